/* daemonize: fills a remote buffer, forks; the parent exits at once, the child (now a daemon)
 * keeps using the remote memory and writes its checksum to RESULT when done.
 * usage: daemonize RESULT [MiB=32] */
#include "common.h"
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) DIE("usage: daemonize RESULT [MiB]");
    size_t len = arg_mib(argc, argv, 2, 32), words = len / 8;
    uint64_t *a = malloc(len);
    if (!a) DIE("malloc");
    fill(a, words, 77);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) DIE("fork: %m");
    if (pid > 0) return 0; /* the parent exits; its remote memory goes with it */
    setsid();
    usleep(200 * 1000); /* let the parent really be gone */
    for (int p = 0; p < 3; p++) {
        verify(a, words, 77 + (uint64_t)p, "daemon's buffer");
        fill(a, words, 78 + (uint64_t)p);
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f) DIE("fopen %s: %m", tmp);
    fprintf(f, "checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
    fclose(f);
    if (rename(tmp, argv[1])) DIE("rename: %m");
    return 0;
}
