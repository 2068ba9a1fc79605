/* Small blocks across threads and fork: four threads allocate and fill small blocks of many
 * sizes and exit (their cached free blocks go back to the allocator), the main thread frees
 * some of theirs and allocates its own, then forks twice: each child verifies every block as
 * of the fork, frees and reallocates, verifies again and prints a checksum, while the parent
 * rewrites its blocks; the parent checks its own after each child exits. Prints checksums.
 * Usage: small_fork [blocks per thread, default 60000] */
#include "common.h"
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 4

static size_t per;
static uint64_t **blk[THREADS + 1];
static size_t *len[THREADS + 1];
static uint64_t gen[THREADS + 1];

static size_t size_of(size_t t, size_t i) { return 16 + ((i * 37 + t * 11) % 300) / 8 * 8; }

static void make(size_t t) {
    blk[t] = malloc(per * sizeof *blk[t]);
    len[t] = malloc(per * sizeof *len[t]);
    if (!blk[t] || !len[t]) DIE("malloc of tables failed");
    for (size_t i = 0; i < per; i++) {
        len[t][i] = size_of(t, i);
        blk[t][i] = i % 5 == 0 ? calloc(1, len[t][i]) : malloc(len[t][i]);
        if (!blk[t][i]) DIE("malloc of block %zu failed", i);
        if (i % 5 == 0)
            for (size_t w = 0; w < len[t][i] / 8; w++)
                if (blk[t][i][w]) DIE("calloc block %zu not zero", i);
        fill(blk[t][i], len[t][i] / 8, t * 1000003 + i);
    }
}

static void *thread(void *arg) {
    make((size_t)arg);
    /* Churn: free and allocate again, so this thread's cache holds blocks when it exits. */
    for (size_t i = 0; i < per; i += 3) {
        free(blk[(size_t)arg][i]);
        blk[(size_t)arg][i] = malloc(len[(size_t)arg][i]);
        if (!blk[(size_t)arg][i]) DIE("malloc failed");
        fill(blk[(size_t)arg][i], len[(size_t)arg][i] / 8, (size_t)arg * 1000003 + i);
    }
    return 0;
}

static uint64_t check(const char *who) {
    uint64_t h = 0;
    for (size_t t = 0; t <= THREADS; t++)
        for (size_t i = 0; i < per; i++) {
            if (!blk[t][i]) continue;
            verify(blk[t][i], len[t][i] / 8, t * 1000003 + i + gen[t], who);
            h = fnv1a(blk[t][i], len[t][i], h);
        }
    return h;
}

int main(int argc, char **argv) {
    per = argc > 1 ? strtoull(argv[1], 0, 0) : 60000;
    pthread_t th[THREADS];
    for (size_t t = 0; t < THREADS; t++)
        if (pthread_create(&th[t], 0, thread, (void *)t)) DIE("pthread_create failed");
    for (size_t t = 0; t < THREADS; t++) pthread_join(th[t], 0);
    make(THREADS);
    for (size_t t = 0; t < THREADS; t++)
        for (size_t i = 1; i < per; i += 4) { free(blk[t][i]); blk[t][i] = 0; }
    printf("checksum=%016llx before fork\n", (unsigned long long)check("before fork"));
    fflush(stdout);
    for (int round = 0; round < 2; round++) {
        pid_t pid = fork();
        if (pid < 0) DIE("fork failed");
        if (pid == 0) {
            uint64_t h = check("child at fork");
            for (size_t i = 0; i < per; i += 2) {
                free(blk[THREADS][i]);
                size_t n = len[THREADS][i] * (i % 4 ? 3 : 1);
                blk[THREADS][i] = malloc(n);
                if (!blk[THREADS][i]) DIE("malloc in child failed");
                len[THREADS][i] = n / 8 * 8;
                fill(blk[THREADS][i], len[THREADS][i] / 8, THREADS * 1000003 + i + gen[THREADS]);
            }
            for (size_t i = 3; i < per; i += 6) {
                if (!blk[0][i]) continue;
                uint64_t *g = realloc(blk[0][i], len[0][i] * 2);
                if (!g) DIE("realloc in child failed");
                blk[0][i] = g;
                verify(g, len[0][i] / 8, i + gen[0], "realloc in child");
            }
            printf("checksum=%016llx child %d at fork\nchecksum=%016llx child %d after\n", (unsigned long long)h,
                   round, (unsigned long long)check("child after"), round);
            fflush(stdout);
            _exit(0);
        }
        /* The parent rewrites its blocks meanwhile: the child must not see it. */
        for (size_t t = 0; t <= THREADS; t++) {
            gen[t] += 7;
            for (size_t i = 0; i < per; i++)
                if (blk[t][i]) fill(blk[t][i], len[t][i] / 8, t * 1000003 + i + gen[t]);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) DIE("child %d failed (%d)", round, st);
        printf("checksum=%016llx parent after child %d\n", (unsigned long long)check("parent"), round);
        fflush(stdout);
    }
    return 0;
}
