/* stride_read: fills a buffer with a pattern, then makes read passes over it, reading BURST
 * consecutive pages out of every STRIDE (all words of each page read are checked).
 * `1 1` reads sequentially: every page a fault's run fetches ahead is used. `4 64` reads four
 * pages and jumps far: the stream detector sees a stream of four, whose last run fetches pages
 * that are never read. `1 8` reads a page and skips seven: a strided stream, whose runs fetch
 * the pages the stride predicts (the ones read), not the seven between.
 * Prints the checksum of what it read; the test compares it with the native run and reads the
 * read-ahead statistics. usage: stride_read [MiB=64] [burst=1] [stride=1] [passes=3] */
#include "common.h"

#define PAGE_WORDS 512

int main(int argc, char **argv) {
    size_t bytes = arg_mib(argc, argv, 1, 64);
    size_t burst = argc > 2 ? strtoull(argv[2], 0, 0) : 1;
    size_t stride = argc > 3 ? strtoull(argv[3], 0, 0) : 1;
    int passes = argc > 4 ? atoi(argv[4]) : 3;
    if (burst == 0 || stride < burst) DIE("need 1 <= burst <= stride");
    size_t words = bytes / 8, pages = words / PAGE_WORDS;
    uint64_t *a = malloc(bytes);
    if (!a) DIE("malloc(%zu) failed", bytes);
    fill(a, words, 11);
    uint64_t h = 0;
    for (int p = 0; p < passes; p++) {
        for (size_t pg = 0; pg < pages; pg++) {
            if (pg % stride >= burst) continue;
            const uint64_t *w = &a[pg * PAGE_WORDS];
            for (size_t i = 0; i < PAGE_WORDS; i++)
                if (w[i] != pattern(11, pg * PAGE_WORDS + i))
                    DIE("DATA CORRUPTION at page %zu word %zu: %016llx", pg, i, (unsigned long long)w[i]);
            h = fnv1a(w, PAGE_WORDS * 8, h);
        }
    }
    printf("checksum=%016llx\n", (unsigned long long)h);
    free(a);
    return 0;
}
