/* scan: sequential read+write passes over every 8-byte word of one big buffer (the "scan"
 * workload of the swap baselines). usage: scan [MiB=1024] [passes=3]
 * prints: result name=scan bytes=.. seconds=.. mb_per_s=.. rate=.. checksum=.. (bytes = bytes swept by
 * all passes; rate = mb_per_s) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench.h"


int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 1024;
    int passes = argc > 2 ? atoi(argv[2]) : 3;
    size_t words = (mib << 20) / 8;
    uint64_t *a = malloc(words * 8);
    if (!a) { fprintf(stderr, "scan: malloc failed\n"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i;
    double t0 = now();
    for (int p = 0; p < passes; p++)
        for (size_t i = 0; i < words; i++) a[i] = a[i] * 3 + 1;
    double t = now() - t0;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < words; i++) h = (h ^ a[i]) * 1099511628211ull; /* FNV-1a over words */
    double mb_s = words * 8.0 * passes / t / 1e6;
    printf("result name=scan bytes=%zu seconds=%.4f mb_per_s=%.1f rate=%.1f checksum=%016llx\n", words * 8 * (size_t)passes, t,
           mb_s, mb_s, (unsigned long long)h);
    free(a);
    return 0;
}
