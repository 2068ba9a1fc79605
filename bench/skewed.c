/* skewed: read-modify-write updates where most go to a hot fifth of the pages (the shape of an
 * index over a table, or a cache with a hot key set), the rest spread over the cold pages.
 * usage: skewed [MiB=1024] [updates=400000] [hot_percent_of_accesses=80] [seed=1]
 * The hot pages are every fifth page (strided, so neither they nor the cold ones form a run a
 * sequential prefetcher would guess). An eviction policy that keeps the hot set resident faults
 * about once per page plus once per cold access; one that cannot tell hot from cold faults on
 * hot pages too.
 * prints: result name=skewed bytes=.. pages=.. hot_pages=.. updates=.. cold_updates=..
 *         seconds=.. updates_per_s=.. rate=.. checksum=..
 * (cold_updates + pages is the fault count a perfect policy approaches at a local buffer that
 * holds the hot set; the checksum covers every word, the same natively and under rackmem) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "bench.h"

#define PAGE 4096
#define WORDS_PER_PAGE (PAGE / 8)

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 1024;
    size_t updates = argc > 2 ? strtoull(argv[2], 0, 0) : 400000;
    uint64_t hot_pct = argc > 3 ? strtoull(argv[3], 0, 0) : 80;
    uint64_t s = argc > 4 ? strtoull(argv[4], 0, 0) : 1;
    size_t pages = (mib << 20) / PAGE;
    if (pages < 5 || hot_pct > 100 || s == 0) {
        fprintf(stderr, "skewed: needs at least 5 pages (20 KiB), hot percent 0..100, seed > 0\n");
        return 2;
    }
    size_t hot = pages / 5, cold = pages - hot;
    uint64_t *t = malloc(pages * PAGE);
    if (!t) { fprintf(stderr, "skewed: malloc of %zu MiB failed\n", mib); return 1; }
    for (size_t i = 0; i < pages * WORDS_PER_PAGE; i++) t[i] = i;
    size_t cold_updates = 0;
    double t0 = now();
    for (size_t k = 0; k < updates; k++) {
        uint64_t r = next(&s);
        size_t page;
        if (r % 100 < hot_pct) {
            page = 5 * (next(&s) % hot);
        } else {
            size_t c = next(&s) % cold;        /* the c-th cold page: 4 of every 5 */
            page = 5 * (c / 4) + 1 + c % 4;
            if (page >= pages) page = pages - 1 - (page - pages) % 4; /* the tail past the last hot page */
            cold_updates++;
        }
        t[page * WORDS_PER_PAGE + r % WORDS_PER_PAGE] ^= r;
    }
    double dt = now() - t0;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < pages * WORDS_PER_PAGE; i++) h = (h ^ t[i]) * 1099511628211ull; /* FNV-1a */
    printf("result name=skewed bytes=%zu pages=%zu hot_pages=%zu updates=%zu cold_updates=%zu seconds=%.4f "
           "updates_per_s=%.1f rate=%.1f checksum=%016llx\n",
           pages * PAGE, pages, hot, updates, cold_updates, dt, updates / dt, updates / dt, (unsigned long long)h);
    free(t);
    return 0;
}
