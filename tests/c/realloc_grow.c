/* realloc_grow: realloc growth from below the threshold to far above it (and shrinking), with
 * contents checked at every step; calloc zeros; the aligned allocators and malloc_usable_size.
 * usage: realloc_grow [MiB=64] */
#include "common.h"
#include <malloc.h>
#include <unistd.h>

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
    for (size_t i = 0; i < max / 8; i++) if (z[i]) DIE("reused calloc memory not zero at word %zu", i);
    free(z);

    size_t big = 8 << 20;
    void *p = 0;
    if (posix_memalign(&p, 1 << 16, big) || ((uintptr_t)p & 0xffff)) DIE("posix_memalign");
    memset(p, 1, big); free(p);
    p = aligned_alloc(1 << 12, big); if (!p || ((uintptr_t)p & 0xfff)) DIE("aligned_alloc"); memset(p, 2, big); free(p);
    p = memalign(1 << 21, big); if (!p || ((uintptr_t)p & 0x1fffff)) DIE("memalign"); memset(p, 3, big); free(p);
    p = valloc(big); if (!p || ((uintptr_t)p & 0xfff)) DIE("valloc"); memset(p, 4, big);
    if (malloc_usable_size(p) < big) DIE("usable size of valloc");
    free(p);
    printf("checksum=%016llx\n", (unsigned long long)h);
    return 0;
}
