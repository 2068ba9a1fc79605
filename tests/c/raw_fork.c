/* raw_fork: a child made without the C library's fork (the raw clone system call, so no
 * pthread_atfork hook runs) reads a buffer its parent filled. Natively the child sees the
 * parent's data. Under rackmem the child has no window (the runtime could not register it for
 * the child), so its touch must be a crash, never zeros where the parent's pages were remote.
 * Prints "child: data" (it read the parent's data), "child: ZEROS" (the defect) or
 * "child: signal N" (it was stopped by a signal), and exits 0 unless the child read wrong data.
 * usage: raw_fork [MiB=32] */
#include "common.h"
#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

int main(int argc, char **argv) {
    size_t bytes = arg_mib(argc, argv, 1, 32), words = bytes / 8;
    uint64_t *a = malloc(words * 8);
    if (!a) DIE("malloc of %zu bytes failed", bytes);
    fill(a, words, 7);
    /* SIGCHLD and no other flag: a copy of the process, as fork(), without its hooks. */
    long pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (pid < 0) DIE("clone: %s", strerror(errno));
    if (pid == 0) {
        size_t zeros = 0, wrong = 0;
        for (size_t i = 0; i < words; i++) {
            if (a[i] == 0) zeros++;
            else if (a[i] != pattern(7, i)) wrong++;
        }
        _exit(zeros ? 4 : wrong ? 5 : 0);
    }
    int st;
    if (waitpid((pid_t)pid, &st, 0) < 0) DIE("waitpid: %s", strerror(errno));
    if (WIFSIGNALED(st)) {
        printf("child: signal %d\n", WTERMSIG(st));
    } else if (WEXITSTATUS(st) == 0) {
        printf("child: data\n");
    } else {
        printf("child: %s\n", WEXITSTATUS(st) == 4 ? "ZEROS" : "WRONG DATA");
        return 1;
    }
    verify(a, words, 7, "the parent's buffer after the child");
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, words * 8, 0));
    return 0;
}
