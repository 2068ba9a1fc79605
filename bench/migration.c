/* migration: seed 001's Tables I-II on rackmem. For buffers of 4 KiB .. 32 MiB living on brick A
 * (written, then pushed out of the local buffer by a sweep of another buffer), in interleaved
 * rounds:
 *   odpm        on-demand: the program touches every page; faults bring the pages from brick A
 *               into the local buffer (the seed's ODPM, with our local buffer as the device);
 *   umpm_local  user-managed: rackmem_migrate(buf, len, "local") (fetch and pin; then unpinned);
 *   umpm_bounce user-managed, brick A -> brick B, bounced through the process ("bounce:B");
 *   umpm_direct user-managed, brick A -> brick B, pulled by B from A ("direct:B");
 *   floor       the link's floor: one plain read of the same size from a segment on brick A
 *               (rackmem_get, over the same kind of link) into memory of this process.
 * Each migrated buffer is checked word by word afterwards (a wrong word stops the run).
 * usage: migration BRICK_A BRICK_B FLUSH_MIB ROUNDS [SIZES]  (SIZES: the first 1..6 sizes)
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
#include <sys/mman.h>
#include "bench.h"
#include "../include/rackmem.h"

#define SIZES 6
#define METHODS 5
#define FLOOR 4
#define MAX_ROUNDS 25
static const size_t sizes[SIZES] = {4096, 32768, 131072, 1 << 20, 4 << 20, 32 << 20};
static const char *names[METHODS] = {"odpm", "umpm_local", "umpm_bounce", "umpm_direct", "floor"};

typedef int (*migrate_fn)(void *, size_t, const char *, struct rackmem_migration *);
typedef rackmem_seg *(*seg_open_fn)(const char *, size_t);
typedef int (*get_fn)(rackmem_seg *, uint64_t, void *, size_t);
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
    seg_open_fn seg_open = (seg_open_fn)dlsym(RTLD_DEFAULT, "rackmem_seg_open");
    get_fn get = (get_fn)dlsym(RTLD_DEFAULT, "rackmem_get");
    if (!migrate || !unpin || !ralloc || !rfree || !seg_open || !get) {
        fprintf(stderr, "migration: run it under rackmem run\n");
        return 2;
    }
    if (argc < 5) { fprintf(stderr, "usage: migration BRICK_A BRICK_B FLUSH_MIB ROUNDS [SIZES]\n"); return 2; }
    const char *a = argv[1], *b = argv[2];
    size_t flush_len = strtoull(argv[3], 0, 0) << 20;
    int rounds = atoi(argv[4]);
    int nsizes = argc > 5 ? atoi(argv[5]) : SIZES;
    if (rounds < 1 || rounds > MAX_ROUNDS) { fprintf(stderr, "migration: 1..%d rounds\n", MAX_ROUNDS); return 2; }
    if (nsizes < 1 || nsizes > SIZES) { fprintf(stderr, "migration: 1..%d sizes\n", SIZES); return 2; }
    char to_bounce[512], to_direct[512];
    snprintf(to_bounce, sizeof to_bounce, "bounce:%s", b);
    snprintf(to_direct, sizeof to_direct, "direct:%s", b);
    volatile uint64_t *flush = ralloc(flush_len);
    if (!flush) { fprintf(stderr, "migration: no rackmem memory for the flush buffer\n"); return 1; }
    /* The floor reads from a segment on brick A (the first configured brick) into memory of
     * this process that is not rackmem's, touched beforehand. */
    size_t largest = sizes[nsizes - 1];
    rackmem_seg *floor_seg = seg_open("bench-migration-floor", largest);
    if (!floor_seg) { fprintf(stderr, "migration: rackmem_seg_open: %s\n", strerror(errno)); return 1; }
    char *floor_buf = mmap(0, largest, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (floor_buf == MAP_FAILED) { fprintf(stderr, "migration: mmap: %s\n", strerror(errno)); return 1; }
    memset(floor_buf, 1, largest);
    static double ns[METHODS][SIZES][MAX_ROUNDS], steps[METHODS][SIZES][4][MAX_ROUNDS];
    uint64_t seed = 1, sink = 0;
    for (int r = 0; r < rounds; r++) {
        for (int s = 0; s < nsizes; s++) {
            for (int m = 0; m < METHODS; m++) {
                size_t len = sizes[s], words = len / 8;
                if (m == FLOOR) {
                    double t0 = now();
                    if (get(floor_seg, 0, floor_buf, len) != 0) {
                        fprintf(stderr, "migration: rackmem_get of %zu bytes: %s\n", len, strerror(errno));
                        return 1;
                    }
                    ns[m][s][r] = (now() - t0) * 1e9;
                    sink += (unsigned char)floor_buf[len - 1];
                    continue;
                }
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
                    const char *to = m == 1 ? "local" : m == 2 ? to_bounce : to_direct;
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
                /* Back, so the next buffers are placed as these. */
                if (m >= 2 && migrate(buf, len, a, &t) != 0) {
                    fprintf(stderr, "migration: rackmem_migrate %zu bytes back to %s: %s\n", len, a, strerror(errno));
                    return 1;
                }
                rfree(buf);
            }
        }
    }
    for (int m = 0; m < METHODS; m++)
        for (int s = 0; s < nsizes; s++) {
            printf("result %s_%zu_ns=%.0f", names[m], sizes[s], median(ns[m][s], rounds));
            if (m > 0 && m != FLOOR) {
                static const char *step[4] = {"setup", "allocate", "transfer", "finalize"};
                for (int k = 0; k < 4; k++) printf(" %s_%zu_%s=%.0f", names[m], sizes[s], step[k], median(steps[m][s][k], rounds));
            }
            printf("\n");
        }
    printf("result rounds=%d sink=%llu\n", rounds, (unsigned long long)(sink & 1));
    return 0;
}
