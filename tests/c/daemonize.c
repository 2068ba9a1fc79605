/* daemonize: fills a remote buffer, forks; the parent exits at once (status 0), the child
 * setsid()s and, now a daemon whose parent and whose parent's runtime are gone, keeps working
 * on the inherited remote buffer (verify + rewrite passes with pauses). It writes its checksum
 * to RESULT atomically (RESULT.tmp, then rename) only if every pass verified.
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
    if (setsid() < 0) DIE("setsid: %m");
    usleep(200 * 1000); /* let the parent really be gone */
    for (int p = 0; p < 3; p++) {
        verify(a, words, 77 + (uint64_t)p, "daemon's buffer");
        fill(a, words, 78 + (uint64_t)p);
        usleep(50 * 1000);
    }
    verify(a, words, 80, "daemon's buffer after the last pass");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f) DIE("fopen %s: %m", tmp);
    fprintf(f, "checksum=%016llx\n", (unsigned long long)fnv1a(a, len, 0));
    if (fclose(f)) DIE("write %s: %m", tmp);
    if (rename(tmp, argv[1])) DIE("rename: %m");
    return 0;
}
