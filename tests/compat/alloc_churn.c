/* An allocation-heavy C program meant to run with another allocator preloaded (tcmalloc,
 * mimalloc): blocks from 16 KiB to 8 MiB are allocated, filled, partly freed, reallocated and
 * reallocated again across rounds, then every byte is checksummed.
 * Usage: alloc_churn MIB ROUNDS   (MIB: the live data at the end) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t next_random(void) {
    /* xorshift64*: deterministic, the same in every run */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dULL;
}

static void fill(unsigned char *p, size_t len, uint64_t seed) {
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = seed * 0x100000001b3ULL + i;
        memcpy(p + i, &v, len - i < 8 ? len - i : 8);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MIB ROUNDS\n", argv[0]);
        return 2;
    }
    size_t target = (size_t)strtoul(argv[1], NULL, 10) << 20;
    int rounds = atoi(argv[2]);
    enum { SLOTS = 4096 };
    static unsigned char *block[SLOTS];
    static size_t len[SLOTS];
    size_t live = 0;
    for (int r = 0; r < rounds; r++) {
        /* grow to the target with blocks of random sizes */
        for (int i = 0; live < target && i < SLOTS; i++) {
            if (block[i]) continue;
            size_t n = (size_t)16 << 10 << (next_random() % 10); /* 16 KiB .. 8 MiB */
            block[i] = malloc(n);
            if (!block[i]) {
                perror("malloc");
                return 1;
            }
            fill(block[i], n, (uint64_t)r * SLOTS + (uint64_t)i);
            len[i] = n;
            live += n;
        }
        /* free a third, and resize another third (keeping its prefix) */
        for (int i = 0; i < SLOTS; i++) {
            if (!block[i]) continue;
            uint64_t what = next_random() % 3;
            if (what == 0) {
                free(block[i]);
                block[i] = NULL;
                live -= len[i];
            } else if (what == 1) {
                size_t n = len[i] % (3 << 20) + (64 << 10);
                unsigned char *p = realloc(block[i], n);
                if (!p) {
                    perror("realloc");
                    return 1;
                }
                if (n > len[i]) fill(p + len[i], n - len[i], (uint64_t)i);
                block[i] = p;
                live = live - len[i] + n;
                len[i] = n;
            }
        }
    }
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t blocks = 0;
    for (int i = 0; i < SLOTS; i++) {
        if (!block[i]) continue;
        blocks++;
        for (size_t j = 0; j < len[i]; j++) h = (h ^ block[i][j]) * 0x100000001b3ULL;
        free(block[i]);
    }
    printf("blocks=%zu live_mib=%zu checksum=%016llx\n", blocks, live >> 20, (unsigned long long)h);
    return 0;
}
