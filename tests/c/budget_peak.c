/* budget_peak: the local buffer is a share of the peak footprint, not of the footprint now.
 * Allocates a scratch array and a kept array, fills both, frees the scratch, then reads the kept
 * array over and over, counting the bytes those passes read from the brick (on demand and ahead)
 * with rackmem's own statistics. With --local 50% and scratch >= kept, the kept array fits half
 * of the peak: after the pass that brings it back, passes read (almost) nothing. Prints the
 * checksum of the kept array and the bytes read by the last passes. Runs natively too (0).
 * usage: budget_peak SCRATCH_MIB KEPT_MIB PASSES */
#include "common.h"
#include <dlfcn.h>
#include "../../include/rackmem.h"

int main(int argc, char **argv) {
    size_t scratch = arg_mib(argc, argv, 1, 80), kept = arg_mib(argc, argv, 2, 48);
    int passes = argc > 3 ? atoi(argv[3]) : 4;
    int (*get_stats)(struct rackmem_stats *) =
        (int (*)(struct rackmem_stats *))dlsym(RTLD_DEFAULT, "rackmem_get_stats");
    uint64_t *a = malloc(scratch), *b = malloc(kept);
    if (!a || !b) DIE("malloc failed");
    size_t aw = scratch / 8, bw = kept / 8;
    fill(a, aw, 1);
    fill(b, bw, 2);
    verify(a, aw, 1, "scratch array");
    free(a);
    /* The first pass brings back what the fill evicted; the others should find it resident. */
    verify(b, bw, 2, "kept array, first pass");
    struct rackmem_stats st = {0};
    uint64_t before = 0, after = 0, budget = 0;
    if (get_stats && get_stats(&st) == 0) before = st.bytes_fetched + st.bytes_prefetched;
    for (int p = 1; p < passes; p++) verify(b, bw, 2, "kept array");
    if (get_stats && get_stats(&st) == 0) {
        after = st.bytes_fetched + st.bytes_prefetched;
        budget = st.budget_bytes;
    }
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(b, kept, 0));
    printf("read_after_first_pass=%llu budget_mib=%llu\n", (unsigned long long)(after - before),
           (unsigned long long)(budget >> 20));
    free(b);
    return 0;
}
