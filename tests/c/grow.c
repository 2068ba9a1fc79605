/* grow: a program whose memory grows in steps, shrinks, and grows again, checking every byte.
 *
 * usage: grow [STEPS=8] [MiB per step=64] [PAUSE_MS=0]
 * Allocates STEPS buffers of MiB each, one after the other, filling each with its own pattern
 * and re-checking every earlier buffer after each step (so earlier buffers are fetched back
 * from remote memory); frees the second half, allocates it again with new patterns, checks
 * everything, and prints a checksum of all buffers. With PAUSE_MS, it sleeps between steps
 * (a test restarts the control plane meanwhile). Exits 3 with "DATA CORRUPTION" on a bad word. */
#include "common.h"
#include <time.h>

static void pause_ms(long ms) {
    if (ms <= 0) return;
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, 0);
}

int main(int argc, char **argv) {
    size_t steps = argc > 1 ? strtoull(argv[1], 0, 0) : 8;
    size_t len = arg_mib(argc, argv, 2, 64);
    long pause = argc > 3 ? strtol(argv[3], 0, 0) : 0;
    if (steps == 0 || steps > 256 || len == 0) DIE("usage: grow [STEPS<=256] [MiB] [PAUSE_MS]");
    uint64_t *buf[256];
    uint64_t seed[256];
    size_t words = len / 8;
    for (size_t s = 0; s < steps; s++) {
        buf[s] = malloc(len);
        if (!buf[s]) DIE("malloc of step %zu failed", s);
        seed[s] = 1000 + s;
        fill(buf[s], words, seed[s]);
        for (size_t k = 0; k <= s; k++) verify(buf[k], words, seed[k], "buffer after growth");
        printf("step %zu: %zu MiB\n", s + 1, (s + 1) * (len >> 20));
        fflush(stdout);
        pause_ms(pause);
    }
    for (size_t s = steps / 2; s < steps; s++) free(buf[s]);
    printf("freed %zu MiB\n", (steps - steps / 2) * (len >> 20));
    fflush(stdout);
    pause_ms(pause);
    for (size_t s = steps / 2; s < steps; s++) {
        buf[s] = malloc(len);
        if (!buf[s]) DIE("malloc of step %zu (again) failed", s);
        seed[s] = 2000 + s;
        fill(buf[s], words, seed[s]);
    }
    uint64_t h = 0;
    for (size_t s = 0; s < steps; s++) {
        verify(buf[s], words, seed[s], "buffer at the end");
        h = fnv1a(buf[s], len, h);
    }
    printf("checksum=%016llx\n", (unsigned long long)h);
    return 0;
}
