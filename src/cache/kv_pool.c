/* kv_pool.c — block allocation over per-layer arenas (see kv_pool.h).
 *
 * FREE slots sit on a stack, CACHED slots on an LRU list (head = least
 * recently used), so allocation, release, revival and eviction are O(1).
 * Invariants (kvpool_check): refcount > 0 exactly for IN USE slots; every
 * FREE slot is on the stack once, every CACHED slot on the list once;
 * n_free + n_cached + (IN USE count) = n_blocks.
 */
#include "cache/kv_pool.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

uint64_t kvpool_bytes_for(int n_layer, int kv_dim, int block_tokens, int n_blocks, MnType kv_type) {
    uint64_t elem = kv_type == MN_TYPE_F16 ? 2 : 4;
    return (uint64_t)n_layer * (uint64_t)n_blocks * 2 * (uint64_t)block_tokens * (uint64_t)kv_dim * elem;
}

int kvpool_type_parse(const char *name, MnType *out) {
    MnType t;
    if (ttype_from_name(name, &t) != MN_OK || (t != MN_TYPE_F16 && t != MN_TYPE_F32)) return MN_EINVAL;
    *out = t;
    return MN_OK;
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
    p->lru_head = p->lru_tail = -1;
    size_t nb = (size_t)n_blocks;
    p->arenas = mn_calloc((size_t)n_layer, sizeof *p->arenas);
    p->refcount = mn_calloc(nb, sizeof *p->refcount);
    p->state = mn_calloc(nb, sizeof *p->state);
    p->is_cacheable = mn_calloc(nb, sizeof *p->is_cacheable);
    p->free_list = mn_calloc(nb, sizeof *p->free_list);
    p->lru_prev = mn_calloc(nb, sizeof *p->lru_prev);
    p->lru_next = mn_calloc(nb, sizeof *p->lru_next);
    p->cached_at = mn_calloc(nb, sizeof *p->cached_at);
    if (!p->cached_at || !p->arenas || !p->refcount || !p->state || !p->is_cacheable || !p->free_list || !p->lru_prev ||
        !p->lru_next)
        goto nomem;
    for (int l = 0; l < n_layer; l++) {
        /* n_blocks * block_bytes: both bounded by the caller's pool size, fits 64 bits */
        p->arenas[l] = mn_alloc_aligned(nb * p->block_bytes, 64);
        if (p->arenas[l] == NULL) goto nomem;
    }
    for (int i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i; /* slot 0 on top */
    p->n_free = n_blocks;
    return MN_OK;
nomem:
    kvpool_deinit(p);
    return MN_ENOMEM;
}

bool kvpool_touch_free(KvPool *p, size_t max_bytes) {
    size_t done = 0;
    for (; p->touch_next < p->n_blocks && done < max_bytes; p->touch_next++) {
        int32_t s = p->touch_next;
        if (p->state[s] != SLOT_FREE) continue;
        for (int l = 0; l < p->n_layer; l++) memset(kvpool_k(p, l, s), 0, p->block_bytes);
        for (int l = 0; l < p->n_hidden_layers; l++) memset(kvpool_h(p, l, s), 0, p->hidden_bytes);
        done += (size_t)p->n_layer * p->block_bytes + (size_t)p->n_hidden_layers * p->hidden_bytes;
    }
    return p->touch_next < p->n_blocks;
}

static void free_hidden(KvPool *p) {
    if (p->hid_arenas != NULL)
        for (int l = 0; l < p->n_hidden_layers; l++) mn_free_aligned(p->hid_arenas[l]);
    mn_free(p->hid_arenas);
    mn_free(p->hid_rows);
    mn_free(p->hid_loaded);
    p->hid_arenas = NULL;
    p->hid_rows = NULL;
    p->hid_loaded = NULL;
    p->hidden_row_bytes = p->hidden_bytes = 0;
    p->n_hidden_layers = 0;
}

int kvpool_init_hidden(KvPool *p, size_t row_bytes) {
    if (row_bytes == 0 || p->hid_arenas != NULL || p->n_blocks <= 0) return MN_EINVAL;
    size_t nb = (size_t)p->n_blocks;
    p->hidden_row_bytes = row_bytes;
    p->hidden_bytes = row_bytes * (size_t)p->block_tokens;
    p->n_hidden_layers = p->n_layer < KVPOOL_HIDDEN_MAX_LAYERS ? p->n_layer : KVPOOL_HIDDEN_MAX_LAYERS;
    p->hid_arenas = mn_calloc((size_t)p->n_hidden_layers, sizeof *p->hid_arenas);
    p->hid_rows = mn_calloc(nb * (size_t)p->block_tokens, 1);
    p->hid_loaded = mn_calloc(nb, sizeof *p->hid_loaded);
    bool ok = p->hid_arenas && p->hid_rows && p->hid_loaded;
    for (int l = 0; ok && l < p->n_hidden_layers; l++) ok = (p->hid_arenas[l] = mn_alloc_aligned(nb * p->hidden_bytes, 64));
    if (!ok) {
        free_hidden(p);
        return MN_ENOMEM;
    }
    return MN_OK;
}

uint64_t kvpool_hidden_layers(const KvPool *p, int32_t slot) {
    if (p->hid_rows == NULL) return 0;
    const uint8_t *rows = p->hid_rows + (size_t)slot * (size_t)p->block_tokens;
    bool full = true;
    for (int i = 0; i < p->block_tokens && full; i++) full = rows[i] != 0;
    return full ? UINT64_MAX : p->hid_loaded[slot];
}

void kvpool_deinit(KvPool *p) {
    free_hidden(p);
    if (p->arenas != NULL)
        for (int l = 0; l < p->n_layer; l++) mn_free_aligned(p->arenas[l]);
    mn_free(p->arenas);
    mn_free(p->refcount);
    mn_free(p->state);
    mn_free(p->is_cacheable);
    mn_free(p->free_list);
    mn_free(p->lru_prev);
    mn_free(p->lru_next);
    mn_free(p->cached_at);
    memset(p, 0, sizeof *p);
}

void kvpool_set_evict_fn(KvPool *p, KvEvictFn fn, void *ctx) {
    p->evict_fn = fn;
    p->evict_ctx = ctx;
}

void kvpool_set_choose_fn(KvPool *p, KvChooseFn fn, void *ctx) {
    p->choose_fn = fn;
    p->choose_ctx = ctx;
}

/* ---- LRU list of CACHED slots --------------------------------------------- */

static void lru_unlink(KvPool *p, int32_t s) {
    int32_t a = p->lru_prev[s], b = p->lru_next[s];
    if (a >= 0) p->lru_next[a] = b;
    else p->lru_head = b;
    if (b >= 0) p->lru_prev[b] = a;
    else p->lru_tail = a;
    p->n_cached--;
}

static void lru_push_tail(KvPool *p, int32_t s) {
    p->lru_prev[s] = p->lru_tail;
    p->lru_next[s] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = s;
    else p->lru_head = s;
    p->lru_tail = s;
    p->n_cached++;
}

/* ---- API ------------------------------------------------------------------- */

int kvpool_alloc(KvPool *p, int32_t *out) {
    int32_t slot;
    if (p->n_free > 0) {
        slot = p->free_list[--p->n_free];
    } else if (p->lru_head >= 0) {
        slot = p->choose_fn ? p->choose_fn(p->choose_ctx, p) : p->lru_head;
        if (slot < 0 || slot >= p->n_blocks || p->state[slot] != SLOT_CACHED) {
            LOG_ERROR("kv pool: the eviction policy chose slot %d, which is not cached", slot);
            abort();
        }
        lru_unlink(p, slot);
        if (p->evict_fn) p->evict_fn(p->evict_ctx, slot);
        p->n_evictions++;
    } else {
        return MN_EFULL;
    }
    assert(p->refcount[slot] == 0);
    p->refcount[slot] = 1;
    p->state[slot] = SLOT_IN_USE;
    p->is_cacheable[slot] = false;
    if (p->hid_rows) { /* what the slot held is not this block's */
        memset(p->hid_rows + (size_t)slot * (size_t)p->block_tokens, 0, (size_t)p->block_tokens);
        p->hid_loaded[slot] = 0;
    }
    *out = slot;
    return MN_OK;
}

void kvpool_retain(KvPool *p, int32_t slot) {
    assert(slot >= 0 && slot < p->n_blocks && p->state[slot] != SLOT_FREE);
    if (p->state[slot] == SLOT_CACHED) {
        lru_unlink(p, slot);
        p->state[slot] = SLOT_IN_USE;
    }
    p->refcount[slot]++;
}

void kvpool_release(KvPool *p, int32_t slot) {
    assert(slot >= 0 && slot < p->n_blocks);
    if (p->state[slot] != SLOT_IN_USE || p->refcount[slot] <= 0) {
        LOG_ERROR("kv pool: release of slot %d that is not in use", slot);
        abort(); /* a broken invariant: corruption would follow */
    }
    if (--p->refcount[slot] > 0) return;
    if (p->is_cacheable[slot]) {
        p->state[slot] = SLOT_CACHED;
        p->cached_at[slot] = mn_now();
        lru_push_tail(p, slot);
    } else {
        p->state[slot] = SLOT_FREE;
        p->free_list[p->n_free++] = slot;
    }
}

/* A CACHED slot goes FREE (its owner has forgotten it). */
static void cached_to_free(KvPool *p, int32_t slot) {
    lru_unlink(p, slot);
    p->state[slot] = SLOT_FREE;
    p->is_cacheable[slot] = false;
    p->free_list[p->n_free++] = slot;
}

/* The LRU list is in the order slots became CACHED (revival and
 * kvpool_drop only remove), so the expired ones are a prefix of it. */
int kvpool_expire(KvPool *p, double cutoff) {
    int n = 0;
    while (p->lru_head >= 0 && p->cached_at[p->lru_head] < cutoff) {
        int32_t slot = p->lru_head;
        if (p->evict_fn) p->evict_fn(p->evict_ctx, slot);
        cached_to_free(p, slot);
        n++;
    }
    return n;
}

void kvpool_drop(KvPool *p, int32_t slot) {
    assert(slot >= 0 && slot < p->n_blocks && p->state[slot] != SLOT_FREE);
    if (p->state[slot] == SLOT_CACHED) cached_to_free(p, slot);
    else p->is_cacheable[slot] = false;
}

void kvpool_copy_rows(KvPool *p, int32_t dst, int32_t src, int n_rows) {
    assert(dst != src && n_rows >= 0 && n_rows <= p->block_tokens);
    size_t row_bytes = p->block_bytes / 2 / (size_t)p->block_tokens, n = row_bytes * (size_t)n_rows;
    for (int l = 0; l < p->n_layer; l++) {
        memcpy(kvpool_k(p, l, dst), kvpool_k(p, l, src), n);
        memcpy(kvpool_v(p, l, dst), kvpool_v(p, l, src), n);
    }
    if (p->hid_rows == NULL) return;
    /* the rows' hidden states go with them (same tokens, same positions),
     * where the pass wrote them */
    const uint8_t *from = p->hid_rows + (size_t)src * (size_t)p->block_tokens;
    uint8_t *to = p->hid_rows + (size_t)dst * (size_t)p->block_tokens;
    for (int l = 0; l < p->n_hidden_layers; l++)
        memcpy(kvpool_h(p, l, dst), kvpool_h(p, l, src), p->hidden_row_bytes * (size_t)n_rows);
    memcpy(to, from, (size_t)n_rows);
}

void kvpool_clear_cacheable(KvPool *p, int32_t slot) {
    assert(slot >= 0 && slot < p->n_blocks);
    p->is_cacheable[slot] = false;
}

void kvpool_set_cacheable(KvPool *p, int32_t slot) {
    assert(slot >= 0 && slot < p->n_blocks && p->state[slot] == SLOT_IN_USE);
    p->is_cacheable[slot] = true;
}

int kvpool_n_available(const KvPool *p) { return p->n_free + p->n_cached; }
int kvpool_n_free(const KvPool *p) { return p->n_free; }
int kvpool_n_cached(const KvPool *p) { return p->n_cached; }
int kvpool_n_used(const KvPool *p) { return p->n_blocks - p->n_free - p->n_cached; }

void kvpool_dump(const KvPool *p) {
    fprintf(stderr, "KvPool: %d layers, %d blocks of %d tokens, kv_dim %d, %s, %zu bytes/block/layer; %d free, %d cached, %d used\n",
            p->n_layer, p->n_blocks, p->block_tokens, p->kv_dim, p->kv_type == MN_TYPE_F16 ? "f16" : "f32",
            p->block_bytes, p->n_free, p->n_cached, kvpool_n_used(p));
    for (int i = 0; i < p->n_blocks; i++)
        if (p->state[i] != SLOT_FREE)
            fprintf(stderr, "  slot %d: %s refcount %d%s\n", i, p->state[i] == SLOT_CACHED ? "cached" : "in use",
                    p->refcount[i], p->is_cacheable[i] ? " cacheable" : "");
}

void kvpool_check(const KvPool *p) {
    int n_in_use = 0, n_lru = 0;
    for (int i = 0; i < p->n_blocks; i++) {
        bool ok = (p->state[i] == SLOT_IN_USE) == (p->refcount[i] > 0) && p->refcount[i] >= 0;
        if (!ok) {
            kvpool_dump(p);
            fprintf(stderr, "kvpool_check: slot %d state %d refcount %d\n", i, p->state[i], p->refcount[i]);
            abort();
        }
        n_in_use += p->state[i] == SLOT_IN_USE;
    }
    for (int s = p->lru_head; s >= 0; s = p->lru_next[s]) {
        if (p->state[s] != SLOT_CACHED || ++n_lru > p->n_blocks) {
            kvpool_dump(p);
            abort();
        }
    }
    for (int i = 0; i < p->n_free; i++)
        if (p->state[p->free_list[i]] != SLOT_FREE) {
            kvpool_dump(p);
            abort();
        }
    if (n_lru != p->n_cached || p->n_free + p->n_cached + n_in_use != p->n_blocks) {
        kvpool_dump(p);
        fprintf(stderr, "kvpool_check: counts free %d cached %d (list %d) in use %d of %d\n", p->n_free, p->n_cached,
                n_lru, n_in_use, p->n_blocks);
        abort();
    }
}
