/* diskprobe.c — raw sequential bandwidth of a directory (see diskprobe.h).
 *
 * What the disk tier's restore bandwidth is compared with. The probe does
 * what tier_disk.c does with a slab, on a scratch file: open it with
 * O_DIRECT through cache/aio (falling back to buffered I/O where the
 * filesystem refuses, as aio_open does for the tier), reserve its space
 * with fallocate, write it front to back in request_bytes requests with
 * queue_depth of them in flight, fdatasync, then read it back front to
 * back the same way. Each slot of the request window owns one aligned
 * buffer; a slot whose request completes is refilled with the next offset
 * at once, so the queue stays full until the file is done (the sliding
 * window aio_run keeps when it is handed more requests than its depth).
 *
 * Checking the data: the buffers are filled once with a pseudo-random
 * pattern; before a write the first 16 bytes of each 4 KiB page are set to
 * its file offset and the offset's complement, and after a read they must
 * read back so. A device or a backend that completes a read without
 * delivering the bytes is caught instead of measured as fast.
 *
 * Sampling (diskprobe_sample) writes the file the same way, then times
 * many short reads of it, one at a time, with the caller's wait between
 * them: the raw rate over a stretch of time, next to a server's restores.
 *
 * Nothing here is shared: one call owns its Aio, buffers and file, and the
 * file is unlinked on every path once it exists. Timing uses mn_now; the
 * write time covers the writes and the fdatasync, not the fallocate (the
 * tier reserves a slab once, long before it moves blocks into it).
 */
#include "tools/diskprobe.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/mem.h"

#define STAMP_MAGIC 0x6d6e656d6f70726full /* "mnemopro" */

/* ---- types ------------------------------------------------------------------ */

typedef struct Probe {
    Aio *aio;
    AioFile file;
    uint8_t *bufs;        /* (n_slots, request_bytes) from mn_huge_alloc */
    size_t bufs_cap;
    AioReq *reqs;         /* (n_slots) reqs[i] always uses buffer i */
    int n_slots;
    uint64_t request_bytes;
    uint64_t bytes;       /* file size */
    uint64_t end;         /* the current pass's end (run_pass) */
    uint64_t bad_offset;  /* a read whose stamp was wrong: the page's offset */
    char path[4096];      /* the file, once made ("" before) */
} Probe;

/* ---- helpers the tier probe shares ------------------------------------------------ */

void diskprobe_fill(uint8_t *p, uint64_t n) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i + 8 <= n; i += 8) { /* xorshift64: incompressible, cheap */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

int diskprobe_io_error(MnErr *err, int rc, const char *dir, const char *what, uint64_t bytes) {
    if (rc == MN_EFULL)
        return mn_err_set(err, rc, "%s: no space left for a %g MiB probe file (%s)", dir, (double)bytes / 1048576.0,
                          what);
    return mn_err_set(err, rc, "%s: %s failed: %s", dir, what, mn_strerror(rc));
}

int diskprobe_check_dir(const char *dir, MnErr *err) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return mn_err_set(err, errno == ENOENT ? MN_ENOTFOUND : MN_EIO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return mn_err_set(err, MN_EINVAL, "%s: not a directory", dir);
    return MN_OK;
}

/* ---- stamps ---------------------------------------------------------------------- */

static void stamp_pages(uint8_t *buf, uint64_t offset, size_t len) {
    for (size_t at = 0; at < len; at += AIO_ALIGN) {
        uint64_t s[2] = {offset + at, (offset + at) ^ STAMP_MAGIC};
        memcpy(buf + at, s, sizeof s);
    }
}

static void clear_stamps(uint8_t *buf, size_t len) {
    for (size_t at = 0; at < len; at += AIO_ALIGN) memset(buf + at, 0xff, 16);
}

/* True when every page of buf carries its own offset; else *bad the first
 * page that does not. */
static bool check_stamps(const uint8_t *buf, uint64_t offset, size_t len, uint64_t *bad) {
    for (size_t at = 0; at < len; at += AIO_ALIGN) {
        uint64_t s[2];
        memcpy(s, buf + at, sizeof s);
        if (s[0] != offset + at || s[1] != ((offset + at) ^ STAMP_MAGIC)) {
            *bad = offset + at;
            return false;
        }
    }
    return true;
}

/* ---- one pass over the file ------------------------------------------------------- */

/* Point slot i's request at the next part of the file and submit it. */
static int slot_start(Probe *p, int i, unsigned op, uint64_t offset) {
    AioReq *r = &p->reqs[i];
    uint64_t left = p->end - offset;
    size_t len = (size_t)(left < p->request_bytes ? left : p->request_bytes);
    uint8_t *buf = p->bufs + (size_t)i * p->request_bytes;
    if (op == AIO_OP_WRITE) stamp_pages(buf, offset, len);
    else clear_stamps(buf, len);
    *r = (AioReq){.op = op, .file = &p->file, .buf = buf, .offset = offset, .len = len};
    return aio_submit(p->aio, r, 1);
}

/* Write or read [from, to) of the file with n_slots requests in flight.
 * Every submitted request is waited for, also after a failure; returns the
 * first failure (MN_EFORMAT for data that came back wrong). */
static int run_pass(Probe *p, unsigned op, uint64_t from, uint64_t to) {
    uint64_t next = from;
    int rc = MN_OK;
    p->end = to;
    for (int i = 0; i < p->n_slots && next < to; i++) {
        rc = slot_start(p, i, op, next);
        if (rc != MN_OK) break;
        next += p->request_bytes;
    }
    AioReq *done[64];
    while (aio_n_outstanding(p->aio) > 0) {
        int n_done = 0;
        int max = aio_n_outstanding(p->aio) < 64 ? aio_n_outstanding(p->aio) : 64;
        int wrc = aio_wait(p->aio, 1, max, done, &n_done);
        if (wrc != MN_OK) return wrc; /* the ring broke: nothing more comes back */
        for (int k = 0; k < n_done; k++) {
            AioReq *r = done[k];
            if (rc == MN_OK && r->result != MN_OK) {
                rc = r->result;
                if (rc == MN_EFORMAT) p->bad_offset = r->offset; /* end of file before the request's end */
            }
            if (rc == MN_OK && op == AIO_OP_READ && !check_stamps(r->buf, r->offset, r->len, &p->bad_offset))
                rc = MN_EFORMAT;
            if (rc == MN_OK && next < to) {
                rc = slot_start(p, (int)(r - p->reqs), op, next);
                next += p->request_bytes;
            }
        }
    }
    return rc;
}

/* ---- the probe ----------------------------------------------------------------------- */

int diskprobe_run(const char *dir, uint64_t bytes, DiskProbeResult *out, MnErr *err) {
    return diskprobe_run_opts(dir, bytes, NULL, out, err);
}

/* Everything a probe holds, released on every path: the file (closed and
 * unlinked), the Aio (waiting for what is in flight first), the buffers. */
static void probe_close(Probe *p) {
    aio_close(&p->file);
    if (p->path[0] != '\0') unlink(p->path);
    aio_free(p->aio); /* waits for anything still in flight before the buffers go */
    mn_free(p->reqs);
    mn_huge_free(p->bufs, p->bufs_cap);
    *p = (Probe){.file = {.fd = -1}};
}

/* Check the sizes, make the buffers, the Aio and the file under dir, and
 * write the file (with its fdatasync): *write_s is that time. On failure
 * err says what failed and the probe holds nothing. */
static int probe_open(Probe *p, const char *dir, uint64_t bytes, const DiskProbeOpts *o, double *write_s,
                      MnErr *err) {
    *p = (Probe){.file = {.fd = -1}};
    DiskProbeOpts opts = o ? *o : (DiskProbeOpts){0};
    if (opts.request_bytes == 0) opts.request_bytes = DISKPROBE_REQUEST_BYTES;
    if (opts.queue_depth == 0) opts.queue_depth = DISKPROBE_QUEUE_DEPTH;
    if (bytes == 0 || bytes % AIO_ALIGN != 0 || bytes > (uint64_t)INT64_MAX)
        return mn_err_set(err, MN_EINVAL, "probe size %" PRIu64 " is not a positive multiple of %u bytes", bytes,
                          AIO_ALIGN);
    if (opts.request_bytes % AIO_ALIGN != 0 || opts.request_bytes > (1u << 30))
        return mn_err_set(err, MN_EINVAL, "request size %" PRIu64 " is not a multiple of %u bytes up to 1 GiB",
                          opts.request_bytes, AIO_ALIGN);
    if (opts.queue_depth < 1 || opts.queue_depth > 1024)
        return mn_err_set(err, MN_EINVAL, "queue depth %d is not in 1..1024", opts.queue_depth);
    int rc = diskprobe_check_dir(dir, err);
    if (rc != MN_OK) return rc;

    p->request_bytes = opts.request_bytes;
    p->bytes = bytes;
    uint64_t n_req = (bytes + p->request_bytes - 1) / p->request_bytes;
    p->n_slots = n_req < (uint64_t)opts.queue_depth ? (int)n_req : opts.queue_depth;
    size_t buf_bytes = 0;
    if (mn_mul_size((size_t)p->n_slots, (size_t)p->request_bytes, &buf_bytes) != 0) /* at most 1024 GiB: 64-bit */
        return mn_err_set(err, MN_ENOMEM, "probe buffers: size overflow");
    p->bufs = mn_huge_alloc(buf_bytes, &p->bufs_cap);
    p->reqs = mn_calloc((size_t)p->n_slots, sizeof *p->reqs);
    if (p->bufs == NULL || p->reqs == NULL) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory for %d probe buffers of %" PRIu64 " bytes", p->n_slots,
                        p->request_bytes);
        goto fail;
    }
    diskprobe_fill(p->bufs, buf_bytes);
    rc = aio_new(opts.backend, opts.queue_depth, &p->aio);
    if (rc != MN_OK) {
        rc = mn_err_set(err, rc, "cannot set up aio (%s backend): %s", aio_backend_name(opts.backend),
                        mn_strerror(rc));
        goto fail;
    }
    if (opts.aio_hook_fn) opts.aio_hook_fn(p->aio, opts.aio_hook_ctx);

    /* a unique name, then the file reopened through aio (O_DIRECT) */
    char path[sizeof p->path];
    if (snprintf(path, sizeof path, "%s/.mnemo-disk-probe-XXXXXX", dir) >= (int)sizeof path) {
        rc = mn_err_set(err, MN_EINVAL, "%s: path too long", dir);
        goto fail;
    }
    int fd = mkstemp(path);
    if (fd < 0) {
        int e = errno;
        rc = aio_errno_to_mn(e);
        if (rc == MN_EFULL) {
            diskprobe_io_error(err, rc, dir, "creating the file", bytes);
        } else {
            if (rc != MN_ENOTFOUND) rc = MN_EIO;
            mn_err_set(err, rc, "%s: cannot create a file: %s", dir, strerror(e));
        }
        goto fail;
    }
    close(fd);
    memcpy(p->path, path, sizeof path); /* from now on probe_close removes it */
    rc = aio_open(p->aio, p->path, AIO_OPEN_TRUNC, &p->file);
    if (rc != MN_OK) {
        diskprobe_io_error(err, rc, dir, "opening the probe file", bytes);
        goto fail;
    }
    rc = aio_fallocate(p->aio, &p->file, 0, bytes);
    if (rc != MN_OK) {
        diskprobe_io_error(err, rc, dir, "reserving the probe file", bytes);
        goto fail;
    }
    double t0 = mn_now();
    rc = run_pass(p, AIO_OP_WRITE, 0, bytes);
    if (rc == MN_OK) rc = aio_fdatasync(p->aio, &p->file);
    *write_s = mn_now() - t0;
    if (rc != MN_OK) {
        diskprobe_io_error(err, rc, dir, "writing the probe file", bytes);
        goto fail;
    }
    if (!p->file.is_direct) /* buffered: read from the device, not the page cache */
        posix_fadvise(p->file.fd, 0, (off_t)bytes, POSIX_FADV_DONTNEED);
    return MN_OK;

fail:
    probe_close(p);
    return rc;
}

/* Read [from, to) of the probe's file once: *read_s its time. */
static int probe_read(Probe *p, const char *dir, uint64_t from, uint64_t to, double *read_s, MnErr *err) {
    double t0 = mn_now();
    int rc = run_pass(p, AIO_OP_READ, from, to);
    *read_s = mn_now() - t0;
    if (rc == MN_EFORMAT)
        return mn_err_set(err, rc, "%s: the probe file read back wrong at offset %" PRIu64 " (short read or bad data)",
                          dir, p->bad_offset);
    if (rc != MN_OK) return diskprobe_io_error(err, rc, dir, "reading the probe file", p->bytes);
    return MN_OK;
}

static double mbps(uint64_t bytes, double s) { return s > 0 ? (double)bytes / s / 1e6 : 0; }

static double huge_share(const Probe *p) {
    long long huge = mn_huge_bytes(p->bufs, p->bufs_cap);
    return huge < 0 ? -1 : (double)huge / (double)p->bufs_cap;
}

int diskprobe_run_opts(const char *dir, uint64_t bytes, const DiskProbeOpts *o, DiskProbeResult *out, MnErr *err) {
    memset(out, 0, sizeof *out);
    Probe p;
    double write_s = 0, read_s = 0;
    int rc = probe_open(&p, dir, bytes, o, &write_s, err);
    if (rc != MN_OK) return rc;
    rc = probe_read(&p, dir, 0, bytes, &read_s, err);
    if (rc == MN_OK) {
        out->bytes = bytes;
        out->write_s = write_s;
        out->read_s = read_s;
        out->write_mbps = mbps(bytes, write_s);
        out->read_mbps = mbps(bytes, read_s);
        out->backend = aio_backend(p.aio);
        out->is_direct = p.file.is_direct;
        out->huge_share = huge_share(&p);
    }
    probe_close(&p);
    return rc;
}

int diskprobe_sample(const char *dir, uint64_t bytes, uint64_t sample_bytes, const DiskProbeOpts *o,
                     DiskSampleFn next, void *ctx, DiskProbeResult *out, MnErr *err) {
    memset(out, 0, sizeof *out);
    if (sample_bytes == 0 || sample_bytes % AIO_ALIGN != 0 || sample_bytes > bytes)
        return mn_err_set(err, MN_EINVAL, "sample size %" PRIu64 " is not a positive multiple of %u bytes up to %"
                          PRIu64, sample_bytes, AIO_ALIGN, bytes);
    Probe p;
    double write_s = 0;
    int rc = probe_open(&p, dir, bytes, o, &write_s, err);
    if (rc != MN_OK) return rc;
    out->bytes = bytes;
    out->write_s = write_s;
    out->write_mbps = mbps(bytes, write_s);
    out->backend = aio_backend(p.aio);
    out->is_direct = p.file.is_direct;
    out->huge_share = huge_share(&p);
    uint64_t n_places = bytes / sample_bytes;
    double last = -1;
    for (uint64_t k = 0; rc == MN_OK && next(ctx, last); k++) {
        uint64_t from = k % n_places * sample_bytes;
        double read_s = 0;
        rc = probe_read(&p, dir, from, from + sample_bytes, &read_s, err);
        last = mbps(sample_bytes, read_s);
        out->read_s += read_s;
    }
    probe_close(&p);
    if (rc != MN_OK) memset(out, 0, sizeof *out);
    return rc;
}
