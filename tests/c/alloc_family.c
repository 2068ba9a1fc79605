/* The whole malloc family on small and large blocks, whichever allocator the program uses
 * (glibc, jemalloc linked with -DWITH_JEMALLOC -ljemalloc, tcmalloc or mimalloc preloaded):
 * fills, verifies and checksums blocks made by malloc, calloc, realloc (across the threshold
 * both ways), reallocarray, posix_memalign, aligned_alloc, memalign, valloc, pvalloc, checks
 * malloc_usable_size, frees with free and cfree-like paths, and with jemalloc its *allocx API;
 * then forks and checks the child sees the same contents.
 * Usage: alloc_family [MiB of large blocks, default 48] */
#include "common.h"
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef WITH_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#define NSMALL 20000
#define NLARGE 24

static void *small[NSMALL];
static size_t small_len[NSMALL];
static void *large[NLARGE];
static size_t large_len[NLARGE];

static void put(void *p, size_t n, uint64_t seed) {
    fill(p, n / 8, seed);
}

static uint64_t check_all(const char *who) {
    uint64_t h = 0;
    for (int i = 0; i < NSMALL; i++) {
        verify(small[i], small_len[i] / 8, 1000 + i, who);
        h = fnv1a(small[i], small_len[i], h);
    }
    for (int i = 0; i < NLARGE; i++) {
        verify(large[i], large_len[i] / 8, 5000 + i, who);
        h = fnv1a(large[i], large_len[i], h);
    }
    return h;
}

static void *aligned_kind(int kind, size_t align, size_t n) {
    void *p = 0;
    switch (kind) {
    case 0: if (posix_memalign(&p, align, n)) p = 0; break;
    case 1: p = aligned_alloc(align, (n + align - 1) / align * align); break;
    case 2: p = memalign(align, n); break;
    case 3: p = valloc(n); align = 4096; break;
#ifdef WITH_JEMALLOC
    /* jemalloc defines no pvalloc: glibc's would hand out a block jemalloc's free rejects. */
    default: p = valloc(n); align = 4096; break;
#else
    default: p = pvalloc(n); align = 4096; break;
#endif
    }
    if (!p) DIE("aligned allocation kind %d of %zu failed", kind, n);
    if ((uintptr_t)p % align) DIE("kind %d returned %p, not aligned to %zu", kind, p, align);
    return p;
}

int main(int argc, char **argv) {
    size_t total = arg_mib(argc, argv, 1, 48);
    uint64_t rng = 42;
    /* Small blocks of every kind. */
    for (int i = 0; i < NSMALL; i++) {
        size_t n = 8 * (1 + xorshift64(&rng) % 256);
        void *p;
        switch (i % 6) {
        case 0: p = malloc(n); break;
        case 1:
            p = calloc(n / 8, 8);
            for (size_t k = 0; p && k < n; k++)
                if (((unsigned char *)p)[k]) DIE("calloc block %d not zero", i);
            break;
#ifdef WITH_JEMALLOC
        case 2: p = realloc(0, n); break; /* no reallocarray in jemalloc (glibc's would mix) */
#else
        case 2: p = reallocarray(0, n / 8, 8); break;
#endif
        default: p = aligned_kind(i % 5, 64, n); break;
        }
        if (!p) DIE("small allocation %d of %zu failed", i, n);
        if (malloc_usable_size(p) < n) DIE("malloc_usable_size(%p) = %zu < %zu", p, malloc_usable_size(p), n);
        small[i] = p;
        small_len[i] = n;
        put(p, n, 1000 + i);
    }
    /* Half the small blocks grow and shrink by realloc, staying small. */
    for (int i = 0; i < NSMALL; i += 2) {
        size_t n = small_len[i] * 2;
        void *p = realloc(small[i], n);
        if (!p) DIE("realloc small %d failed", i);
        verify(p, small_len[i] / 8, 1000 + i, "small realloc");
        small[i] = p;
        small_len[i] = n;
        put(p, n, 1000 + i);
    }
    /* Large blocks; some start small and cross the threshold by realloc, some come back. */
    size_t each = total / NLARGE / 8 * 8;
    for (int i = 0; i < NLARGE; i++) {
        void *p;
        size_t n = each;
        if (i % 4 == 0) {
            p = malloc(4096);
            put(p, 4096, 5000 + i);
            p = realloc(p, n);
            if (!p) DIE("realloc across the threshold failed");
            verify(p, 4096 / 8, 5000 + i, "realloc up");
        } else if (i % 4 == 1) {
            p = calloc(1, n);
            for (size_t k = 0; p && k < n; k += 4096)
                if (((unsigned char *)p)[k]) DIE("large calloc block not zero");
        } else if (i % 4 == 2) {
            p = aligned_kind(i % 5, 1 << 16, n);
        } else {
            p = malloc(n + 3 * 4096);
            put(p, n + 3 * 4096, 5000 + i);
            p = realloc(p, 8192); /* back under the threshold */
            if (!p) DIE("realloc down failed");
            verify(p, 8192 / 8, 5000 + i, "realloc down");
            p = realloc(p, n);
        }
        if (!p) DIE("large allocation %d failed", i);
        if (malloc_usable_size(p) < n) DIE("large malloc_usable_size %zu < %zu", malloc_usable_size(p), n);
        large[i] = p;
        large_len[i] = n;
        put(p, n, 5000 + i);
    }
#ifdef WITH_JEMALLOC
    /* jemalloc's own API on window blocks and on its own. */
    for (int i = 0; i < 64; i++) {
        size_t n = i % 2 ? 2u << 20 : 4096;
        void *p = mallocx(n, MALLOCX_ALIGN(4096) | MALLOCX_ZERO);
        if (!p || (uintptr_t)p % 4096) DIE("mallocx %zu", n);
        if (sallocx(p, 0) < n) DIE("sallocx %zu < %zu", sallocx(p, 0), n);
        for (size_t k = 0; k < n; k += 512)
            if (((unsigned char *)p)[k]) DIE("mallocx ZERO block not zero");
        put(p, n, 77 + i);
        size_t got = xallocx(p, n, 4096, 0);
        if (got < n) DIE("xallocx shrank %zu to %zu", n, got);
        p = rallocx(p, n * 2, 0);
        if (!p) DIE("rallocx");
        verify(p, n / 8, 77 + i, "rallocx");
        if (i % 4 < 2) dallocx(p, 0);
        else sdallocx(p, n * 2, 0);
    }
#endif
    uint64_t h = check_all("parent");
    printf("checksum=%016llx\n", (unsigned long long)h);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) DIE("fork failed");
    if (pid == 0) {
        uint64_t c = check_all("child");
        /* The child frees and allocates on its own. */
        for (int i = 0; i < NSMALL; i += 3) free(small[i]);
        for (int i = 0; i < NLARGE; i += 2) free(large[i]);
        void *p = malloc(3 << 20);
        put(p, 3 << 20, 9);
        verify(p, (3 << 20) / 8, 9, "child block");
        free(p);
        printf("child checksum=%016llx\n", (unsigned long long)c);
        fflush(stdout);
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) DIE("child failed (status %d)", st);
    /* The parent's blocks are untouched by the child's frees. */
    if (check_all("parent after child") != h) DIE("parent contents changed");
    for (int i = 0; i < NSMALL; i++) free(small[i]);
    for (int i = 0; i < NLARGE; i++) free(large[i]);
    printf("done\n");
    return 0;
}
