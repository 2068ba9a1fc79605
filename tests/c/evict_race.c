/* evict_race: several threads keep writing into pages that the runtime keeps evicting (a tiny
 * local buffer and many pages), each thread incrementing its own counter word in every page.
 * Every increment must survive: a write that lands while its page is being moved out and written
 * back must not be lost. usage: evict_race [MiB=16] [threads=3] [rounds=20] */
#include "common.h"
#include <pthread.h>

static uint64_t *a;
static size_t pages;
static int rounds;

static void *work(void *arg) {
    size_t t = (size_t)arg;
    uint64_t s = t + 1;
    for (int r = 0; r < rounds; r++)
        for (size_t k = 0; k < pages; k++) {
            size_t p = xorshift64(&s) % pages;
            __atomic_fetch_add(&a[p * 512 + t * 8], 1, __ATOMIC_RELAXED);
        }
    return 0;
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 16);
    int threads = argc > 2 ? atoi(argv[2]) : 3;
    rounds = argc > 3 ? atoi(argv[3]) : 20;
    if (threads < 1 || threads > 32) DIE("threads must be 1..32");
    pages = len / 4096;
    a = calloc(len / 8, 8);
    if (!a) DIE("calloc");
    pthread_t th[32];
    for (int t = 0; t < threads; t++) pthread_create(&th[t], 0, work, (void *)(size_t)t);
    for (int t = 0; t < threads; t++) pthread_join(th[t], 0);
    /* Recompute each thread's expected per-page counts with the same generator. */
    uint64_t h = 0;
    for (int t = 0; t < threads; t++) {
        uint32_t *want = calloc(pages, 4);
        uint64_t s = (uint64_t)t + 1;
        for (int r = 0; r < rounds; r++)
            for (size_t k = 0; k < pages; k++) want[xorshift64(&s) % pages]++;
        for (size_t p = 0; p < pages; p++)
            if (a[p * 512 + (size_t)t * 8] != want[p])
                DIE("DATA CORRUPTION: lost writes: thread %d page %zu has %llu, expected %u", t, p,
                    (unsigned long long)a[p * 512 + (size_t)t * 8], want[p]);
        h = fnv1a(want, pages * 4, h);
        free(want);
    }
    printf("checksum=%016llx\n", (unsigned long long)h);
    return 0;
}
