/* gups: random 8-byte read-modify-write updates over a table (HPCC RandomAccess style).
 * usage: gups [MiB=1024] [updates=200000] [seed=1]
 * prints: result name=gups bytes=.. updates=.. seconds=.. updates_per_s=.. rate=.. checksum=..
 * (rate = updates_per_s; the checksum covers every word, so it is the same natively and under rackmem) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench.h"


int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 1024;
    size_t updates = argc > 2 ? strtoull(argv[2], 0, 0) : 200000;
    uint64_t s = argc > 3 ? strtoull(argv[3], 0, 0) : 1;
    size_t words = (mib << 20) / 8;
    uint64_t *t = malloc(words * 8);
    if (!t || !words) { fprintf(stderr, "gups: malloc failed\n"); return 1; }
    for (size_t i = 0; i < words; i++) t[i] = i;
    double t0 = now();
    for (size_t k = 0; k < updates; k++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        t[s % words] ^= s;
    }
    double dt = now() - t0;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < words; i++) h = (h ^ t[i]) * 1099511628211ull; /* FNV-1a over words */
    printf("result name=gups bytes=%zu updates=%zu seconds=%.4f updates_per_s=%.1f rate=%.1f checksum=%016llx\n", words * 8, updates,
           dt, updates / dt, updates / dt, (unsigned long long)h);
    free(t);
    return 0;
}
