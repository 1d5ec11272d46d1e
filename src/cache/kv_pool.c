/* kv_pool.c — block allocation over per-layer arenas (see kv_pool.h).
 *
 * Free slots sit on a stack, so allocation and release are O(1). The
 * refcount of a free slot is 0; a slot with a positive refcount is never on
 * the stack (checked in debug builds by kvpool_dump's caller tests).
 */
#include "cache/kv_pool.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

uint64_t kvpool_bytes_for(int n_layer, int kv_dim, int block_tokens, int n_blocks, MnType kv_type) {
    uint64_t elem = kv_type == MN_TYPE_F16 ? 2 : 4;
    return (uint64_t)n_layer * (uint64_t)n_blocks * 2 * (uint64_t)block_tokens * (uint64_t)kv_dim * elem;
}

int kvpool_init(KvPool *p, int n_layer, int kv_dim, int block_tokens, int n_blocks, MnType kv_type) {
    memset(p, 0, sizeof *p);
    if (n_layer <= 0 || kv_dim <= 0 || block_tokens <= 0 || n_blocks <= 0 ||
        (kv_type != MN_TYPE_F16 && kv_type != MN_TYPE_F32))
        return MN_EINVAL;
    p->n_layer = n_layer;
    p->kv_dim = kv_dim;
    p->block_tokens = block_tokens;
    p->n_blocks = n_blocks;
    p->kv_type = kv_type;
    p->block_bytes = (size_t)kvpool_bytes_for(1, kv_dim, block_tokens, 1, kv_type);
    p->arenas = mn_calloc((size_t)n_layer, sizeof *p->arenas);
    p->refcount = mn_calloc((size_t)n_blocks, sizeof *p->refcount);
    p->free_list = mn_calloc((size_t)n_blocks, sizeof *p->free_list);
    if (p->arenas == NULL || p->refcount == NULL || p->free_list == NULL) goto nomem;
    for (int l = 0; l < n_layer; l++) {
        /* size: n_blocks * block_bytes, both bounded above, fits 64 bits */
        p->arenas[l] = mn_alloc_aligned((size_t)n_blocks * p->block_bytes, 64);
        if (p->arenas[l] == NULL) goto nomem;
    }
    for (int i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i; /* slot 0 on top */
    p->n_free = n_blocks;
    return MN_OK;
nomem:
    kvpool_deinit(p);
    return MN_ENOMEM;
}

void kvpool_deinit(KvPool *p) {
    if (p->arenas != NULL)
        for (int l = 0; l < p->n_layer; l++) mn_free_aligned(p->arenas[l]);
    mn_free(p->arenas);
    mn_free(p->refcount);
    mn_free(p->free_list);
    memset(p, 0, sizeof *p);
}

int kvpool_alloc(KvPool *p, int32_t *out) {
    if (p->n_free == 0) return MN_EFULL;
    int32_t slot = p->free_list[--p->n_free];
    assert(p->refcount[slot] == 0);
    p->refcount[slot] = 1;
    *out = slot;
    return MN_OK;
}

void kvpool_retain(KvPool *p, int32_t slot) {
    assert(slot >= 0 && slot < p->n_blocks && p->refcount[slot] > 0);
    p->refcount[slot]++;
}

void kvpool_release(KvPool *p, int32_t slot) {
    assert(slot >= 0 && slot < p->n_blocks);
    if (p->refcount[slot] <= 0) {
        LOG_ERROR("kv pool: release of free slot %d", slot);
        return;
    }
    if (--p->refcount[slot] == 0) p->free_list[p->n_free++] = slot;
}

int kvpool_n_free(const KvPool *p) { return p->n_free; }

void kvpool_dump(const KvPool *p) {
    fprintf(stderr, "KvPool: %d layers, %d blocks of %d tokens, kv_dim %d, %s, %zu bytes/block/layer, %d free\n",
            p->n_layer, p->n_blocks, p->block_tokens, p->kv_dim, p->kv_type == MN_TYPE_F16 ? "f16" : "f32",
            p->block_bytes, p->n_free);
    for (int i = 0; i < p->n_blocks; i++)
        if (p->refcount[i] != 0) fprintf(stderr, "  slot %d: refcount %d\n", i, p->refcount[i]);
}
