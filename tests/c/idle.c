/* idle: fills a buffer, says "ready pid=PID", then does nothing until a line arrives on stdin
 * (the test looks at how often rackmem's threads wake meanwhile), then verifies the buffer and
 * prints its checksum.
 * usage: idle [MiB=32] */
#include "common.h"
#include <unistd.h>

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 32), words = len / 8;
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, words, 5);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) DIE("stdin closed before the go-ahead");
    verify(a, words, 5, "buffer after idling");
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
    return 0;
}
