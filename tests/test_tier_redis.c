/* test_tier_redis.c — the shared tier (cache/tier_redis.c) against a real
 * redis-server on a unix socket (test_redis_util.h), through cache/tier.h:
 * runs come back bit-exact, layer by layer, from one or several runs in one
 * pipelined read; a second tier — another instance — finds what the first
 * put by probing, and adopts only the part of a run its sequence names;
 * keys are named as tier_redis.c says (a run's keys share a hash tag) and
 * carry the TTL; a value the store let go is a miss (MN_ENOTFOUND, the
 * run dropped as TIER_DROP_MISSING, counted); a damaged value or pointer
 * is refused and deleted from the store, a value of another model refused
 * and kept; a write refused for memory is MN_EFULL and the tier goes on;
 * a store that dies (also in the middle of a read) puts the tier in its
 * error state, and a reset once it is back (empty) brings the tier back;
 * URLs are checked, a password works, and no message or log line names a
 * credential; reply-memory entries one tier shares reach another's memory;
 * a measurement of the read rate leaves no key behind.
 * Each case starts its own server and stops it.
 */
#include "test_redis_util.h"
#include "test_tier_util.h"

#include <fcntl.h>

#define FP_BYTE 0x3c

typedef struct RFix {
    RedisSrv srv;
    KvPool p;
    Tier *a, *b; /* two instances' tiers on the one store */
    Drops drops_a, drops_b;
} RFix;

static int rfix_setup(void **state) {
    RFix *f = calloc(1, sizeof *f);
    if (f == NULL) return -1;
    *state = f;
    return 0;
}

static int rfix_teardown(void **state) {
    RFix *f = *state;
    tier_free(f->a);
    tier_free(f->b);
    if (f->p.n_layer > 0) kvpool_deinit(&f->p);
    redis_srv_free(&f->srv);
    free(f);
    return 0;
}

/* A redis tier on url with the pool's geometry, storing layers as hidden
 * states of hidden_bytes a block (0: K/V only); fingerprint byte fp,
 * ttl_s, a read window of window bytes (0: default). */
static Tier *redis_tier_hidden(const KvPool *p, const char *url, size_t hidden_bytes, uint8_t fp, int ttl_s,
                               uint64_t window) {
    TierRedisConfig cfg = {.urls = &url,
                           .n_urls = 1,
                           .n_layer = p->n_layer,
                           .block_bytes = p->block_bytes,
                           .hidden_bytes = hidden_bytes,
                           .kv_format = 1 | (uint32_t)p->block_tokens << 8,
                           .ttl_s = ttl_s,
                           .timeout_ms = 5000,
                           .read_window_bytes = window};
    memset(cfg.model_fingerprint.b, fp, 16);
    Tier *t = NULL;
    MnErr err = {0};
    if (tier_redis_new(&cfg, &t, &err) != MN_OK) fail_msg("tier_redis_new: %s", err.msg);
    return t;
}

static Tier *redis_tier(const KvPool *p, const char *url, uint8_t fp, int ttl_s, uint64_t window) {
    return redis_tier_hidden(p, url, 0, fp, ttl_s, window);
}

/* The server, a pool of 4 layers x 4 KiB blocks and two tiers on it. */
static bool rfix_open(RFix *f, const char *const *extra, int ttl_s, uint64_t window) {
    if (!redis_srv_available()) {
        skip();
        return false;
    }
    redis_srv_start(&f->srv, extra);
    assert_int_equal(kvpool_init(&f->p, 4, 128, 8, 64, MN_TYPE_F16), MN_OK);
    assert_int_equal(f->p.block_bytes, 4096);
    scramble_pool(&f->p, 7);
    f->a = redis_tier(&f->p, f->srv.url, FP_BYTE, ttl_s, window);
    f->b = redis_tier(&f->p, f->srv.url, FP_BYTE, ttl_s, window);
    tier_set_drop_fn(f->a, on_drop, &f->drops_a);
    tier_set_drop_fn(f->b, on_drop, &f->drops_b);
    assert_false(tier_is_failed(f->a));
    assert_true(tier_is_retried(f->a));
    return true;
}

/* Probe t for the sequence of blocks ids[0..n) (every one looked up). */
static int probe_ids(Tier *t, const uint32_t *ids, int n) {
    Hash128 h[64];
    uint8_t want[64];
    for (int i = 0; i < n; i++) {
        h[i] = h_of(ids[i]);
        want[i] = 1;
    }
    return tier_redis_probe(t, h, want, n, 8, NULL);
}

static void probe_range(Tier *t, uint32_t first, int n, int want_adopted) {
    uint32_t ids[64];
    for (int i = 0; i < n; i++) ids[i] = first + (uint32_t)i;
    assert_int_equal(probe_ids(t, ids, n), want_adopted);
}

static bool has_id(const Tier *t, uint32_t id) {
    Hash128 h = h_of(id);
    return tier_has(t, &h);
}

/* Every layer of ids [first, first+n) through tier_read_layers into slots
 * from dst on, each layer checked as it is reported. */
static int read_range_layers(Tier *t, KvPool *p, uint32_t first, int n, int32_t dst) {
    uint32_t ids[64];
    int32_t slots[64];
    for (int i = 0; i < n; i++) {
        ids[i] = first + (uint32_t)i;
        slots[i] = dst + i;
    }
    scramble_pool(p, 1000 + first);
    LayerLog lg;
    int rc = read_all_layers(t, p, ids, slots, n, &lg);
    if (rc == MN_OK) assert_int_equal(lg.n_calls, p->n_layer);
    return rc;
}

/* ---- round trips ------------------------------------------------------------ */

/* Two runs put by A come back bit-exact through A, one layer at a time
 * and streamed (both runs in one pipelined read); the store holds one key
 * per layer extent under the run's hash tag plus a pointer per block. */
static void test_redis_roundtrip(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    assert_int_equal(put_range(f->a, &f->p, 0, 5, 0), MN_OK);
    assert_int_equal(put_range(f->a, &f->p, 5, 3, 5), MN_OK);
    tier_check(f->a);
    scramble_pool(&f->p, 99);
    expect_range(f->a, &f->p, 0, 5, 20);
    expect_range(f->a, &f->p, 5, 3, 40);
    assert_int_equal(read_range_layers(f->a, &f->p, 0, 8, 10), MN_OK);
    /* keys: 4 layer values per run, 8 pointers */
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 2 * 4 + 8);
    redisReply *keys = redis_srv_keys(&f->srv, "mnemo:kv1:3c3c3c3c3c3c3c3c:0000000000000000:{*}:*");
    assert_int_equal(keys->elements, 8);
    freeReplyObject(keys);
    keys = redis_srv_keys(&f->srv, "mnemo:blk1:3c3c3c3c3c3c3c3c:0000000000000000:*");
    assert_int_equal(keys->elements, 8);
    freeReplyObject(keys);
    TierStats s;
    tier_stats(f->a, &s);
    assert_string_equal(s.name, "redis");
    assert_int_equal(s.n_runs, 2);
    assert_int_equal(s.n_blocks, 8);
    assert_int_equal(s.n_puts, 2);
    /* bytes: 4 layer values (80 + 16n + n*4096 bytes) and n 64-byte pointers a run */
    uint64_t want = 4 * (80 + 16 * 5 + 5 * 4096ull) + 5 * 64 + 4 * (80 + 16 * 3 + 3 * 4096ull) + 3 * 64;
    assert_int_equal(s.bytes_written, want);
    assert_int_equal(s.occupancy_bytes, want);
    assert_true(s.bytes_read > 0);
    assert_int_equal(s.n_checksum_failures + s.n_missing_runs + s.n_io_errors, 0);
    char shown[200];
    snprintf(shown, sizeof shown, "%s?db=0", f->srv.url);
    assert_string_equal(tier_redis_url(f->a), shown);
}

/* B, another instance, knows nothing until it probes; then it adopts the
 * runs A put, as far as its sequence names them, and reads them
 * bit-exact. */
static void test_redis_probe_other_instance(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    assert_int_equal(put_range(f->a, &f->p, 0, 5, 0), MN_OK);  /* a turn: blocks 0..4 */
    assert_int_equal(put_range(f->a, &f->p, 5, 3, 5), MN_OK);  /* the next: 5..7 */
    assert_false(has_id(f->b, 0));
    /* a sequence of blocks 0..9: two runs found, 8 blocks held */
    probe_range(f->b, 0, 10, 2);
    for (uint32_t id = 0; id < 10; id++) assert_int_equal(has_id(f->b, id), id < 8);
    tier_check(f->b);
    assert_int_equal(read_range_layers(f->b, &f->p, 0, 8, 20), MN_OK);
    TierStats s;
    tier_stats(f->b, &s);
    assert_int_equal(s.n_adopted_runs, 2);
    assert_int_equal(s.n_puts, 0);
    tier_free(f->b);
    f->b = redis_tier(&f->p, f->srv.url, FP_BYTE, 0, 0);
    /* a sequence that names blocks 0..2 only: the first run's first three */
    probe_range(f->b, 0, 3, 1);
    for (uint32_t id = 0; id < 8; id++) assert_int_equal(has_id(f->b, id), id < 3);
    assert_int_equal(read_range_layers(f->b, &f->p, 0, 3, 30), MN_OK);
    /* looked up alone, block 3 sits at index 3 of its run: the sequence
     * has no room for blocks 0..2 before it, so nothing is adopted */
    uint32_t just3[1] = {3};
    assert_int_equal(probe_ids(f->b, just3, 1), 0);
    /* the longer sequence again: the run is adopted whole, the part held
     * before gives way */
    probe_range(f->b, 0, 5, 1);
    for (uint32_t id = 0; id < 5; id++) assert_true(has_id(f->b, id));
    tier_check(f->b);
    tier_stats(f->b, &s);
    assert_int_equal(s.n_runs, 1);
    assert_int_equal(read_range_layers(f->b, &f->p, 0, 5, 30), MN_OK);
}

/* Keys carry the TTL, and a use of the run renews it. */
static void test_redis_ttl(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 100, 0)) return;
    assert_int_equal(put_range(f->a, &f->p, 0, 2, 0), MN_OK);
    redisReply *keys = redis_srv_keys(&f->srv, "mnemo:*");
    assert_int_equal(keys->elements, 4 + 2);
    for (size_t i = 0; i < keys->elements; i++) {
        long long ttl = redis_srv_int(&f->srv, "TTL %s", keys->element[i]->str);
        assert_true(ttl > 0 && ttl <= 100);
        freeReplyObject(redis_srv_cmd(&f->srv, "EXPIRE %s 5", keys->element[i]->str));
    }
    /* a read of layer 0 is a use: every key of the run (its pointers too)
     * lives 100 s again; the renewals are in the store once the tier's
     * next exchange has read their replies */
    expect_range(f->a, &f->p, 0, 2, 10);
    probe_range(f->a, 50, 1, 0);
    for (size_t i = 0; i < keys->elements; i++) {
        long long ttl = redis_srv_int(&f->srv, "TTL %s", keys->element[i]->str);
        if (!(ttl > 5 && ttl <= 100)) fail_msg("%s: TTL %lld after a use", keys->element[i]->str, ttl);
    }
    freeReplyObject(keys);
}

/* tier_measure_read writes a scratch run and reads it back, then deletes
 * it from the store: no key of it stays (the DELs are in once the tier's
 * next exchange has read their replies), nothing is held or counted, and
 * B, another instance, finds nothing of it. */
static void test_redis_measure_read(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    int32_t slots[6] = {10, 11, 12, 13, 14, 15};
    TierReadRate r;
    assert_int_equal(tier_measure_read(f->a, &f->p, slots, 6, 7, &r), MN_OK);
    assert_int_equal(r.bytes, 4 * (80 + 16 * 6 + 6 * 4096ull)); /* four layer values, headers included */
    assert_true(r.seconds > 0);
    assert_int_equal(put_range(f->a, &f->p, 0, 2, 0), MN_OK); /* an exchange */
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 4 + 2);
    TierStats s;
    tier_stats(f->a, &s);
    assert_int_equal(s.n_runs, 1);
    assert_int_equal(s.n_puts, 1);
    assert_int_equal(s.bytes_read, 0);
    assert_int_equal(s.bytes_written, 4 * (80 + 16 * 2 + 2 * 4096ull) + 2 * 64);
    /* a store that is gone: MN_EIO, and the tier is off as after a failed put */
    redis_srv_kill(&f->srv);
    assert_int_equal(tier_measure_read(f->a, &f->p, slots, 6, 8, &r), MN_EIO);
    assert_true(tier_is_failed(f->a));
}

/* Values hold whole blocks of at most value_bytes (TIER_REDIS_VALUE_BYTES
 * by default): tier_max_run_blocks says how many, and a longer run is
 * refused (the mover cuts its saves to it). */
static void test_redis_value_bytes(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    assert_int_equal(tier_max_run_blocks(f->a), TIER_REDIS_VALUE_BYTES / 4096);
    const char *url = f->srv.url;
    TierRedisConfig cfg = {.urls = &url, .n_urls = 1, .n_layer = 4, .block_bytes = 4096,
                           .kv_format = 1 | 8u << 8, .value_bytes = 3 * 4096 + 100};
    Tier *t = NULL;
    MnErr err = {0};
    assert_int_equal(tier_redis_new(&cfg, &t, &err), MN_OK);
    assert_int_equal(tier_max_run_blocks(t), 3);
    assert_int_equal(put_range(t, &f->p, 0, 4, 0), MN_EINVAL);
    assert_int_equal(put_range(t, &f->p, 0, 3, 0), MN_OK);
    expect_range(t, &f->p, 0, 3, 20);
    tier_free(t);
    cfg.value_bytes = 100; /* less than a block: one a value */
    assert_int_equal(tier_redis_new(&cfg, &t, &err), MN_OK);
    assert_int_equal(tier_max_run_blocks(t), 1);
    tier_free(t);
}

/* ---- what the store lets go, damage, another model --------------------------- */

/* FLUSHALL (or Redis's own eviction): the read is a miss, the run is
 * dropped and counted; a probe finds nothing; a run missing one layer
 * value is not adopted. */
static void test_redis_missing(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    assert_int_equal(put_range(f->a, &f->p, 0, 4, 0), MN_OK);
    freeReplyObject(redis_srv_cmd(&f->srv, "FLUSHALL"));
    assert_int_equal(read_range_layers(f->a, &f->p, 0, 4, 10), MN_ENOTFOUND);
    assert_int_equal(f->drops_a.n_calls, 1);
    assert_int_equal(f->drops_a.n_blocks, 4);
    assert_int_equal(f->drops_a.last_why, TIER_DROP_MISSING);
    assert_false(has_id(f->a, 0));
    TierStats s;
    tier_stats(f->a, &s);
    assert_int_equal(s.n_missing_runs, 1);
    assert_int_equal(s.n_checksum_failures, 0);
    assert_false(s.is_failed);
    probe_range(f->b, 0, 4, 0);
    /* one layer value gone (the store evicted it): not adopted */
    assert_int_equal(put_range(f->a, &f->p, 0, 4, 0), MN_OK);
    redisReply *keys = redis_srv_keys(&f->srv, "mnemo:kv1:*:2");
    assert_int_equal(keys->elements, 1);
    freeReplyObject(redis_srv_cmd(&f->srv, "DEL %s", keys->element[0]->str));
    freeReplyObject(keys);
    probe_range(f->b, 0, 4, 0);
    assert_false(has_id(f->b, 0));
    /* the run read one layer at a time: the missing layer is the miss */
    uint32_t ids[4] = {0, 1, 2, 3};
    int32_t slots[4] = {10, 11, 12, 13};
    assert_int_equal(read_ids(f->a, &f->p, ids, slots, 4, 1), MN_OK);
    assert_int_equal(read_ids(f->a, &f->p, ids, slots, 4, 2), MN_ENOTFOUND);
    tier_stats(f->a, &s);
    assert_int_equal(s.n_missing_runs, 2);
    tier_check(f->a);
}

/* A damaged layer value fails its check: the read fails, the run is
 * dropped and counted, and the value is deleted from the store, so no
 * probe adopts the run again. A damaged pointer is skipped and deleted. */
static void test_redis_damaged(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    assert_int_equal(put_range(f->a, &f->p, 0, 4, 0), MN_OK);
    assert_int_equal(put_range(f->a, &f->p, 10, 2, 4), MN_OK);
    /* a byte in the middle of the blocks of every layer value of run 0..3 */
    redisReply *keys = redis_srv_keys(&f->srv, "mnemo:kv1:*");
    int n_damaged = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        long long len = redis_srv_int(&f->srv, "STRLEN %s", keys->element[i]->str);
        if (len < 4 * 4096) continue; /* the 2-block run */
        freeReplyObject(redis_srv_cmd(&f->srv, "SETRANGE %s 5000 %b", keys->element[i]->str, "\x77", (size_t)1));
        n_damaged++;
    }
    freeReplyObject(keys);
    assert_int_equal(n_damaged, 4);
    probe_range(f->b, 0, 4, 1); /* the pointers and the keys are all there */
    assert_int_equal(read_range_layers(f->b, &f->p, 0, 4, 10), MN_ECHECKSUM);
    assert_int_equal(f->drops_b.last_why, TIER_DROP_CHECKSUM);
    assert_false(has_id(f->b, 0));
    TierStats s;
    tier_stats(f->b, &s);
    assert_int_equal(s.n_checksum_failures, 1);
    assert_false(s.is_failed);
    /* layer 0's value was deleted (in the store once B's next exchange read
     * the DEL's reply): a probe no longer adopts the run */
    probe_range(f->b, 0, 4, 0);
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 4 + 4 + (4 + 2) - 1);
    /* A still believes in it: its read meets the hole, a miss */
    assert_int_equal(read_range_layers(f->a, &f->p, 0, 4, 10), MN_ENOTFOUND);
    /* the other run is intact */
    probe_range(f->b, 10, 2, 1);
    assert_int_equal(read_range_layers(f->b, &f->p, 10, 2, 20), MN_OK);
    /* a damaged pointer: skipped, deleted */
    assert_int_equal(redis_srv_damage(&f->srv, "mnemo:blk1:*", 10), 6);
    probe_range(f->b, 10, 2, 0);
    probe_range(f->b, 10, 2, 0); /* (the second exchange reads the DELs' replies) */
    redisReply *ptrs = redis_srv_keys(&f->srv, "mnemo:blk1:*");
    assert_true(ptrs->elements <= 4); /* the two looked up are gone */
    freeReplyObject(ptrs);
    tier_check(f->b);
}

/* A tier of another model (fingerprint) does not even see the first
 * model's keys, which carry the fingerprint. Moved under its keys (as a
 * bug or a hand edit might), the pointers lead it to the values, whose
 * headers name the other model: refused, and kept (they are intact). */
static void test_redis_other_model(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    assert_int_equal(put_range(f->a, &f->p, 0, 3, 0), MN_OK);
    Tier *c = redis_tier(&f->p, f->srv.url, FP_BYTE + 1, 0, 0);
    probe_range(c, 0, 3, 0);
    redisReply *keys = redis_srv_keys(&f->srv, "mnemo:*");
    assert_int_equal(keys->elements, 3 + 4);
    for (size_t i = 0; i < keys->elements; i++) {
        char moved[256];
        snprintf(moved, sizeof moved, "%s", keys->element[i]->str);
        char *fp = strstr(moved, "3c3c3c3c3c3c3c3c");
        assert_non_null(fp);
        memcpy(fp, "3d3d3d3d3d3d3d3d", 16);
        freeReplyObject(redis_srv_cmd(&f->srv, "RENAME %s %s", keys->element[i]->str, moved));
    }
    freeReplyObject(keys);
    probe_range(c, 0, 3, 1);
    assert_int_equal(read_range_layers(c, &f->p, 0, 3, 10), MN_ECHECKSUM);
    TierStats s;
    tier_stats(c, &s);
    assert_int_equal(s.n_checksum_failures, 1);
    probe_range(c, 50, 1, 0); /* an exchange after the read */
    tier_free(c);
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 3 + 4);
}

/* With maxmemory reached under noeviction, a put is refused as full (the
 * store said OOM) and the tier keeps working. */
static void test_redis_full(void **state) {
    RFix *f = *state;
    static const char *const extra[] = {"--maxmemory", "3mb", "--maxmemory-policy", "noeviction", NULL};
    if (!rfix_open(f, extra, 0, 0)) return;
    int rc = MN_OK, n_ok = 0;
    for (uint32_t first = 0; first < 64 * 32 && rc == MN_OK; first += 32) {
        rc = put_range(f->a, &f->p, first, 32, 0); /* 512 KiB a run */
        n_ok += rc == MN_OK;
    }
    assert_int_equal(rc, MN_EFULL);
    assert_true(n_ok >= 1);
    TierStats s;
    tier_stats(f->a, &s);
    assert_int_equal(s.n_puts_full, 1);
    assert_false(s.is_failed);
    expect_range(f->a, &f->p, 0, 32, 0);
}

/* ---- the shared reply memory -------------------------------------------------------- */

/* A reply-memory entry A shares comes into B's memory when B looks its
 * text up (an unknown text finds nothing), under its own prefix key; the
 * key is the namespace's and the model's; a damaged entry is skipped. */
static void test_redis_shared_replies(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    Hash128 ns = h_of(77), other_ns = h_of(78), key = h_of(1234);
    const char *text = "Once upon a time", *texts[2] = {"Once upon a time", "never said"};
    size_t lens[2] = {strlen(texts[0]), strlen(texts[1])};
    int32_t ids[3] = {5, 6, 7};
    assert_int_equal(tier_redis_put_reply(f->a, &ns, &key, text, strlen(text), ids, 3), MN_OK);
    probe_range(f->a, 50, 1, 0); /* A's next exchange: its SET is done */
    ReplyMemory *rm = replymem_new(16);
    assert_non_null(rm);
    assert_int_equal(tier_redis_get_replies(f->b, &other_ns, texts, lens, 2, rm), 0);
    assert_int_equal(tier_redis_get_replies(f->b, &ns, texts, lens, 2, rm), 1);
    assert_int_equal(replymem_count(rm), 1);
    TokIds got = {0};
    assert_int_equal(replymem_get(rm, &key, text, strlen(text), &got), 1);
    assert_int_equal(got.n, 3);
    assert_memory_equal(got.ids, ids, sizeof ids);
    tok_ids_free(&got);
    replymem_free(rm);
    /* damaged: skipped */
    assert_int_equal(redis_srv_damage(&f->srv, "mnemo:reply1:*", 12), 1);
    rm = replymem_new(16);
    assert_int_equal(tier_redis_get_replies(f->b, &ns, texts, lens, 2, rm), 0);
    assert_int_equal(replymem_count(rm), 0);
    replymem_free(rm);
}

/* ---- a store that dies ---------------------------------------------------------- */

/* Redis killed: the next call fails with MN_EIO and the tier is off
 * (every call refused); a reset while it is down fails; once it is back
 * (empty), a reset brings the tier back, counted, with nothing held. */
static void test_redis_down_and_back(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 0)) return;
    assert_int_equal(put_range(f->a, &f->p, 0, 4, 0), MN_OK);
    redis_srv_kill(&f->srv);
    assert_int_equal(read_range_layers(f->a, &f->p, 0, 4, 10), MN_EIO);
    assert_true(tier_is_failed(f->a));
    assert_int_equal(put_range(f->a, &f->p, 20, 2, 0), MN_EIO);
    probe_range(f->a, 40, 2, -MN_EIO);
    assert_int_equal(tier_reset(f->a), MN_EIO);
    assert_true(tier_is_failed(f->a));
    redis_srv_start(&f->srv, NULL);
    f->drops_a = (Drops){0};
    assert_int_equal(tier_reset(f->a), MN_OK);
    assert_false(tier_is_failed(f->a));
    TierStats s;
    tier_stats(f->a, &s);
    assert_int_equal(s.n_resets, 1);
    assert_int_equal(s.n_io_errors, 1);
    assert_int_equal(s.n_blocks, 0);
    assert_int_equal(put_range(f->a, &f->p, 0, 4, 0), MN_OK);
    expect_range(f->a, &f->p, 0, 4, 10);
    /* B failed at its first call too, and comes back the same way */
    probe_range(f->b, 0, 4, -MN_EIO);
    assert_int_equal(tier_reset(f->b), MN_OK);
    probe_range(f->b, 0, 4, 1);
}

typedef struct KillAt {
    RedisSrv *srv;
    int layer, n_calls;
} KillAt;

static void kill_at_layer(void *ctx, int layer) {
    KillAt *k = ctx;
    k->n_calls++;
    if (layer == k->layer) redis_srv_kill(k->srv);
}

/* Killed in the middle of a streamed read, a layer at a time asked for:
 * the read reports the layers it placed, then fails with MN_EIO. */
static void test_redis_killed_mid_read(void **state) {
    RFix *f = *state;
    if (!rfix_open(f, NULL, 0, 1)) return;
    assert_int_equal(put_range(f->a, &f->p, 0, 4, 0), MN_OK);
    Hash128 h[4];
    int32_t slots[4];
    for (int i = 0; i < 4; i++) {
        h[i] = h_of((uint32_t)i);
        slots[i] = 10 + i;
    }
    KillAt k = {&f->srv, 1, 0};
    assert_int_equal(tier_read_layers(f->a, h, 4, &f->p, slots, kill_at_layer, &k), MN_EIO);
    assert_int_equal(k.n_calls, 2);
    assert_true(tier_is_failed(f->a));
}

/* ---- URLs and credentials -------------------------------------------------------- */

static void expect_url_refused(const KvPool *p, const char *url, int want, const char *secret) {
    TierRedisConfig cfg = {.urls = &url, .n_urls = 1, .n_layer = p->n_layer, .block_bytes = p->block_bytes};
    Tier *t = NULL;
    MnErr err = {0};
    int rc = tier_redis_new(&cfg, &t, &err);
    if (rc != want) fail_msg("'%s': %s, not %s (%s)", url, mn_strerror(rc), mn_strerror(want), err.msg);
    assert_null(t);
    assert_true(strlen(err.msg) > 0);
    if (secret && strstr(err.msg, secret)) fail_msg("the message for '%s' names the secret: %s", url, err.msg);
}

typedef struct AuthCase {
    RFix *f;
    const char *url;
    Tier *t;
} AuthCase;

static void open_auth(void *ctx) {
    AuthCase *ac = ctx;
    ac->t = redis_tier(&ac->f->p, ac->url, FP_BYTE, 0, 0);
    if (!tier_is_failed(ac->t)) assert_int_equal(put_range(ac->t, &ac->f->p, 0, 1, 0), MN_OK);
    tier_reset(ac->t);
}

/* Malformed URLs are refused with a message; a server with a password
 * takes the right one (user and password, or the password alone) and
 * refuses a wrong one (the tier starts failed); neither the messages nor
 * the log name the password. */
static void test_redis_urls_and_auth(void **state) {
    RFix *f = *state;
    static const char *const extra[] = {"--requirepass", "s3cr%t:pw", NULL};
    if (!rfix_open(f, NULL, 0, 0)) return;
    expect_url_refused(&f->p, "http://localhost", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "redis://", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "redis://host:0", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "redis://host:70000", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "redis://host:x", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "redis://host/db1", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "redis://[::1", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "unix://relative.sock", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "unix:///tmp/x.sock?password=1", MN_EINVAL, NULL);
    expect_url_refused(&f->p, "redis://u:p%zzhunter2@host", MN_EINVAL, "hunter2");
    expect_url_refused(&f->p, "rediss://u:hunter2@host:6380", MN_EUNSUPPORTED, "hunter2");
    /* a server with a password (the same socket, started again) */
    tier_free(f->a);
    tier_free(f->b);
    f->a = f->b = NULL;
    redis_srv_kill(&f->srv);
    redis_srv_start(&f->srv, extra);
    char url[256];
    AuthCase ac = {f, url, NULL};
    snprintf(url, sizeof url, "unix://default:s3cr%%25t%%3Apw@%s", f->srv.sock);
    char *log = redis_capture_stderr(open_auth, &ac);
    assert_false(tier_is_failed(ac.t));
    assert_null(strstr(tier_redis_url(ac.t), "s3cr"));
    assert_non_null(strstr(tier_redis_url(ac.t), "***@"));
    tier_free(ac.t);
    assert_null(strstr(log, "s3cr"));
    free(log);
    snprintf(url, sizeof url, "unix://s3cr%%25t%%3Apw@%s?db=2", f->srv.sock); /* the password alone */
    log = redis_capture_stderr(open_auth, &ac);
    assert_false(tier_is_failed(ac.t));
    tier_free(ac.t);
    free(log);
    snprintf(url, sizeof url, "unix://default:hunter2@%s", f->srv.sock);
    log = redis_capture_stderr(open_auth, &ac);
    assert_true(tier_is_failed(ac.t));
    tier_free(ac.t);
    if (strstr(log, "hunter2")) fail_msg("the log names the password:\n%s", log);
    assert_non_null(strstr(log, "redis tier"));
    free(log);
}

/* ---- hidden states ---------------------------------------------------------- */

/* The server and a pool of n_layer layers (16-wide K/V in f16, blocks of
 * 4 tokens, 32 of them) with hidden rows of row_bytes a token; no tiers
 * yet. False (the case skipped) without a redis-server. */
static bool hfix_open(RFix *f, int n_layer, size_t row_bytes) {
    if (!redis_srv_available()) {
        skip();
        return false;
    }
    redis_srv_start(&f->srv, NULL);
    assert_int_equal(kvpool_init(&f->p, n_layer, 16, 4, 32, MN_TYPE_F16), MN_OK);
    assert_int_equal(kvpool_init_hidden(&f->p, row_bytes), MN_OK);
    return true;
}

/* Read every layer of blocks ids[0..n) of t into slots (K/V scrambled,
 * hidden rows 0xee first) and check each layer where it belongs: the
 * hidden rows for the layers in `hidden`, the K/V for the others. */
static void expect_read_as(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n, uint64_t hidden) {
    scramble_pool(p, 77);
    for (int l = 0; l < p->n_hidden_layers; l++) memset(p->hid_arenas[l], 0xee, (size_t)p->n_blocks * p->hidden_bytes);
    Hash128 h[8];
    for (int i = 0; i < n; i++) h[i] = h_of(ids[i]);
    assert_int_equal(tier_read_layers(t, h, n, p, slots, NULL, NULL), MN_OK);
    for (int l = 0; l < p->n_layer; l++)
        for (int i = 0; i < n; i++) {
            assert_true(kvpool_layer_in(hidden, l) ? hidden_is(p, l, slots[i], ids[i]) : slot_is(p, l, slots[i], ids[i]));
        }
}

/* A run with layers stored as hidden states, of a model deeper than a
 * layer set (70 layers: 63 may be hidden, 64..69 are K/V): A puts blocks
 * 100..104 with layers 0, 2 and 63 as hidden rows (160 bytes a block,
 * K/V 256): a version 2 pointer of 72 bytes a block, each layer's value
 * at its representation's size, the stored bytes counted by
 * representation. B, another instance keeping hidden states, finds the
 * run by its probe with its layer plan and reads every layer back where
 * it was stored from, bit for bit. C, which keeps no hidden states, does
 * not adopt it (a miss). C's own K/V run of the same blocks gets keys of
 * its own (its tag has no plan): a new instance then finds that one,
 * and A still reads its run whole. */
static void test_redis_hidden_layers(void **state) {
    RFix *f = *state;
    if (!hfix_open(f, 70, 40)) return;
    KvPool *p = &f->p;
    assert_int_equal(p->n_hidden_layers, 64);
    assert_int_equal(p->block_bytes, 256);
    assert_int_equal(p->hidden_bytes, 160);
    uint32_t ids[5];
    int32_t src[5], dst[5];
    Hash128 hs[5];
    for (int i = 0; i < 5; i++) {
        ids[i] = 100 + (uint32_t)i;
        src[i] = i;
        dst[i] = 10 + i;
        hs[i] = h_of(ids[i]);
        fill_slot(p, src[i], ids[i]);
        fill_hidden(p, src[i], ids[i]);
    }
    const uint64_t mask = 0x5 | 1ull << 63;
    f->a = redis_tier_hidden(p, f->srv.url, p->hidden_bytes, FP_BYTE, 0, 0);
    TierRunInfo info = {.hidden = mask};
    assert_int_equal(tier_put_run(f->a, hs, 5, p, src, &info), MN_OK);
    assert_int_equal(tier_block_hidden(f->a, &hs[0]), mask);
    TierStats s;
    tier_stats(f->a, &s);
    assert_int_equal(s.hidden_bytes, 5 * 3 * 160);
    assert_int_equal(s.kv_bytes, 5 * 67 * 256);
    /* 70 layer values and 5 pointers */
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 70 + 5);
    redisReply *keys = redis_srv_keys(&f->srv, "mnemo:blk1:*");
    assert_int_equal(keys->elements, 5);
    for (size_t k = 0; k < keys->elements; k++)
        assert_int_equal(redis_srv_int(&f->srv, "STRLEN %s", keys->element[k]->str), 72);
    freeReplyObject(keys);
    keys = redis_srv_keys(&f->srv, "mnemo:kv1:*");
    uint64_t sum = 0;
    for (size_t k = 0; k < keys->elements; k++) sum += (uint64_t)redis_srv_int(&f->srv, "STRLEN %s", keys->element[k]->str);
    freeReplyObject(keys);
    assert_int_equal(sum, 70 * (80 + 16 * 5) + 5 * (3 * 160 + 67 * 256));
    assert_int_equal(s.occupancy_bytes, sum + 5 * 72); /* the values and the pointers */
    expect_read_as(f->a, p, ids, dst, 5, mask);
    /* B finds it, with its plan */
    f->b = redis_tier_hidden(p, f->srv.url, p->hidden_bytes, FP_BYTE, 0, 0);
    assert_int_equal(probe_ids(f->b, ids, 5), 1);
    assert_int_equal(tier_block_hidden(f->b, &hs[4]), mask);
    tier_stats(f->b, &s);
    assert_int_equal(s.hidden_bytes, 5 * 3 * 160);
    expect_read_as(f->b, p, ids, dst, 5, mask);
    tier_check(f->b);
    /* C keeps no hidden states: a miss */
    Tier *c = redis_tier(p, f->srv.url, FP_BYTE, 0, 0);
    assert_int_equal(probe_ids(c, ids, 5), 0);
    assert_false(tier_has(c, &hs[0]));
    /* C's K/V run of the same blocks: keys of its own */
    for (int i = 0; i < 5; i++) fill_slot(p, src[i], ids[i]); /* (the reads scrambled the pool) */
    assert_int_equal(tier_put_run(c, hs, 5, p, src, NULL), MN_OK);
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 2 * 70 + 5);
    tier_free(f->b);
    f->b = redis_tier_hidden(p, f->srv.url, p->hidden_bytes, FP_BYTE, 0, 0);
    assert_int_equal(probe_ids(f->b, ids, 5), 1);
    assert_int_equal(tier_block_hidden(f->b, &hs[0]), 0);
    expect_read_as(f->b, p, ids, dst, 5, 0);
    expect_read_as(f->a, p, ids, dst, 5, mask);
    tier_stats(f->a, &s);
    assert_int_equal(s.n_checksum_failures + s.n_missing_runs + s.n_io_errors, 0);
    tier_free(c);
}

/* Rewrite the value of key through edit (at offset, 8 bytes little-endian
 * or 4 when is_u32) and stamp its checksum again, as a bug or a hostile
 * writer could: intact to every check but the fields'. */
static void value_restamp(const RedisSrv *srv, const char *key, size_t offset, uint64_t v, bool is_u32) {
    redisReply *rep = redis_srv_cmd(srv, "GET %s", key);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    size_t len = rep->len;
    uint8_t *b = malloc(len);
    assert_non_null(b);
    memcpy(b, rep->str, len);
    freeReplyObject(rep);
    for (int i = 0; i < (is_u32 ? 4 : 8); i++) b[offset + (size_t)i] = (uint8_t)(v >> (8 * i));
    uint64_t sum = XXH3_64bits_withSeed(b, len - 8, 0);
    for (int i = 0; i < 8; i++) b[len - 8 + (size_t)i] = (uint8_t)(sum >> (8 * i));
    freeReplyObject(redis_srv_cmd(srv, "SET %s %b", key, b, len));
    free(b);
}

/* Stored runs with hidden layers whose checksums hold but whose fields do
 * not fit are never used, and not deleted (intact: not damage). A puts
 * blocks 100..102 with layers 0 and 2 as hidden rows (160 bytes a block,
 * K/V 256). Pointers re-stamped with a mask that also names layer 10 (the
 * model has 4) are not adopted by B. With the pointers right again, layer
 * 0's value re-stamped as K/V (representation 0, its length still a
 * hidden layer's): B adopts the run (the values exist) but its read
 * refuses the layer (MN_ECHECKSUM) rather than take it for hidden rows.
 * With that value right again and the pointers naming layer 0 only, B's
 * read meets layer 2's value at a hidden layer's length where it expects
 * K/V: refused too. Every value stays. */
static void test_redis_hidden_forged(void **state) {
    RFix *f = *state;
    if (!hfix_open(f, 4, 40)) return;
    KvPool *p = &f->p;
    uint32_t ids[3] = {100, 101, 102};
    int32_t src[3] = {0, 1, 2}, dst[3] = {10, 11, 12};
    Hash128 hs[3];
    for (int i = 0; i < 3; i++) {
        hs[i] = h_of(ids[i]);
        fill_slot(p, src[i], ids[i]);
        fill_hidden(p, src[i], ids[i]);
    }
    f->a = redis_tier_hidden(p, f->srv.url, p->hidden_bytes, FP_BYTE, 0, 0);
    TierRunInfo info = {.hidden = 0x5};
    assert_int_equal(tier_put_run(f->a, hs, 3, p, src, &info), MN_OK);
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 4 + 3);
    /* pointers naming a layer the model does not have */
    redisReply *ptrs = redis_srv_keys(&f->srv, "mnemo:blk1:*");
    assert_int_equal(ptrs->elements, 3);
    for (size_t k = 0; k < ptrs->elements; k++) value_restamp(&f->srv, ptrs->element[k]->str, 56, 0x5 | 1ull << 10, false);
    f->b = redis_tier_hidden(p, f->srv.url, p->hidden_bytes, FP_BYTE, 0, 0);
    assert_int_equal(probe_ids(f->b, ids, 3), 0);
    assert_false(tier_has(f->b, &hs[0]));
    for (size_t k = 0; k < ptrs->elements; k++) value_restamp(&f->srv, ptrs->element[k]->str, 56, 0x5, false);
    freeReplyObject(ptrs);
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 4 + 3);
    /* a hidden layer's value claiming K/V */
    redisReply *l0 = redis_srv_keys(&f->srv, "mnemo:kv1:*:0");
    assert_int_equal(l0->elements, 1);
    value_restamp(&f->srv, l0->element[0]->str, 36, 0, true);
    assert_int_equal(probe_ids(f->b, ids, 3), 1);
    assert_int_equal(tier_block_hidden(f->b, &hs[0]), 0x5);
    scramble_pool(p, 5);
    assert_int_equal(tier_read_layers(f->b, hs, 3, p, dst, NULL, NULL), MN_ECHECKSUM);
    assert_false(tier_has(f->b, &hs[0]));
    TierStats s;
    tier_stats(f->b, &s);
    assert_int_equal(s.n_checksum_failures, 1);
    assert_false(s.is_failed);
    assert_int_equal(redis_srv_int(&f->srv, "EXISTS %s", l0->element[0]->str), 1);
    value_restamp(&f->srv, l0->element[0]->str, 36, 1, true);
    freeReplyObject(l0);
    /* a pointer's mask that is not the run's */
    ptrs = redis_srv_keys(&f->srv, "mnemo:blk1:*");
    for (size_t k = 0; k < ptrs->elements; k++) value_restamp(&f->srv, ptrs->element[k]->str, 56, 0x1, false);
    freeReplyObject(ptrs);
    assert_int_equal(probe_ids(f->b, ids, 3), 1);
    assert_int_equal(tier_block_hidden(f->b, &hs[0]), 0x1);
    assert_int_equal(tier_read_layers(f->b, hs, 3, p, dst, NULL, NULL), MN_ECHECKSUM);
    tier_stats(f->b, &s);
    assert_int_equal(s.n_checksum_failures, 2);
    probe_ids(f->b, ids, 3); /* (its exchange reads the replies of any DEL sent) */
    assert_int_equal(redis_srv_int(&f->srv, "DBSIZE"), 4 + 3);
    tier_check(f->b);
}

int main(void) {
    test_apply_filter();
    signal(SIGPIPE, SIG_IGN); /* as mnemo serve: a write to a killed server is an error, not a signal */
#define RT(fn) cmocka_unit_test_setup_teardown(fn, rfix_setup, rfix_teardown)
    const struct CMUnitTest tests[] = {
        RT(test_redis_roundtrip),     RT(test_redis_probe_other_instance), RT(test_redis_ttl),
        RT(test_redis_missing),       RT(test_redis_damaged),              RT(test_redis_other_model),
        RT(test_redis_full),          RT(test_redis_down_and_back),        RT(test_redis_killed_mid_read),
        RT(test_redis_urls_and_auth), RT(test_redis_shared_replies),       RT(test_redis_hidden_layers),
        RT(test_redis_hidden_forged), RT(test_redis_measure_read),         RT(test_redis_value_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
