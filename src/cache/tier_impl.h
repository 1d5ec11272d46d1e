/* tier_impl.h — the contract between the tier core (tier.c) and a tier
 * kind (tier_ram.c, tier_disk.c). Only tier code includes this.
 *
 * The core decides what is stored, where each block is, what to evict and
 * what to count; a kind only reserves room on its medium, moves a run's
 * bytes there and back, and frees the room. The core calls a kind from the
 * tier's owner thread only, never while another call into it is running,
 * and only for runs it has reserved and not yet released:
 *
 *   reserve -> write -> { read_layer | read_layers [touch] }* -> release
 *   (a failed reserve needs no release; a failed write does)
 *
 * A persistent kind also brings back runs it stored in an earlier life:
 * while the tier is being opened it sets up run->data itself and hands
 * the run to tier_adopt_run; from then on the run follows the same path
 * (read_layer, touch, release). tier_free calls close before releasing
 * every run, so a persistent kind can tell "forget it, the process is
 * going" (keep the record) from "it is gone" (delete the record).
 */
#ifndef MN_TIER_IMPL_H
#define MN_TIER_IMPL_H

#include "cache/tier.h"

/* A stored run, owned by the core. */
typedef struct TierRun {
    uint64_t id;                        /* 1, 2, ... in order of creation */
    int n_blocks;
    int n_live;                         /* blocks the map points here */
    uint64_t n_bytes;                   /* kind->run_bytes(n_blocks) */
    double last_used;                   /* unix seconds: put, or a read of layer 0 */
    double inserted;                    /* unix seconds: put (adopted: last_used) */
    int32_t pos;                        /* TierRunInfo.pos */
    uint64_t hidden;                    /* TierRunInfo.hidden, as stored */
    bool has_ns;                        /* TierRunInfo.ns_id was given: */
    Hash128 ns_id;                      /* its namespace */
    int32_t window_idx;                 /* scratch of choose_victim: -1 = not in the window */
    struct TierRun *lru_prev, *lru_next; /* head of the core's list = LRU */
    void *data;                         /* the kind's: where the bytes are */
    int check_live;                     /* scratch for tier_check */
    Hash128 hashes[];                   /* (n_blocks) */
} TierRun;

/* One run's share of a multi-layer read: blocks idx[k] of run go to pool
 * slots[k], k < n. */
typedef struct TierReadGroup {
    TierRun *run;
    const int32_t *idx, *slots;
    int n;
} TierReadGroup;

/* Where a multi-layer read found a bad extent. */
typedef struct TierReadFailure {
    int group, layer;
} TierReadFailure;

typedef struct TierKindOps {
    const char *name;
    /* After an I/O error its owner resets the tier with a back-off (a
     * remote store that may come back): tier_is_retried. */
    bool is_retried;
    /* Bytes a run of n_blocks whose layers `hidden` are hidden states
     * (tier_layer_bytes) takes on the medium (counted against the budget);
     * UINT64_MAX when such a run can never fit. */
    uint64_t (*run_bytes)(void *kind, int n_blocks, uint64_t hidden);
    /* The most blocks one run may hold (tier_max_run_blocks); may be NULL:
     * any number. */
    int (*max_run_blocks)(void *kind);
    /* Claim run->n_bytes of room and set run->data. MN_EFULL when the
     * medium has no room now (the core evicts and asks again), MN_ENOMEM,
     * MN_EIO. */
    int (*reserve)(void *kind, TierRun *run);
    /* Copy all layers of the run out of pool (block i from slots[i]);
     * *io_bytes = bytes moved to the medium. run->id, run->last_used and
     * run->pos are set. A persistent kind records the run only once its
     * bytes are durable. MN_EFULL, MN_EIO, MN_ENOMEM. */
    int (*write)(void *kind, TierRun *run, const KvPool *pool, const int32_t *slots, uint64_t *io_bytes);
    /* Copy layer `layer` of blocks idx[k] of the run into slots[k], k < n,
     * after verifying what the medium returned; *io_bytes = bytes read
     * from the medium. MN_ECHECKSUM, MN_ENOTFOUND (the medium no longer
     * has the run: a shared store's own eviction), MN_EIO, MN_ENOMEM. */
    int (*read_layer)(void *kind, TierRun *run, int layer, const int32_t *idx, const int32_t *slots, int n,
                      KvPool *pool, uint64_t *io_bytes);
    /* Copy every layer of the groups into the pool, layer 0 first, calling
     * layer_fn(ctx, l) (when not NULL) once layer l of every group is
     * verified and in place; *io_bytes = bytes read from the medium. On
     * MN_ECHECKSUM and MN_ENOTFOUND *bad = the group and layer whose
     * extent failed. May be NULL: the core then calls read_layer per layer
     * and group. */
    int (*read_layers)(void *kind, const TierReadGroup *groups, int n_groups, KvPool *pool, TierLayerFn layer_fn,
                       void *ctx, uint64_t *io_bytes, TierReadFailure *bad);
    /* run->last_used changed (a read of layer 0, or tier_touch); may be
     * NULL. Failures are the kind's to log: the read or touch itself
     * succeeded. */
    void (*touch)(void *kind, TierRun *run);
    /* Free the run's room (and, for a persistent kind, its record unless
     * close was called). */
    void (*release)(void *kind, TierRun *run);
    /* Delete the run's bytes from the medium where release keeps them (a
     * shared store); release follows. May be NULL (release frees them).
     * Failures are the kind's to log. */
    void (*discard)(void *kind, TierRun *run);
    /* The tier is being freed: the releases that follow keep what is
     * stored. May be NULL. */
    void (*close)(void *kind);
    /* Start over after the core released every run (tier_reset); may be
     * NULL. */
    int (*reset)(void *kind);
    void (*check)(const void *kind, uint64_t occupancy_bytes); /* may be NULL */
    void (*dump)(const void *kind);                             /* may be NULL */
    void (*free)(void *kind);
} TierKindOps;

/* Allocation failures injected by tests (tier_fault_alloc,
 * tier_disk_fault_alloc): of the allocations that ask from now on, the
 * first n_skip succeed and the next n_fail fail. */
typedef struct AllocFaults {
    int n_skip, n_fail;
    struct AllocFaults *shared; /* when set, the allocations count there */
} AllocFaults;

static inline void alloc_faults_set(AllocFaults *f, int n_skip, int n_fail) {
    f->n_skip = n_skip > 0 ? n_skip : 0;
    f->n_fail = n_fail;
}

/* Whether the allocation about to be made fails. */
static inline bool alloc_faults_take(AllocFaults *f) {
    if (f->shared != NULL) f = f->shared;
    if (f->n_fail <= 0) return false;
    if (f->n_skip > 0) {
        f->n_skip--;
        return false;
    }
    f->n_fail--;
    return true;
}

/* Bytes of one block in layer l of a run whose layers `hidden` (a layer
 * set: kvpool_layer_in) are stored as hidden states: hidden_bytes, else
 * the pool's block_bytes (K then V). */
static inline size_t tier_layer_bytes(size_t block_bytes, size_t hidden_bytes, uint64_t hidden, int l) {
    return kvpool_layer_in(hidden, l) ? hidden_bytes : block_bytes;
}
/* Where such a run's layer l begins when its layers lie one after
 * another, a K/V layer taking kv_len bytes and a hidden one hidden_len:
 * the bytes of layers 0..l-1 (l = n_layer: the whole run). */
static inline uint64_t tier_layer_at(uint64_t kv_len, uint64_t hidden_len, uint64_t hidden, int l) {
    uint64_t h = (uint64_t)__builtin_popcountll(hidden & kvpool_layers_below(l));
    return ((uint64_t)l - h) * kv_len + h * hidden_len;
}
/* Where block `slot`'s bytes of layer l are in the pool for such a run:
 * its hidden rows (kvpool_h) or its K/V (kvpool_k). */
static inline uint8_t *tier_pool_layer(const KvPool *pool, uint64_t hidden, int l, int32_t slot) {
    return kvpool_layer_in(hidden, l) ? (uint8_t *)kvpool_h(pool, l, slot) : (uint8_t *)kvpool_k(pool, l, slot);
}

/* A tier over kind (owned from now on: freed with the tier, also when this
 * fails). faults, when not NULL, is the kind's counter: the allocations
 * made here, and the core's later ones until tier_share_faults(t, NULL),
 * ask it (so a test can sweep everything opening a tier allocates).
 * MN_EINVAL, MN_ENOMEM; *out NULL on failure. */
int tier_new_kind(const TierKindOps *ops, void *kind, int n_layer, size_t block_bytes, uint64_t capacity_bytes,
                  AllocFaults *faults, Tier **out);
/* The kind stores layers as hidden states of hidden_bytes a block (the
 * pool's hidden_bytes); without this call (0) every run is stored as KV,
 * whatever TierRunInfo.hidden asks. Call before the first put or adopt. */
void tier_set_hidden_bytes(Tier *t, size_t hidden_bytes);
/* The core's allocations ask f from now on (NULL: its own counter again). */
void tier_share_faults(Tier *t, AllocFaults *f);
const TierKindOps *tier_kind_ops(const Tier *t);
void *tier_kind(const Tier *t);
/* The run holding hash and the block's index in it, or NULL. */
TierRun *tier_find_run(const Tier *t, const Hash128 *hash, int *index);

/* Take over a run the kind finds on its medium: while the tier is being
 * opened, one it stored earlier; while serving (a shared store), one
 * another instance stored (run_id from tier_new_run_id). Its room is
 * already claimed and data set up as reserve would; info as in
 * tier_put_run, may be NULL. While opening, call in
 * ascending last_used order: the run becomes the most recently used, and
 * least recently used runs are evicted (released, reported, counted)
 * while the budget lacks room. A block already held by a run with a
 * larger id stays there (the later put won); one held by a smaller id
 * moves here, as in tier_put_run. A run left with no live block is
 * released at once. MN_OK: the core owns data (released through the kind
 * from now on). MN_EFULL: n_bytes exceeds the whole budget; MN_EINVAL:
 * n_blocks < 1, run_id 0 or >= 2^48; MN_ENOMEM — in these cases nothing
 * changed and data is still the caller's. */
int tier_adopt_run(Tier *t, uint64_t run_id, const Hash128 *hashes, int n_blocks, void *data, uint64_t n_bytes,
                   double last_used, const TierRunInfo *info);
/* New runs get ids above `id`: ids seen in the store, adopted or not, are
 * never reused (the format wants run ids unique in the directory). */
void tier_skip_run_ids(Tier *t, uint64_t id);
/* A run id no run of the tier has had, for tier_adopt_run while serving. */
uint64_t tier_new_run_id(Tier *t);
/* The kind found its medium failing outside a call of the core (opening a
 * remote store that does not answer): the tier enters the error state
 * (logged once, counted) until tier_reset. */
void tier_fail(Tier *t, const char *what);

#endif
