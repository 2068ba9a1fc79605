/* huge_units: what a window of 2 MiB units must keep exact (run with and without
 * `rackmem run --huge-pages`; the test compares the checksums with the native run's).
 *
 *   huge_units scan MiB passes     fill, then sequential read-modify-write passes, each followed
 *                                  by random 8-byte writes all over the buffer
 *   huge_units small MiB passes    fill, then per pass one 8-byte write in every 2 MiB: each
 *                                  unit comes back and only one of its subpages changes
 *   huge_units holes MiB           fill, release small ranges inside units with
 *                                  madvise(MADV_DONTNEED) (one just written, so resident; one at
 *                                  the start, long evicted; one across a unit boundary); they
 *                                  must read zeros, also after a pass that evicts everything and
 *                                  brings it back; then they are written again
 *
 * Prints "checksum=..." (and, for holes, "nonzero_in_holes=0"). */
#include <sys/mman.h>
#include "common.h"

#define UNIT_WORDS (262144u) /* 2 MiB of 8-byte words */

static uint64_t sum(const volatile uint64_t *a, size_t words) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < words; i++) { h ^= a[i]; h *= 1099511628211ull; }
    return h;
}

static size_t nonzero(const volatile uint64_t *a, size_t from, size_t n) {
    size_t k = 0;
    for (size_t i = from; i < from + n; i++) k += a[i] != 0;
    return k;
}

int main(int argc, char **argv) {
    if (argc < 3) DIE("usage: huge_units scan|small|holes MiB [passes]");
    const char *mode = argv[1];
    size_t bytes = strtoull(argv[2], 0, 0) << 20;
    int passes = argc > 3 ? atoi(argv[3]) : 2;
    size_t words = bytes / 8;
    /* Page-aligned by mmap, as a large malloc is; not necessarily 2 MiB-aligned: a release of a
     * few KiB lies inside a unit either way. */
    volatile uint64_t *a = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) DIE("mmap(%zu) failed", bytes);
    fill((uint64_t *)a, words, 11);
    if (!strcmp(mode, "scan")) {
        uint64_t s = 88172645463325252ull;
        for (int p = 0; p < passes; p++) {
            for (size_t i = 0; i < words; i++) a[i] = a[i] * 3 + (uint64_t)p;
            /* Few: each one may bring a whole unit back (GUPS is the benchmark for many). */
            for (size_t k = 0; k < words / 32768; k++) a[xorshift64(&s) % words] ^= k;
        }
    } else if (!strcmp(mode, "small")) {
        for (int p = 0; p < passes; p++)
            for (size_t u = 0; u + 1 < words / UNIT_WORDS + 1; u++) {
                size_t i = u * UNIT_WORDS + 37 + (size_t)p * 613;
                if (i < words) a[i] += (uint64_t)p + 1;
            }
    } else if (!strcmp(mode, "holes")) {
        struct { size_t word, n; } r[3] = {
            {words - UNIT_WORDS / 2 + 5 * 512, 3 * 512},  /* 12 KiB near the end: resident */
            {7 * 512, 512},                              /* 4 KiB at the start: evicted */
            {UNIT_WORDS - 40 * 512, 80 * 512},           /* 320 KiB across the first boundary */
        };
        for (int k = 0; k < 3; k++)
            if (madvise((void *)(a + r[k].word), r[k].n * 8, MADV_DONTNEED)) DIE("madvise failed");
        size_t bad = 0;
        for (int k = 0; k < 3; k++) bad += nonzero(a, r[k].word, r[k].n);
        /* Every unit leaves and comes back (the buffer is larger than the local buffer). */
        uint64_t mid = sum(a, words);
        for (int k = 0; k < 3; k++) bad += nonzero(a, r[k].word, r[k].n);
        printf("nonzero_in_holes=%zu\nafter the release: checksum=%016llx\n", bad, (unsigned long long)mid);
        for (int k = 0; k < 3; k++)
            for (size_t i = r[k].word; i < r[k].word + r[k].n; i += 7) a[i] = i;
    } else {
        DIE("unknown mode %s", mode);
    }
    printf("checksum=%016llx\n", (unsigned long long)sum(a, words));
    return 0;
}
