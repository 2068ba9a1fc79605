/* fileio: read() from a file straight into a big malloc'd buffer (the kernel writes into pages
 * that are not present yet), modify it, write() it to another file from the buffer, and check
 * both files.  usage: fileio DIR [MiB=32] */
#include "common.h"
#include <fcntl.h>
#include <unistd.h>

static void write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) { ssize_t w = write(fd, c, n); if (w <= 0) DIE("write: %m"); c += w; n -= (size_t)w; }
}
static void read_all(int fd, void *p, size_t n) {
    char *c = p;
    while (n) { ssize_t r = read(fd, c, n); if (r <= 0) DIE("read: %m"); c += r; n -= (size_t)r; }
}

int main(int argc, char **argv) {
    if (argc < 2) DIE("usage: fileio DIR [MiB]");
    size_t len = arg_mib(argc, argv, 2, 32), words = len / 8;
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/in.bin", argv[1]);
    snprintf(out, sizeof out, "%s/out.bin", argv[1]);
    uint64_t chunk[512];
    int fd = open(in, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (fd < 0) DIE("open %s: %m", in);
    for (size_t i = 0; i < words; i += 512) { for (size_t k = 0; k < 512; k++) chunk[k] = pattern(7, i + k); write_all(fd, chunk, sizeof chunk); }
    close(fd);

    uint64_t *buf = malloc(len);
    if (!buf) DIE("malloc");
    fd = open(in, O_RDONLY);
    read_all(fd, buf, len); /* one big read into remote memory */
    close(fd);
    verify(buf, words, 7, "buffer after read()");
    for (size_t i = 0; i < words; i++) buf[i] = pattern(7, i) ^ i;
    fd = open(out, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    write_all(fd, buf, len); /* one big write from remote memory */
    close(fd);
    fd = open(out, O_RDONLY);
    uint64_t h = 0;
    for (size_t i = 0; i < words; i += 512) {
        read_all(fd, chunk, sizeof chunk);
        for (size_t k = 0; k < 512; k++) if (chunk[k] != (pattern(7, i + k) ^ (i + k))) DIE("DATA CORRUPTION in written file at word %zu", i + k);
        h = fnv1a(chunk, sizeof chunk, h);
    }
    close(fd);
    printf("checksum=%016llx\n", (unsigned long long)h);
    free(buf);
    return 0;
}
