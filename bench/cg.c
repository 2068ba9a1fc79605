/* cg: conjugate gradient on the 27-point stencil of an n x n x n grid (the operator of MiniFE, the
 * sequential kind of seed 002's Fig. 4), the matrix stored in compressed sparse rows, T threads
 * splitting the rows. Dot products are summed per block of 4096 rows and the blocks in order, so
 * the result (and the checksum) is the same for any number of threads, natively and under rackmem.
 * usage: cg [n=80] [iterations=25] [threads=1, 0 = every online CPU]
 * prints: result name=cg rows=.. bytes=.. threads=.. iterations=.. seconds=.. residual=.. checksum=..
 * (bytes = matrix and vectors; seconds = the iterations, not the assembly) */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "bench.h"

#define BLOCK 4096

static size_t rows, nblocks;
static long nthreads;
static int iterations;
static uint64_t *rowptr;
static uint32_t *col;
static double *val, *x, *r, *p, *q, *partial;
static double shared_scalar[2];
static pthread_barrier_t bar;

static void range(long id, size_t *from, size_t *to) {
    /* Whole blocks per thread, so a block's partial sum is one thread's. */
    size_t b0 = nblocks * id / nthreads, b1 = nblocks * (id + 1) / nthreads;
    *from = b0 * BLOCK;
    *to = b1 * BLOCK < rows ? b1 * BLOCK : rows;
}

/* Sum of a[i]*b[i] over the thread's blocks into partial[], then (thread 0) the blocks in order. */
static double dot(long id, const double *a, const double *b) {
    size_t from, to;
    range(id, &from, &to);
    for (size_t s = from; s < to; s += BLOCK) {
        size_t e = s + BLOCK < to ? s + BLOCK : to;
        double acc = 0;
        for (size_t i = s; i < e; i++) acc += a[i] * b[i];
        partial[s / BLOCK] = acc;
    }
    pthread_barrier_wait(&bar);
    if (id == 0) {
        double t = 0;
        for (size_t k = 0; k < nblocks; k++) t += partial[k];
        shared_scalar[0] = t;
    }
    pthread_barrier_wait(&bar);
    return shared_scalar[0];
}

static void *solve(void *arg) {
    long id = (long)arg;
    size_t from, to;
    range(id, &from, &to);
    double rr = dot(id, r, r);
    for (int it = 0; it < iterations; it++) {
        for (size_t i = from; i < to; i++) {
            double s = 0;
            for (uint64_t k = rowptr[i]; k < rowptr[i + 1]; k++) s += val[k] * p[col[k]];
            q[i] = s;
        }
        pthread_barrier_wait(&bar);
        double alpha = rr / dot(id, p, q);
        for (size_t i = from; i < to; i++) { x[i] += alpha * p[i]; r[i] -= alpha * q[i]; }
        pthread_barrier_wait(&bar);
        double rr_new = dot(id, r, r);
        double beta = rr_new / rr;
        rr = rr_new;
        for (size_t i = from; i < to; i++) p[i] = r[i] + beta * p[i];
        pthread_barrier_wait(&bar);
    }
    if (id == 0) shared_scalar[1] = sqrt(rr);
    return NULL;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], 0, 0) : 80;
    iterations = argc > 2 ? atoi(argv[2]) : 25;
    nthreads = argc > 3 ? strtol(argv[3], 0, 0) : 1;
    if (nthreads == 0) nthreads = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 2 || n > 1000 || iterations < 1 || nthreads < 1 || nthreads > 1024) {
        fprintf(stderr, "cg: usage: cg [n 2..1000] [iterations >= 1] [threads 0..1024]\n");
        return 2;
    }
    rows = n * n * n;
    nblocks = (rows + BLOCK - 1) / BLOCK;
    size_t nnz_max = rows * 27;
    rowptr = malloc((rows + 1) * sizeof *rowptr);
    col = malloc(nnz_max * sizeof *col);
    val = malloc(nnz_max * sizeof *val);
    x = malloc(rows * sizeof *x); r = malloc(rows * sizeof *r);
    p = malloc(rows * sizeof *p); q = malloc(rows * sizeof *q);
    partial = malloc(nblocks * sizeof *partial);
    if (!rowptr || !col || !val || !x || !r || !p || !q || !partial) { fprintf(stderr, "cg: out of memory\n"); return 1; }
    /* Assembly: 27 on the diagonal, -1 to each neighbour (diagonally dominant, so SPD); b = A * 1,
     * so the solution is all ones and x starts at 0. */
    uint64_t k = 0;
    for (size_t z = 0; z < n; z++)
        for (size_t y = 0; y < n; y++)
            for (size_t xx = 0; xx < n; xx++) {
                size_t i = (z * n + y) * n + xx;
                rowptr[i] = k;
                double rowsum = 0;
                for (int dz = -1; dz <= 1; dz++)
                    for (int dy = -1; dy <= 1; dy++)
                        for (int dx = -1; dx <= 1; dx++) {
                            long zz = (long)z + dz, yy = (long)y + dy, xs = (long)xx + dx;
                            if (zz < 0 || yy < 0 || xs < 0 || zz >= (long)n || yy >= (long)n || xs >= (long)n) continue;
                            col[k] = (uint32_t)(((size_t)zz * n + (size_t)yy) * n + (size_t)xs);
                            val[k] = (dz == 0 && dy == 0 && dx == 0) ? 27.0 : -1.0;
                            rowsum += val[k];
                            k++;
                        }
                x[i] = 0;
                r[i] = rowsum; /* b - A*0 */
                p[i] = rowsum;
            }
    rowptr[rows] = k;
    pthread_barrier_init(&bar, NULL, (unsigned)nthreads);
    pthread_t *ids = calloc(nthreads, sizeof *ids);
    if (!ids) { fprintf(stderr, "cg: out of memory\n"); return 1; }
    double t0 = now();
    for (long i = 1; i < nthreads; i++)
        if (pthread_create(&ids[i], NULL, solve, (void *)i)) { fprintf(stderr, "cg: pthread_create failed\n"); return 1; }
    solve((void *)0);
    for (long i = 1; i < nthreads; i++) pthread_join(ids[i], NULL);
    double dt = now() - t0;
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < rows * sizeof *x; i++) { h ^= b[i]; h *= 1099511628211ull; }
    size_t bytes = (rows + 1) * sizeof *rowptr + k * (sizeof *col + sizeof *val) + 4 * rows * sizeof(double);
    printf("result name=cg rows=%zu bytes=%zu threads=%ld iterations=%d seconds=%.4f residual=%.3e checksum=%016llx\n",
           rows, bytes, nthreads, iterations, dt, shared_scalar[1], (unsigned long long)h);
    return 0;
}
