/* Holds many idle connections to the node agent, as one user flooding it would:
 * agent_hold SOCKET N
 * Opens N connections and says nothing on them; once the agent has had time to turn some
 * away, prints "held=H refused=R" (a refused connection got a line and was closed), then
 * keeps the held ones open until its standard input closes. Exit 2 when it cannot connect. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: agent_hold SOCKET N\n");
        return 1;
    }
    int n = atoi(argv[2]);
    if (n <= 0 || n > 100000) {
        fprintf(stderr, "agent_hold: N must be 1 to 100000\n");
        return 1;
    }
    struct pollfd *fds = calloc((size_t)n, sizeof *fds);
    if (!fds)
        return 1;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            printf("connect: %s (after %d)\n", strerror(errno), i);
            return 2;
        }
        fds[i].fd = fd;
        fds[i].events = POLLIN;
    }
    /* A refused connection is answered at once; give the agent's accept loop time to get to
     * every one (it takes them in order), polling until nothing changed for half a second. */
    int refused = 0, quiet_ms = 0;
    while (quiet_ms < 500) {
        int r = poll(fds, (nfds_t)n, 100);
        if (r < 0 && errno != EINTR)
            return 1;
        if (r <= 0) {
            quiet_ms += 100;
            continue;
        }
        quiet_ms = 0;
        for (int i = 0; i < n; i++) {
            if (fds[i].fd >= 0 && fds[i].revents) {
                close(fds[i].fd);
                fds[i].fd = -1; /* poll skips negative descriptors */
                refused++;
            }
        }
    }
    printf("held=%d refused=%d\n", n - refused, refused);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
