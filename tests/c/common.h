/* Helpers shared by the rackmem test programs: deterministic patterns and checksums. */
#ifndef RACKMEM_TEST_COMMON_H
#define RACKMEM_TEST_COMMON_H
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(3); } while (0)

static inline uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    if (!h) h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}

/* Seconds on the monotonic clock. */
static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static inline uint64_t xorshift64(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

/* The value the pattern `seed` puts in word i. */
static inline uint64_t pattern(uint64_t seed, size_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    return x | 1; /* never zero: a zero-filled page never passes for data */
}

static inline void fill(uint64_t *a, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++) a[i] = pattern(seed, i);
}

/* Exits with "DATA CORRUPTION" if a word differs from the pattern. */
static inline void verify(const uint64_t *a, size_t words, uint64_t seed, const char *what) {
    for (size_t i = 0; i < words; i++)
        if (a[i] != pattern(seed, i))
            DIE("DATA CORRUPTION in %s at word %zu (page %zu): %016llx, expected %016llx", what, i, i * 8 / 4096,
                (unsigned long long)a[i], (unsigned long long)pattern(seed, i));
}

/* Exits with "DATA CORRUPTION" if a word of 4 KiB page `pg` of `a` differs from the pattern
 * `seed` (indexed by the word's place in `a`, as fill() writes it). */
static inline void check_page(const uint64_t *a, size_t pg, uint64_t seed, const char *what) {
    for (size_t w = pg * 512; w < (pg + 1) * 512; w++)
        if (a[w] != pattern(seed, w))
            DIE("DATA CORRUPTION: %s: page %zu word %zu is %016llx, expected %016llx (seed %llu)", what, pg, w,
                (unsigned long long)a[w], (unsigned long long)pattern(seed, w), (unsigned long long)seed);
}

static inline size_t arg_mib(int argc, char **argv, int i, size_t dflt) {
    return (argc > i ? strtoull(argv[i], 0, 0) : dflt) << 20;
}
#endif
