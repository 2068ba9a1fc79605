/* realloc_grow: realloc growth from below the threshold to far above it (and shrinking), with
 * contents checked at every step (64 KiB, 256 KiB, 1 MiB, 4 MiB ... MAX); calloc of a big size
 * reads as zeros, also when it reuses freed memory; posix_memalign, aligned_alloc, memalign,
 * valloc and pvalloc of big sizes are aligned and have malloc_usable_size >= the request.
 * usage: realloc_grow [MiB=64] */
#include "common.h"
#include <malloc.h>
#include <unistd.h>

/* Checks alignment and usable size, writes and verifies the block, then frees it. */
static void check_aligned(void *p, size_t align, size_t size, int seed, const char *what) {
    if (!p) DIE("%s(%zu, %zu) returned NULL", what, align, size);
    if ((uintptr_t)p % align) DIE("%s returned %p, not aligned to %zu", what, p, align);
    if (malloc_usable_size(p) < size) DIE("%s: malloc_usable_size %zu < %zu", what, malloc_usable_size(p), size);
    size_t words = size / 8;
    fill(p, words, (uint64_t)seed);
    verify(p, words, (uint64_t)seed, what);
    free(p);
}

int main(int argc, char **argv) {
    size_t max = arg_mib(argc, argv, 1, 64);
    size_t len = 64 << 10;
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, len / 8, 3);
    uint64_t h = 0;
    while (len < max) {
        size_t nl = len * 4 > max ? max : len * 4;
        a = realloc(a, nl);
        if (!a) DIE("realloc to %zu failed", nl);
        verify(a, len / 8, 3, "realloc'd prefix");
        for (size_t i = len / 8; i < nl / 8; i++) a[i] = pattern(3, i);
        if (malloc_usable_size(a) < nl) DIE("malloc_usable_size %zu < %zu", malloc_usable_size(a), nl);
        len = nl;
    }
    verify(a, len / 8, 3, "grown buffer");
    h = fnv1a(a, len, h);
    a = realloc(a, len / 3 / 8 * 8);
    if (!a) DIE("shrinking realloc failed");
    verify(a, len / 3 / 8, 3, "shrunk buffer");
    h = fnv1a(a, len / 3 / 8 * 8, h);
    a = realloc(a, 100 << 10); /* back below the threshold */
    if (!a) DIE("realloc below threshold failed");
    verify(a, (100 << 10) / 8, 3, "buffer moved below the threshold");
    free(a);

    uint64_t *z = calloc(max / 8, 8);
    if (!z) DIE("calloc");
    for (size_t i = 0; i < max / 8; i++) if (z[i]) DIE("calloc memory not zero at word %zu", i);
    fill(z, max / 8, 5);
    free(z);
    z = calloc(max / 8, 8); /* likely the same window region: must be zero again */
    if (!z) DIE("second calloc");
    for (size_t i = 0; i < max / 8; i++) if (z[i]) DIE("reused calloc memory not zero at word %zu", i);
    free(z);

    /* The aligned allocators with big sizes: alignment, usable size, and the memory works. */
    size_t big = 8 << 20;
    void *p = 0;
    if (posix_memalign(&p, 1 << 16, big)) DIE("posix_memalign failed");
    check_aligned(p, 1 << 16, big, 1, "posix_memalign");
    check_aligned(aligned_alloc(1 << 12, big), 1 << 12, big, 2, "aligned_alloc");
    check_aligned(memalign(1 << 21, big + 4096), 1 << 21, big + 4096, 3, "memalign");
    check_aligned(valloc(big), 4096, big, 4, "valloc");
    check_aligned(pvalloc(big - 100), 4096, big - 100, 5, "pvalloc");
    printf("checksum=%016llx\n", (unsigned long long)h);
    return 0;
}
