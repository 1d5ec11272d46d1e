/* test_tier.c — every kind of tier below the pool (RAM, disk over
 * io_uring, disk over the sync backend), through cache/tier.h: runs of a
 * real KvPool with random contents come back bit-exact, layer by layer,
 * into other slots and across runs; LRU and policy eviction under a small
 * budget; has / locate / drop / drop_run and re-put semantics; stats
 * counters. Expiry: tier_expire drops what was not used since a cutoff (a
 * layer-0 read counts as use), reported as TIER_DROP_EXPIRED;
 * tier_foreach_run lists the live blocks in LRU order. tier_measure_read
 * leaves nothing behind. A randomized test
 * runs each tier beside a trivially correct model (block id -> content,
 * held or not) and compares every result. Streamed reads are in
 * test_tier_read.c, the disk's failures in test_tier_faults.c, persistence
 * in test_tier_persist.c, data at rest in test_tier_dir.c.
 */
#include "test_tier_util.h"

/* ---- tiers: round trips ------------------------------------------------------ */

/* Geometries: 128-byte blocks (much padding on disk), 4096 (none), 576. */
typedef struct Geom {
    int n_layer, kv_dim, block_tokens;
    MnType type;
} Geom;
static const Geom GEOMS[] = {{3, 8, 4, MN_TYPE_F16}, {2, 64, 16, MN_TYPE_F16}, {4, 24, 3, MN_TYPE_F32}};

static void test_tier_roundtrip(void **state) {
    const Param *pa = *state;
    for (size_t g = 0; g < sizeof GEOMS / sizeof GEOMS[0]; g++) {
        const Geom *ge = &GEOMS[g];
        KvPool p;
        assert_int_equal(kvpool_init(&p, ge->n_layer, ge->kv_dim, ge->block_tokens, 48, ge->type), MN_OK);
        scramble_pool(&p, 11 + g);
        Fixture fx;
        fx_open(&fx, pa, &p, 1 << 20, 0, true);
        Tier *t = fx.tier;
        /* a run of 5 from scattered slots, one of 1, one of 7 */
        uint32_t ids[5] = {100, 101, 102, 103, 104};
        int32_t slots[5] = {7, 2, 30, 31, 0};
        assert_int_equal(put_ids(t, &p, ids, slots, 5), MN_OK);
        assert_int_equal(put_range(t, &p, 200, 1, 40), MN_OK);
        assert_int_equal(put_range(t, &p, 300, 7, 10), MN_OK);
        tier_check(t);
        scramble_pool(&p, 99); /* the pool's copy is gone */
        expect_range(t, &p, 100, 5, 20);
        expect_range(t, &p, 200, 1, 3);
        expect_range(t, &p, 300, 7, 41); /* wraps around the pool's end */

        TierStats s;
        tier_stats(t, &s);
        uint64_t want = run_bytes(pa, &p, 5) + run_bytes(pa, &p, 1) + run_bytes(pa, &p, 7);
        assert_string_equal(s.name, pa->kind == KIND_RAM ? "ram" : "disk");
        assert_int_equal(s.capacity_bytes, 1 << 20);
        assert_int_equal(s.occupancy_bytes, want);
        assert_int_equal(s.bytes_written, want);
        assert_int_equal(s.n_runs, 3);
        assert_int_equal(s.n_blocks, 13);
        assert_int_equal(s.n_puts, 3);
        assert_int_equal(s.n_layer_reads, 3 * ge->n_layer);
        /* whole runs were read: every byte once more */
        uint64_t want_read = pa->kind == KIND_RAM ? 13ull * p.block_bytes * (uint64_t)ge->n_layer : want;
        assert_int_equal(s.bytes_read, want_read);
        assert_true(s.write_seconds >= 0 && s.read_seconds >= 0);
        assert_int_equal(s.n_evicted_runs + s.n_checksum_failures + s.n_io_errors + s.n_puts_full, 0);
        assert_false(s.is_failed);
        fx_close(&fx);
        kvpool_deinit(&p);
    }
}

/* Layers one at a time, into different slots each time, out of order, and
 * across runs: blocks 3..9 when runs hold 0..5 and 6..12. */
static void test_tier_layers_and_spans(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 4, 8, 4, 40, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    assert_int_equal(put_range(t, &p, 0, 6, 0), MN_OK);
    assert_int_equal(put_range(t, &p, 6, 7, 6), MN_OK);
    scramble_pool(&p, 5);
    for (int l = 3; l >= 0; l--) {
        uint32_t ids[7];
        int32_t slots[7];
        for (int i = 0; i < 7; i++) {
            ids[i] = 3 + (uint32_t)i;
            slots[i] = 39 - 5 * l - i; /* different slots per layer */
        }
        assert_int_equal(read_ids(t, &p, ids, slots, 7, l), MN_OK);
        for (int i = 0; i < 7; i++) assert_true(slot_is(&p, l, slots[i], ids[i]));
        /* the other layers of those slots were not touched by this read */
        if (l < 3) assert_false(slot_is(&p, l + 1, slots[0], ids[0]));
    }
    /* any order, blocks interleaved from both runs */
    uint32_t ids[4] = {12, 0, 7, 5};
    int32_t slots[4] = {1, 2, 3, 4};
    assert_int_equal(read_ids(t, &p, ids, slots, 4, 2), MN_OK);
    for (int i = 0; i < 4; i++) assert_true(slot_is(&p, 2, slots[i], ids[i]));
    TierLoc loc;
    Hash128 h = h_of(8);
    assert_int_equal(tier_locate(t, &h, &loc), MN_OK);
    assert_int_equal(loc.index, 2);
    assert_int_equal(loc.n_blocks, 7);
    TierLoc loc0;
    h = h_of(0);
    assert_int_equal(tier_locate(t, &h, &loc0), MN_OK);
    assert_true(loc0.run_id != loc.run_id);
    /* refused requests */
    uint32_t missing[2] = {1, 77};
    assert_int_equal(read_ids(t, &p, missing, slots, 2, 0), MN_ENOTFOUND);
    assert_int_equal(read_ids(t, &p, ids, slots, 1, 4), MN_EINVAL);
    int32_t bad_slot[1] = {40};
    assert_int_equal(read_ids(t, &p, ids, bad_slot, 1, 0), MN_EINVAL);
    Hash128 hs[1] = {h_of(500)};
    assert_int_equal(tier_put_run(t, hs, 0, &p, slots, NULL), MN_EINVAL);
    KvPool other;
    assert_int_equal(kvpool_init(&other, 4, 16, 4, 8, MN_TYPE_F16), MN_OK);
    assert_int_equal(tier_put_run(t, hs, 1, &other, slots, NULL), MN_EINVAL);
    kvpool_deinit(&other);
    tier_check(t);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* ---- tiers: hidden states --------------------------------------------------------- */

/* Which of the read's blocks (the first n_hidden, in layers of mask) come
 * as hidden rows; checked as each layer arrives. */
typedef struct HiddenRead {
    const KvPool *p;
    const uint32_t *ids;
    const int32_t *slots;
    int n, n_hidden, n_calls;
    uint64_t mask;
} HiddenRead;

static void expect_hidden_read(const HiddenRead *r, int l) {
    for (int i = 0; i < r->n; i++) {
        bool is_hidden = i < r->n_hidden && (r->mask >> l & 1);
        assert_true(is_hidden ? hidden_is(r->p, l, r->slots[i], r->ids[i]) : slot_is(r->p, l, r->slots[i], r->ids[i]));
        assert_false(is_hidden ? slot_is(r->p, l, r->slots[i], r->ids[i]) : hidden_is(r->p, l, r->slots[i], r->ids[i]));
    }
}

static void on_hidden_layer(void *ctx, int layer) {
    HiddenRead *r = ctx;
    assert_int_equal(layer, r->n_calls++);
    expect_hidden_read(r, layer);
}

/* Runs whose layers are stored as K/V or as hidden states (smaller and
 * larger than K/V, in one run), mixed with all-KV runs: a read brings
 * each layer back where it was stored from — the hidden rows or the K/V
 * of the slots — bit for bit, and nothing else; tier_block_hidden tells
 * which; the occupancy counts each layer at its size. A tier without
 * hidden states stores the same run as K/V, and a pool without hidden
 * arenas cannot take a run with hidden layers. */
static void test_tier_hidden_layers(void **state) {
    const Param *pa = *state;
    static const size_t rows[] = {40, 400}; /* hidden block of 160 and 1600 bytes, KV of 256 */
    for (size_t g = 0; g < 2; g++) {
        KvPool p;
        assert_int_equal(kvpool_init(&p, 3, 16, 4, 40, MN_TYPE_F16), MN_OK);
        assert_int_equal(kvpool_init_hidden(&p, rows[g]), MN_OK);
        Fixture fx;
        fx_open(&fx, pa, &p, 1 << 20, 0, false);
        Tier *t = fx.tier;
        for (int32_t s = 0; s < 8; s++) {
            fill_slot(&p, s, 100 + (uint32_t)s);
            fill_hidden(&p, s, 100 + (uint32_t)s);
        }
        Hash128 hs[8];
        int32_t src[8];
        for (int i = 0; i < 8; i++) {
            hs[i] = h_of(100 + (uint32_t)i);
            src[i] = i;
        }
        TierRunInfo mixed = {.hidden = 0x5}, kv = {0};
        assert_int_equal(tier_put_run(t, hs, 5, &p, src, &mixed), MN_OK); /* 100..104: layers 0, 2 hidden */
        assert_int_equal(tier_put_run(t, hs + 5, 3, &p, src + 5, &kv), MN_OK); /* 105..107 */
        assert_int_equal(tier_block_hidden(t, &hs[2]), 0x5);
        assert_int_equal(tier_block_hidden(t, &hs[6]), 0);
        TierStats st;
        tier_stats(t, &st);
        uint64_t a = 5 * p.block_bytes, b = 5 * p.hidden_bytes, c = 3 * p.block_bytes;
        if (pa->kind == KIND_DISK) {
            a = (a + 4095) & ~(uint64_t)4095;
            b = (b + 4095) & ~(uint64_t)4095;
            c = (c + 4095) & ~(uint64_t)4095;
        }
        assert_int_equal(st.occupancy_bytes, a + 2 * b + 3 * c);
        assert_int_equal(st.kv_bytes, (5 * 1 + 3 * 3) * p.block_bytes); /* payload, no padding */
        assert_int_equal(st.hidden_bytes, 5 * 2 * p.hidden_bytes);
        /* read both runs into other slots: K/V and hidden rows scrambled first */
        scramble_pool(&p, 7);
        for (int l = 0; l < p.n_hidden_layers; l++) memset(p.hid_arenas[l], 0xee, (size_t)p.n_blocks * p.hidden_bytes);
        int32_t dst[8] = {30, 12, 25, 9, 18, 33, 21, 14};
        uint32_t ids[8];
        for (int i = 0; i < 8; i++) ids[i] = 100 + (uint32_t)i;
        HiddenRead r = {&p, ids, dst, 8, 5, 0, 0x5};
        assert_int_equal(tier_read_layers(t, hs, 8, &p, dst, on_hidden_layer, &r), MN_OK);
        assert_int_equal(r.n_calls, p.n_layer);
        for (int l = 0; l < p.n_layer; l++) expect_hidden_read(&r, l);
        /* one layer at a time too */
        assert_int_equal(read_ids(t, &p, ids, dst, 8, 2), MN_OK);
        assert_true(hidden_is(&p, 2, dst[4], ids[4]) && slot_is(&p, 2, dst[5], ids[5]));
        /* a pool without hidden arenas takes the KV run, not the mixed one */
        KvPool plain;
        assert_int_equal(kvpool_init(&plain, 3, 16, 4, 40, MN_TYPE_F16), MN_OK);
        assert_int_equal(read_ids(t, &plain, ids + 5, dst, 3, 0), MN_OK);
        assert_int_equal(read_ids(t, &plain, ids, dst, 1, 0), MN_EINVAL);
        assert_int_equal(tier_put_run(t, hs, 1, &plain, src, &mixed), MN_EINVAL);
        tier_check(t);
        fx_close(&fx);
        /* a tier without hidden states stores the run as K/V */
        fx_open(&fx, pa, &plain, 1 << 20, 0, false);
        for (int32_t s = 0; s < 5; s++) fill_slot(&plain, s, 100 + (uint32_t)s);
        assert_int_equal(tier_put_run(fx.tier, hs, 5, &plain, src, &mixed), MN_OK);
        assert_int_equal(tier_block_hidden(fx.tier, &hs[0]), 0);
        tier_stats(fx.tier, &st);
        assert_int_equal(st.kv_bytes, 5 * 3 * plain.block_bytes);
        assert_int_equal(st.hidden_bytes, 0);
        expect_range(fx.tier, &plain, 100, 5, 20);
        fx_close(&fx);
        kvpool_deinit(&plain);
        kvpool_deinit(&p);
    }
}

/* ---- tiers: eviction, drop ----------------------------------------------------- */

static void test_tier_lru(void **state) {
    const Param *pa = *state;
    KvPool p; /* 4096-byte blocks: a run takes the same room in RAM and on disk */
    assert_int_equal(kvpool_init(&p, 2, 128, 8, 32, MN_TYPE_F16), MN_OK);
    assert_int_equal(p.block_bytes, 4096);
    uint64_t rb = run_bytes(pa, &p, 4);
    Fixture fx;
    /* room for three runs of 4 (disk: two slabs, so room spans files) */
    fx_open(&fx, pa, &p, 3 * rb + rb / 2, 2 * rb, false);
    Tier *t = fx.tier;
    Drops drops = {0};
    tier_set_drop_fn(t, on_drop, &drops);
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);   /* A */
    assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);  /* B */
    assert_int_equal(put_range(t, &p, 20, 4, 8), MN_OK);  /* C */
    assert_int_equal(drops.n_calls, 0);
    expect_range(t, &p, 0, 4, 16);                        /* A is now the most recent */
    assert_int_equal(put_range(t, &p, 30, 4, 12), MN_OK); /* D evicts B */
    tier_check(t);
    assert_int_equal(drops.n_calls, 1);
    assert_int_equal(drops.n_blocks, 4);
    assert_int_equal(drops.last_why, TIER_DROP_EVICTED);
    for (uint32_t i = 0; i < 4; i++) {
        assert_true(dropped(&drops, 10 + i));
        Hash128 h = h_of(10 + i);
        assert_false(tier_has(t, &h));
        h = h_of(i);
        assert_true(tier_has(t, &h));
        h = h_of(20 + i);
        assert_true(tier_has(t, &h));
    }
    expect_range(t, &p, 0, 4, 16);
    expect_range(t, &p, 20, 4, 16);
    expect_range(t, &p, 30, 4, 16);
    /* LRU order is now A C D. A run of 8 needs two runs' room: A and C go.
     * On disk the room must also be contiguous within one slab — slab 0
     * (2 runs' room) holds D in its second half, slab 1 has 1.5 runs' room
     * — so D goes too. */
    drops.n_calls = drops.n_blocks = 0;
    assert_int_equal(put_range(t, &p, 40, 8, 0), MN_OK);
    tier_check(t);
    assert_true(dropped(&drops, 0));
    assert_true(dropped(&drops, 20));
    Hash128 h = h_of(20);
    assert_false(tier_has(t, &h));
    h = h_of(30);
    bool is_disk = pa->kind == KIND_DISK;
    assert_int_equal(tier_has(t, &h), !is_disk);
    if (!is_disk) expect_range(t, &p, 30, 4, 8);
    expect_range(t, &p, 40, 8, 8);
    /* bigger than the budget: refused, nothing evicted */
    drops.n_calls = drops.n_blocks = 0;
    assert_int_equal(put_range(t, &p, 100, 20, 0), MN_EFULL);
    assert_int_equal(drops.n_calls, 0);
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_puts_full, 1);
    assert_int_equal(s.n_evicted_runs, is_disk ? 4 : 3);
    assert_int_equal(s.n_evicted_blocks, is_disk ? 16 : 12);
    assert_int_equal(s.n_runs, is_disk ? 1 : 2);
    assert_int_equal(s.n_blocks, is_disk ? 8 : 12);
    assert_true(s.occupancy_bytes <= s.capacity_bytes);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* --evict below the pool: the tiers score whole runs by the policy
 * (pensieve: cheap leading runs first, whatever the recency), runs in the
 * look-ahead window go last and the window's tail first, and a cleared
 * window gives the plain order back. */
static void test_tier_policy(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 128, 8, 64, MN_TYPE_F16), MN_OK);
    uint64_t rb = run_bytes(pa, &p, 4);
    Fixture fx;
    fx_open(&fx, pa, &p, 3 * rb + rb / 2, 4 * rb, false); /* room for three runs of 4 */
    Tier *t = fx.tier;
    Drops d = {0};
    tier_set_drop_fn(t, on_drop, &d);
    tier_set_policy(t, EVICT_PENSIEVE, NULL); /* cost grows with the position */
    put_bac(t, &p);
    put_evicts(t, &p, &d, 300, 512, 0);                           /* D: A goes (lru would take B) */

    /* the window: C at its head, B behind it; D outside goes first, though
     * pensieve alone would pick C */
    tier_set_policy(t, EVICT_PENSIEVE_LOOKAHEAD, NULL);
    Hash128 wh[3] = {h_of(201), h_of(100), h_of(0)};
    int32_t wi[3] = {0, 1, 2};
    assert_int_equal(tier_set_window(t, wh, wi, 3), MN_OK);
    put_evicts(t, &p, &d, 400, 0, 300); /* E (pos 0, outside) */
    /* everything in the window (E too, behind C): its tail goes first, B */
    wh[1] = h_of(403);
    wh[2] = h_of(100);
    assert_int_equal(tier_set_window(t, wh, wi, 3), MN_OK);
    put_evicts(t, &p, &d, 500, 1024, 100); /* F */
    /* a plain lookahead keeps the window and orders the rest by recency */
    tier_set_policy(t, EVICT_LOOKAHEAD, NULL);
    assert_int_equal(tier_set_window(t, wh + 1, wi, 1), MN_OK); /* E only */
    put_evicts(t, &p, &d, 600, 2048, 200);                     /* G: C, the least recent outside */
    /* window cleared: pensieve again picks the cheapest, E */
    tier_set_policy(t, EVICT_PENSIEVE_LOOKAHEAD, NULL);
    assert_int_equal(tier_set_window(t, NULL, NULL, 0), MN_OK);
    put_evicts(t, &p, &d, 700, 4096, 400);
    /* fifo: the earliest put of what is left (F, G, H) goes, even after a read */
    tier_set_policy(t, EVICT_FIFO, NULL);
    expect_range(t, &p, 500, 4, 16);
    put_evicts(t, &p, &d, 800, 0, 500);
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_evicted_runs, 6);
    fx_close(&fx);
    kvpool_deinit(&p);
}

static void test_tier_has_drop(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    Drops drops = {0};
    tier_set_drop_fn(t, on_drop, &drops);
    assert_int_equal(put_range(t, &p, 0, 3, 0), MN_OK); /* run X: 0 1 2 */
    Hash128 h0 = h_of(0), h1 = h_of(1), h2 = h_of(2), h3 = h_of(3), h9 = h_of(9);
    assert_true(tier_has(t, &h0));
    assert_false(tier_has(t, &h9));
    TierLoc loc;
    assert_int_equal(tier_locate(t, &h9, &loc), MN_ENOTFOUND);
    assert_int_equal(tier_drop(t, &h9), MN_ENOTFOUND);
    assert_int_equal(tier_drop_run(t, &h9), MN_ENOTFOUND);

    /* dropping one block keeps the rest of the run */
    TierStats s;
    tier_stats(t, &s);
    uint64_t occ = s.occupancy_bytes;
    assert_int_equal(tier_drop(t, &h1), MN_OK);
    assert_false(tier_has(t, &h1));
    assert_int_equal(drops.n_calls, 0); /* the caller knows */
    uint32_t ids[2] = {0, 2};
    int32_t slots[2] = {20, 21};
    assert_int_equal(read_ids(t, &p, ids, slots, 2, 1), MN_OK);
    assert_true(slot_is(&p, 1, 20, 0) && slot_is(&p, 1, 21, 2));
    assert_int_equal(read_ids(t, &p, (uint32_t[]){1}, slots, 1, 0), MN_ENOTFOUND);
    tier_stats(t, &s);
    assert_int_equal(s.occupancy_bytes, occ);
    assert_int_equal(s.n_blocks, 2);

    /* re-put 2 3: block 2 moves to the new run Y; X keeps only 0 */
    assert_int_equal(put_range(t, &p, 2, 2, 4), MN_OK);
    assert_int_equal(tier_locate(t, &h2, &loc), MN_OK);
    assert_int_equal(loc.index, 0);
    assert_int_equal(loc.n_blocks, 2);
    tier_check(t);
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 2);
    /* dropping X's last live block frees X */
    assert_int_equal(tier_drop(t, &h0), MN_OK);
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 1);
    assert_int_equal(s.occupancy_bytes, run_bytes(pa, &p, 2));
    tier_check(t);
    /* a run entirely re-put is freed at once */
    assert_int_equal(put_range(t, &p, 2, 2, 8), MN_OK);
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 1);
    /* drop_run reports every live block of the run */
    assert_int_equal(tier_drop_run(t, &h3), MN_OK);
    assert_int_equal(drops.n_calls, 1);
    assert_int_equal(drops.n_blocks, 2);
    assert_int_equal(drops.last_why, TIER_DROP_CALLER);
    assert_false(tier_has(t, &h2));
    tier_stats(t, &s);
    assert_int_equal(s.n_runs + s.n_blocks + s.occupancy_bytes, 0);
    /* reset reports what is left and the tier goes on */
    assert_int_equal(put_range(t, &p, 50, 3, 0), MN_OK);
    assert_int_equal(tier_reset(t), MN_OK);
    assert_int_equal(drops.n_blocks, 5);
    Hash128 h50 = h_of(50);
    assert_false(tier_has(t, &h50));
    assert_int_equal(put_range(t, &p, 60, 3, 0), MN_OK);
    expect_range(t, &p, 60, 3, 10);
    tier_check(t);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* ---- expiry (every tier) -------------------------------------------------------- */

static void test_tier_expire(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    Drops drops = {0};
    tier_set_drop_fn(t, on_drop, &drops);
    assert_int_equal(put_range(t, &p, 0, 3, 0), MN_OK);  /* A */
    tick();
    double t1 = mn_wall_now();
    tick();
    assert_int_equal(put_range(t, &p, 10, 2, 3), MN_OK); /* B */
    assert_int_equal(put_range(t, &p, 20, 2, 5), MN_OK); /* C */
    Hash128 h = h_of(1);
    assert_int_equal(tier_drop(t, &h), MN_OK);           /* A keeps 0 and 2 live */
    assert_int_equal(tier_expire(t, t1), 2);             /* A only: its live blocks */
    assert_int_equal(drops.n_calls, 1);
    assert_int_equal(drops.last_why, TIER_DROP_EXPIRED);
    assert_true(dropped(&drops, 0) && dropped(&drops, 2) && !dropped(&drops, 1));
    h = h_of(0);
    assert_false(tier_has(t, &h));
    tick();
    double t2 = mn_wall_now();
    tick();
    /* a read of layer 0 makes B recent; a read of another layer does not (C) */
    uint32_t ids[2] = {10, 11};
    int32_t slots[2] = {20, 21};
    assert_int_equal(read_ids(t, &p, ids, slots, 2, 0), MN_OK);
    ids[0] = 20;
    ids[1] = 21;
    assert_int_equal(read_ids(t, &p, ids, slots, 2, 1), MN_OK);
    Listed l = {0};
    tier_foreach_run(t, on_run, &l); /* LRU first: any read makes a run the most recent */
    assert_int_equal(l.n_runs, 2);
    assert_int_equal(l.first[0], 10);
    assert_int_equal(l.first[1], 20);
    assert_int_equal(tier_expire(t, t2), 2);             /* C */
    h = h_of(20);
    assert_false(tier_has(t, &h));
    h = h_of(10);
    assert_true(tier_has(t, &h));
    assert_int_equal(tier_expire(t, t2), 0);
    assert_int_equal(tier_expire(t, mn_wall_now() + 1), 2); /* B */
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_runs + s.n_blocks + s.occupancy_bytes, 0);
    assert_int_equal(s.n_expired_runs, 3);
    assert_int_equal(s.n_expired_blocks, 6);
    assert_int_equal(drops.n_calls, 3);
    tier_check(t);
    l.n_runs = 0;
    tier_foreach_run(t, on_run, &l);
    assert_int_equal(l.n_runs, 0);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* ---- randomized, against a model --------------------------------------------- */

enum { MODEL_IDS = 160 };

static void test_tier_model(void **state) {
    const Param *pa = *state;
    KvPool p; /* 1 KiB blocks: a disk run of n blocks takes ceil(n/4) pages a layer */
    assert_int_equal(kvpool_init(&p, 3, 32, 8, 64, MN_TYPE_F16), MN_OK);
    assert_int_equal(p.block_bytes, 1024);
    /* a budget of 40 blocks for the RAM tier; on disk 30 pages a layer, in
     * slabs of 7 so runs of 1 to 3 pages fragment them */
    uint64_t cap = pa->kind == KIND_RAM ? 40 * 3 * p.block_bytes : 30 * 3 * 4096;
    Fixture fx;
    fx_open(&fx, pa, &p, cap, 7 * 3 * 4096, false);
    Tier *t = fx.tier;
    bool held[MODEL_IDS] = {0};
    Drops drops = {.held = held};
    tier_set_drop_fn(t, on_drop, &drops);
    uint64_t seed = 1234;
    int n_ok_reads = 0, n_full = 0;
    for (int step = 0; step < 3000; step++) {
        int op = (int)(rng_splitmix64(&seed) % 100);
        if (op < 40) { /* put a run of consecutive ids, overlapping others at times */
            int n = 1 + (int)(rng_splitmix64(&seed) % 10);
            uint32_t first = (uint32_t)(rng_splitmix64(&seed) % (MODEL_IDS - (uint64_t)n));
            int32_t slot0 = (int32_t)(rng_splitmix64(&seed) % (uint64_t)p.n_blocks);
            bool inject = pa->kind == KIND_DISK && rng_splitmix64(&seed) % 20 == 0;
            if (inject) aio_fault_set(tier_disk_aio(t), AIO_OP_WRITE, 0, 1, ENOSPC);
            int rc = put_range(t, &p, first, n, slot0);
            if (inject) aio_fault_set(tier_disk_aio(t), 0, 0, 0, 0);
            /* an injected ENOSPC refuses the put, unless a new slab file's
             * header write took it (older runs then make room instead) */
            if (inject && rc == MN_EFULL) {
                n_full++; /* old copies stay; evictions were reported */
            } else {
                assert_int_equal(rc, MN_OK);
                for (int i = 0; i < n; i++) held[first + (uint32_t)i] = true;
            }
        } else if (op < 80) { /* read some held blocks, one layer */
            uint32_t ids[12];
            int32_t slots[12];
            int n = 0, want = 1 + (int)(rng_splitmix64(&seed) % 12);
            for (int tries = 0; tries < 64 && n < want; tries++) {
                uint32_t id = (uint32_t)(rng_splitmix64(&seed) % MODEL_IDS);
                if (!held[id]) continue;
                ids[n] = id;
                slots[n] = (int32_t)((uint64_t)n * 5 + rng_splitmix64(&seed) % 5); /* distinct */
                n++;
            }
            if (n == 0) continue;
            int layer = (int)(rng_splitmix64(&seed) % (uint64_t)p.n_layer);
            int rc = read_ids(t, &p, ids, slots, n, layer);
            if (rc != MN_OK) {
                tier_dump(t);
                fail_msg("step %d: read of %d held blocks: %s", step, n, mn_strerror(rc));
            }
            for (int i = 0; i < n; i++) assert_true(slot_is(&p, layer, slots[i], ids[i]));
            n_ok_reads++;
        } else if (op < 90) { /* drop one block */
            uint32_t id = (uint32_t)(rng_splitmix64(&seed) % MODEL_IDS);
            Hash128 h = h_of(id);
            assert_int_equal(tier_drop(t, &h), held[id] ? MN_OK : MN_ENOTFOUND);
            held[id] = false;
        } else if (op < 97) { /* drop a run (reported through the callback) */
            uint32_t id = (uint32_t)(rng_splitmix64(&seed) % MODEL_IDS);
            Hash128 h = h_of(id);
            bool was = held[id];
            assert_int_equal(tier_drop_run(t, &h), was ? MN_OK : MN_ENOTFOUND);
            assert_false(held[id]);
        } else { /* a read of something not held is refused, nothing read */
            uint32_t id = (uint32_t)(rng_splitmix64(&seed) % MODEL_IDS);
            if (held[id]) continue;
            int32_t slot = 0;
            assert_int_equal(read_ids(t, &p, &id, &slot, 1, 0), MN_ENOTFOUND);
        }
        tier_check(t);
        TierStats s;
        tier_stats(t, &s);
        uint64_t n_held = 0;
        for (uint32_t id = 0; id < MODEL_IDS; id++) {
            Hash128 h = h_of(id);
            if (tier_has(t, &h) != held[id]) {
                tier_dump(t);
                fail_msg("step %d: id %u: tier has %d, model %d", step, id, !held[id], held[id]);
            }
            n_held += held[id];
        }
        assert_int_equal(s.n_blocks, n_held);
        assert_true(s.occupancy_bytes <= s.capacity_bytes);
        assert_false(s.is_failed);
    }
    TierStats s;
    tier_stats(t, &s);
    assert_true(s.n_evicted_runs > 50); /* the budget was small: eviction ran often */
    assert_true(n_ok_reads > 500);
    assert_int_equal(s.n_puts_full, (uint64_t)n_full);
    assert_int_equal(s.n_checksum_failures, 0);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* ---- measuring the read rate ------------------------------------------------ */

/* tier_measure_read moves a scratch run's bytes through the medium and
 * leaves the tier as it was: what it holds, its counters, its budget and
 * the pool's slots; with too little room it is MN_EFULL and evicts
 * nothing. */
static void test_tier_measure_read(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 64, 16, 16, MN_TYPE_F16), MN_OK);
    scramble_pool(&p, 5);
    Fixture fx;
    fx_open(&fx, pa, &p, 3 * run_bytes(pa, &p, 4), 0, true);
    Tier *t = fx.tier;
    assert_int_equal(put_range(t, &p, 100, 4, 0), MN_OK);
    TierStats before, after;
    tier_stats(t, &before);
    for (int32_t i = 8; i < 16; i++) fill_slot(&p, i, 500 + (uint32_t)i);
    int32_t slots[8] = {8, 9, 10, 11, 12, 13, 14, 15};
    TierReadRate r;
    assert_int_equal(tier_measure_read(t, &p, slots, 8, 42, &r), MN_OK);
    /* every byte of the run was read back: the RAM tier's payload, the disk's extents */
    uint64_t want = pa->kind == KIND_RAM ? 8ull * p.block_bytes * (uint64_t)p.n_layer : run_bytes(pa, &p, 8);
    assert_int_equal(r.bytes, want);
    assert_true(r.seconds > 0);
    for (int32_t i = 8; i < 16; i++)
        for (int l = 0; l < p.n_layer; l++) assert_true(slot_is(&p, l, i, 500 + (uint32_t)i));
    tier_stats(t, &after);
    assert_int_equal(after.n_runs, before.n_runs);
    assert_int_equal(after.n_blocks, 4);
    assert_int_equal(after.occupancy_bytes, before.occupancy_bytes);
    assert_int_equal(after.bytes_read, before.bytes_read);
    assert_int_equal(after.bytes_written, before.bytes_written);
    assert_int_equal(after.n_puts, before.n_puts);
    tier_check(t);
    /* the room it took is free again: another run of 8 fits beside the 4
     * held; beside 8 held it does not, and nothing is evicted for it */
    assert_int_equal(tier_measure_read(t, &p, slots, 8, 43, &r), MN_OK);
    assert_int_equal(put_range(t, &p, 200, 4, 4), MN_OK);
    assert_int_equal(tier_measure_read(t, &p, slots, 8, 44, &r), MN_EFULL);
    assert_int_equal(r.bytes, 0);
    tier_stats(t, &after);
    assert_int_equal(after.n_blocks, 8);
    assert_int_equal(after.n_evicted_runs, 0);
    assert_int_equal(tier_measure_read(t, &p, slots, 4, 45, &r), MN_OK); /* a smaller one fits */
    expect_range(t, &p, 100, 4, 0);
    expect_range(t, &p, 200, 4, 4);
    int32_t bad[1] = {16};
    assert_int_equal(tier_measure_read(t, &p, bad, 1, 46, &r), MN_EINVAL);
    fx_close(&fx);
    kvpool_deinit(&p);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        TIER_TESTS(test_tier_roundtrip),
        TIER_TESTS(test_tier_layers_and_spans),
        TIER_TESTS(test_tier_hidden_layers),
        TIER_TESTS(test_tier_lru),
        TIER_TESTS(test_tier_policy),
        TIER_TESTS(test_tier_has_drop),
        TIER_TESTS(test_tier_expire),
        TIER_TESTS(test_tier_model),
        TIER_TESTS(test_tier_measure_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
