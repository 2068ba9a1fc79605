/* protected_evict: window pages that are not read-write are evicted and come back intact.
 * A region is filled, made read-only, pushed out by filling a second region, read back; made
 * PROT_NONE, pushed out again, made read-write, read and rewritten. Prints a checksum.
 * usage: protected_evict MIB (each region) */
#include "common.h"
#include <sys/mman.h>

static uint64_t *region(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) DIE("mmap failed");
    return p;
}

int main(int argc, char **argv) {
    size_t bytes = arg_mib(argc, argv, 1, 32), words = bytes / 8;
    uint64_t *a = region(bytes), *b = region(bytes);
    fill(a, words, 1);
    if (mprotect(a, bytes, PROT_READ)) DIE("mprotect(PROT_READ) failed");
    fill(b, words, 2);                        /* pushes a's read-only pages out */
    verify(a, words, 1, "read-only region"); /* and back in, read-only */
    verify(b, words, 2, "second region");
    if (mprotect(a, bytes, PROT_NONE)) DIE("mprotect(PROT_NONE) failed");
    fill(b, words, 3);                        /* pushes a's PROT_NONE pages out */
    verify(b, words, 3, "second region, rewritten");
    if (mprotect(a, bytes, PROT_READ | PROT_WRITE)) DIE("mprotect(PROT_READ|PROT_WRITE) failed");
    verify(a, words, 1, "region made read-write again");
    fill(a, words, 4);
    verify(a, words, 4, "region rewritten");
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, bytes, fnv1a(b, bytes, 0)));
    return 0;
}
