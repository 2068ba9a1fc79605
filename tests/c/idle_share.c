/* idle_share: one process of a run goes idle holding its pages while another grows. Child A
 * fills a buffer of MiB and waits, idle (no fault), until child B has filled its own buffer of
 * MiB and verified it PASSES times; B then reads A's RssAnon from /proc and prints it, and lets A
 * verify its buffer. Under `rackmem run --local SIZE` the run's processes share SIZE: A, alone
 * at first, may hold all of it, and must give its excess back while idle once B needs its share.
 * Prints "idle_rss_kib=N", then each child's checksum ("idle ..." and "busy ...").
 * usage: idle_share [MiB=128] [PASSES=4] */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

static void must_read(int fd) {
    char c;
    if (read(fd, &c, 1) != 1) DIE("read from a pipe: %m");
}

static void must_write(int fd) {
    if (write(fd, "x", 1) != 1) DIE("write to a pipe: %m");
}

static long rss_anon_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) DIE("open %s: %m", path);
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld kB", &kib) == 1) break;
    fclose(f);
    if (kib < 0) DIE("no RssAnon in %s", path);
    return kib;
}

int main(int argc, char **argv) {
    size_t len = arg_mib(argc, argv, 1, 128);
    int passes = argc > 2 ? atoi(argv[2]) : 4;
    if (len < 4096 || passes < 1) DIE("usage: idle_share [MiB>0] [PASSES>0]");
    int filled[2], done[2];
    if (pipe(filled) || pipe(done)) DIE("pipe: %m");
    fflush(stdout);
    pid_t a = fork();
    if (a < 0) DIE("fork: %m");
    if (a == 0) {
        uint64_t *buf = malloc(len);
        if (!buf) DIE("malloc");
        fill(buf, len / 8, 100);
        must_write(filled[1]);
        must_read(done[0]); /* idle: no fault until B is done */
        verify(buf, len / 8, 100, "the idle child's buffer");
        printf("idle checksum=%016llx\n", (unsigned long long)fnv1a(buf, len, 0));
        exit(0); /* not _exit: the runtime reports this process's statistics at exit */
    }
    pid_t b = fork();
    if (b < 0) DIE("fork: %m");
    if (b == 0) {
        must_read(filled[0]);
        uint64_t *buf = malloc(len);
        if (!buf) DIE("malloc");
        fill(buf, len / 8, 200);
        for (int p = 0; p < passes; p++) verify(buf, len / 8, 200, "the busy child's buffer");
        printf("idle_rss_kib=%ld\n", rss_anon_kib(a));
        printf("busy checksum=%016llx\n", (unsigned long long)fnv1a(buf, len, 0));
        fflush(stdout);
        must_write(done[1]);
        exit(0);
    }
    int failed = 0;
    for (int i = 0; i < 2; i++) {
        int st;
        if (wait(&st) < 0) DIE("wait: %m");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    if (failed) DIE("%d children failed", failed);
    return 0;
}
