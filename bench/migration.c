/* migration: seed 001's Tables I-II on rackmem. For buffers of 4 KiB .. 32 MiB living on brick A
 * (written, then pushed out of the local buffer by a sweep of another buffer), in interleaved
 * rounds:
 *   odpm        on-demand: the program touches every page; faults bring the pages from brick A
 *               into the local buffer (the seed's ODPM, with our local buffer as the device);
 *   umpm_local  user-managed: rackmem_migrate(buf, len, "local") (fetch and pin; then unpinned);
 *   umpm_bounce user-managed, brick A -> brick B, bounced through the process (rackmem_migrate).
 * Each measurement's buffer is checked word by word afterwards (a wrong word stops the run).
 * usage: migration BRICK_A BRICK_B FLUSH_MIB ROUNDS
 * prints one result line per (method, size) with the median over rounds, in ns:
 *   result METHOD_SIZE_ns=.. and, for the user-managed ones, METHOD_SIZE_{setup,allocate,transfer,finalize}=..
 * Needs librackmem (rackmem run), the local buffer at least twice the largest buffer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"
#include "../include/rackmem.h"

#define SIZES 6
#define METHODS 3
#define MAX_ROUNDS 25
static const size_t sizes[SIZES] = {4096, 32768, 131072, 1 << 20, 4 << 20, 32 << 20};
static const char *names[METHODS] = {"odpm", "umpm_local", "umpm_bounce"};

typedef int (*migrate_fn)(void *, size_t, const char *, struct rackmem_migration *);
typedef int (*unpin_fn)(void *, size_t);
typedef void *(*alloc_fn)(size_t);
typedef void (*free_fn)(void *);

static uint64_t word(uint64_t seed, size_t i) { return (seed * 0x9E3779B97F4A7C15ull + i) | 1; }

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    migrate_fn migrate = (migrate_fn)dlsym(RTLD_DEFAULT, "rackmem_migrate_timed");
    unpin_fn unpin = (unpin_fn)dlsym(RTLD_DEFAULT, "rackmem_unpin");
    alloc_fn ralloc = (alloc_fn)dlsym(RTLD_DEFAULT, "rackmem_alloc");
    free_fn rfree = (free_fn)dlsym(RTLD_DEFAULT, "rackmem_free");
    if (!migrate || !unpin || !ralloc || !rfree) { fprintf(stderr, "migration: run it under rackmem run\n"); return 2; }
    if (argc < 5) { fprintf(stderr, "usage: migration BRICK_A BRICK_B FLUSH_MIB ROUNDS\n"); return 2; }
    const char *a = argv[1], *b = argv[2];
    size_t flush_len = strtoull(argv[3], 0, 0) << 20;
    int rounds = atoi(argv[4]);
    if (rounds < 1 || rounds > MAX_ROUNDS) { fprintf(stderr, "migration: 1..%d rounds\n", MAX_ROUNDS); return 2; }
    volatile uint64_t *flush = ralloc(flush_len);
    if (!flush) { fprintf(stderr, "migration: no rackmem memory for the flush buffer\n"); return 1; }
    static double ns[METHODS][SIZES][MAX_ROUNDS], steps[METHODS][SIZES][4][MAX_ROUNDS];
    uint64_t seed = 1, sink = 0;
    for (int r = 0; r < rounds; r++) {
        for (int s = 0; s < SIZES; s++) {
            for (int m = 0; m < METHODS; m++) {
                size_t len = sizes[s], words = len / 8;
                uint64_t *buf = ralloc(len);
                if (!buf) { fprintf(stderr, "migration: rackmem_alloc(%zu) failed\n", len); return 1; }
                seed++;
                for (size_t i = 0; i < words; i++) buf[i] = word(seed, i);
                /* Push it out of the local buffer (to brick A, the window's first segment). */
                for (size_t i = 0; i < flush_len / 8; i += 512) flush[i] = flush[i] + 1;
                struct rackmem_migration t = {0};
                double t0 = now();
                if (m == 0) {
                    for (size_t i = 0; i < words; i += 512) sink += buf[i];
                } else {
                    const char *to = m == 1 ? "local" : b;
                    if (migrate(buf, len, to, &t) != 0) {
                        fprintf(stderr, "migration: rackmem_migrate %zu bytes to %s: %s\n", len, to, strerror(errno));
                        return 1;
                    }
                }
                double dt = now() - t0;
                ns[m][s][r] = dt * 1e9;
                steps[m][s][0][r] = t.setup_ns;
                steps[m][s][1][r] = t.allocate_ns;
                steps[m][s][2][r] = t.transfer_ns;
                steps[m][s][3][r] = t.finalize_ns;
                if (m == 1) unpin(buf, len);
                for (size_t i = 0; i < words; i++)
                    if (buf[i] != word(seed, i)) {
                        fprintf(stderr, "migration: DATA CORRUPTION after %s of %zu bytes at word %zu\n", names[m], len, i);
                        return 1;
                    }
                if (m == 2) migrate(buf, len, a, &t); /* back, so the next buffers are placed as these */
                rfree(buf);
            }
        }
    }
    for (int m = 0; m < METHODS; m++)
        for (int s = 0; s < SIZES; s++) {
            printf("result %s_%zu_ns=%.0f", names[m], sizes[s], median(ns[m][s], rounds));
            if (m > 0) {
                static const char *step[4] = {"setup", "allocate", "transfer", "finalize"};
                for (int k = 0; k < 4; k++) printf(" %s_%zu_%s=%.0f", names[m], sizes[s], step[k], median(steps[m][s][k], rounds));
            }
            printf("\n");
        }
    printf("result rounds=%d sink=%llu\n", rounds, (unsigned long long)(sink & 1));
    return 0;
}
