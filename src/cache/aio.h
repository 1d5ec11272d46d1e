/* aio.h — asynchronous file I/O for the tiers below the pool.
 *
 * One API, two backends chosen in one place (aio_new): io_uring (liburing)
 * and a plain pread/pwrite fallback that does the same work synchronously
 * inside aio_submit. Callers cannot tell them apart except by speed: the
 * same requests complete with the same results in both.
 *
 * Every data transfer is 4 KiB aligned — file offset, length and buffer
 * address — so files can be opened with O_DIRECT; requests that are not are
 * refused with MN_EINVAL before anything is submitted. Short transfers are
 * continued internally; a read that meets end of file before its length
 * completes with MN_EFORMAT (the file is shorter than its owner believes).
 * Foreign codes are converted here: ENOSPC/EDQUOT -> MN_EFULL, ENOMEM ->
 * MN_ENOMEM, EINVAL -> MN_EINVAL, anything else -> MN_EIO.
 *
 * An Aio belongs to one thread (the mover); nothing here locks. A request
 * (AioReq) is owned by the caller and must stay where it is, untouched,
 * from aio_submit until aio_wait hands it back.
 *
 * For tests, aio_fault_set makes chosen operations fail with a chosen errno
 * at the point where the system call would be made, so the conversion and
 * every caller's error path run exactly as a real failure would.
 */
#ifndef MN_AIO_H
#define MN_AIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AIO_ALIGN 4096u

typedef enum AioBackend {
    AIO_BACKEND_AUTO = 0, /* io_uring when the kernel allows it, else sync */
    AIO_BACKEND_URING,
    AIO_BACKEND_SYNC,
} AioBackend;

/* Operation kinds; also bits for aio_fault_set's op_mask. */
enum {
    AIO_OP_READ = 1u << 0,
    AIO_OP_WRITE = 1u << 1,
    AIO_OP_FDATASYNC = 1u << 2,
    AIO_OP_FALLOCATE = 1u << 3, /* aio_fallocate */
    AIO_OP_OPEN = 1u << 4,      /* the open(2) calls of aio_open */
    AIO_OP_RING = 1u << 5,      /* io_uring only: handing requests to the
                                   ring or waiting on it fails as if the ring
                                   itself broke, also aio_free's waits
                                   (errnum unused) */
};

/* aio_open flags */
enum {
    AIO_OPEN_CREATE = 1u << 0,   /* O_CREAT, mode 0600 */
    AIO_OPEN_TRUNC = 1u << 1,    /* O_TRUNC */
    AIO_OPEN_BUFFERED = 1u << 2, /* do not try O_DIRECT */
    AIO_OPEN_RDONLY = 1u << 3,   /* default is read-write */
};

typedef struct AioFile {
    int fd;         /* -1 when closed */
    bool is_direct; /* opened with O_DIRECT */
} AioFile;

typedef struct AioReq {
    /* set by the caller */
    unsigned op;         /* AIO_OP_READ, AIO_OP_WRITE or AIO_OP_FDATASYNC */
    const AioFile *file;
    void *buf;           /* AIO_ALIGN aligned; unused for FDATASYNC */
    uint64_t offset;     /* AIO_ALIGN aligned */
    size_t len;          /* AIO_ALIGN multiple, > 0; unused for FDATASYNC */
    void *user;          /* the caller's tag, untouched */
    /* set on completion */
    int result;          /* MN_OK or an MN_* code */
    /* private to aio.c */
    size_t n_done_bytes;
    struct AioReq *next_done;
} AioReq;

typedef struct Aio Aio;

/* A context with room for queue_depth requests in flight (>= 1; a larger
 * batch is fed in as earlier requests complete). AIO_BACKEND_AUTO picks
 * io_uring and falls back to sync when the ring cannot be created (old
 * kernel, seccomp). Asking for AIO_BACKEND_URING where it is unavailable
 * returns MN_EUNSUPPORTED. MN_ENOMEM. *out is NULL on failure. */
int aio_new(AioBackend backend, int queue_depth, Aio **out);
/* Requests still in flight are waited for first, also on a broken ring:
 * every request the kernel took is finished with its buffer when this
 * returns, so the caller may free the buffers right after. */
void aio_free(Aio *a);

/* The backend in use (never AUTO) and its name ("io_uring", "sync"). */
AioBackend aio_backend(const Aio *a);
const char *aio_backend_name(AioBackend b);

/* Open path. O_DIRECT is tried first unless AIO_OPEN_BUFFERED; when the
 * filesystem refuses it with EINVAL the file is opened buffered instead
 * (file->is_direct says which). MN_ENOTFOUND when the path (or its
 * directory) does not exist, else a converted code; out->fd is -1 then. */
int aio_open(Aio *a, const char *path, unsigned flags, AioFile *out);
/* Close the file (no-op when already closed). */
void aio_close(AioFile *f);

/* Queue n requests and start as many as the ring has room for; the rest
 * start in order as earlier ones complete (while the caller is in
 * aio_wait), so this never waits for the device. MN_EINVAL (nothing
 * submitted) when one is malformed or misaligned; MN_EIO when the ring
 * itself fails (the Aio is then broken and refuses everything). Results
 * arrive through aio_wait. */
int aio_submit(Aio *a, AioReq *reqs, int n);
/* Hand back up to max_done completed requests in done[], waiting until at
 * least min_done have completed. MN_EINVAL when min_done exceeds what is
 * outstanding. */
int aio_wait(Aio *a, int min_done, int max_done, AioReq **done, int *n_done);
/* Requests submitted and not yet handed back by aio_wait. */
int aio_n_outstanding(const Aio *a);

/* From now on at most n requests (1..queue_depth; at first queue_depth)
 * are in the ring at once; the rest wait their turn in FIFO order, as when
 * the ring is full. A device that serves the requests it holds side by
 * side returns a full ring's worth together; let in a few at a time, they
 * return in order. Raising the limit starts waiting requests at once;
 * lowering it lets those in the ring finish. MN_EINVAL outside
 * 1..queue_depth (the limit is unchanged); MN_EIO when the ring fails. */
int aio_set_inflight(Aio *a, int n);
/* Requests in the ring now, handed to the device and not yet reaped by
 * aio_wait (always 0 for the sync backend). */
int aio_n_inflight(const Aio *a);
/* The most requests that were in the ring at once since the last call (or
 * aio_new); the next count starts from those in it now. */
int aio_take_peak(Aio *a);
/* Requests aio_submit has taken since aio_new (a transfer continued after
 * a short one counts once): how many it took to move some bytes. */
uint64_t aio_n_requests(const Aio *a);

/* Submit n requests and wait for all of them; nothing else may be
 * outstanding. Returns the first failed request's code (all are waited
 * for regardless), or MN_OK. */
int aio_run(Aio *a, AioReq *reqs, int n);

/* fdatasync(file), through the backend. */
int aio_fdatasync(Aio *a, const AioFile *file);
/* Reserve [offset, offset+len) of file on the device (fallocate, mode 0);
 * where the filesystem cannot, the file is only extended (space is then
 * claimed, and may run out, at write time). ENOSPC -> MN_EFULL. */
int aio_fallocate(Aio *a, const AioFile *file, uint64_t offset, uint64_t len);

/* Test hook: after n_skip more operations whose kind is in op_mask, the
 * next n_fail such operations fail with errnum (a positive errno) as if
 * the kernel had returned it. op_mask 0 clears the fault. */
void aio_fault_set(Aio *a, unsigned op_mask, int n_skip, int n_fail, int errnum);

/* Memory for transfers comes from mn_huge_alloc (base/mem.h): 2 MiB
 * aligned and in transparent huge pages where the kernel grants them,
 * which is what a virtio disk without indirect descriptors needs: each
 * scattered page of a request takes one slot of its ring, so with 4 KiB
 * pages about 1 MiB fits in flight, with huge pages hundreds; the same
 * reads run faster (OPERATIONS.md, "Tiers", has the figures). */

/* errno -> MN_* as described above (exposed for callers' own syscalls). */
int aio_errno_to_mn(int errnum);

#endif
