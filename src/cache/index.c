/* index.c — the block index (see index.h): two open-addressing hash
 * tables with linear probing and backward-shift deletion — block hash ->
 * record {pool slot, tier mask}, and child key -> the first slot of its
 * children list — plus per-slot arrays: the reverse map slot -> hash for
 * eviction, and each slot's place among the children of its parent (key,
 * valid rows, their tokens, list links). A table doubles when it is half
 * full, so probe chains stay short and a free bucket always ends them; the
 * children table starts at four times the pool's slots and never needs to
 * (every key has a slot of its own, so it holds at most n_blocks keys).
 *
 * Invariants: a slot is on at most one children list, the one of
 * child_key[slot], exactly when child_rows[slot] > 0; a full child
 * (block_tokens rows) is an indexed slot, a partial one is not; no partial
 * child's rows are a prefix of another child's under the same key (it
 * would never be the longest match).
 */
#include "cache/index.h"

#include <assert.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"

typedef struct Entry {
    Hash128 hash;
    int32_t slot;   /* blocks: pool slot, -1 = none; children: the list's first slot */
    uint32_t tiers; /* blocks: lower tiers holding the block */
    uint8_t is_used;
} Entry;

typedef struct Table {
    Entry *e;     /* (cap) */
    uint32_t cap; /* power of two, > 2 * n */
    int n;        /* entries in use */
} Table;

struct BlockIndex {
    KvPool *pool;
    Table blocks;       /* block hash -> record */
    Table children;     /* child key -> its list of slots, newest first */
    Hash128 *slot_hash; /* (n_blocks) */
    uint8_t *slot_indexed;
    Hash128 *child_key;       /* (n_blocks) the key of the list a slot is on */
    int32_t *child_rows;      /* (n_blocks) its rows with valid KV; 0: on no list */
    int32_t *child_tokens;    /* (n_blocks, block_tokens) the tokens of those rows */
    int32_t *child_next, *child_prev; /* (n_blocks) list links, -1 ends */
    int count;          /* records with a slot */
    int n_partials;     /* partial children */
    uint64_t n_deleted; /* records deleted: blocks no longer anywhere */
};

static uint32_t bucket_of(uint32_t cap, const Hash128 *h) {
    uint32_t v;
    memcpy(&v, h->b + 12, 4); /* hash bytes are uniform */
    return v & (cap - 1);
}

static void on_evict(void *ctx, int32_t slot) { index_remove_slot(ctx, slot); }

/* ---- the tables ------------------------------------------------------------ */

static int table_init(Table *t, uint64_t min_cap) {
    t->cap = 16;
    while (t->cap < min_cap && t->cap < (1u << 31)) t->cap *= 2;
    t->n = 0;
    t->e = mn_calloc(t->cap, sizeof *t->e);
    return t->e ? MN_OK : MN_ENOMEM;
}

static Entry *table_find(const Table *t, const Hash128 *h) {
    for (uint32_t i = bucket_of(t->cap, h);; i = (i + 1) & (t->cap - 1)) {
        if (!t->e[i].is_used) return NULL;
        if (hash128_eq(&t->e[i].hash, h)) return &t->e[i];
    }
}

static int table_grow(Table *t) {
    uint32_t cap = t->cap * 2;
    Entry *e = mn_calloc(cap, sizeof *e);
    if (e == NULL) return MN_ENOMEM;
    for (uint32_t i = 0; i < t->cap; i++) {
        if (!t->e[i].is_used) continue;
        uint32_t j = bucket_of(cap, &t->e[i].hash);
        while (e[j].is_used) j = (j + 1) & (cap - 1);
        e[j] = t->e[i];
    }
    mn_free(t->e);
    t->e = e;
    t->cap = cap;
    return MN_OK;
}

/* The entry of h, created empty (slot -1, no tiers) if missing; NULL when
 * the table cannot grow. */
static Entry *table_find_or_add(Table *t, const Hash128 *h) {
    Entry *e = table_find(t, h);
    if (e) return e;
    if (2u * (uint32_t)(t->n + 1) >= t->cap && table_grow(t) != MN_OK) return NULL;
    uint32_t i = bucket_of(t->cap, h);
    while (t->e[i].is_used) i = (i + 1) & (t->cap - 1);
    t->e[i] = (Entry){*h, -1, 0, 1};
    t->n++;
    return &t->e[i];
}

/* Delete the entry at e (backward-shift keeps every probe chain unbroken;
 * entries may move, so pointers into the table are stale afterwards). */
static void table_delete(Table *t, Entry *e) {
    uint32_t mask = t->cap - 1, i = (uint32_t)(e - t->e);
    for (uint32_t j = (i + 1) & mask; t->e[j].is_used; j = (j + 1) & mask) {
        uint32_t home = bucket_of(t->cap, &t->e[j].hash);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->e[i] = t->e[j];
            i = j;
        }
    }
    t->e[i].is_used = 0;
    t->n--;
}

/* A block record is deleted: the block is no longer anywhere. */
static void delete_record(BlockIndex *ix, Entry *e) {
    table_delete(&ix->blocks, e);
    ix->n_deleted++;
}

/* ---- life cycle ------------------------------------------------------------- */

BlockIndex *index_new(KvPool *pool) {
    BlockIndex *ix = mn_calloc(1, sizeof *ix);
    if (ix == NULL) return NULL;
    ix->pool = pool;
    size_t nb = (size_t)pool->n_blocks;
    int rc = table_init(&ix->blocks, 2 * (uint64_t)nb);
    if (rc == MN_OK) rc = table_init(&ix->children, 4 * (uint64_t)nb);
    ix->slot_hash = mn_calloc(nb, sizeof *ix->slot_hash);
    ix->slot_indexed = mn_calloc(nb, 1);
    ix->child_key = mn_calloc(nb, sizeof *ix->child_key);
    ix->child_rows = mn_calloc(nb, sizeof *ix->child_rows);
    ix->child_tokens = mn_calloc(nb * (size_t)pool->block_tokens, sizeof *ix->child_tokens);
    ix->child_next = mn_calloc(nb, sizeof *ix->child_next);
    ix->child_prev = mn_calloc(nb, sizeof *ix->child_prev);
    if (rc || !ix->slot_hash || !ix->slot_indexed || !ix->child_key || !ix->child_rows || !ix->child_tokens ||
        !ix->child_next || !ix->child_prev) {
        index_free(ix);
        return NULL;
    }
    kvpool_set_evict_fn(pool, on_evict, ix);
    return ix;
}

void index_free(BlockIndex *ix) {
    if (ix == NULL) return;
    if (ix->pool && ix->pool->evict_ctx == ix) kvpool_set_evict_fn(ix->pool, NULL, NULL);
    mn_free(ix->blocks.e);
    mn_free(ix->children.e);
    mn_free(ix->slot_hash);
    mn_free(ix->slot_indexed);
    mn_free(ix->child_key);
    mn_free(ix->child_rows);
    mn_free(ix->child_tokens);
    mn_free(ix->child_next);
    mn_free(ix->child_prev);
    mn_free(ix);
}

/* ---- children lists --------------------------------------------------------- */

static const int32_t *child_tokens(const BlockIndex *ix, int32_t slot) {
    return ix->child_tokens + (size_t)slot * (size_t)ix->pool->block_tokens;
}

/* How many leading tokens a[0..na) and b[0..nb) share. */
static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, k = 0;
    while (k < n && a[k] == b[k]) k++;
    return k;
}

/* Take slot off its children list (it is on one). */
static void child_unlink(BlockIndex *ix, int32_t slot) {
    int32_t a = ix->child_prev[slot], b = ix->child_next[slot];
    if (b >= 0) ix->child_prev[b] = a;
    if (a >= 0) {
        ix->child_next[a] = b;
    } else {
        Entry *e = table_find(&ix->children, &ix->child_key[slot]);
        assert(e != NULL && e->slot == slot);
        if (b >= 0) e->slot = b;
        else table_delete(&ix->children, e);
    }
    if (ix->child_rows[slot] < ix->pool->block_tokens) ix->n_partials--;
    ix->child_rows[slot] = 0;
}

/* ---- API -------------------------------------------------------------------- */

int32_t index_lookup(const BlockIndex *ix, const Hash128 *h) {
    const Entry *e = table_find(&ix->blocks, h);
    return e ? e->slot : -1;
}

uint32_t index_tiers(const BlockIndex *ix, const Hash128 *h) {
    const Entry *e = table_find(&ix->blocks, h);
    return e ? e->tiers : 0;
}

int index_has(const BlockIndex *ix, const Hash128 *h) { return table_find(&ix->blocks, h) != NULL; }

int index_insert(BlockIndex *ix, const Hash128 *h, int32_t slot) {
    if (ix->slot_indexed[slot] || ix->child_rows[slot] > 0) return 0;
    Entry *e = table_find_or_add(&ix->blocks, h);
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
    if (!ix->slot_indexed[slot] && ix->child_rows[slot] == 0) return;
    kvpool_clear_cacheable(ix->pool, slot);
    if (ix->child_rows[slot] > 0) child_unlink(ix, slot);
    if (!ix->slot_indexed[slot]) return;
    Entry *e = table_find(&ix->blocks, &ix->slot_hash[slot]);
    ix->slot_indexed[slot] = 0;
    ix->count--;
    if (e == NULL) return; /* cannot happen: a slot's record exists */
    e->slot = -1;
    if (e->tiers == 0) delete_record(ix, e);
}

int index_set_tiers(BlockIndex *ix, const Hash128 *h, uint32_t add, uint32_t remove) {
    Entry *e = add ? table_find_or_add(&ix->blocks, h) : table_find(&ix->blocks, h);
    if (e == NULL) return add ? MN_ENOMEM : MN_OK;
    e->tiers = (e->tiers | add) & ~remove;
    if (e->tiers == 0 && e->slot < 0) delete_record(ix, e);
    return MN_OK;
}

const Hash128 *index_slot_hash(const BlockIndex *ix, int32_t slot) {
    return ix->slot_indexed[slot] ? &ix->slot_hash[slot] : NULL;
}

/* ---- the children of a parent ---------------------------------------------------- */

Hash128 index_child_key(const Hash128 *parent, const Hash128 *fingerprint, uint32_t kv_format, const Hash128 *ns_id) {
    return index_block_hash(parent, NULL, 0, fingerprint, kv_format, ns_id);
}

int index_child_add(BlockIndex *ix, const Hash128 *key, int32_t slot, const int32_t *tokens, int n_rows) {
    const int bt = ix->pool->block_tokens;
    assert(slot >= 0 && slot < ix->pool->n_blocks && n_rows > 0 && n_rows <= bt);
    if (ix->child_rows[slot] > 0 || (n_rows == bt) != (ix->slot_indexed[slot] != 0)) return 0;
    const Entry *e = table_find(&ix->children, key);
    for (int32_t s = e ? e->slot : -1, next; s >= 0; s = next) {
        next = ix->child_next[s];
        int rows = ix->child_rows[s], k = common_prefix(child_tokens(ix, s), rows, tokens, n_rows);
        if (k == n_rows) return 0; /* s holds these rows already (and perhaps more) */
        if (k == rows && rows < bt) { /* a partial child that this one extends: never the longest match again */
            child_unlink(ix, s);
            kvpool_drop(ix->pool, s);
        }
    }
    Entry *head = table_find_or_add(&ix->children, key); /* unlinking may have moved or deleted e */
    if (head == NULL) return -MN_ENOMEM;
    ix->child_key[slot] = *key;
    ix->child_rows[slot] = n_rows;
    memcpy(ix->child_tokens + (size_t)slot * (size_t)bt, tokens, (size_t)n_rows * sizeof *tokens);
    ix->child_prev[slot] = -1;
    ix->child_next[slot] = head->slot;
    if (head->slot >= 0) ix->child_prev[head->slot] = slot;
    head->slot = slot;
    if (n_rows < bt) {
        ix->n_partials++;
        kvpool_set_cacheable(ix->pool, slot);
    }
    return 1;
}

int32_t index_child_find(const BlockIndex *ix, const Hash128 *key, const int32_t *tokens, int n, int *n_rows) {
    *n_rows = 0;
    int32_t best = -1;
    const Entry *e = table_find(&ix->children, key);
    for (int32_t s = e ? e->slot : -1; s >= 0; s = ix->child_next[s]) {
        int k = common_prefix(child_tokens(ix, s), ix->child_rows[s], tokens, n);
        if (k > *n_rows) {
            *n_rows = k;
            best = s;
        }
    }
    return best;
}

int index_n_partials(const BlockIndex *ix) { return ix->n_partials; }

int index_count(const BlockIndex *ix) { return ix->count; }
int index_records(const BlockIndex *ix) { return ix->blocks.n; }
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
    hasher_i32s(&h, tokens, (size_t)block_tokens);
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
    hasher_i32s(&h, dropped, n);
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
