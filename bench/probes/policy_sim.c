/* policy_sim: how many page faults each eviction policy would take on a program's own accesses.
 * Reads a valgrind lackey trace (every load, store and modify, with its address) on stdin, keeps
 * the 4 KiB page of each access, and replays the page sequence against a local buffer of a given
 * share of the distinct pages touched, under:
 *   LRU           exact least-recently-used: sees every access (what no user-space pager can see)
 *   FIFO          evicts in fault order: sees only misses (rackmem's `--eviction fifo`)
 *   CLOCK-all     second chance with a reference bit set by every access (the kernel's view)
 *   CLOCK-writes  the same with the bit set by stores only: what UFFD_FEATURE_WP_ASYNC with
 *                 PAGEMAP_SCAN could tell a user-space pager about hits
 * Build: gcc -O2 -Wall policy_sim.c -o policy_sim
 * Run:   valgrind --tool=lackey --trace-mem=yes --log-fd=9 PROGRAM ARGS 9>&1 >/dev/null \
 *            | ./policy_sim 0.25 0.5
 * Only consecutive accesses to different pages are kept, so the trace fits in memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TABLE (1u << 22)

static uint64_t keys[TABLE]; /* page + 1; 0 is empty */
static int ids[TABLE];
static int npages;

/* A dense id for page `p`, given at its first access. */
static int page_id(uint64_t p)
{
    uint64_t h = (p * 0x9E3779B97F4A7C15ull) >> 42;
    while (keys[h] && keys[h] != p + 1)
        h = (h + 1) & (TABLE - 1);
    if (!keys[h]) {
        if (npages == TABLE / 2) {
            fprintf(stderr, "more than %u distinct pages\n", TABLE / 2);
            exit(1);
        }
        keys[h] = p + 1;
        ids[h] = npages++;
    }
    return ids[h];
}

static int *seq;  /* page ids in access order */
static char *wrt; /* whether that access (or one merged into it) stored */
static size_t n;

static long lru(int cap)
{
    int *prev = malloc(npages * sizeof(int)), *next = malloc(npages * sizeof(int));
    char *in = calloc(npages, 1);
    int head = -1, tail = -1, count = 0;
    long misses = 0;
    for (size_t i = 0; i < n; i++) {
        int p = seq[i];
        if (in[p]) {
            if (head == p)
                continue;
            if (prev[p] >= 0)
                next[prev[p]] = next[p];
            if (next[p] >= 0)
                prev[next[p]] = prev[p];
            if (tail == p)
                tail = prev[p];
        } else {
            misses++;
            if (count == cap) {
                int v = tail;
                tail = prev[v];
                if (tail >= 0)
                    next[tail] = -1;
                else
                    head = -1;
                in[v] = 0;
                count--;
            }
            in[p] = 1;
            count++;
        }
        prev[p] = -1;
        next[p] = head;
        if (head >= 0)
            prev[head] = p;
        head = p;
        if (tail < 0)
            tail = p;
    }
    free(prev);
    free(next);
    free(in);
    return misses;
}

/* CLOCK over a ring of `cap` pages; `refs`: 0 never (FIFO), 1 every access, 2 stores only. */
static long clock_policy(int cap, int refs)
{
    int *ring = malloc(cap * sizeof(int));
    char *in = calloc(npages, 1), *ref = calloc(npages, 1);
    int count = 0, hand = 0;
    long misses = 0;
    for (size_t i = 0; i < n; i++) {
        int p = seq[i];
        if (in[p]) {
            if (refs == 1 || (refs == 2 && wrt[i]))
                ref[p] = 1;
            continue;
        }
        misses++;
        if (count < cap) {
            ring[count++] = p;
        } else {
            while (ref[ring[hand]]) {
                ref[ring[hand]] = 0;
                hand = (hand + 1) % cap;
            }
            in[ring[hand]] = 0;
            ring[hand] = p;
            hand = (hand + 1) % cap;
        }
        in[p] = 1;
        ref[p] = 0;
    }
    free(ring);
    free(in);
    free(ref);
    return misses;
}

int main(int argc, char **argv)
{
    char line[256];
    size_t cap = 1 << 24;
    seq = malloc(cap * sizeof(int));
    wrt = malloc(cap);
    int last = -1;
    while (fgets(line, sizeof line, stdin)) {
        char t = line[1];
        if (line[0] != ' ' || (t != 'L' && t != 'S' && t != 'M'))
            continue;
        int p = page_id(strtoull(line + 3, NULL, 16) >> 12);
        char w = t != 'L';
        if (p == last) {
            wrt[n - 1] |= w;
            continue;
        }
        if (n == cap) {
            cap *= 2;
            seq = realloc(seq, cap * sizeof(int));
            wrt = realloc(wrt, cap);
        }
        seq[n] = p;
        wrt[n] = w;
        n++;
        last = p;
    }
    printf("%zu page changes over %d distinct pages (%.1f MiB)\n", n, npages, npages / 256.0);
    for (int a = 1; a < argc; a++) {
        double share = atof(argv[a]);
        int c = (int)(npages * share);
        if (c < 1)
            c = 1;
        long l = lru(c), f = clock_policy(c, 0), ca = clock_policy(c, 1), cw = clock_policy(c, 2);
        printf("buffer %.0f%% (%d pages): faults LRU %ld, FIFO %ld (%.2f x LRU), CLOCK-all %ld (%.2f x), "
               "CLOCK-writes %ld (%.2f x)\n",
               share * 100, c, l, f, (double)f / l, ca, (double)ca / l, cw, (double)cw / l);
    }
    return 0;
}
