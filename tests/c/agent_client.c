/* A minimal client of the node agent's protocol, for tests that need a process of another
 * user or one that outlives the agent: agent_client SOCKET HOLD_MS LINE...
 * Sends each LINE (a newline appended), prints each reply line as it arrives, then keeps the
 * connection open HOLD_MS milliseconds. Exit 2 when it cannot connect (the reason printed as
 * "connect: ..."), 3 when the agent closed the connection before a reply. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int read_line(int fd, char *buf, size_t cap) {
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        if (buf[n++] == '\n')
            break;
    }
    buf[n] = 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: agent_client SOCKET HOLD_MS LINE...\n");
        return 64;
    }
    /* A refusing agent may close before our request is written: read its line anyway. */
    signal(SIGPIPE, SIG_IGN);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        printf("connect: %s\n", strerror(errno));
        return 2;
    }
    static char buf[1 << 16];
    for (int i = 3; i < argc; i++) {
        size_t len = strlen(argv[i]);
        if (write(fd, argv[i], len) != (ssize_t)len || write(fd, "\n", 1) != 1)
            printf("write: %s\n", strerror(errno));
        if (read_line(fd, buf, sizeof buf) != 0) {
            printf("closed\n");
            return 3;
        }
        fputs(buf, stdout);
        fflush(stdout);
    }
    long ms = atol(argv[2]);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    close(fd);
    return 0;
}
