/* brick_loss: fills a remote buffer and verifies it pass after pass, forever, printing a line
 * per pass. Used by the test that kills the brick mid-run: the program must stop with an error,
 * never print a wrong pass or read zeros.  usage: brick_loss [MiB=64] */
#include "common.h"

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 64), words = len / 8;
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, words, 5);
    for (unsigned long pass = 1;; pass++) {
        verify(a, words, 5, "buffer");
        printf("pass %lu ok\n", pass);
        fflush(stdout);
    }
}
