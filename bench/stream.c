/* stream: the four STREAM kernels (copy, scale, add, triad) over three arrays allocated with
 * malloc, so under rackmem they live in remote memory. Reports the best of N iterations per
 * kernel and a checksum of the final arrays (identical natively and under rackmem).
 * usage: stream [elements=10000000] [iterations=5]
 * prints: result name=stream elements=.. bytes=.. seconds=.. copy_mb_s=.. scale_mb_s=.. add_mb_s=.. triad_mb_s=..
 *         rate=.. checksum=..
 * (bytes = footprint of the three arrays; seconds = best triad time; rate = triad_mb_s) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"


static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], 0, 0) : 10000000;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    if (n == 0 || iters < 1) { fprintf(stderr, "stream: bad arguments\n"); return 2; }
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c) { fprintf(stderr, "stream: out of memory\n"); return 1; }
    for (size_t i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.0; }
    const double s = 3.0;
    double best[4] = { 1e30, 1e30, 1e30, 1e30 };
    for (int k = 0; k < iters; k++) {
        double t = now();
        for (size_t i = 0; i < n; i++) c[i] = a[i];
        double t1 = now(); if (t1 - t < best[0]) best[0] = t1 - t;
        for (size_t i = 0; i < n; i++) b[i] = s * c[i];
        double t2 = now(); if (t2 - t1 < best[1]) best[1] = t2 - t1;
        for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
        double t3 = now(); if (t3 - t2 < best[2]) best[2] = t3 - t2;
        for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        double t4 = now(); if (t4 - t3 < best[3]) best[3] = t4 - t3;
    }
    double bytes[4] = { 16.0 * n, 16.0 * n, 24.0 * n, 24.0 * n };
    uint64_t h = 1469598103934665603ull;
    h = fnv(a, n * sizeof *a, h); h = fnv(b, n * sizeof *b, h); h = fnv(c, n * sizeof *c, h);
    printf("result name=stream elements=%zu bytes=%zu seconds=%.4f copy_mb_s=%.1f scale_mb_s=%.1f add_mb_s=%.1f triad_mb_s=%.1f "
           "rate=%.1f checksum=%016llx\n",
           n, 3 * n * sizeof(double), best[3], bytes[0] / best[0] / 1e6, bytes[1] / best[1] / 1e6, bytes[2] / best[2] / 1e6,
           bytes[3] / best[3] / 1e6, bytes[3] / best[3] / 1e6, (unsigned long long)h);
    free(a); free(b); free(c);
    return 0;
}
