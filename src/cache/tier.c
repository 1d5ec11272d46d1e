/* tier.c — the bookkeeping every tier below the pool shares (see tier.h).
 *
 * A Tier is a set of runs plus a map from block hash to (run, index). The
 * runs sit on one LRU list (head = least recently used); tier_put_run
 * evicts while the budget or the medium (the kind's reserve) lacks room:
 * the head under lru, else the run the eviction policy scores lowest
 * (policy.h; one scan of the runs per victim). The bytes themselves belong
 * to the kind behind TierKindOps (tier_impl.h): host RAM or disk files.
 *
 * Owner: the mover thread; nothing locks (tier.h).
 *
 * Invariants (tier_check):
 *   - every map entry (h -> run, i) has run->hashes[i] == h and run on the
 *     list; run->n_live is the number of map entries pointing at run, and
 *     is >= 1 for every listed run (a run with no live block is freed at
 *     once);
 *   - occupancy_bytes is the sum of the listed runs' n_bytes and never
 *     exceeds capacity_bytes;
 *   - kv_stored and hidden_stored are the sums of the listed runs'
 *     run_payload in each form;
 *   - in the error state (is_failed) no call touches the medium;
 *   - next_run_id is above every id the tier has used or adopted.
 * The map is open addressing with linear probing and backward-shift
 * deletion (no tombstones), at most half full.
 */
#include "cache/tier_impl.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

/* ---- types --------------------------------------------------------------- */

typedef struct MapSlot {
    Hash128 key;
    TierRun *run; /* NULL = empty slot */
    int32_t index;
} MapSlot;

struct Tier {
    const TierKindOps *ops;
    void *kind;
    int n_layer;
    size_t block_bytes;
    size_t hidden_bytes; /* tier_set_hidden_bytes; 0: runs are stored as KV */
    uint64_t capacity_bytes;
    uint64_t occupancy_bytes;
    uint64_t kv_stored, hidden_stored; /* the listed runs' layers by representation (run_payload) */
    uint64_t n_runs;
    uint64_t next_run_id;
    TierRun *lru_head, *lru_tail;
    MapSlot *map;        /* (map_cap) */
    uint64_t map_cap;    /* power of two */
    uint64_t map_count;
    bool is_failed;
    AllocFaults faults;  /* tier_fault_alloc (tests) */
    TierDropFn drop_fn;
    void *drop_ctx;
    /* scratch sized for the largest request so far (no allocation while
     * evicting) */
    Hash128 *report;     /* (scratch_cap) live hashes of a run being dropped */
    TierRun **read_run;  /* (scratch_cap) run of each requested block */
    int32_t *read_idx;   /* (scratch_cap) its index in that run */
    int32_t *group_idx, *group_slot; /* (scratch_cap) the runs' shares, run by run */
    TierReadGroup *groups;           /* (scratch_cap) one per run touched */
    int scratch_cap;
    /* eviction policy (tier_set_policy) and the look-ahead window */
    EvictPolicy policy;
    CostModel cost;
    bool has_cost;
    Hash128 *win_hashes; /* (n_win) */
    int32_t *win_idx;    /* (n_win) */
    int n_win;
    TierStats st;        /* counters; the "now" fields are filled by tier_stats */
};

/* ---- helpers: time, map -------------------------------------------------- */

static uint64_t key_hash(const Hash128 *h) {
    uint64_t a, b;
    memcpy(&a, h->b, 8);
    memcpy(&b, h->b + 8, 8);
    uint64_t x = a ^ (b * 0x9e3779b97f4a7c15ull); /* hashes are already mixed; */
    x ^= x >> 31;                                  /* this only guards tests' */
    x *= 0xbf58476d1ce4e5b9ull;                    /* hand-made ones */
    x ^= x >> 29;
    return x;
}

/* Slot of h, or the empty slot where it would go. */
static uint64_t map_find(const Tier *t, const Hash128 *h) {
    uint64_t mask = t->map_cap - 1, i = key_hash(h) & mask;
    while (t->map[i].run != NULL && !hash128_eq(&t->map[i].key, h)) i = (i + 1) & mask;
    return i;
}

static MapSlot *map_get(const Tier *t, const Hash128 *h) {
    MapSlot *s = &t->map[map_find(t, h)];
    return s->run != NULL ? s : NULL;
}

/* Whether this allocation fails by injection (tier_fault_alloc; tests). */
static bool alloc_fault(Tier *t) { return alloc_faults_take(&t->faults); }

/* Room for `more` new keys without exceeding half full. */
static int map_reserve(Tier *t, uint64_t more) {
    uint64_t cap = t->map_cap;
    while (2 * (t->map_count + more) > cap) cap *= 2;
    if (cap == t->map_cap) return MN_OK;
    MapSlot *old = t->map;
    uint64_t old_cap = t->map_cap;
    MapSlot *m = alloc_fault(t) ? NULL : mn_calloc(cap, sizeof *m);
    if (m == NULL) return MN_ENOMEM;
    t->map = m;
    t->map_cap = cap;
    for (uint64_t i = 0; i < old_cap; i++)
        if (old[i].run != NULL) t->map[map_find(t, &old[i].key)] = old[i];
    mn_free(old);
    return MN_OK;
}

/* Remove the entry in slot i, shifting later entries of its probe chain. */
static void map_delete_at(Tier *t, uint64_t i) {
    uint64_t mask = t->map_cap - 1, j = i;
    for (;;) {
        t->map[i].run = NULL;
        for (;;) {
            j = (j + 1) & mask;
            if (t->map[j].run == NULL) {
                t->map_count--;
                return;
            }
            uint64_t home = key_hash(&t->map[j].key) & mask;
            /* j's entry may move to i when its home is not in (i, j] */
            bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
            if (!stays) break;
        }
        t->map[i] = t->map[j];
        i = j;
    }
}

/* ---- helpers: runs ------------------------------------------------------- */

static void lru_unlink(Tier *t, TierRun *r) {
    if (r->lru_prev) r->lru_prev->lru_next = r->lru_next;
    else t->lru_head = r->lru_next;
    if (r->lru_next) r->lru_next->lru_prev = r->lru_prev;
    else t->lru_tail = r->lru_prev;
    r->lru_prev = r->lru_next = NULL;
}

static void lru_push_mru(Tier *t, TierRun *r) {
    r->lru_next = NULL;
    r->lru_prev = t->lru_tail;
    if (t->lru_tail) t->lru_tail->lru_next = r;
    else t->lru_head = r;
    t->lru_tail = r;
}

/* The payload of run r's layers stored as hidden states (is_hidden) or
 * as K/V: blocks times layers times the block's size in that form. */
static uint64_t run_payload(const Tier *t, const TierRun *r, bool is_hidden) {
    int n_hidden = __builtin_popcountll(r->hidden);
    return (uint64_t)r->n_blocks * (is_hidden ? (uint64_t)n_hidden * t->hidden_bytes
                                              : (uint64_t)(t->n_layer - n_hidden) * t->block_bytes);
}

/* Count a run being listed in the occupancy (is_in), or one leaving it. */
static void run_account(Tier *t, const TierRun *r, bool is_in) {
    if (is_in) {
        t->occupancy_bytes += r->n_bytes;
        t->kv_stored += run_payload(t, r, false);
        t->hidden_stored += run_payload(t, r, true);
    } else {
        t->occupancy_bytes -= r->n_bytes;
        t->kv_stored -= run_payload(t, r, false);
        t->hidden_stored -= run_payload(t, r, true);
    }
}

/* Unlink a listed run, free its room and the struct. */
static void run_destroy(Tier *t, TierRun *r) {
    lru_unlink(t, r);
    t->ops->release(t->kind, r);
    run_account(t, r, false);
    t->n_runs--;
    mn_free(r);
}

/* Drop a listed run: unmap its live blocks, report them when why != 0,
 * destroy it. Returns the number of live blocks it had. */
static int run_drop(Tier *t, TierRun *r, TierDropReason why) {
    int n_report = 0;
    for (int i = 0; i < r->n_blocks; i++) {
        uint64_t s = map_find(t, &r->hashes[i]);
        if (t->map[s].run == r && t->map[s].index == i) {
            t->report[n_report++] = r->hashes[i]; /* scratch_cap >= every run's n_blocks */
            map_delete_at(t, s);
        }
    }
    assert(n_report == r->n_live);
    run_destroy(t, r);
    if (why != 0 && n_report > 0 && t->drop_fn != NULL) t->drop_fn(t->drop_ctx, t->report, n_report, why);
    return n_report;
}

/* Map the blocks of the listed run r here, except those held by a run
 * with a larger id (in a put r has the largest id, so all move). A run
 * that loses its last live block to r goes (its blocks are still held,
 * so nothing is reported). r itself may end with n_live 0 (adoption). */
static void map_run(Tier *t, TierRun *r) {
    for (int i = 0; i < r->n_blocks; i++) {
        uint64_t s = map_find(t, &r->hashes[i]);
        MapSlot *ms = &t->map[s];
        if (ms->run != NULL) {
            TierRun *old = ms->run;
            if (old->id > r->id) continue; /* a later copy wins */
            old->n_live--;
            if (old != r && old->n_live == 0) run_destroy(t, old);
        } else {
            ms->key = r->hashes[i];
            t->map_count++;
        }
        ms->run = r;
        ms->index = i;
        r->n_live++;
    }
}

/* Each run's window index: the smallest of its live blocks' (-1: none). */
static void mark_window(Tier *t) {
    for (TierRun *r = t->lru_head; r != NULL; r = r->lru_next) r->window_idx = -1;
    for (int i = 0; i < t->n_win; i++) {
        MapSlot *s = map_get(t, &t->win_hashes[i]);
        if (s != NULL && (s->run->window_idx < 0 || t->win_idx[i] < s->run->window_idx))
            s->run->window_idx = t->win_idx[i];
    }
}

/* The run to evict next: the LRU head, or the policy's lowest key. */
static TierRun *choose_victim(Tier *t) {
    if (t->policy == EVICT_LRU || t->lru_head == NULL) return t->lru_head;
    if (policy_uses_window(t->policy)) mark_window(t);
    PolicyCtx pc = {t->policy, t->has_cost ? &t->cost : NULL, mn_wall_now()};
    TierRun *best = NULL;
    EvictKey best_key;
    for (TierRun *r = t->lru_head; r != NULL; r = r->lru_next) {
        EvictCand c = {.id = r->id,
                       .pos = r->pos,
                       .window_idx = policy_uses_window(t->policy) ? r->window_idx : -1,
                       .last_access = r->last_used,
                       .inserted = r->inserted};
        EvictKey k;
        policy_key(&pc, &c, &k);
        if (best == NULL || policy_key_cmp(&k, &best_key) < 0) {
            best = r;
            best_key = k;
        }
    }
    return best;
}

static void evict_one(Tier *t) {
    int n = run_drop(t, choose_victim(t), TIER_DROP_EVICTED);
    t->st.n_evicted_runs++;
    t->st.n_evicted_blocks += (uint64_t)n;
}

static int enter_failed(Tier *t, const char *what) {
    if (!t->is_failed) {
        LOG_ERROR("%s tier: I/O error while %s; the tier is off until reset", t->ops->name, what);
        t->st.n_io_errors++;
    }
    t->is_failed = true;
    return MN_EIO;
}

static int scratch_reserve(Tier *t, int n) {
    if (n <= t->scratch_cap) return MN_OK;
    int cap = t->scratch_cap ? t->scratch_cap : 16;
    while (cap < n) cap = cap > (1 << 29) ? n : 2 * cap;
    if (alloc_fault(t)) return MN_ENOMEM;
    Hash128 *report = mn_realloc(t->report, (size_t)cap * sizeof *report);
    if (report) t->report = report;
    TierRun **rr = mn_realloc(t->read_run, (size_t)cap * sizeof *rr);
    if (rr) t->read_run = rr;
    int32_t *ri = mn_realloc(t->read_idx, (size_t)cap * sizeof *ri);
    if (ri) t->read_idx = ri;
    int32_t *gi = mn_realloc(t->group_idx, (size_t)cap * sizeof *gi);
    if (gi) t->group_idx = gi;
    int32_t *gs = mn_realloc(t->group_slot, (size_t)cap * sizeof *gs);
    if (gs) t->group_slot = gs;
    TierReadGroup *g = mn_realloc(t->groups, (size_t)cap * sizeof *g);
    if (g) t->groups = g;
    if (!report || !rr || !ri || !gi || !gs || !g) return MN_ENOMEM;
    t->scratch_cap = cap;
    return MN_OK;
}

/* The layers of a run stored as hidden states: what was asked, where the
 * tier stores them and the model has such a layer. */
static uint64_t hidden_mask(const Tier *t, uint64_t asked) {
    if (t->hidden_bytes == 0) return 0;
    return asked & kvpool_layers_below(t->n_layer);
}

/* Whether pool has hidden rows of the tier's size (for a run with hidden layers). */
static bool pool_has_hidden(const Tier *t, const KvPool *pool) {
    return pool->hid_arenas != NULL && pool->hidden_bytes == t->hidden_bytes;
}

static bool pool_fits(const Tier *t, const KvPool *pool, const int32_t *slots, int n, uint64_t hidden) {
    if (pool == NULL || slots == NULL || pool->n_layer != t->n_layer || pool->block_bytes != t->block_bytes)
        return false;
    if (hidden != 0 && !pool_has_hidden(t, pool)) return false;
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= pool->n_blocks) return false;
    return true;
}

/* ---- construction -------------------------------------------------------- */

int tier_new_kind(const TierKindOps *ops, void *kind, int n_layer, size_t block_bytes, uint64_t capacity_bytes,
                  AllocFaults *faults, Tier **out) {
    *out = NULL;
    if (n_layer < 1 || block_bytes == 0 || capacity_bytes == 0) {
        ops->free(kind);
        return MN_EINVAL;
    }
    Tier *t = faults && alloc_faults_take(faults) ? NULL : mn_calloc(1, sizeof *t);
    MapSlot *map = faults && alloc_faults_take(faults) ? NULL : mn_calloc(64, sizeof *map);
    if (t == NULL || map == NULL) {
        mn_free(t);
        mn_free(map);
        ops->free(kind);
        return MN_ENOMEM;
    }
    t->ops = ops;
    t->kind = kind;
    t->n_layer = n_layer;
    t->block_bytes = block_bytes;
    t->capacity_bytes = capacity_bytes;
    t->next_run_id = 1;
    t->map = map;
    t->map_cap = 64;
    t->st.name = ops->name;
    t->faults.shared = faults;
    *out = t;
    return MN_OK;
}

void tier_share_faults(Tier *t, AllocFaults *f) { t->faults.shared = f; }

void tier_set_hidden_bytes(Tier *t, size_t hidden_bytes) { t->hidden_bytes = hidden_bytes; }

void tier_free(Tier *t) {
    if (t == NULL) return;
    if (t->ops->close) t->ops->close(t->kind); /* what is stored stays stored */
    while (t->lru_head) run_destroy(t, t->lru_head);
    t->ops->free(t->kind);
    mn_free(t->map);
    mn_free(t->report);
    mn_free(t->read_run);
    mn_free(t->read_idx);
    mn_free(t->group_idx);
    mn_free(t->group_slot);
    mn_free(t->groups);
    mn_free(t->win_hashes);
    mn_free(t->win_idx);
    mn_free(t);
}

const TierKindOps *tier_kind_ops(const Tier *t) { return t->ops; }
void *tier_kind(const Tier *t) { return t->kind; }
const char *tier_name(const Tier *t) { return t->ops->name; }

void tier_set_policy(Tier *t, EvictPolicy policy, const CostModel *cost) {
    t->policy = (unsigned)policy < EVICT__COUNT ? policy : EVICT_LRU;
    t->has_cost = cost != NULL;
    if (cost != NULL) t->cost = *cost;
}

int tier_set_window(Tier *t, const Hash128 *hashes, const int32_t *idx, int n) {
    Hash128 *h = NULL;
    int32_t *ix = NULL;
    if (n > 0) {
        h = mn_malloc((size_t)n * sizeof *h);
        ix = mn_malloc((size_t)n * sizeof *ix);
        if (h == NULL || ix == NULL) {
            mn_free(h);
            mn_free(ix);
            return MN_ENOMEM;
        }
        memcpy(h, hashes, (size_t)n * sizeof *h);
        memcpy(ix, idx, (size_t)n * sizeof *ix);
    }
    mn_free(t->win_hashes);
    mn_free(t->win_idx);
    t->win_hashes = h;
    t->win_idx = ix;
    t->n_win = n > 0 ? n : 0;
    return MN_OK;
}

void tier_set_drop_fn(Tier *t, TierDropFn fn, void *ctx) {
    t->drop_fn = fn;
    t->drop_ctx = ctx;
}

TierRun *tier_find_run(const Tier *t, const Hash128 *hash, int *index) {
    MapSlot *s = map_get(t, hash);
    if (s == NULL) return NULL;
    if (index) *index = s->index;
    return s->run;
}

/* ---- put ----------------------------------------------------------------- */

static void run_set_info(const Tier *t, TierRun *r, const TierRunInfo *info) {
    r->pos = info != NULL && info->pos > 0 ? info->pos : 0;
    r->hidden = info != NULL ? hidden_mask(t, info->hidden) : 0;
    r->has_ns = info != NULL && info->ns_id != NULL;
    if (r->has_ns) r->ns_id = *info->ns_id;
}

int tier_max_run_blocks(const Tier *t) { return t->ops->max_run_blocks ? t->ops->max_run_blocks(t->kind) : 0; }

int tier_put_run(Tier *t, const Hash128 *hashes, int n_blocks, const KvPool *pool, const int32_t *slots,
                 const TierRunInfo *info) {
    if (t->is_failed) return MN_EIO;
    uint64_t hidden = info != NULL ? hidden_mask(t, info->hidden) : 0;
    int max = tier_max_run_blocks(t);
    if (n_blocks < 1 || (max > 0 && n_blocks > max) || hashes == NULL || !pool_fits(t, pool, slots, n_blocks, hidden))
        return MN_EINVAL;
    uint64_t need = t->ops->run_bytes(t->kind, n_blocks, hidden);
    if (need > t->capacity_bytes) {
        t->st.n_puts_full++;
        return MN_EFULL;
    }
    int rc = scratch_reserve(t, n_blocks);
    if (rc == MN_OK) rc = map_reserve(t, (uint64_t)n_blocks);
    if (rc != MN_OK) return rc;
    TierRun *r = alloc_fault(t) ? NULL : mn_malloc(sizeof *r + (size_t)n_blocks * sizeof(Hash128));
    if (r == NULL) return MN_ENOMEM;
    memset(r, 0, sizeof *r);
    r->id = t->next_run_id++;
    r->n_blocks = n_blocks;
    r->n_bytes = need;
    run_set_info(t, r, info);
    memcpy(r->hashes, hashes, (size_t)n_blocks * sizeof(Hash128));

    /* room: first the budget, then the medium */
    while (t->occupancy_bytes + need > t->capacity_bytes) evict_one(t); /* need <= capacity: ends */
    for (;;) {
        rc = alloc_fault(t) ? MN_ENOMEM : t->ops->reserve(t->kind, r); /* (as the kind's own allocation) */
        if (rc != MN_EFULL || t->lru_head == NULL) break;
        evict_one(t);
    }
    if (rc != MN_OK) {
        mn_free(r);
        if (rc == MN_EFULL) t->st.n_puts_full++;
        return rc == MN_EIO ? enter_failed(t, "reserving room") : rc;
    }

    uint64_t io_bytes = 0;
    r->last_used = r->inserted = mn_wall_now();
    double t0 = mn_now();
    rc = t->ops->write(t->kind, r, pool, slots, &io_bytes);
    double dt = mn_now() - t0;
    if (rc != MN_OK) {
        t->ops->release(t->kind, r);
        mn_free(r);
        if (rc == MN_EFULL) t->st.n_puts_full++;
        return rc == MN_EIO ? enter_failed(t, "writing a run") : rc;
    }
    t->st.bytes_written += io_bytes;
    t->st.write_seconds += dt;
    t->st.n_puts++;

    lru_push_mru(t, r);
    run_account(t, r, true); /* r->n_bytes == need */
    t->n_runs++;
    map_run(t, r);
    return MN_OK;
}

/* ---- adopt (opening a persistent tier) ------------------------------------ */

int tier_adopt_run(Tier *t, uint64_t run_id, const Hash128 *hashes, int n_blocks, void *data, uint64_t n_bytes,
                   double last_used, const TierRunInfo *info) {
    if (n_blocks < 1 || hashes == NULL || run_id == 0 || run_id >= (1ull << 48)) return MN_EINVAL;
    if (n_bytes > t->capacity_bytes) return MN_EFULL;
    int rc = scratch_reserve(t, n_blocks);
    if (rc == MN_OK) rc = map_reserve(t, (uint64_t)n_blocks);
    if (rc != MN_OK) return rc;
    TierRun *r = alloc_fault(t) ? NULL : mn_malloc(sizeof *r + (size_t)n_blocks * sizeof(Hash128));
    if (r == NULL) return MN_ENOMEM;
    memset(r, 0, sizeof *r);
    r->id = run_id;
    r->n_blocks = n_blocks;
    r->n_bytes = n_bytes;
    r->last_used = r->inserted = last_used;
    run_set_info(t, r, info);
    r->data = data;
    memcpy(r->hashes, hashes, (size_t)n_blocks * sizeof(Hash128));
    if (run_id >= t->next_run_id) t->next_run_id = run_id + 1;
    while (t->occupancy_bytes + n_bytes > t->capacity_bytes) evict_one(t); /* n_bytes <= capacity: ends */
    lru_push_mru(t, r);
    run_account(t, r, true);
    t->n_runs++;
    t->st.n_adopted_runs++;
    map_run(t, r);
    if (r->n_live == 0) run_destroy(t, r); /* every block lives in a later run */
    return MN_OK;
}

void tier_skip_run_ids(Tier *t, uint64_t id) {
    if (id >= t->next_run_id) t->next_run_id = id + 1;
}

uint64_t tier_new_run_id(Tier *t) { return t->next_run_id++; }

/* ---- lookups ------------------------------------------------------------- */

bool tier_has(const Tier *t, const Hash128 *hash) { return map_get(t, hash) != NULL; }

uint64_t tier_block_hidden(const Tier *t, const Hash128 *hash) {
    MapSlot *s = map_get(t, hash);
    return s != NULL ? s->run->hidden : 0;
}

int tier_locate(const Tier *t, const Hash128 *hash, TierLoc *out) {
    MapSlot *s = map_get(t, hash);
    if (s == NULL) return MN_ENOTFOUND;
    out->run_id = s->run->id;
    out->index = s->index;
    out->n_blocks = s->run->n_blocks;
    return MN_OK;
}

/* ---- read ---------------------------------------------------------------- */

/* Split a read of hashes[0..n) into slots[] by run: t->groups[0..*n_groups)
 * in order of each run's first block, their idx/slots in group_idx/slot.
 * MN_ENOTFOUND when a block is not held, MN_EINVAL, MN_ENOMEM. */
static int group_by_run(Tier *t, const Hash128 *hashes, int n_blocks, KvPool *pool, const int32_t *slots,
                        int *n_groups) {
    *n_groups = 0;
    if (t->is_failed) return MN_EIO;
    if (n_blocks < 1 || hashes == NULL || !pool_fits(t, pool, slots, n_blocks, 0)) return MN_EINVAL;
    int rc = scratch_reserve(t, n_blocks);
    if (rc != MN_OK) return rc;
    for (int i = 0; i < n_blocks; i++) {
        MapSlot *s = map_get(t, &hashes[i]);
        if (s == NULL) return MN_ENOTFOUND;
        if (s->run->hidden != 0 && !pool_has_hidden(t, pool)) return MN_EINVAL;
        t->read_run[i] = s->run;
        t->read_idx[i] = s->index;
    }
    int n = 0, g = 0;
    for (int i = 0; i < n_blocks; i++) {
        TierRun *r = t->read_run[i];
        if (r == NULL) continue;
        t->groups[g] = (TierReadGroup){.run = r, .idx = &t->group_idx[n], .slots = &t->group_slot[n]};
        for (int j = i; j < n_blocks; j++)
            if (t->read_run[j] == r) {
                t->group_idx[n] = t->read_idx[j];
                t->group_slot[n++] = slots[j];
                t->groups[g].n++;
                t->read_run[j] = NULL;
            }
        g++;
    }
    *n_groups = g;
    return MN_OK;
}

/* Run r was used at `when` (the kind keeps it, the disk in its record). */
static void run_used(Tier *t, TierRun *r, double when) {
    r->last_used = when;
    if (t->ops->touch && !t->is_failed) t->ops->touch(t->kind, r);
}

/* Settle what a read of run r's layer returned: a checksum failure or a
 * run the medium no longer has drops the run, an I/O error is sticky (r
 * may be NULL then), success makes the run most recently used (and a read
 * of layer 0 counts as a use). */
static int read_outcome(Tier *t, TierRun *r, int layer, int rc) {
    if (rc == MN_ECHECKSUM) {
        assert(r != NULL);
        LOG_WARN("%s tier: layer %d of run %llu failed its checksum; dropping the run", t->ops->name, layer,
                 (unsigned long long)r->id);
        t->st.n_checksum_failures++;
        run_drop(t, r, TIER_DROP_CHECKSUM);
        return rc;
    }
    if (rc == MN_ENOTFOUND && r != NULL) { /* the store's own eviction: an ordinary miss */
        LOG_INFO("%s tier: layer %d of run %llu is no longer stored; dropping the run", t->ops->name, layer,
                 (unsigned long long)r->id);
        t->st.n_missing_runs++;
        run_drop(t, r, TIER_DROP_MISSING);
        return rc;
    }
    if (rc == MN_EIO) return enter_failed(t, "reading a layer");
    if (rc != MN_OK) return rc;
    lru_unlink(t, r);
    lru_push_mru(t, r);
    if (layer == 0) run_used(t, r, mn_wall_now());
    return MN_OK;
}

/* One kind call per run touched, with that run's share of the request. */
static int read_groups_layer(Tier *t, int n_groups, int layer, KvPool *pool) {
    for (int g = 0; g < n_groups; g++) {
        TierReadGroup *gr = &t->groups[g];
        uint64_t io_bytes = 0;
        double t0 = mn_now();
        int rc = t->ops->read_layer(t->kind, gr->run, layer, gr->idx, gr->slots, gr->n, pool, &io_bytes);
        t->st.read_seconds += mn_now() - t0;
        t->st.bytes_read += io_bytes;
        if ((rc = read_outcome(t, gr->run, layer, rc)) != MN_OK) return rc;
    }
    t->st.n_layer_reads++;
    return MN_OK;
}

int tier_read_layer(Tier *t, const Hash128 *hashes, int n_blocks, int layer, KvPool *pool, const int32_t *slots) {
    if (layer < 0 || layer >= t->n_layer) return MN_EINVAL;
    int n_groups;
    int rc = group_by_run(t, hashes, n_blocks, pool, slots, &n_groups);
    return rc != MN_OK ? rc : read_groups_layer(t, n_groups, layer, pool);
}

int tier_read_layers(Tier *t, const Hash128 *hashes, int n_blocks, KvPool *pool, const int32_t *slots,
                     TierLayerFn layer_fn, void *ctx) {
    int n_groups;
    int rc = group_by_run(t, hashes, n_blocks, pool, slots, &n_groups);
    if (rc != MN_OK) return rc;
    if (t->ops->read_layers == NULL) {
        for (int l = 0; l < t->n_layer; l++) {
            if ((rc = read_groups_layer(t, n_groups, l, pool)) != MN_OK) return rc;
            if (layer_fn) layer_fn(ctx, l);
        }
        return MN_OK;
    }
    uint64_t io_bytes = 0;
    TierReadFailure bad = {-1, -1};
    double t0 = mn_now();
    rc = t->ops->read_layers(t->kind, t->groups, n_groups, pool, layer_fn, ctx, &io_bytes, &bad);
    t->st.read_seconds += mn_now() - t0;
    t->st.bytes_read += io_bytes;
    if (rc == MN_ECHECKSUM || rc == MN_ENOTFOUND) {
        assert(bad.group >= 0 && bad.group < n_groups);
        return read_outcome(t, t->groups[bad.group].run, bad.layer, rc);
    }
    if (rc != MN_OK) return read_outcome(t, NULL, -1, rc);
    for (int g = 0; g < n_groups; g++) read_outcome(t, t->groups[g].run, 0, MN_OK);
    t->st.n_layer_reads += (uint64_t)t->n_layer;
    return MN_OK;
}

/* ---- measure ---------------------------------------------------------------- */

/* Read scratch run r (blocks idx[k] into slots[k]) back as tier_read_layers
 * would, timed. */
static int read_back_timed(Tier *t, TierRun *r, const int32_t *idx, KvPool *pool, const int32_t *slots,
                           TierReadRate *out) {
    uint64_t io_bytes = 0;
    int rc = MN_OK;
    double t0 = mn_now();
    if (t->ops->read_layers != NULL) {
        TierReadGroup g = {.run = r, .idx = idx, .slots = slots, .n = r->n_blocks};
        TierReadFailure bad;
        rc = t->ops->read_layers(t->kind, &g, 1, pool, NULL, NULL, &io_bytes, &bad);
    } else {
        for (int l = 0; l < t->n_layer && rc == MN_OK; l++) {
            uint64_t layer_bytes = 0;
            rc = t->ops->read_layer(t->kind, r, l, idx, slots, r->n_blocks, pool, &layer_bytes);
            io_bytes += layer_bytes;
        }
    }
    out->seconds = mn_now() - t0;
    out->bytes = io_bytes;
    return rc;
}

int tier_measure_read(Tier *t, KvPool *pool, const int32_t *slots, int n, uint64_t salt, TierReadRate *out) {
    *out = (TierReadRate){0};
    if (t->is_failed) return MN_EIO;
    int max = tier_max_run_blocks(t);
    if (n < 1 || (max > 0 && n > max) || !pool_fits(t, pool, slots, n, 0)) return MN_EINVAL;
    uint64_t need = t->ops->run_bytes(t->kind, n, 0);
    if (need > t->capacity_bytes || t->occupancy_bytes + need > t->capacity_bytes) return MN_EFULL;
    TierRun *r = mn_calloc(1, sizeof *r + (size_t)n * sizeof(Hash128));
    int32_t *idx = mn_malloc((size_t)n * sizeof *idx);
    int rc = r != NULL && idx != NULL ? MN_OK : MN_ENOMEM;
    if (rc == MN_OK) {
        r->id = t->next_run_id++;
        r->n_blocks = n;
        r->n_bytes = need;
        r->window_idx = -1;
        r->last_used = r->inserted = mn_wall_now();
        for (int i = 0; i < n; i++) {
            uint64_t key[3] = {salt, r->id, (uint64_t)i};
            r->hashes[i] = hash128(key, sizeof key);
            idx[i] = i;
        }
        rc = t->ops->reserve(t->kind, r); /* a failed reserve needs no release */
    }
    if (rc == MN_OK) {
        uint64_t io_bytes = 0;
        rc = t->ops->write(t->kind, r, pool, slots, &io_bytes);
        if (rc == MN_OK) rc = read_back_timed(t, r, idx, pool, slots, out);
        if (t->ops->discard) t->ops->discard(t->kind, r);
        t->ops->release(t->kind, r);
    }
    mn_free(idx);
    mn_free(r);
    if (rc != MN_OK) *out = (TierReadRate){0};
    return rc == MN_EIO ? enter_failed(t, "measuring its read rate") : rc;
}

void tier_fault_alloc(Tier *t, int n_skip, int n_fail) {
    alloc_faults_set(&t->faults, n_skip, n_fail);
}

int tier_touch(Tier *t, const Hash128 *hashes, int n, double when) {
    int n_runs = 0;
    for (int i = 0; i < n; i++) {
        MapSlot *s = map_get(t, &hashes[i]);
        if (s == NULL || s->run->last_used >= when) continue;
        lru_unlink(t, s->run);
        lru_push_mru(t, s->run);
        run_used(t, s->run, when);
        n_runs++;
    }
    return n_runs;
}

/* ---- drop, reset ----------------------------------------------------------- */

int tier_drop(Tier *t, const Hash128 *hash) {
    uint64_t s = map_find(t, hash);
    TierRun *r = t->map[s].run;
    if (r == NULL) return MN_ENOTFOUND;
    map_delete_at(t, s);
    if (--r->n_live == 0) run_destroy(t, r);
    return MN_OK;
}

int tier_drop_run(Tier *t, const Hash128 *hash) {
    MapSlot *s = map_get(t, hash);
    if (s == NULL) return MN_ENOTFOUND;
    run_drop(t, s->run, TIER_DROP_CALLER);
    return MN_OK;
}

int tier_drop_namespace(Tier *t, const Hash128 *ns_id, int *n_blocks) {
    int n_runs = 0, n = 0;
    for (TierRun *r = t->lru_head, *next; r != NULL; r = next) {
        next = r->lru_next; /* run_drop frees r and nothing else */
        if (ns_id != NULL && r->has_ns && !hash128_eq(&r->ns_id, ns_id)) continue;
        n += run_drop(t, r, TIER_DROP_CALLER);
        n_runs++;
    }
    if (n_blocks) *n_blocks = n;
    return n_runs;
}

int tier_expire(Tier *t, double cutoff) {
    int n_blocks = 0;
    for (TierRun *r = t->lru_head, *next; r != NULL; r = next) {
        next = r->lru_next; /* run_drop frees r and nothing else */
        if (!(r->last_used < cutoff)) continue;
        int n = run_drop(t, r, TIER_DROP_EXPIRED);
        t->st.n_expired_runs++;
        t->st.n_expired_blocks += (uint64_t)n;
        n_blocks += n;
    }
    return n_blocks;
}

int tier_reset(Tier *t) {
    while (t->lru_head) run_drop(t, t->lru_head, TIER_DROP_CALLER);
    int rc = t->ops->reset ? t->ops->reset(t->kind) : MN_OK;
    if (rc != MN_OK) { /* the kind could not start over: stay (or become) failed */
        enter_failed(t, "resetting");
        return rc;
    }
    if (t->is_failed) t->st.n_resets++;
    t->is_failed = false;
    return MN_OK;
}

void tier_fail(Tier *t, const char *what) { enter_failed(t, what); }

bool tier_is_failed(const Tier *t) { return t->is_failed; }

bool tier_is_retried(const Tier *t) { return t->ops->is_retried; }

/* ---- listing ---------------------------------------------------------------- */

void tier_foreach_run(const Tier *t, TierRunFn fn, void *ctx) {
    for (const TierRun *r = t->lru_head; r != NULL; r = r->lru_next) {
        int n = 0;
        for (int i = 0; i < r->n_blocks; i++) {
            const MapSlot *s = map_get(t, &r->hashes[i]);
            if (s != NULL && s->run == r && s->index == i)
                t->report[n++] = r->hashes[i]; /* scratch_cap >= every run's n_blocks */
        }
        fn(ctx, t->report, n);
    }
}

/* ---- stats, check, dump ---------------------------------------------------- */

void tier_stats(const Tier *t, TierStats *out) {
    *out = t->st;
    out->capacity_bytes = t->capacity_bytes;
    out->occupancy_bytes = t->occupancy_bytes;
    out->kv_bytes = t->kv_stored;
    out->hidden_bytes = t->hidden_stored;
    out->n_runs = t->n_runs;
    out->n_blocks = t->map_count;
    out->is_failed = t->is_failed;
}

void tier_dump(const Tier *t) {
    fprintf(stderr, "Tier %s: %d layers, %zu bytes/block/layer; %llu of %llu bytes in %llu runs, %llu blocks%s\n",
            t->ops->name, t->n_layer, t->block_bytes, (unsigned long long)t->occupancy_bytes,
            (unsigned long long)t->capacity_bytes, (unsigned long long)t->n_runs,
            (unsigned long long)t->map_count, t->is_failed ? " FAILED" : "");
    const TierStats *s = &t->st;
    fprintf(stderr,
            "  puts %llu (full %llu), layer reads %llu, written %llu B in %.6f s, read %llu B in %.6f s, "
            "evicted %llu runs / %llu blocks, expired %llu runs / %llu blocks, adopted %llu runs, "
            "checksum failures %llu, missing runs %llu, io errors %llu, resets %llu\n",
            (unsigned long long)s->n_puts, (unsigned long long)s->n_puts_full, (unsigned long long)s->n_layer_reads,
            (unsigned long long)s->bytes_written, s->write_seconds, (unsigned long long)s->bytes_read, s->read_seconds,
            (unsigned long long)s->n_evicted_runs, (unsigned long long)s->n_evicted_blocks,
            (unsigned long long)s->n_expired_runs, (unsigned long long)s->n_expired_blocks,
            (unsigned long long)s->n_adopted_runs, (unsigned long long)s->n_checksum_failures,
            (unsigned long long)s->n_missing_runs, (unsigned long long)s->n_io_errors,
            (unsigned long long)s->n_resets);
    int k = 0;
    for (const TierRun *r = t->lru_head; r != NULL; r = r->lru_next, k++) {
        if (k == 64) {
            fprintf(stderr, "  ... (%llu runs in all)\n", (unsigned long long)t->n_runs);
            break;
        }
        char hex[33];
        hash128_hex(&r->hashes[0], hex);
        fprintf(stderr, "  run %llu: %d blocks (%d live), %llu bytes, last used %.3f, first %s\n",
                (unsigned long long)r->id, r->n_blocks, r->n_live, (unsigned long long)r->n_bytes, r->last_used, hex);
    }
    if (t->ops->dump) t->ops->dump(t->kind);
}

static void check_fail(const Tier *t, const char *what) {
    tier_dump(t);
    fprintf(stderr, "tier_check: %s\n", what);
    abort();
}

void tier_check(const Tier *t) {
    uint64_t n_runs = 0, bytes = 0;
    for (TierRun *r = t->lru_head; r != NULL; r = r->lru_next) {
        if (r->lru_next ? r->lru_next->lru_prev != r : t->lru_tail != r) check_fail(t, "broken LRU links");
        r->check_live = 0;
        n_runs++;
        bytes += r->n_bytes;
    }
    if (n_runs != t->n_runs) check_fail(t, "run count");
    if (bytes != t->occupancy_bytes) check_fail(t, "occupancy is not the sum of the runs");
    uint64_t kv = 0, hid = 0;
    for (TierRun *r = t->lru_head; r != NULL; r = r->lru_next) {
        kv += run_payload(t, r, false);
        hid += run_payload(t, r, true);
    }
    if (kv != t->kv_stored || hid != t->hidden_stored) check_fail(t, "stored bytes by representation");
    if (t->occupancy_bytes > t->capacity_bytes) check_fail(t, "occupancy over the budget");
    uint64_t n_map = 0;
    for (uint64_t i = 0; i < t->map_cap; i++) {
        const MapSlot *s = &t->map[i];
        if (s->run == NULL) continue;
        n_map++;
        if (map_find(t, &s->key) != i) check_fail(t, "map entry unreachable from its home");
        if (s->index < 0 || s->index >= s->run->n_blocks || !hash128_eq(&s->run->hashes[s->index], &s->key))
            check_fail(t, "map entry disagrees with its run");
        s->run->check_live++;
    }
    if (n_map != t->map_count || 2 * n_map > t->map_cap) check_fail(t, "map count");
    uint64_t n_seen = 0;
    for (TierRun *r = t->lru_head; r != NULL; r = r->lru_next) {
        if (r->check_live != r->n_live || r->n_live < 1) check_fail(t, "run live count");
        n_seen += (uint64_t)r->check_live;
    }
    if (n_seen != n_map) check_fail(t, "map entry pointing at a run not listed");
    for (TierRun *r = t->lru_head; r != NULL; r = r->lru_next) {
        if (r->id >= t->next_run_id) check_fail(t, "run id not below next_run_id");
        if (r->n_blocks > t->scratch_cap) check_fail(t, "scratch smaller than a run");
    }
    if (t->ops->check) t->ops->check(t->kind, t->occupancy_bytes);
}
