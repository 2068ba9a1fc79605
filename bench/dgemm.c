/* dgemm: C = A * B for n x n doubles, in 64 x 64 tiles, T threads each computing whole row tiles
 * of C (the DGEMM of seed 002's Fig. 4, written plainly: no BLAS, so every build runs the same
 * loops). Each element of C is summed in the same order whatever the threads, so the checksum is
 * the same for any number of threads, natively and under rackmem.
 * usage: dgemm [n=1536] [threads=1, 0 = every online CPU]
 * prints: result name=dgemm n=.. bytes=.. threads=.. seconds=.. gflops=.. checksum=.. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "bench.h"

#define TILE 64

static size_t n;
static long nthreads;
static double *A, *B, *C;

static void *work(void *arg) {
    long id = (long)arg;
    size_t tiles = (n + TILE - 1) / TILE;
    for (size_t ti = (size_t)id; ti < tiles; ti += (size_t)nthreads) {
        size_t i0 = ti * TILE, i1 = i0 + TILE < n ? i0 + TILE : n;
        for (size_t k0 = 0; k0 < n; k0 += TILE) {
            size_t k1 = k0 + TILE < n ? k0 + TILE : n;
            for (size_t j0 = 0; j0 < n; j0 += TILE) {
                size_t j1 = j0 + TILE < n ? j0 + TILE : n;
                for (size_t i = i0; i < i1; i++)
                    for (size_t k = k0; k < k1; k++) {
                        double a = A[i * n + k];
                        for (size_t j = j0; j < j1; j++) C[i * n + j] += a * B[k * n + j];
                    }
            }
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    n = argc > 1 ? strtoull(argv[1], 0, 0) : 1536;
    nthreads = argc > 2 ? strtol(argv[2], 0, 0) : 1;
    if (nthreads == 0) nthreads = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1 || n > 65536 || nthreads < 1 || nthreads > 1024) {
        fprintf(stderr, "dgemm: usage: dgemm [n 1..65536] [threads 0..1024]\n");
        return 2;
    }
    A = malloc(n * n * sizeof *A); B = malloc(n * n * sizeof *B); C = malloc(n * n * sizeof *C);
    pthread_t *ids = calloc(nthreads, sizeof *ids);
    if (!A || !B || !C || !ids) { fprintf(stderr, "dgemm: out of memory\n"); return 1; }
    for (size_t i = 0; i < n * n; i++) {
        A[i] = (double)((i * 7 + 3) % 13) / 13.0;
        B[i] = (double)((i * 5 + 1) % 11) / 11.0;
        C[i] = 0;
    }
    double t0 = now();
    for (long i = 1; i < nthreads; i++)
        if (pthread_create(&ids[i], NULL, work, (void *)i)) { fprintf(stderr, "dgemm: pthread_create failed\n"); return 1; }
    work((void *)0);
    for (long i = 1; i < nthreads; i++) pthread_join(ids[i], NULL);
    double dt = now() - t0;
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)C;
    for (size_t i = 0; i < n * n * sizeof *C; i++) { h ^= b[i]; h *= 1099511628211ull; }
    printf("result name=dgemm n=%zu bytes=%zu threads=%ld seconds=%.4f gflops=%.3f checksum=%016llx\n", n,
           3 * n * n * sizeof(double), nthreads, dt, 2.0 * n * n * n / dt / 1e9, (unsigned long long)h);
    return 0;
}
