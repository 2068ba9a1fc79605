/* thrash_threads: two threads, each making UPDATES random 8-byte updates on a working set of its
 * own (MiB each), beside a cold buffer of the same size filled first and never touched again.
 * At 50% local the buffer holds one working set and a half: one thread's fits alone, the two
 * together do not, so their faults evict each other's pages (what load control is for).
 *   plain: the threads update independently;
 *   mutex: every update happens with a mutex shared by both threads held, in chunks of 64, so
 *          a thread that faults while holding it keeps the other waiting (load control must
 *          not hold the lock holder's faults for long while the other waits for it).
 * XOR of a per-thread random sequence on a private buffer: the final contents are the same
 * natively and under rackmem whatever the interleaving. Prints seconds=... and checksum=....
 * usage: thrash_threads MiB UPDATES plain|mutex */
#include "common.h"
#include <pthread.h>
#include <time.h>

static uint64_t *ws[2];
static size_t words, updates;
static int use_mutex;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t chunks; /* under `lock`: chunks done by both threads */

static void *worker(void *arg) {
    size_t t = (size_t)arg;
    uint64_t s = 0x2545F4914F6CDD1Dull ^ (0x9E3779B97F4A7C15ull * (t + 1));
    uint64_t *a = ws[t];
    for (size_t i = 0; i < updates; i += 64) {
        if (use_mutex && pthread_mutex_lock(&lock)) DIE("pthread_mutex_lock");
        for (size_t j = i; j < i + 64 && j < updates; j++) {
            uint64_t r = xorshift64(&s);
            a[r % words] ^= r;
        }
        if (use_mutex) {
            chunks++;
            if (pthread_mutex_unlock(&lock)) DIE("pthread_mutex_unlock");
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) DIE("usage: thrash_threads MiB UPDATES plain|mutex");
    size_t bytes = arg_mib(argc, argv, 1, 16);
    updates = strtoull(argv[2], 0, 0);
    if (!strcmp(argv[3], "mutex")) use_mutex = 1;
    else if (strcmp(argv[3], "plain")) DIE("mode must be plain or mutex, not %s", argv[3]);
    words = bytes / 8;
    uint64_t *cold = malloc(bytes);
    ws[0] = malloc(bytes);
    ws[1] = malloc(bytes);
    if (!cold || !ws[0] || !ws[1]) DIE("malloc(%zu) x3", bytes);
    fill(ws[0], words, 3);
    fill(ws[1], words, 5);
    fill(cold, words, 7);
    pthread_t tid[2];
    double t0 = now_s();
    for (size_t t = 0; t < 2; t++)
        if (pthread_create(&tid[t], 0, worker, (void *)t)) DIE("pthread_create");
    for (int t = 0; t < 2; t++) pthread_join(tid[t], 0);
    double secs = now_s() - t0;
    verify(cold, words, 7, "the cold buffer");
    uint64_t want = use_mutex ? 2 * ((updates + 63) / 64) : 0;
    if (chunks != want) DIE("chunks done under the mutex: %llu, expected %llu", (unsigned long long)chunks, (unsigned long long)want);
    printf("seconds=%.3f\n", secs);
    printf("checksum=%016llx\n", (unsigned long long)(fnv1a(ws[0], bytes, 0) ^ (fnv1a(ws[1], bytes, 0) << 1)));
    free(cold);
    free(ws[0]);
    free(ws[1]);
    return 0;
}
