/* tier_impl.h — the contract between the tier core (tier.c) and a tier
 * kind (tier_ram.c, tier_disk.c). Only tier code includes this.
 *
 * The core decides what is stored, where each block is, what to evict and
 * what to count; a kind only reserves room on its medium, moves a run's
 * bytes there and back, and frees the room. The core calls a kind from the
 * tier's owner thread only, never while another call into it is running,
 * and only for runs it has reserved and not yet released:
 *
 *   reserve -> write -> { read_layer }* -> release
 *   (a failed reserve needs no release; a failed write does)
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
    struct TierRun *lru_prev, *lru_next; /* head of the core's list = LRU */
    void *data;                         /* the kind's: where the bytes are */
    int check_live;                     /* scratch for tier_check */
    Hash128 hashes[];                   /* (n_blocks) */
} TierRun;

typedef struct TierKindOps {
    const char *name;
    /* Bytes a run of n_blocks takes on the medium (counted against the
     * budget); UINT64_MAX when such a run can never fit. */
    uint64_t (*run_bytes)(void *kind, int n_blocks);
    /* Claim run->n_bytes of room and set run->data. MN_EFULL when the
     * medium has no room now (the core evicts and asks again), MN_ENOMEM,
     * MN_EIO. */
    int (*reserve)(void *kind, TierRun *run);
    /* Copy all layers of the run out of pool (block i from slots[i]);
     * *io_bytes = bytes moved to the medium. MN_EFULL, MN_EIO, MN_ENOMEM. */
    int (*write)(void *kind, TierRun *run, const KvPool *pool, const int32_t *slots, uint64_t *io_bytes);
    /* Copy layer `layer` of blocks idx[k] of the run into slots[k], k < n,
     * after verifying what the medium returned; *io_bytes = bytes read
     * from the medium. MN_ECHECKSUM, MN_EIO, MN_ENOMEM. */
    int (*read_layer)(void *kind, TierRun *run, int layer, const int32_t *idx, const int32_t *slots, int n,
                      KvPool *pool, uint64_t *io_bytes);
    void (*release)(void *kind, TierRun *run);
    /* Start over after the core released every run (tier_reset); may be
     * NULL. */
    int (*reset)(void *kind);
    void (*check)(const void *kind, uint64_t occupancy_bytes); /* may be NULL */
    void (*dump)(const void *kind);                             /* may be NULL */
    void (*free)(void *kind);
} TierKindOps;

/* A tier over kind (owned from now on: freed with the tier, also when this
 * fails). MN_EINVAL, MN_ENOMEM; *out NULL on failure. */
int tier_new_kind(const TierKindOps *ops, void *kind, int n_layer, size_t block_bytes, uint64_t capacity_bytes,
                  Tier **out);
const TierKindOps *tier_kind_ops(const Tier *t);
void *tier_kind(const Tier *t);
/* The run holding hash and the block's index in it, or NULL. */
TierRun *tier_find_run(const Tier *t, const Hash128 *hash, int *index);

#endif
