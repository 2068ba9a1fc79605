/* putget: the one-sided calls of include/rackmem.h against a real brick, checked against a
 * local model of the same operations. The calls are resolved at run time, so one binary runs
 * under `rackmem run` (LD_PRELOAD) and, built with -lrackmem, without it.
 *
 * usage: putget model MIB SEED     random puts, gets (blocking and non-blocking), atomics on a
 *                                  segment of MIB MiB, each get compared with the model; then
 *                                  every error case; prints the model's checksum
 *        putget counter NAME PROCS N
 *                                  PROCS processes (this program, exec'd) open the named
 *                                  segment and each add 1 to one word N times, half by
 *                                  fetch-add and half by compare-and-swap; prints the total
 *        putget fork                a child of fork() cannot touch its parent's segment (EBADF)
 *                                  nor disturb its transfers in flight, even when it exits;
 *                                  it makes segments of its own, and so does its child */
#include "common.h"
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>
#include "putget_api.h"


/* Expects the call's result `got` to be the failure value and errno to be `want`. */
#define EXPECT_ERR(got, failure, want, what)                                                     \
    do {                                                                                          \
        errno = 0;                                                                                \
        if ((got) != (failure)) DIE("%s: succeeded, expected errno %d", what, want);              \
        if (errno != (want)) DIE("%s: errno %d (%s), expected %d", what, errno, strerror(errno), want); \
    } while (0)

static uint64_t rnd(uint64_t *s, uint64_t n) { return n ? xorshift64(s) % n : 0; }

static void check_range(const uint8_t *got, const uint8_t *want, size_t n, uint64_t off, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            DIE("DATA CORRUPTION: %s at segment offset %llu: %02x, expected %02x", what,
                (unsigned long long)(off + i), got[i], want[i]);
}

static int model(size_t bytes, uint64_t seed) {
    rackmem_seg *s = seg_alloc(bytes);
    if (!s) DIE("rackmem_seg_alloc(%zu): %s", bytes, strerror(errno));
    size_t size = seg_size(s);
    if (size < bytes) DIE("segment of %zu bytes for %zu asked", size, bytes);
    uint8_t *m = calloc(size, 1), *buf = malloc(size), *src = malloc(size);
    if (!m || !buf || !src) DIE("out of memory");
    static const size_t sizes[] = {1, 7, 8, 64, 4096, 65536, 300000, 1 << 20, 3 << 20};
    const size_t nsizes = sizeof sizes / sizeof sizes[0];
    uint64_t st = seed | 1;
    for (int round = 0; round < 200; round++) {
        size_t len = sizes[round % nsizes] + rnd(&st, 5);
        if (len > size) len = size;
        uint64_t off = rnd(&st, size - len + 1);
        for (size_t i = 0; i < len; i++) src[i] = (uint8_t)xorshift64(&st);
        int op = (int)rnd(&st, 5);
        memcpy(m + off, src, len);
        if (op == 0) {
            if (put_nbi(s, off, src, len)) DIE("rackmem_put_nbi: %s", strerror(errno));
            memset(src, 0xee, len); /* the source is free at once */
            if (quiet()) DIE("rackmem_quiet after put_nbi: %s", strerror(errno));
        } else if (put(s, off, src, len)) {
            DIE("rackmem_put(%llu, %zu): %s", (unsigned long long)off, len, strerror(errno));
        }
        /* A get of a random range: blocking, or non-blocking in three parts. */
        size_t glen = sizes[rnd(&st, nsizes)] + rnd(&st, 3);
        if (glen > size) glen = size;
        uint64_t goff = rnd(&st, size - glen + 1);
        memset(buf, 0x5a, glen);
        if (rnd(&st, 2)) {
            if (get(s, goff, buf, glen)) DIE("rackmem_get: %s", strerror(errno));
        } else {
            size_t a = glen / 3, b = glen / 3;
            if (get_nbi(s, goff, buf, a) || get_nbi(s, goff + a, buf + a, b) ||
                get_nbi(s, goff + a + b, buf + a + b, glen - a - b))
                DIE("rackmem_get_nbi: %s", strerror(errno));
            if (quiet()) DIE("rackmem_quiet after get_nbi: %s", strerror(errno));
        }
        check_range(buf, m + goff, glen, goff, "get after put");
    }
    /* Many non-blocking puts of small pieces, then one quiet: all land. */
    for (size_t i = 0; i < 1000; i++) {
        uint64_t v = pattern(seed, i);
        if (put_nbi(s, 8 * i + 3, &v, 8)) DIE("rackmem_put_nbi: %s", strerror(errno));
        memcpy(m + 8 * i + 3, &v, 8);
    }
    if (quiet()) DIE("rackmem_quiet: %s", strerror(errno));
    if (get(s, 0, buf, 8100)) DIE("rackmem_get: %s", strerror(errno));
    check_range(buf, m, 8100, 0, "put_nbi burst");
    /* Atomics against the model. */
    for (int i = 0; i < 500; i++) {
        uint64_t w = 8 * rnd(&st, size / 8), v = xorshift64(&st), old, mv;
        memcpy(&mv, m + w, 8);
        if (i % 2) {
            errno = 0;
            old = fetch_add(s, w, v);
            if (errno) DIE("fetch_add: %s", strerror(errno));
            mv += v;
        } else {
            uint64_t expected = rnd(&st, 2) ? mv : v;
            errno = 0;
            old = compare_swap(s, w, expected, v ^ 1);
            if (errno) DIE("compare_swap: %s", strerror(errno));
            if (expected == mv) mv = v ^ 1;
        }
        uint64_t before;
        memcpy(&before, m + w, 8);
        if (old != before) DIE("atomic at %llu returned %llx, model %llx", (unsigned long long)w,
                               (unsigned long long)old, (unsigned long long)before);
        memcpy(m + w, &mv, 8);
    }
    if (get(s, 0, buf, size)) DIE("rackmem_get of the whole segment: %s", strerror(errno));
    check_range(buf, m, size, 0, "whole segment");
    uint64_t sum = fnv1a(m, size, 0);

    /* Errors: -1 (or NULL, or UINT64_MAX) and the right errno; the segment still works. */
    uint8_t b[16] = {0};
    EXPECT_ERR(put(s, size - 3, b, 4), -1, EINVAL, "put past the end");
    EXPECT_ERR(get(s, size, b, 1), -1, EINVAL, "get at the end");
    EXPECT_ERR(get(s, UINT64_MAX - 2, b, 8), -1, EINVAL, "get whose end overflows");
    EXPECT_ERR(put_nbi(s, size, b, 1), -1, EINVAL, "put_nbi past the end");
    EXPECT_ERR(get_nbi(s, size - 1, b, 2), -1, EINVAL, "get_nbi past the end");
    EXPECT_ERR(put(s, 0, NULL, 8), -1, EINVAL, "put from NULL");
    EXPECT_ERR(fetch_add(s, 4, 1), UINT64_MAX, EINVAL, "misaligned fetch_add");
    EXPECT_ERR(compare_swap(s, size, 0, 1), UINT64_MAX, EINVAL, "compare_swap past the end");
    EXPECT_ERR(seg_alloc(0), NULL, EINVAL, "alloc of 0 bytes");
    EXPECT_ERR(seg_open("", 4096), NULL, EINVAL, "open of an empty name");
    if (put(s, size - 4, b, 4) || get(s, 0, b, 16)) DIE("the segment failed after refusals: %s", strerror(errno));
    if (quiet()) DIE("quiet with nothing in flight: %s", strerror(errno));
    seg_free(s);
    EXPECT_ERR(put(s, 0, b, 1), -1, EBADF, "put to a freed segment");
    EXPECT_ERR(get(s, 0, b, 1), -1, EBADF, "get from a freed segment");
    EXPECT_ERR(get_nbi(s, 0, b, 1), -1, EBADF, "get_nbi from a freed segment");
    EXPECT_ERR(fetch_add(s, 0, 1), UINT64_MAX, EBADF, "fetch_add on a freed segment");
    EXPECT_ERR(seg_size(s), 0, EBADF, "size of a freed segment");
    errno = 0;
    seg_free(s);
    if (errno != EBADF) DIE("freeing twice: errno %d, expected EBADF", errno);
    free(m); free(buf); free(src);
    printf("putget model ok checksum=%016llx\n", (unsigned long long)sum);
    return 0;
}

#define SLOTS 4096 /* where each process leaves its mark, one word each */

static void add_n(rackmem_seg *s, uint64_t n, int who) {
    for (uint64_t i = 0; i < n; i++) {
        if ((i + (uint64_t)who) % 2 == 0) {
            errno = 0;
            fetch_add(s, 64, 1);
            if (errno) DIE("fetch_add: %s", strerror(errno));
        } else {
            uint64_t cur;
            if (get(s, 64, &cur, 8)) DIE("get: %s", strerror(errno));
            for (;;) {
                errno = 0;
                uint64_t old = compare_swap(s, 64, cur, cur + 1);
                if (errno) DIE("compare_swap: %s", strerror(errno));
                if (old == cur) break;
                cur = old;
            }
        }
    }
    uint64_t mark = 1000 + (uint64_t)who;
    if (put_nbi(s, SLOTS + 8 * (uint64_t)who, &mark, 8) || quiet()) DIE("mark: %s", strerror(errno));
}

static int counter(const char *name, int procs, uint64_t n) {
    rackmem_seg *s = seg_open(name, 1 << 20);
    if (!s) DIE("rackmem_seg_open(%s): %s", name, strerror(errno));
    uint64_t zero = 0;
    if (put(s, 64, &zero, 8)) DIE("put: %s", strerror(errno));
    pid_t kids[64];
    if (procs > 64) procs = 64;
    char nbuf[32], wbuf[16];
    snprintf(nbuf, sizeof nbuf, "%llu", (unsigned long long)n);
    for (int i = 0; i < procs; i++) {
        snprintf(wbuf, sizeof wbuf, "%d", i);
        kids[i] = fork();
        if (kids[i] < 0) DIE("fork: %s", strerror(errno));
        if (kids[i] == 0) {
            /* A new program: it must not use its parent's segment, so it opens the name. */
            execl("/proc/self/exe", "putget", "child", name, nbuf, wbuf, (char *)NULL);
            _exit(4);
        }
    }
    for (int i = 0; i < procs; i++) {
        int st;
        if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            DIE("process %d failed (status %d)", i, st);
    }
    uint64_t total;
    if (get(s, 64, &total, 8)) DIE("get: %s", strerror(errno));
    for (int i = 0; i < procs; i++) {
        uint64_t mark;
        if (get(s, SLOTS + 8 * (uint64_t)i, &mark, 8)) DIE("get: %s", strerror(errno));
        if (mark != 1000 + (uint64_t)i) DIE("process %d's mark is %llu", i, (unsigned long long)mark);
    }
    seg_free(s);
    printf("counter=%llu expected=%llu\n", (unsigned long long)total, (unsigned long long)(n * (uint64_t)procs));
    return total == n * (uint64_t)procs ? 0 : 5;
}

/* In a child of fork(): the segments of every ancestor (`theirs`, n of them) fail with EBADF,
 * and a segment of its own works end to end; `depth` more generations do the same below it.
 * Returns 0 when all of them did (or dies saying what failed). */
static int own_segments(rackmem_seg **theirs, int n, int depth) {
    uint64_t v = 1;
    for (int i = 0; i < n; i++) {
        EXPECT_ERR(put(theirs[i], 0, &v, 8), -1, EBADF, "child: put to an ancestor's segment");
        EXPECT_ERR(fetch_add(theirs[i], 0, 1), UINT64_MAX, EBADF, "child: fetch_add on an ancestor's segment");
    }
    rackmem_seg *mine = seg_alloc(1 << 20);
    if (!mine) DIE("child %d: its own segment: %s", depth, strerror(errno));
    static uint64_t w[2048], back[2048];
    for (size_t i = 0; i < 2048; i++) w[i] = pattern(20 + (uint64_t)depth, i);
    if (put(mine, 4096, w, sizeof w) || put_nbi(mine, 65536, w, 800) || quiet())
        DIE("child %d: put to its own segment: %s", depth, strerror(errno));
    if (get(mine, 4096, back, sizeof back)) DIE("child %d: get: %s", depth, strerror(errno));
    verify(back, 2048, 20 + (uint64_t)depth, "a forked child's own segment");
    if (fetch_add(mine, 0, 7) != 0 || fetch_add(mine, 0, 1) != 7)
        DIE("child %d: fetch_add on its own segment: %s", depth, strerror(errno));
    if (depth > 0) {
        theirs[n] = mine;
        pid_t pid = fork();
        if (pid < 0) DIE("fork: %s", strerror(errno));
        if (pid == 0) exit(own_segments(theirs, n + 1, depth - 1));
        int st;
        if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            DIE("grandchild failed (status %d)", st);
        /* Its child's exit left this one's segment whole. */
        memset(back, 0, sizeof back);
        if (get(mine, 4096, back, sizeof back)) DIE("child %d: get after its child: %s", depth, strerror(errno));
        verify(back, 2048, 20 + (uint64_t)depth, "a forked child's own segment after its child exited");
    }
    seg_free(mine);
    return 0;
}

static int forked(void) {
    rackmem_seg *s = seg_alloc(1 << 20);
    if (!s) DIE("rackmem_seg_alloc: %s", strerror(errno));
    static uint64_t words[4096];
    for (size_t i = 0; i < 4096; i++) words[i] = pattern(11, i);
    /* In flight across the fork: the parent's. */
    if (put_nbi(s, 0, words, sizeof words) || put_nbi(s, 40000, words, 800)) DIE("put_nbi: %s", strerror(errno));
    static uint64_t got[4096];
    if (get_nbi(s, 0, got, 8)) DIE("get_nbi: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) DIE("fork: %s", strerror(errno));
    if (pid == 0) {
        if (quiet()) DIE("child: quiet: %s", strerror(errno));
        seg_free(s); /* must not cut the parent's connection */
        rackmem_seg *ancestors[4] = {s};
        /* exit runs thread-local destructors: they must not touch the parent's link. */
        exit(own_segments(ancestors, 1, 2));
    }
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) DIE("child failed (status %d)", st);
    if (quiet()) DIE("parent: quiet: %s", strerror(errno));
    if (got[0] != pattern(11, 0)) DIE("parent: get_nbi across the fork read %llx", (unsigned long long)got[0]);
    memset(got, 0, sizeof got);
    if (get(s, 0, got, sizeof got)) DIE("parent: get after the fork: %s", strerror(errno));
    verify(got, 4096, 11, "segment written across a fork");
    uint64_t more = 5;
    if (put(s, 8, &more, 8) || fetch_add(s, 8, 1) != 5) DIE("parent: the segment failed after the fork: %s", strerror(errno));
    seg_free(s);
    printf("fork ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (!resolve_putget()) { printf("rackmem=absent\n"); return 0; }
    if (argc >= 4 && !strcmp(argv[1], "model")) return model(arg_mib(argc, argv, 2, 8) + 12345, strtoull(argv[3], 0, 0));
    if (argc >= 5 && !strcmp(argv[1], "counter")) return counter(argv[2], atoi(argv[3]), strtoull(argv[4], 0, 0));
    if (argc >= 2 && !strcmp(argv[1], "fork")) return forked();
    if (argc >= 5 && !strcmp(argv[1], "child")) {
        rackmem_seg *s = seg_open(argv[2], 0);
        if (!s) DIE("child: rackmem_seg_open(%s): %s", argv[2], strerror(errno));
        add_n(s, strtoull(argv[3], 0, 0), atoi(argv[4]));
        seg_free(s);
        return 0;
    }
    fprintf(stderr, "usage: putget model MIB SEED | putget counter NAME PROCS N\n");
    return 2;
}
