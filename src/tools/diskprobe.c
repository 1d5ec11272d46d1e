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

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/cli.h"
#include "base/clock.h"
#include "base/hash.h"
#include "base/mem.h"
#include "cache/kv_pool.h"

#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define STAMP_MAGIC 0x6d6e656d6f70726full /* "mnemopro" */

/* ---- types ------------------------------------------------------------------ */

typedef struct Probe {
    Aio *aio;
    AioFile file;
    uint8_t *bufs;        /* (n_slots, request_bytes) from aio_buf_new */
    size_t bufs_cap;
    AioReq *reqs;         /* (n_slots) reqs[i] always uses buffer i */
    int n_slots;
    uint64_t request_bytes;
    uint64_t bytes;       /* file size */
    uint64_t end;         /* the current pass's end (run_pass) */
    uint64_t bad_offset;  /* a read whose stamp was wrong: the page's offset */
    char path[4096];      /* the file, once made ("" before) */
} Probe;

/* ---- stamps ---------------------------------------------------------------------- */

static void fill_pattern(uint8_t *p, uint64_t n) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i + 8 <= n; i += 8) { /* xorshift64: incompressible, cheap */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

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

static int fail_io(MnErr *err, int rc, const char *dir, const char *what, uint64_t bytes) {
    if (rc == MN_EFULL)
        return mn_err_set(err, rc, "%s: no space left for a %g MiB probe file (%s)", dir, (double)bytes / 1048576.0,
                          what);
    return mn_err_set(err, rc, "%s: %s failed: %s", dir, what, mn_strerror(rc));
}

static int check_dir(const char *dir, MnErr *err) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return mn_err_set(err, errno == ENOENT ? MN_ENOTFOUND : MN_EIO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return mn_err_set(err, MN_EINVAL, "%s: not a directory", dir);
    return MN_OK;
}

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
    aio_buf_free(p->bufs, p->bufs_cap);
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
    int rc = check_dir(dir, err);
    if (rc != MN_OK) return rc;

    p->request_bytes = opts.request_bytes;
    p->bytes = bytes;
    uint64_t n_req = (bytes + p->request_bytes - 1) / p->request_bytes;
    p->n_slots = n_req < (uint64_t)opts.queue_depth ? (int)n_req : opts.queue_depth;
    size_t buf_bytes = 0;
    if (mn_mul_size((size_t)p->n_slots, (size_t)p->request_bytes, &buf_bytes) != 0) /* at most 1024 GiB: 64-bit */
        return mn_err_set(err, MN_ENOMEM, "probe buffers: size overflow");
    p->bufs = aio_buf_new(buf_bytes, &p->bufs_cap);
    p->reqs = mn_calloc((size_t)p->n_slots, sizeof *p->reqs);
    if (p->bufs == NULL || p->reqs == NULL) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory for %d probe buffers of %" PRIu64 " bytes", p->n_slots,
                        p->request_bytes);
        goto fail;
    }
    fill_pattern(p->bufs, buf_bytes);
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
            fail_io(err, rc, dir, "creating the file", bytes);
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
        fail_io(err, rc, dir, "opening the probe file", bytes);
        goto fail;
    }
    rc = aio_fallocate(p->aio, &p->file, 0, bytes);
    if (rc != MN_OK) {
        fail_io(err, rc, dir, "reserving the probe file", bytes);
        goto fail;
    }
    double t0 = mn_now();
    rc = run_pass(p, AIO_OP_WRITE, 0, bytes);
    if (rc == MN_OK) rc = aio_fdatasync(p->aio, &p->file);
    *write_s = mn_now() - t0;
    if (rc != MN_OK) {
        fail_io(err, rc, dir, "writing the probe file", bytes);
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
    if (rc != MN_OK) return fail_io(err, rc, dir, "reading the probe file", p->bytes);
    return MN_OK;
}

static double mbps(uint64_t bytes, double s) { return s > 0 ? (double)bytes / s / 1e6 : 0; }

static double huge_share(const Probe *p) {
    long long huge = aio_buf_huge_bytes(p->bufs, p->bufs_cap);
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

/* ---- the disk tier's restore path ------------------------------------------------------ */

/* The 1.1B model's KV shape (scripts/bench): 22 layers, 4 KV heads of 64,
 * blocks of 32 tokens in f16. */
#define RESTORE_N_LAYER 22
#define RESTORE_KV_DIM 256
#define RESTORE_BLOCK_TOKENS 32

/* Block i of run r: a hash no two blocks share. */
static Hash128 restore_hash(uint64_t run, int i) {
    uint64_t key[2] = {run, (uint64_t)i};
    return hash128(key, sizeof key);
}

/* Remove the tier's scratch directory: its slab files, then itself. */
static void remove_scratch(const char *path) {
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *de;
        char file[4096 + 256];
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.') continue;
            snprintf(file, sizeof file, "%s/%s", path, de->d_name);
            unlink(file);
        }
        closedir(d);
    }
    rmdir(path);
}

/* Put n_runs runs of run_blocks blocks (from pool slots 0..run_blocks). */
static int restore_fill(Tier *t, KvPool *pool, int n_runs, int run_blocks, Hash128 *hashes, int32_t *slots) {
    for (int r = 0; r < n_runs; r++) {
        for (int i = 0; i < run_blocks; i++) {
            hashes[i] = restore_hash((uint64_t)r, i);
            slots[i] = i;
        }
        TierRunInfo info = {.pos = 0};
        int rc = tier_put_run(t, hashes, run_blocks, pool, slots, &info);
        if (rc != MN_OK) return rc;
    }
    return MN_OK;
}

static int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

/* Read the runs back rpr at a time, the groups in a scattered order (a
 * stride prime to their count), into pool slots 0..rpr*run_blocks. */
static int restore_read(Tier *t, KvPool *pool, int n_runs, int run_blocks, int rpr, Hash128 *hashes,
                        int32_t *slots, int *n_restores) {
    int n_groups = n_runs / rpr, stride = 1;
    for (int c = 7; c < n_groups; c++)
        if (gcd(c, n_groups) == 1) {
            stride = c;
            break;
        }
    for (int k = 0; k < n_groups; k++) {
        int g = (int)(((int64_t)k * stride) % n_groups), n = 0;
        for (int r = g * rpr; r < (g + 1) * rpr; r++)
            for (int i = 0; i < run_blocks; i++, n++) {
                hashes[n] = restore_hash((uint64_t)r, i);
                slots[n] = n;
            }
        int rc = tier_read_layers(t, hashes, n, pool, slots, NULL, NULL);
        if (rc != MN_OK) return rc;
        (*n_restores)++;
    }
    return MN_OK;
}

int diskprobe_restore(const char *dir, uint64_t bytes, const DiskRestoreOpts *o, DiskRestoreResult *out,
                      MnErr *err) {
    memset(out, 0, sizeof *out);
    DiskRestoreOpts opts = o ? *o : (DiskRestoreOpts){0};
    int run_blocks = opts.run_blocks > 0 ? opts.run_blocks : 5;
    int rpr = opts.runs_per_restore > 0 ? opts.runs_per_restore : 2;
    if (run_blocks > 4096 || rpr > 64)
        return mn_err_set(err, MN_EINVAL, "runs of %d blocks, %d per restore: too many", run_blocks, rpr);
    int rc = check_dir(dir, err);
    if (rc != MN_OK) return rc;
    KvPool pool;
    rc = kvpool_init(&pool, RESTORE_N_LAYER, RESTORE_KV_DIM, RESTORE_BLOCK_TOKENS, run_blocks * rpr, MN_TYPE_F16);
    if (rc != MN_OK) return mn_err_set(err, rc, "the restore probe's pool: %s", mn_strerror(rc));
    uint64_t run_bytes = (uint64_t)run_blocks * pool.block_bytes * RESTORE_N_LAYER;
    uint64_t n_runs = bytes / run_bytes / (uint64_t)rpr * (uint64_t)rpr;
    uint64_t stored = n_runs * (run_bytes + (uint64_t)AIO_ALIGN * RESTORE_N_LAYER);
    Hash128 *hashes = mn_malloc((size_t)(run_blocks * rpr) * sizeof *hashes);
    int32_t *slots = mn_malloc((size_t)(run_blocks * rpr) * sizeof *slots);
    char path[4096];
    bool has_dir = false;
    Tier *t = NULL;
    if (n_runs == 0 || n_runs > (1u << 20)) {
        rc = mn_err_set(err, MN_EINVAL, "%" PRIu64 " bytes hold no whole restore of %d runs of %" PRIu64 " bytes",
                        bytes, rpr, run_bytes);
        goto done;
    }
    if (hashes == NULL || slots == NULL) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory for the restore probe");
        goto done;
    }
    for (int l = 0; l < RESTORE_N_LAYER; l++) /* incompressible, like KV */
        fill_pattern(kvpool_k(&pool, l, 0), (uint64_t)pool.n_blocks * pool.block_bytes);
    if (snprintf(path, sizeof path, "%s/.mnemo-restore-probe-XXXXXX", dir) >= (int)sizeof path) {
        rc = mn_err_set(err, MN_EINVAL, "%s: path too long", dir);
        goto done;
    }
    if (mkdtemp(path) == NULL) {
        rc = mn_err_set(err, aio_errno_to_mn(errno), "%s: cannot make a scratch directory: %s", dir, strerror(errno));
        goto done;
    }
    has_dir = true;
    TierDiskConfig cfg = {.dir = path,
                          /* room for every run with its padding, and
                             for what the slabs' ends waste: none goes */
                          .capacity_bytes = stored + stored / 16 + (8u << 20),
                          .n_layer = RESTORE_N_LAYER,
                          .block_bytes = pool.block_bytes,
                          .aio_backend = AIO_BACKEND_AUTO};
    rc = tier_disk_new(&cfg, &t, err);
    if (rc != MN_OK) goto done;
    if (opts.tier_hook_fn) opts.tier_hook_fn(t, opts.tier_hook_ctx);
    rc = restore_fill(t, &pool, (int)n_runs, run_blocks, hashes, slots);
    if (rc != MN_OK) {
        rc = fail_io(err, rc, dir, "storing the probe's runs", bytes);
        goto done;
    }
    TierStats before, after;
    tier_stats(t, &before);
    rc = restore_read(t, &pool, (int)n_runs, run_blocks, rpr, hashes, slots, &out->n_restores);
    if (rc != MN_OK) {
        rc = fail_io(err, rc == MN_ECHECKSUM ? MN_EIO : rc, dir, "restoring the probe's runs", bytes);
        out->n_restores = 0;
        goto done;
    }
    tier_stats(t, &after);
    out->bytes = after.bytes_read - before.bytes_read;
    out->read_s = after.read_seconds - before.read_seconds;
    out->restore_mbps = mbps(out->bytes, out->read_s);

done:
    tier_free(t);
    if (has_dir) remove_scratch(path);
    mn_free(hashes);
    mn_free(slots);
    kvpool_deinit(&pool);
    return rc;
}

/* ---- the command ----------------------------------------------------------------------- */

/* --sample-ms: the reads' rates, each printed as it comes; between reads
 * the wait is a sigtimedwait for SIGTERM or SIGINT (blocked meanwhile), so
 * a signal ends the sampling at once and the file is still removed. */
typedef struct Sampling {
    sigset_t stop;
    struct timespec every;
    int max;       /* reads to take; 0: until a signal */
    double *rates; /* (cap) */
    int n, cap;
    bool is_short; /* ran out of memory for the rates */
} Sampling;

static bool sampling_next(void *ctx, double last) {
    Sampling *s = ctx;
    if (last >= 0) {
        if (s->n == s->cap) {
            int cap = s->cap ? 2 * s->cap : 256;
            double *grown = mn_realloc(s->rates, (size_t)cap * sizeof *grown);
            if (grown == NULL) {
                s->is_short = true;
                return false;
            }
            s->rates = grown;
            s->cap = cap;
        }
        s->rates[s->n++] = last;
        printf("sample_read_mbps=%.1f\n", last);
        fflush(stdout);
    }
    if (s->max > 0 && s->n >= s->max) return false;
    return sigtimedwait(&s->stop, NULL, &s->every) < 0; /* a timeout (or another signal): go on */
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int sample_main(const char *dir, uint64_t mb, uint64_t sample_mb, int every_ms, int max,
                       const DiskProbeOpts *o) {
    Sampling s = {.every = {every_ms / 1000, (long)(every_ms % 1000) * 1000000L}, .max = max};
    sigset_t old;
    sigemptyset(&s.stop);
    sigaddset(&s.stop, SIGTERM);
    sigaddset(&s.stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &s.stop, &old);
    DiskProbeResult res;
    MnErr err = {0};
    int rc = diskprobe_sample(dir, mb << 20, sample_mb << 20, o, sampling_next, &s, &res, &err);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == MN_OK && s.is_short) rc = mn_err_set(&err, MN_ENOMEM, "out of memory for the samples");
    if (rc != MN_OK) {
        fprintf(stderr, "mnemo disk-probe: %s\n", err.msg);
        mn_free(s.rates);
        return 1;
    }
    double median = 0, q1 = 0, q3 = 0;
    if (s.n > 0) {
        qsort(s.rates, (size_t)s.n, sizeof *s.rates, cmp_double);
        median = s.n % 2 ? s.rates[s.n / 2] : (s.rates[s.n / 2 - 1] + s.rates[s.n / 2]) / 2;
        q1 = s.rates[(s.n - 1) / 4];
        q3 = s.rates[3 * (s.n - 1) / 4];
        printf("disk-probe %s: %d reads of %" PRIu64 " MiB, one every %d ms: median %.1f MB/s (%.1f to %.1f); "
               "write %.1f MB/s (%" PRIu64 " MiB, %s)\n",
               dir, s.n, sample_mb, every_ms, median, s.rates[0], s.rates[s.n - 1], res.write_mbps, mb,
               aio_backend_name(res.backend));
    }
    printf("samples=%d median_read_mbps=%.1f q1_read_mbps=%.1f q3_read_mbps=%.1f\n", s.n, median, q1, q3);
    mn_free(s.rates);
    return 0;
}

/* ---- memory traffic beside a probe ---------------------------------------------------- */

typedef struct LoadThread {
    pthread_t th;
    int stop_fd;     /* the pipe's read end: readable (closed) = stop */
    uint8_t *a, *b;  /* DISKPROBE_LOAD_BYTES each */
    uint64_t copied; /* written by the thread, read after the join */
} LoadThread;

struct MemLoad {
    int n;
    int stop_pipe[2];
    double t0;
    LoadThread *threads;
};

static bool told_to_stop(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) != 0;
}

static void *load_main(void *arg) {
    LoadThread *t = arg;
    while (!told_to_stop(t->stop_fd)) {
        memcpy(t->b, t->a, DISKPROBE_LOAD_BYTES);
        memcpy(t->a, t->b, DISKPROBE_LOAD_BYTES);
        t->copied += 2ull * DISKPROBE_LOAD_BYTES;
    }
    return NULL;
}

/* Join the n_started threads, free everything; bytes copied per second. */
static double load_end(MemLoad *l, int n_started) {
    if (l->stop_pipe[1] >= 0) close(l->stop_pipe[1]);
    uint64_t copied = 0;
    for (int i = 0; i < n_started; i++) {
        pthread_join(l->threads[i].th, NULL);
        copied += l->threads[i].copied;
    }
    double dt = mn_now() - l->t0;
    for (int i = 0; i < l->n; i++) {
        mn_free_aligned(l->threads[i].a);
        mn_free_aligned(l->threads[i].b);
    }
    if (l->stop_pipe[0] >= 0) close(l->stop_pipe[0]);
    mn_free(l->threads);
    mn_free(l);
    return dt > 0 ? (double)copied / dt : 0.0;
}

int diskprobe_load_start(int n_threads, MemLoad **out, MnErr *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > DISKPROBE_LOAD_MAX)
        return mn_err_set(err, MN_EINVAL, "a memory load of %d threads (1..%d)", n_threads, DISKPROBE_LOAD_MAX);
    MemLoad *l = mn_calloc(1, sizeof *l);
    if (l == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory for the memory load");
    l->stop_pipe[0] = l->stop_pipe[1] = -1;
    l->threads = mn_calloc((size_t)n_threads, sizeof *l->threads);
    bool ok = l->threads != NULL && pipe(l->stop_pipe) == 0;
    if (!ok) l->stop_pipe[0] = l->stop_pipe[1] = -1;
    l->n = ok ? n_threads : 0;
    for (int i = 0; ok && i < n_threads; i++) {
        LoadThread *t = &l->threads[i];
        t->stop_fd = l->stop_pipe[0];
        t->a = mn_alloc_aligned(DISKPROBE_LOAD_BYTES, 4096);
        t->b = mn_alloc_aligned(DISKPROBE_LOAD_BYTES, 4096);
        ok = t->a != NULL && t->b != NULL;
        if (ok) { /* touched now, so the load is copying, not faulting */
            memset(t->a, i + 1, DISKPROBE_LOAD_BYTES);
            memset(t->b, 0, DISKPROBE_LOAD_BYTES);
        }
    }
    l->t0 = mn_now();
    int n_started = 0;
    while (ok && n_started < n_threads) {
        ok = pthread_create(&l->threads[n_started].th, NULL, load_main, &l->threads[n_started]) == 0;
        if (ok) n_started++;
    }
    if (!ok) {
        load_end(l, n_started);
        return mn_err_set(err, MN_ENOMEM, "cannot start a memory load of %d threads", n_threads);
    }
    *out = l;
    return MN_OK;
}

double diskprobe_load_stop(MemLoad *l) { return l == NULL ? 0.0 : load_end(l, l->n); }

/* The probe (and with restore, the restore probe) of dir, printed: the
 * exit code. */
static int probe_main(const char *dir, uint64_t mb, const DiskProbeOpts *o, bool restore) {
    MnErr err = {0};
    DiskProbeResult res;
    if (diskprobe_run_opts(dir, mb << 20, o, &res, &err) != MN_OK) {
        fprintf(stderr, "mnemo disk-probe: %s\n", err.msg);
        return 1;
    }
    char huge[48] = "";
    if (res.huge_share >= 0) snprintf(huge, sizeof huge, ", buffers %.0f%% in huge pages", res.huge_share * 100);
    printf("disk-probe %s: write %.1f MB/s, read %.1f MB/s (%" PRIu64 " MiB, %s%s%s)\n", dir, res.write_mbps,
           res.read_mbps, mb, aio_backend_name(res.backend), res.is_direct ? "" : ", buffered: O_DIRECT refused", huge);
    printf("read_mbps=%.1f write_mbps=%.1f\n", res.read_mbps, res.write_mbps);
    if (!restore) return 0;
    DiskRestoreResult rr;
    if (diskprobe_restore(dir, mb << 20, NULL, &rr, &err) != MN_OK) {
        fprintf(stderr, "mnemo disk-probe: %s\n", err.msg);
        return 1;
    }
    printf("disk-probe %s: the disk tier restores at %.1f MB/s, %.2f of the raw read (%d restores of 2 runs x 5 "
           "blocks, %.1f MB)\n",
           dir, rr.restore_mbps, res.read_mbps > 0 ? rr.restore_mbps / res.read_mbps : 0.0, rr.n_restores,
           (double)rr.bytes / 1e6);
    printf("restore_mbps=%.1f\n", rr.restore_mbps);
    return 0;
}

int diskprobe_main(int argc, char **argv) {
    uint64_t mb = 512, request_kb = DISKPROBE_REQUEST_BYTES / 1024;
    int queue_depth = DISKPROBE_QUEUE_DEPTH;
    uint64_t sample_mb = 8;
    int sample_ms = 0, samples = 0;
    bool restore = false;
    int memory_load = 0;
    CliOpt opts[] = {
        {"mb", 0, CLI_U64, &mb, "N", "size of the probe file in MiB (default 512)"},
        {"request-kb", 0, CLI_U64, &request_kb, "KB", "bytes per request in KiB, a multiple of 4 (default 1024)"},
        {"queue-depth", 0, CLI_INT, &queue_depth, "N", "requests in flight (default 32, as the disk tier)"},
        {"restore", 0, CLI_FLAG, &restore, NULL,
         "also time the disk tier's own restores of --mb MiB (2 runs of 5 blocks of the 1.1B model each)"},
        {"sample-ms", 0, CLI_INT, &sample_ms, "MS",
         "instead: read --sample-mb of the file every MS ms, each read timed, until SIGTERM or SIGINT"},
        {"sample-mb", 0, CLI_U64, &sample_mb, "N", "MiB per sampled read (default 8)"},
        {"samples", 0, CLI_INT, &samples, "N", "stop sampling after N reads (default 0: at a signal only)"},
        {"memory-load", 0, CLI_INT, &memory_load, "N",
         "probe while N threads copy memory, as a server's compute does (default 0: none)"},
    };
    const char *synopsis = "mnemo disk-probe DIR [--mb N] [--request-kb KB] [--queue-depth N] [--restore] "
                           "[--memory-load N]\n"
                           "       mnemo disk-probe DIR --sample-ms MS [--sample-mb N] [--samples N] [--mb N] ...";
    const char *pos[1];
    int n_pos = 0;
    MnErr err = {0};
    int rc = cli_parse(argc, argv, opts, N_OPTS(opts), pos, 1, &n_pos, &err);
    if (rc == MN_ECANCELED) {
        cli_usage(stdout, synopsis, opts, N_OPTS(opts));
        return 0;
    }
    if (rc == MN_OK && n_pos != 1) rc = mn_err_set(&err, MN_EINVAL, "needs one DIR argument");
    if (rc == MN_OK && (mb < 1 || mb > (1u << 20))) rc = mn_err_set(&err, MN_EINVAL, "--mb must be in 1..1048576");
    if (rc == MN_OK && (request_kb < 4 || request_kb % 4 != 0 || request_kb > (1u << 20)))
        rc = mn_err_set(&err, MN_EINVAL, "--request-kb must be a multiple of 4 in 4..1048576");
    if (rc == MN_OK && (queue_depth < 1 || queue_depth > 1024))
        rc = mn_err_set(&err, MN_EINVAL, "--queue-depth must be in 1..1024");
    if (rc == MN_OK && (sample_ms < 0 || sample_ms > 3600000))
        rc = mn_err_set(&err, MN_EINVAL, "--sample-ms must be in 0..3600000");
    if (rc == MN_OK && sample_ms > 0 && (sample_mb < 1 || sample_mb > mb))
        rc = mn_err_set(&err, MN_EINVAL, "--sample-mb must be in 1..--mb");
    if (rc == MN_OK && samples < 0) rc = mn_err_set(&err, MN_EINVAL, "--samples must be 0 or more");
    if (rc == MN_OK && sample_ms > 0 && restore) rc = mn_err_set(&err, MN_EINVAL, "--restore does not sample");
    if (rc == MN_OK && (memory_load < 0 || memory_load > DISKPROBE_LOAD_MAX))
        rc = mn_err_set(&err, MN_EINVAL, "--memory-load must be in 0..%d", DISKPROBE_LOAD_MAX);
    if (rc == MN_OK && sample_ms > 0 && memory_load > 0)
        rc = mn_err_set(&err, MN_EINVAL, "--memory-load does not sample");
    if (rc != MN_OK) {
        cli_error(stderr, synopsis, err.msg);
        return 2;
    }
    DiskProbeOpts o = {.request_bytes = request_kb * 1024, .queue_depth = queue_depth};
    if (sample_ms > 0) return sample_main(pos[0], mb, sample_mb, sample_ms, samples, &o);
    MemLoad *load = NULL;
    if (memory_load > 0 && diskprobe_load_start(memory_load, &load, &err) != MN_OK) {
        fprintf(stderr, "mnemo disk-probe: %s\n", err.msg);
        return 1;
    }
    int code = probe_main(pos[0], mb, &o, restore);
    double copied = diskprobe_load_stop(load);
    if (memory_load > 0) {
        printf("disk-probe %s: all of the above while %d threads copied memory at %.1f GB/s\n", pos[0], memory_load,
               copied / 1e9);
        printf("memory_load_threads=%d memory_load_gbps=%.1f\n", memory_load, copied / 1e9);
    }
    return code;
}

