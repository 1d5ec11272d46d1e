/* kv_pool.h — the compute pool: KV of all sequences, in fixed-size blocks.
 *
 * One arena per layer. Block slot b of layer l holds the K rows and then the
 * V rows of that block's block_tokens tokens for layer l:
 *     arena[l] : (n_blocks, 2, block_tokens, kv_dim) elements of kv_type
 * A block is the same slot index in every layer's arena, so a sequence's
 * block table (logical block i -> slot) serves all layers, and the blocks of
 * one sequence can be anywhere in the pool. Attention reads them in place.
 *
 * Life cycle of a slot:
 *
 *            kvpool_alloc                      kvpool_release (last ref)
 *     FREE -----------------> IN USE (ref >= 1) ----------------------> FREE
 *      ^                        |  ^                                (not cacheable)
 *      |                        |  | kvpool_retain (revive, cache hit)
 *      |   kvpool_release       v  |
 *      |   (last ref, cacheable) CACHED (ref 0, content kept, on the LRU list)
 *      +---------------------------+
 *        eviction inside kvpool_alloc when no slot is FREE: the least
 *        recently used CACHED slot is reused, and evict_fn tells its owner
 *        (the index) to forget it first; kvpool_expire (TTL) likewise.
 *        kvpool_drop frees a CACHED slot its owner no longer wants (no
 *        callback: the owner asked).
 *
 * Hidden states (optional, kvpool_init_hidden): a second arena per layer
 * holds, per slot, the operand the K and V projections of that layer
 * consumed for each of the block's tokens (docs/DESIGN.md, "Hidden-state
 * restore"), so a tier can store a layer as hidden states instead of KV.
 * Only the first KVPOOL_HIDDEN_MAX_LAYERS layers have such an arena.
 * A slot's hidden rows are usable for a layer when the forward pass wrote
 * every row of the block (it writes all layers of a token at once), or a
 * restore brought that layer's hidden rows (kvpool_note_hidden); a fresh
 * allocation forgets both.
 *
 * kvpool_set_cacheable marks an IN USE slot whose content is final (a full
 * block registered in the index): when its last reference goes it is kept
 * as CACHED instead of freed. The pool is owned by the engine thread;
 * nothing here locks.
 */
#ifndef MN_KV_POOL_H
#define MN_KV_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/ttype.h"

typedef enum SlotState { SLOT_FREE = 0, SLOT_IN_USE, SLOT_CACHED } SlotState;

/* Layers that may be kept as hidden states: a set of layers is a uint64_t
 * (bit l: layer l) everywhere (the pool's marks, a tier run's, the
 * planner's), so of a deeper model only the first 64 may; its later
 * layers are always K/V and get no hidden arena. */
#define KVPOOL_HIDDEN_MAX_LAYERS 64

/* The layers below l as a layer set: every layer a set can name when
 * l >= KVPOOL_HIDDEN_MAX_LAYERS. A set names only layers of an n_layer
 * model when it has no bit outside kvpool_layers_below(n_layer). */
static inline uint64_t kvpool_layers_below(int l) {
    return l >= KVPOOL_HIDDEN_MAX_LAYERS ? UINT64_MAX : (1ull << l) - 1;
}
/* Whether layer l is in the layer set (never a layer past the first 64). */
static inline bool kvpool_layer_in(uint64_t set, int l) { return l < KVPOOL_HIDDEN_MAX_LAYERS && (set >> l & 1); }

typedef struct KvPool KvPool;

/* Called when a CACHED slot is about to be reused. */
typedef void (*KvEvictFn)(void *ctx, int32_t slot);
/* Chooses which CACHED slot to reuse (the eviction policy); must return a
 * CACHED slot. Without one the least recently cached goes. */
typedef int32_t (*KvChooseFn)(void *ctx, const KvPool *p);

struct KvPool {
    int n_layer;
    int kv_dim;          /* K (and V) elements per token per layer */
    int block_tokens;
    int n_blocks;
    MnType kv_type;      /* MN_TYPE_F16 or MN_TYPE_F32 */
    size_t block_bytes;  /* bytes of one block in one layer (K and V) */
    uint8_t **arenas;    /* (n_layer) each (n_blocks * block_bytes), 64-byte aligned */
    int32_t *refcount;   /* (n_blocks) */
    uint8_t *state;      /* (n_blocks) SlotState */
    bool *is_cacheable;  /* (n_blocks) */
    int32_t *free_list;  /* stack of FREE slots */
    int n_free;
    int32_t *lru_prev, *lru_next; /* (n_blocks) doubly linked CACHED list, -1 ends */
    int32_t lru_head, lru_tail;   /* head = least recently used */
    double *cached_at;            /* (n_blocks) monotonic seconds a slot became CACHED */
    int n_cached;
    KvEvictFn evict_fn;
    void *evict_ctx;
    KvChooseFn choose_fn;
    void *choose_ctx;
    uint64_t n_evictions;
    /* hidden states: all 0/NULL without kvpool_init_hidden */
    int n_hidden_layers;     /* layers with hidden arenas: the first
                                min(n_layer, KVPOOL_HIDDEN_MAX_LAYERS) */
    size_t hidden_row_bytes; /* one token's operand in one layer */
    size_t hidden_bytes;     /* one block in one layer: block_tokens rows */
    uint8_t **hid_arenas;    /* (n_hidden_layers) each (n_blocks * hidden_bytes), 64-byte aligned */
    uint8_t *hid_rows;       /* (n_blocks * block_tokens) 1: the forward pass wrote the
                                token's rows (of every layer) since the slot's allocation */
    uint64_t *hid_loaded;    /* (n_blocks) layers whose rows a restore brought */
    int32_t touch_next;      /* kvpool_touch_free's cursor: slots below it were
                                touched, or taken before it came to them */
};

/* Build a pool of n_blocks blocks. MN_EINVAL for bad sizes or a kv_type other
 * than f16/f32, MN_ENOMEM. On failure the pool is left zeroed. */
int kvpool_init(KvPool *p, int n_layer, int kv_dim, int block_tokens, int n_blocks, MnType kv_type);
void kvpool_deinit(KvPool *p);
/* Add the hidden-state arenas, row_bytes per token per layer, for the
 * first min(n_layer, KVPOOL_HIDDEN_MAX_LAYERS) layers. MN_EINVAL
 * (row_bytes 0, or already added), MN_ENOMEM (the pool is unchanged). */
int kvpool_init_hidden(KvPool *p, size_t row_bytes);
void kvpool_set_evict_fn(KvPool *p, KvEvictFn fn, void *ctx);
void kvpool_set_choose_fn(KvPool *p, KvChooseFn fn, void *ctx);

/* The KV element type a pool holds, by name: "f16" or "f32". MN_OK and
 * *out, or MN_EINVAL for any other name. */
int kvpool_type_parse(const char *name, MnType *out);

/* Bytes a pool of n_blocks would take. */
uint64_t kvpool_bytes_for(int n_layer, int kv_dim, int block_tokens, int n_blocks, MnType kv_type);

/* Take a slot (refcount 1, not cacheable) into *out: a FREE one, else the
 * least recently used CACHED one. MN_EFULL when every slot is IN USE. */
int kvpool_alloc(KvPool *p, int32_t *out);
/* Add a reference to an IN USE or CACHED slot (a CACHED one becomes IN USE). */
void kvpool_retain(KvPool *p, int32_t slot);
void kvpool_release(KvPool *p, int32_t slot);
void kvpool_set_cacheable(KvPool *p, int32_t slot);
/* The slot's content is no longer final (a failed restore) or it is being
 * evicted: when its last reference goes it is freed, not cached. */
void kvpool_clear_cacheable(KvPool *p, int32_t slot);
/* The owner (the index) no longer wants the content of slot: a CACHED
 * slot goes FREE now, without the evict callback; an IN USE one stops
 * being cacheable (FREE on its last release). */
void kvpool_drop(KvPool *p, int32_t slot);
/* Free every CACHED slot that became CACHED before `cutoff` (mn_now()
 * seconds, base/clock.h); the evict callback hears of each. Returns how
 * many were freed. */
int kvpool_expire(KvPool *p, double cutoff);

/* Write the arenas of FREE slots not yet touched (in slot order, from
 * where the last call ended) until about max_bytes are written, so their
 * pages are mapped before a restore or a pass writes them: the first write
 * to a fresh page costs ~6 us on the virtual machines this runs on. Slots
 * taken before the cursor reached them are passed over (their first
 * writer mapped them). Returns false once the cursor is past the last
 * slot. FREE slots hold nothing, so only the caller's thread (the pool's
 * owner) may run this, and nothing else reads them meanwhile. */
bool kvpool_touch_free(KvPool *p, size_t max_bytes);

/* Slots an allocation can take now: FREE + CACHED. */
int kvpool_n_available(const KvPool *p);
int kvpool_n_free(const KvPool *p);
int kvpool_n_cached(const KvPool *p);
int kvpool_n_used(const KvPool *p);

/* K rows (block_tokens, kv_dim) and V rows of slot in layer l. */
static inline void *kvpool_k(const KvPool *p, int layer, int32_t slot) {
    return p->arenas[layer] + (size_t)slot * p->block_bytes;
}
static inline void *kvpool_v(const KvPool *p, int layer, int32_t slot) {
    return p->arenas[layer] + (size_t)slot * p->block_bytes + p->block_bytes / 2;
}

/* Copy the K and V rows of the first n_rows tokens (0 <= n_rows <=
 * block_tokens) of slot src into slot dst, in every layer, and their
 * hidden rows with the pass's marks; the rest of dst is left as it was.
 * dst != src. */
void kvpool_copy_rows(KvPool *p, int32_t dst, int32_t src, int n_rows);
/* Hidden rows (block_tokens * hidden_row_bytes) of slot in layer l
 * (l < n_hidden_layers). */
static inline void *kvpool_h(const KvPool *p, int layer, int32_t slot) {
    return p->hid_arenas[layer] + (size_t)slot * p->hidden_bytes;
}
/* The layers (bit l: layer l; layers past 63 never) whose hidden rows the
 * slot holds in full; 0 without hidden arenas. */
uint64_t kvpool_hidden_layers(const KvPool *p, int32_t slot);
/* A restore brought the hidden rows of these layers into the slot. */
static inline void kvpool_note_hidden(KvPool *p, int32_t slot, uint64_t layers) {
    if (p->hid_loaded) p->hid_loaded[slot] |= layers;
}

/* Check every invariant (states, counts, lists); aborts with a dump on a
 * broken one. For tests and debug builds. */
void kvpool_check(const KvPool *p);
/* Print the pool's state (for gdb and failing tests). */
void kvpool_dump(const KvPool *p);

#endif
