/* spawn_window: threads keep allocating small blocks from the program's allocator while the
 * main thread's first large allocation starts the rackmem runtime (and with it, its threads).
 * usage: spawn_window [THREADS=4] [LIVE=20000] [ROUNDS=30]
 * Every thread, ROUNDS times: LIVE small blocks allocated, filled, checked and freed. A malloc
 * that returns NULL ends the program with exit status 3 and says where.
 * prints: checksum=<hex of every block's contents> large=<hex of the large block's sum> */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_THREADS 16
#define MAX_LIVE 100000

static atomic_int started, go;
static long live_blocks = 20000, rounds = 30;
static uint64_t sums[MAX_THREADS];
static unsigned char *blocks[MAX_THREADS][MAX_LIVE];

static void *worker(void *arg) {
    long id = (long)arg;
    uint64_t h = 1469598103934665603ull;
    atomic_fetch_add(&started, 1);
    while (!atomic_load(&go)) sched_yield();
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < live_blocks; i++) {
            size_t len = 16 + (size_t)((i * 7 + r) % 48);
            unsigned char *p = malloc(len);
            if (!p) {
                fprintf(stderr, "spawn_window: malloc(%zu) returned NULL (thread %ld, round %ld, block %ld)\n",
                        len, id, r, i);
                exit(3);
            }
            memset(p, (int)((id * 31 + r * 7 + i) & 0xff), len);
            p[0] = (unsigned char)len;
            blocks[id][i] = p;
        }
        for (long i = 0; i < live_blocks; i++) {
            unsigned char *p = blocks[id][i];
            size_t len = p[0];
            unsigned char want = (unsigned char)((id * 31 + r * 7 + i) & 0xff);
            for (size_t k = 1; k < len; k++) {
                if (p[k] != want) {
                    fprintf(stderr, "spawn_window: block %ld of thread %ld changed\n", i, id);
                    exit(4);
                }
            }
            h = (h ^ (len * 131 + want)) * 1099511628211ull;
            free(p);
        }
    }
    sums[id] = h;
    return NULL;
}

int main(int argc, char **argv) {
    long threads = argc > 1 ? atol(argv[1]) : 4;
    if (argc > 2) live_blocks = atol(argv[2]);
    if (argc > 3) rounds = atol(argv[3]);
    if (threads < 1 || threads > MAX_THREADS || live_blocks < 1 || live_blocks > MAX_LIVE || rounds < 1) {
        fprintf(stderr, "spawn_window: 1..%d threads, 1..%d live blocks, rounds > 0\n", MAX_THREADS, MAX_LIVE);
        return 2;
    }
    /* One CPU for everything: a new thread then waits for the scheduler while the others run,
     * which is what a loaded machine does to it. */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) perror("spawn_window: sched_setaffinity");
    pthread_t t[MAX_THREADS];
    for (long i = 0; i < threads; i++) {
        if (pthread_create(&t[i], NULL, worker, (void *)i) != 0) {
            fprintf(stderr, "spawn_window: pthread_create failed\n");
            return 1;
        }
    }
    while (atomic_load(&started) < threads) sched_yield();
    atomic_store(&go, 1);
    /* The first large allocation: under rackmem the runtime starts here. */
    size_t big = 64u << 20;
    uint64_t *b = malloc(big);
    if (!b) {
        fprintf(stderr, "spawn_window: the large malloc returned NULL\n");
        return 3;
    }
    uint64_t lsum = 0;
    for (size_t i = 0; i < big / 8; i++) b[i] = i * 2654435761u;
    for (size_t i = 0; i < big / 8; i += 512) lsum += b[i];
    for (long i = 0; i < threads; i++) pthread_join(t[i], NULL);
    free(b);
    uint64_t h = 1469598103934665603ull;
    for (long i = 0; i < threads; i++) h = (h ^ sums[i]) * 1099511628211ull;
    printf("checksum=%016llx large=%016llx\n", (unsigned long long)h, (unsigned long long)lsum);
    return 0;
}
