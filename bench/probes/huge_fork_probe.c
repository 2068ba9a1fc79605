/* huge_fork_probe: what UFFDIO_MOVE does with a 2 MiB THP that fork() made COW-shared, and with a
 * THP split into 4 KiB entries (MADV_DONTNEED of one subpage). Answers how eviction of a huge unit
 * must treat fork and splits. Build: gcc -O2 -Wall -pthread huge_fork_probe.c -o huge_fork_probe */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef UFFDIO_MOVE
struct uffdio_move { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
#ifndef UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((uint64_t)1 << 1)
#endif
#define HP (2ul << 20)
#define DIE(m) do { perror(m); exit(1); } while (0)

static char *thp_alloc(size_t len) {
    char *raw = mmap(0, len + HP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) DIE("mmap");
    char *p = (char *)(((uintptr_t)raw + HP - 1) & ~(HP - 1));
    if (madvise(p, len, MADV_HUGEPAGE)) DIE("madvise");
    return p;
}
static long ahp(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r"); char l[256]; long v = -1;
    while (f && fgets(l, sizeof l, f)) if (!strncmp(l, "AnonHugePages:", 14)) v = atol(l + 14);
    if (f) fclose(f);
    return v;
}
static int uffd_on(char *p, size_t len) {
    int fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {UFFD_API, UFFD_FEATURE_MOVE, 0};
    struct uffdio_register reg = {{(uint64_t)p, len}, UFFDIO_REGISTER_MODE_MISSING, 0};
    if (fd < 0 || ioctl(fd, UFFDIO_API, &api) || ioctl(fd, UFFDIO_REGISTER, &reg)) DIE("uffd");
    return fd;
}
/* moves [src, src+len) to dst, retrying EAGAIN from where the kernel stopped (as the runtime does);
 * prints the first answer and how many retries finished the move */
static size_t try_move(const char *what, int fd, char *dst, char *src, size_t len, uint64_t mode) {
    struct uffdio_move mv = {(uint64_t)dst, (uint64_t)src, len, mode, 0};
    int r = ioctl(fd, UFFDIO_MOVE, &mv), e = errno, retries = 0;
    long long first = mv.move;
    size_t done = r == 0 ? len : mv.move > 0 ? (size_t)mv.move : 0;
    while (r && e == EAGAIN && retries < 1000) {
        retries++;
        struct uffdio_move m2 = {(uint64_t)dst + done, (uint64_t)src + done, len - done, mode, 0};
        r = ioctl(fd, UFFDIO_MOVE, &m2); e = errno;
        done += r == 0 ? len - done : m2.move > 0 ? (size_t)m2.move : 0;
    }
    printf("%-48s first: errno=%-7s moved=%-8lld after %d EAGAIN retries: %s, %zu bytes; AnonHugePages=%ld kB\n",
           what, first == (long long)len ? "-" : strerrorname_np(e), first, retries, r ? strerrorname_np(e) : "ok",
           done, ahp());
    return r ? 0 : done;
}

int main(int argc, char **argv) {
    char *win = thp_alloc(2 * HP), *stage = thp_alloc(2 * HP);
    int wfd = uffd_on(win, 2 * HP), sfd = uffd_on(stage, 2 * HP);
    /* the runtime marks the window and staging area MADV_DONTFORK; argv[1] = "shared" leaves them
     * inherited to show what a COW-shared unit does */
    int dontfork = !(argc > 1 && !strcmp(argv[1], "shared"));
    if (dontfork && (madvise(win, 2 * HP, MADV_DONTFORK) || madvise(stage, 2 * HP, MADV_DONTFORK))) DIE("DONTFORK");
    printf("window %s\n", dontfork ? "MADV_DONTFORK (as the runtime)" : "inherited by fork (COW-shared)");
    /* a THP built outside, moved into the window: the install path */
    char *src = thp_alloc(HP);
    memset(src, 7, HP);
    try_move("install: 2 MiB THP into the window", wfd, win, src, HP, 0);

    pid_t pid = fork();
    if (pid == 0) { sleep(1); _exit(dontfork ? 0 : win[12345] == 7 ? 0 : 3); }
    size_t moved = try_move("evict after fork (child alive)", sfd, stage, win, HP, 0);
    int st; waitpid(pid, &st, 0);
    printf("child exit status %d (it checked the parent's data when the window was inherited)\n", WEXITSTATUS(st));
    if (!moved && !try_move("evict after the child exited", sfd, stage, win, HP, 0)) {
        /* a write makes the subpages exclusive again (COW splits the THP): then it moves */
        win[0] = 8;
        printf("parent wrote one byte: AnonHugePages=%ld kB\n", ahp());
        if (!try_move("evict after that write", sfd, stage, win, HP, 0)) { printf("unit still immovable: stop\n"); return 0; }
        printf("stage[0]=%d stage[100]=%d (expect 8 and 7)\n", stage[0], stage[100]);
        return 0;
    }
    try_move("install it back", wfd, win, stage, HP, 0);

    /* a write to one subpage after fork breaks COW of the whole THP or of one subpage? */
    pid = fork();
    if (pid == 0) { sleep(1); _exit(0); }
    win[0] = 8;
    printf("after fork + a one-byte write: AnonHugePages=%ld kB\n", ahp());
    try_move("evict after fork + parent wrote one byte", sfd, stage, win, HP, 0);
    waitpid(pid, &st, 0);

    try_move("install it back", wfd, win, stage, HP, 0);

    /* split: drop one 4 KiB subpage, then move the 2 MiB range */
    if (madvise(win + 4096, 4096, MADV_DONTNEED)) DIE("madvise DONTNEED");
    printf("after MADV_DONTNEED of one subpage: AnonHugePages=%ld kB\n", ahp());
    try_move("evict the split unit, ALLOW_SRC_HOLES", sfd, stage, win, HP, UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES);
    printf("stage[0]=%d stage[2*4096]=%d (expect 8 and 7)\n", stage[0], stage[2 * 4096]);
    return 0;
}
