/* run_budget: children that together need more than a per-process share. The parent forks
 * `children` processes at once; each allocates its own buffer of MiB, fills it with a pattern of
 * its own, and verifies it `passes` times (every pass touches every page: a process whose pages
 * stayed local would hold its whole buffer), then prints its checksum. Under `rackmem run
 * --local SIZE` the run's processes share SIZE, so their anonymous memory together stays near
 * SIZE instead of SIZE per process.
 * usage: run_budget [MiB=48] [children=4] [passes=4] */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 48);
    int children = argc > 2 ? atoi(argv[2]) : 4;
    int passes = argc > 3 ? atoi(argv[3]) : 4;
    if (len < 4096 || children < 1 || passes < 1) DIE("usage: run_budget [MiB>0] [children>0] [passes>0]");
    fflush(stdout);
    for (int c = 0; c < children; c++) {
        pid_t pid = fork();
        if (pid < 0) DIE("fork: %m");
        if (pid == 0) {
            uint64_t *a = malloc(len);
            if (!a) DIE("malloc");
            uint64_t seed = 100 + (uint64_t)c;
            fill(a, len / 8, seed);
            for (int p = 0; p < passes; p++) verify(a, len / 8, seed, "a child's buffer");
            printf("child %d checksum=%016llx\n", c, (unsigned long long)fnv1a(a, len, 0));
            free(a);
            exit(0); /* not _exit: the runtime reports this process's statistics at exit */
        }
    }
    int failed = 0;
    for (int c = 0; c < children; c++) {
        int st;
        if (wait(&st) < 0) DIE("wait: %m");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    if (failed) DIE("%d children failed", failed);
    return 0;
}
