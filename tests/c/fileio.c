/* fileio: read() from a file straight into a big malloc'd buffer (the kernel writes into pages
 * that are not present yet), modify it, write() it to another file from the buffer (the kernel
 * reads pages that may have been evicted), then re-read both files through a small buffer,
 * verify every word and print a checksum of each.  usage: fileio DIR [MiB=32] */
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
    if (fd < 0) DIE("open %s: %m", in);
    read_all(fd, buf, len); /* one big read into remote memory */
    close(fd);
    verify(buf, words, 7, "buffer after read()");
    for (size_t i = 0; i < words; i++) buf[i] = pattern(7, i) ^ i;
    fd = open(out, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (fd < 0) DIE("open %s: %m", out);
    write_all(fd, buf, len); /* one big write from remote memory */
    close(fd);
    uint64_t hin = 0, hout = 0;
    int fin = open(in, O_RDONLY), fout = open(out, O_RDONLY);
    if (fin < 0 || fout < 0) DIE("reopen: %m");
    for (size_t i = 0; i < words; i += 512) {
        read_all(fin, chunk, sizeof chunk);
        for (size_t k = 0; k < 512; k++) if (chunk[k] != pattern(7, i + k)) DIE("DATA CORRUPTION in input file at word %zu", i + k);
        hin = fnv1a(chunk, sizeof chunk, hin);
        read_all(fout, chunk, sizeof chunk);
        for (size_t k = 0; k < 512; k++) if (chunk[k] != (pattern(7, i + k) ^ (i + k))) DIE("DATA CORRUPTION in written file at word %zu", i + k);
        hout = fnv1a(chunk, sizeof chunk, hout);
    }
    close(fin);
    close(fout);
    printf("in checksum=%016llx\nout checksum=%016llx\n", (unsigned long long)hin, (unsigned long long)hout);
    free(buf);
    return 0;
}
