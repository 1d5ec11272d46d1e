/* aio.c — asynchronous file I/O behind one API (see aio.h).
 *
 * Two backends sit behind the public functions, chosen once in aio_new as
 * Redis picks ae_epoll.c behind ae.c: io_uring (liburing) and a synchronous
 * pread/pwrite fallback. Each backend provides three things: start a
 * request (sync: run it to the end), reap completions, and flush queued
 * submissions. Everything else — validation, fault injection, errno
 * conversion, the done queue and the counts — is shared.
 *
 * Owner: the thread that created the Aio (the mover); no locking.
 *
 * Invariants:
 *   n_outstanding = n_inflight + n_waiting + (length of the done queue)
 *   n_inflight <= queue_depth (io_uring: requests handed to the ring; the
 *   completion ring is twice as large, so completions are never dropped)
 *   1 <= limit <= queue_depth (aio_set_inflight)
 *   n_waiting > 0 only while n_inflight >= limit: the requests of a batch
 *   larger than the limit wait in FIFO order, and each completion hands
 *   the ring the next (so aio_submit never waits for the device); after
 *   the limit is lowered, n_inflight may exceed it until completions
 *   bring it down
 *   a request is on the done queue exactly once, with result set, between
 *   its completion and the aio_wait that hands it back.
 * A failure of the ring itself (io_uring_submit or io_uring_wait_cqe
 * returning an error other than EINTR/EAGAIN) sets is_broken: from then on
 * every call returns MN_EIO, because requests may be lost in it. Only
 * aio_free still waits on a broken ring, for the requests the kernel took:
 * their buffers belong to the caller, who frees them after aio_free.
 */
#include "cache/aio.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/mem.h"

/* ---- types --------------------------------------------------------------- */

/* One transfer system call moves at most this much (io_uring takes a 32-bit
 * length); longer requests continue as short transfers do. */
#define AIO_MAX_XFER (1u << 30)

struct Aio {
    AioBackend backend;
    int queue_depth;
    int limit;                     /* requests in the ring at most (aio_set_inflight) */
    int peak_inflight;             /* n_inflight's highest since aio_take_peak */
    bool is_broken;
    int n_inflight;
    int n_waiting;                 /* submitted, not yet handed to the ring */
    int n_outstanding;
    uint64_t n_requests;           /* taken by aio_submit, ever */
    AioReq *done_head, *done_tail; /* FIFO of completed requests */
    AioReq *wait_head, *wait_tail; /* FIFO of waiting requests (linked by next_done) */
    /* fault injection (tests) */
    unsigned fault_mask;
    int fault_skip, fault_fail, fault_errno;
    bool has_ring;
    struct io_uring ring;
};

/* ---- shared helpers ------------------------------------------------------ */

int aio_errno_to_mn(int errnum) {
    switch (errnum) {
    case 0: return MN_OK;
    case ENOSPC:
    case EDQUOT: return MN_EFULL;
    case ENOMEM: return MN_ENOMEM;
    case EINVAL: return MN_EINVAL;
    case ENOENT: return MN_ENOTFOUND;
    case ECANCELED: return MN_ECANCELED;
    default: return MN_EIO;
    }
}

/* Whether an operation of kind op fails by injection now; its errno or 0. */
static int fault_take(Aio *a, unsigned op) {
    if ((a->fault_mask & op) == 0 || a->fault_fail <= 0) return 0;
    if (a->fault_skip > 0) {
        a->fault_skip--;
        return 0;
    }
    a->fault_fail--;
    return a->fault_errno;
}

static void fifo_push(AioReq **head, AioReq **tail, AioReq *r) {
    r->next_done = NULL;
    if (*tail) (*tail)->next_done = r;
    else *head = r;
    *tail = r;
}

static AioReq *fifo_pop(AioReq **head, AioReq **tail) {
    AioReq *r = *head;
    *head = r->next_done;
    if (*head == NULL) *tail = NULL;
    r->next_done = NULL;
    return r;
}

static void complete(Aio *a, AioReq *r, int code) {
    r->result = code;
    fifo_push(&a->done_head, &a->done_tail, r);
}

static bool is_aligned(uint64_t v) { return (v & (AIO_ALIGN - 1)) == 0; }

static bool req_valid(const AioReq *r) {
    if (r->file == NULL || r->file->fd < 0) return false;
    if (r->op == AIO_OP_FDATASYNC) return true;
    if (r->op != AIO_OP_READ && r->op != AIO_OP_WRITE) return false;
    return r->buf != NULL && r->len > 0 && is_aligned((uintptr_t)r->buf) && is_aligned(r->offset) &&
           is_aligned(r->len) && r->offset + r->len >= r->offset;
}

/* ---- sync backend -------------------------------------------------------- */

static void sync_run(Aio *a, AioReq *r) {
    int fd = r->file->fd;
    if (r->op == AIO_OP_FDATASYNC) {
        int rc;
        do rc = fdatasync(fd);
        while (rc != 0 && errno == EINTR);
        complete(a, r, rc == 0 ? MN_OK : aio_errno_to_mn(errno));
        return;
    }
    while (r->n_done_bytes < r->len) {
        size_t left = r->len - r->n_done_bytes;
        if (left > AIO_MAX_XFER) left = AIO_MAX_XFER;
        uint8_t *p = (uint8_t *)r->buf + r->n_done_bytes;
        off_t off = (off_t)(r->offset + r->n_done_bytes);
        ssize_t n = r->op == AIO_OP_READ ? pread(fd, p, left, off) : pwrite(fd, p, left, off);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            complete(a, r, aio_errno_to_mn(errno));
            return;
        }
        if (n == 0) { /* end of file on a read; a write that moves nothing */
            complete(a, r, r->op == AIO_OP_READ ? MN_EFORMAT : MN_EIO);
            return;
        }
        r->n_done_bytes += (size_t)n;
    }
    complete(a, r, MN_OK);
}

/* ---- io_uring backend ---------------------------------------------------- */

/* An injected AIO_OP_RING fault: the ring breaks here (tests). */
static bool ring_breaks(Aio *a) {
    if (!fault_take(a, AIO_OP_RING)) return false;
    a->is_broken = true;
    return true;
}

/* Hand queued SQEs to the kernel. */
static int uring_flush(Aio *a) {
    if (ring_breaks(a)) return MN_EIO;
    for (;;) {
        int rc = io_uring_submit(&a->ring);
        if (rc >= 0) return MN_OK;
        if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
        a->is_broken = true;
        return MN_EIO;
    }
}

/* Queue the rest of r's transfer. The caller keeps n_inflight < depth, so
 * an SQE is free once earlier ones have been flushed. */
static int uring_prep(Aio *a, AioReq *r) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&a->ring);
    if (sqe == NULL) {
        int rc = uring_flush(a);
        if (rc != MN_OK) return rc;
        sqe = io_uring_get_sqe(&a->ring);
        if (sqe == NULL) {
            a->is_broken = true;
            return MN_EIO;
        }
    }
    if (r->op == AIO_OP_FDATASYNC) {
        io_uring_prep_fsync(sqe, r->file->fd, IORING_FSYNC_DATASYNC);
    } else {
        size_t left = r->len - r->n_done_bytes;
        unsigned n = left > AIO_MAX_XFER ? AIO_MAX_XFER : (unsigned)left;
        uint8_t *p = (uint8_t *)r->buf + r->n_done_bytes;
        uint64_t off = r->offset + r->n_done_bytes;
        if (r->op == AIO_OP_READ) io_uring_prep_read(sqe, r->file->fd, p, n, off);
        else io_uring_prep_write(sqe, r->file->fd, p, n, off);
    }
    io_uring_sqe_set_data(sqe, r);
    a->n_inflight++;
    if (a->n_inflight > a->peak_inflight) a->peak_inflight = a->n_inflight;
    assert(a->n_inflight <= a->queue_depth); /* so the completion queue never fills (uring_drain) */
    return MN_OK;
}

/* Hand waiting requests to the ring while it has room. */
static int uring_feed(Aio *a) {
    int n_fed = 0;
    for (; a->n_waiting > 0 && a->n_inflight < a->limit; n_fed++) {
        a->n_waiting--;
        if (uring_prep(a, fifo_pop(&a->wait_head, &a->wait_tail)) != MN_OK) return MN_EIO;
    }
    return n_fed > 0 ? uring_flush(a) : MN_OK;
}

/* Take one completion (waiting for it when `wait`): 1 when one was taken
 * (the request may have been requeued to continue a short transfer), 0 when
 * none was ready, -MN_EIO when the ring failed (the Aio is then broken). */
static int uring_reap_one(Aio *a, bool wait) {
    struct io_uring_cqe *cqe = NULL;
    if (wait && ring_breaks(a)) return -MN_EIO;
    for (;;) {
        int rc = wait ? io_uring_wait_cqe(&a->ring, &cqe) : io_uring_peek_cqe(&a->ring, &cqe);
        if (rc == 0) break;
        if (rc == -EAGAIN && !wait) return 0;
        if (rc == -EINTR || rc == -EAGAIN) continue;
        a->is_broken = true;
        return -MN_EIO;
    }
    AioReq *r = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&a->ring, cqe);
    a->n_inflight--;
    if (res == -EINTR || res == -EAGAIN) goto again;
    if (res < 0) {
        complete(a, r, aio_errno_to_mn(-res));
        return 1;
    }
    if (r->op == AIO_OP_FDATASYNC) {
        complete(a, r, MN_OK);
        return 1;
    }
    if (res == 0) {
        complete(a, r, r->op == AIO_OP_READ ? MN_EFORMAT : MN_EIO);
        return 1;
    }
    r->n_done_bytes += (size_t)res;
    if (r->n_done_bytes >= r->len) {
        complete(a, r, MN_OK);
        return 1;
    }
again: /* a short or interrupted transfer: queue the rest */
    if (uring_prep(a, r) != MN_OK || uring_flush(a) != MN_OK) return -MN_EIO;
    return 1;
}

/* uring_reap_one, then the freed room goes to the next waiting request. */
static int uring_reap(Aio *a, bool wait) {
    int rc = uring_reap_one(a, wait);
    if (rc == 1 && uring_feed(a) != MN_OK) return -MN_EIO;
    return rc;
}

/* ---- API ----------------------------------------------------------------- */

int aio_new(AioBackend backend, int queue_depth, Aio **out) {
    *out = NULL;
    if (queue_depth < 1) return MN_EINVAL;
    if (queue_depth > 4096) queue_depth = 4096;
    Aio *a = mn_calloc(1, sizeof *a);
    if (a == NULL) return MN_ENOMEM;
    a->queue_depth = queue_depth;
    a->limit = queue_depth;
    if (backend == AIO_BACKEND_AUTO || backend == AIO_BACKEND_URING) {
        struct io_uring_params params;
        memset(&params, 0, sizeof params);
        params.flags = IORING_SETUP_CQSIZE;
        params.cq_entries = 2u * (unsigned)queue_depth;
        int rc = io_uring_queue_init_params((unsigned)queue_depth, &a->ring, &params);
        if (rc == 0) {
            a->has_ring = true;
            a->backend = AIO_BACKEND_URING;
        } else if (backend == AIO_BACKEND_URING) {
            mn_free(a);
            return rc == -ENOMEM ? MN_ENOMEM : MN_EUNSUPPORTED;
        }
    }
    if (!a->has_ring) a->backend = AIO_BACKEND_SYNC;
    *out = a;
    return MN_OK;
}

/* Wait until the kernel is done with every request it took, discarding
 * the completions (the Aio is going away). SQEs still queued in the ring
 * (a failed submit left them there) were never taken and are not waited
 * for. Works on a broken ring: when waiting fails, the completion queue,
 * which needs no system call to read, is polled instead. This counts on
 * the kernel posting a completion for every request it took. It always
 * can: the completion queue has room for twice the queue depth, and
 * n_inflight (every request taken and not yet reaped, so every completion
 * waiting in the queue) never exceeds the depth, so the queue never fills
 * and no completion is dropped, with or without IORING_FEAT_NODROP. */
static void uring_drain(Aio *a) {
    unsigned queued = io_uring_sq_ready(&a->ring);
    int held = a->n_inflight - (int)queued;
    while (held > 0) {
        struct io_uring_cqe *cqe = NULL;
        int rc = fault_take(a, AIO_OP_RING) ? -EIO : io_uring_wait_cqe(&a->ring, &cqe);
        if (rc == -EINTR || rc == -EAGAIN) continue;
        if (rc < 0 && io_uring_peek_cqe(&a->ring, &cqe) != 0) {
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
            continue;
        }
        io_uring_cqe_seen(&a->ring, cqe);
        held--;
    }
    a->n_inflight = 0;
}

void aio_free(Aio *a) {
    if (a == NULL) return;
    a->wait_head = a->wait_tail = NULL; /* never taken by the kernel: nothing to wait for */
    a->n_waiting = 0;
    if (a->has_ring) {
        if (a->is_broken) uring_drain(a);
        else
            while (a->n_inflight > 0)
                if (uring_reap(a, true) < 0) { /* the ring broke now */
                    uring_drain(a);
                    break;
                }
        io_uring_queue_exit(&a->ring);
    }
    mn_free(a);
}

AioBackend aio_backend(const Aio *a) { return a->backend; }

const char *aio_backend_name(AioBackend b) {
    switch (b) {
    case AIO_BACKEND_URING: return "io_uring";
    case AIO_BACKEND_SYNC: return "sync";
    default: return "auto";
    }
}

static int open_once(Aio *a, const char *path, int oflags) {
    int injected = fault_take(a, AIO_OP_OPEN);
    if (injected) {
        errno = injected;
        return -1;
    }
    return open(path, oflags, 0600);
}

int aio_open(Aio *a, const char *path, unsigned flags, AioFile *out) {
    out->fd = -1;
    out->is_direct = false;
    if (a->is_broken) return MN_EIO;
    int oflags = O_CLOEXEC | ((flags & AIO_OPEN_RDONLY) ? O_RDONLY : O_RDWR);
    if (flags & AIO_OPEN_CREATE) oflags |= O_CREAT;
    if (flags & AIO_OPEN_TRUNC) oflags |= O_TRUNC;
    int fd = -1;
    if (!(flags & AIO_OPEN_BUFFERED)) {
        fd = open_once(a, path, oflags | O_DIRECT);
        if (fd >= 0) {
            out->fd = fd;
            out->is_direct = true;
            return MN_OK;
        }
        if (errno != EINVAL) return aio_errno_to_mn(errno);
        /* the filesystem does not do O_DIRECT (tmpfs, some FUSE): buffered */
    }
    fd = open_once(a, path, oflags);
    if (fd < 0) return aio_errno_to_mn(errno);
    out->fd = fd;
    return MN_OK;
}

void aio_close(AioFile *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
}

int aio_submit(Aio *a, AioReq *reqs, int n) {
    if (a->is_broken) return MN_EIO;
    if (n < 0) return MN_EINVAL;
    for (int i = 0; i < n; i++)
        if (!req_valid(&reqs[i])) return MN_EINVAL;
    for (int i = 0; i < n; i++) {
        AioReq *r = &reqs[i];
        r->result = MN_OK;
        r->n_done_bytes = 0;
        r->next_done = NULL;
        a->n_outstanding++;
        a->n_requests++;
        int injected = fault_take(a, r->op);
        if (injected) {
            complete(a, r, aio_errno_to_mn(injected));
            continue;
        }
        if (!a->has_ring) {
            sync_run(a, r);
            continue;
        }
        if (a->n_waiting > 0 || a->n_inflight >= a->limit) { /* the ring is full: it waits its turn */
            fifo_push(&a->wait_head, &a->wait_tail, r);
            a->n_waiting++;
            continue;
        }
        if (uring_prep(a, r) != MN_OK) return MN_EIO;
    }
    if (a->has_ring && a->n_inflight > 0) return uring_flush(a);
    return MN_OK;
}

int aio_set_inflight(Aio *a, int n) {
    if (n < 1 || n > a->queue_depth) return MN_EINVAL;
    if (a->is_broken) return MN_EIO;
    a->limit = n;
    return a->has_ring ? uring_feed(a) : MN_OK;
}

int aio_n_inflight(const Aio *a) { return a->n_inflight; }

int aio_take_peak(Aio *a) {
    int peak = a->peak_inflight;
    a->peak_inflight = a->n_inflight;
    return peak;
}

int aio_n_outstanding(const Aio *a) { return a->n_outstanding; }

uint64_t aio_n_requests(const Aio *a) { return a->n_requests; }

int aio_wait(Aio *a, int min_done, int max_done, AioReq **done, int *n_done) {
    *n_done = 0;
    if (a->is_broken) return MN_EIO;
    if (min_done < 0 || min_done > a->n_outstanding || max_done < min_done) return MN_EINVAL;
    int n_ready = a->n_outstanding - a->n_inflight - a->n_waiting;
    while (n_ready < min_done) {
        int rc = uring_reap(a, true); /* sync: n_inflight is 0, never here */
        if (rc < 0) return MN_EIO;
        n_ready = a->n_outstanding - a->n_inflight - a->n_waiting;
    }
    if (a->has_ring) /* collect what is ready anyway, without waiting */
        while (n_ready < max_done && a->n_inflight > 0) {
            int rc = uring_reap(a, false);
            if (rc < 0) return MN_EIO;
            if (rc == 0) break;
            n_ready = a->n_outstanding - a->n_inflight - a->n_waiting;
        }
    int k = 0;
    while (k < max_done && a->done_head != NULL) done[k++] = fifo_pop(&a->done_head, &a->done_tail);
    a->n_outstanding -= k;
    *n_done = k;
    return MN_OK;
}

int aio_run(Aio *a, AioReq *reqs, int n) {
    if (a->n_outstanding != 0) return MN_EINVAL;
    int rc = aio_submit(a, reqs, n);
    if (rc != MN_OK) return rc;
    int left = a->n_outstanding; /* every request, submitted or completed */
    while (left > 0) {
        AioReq *done[64];
        int got;
        rc = aio_wait(a, 1, 64, done, &got);
        if (rc != MN_OK) return rc;
        left -= got;
    }
    for (int i = 0; i < n; i++)
        if (reqs[i].result != MN_OK) return reqs[i].result;
    return MN_OK;
}

int aio_fdatasync(Aio *a, const AioFile *file) {
    AioReq r = {.op = AIO_OP_FDATASYNC, .file = file};
    return aio_run(a, &r, 1);
}

int aio_fallocate(Aio *a, const AioFile *file, uint64_t offset, uint64_t len) {
    if (a->is_broken) return MN_EIO;
    if (file == NULL || file->fd < 0 || len == 0 || offset + len < offset || offset + len > (uint64_t)INT64_MAX)
        return MN_EINVAL;
    int injected = fault_take(a, AIO_OP_FALLOCATE);
    if (injected) return aio_errno_to_mn(injected);
    int rc;
    do rc = fallocate(file->fd, 0, (off_t)offset, (off_t)len);
    while (rc != 0 && errno == EINTR);
    if (rc == 0) return MN_OK;
    if (errno != EOPNOTSUPP && errno != ENOSYS) return aio_errno_to_mn(errno);
    /* no preallocation here: extend the file, space is claimed on write */
    struct stat st;
    if (fstat(file->fd, &st) != 0) return aio_errno_to_mn(errno);
    if ((uint64_t)st.st_size >= offset + len) return MN_OK;
    if (ftruncate(file->fd, (off_t)(offset + len)) != 0) return aio_errno_to_mn(errno);
    return MN_OK;
}

void aio_fault_set(Aio *a, unsigned op_mask, int n_skip, int n_fail, int errnum) {
    a->fault_mask = op_mask;
    a->fault_skip = n_skip;
    a->fault_fail = op_mask ? n_fail : 0;
    a->fault_errno = errnum;
}
