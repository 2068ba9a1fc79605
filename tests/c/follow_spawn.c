/* follow_spawn: one thread faults alone (random updates over a buffer), so that the fault
 * handler follows it onto its CPU; then it starts a thread, which must not stay confined to that
 * CPU. Both threads print the CPUs they may use (from /proc/thread-self/status) after a pause,
 * and the program prints a checksum of the buffer.
 * usage: follow_spawn MiB UPDATES */
#include "common.h"
#include <pthread.h>
#include <unistd.h>

static void print_cpus(const char *who) {
    FILE *f = fopen("/proc/thread-self/status", "r");
    if (!f) DIE("cannot read /proc/thread-self/status");
    char line[256];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Cpus_allowed_list:", 18)) printf("%s %s", who, line);
    fclose(f);
}

static void *worker(void *arg) {
    (void)arg;
    usleep(800 * 1000); /* longer than a watchdog tick */
    print_cpus("worker");
    return 0;
}

int main(int argc, char **argv) {
    size_t bytes = arg_mib(argc, argv, 1, 32);
    size_t updates = argc > 2 ? strtoull(argv[2], 0, 0) : 200000;
    size_t words = bytes / 8;
    uint64_t *a = malloc(bytes);
    if (!a) DIE("malloc(%zu)", bytes);
    fill(a, words, 21);
    uint64_t s = 2463534242ull;
    for (size_t i = 0; i < updates; i++) {
        uint64_t r = xorshift64(&s);
        a[r % words] += r;
    }
    pthread_t t;
    if (pthread_create(&t, 0, worker, 0)) DIE("pthread_create");
    pthread_join(t, 0);
    print_cpus("main");
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, bytes, 0));
    free(a);
    return 0;
}
