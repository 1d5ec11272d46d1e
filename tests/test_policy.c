/* test_policy.c — eviction policies: name parsing, lru/fifo orders,
 * Pensieve retention ordering (leading blocks of idle conversations first,
 * active conversations last), look-ahead exemption and tail-first eviction,
 * partial selection against a brute-force sort, window length and the
 * write-behind watermark. Costs come from synthetic CostModels, so nothing
 * depends on timing. */
#include "test_util.h"

#include <math.h>

#include "base/mem.h"
#include "base/rng.h"
#include "cache/cost.h"
#include "cache/policy.h"

/* ---- helpers -------------------------------------------------------------- */

static CostModel synthetic_cost(double tok_sec, double attn_per_ctx) {
    CostKey key;
    memset(&key, 0, sizeof key);
    key.block_tokens = 32;
    CostModel cm;
    MnErr err;
    if (cost_init_linear(&cm, &key, tok_sec, attn_per_ctx, 8192, &err)) fail_msg("%s", err.msg);
    return cm;
}

/* The full eviction order by insertion sort: the trivially correct model. */
static void brute_order(const EvictKey *keys, int n, int32_t *out) {
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && policy_key_cmp(&keys[out[j - 1]], &keys[i]) > 0) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = i;
    }
}

/* Order of all candidates under ctx, as candidate ids. */
static void order_ids(const PolicyCtx *ctx, const EvictCand *c, int n, uint64_t *ids) {
    EvictKey *keys = mn_calloc((size_t)n, sizeof *keys);
    int32_t *order = mn_calloc((size_t)n, sizeof *order);
    assert_non_null(keys);
    assert_non_null(order);
    policy_keys(ctx, c, n, keys);
    assert_int_equal(policy_select(keys, n, n, order), n);
    for (int i = 0; i < n; i++) ids[i] = c[order[i]].id;
    mn_free(keys);
    mn_free(order);
}

static void expect_ids(const PolicyCtx *ctx, const EvictCand *c, int n, const uint64_t *want) {
    uint64_t got[64];
    assert_true(n <= 64);
    order_ids(ctx, c, n, got);
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            policy_dump(ctx, c, NULL, n);
            fail_msg("position %d of the eviction order: id %llu, expected %llu", i, (unsigned long long)got[i],
                     (unsigned long long)want[i]);
        }
    }
}

static EvictCand cand(uint64_t id, uint64_t conv, int32_t pos, double last_access, double inserted, int32_t win) {
    return (EvictCand){id, conv, pos, win, last_access, inserted};
}

/* ---- names ---------------------------------------------------------------- */

static void test_names(void **state) {
    (void)state;
    const char *names[] = {"lru", "fifo", "pensieve", "lookahead", "pensieve+lookahead"};
    for (int i = 0; i < 5; i++) {
        EvictPolicy p = EVICT__COUNT;
        assert_int_equal(policy_parse(names[i], &p, NULL), MN_OK);
        assert_int_equal(p, i);
        assert_string_equal(policy_name(p), names[i]);
    }
    assert_int_equal(EVICT_DEFAULT, EVICT_PENSIEVE_LOOKAHEAD);
    assert_string_equal(policy_name(EVICT_DEFAULT), "pensieve+lookahead");
    const char *bad[] = {"", "LRU", "lru ", "pensieve+", "lookahead+pensieve", "random"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EvictPolicy p = EVICT_FIFO;
        MnErr err = {0};
        assert_int_equal(policy_parse(bad[i], &p, &err), MN_EINVAL);
        assert_int_equal(p, EVICT_FIFO); /* untouched */
        assert_non_null(strstr(err.msg, "pensieve+lookahead"));
    }
    MnErr err = {0};
    EvictPolicy p;
    assert_int_equal(policy_parse("bogus", &p, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "'bogus'"));
    assert_int_equal(policy_parse(NULL, &p, NULL), MN_EINVAL);
    assert_string_equal(policy_name(EVICT__COUNT), "?");
    assert_string_equal(policy_name((EvictPolicy)-1), "?");
    assert_true(policy_uses_window(EVICT_LOOKAHEAD) && policy_uses_window(EVICT_PENSIEVE_LOOKAHEAD));
    assert_false(policy_uses_window(EVICT_PENSIEVE) || policy_uses_window(EVICT_LRU));
    assert_true(policy_uses_cost(EVICT_PENSIEVE) && policy_uses_cost(EVICT_PENSIEVE_LOOKAHEAD));
    assert_false(policy_uses_cost(EVICT_LOOKAHEAD) || policy_uses_cost(EVICT_FIFO));
}

/* ---- lru and fifo --------------------------------------------------------- */

static void test_lru_fifo(void **state) {
    (void)state;
    /* Access and insertion times disagree so the two orders differ. */
    EvictCand c[] = {
        cand(1, 10, 0, 50.0, 1.0, -1), cand(2, 10, 32, 50.0, 2.0, -1), /* conv 10, accessed at 50 */
        cand(3, 20, 0, 20.0, 3.0, -1), cand(4, 20, 32, 20.0, 4.0, -1), /* conv 20, accessed at 20 */
        cand(5, 0, 0, 30.0, 0.5, 3),                                   /* no conversation; in window */
    };
    PolicyCtx lru = {EVICT_LRU, NULL, 100.0};
    expect_ids(&lru, c, 5, (const uint64_t[]){3, 4, 5, 1, 2}); /* the window means nothing to lru */
    PolicyCtx fifo = {EVICT_FIFO, NULL, 100.0};
    expect_ids(&fifo, c, 5, (const uint64_t[]){5, 1, 2, 3, 4});

    /* Ties within a conversation go to the leading block, whatever the
     * input order. */
    EvictCand d[] = {cand(7, 1, 96, 5.0, 9.0, -1), cand(8, 1, 0, 5.0, 9.0, -1), cand(9, 1, 64, 5.0, 9.0, -1),
                     cand(6, 1, 32, 5.0, 9.0, -1)};
    expect_ids(&lru, d, 4, (const uint64_t[]){8, 6, 9, 7});
    expect_ids(&fifo, d, 4, (const uint64_t[]){8, 6, 9, 7});
    /* Full ties fall to the id. */
    EvictCand e[] = {cand(42, 1, 0, 5.0, 9.0, -1), cand(41, 1, 0, 5.0, 9.0, -1)};
    expect_ids(&lru, e, 2, (const uint64_t[]){41, 42});
}

/* ---- pensieve ------------------------------------------------------------- */

static void test_pensieve_idle_leading_first(void **state) {
    (void)state;
    CostModel cm = synthetic_cost(1e-4, 1e-7);
    PolicyCtx ctx = {EVICT_PENSIEVE, &cm, 1000.0};
    /* Conversation A idle for 100 s, B for 1 s, C active now; four blocks
     * each, given in scrambled order. */
    EvictCand c[12];
    int n = 0;
    const double access[3] = {900.0, 999.0, 1000.0};
    for (int blk = 3; blk >= 0; blk--)
        for (int conv = 0; conv < 3; conv++)
            c[n++] = cand((uint64_t)(10 * (conv + 1) + blk), (uint64_t)conv + 1, 32 * blk, access[conv], 0, -1);
    expect_ids(&ctx, c, n, (const uint64_t[]){10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33});

    /* Retention values: leading < trailing within a conversation, and the
     * value is cost / idle. */
    EvictKey k0, k3;
    policy_key(&ctx, &c[9], &k0);  /* A, block 0 (pos 0) */
    policy_key(&ctx, &c[0], &k3);  /* A, block 3 (pos 96) */
    assert_int_equal(c[9].id, 10);
    assert_int_equal(c[0].id, 13);
    assert_true(k0.value < k3.value);
    assert_true(fabs(k0.value - cost_block(&cm, 0) / 100.0) < 1e-15);
    assert_true(fabs(k3.value - cost_block(&cm, 96) / 100.0) < 1e-15);
    assert_false(k0.is_exempt);

    /* An active conversation's retention is large but finite. */
    EvictKey ka;
    policy_key(&ctx, &c[11], &ka);
    assert_int_equal(c[11].id, 30);
    assert_true(isfinite(ka.value));
    assert_true(fabs(ka.value - cost_block(&cm, 0) / POLICY_MIN_IDLE_SEC) < 1e-9);
    /* A last access in the future (another clock) counts as active. */
    EvictCand fut = cand(99, 9, 0, 2000.0, 0, -1);
    EvictKey kf;
    policy_key(&ctx, &fut, &kf);
    assert_true(kf.value == ka.value);
}

/* With strong attention costs, a trailing block of a very idle conversation
 * can outlive a leading block of a less idle one: the order is exactly by
 * cost(pos) / idle. */
static void test_pensieve_tradeoff(void **state) {
    (void)state;
    CostModel cm = synthetic_cost(1e-6, 1e-6); /* attention dominates past ~1 token */
    PolicyCtx ctx = {EVICT_PENSIEVE, &cm, 100.0};
    EvictCand c[] = {
        cand(1, 1, 1024, 0.0, 0, -1), /* idle 100 s, deep */
        cand(2, 2, 0, 90.0, 0, -1),   /* idle 10 s, leading */
        cand(3, 1, 0, 0.0, 0, -1),    /* idle 100 s, leading */
    };
    /* values: 1: 32*(1e-6+1.024e-3)/100 = 3.28e-4; 2: 32e-6/10 = 3.2e-6; 3: 3.2e-7 */
    expect_ids(&ctx, c, 3, (const uint64_t[]){3, 2, 1});
    /* Without a cost model the cost grows with the position. */
    PolicyCtx flat = {EVICT_PENSIEVE, NULL, 100.0};
    expect_ids(&flat, c, 3, (const uint64_t[]){3, 2, 1});
    /* Plain pensieve ignores the window. */
    c[2].window_idx = 0;
    expect_ids(&ctx, c, 3, (const uint64_t[]){3, 2, 1});
}

/* ---- look-ahead ----------------------------------------------------------- */

static void test_lookahead(void **state) {
    (void)state;
    CostModel cm = synthetic_cost(1e-4, 1e-7);
    EvictCand c[] = {
        cand(1, 1, 0, 10.0, 0, 0),   cand(2, 1, 32, 10.0, 0, 0),  /* head of the window, very idle */
        cand(3, 2, 0, 50.0, 0, 2),   cand(4, 2, 32, 50.0, 0, 2),  /* tail of the window */
        cand(5, 3, 0, 40.0, 0, 1),                                /* middle */
        cand(6, 4, 32, 90.0, 0, -1), cand(7, 4, 0, 90.0, 0, -1), /* outside, recently used */
        cand(8, 5, 0, 60.0, 0, -1),                               /* outside */
    };
    const int n = 8;
    /* lookahead: everything outside by LRU, then the window tail first. */
    PolicyCtx la = {EVICT_LOOKAHEAD, NULL, 100.0};
    expect_ids(&la, c, n, (const uint64_t[]){8, 7, 6, 3, 4, 5, 1, 2});
    /* pensieve+lookahead: outside by retention (8 idle 40 s beats 4's
     * leading block idle 10 s), then the same window order. */
    PolicyCtx pl = {EVICT_PENSIEVE_LOOKAHEAD, &cm, 100.0};
    expect_ids(&pl, c, n, (const uint64_t[]){8, 7, 6, 3, 4, 5, 1, 2});
    /* Without the window rule, the idle head of the window would go first. */
    PolicyCtx lru = {EVICT_LRU, NULL, 100.0};
    expect_ids(&lru, c, n, (const uint64_t[]){1, 2, 5, 3, 4, 8, 7, 6});

    /* Exemption: the first three victims are outside; a caller that must
     * not touch the window stops at the first exempt key. */
    EvictKey keys[8];
    int32_t out[8];
    policy_keys(&pl, c, n, keys);
    assert_int_equal(policy_select(keys, n, 8, out), 8);
    int n_free = 0;
    while (n_free < n && !keys[out[n_free]].is_exempt) n_free++;
    assert_int_equal(n_free, 3);
    for (int i = 0; i < n; i++) assert_true(keys[i].is_exempt == (c[i].window_idx >= 0));

    /* Pensieve order among the non-exempt blocks matches plain pensieve. */
    PolicyCtx pv = {EVICT_PENSIEVE, &cm, 100.0};
    EvictCand outside[] = {c[5], c[6], c[7]};
    expect_ids(&pv, outside, 3, (const uint64_t[]){8, 7, 6});

    /* When only window blocks remain, the tail request goes first. */
    EvictCand inside[] = {c[0], c[2], c[4]};
    expect_ids(&pl, inside, 3, (const uint64_t[]){3, 5, 1});
    assert_int_equal(policy_victim(keys, n), 7); /* index of id 8 */
}

/* ---- selection ------------------------------------------------------------ */

static void test_select_matches_sort(void **state) {
    (void)state;
    CostModel cm = synthetic_cost(2e-5, 3e-8);
    uint64_t rng = 12345;
    enum { N = 700 };
    EvictCand *c = mn_calloc(N, sizeof *c);
    EvictKey *keys = mn_calloc(N, sizeof *keys);
    int32_t *want = mn_calloc(N, sizeof *want);
    assert_true(c && keys && want);
    for (int round = 0; round < 40; round++) {
        EvictPolicy pol = (EvictPolicy)(round % EVICT__COUNT);
        int n = round < 5 ? round : (int)(rng_splitmix64(&rng) % N) + 1;
        for (int i = 0; i < n; i++) {
            uint64_t conv = rng_splitmix64(&rng) % 20;
            /* coarse times and positions so ties happen often */
            c[i] = cand(rng_splitmix64(&rng) % 1000, conv, (int32_t)(rng_splitmix64(&rng) % 64) * 32,
                        (double)(conv * 7 % 13), (double)(rng_splitmix64(&rng) % 50),
                        rng_splitmix64(&rng) % 4 == 0 ? (int32_t)(conv % 5) : -1);
        }
        PolicyCtx ctx = {pol, pol == EVICT_PENSIEVE ? NULL : &cm, 20.0};
        policy_keys(&ctx, c, n, keys);
        brute_order(keys, n, want);
        int ks[] = {0, 1, 2, 3, n / 3, n - 1, n, n + 5};
        for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
            int k = ks[t];
            if (k < 0) continue;
            int32_t *buf = mn_calloc((size_t)(k > 0 ? k : 1), sizeof *buf);
            assert_non_null(buf);
            int m = policy_select(keys, n, k, buf);
            assert_int_equal(m, k < n ? k : n);
            for (int i = 0; i < m; i++) {
                /* equal keys are interchangeable; compare keys, not indices */
                if (policy_key_cmp(&keys[buf[i]], &keys[want[i]]) != 0) {
                    policy_dump(&ctx, c, keys, n);
                    fail_msg("round %d k %d: victim %d differs from the sorted order", round, k, i);
                }
            }
            mn_free(buf);
        }
        int v = policy_victim(keys, n);
        if (n == 0) assert_int_equal(v, -1);
        else assert_int_equal(policy_key_cmp(&keys[v], &keys[want[0]]), 0);
    }
    mn_free(c);
    mn_free(keys);
    mn_free(want);
}

static void test_key_total_order(void **state) {
    (void)state;
    /* NaN times never reach the comparison: they keep the block. */
    EvictCand c[] = {cand(1, 1, 0, NAN, NAN, -1), cand(2, 2, 0, 5.0, 5.0, -1)};
    for (int p = 0; p < EVICT__COUNT; p++) {
        PolicyCtx ctx = {(EvictPolicy)p, NULL, 10.0};
        EvictKey k[2];
        policy_keys(&ctx, c, 2, k);
        assert_false(isnan(k[0].value));
        assert_false(isnan(k[1].value));
        if (p != EVICT_PENSIEVE && p != EVICT_PENSIEVE_LOOKAHEAD) /* NaN idle counts as active there */
            assert_true(policy_key_cmp(&k[1], &k[0]) < 0);
        assert_true(policy_key_cmp(&k[0], &k[1]) == -policy_key_cmp(&k[1], &k[0]));
        assert_int_equal(policy_key_cmp(&k[0], &k[0]), 0);
    }
}

/* ---- sizing --------------------------------------------------------------- */

static void test_window_len(void **state) {
    (void)state;
    assert_int_equal(policy_window_len(100, 30, 10), 3);
    assert_int_equal(policy_window_len(90, 30, 10), 3);
    assert_int_equal(policy_window_len(89.9, 30, 10), 2);
    assert_int_equal(policy_window_len(100, 30, 2), 2);   /* only two waiting */
    assert_int_equal(policy_window_len(100, 0, 7), 7);    /* requests need no room */
    assert_int_equal(policy_window_len(0, 30, 7), 0);     /* no room */
    assert_int_equal(policy_window_len(-5, 30, 7), 0);
    assert_int_equal(policy_window_len(100, 30, 0), 0);
    assert_int_equal(policy_window_len(NAN, 30, 4), 0);
    assert_int_equal(policy_window_len(100, NAN, 4), 4);
    assert_int_equal(policy_window_len(1e300, 1e-300, 1000000), 1000000); /* no overflow */
}

static void test_writebehind_want(void **state) {
    (void)state;
    assert_int_equal(policy_writebehind_want(30, 0, 100, 0.25), 0);
    assert_int_equal(policy_writebehind_want(25, 0, 100, 0.25), 0);
    assert_int_equal(policy_writebehind_want(24, 0, 100, 0.25), 1);
    assert_int_equal(policy_writebehind_want(10, 5, 100, 0.25), 10);
    assert_int_equal(policy_writebehind_want(0, 0, 100, 0.25), 25);
    assert_int_equal(policy_writebehind_want(0, 0, 10, 0.25), 3); /* ceil */
    assert_int_equal(policy_writebehind_want(0, 0, 100, 0), 0);
    assert_int_equal(policy_writebehind_want(0, 0, 100, 2.0), 100);
    assert_int_equal(policy_writebehind_want(0, 0, 0, 0.25), 0);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_lru_fifo),
        cmocka_unit_test(test_pensieve_idle_leading_first),
        cmocka_unit_test(test_pensieve_tradeoff),
        cmocka_unit_test(test_lookahead),
        cmocka_unit_test(test_select_matches_sort),
        cmocka_unit_test(test_key_total_order),
        cmocka_unit_test(test_window_len),
        cmocka_unit_test(test_writebehind_want),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
