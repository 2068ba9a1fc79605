/* fork_wait: a forked child that lives while the test looks. The parent fills a buffer and
 * forks; the child checks it sees the parent's data, writes its own pattern over it, checks it,
 * prints "child ready" and waits for a line on stdin; the parent meanwhile writes a pattern of
 * its own and checks it. Once the child has exited (reaped, with status 0) the parent prints
 * "child gone", checks its buffer again, waits for a second line, and prints its checksum.
 * With `refused`, the parent prints "filled" and waits for a line before it forks, and the child
 * must die of SIGSEGV (it has no copy of the parent's remote memory: never zeros).
 * usage: fork_wait [MiB=32] [refused] */
#include <signal.h>
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

enum { SEED_A = 11, SEED_CHILD = 22, SEED_PARENT = 33 };

/* One line of stdin, a byte at a time: a buffered read could take the other process's line. */
static void wait_line(void) {
    char c;
    do {
        if (read(0, &c, 1) != 1) DIE("stdin closed");
    } while (c != '\n');
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 32), words = len / 8;
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    int refused = argc > 2 && !strcmp(argv[2], "refused");
    fill(a, words, SEED_A);
    if (refused) {
        printf("filled\n");
        fflush(stdout);
        wait_line();
    }
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) DIE("fork: %m");
    if (c == 0) {
        verify(a, words, SEED_A, "child, as of the fork");
        fill(a, words, SEED_CHILD);
        verify(a, words, SEED_CHILD, "child, its own writes");
        printf("child ready\n");
        fflush(stdout);
        wait_line();
        verify(a, words, SEED_CHILD, "child, at its end");
        _exit(0);
    }
    fill(a, words, SEED_PARENT);
    verify(a, words, SEED_PARENT, "parent, its own writes");
    int st;
    if (waitpid(c, &st, 0) != c) DIE("waitpid: %m");
    if (refused) {
        if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV)
            DIE("the child without a copy ended with %s %d, expected SIGSEGV", WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        DIE("the child ended with %s %d", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    printf("child gone\n");
    fflush(stdout);
    verify(a, words, SEED_PARENT, "parent, after the child");
    wait_line();
    printf("parent checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
    free(a);
    return 0;
}
