/* fault_latency: latency of touching one random 4 KiB page of a large buffer, seen by the
 * program. Under `rackmem run --local SMALL --prefetch 0` almost every touch is a remote fault
 * (fetch from the brick, plus the eviction it causes); natively it is a cache/TLB miss.
 * usage: fault_latency [MiB=256] [touches=20000] [seed=1]
 * prints: result name=fault_latency touches=N p50_us=.. p90_us=.. p99_us=.. mean_us=.. checksum=.. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 0) : 256;
    size_t touches = argc > 2 ? strtoul(argv[2], 0, 0) : 20000;
    uint64_t seed = argc > 3 ? strtoull(argv[3], 0, 0) : 1;
    size_t len = mib << 20, pages = len / 4096;
    volatile uint8_t *buf = malloc(len);
    uint64_t *lat = malloc(touches * sizeof *lat);
    if (!buf || !lat) { fprintf(stderr, "fault_latency: out of memory\n"); return 1; }
    for (size_t p = 0; p < pages; p++) buf[p * 4096] = (uint8_t)(p * 7 + 1);
    uint64_t sum = 0;
    for (size_t i = 0; i < touches; i++) {
        size_t p = xorshift(&seed) % pages;
        uint64_t t0 = now_ns();
        uint8_t v = buf[p * 4096 + 64];
        uint64_t t1 = now_ns();
        lat[i] = t1 - t0;
        sum = sum * 31 + v + buf[p * 4096];
        if (buf[p * 4096] != (uint8_t)(p * 7 + 1)) { fprintf(stderr, "DATA CORRUPTION at page %zu\n", p); return 3; }
    }
    uint64_t total = 0;
    for (size_t i = 0; i < touches; i++) total += lat[i];
    qsort(lat, touches, sizeof *lat, cmp_u64);
    printf("result name=fault_latency touches=%zu p50_us=%.2f p90_us=%.2f p99_us=%.2f mean_us=%.2f checksum=%016llx\n",
           touches, lat[touches / 2] / 1e3, lat[touches * 9 / 10] / 1e3, lat[touches * 99 / 100] / 1e3,
           (double)total / touches / 1e3, (unsigned long long)sum);
    free((void *)buf);
    free(lat);
    return 0;
}
