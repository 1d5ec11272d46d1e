/* tier.h — the stores below the compute pool: one interface for every tier.
 *
 * A tier holds RUNS: n consecutive blocks of one sequence, named by their
 * block hashes (index.h), copied out of the pool in one piece and stored
 * layer-major ([layer][block]), so one layer of a run is one contiguous
 * extent that can be restored — and used by the forward pass — before the
 * next layer has arrived. Every tier is exact: a block comes back bit for
 * bit as it went in.
 *
 * The bookkeeping (which block is in which run, LRU order, byte budget,
 * eviction, counters, the sticky error state) is common to all tiers and
 * lives in tier.c; a tier kind (tier_ram.c, tier_disk.c) only stores and
 * fetches bytes, behind the backend contract in tier_impl.h.
 *
 * Life cycle of a run:
 *
 *            tier_put_run                tier_read_layer(s) (moves it to MRU)
 *   (none) ---------------> STORED ----------------------------+
 *      |                     ^   |  ^                           |
 *      +---------------------+   |  +---------------------------+
 *      tier_disk_new, adopting   |
 *      a stored run; tier_redis_ +--> (gone) by: eviction inside tier_put_run
 *      probe, adopting a run      (by tier_set_policy), tier_drop_run,
 *      another instance stored    tier_drop of its last live block, a checksum
 *                                 failure or a run the medium no longer has
 *                                 in tier_read_layer, tier_expire, tier_reset
 *
 * Each run carries the wall-clock time it was last used (put, or a read of
 * its layer 0); tier_expire drops the runs not used since a cutoff. With a
 * CacheStore (store.h) the disk tier is persistent: its runs survive
 * tier_free and a crash, and tier_disk_new adopts them again.
 *
 * A block hash maps to at most one run. Putting a run that contains blocks
 * already held moves them to the new run (the new copy wins); a run none of
 * whose blocks is mapped any more is freed at once.
 *
 * Reads may name any held blocks, in any order, spread over any number of
 * stored runs (blocks 3..9 when runs hold 0..5 and 6..12 is fine). A layer
 * is verified as a whole extent of its run, so a read that needs only part
 * of a run still fetches (and counts) that run's whole layer extent: ask for
 * whole runs (tier_locate tells a block's run) to move no extra bytes.
 *
 * Blocks that leave a tier are reported through the drop callback
 * (tier_set_drop_fn) — evictions, checksum failures, expiry, tier_drop_run,
 * tier_reset — except the block named in a tier_drop call, which the caller
 * already knows about. The callback runs inside the tier call that dropped
 * them and must not call back into the tier. An eviction inside
 * tier_put_run may report blocks that the same put then stores again:
 * record the put's blocks after it returns.
 *
 * Threads: a Tier belongs to one thread (the mover) — every function here,
 * tier_stats included, is called from it; nothing locks. tier_put_run reads
 * and tier_read_layer writes the given pool slots' bytes: the caller keeps
 * those slots referenced and out of the engine's way meanwhile.
 *
 * Errors: MN_EIO from a device is sticky: the tier then refuses every call
 * with MN_EIO until tier_reset (SQLite's pager error state). MN_EFULL and
 * MN_ECHECKSUM are not sticky: the tier keeps working. A tier over a
 * remote store that may come back (tier_is_retried: redis) is reset by its
 * owner with a back-off; a local device stays off until a restart.
 *
 * A shared store (redis) also decides on its own what it keeps: a run this
 * tier holds may be gone when it is read. The read then fails with
 * MN_ENOTFOUND, and the run is dropped (reported as TIER_DROP_MISSING) and
 * counted, as a checksum failure is: the caller recomputes.
 */
#ifndef MN_TIER_H
#define MN_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hash.h"
#include "cache/aio.h"
#include "cache/cost.h"
#include "cache/kv_pool.h"
#include "cache/policy.h"
#include "cache/reply_mem.h"

typedef struct Tier Tier;
typedef struct CacheStore CacheStore; /* store.h */
typedef struct RedisClusterStats RedisClusterStats; /* redis_cluster.h */

typedef enum TierDropReason {
    TIER_DROP_EVICTED = 1, /* made room for a put */
    TIER_DROP_CHECKSUM,    /* a layer failed its checksum: never used again */
    TIER_DROP_CALLER,      /* tier_drop_run, tier_reset */
    TIER_DROP_EXPIRED,     /* not used since tier_expire's cutoff */
    TIER_DROP_MISSING,     /* the medium no longer had it when read (a
                              shared store evicted or lost it) */
} TierDropReason;

/* Blocks hashes[0..n_hashes) left the tier (the live blocks of one run). */
typedef void (*TierDropFn)(void *ctx, const Hash128 *hashes, int n_hashes, TierDropReason why);

/* What a tier knows of a run besides its blocks and use times: for the
 * eviction policy, the position (in tokens) of its first block's first
 * token in its sequence (the runs the engine saves are blocks of one
 * sequence, in order); for tier_drop_namespace and the disk tier's
 * records, the namespace its blocks belong to. */
typedef struct TierRunInfo {
    int32_t pos;
    const Hash128 *ns_id; /* index_namespace_id; NULL: not known */
    uint64_t hidden;      /* layers (bit l: layer l < 64; later layers
                             are always K/V) to store as the hidden states
                             of the pool's hidden arenas (kvpool_h) rather
                             than as K/V; a tier made without hidden_bytes
                             stores K/V */
} TierRunInfo;

/* Where a held block lives. */
typedef struct TierLoc {
    uint64_t run_id;   /* unique within the tier's lifetime */
    int index;         /* the block's position in its run */
    int n_blocks;      /* blocks in the run (live or not) */
} TierLoc;

/* Counters since the tier was created (reset does not clear them), for
 * /metrics (mnemo_tier_*). Bandwidth = bytes / seconds. */
typedef struct TierStats {
    const char *name;          /* "ram", "disk" */
    uint64_t capacity_bytes;   /* the byte budget */
    uint64_t occupancy_bytes;  /* bytes of stored runs, padding included */
    uint64_t kv_bytes, hidden_bytes; /* of those, the layers stored as K/V and as hidden states
                                        (their payload: padding and headers not counted) */
    uint64_t n_runs;           /* runs stored now */
    uint64_t n_blocks;         /* live blocks stored now */
    uint64_t bytes_written, bytes_read;  /* moved to / from the medium */
    double write_seconds, read_seconds;  /* wall time of puts / layer reads */
    uint64_t n_puts, n_layer_reads;      /* successful calls */
    uint64_t n_puts_full;                /* puts refused with MN_EFULL */
    uint64_t n_evicted_runs, n_evicted_blocks;
    uint64_t n_expired_runs, n_expired_blocks; /* tier_expire */
    uint64_t n_adopted_runs;             /* taken over from the store at open */
    uint64_t n_checksum_failures;        /* layer extents that failed */
    uint64_t n_missing_runs;             /* runs the medium no longer had when read */
    uint64_t n_io_errors;                /* sticky failures entered */
    uint64_t n_resets;                   /* tier_reset calls that left the error state */
    bool is_failed;                      /* in the sticky error state now */
} TierStats;

/* ---- constructors ---------------------------------------------------------- */

/* Host RAM: runs in heap buffers, at most capacity_bytes of them
 * (evicting by tier_set_policy). The tier stores blocks of pools with
 * these n_layer and block_bytes only. MN_EINVAL, MN_ENOMEM; *out NULL on failure. */
int tier_ram_new(int n_layer, size_t block_bytes, uint64_t capacity_bytes, Tier **out);
/* The same, storing the layers a put asks for as hidden states of
 * hidden_bytes a block (the pool's; 0: none). */
int tier_ram_new_hidden(int n_layer, size_t block_bytes, size_t hidden_bytes, uint64_t capacity_bytes, Tier **out);

typedef struct TierDiskConfig {
    const char *dir;           /* created (one level) if missing */
    uint64_t capacity_bytes;   /* data bytes budget (slab headers extra) */
    int n_layer;
    size_t block_bytes;
    size_t hidden_bytes;       /* a block of a layer stored as hidden states
                                  (the pool's); 0: every run is stored as
                                  KV, and stored runs with hidden layers are
                                  not adopted */
    Hash128 model_fingerprint; /* stamped in slab headers and run records */
    uint32_t kv_format;        /* index_kv_format() */
    uint64_t slab_bytes;       /* data bytes per slab file; 0 = 256 MiB */
    AioBackend aio_backend;    /* AIO_BACKEND_AUTO normally */
    int queue_depth;           /* requests in flight; 0 = 32 */
    uint64_t read_window_bytes; /* bytes a tier_read_layers keeps in
                                  flight (whole spans of layers, at least
                                  one layer); 0 = 8 MiB */
    int read_inflight;         /* of those, requests in the device at once
                                  (at most queue_depth); 0 = 4 */
    bool is_durable;           /* fdatasync each run before it is visible */
    bool is_clamped_to_room;   /* cut a budget over the filesystem's free
                                  space (plus the tier's slab files) to it,
                                  with a warning (a server's; not a tool's
                                  that only reads or drops runs) */
    CacheStore *store;         /* borrowed, outlives the tier: the run
                                  records' home; NULL = not persistent */
    int test_open_alloc_skip;  /* tests: of the allocations made while the */
    int test_open_alloc_fail;  /* tier opens (its own and its core's), the
                                  first skip succeed and the next fail fail
                                  (MN_ENOMEM); both 0 normally */
} TierDiskConfig;

/* Files under cfg->dir, written and read with aio (O_DIRECT where the
 * filesystem allows). Format: top of tier_disk.c.
 * Without a store the tier starts empty and its slab files are recreated.
 * With one (opened on cfg->dir, same identity) it reopens the slab files
 * and adopts every valid stored run (invalid records are deleted, logged;
 * beyond the budget the least recently used go); no drop callback hears of
 * those, as none is set yet. tier_foreach_run then lists what is held.
 * MN_EINVAL (bad sizes, a store of another identity, with a message in
 * err), MN_EIO / MN_ENOTFOUND (directory),
 * MN_ENOMEM, a store's code. */
int tier_disk_new(const TierDiskConfig *cfg, Tier **out, MnErr *err);

/* NULL is fine; no drop callbacks. A persistent disk tier keeps its runs
 * (records and bytes) for the next tier_disk_new. */
void tier_free(Tier *t);

/* ---- operations ------------------------------------------------------------ */

/* Report dropped blocks to fn (see above); fn NULL to stop. */
void tier_set_drop_fn(Tier *t, TierDropFn fn, void *ctx);

/* Copy the run of n_blocks blocks (hashes[i] lives in pool slot slots[i],
 * all layers; info may be NULL: position 0) into the tier, evicting runs
 * (tier_set_policy) while the budget or the medium lacks room. MN_OK:
 * every hashes[i] is held, in this run. MN_EFULL: the run cannot fit at
 * all (bigger than the budget, or the medium is out of space even with
 * everything evicted) — not stored, the tier keeps working. MN_EINVAL:
 * n_blocks < 1 or over tier_max_run_blocks, a slot out of range, a pool
 * of another geometry. MN_ENOMEM, MN_EIO (sticky). */
int tier_put_run(Tier *t, const Hash128 *hashes, int n_blocks, const KvPool *pool, const int32_t *slots,
                 const TierRunInfo *info);

/* Which run goes when room is needed (policy.h), whole runs at a time:
 * EVICT_LRU (the default) takes the least recently used run. The others
 * score each run as one candidate: its last use (put or restore) stands
 * for its conversation's last access, its put for its insertion, its
 * TierRunInfo.pos for its position, and its window index is the smallest
 * of its live blocks' (tier_set_window). cost may be NULL (cost grows as
 * pos + 1); it is copied. */
void tier_set_policy(Tier *t, EvictPolicy policy, const CostModel *cost);

/* The scheduler's look-ahead window: block hashes[i] belongs to the cached
 * history of the waiting request at window index idx[i] (0 = next to be
 * scheduled). With a window policy, runs holding such blocks go only after
 * every other run, the tail of the window first. Replaces the previous
 * window (copied); n = 0 clears it. MN_ENOMEM keeps the previous one. */
int tier_set_window(Tier *t, const Hash128 *hashes, const int32_t *idx, int n);

/* Whether the block is held. */
bool tier_has(const Tier *t, const Hash128 *hash);
/* Where the block is held: MN_OK and *out, or MN_ENOTFOUND. */
int tier_locate(const Tier *t, const Hash128 *hash, TierLoc *out);

/* Restore layer `layer` of the blocks hashes[0..n_blocks) into pool slots
 * slots[i], verifying each stored extent as it arrives. MN_OK: those bytes
 * are in the pool and the runs touched become most recently used.
 * MN_ENOTFOUND: a block is not held (nothing read), or a shared store no
 * longer had a run (it is dropped, reported and counted). MN_ECHECKSUM: a
 * stored extent failed its check — its run is dropped (reported) and
 * counted. After either failure the slots' contents are undefined.
 * MN_EINVAL, MN_ENOMEM, MN_EIO (sticky). */
int tier_read_layer(Tier *t, const Hash128 *hashes, int n_blocks, int layer, KvPool *pool, const int32_t *slots);

/* Called by tier_read_layers once layer `layer` of every requested block
 * is verified and in the pool, for layer 0, 1, ... in order. */
typedef void (*TierLayerFn)(void *ctx, int layer);

/* The layers of held block `hash` that its run stores as hidden states
 * (TierRunInfo.hidden as stored); 0 when not held. A read brings those
 * layers into the slots' hidden rows (kvpool_h) instead of their K/V: the
 * reader projects them (fwd_project). */
uint64_t tier_block_hidden(const Tier *t, const Hash128 *hash);

/* Restore every layer of the blocks hashes[0..n_blocks) into pool slots
 * slots[i], layer 0 first, calling layer_fn (may be NULL) as each layer is
 * in place, so a consumer can use the early layers while later ones are
 * still arriving. The disk tier reads spans of several layers of each run
 * (contiguous on disk), several spans in flight at once (read_window_bytes
 * of them, read_inflight requests in the device at a time, so that the
 * first spans arrive while the rest are read), and moves at close to the
 * device's sequential read rate; other kinds copy layer by layer. Results
 * as tier_read_layer; after a failure layer_fn has been called exactly
 * for the layers completed before it, and the slots' contents in the
 * other layers are undefined. */
int tier_read_layers(Tier *t, const Hash128 *hashes, int n_blocks, KvPool *pool, const int32_t *slots,
                     TierLayerFn layer_fn, void *ctx);

/* The most blocks a run put into t may hold (tier_put_run refuses longer
 * ones); 0: any number. A shared store keeps its values small
 * (TierRedisConfig.value_bytes): the mover cuts longer runs to this. */
int tier_max_run_blocks(const Tier *t);

/* What tier_measure_read read: bytes from the medium, in seconds. */
typedef struct TierReadRate {
    uint64_t bytes;
    double seconds;
} TierReadRate;

/* The medium's read rate as a restore meets it: a scratch run of blocks
 * slots[0..n) of pool (their bytes, whatever they hold, as K/V) is
 * written to the medium, read back into the same slots the way
 * tier_read_layers reads (verified; the bytes come back unchanged) and
 * deleted; *out = the bytes the read moved and its time. Nothing the
 * tier holds, counts or reports changes: the run is in no map or list,
 * its hashes are fresh (salt, e.g. the process and the time, keeps two
 * instances on one shared store apart), it claims room only while it
 * lasts, and a shared store deletes it again. MN_EFULL when the budget or
 * the medium has no room for it now (nothing is evicted for it); MN_EIO
 * (sticky, as a failed put), MN_ECHECKSUM, MN_ENOTFOUND (a shared store
 * let it go), MN_ENOMEM, MN_EINVAL; *out is zero on failure. The engine's
 * restore planner starts from this figure until restores measure the
 * tier (mover.h, MoverConfig.measure_reads). */
int tier_measure_read(Tier *t, KvPool *pool, const int32_t *slots, int n, uint64_t salt, TierReadRate *out);

/* The blocks hashes[0..n) were used at `when` (unix seconds, as
 * mn_wall_now): each run holding one, unless already used since, takes
 * that as its last use and becomes most recently used, as if read. The
 * engine says so of every block of a sequence when its turn ends, so a
 * conversation's runs age together — also those it did not need to read
 * because their blocks were still in the pool. Blocks not held are
 * skipped. Returns how many runs moved. */
int tier_touch(Tier *t, const Hash128 *hashes, int n, double when);

/* Forget one block (its run's storage is freed with its last live block).
 * MN_OK or MN_ENOTFOUND. */
int tier_drop(Tier *t, const Hash128 *hash);
/* Forget the whole run holding this block; all its live blocks, the named
 * one included, are reported (TIER_DROP_CALLER). MN_OK or MN_ENOTFOUND. */
int tier_drop_run(Tier *t, const Hash128 *hash);

/* Drop every run of namespace ns_id, and every run whose namespace is not
 * known (TierRunInfo.ns_id was NULL); ns_id NULL drops every run. Reported
 * with TIER_DROP_CALLER. Returns the number of runs dropped (*n_blocks:
 * their live blocks; may be NULL). Works in the error state too. */
int tier_drop_namespace(Tier *t, const Hash128 *ns_id, int *n_blocks);

/* Drop every run last used before cutoff (unix seconds, CLOCK_REALTIME),
 * reported with TIER_DROP_EXPIRED. Returns the number of live blocks
 * dropped. Works in the error state too (touches no medium). */
int tier_expire(Tier *t, double cutoff);

/* Drop everything (reported) and leave the error state; the disk tier
 * starts over with fresh files and a fresh Aio (and no stored runs). MN_OK,
 * or the code of what failed while starting over (the tier is then in the
 * error state). */
int tier_reset(Tier *t);

/* Call fn once per stored run, least recently used first, with the run's
 * live blocks in run order (hashes valid during the call only). fn must
 * not call into the tier. After a restart the engine seeds its directory
 * from this. */
typedef void (*TierRunFn)(void *ctx, const Hash128 *hashes, int n_hashes);
void tier_foreach_run(const Tier *t, TierRunFn fn, void *ctx);

void tier_stats(const Tier *t, TierStats *out);
const char *tier_name(const Tier *t);
/* Whether the tier is in the sticky error state. */
bool tier_is_failed(const Tier *t);
/* Whether the tier's owner should reset it after an I/O error, with a
 * back-off (a remote store that may come back: redis); false for a local
 * device, which stays off. */
bool tier_is_retried(const Tier *t);

/* Check every invariant (map against runs, counts, occupancy within the
 * budget, the kind's own); aborts with a dump on a broken one. */
void tier_check(const Tier *t);
/* Print the tier's runs and counters to stderr (gdb, failing tests). */
void tier_dump(const Tier *t);

/* Test hook, any kind: of the allocations the core makes from now on (its
 * key map and scratch growing, each run's record) and of the kind's room
 * for each put (failing as the kind's own allocation would), the first
 * n_skip succeed and the next n_fail fail with MN_ENOMEM; n_fail 0
 * clears it. */
void tier_fault_alloc(Tier *t, int n_skip, int n_fail);

typedef struct TierRedisConfig {
    const char *const *urls;   /* (n_urls) redis://[user[:password]@]host[:port][/db]
                                  or unix://[user[:password]@]/path.sock[?db=N]:
                                  the server (one URL), or with is_cluster a
                                  Redis Cluster's seeds (redis_cluster.h) */
    int n_urls;
    bool is_cluster;
    uint64_t capacity_bytes;   /* what the tier remembers of the store: the
                                  stored bytes of the runs it knows of (its
                                  puts and those tier_redis_probe found);
                                  forgetting one loses nothing; 0 = 1 TiB */
    int n_layer;
    size_t block_bytes;
    size_t hidden_bytes;       /* a block of a layer stored as hidden states
                                  (the pool's); 0: every run is stored as
                                  KV, and stored runs with hidden layers are
                                  misses */
    Hash128 model_fingerprint; /* in every value's header */
    uint32_t kv_format;        /* index_kv_format() */
    int ttl_s;                 /* keys expire this long after their last put
                                  or use; 0: never (the server's maxmemory
                                  policy decides) */
    int timeout_ms;            /* connecting, and each read or write on the
                                  connection; 0 = 1000 */
    uint64_t read_window_bytes; /* a restore's layer values requested ahead
                                  (whole layers, at least one); 0 = 512 KiB */
    uint64_t value_bytes;      /* a layer value holds blocks of at most this
                                  many bytes (whole blocks, at least one), so
                                  runs are at most that long
                                  (tier_max_run_blocks); 0 = TIER_REDIS_VALUE_BYTES */
} TierRedisConfig;

/* The blocks of one Redis value at most, in bytes. Redis copies a GET's
 * value into a reply buffer of the value's size, and its allocator
 * (jemalloc) maps a buffer of 8 MiB or more afresh each time and gives it
 * back at once: on a virtual machine whose page faults are dear, values
 * of 8 MiB read at about 150 MB/s where values of 2 MiB read at 5-6 GB/s
 * (docs/OPERATIONS.md, "The Redis tier's key layout"). */
#define TIER_REDIS_VALUE_BYTES (2ull << 20)

/* A tier in a Redis server, shared by every mnemo instance that uses it
 * (key and value format: top of tier_redis.c), or in a Redis Cluster
 * (is_cluster: the client of redis_cluster.h routes each key to its node).
 * The URLs are checked here (MN_EINVAL with a message that leaves their
 * credentials out; rediss:// is refused: hiredis 0.14 has no TLS). A
 * server (a cluster: every seed) that does not answer is no error: the
 * tier starts in the error state, and its owner resets it with a back-off
 * (tier_is_retried); a cluster node that fails puts the tier in the error
 * state the same way. Nothing it logs names the credentials.
 * A write to a server that died raises SIGPIPE: the process must ignore
 * it (mnemo serve does), so that it is an error instead.
 * MN_ENOMEM; *out NULL on failure. */
int tier_redis_new(const TierRedisConfig *cfg, Tier **out, MnErr *err);

/* Look blocks up in the shared store, where other instances may have put
 * them. hashes[0..n) are one sequence's blocks in order; those with want[i]
 * set are looked up. Every stored run found holding one of them is adopted
 * (the part of it this sequence names), unless some of its values are gone
 * from the store; tier_has then tells which blocks the tier holds.
 * block_tokens and ns_id (may be NULL) make the adopted runs' TierRunInfo.
 * Returns the number of runs adopted (>= 0), or -MN_EIO (sticky),
 * -MN_ENOMEM, -MN_EINVAL (not a redis tier). */
int tier_redis_probe(Tier *t, const Hash128 *hashes, const uint8_t *want, int n, int block_tokens,
                     const Hash128 *ns_id);
/* The store's URL (a cluster: "cluster " and its seeds) as the logs show
 * it (credentials left out); "" for other kinds. Valid until tier_free. */
const char *tier_redis_url(const Tier *t);
/* The client's counters (redirections followed, slot maps read); zeros
 * for other kinds. */
void tier_redis_client_stats(const Tier *t, RedisClusterStats *out);

/* Share a reply-memory entry (reply_mem.h) of namespace ns_id with the
 * other instances: (key, text) -> ids, keyed in the store by the text.
 * Sent without waiting (a failure shows at the tier's next exchange).
 * MN_OK, MN_EIO (the tier is off), MN_EINVAL (not a redis tier, or an
 * entry too large). */
int tier_redis_put_reply(Tier *t, const Hash128 *ns_id, const Hash128 *key, const char *text, size_t len,
                         const int32_t *ids, size_t n_ids);
/* Look the reply texts texts[0..n) of namespace ns_id up in the store and
 * put every sound entry found into rm (a damaged one is skipped). Returns
 * how many were put, or -MN_EIO (sticky), -MN_EINVAL. */
int tier_redis_get_replies(Tier *t, const Hash128 *ns_id, const char *const *texts, const size_t *lens, int n,
                           ReplyMemory *rm);

/* ---- disk tier, for tests and tools ----------------------------------------- */

/* The Aio the disk tier uses (fault injection in tests); NULL for others. */
Aio *tier_disk_aio(Tier *t);
/* Test hook: of the allocations the disk tier makes from now on while
 * serving (its staging buffer and request array, a new slab's free list
 * and the growth of one, the run records it encodes, each run's own
 * record), the first n_skip succeed and the next n_fail fail (MN_ENOMEM),
 * as real ones would; n_fail 0 clears it. No-op for other kinds. */
void tier_disk_fault_alloc(Tier *t, int n_skip, int n_fail);
/* Overwrite with zeros every byte of the slab files' data areas that no
 * held run occupies — what dropped, evicted and expired runs left behind —
 * and sync the files. For a tool that has the directory to itself (mnemo
 * cache purge): the writes are not counted in the stats, and a failure
 * (MN_EIO, MN_EFULL) is returned without putting the tier in the error
 * state. *n_zeroed: bytes written (ranges the filesystem reports as holes
 * read as zeros and are skipped). MN_EINVAL for other kinds. */
int tier_disk_scrub(Tier *t, uint64_t *n_zeroed);
/* The data file and extent holding layer `layer` of the run that holds
 * hash: path (NUL-terminated, truncated to cap), file offset, length.
 * MN_ENOTFOUND, MN_EINVAL (not a disk tier, bad layer). */
int tier_disk_extent(const Tier *t, const Hash128 *hash, int layer, char *path, size_t cap, uint64_t *offset,
                     uint64_t *len);

#endif
