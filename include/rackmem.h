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

/* ---- Migration (user-managed: the program moves a range between memories) ----------------
 *
 * rackmem_migrate moves the pages of [addr, addr+len) (rounded out to pages; inside memory the
 * program allocated from rackmem) to `target` and returns when they are there:
 *   "local"        fetch the range and pin it in the local buffer until rackmem_unpin or until
 *                  it is freed (pins may take at most half the local buffer);
 *   a brick        an address as given in RACKMEM_BRICKS ("unix:/path", "tcp://host:port"):
 *                  the range's pages move to that brick, through this process, and later
 *                  evictions of the range write there. A pinned range is unpinned.
 * The program keeps running meanwhile: other threads may read and write the range, and no write
 * is lost. Returns 0, or -1 with errno:
 *   EINVAL  the range is empty or not inside rackmem memory;
 *   ENOENT  `target` is neither "local" nor a brick of RACKMEM_BRICKS;
 *   ENOSPC  the target has no room (the brick cannot carve a segment, or the pin is too large);
 *   EIO     the target brick failed during the move: the range stays where it was;
 *   EBUSY   part of the range is being moved by another call;
 *   ENOTSUP brick targets with a node agent (the control plane places memory there);
 *   ENOSYS  rackmem is not active in this process.
 * Each migration is timed in four steps (seed 001's Table III), also summed in --stats-json. */
struct rackmem_migration {
    uint64_t setup_ns;    /* check, split by source, wait out write-backs in flight */
    uint64_t allocate_ns; /* find or carve room on the target */
    uint64_t transfer_ns; /* read from the source, write to the target (or fetch, for "local") */
    uint64_t finalize_ns; /* point the range at the target, send write-backs held meanwhile */
    uint64_t bytes;       /* bytes carried */
};

int rackmem_migrate(void *addr, size_t len, const char *target);

/* As rackmem_migrate; fills `out` (if not NULL) with the step times on success. */
int rackmem_migrate_timed(void *addr, size_t len, const char *target, struct rackmem_migration *out);

/* Ends a "local" pin of [addr, addr+len): its pages may leave the local buffer again. 0, or -1
 * with errno (EINVAL: not rackmem memory; ENOSYS: rackmem not active). */
int rackmem_unpin(void *addr, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* RACKMEM_H */
