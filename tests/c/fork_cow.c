/* fork_cow: children that share their parent's remote pages while the parent overwrites them.
 * The parent fills a buffer (seed A), then forks `children` children, changing one stretch of
 * pages before each fork, so every child has its own "memory as of the fork". After the last
 * fork the parent overwrites the whole buffer (seed Z), twice, while every child reads its view
 * of it: under a small local buffer the parent's dirty pages are written back over pages its
 * children still share. Each child checks every page against its fork-time value, then writes
 * its own pattern over a stretch and checks it; the first child then forks a grandchild, which
 * checks the child's view (its own writes and what it shared with the parent) and writes too.
 * Nobody may see another process's writes. Exits 0 only if all held, and prints a checksum of
 * the parent's buffer.
 * usage: fork_cow [MiB=32] [children=4] */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

enum { SEED_A = 1000, SEED_F = 2000, SEED_Z = 3000, SEED_C = 4000, SEED_G = 5000, PAGE_WORDS = 4096 / 8 };

static size_t pages, stretch;

/* Seed of page `pg` in the parent just after it changed the stretch for fork `last`. */
static uint64_t at_fork(size_t pg, int last) {
    size_t s = pg / stretch;
    return (int)s <= last ? SEED_F + s : SEED_A;
}

static void fill_page(uint64_t *a, size_t pg, uint64_t seed) {
    for (size_t w = pg * PAGE_WORDS; w < (pg + 1) * PAGE_WORDS; w++) a[w] = pattern(seed, w);
}

/* A child (or grandchild) writes `seed` over stretch `s` and checks the whole buffer: its own
 * stretch, `own_before` (another stretch it wrote earlier, or none), and the rest as `base`. */
static void write_and_check(uint64_t *a, size_t s, uint64_t seed, long own_before, uint64_t before_seed, int fork_i,
                            const char *who) {
    for (size_t pg = s * stretch; pg < (s + 1) * stretch && pg < pages; pg++) fill_page(a, pg, seed);
    for (size_t pg = 0; pg < pages; pg++) {
        size_t t = pg / stretch;
        uint64_t want = t == s ? seed : (long)t == own_before ? before_seed : at_fork(pg, fork_i);
        check_page(a, pg, want, who);
    }
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 32);
    int children = argc > 2 ? atoi(argv[2]) : 4;
    pages = len / 4096;
    if (children < 1 || pages < (size_t)children * 4) DIE("usage: fork_cow [MiB] [children>0, at most MiB*64]");
    stretch = pages / ((size_t)children + 2);
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    for (size_t pg = 0; pg < pages; pg++) fill_page(a, pg, SEED_A);
    pid_t kids[children];
    for (int i = 0; i < children; i++) {
        for (size_t pg = (size_t)i * stretch; pg < (size_t)(i + 1) * stretch; pg++) fill_page(a, pg, SEED_F + (uint64_t)i);
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) DIE("fork: %m");
        if (pid > 0) {
            kids[i] = pid;
            continue;
        }
        /* Child i: its whole view, read while the parent overwrites it. */
        for (size_t pg = 0; pg < pages; pg++) check_page(a, pg, at_fork(pg, i), "child's view of the parent's memory at fork");
        size_t mine = (size_t)children + 1; /* a stretch no fork changed */
        write_and_check(a, mine, SEED_C + (uint64_t)i, -1, 0, i, "child's own write");
        if (i == 0) {
            pid_t g = fork();
            if (g < 0) DIE("fork (grandchild): %m");
            if (g == 0) {
                /* The grandchild sees the child's write and, elsewhere, the parent's memory as of
                 * the child's fork; it writes a stretch of its own. */
                write_and_check(a, 0, SEED_G, (long)mine, SEED_C, 0, "grandchild's view");
                exit(0);
            }
            int st;
            if (waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0) DIE("grandchild failed");
            /* The grandchild's write must not show here. */
            for (size_t pg = 0; pg < pages; pg++)
                check_page(a, pg, pg / stretch == mine ? SEED_C : at_fork(pg, 0), "child after its grandchild");
        }
        exit(0); /* not _exit: the runtime reports this process's statistics at exit */
    }
    /* The parent overwrites everything while the children read their views. */
    for (int round = 0; round < 2; round++)
        for (size_t pg = 0; pg < pages; pg++) fill_page(a, pg, SEED_Z + (uint64_t)round);
    int failed = 0;
    for (int i = 0; i < children; i++) {
        int st;
        if (waitpid(kids[i], &st, 0) != kids[i]) DIE("waitpid: %m");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "fork_cow: child %d failed (%s %d)\n", i, WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failed = 1;
        }
    }
    if (failed) DIE("a child failed");
    for (size_t pg = 0; pg < pages; pg++) check_page(a, pg, SEED_Z + 1, "parent's memory after its children");
    printf("children=%d checksum=%016llx\n", children, (unsigned long long)fnv1a(a, len, 0));
    return 0;
}
