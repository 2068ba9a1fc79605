/* pageout EXE SECONDS: until SIGTERM or for SECONDS, every 20 ms, asks the kernel to reclaim (MADV_PAGEOUT, to
 * swap) every private writable anonymous mapping of every process running EXE, as memory
 * pressure would; prints the largest swapped-out size seen (VmSwap) as swapped_kb_max=N. */
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

static long swapped_kb(int pid) {
    char path[64], line[256];
    long kb = 0;
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSwap: %ld", &kb) == 1) break;
    fclose(f);
    return kb;
}

static void page_out(int pid) {
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) return;
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *f = fopen(path, "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            unsigned long a, b, off, ino;
            char perm[8], dev[16];
            if (sscanf(line, "%lx-%lx %7s %lx %15s %lu", &a, &b, perm, &off, dev, &ino) < 6) continue;
            if (perm[0] != 'r' || perm[1] != 'w' || perm[3] != 'p' || ino != 0) continue;
            struct iovec v = {(void *)a, b - a};
            syscall(SYS_process_madvise, pidfd, &v, 1, MADV_PAGEOUT, 0);
        }
        fclose(f);
    }
    close(pidfd);
}

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    signal(SIGTERM, on_term);
    if (argc != 3) {
        fprintf(stderr, "usage: pageout EXE SECONDS\n");
        return 2;
    }
    char want[PATH_MAX];
    if (!realpath(argv[1], want)) {
        perror(argv[1]);
        return 2;
    }
    time_t end = time(0) + atoi(argv[2]);
    long max_kb = 0;
    while (!stop && time(0) < end) {
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            int pid = atoi(e->d_name);
            if (pid <= 0) continue;
            char exe[64], got[PATH_MAX];
            snprintf(exe, sizeof exe, "/proc/%d/exe", pid);
            ssize_t n = readlink(exe, got, sizeof got - 1);
            if (n <= 0) continue;
            got[n] = 0;
            if (strcmp(got, want)) continue;
            page_out(pid);
            long kb = swapped_kb(pid);
            if (kb > max_kb) max_kb = kb;
        }
        if (d) closedir(d);
        usleep(20000);
    }
    printf("swapped_kb_max=%ld\n", max_kb);
    return 0;
}
