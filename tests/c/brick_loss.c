/* brick_loss: fills a remote buffer, then works on it pass after pass, forever: each pass checks
 * every word against the pattern the previous pass wrote, rewrites the buffer with the next
 * pattern (so dirty pages keep being written back), and prints "pass N ok". Used by the test
 * that kills the brick mid-run: the program must be stopped with an error naming the brick.
 * It never prints a wrong pass: a page that reads wrong (e.g. zero-filled) makes it exit 3 with
 * "DATA CORRUPTION" on stderr.  usage: brick_loss [MiB=64] */
#include "common.h"

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 64), words = len / 8;
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, words, 5);
    for (unsigned long pass = 1;; pass++) {
        verify(a, words, 4 + pass, "buffer");
        fill(a, words, 5 + pass);
        printf("pass %lu ok\n", pass);
        fflush(stdout);
    }
}
