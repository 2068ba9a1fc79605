/* A chained hash table of small blocks of the C library's malloc (the shape of a C program
 * whose data are many small objects): N entries of 64 bytes, each allocated alone, inserted
 * under random keys; then lookups, a walk in allocation order, a checksum, frees of half the
 * entries (in allocation order, the chains of the others rebuilt) and a second generation of
 * strings of other sizes, a third of them grown by realloc.
 * Prints "checksum=..." lines. Usage: small_blocks [entries, default 1000000] */
#include "common.h"

struct entry {
    uint64_t key;
    struct entry *next;  /* bucket chain */
    struct entry *older; /* allocation order */
    uint64_t payload[5];
};

static uint64_t mix(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33;
    return k;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], 0, 0) : 1000000;
    size_t nb = 1;
    while (nb < n) nb <<= 1;
    struct entry **b = calloc(nb, sizeof *b);
    if (!b) DIE("calloc of %zu buckets failed", nb);
    struct entry *newest = 0;
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        struct entry *e = malloc(sizeof *e);
        if (!e) DIE("malloc of entry %zu failed", i);
        e->key = xorshift64(&s);
        fill(e->payload, 5, e->key);
        size_t h = mix(e->key) & (nb - 1);
        e->next = b[h];
        b[h] = e;
        e->older = newest;
        newest = e;
    }
    /* Lookups of a sample of keys, replayed from the same generator. */
    uint64_t s2 = 88172645463325252ull, found = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = xorshift64(&s2);
        if (i % 16) continue;
        for (struct entry *e = b[mix(k) & (nb - 1)]; e; e = e->next)
            if (e->key == k) { verify(e->payload, 5, k, "lookup"); found++; break; }
    }
    if (found != (n + 15) / 16) DIE("found %llu of %zu keys", (unsigned long long)found, (n + 15) / 16);
    uint64_t h = 0;
    for (struct entry *e = newest; e; e = e->older) {
        verify(e->payload, 5, e->key, "walk");
        h = fnv1a(e->payload, sizeof e->payload, h);
    }
    printf("checksum=%016llx entries=%zu\n", (unsigned long long)h, n);
    /* Free every other entry in allocation order, rebuilding the chains of those kept. */
    size_t freed = 0;
    memset(b, 0, nb * sizeof *b);
    struct entry *kept = 0;
    for (struct entry *e = newest, *older; e; e = older) {
        older = e->older;
        if (e->key & 1) { free(e); freed++; continue; }
        size_t h = mix(e->key) & (nb - 1);
        e->next = b[h];
        b[h] = e;
        e->older = kept;
        kept = e;
    }
    char **str = malloc(freed * sizeof *str);
    if (!str) DIE("malloc of %zu string pointers failed", freed);
    uint64_t h2 = 0;
    for (size_t i = 0; i < freed; i++) {
        size_t len = 8 + i % 40;
        str[i] = malloc(len);
        if (!str[i]) DIE("malloc of string %zu failed", i);
        for (size_t j = 0; j + 1 < len; j++) str[i][j] = 'a' + (i + j) % 26;
        str[i][len - 1] = 0;
        if (i % 3 == 0) {
            char *g = realloc(str[i], len * 3);
            if (!g) DIE("realloc of string %zu failed", i);
            memset(g + len - 1, 'z', len * 2);
            g[len * 3 - 1] = 0;
            str[i] = g;
        }
    }
    for (size_t i = 0; i < freed; i++) h2 = fnv1a(str[i], strlen(str[i]), h2);
    uint64_t h3 = 0;
    for (struct entry *e = kept; e; e = e->older) {
        verify(e->payload, 5, e->key, "after frees");
        h3 = fnv1a(&e->key, 8, h3);
    }
    printf("checksum=%016llx freed=%zu\n", (unsigned long long)h2, freed);
    printf("checksum=%016llx kept\n", (unsigned long long)h3);
    return 0;
}
