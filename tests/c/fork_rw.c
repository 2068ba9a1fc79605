/* fork_rw: parent and forked child both read and write the same remote buffer at the same time;
 * each must see its own copy only (fork's copy semantics).  usage: fork_rw [MiB=32] [passes=3] */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

static uint64_t run(uint64_t *a, size_t words, uint64_t mine, int passes) {
    /* Overwrite the first half with my pattern, keep checking the second (inherited) half. */
    for (int p = 0; p < passes; p++) {
        fill(a, words / 2, mine + (uint64_t)p);
        verify(a + words / 2, words / 2, 0, "inherited half");
        verify(a, words / 2, mine + (uint64_t)p, "own half");
    }
    return fnv1a(a, words * 8, 0);
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 32), words = len / 8;
    int passes = argc > 2 ? atoi(argv[2]) : 3;
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, words / 2, 1000);
    for (size_t i = words / 2; i < words; i++) a[i] = pattern(0, i - words / 2);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) DIE("fork: %m");
    if (pid == 0) {
        verify(a, words / 2, 1000, "child's view of the parent's data at fork");
        uint64_t h = run(a, words, 2000, passes);
        printf("child checksum=%016llx\n", (unsigned long long)h);
        fflush(stdout);
        _exit(0);
    }
    uint64_t h = run(a, words, 3000, passes);
    int st;
    if (waitpid(pid, &st, 0) != pid) DIE("waitpid: %m");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) DIE("child failed with status %d", st);
    verify(a, words / 2, 3000 + (uint64_t)passes - 1, "parent's half after the child ran");
    printf("parent checksum=%016llx\n", (unsigned long long)h);
    return 0;
}
