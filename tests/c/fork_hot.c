/* fork_hot: a server forking per connection whose children all read the same pages of its
 * memory, as PostgreSQL's backends read the postmaster's. The parent fills a data buffer, then a
 * scratch buffer three times its size that pushes the data out of a small local buffer, and
 * frees the scratch (room again, the data still away). Then N times: it changes one hot page of
 * the data (so each child has its own "memory as of the fork", and the parent writes pages live
 * children share), forks, and keeps up to 4 children alive at once. Each child checks every hot
 * page against what the parent held at its fork, sleeps, checks them again (the parent has
 * changed some meanwhile), writes its own pattern over two of them and checks that; every tenth
 * child forks a grandchild that checks the same pages as of the child's fork. At the end the
 * parent checks its whole data buffer (no child's write may show) and prints a checksum.
 * usage: fork_hot [MiB=8] [forks=60] [hot=64] */
#include "common.h"
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { SEED_A = 100, SEED_P = 5000, SEED_C = 9000, SEED_SCRATCH = 77, PAGE_WORDS = 4096 / 8, LIVE = 4 };

static size_t pages, hot;

/* The hot page k: spread over the data buffer. */
static size_t hot_page(size_t k) { return k * (pages / hot); }
/* The hot page the parent changes before fork i. */
static size_t changed(int i) { return hot_page((size_t)i * 7u % hot); }

/* Seed of page `pg` in the parent after it changed pages for forks 0..=last. */
static uint64_t seed_of(size_t pg, int last) {
    uint64_t s = SEED_A;
    for (int i = 0; i <= last; i++)
        if (changed(i) == pg) s = SEED_P + (uint64_t)i;
    return s;
}

static void check_hot(const uint64_t *a, int as_of, const char *what) {
    for (size_t k = 0; k < hot; k++) check_page(a, hot_page(k), seed_of(hot_page(k), as_of), what);
}

static void reap(pid_t pid) {
    int st;
    if (waitpid(pid, &st, 0) != pid) DIE("waitpid: %m");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        DIE("child %d failed: %s %d", (int)pid, WIFEXITED(st) ? "exit" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 8);
    int forks = argc > 2 ? atoi(argv[2]) : 60;
    hot = argc > 3 ? (size_t)atoi(argv[3]) : 64;
    pages = len / 4096;
    if (forks < 1 || hot < 1 || pages < hot) DIE("usage: fork_hot [MiB>0] [forks>0] [hot>0, at most the pages]");
    uint64_t *a = malloc(len);
    uint64_t *scratch = malloc(3 * len);
    if (!a || !scratch) DIE("malloc");
    fill(a, len / 8, SEED_A);
    fill(scratch, 3 * len / 8, SEED_SCRATCH);
    verify(scratch, 3 * len / 8, SEED_SCRATCH, "scratch");
    free(scratch);
    pid_t live[LIVE] = {0};
    for (int i = 0; i < forks; i++) {
        size_t pg = changed(i);
        for (size_t w = pg * PAGE_WORDS; w < (pg + 1) * PAGE_WORDS; w++) a[w] = pattern(SEED_P + (uint64_t)i, w);
        if (live[i % LIVE]) reap(live[i % LIVE]);
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) DIE("fork: %m");
        if (pid == 0) {
            check_hot(a, i, "child's view of the parent's memory at fork");
            pid_t grandchild = 0;
            if (i % 10 == 0) {
                grandchild = fork();
                if (grandchild < 0) DIE("fork: %m");
                if (grandchild == 0) {
                    check_hot(a, i, "grandchild's view of the memory at its parent's fork");
                    exit(0);
                }
            }
            nanosleep(&(struct timespec){.tv_nsec = 25 * 1000 * 1000}, NULL);
            check_hot(a, i, "child's view after the parent changed pages");
            for (size_t k = 0; k < 2; k++) {
                size_t p = hot_page(((size_t)i + k) % hot);
                uint64_t s = SEED_C + (uint64_t)i * 10 + k;
                for (size_t w = p * PAGE_WORDS; w < (p + 1) * PAGE_WORDS; w++) a[w] = pattern(s, w);
                check_page(a, p, s, "child's own write");
            }
            if (grandchild) reap(grandchild);
            exit(0); /* not _exit: the runtime reports this process's statistics at exit */
        }
        live[i % LIVE] = pid;
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k]) reap(live[k]);
    for (size_t p = 0; p < pages; p++) check_page(a, p, seed_of(p, forks - 1), "parent's memory after the children");
    printf("forks=%d hot=%zu checksum=%016llx\n", forks, hot, (unsigned long long)fnv1a(a, len, 0));
    return 0;
}
