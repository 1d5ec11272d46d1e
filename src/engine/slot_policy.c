/* slot_policy.c — the eviction policy's facts about each pool slot (see
 * slot_policy.h).
 *
 * Per slot: the position of its block's first token, its conversation and
 * namespace, when it was indexed, and the index of its request in the
 * look-ahead window (-1: none). Ranking builds a candidate per slot into
 * scratch sized once for the whole pool, so neither eviction nor
 * write-behind allocates. Engine thread only.
 */
#include "engine/slot_policy.h"

#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"

struct SlotPolicy {
    const KvPool *pool;      /* borrowed: the cached-at times and the LRU list */
    EvictPolicy evict;
    CostModel cost;          /* valid when has_cost */
    bool has_cost;
    int32_t *slot_pos;       /* (n_blocks) position of the block's first token in its sequence */
    uint64_t *slot_conv;     /* (n_blocks) its conversation (0: none) */
    Hash128 *slot_ns;        /* (n_blocks) its namespace */
    double *slot_inserted;   /* (n_blocks) when it was indexed (computed or restored) */
    int32_t *slot_window;    /* (n_blocks) index of its request in the look-ahead window, -1 */
    bool has_window_marks;   /* some slot_window entry may be set */
    EvictCand *cands;        /* (n_blocks) scratch for ranking */
    EvictKey *keys;          /* (n_blocks) */
};

/* ---- life cycle ---------------------------------------------------------------- */

int slotpol_new(const KvPool *pool, EvictPolicy evict, const CostModel *cost, SlotPolicy **out) {
    *out = NULL;
    SlotPolicy *sp = mn_calloc(1, sizeof *sp);
    if (sp == NULL) return MN_ENOMEM;
    sp->pool = pool;
    sp->evict = evict;
    if (cost) {
        sp->cost = *cost;
        sp->has_cost = true;
    }
    size_t nb = (size_t)pool->n_blocks;
    sp->slot_pos = mn_calloc(nb, sizeof *sp->slot_pos);
    sp->slot_conv = mn_calloc(nb, sizeof *sp->slot_conv);
    sp->slot_ns = mn_calloc(nb, sizeof *sp->slot_ns);
    sp->slot_inserted = mn_calloc(nb, sizeof *sp->slot_inserted);
    sp->slot_window = mn_malloc(nb * sizeof *sp->slot_window);
    sp->cands = mn_malloc(nb * sizeof *sp->cands);
    sp->keys = mn_malloc(nb * sizeof *sp->keys);
    if (!sp->slot_pos || !sp->slot_conv || !sp->slot_ns || !sp->slot_inserted || !sp->slot_window || !sp->cands ||
        !sp->keys) {
        slotpol_free(sp);
        return MN_ENOMEM;
    }
    for (size_t i = 0; i < nb; i++) sp->slot_window[i] = -1;
    *out = sp;
    return MN_OK;
}

void slotpol_free(SlotPolicy *sp) {
    if (sp == NULL) return;
    mn_free(sp->slot_pos);
    mn_free(sp->slot_conv);
    mn_free(sp->slot_ns);
    mn_free(sp->slot_inserted);
    mn_free(sp->slot_window);
    mn_free(sp->cands);
    mn_free(sp->keys);
    mn_free(sp);
}

const CostModel *slotpol_cost(const SlotPolicy *sp) { return sp->has_cost ? &sp->cost : NULL; }

/* ---- facts ------------------------------------------------------------------------ */

void slotpol_note_block(SlotPolicy *sp, int32_t slot, int32_t pos, uint64_t conv, const Hash128 *ns) {
    sp->slot_pos[slot] = pos;
    sp->slot_conv[slot] = conv;
    sp->slot_ns[slot] = *ns;
    sp->slot_inserted[slot] = mn_now();
}

EvictCand slotpol_cand(const SlotPolicy *sp, int32_t s) {
    return (EvictCand){.id = (uint64_t)s,
                       .conv = sp->slot_conv[s],
                       .pos = sp->slot_pos[s],
                       .window_idx = sp->slot_window[s],
                       .last_access = sp->pool->cached_at[s],
                       .inserted = sp->slot_inserted[s]};
}

const Hash128 *slotpol_ns(const SlotPolicy *sp, int32_t slot) { return &sp->slot_ns[slot]; }

/* ---- the look-ahead window's marks ---------------------------------------------- */

bool slotpol_has_window(const SlotPolicy *sp) { return sp->has_window_marks; }

void slotpol_reset_window(SlotPolicy *sp, bool is_marking) {
    if (sp->has_window_marks)
        for (int i = 0; i < sp->pool->n_blocks; i++) sp->slot_window[i] = -1;
    sp->has_window_marks = is_marking;
}

void slotpol_mark_window(SlotPolicy *sp, int32_t slot, int idx) {
    if (sp->slot_window[slot] < 0) sp->slot_window[slot] = idx;
}

/* ---- ranking -------------------------------------------------------------------- */

static PolicyCtx policy_ctx(const SlotPolicy *sp) { return (PolicyCtx){sp->evict, slotpol_cost(sp), mn_now()}; }

int32_t slotpol_choose_victim(void *ctx, const KvPool *p) {
    SlotPolicy *sp = ctx;
    PolicyCtx pc = policy_ctx(sp);
    int n = 0;
    for (int32_t s = p->lru_head; s >= 0; s = p->lru_next[s], n++) sp->cands[n] = slotpol_cand(sp, s);
    policy_keys(&pc, sp->cands, n, sp->keys);
    return (int32_t)sp->cands[policy_victim(sp->keys, n)].id;
}

int slotpol_select(SlotPolicy *sp, const int32_t *slots, int n, int k, int32_t *out) {
    PolicyCtx pc = policy_ctx(sp);
    for (int i = 0; i < n; i++) sp->cands[i] = slotpol_cand(sp, slots[i]);
    policy_keys(&pc, sp->cands, n, sp->keys);
    return policy_select(sp->keys, n, k, out);
}
