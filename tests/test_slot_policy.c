/* test_slot_policy.c — the eviction policy's facts per pool slot
 * (engine/slot_policy.h), side by side with a plain model: flat arrays of
 * what the test noted, ranked by cache/policy directly. The pool's own
 * cached-at times are the last accesses of both, and the policies used
 * (lru, lookahead) do not read the clock, so nothing depends on timing. */
#include "test_util.h"

#include "base/mem.h"
#include "base/rng.h"
#include "cache/kv_pool.h"
#include "engine/slot_policy.h"

#define N_BLOCKS 24

/* What the test noted per slot: the trivially correct model. */
typedef struct Model {
    int32_t pos[N_BLOCKS];
    uint64_t conv[N_BLOCKS];
    Hash128 ns[N_BLOCKS];
    int32_t window[N_BLOCKS];
} Model;

/* A pool whose every slot is CACHED, released in a random order (so the
 * LRU list and cached-at times are shuffled). */
static void cached_pool(KvPool *p, Rng *r) {
    assert_int_equal(kvpool_init(p, 1, 4, 4, N_BLOCKS, MN_TYPE_F32), MN_OK);
    int32_t slots[N_BLOCKS];
    for (int i = 0; i < N_BLOCKS; i++) {
        assert_int_equal(kvpool_alloc(p, &slots[i]), MN_OK);
        kvpool_set_cacheable(p, slots[i]);
    }
    for (int i = N_BLOCKS - 1; i > 0; i--) {
        int j = (int)rng_below(r, (uint64_t)i + 1);
        int32_t t = slots[i];
        slots[i] = slots[j];
        slots[j] = t;
    }
    for (int i = 0; i < N_BLOCKS; i++) kvpool_release(p, slots[i]);
    assert_int_equal(kvpool_n_cached(p), N_BLOCKS);
}

static EvictCand model_cand(const Model *m, const KvPool *p, int32_t s) {
    return (EvictCand){.id = (uint64_t)s,
                       .conv = m->conv[s],
                       .pos = m->pos[s],
                       .window_idx = m->window[s],
                       .last_access = p->cached_at[s]};
}

/* Note random facts into sp and m alike; mark a random window. */
static void note_random(SlotPolicy *sp, Model *m, Rng *r) {
    for (int32_t s = 0; s < N_BLOCKS; s++) {
        m->pos[s] = (int32_t)rng_below(r, 8) * 32;
        m->conv[s] = rng_below(r, 4);
        memset(&m->ns[s], 0, sizeof m->ns[s]);
        m->ns[s].b[0] = (uint8_t)rng_below(r, 3);
        m->window[s] = -1;
        slotpol_note_block(sp, s, m->pos[s], m->conv[s], &m->ns[s]);
    }
    slotpol_reset_window(sp, true);
    for (int k = 0; k < N_BLOCKS / 2; k++) {
        int32_t s = (int32_t)rng_below(r, N_BLOCKS);
        int idx = (int)rng_below(r, 5);
        slotpol_mark_window(sp, s, idx);
        if (m->window[s] < 0) m->window[s] = idx; /* the first mark stays */
    }
}

/* ---- tests ---------------------------------------------------------------- */

static void test_facts_and_marks(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 1, 0);
    KvPool p;
    cached_pool(&p, &r);
    SlotPolicy *sp;
    assert_int_equal(slotpol_new(&p, EVICT_LOOKAHEAD, NULL, &sp), MN_OK);
    assert_null(slotpol_cost(sp));
    assert_false(slotpol_has_window(sp));
    Model m;
    note_random(sp, &m, &r);
    assert_true(slotpol_has_window(sp));
    for (int32_t s = 0; s < N_BLOCKS; s++) {
        EvictCand c = slotpol_cand(sp, s);
        assert_int_equal(c.id, s);
        assert_int_equal(c.pos, m.pos[s]);
        assert_int_equal(c.conv, m.conv[s]);
        assert_int_equal(c.window_idx, m.window[s]);
        assert_true(c.last_access == p.cached_at[s]);
        assert_true(hash128_eq(slotpol_ns(sp, s), &m.ns[s]));
    }
    slotpol_reset_window(sp, false); /* every mark goes */
    assert_false(slotpol_has_window(sp));
    for (int32_t s = 0; s < N_BLOCKS; s++) assert_int_equal(slotpol_cand(sp, s).window_idx, -1);
    slotpol_free(sp);
    kvpool_deinit(&p);
}

/* The victim and the first k of any subset, as the model ranks them. */
static void test_ranking_matches_model(void **state) {
    (void)state;
    const EvictPolicy policies[] = {EVICT_LRU, EVICT_LOOKAHEAD};
    for (int round = 0; round < 40; round++) {
        Rng r;
        rng_seed(&r, 100 + (uint64_t)round, 0);
        KvPool p;
        cached_pool(&p, &r);
        EvictPolicy pol = policies[round % 2];
        SlotPolicy *sp;
        assert_int_equal(slotpol_new(&p, pol, NULL, &sp), MN_OK);
        Model m;
        note_random(sp, &m, &r);
        PolicyCtx pc = {pol, NULL, 0};
        EvictCand cands[N_BLOCKS];
        EvictKey keys[N_BLOCKS];
        int n = 0;
        for (int32_t s = p.lru_head; s >= 0; s = p.lru_next[s]) cands[n++] = model_cand(&m, &p, s);
        policy_keys(&pc, cands, n, keys);
        assert_int_equal(slotpol_choose_victim(sp, &p), (int32_t)cands[policy_victim(keys, n)].id);
        /* a random subset, as write-behind passes its unsaved slots */
        int32_t subset[N_BLOCKS];
        int n_sub = 0;
        for (int32_t s = 0; s < N_BLOCKS; s++)
            if (rng_below(&r, 2)) {
                subset[n_sub] = s;
                cands[n_sub++] = model_cand(&m, &p, s);
            }
        int k = 1 + (int)rng_below(&r, 8);
        int32_t got[N_BLOCKS], want[N_BLOCKS];
        policy_keys(&pc, cands, n_sub, keys);
        int n_want = policy_select(keys, n_sub, k, want);
        assert_int_equal(slotpol_select(sp, subset, n_sub, k, got), n_want);
        for (int i = 0; i < n_want; i++) assert_int_equal(got[i], want[i]);
        slotpol_free(sp);
        kvpool_deinit(&p);
    }
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_facts_and_marks),
        cmocka_unit_test(test_ranking_matches_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
