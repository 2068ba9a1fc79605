/* mmap_ops: memory taken with anonymous mmap (as jemalloc and language runtimes do), released
 * with munmap and madvise(MADV_DONTNEED) (which must read back as zeros), grown with mremap.
 * usage: mmap_ops [MiB=64] */
#include "common.h"
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 64), words = len / 8;
    uint64_t *a = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) DIE("mmap: %m");
    for (size_t i = 0; i < words; i++) if (a[i]) DIE("fresh mmap memory not zero");
    fill(a, words, 11);
    size_t q = words / 4;
    if (madvise(a + q, q * 8, MADV_DONTNEED)) DIE("madvise: %m");
    for (size_t i = q; i < 2 * q; i++) if (a[i]) DIE("DATA CORRUPTION: page %zu not zero after MADV_DONTNEED", i * 8 / 4096);
    verify(a, q, 11, "prefix after DONTNEED");
    for (size_t i = 2 * q; i < words; i++) if (a[i] != pattern(11, i)) DIE("DATA CORRUPTION after DONTNEED at word %zu", i);
    /* The same through the raw system call, as runtimes that bypass the C library do: the
     * runtime sees it as a userfaultfd REMOVE event. */
    if (syscall(SYS_madvise, a + 2 * q, 4096 * 4, MADV_DONTNEED)) DIE("raw madvise: %m");
    for (size_t i = 2 * q; i < 2 * q + 2048; i++) if (a[i]) DIE("DATA CORRUPTION: word %zu not zero after raw MADV_DONTNEED", i);
    for (size_t i = 2 * q + 2048; i < words; i++) if (a[i] != pattern(11, i)) DIE("DATA CORRUPTION after raw DONTNEED at word %zu", i);
    uint64_t h = fnv1a(a, len, 0);
    if (munmap(a + 3 * q, q * 8)) DIE("partial munmap: %m");
    verify(a, q, 11, "prefix after partial munmap");
    uint64_t *b = mremap(a, 3 * q * 8, 2 * len, MREMAP_MAYMOVE);
    if (b == MAP_FAILED) DIE("mremap: %m");
    verify(b, q, 11, "prefix after mremap");
    for (size_t i = 2 * q + 2048; i < 3 * q; i++) if (b[i] != pattern(11, i)) DIE("DATA CORRUPTION after mremap at word %zu", i);
    for (size_t i = 3 * q; i < 2 * words; i++) b[i] = i;
    h = fnv1a(b, 2 * len, h);
    if (munmap(b, 2 * len)) DIE("munmap: %m");
    printf("checksum=%016llx\n", (unsigned long long)h);
    return 0;
}
