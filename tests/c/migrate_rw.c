/* migrate_rw: a buffer migrates between memories while another thread keeps writing it.
 *
 * usage: migrate_rw MODE MIB BRICK_A BRICK_B [ROUNDS]
 *   moves:  ROUNDS times, the buffer goes A -> B (bounced), its first eighth B -> local (pinned:
 *           run with a local buffer of at least a quarter of the buffer), then all of it -> A,
 *           while a writer thread rewrites it word by word, pass after pass, checking that every
 *           word it overwrites holds what it wrote there in the previous pass. At the end the
 *           buffer is checked against the model (pass numbers) and both checksums are printed:
 *           "checksum BUFFER model MODEL".
 *   pages:  ROUNDS times, runs of 1 to 4 pages spread over the buffer (one run every 61 pages)
 *           move one by one to brick B bounced ("bounce:B"), then the whole buffer goes back to
 *           A, while the writer runs as in moves; prints "small-moves N" and the checksums.
 *   kill:   moves the first half to B and back (B now holds a migration segment), prints
 *           "kill-target" and waits for a line on stdin (the test kills brick B meanwhile),
 *           then migrates the second half to B, which must fail with EIO while the writer goes
 *           on; prints "target-lost errno=EIO" and the checksums.
 *   srckill: (a third brick C as argument 5, serving slowly) a second buffer V of the same size
 *           is filled and moved to C, and left to be evicted there while the writer runs on the
 *           first; then "pulling" is printed and V moves C -> B (pulled by B), while the test
 *           kills C half-way: the migration must fail with EIO and the writer go on; prints
 *           "source-lost errno=EIO" and the checksums of the first buffer (V is not touched
 *           again: its pages died with C).
 *   fork:   moves the buffer to B while the writer runs, stops the writer, forks: the child checks
 *           the whole buffer against the model (it reads the clones of the segments, moved range
 *           included) and rewrites it; the parent checks that its own copy did not change and
 *           prints "fork ok" and the checksums.
 *   external: (BRICK_A and BRICK_B unused) the writer runs while others move the buffer
 *           (`rackmem migrate --pid`): prints "buffer ADDR LEN pid PID" and waits for a line on
 *           stdin, then lets the writer finish two more passes and prints the checksums.
 *   rate:   as external, and the writer prints "pass P SECONDS" (wall clock) after each whole
 *           pass, for a drain's throughput before, during and after (scripts/drain-bench).
 *   bad:    bad requests: an unknown brick (ENOENT), a range outside rackmem memory (EINVAL),
 *           an empty range (EINVAL), a pin larger than the local buffer allows (ENOSPC), and a
 *           move to brick B when B has no room left (ENOSPC); prints "bad-requests ok".
 * Without rackmem (run natively) it prints "rackmem=absent". */
#include "common.h"
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../../include/rackmem.h"

typedef int (*migrate_fn)(void *, size_t, const char *, struct rackmem_migration *);
typedef int (*unpin_fn)(void *, size_t);
typedef int (*is_remote_fn)(const void *);

static uint64_t *buf;
static size_t words;
static atomic_int stop;
/* The writer's progress: pass `passes` is written up to word `at` (exclusive). */
static uint64_t passes;
static size_t at;
/* Print each pass's end time (mode rate). */
static int report_passes;

/* Word i after pass p (pass 0: zeros, never written). */
static uint64_t value(uint64_t p, size_t i) { return p == 0 ? 0 : pattern(p, i); }

static void *writer(void *arg) {
    (void)arg;
    for (uint64_t p = 1; !atomic_load(&stop); p++) {
        for (size_t i = 0; i < words; i++) {
            if (buf[i] != value(p - 1, i))
                DIE("DATA CORRUPTION: pass %llu, word %zu (page %zu): %016llx, expected %016llx",
                    (unsigned long long)p, i, i * 8 / 4096, (unsigned long long)buf[i],
                    (unsigned long long)value(p - 1, i));
            buf[i] = value(p, i);
            if ((i & 4095) == 0 && atomic_load(&stop) && p > 1) {
                passes = p;
                at = i + 1;
                return 0;
            }
        }
        passes = p;
        at = words;
        if (report_passes) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            printf("pass %llu %.3f\n", (unsigned long long)p, ts.tv_sec + ts.tv_nsec / 1e9);
            fflush(stdout);
        }
    }
    return 0;
}

static void finish(pthread_t t) {
    atomic_store(&stop, 1);
    pthread_join(t, 0);
    uint64_t h = 0, m = 0;
    for (size_t i = 0; i < words; i++) {
        uint64_t want = i < at ? value(passes, i) : value(passes - 1, i);
        if (buf[i] != want)
            DIE("DATA CORRUPTION at the end: word %zu (page %zu): %016llx, expected %016llx", i, i * 8 / 4096,
                (unsigned long long)buf[i], (unsigned long long)want);
        h = fnv1a(&buf[i], 8, h);
        m = fnv1a(&want, 8, m);
    }
    printf("checksum %016llx model %016llx passes %llu\n", (unsigned long long)h, (unsigned long long)m,
           (unsigned long long)passes);
}

static double ms(uint64_t ns) { return ns / 1e6; }

static void migrate_or_die(migrate_fn migrate, void *p, size_t len, const char *to) {
    struct rackmem_migration t;
    if (migrate(p, len, to, &t) != 0) DIE("rackmem_migrate to %s failed: %s", to, strerror(errno));
    printf("migrated %zu MiB to %s: setup %.3f ms, allocate %.3f ms, transfer %.3f ms, finalize %.3f ms, %llu bytes\n",
           len >> 20, to, ms(t.setup_ns), ms(t.allocate_ns), ms(t.transfer_ns), ms(t.finalize_ns),
           (unsigned long long)t.bytes);
    fflush(stdout);
}

static void expect_error(int r, int want, const char *what) {
    if (r != -1 || errno != want)
        DIE("%s: returned %d errno %d (%s), expected -1 errno %d (%s)", what, r, r ? errno : 0, strerror(errno),
            want, strerror(want));
}

int main(int argc, char **argv) {
    migrate_fn migrate = (migrate_fn)dlsym(RTLD_DEFAULT, "rackmem_migrate_timed");
    unpin_fn unpin = (unpin_fn)dlsym(RTLD_DEFAULT, "rackmem_unpin");
    is_remote_fn is_remote = (is_remote_fn)dlsym(RTLD_DEFAULT, "rackmem_is_remote");
    if (!migrate || !unpin || !is_remote) { printf("rackmem=absent\n"); return 0; }
    if (argc < 5) DIE("usage: migrate_rw moves|pages|kill|bad MIB BRICK_A BRICK_B [ROUNDS]");
    const char *mode = argv[1], *a = argv[3], *b = argv[4];
    size_t len = arg_mib(argc, argv, 2, 32);
    int rounds = argc > 5 ? atoi(argv[5]) : 2;
    words = len / 8;
    buf = malloc(len);
    if (!buf) DIE("malloc");
    if (!is_remote(buf)) DIE("the buffer is not in rackmem memory");
    memset(buf, 0, len);
    report_passes = !strcmp(mode, "rate");
    if (strcmp(mode, "external") && !report_passes) {
        /* The buffer lives on brick A (the window's first segment) before anything moves. */
        migrate_or_die(migrate, buf, len, a);
    }

    if (!strcmp(mode, "bad")) {
        char local[64];
        struct rackmem_migration t;
        expect_error(migrate(buf, len, "tcp://127.0.0.1:1", &t), ENOENT, "a brick not in RACKMEM_BRICKS");
        expect_error(migrate(buf, len, "nonsense", &t), ENOENT, "a target that is no address");
        expect_error(migrate(local, sizeof local, b, &t), EINVAL, "a range outside rackmem memory");
        expect_error(migrate(buf, 0, b, &t), EINVAL, "an empty range");
        expect_error(migrate(buf, len, "local", &t), ENOSPC, "a pin larger than half the local buffer");
        expect_error(unpin(local, sizeof local), EINVAL, "unpinning memory that is not rackmem's");
        /* Brick B is too small for a migration segment. */
        expect_error(migrate(buf, len, b, &t), ENOSPC, "a target brick with no room");
        fill(buf, words, 7);
        verify(buf, words, 7, "the buffer after the refused requests");
        printf("bad-requests ok\n");
        return 0;
    }

    pthread_t t;
    if (pthread_create(&t, 0, writer, 0)) DIE("pthread_create");
    /* One whole pass first, so that most of the buffer lives on brick A (not as zero pages). */
    while (passes < 1) usleep(1000);
    if (!strcmp(mode, "moves")) {
        for (int r = 0; r < rounds; r++) {
            migrate_or_die(migrate, buf, len, b);       /* brick -> brick, bounced */
            migrate_or_die(migrate, buf, len / 8, "local"); /* brick -> local (pinned) */
            migrate_or_die(migrate, buf, len, a);           /* local -> brick */
        }
        /* Let the writer finish a pass over the buffer's new home. */
        uint64_t p0 = passes;
        while (passes < p0 + 2) usleep(1000);
        finish(t);
        return 0;
    }
    if (!strcmp(mode, "pages")) {
        char to[512];
        snprintf(to, sizeof to, "bounce:%s", b);
        size_t pages = len / 4096, moved = 0;
        for (int r = 0; r < rounds; r++) {
            for (size_t pg = (size_t)r; pg < pages; pg += 61) {
                size_t n = 1 + pg % 4;
                if (pg + n > pages) break;
                struct rackmem_migration m;
                if (migrate((char *)buf + pg * 4096, n * 4096, to, &m) != 0)
                    DIE("rackmem_migrate of %zu pages at page %zu to %s failed: %s", n, pg, to, strerror(errno));
                moved++;
            }
            migrate_or_die(migrate, buf, len, a);
        }
        printf("small-moves %zu\n", moved);
        uint64_t p0 = passes;
        while (passes < p0 + 2) usleep(1000);
        finish(t);
        return 0;
    }
    if (!strcmp(mode, "external") || report_passes) {
        printf("buffer %p %zu pid %d\n", (void *)buf, len, (int)getpid());
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) DIE("stdin closed before the moves ended");
        uint64_t p0 = passes;
        while (passes < p0 + 2) usleep(1000);
        finish(t);
        return 0;
    }
    if (!strcmp(mode, "kill")) {
        size_t half = len / 2;
        migrate_or_die(migrate, buf, half, b);
        migrate_or_die(migrate, buf, half, a);
        printf("kill-target\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) DIE("stdin closed before the target was killed");
        struct rackmem_migration tm;
        int r = migrate((char *)buf + half, len - half, b, &tm);
        if (r != -1) DIE("the migration to a dead brick returned %d", r);
        printf("target-lost errno=%s\n", errno == EIO ? "EIO" : strerror(errno));
        fflush(stdout);
        uint64_t p0 = passes;
        while (passes < p0 + 2) usleep(1000);
        finish(t);
        return 0;
    }
    if (!strcmp(mode, "srckill")) {
        if (argc < 6) DIE("srckill needs a third brick");
        const char *c = argv[5];
        uint64_t *v = malloc(len);
        if (!v) DIE("malloc");
        if (!is_remote(v)) DIE("the second buffer is not in rackmem memory");
        for (size_t i = 0; i < words; i++) v[i] = pattern(99, i);
        migrate_or_die(migrate, v, len, c);
        /* Two passes of the writer over the first buffer evict V to C. */
        uint64_t p0 = passes;
        while (passes < p0 + 2) usleep(1000);
        printf("pulling\n");
        fflush(stdout);
        struct rackmem_migration tm;
        int r = migrate(v, len, b, &tm);
        if (r != -1) DIE("the migration from a dead brick returned %d", r);
        printf("source-lost errno=%s\n", errno == EIO ? "EIO" : strerror(errno));
        fflush(stdout);
        p0 = passes;
        while (passes < p0 + 2) usleep(1000);
        finish(t);
        return 0;
    }
    if (!strcmp(mode, "fork")) {
        migrate_or_die(migrate, buf, len, b);
        uint64_t p0 = passes;
        while (passes < p0 + 1) usleep(1000);
        atomic_store(&stop, 1);
        pthread_join(t, 0);
        pid_t child = fork();
        if (child < 0) DIE("fork: %s", strerror(errno));
        if (child == 0) {
            for (size_t i = 0; i < words; i++) {
                uint64_t want = i < at ? value(passes, i) : value(passes - 1, i);
                if (buf[i] != want)
                    DIE("DATA CORRUPTION in the child: word %zu (page %zu): %016llx, expected %016llx", i,
                        i * 8 / 4096, (unsigned long long)buf[i], (unsigned long long)want);
                buf[i] = ~want;
            }
            _exit(0);
        }
        int st;
        if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            DIE("the child failed (status %d)", st);
        /* The writer is stopped: the parent's copy must be as it left it. */
        uint64_t h = 0, m = 0;
        for (size_t i = 0; i < words; i++) {
            uint64_t want = i < at ? value(passes, i) : value(passes - 1, i);
            if (buf[i] != want) DIE("DATA CORRUPTION in the parent after the fork: word %zu", i);
            h = fnv1a(&buf[i], 8, h);
            m = fnv1a(&want, 8, m);
        }
        printf("fork ok\nchecksum %016llx model %016llx passes %llu\n", (unsigned long long)h, (unsigned long long)m,
               (unsigned long long)passes);
        return 0;
    }
    DIE("unknown mode %s", mode);
}
