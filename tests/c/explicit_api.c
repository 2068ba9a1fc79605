/* explicit_api: the C API of include/rackmem.h, resolved at run time so the program also runs
 * without rackmem: remote allocation regardless of size, rackmem_is_remote, statistics.
 * usage: explicit_api */
#include "common.h"
#include <dlfcn.h>
#include "../../include/rackmem.h"

int main(void) {
    void *(*alloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "rackmem_alloc");
    void (*release)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "rackmem_free");
    int (*is_remote)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "rackmem_is_remote");
    int (*get_stats)(struct rackmem_stats *) = (int (*)(struct rackmem_stats *))dlsym(RTLD_DEFAULT, "rackmem_get_stats");
    if (!alloc || !release || !is_remote || !get_stats) { printf("rackmem=absent\n"); return 0; }
    uint64_t *small = alloc(64 << 10); /* far below the threshold: remote anyway */
    if (!small) DIE("rackmem_alloc returned NULL");
    if (!is_remote(small)) DIE("rackmem_alloc memory is not remote");
    char local[16];
    if (is_remote(local)) DIE("a stack buffer reported remote");
    for (size_t i = 0; i < 8192; i++) if (small[i]) DIE("rackmem_alloc memory not zero");
    fill(small, 8192, 4);
    verify(small, 8192, 4, "explicit allocation");
    struct rackmem_stats st;
    if (get_stats(&st) != 0) DIE("rackmem_get_stats failed");
    if (st.faults == 0 || st.window_bytes_allocated < (64 << 10)) DIE("statistics do not show the allocation");
    release(small);
    printf("rackmem=present remote=1 faults>0\n");
    return 0;
}
