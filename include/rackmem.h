/* rackmem.h: explicit use of rackmem remote memory from C.
 *
 * Programs need none of this: under `rackmem run` (LD_PRELOAD=librackmem.so) their large
 * allocations go to remote memory transparently. This header is for programs that want to
 * choose: put a buffer on remote memory whatever its size, ask whether a pointer is remote, or
 * read the runtime's statistics. Link with -lrackmem, or resolve the symbols with dlsym when
 * the library may be absent.
 */
#ifndef RACKMEM_H
#define RACKMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rackmem_stats {
    uint64_t faults;                 /* page faults handled */
    uint64_t bytes_fetched;          /* bytes read from bricks for faulting pages */
    uint64_t bytes_prefetched;       /* bytes read ahead of use */
    uint64_t bytes_written_back;     /* dirty bytes written back to bricks */
    uint64_t evictions;              /* pages evicted from the local buffer */
    uint64_t resident_bytes;         /* remote-backed bytes resident now */
    uint64_t peak_resident_bytes;    /* largest resident size seen */
    uint64_t budget_bytes;           /* local buffer budget now */
    uint64_t window_bytes_allocated; /* bytes allocated in the window now */
    uint64_t fault_p50_ns;           /* median fault service time in the handler */
    uint64_t fault_p99_ns;           /* 99th percentile fault service time */
};

/* Allocates `size` bytes of remote memory (zero-filled, page aligned) whatever the threshold.
 * Returns NULL if rackmem is not active in this process or the window is full. */
void *rackmem_alloc(size_t size);

/* Frees memory returned by rackmem_alloc (free() works too). */
void rackmem_free(void *p);

/* 1 if `p` points into remote memory, 0 otherwise. */
int rackmem_is_remote(const void *p);

/* Fills `out` and returns 0; returns -1 if rackmem is not active in this process. */
int rackmem_get_stats(struct rackmem_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* RACKMEM_H */
