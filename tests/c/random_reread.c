/* random_reread: pages evicted earlier come back in random order while the local buffer has room,
 * the shape of Graph500 BFS's first search (its edge list freed, its adjacency array read back at
 * random). Fills a kept array, then a scratch array that pushes most of the kept one to the brick
 * (at --local 50% of both), frees the scratch, then reads one word of every page of the kept
 * array in a random order of its pages, counting the faults of that phase with rackmem's own
 * statistics. Then verifies the whole kept array and prints its checksum. Runs natively too (0).
 * usage: random_reread SCRATCH_MIB KEPT_MIB
 * prints: checksum=.. and pages=.. reread_faults=.. */
#include "common.h"
#include <dlfcn.h>
#include "../../include/rackmem.h"

int main(int argc, char **argv) {
    size_t scratch = arg_mib(argc, argv, 1, 64), kept = arg_mib(argc, argv, 2, 48);
    int (*get_stats)(struct rackmem_stats *) =
        (int (*)(struct rackmem_stats *))dlsym(RTLD_DEFAULT, "rackmem_get_stats");
    uint64_t *b = malloc(kept), *a = malloc(scratch);
    size_t pages = kept / 4096, words_per_page = 4096 / 8;
    uint32_t *order = malloc(pages * sizeof(uint32_t));
    if (!a || !b || !order) DIE("malloc failed");
    size_t aw = scratch / 8, bw = kept / 8;
    fill(b, bw, 2);
    fill(a, aw, 1);
    verify(a, aw, 1, "scratch array");
    free(a);
    for (size_t i = 0; i < pages; i++) order[i] = (uint32_t)i;
    uint64_t s = 42;
    for (size_t i = pages - 1; i > 0; i--) {
        size_t j = xorshift64(&s) % (i + 1);
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    struct rackmem_stats st = {0};
    uint64_t before = 0, after = 0;
    if (get_stats && get_stats(&st) == 0) before = st.faults;
    uint64_t sum = 0;
    for (size_t i = 0; i < pages; i++) {
        size_t w = (size_t)order[i] * words_per_page + (i % words_per_page);
        if (b[w] != pattern(2, w)) DIE("DATA CORRUPTION in the kept array at word %zu", w);
        sum += b[w];
    }
    if (get_stats && get_stats(&st) == 0) after = st.faults;
    verify(b, bw, 2, "kept array");
    printf("checksum=%016llx sum=%016llx\n", (unsigned long long)fnv1a(b, kept, 0), (unsigned long long)sum);
    printf("pages=%zu reread_faults=%llu\n", pages, (unsigned long long)(after - before));
    free(b);
    free(order);
    return 0;
}
