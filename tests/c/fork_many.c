/* fork_many: a loop of forks whose children read and write parts of the parent's memory, the
 * way a server forking per connection uses it. The parent fills a buffer, then N times: changes
 * a few pages of it (so every child has a different "memory as of the fork"), forks, and waits
 * for the child. Each child checks `touch` pages spread over the buffer against what the parent
 * held at the fork, writes its own pattern over them and checks that, and exits 0 only if all
 * held. With touch = 0 the child exits at once (what a child that execs costs). At the end the
 * parent checks its whole buffer (no child's write may show) and prints a checksum.
 * The time per fork (fork to the child's exit reaped, and the parent's fork() call alone) goes
 * to stderr, so that stdout is the same natively and under rackmem.
 * usage: fork_many [MiB=32] [forks=20] [touch=16] */
#include "common.h"
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { SEED_A = 1000, SEED_P = 5000, SEED_C = 9000, PAGE_WORDS = 4096 / 8 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The page the parent changes before fork i. */
static size_t parent_page(size_t pages, int i) { return ((size_t)i * 7919u) % pages; }

/* Seed of page `pg` in the parent after it changed pages for forks 0..=last. */
static uint64_t seed_of(size_t pages, size_t pg, int last) {
    uint64_t s = SEED_A;
    for (int i = 0; i <= last; i++)
        if (parent_page(pages, i) == pg) s = SEED_P + (uint64_t)i;
    return s;
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 32), pages = len / 4096;
    int forks = argc > 2 ? atoi(argv[2]) : 20;
    int touch = argc > 3 ? atoi(argv[3]) : 16;
    if (forks < 1 || touch < 0 || pages < 2) DIE("usage: fork_many [MiB>0] [forks>0] [touch>=0]");
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, len / 8, SEED_A);
    double in_fork = 0, total = 0;
    for (int i = 0; i < forks; i++) {
        size_t pg = parent_page(pages, i);
        for (size_t w = pg * PAGE_WORDS; w < (pg + 1) * PAGE_WORDS; w++) a[w] = pattern(SEED_P + (uint64_t)i, w);
        fflush(stdout);
        double t0 = now();
        pid_t pid = fork();
        double t1 = now();
        if (pid < 0) DIE("fork: %m");
        if (pid == 0) {
            /* Pages spread over the buffer, a different set per child, the parent's latest among them. */
            for (int k = 0; k < touch; k++) {
                size_t p = k == 0 ? pg : (pg + (size_t)k * (pages / (size_t)touch + 1) + (size_t)i) % pages;
                check_page(a, p, seed_of(pages, p, i), "child's view of the parent's memory at fork");
                uint64_t s = SEED_C + (uint64_t)i * 1000 + (uint64_t)k;
                for (size_t w = p * PAGE_WORDS; w < (p + 1) * PAGE_WORDS; w++) a[w] = pattern(s, w);
                check_page(a, p, s, "child's own write");
            }
            exit(0); /* not _exit: the runtime reports this process's statistics at exit */
        }
        int st;
        if (waitpid(pid, &st, 0) != pid) DIE("waitpid: %m");
        double t2 = now();
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            DIE("child %d failed: %s %d", i, WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        in_fork += t1 - t0;
        total += t2 - t0;
    }
    for (size_t p = 0; p < pages; p++) check_page(a, p, seed_of(pages, p, forks - 1), "parent's memory after the children");
    printf("forks=%d touch=%d checksum=%016llx\n", forks, touch, (unsigned long long)fnv1a(a, len, 0));
    fprintf(stderr, "fork_many: %.1f us per fork (fork() call %.1f us in the parent)\n", total / forks * 1e6,
            in_fork / forks * 1e6);
    return 0;
}
