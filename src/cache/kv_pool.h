/* kv_pool.h — the compute pool: KV of all sequences, in fixed-size blocks.
 *
 * One arena per layer. Block slot b of layer l holds the K rows and then the
 * V rows of that block's block_tokens tokens for layer l:
 *     arena[l] : (n_blocks, 2, block_tokens, kv_dim) elements of kv_type
 * A block is the same slot index in every layer's arena, so a sequence's
 * block table (logical block i -> slot) serves all layers, and the blocks of
 * one sequence can be anywhere in the pool. Attention reads them in place.
 *
 * Life cycle of a slot (this part of it):
 *
 *     FREE --kvpool_alloc--> IN USE (refcount >= 1) --kvpool_release to 0--> FREE
 *                             ^  kvpool_retain adds a reference (sharing)
 *
 * The pool is owned by the engine thread; nothing here locks.
 */
#ifndef MN_KV_POOL_H
#define MN_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "base/ttype.h"

typedef struct KvPool {
    int n_layer;
    int kv_dim;          /* K (and V) elements per token per layer */
    int block_tokens;
    int n_blocks;
    MnType kv_type;      /* MN_TYPE_F16 or MN_TYPE_F32 */
    size_t block_bytes;  /* bytes of one block in one layer (K and V) */
    uint8_t **arenas;    /* (n_layer) each (n_blocks * block_bytes), 64-byte aligned */
    int32_t *refcount;   /* (n_blocks) */
    int32_t *free_list;  /* stack of free slots */
    int n_free;
} KvPool;

/* Build a pool of n_blocks blocks. MN_EINVAL for bad sizes or a kv_type other
 * than f16/f32, MN_ENOMEM. On failure the pool is left zeroed. */
int kvpool_init(KvPool *p, int n_layer, int kv_dim, int block_tokens, int n_blocks, MnType kv_type);
void kvpool_deinit(KvPool *p);

/* Bytes a pool of n_blocks would take. */
uint64_t kvpool_bytes_for(int n_layer, int kv_dim, int block_tokens, int n_blocks, MnType kv_type);

/* Take a free slot (refcount 1) into *out; MN_EFULL when none is free. */
int kvpool_alloc(KvPool *p, int32_t *out);
void kvpool_retain(KvPool *p, int32_t slot);
void kvpool_release(KvPool *p, int32_t slot);
int kvpool_n_free(const KvPool *p);

/* K rows (block_tokens, kv_dim) and V rows of slot in layer l. */
static inline void *kvpool_k(const KvPool *p, int layer, int32_t slot) {
    return p->arenas[layer] + (size_t)slot * p->block_bytes;
}
static inline void *kvpool_v(const KvPool *p, int layer, int32_t slot) {
    return p->arenas[layer] + (size_t)slot * p->block_bytes + p->block_bytes / 2;
}

/* Print the pool's state (for gdb and failing tests). */
void kvpool_dump(const KvPool *p);

#endif
