/* signal_storm: process-directed signals arrive all the time while the program's memory is
 * being faulted in, and the program's own threads block them (as PostgreSQL blocks SIGURG and
 * waits for it on a signalfd), so the kernel may deliver them to any other thread of the
 * process. A thread sends SIGUSR1 and SIGURG to the process in a loop while the main thread
 * reads and checks a buffer larger than the local buffer, then (mode "fork") the same in a
 * forked child, whose faults go to its clone over its link. The handler, where it runs,
 * counts. Then the main thread unblocks the signals and allocates, fills and frees blocks of
 * the window (each free a request to the brick on the program's own thread) under the storm.
 * Prints a checksum and exits 0 only if every page held its pattern.
 * usage: signal_storm [MiB=48] [passes=3] [fork|nofork] */
#include "common.h"
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t handled;
static volatile int stop;

static void on_signal(int sig) { (void)sig; handled++; }

static void *storm(void *arg) {
    (void)arg;
    while (!stop) {
        kill(getpid(), SIGUSR1);
        kill(getpid(), SIGURG);
        usleep(50);
    }
    return 0;
}

/* Reads every page of `a` `passes` times under a signal storm; returns the checksum. */
static uint64_t read_under_storm(const uint64_t *a, size_t len, int passes, uint64_t seed, const char *who) {
    stop = 0;
    pthread_t t;
    if (pthread_create(&t, 0, storm, 0)) DIE("pthread_create");
    uint64_t h = 0;
    for (int p = 0; p < passes; p++) {
        verify(a, len / 8, seed, who);
        h = fnv1a(a, len, h);
    }
    stop = 1;
    pthread_join(t, 0);
    return h;
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 48);
    int passes = argc > 2 ? atoi(argv[2]) : 3;
    int forking = argc > 3 && !strcmp(argv[3], "fork");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, 0);
    sigaction(SIGURG, &sa, 0);
    /* The runtime starts at the first allocation, before the signals are blocked: its threads
     * must not take them anyway. */
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    /* Blocked in the program's threads (the storm thread inherits the mask). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGURG);
    pthread_sigmask(SIG_BLOCK, &set, 0);
    fill(a, len / 8, 77);
    uint64_t h = read_under_storm(a, len, passes, 77, "parent's buffer");
    if (forking) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) DIE("fork: %m");
        if (pid == 0) {
            uint64_t hc = read_under_storm(a, len, passes, 77, "child's view of the parent's buffer");
            exit(hc == h ? 0 : 4);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid) DIE("waitpid: %m");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            DIE("child failed: %s %d", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    /* The program's own thread takes the signals now, while it allocates and frees. */
    pthread_sigmask(SIG_UNBLOCK, &set, 0);
    stop = 0;
    pthread_t t;
    if (pthread_create(&t, 0, storm, 0)) DIE("pthread_create");
    for (int i = 0; i < 200; i++) {
        size_t n = (size_t)(2 + i % 5) << 20;
        uint64_t *b = malloc(n);
        if (!b) DIE("malloc");
        fill(b, n / 8, 1000 + (uint64_t)i);
        verify(b, n / 8, 1000 + (uint64_t)i, "a block allocated under the storm");
        free(b);
    }
    stop = 1;
    pthread_join(t, 0);
    verify(a, len / 8, 77, "parent's buffer at the end");
    printf("passes=%d checksum=%016llx\n", passes, (unsigned long long)h);
    fprintf(stderr, "signal_storm: %d signals handled\n", (int)handled);
    return 0;
}
