/* named_seg: one-sided segments driven line by line from standard input, so that a test can
 * make processes on several nodes open the same named segment and take turns (or run at
 * once). The calls are resolved at run time (under `rackmem run`, or built with -lrackmem).
 * One current segment at a time (a failed open or alloc keeps it). Every command prints one
 * line: "ok ..." or "err ERRNO".
 *
 *   open NAME BYTES      rackmem_seg_open; prints its size
 *   alloc BYTES          rackmem_seg_alloc; prints its size
 *   add OFF N            adds 1 to the word at OFF N times, alternating fetch-add and
 *                        compare-and-swap
 *   word OFF             prints the word at OFF
 *   fill SEED OFF LEN    puts the pattern SEED at OFF (LEN bytes, a multiple of 8)
 *   check SEED OFF LEN   gets LEN bytes at OFF and compares them with the pattern SEED;
 *                        prints their checksum
 *   rounds SEED OFF LEN N  N rounds of a put of pattern SEED+i at OFF and a get of it back,
 *                        compared (every put read back while, say, the segment moves)
 *   nbirounds SEED OFF LEN N  the same with non-blocking transfers: each round puts LEN in 16
 *                        rackmem_put_nbi, quiets, gets it back in 16 rackmem_get_nbi, quiets
 *   free                 rackmem_seg_free
 *   pid                  prints this process's id
 * End of input exits. */
#include "common.h"
#include <errno.h>
#include <unistd.h>
#include "putget_api.h"


static int add_n(rackmem_seg *s, uint64_t off, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        if (i % 2 == 0) {
            errno = 0;
            fetch_add(s, off, 1);
            if (errno) return -1;
        } else {
            uint64_t cur;
            if (get(s, off, &cur, 8)) return -1;
            for (;;) {
                errno = 0;
                uint64_t old = compare_swap(s, off, cur, cur + 1);
                if (errno) return -1;
                if (old == cur) break;
                cur = old;
            }
        }
    }
    return 0;
}

int main(void) {
    if (!resolve_putget()) { printf("rackmem=absent\n"); return 0; }
    setvbuf(stdout, NULL, _IOLBF, 0);
    rackmem_seg *s = NULL;
    char line[512], name[256];
    unsigned long long a, b, c, d;
    while (fgets(line, sizeof line, stdin)) {
        errno = 0;
        if (sscanf(line, "open %255s %llu", name, &a) == 2) {
            rackmem_seg *t = seg_open(name, a); /* on failure, the current segment stays */
            if (t) { s = t; printf("ok %zu\n", seg_size(s)); } else printf("err %d\n", errno);
        } else if (sscanf(line, "alloc %llu", &a) == 1) {
            rackmem_seg *t = seg_alloc(a);
            if (t) { s = t; printf("ok %zu\n", seg_size(s)); } else printf("err %d\n", errno);
        } else if (sscanf(line, "add %llu %llu", &a, &b) == 2) {
            if (add_n(s, a, b)) printf("err %d\n", errno); else printf("ok\n");
        } else if (sscanf(line, "word %llu", &a) == 1) {
            uint64_t w;
            if (get(s, a, &w, 8)) printf("err %d\n", errno); else printf("ok %llu\n", (unsigned long long)w);
        } else if (sscanf(line, "fill %llu %llu %llu", &a, &b, &c) == 3) {
            uint64_t *buf = malloc(c);
            if (!buf) DIE("malloc %llu", c);
            fill(buf, c / 8, a);
            if (put(s, b, buf, c)) printf("err %d\n", errno); else printf("ok\n");
            free(buf);
        } else if (sscanf(line, "rounds %llu %llu %llu %llu", &a, &b, &c, &d) == 4) {
            uint64_t *buf = malloc(c), *back = malloc(c);
            if (!buf || !back) DIE("malloc %llu", c);
            int bad = 0;
            for (unsigned long long i = 0; i < d && !bad; i++) {
                fill(buf, c / 8, a + i);
                if (put(s, b, buf, c) || get(s, b, back, c)) bad = 1;
                else verify(back, c / 8, a + i, "a put read back");
            }
            if (bad) printf("err %d\n", errno); else printf("ok\n");
            free(buf);
            free(back);
        } else if (sscanf(line, "nbirounds %llu %llu %llu %llu", &a, &b, &c, &d) == 4) {
            uint64_t *buf = malloc(c), *back = malloc(c);
            if (!buf || !back || c % 128) DIE("nbirounds: malloc %llu, or not a multiple of 128", c);
            size_t part = c / 16;
            int bad = 0;
            for (unsigned long long i = 0; i < d && !bad; i++) {
                fill(buf, c / 8, a + i);
                for (size_t k = 0; k < 16 && !bad; k++)
                    if (put_nbi(s, b + k * part, (char *)buf + k * part, part)) bad = 1;
                if (!bad && quiet()) bad = 1;
                for (size_t k = 0; k < 16 && !bad; k++)
                    if (get_nbi(s, b + k * part, (char *)back + k * part, part)) bad = 1;
                if (!bad && quiet()) bad = 1;
                if (!bad) verify(back, c / 8, a + i, "a non-blocking put read back");
            }
            if (bad) printf("err %d\n", errno); else printf("ok\n");
            free(buf);
            free(back);
        } else if (sscanf(line, "check %llu %llu %llu", &a, &b, &c) == 3) {
            uint64_t *buf = malloc(c);
            if (!buf) DIE("malloc %llu", c);
            if (get(s, b, buf, c)) {
                printf("err %d\n", errno);
            } else {
                verify(buf, c / 8, a, "a segment another process filled");
                printf("ok %016llx\n", (unsigned long long)fnv1a(buf, c, 0));
            }
            free(buf);
        } else if (!strncmp(line, "free", 4)) {
            seg_free(s);
            s = NULL;
            printf("ok\n");
        } else if (!strncmp(line, "pid", 3)) {
            printf("ok %d\n", (int)getpid());
        } else {
            printf("err %d\n", EINVAL);
        }
    }
    return 0;
}
