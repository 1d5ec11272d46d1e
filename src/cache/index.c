/* index.c — the block index (see index.h): an open-addressing hash table
 * from block hash to record {pool slot, tier mask} with linear probing and
 * backward-shift deletion, plus the reverse map slot -> hash for eviction.
 * The table doubles when it is half full, so probe chains stay short and
 * a free bucket always ends them.
 */
#include "cache/index.h"

#include <string.h>

#include "base/err.h"
#include "base/mem.h"

typedef struct Entry {
    Hash128 hash;
    int32_t slot;   /* pool slot, -1 = none */
    uint32_t tiers; /* lower tiers holding the block */
    uint8_t is_used;
} Entry;

struct BlockIndex {
    KvPool *pool;
    Entry *table;       /* (cap) */
    uint32_t cap;       /* power of two, > 2 * n_records */
    Hash128 *slot_hash; /* (n_blocks) */
    uint8_t *slot_indexed;
    int count;          /* records with a slot */
    int n_records;
    uint64_t n_deleted; /* records deleted: blocks no longer anywhere */
};

static uint32_t bucket_of(uint32_t cap, const Hash128 *h) {
    uint32_t v;
    memcpy(&v, h->b + 12, 4); /* hash bytes are uniform */
    return v & (cap - 1);
}

static void on_evict(void *ctx, int32_t slot) { index_remove_slot(ctx, slot); }

BlockIndex *index_new(KvPool *pool) {
    BlockIndex *ix = mn_calloc(1, sizeof *ix);
    if (ix == NULL) return NULL;
    ix->pool = pool;
    ix->cap = 16;
    while (ix->cap < 2u * (uint32_t)pool->n_blocks) ix->cap *= 2;
    ix->table = mn_calloc(ix->cap, sizeof *ix->table);
    ix->slot_hash = mn_calloc((size_t)pool->n_blocks, sizeof *ix->slot_hash);
    ix->slot_indexed = mn_calloc((size_t)pool->n_blocks, 1);
    if (!ix->table || !ix->slot_hash || !ix->slot_indexed) {
        index_free(ix);
        return NULL;
    }
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

/* ---- the table ------------------------------------------------------------- */

static Entry *find(const BlockIndex *ix, const Hash128 *h) {
    for (uint32_t i = bucket_of(ix->cap, h);; i = (i + 1) & (ix->cap - 1)) {
        if (!ix->table[i].is_used) return NULL;
        if (hash128_eq(&ix->table[i].hash, h)) return &ix->table[i];
    }
}

static int grow(BlockIndex *ix) {
    uint32_t cap = ix->cap * 2;
    Entry *t = mn_calloc(cap, sizeof *t);
    if (t == NULL) return MN_ENOMEM;
    for (uint32_t i = 0; i < ix->cap; i++) {
        if (!ix->table[i].is_used) continue;
        uint32_t j = bucket_of(cap, &ix->table[i].hash);
        while (t[j].is_used) j = (j + 1) & (cap - 1);
        t[j] = ix->table[i];
    }
    mn_free(ix->table);
    ix->table = t;
    ix->cap = cap;
    return MN_OK;
}

/* The record of h, created empty if missing; NULL when the table cannot grow. */
static Entry *find_or_add(BlockIndex *ix, const Hash128 *h) {
    Entry *e = find(ix, h);
    if (e) return e;
    if (2u * (uint32_t)(ix->n_records + 1) >= ix->cap && grow(ix) != MN_OK) return NULL;
    uint32_t i = bucket_of(ix->cap, h);
    while (ix->table[i].is_used) i = (i + 1) & (ix->cap - 1);
    ix->table[i] = (Entry){*h, -1, 0, 1};
    ix->n_records++;
    return &ix->table[i];
}

/* Delete the record at e (backward-shift keeps every probe chain unbroken). */
static void delete_entry(BlockIndex *ix, Entry *e) {
    uint32_t mask = ix->cap - 1, i = (uint32_t)(e - ix->table);
    for (uint32_t j = (i + 1) & mask; ix->table[j].is_used; j = (j + 1) & mask) {
        uint32_t home = bucket_of(ix->cap, &ix->table[j].hash);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            ix->table[i] = ix->table[j];
            i = j;
        }
    }
    ix->table[i].is_used = 0;
    ix->n_records--;
    ix->n_deleted++;
}

/* ---- API -------------------------------------------------------------------- */

int32_t index_lookup(const BlockIndex *ix, const Hash128 *h) {
    const Entry *e = find(ix, h);
    return e ? e->slot : -1;
}

uint32_t index_tiers(const BlockIndex *ix, const Hash128 *h) {
    const Entry *e = find(ix, h);
    return e ? e->tiers : 0;
}

int index_has(const BlockIndex *ix, const Hash128 *h) { return find(ix, h) != NULL; }

int index_insert(BlockIndex *ix, const Hash128 *h, int32_t slot) {
    if (ix->slot_indexed[slot]) return 0;
    Entry *e = find_or_add(ix, h);
    if (e == NULL) return -MN_ENOMEM;
    if (e->slot >= 0) return 0;
    e->slot = slot;
    ix->slot_hash[slot] = *h;
    ix->slot_indexed[slot] = 1;
    ix->count++;
    kvpool_set_cacheable(ix->pool, slot);
    return 1;
}

void index_remove_slot(BlockIndex *ix, int32_t slot) {
    if (!ix->slot_indexed[slot]) return;
    Entry *e = find(ix, &ix->slot_hash[slot]);
    ix->slot_indexed[slot] = 0;
    ix->count--;
    kvpool_clear_cacheable(ix->pool, slot);
    if (e == NULL) return; /* cannot happen: a slot's record exists */
    e->slot = -1;
    if (e->tiers == 0) delete_entry(ix, e);
}

int index_set_tiers(BlockIndex *ix, const Hash128 *h, uint32_t add, uint32_t remove) {
    Entry *e = add ? find_or_add(ix, h) : find(ix, h);
    if (e == NULL) return add ? MN_ENOMEM : MN_OK;
    e->tiers = (e->tiers | add) & ~remove;
    if (e->tiers == 0 && e->slot < 0) delete_entry(ix, e);
    return MN_OK;
}

const Hash128 *index_slot_hash(const BlockIndex *ix, int32_t slot) {
    return ix->slot_indexed[slot] ? &ix->slot_hash[slot] : NULL;
}

int index_count(const BlockIndex *ix) { return ix->count; }
int index_records(const BlockIndex *ix) { return ix->n_records; }
uint64_t index_n_deleted(const BlockIndex *ix) { return ix->n_deleted; }

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

Hash128 index_shift_domain(const int32_t *dropped, size_t n) {
    static const char tag[] = "mnemo shifted KV v1\n";
    Hasher h;
    hasher_init(&h);
    hasher_update(&h, tag, sizeof tag - 1);
    for (size_t i = 0; i < n; i++) hasher_u32(&h, (uint32_t)dropped[i]);
    return hasher_final(&h);
}

Hash128 index_shift_parent(const Hash128 *parent, const Hash128 *domain) {
    static const Hash128 zero = {{0}};
    Hasher h;
    hasher_init(&h);
    hasher_update(&h, parent ? parent->b : zero.b, 16);
    hasher_update(&h, domain->b, 16);
    return hasher_final(&h);
}
