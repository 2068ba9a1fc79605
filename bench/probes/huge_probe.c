/* huge_probe: what userfaultfd allows for 2 MiB pages on this kernel, and what each mechanism costs.
 * For each backing, a handler thread serves MISSING faults of a region of SIZE bytes that one
 * thread scans sequentially (one read per 4 KiB), then the same scan is repeated once everything is
 * resident (the TLB effect alone). Data comes from a local source buffer: this measures the install
 * path, not the link.
 *   anon-4k     anonymous, MADV_NOHUGEPAGE, UFFDIO_COPY 4 KiB per fault (the runtime today)
 *   anon-64k    same, UFFDIO_COPY 64 KiB per fault (what read-ahead batches reach)
 *   anon-move2m anonymous THP, UFFDIO_MOVE of a PMD-aligned 2 MiB THP per fault
 *   thp-recycle same, but the staging THP is the page evicted (UFFDIO_MOVE out, 2 MiB) from 8 MiB
 *               behind: the steady state at a small budget, no THP allocation per fault
 *   hugetlb-2m  memfd MFD_HUGETLB, MAP_SHARED, UFFDIO_COPY 2 MiB per fault
 * Then the drop path: MADV_DONTNEED / fallocate(PUNCH_HOLE) of one 2 MiB page on hugetlb.
 * Needs root for the hugetlb pool: echo N > /proc/sys/vm/nr_hugepages (N >= SIZE/2MiB + 2).
 * Build: gcc -O2 -Wall -pthread huge_probe.c -o huge_probe; run: ./huge_probe [MiB] [rounds] */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef UFFDIO_MOVE
struct uffdio_move { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
#define HP (2ul << 20)
#define DIE(m) do { perror(m); exit(1); } while (0)

static uint64_t now_ns(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

enum mode { ANON4K, ANON64K, MOVE2M, RECYCLE2M, HUGETLB2M, NMODES };
static const char *names[] = {"anon-4k", "anon-64k", "anon-move2m", "thp-recycle", "hugetlb-2m"};

struct ctx { int uffd; enum mode m; char *base; size_t size; char *src; volatile int stop; uint64_t faults; };

static char *thp_alloc(size_t len) {
    char *raw = mmap(0, len + HP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) DIE("mmap");
    char *p = (char *)(((uintptr_t)raw + HP - 1) & ~(HP - 1));
    madvise(p, len, MADV_HUGEPAGE);
    return p;
}

static void *handler(void *arg) {
    struct ctx *c = arg;
    struct pollfd pf = {c->uffd, POLLIN, 0};
    char *stage = c->m == MOVE2M || c->m == RECYCLE2M ? thp_alloc(HP) : NULL;
    /* UFFDIO_MOVE takes a destination registered with the uffd it is called on: the staging
     * buffer gets a second uffd with no events, as the runtime's staging area does */
    int sfd = -1, stage_full = 0;
    if (c->m == RECYCLE2M) {
        sfd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
        struct uffdio_api api = {UFFD_API, UFFD_FEATURE_MOVE, 0};
        struct uffdio_register reg = {{(uint64_t)stage, HP}, UFFDIO_REGISTER_MODE_MISSING, 0};
        if (sfd < 0 || ioctl(sfd, UFFDIO_API, &api) || ioctl(sfd, UFFDIO_REGISTER, &reg)) DIE("staging uffd");
    }
    while (!c->stop) {
        if (poll(&pf, 1, 100) <= 0) continue;
        struct uffd_msg msg;
        if (read(c->uffd, &msg, sizeof msg) != sizeof msg) { if (errno == EAGAIN) continue; DIE("read"); }
        if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
        uint64_t a = msg.arg.pagefault.address;
        size_t unit = c->m == ANON4K ? 4096 : c->m == ANON64K ? 65536 : HP;
        uint64_t start = a & ~(uint64_t)(unit - 1);
        if (start + unit > (uint64_t)c->base + c->size) unit = (uint64_t)c->base + c->size - start;
        c->faults++;
        if (c->m == MOVE2M || c->m == RECYCLE2M) {
            /* fill the THP in the staging buffer (as a fetch would), then move it whole */
            /* recycle: the staging THP holds the last victim; otherwise a fresh THP each time */
            char *from = c->m == RECYCLE2M && stage_full ? stage : c->m == RECYCLE2M ? thp_alloc(HP) : stage;
            memcpy(from, c->src, HP);
            struct uffdio_move mv = {start, (uint64_t)from, HP, 0, 0};
            if (ioctl(c->uffd, UFFDIO_MOVE, &mv) && errno != EEXIST) DIE("UFFDIO_MOVE");
            if (from == stage) stage_full = 0;
            if (c->m == RECYCLE2M && start >= (uint64_t)c->base + 4 * HP) {
                struct uffdio_move out = {(uint64_t)stage, start - 4 * HP, HP, 0, 0};
                if (ioctl(sfd, UFFDIO_MOVE, &out)) DIE("UFFDIO_MOVE out");
                stage_full = 1;
            }
        } else {
            struct uffdio_copy cp = {start, (uint64_t)c->src, unit, 0, 0};
            if (ioctl(c->uffd, UFFDIO_COPY, &cp) && errno != EEXIST) DIE("UFFDIO_COPY");
        }
        if (errno == EEXIST) { struct uffdio_range r = {start, unit}; ioctl(c->uffd, UFFDIO_WAKE, &r); errno = 0; }
    }
    return NULL;
}

static uint64_t scan(char *p, size_t size) {
    uint64_t s = 0;
    for (size_t i = 0; i < size; i += 4096) s += *(volatile uint64_t *)(p + i + 8);
    return s;
}

static long meminfo(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r"); char line[256]; long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key) + 1);
    if (f) fclose(f);
    return v;
}

static void run(enum mode m, size_t size, double out[2]) {
    int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (uffd < 0) DIE("userfaultfd");
    struct uffdio_api api = {UFFD_API, m == MOVE2M || m == RECYCLE2M ? UFFD_FEATURE_MOVE : 0, 0};
    if (ioctl(uffd, UFFDIO_API, &api)) DIE("UFFDIO_API");
    char *base; int fd = -1;
    if (m == HUGETLB2M) {
        fd = memfd_create("huge_probe", MFD_HUGETLB | MFD_CLOEXEC);
        if (fd < 0) DIE("memfd_create(MFD_HUGETLB)");
        if (ftruncate(fd, size)) DIE("ftruncate");
        base = mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) DIE("mmap hugetlb (pool too small?)");
    } else if (m == MOVE2M || m == RECYCLE2M) {
        base = thp_alloc(size);
    } else {
        base = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(base, size, MADV_NOHUGEPAGE);
    }
    struct uffdio_register reg = {{(uint64_t)base, size}, UFFDIO_REGISTER_MODE_MISSING, 0};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) DIE("UFFDIO_REGISTER");
    char *src = thp_alloc(HP);
    for (size_t i = 0; i < HP; i += 8) *(uint64_t *)(src + i) = i;
    struct ctx c = {uffd, m, base, size, src, 0, 0};
    pthread_t t; pthread_create(&t, NULL, handler, &c);
    long ahp0 = meminfo("AnonHugePages");
    uint64_t t0 = now_ns(); uint64_t s1 = scan(base, size); uint64_t t1 = now_ns();
    long ahp1 = meminfo("AnonHugePages");
    if (m == RECYCLE2M) s1 = scan(base, size); /* evicted pages fault back in: the sums compare like the others */
    t1 = m == RECYCLE2M ? now_ns() : t1;
    uint64_t s2 = scan(base, size); uint64_t t2 = now_ns();
    c.stop = 1; pthread_join(t, NULL);
    out[0] = (double)size / (1 << 20) / ((t1 - t0) / 1e9);
    out[1] = (double)size / (1 << 20) / ((t2 - t1) / 1e9);
    printf("%-12s faults=%-7lu first scan %8.0f MiB/s  resident scan %8.0f MiB/s  AnonHugePages +%ld kB  sum %s\n",
           names[m], (unsigned long)c.faults, out[0], out[1], ahp1 - ahp0, s1 == s2 ? "ok" : "MISMATCH");
    if (m == HUGETLB2M) {
        uint64_t a = now_ns();
        int r1 = madvise(base, HP, MADV_DONTNEED);
        int r2 = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, HP);
        uint64_t b = now_ns();
        long free0 = meminfo("HugePages_Free");
        printf("  hugetlb drop of one 2 MiB page: madvise(DONTNEED)=%d punch_hole=%d  %.1f us, pool free now %ld\n",
               r1, r2, (b - a) / 1e3, free0);
        struct uffdio_move mv = {(uint64_t)base, (uint64_t)src, HP, 0, 0};
        int r = ioctl(uffd, UFFDIO_MOVE, &mv);
        printf("  UFFDIO_MOVE into hugetlb: %s\n", r ? strerror(errno) : "accepted");
    }
    munmap(base, size);
    if (fd >= 0) close(fd);
    close(uffd);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 512;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    size_t size = mib << 20;
    double sum[NMODES][2] = {{0}};
    for (int r = 0; r < rounds; r++)
        for (int m = 0; m < NMODES; m++) { double o[2]; run(m, size, o); sum[m][0] += o[0]; sum[m][1] += o[1]; }
    printf("\nmean over %d interleaved rounds, %zu MiB; ratio against anon-4k in the same run\n", rounds, mib);
    for (int m = 0; m < NMODES; m++)
        printf("%-12s first scan %8.0f MiB/s (%.2fx)  resident scan %8.0f MiB/s (%.2fx)\n", names[m],
               sum[m][0] / rounds, sum[m][0] / sum[0][0], sum[m][1] / rounds, sum[m][1] / sum[0][1]);
    return 0;
}
