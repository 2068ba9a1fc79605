/* parallel_faults: THREADS threads make UPDATES random 8-byte updates in all (the same total work
 * whatever THREADS is) on a buffer of MiB, so that under a small local buffer several threads
 * fault at once.
 *   disjoint: each thread updates words of its own slice of the buffer;
 *   shared:   every thread updates words anywhere (atomic XOR: threads fault on, and race for,
 *             the same pages).
 * XOR commutes, so the final contents do not depend on how the threads interleave: the checksum
 * printed at the end is the same natively and under rackmem. With FORKS > 0 the main thread forks
 * that many times while the threads update; each child verifies a second buffer that no thread
 * touches (its pages were evicted and live on the brick) and exits 0 if it reads back intact.
 * Prints "running" once the threads have started (for tests that act meanwhile), then
 * seconds=..., forks=..., checksum=....
 * usage: parallel_faults MiB THREADS disjoint|shared UPDATES [FORKS] */
#include "common.h"
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64

static uint64_t *a;
static size_t words, per_thread;
static int threads, shared;

static void *worker(void *arg) {
    size_t t = (size_t)arg;
    uint64_t s = 88172645463325252ull ^ (0x9E3779B97F4A7C15ull * (t + 1));
    size_t slice = words / (size_t)threads;
    uint64_t *base = shared ? a : a + t * slice;
    size_t span = shared ? words : slice;
    for (size_t i = 0; i < per_thread; i++) {
        uint64_t r = xorshift64(&s);
        __atomic_fetch_xor(&base[r % span], r, __ATOMIC_RELAXED);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) DIE("usage: parallel_faults MiB THREADS disjoint|shared UPDATES [FORKS]");
    size_t bytes = arg_mib(argc, argv, 1, 64);
    threads = atoi(argv[2]);
    if (threads < 1 || threads > MAX_THREADS) DIE("THREADS must be 1..%d", MAX_THREADS);
    if (!strcmp(argv[3], "shared")) shared = 1;
    else if (strcmp(argv[3], "disjoint")) DIE("mode must be disjoint or shared, not %s", argv[3]);
    size_t updates = strtoull(argv[4], 0, 0);
    int forks = argc > 5 ? atoi(argv[5]) : 0;
    words = bytes / 8;
    per_thread = updates / (size_t)threads;
    a = malloc(bytes);
    if (!a) DIE("malloc(%zu)", bytes);
    /* Untouched by the threads; filled first, so the buffer above pushes it out to the brick. */
    size_t quiet_words = forks ? words / 4 : 0;
    uint64_t *quiet = forks ? malloc(quiet_words * 8) : 0;
    if (forks && !quiet) DIE("malloc(%zu)", quiet_words * 8);
    if (quiet) fill(quiet, quiet_words, 29);
    fill(a, words, 17);
    pthread_t tid[MAX_THREADS];
    double t0 = now_s();
    for (int t = 0; t < threads; t++)
        if (pthread_create(&tid[t], 0, worker, (void *)(size_t)t)) DIE("pthread_create");
    printf("running\n");
    fflush(stdout);
    for (int f = 0; f < forks; f++) {
        usleep(50000);
        pid_t p = fork();
        if (p < 0) DIE("fork");
        if (p == 0) {
            verify(quiet, quiet_words, 29, "the untouched buffer in a child forked while threads fault");
            _exit(0);
        }
        int st;
        if (waitpid(p, &st, 0) != p) DIE("waitpid");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) DIE("child %d of a fork while threads fault failed (status %#x)", f, st);
    }
    for (int t = 0; t < threads; t++) pthread_join(tid[t], 0);
    double secs = now_s() - t0;
    if (quiet) verify(quiet, quiet_words, 29, "the untouched buffer after the forks");
    printf("seconds=%.3f\n", secs);
    printf("forks=%d\n", forks);
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, bytes, 0));
    free(quiet);
    free(a);
    return 0;
}
