/* fork_exec: a parent with remote memory forks twice: one child execs `/bin/sh -c 'exit 7'`,
 * the other a fresh copy of this program (which fills and checks remote memory of its own and
 * exits 7). The parent checks each exit status and then that its own buffer is intact.
 * usage: fork_exec [MiB=32] | fork_exec child MiB */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

/* Waits for a child that must exit with status 7. */
static void wait_for(pid_t pid, const char *what) {
    int st;
    if (waitpid(pid, &st, 0) != pid) DIE("waitpid: %m");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 7)
        DIE("%s ended with %s %d, expected exit 7", what, WIFEXITED(st) ? "exit" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "child")) {
        size_t len = strtoull(argv[2], 0, 0) << 20;
        uint64_t *c = calloc(len / 8, 8);
        if (!c) DIE("child malloc");
        fill(c, len / 8, 99);
        verify(c, len / 8, 99, "exec'd child buffer");
        printf("child checksum=%016llx\n", (unsigned long long)fnv1a(c, len, 0));
        fflush(stdout);
        return 7;
    }
    size_t len = arg_mib(argc, argv, 1, 32);
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, len / 8, 21);
    fflush(stdout);
    /* first a shell (a program that knows nothing of the parent's window) */
    pid_t pid = fork();
    if (pid < 0) DIE("fork: %m");
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", "exit 7", (char *)0);
        _exit(127);
    }
    wait_for(pid, "/bin/sh -c 'exit 7'");
    verify(a, len / 8, 21, "parent buffer after the shell ran");
    /* then this program again, with a big buffer of its own */
    pid = fork();
    if (pid < 0) DIE("fork: %m");
    if (pid == 0) {
        char mib[32];
        snprintf(mib, sizeof mib, "%zu", len >> 20);
        execl("/proc/self/exe", argv[0], "child", mib, (char *)0);
        _exit(127);
    }
    wait_for(pid, "exec'd copy of fork_exec");
    verify(a, len / 8, 21, "parent buffer after the child exec'd");
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
    return 0;
}
