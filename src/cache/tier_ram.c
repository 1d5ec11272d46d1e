/* tier_ram.c — the host-RAM tier: runs in heap buffers (see tier.h).
 *
 * The first tier below the pool: cheaper than disk, dearer than the pool,
 * sized by --ram-tier-mb. Each run is one heap buffer laid out [layer][block]:
 *     run->data : layer 0's n_blocks blocks, then layer 1's, ...
 * a block of layer l being block_bytes of K/V, or hidden_bytes of hidden
 * states when the run stores layer l so (run->hidden, tier_layer_bytes),
 * so a layer of a run is one contiguous piece, as in every tier. The
 * budget counts exactly those bytes; eviction (least recently used run
 * first) is the core's (tier.c). Memory does not corrupt itself, so no
 * checksums here: the tier is exact by construction.
 *
 * Owner: the mover thread, through the core; nothing locks.
 */
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"
#include "cache/tier_impl.h"

/* ---- types --------------------------------------------------------------- */

typedef struct RamTier {
    int n_layer;
    size_t block_bytes;
    size_t hidden_bytes;
} RamTier;

static size_t layer_bytes(const RamTier *rt, uint64_t hidden, int l) {
    return tier_layer_bytes(rt->block_bytes, rt->hidden_bytes, hidden, l);
}

/* Where layer l of a run of n_blocks begins in its buffer (l = n_layer:
 * the run's size). */
static uint64_t layer_at(const RamTier *rt, int n_blocks, uint64_t hidden, int l) {
    return tier_layer_at((uint64_t)n_blocks * rt->block_bytes, (uint64_t)n_blocks * rt->hidden_bytes, hidden, l);
}

/* ---- kind operations ----------------------------------------------------- */

static uint64_t ram_run_bytes(void *kind, int n_blocks, uint64_t hidden) {
    const RamTier *rt = kind;
    return layer_at(rt, n_blocks, hidden, rt->n_layer); /* bounded by the pool's own size */
}

static int ram_reserve(void *kind, TierRun *run) {
    if (run->n_bytes > SIZE_MAX) return MN_ENOMEM;
    run->data = mn_malloc((size_t)run->n_bytes);
    return run->data != NULL ? MN_OK : MN_ENOMEM;
}

static int ram_write(void *kind, TierRun *run, const KvPool *pool, const int32_t *slots, uint64_t *io_bytes) {
    const RamTier *rt = kind;
    uint8_t *dst = run->data;
    for (int l = 0; l < rt->n_layer; l++) {
        size_t bb = layer_bytes(rt, run->hidden, l);
        for (int i = 0; i < run->n_blocks; i++) {
            memcpy(dst, tier_pool_layer(pool, run->hidden, l, slots[i]), bb);
            dst += bb;
        }
    }
    *io_bytes = run->n_bytes;
    return MN_OK;
}

static int ram_read_layer(void *kind, TierRun *run, int layer, const int32_t *idx, const int32_t *slots, int n,
                          KvPool *pool, uint64_t *io_bytes) {
    const RamTier *rt = kind;
    const uint8_t *base = (const uint8_t *)run->data + layer_at(rt, run->n_blocks, run->hidden, layer);
    size_t bb = layer_bytes(rt, run->hidden, layer);
    for (int k = 0; k < n; k++) memcpy(tier_pool_layer(pool, run->hidden, layer, slots[k]), base + (size_t)idx[k] * bb, bb);
    *io_bytes = (uint64_t)n * bb;
    return MN_OK;
}

static void ram_release(void *kind, TierRun *run) {
    mn_free(run->data);
    run->data = NULL;
}

static void ram_free(void *kind) { mn_free(kind); }

static const TierKindOps ram_ops = {
    .name = "ram",
    .run_bytes = ram_run_bytes,
    .reserve = ram_reserve,
    .write = ram_write,
    .read_layer = ram_read_layer,
    .release = ram_release,
    .free = ram_free,
};

/* ---- API ----------------------------------------------------------------- */

int tier_ram_new_hidden(int n_layer, size_t block_bytes, size_t hidden_bytes, uint64_t capacity_bytes, Tier **out) {
    *out = NULL;
    RamTier *rt = mn_calloc(1, sizeof *rt);
    if (rt == NULL) return MN_ENOMEM;
    rt->n_layer = n_layer;
    rt->block_bytes = block_bytes;
    rt->hidden_bytes = hidden_bytes;
    int rc = tier_new_kind(&ram_ops, rt, n_layer, block_bytes, capacity_bytes, NULL, out);
    if (rc == MN_OK) tier_set_hidden_bytes(*out, hidden_bytes);
    return rc;
}

int tier_ram_new(int n_layer, size_t block_bytes, uint64_t capacity_bytes, Tier **out) {
    return tier_ram_new_hidden(n_layer, block_bytes, 0, capacity_bytes, out);
}
