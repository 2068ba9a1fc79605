/* The malloc family's fast path: "pairs" allocates a small block, writes it and frees it at
 * once (the allocator's cached path); "churn" keeps a pool of live blocks and replaces a random
 * one per step (allocation and free of blocks of random sizes among many live ones, the common
 * shape of a program's small objects); "threads" runs churn on two threads at once. Sizes are
 * random in 16..512 bytes. Prints nanoseconds per malloc+free for each, and a checksum of the
 * pool's contents so the work cannot be optimised away.
 * Usage: malloc_bench [million operations per phase, default 20] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POOL 65536

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

static size_t ops;

static uint64_t churn(uint64_t seed) {
    char **pool = calloc(POOL, sizeof *pool);
    if (!pool) { perror("calloc"); exit(1); }
    uint64_t s = seed, h = 0;
    for (size_t i = 0; i < ops; i++) {
        size_t k = rnd(&s) % POOL, n = 16 + rnd(&s) % 497;
        free(pool[k]);
        pool[k] = malloc(n);
        if (!pool[k]) { perror("malloc"); exit(1); }
        memset(pool[k], (int)i, 16);
    }
    for (size_t k = 0; k < POOL; k++) {
        if (pool[k]) h = h * 31 + (unsigned char)pool[k][0];
        free(pool[k]);
    }
    free(pool);
    return h;
}

static void *churn_thread(void *arg) {
    return (void *)(uintptr_t)churn((uintptr_t)arg);
}

int main(int argc, char **argv) {
    ops = (argc > 1 ? strtoull(argv[1], 0, 0) : 20) * 1000000;
    uint64_t s = 88172645463325252ull, h = 0;
    double t = now();
    for (size_t i = 0; i < ops; i++) {
        char *p = malloc(16 + rnd(&s) % 497);
        if (!p) { perror("malloc"); exit(1); }
        p[0] = (char)i;
        h += (unsigned char)p[0];
        free(p);
    }
    double pairs = (now() - t) * 1e9 / ops;
    t = now();
    h = h * 31 + churn(12345);
    double ch = (now() - t) * 1e9 / ops;
    t = now();
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], 0, churn_thread, (void *)(uintptr_t)(777 + i));
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(th[i], &r);
        h = h * 31 + (uintptr_t)r;
    }
    double thr = (now() - t) * 1e9 / ops;
    printf("pairs_ns=%.1f churn_ns=%.1f threads_ns=%.1f checksum=%016llx\n", pairs, ch, thr, (unsigned long long)h);
    return 0;
}
