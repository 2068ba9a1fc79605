/* The one-sided calls of include/rackmem.h, resolved at run time (dlsym) so that one binary
 * runs under `rackmem run` (LD_PRELOAD), built with -lrackmem, or natively, where it finds no
 * API and says so. Shared by the put/get test programs. */
#ifndef RACKMEM_TEST_PUTGET_API_H
#define RACKMEM_TEST_PUTGET_API_H
#include <dlfcn.h>
#include "../../include/rackmem.h"

static rackmem_seg *(*seg_alloc)(size_t);
static rackmem_seg *(*seg_open)(const char *, size_t);
static void (*seg_free)(rackmem_seg *);
static size_t (*seg_size)(rackmem_seg *);
static int (*put)(rackmem_seg *, uint64_t, const void *, size_t);
static int (*get)(rackmem_seg *, uint64_t, void *, size_t);
static int (*put_nbi)(rackmem_seg *, uint64_t, const void *, size_t);
static int (*get_nbi)(rackmem_seg *, uint64_t, void *, size_t);
static int (*quiet)(void);
static uint64_t (*fetch_add)(rackmem_seg *, uint64_t, uint64_t);
static uint64_t (*compare_swap)(rackmem_seg *, uint64_t, uint64_t, uint64_t);

#define RESOLVE_PUTGET(var, name) \
    do { *(void **)&var = dlsym(RTLD_DEFAULT, name); if (!var) return 0; } while (0)

/* 1 when every call resolved, 0 when rackmem is not loaded. */
static int resolve_putget(void) {
    RESOLVE_PUTGET(seg_alloc, "rackmem_seg_alloc");
    RESOLVE_PUTGET(seg_open, "rackmem_seg_open");
    RESOLVE_PUTGET(seg_free, "rackmem_seg_free");
    RESOLVE_PUTGET(seg_size, "rackmem_seg_size");
    RESOLVE_PUTGET(put, "rackmem_put");
    RESOLVE_PUTGET(get, "rackmem_get");
    RESOLVE_PUTGET(put_nbi, "rackmem_put_nbi");
    RESOLVE_PUTGET(get_nbi, "rackmem_get_nbi");
    RESOLVE_PUTGET(quiet, "rackmem_quiet");
    RESOLVE_PUTGET(fetch_add, "rackmem_atomic_fetch_add");
    RESOLVE_PUTGET(compare_swap, "rackmem_atomic_compare_swap");
    return 1;
}
#endif
