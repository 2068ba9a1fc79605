/* fork_late: forked children whose first write-back comes at once, or only after they have been
 * idle for longer than a watchdog tick (a lazily forked child starts its write-back and watchdog
 * threads at its first write-back job, or once it has lived one tick). The parent fills a
 * buffer and, for each delay given, changes one page, forks and waits for the child. Each child
 * sleeps its delay, checks it sees the parent's data as of its fork, writes its own pattern over
 * the whole buffer in two passes (more than a small local buffer holds, so pages go back to the
 * brick and come again), checks it after each pass and exits 0. At the end the parent checks its
 * own buffer (no child's write may show). Prints checksums.
 * usage: fork_late [MiB=32] [delay_ms...] (default delays: 0 400) */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

enum { SEED_A = 1000, SEED_P = 5000, SEED_C = 9000, PAGE_WORDS = 4096 / 8 };

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 32), words = len / 8, pages = len / 4096;
    int defaults[] = {0, 400};
    int n = argc > 2 ? argc - 2 : 2;
    if (pages < 2) DIE("usage: fork_late [MiB>0] [delay_ms...]");
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, words, SEED_A);
    for (int i = 0; i < n; i++) {
        int delay = argc > 2 ? atoi(argv[2 + i]) : defaults[i];
        /* A page the parent changes before this fork: the child must see it, later children too. */
        size_t pg = (size_t)i * 7919u % pages;
        for (size_t w = pg * PAGE_WORDS; w < (pg + 1) * PAGE_WORDS; w++) a[w] = pattern(SEED_P + (uint64_t)i, w);
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) DIE("fork: %m");
        if (pid == 0) {
            if (delay > 0) usleep((useconds_t)delay * 1000);
            for (size_t p = 0; p < pages; p++) {
                uint64_t s = SEED_A;
                for (int j = 0; j <= i; j++)
                    if ((size_t)j * 7919u % pages == p) s = SEED_P + (uint64_t)j;
                check_page(a, p, s, "child's view of the parent's memory at fork");
            }
            for (int pass = 0; pass < 2; pass++) {
                uint64_t s = SEED_C + (uint64_t)i * 10 + (uint64_t)pass;
                fill(a, words, s);
                verify(a, words, s, "child's own writes");
            }
            printf("child %d (delay %d ms) checksum=%016llx\n", i, delay, (unsigned long long)fnv1a(a, len, 0));
            exit(0); /* not _exit: the runtime reports this process's statistics at exit */
        }
        int st;
        if (waitpid(pid, &st, 0) != pid) DIE("waitpid: %m");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            DIE("child %d failed: %s %d", i, WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    for (size_t p = 0; p < pages; p++) {
        uint64_t s = SEED_A;
        for (int j = 0; j < n; j++)
            if ((size_t)j * 7919u % pages == p) s = SEED_P + (uint64_t)j;
        check_page(a, p, s, "parent's memory after its children");
    }
    printf("parent checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
    return 0;
}
