/* updates: random 8-byte updates (XOR of a pseudo-random word) over one array, shared by T threads
 * that split the same total number of updates (GUPS-style, seed 002's random-access kind).
 * usage: updates [MiB=512] [updates=1000000] [threads=1, 0 = every online CPU] [seed=1]
 * prints: result name=updates bytes=.. updates=.. threads=.. seconds=.. updates_per_s=.. checksum=..
 * Update k XORs splitmix64(seed + k) into word splitmix64(seed + k) % words, atomically: XOR
 * commutes, so the array ends the same whatever the threads' interleaving and however many there
 * are, and the checksum (over every word) is the same for 1, 2 or all CPUs, natively, under rackmem
 * and under swap. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "bench.h"

struct part {
    uint64_t *t;
    size_t words;
    uint64_t seed, from, to;
};

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void *work(void *arg) {
    const struct part *p = arg;
    for (uint64_t k = p->from; k < p->to; k++) {
        uint64_t x = splitmix64(p->seed + k);
        __atomic_fetch_xor(&p->t[x % p->words], x, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 512;
    uint64_t updates = argc > 2 ? strtoull(argv[2], 0, 0) : 1000000;
    long threads = argc > 3 ? strtol(argv[3], 0, 0) : 1;
    uint64_t seed = argc > 4 ? strtoull(argv[4], 0, 0) : 1;
    if (threads == 0) threads = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1 || threads > 1024) { fprintf(stderr, "updates: threads must be 0 (all) or 1..1024\n"); return 2; }
    size_t words = (mib << 20) / 8;
    uint64_t *t = malloc(words * 8);
    struct part *parts = calloc(threads, sizeof *parts);
    pthread_t *ids = calloc(threads, sizeof *ids);
    if (!t || !words || !parts || !ids) { fprintf(stderr, "updates: malloc failed\n"); return 1; }
    for (size_t i = 0; i < words; i++) t[i] = i;
    double t0 = now();
    for (long i = 0; i < threads; i++) {
        parts[i] = (struct part){t, words, seed, updates * i / threads, updates * (i + 1) / threads};
        if (pthread_create(&ids[i], NULL, work, &parts[i])) { fprintf(stderr, "updates: pthread_create failed\n"); return 1; }
    }
    for (long i = 0; i < threads; i++) pthread_join(ids[i], NULL);
    double dt = now() - t0;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < words; i++) h = (h ^ t[i]) * 1099511628211ull; /* FNV-1a over words */
    printf("result name=updates bytes=%zu updates=%llu threads=%ld seconds=%.4f updates_per_s=%.1f checksum=%016llx\n",
           words * 8, (unsigned long long)updates, threads, dt, updates / dt, (unsigned long long)h);
    free(ids);
    free(parts);
    free(t);
    return 0;
}
