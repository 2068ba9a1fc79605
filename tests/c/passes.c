/* passes: sequential and random read/write passes over one big malloc'd buffer, by one or
 * several threads. Each thread owns a slice (sequential passes, random read-modify-writes
 * undone in reverse, exact verification after every phase); then all threads hammer random
 * words of the WHOLE buffer with atomic adds (so several threads fault on the same pages at
 * once), undo them, and every slice must again hold exactly its pattern: a lost or duplicated
 * write anywhere shows up. The checksum must equal the native run's.
 * usage: passes [MiB=64] [threads=1] [passes=3] */
#include "common.h"
#include <pthread.h>

#define RANDOM_XOR 0x5a5a5a5a5a5a5a5aull

struct slice { uint64_t *a; size_t words; int passes; uint64_t seed; uint64_t sum; };

static uint64_t *all;
static size_t all_words;
static pthread_barrier_t barrier;

/* The value word i of a slice holds after `done` rounds of sequential passes (one up, one down). */
static uint64_t expected(const struct slice *s, size_t i, int done) {
    return pattern(s->seed, i) + 2 * (uint64_t)done * i;
}

static void check(const struct slice *s, int done, const char *phase) {
    for (size_t i = 0; i < s->words; i++)
        if (s->a[i] != expected(s, i, done))
            DIE("DATA CORRUPTION after %s (pass %d, thread seed %llu) at word %zu: %016llx, expected %016llx", phase,
                done, (unsigned long long)s->seed, i, (unsigned long long)s->a[i],
                (unsigned long long)expected(s, i, done));
}

/* Adds `sign * k` to random words of the whole buffer; the same generator undoes it. */
static void shared_adds(uint64_t seed, size_t n, int sign) {
    uint64_t rs = seed;
    for (size_t k = 0; k < n; k++) {
        size_t i = xorshift64(&rs) % all_words;
        __atomic_fetch_add(&all[i], sign > 0 ? k + 1 : -(k + 1), __ATOMIC_RELAXED);
    }
}

static void *work(void *arg) {
    struct slice *s = arg;
    fill(s->a, s->words, s->seed);
    int p = 0;
    for (; p < s->passes; p++) {
        /* sequential read+write, up then down (a backward memmove walks down): a[i] += i */
        for (size_t i = 0; i < s->words; i++) s->a[i] += i;
        for (size_t i = s->words; i-- > 0;) s->a[i] += i;
        check(s, p + 1, "sequential passes");
        /* random read-modify-writes (a fault on almost every one), undone in reverse order */
        uint64_t seed = s->seed * 1000 + 17 + (uint64_t)p;
        size_t n = s->words / 256; /* random faults are the slow case: keep tests short */
        uint64_t rs = seed;
        for (size_t k = 0; k < n; k++) s->a[xorshift64(&rs) % s->words] ^= RANDOM_XOR;
        rs = seed;
        for (size_t k = 0; k < n; k++) s->a[xorshift64(&rs) % s->words] ^= RANDOM_XOR;
        check(s, p + 1, "random pass");
    }
    /* shared phase: every thread touches random words of every slice at the same time */
    pthread_barrier_wait(&barrier);
    shared_adds(s->seed * 7919, all_words / 512, +1);
    pthread_barrier_wait(&barrier);
    shared_adds(s->seed * 7919, all_words / 512, -1);
    pthread_barrier_wait(&barrier);
    check(s, p, "shared random phase");
    s->sum = fnv1a(s->a, s->words * 8, 0);
    return 0;
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 64);
    int threads = argc > 2 ? atoi(argv[2]) : 1, passes = argc > 3 ? atoi(argv[3]) : 3;
    if (threads < 1 || threads > 64) DIE("threads must be 1..64");
    if (len < (size_t)threads * 4096) DIE("buffer too small for %d threads", threads);
    all = malloc(len);
    if (!all) DIE("malloc(%zu) failed", len);
    size_t per = len / 8 / (size_t)threads;
    all_words = per * (size_t)threads; /* the shared phase stays inside the slices */
    pthread_t t[64];
    struct slice s[64];
    if (pthread_barrier_init(&barrier, 0, (unsigned)threads)) DIE("pthread_barrier_init");
    for (int i = 0; i < threads; i++) {
        s[i] = (struct slice){ all + (size_t)i * per, per, passes, (uint64_t)i + 1, 0 };
        if (pthread_create(&t[i], 0, work, &s[i])) DIE("pthread_create");
    }
    uint64_t h = 0;
    for (int i = 0; i < threads; i++) { pthread_join(t[i], 0); h = fnv1a(&s[i].sum, 8, h); }
    printf("threads=%d passes=%d checksum=%016llx\n", threads, passes, (unsigned long long)h);
    free(all);
    return 0;
}
