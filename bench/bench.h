/* Shared by the bench workloads: a monotonic clock in seconds. */
#ifndef RACKMEM_BENCH_H
#define RACKMEM_BENCH_H
#include <time.h>

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
#endif
