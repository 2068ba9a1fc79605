/* shared_anon: shared anonymous memory keeps its meaning under rackmem (a child's writes are seen
 * by its parent) and stays local; private memory beside it goes remote as usual.
 * usage: shared_anon SHARED_MIB PRIVATE_MIB */
#include "common.h"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t shared = arg_mib(argc, argv, 1, 64), private_bytes = arg_mib(argc, argv, 2, 64);
    uint64_t *s = mmap(NULL, shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) DIE("mmap(MAP_SHARED) failed");
    uint64_t *p = malloc(private_bytes);
    if (!p) DIE("malloc failed");
    fill(p, private_bytes / 8, 7);
    pid_t child = fork();
    if (child < 0) DIE("fork failed");
    if (child == 0) {
        fill(s, shared / 8, 5); /* the parent must see this */
        verify(p, private_bytes / 8, 7, "private memory in the child");
        _exit(0);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        DIE("child failed (status %d)", status);
    verify(s, shared / 8, 5, "shared memory written by the child");
    verify(p, private_bytes / 8, 7, "private memory");
    printf("checksum=%016llx\n", (unsigned long long)fnv1a(s, shared, fnv1a(p, private_bytes, 0)));
    return 0;
}
