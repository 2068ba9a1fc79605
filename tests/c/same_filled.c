/* same_filled: pages of one repeated word beside pages that only nearly are. Each pass gives
 * every page of a big buffer one of five kinds (one word repeated, zeros, a pattern, one word
 * repeated but for the last word, one word repeated but for one byte), chosen anew per pass,
 * so pages change kind while they are remote. After each pass the whole buffer is verified
 * (pages come back from remote memory), then one word of some one-word pages is changed (a
 * page fetched as a fill, then written) and everything is verified again. Finally the process
 * forks: the child must see exactly the parent's contents, and each side's later writes stay
 * its own. Prints one checksum per process.
 * usage: same_filled [MiB=32] [passes=4] */
#include "common.h"
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

enum { WORDS = 512 };

static uint64_t *buf;
static size_t pages;

static unsigned kind(size_t p, int pass) { return (unsigned)(pattern(pass + 77, p) >> 7) % 5; }

/* Word i of page p after pass `pass` was written (before any poke). */
static uint64_t expected(size_t p, size_t i, int pass) {
    uint64_t w = pattern(pass * 7919 + 1, p);
    switch (kind(p, pass)) {
    case 0: return w;
    case 1: return 0;
    case 2: return pattern(pass, p * WORDS + i);
    case 3: return i == WORDS - 1 ? ~w : w;
    default: return i == WORDS / 2 ? w ^ 0x100 : w;
    }
}

/* Pages whose word WORDS/3 is bumped after pass `pass`. */
static int poked(size_t p, int pass) { return kind(p, pass) == 0 && p % 3 == (size_t)pass % 3; }

static void write_pass(int pass) {
    for (size_t p = 0; p < pages; p++)
        for (size_t i = 0; i < WORDS; i++) buf[p * WORDS + i] = expected(p, i, pass);
}

static void check(int pass, int with_pokes, const char *what) {
    for (size_t p = 0; p < pages; p++)
        for (size_t i = 0; i < WORDS; i++) {
            uint64_t want = expected(p, i, pass) + (with_pokes && poked(p, pass) && i == WORDS / 3);
            if (buf[p * WORDS + i] != want)
                DIE("DATA CORRUPTION %s (pass %d) at page %zu word %zu (kind %u): %016llx, expected %016llx", what,
                    pass, p, i, kind(p, pass), (unsigned long long)buf[p * WORDS + i], (unsigned long long)want);
        }
}

int main(int argc, char **argv) {
    size_t bytes = arg_mib(argc, argv, 1, 32);
    int passes = argc > 2 ? atoi(argv[2]) : 4;
    pages = bytes / 4096;
    buf = malloc(bytes);
    if (!buf) DIE("same_filled: out of memory");
    int pass = 0;
    for (; pass < passes; pass++) {
        write_pass(pass);
        check(pass, 0, "after writing");
        for (size_t p = 0; p < pages; p++)
            if (poked(p, pass)) buf[p * WORDS + WORDS / 3] += 1;
        check(pass, 1, "after changing one word of one-word pages");
    }
    pass--;
    pid_t child = fork();
    if (child < 0) DIE("fork: %s", strerror(errno));
    check(pass, 1, child == 0 ? "in the child after fork" : "in the parent after fork");
    /* The child makes every page one word; the parent must not see it. */
    if (child == 0) {
        for (size_t p = 0; p < pages; p++)
            for (size_t i = 0; i < WORDS; i++) buf[p * WORDS + i] = p + 5;
        for (size_t p = 0; p < pages; p++)
            for (size_t i = 0; i < WORDS; i++)
                if (buf[p * WORDS + i] != p + 5) DIE("DATA CORRUPTION in the child at page %zu word %zu", p, i);
    } else {
        int status = 0;
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            DIE("the child failed (status %d)", status);
        check(pass, 1, "in the parent after the child wrote");
    }
    printf("result name=same_filled who=%s pages=%zu checksum=%016llx\n", child == 0 ? "child" : "parent", pages,
           (unsigned long long)fnv1a(buf, bytes, 0));
    return 0;
}
