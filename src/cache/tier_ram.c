/* tier_ram.c — the host-RAM tier: runs in heap buffers (see tier.h).
 *
 * The first tier below the pool: cheaper than disk, dearer than the pool,
 * sized by --ram-tier-mb. Each run is one heap buffer laid out [layer][block]:
 *     run->data : (n_layer, n_blocks, block_bytes) bytes
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
} RamTier;

/* ---- kind operations ----------------------------------------------------- */

static uint64_t ram_run_bytes(void *kind, int n_blocks) {
    const RamTier *rt = kind;
    /* n_layer * n_blocks * block_bytes: bounded by the pool's own size */
    return (uint64_t)rt->n_layer * (uint64_t)n_blocks * (uint64_t)rt->block_bytes;
}

static int ram_reserve(void *kind, TierRun *run) {
    if (run->n_bytes > SIZE_MAX) return MN_ENOMEM;
    run->data = mn_malloc((size_t)run->n_bytes);
    return run->data != NULL ? MN_OK : MN_ENOMEM;
}

static int ram_write(void *kind, TierRun *run, const KvPool *pool, const int32_t *slots, uint64_t *io_bytes) {
    const RamTier *rt = kind;
    uint8_t *dst = run->data;
    for (int l = 0; l < rt->n_layer; l++)
        for (int i = 0; i < run->n_blocks; i++) {
            memcpy(dst, kvpool_k(pool, l, slots[i]), rt->block_bytes);
            dst += rt->block_bytes;
        }
    *io_bytes = run->n_bytes;
    return MN_OK;
}

static int ram_read_layer(void *kind, TierRun *run, int layer, const int32_t *idx, const int32_t *slots, int n,
                          KvPool *pool, uint64_t *io_bytes) {
    const RamTier *rt = kind;
    const uint8_t *base = (const uint8_t *)run->data + (size_t)layer * (size_t)run->n_blocks * rt->block_bytes;
    for (int k = 0; k < n; k++)
        memcpy(kvpool_k(pool, layer, slots[k]), base + (size_t)idx[k] * rt->block_bytes, rt->block_bytes);
    *io_bytes = (uint64_t)n * rt->block_bytes;
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

int tier_ram_new(int n_layer, size_t block_bytes, uint64_t capacity_bytes, Tier **out) {
    *out = NULL;
    RamTier *rt = mn_calloc(1, sizeof *rt);
    if (rt == NULL) return MN_ENOMEM;
    rt->n_layer = n_layer;
    rt->block_bytes = block_bytes;
    return tier_new_kind(&ram_ops, rt, n_layer, block_bytes, capacity_bytes, NULL, out);
}
