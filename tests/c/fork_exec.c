/* fork_exec: a parent with remote memory forks; the child execs a fresh copy of this program
 * (which allocates remote memory of its own) and the parent checks its buffer afterwards.
 * usage: fork_exec [MiB=32] | fork_exec child MiB */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

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
    pid_t pid = fork();
    if (pid < 0) DIE("fork: %m");
    if (pid == 0) {
        char mib[32];
        snprintf(mib, sizeof mib, "%zu", len >> 20);
        execl("/proc/self/exe", argv[0], "child", mib, (char *)0);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) DIE("waitpid: %m");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 7) DIE("child ended with status %d", st);
    verify(a, len / 8, 21, "parent buffer after the child exec'd");
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
    return 0;
}
