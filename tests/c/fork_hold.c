/* fork_hold: a server with long-lived children that forks short-lived ones one after the other
 * (PostgreSQL's postmaster: its auxiliary processes stay, a backend per connection comes and
 * goes). The parent fills a buffer, forks `hold` children that wait on a pipe, then `serial`
 * children one at a time, each checking a page of the parent's memory and exiting, reaped before
 * the next fork; then lets the holders check theirs and exit. Every child must start and see the
 * parent's data: under rackmem each child's clone takes a range of the brick, which an exited
 * child gives back a moment after its exit.
 * usage: fork_hold [hold=14] [serial=100] */
#include "common.h"
#include <sys/wait.h>
#include <unistd.h>

static unsigned char at(size_t i) { return (unsigned char)(i * 7u + 3u); }

int main(int argc, char **argv) {
    int hold = argc > 1 ? atoi(argv[1]) : 14, serial = argc > 2 ? atoi(argv[2]) : 100;
    size_t n = (size_t)8 << 20;
    unsigned char *b = malloc(n);
    if (!b) return 2;
    for (size_t i = 0; i < n; i++) b[i] = at(i);
    int p[2];
    if (pipe(p)) return 2;
    for (int i = 0; i < hold; i++) {
        pid_t c = fork();
        if (c < 0) { perror("fork"); return 2; }
        if (c == 0) {
            close(p[1]);
            char x;
            if (read(p[0], &x, 1) < 0) exit(4);
            size_t k = ((size_t)i * 4096u * 37u) % n;
            exit(b[k] == at(k) ? 0 : 3);
        }
    }
    close(p[0]);
    int bad = 0;
    for (int i = 0; i < serial; i++) {
        pid_t c = fork();
        if (c < 0) { perror("fork"); return 2; }
        size_t k = ((size_t)i * 4096u * 11u + 5u) % n;
        if (c == 0) exit(b[k] == at(k) ? 0 : 3);
        int st;
        if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "short-lived child %d failed: status %d\n", i, st);
            bad++;
        }
    }
    close(p[1]);
    int st;
    while (wait(&st) > 0) {
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "long-lived child failed: status %d\n", st);
            bad++;
        }
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i += 64) sum = sum * 31u + b[i];
    printf("children failed: %d, parent checksum=%016llx\n", bad, (unsigned long long)sum);
    return bad ? 1 : 0;
}
