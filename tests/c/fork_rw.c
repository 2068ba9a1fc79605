/* fork_rw: fork's copy semantics on remote memory. The parent fills a big buffer with pattern A
 * and forks. The child checks it sees A, then, pass after pass, writes pattern B_p over the
 * first half while the parent writes C_p over the second half, at the same time. After each
 * pass both wait for each other (a pipe handshake, so the other's writes have certainly
 * happened) and check they see ONLY their own writes: the child B_p then A, the parent A then
 * C_p. The child exits 0 only if everything held; the parent checks that. Both print checksums.
 * usage: fork_rw [MiB=32] [passes=3] */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

enum { SEED_A = 1000, SEED_B = 2000, SEED_C = 3000 };

/* Both sides have finished writing this pass: tell the other, then wait for the other. */
static int handshake(int to, int from) {
    char c = 'x';
    if (write(to, &c, 1) != 1) return -1;
    return read(from, &c, 1) == 1 ? 0 : -1;
}

/* Word i of pattern `seed` over the whole buffer (so halves differ from each other too). */
static void fill_range(uint64_t *a, size_t from, size_t to, uint64_t seed) {
    for (size_t i = from; i < to; i++) a[i] = pattern(seed, i);
}

static void verify_range(const uint64_t *a, size_t from, size_t to, uint64_t seed, const char *what) {
    for (size_t i = from; i < to; i++)
        if (a[i] != pattern(seed, i))
            DIE("DATA CORRUPTION: %s: word %zu (page %zu) is %016llx, expected %016llx", what, i, i * 8 / 4096,
                (unsigned long long)a[i], (unsigned long long)pattern(seed, i));
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 32), words = len / 8, half = words / 2;
    int passes = argc > 2 ? atoi(argv[2]) : 3;
    if (passes < 1) DIE("passes must be at least 1");
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill_range(a, 0, words, SEED_A);
    int p2c[2], c2p[2];
    if (pipe(p2c) || pipe(c2p)) DIE("pipe: %m");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) DIE("fork: %m");
    if (pid == 0) {
        close(p2c[1]);
        close(c2p[0]);
        verify_range(a, 0, words, SEED_A, "child's view of the parent's data at fork");
        for (int p = 0; p < passes; p++) {
            fill_range(a, 0, half, SEED_B + (uint64_t)p);
            if (handshake(c2p[1], p2c[0])) DIE("child: the parent went away");
            verify_range(a, 0, half, SEED_B + (uint64_t)p, "child's own half");
            verify_range(a, half, words, SEED_A, "child's untouched half (the parent's writes leaked in)");
        }
        printf("child checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
        exit(0); /* not _exit: the runtime reports this process's statistics at exit */
    }
    close(p2c[0]);
    close(c2p[1]);
    for (int p = 0; p < passes; p++) {
        fill_range(a, half, words, SEED_C + (uint64_t)p);
        if (handshake(p2c[1], c2p[0])) break; /* the child failed: its status says why */
        verify_range(a, half, words, SEED_C + (uint64_t)p, "parent's own half");
        verify_range(a, 0, half, SEED_A, "parent's untouched half (the child's writes leaked in)");
    }
    close(p2c[1]);
    int st;
    if (waitpid(pid, &st, 0) != pid) DIE("waitpid: %m");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        DIE("the child failed: %s %d", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    verify_range(a, 0, half, SEED_A, "parent's untouched half after the child exited");
    verify_range(a, half, words, SEED_C + (uint64_t)passes - 1, "parent's own half after the child exited");
    printf("parent checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
    return 0;
}
