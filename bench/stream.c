/* stream: the four STREAM kernels (copy, scale, add, triad) over three arrays allocated with
 * malloc, so under rackmem they live in remote memory. Reports the best of N iterations per
 * kernel and a checksum of the final arrays (identical natively and under rackmem).
 * With T threads each kernel's elements are split between them (seed 004's STREAM runs on 1 to
 * all cores); the arrays end the same for any T.
 * With init=varied the arrays start with a different value in every element: constant arrays
 * are same-filled pages, which rackmem (like zram) keeps as one word and never moves, so only
 * varied arrays measure a link.
 * With progress (a fifth argument) every kernel run prints a line as it ends, flushed:
 *   step ITERATION KERNEL START END BYTES   (START, END: wall-clock seconds since the epoch)
 * so a script can take the throughput over any stretch of time (scripts/drain-bench does,
 * around a brick drain).
 * usage: stream [elements=10000000] [iterations=5] [threads=1, 0 = every online CPU] [init=const|varied] [progress]
 * prints: result name=stream elements=.. bytes=.. seconds=.. copy_mb_s=.. scale_mb_s=.. add_mb_s=.. triad_mb_s=..
 *         rate=.. checksum=..
 * (bytes = footprint of the three arrays; seconds = best triad time; rate = triad_mb_s) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench.h"


static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}

static size_t n;
static int iters;
static long nthreads;
static double *a, *b, *c;
static double best[4] = { 1e30, 1e30, 1e30, 1e30 };
static pthread_barrier_t bar;
static int progress;

/* Wall-clock seconds: progress lines are matched with other programs' times. */
static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *kernels(void *arg) {
    long id = (long)arg;
    size_t from = n * id / nthreads, to = n * (id + 1) / nthreads;
    const double s = 3.0;
    for (int k = 0; k < iters; k++) {
        double t[5], w[5];
        for (int kernel = 0; kernel < 4; kernel++) {
            pthread_barrier_wait(&bar);
            if (id == 0) {
                t[kernel] = now();
                w[kernel] = wall();
                if (progress && kernel > 0) {
                    printf("step %d %d %.6f %.6f %.0f\n", k, kernel - 1, w[kernel - 1], w[kernel],
                           (kernel - 1 < 2 ? 16.0 : 24.0) * n);
                    fflush(stdout);
                }
            }
            switch (kernel) {
            case 0: for (size_t i = from; i < to; i++) c[i] = a[i]; break;
            case 1: for (size_t i = from; i < to; i++) b[i] = s * c[i]; break;
            case 2: for (size_t i = from; i < to; i++) c[i] = a[i] + b[i]; break;
            default: for (size_t i = from; i < to; i++) a[i] = b[i] + s * c[i]; break;
            }
        }
        pthread_barrier_wait(&bar);
        if (id == 0) {
            t[4] = now();
            w[4] = wall();
            if (progress) {
                printf("step %d 3 %.6f %.6f %.0f\n", k, w[3], w[4], 24.0 * n);
                fflush(stdout);
            }
            for (int kernel = 0; kernel < 4; kernel++)
                if (t[kernel + 1] - t[kernel] < best[kernel]) best[kernel] = t[kernel + 1] - t[kernel];
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    n = argc > 1 ? strtoull(argv[1], 0, 0) : 10000000;
    iters = argc > 2 ? atoi(argv[2]) : 5;
    nthreads = argc > 3 ? strtol(argv[3], 0, 0) : 1;
    if (nthreads == 0) nthreads = sysconf(_SC_NPROCESSORS_ONLN);
    if (n == 0 || iters < 1 || nthreads < 1 || nthreads > 1024) { fprintf(stderr, "stream: bad arguments\n"); return 2; }
    a = malloc(n * sizeof *a), b = malloc(n * sizeof *b), c = malloc(n * sizeof *c);
    pthread_t *ids = calloc(nthreads, sizeof *ids);
    if (!a || !b || !c || !ids) { fprintf(stderr, "stream: out of memory\n"); return 1; }
    int varied = argc > 4 && strcmp(argv[4], "varied") == 0;
    if (argc > 4 && !varied && strcmp(argv[4], "const") != 0) { fprintf(stderr, "stream: init must be const or varied\n"); return 2; }
    progress = argc > 5 && strcmp(argv[5], "progress") == 0;
    if (argc > 5 && !progress) { fprintf(stderr, "stream: the fifth argument is progress or nothing\n"); return 2; }
    for (size_t i = 0; i < n; i++) {
        double d = varied ? (double)(i % 1000003) * 1e-7 : 0.0;
        a[i] = 1.0 + d; b[i] = 2.0 + d; c[i] = d;
    }
    pthread_barrier_init(&bar, NULL, (unsigned)nthreads);
    for (long i = 1; i < nthreads; i++)
        if (pthread_create(&ids[i], NULL, kernels, (void *)i)) { fprintf(stderr, "stream: pthread_create failed\n"); return 1; }
    kernels((void *)0);
    for (long i = 1; i < nthreads; i++) pthread_join(ids[i], NULL);
    double bytes[4] = { 16.0 * n, 16.0 * n, 24.0 * n, 24.0 * n };
    uint64_t h = 1469598103934665603ull;
    h = fnv(a, n * sizeof *a, h); h = fnv(b, n * sizeof *b, h); h = fnv(c, n * sizeof *c, h);
    printf("result name=stream elements=%zu bytes=%zu threads=%ld seconds=%.4f copy_mb_s=%.1f scale_mb_s=%.1f add_mb_s=%.1f "
           "triad_mb_s=%.1f rate=%.1f checksum=%016llx\n",
           n, 3 * n * sizeof(double), nthreads, best[3], bytes[0] / best[0] / 1e6, bytes[1] / best[1] / 1e6,
           bytes[2] / best[2] / 1e6, bytes[3] / best[3] / 1e6, bytes[3] / best[3] / 1e6, (unsigned long long)h);
    free(a); free(b); free(c); free(ids);
    return 0;
}
