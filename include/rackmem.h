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

/* ---------------------------------------------------------------------------------------------
 * One-sided segments: put, get and atomics on brick memory outside the window.
 *
 * A segment is a range of a memory brick's memory that this process reads and writes
 * explicitly, in the style of OpenSHMEM: nothing is mapped into the window, no page fault is
 * taken, and the program decides what moves when. Use it when you know your access pattern
 * better than page faults do (a distributed array updated in scattered 8-byte words, a
 * counter shared by several processes, a buffer staged in bulk); see docs/putget.md.
 *
 * Configuration: the environment of `rackmem run` (RACKMEM_BRICKS, RACKMEM_SECRET,
 * RACKMEM_TIMEOUT_MS, RACKMEM_SHARED_MEMORY, RACKMEM_TLS_CA), read at the first call. Under
 * `rackmem run` it is set for you; a program linked with -lrackmem and started without it
 * needs at least RACKMEM_BRICKS and RACKMEM_SECRET naming a running `rackmem brick`.
 * RACKMEM_TRANSFER_THRESHOLD pins the size from which transfers take the bulk path (`auto`,
 * the default: measured on each brick's link at its first segment, on a scratch segment, in a
 * few tens of milliseconds at most; `inline`; `bulk`; or a size such as `64KiB`).
 * RACKMEM_PUTGET_SPIN_US is how long a caller may poll for the brick's answer before it
 * sleeps (default 50; each link measures polled and slept waits and takes the shorter, since
 * on a machine with busy CPUs the poller takes the CPU the brick needs; 0 never polls). Segments of a brick on this host (unix:
 * address) are mapped into the process, so transfers and atomics are memory operations;
 * RACKMEM_SHARED_MEMORY=0 keeps them on the socket.
 *
 * Agent memory: with no RACKMEM_BRICKS but a node agent (RACKMEM_AGENT, which `rackmem run
 * --agent` sets), segments come from the control plane through the agent, which checks the
 * process's user and quotas as it does for the window's memory. rackmem_seg_alloc gets a
 * segment of this process's own; rackmem_seg_open a named segment of the control plane, which
 * processes of the same user open on any node (the name belongs to the user who created it:
 * another user's open is refused with EACCES). It counts against the quota of the node that
 * created it, lives while a process holds it open, and is freed by the last close; a process
 * that exits or is killed closes what it held (its agent sees its connection close). The
 * process attaches to the brick directly with the grant the agent returns, so put, get,
 * rackmem_quiet and the atomics work as on a configured brick.
 *
 * Errors: every call returns -1 (NULL for the allocators, UINT64_MAX for the atomics, see
 * there) and sets errno:
 *   EINVAL  offset or offset+len past the end of the segment, an atomic's offset not a
 *           multiple of 8, a NULL buffer with a non-zero length, a bad name or size (on
 *           agent memory a name is 1 to 128 characters of A-Z a-z 0-9 - _ . :)
 *   EBADF   a segment handle that was freed (or never allocated)
 *   ENOMEM  the brick has no room for the segment; on agent memory also: over the process's,
 *           the user's or the node's quota, or no brick with room
 *   ENOENT  rackmem_seg_open of a name with no live segment and bytes == 0
 *   EEXIST  rackmem_seg_open of a live segment smaller than `bytes`
 *   EACCES  the brick refused the secret; on agent memory, a name another user created
 *   EMFILE  64 segments are open in this process already
 *   ENODEV  neither a brick nor a node agent is configured (RACKMEM_BRICKS and RACKMEM_AGENT
 *           unset)
 *   EAGAIN  the node agent serves as many processes as it may; a named segment still being
 *           moved to another brick after 30 s (nothing was done; call again, see below)
 *   EIO     the brick was lost or failed; the node agent or control plane cannot be reached;
 *           a named segment whose brick restarted (its contents are lost, see below); an
 *           atomic whose link broke after it was sent (its outcome is unknown, see below); a
 *           segment of rackmem_seg_alloc whose brick says it moves (only named segments move)
 *
 * Broken links (agent memory, named segments): a call whose link to the brick breaks (a
 * connection reset, the brick closing an idle link, the grant expired) re-opens the name
 * through the node agent (a new grant), attaches again and retries, by itself: one try at
 * once, then tries 50 ms apart doubling up to 1 s, for at most 10 s after the failure (plus
 * one RACKMEM_TIMEOUT_MS for the try under way); then -1 and EIO. A put or a get is retried
 * whatever happened to it (repeating it is harmless). An atomic is retried only when the brick
 * refused it unexecuted, or when the brick had closed the link before the call (an idle
 * close: seen before sending); if the link broke after it was sent, the brick may have executed it,
 * so it fails with EIO and its outcome is unknown (read the word to find out); the next call
 * finds the segment attached again. A brick that restarted on the same address starts with an
 * empty pool, so the segment's contents are lost: the call and every later one on that handle
 * fail with EIO (never the new brick's zeros) until rackmem_seg_free; opening the name again
 * then gives the restarted brick's memory, zero-filled. Non-blocking transfers whose link
 * breaks are sent again by rackmem_quiet, as the blocking calls are (a put's bytes are kept
 * until its answer for that; within the same bounds, then -1 and EIO). Not covered: segments mapped
 * from a brick on this host (their calls are memory operations that never see the link), and
 * segments of configured bricks (RACKMEM_BRICKS: a standalone brick frees a segment when its
 * connection closes, so there is nothing to come back to) or rackmem_seg_alloc's.
 *
 * Moves (agent memory, named segments): the control plane moves a named segment off a brick
 * that drains (docs/migration.md). While its pages are copied the brick answers every call on
 * it "moving" without executing it: the call waits (1 ms, doubling up to 50 ms) and sends it
 * again, for at most 30 s (the control plane ends a move that is not done in 20 s and the
 * segment is served where it was), then -1 and EAGAIN with nothing done. Once the name points
 * at the new brick the old one answers "moved", also unexecuted (and, 10 s later, that it has
 * no such segment): the call re-opens the name and re-attaches as after a broken link (above),
 * and sends it to the new brick. Neither answer
 * executed anything, so atomics are retried too and each is executed exactly once. A call may
 * so take the move's time (0.6-1.2 s for a 64 MiB segment over loopback TCP, docs/benchmarks.md).
 * Segments mapped from a brick on this host are not moved (the brick cannot refuse the
 * processor's stores): a drain waits for them to be closed, saying so. Non-blocking transfers
 * answered "moving" or "moved" are sent again by rackmem_quiet as the blocking calls are; a
 * transfer sent again may land after later non-blocking transfers of the thread to the same
 * bytes (they are unordered until rackmem_quiet).
 *
 * Thread safety: every call may be made from any thread at once, on the same segment or not.
 * Transfers from different threads to overlapping bytes are not ordered with each other;
 * atomics are atomic with respect to each other from every thread, process and node, and
 * with respect to nothing else (a put over a word being added to may lose the add).
 * Non-blocking transfers belong to the thread that started them: rackmem_quiet completes
 * the calling thread's. fork(): the parent's segments stay the parent's; in the child, calls on
 * them fail with EBADF (and rackmem_seg_free of them too, harmlessly), and transfers the
 * forking thread had in flight are the parent's (rackmem_quiet in the child does not wait for
 * them). The child makes segments of its own, over connections of its own (so do its
 * children); its copies of the parent's connections are closed, so the parent's segments are
 * freed when the parent frees them or exits. A child that execs starts afresh. */

/* An open segment; the pointer is a handle, never dereference it. */
typedef struct rackmem_seg rackmem_seg;

/* Allocates a segment of at least `bytes` (rounded up to the brick's 1 MiB chunk), zero-filled,
 * on the configured bricks in turn (on agent memory: where the control plane places it).
 * Returns NULL and sets errno on failure. Freed by rackmem_seg_free, or when the process
 * exits. */
rackmem_seg *rackmem_seg_alloc(size_t bytes);

/* Opens the segment named `name` (1 to 255 bytes, NUL-terminated) on the first configured
 * brick (on agent memory: the control plane's segment of that name), creating it with `bytes`
 * (zero-filled) if no live segment has that name; bytes == 0 opens an existing one only. Every
 * process that opens the name, on any node, shares the same memory; it lives while one of them
 * holds it open. Returns NULL and sets errno on failure. */
rackmem_seg *rackmem_seg_open(const char *name, size_t bytes);

/* Closes the segment (freeing it once no process holds it). This thread's non-blocking
 * transfers on it are completed first; later use of the handle fails with EBADF. NULL is
 * ignored. On a handle that is not open, sets errno to EBADF. */
void rackmem_seg_free(rackmem_seg *seg);

/* The segment's size in bytes; 0 and errno EBADF for a handle that is not open. */
size_t rackmem_seg_size(rackmem_seg *seg);

/* Copies `len` bytes from `src` to byte `offset` of the segment (any alignment); returns 0
 * once the brick holds them (other processes' gets see them), or -1 and errno. */
int rackmem_put(rackmem_seg *seg, uint64_t offset, const void *src, size_t len);

/* Copies `len` bytes from byte `offset` of the segment to `dst`; returns 0 or -1 and errno. */
int rackmem_get(rackmem_seg *seg, uint64_t offset, void *dst, size_t len);

/* Starts a put and returns: `src` may be reused at once (its bytes are sent, or copied, before
 * the call returns), but the put is complete (visible to others) only after rackmem_quiet.
 * Argument errors are reported now; the brick's refusal at rackmem_quiet. */
int rackmem_put_nbi(rackmem_seg *seg, uint64_t offset, const void *src, size_t len);

/* Starts a get and returns: `dst` holds the bytes only after this thread's next rackmem_quiet
 * returns 0; until then the program must neither read, write nor free it. */
int rackmem_get_nbi(rackmem_seg *seg, uint64_t offset, void *dst, size_t len);

/* Completes every non-blocking transfer this thread started: returns 0, or -1 and the errno of
 * the first that failed (the others are completed all the same). A thread that exits with
 * transfers in flight completes them. At most 256 transfers (64 MiB of gets) are in flight per
 * thread; starting more first completes the oldest. */
int rackmem_quiet(void);

/* Atomically adds `value` (wrapping) to the 8-byte word at `offset` (a multiple of 8) and
 * returns the word's previous value, executed by the brick (or by this processor on a mapped
 * segment: the same memory). On error returns UINT64_MAX and sets errno: to tell an error from
 * a word that held UINT64_MAX, set errno to 0 before the call. */
uint64_t rackmem_atomic_fetch_add(rackmem_seg *seg, uint64_t offset, uint64_t value);

/* Atomically replaces the 8-byte word at `offset` (a multiple of 8) by `desired` if it holds
 * `expected`; returns the word's previous value (the swap happened iff it equals `expected`).
 * Errors as rackmem_atomic_fetch_add. */
uint64_t rackmem_atomic_compare_swap(rackmem_seg *seg, uint64_t offset, uint64_t expected, uint64_t desired);

/* ---- Migration (user-managed: the program moves a range between memories) ----------------
 *
 * rackmem_migrate moves the pages of [addr, addr+len) (rounded out to pages; inside memory the
 * program allocated from rackmem) to `target` and returns when they are there:
 *   "local"        fetch the range and pin it in the local buffer until rackmem_unpin or until
 *                  it is freed (pins may take at most half the local buffer);
 *   a brick        an address as given in RACKMEM_BRICKS ("unix:/path", "tcp://host:port"),
 *                  or with a node agent as the control plane lists it (rackmem ctl bricks):
 *                  the range's pages move to that brick (pulled by it from the source brick,
 *                  or through this process), and later evictions of the range write there.
 *                  With a node agent the control plane places and accounts the room there.
 *                  A pinned range is unpinned. Prefixed "direct:" the brick pulls the pages
 *                  whatever their size, prefixed "bounce:" they go through this process (for
 *                  measuring one against the other; unprefixed, RACKMEM_MIGRATION chooses).
 * The program keeps running meanwhile: other threads may read and write the range, and no write
 * is lost. Returns 0, or -1 with errno:
 *   EINVAL  the range is empty or not inside rackmem memory;
 *   ENOENT  `target` is neither "local" nor a brick of RACKMEM_BRICKS (with a node agent: of
 *           the control plane);
 *   ENOSPC  the target has no room (the brick cannot carve a segment, the control plane or the
 *           agent's quotas refuse it, or the pin is too large);
 *   EIO     the target brick failed during the move: the range stays where it was;
 *   EBUSY   part of the range is being moved by another call;
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
