/* Bad input to the malloc family, one kind per run (the first argument): "double" frees a small
 * block twice, "never" frees a pointer on the stack, "interior" frees a pointer into the middle
 * of a small block, "past" writes past a small block into its neighbour and frees the
 * neighbour, "after" writes into a freed block's first words (a use after free) and allocates
 * again, "window" frees a pointer into the middle of a large block. Each should be stopped by
 * the allocator (glibc aborts on all but "after" and "window", whose effects it cannot see
 * at once); "none" does everything right. Before the bad call it fills enough small blocks
 * that the program's small blocks live in remote memory under rackmem, and prints a checksum
 * of them (the program must not get further if the allocator stops it). */
#include "common.h"
#include <unistd.h>

#define N 100000

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "none";
    static uint64_t *keep[N];
    uint64_t h = 0;
    for (int i = 0; i < N; i++) {
        keep[i] = malloc(64);
        if (!keep[i]) DIE("malloc failed");
        fill(keep[i], 8, i);
        h = fnv1a(keep[i], 64, h);
    }
    printf("checksum=%016llx\n", (unsigned long long)h);
    fflush(stdout);
    char *volatile a = malloc(40);
    char *volatile b = malloc(40);
    char *volatile big = malloc(8 << 20);
    if (!a || !b || !big) DIE("malloc failed");
    memset(a, 1, 40);
    memset(b, 2, 40);
    memset(big, 3, 8 << 20);
    if (!strcmp(kind, "double")) {
        free(b);
        free(b);
    } else if (!strcmp(kind, "never")) {
        char local[64];
        char *volatile p = local + 16;
        free(p);
    } else if (!strcmp(kind, "interior")) {
        char *volatile p = a + 16;
        free(p);
    } else if (!strcmp(kind, "past")) {
        /* From a's start over its usable size into b's header (glibc's size field). */
        memset(a, 0x41, 64);
        free(b);
    } else if (!strcmp(kind, "after")) {
        free(b);
        memset(b, 0x42, 16);
        char *c = malloc(40), *d = malloc(40);
        if (c && d) memset(d, 4, 40);
    } else if (!strcmp(kind, "window")) {
        char *volatile p = big + 4096;
        free(p);
    } else {
        free(a);
        free(b);
        free(big);
    }
    h = 0;
    for (int i = 0; i < N; i++) {
        verify(keep[i], 8, i, "kept block");
        h = fnv1a(keep[i], 64, h);
        free(keep[i]);
    }
    printf("checksum=%016llx after %s\n", (unsigned long long)h, kind);
    return 0;
}
