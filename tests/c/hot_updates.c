/* hot_updates: random read-modify-write updates of 8-byte words, confined to a hot part of a
 * buffer, the way GUPS updates a table: the working set is that hot part. The buffer is filled
 * first; then updates run for SECONDS (or exactly UPDATES of them, when given, to repeat a run),
 * and the program prints how many it made and a checksum of the whole buffer.
 * usage: hot_updates MiB HOT_PERCENT SECONDS [UPDATES] */
#include "common.h"
#include <time.h>

int main(int argc, char **argv) {
    if (argc < 4) DIE("usage: hot_updates MiB HOT_PERCENT SECONDS [UPDATES]");
    size_t bytes = arg_mib(argc, argv, 1, 64);
    size_t hot_pct = strtoull(argv[2], 0, 0);
    double seconds = strtod(argv[3], 0);
    size_t fixed = argc > 4 ? strtoull(argv[4], 0, 0) : 0;
    if (hot_pct < 1 || hot_pct > 100) DIE("HOT_PERCENT must be 1..100");
    size_t words = bytes / 8;
    size_t hot = words / 100 * hot_pct;
    uint64_t *a = malloc(bytes);
    if (!a) DIE("malloc(%zu)", bytes);
    fill(a, words, 11);
    uint64_t s = 88172645463325252ull;
    size_t n = 0;
    double end = now_s() + seconds;
    for (;;) {
        if (fixed ? n >= fixed : (n % 4096 == 0 && now_s() >= end)) break;
        uint64_t r = xorshift64(&s);
        a[r % hot] ^= r;
        n++;
    }
    printf("updates=%zu\n", n);
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, bytes, 0));
    free(a);
    return 0;
}
