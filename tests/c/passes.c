/* passes: sequential and random read/write passes over one big malloc'd buffer, optionally by
 * several threads on disjoint slices. Checks the data after every pass; prints a checksum that
 * must equal the native run's.  usage: passes [MiB=64] [threads=1] [passes=3] */
#include "common.h"
#include <pthread.h>

struct slice { uint64_t *a; size_t words; int passes; uint64_t seed; uint64_t sum; };

static void *work(void *arg) {
    struct slice *s = arg;
    fill(s->a, s->words, s->seed);
    for (int p = 0; p < s->passes; p++) {
        /* sequential read+write: a[i] += i, verified against the expected value */
        for (size_t i = 0; i < s->words; i++) s->a[i] += i;
        for (size_t i = 0; i < s->words; i++)
            if (s->a[i] != pattern(s->seed, i) + (uint64_t)(p + 1) * i) DIE("DATA CORRUPTION after sequential pass %d at word %zu", p, i);
        /* random updates, undone in reverse order so the data stays known */
        uint64_t rs = s->seed + 17 + (uint64_t)p;
        size_t n = s->words / 256; /* random faults are the slow case: keep tests short */
        for (size_t k = 0; k < n; k++) { size_t i = xorshift64(&rs) % s->words; s->a[i] ^= 0x5a5a5a5a5a5a5a5aull; }
        rs = s->seed + 17 + (uint64_t)p;
        for (size_t k = 0; k < n; k++) { size_t i = xorshift64(&rs) % s->words; s->a[i] ^= 0x5a5a5a5a5a5a5a5aull; }
    }
    s->sum = fnv1a(s->a, s->words * 8, 0);
    return 0;
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 64);
    int threads = argc > 2 ? atoi(argv[2]) : 1, passes = argc > 3 ? atoi(argv[3]) : 3;
    if (threads < 1 || threads > 64) DIE("threads must be 1..64");
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc(%zu) failed", len);
    size_t words = len / 8, per = words / (size_t)threads;
    pthread_t t[64];
    struct slice s[64];
    for (int i = 0; i < threads; i++) {
        s[i] = (struct slice){ a + (size_t)i * per, per, passes, (uint64_t)i + 1, 0 };
        if (pthread_create(&t[i], 0, work, &s[i])) DIE("pthread_create");
    }
    uint64_t h = 0;
    for (int i = 0; i < threads; i++) { pthread_join(t[i], 0); h = fnv1a(&s[i].sum, 8, h); }
    printf("checksum=%016llx\n", (unsigned long long)h);
    free(a);
    return 0;
}
