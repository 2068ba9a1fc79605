/* ptrchase: a dependent random walk through a cyclic permutation (each load's address comes
 * from the previous load), the latency-bound extreme. usage: ptrchase [MiB=256] [steps=200000]
 * prints: result name=ptrchase bytes=.. steps=.. seconds=.. ns_per_step=.. rate=.. checksum=..
 * (rate = steps per second) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench.h"


int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 256;
    size_t steps = argc > 2 ? strtoull(argv[2], 0, 0) : 200000;
    /* One slot per 64-byte line; a random cyclic permutation (Sattolo) links them. */
    size_t n = (mib << 20) / 64;
    uint64_t *next = malloc(n * 64);
    if (!next || n < 2) { fprintf(stderr, "ptrchase: malloc failed\n"); return 1; }
    for (size_t i = 0; i < n; i++) next[i * 8] = i;
    uint64_t s = 88172645463325252ull;
    for (size_t i = n - 1; i > 0; i--) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        size_t j = s % i, a = next[i * 8];
        next[i * 8] = next[j * 8];
        next[j * 8] = a;
    }
    size_t p = 0;
    double t0 = now();
    for (size_t k = 0; k < steps; k++) p = next[p * 8];
    double dt = now() - t0;
    printf("result name=ptrchase bytes=%zu steps=%zu seconds=%.4f ns_per_step=%.1f rate=%.1f checksum=%016llx\n", n * 64, steps,
           dt, dt * 1e9 / steps, steps / dt, (unsigned long long)p);
    free(next);
    return 0;
}
