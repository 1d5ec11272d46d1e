/* tier_disk.c — the disk tier: runs in preallocated slab files under a
 * directory, moved with aio (io_uring, O_DIRECT) and checksummed per layer.
 *
 * The tier below RAM (--disk-tier DIR --disk-tier-mb N). The core (tier.c)
 * decides what is stored and evicted; this file keeps the bytes. Data lives
 * in a few large slab files whose data areas are handed out in 4 KiB pages
 * (first fit, freed extents coalesce); each run takes one contiguous region
 * of a slab, laid out [layer][block], so one layer of a run is one
 * contiguous 4 KiB-aligned extent with its own checksum. Headers — what
 * each run is, where, and its checksums — are kept apart from the data, as
 * rows of the cache's SQLite database (store.h), so a data file holds
 * nothing but slab headers and extents.
 *
 * Owner: the mover thread, through the core; nothing locks. The Aio, the
 * staging buffer, the request array and the borrowed CacheStore are used
 * by one call at a time.
 *
 * ON-DISK FORMAT: slabs of version 1, run records of version 2 (version
 * 1 records are read as before: every layer KV). All integers
 * little-endian.
 *
 * Directory DIR:
 *     slab-NNNNN.dat   data slab N (5 decimal digits, from 00000)
 *     mnemo.db         the SQLite database (store.c; with mnemo.db-wal
 *                      while open): its table `runs` holds one row per
 *                      stored run — run id, the run record below verbatim,
 *                      the last-used time, the namespace of its blocks
 * The directory is 0700 and every file in it 0600 (tier_dir.h).
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
 * multiple of 4096, inside the data area) holds its layers one after
 * another. Layer l is stored as KV or, when bit l of the run's hidden
 * mask is set, as hidden states (docs/DESIGN.md, "Hidden-state restore");
 * its block bytes B_l are block_bytes or H (the pool's hidden_bytes), its
 * extent's length S_l = round_up(n * B_l, 4096): S for KV layers, S_H for
 * hidden ones, and the run occupies the sum of the S_l:
 *     layer l extent   [O + E_l, O + E_l + S_l), E_l = the sum of S_j, j < l
 *     block i of it    at O + E_l + i*B_l, B_l bytes, the bytes of pool
 *                      arena l's slot (kvpool_k) or of its hidden arena
 *                      (kvpool_h) verbatim
 *     padding          [n*B_l, S_l) of each extent, zero
 *     checksum of l    XXH3-64 over the S_l bytes of the extent, seed
 *                      (R << 16) | l. The seed binds an extent to its run
 *                      and layer: stale bytes of an earlier run on the
 *                      same pages, or the wrong layer, fail the check.
 *
 * Run record (the header of a run; the `record` column of its row):
 *     offset size  field
 *          0    8  magic "MNEMORUN"
 *          8    4  format version, 1
 *         12    4  n, blocks in the run (>= 1)
 *         16    8  run id R (1 <= R < 2^48, unique in the directory; the
 *                  row's run_id)
 *         24    4  slab id N
 *         28    4  n_layer (<= 65536)
 *         32    8  O, file offset of layer 0's extent
 *         40    8  S, layer stride
 *         48    8  block_bytes
 *         56    4  KV format id
 *         60    4  position of the run's first token in its sequence
 *                  (TierRunInfo.pos, < 2^31; 0 when unknown), for the
 *                  eviction policy
 *         64   16  model fingerprint
 *         80 16*n  block hashes in run order (canonical bytes)
 *     80+16n 8*n_layer  layer checksums, layer 0 first
 *     version 2 only, after the checksums:
 *              8   hidden mask (bit l: layer l, l < min(n_layer, 64), is
 *                  stored as hidden states)
 *              8   H, bytes of one block of a hidden layer (0 when the
 *                  mask is 0)
 *        end    8  XXH3-64, seed 0, of all the record's earlier bytes
 *
 * Validity: a slab is usable when its header's magic, version, checksum,
 * slab id, fingerprint, KV format, n_layer and block_bytes match the tier
 * and D matches the file size. A run record is valid when its magic,
 * version and checksum match, its length is that of n blocks and n_layer
 * layers, R is its row's id, its fingerprint, KV format, n_layer and
 * block_bytes are the tier's, S == round_up(n * block_bytes, 4096), a
 * nonzero hidden mask names layers the run has and H is the tier's
 * hidden_bytes (a tier opened without hidden states — a server serving
 * --restore-plan kv — does not adopt such runs: they are dropped, as
 * misses), its slab is usable and [O, O + the sum of S_l) lies inside
 * that slab's data area
 * and overlaps no other adopted run (of two that overlap, the larger R
 * wins: its bytes were written last). A layer of a valid run is used only
 * when its extent's checksum matches; otherwise the whole run is dropped.
 * A record is made visible only after its extents are durable (written,
 * then fdatasync when is_durable). Another format version is refused.
 *
 * Reopening (tier_disk_new with a store). Slab files 0, 1, ... are
 * adopted as they are (not truncated) up to the first missing or unusable
 * one; that one and every later slab file are deleted (their runs cannot
 * be adopted) and made afresh when needed — except a slab of another
 * format version (valid magic, version != 1): the directory is then
 * refused (MN_EFORMAT, a message naming both versions), nothing deleted.
 * Each row of `runs` is then validated as above; invalid rows are
 * deleted (LOG_WARN with the reason) and their pages stay free. Valid runs
 * are adopted in order of last use, so the least recently used go first
 * when the budget has shrunk (the tier's policy is set only afterwards);
 * a block named by two runs belongs to the later run, as after the put
 * that moved it. New run ids continue above the largest id seen. A block dropped
 * alone (tier_drop) is not recorded, so after a restart it is held again:
 * its bytes are still exactly right. Slab files past the budget are
 * removed once they hold no run. Without a store nothing is reopened:
 * slab files are recreated (truncated) when first needed.
 *
 * Crashes. A process killed at any instant (SIGKILL, or a power cut when
 * is_durable) leaves a directory that reopens to a consistent tier:
 *   - a put writes the extents, fdatasyncs the slab (is_durable), then
 *     commits the run's row (WAL, synchronous=FULL: atomic and durable).
 *     Killed before the commit, no row names those pages, so they are free
 *     at the next open; killed after, the row and its bytes are both on
 *     disk. A row is never visible before its data.
 *   - releasing a run deletes (commits) its row before its pages return to
 *     the free list, so no committed row names pages that another run may
 *     be overwriting. (Were the delete lost, the stale row would overlap a
 *     later run and lose to it, or fail its checksums.)
 *   - a slab is usable only once its header is written and its data area
 *     reserved (size 4096 + D): a half-made slab fails that test and is
 *     made again; no row can name it before a put into it completed.
 *     With a store and is_durable the directory is synced after a slab
 *     is made, so a power cut cannot lose a slab file that rows name.
 *   - a touch (last-used time) is its own atomic transaction; losing one
 *     only changes the LRU order.
 *   - whatever slips past this (no is_durable and a power cut, a disk that
 *     lies, a hand edit) is caught by the layer checksums, whose seeds bind
 *     bytes to their run and layer: a bad extent is found when read
 *     (MN_ECHECKSUM), its run dropped and its row deleted. Never served.
 *
 * Errors: ENOSPC (from fallocate or a write) or SQLITE_FULL -> MN_EFULL,
 * the run is not stored and the tier keeps working; any other I/O or
 * database failure while storing -> MN_EIO, which the core makes sticky;
 * a short read (a truncated file) counts as a checksum failure. A failed
 * touch or row delete is logged and otherwise ignored (see Crashes).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/store.h"
#include "cache/tier_dir.h"
#include "cache/tier_impl.h"

/* ---- types --------------------------------------------------------------- */

#define DISK_FORMAT_VERSION 1u /* slabs' */
#define DISK_RECORD_VERSION 2u /* run records' (1 is still read) */
#define DISK_PAGE 4096u
#define DISK_SLAB_HEADER 4096u
#define DISK_DEFAULT_SLAB (256ull << 20)
#define DISK_MAX_SLABS 4096
#define DISK_CHUNK (1u << 20) /* bytes per aio request: several in flight */
/* A streamed restore keeps up to this many bytes of extents (whole spans
 * of layers, at least one layer) in flight by default, so small extents
 * still fill the device queue; a read whose layers nobody uses early (a
 * promote into RAM) keeps DISK_BULK_FACTOR times as many, as a device
 * pays a fixed delay before a burst's first byte and so moves bigger
 * bursts faster (docs/OPERATIONS.md, "Figures behind the tier defaults") */
#define DISK_READ_WINDOW (8ull << 20)
#define DISK_BULK_FACTOR 4
/* Of a streamed read's window, this many requests are in the device at
 * once; the rest wait in the aio's queue. A disk that serves the requests
 * it holds side by side (a virtio disk does) returns a deep queue's reads
 * all together at the end, so no layer could be checked and copied while
 * the others were read, and the copy would come on top of the read. A few
 * at a time come back in order, and the copy of one group overlaps the
 * read of the next; a queue this shallow still keeps such a device busy
 * (docs/OPERATIONS.md, "Figures behind the tier defaults"). */
#define DISK_READ_INFLIGHT 4
#define DISK_STREAM_MAX_DEPTH 256 /* spans in flight, at most */
#define DISK_RECORD_HEAD 80u  /* run record bytes before the hashes */
#define DISK_MAX_RUN_ID (1ull << 48)

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
    bool is_stored;       /* its row is committed (deleted on release) */
    uint64_t offset;      /* O: file offset of layer 0's extent */
    uint64_t stride;      /* S, a KV layer's extent */
    uint64_t hstride;     /* S_H, a hidden layer's (0 without hidden layers) */
    uint64_t hidden;      /* the run's hidden mask (TierRun.hidden) */
    uint64_t checksums[]; /* (n_layer) */
} DiskRun;

typedef struct DiskTier {
    char *dir;
    int n_layer;
    size_t block_bytes;
    size_t hidden_bytes;  /* H; 0: no hidden layers stored or adopted */
    Hash128 fingerprint;
    uint32_t kv_format;
    bool is_durable;
    AioBackend backend;
    int queue_depth;
    uint64_t read_window_bytes; /* disk_read_layers' bytes in flight */
    int read_inflight;          /* of those, requests in the device at once */
    Aio *aio;
    uint64_t capacity_bytes;
    uint64_t slab_bytes;  /* data bytes of a new slab (the last may be less) */
    Slab *slabs;          /* (slabs_cap); the first n_slabs exist */
    int slabs_cap, n_slabs;
    uint64_t slabs_data_bytes; /* sum of the existing slabs' data_bytes */
    uint8_t *staging;     /* (staging_bytes) from mn_huge_alloc */
    size_t staging_bytes;
    bool has_warned_huge; /* logged once that staging has no huge pages */
    AioReq *reqs;         /* (reqs_cap) */
    int reqs_cap;
    CacheStore *store;    /* borrowed; NULL: records in memory only */
    bool is_closing;      /* tier_free under way: releases keep the rows */
    uint8_t *record;      /* (record_cap) a run record being stored */
    size_t record_cap;
    AllocFaults faults;   /* tier_disk_fault_alloc (tests) */
} DiskTier;

/* ---- helpers: bytes, buffers --------------------------------------------- */

static uint64_t round_page(uint64_t n) { return (n + DISK_PAGE - 1) & ~(uint64_t)(DISK_PAGE - 1); }

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static uint64_t layer_seed(uint64_t run_id, int layer) { return (run_id << 16) | (uint64_t)layer; }

/* Bytes of the record of a run of n blocks (n <= INT_MAX: fits). */
static size_t record_len(int n_blocks, int n_layer, uint32_t version) {
    return DISK_RECORD_HEAD + 16 * (size_t)n_blocks + 8 * (size_t)n_layer + (version >= 2 ? 16 : 0) + 8;
}

/* S_l, the extent of layer l of dr. */
static uint64_t ext_len(const DiskRun *dr, int l) {
    return kvpool_layer_in(dr->hidden, l) ? dr->hstride : dr->stride;
}

/* E_l, where layer l's extent begins, from O. */
static uint64_t ext_at(const DiskRun *dr, int l) { return tier_layer_at(dr->stride, dr->hstride, dr->hidden, l); }

/* The extents of a run of n_blocks with that hidden mask into dr (no
 * room taken). */
static void run_shape(const DiskTier *d, int n_blocks, uint64_t hidden, DiskRun *dr) {
    /* n_blocks * block_bytes is bounded by the pool's size: fits 64 bits */
    dr->stride = round_page((uint64_t)n_blocks * d->block_bytes);
    dr->hstride = hidden != 0 ? round_page((uint64_t)n_blocks * d->hidden_bytes) : 0;
    dr->hidden = hidden;
}

/* The longest extent of dr's layers. */
static uint64_t ext_max(const DiskRun *dr) {
    return dr->hidden != 0 && dr->hstride > dr->stride ? dr->hstride : dr->stride;
}

/* Whether this allocation fails by injection (tests): every allocation
 * the tier makes while serving asks first. */
static bool alloc_fault(DiskTier *d) { return alloc_faults_take(&d->faults); }

static int staging_reserve(DiskTier *d, uint64_t n) {
    if (n <= d->staging_bytes) return MN_OK;
    if (n > SIZE_MAX / 2 || alloc_fault(d)) return MN_ENOMEM;
    size_t want = d->staging_bytes ? d->staging_bytes : (size_t)DISK_CHUNK, cap;
    while (want < n) want *= 2;
    uint8_t *b = mn_huge_alloc(want, &cap);
    if (b == NULL) return MN_ENOMEM;
    mn_huge_free(d->staging, d->staging_bytes);
    d->staging = b;
    d->staging_bytes = cap;
    if (!d->has_warned_huge && mn_huge_bytes(b, cap) == 0) {
        d->has_warned_huge = true;
        LOG_WARN("disk tier: the kernel gave its %zu-byte staging buffer no huge pages (transparent huge pages "
                 "off?); reads may run at a third of the disk's speed",
                 cap);
    }
    return MN_OK;
}

/* Bytes a read without a layer consumer keeps in flight. */
static uint64_t bulk_window(const DiskTier *d) { return DISK_BULK_FACTOR * d->read_window_bytes; }

static int reqs_reserve(DiskTier *d, uint64_t n) {
    if (n <= (uint64_t)d->reqs_cap) return MN_OK;
    if (n > (uint64_t)INT32_MAX || alloc_fault(d)) return MN_ENOMEM;
    AioReq *r = mn_realloc(d->reqs, (size_t)n * sizeof *r);
    if (r == NULL) return MN_ENOMEM;
    d->reqs = r;
    d->reqs_cap = (int)n;
    return MN_OK;
}

static uint64_t n_chunks(uint64_t len) { return (len + DISK_CHUNK - 1) / DISK_CHUNK; }

/* Fill reqs[0..n_chunks(len)) for [buf, buf+len) <-> [offset, offset+len)
 * of file, DISK_CHUNK bytes each; returns how many. */
static int chunk_reqs(AioReq *reqs, unsigned op, const AioFile *file, uint8_t *buf, uint64_t offset, uint64_t len,
                      void *user) {
    int n = (int)n_chunks(len);
    for (int i = 0; i < n; i++) {
        uint64_t at = (uint64_t)i * DISK_CHUNK;
        reqs[i] = (AioReq){.op = op,
                           .file = file,
                           .buf = buf + at,
                           .offset = offset + at,
                           .len = (size_t)(len - at < DISK_CHUNK ? len - at : DISK_CHUNK),
                           .user = user};
    }
    return n;
}

/* Run [buf, buf+len) <-> [offset, offset+len) of file as DISK_CHUNK-sized
 * requests in flight together. */
static int transfer(DiskTier *d, unsigned op, const AioFile *file, uint8_t *buf, uint64_t offset, uint64_t len) {
    int rc = reqs_reserve(d, n_chunks(len));
    if (rc != MN_OK) return rc;
    return aio_run(d->aio, d->reqs, chunk_reqs(d->reqs, op, file, buf, offset, len, NULL));
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

/* Take exactly [off, off+len) out of the free list (a run being adopted):
 * false when any of it is not free. May split a hole: the caller made
 * room (slab_room). */
static bool ext_take(Slab *s, uint64_t off, uint64_t len) {
    int lo = 0, hi = s->n_free; /* first hole starting after off */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s->free[mid].off <= off) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return false;
    FreeExt *e = &s->free[lo - 1]; /* e->off <= off */
    uint64_t end = e->off + e->len;
    if (off + len > end) return false;
    if (e->off == off && end == off + len) {
        memmove(e, e + 1, (size_t)(s->n_free - lo) * sizeof *e);
        s->n_free--;
    } else if (e->off == off) {
        e->off += len;
        e->len -= len;
    } else if (end == off + len) {
        e->len -= len;
    } else {
        memmove(&s->free[lo + 1], &s->free[lo], (size_t)(s->n_free - lo) * sizeof *s->free);
        s->free[lo] = (FreeExt){off + len, end - (off + len)};
        s->free[lo - 1].len = off - s->free[lo - 1].off;
        s->n_free++;
    }
    s->free_bytes -= len;
    return true;
}

/* Return [off, off+len) to the slab, merging with its neighbours. Never
 * allocates: cap_free >= n_runs + 1 is kept by slab_room. */
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

/* Room in the free list for every hole one more run may open. */
static int slab_room(DiskTier *d, Slab *s) {
    if (s->cap_free >= s->n_runs + 2) return MN_OK;
    int cap = 2 * (s->n_runs + 2);
    FreeExt *fl = alloc_fault(d) ? NULL : mn_realloc(s->free, (size_t)cap * sizeof *fl);
    if (fl == NULL) return MN_ENOMEM;
    s->free = fl;
    s->cap_free = cap;
    return MN_OK;
}

/* ---- helpers: slab files --------------------------------------------------- */

static void slab_path_in(const char *dir, int id, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/slab-%05d.dat", dir, id);
}

static void slab_path(const DiskTier *d, int id, char *buf, size_t cap) { slab_path_in(d->dir, id, buf, cap); }

/* Bytes dir's filesystem has room for: its free space, plus the tier's
 * slab files already there (they are reused or made again in place).
 * UINT64_MAX when the filesystem cannot be asked. */
static uint64_t disk_room(const char *dir) {
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) {
        LOG_WARN("disk tier: statvfs %s: %s; its free space is not checked", dir, strerror(errno));
        return UINT64_MAX;
    }
    uint64_t room = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
    for (int id = 0; id < DISK_MAX_SLABS; id++) {
        char path[4096];
        struct stat st;
        slab_path_in(dir, id, path, sizeof path);
        if (stat(path, &st) != 0) break;
        room += (uint64_t)st.st_blocks * 512;
    }
    return room;
}

/* Slab headers of a budget of capacity bytes in slabs of slab bytes. */
static uint64_t slab_headers_for(uint64_t capacity, uint64_t slab) {
    uint64_t n = (capacity + slab - 1) / slab;
    return DISK_SLAB_HEADER * (n < DISK_MAX_SLABS ? n : DISK_MAX_SLABS);
}

/* The budget capacity (data bytes, in slabs of slab bytes) cut to what
 * dir's filesystem has room for, with a warning when it is cut: the slab
 * files are reserved only as runs need them, so a budget over the free
 * space would otherwise show as failed writes while serving, where a
 * budget that fits makes the tier evict its least recently used runs. At
 * least one page, so a server restarted on a full disk still starts (its
 * writes then fail, as on a disk that fills later). */
static uint64_t clamp_to_room(const char *dir, uint64_t capacity, uint64_t slab) {
    uint64_t room = disk_room(dir);
    if (room == UINT64_MAX || capacity + slab_headers_for(capacity, slab) <= room) return capacity;
    uint64_t keep = slab_headers_for(room, slab) + room / 32; /* and some room for the database's journal */
    uint64_t fit = room > keep ? (room - keep) & ~(uint64_t)(DISK_PAGE - 1) : 0;
    if (fit < DISK_PAGE) fit = DISK_PAGE;
    LOG_WARN("disk tier: --disk-tier-mb %llu is more than %s's filesystem has room for (%llu MiB free, counting the "
             "tier's slab files): the budget is cut to %llu KiB",
             (unsigned long long)(capacity >> 20), dir, (unsigned long long)(room >> 20),
             (unsigned long long)(fit >> 10));
    return fit;
}

/* Data bytes of the next slab: what the budget has left, at most
 * slab_bytes (0: the slabs already cover the budget). */
static uint64_t next_slab_bytes(const DiskTier *d) {
    if (d->slabs_data_bytes >= d->capacity_bytes) return 0;
    uint64_t left = d->capacity_bytes - d->slabs_data_bytes;
    return left < d->slab_bytes ? left : d->slab_bytes;
}

static void slab_init(Slab *s, FreeExt *fl, uint64_t data_bytes) {
    s->data_bytes = data_bytes;
    s->free = fl;
    s->cap_free = 4;
    s->free[0] = (FreeExt){DISK_SLAB_HEADER, data_bytes};
    s->n_free = 1;
    s->n_runs = 0;
    s->free_bytes = data_bytes;
}

/* Make the directory entries of new files durable. */
static int sync_dir(const DiskTier *d) {
    int fd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return aio_errno_to_mn(errno);
    int rc = fsync(fd) == 0 ? MN_OK : aio_errno_to_mn(errno);
    close(fd);
    return rc;
}

static void slab_header(const DiskTier *d, int id, uint64_t data_bytes, uint8_t *h) {
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
}

/* Why slab `id`'s header h (64 bytes) with file size file_bytes is not
 * usable for this tier, or NULL (then *data_bytes = D). */
static const char *slab_header_check(const DiskTier *d, int id, const uint8_t *h, uint64_t file_bytes,
                                     uint64_t *data_bytes) {
    if (memcmp(h, "MNEMOSLB", 8) != 0) return "not a slab file (bad magic)";
    if (get_u32(h + 8) != DISK_FORMAT_VERSION) return "another format version";
    if (get_u64(h + 56) != XXH3_64bits_withSeed(h, 56, 0)) return "header checksum mismatch";
    if (get_u32(h + 12) != (uint32_t)id) return "slab id differs from its name";
    if (memcmp(h + 24, d->fingerprint.b, 16) != 0 || get_u32(h + 40) != d->kv_format ||
        get_u32(h + 44) != (uint32_t)d->n_layer || get_u64(h + 48) != (uint64_t)d->block_bytes)
        return "made for another model or KV layout";
    uint64_t data = get_u64(h + 16);
    if (data == 0 || data % DISK_PAGE != 0) return "bad data area size";
    if (file_bytes < DISK_SLAB_HEADER || file_bytes - DISK_SLAB_HEADER != data)
        return "file size does not match its header (truncated or unfinished)";
    *data_bytes = data;
    return NULL;
}

/* Create slab `id` (the next one): header, then the data area reserved.
 * On failure nothing is left behind. */
static int slab_create(DiskTier *d, int id) {
    Slab *s = &d->slabs[id];
    char path[4096];
    slab_path(d, id, path, sizeof path);
    uint64_t data_bytes = next_slab_bytes(d);
    int rc = staging_reserve(d, DISK_SLAB_HEADER);
    if (rc != MN_OK) return rc;
    FreeExt *fl = alloc_fault(d) ? NULL : mn_calloc(4, sizeof *fl);
    if (fl == NULL) return MN_ENOMEM;
    rc = aio_open(d->aio, path, AIO_OPEN_CREATE | AIO_OPEN_TRUNC, &s->file);
    if (rc != MN_OK) {
        LOG_ERROR("disk tier: cannot create %s: %s", path, mn_strerror(rc));
        mn_free(fl);
        return medium_code(rc);
    }
    slab_header(d, id, data_bytes, d->staging);
    /* private whatever the umask (tier_dir.h) */
    rc = fchmod(s->file.fd, 0600) == 0 ? MN_OK : aio_errno_to_mn(errno);
    if (rc == MN_OK) rc = transfer(d, AIO_OP_WRITE, &s->file, d->staging, 0, DISK_SLAB_HEADER);
    if (rc == MN_OK) rc = aio_fallocate(d->aio, &s->file, DISK_SLAB_HEADER, data_bytes);
    if (rc == MN_OK && d->is_durable && d->store != NULL) rc = sync_dir(d);
    if (rc != MN_OK) {
        if (rc == MN_EFULL) LOG_WARN("disk tier: no space for %s (%llu bytes)", path, (unsigned long long)data_bytes);
        else LOG_ERROR("disk tier: cannot set up %s: %s", path, mn_strerror(rc));
        aio_close(&s->file);
        unlink(path);
        mn_free(fl);
        return medium_code(rc);
    }
    slab_init(s, fl, data_bytes);
    d->n_slabs = id + 1;
    d->slabs_data_bytes += data_bytes;
    return MN_OK;
}

static int slabs_grow(DiskTier *d, int cap) {
    if (cap <= d->slabs_cap) return MN_OK;
    Slab *s = alloc_fault(d) ? NULL : mn_realloc(d->slabs, (size_t)cap * sizeof *s);
    if (s == NULL) return MN_ENOMEM;
    memset(s + d->slabs_cap, 0, (size_t)(cap - d->slabs_cap) * sizeof *s);
    for (int i = d->slabs_cap; i < cap; i++) s[i].file.fd = -1;
    d->slabs = s;
    d->slabs_cap = cap;
    return MN_OK;
}

/* Close the first n_slabs slabs (unlinking their files when asked). */
static void slabs_close(DiskTier *d, bool unlink_files) {
    for (int i = 0; i < d->n_slabs; i++) {
        aio_close(&d->slabs[i].file);
        mn_free(d->slabs[i].free);
        if (unlink_files) {
            char path[4096];
            slab_path(d, i, path, sizeof path);
            unlink(path);
        }
        memset(&d->slabs[i], 0, sizeof d->slabs[i]);
        d->slabs[i].file.fd = -1;
    }
    d->n_slabs = 0;
    d->slabs_data_bytes = 0;
}

/* Slab id of a file name "slab-NNNNN.dat", or -1. */
static int slab_file_id(const char *name) {
    if (strlen(name) != 14 || memcmp(name, "slab-", 5) != 0 || strcmp(name + 10, ".dat") != 0) return -1;
    int id = 0;
    for (int i = 5; i < 10; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        id = 10 * id + (name[i] - '0');
    }
    return id;
}

/* Adopt slab files 0, 1, ... while they exist and are usable for this
 * tier; delete the first unusable one and every later one. A slab of
 * another format version is not ours to delete: MN_EFORMAT, nothing
 * touched, and *version says which. */
static int slabs_reopen(DiskTier *d, uint32_t *version) {
    for (int id = 0; id < DISK_MAX_SLABS; id++) {
        char path[4096];
        slab_path(d, id, path, sizeof path);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno != ENOENT) LOG_WARN("disk tier: cannot open %s: %s; starting it over", path, strerror(errno));
            break;
        }
        uint8_t h[64] = {0};
        struct stat st;
        uint64_t data_bytes = 0;
        const char *why = NULL;
        if (fstat(fd, &st) != 0) why = "cannot stat it";
        else if (pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) why = "shorter than a slab header";
        else why = slab_header_check(d, id, h, (uint64_t)st.st_size, &data_bytes);
        close(fd);
        if (why != NULL && memcmp(h, "MNEMOSLB", 8) == 0 && get_u32(h + 8) != DISK_FORMAT_VERSION) {
            *version = get_u32(h + 8);
            return MN_EFORMAT;
        }
        if (why != NULL) {
            LOG_WARN("disk tier: %s: %s; starting it over", path, why);
            break;
        }
        int rc = id < d->slabs_cap ? MN_OK : slabs_grow(d, 2 * id + 2);
        FreeExt *fl = rc == MN_OK && !alloc_fault(d) ? mn_calloc(4, sizeof *fl) : NULL;
        if (fl == NULL) return MN_ENOMEM;
        Slab *s = &d->slabs[id];
        rc = aio_open(d->aio, path, 0, &s->file);
        if (rc != MN_OK) {
            LOG_WARN("disk tier: cannot reopen %s: %s; starting it over", path, mn_strerror(rc));
            mn_free(fl);
            if (rc == MN_ENOMEM) return rc;
            break;
        }
        slab_init(s, fl, data_bytes);
        d->n_slabs = id + 1;
        d->slabs_data_bytes += data_bytes;
    }
    /* later slab files cannot be adopted: nothing may name them */
    DIR *dir = opendir(d->dir);
    if (dir == NULL) return MN_OK;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        int id = slab_file_id(e->d_name);
        if (id < d->n_slabs) continue;
        char path[4096];
        slab_path(d, id, path, sizeof path);
        if (unlink(path) == 0) LOG_INFO("disk tier: removed %s (after the last usable slab)", path);
    }
    closedir(dir);
    return MN_OK;
}

/* Remove trailing slabs that hold no run while the slabs exceed the budget
 * (it shrank since they were made). */
static void slabs_shrink(DiskTier *d) {
    while (d->n_slabs > 0 && d->slabs_data_bytes > d->capacity_bytes && d->slabs[d->n_slabs - 1].n_runs == 0) {
        Slab *s = &d->slabs[d->n_slabs - 1];
        char path[4096];
        slab_path(d, d->n_slabs - 1, path, sizeof path);
        aio_close(&s->file);
        mn_free(s->free);
        d->slabs_data_bytes -= s->data_bytes;
        memset(s, 0, sizeof *s);
        s->file.fd = -1;
        d->n_slabs--;
        unlink(path);
        LOG_INFO("disk tier: removed %s (beyond the budget)", path);
    }
}

/* ---- helpers: run records ---------------------------------------------------- */

/* The record of run (format above) into d->record; *len its bytes. */
static int record_encode(DiskTier *d, const TierRun *run, const DiskRun *dr, size_t *len) {
    size_t n = record_len(run->n_blocks, d->n_layer, DISK_RECORD_VERSION);
    if (n > d->record_cap) {
        uint8_t *b = alloc_fault(d) ? NULL : mn_realloc(d->record, n);
        if (b == NULL) return MN_ENOMEM;
        d->record = b;
        d->record_cap = n;
    }
    uint8_t *p = d->record;
    memset(p, 0, DISK_RECORD_HEAD);
    memcpy(p, "MNEMORUN", 8);
    put_u32(p + 8, DISK_RECORD_VERSION);
    put_u32(p + 12, (uint32_t)run->n_blocks);
    put_u64(p + 16, run->id);
    put_u32(p + 24, (uint32_t)dr->slab);
    put_u32(p + 28, (uint32_t)d->n_layer);
    put_u64(p + 32, dr->offset);
    put_u64(p + 40, dr->stride);
    put_u64(p + 48, (uint64_t)d->block_bytes);
    put_u32(p + 56, d->kv_format);
    put_u32(p + 60, (uint32_t)run->pos);
    memcpy(p + 64, d->fingerprint.b, 16);
    memcpy(p + DISK_RECORD_HEAD, run->hashes, 16 * (size_t)run->n_blocks);
    uint8_t *c = p + DISK_RECORD_HEAD + 16 * (size_t)run->n_blocks;
    for (int l = 0; l < d->n_layer; l++) put_u64(c + 8 * l, dr->checksums[l]);
    put_u64(c + 8 * (size_t)d->n_layer, dr->hidden);
    put_u64(c + 8 * (size_t)d->n_layer + 8, dr->hidden != 0 ? (uint64_t)d->hidden_bytes : 0);
    put_u64(p + n - 8, XXH3_64bits_withSeed(p, n - 8, 0));
    *len = n;
    return MN_OK;
}

/* A row of the runs table, read at open. */
typedef struct Found {
    uint64_t run_id;
    double last_used;
    bool has_ns;        /* the row names its namespace: */
    Hash128 ns_id;
    uint8_t *record;    /* (len) a copy */
    size_t len;
    const char *why;    /* NULL while it may be adopted */
    int n_blocks, slab; /* decoded, once valid */
    uint64_t offset, hidden, n_bytes; /* the extents: run_shape */
    int32_t pos;
} Found;

typedef struct FoundList {
    Found *v; /* (cap) */
    int n, cap;
    DiskTier *d; /* whose alloc_fault counts */
} FoundList;

static int found_collect(void *ctx, uint64_t run_id, const void *record, size_t len, double last_used,
                         const Hash128 *ns_id) {
    FoundList *fl = ctx;
    if (fl->n == fl->cap) {
        int cap = fl->cap ? 2 * fl->cap : 64;
        Found *v = alloc_fault(fl->d) ? NULL : mn_realloc(fl->v, (size_t)cap * sizeof *v);
        if (v == NULL) return MN_ENOMEM;
        fl->v = v;
        fl->cap = cap;
    }
    uint8_t *copy = alloc_fault(fl->d) ? NULL : mn_malloc(len ? len : 1);
    if (copy == NULL) return MN_ENOMEM;
    memcpy(copy, record, len);
    if (isnan(last_used)) last_used = 0; /* a hand-edited row must not upset the sort */
    fl->v[fl->n++] = (Found){.run_id = run_id,
                             .last_used = last_used,
                             .has_ns = ns_id != NULL,
                             .ns_id = ns_id != NULL ? *ns_id : (Hash128){{0}},
                             .record = copy,
                             .len = len};
    return 0;
}

/* Why the row f cannot be adopted (format above, all but overlap), or
 * NULL; fills f's decoded fields. */
static const char *record_check(const DiskTier *d, Found *f) {
    const uint8_t *p = f->record;
    if (f->len < record_len(1, 1, 1)) return "shorter than a run record";
    if (memcmp(p, "MNEMORUN", 8) != 0) return "not a run record (bad magic)";
    uint32_t version = get_u32(p + 8);
    if (version != 1 && version != DISK_RECORD_VERSION) return "another format version";
    uint32_t n = get_u32(p + 12), n_layer = get_u32(p + 28);
    if (n < 1 || n > (uint32_t)INT32_MAX / 32 || n_layer < 1 || n_layer > 65536 ||
        f->len != record_len((int)n, (int)n_layer, version))
        return "its length does not match its block and layer counts";
    if (get_u64(p + f->len - 8) != XXH3_64bits_withSeed(p, f->len - 8, 0)) return "record checksum mismatch";
    uint64_t run_id = get_u64(p + 16);
    if (run_id != f->run_id) return "its run id differs from its row's";
    if (run_id == 0 || run_id >= DISK_MAX_RUN_ID) return "run id out of range";
    if (n_layer != (uint32_t)d->n_layer || get_u64(p + 48) != (uint64_t)d->block_bytes ||
        get_u32(p + 56) != d->kv_format || memcmp(p + 64, d->fingerprint.b, 16) != 0)
        return "made for another model or KV layout";
    if (get_u32(p + 60) > (uint32_t)INT32_MAX) return "position out of range";
    uint32_t slab = get_u32(p + 24);
    if (slab >= (uint32_t)d->n_slabs) return "its slab file is missing or unusable";
    uint64_t offset = get_u64(p + 32), stride = get_u64(p + 40);
    if (stride != round_page((uint64_t)n * d->block_bytes)) return "wrong layer stride";
    uint64_t hidden = 0;
    if (version >= 2) {
        const uint8_t *h = p + DISK_RECORD_HEAD + 16 * (size_t)n + 8 * (size_t)n_layer;
        hidden = get_u64(h);
        if ((hidden & ~kvpool_layers_below((int)n_layer)) != 0) return "its hidden mask names layers it does not have";
        if (hidden != 0 && d->hidden_bytes == 0) return "stored as hidden states, which this server does not restore";
        if (hidden != 0 && get_u64(h + 8) != (uint64_t)d->hidden_bytes) return "made for another hidden-state layout";
    }
    DiskRun dr;
    run_shape(d, (int)n, hidden, &dr);
    uint64_t end = DISK_SLAB_HEADER + d->slabs[slab].data_bytes, span = ext_at(&dr, (int)n_layer);
    /* [O, O + the extents) inside [4096, end), without overflowing (each
     * extent is below 2^40: n < 2^26 blocks of a pool's block) */
    if (offset % DISK_PAGE != 0 || offset < DISK_SLAB_HEADER || offset >= end || span > end - offset)
        return "its extent lies outside its slab's data area";
    f->n_blocks = (int)n;
    f->slab = (int)slab;
    f->offset = offset;
    f->hidden = hidden;
    f->n_bytes = span;
    f->pos = (int32_t)get_u32(p + 60);
    return NULL;
}

static int found_by_id_desc(const void *a, const void *b) {
    const Found *x = a, *y = b;
    return x->run_id < y->run_id ? 1 : x->run_id > y->run_id ? -1 : 0;
}

static int found_by_last_use(const void *a, const void *b) {
    const Found *x = a, *y = b;
    if (x->last_used != y->last_used) return x->last_used < y->last_used ? -1 : 1;
    return x->run_id < y->run_id ? -1 : x->run_id > y->run_id ? 1 : 0;
}

/* Adopt the stored runs into t (see "Reopening" above). On failure the
 * caller frees the tier and this kind whole, so claimed room needs no
 * giving back, and rows stay (tier_free keeps what is stored). */
static int runs_adopt(DiskTier *d, Tier *t) {
    FoundList fl = {.d = d};
    int rc = store_run_foreach(d->store, found_collect, &fl);
    if (rc != MN_OK) goto done;
    uint64_t max_id = 0;
    for (int i = 0; i < fl.n; i++) {
        Found *f = &fl.v[i];
        if (f->run_id < DISK_MAX_RUN_ID && f->run_id > max_id) max_id = f->run_id;
        f->why = record_check(d, f);
    }
    tier_skip_run_ids(t, max_id);
    if (fl.n == 0) goto done;
    /* claim the extents, later runs first: of two that overlap, the later
     * one wrote its bytes last */
    qsort(fl.v, (size_t)fl.n, sizeof *fl.v, found_by_id_desc);
    for (int i = 0; i < fl.n; i++) {
        Found *f = &fl.v[i];
        if (f->why != NULL) continue;
        Slab *s = &d->slabs[f->slab];
        rc = slab_room(d, s);
        if (rc != MN_OK) goto done;
        if (ext_take(s, f->offset, f->n_bytes)) s->n_runs++;
        else f->why = "its extent overlaps a later run";
    }
    /* adopt, least recently used first */
    qsort(fl.v, (size_t)fl.n, sizeof *fl.v, found_by_last_use);
    int n_dropped = 0;
    for (int i = 0; i < fl.n; i++) {
        Found *f = &fl.v[i];
        if (f->why == NULL) {
            DiskRun *dr = alloc_fault(d) ? NULL : mn_malloc(sizeof *dr + (size_t)d->n_layer * sizeof(uint64_t));
            if (dr == NULL) {
                rc = MN_ENOMEM;
                goto done;
            }
            dr->slab = f->slab;
            dr->is_stored = true;
            dr->offset = f->offset;
            run_shape(d, f->n_blocks, f->hidden, dr);
            const uint8_t *c = f->record + DISK_RECORD_HEAD + 16 * (size_t)f->n_blocks;
            for (int l = 0; l < d->n_layer; l++) dr->checksums[l] = get_u64(c + 8 * l);
            /* Hash128 is 16 bytes with alignment 1: the record's bytes are hashes */
            TierRunInfo info = {.pos = f->pos, .ns_id = f->has_ns ? &f->ns_id : NULL, .hidden = f->hidden};
            rc = tier_adopt_run(t, f->run_id, (const Hash128 *)(const void *)(f->record + DISK_RECORD_HEAD),
                                f->n_blocks, dr, f->n_bytes, f->last_used, &info);
            if (rc == MN_OK) continue;
            mn_free(dr);
            ext_free(&d->slabs[f->slab], f->offset, f->n_bytes);
            d->slabs[f->slab].n_runs--;
            if (rc != MN_EFULL) goto done;
            rc = MN_OK;
            f->why = "larger than the whole budget";
        }
        LOG_WARN("disk tier %s: dropping the record of run %llu: %s", d->dir, (unsigned long long)f->run_id, f->why);
        store_run_delete(d->store, f->run_id); /* logged when it fails; a stale row is harmless (Crashes) */
        n_dropped++;
    }
    slabs_shrink(d);
    TierStats st;
    tier_stats(t, &st);
    if (st.n_adopted_runs > 0 || n_dropped > 0)
        LOG_INFO("disk tier %s: reopened %llu runs (%llu blocks, %llu bytes); %d records dropped, %llu runs evicted "
                 "for the budget",
                 d->dir, (unsigned long long)st.n_runs, (unsigned long long)st.n_blocks,
                 (unsigned long long)st.occupancy_bytes, n_dropped, (unsigned long long)st.n_evicted_runs);
done:
    for (int i = 0; i < fl.n; i++) mn_free(fl.v[i].record);
    mn_free(fl.v);
    return rc;
}

/* ---- kind operations ----------------------------------------------------- */

static uint64_t disk_run_bytes(void *kind, int n_blocks, uint64_t hidden) {
    const DiskTier *d = kind;
    DiskRun shape;
    run_shape(d, n_blocks, hidden, &shape);
    uint64_t bytes = ext_at(&shape, d->n_layer);
    return bytes <= d->slab_bytes ? bytes : UINT64_MAX;
}

static int disk_reserve(void *kind, TierRun *run) {
    DiskTier *d = kind;
    DiskRun *dr = alloc_fault(d) ? NULL : mn_malloc(sizeof *dr + (size_t)d->n_layer * sizeof(uint64_t));
    if (dr == NULL) return MN_ENOMEM;
    run_shape(d, run->n_blocks, run->hidden, dr);
    dr->is_stored = false;
    int found = -1;
    for (int i = 0; i < d->n_slabs && found < 0; i++)
        if (d->slabs[i].free_bytes >= run->n_bytes && ext_alloc(&d->slabs[i], run->n_bytes, &dr->offset)) found = i;
    if (found < 0 && d->n_slabs < d->slabs_cap && next_slab_bytes(d) >= run->n_bytes) {
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
    if (slab_room(d, s) != MN_OK) {
        ext_free(s, dr->offset, run->n_bytes);
        mn_free(dr);
        return MN_ENOMEM;
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
    for (int l = 0; l < d->n_layer; l++) {
        uint8_t *ext = d->staging + ext_at(dr, l);
        size_t bb = tier_layer_bytes(d->block_bytes, d->hidden_bytes, dr->hidden, l), payload = (size_t)run->n_blocks * bb;
        for (int i = 0; i < run->n_blocks; i++) memcpy(ext + (size_t)i * bb, tier_pool_layer(pool, dr->hidden, l, slots[i]), bb);
        memset(ext + payload, 0, (size_t)ext_len(dr, l) - payload);
        dr->checksums[l] = XXH3_64bits_withSeed(ext, (size_t)ext_len(dr, l), layer_seed(run->id, l));
    }
    const AioFile *f = &d->slabs[dr->slab].file;
    rc = transfer(d, AIO_OP_WRITE, f, d->staging, dr->offset, run->n_bytes);
    if (rc == MN_OK && d->is_durable) rc = aio_fdatasync(d->aio, f);
    if (rc != MN_OK) return medium_code(rc);
    if (d->store != NULL) { /* the bytes are durable: now the record may be visible */
        size_t len = 0;
        rc = record_encode(d, run, dr, &len);
        if (rc == MN_OK)
            rc = store_run_put(d->store, run->id, d->record, len, run->last_used, run->has_ns ? &run->ns_id : NULL);
        if (rc != MN_OK) return medium_code(rc);
        dr->is_stored = true;
    }
    *io_bytes = run->n_bytes;
    return MN_OK;
}

/* Layer `layer` of run has arrived at ext (its whole extent): verify it and
 * copy blocks idx[k] into pool slots[k]. MN_ECHECKSUM when it is damaged.
 * When idx rises (as a restore asks for a run's blocks), each block is
 * hashed and copied in one pass, while it is in the core's cache: the
 * extent came from the device, so a separate hash pass would read it from
 * memory twice. A damaged extent then leaves its blocks in the slots, which
 * the caller's failure unindexes before anyone reads them (no layer after
 * the last good one is reported). */
static int extent_place(const DiskTier *d, const TierRun *run, int layer, const uint8_t *ext, const int32_t *idx,
                        const int32_t *slots, int n, KvPool *pool) {
    const DiskRun *dr = run->data;
    uint64_t seed = layer_seed(run->id, layer);
    const size_t len = (size_t)ext_len(dr, layer), bb = tier_layer_bytes(d->block_bytes, d->hidden_bytes, dr->hidden, layer);
    bool rises = true;
    for (int k = 1; k < n && rises; k++) rises = idx[k] > idx[k - 1];
    if (!rises) {
        if (XXH3_64bits_withSeed(ext, len, seed) != dr->checksums[layer]) return MN_ECHECKSUM;
        for (int k = 0; k < n; k++) memcpy(tier_pool_layer(pool, dr->hidden, layer, slots[k]), ext + (size_t)idx[k] * bb, bb);
        return MN_OK;
    }
    XXH3_state_t h;
    memset(&h, 0, sizeof h); /* gcc cannot see that the reset sets every field it reads */
    XXH3_64bits_reset_withSeed(&h, seed);
    size_t at = 0; /* bytes hashed */
    for (int k = 0; k < n; k++) {
        size_t from = (size_t)idx[k] * bb;
        XXH3_64bits_update(&h, ext + at, from + bb - at);
        memcpy(tier_pool_layer(pool, dr->hidden, layer, slots[k]), ext + from, bb);
        at = from + bb;
    }
    XXH3_64bits_update(&h, ext + at, len - at);
    return XXH3_64bits_digest(&h) == dr->checksums[layer] ? MN_OK : MN_ECHECKSUM;
}

static int disk_read_layer(void *kind, TierRun *run, int layer, const int32_t *idx, const int32_t *slots, int n,
                           KvPool *pool, uint64_t *io_bytes) {
    DiskTier *d = kind;
    DiskRun *dr = run->data;
    int rc = staging_reserve(d, ext_len(dr, layer));
    if (rc != MN_OK) return rc;
    rc = transfer(d, AIO_OP_READ, &d->slabs[dr->slab].file, d->staging, dr->offset + ext_at(dr, layer),
                  ext_len(dr, layer));
    if (rc == MN_EFORMAT) return MN_ECHECKSUM; /* the file is shorter than the extent */
    if (rc != MN_OK) return medium_code(rc);
    *io_bytes = ext_len(dr, layer);
    return extent_place(d, run, layer, d->staging, idx, slots, n, pool);
}

/* ---- streamed restore ------------------------------------------------------ */

/* A restore of every layer of several runs. A run's layers lie one after
 * another on disk, so `span` consecutive layers of a run are one
 * contiguous piece, and the stream reads spans rather than single layers,
 * in as few requests (of up to DISK_CHUNK) as that takes. Each request
 * costs the mover a share of a core to issue, whatever its size, and with
 * compute on every core that share is scarce: many small requests move
 * the same bytes slower than a few large ones (docs/OPERATIONS.md,
 * "Figures behind the tier defaults").
 *
 * Span j (layers [j*span, (j+1)*span)) is read into staging slot
 * j % depth: the groups' pieces side by side in group order, each
 * span * (the group's longest extent) bytes, the span's extents one after
 * another in it as on disk; its requests are reqs[slot * per_slot ...], each
 * tagged with its group. When the span whose turn it is has fully arrived,
 * its layers are checked, copied into the pool and reported one by one,
 * and its slot takes span j + depth. A failed request stops the read when
 * its span's turn comes, so exactly the layers before that span are
 * reported; a failed checksum stops it at its layer. */
typedef struct Stream {
    DiskTier *d;
    const TierReadGroup *groups;
    int n_groups;
    int span;              /* layers per slot */
    int n_spans;           /* spans of the runs: ceil(n_layer / span) */
    int depth;             /* slots, that is spans in flight */
    int per_slot;          /* requests of a full span */
    uint64_t layer_bytes;  /* one layer of every group */
    int left[DISK_STREAM_MAX_DEPTH];      /* requests of each slot not yet back */
    int rc[DISK_STREAM_MAX_DEPTH];        /* first failure in each slot */
    int bad_group[DISK_STREAM_MAX_DEPTH]; /* whose request that was */
} Stream;

/* Room of one layer of g in a staging slot: its run's longest extent. */
static uint64_t group_stride(const TierReadGroup *g) { return ext_max(g->run->data); }

/* Layers of span j (the last may be short). */
static int span_layers(const Stream *st, int j) {
    int first = j * st->span, n = st->d->n_layer - first;
    return n < st->span ? n : st->span;
}

/* Choose span, depth and per_slot for the groups and the read window:
 * a span as long as a request holds of the longest stride, no longer than
 * the window — half of it when the window cannot hold every layer, so
 * that two spans are in flight and one's reads overlap the next's; as
 * many spans in flight as the window holds. */
static void stream_shape(Stream *st, uint64_t window) {
    DiskTier *d = st->d;
    uint64_t max_stride = 0;
    st->layer_bytes = 0;
    for (int g = 0; g < st->n_groups; g++) {
        uint64_t stride = group_stride(&st->groups[g]);
        st->layer_bytes += stride;
        if (stride > max_stride) max_stride = stride;
    }
    uint64_t span = DISK_CHUNK / max_stride, fit = window / st->layer_bytes;
    if (fit < (uint64_t)d->n_layer && fit >= 2) fit /= 2; /* not all at once: two spans in flight, not one */
    if (span > fit) span = fit;
    if (span < 1) span = 1;
    if (span > (uint64_t)d->n_layer) span = (uint64_t)d->n_layer;
    st->span = (int)span;
    st->n_spans = (d->n_layer + st->span - 1) / st->span;
    uint64_t depth = window / (span * st->layer_bytes);
    if (depth < 1) depth = 1;
    if (depth > (uint64_t)st->n_spans) depth = (uint64_t)st->n_spans;
    st->depth = depth > DISK_STREAM_MAX_DEPTH ? DISK_STREAM_MAX_DEPTH : (int)depth;
    uint64_t per_slot = 0;
    for (int g = 0; g < st->n_groups; g++) per_slot += n_chunks(span * group_stride(&st->groups[g]));
    st->per_slot = (int)per_slot; /* the window bounds it */
}

static uint8_t *slot_base(const Stream *st, int slot) {
    return st->d->staging + (uint64_t)slot * (uint64_t)st->span * st->layer_bytes;
}

static int stream_submit(Stream *st, int j) {
    DiskTier *d = st->d;
    int slot = j % st->depth, k = slot * st->per_slot, n = span_layers(st, j);
    uint8_t *buf = slot_base(st, slot);
    for (int g = 0; g < st->n_groups; g++) {
        const DiskRun *dr = st->groups[g].run->data;
        uint64_t from = ext_at(dr, j * st->span), to = ext_at(dr, j * st->span + n);
        k += chunk_reqs(&d->reqs[k], AIO_OP_READ, &d->slabs[dr->slab].file, buf, dr->offset + from, to - from,
                        (void *)(intptr_t)g);
        buf += (uint64_t)st->span * group_stride(&st->groups[g]);
    }
    st->left[slot] = k - slot * st->per_slot;
    st->rc[slot] = MN_OK;
    return aio_submit(d->aio, &d->reqs[slot * st->per_slot], st->left[slot]);
}

/* Take completions until the requests of staging slot `slot` are all back
 * (or, with slot < 0, until nothing is outstanding). MN_EIO when the ring
 * itself broke (requests may be lost in it). */
static int stream_reap(Stream *st, int slot) {
    DiskTier *d = st->d;
    while (slot < 0 ? aio_n_outstanding(d->aio) > 0 : st->left[slot] > 0) {
        AioReq *done[64];
        int n_done;
        int rc = aio_wait(d->aio, 1, 64, done, &n_done);
        if (rc != MN_OK) return rc;
        for (int i = 0; i < n_done; i++) {
            int s = (int)((done[i] - d->reqs) / st->per_slot);
            st->left[s]--;
            if (done[i]->result != MN_OK && st->rc[s] == MN_OK) {
                st->rc[s] = done[i]->result == MN_EFORMAT ? MN_ECHECKSUM : medium_code(done[i]->result);
                st->bad_group[s] = (int)(intptr_t)done[i]->user;
            }
        }
    }
    return MN_OK;
}

/* Layer `layer` has arrived in its slot: verify each group's extent and
 * copy its blocks into the pool; on a bad extent *bad_group says whose. */
static int stream_place(Stream *st, int layer, KvPool *pool, int *bad_group) {
    const uint8_t *piece = slot_base(st, layer / st->span % st->depth);
    const int first = layer - layer % st->span; /* the span's first layer */
    for (int g = 0; g < st->n_groups; g++) {
        const TierReadGroup *gr = &st->groups[g];
        const DiskRun *dr = gr->run->data;
        uint64_t stride = group_stride(gr);
        if (extent_place(st->d, gr->run, layer, piece + (ext_at(dr, layer) - ext_at(dr, first)), gr->idx, gr->slots,
                         gr->n, pool) != MN_OK) {
            *bad_group = g;
            return MN_ECHECKSUM;
        }
        piece += (uint64_t)st->span * stride;
    }
    return MN_OK;
}

static int disk_read_layers(void *kind, const TierReadGroup *groups, int n_groups, KvPool *pool,
                            TierLayerFn layer_fn, void *ctx, uint64_t *io_bytes, TierReadFailure *bad) {
    DiskTier *d = kind;
    Stream st = {.d = d, .groups = groups, .n_groups = n_groups};
    stream_shape(&st, layer_fn ? d->read_window_bytes : bulk_window(d));
    int rc = staging_reserve(d, (uint64_t)st.depth * (uint64_t)st.span * st.layer_bytes);
    if (rc == MN_OK) rc = reqs_reserve(d, (uint64_t)st.depth * (uint64_t)st.per_slot);
    if (rc != MN_OK) return rc;
    if ((rc = aio_set_inflight(d->aio, d->read_inflight)) != MN_OK) return medium_code(rc);

    int n_submitted = 0, result = MN_OK;
    for (; n_submitted < st.depth && rc == MN_OK; n_submitted++) rc = stream_submit(&st, n_submitted);
    for (int l = 0; l < d->n_layer && rc == MN_OK; l++) {
        int j = l / st.span, slot = j % st.depth;
        if (l % st.span == 0) { /* the span's turn: all of it must be here */
            if ((rc = stream_reap(&st, slot)) != MN_OK) break;
            if ((result = st.rc[slot]) != MN_OK) {
                *bad = (TierReadFailure){st.bad_group[slot], l};
                break;
            }
            *io_bytes += (uint64_t)span_layers(&st, j) * st.layer_bytes;
        }
        int bad_group = -1;
        if ((result = stream_place(&st, l, pool, &bad_group)) != MN_OK) {
            *bad = (TierReadFailure){bad_group, l};
            break;
        }
        if (layer_fn) layer_fn(ctx, l);
        bool is_span_end = l % st.span == st.span - 1 || l == d->n_layer - 1;
        if (is_span_end && n_submitted < st.n_spans) rc = stream_submit(&st, n_submitted++);
    }
    /* the staging slots and requests must outlive every request in flight */
    int drain = stream_reap(&st, -1);
    if (rc == MN_OK) rc = drain;
    int unlimit = aio_set_inflight(d->aio, d->queue_depth); /* writes keep the whole ring */
    if (rc == MN_OK) rc = unlimit;
    return rc != MN_OK ? medium_code(rc) : result;
}

static void disk_touch(void *kind, TierRun *run) {
    DiskTier *d = kind;
    const DiskRun *dr = run->data;
    if (d->store != NULL && dr->is_stored) store_run_touch(d->store, run->id, run->last_used); /* logged on failure */
}

static void disk_release(void *kind, TierRun *run) {
    DiskTier *d = kind;
    DiskRun *dr = run->data;
    if (dr == NULL) return;
    /* the row goes before the pages can be reused (see Crashes) */
    if (dr->is_stored && d->store != NULL && !d->is_closing) store_run_delete(d->store, run->id);
    Slab *s = &d->slabs[dr->slab];
    ext_free(s, dr->offset, run->n_bytes);
    s->n_runs--;
    mn_free(dr);
    run->data = NULL;
}

static void disk_close(void *kind) {
    DiskTier *d = kind;
    d->is_closing = true;
}

/* Start over: fresh slab files and a fresh Aio (a failed ring stays
 * failed). Every run was released by the core before (rows deleted). */
static int disk_reset(void *kind) {
    DiskTier *d = kind;
    slabs_close(d, true);
    aio_free(d->aio);
    d->aio = NULL;
    return aio_new(d->backend, d->queue_depth, &d->aio);
}

static void disk_check(const void *kind, uint64_t occupancy_bytes) {
    const DiskTier *d = kind;
    uint64_t used = 0, total = 0;
    if (d->n_slabs > d->slabs_cap) {
        fprintf(stderr, "tier_disk check: %d slabs, room for %d\n", d->n_slabs, d->slabs_cap);
        abort();
    }
    for (int i = 0; i < d->n_slabs; i++) {
        const Slab *s = &d->slabs[i];
        uint64_t free_sum = 0, end = DISK_SLAB_HEADER;
        bool ok = s->n_free <= s->n_runs + 1 && s->n_free <= s->cap_free && s->n_runs >= 0;
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
        total += s->data_bytes;
    }
    if (used != occupancy_bytes || total != d->slabs_data_bytes) {
        fprintf(stderr, "tier_disk check: slabs hold %llu bytes, runs %llu; slabs %llu bytes, counted %llu\n",
                (unsigned long long)used, (unsigned long long)occupancy_bytes, (unsigned long long)total,
                (unsigned long long)d->slabs_data_bytes);
        abort();
    }
}

static void disk_dump(const void *kind) {
    const DiskTier *d = kind;
    fprintf(stderr, "  disk %s (aio %s, %s): %d slabs, %llu data bytes, new slabs of %llu bytes\n", d->dir,
            aio_backend_name(aio_backend(d->aio)), d->store ? "persistent" : "not persistent", d->n_slabs,
            (unsigned long long)d->slabs_data_bytes, (unsigned long long)d->slab_bytes);
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
    mn_huge_free(d->staging, d->staging_bytes);
    mn_free(d->reqs);
    mn_free(d->record);
    mn_free(d->dir);
    mn_free(d);
}

static const TierKindOps disk_ops = {
    .name = "disk",
    .run_bytes = disk_run_bytes,
    .reserve = disk_reserve,
    .write = disk_write,
    .read_layer = disk_read_layer,
    .read_layers = disk_read_layers,
    .touch = disk_touch,
    .release = disk_release,
    .close = disk_close,
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
    if (cfg->store != NULL) {
        const StoreIdentity *id = store_identity(cfg->store);
        if (!hash128_eq(&id->model_fingerprint, &cfg->model_fingerprint) || id->kv_format != cfg->kv_format ||
            id->n_layer != cfg->n_layer || id->block_bytes != (uint64_t)cfg->block_bytes)
            return mn_err_set(err, MN_EINVAL, "disk tier: the cache store %s is bound to another model or KV layout",
                              store_path(cfg->store));
    }
    /* with a store, opening it (on this directory) checked it */
    if (cfg->store == NULL) {
        int rc = tierdir_prepare(cfg->dir, true, err);
        if (rc != MN_OK) return rc;
    }

    uint64_t slab = cfg->slab_bytes ? cfg->slab_bytes & ~(uint64_t)(DISK_PAGE - 1) : DISK_DEFAULT_SLAB;
    if (slab == 0) slab = DISK_PAGE;
    if (cfg->is_clamped_to_room) capacity = clamp_to_room(cfg->dir, capacity, slab);
    if (slab > capacity) slab = capacity;
    if ((capacity + slab - 1) / slab > DISK_MAX_SLABS) /* keep the file count sane */
        slab = round_page((capacity + DISK_MAX_SLABS - 1) / DISK_MAX_SLABS);
    int max_new_slabs = (int)((capacity + slab - 1) / slab);

    AllocFaults faults = {0};
    alloc_faults_set(&faults, cfg->test_open_alloc_skip, cfg->test_open_alloc_fail);
    DiskTier *d = alloc_faults_take(&faults) ? NULL : mn_calloc(1, sizeof *d);
    if (d == NULL) return mn_err_set(err, MN_ENOMEM, "disk tier: out of memory");
    d->faults = faults; /* (while it opens) */
    d->dir = alloc_fault(d) ? NULL : mn_strdup(cfg->dir);
    d->n_layer = cfg->n_layer;
    d->block_bytes = cfg->block_bytes;
    d->hidden_bytes = cfg->hidden_bytes;
    d->fingerprint = cfg->model_fingerprint;
    d->kv_format = cfg->kv_format;
    d->is_durable = cfg->is_durable;
    d->backend = cfg->aio_backend;
    d->queue_depth = cfg->queue_depth > 0 ? cfg->queue_depth : 32;
    d->read_window_bytes = cfg->read_window_bytes > 0 ? cfg->read_window_bytes : DISK_READ_WINDOW;
    d->read_inflight = cfg->read_inflight > 0 ? cfg->read_inflight : DISK_READ_INFLIGHT;
    if (d->read_inflight > d->queue_depth) d->read_inflight = d->queue_depth;
    d->capacity_bytes = capacity;
    d->slab_bytes = slab;
    d->store = cfg->store;
    int rc = d->dir != NULL ? slabs_grow(d, max_new_slabs) : MN_ENOMEM;
    if (rc != MN_OK) {
        disk_free(d);
        return mn_err_set(err, MN_ENOMEM, "disk tier: out of memory");
    }
    rc = aio_new(d->backend, d->queue_depth, &d->aio);
    if (rc != MN_OK) {
        disk_free(d);
        return mn_err_set(err, rc, "disk tier: no %s I/O: %s", aio_backend_name(cfg->aio_backend), mn_strerror(rc));
    }
    /* the staging buffer at the size a bulk read uses (or the budget, when
     * smaller) now: growing it while serving stalls the read or put that
     * needs it for as long as the kernel takes to populate the huge pages,
     * far longer than a read */
    rc = staging_reserve(d, bulk_window(d) < capacity ? bulk_window(d) : capacity);
    if (rc != MN_OK) {
        disk_free(d);
        return mn_err_set(err, rc, "disk tier: out of memory for the staging buffer");
    }
    if (d->store != NULL) {
        /* adopted slabs may be more (or other) than this budget would make;
         * new ones are made only while the slabs fall short of it */
        uint32_t version = 0;
        rc = slabs_reopen(d, &version);
        if (rc == MN_OK) rc = slabs_grow(d, d->n_slabs + max_new_slabs);
        if (rc != MN_OK) {
            disk_free(d);
            if (rc == MN_EFORMAT)
                return mn_err_set(err, rc,
                                  "disk tier: %s holds data of format version %u, this build uses %u: move the "
                                  "directory away (its cache is then rebuilt) or use the mnemo that wrote it",
                                  cfg->dir, version, DISK_FORMAT_VERSION);
            return mn_err_set(err, rc, "disk tier: reopening %s: %s", cfg->dir, mn_strerror(rc));
        }
    }
    Tier *t;
    rc = tier_new_kind(&disk_ops, d, cfg->n_layer, cfg->block_bytes, capacity, &d->faults, &t);
    if (rc != MN_OK) return mn_err_set(err, rc, "disk tier: %s", mn_strerror(rc));
    tier_set_hidden_bytes(t, d->hidden_bytes);
    if (d->store != NULL) {
        rc = runs_adopt(d, t);
        if (rc != MN_OK) {
            tier_free(t); /* keeps what is stored */
            return mn_err_set(err, rc, "disk tier: reading the run records of %s: %s", store_path(cfg->store),
                              mn_strerror(rc));
        }
    }
    tier_share_faults(t, NULL); /* opened: the open faults are spent */
    alloc_faults_set(&d->faults, 0, 0);
    *out = t;
    return MN_OK;
}

Aio *tier_disk_aio(Tier *t) {
    if (tier_kind_ops(t) != &disk_ops) return NULL;
    return ((DiskTier *)tier_kind(t))->aio;
}

void tier_disk_fault_alloc(Tier *t, int n_skip, int n_fail) {
    if (tier_kind_ops(t) != &disk_ops) return;
    DiskTier *d = tier_kind(t);
    alloc_faults_set(&d->faults, n_skip, n_fail);
}

/* Overwrite [off, end) of slab s (page-aligned, inside its data area) with
 * the zeros in staging where the file holds data: what the filesystem
 * reports as a hole (never written, or reserved and unwritten) reads as
 * zeros already. */
static int scrub_range(DiskTier *d, Slab *s, uint64_t off, uint64_t end, uint64_t *n_zeroed) {
    while (off < end) {
        off_t data = lseek(s->file.fd, (off_t)off, SEEK_DATA);
        if (data < 0) return errno == ENXIO ? MN_OK : aio_errno_to_mn(errno); /* ENXIO: no data after off */
        if ((uint64_t)data >= end) return MN_OK;
        off_t hole = lseek(s->file.fd, data, SEEK_HOLE);
        if (hole < 0) return aio_errno_to_mn(errno);
        uint64_t from = (uint64_t)data & ~(uint64_t)(DISK_PAGE - 1), to = round_page((uint64_t)hole);
        if (from < off) from = off;
        if (to > end) to = end;
        for (uint64_t at = from; at < to;) {
            uint64_t n = to - at < d->staging_bytes ? to - at : d->staging_bytes;
            int rc = transfer(d, AIO_OP_WRITE, &s->file, d->staging, at, n);
            if (rc != MN_OK) return rc;
            at += n;
            *n_zeroed += n;
        }
        off = to;
    }
    return MN_OK;
}

int tier_disk_scrub(Tier *t, uint64_t *n_zeroed) {
    *n_zeroed = 0;
    if (tier_kind_ops(t) != &disk_ops) return MN_EINVAL;
    DiskTier *d = tier_kind(t);
    memset(d->staging, 0, d->staging_bytes); /* made at open: at least a page */
    int rc = MN_OK;
    for (int i = 0; i < d->n_slabs && rc == MN_OK; i++) {
        Slab *s = &d->slabs[i];
        uint64_t before = *n_zeroed;
        for (int k = 0; k < s->n_free && rc == MN_OK; k++)
            rc = scrub_range(d, s, s->free[k].off, s->free[k].off + s->free[k].len, n_zeroed);
        if (rc == MN_OK && *n_zeroed > before) rc = aio_fdatasync(d->aio, &s->file);
    }
    return rc == MN_OK ? MN_OK : medium_code(rc);
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
    *offset = dr->offset + ext_at(dr, layer);
    *len = ext_len(dr, layer);
    return MN_OK;
}
