/* bfs: breadth-first search on a Kronecker (R-MAT) graph, as the Graph500 benchmark does.
 * usage: bfs [scale=20] [edgefactor=16] [roots=8] [seed=1] [A=0.57 B=0.19 C=0.19]
 * prints: result name=bfs vertices=.. edges=.. bytes=.. roots=.. seconds=.. teps=.. valid=..
 *         max_degree=.. mean_degree=.. isolated=.. edge_checksum=.. checksum=..
 *
 * Graph500's generator: 2^scale vertices and edgefactor * 2^scale edges, each edge placed by
 * scale recursive choices of a quadrant of the adjacency matrix with probabilities A, B, C and
 * D = 1 - A - B - C (Graph500: 0.57, 0.19, 0.19, 0.05); vertex labels are then permuted so that
 * a vertex's degree says nothing about its number. Edge i's choices come from a counter-based
 * generator (splitmix64 of seed, i and level), so the graph is the same on every run. The edge
 * list (two 32-bit vertices per edge) is turned into an undirected CSR graph (self-loops
 * dropped, duplicates kept), both held in large malloc'd arrays.
 *
 * BFS (top-down, a FIFO queue) runs from `roots` vertices of non-zero degree picked by the
 * seed; teps is the harmonic mean over roots of the edges of the reached component divided by
 * the search time, as Graph500 reports it. The first search is validated as Graph500 does
 * (every tree edge joins levels l and l+1, every graph edge joins levels at most one apart, both
 * ends reached or neither). The checksum covers every search's parent and level arrays; with a
 * FIFO queue over the same CSR they are the same natively and under rackmem. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double unit(uint64_t x) { return (x >> 11) * (1.0 / 9007199254740992.0); }

static uint64_t fnv(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

int main(int argc, char **argv) {
    unsigned scale = argc > 1 ? (unsigned)strtoul(argv[1], 0, 0) : 20;
    uint64_t ef = argc > 2 ? strtoull(argv[2], 0, 0) : 16;
    unsigned nroots = argc > 3 ? (unsigned)strtoul(argv[3], 0, 0) : 8;
    uint64_t seed = argc > 4 ? strtoull(argv[4], 0, 0) : 1;
    double A = argc > 5 ? strtod(argv[5], 0) : 0.57;
    double B = argc > 6 ? strtod(argv[6], 0) : 0.19;
    double C = argc > 7 ? strtod(argv[7], 0) : 0.19;
    if (scale < 1 || scale > 30 || !ef || !nroots || A < 0 || B < 0 || C < 0 || A + B + C > 1) {
        fprintf(stderr, "bfs: need 1 <= scale <= 30, edgefactor >= 1, roots >= 1, A+B+C <= 1\n");
        return 1;
    }
    uint64_t nv = 1ull << scale, ne = ef * nv;
    uint32_t *edges = malloc(ne * 2 * sizeof(uint32_t));
    uint32_t *perm = malloc(nv * sizeof(uint32_t));
    uint64_t *off = calloc(nv + 1, sizeof(uint64_t));
    if (!edges || !perm || !off) {
        fprintf(stderr, "bfs: malloc failed\n");
        return 1;
    }
    for (uint64_t e = 0; e < ne; e++) {
        uint32_t u = 0, v = 0;
        for (unsigned l = 0; l < scale; l++) {
            double r = unit(splitmix(seed ^ splitmix(e * 64 + l)));
            unsigned bu = r >= A + B, bv = (r >= A && r < A + B) || r >= A + B + C;
            u |= bu << l;
            v |= bv << l;
        }
        edges[2 * e] = u;
        edges[2 * e + 1] = v;
    }
    /* Fisher-Yates shuffle of the labels. */
    for (uint64_t i = 0; i < nv; i++) perm[i] = (uint32_t)i;
    for (uint64_t i = nv - 1; i > 0; i--) {
        uint64_t j = splitmix(seed * 31 + i) % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    uint64_t edge_sum = 1469598103934665603ull;
    for (uint64_t e = 0; e < ne; e++) {
        uint32_t u = perm[edges[2 * e]], v = perm[edges[2 * e + 1]];
        edges[2 * e] = u;
        edges[2 * e + 1] = v;
        edge_sum = fnv(fnv(edge_sum, u), v);
        if (u != v) {
            off[u + 1]++;
            off[v + 1]++;
        }
    }
    uint64_t max_degree = 0, isolated = 0;
    for (uint64_t i = 0; i < nv; i++) {
        uint64_t dg = off[i + 1];
        if (dg > max_degree) max_degree = dg;
        if (!dg) isolated++;
        off[i + 1] += off[i];
    }
    uint64_t nadj = off[nv];
    uint32_t *adj = malloc((nadj ? nadj : 1) * sizeof(uint32_t));
    uint64_t *fill = malloc(nv * sizeof(uint64_t));
    int64_t *parent = malloc(nv * sizeof(int64_t));
    int32_t *level = malloc(nv * sizeof(int32_t));
    uint32_t *queue = malloc(nv * sizeof(uint32_t));
    if (!adj || !fill || !parent || !level || !queue) {
        fprintf(stderr, "bfs: malloc failed\n");
        return 1;
    }
    memcpy(fill, off, nv * sizeof(uint64_t));
    /* The edge list is read once per slice of 1/16 of the vertices and only that slice's part
     * of adj is written: the scattered writes then stay within a sixteenth of adj instead of
     * spreading over all of it (kernel 1 of Graph500 is untimed, but it should not thrash). */
    for (uint64_t lo = 0, step = (nv + 15) / 16; lo < nv; lo += step) {
        uint64_t hi = lo + step;
        for (uint64_t e = 0; e < ne; e++) {
            uint32_t u = edges[2 * e], v = edges[2 * e + 1];
            if (u == v) continue;
            if (u >= lo && u < hi) adj[fill[u]++] = v;
            if (v >= lo && v < hi) adj[fill[v]++] = u;
        }
    }
    free(edges);
    free(fill);
    uint64_t checksum = 1469598103934665603ull;
    double inv_teps = 0, total = 0;
    int valid = 1;
    uint64_t pick = seed;
    for (unsigned r = 0; r < nroots; r++) {
        uint32_t root;
        do root = (uint32_t)(splitmix(pick++) % nv);
        while (off[root + 1] == off[root] && nadj);
        for (uint64_t i = 0; i < nv; i++) {
            parent[i] = -1;
            level[i] = -1;
        }
        double t0 = now();
        uint64_t head = 0, tail = 0, traversed = 0;
        parent[root] = root;
        level[root] = 0;
        queue[tail++] = root;
        while (head < tail) {
            uint32_t u = queue[head++];
            traversed += off[u + 1] - off[u];
            for (uint64_t j = off[u]; j < off[u + 1]; j++) {
                uint32_t v = adj[j];
                if (parent[v] < 0) {
                    parent[v] = u;
                    level[v] = level[u] + 1;
                    queue[tail++] = v;
                }
            }
        }
        double dt = now() - t0;
        total += dt;
        /* Edges of the component: each undirected edge was seen from both ends. */
        double teps = dt > 0 ? (traversed / 2) / dt : 0;
        inv_teps += teps > 0 ? 1.0 / teps : 0;
        if (r == 0) {
            for (uint64_t v = 0; v < nv && valid; v++) {
                if (level[v] < 0) continue;
                if (v != root && level[v] != level[parent[v]] + 1) valid = 0;
                for (uint64_t j = off[v]; j < off[v + 1]; j++) {
                    int32_t lw = level[adj[j]];
                    if (lw < 0 || lw > level[v] + 1 || lw < level[v] - 1) valid = 0;
                }
            }
        }
        for (uint64_t i = 0; i < nv; i++) checksum = fnv(fnv(checksum, (uint64_t)parent[i]), (uint32_t)level[i]);
    }
    double teps = inv_teps > 0 ? nroots / inv_teps : 0;
    printf("result name=bfs vertices=%llu edges=%llu bytes=%llu roots=%u seconds=%.4f teps=%.1f valid=%d max_degree=%llu "
           "mean_degree=%.3f isolated=%llu edge_checksum=%016llx checksum=%016llx\n",
           (unsigned long long)nv, (unsigned long long)ne,
           (unsigned long long)(ne * 2 * sizeof(uint32_t) + nadj * sizeof(uint32_t) + (nv + 1) * sizeof(uint64_t)), nroots,
           total, teps, valid, (unsigned long long)max_degree, (double)nadj / nv, (unsigned long long)isolated,
           (unsigned long long)edge_sum, (unsigned long long)checksum);
    free(adj);
    free(perm);
    free(off);
    free(parent);
    free(level);
    free(queue);
    return 0;
}
