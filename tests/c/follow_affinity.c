/* follow_affinity: one thread faults alone (random updates over a buffer), so that the fault
 * handler confines it to its CPU; meanwhile it asks for its own affinity mask, as a program
 * sizing a thread pool does (OpenBLAS at NumPy's import), through sched_getaffinity and
 * pthread_getaffinity_np, and reads the kernel's mask from /proc/thread-self/status. It prints
 * the fewest CPUs each way reported, how many checks found the kernel's mask confined to one
 * CPU, and a checksum of the buffer.
 * usage: follow_affinity MiB UPDATES CHECKS */
#include "common.h"
#include <pthread.h>
#include <sched.h>

static int kernel_cpus(void) {
    FILE *f = fopen("/proc/thread-self/status", "r");
    if (!f) DIE("cannot read /proc/thread-self/status");
    char line[4096];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Cpus_allowed_list:", 18)) {
            /* "0-3,5": count the CPUs of each piece. */
            n = 0;
            for (char *p = line + 18; *p && *p != '\n';) {
                while (*p == ' ' || *p == '\t' || *p == ',') p++;
                if (!*p || *p == '\n') break;
                long a = strtol(p, &p, 10), b = a;
                if (*p == '-') b = strtol(p + 1, &p, 10);
                n += (int)(b - a + 1);
            }
        }
    fclose(f);
    if (n < 0) DIE("no Cpus_allowed_list in /proc/thread-self/status");
    return n;
}

int main(int argc, char **argv) {
    size_t bytes = arg_mib(argc, argv, 1, 32);
    size_t updates = argc > 2 ? strtoull(argv[2], 0, 0) : 200000;
    size_t checks = argc > 3 ? strtoull(argv[3], 0, 0) : 400;
    size_t words = bytes / 8;
    uint64_t *a = malloc(bytes);
    if (!a) DIE("malloc(%zu)", bytes);
    fill(a, words, 21);
    uint64_t s = 2463534242ull;
    int sched_min = 1 << 30, pthread_min = 1 << 30, kernel_min = 1 << 30, confined = 0;
    size_t every = updates / (checks ? checks : 1) + 1;
    for (size_t i = 0; i < updates; i++) {
        uint64_t r = xorshift64(&s);
        a[r % words] += r;
        if (i % every) continue;
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(0, sizeof set, &set)) DIE("sched_getaffinity");
        int n = CPU_COUNT(&set);
        if (n < sched_min) sched_min = n;
        CPU_ZERO(&set);
        if (pthread_getaffinity_np(pthread_self(), sizeof set, &set)) DIE("pthread_getaffinity_np");
        n = CPU_COUNT(&set);
        if (n < pthread_min) pthread_min = n;
        n = kernel_cpus();
        if (n < kernel_min) kernel_min = n;
        confined += n == 1;
    }
    printf("sched_getaffinity=%d pthread_getaffinity_np=%d kernel=%d confined_checks=%d\n", sched_min,
           pthread_min, kernel_min, confined);
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, bytes, 0));
    free(a);
    return 0;
}
