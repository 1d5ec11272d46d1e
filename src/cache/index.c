/* index.c — the block index (see index.h): an open-addressing hash table
 * from block hash to pool slot with linear probing and backward-shift
 * deletion, sized to twice the slot count so it never fills, plus the
 * reverse map slot -> hash for eviction.
 */
#include "cache/index.h"

#include <string.h>

#include "base/mem.h"

typedef struct Entry {
    Hash128 hash;
    int32_t slot; /* -1 = empty */
} Entry;

struct BlockIndex {
    KvPool *pool;
    Entry *table;       /* (cap) */
    uint32_t cap;       /* power of two >= 2 * n_blocks */
    Hash128 *slot_hash; /* (n_blocks) */
    uint8_t *slot_indexed;
    int count;
};

static uint32_t bucket_of(const BlockIndex *ix, const Hash128 *h) {
    uint32_t v;
    memcpy(&v, h->b + 12, 4); /* hash bytes are uniform */
    return v & (ix->cap - 1);
}

static void on_evict(void *ctx, int32_t slot) { index_remove_slot(ctx, slot); }

BlockIndex *index_new(KvPool *pool) {
    BlockIndex *ix = mn_calloc(1, sizeof *ix);
    if (ix == NULL) return NULL;
    ix->pool = pool;
    ix->cap = 16;
    while (ix->cap < 2u * (uint32_t)pool->n_blocks) ix->cap *= 2;
    ix->table = mn_malloc(sizeof *ix->table * ix->cap);
    ix->slot_hash = mn_calloc((size_t)pool->n_blocks, sizeof *ix->slot_hash);
    ix->slot_indexed = mn_calloc((size_t)pool->n_blocks, 1);
    if (!ix->table || !ix->slot_hash || !ix->slot_indexed) {
        index_free(ix);
        return NULL;
    }
    for (uint32_t i = 0; i < ix->cap; i++) ix->table[i].slot = -1;
    kvpool_set_evict_fn(pool, on_evict, ix);
    return ix;
}

void index_free(BlockIndex *ix) {
    if (ix == NULL) return;
    if (ix->pool && ix->pool->evict_ctx == ix) kvpool_set_evict_fn(ix->pool, NULL, NULL);
    mn_free(ix->table);
    mn_free(ix->slot_hash);
    mn_free(ix->slot_indexed);
    mn_free(ix);
}

int32_t index_lookup(const BlockIndex *ix, const Hash128 *h) {
    for (uint32_t i = bucket_of(ix, h);; i = (i + 1) & (ix->cap - 1)) {
        if (ix->table[i].slot < 0) return -1;
        if (hash128_eq(&ix->table[i].hash, h)) return ix->table[i].slot;
    }
}

int index_insert(BlockIndex *ix, const Hash128 *h, int32_t slot) {
    if (ix->slot_indexed[slot]) return 0;
    uint32_t i = bucket_of(ix, h);
    for (; ix->table[i].slot >= 0; i = (i + 1) & (ix->cap - 1))
        if (hash128_eq(&ix->table[i].hash, h)) return 0;
    ix->table[i].hash = *h;
    ix->table[i].slot = slot;
    ix->slot_hash[slot] = *h;
    ix->slot_indexed[slot] = 1;
    ix->count++;
    kvpool_set_cacheable(ix->pool, slot);
    return 1;
}

void index_remove_slot(BlockIndex *ix, int32_t slot) {
    if (!ix->slot_indexed[slot]) return;
    const Hash128 *h = &ix->slot_hash[slot];
    uint32_t mask = ix->cap - 1, i = bucket_of(ix, h);
    while (!(ix->table[i].slot == slot && hash128_eq(&ix->table[i].hash, h))) i = (i + 1) & mask;
    /* backward-shift deletion keeps every probe chain unbroken */
    for (uint32_t j = (i + 1) & mask; ix->table[j].slot >= 0; j = (j + 1) & mask) {
        uint32_t home = bucket_of(ix, &ix->table[j].hash);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            ix->table[i] = ix->table[j];
            i = j;
        }
    }
    ix->table[i].slot = -1;
    ix->slot_indexed[slot] = 0;
    ix->count--;
}

int index_count(const BlockIndex *ix) { return ix->count; }

uint32_t index_kv_format(MnType kv_type, int block_tokens) {
    return (uint32_t)kv_type | ((uint32_t)block_tokens << 8);
}

Hash128 index_namespace_id(const char *ns) { return hash128(ns ? ns : "", ns ? strlen(ns) : 0); }

Hash128 index_block_hash(const Hash128 *parent, const int32_t *tokens, int block_tokens, const Hash128 *fingerprint,
                         uint32_t kv_format, const Hash128 *ns_id) {
    Hasher h;
    static const Hash128 zero = {{0}};
    hasher_init(&h);
    hasher_update(&h, parent ? parent->b : zero.b, 16);
    for (int i = 0; i < block_tokens; i++) hasher_u32(&h, (uint32_t)tokens[i]);
    hasher_update(&h, fingerprint->b, 16);
    hasher_u32(&h, kv_format);
    hasher_update(&h, ns_id->b, 16);
    return hasher_final(&h);
}
