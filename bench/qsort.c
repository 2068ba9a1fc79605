/* qsort: the C library's qsort(3) on one large array of 64-bit keys (a comparison sort through a
 * function pointer, as a program that never heard of radix sorts would write it).
 * usage: qsort [elements=16777216] [seed=1]
 * prints: result name=qsort elements=.. seconds=.. elements_per_s=.. sorted=1 checksum=..
 * (glibc sorts with a merge sort into a temporary copy of the array when the array is under a
 * quarter of the machine's memory, so the footprint is about twice the array; the checksum covers
 * every key in sorted order, so it is the same natively, under rackmem and under swap) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "bench.h"

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], 0, 0) : (size_t)16 << 20;
    uint64_t s = argc > 2 ? strtoull(argv[2], 0, 0) : 1;
    if (!n || !s) { fprintf(stderr, "qsort: elements and seed must be positive\n"); return 2; }
    uint64_t *a = malloc(n * sizeof *a);
    if (!a) { fprintf(stderr, "qsort: malloc of %zu elements failed\n", n); return 1; }
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        a[i] = s;
    }
    double t0 = now();
    qsort(a, n, sizeof *a, cmp_u64);
    double dt = now() - t0;
    int sorted = 1;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        if (i && a[i - 1] > a[i]) sorted = 0;
        h = (h ^ a[i]) * 1099511628211ull; /* FNV-1a over keys */
    }
    printf("result name=qsort elements=%zu seconds=%.4f elements_per_s=%.1f sorted=%d checksum=%016llx\n", n, dt,
           n / dt, sorted, (unsigned long long)h);
    free(a);
    return sorted ? 0 : 1;
}
