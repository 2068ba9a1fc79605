/* reread: pages that are only read, or written back to the value they held, must not cost a
 * write-back. The program fills a big buffer with a pattern, then makes read-only passes over
 * it; in between, it changes one word on every 8th page and restores it (the page ends as it
 * was). Last, it rewrites every other page with a second pattern and checks the whole buffer.
 * Prints the checksum; the test compares it with the native run and reads the write-back
 * statistics. usage: reread [MiB=32] [passes=4] */
#include "common.h"

enum { SEED_A = 7, SEED_B = 8 };
#define PAGE_WORDS 512

int main(int argc, char **argv) {
    size_t bytes = arg_mib(argc, argv, 1, 32);
    int passes = argc > 2 ? atoi(argv[2]) : 4;
    size_t words = bytes / 8, pages = words / PAGE_WORDS;
    volatile uint64_t *a = malloc(bytes);
    if (!a) DIE("malloc(%zu) failed", bytes);
    fill((uint64_t *)a, words, SEED_A);
    for (int p = 0; p < passes; p++) {
        verify((const uint64_t *)a, words, SEED_A, "a read-only pass");
        for (size_t pg = p % 8; pg < pages; pg += 8) {
            size_t i = pg * PAGE_WORDS + 17;
            uint64_t old = a[i];
            a[i] = ~old;
            a[i] = old;
        }
    }
    for (size_t pg = 0; pg < pages; pg += 2)
        for (size_t i = pg * PAGE_WORDS; i < (pg + 1) * PAGE_WORDS; i++) a[i] = pattern(SEED_B, i);
    uint64_t h = 0;
    for (size_t pg = 0; pg < pages; pg++) {
        for (size_t i = pg * PAGE_WORDS; i < (pg + 1) * PAGE_WORDS; i++)
            if (a[i] != pattern(pg % 2 ? SEED_A : SEED_B, i))
                DIE("DATA CORRUPTION at word %zu (page %zu): %016llx", i, pg, (unsigned long long)a[i]);
        h = fnv1a((const void *)&a[pg * PAGE_WORDS], PAGE_WORDS * 8, h);
    }
    printf("checksum=%016llx\n", (unsigned long long)h);
    free((void *)a);
    return 0;
}
