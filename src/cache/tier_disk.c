/* tier_disk.c — the disk tier: runs in preallocated slab files under a
 * directory, moved with aio (io_uring, O_DIRECT) and checksummed per layer.
 *
 * The tier below RAM (--disk-tier DIR --disk-tier-mb N). The core (tier.c)
 * decides what is stored and evicted; this file keeps the bytes. Data lives
 * in a few large slab files whose data areas are handed out in 4 KiB pages
 * (first fit, freed extents coalesce); each run takes one contiguous region
 * of a slab, laid out [layer][block], so one layer of a run is one
 * contiguous 4 KiB-aligned extent with its own checksum. Headers — what
 * each run is, where, and its checksums — are kept apart from the data (in
 * memory in this version; rows of the SQLite index later), so a data file
 * holds nothing but slab headers and extents.
 *
 * Owner: the mover thread, through the core; nothing locks. The Aio, the
 * staging buffer and the request array are this tier's and used by one
 * call at a time.
 *
 * ON-DISK FORMAT, version 1. All integers little-endian.
 *
 * Directory DIR:
 *     slab-NNNNN.dat   data slab N (5 decimal digits, from 00000)
 *     (later)          the SQLite database holding the run records below
 *
 * Slab file = a 4096-byte slab header, then a data area of D bytes (D a
 * multiple of 4096); file size 4096 + D, reserved with fallocate when the
 * slab is created.
 *     offset size  slab header field
 *          0    8  magic "MNEMOSLB"
 *          8    4  format version, 1
 *         12    4  slab id N (as in the file name)
 *         16    8  D, data area bytes
 *         24   16  model fingerprint (Hash128 canonical bytes)
 *         40    4  KV format id (index_kv_format)
 *         44    4  n_layer
 *         48    8  block_bytes (bytes of one block in one layer, K then V)
 *         56    8  XXH3-64, seed 0, of bytes [0, 56)
 *         64 4032  zero
 *
 * A run of n blocks, with run id R, at file offset O of slab N (O a
 * multiple of 4096, inside the data area) occupies n_layer * S bytes, where
 * S = round_up(n * block_bytes, 4096) is the layer stride:
 *     layer l extent   [O + l*S, O + (l+1)*S)
 *     block i of it    at O + l*S + i*block_bytes, block_bytes bytes, the
 *                      bytes of pool arena l's slot (kvpool_k) verbatim
 *     padding          [n*block_bytes, S) of each extent, zero
 *     checksum of l    XXH3-64 over the S bytes of the extent, seed
 *                      (R << 16) | l. The seed binds an extent to its run
 *                      and layer: stale bytes of an earlier run on the
 *                      same pages, or the wrong layer, fail the check.
 *
 * Run record (the header of a run; kept in memory in this version, the
 * row of the SQLite index later):
 *     offset size  field
 *          0    8  magic "MNEMORUN"
 *          8    4  format version, 1
 *         12    4  n, blocks in the run (>= 1)
 *         16    8  run id R (< 2^48, unique in the directory)
 *         24    4  slab id N
 *         28    4  n_layer (<= 65536)
 *         32    8  O, file offset of layer 0's extent
 *         40    8  S, layer stride
 *         48    8  block_bytes
 *         56    4  KV format id
 *         60    4  zero
 *         64   16  model fingerprint
 *         80 16*n  block hashes in run order (canonical bytes)
 *     80+16n 8*n_layer  layer checksums, layer 0 first
 *        end    8  XXH3-64, seed 0, of all the record's earlier bytes
 *
 * Validity: a slab is usable when its header's magic, version, checksum,
 * fingerprint, KV format, n_layer and block_bytes match the tier and D
 * matches the file size. A run record is valid when its magic, version and
 * checksum match, its fingerprint, KV format, n_layer and block_bytes are
 * the tier's, S == round_up(n * block_bytes, 4096), and [O, O + n_layer*S)
 * lies inside its slab's data area. A layer of a valid run is used only
 * when its extent's checksum matches; otherwise the whole run is dropped.
 * A record is made visible only after its extents are durable (written,
 * then fdatasync when is_durable). Another format version is refused.
 *
 * What this version does: writes slab headers and extents exactly as
 * above and keeps run records in memory (struct DiskRun plus the core's
 * TierRun carry every record field). It does not reopen earlier data: a
 * slab file is recreated (truncated) when first needed, so nothing
 * survives a restart until the SQLite index stores the records.
 *
 * Errors: ENOSPC (from fallocate or a write) -> MN_EFULL, the run is not
 * stored and the tier keeps working; any other I/O failure -> MN_EIO,
 * which the core makes sticky; a short read (a truncated file) counts as
 * a checksum failure.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/tier_impl.h"

/* ---- types --------------------------------------------------------------- */

#define DISK_FORMAT_VERSION 1u
#define DISK_PAGE 4096u
#define DISK_SLAB_HEADER 4096u
#define DISK_DEFAULT_SLAB (256ull << 20)
#define DISK_MAX_SLABS 4096
#define DISK_CHUNK (1u << 20) /* bytes per aio request: several in flight */

typedef struct FreeExt {
    uint64_t off, len; /* file offsets, multiples of DISK_PAGE */
} FreeExt;

typedef struct Slab {
    AioFile file;       /* fd -1 until created */
    uint64_t data_bytes;
    FreeExt *free;      /* (cap_free) sorted by off, disjoint, never adjacent */
    int n_free, cap_free;
    int n_runs;         /* n_free <= n_runs + 1 always (runs separate holes) */
    uint64_t free_bytes;
} Slab;

typedef struct DiskRun {
    int slab;
    uint64_t offset;      /* O: file offset of layer 0's extent */
    uint64_t stride;      /* S */
    uint64_t checksums[]; /* (n_layer) */
} DiskRun;

typedef struct DiskTier {
    char *dir;
    int n_layer;
    size_t block_bytes;
    Hash128 fingerprint;
    uint32_t kv_format;
    bool is_durable;
    AioBackend backend;
    int queue_depth;
    Aio *aio;
    uint64_t capacity_bytes;
    uint64_t slab_bytes;  /* data bytes of every slab but perhaps the last */
    int max_slabs;
    Slab *slabs;          /* (max_slabs); the first n_slabs exist */
    int n_slabs;
    uint8_t *staging;     /* (staging_bytes) DISK_PAGE aligned */
    size_t staging_bytes;
    AioReq *reqs;         /* (reqs_cap) */
    int reqs_cap;
} DiskTier;

/* ---- helpers: bytes, buffers --------------------------------------------- */

static uint64_t round_page(uint64_t n) { return (n + DISK_PAGE - 1) & ~(uint64_t)(DISK_PAGE - 1); }

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t layer_seed(uint64_t run_id, int layer) { return (run_id << 16) | (uint64_t)layer; }

static int staging_reserve(DiskTier *d, uint64_t n) {
    if (n <= d->staging_bytes) return MN_OK;
    if (n > SIZE_MAX / 2) return MN_ENOMEM;
    size_t cap = d->staging_bytes ? d->staging_bytes : (size_t)DISK_CHUNK;
    while (cap < n) cap *= 2;
    uint8_t *b = mn_alloc_aligned(cap, DISK_PAGE);
    if (b == NULL) return MN_ENOMEM;
    mn_free_aligned(d->staging);
    d->staging = b;
    d->staging_bytes = cap;
    return MN_OK;
}

/* Run [buf, buf+len) <-> [offset, offset+len) of file as DISK_CHUNK-sized
 * requests in flight together. */
static int transfer(DiskTier *d, unsigned op, const AioFile *file, uint8_t *buf, uint64_t offset, uint64_t len) {
    uint64_t n64 = (len + DISK_CHUNK - 1) / DISK_CHUNK;
    if (n64 > (uint64_t)INT32_MAX) return MN_ENOMEM;
    int n = (int)n64;
    if (n > d->reqs_cap) {
        AioReq *r = mn_realloc(d->reqs, (size_t)n * sizeof *r);
        if (r == NULL) return MN_ENOMEM;
        d->reqs = r;
        d->reqs_cap = n;
    }
    for (int i = 0; i < n; i++) {
        uint64_t at = (uint64_t)i * DISK_CHUNK;
        d->reqs[i] = (AioReq){.op = op,
                              .file = file,
                              .buf = buf + at,
                              .offset = offset + at,
                              .len = (size_t)(len - at < DISK_CHUNK ? len - at : DISK_CHUNK)};
    }
    return aio_run(d->aio, d->reqs, n);
}

/* Codes a medium failure may surface as, narrowed to what the core expects. */
static int medium_code(int rc) {
    if (rc == MN_OK || rc == MN_EFULL || rc == MN_ENOMEM) return rc;
    return MN_EIO;
}

/* ---- helpers: slab extents ------------------------------------------------ */

static bool ext_alloc(Slab *s, uint64_t len, uint64_t *off) {
    for (int i = 0; i < s->n_free; i++) {
        FreeExt *e = &s->free[i];
        if (e->len < len) continue;
        *off = e->off;
        e->off += len;
        e->len -= len;
        if (e->len == 0) {
            memmove(e, e + 1, (size_t)(s->n_free - i - 1) * sizeof *e);
            s->n_free--;
        }
        s->free_bytes -= len;
        return true;
    }
    return false;
}

/* Return [off, off+len) to the slab, merging with its neighbours. Never
 * allocates: cap_free >= n_runs + 1 is kept by reserve. */
static void ext_free(Slab *s, uint64_t off, uint64_t len) {
    int lo = 0, hi = s->n_free; /* first hole after off */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s->free[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    bool join_prev = lo > 0 && s->free[lo - 1].off + s->free[lo - 1].len == off;
    bool join_next = lo < s->n_free && off + len == s->free[lo].off;
    if (join_prev && join_next) {
        s->free[lo - 1].len += len + s->free[lo].len;
        memmove(&s->free[lo], &s->free[lo + 1], (size_t)(s->n_free - lo - 1) * sizeof *s->free);
        s->n_free--;
    } else if (join_prev) {
        s->free[lo - 1].len += len;
    } else if (join_next) {
        s->free[lo].off = off;
        s->free[lo].len += len;
    } else {
        if (s->n_free >= s->cap_free) { /* cannot happen: see Slab */
            fprintf(stderr, "tier_disk: free list overflow (%d holes, room %d)\n", s->n_free, s->cap_free);
            abort();
        }
        memmove(&s->free[lo + 1], &s->free[lo], (size_t)(s->n_free - lo) * sizeof *s->free);
        s->free[lo] = (FreeExt){off, len};
        s->n_free++;
    }
    s->free_bytes += len;
}

static void slab_path(const DiskTier *d, int id, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/slab-%05d.dat", d->dir, id);
}

static uint64_t slab_data_bytes(const DiskTier *d, int id) {
    uint64_t start = (uint64_t)id * d->slab_bytes;
    uint64_t left = d->capacity_bytes - start;
    return left < d->slab_bytes ? left : d->slab_bytes;
}

/* Create slab `id` (the next one): header, then the data area reserved.
 * On failure nothing is left behind. */
static int slab_create(DiskTier *d, int id) {
    Slab *s = &d->slabs[id];
    char path[4096];
    slab_path(d, id, path, sizeof path);
    uint64_t data_bytes = slab_data_bytes(d, id);
    int rc = staging_reserve(d, DISK_SLAB_HEADER);
    if (rc != MN_OK) return rc;
    FreeExt *fl = mn_calloc(4, sizeof *fl);
    if (fl == NULL) return MN_ENOMEM;
    rc = aio_open(d->aio, path, AIO_OPEN_CREATE | AIO_OPEN_TRUNC, &s->file);
    if (rc != MN_OK) {
        LOG_ERROR("disk tier: cannot create %s: %s", path, mn_strerror(rc));
        mn_free(fl);
        return medium_code(rc);
    }
    uint8_t *h = d->staging;
    memset(h, 0, DISK_SLAB_HEADER);
    memcpy(h, "MNEMOSLB", 8);
    put_u32(h + 8, DISK_FORMAT_VERSION);
    put_u32(h + 12, (uint32_t)id);
    put_u64(h + 16, data_bytes);
    memcpy(h + 24, d->fingerprint.b, 16);
    put_u32(h + 40, d->kv_format);
    put_u32(h + 44, (uint32_t)d->n_layer);
    put_u64(h + 48, (uint64_t)d->block_bytes);
    put_u64(h + 56, XXH3_64bits_withSeed(h, 56, 0));
    rc = transfer(d, AIO_OP_WRITE, &s->file, h, 0, DISK_SLAB_HEADER);
    if (rc == MN_OK) rc = aio_fallocate(d->aio, &s->file, DISK_SLAB_HEADER, data_bytes);
    if (rc != MN_OK) {
        if (rc == MN_EFULL) LOG_WARN("disk tier: no space for %s (%llu bytes)", path, (unsigned long long)data_bytes);
        else LOG_ERROR("disk tier: cannot set up %s: %s", path, mn_strerror(rc));
        aio_close(&s->file);
        unlink(path);
        mn_free(fl);
        return medium_code(rc);
    }
    s->data_bytes = data_bytes;
    s->free = fl;
    s->cap_free = 4;
    s->free[0] = (FreeExt){DISK_SLAB_HEADER, data_bytes};
    s->n_free = 1;
    s->n_runs = 0;
    s->free_bytes = data_bytes;
    d->n_slabs = id + 1;
    return MN_OK;
}

/* ---- kind operations ----------------------------------------------------- */

static uint64_t disk_run_bytes(void *kind, int n_blocks) {
    const DiskTier *d = kind;
    /* n_blocks * block_bytes is bounded by the pool's size: fits 64 bits */
    uint64_t bytes = (uint64_t)d->n_layer * round_page((uint64_t)n_blocks * d->block_bytes);
    return bytes <= d->slab_bytes ? bytes : UINT64_MAX;
}

static int disk_reserve(void *kind, TierRun *run) {
    DiskTier *d = kind;
    DiskRun *dr = mn_malloc(sizeof *dr + (size_t)d->n_layer * sizeof(uint64_t));
    if (dr == NULL) return MN_ENOMEM;
    dr->stride = round_page((uint64_t)run->n_blocks * d->block_bytes);
    int found = -1;
    for (int i = 0; i < d->n_slabs && found < 0; i++)
        if (d->slabs[i].free_bytes >= run->n_bytes && ext_alloc(&d->slabs[i], run->n_bytes, &dr->offset)) found = i;
    if (found < 0 && d->n_slabs < d->max_slabs && slab_data_bytes(d, d->n_slabs) >= run->n_bytes) {
        int rc = slab_create(d, d->n_slabs);
        if (rc != MN_OK) {
            mn_free(dr);
            return rc;
        }
        if (ext_alloc(&d->slabs[d->n_slabs - 1], run->n_bytes, &dr->offset)) found = d->n_slabs - 1;
    }
    if (found < 0) {
        mn_free(dr);
        return MN_EFULL;
    }
    Slab *s = &d->slabs[found];
    if (s->cap_free < s->n_runs + 2) { /* room for every hole ext_free may open */
        int cap = 2 * (s->n_runs + 2);
        FreeExt *fl = mn_realloc(s->free, (size_t)cap * sizeof *fl);
        if (fl == NULL) {
            ext_free(s, dr->offset, run->n_bytes);
            mn_free(dr);
            return MN_ENOMEM;
        }
        s->free = fl;
        s->cap_free = cap;
    }
    s->n_runs++;
    dr->slab = found;
    run->data = dr;
    return MN_OK;
}

static int disk_write(void *kind, TierRun *run, const KvPool *pool, const int32_t *slots, uint64_t *io_bytes) {
    DiskTier *d = kind;
    DiskRun *dr = run->data;
    int rc = staging_reserve(d, run->n_bytes);
    if (rc != MN_OK) return rc;
    size_t payload = (size_t)run->n_blocks * d->block_bytes;
    for (int l = 0; l < d->n_layer; l++) {
        uint8_t *ext = d->staging + (size_t)l * dr->stride;
        for (int i = 0; i < run->n_blocks; i++)
            memcpy(ext + (size_t)i * d->block_bytes, kvpool_k(pool, l, slots[i]), d->block_bytes);
        memset(ext + payload, 0, (size_t)dr->stride - payload);
        dr->checksums[l] = XXH3_64bits_withSeed(ext, (size_t)dr->stride, layer_seed(run->id, l));
    }
    const AioFile *f = &d->slabs[dr->slab].file;
    rc = transfer(d, AIO_OP_WRITE, f, d->staging, dr->offset, run->n_bytes);
    if (rc == MN_OK && d->is_durable) rc = aio_fdatasync(d->aio, f);
    if (rc != MN_OK) return medium_code(rc);
    *io_bytes = run->n_bytes;
    return MN_OK;
}

static int disk_read_layer(void *kind, TierRun *run, int layer, const int32_t *idx, const int32_t *slots, int n,
                           KvPool *pool, uint64_t *io_bytes) {
    DiskTier *d = kind;
    DiskRun *dr = run->data;
    int rc = staging_reserve(d, dr->stride);
    if (rc != MN_OK) return rc;
    rc = transfer(d, AIO_OP_READ, &d->slabs[dr->slab].file, d->staging, dr->offset + (uint64_t)layer * dr->stride,
                  dr->stride);
    if (rc == MN_EFORMAT) return MN_ECHECKSUM; /* the file is shorter than the extent */
    if (rc != MN_OK) return medium_code(rc);
    *io_bytes = dr->stride;
    if (XXH3_64bits_withSeed(d->staging, (size_t)dr->stride, layer_seed(run->id, layer)) != dr->checksums[layer])
        return MN_ECHECKSUM;
    for (int k = 0; k < n; k++)
        memcpy(kvpool_k(pool, layer, slots[k]), d->staging + (size_t)idx[k] * d->block_bytes, d->block_bytes);
    return MN_OK;
}

static void disk_release(void *kind, TierRun *run) {
    DiskTier *d = kind;
    DiskRun *dr = run->data;
    if (dr == NULL) return;
    Slab *s = &d->slabs[dr->slab];
    ext_free(s, dr->offset, run->n_bytes);
    s->n_runs--;
    mn_free(dr);
    run->data = NULL;
}

static void slabs_close(DiskTier *d, bool unlink_files) {
    for (int i = 0; i < d->n_slabs; i++) {
        aio_close(&d->slabs[i].file);
        mn_free(d->slabs[i].free);
        if (unlink_files) {
            char path[4096];
            slab_path(d, i, path, sizeof path);
            unlink(path);
        }
    }
    memset(d->slabs, 0, (size_t)d->max_slabs * sizeof *d->slabs);
    d->n_slabs = 0;
}

/* Start over: fresh slab files and a fresh Aio (a failed ring stays
 * failed). Every run was released by the core before. */
static int disk_reset(void *kind) {
    DiskTier *d = kind;
    slabs_close(d, true);
    aio_free(d->aio);
    d->aio = NULL;
    return aio_new(d->backend, d->queue_depth, &d->aio);
}

static void disk_check(const void *kind, uint64_t occupancy_bytes) {
    const DiskTier *d = kind;
    uint64_t used = 0;
    for (int i = 0; i < d->n_slabs; i++) {
        const Slab *s = &d->slabs[i];
        uint64_t free_sum = 0, end = DISK_SLAB_HEADER;
        bool ok = s->n_free <= s->n_runs + 1 && s->n_free <= s->cap_free;
        for (int k = 0; k < s->n_free && ok; k++) {
            const FreeExt *e = &s->free[k];
            ok = e->len > 0 && e->off % DISK_PAGE == 0 && e->len % DISK_PAGE == 0 &&
                 (k == 0 ? e->off >= end : e->off > end) && e->off + e->len <= DISK_SLAB_HEADER + s->data_bytes;
            end = e->off + e->len;
            free_sum += e->len;
        }
        if (!ok || free_sum != s->free_bytes) {
            fprintf(stderr, "tier_disk check: slab %d free list broken\n", i);
            abort();
        }
        used += s->data_bytes - s->free_bytes;
    }
    if (used != occupancy_bytes) {
        fprintf(stderr, "tier_disk check: slabs hold %llu bytes, runs %llu\n", (unsigned long long)used,
                (unsigned long long)occupancy_bytes);
        abort();
    }
}

static void disk_dump(const void *kind) {
    const DiskTier *d = kind;
    fprintf(stderr, "  disk %s (aio %s): %d of %d slabs of %llu bytes\n", d->dir,
            aio_backend_name(aio_backend(d->aio)), d->n_slabs, d->max_slabs, (unsigned long long)d->slab_bytes);
    for (int i = 0; i < d->n_slabs; i++) {
        const Slab *s = &d->slabs[i];
        fprintf(stderr, "  slab %d: %llu data bytes, %llu free in %d holes, %d runs%s\n", i,
                (unsigned long long)s->data_bytes, (unsigned long long)s->free_bytes, s->n_free, s->n_runs,
                s->file.is_direct ? ", O_DIRECT" : "");
    }
}

static void disk_free(void *kind) {
    DiskTier *d = kind;
    if (d == NULL) return;
    if (d->slabs) slabs_close(d, false);
    mn_free(d->slabs);
    aio_free(d->aio);
    mn_free_aligned(d->staging);
    mn_free(d->reqs);
    mn_free(d->dir);
    mn_free(d);
}

static const TierKindOps disk_ops = {
    .name = "disk",
    .run_bytes = disk_run_bytes,
    .reserve = disk_reserve,
    .write = disk_write,
    .read_layer = disk_read_layer,
    .release = disk_release,
    .reset = disk_reset,
    .check = disk_check,
    .dump = disk_dump,
    .free = disk_free,
};

/* ---- API ----------------------------------------------------------------- */

int tier_disk_new(const TierDiskConfig *cfg, Tier **out, MnErr *err) {
    *out = NULL;
    if (cfg->dir == NULL || cfg->dir[0] == '\0') return mn_err_set(err, MN_EINVAL, "disk tier: no directory");
    if (cfg->n_layer < 1 || cfg->n_layer > 65536 || cfg->block_bytes == 0)
        return mn_err_set(err, MN_EINVAL, "disk tier: bad geometry (%d layers, %zu bytes per block)", cfg->n_layer,
                          cfg->block_bytes);
    uint64_t capacity = cfg->capacity_bytes & ~(uint64_t)(DISK_PAGE - 1);
    if (capacity == 0)
        return mn_err_set(err, MN_EINVAL, "disk tier: capacity %llu bytes is under one page",
                          (unsigned long long)cfg->capacity_bytes);
    if (strlen(cfg->dir) > 4000) return mn_err_set(err, MN_EINVAL, "disk tier: directory path too long");
    if (mkdir(cfg->dir, 0700) != 0 && errno != EEXIST)
        return mn_err_set(err, errno == ENOENT ? MN_ENOTFOUND : MN_EIO,
                          "disk tier: cannot create %s: %s", cfg->dir, strerror(errno));
    struct stat st;
    if (stat(cfg->dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return mn_err_set(err, MN_EINVAL, "disk tier: %s is not a directory", cfg->dir);

    uint64_t slab = cfg->slab_bytes ? cfg->slab_bytes & ~(uint64_t)(DISK_PAGE - 1) : DISK_DEFAULT_SLAB;
    if (slab == 0) slab = DISK_PAGE;
    if (slab > capacity) slab = capacity;
    if ((capacity + slab - 1) / slab > DISK_MAX_SLABS) /* keep the file count sane */
        slab = round_page((capacity + DISK_MAX_SLABS - 1) / DISK_MAX_SLABS);

    DiskTier *d = mn_calloc(1, sizeof *d);
    if (d == NULL) return mn_err_set(err, MN_ENOMEM, "disk tier: out of memory");
    d->dir = mn_strdup(cfg->dir);
    d->n_layer = cfg->n_layer;
    d->block_bytes = cfg->block_bytes;
    d->fingerprint = cfg->model_fingerprint;
    d->kv_format = cfg->kv_format;
    d->is_durable = cfg->is_durable;
    d->backend = cfg->aio_backend;
    d->queue_depth = cfg->queue_depth > 0 ? cfg->queue_depth : 32;
    d->capacity_bytes = capacity;
    d->slab_bytes = slab;
    d->max_slabs = (int)((capacity + slab - 1) / slab);
    d->slabs = mn_calloc((size_t)d->max_slabs, sizeof *d->slabs);
    if (d->dir == NULL || d->slabs == NULL) {
        disk_free(d);
        return mn_err_set(err, MN_ENOMEM, "disk tier: out of memory");
    }
    int rc = aio_new(d->backend, d->queue_depth, &d->aio);
    if (rc != MN_OK) {
        disk_free(d);
        return mn_err_set(err, rc, "disk tier: no %s I/O: %s", aio_backend_name(cfg->aio_backend), mn_strerror(rc));
    }
    rc = tier_new_kind(&disk_ops, d, cfg->n_layer, cfg->block_bytes, capacity, out);
    if (rc != MN_OK) return mn_err_set(err, rc, "disk tier: %s", mn_strerror(rc));
    return MN_OK;
}

Aio *tier_disk_aio(Tier *t) {
    if (tier_kind_ops(t) != &disk_ops) return NULL;
    return ((DiskTier *)tier_kind(t))->aio;
}

int tier_disk_extent(const Tier *t, const Hash128 *hash, int layer, char *path, size_t cap, uint64_t *offset,
                     uint64_t *len) {
    if (tier_kind_ops(t) != &disk_ops) return MN_EINVAL;
    const DiskTier *d = tier_kind(t);
    if (layer < 0 || layer >= d->n_layer) return MN_EINVAL;
    TierRun *run = tier_find_run(t, hash, NULL);
    if (run == NULL) return MN_ENOTFOUND;
    const DiskRun *dr = run->data;
    slab_path(d, dr->slab, path, cap);
    *offset = dr->offset + (uint64_t)layer * dr->stride;
    *len = dr->stride;
    return MN_OK;
}
