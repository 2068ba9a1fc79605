/* Reserve-then-commit, as JVMs, V8 and mimalloc manage their heaps: PROT_NONE reservations
 * (with address hints that name free space and hints elsewhere), commit by mprotect and by
 * MAP_FIXED, decommit by MAP_FIXED|MAP_NORESERVE and by madvise + mprotect(PROT_NONE), a file
 * mapped with MAP_FIXED into a reserved range, partial munmap, read-only ranges holding data
 * while other memory forces evictions, SIGSEGV on PROT_NONE still delivered, and fork.
 * Prints checksums to compare with the native run. Usage: reserve_commit [MiB, default 48] */
#include "common.h"
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1ul << 20)
#define RW (PROT_READ | PROT_WRITE)
#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)

static sigjmp_buf jb;
static volatile sig_atomic_t faults;

static void on_segv(int sig) {
    (void)sig;
    faults++;
    siglongjmp(jb, 1);
}

/* 1 if reading *p raises SIGSEGV. */
static int faults_on(volatile uint64_t *p) {
    if (sigsetjmp(jb, 1) == 0) {
        uint64_t v = *p;
        (void)v;
        return 0;
    }
    return 1;
}

static void zeros(const uint64_t *p, size_t words, const char *what) {
    for (size_t i = 0; i < words; i++)
        if (p[i]) DIE("%s: word %zu is %016llx, expected zero", what, i, (unsigned long long)p[i]);
}

static uint64_t sum(const void *p, size_t n, uint64_t h) {
    return fnv1a(p, n, h);
}

int main(int argc, char **argv) {
    size_t big = arg_mib(argc, argv, 1, 48);
    struct sigaction sa = {0};
    sa.sa_handler = on_segv;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, 0);

    /* A 64 MiB reservation, nothing committed. */
    size_t rlen = 64 * MIB;
    char *r = mmap(0, rlen, PROT_NONE, ANON | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) DIE("reserve failed");
    if (!faults_on((uint64_t *)(r + 5 * MIB))) DIE("PROT_NONE reservation did not fault");

    /* Commit 8 MiB by mprotect, 8 MiB by MAP_FIXED. */
    if (mprotect(r, 8 * MIB, RW)) DIE("mprotect commit failed");
    fill((uint64_t *)r, 8 * MIB / 8, 1);
    char *c2 = mmap(r + 8 * MIB, 8 * MIB, RW, ANON | MAP_FIXED, -1, 0);
    if (c2 != r + 8 * MIB) DIE("MAP_FIXED commit returned %p, not %p", (void *)c2, (void *)(r + 8 * MIB));
    zeros((uint64_t *)c2, 8 * MIB / 8, "fresh MAP_FIXED commit");
    fill((uint64_t *)c2, 8 * MIB / 8, 2);

    /* Decommit 2 MiB by MAP_FIXED|MAP_NORESERVE PROT_NONE, and 2 MiB by madvise + mprotect. */
    if (mmap(r + 2 * MIB, 2 * MIB, PROT_NONE, ANON | MAP_FIXED | MAP_NORESERVE, -1, 0) != r + 2 * MIB)
        DIE("MAP_FIXED decommit failed");
    if (!faults_on((uint64_t *)(r + 3 * MIB))) DIE("decommitted range did not fault");
    if (madvise(r + 10 * MIB, 2 * MIB, MADV_DONTNEED) || mprotect(r + 10 * MIB, 2 * MIB, PROT_NONE))
        DIE("madvise/mprotect decommit failed");
    if (!faults_on((uint64_t *)(r + 11 * MIB))) DIE("mprotect(PROT_NONE) range did not fault");
    /* Commit again: zeros. */
    if (mprotect(r + 2 * MIB, 2 * MIB, RW) || mprotect(r + 10 * MIB, 2 * MIB, RW)) DIE("recommit failed");
    zeros((uint64_t *)(r + 2 * MIB), 2 * MIB / 8, "recommitted after MAP_FIXED decommit");
    zeros((uint64_t *)(r + 10 * MIB), 2 * MIB / 8, "recommitted after madvise decommit");
    fill((uint64_t *)(r + 2 * MIB), 2 * MIB / 8, 3);
    fill((uint64_t *)(r + 10 * MIB), 2 * MIB / 8, 4);

    /* A file mapped with MAP_FIXED into the reserved part (a class-data archive). */
    char path[] = "/tmp/rackmem-reserve-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) DIE("mkstemp failed");
    unlink(path);
    static uint64_t fbuf[1 * MIB / 8];
    fill(fbuf, 1 * MIB / 8, 5);
    if (write(fd, fbuf, sizeof fbuf) != (ssize_t)sizeof fbuf) DIE("write failed");
    char *f = mmap(r + 20 * MIB, 1 * MIB, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (f != r + 20 * MIB) DIE("file MAP_FIXED failed");
    verify((uint64_t *)f, 1 * MIB / 8, 5, "file mapped into the reservation");
    if (mprotect(f, 1 * MIB, RW)) DIE("mprotect of the file mapping failed");
    ((uint64_t *)f)[7] = 77;
    uint64_t h = sum(f, 1 * MIB, 0);

    /* Hints: one naming free space (the tail of the reservation, unmapped), one far away. */
    if (munmap(r + 48 * MIB, 16 * MIB)) DIE("partial munmap of the reservation failed");
    char *hinted = mmap(r + 48 * MIB, 16 * MIB, PROT_NONE, ANON | MAP_NORESERVE, -1, 0);
    if (hinted != r + 48 * MIB) DIE("a hint naming free space was not honoured: %p", (void *)hinted);
    char *far = mmap((void *)(1ul << 40), 4 * MIB, RW, ANON, -1, 0);
    if (far == MAP_FAILED) DIE("hinted mmap failed");
    fill((uint64_t *)far, 4 * MIB / 8, 6);

    /* Read-only data while other memory forces evictions. */
    if (mprotect(hinted, 16 * MIB, RW)) DIE("commit of the hinted range failed");
    fill((uint64_t *)hinted, 16 * MIB / 8, 7);
    if (mprotect(hinted, 16 * MIB, PROT_READ)) DIE("mprotect read-only failed");
    char *press = mmap(0, big, RW, ANON, -1, 0);
    for (int pass = 0; pass < 2; pass++) {
        fill((uint64_t *)press, big / 8, 8 + pass);
        verify((uint64_t *)hinted, 16 * MIB / 8, 7, "read-only range under pressure");
        verify((uint64_t *)r, 2 * MIB / 8, 1, "committed range under pressure");
    }
    verify((uint64_t *)press, big / 8, 9, "pressure buffer");

    /* Partial munmap in the middle of committed memory; the rest keeps its data. */
    if (munmap(r + 4 * MIB, 2 * MIB)) DIE("munmap in the middle failed");
    for (size_t i = 6 * MIB / 8; i < 8 * MIB / 8; i++)
        if (((uint64_t *)r)[i] != pattern(1, i)) DIE("DATA CORRUPTION after partial munmap at word %zu", i);

    /* Everything that must hold data, in a checksum. */
    h = sum(r, 2 * MIB, h);
    h = sum(r + 2 * MIB, 2 * MIB, h);
    h = sum(r + 6 * MIB, 10 * MIB, h);
    h = sum(hinted, 16 * MIB, h);
    h = sum(far, 4 * MIB, h);
    h = sum(press, big, h);
    printf("checksum=%016llx\n", (unsigned long long)h);
    fflush(stdout);

    pid_t pid = fork();
    if (pid == 0) {
        verify((uint64_t *)hinted, 16 * MIB / 8, 7, "child read-only range");
        if (!faults_on((uint64_t *)(r + 30 * MIB))) DIE("child: reservation did not fault");
        uint64_t k = sum(hinted, 16 * MIB, 0);
        printf("child checksum=%016llx\n", (unsigned long long)k);
        fflush(stdout);
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) DIE("child failed");
    printf("parent checksum=%016llx\n", (unsigned long long)sum(hinted, 16 * MIB, 0));

    /* Read-write again, modified, and released. */
    if (mprotect(hinted, 16 * MIB, RW)) DIE("mprotect read-write failed");
    fill((uint64_t *)hinted, 16 * MIB / 8, 10);
    verify((uint64_t *)hinted, 16 * MIB / 8, 10, "rewritten range");
    if (munmap(f, 1 * MIB) || munmap(r, 48 * MIB) || munmap(hinted, 16 * MIB)) DIE("final munmap failed");
    /* The window space comes back usable. */
    char *again = mmap(0, 32 * MIB, RW, ANON, -1, 0);
    fill((uint64_t *)again, 32 * MIB / 8, 11);
    verify((uint64_t *)again, 32 * MIB / 8, 11, "memory after the reservation was freed");
    printf("segv faults=%d\n", (int)faults);
    return 0;
}
