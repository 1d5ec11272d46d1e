/* test_index.c — the block index and the reply memory: block hashes follow
 * DESIGN.md's byte layout exactly (checked against XXH3 over a buffer built
 * by hand), the hash table agrees with a plain array model under random
 * inserts, lookups, evictions and removals, so do the children lists
 * (row reuse) under random adds, lookups and evictions, and the reply
 * memory returns what was put for the same key and text only, dropping
 * the oldest first. */
#include "test_util.h"

#include <xxhash.h>

#include "base/err.h"
#include "base/hash.h"
#include "base/mem.h"
#include "cache/index.h"
#include "cache/kv_pool.h"
#include "cache/reply_mem.h"

/* hasher_i32s hashes ids as one hasher_u32 each would (the block and
 * reply-memory keys rest on it), across its kilobyte chunks. */
static void test_hasher_i32s_as_u32s(void **s) {
    enum { N = 700 };
    int32_t ids[N];
    uint8_t bytes[4 * N];
    for (int i = 0; i < N; i++) {
        ids[i] = (int32_t)((uint32_t)i * 2654435761u);
        for (int k = 0; k < 4; k++) bytes[4 * i + k] = (uint8_t)((uint32_t)ids[i] >> (8 * k));
    }
    for (size_t n = 0; n <= N; n += n < 300 ? 1 : 97) {
        Hasher a, b;
        hasher_init(&a);
        hasher_init(&b);
        hasher_update(&a, "x", 1);
        hasher_update(&b, "x", 1);
        hasher_i32s(&a, ids, n);
        for (size_t i = 0; i < n; i++) hasher_u32(&b, (uint32_t)ids[i]);
        Hash128 ha = hasher_final(&a), hb = hasher_final(&b);
        assert_memory_equal(ha.b, hb.b, 16);
        uint8_t buf[1 + 4 * N];
        buf[0] = 'x';
        memcpy(buf + 1, bytes, 4 * n);
        XXH128_canonical_t want;
        XXH128_canonicalFromHash(&want, XXH3_128bits(buf, 1 + 4 * n));
        assert_memory_equal(ha.b, want.digest, 16);
    }
}

static void test_block_hash_layout(void **s) {
    Hash128 parent, fp, ns;
    for (int i = 0; i < 16; i++) {
        parent.b[i] = (uint8_t)(i * 7 + 1);
        fp.b[i] = (uint8_t)(200 - i);
    }
    ns = index_namespace_id("tenant-a");
    int32_t tokens[4] = {1, 258, 65536, 0x7fffffff};
    uint32_t fmt = index_kv_format(MN_TYPE_F16, 4);
    assert_int_equal(fmt, 1 | (4 << 8));
    /* the bytes, by hand: parent | tokens LE u32 | fingerprint | format LE u32 | namespace */
    uint8_t buf[16 + 16 + 16 + 4 + 16], *p = buf;
    memcpy(p, parent.b, 16), p += 16;
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 4; k++) *p++ = (uint8_t)((uint32_t)tokens[i] >> (8 * k));
    memcpy(p, fp.b, 16), p += 16;
    for (int k = 0; k < 4; k++) *p++ = (uint8_t)(fmt >> (8 * k));
    memcpy(p, ns.b, 16), p += 16;
    assert_int_equal(p - buf, (long)sizeof buf);
    XXH128_canonical_t want;
    XXH128_canonicalFromHash(&want, XXH3_128bits(buf, sizeof buf));
    Hash128 got = index_block_hash(&parent, tokens, 4, &fp, fmt, &ns);
    assert_memory_equal(got.b, want.digest, 16);
    /* the first block's parent is 16 zero bytes */
    memset(buf, 0, 16);
    XXH128_canonicalFromHash(&want, XXH3_128bits(buf, sizeof buf));
    got = index_block_hash(NULL, tokens, 4, &fp, fmt, &ns);
    assert_memory_equal(got.b, want.digest, 16);
    /* a child key is the hash of an empty block: parent | fingerprint | format | namespace */
    uint8_t kbuf[16 + 16 + 4 + 16];
    memcpy(kbuf, parent.b, 16);
    memcpy(kbuf + 16, fp.b, 16);
    for (int k = 0; k < 4; k++) kbuf[32 + k] = (uint8_t)(fmt >> (8 * k));
    memcpy(kbuf + 36, ns.b, 16);
    XXH128_canonicalFromHash(&want, XXH3_128bits(kbuf, sizeof kbuf));
    got = index_child_key(&parent, &fp, fmt, &ns);
    assert_memory_equal(got.b, want.digest, 16);
    /* the namespace id is XXH3-128 of its string; "" for none */
    XXH128_canonicalFromHash(&want, XXH3_128bits("tenant-a", 8));
    assert_memory_equal(ns.b, want.digest, 16);
    Hash128 none = index_namespace_id(NULL), empty = index_namespace_id("");
    assert_true(hash128_eq(&none, &empty));
}

static Hash128 h_of(int k) {
    int32_t t = k;
    Hash128 z = {{0}};
    return index_block_hash(NULL, &t, 1, &z, 0, &z);
}

static void test_index_model(void **s) {
    enum { N = 64 };
    KvPool p;
    assert_int_equal(kvpool_init(&p, 1, 8, 4, N, MN_TYPE_F16), MN_OK);
    BlockIndex *ix = index_new(&p);
    assert_non_null(ix);
    int model_key[N]; /* key held by slot, -1 none */
    int32_t held[N];
    int n_held = 0;
    for (int i = 0; i < N; i++) model_key[i] = -1;
    uint64_t r = 99;
    for (int step = 0; step < 20000; step++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int op = (int)((r >> 33) % 4), key = (int)((r >> 40) % 200);
        if (op == 0) { /* allocate a block and index it under key */
            int32_t slot;
            int rc = kvpool_alloc(&p, &slot);
            if (rc == MN_EFULL) continue;
            model_key[slot] = -1; /* an evicted slot lost its entry */
            Hash128 h = h_of(key);
            int dup = -1;
            for (int i = 0; i < N; i++)
                if (model_key[i] == key) dup = i;
            int ins = index_insert(ix, &h, slot);
            assert_int_equal(ins, dup < 0 ? 1 : 0);
            if (ins) model_key[slot] = key;
            held[n_held++] = slot;
        } else if (op == 1 && n_held > 0) { /* release: indexed blocks stay cached */
            int i = (int)((r >> 20) % (uint64_t)n_held);
            kvpool_release(&p, held[i]);
            held[i] = held[--n_held];
        } else { /* lookups agree with the model */
            Hash128 h = h_of(key);
            int32_t slot = index_lookup(ix, &h);
            int want = -1;
            for (int i = 0; i < N; i++)
                if (model_key[i] == key) want = i;
            assert_int_equal(slot, want);
        }
        int n = 0;
        for (int i = 0; i < N; i++) n += model_key[i] >= 0;
        assert_int_equal(index_count(ix), n);
        kvpool_check(&p);
    }
    assert_true(p.n_evictions > 0);
    index_free(ix);
    kvpool_deinit(&p);
}

/* kvpool_touch_free writes the FREE slots only, in order, a piece at a
 * time: slots in use and cached keep their bytes, one freed behind the
 * cursor is not visited again, and the calls end once the cursor is past
 * the last slot. */
static void test_pool_touch_free(void **s) {
    enum { N = 8 };
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, N, MN_TYPE_F16), MN_OK);
    int32_t a, b;
    assert_int_equal(kvpool_alloc(&p, &a), MN_OK);
    assert_int_equal(kvpool_alloc(&p, &b), MN_OK);
    for (int l = 0; l < p.n_layer; l++) {
        memset(kvpool_k(&p, l, a), 0xab, p.block_bytes);
        memset(kvpool_k(&p, l, b), 0xcd, p.block_bytes);
    }
    kvpool_set_cacheable(&p, b);
    kvpool_release(&p, b); /* cached */
    int n_calls = 0;
    while (kvpool_touch_free(&p, 1)) n_calls++; /* one slot per call */
    assert_int_equal(n_calls + 1, N - 2);    /* the last call touched the last FREE slot */
    assert_int_equal(p.touch_next, N);
    for (int l = 0; l < p.n_layer; l++)
        for (size_t i = 0; i < p.block_bytes; i++) {
            assert_int_equal(((const uint8_t *)kvpool_k(&p, l, a))[i], 0xab);
            assert_int_equal(((const uint8_t *)kvpool_k(&p, l, b))[i], 0xcd);
        }
    kvpool_release(&p, a);
    assert_false(kvpool_touch_free(&p, SIZE_MAX)); /* nothing is visited again */
    kvpool_check(&p);
    kvpool_deinit(&p);
}

/* The children lists against a plain array: full and partial children
 * under a few keys, with tokens from a two-letter alphabet so that one
 * often extends another, releases, and evictions (kvpool_alloc reuses
 * cached slots). Every lookup gives the longest prefix the model holds,
 * a partial child that another extends is gone (its slot FREE unless
 * held), a child that adds nothing is refused, and an evicted slot is on
 * no list: its rows are never offered again. */
static void test_index_children_model(void **s) {
    enum { N = 32, BT = 4, KEYS = 3 };
    KvPool p;
    assert_int_equal(kvpool_init(&p, 1, 8, BT, N, MN_TYPE_F16), MN_OK);
    BlockIndex *ix = index_new(&p);
    assert_non_null(ix);
    struct {
        int key, rows; /* rows 0: on no list */
        int32_t tok[BT];
    } model[N] = {{0}};
    bool is_held[N] = {false};
    int32_t held[N];
    int n_held = 0, n_added = 0, n_dropped = 0, n_refused = 0, n_evicted = 0;
    Hash128 z = {{0}}, keys[KEYS];
    for (int k = 0; k < KEYS; k++) {
        Hash128 parent = h_of(1000 + k);
        keys[k] = index_child_key(&parent, &z, 0, &z);
    }
    uint64_t r = 7;
    for (int step = 0; step < 20000; step++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int op = (int)((r >> 33) % 4), key = (int)((r >> 40) % KEYS), n = 1 + (int)((r >> 44) % BT);
        int32_t tok[BT];
        for (int i = 0; i < BT; i++) tok[i] = (int32_t)((r >> (50 + i)) & 1);
        if (op == 0) { /* a block: full (indexed first, as the engine does) or partial */
            int32_t slot;
            if (kvpool_alloc(&p, &slot) == MN_EFULL) continue;
            if (model[slot].rows > 0) n_evicted++;
            model[slot].rows = 0;
            held[n_held++] = slot;
            is_held[slot] = true;
            if (n == BT) { /* its hash is its key's and tokens': the same block twice is one record */
                Hash128 h = index_block_hash(&keys[key], tok, BT, &z, 0, &z);
                if (index_insert(ix, &h, slot) != 1) continue;
            }
            bool has = false; /* a child under key holds these rows already */
            for (int i = 0; i < N; i++)
                if (model[i].rows >= n && model[i].key == key && memcmp(model[i].tok, tok, (size_t)n * 4) == 0) has = true;
            int rc = index_child_add(ix, &keys[key], slot, tok, n);
            assert_int_equal(rc, has ? 0 : 1);
            if (has) {
                n_refused++;
                continue;
            }
            for (int i = 0; i < N; i++) /* partial children the new one extends */
                if (model[i].rows > 0 && model[i].rows < n && model[i].rows < BT && model[i].key == key &&
                    memcmp(model[i].tok, tok, (size_t)model[i].rows * 4) == 0) {
                    model[i].rows = 0;
                    assert_int_equal(p.state[i], is_held[i] ? SLOT_IN_USE : SLOT_FREE);
                    n_dropped++;
                }
            model[slot].key = key;
            model[slot].rows = n;
            memcpy(model[slot].tok, tok, sizeof tok);
            n_added++;
        } else if (op == 1 && n_held > 0) {
            int i = (int)((r >> 20) % (uint64_t)n_held);
            is_held[held[i]] = false;
            kvpool_release(&p, held[i]);
            held[i] = held[--n_held];
        } else { /* the longest prefix of tok[0..n) under key */
            int best = 0, got;
            for (int i = 0; i < N; i++) {
                int k = 0;
                while (model[i].key == key && k < model[i].rows && k < n && model[i].tok[k] == tok[k]) k++;
                if (k > best) best = k;
            }
            int32_t slot = index_child_find(ix, &keys[key], tok, n, &got);
            assert_int_equal(got, best);
            if (best == 0) {
                assert_int_equal(slot, -1);
            } else {
                assert_true(slot >= 0 && model[slot].key == key && model[slot].rows >= best);
                assert_memory_equal(model[slot].tok, tok, (size_t)best * 4);
            }
        }
        int n_partial = 0;
        for (int i = 0; i < N; i++) n_partial += model[i].rows > 0 && model[i].rows < BT;
        assert_int_equal(index_n_partials(ix), n_partial);
        kvpool_check(&p);
    }
    assert_true(n_added > 0 && n_dropped > 0 && n_refused > 0 && n_evicted > 0);
    index_free(ix);
    kvpool_deinit(&p);
}

static void test_reply_memory(void **s) {
    ReplyMemory *rm = replymem_new(3);
    assert_non_null(rm);
    Hash128 ns = index_namespace_id(""), other = index_namespace_id("x");
    int32_t prefix[3] = {1, 2, 3}, ids[2] = {40, 41};
    Hash128 k = replymem_prefix_key(&ns, prefix, 3), k2 = replymem_prefix_key(&other, prefix, 3);
    assert_int_equal(replymem_put(rm, &k, "hello", 5, ids, 2), MN_OK);
    TokIds out = {0};
    assert_int_equal(replymem_get(rm, &k, "hello", 5, &out), 1);
    assert_int_equal(out.n, 2);
    assert_int_equal(out.ids[1], 41);
    assert_int_equal(replymem_get(rm, &k, "hell", 4, &out), 0);
    assert_int_equal(replymem_get(rm, &k2, "hello", 5, &out), 0);
    /* the text filter: held under some key, or surely not */
    assert_true(replymem_may_hold(rm, "hello", 5));
    assert_false(replymem_may_hold(rm, "goodbye", 7));
    /* replacing keeps one entry; the oldest goes when full */
    int32_t ids2[1] = {7};
    assert_int_equal(replymem_put(rm, &k, "hello", 5, ids2, 1), MN_OK);
    assert_int_equal(replymem_count(rm), 1);
    out.n = 0;
    assert_int_equal(replymem_get(rm, &k, "hello", 5, &out), 1);
    assert_int_equal(out.n, 1);
    assert_int_equal(out.ids[0], 7);
    assert_int_equal(replymem_put(rm, &k, "a", 1, ids, 2), MN_OK);
    assert_int_equal(replymem_put(rm, &k, "b", 1, ids, 2), MN_OK);
    assert_int_equal(replymem_put(rm, &k, "c", 1, ids, 2), MN_OK);
    assert_int_equal(replymem_count(rm), 3);
    out.n = 0;
    assert_int_equal(replymem_get(rm, &k, "hello", 5, &out), 0);
    assert_false(replymem_may_hold(rm, "hello", 5)); /* its entry was dropped (once, though put twice) */
    assert_int_equal(replymem_get(rm, &k, "c", 1, &out), 1);
    assert_true(replymem_may_hold(rm, "c", 1));
    tok_ids_free(&out);
    replymem_free(rm);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hasher_i32s_as_u32s),
        cmocka_unit_test(test_block_hash_layout),
        cmocka_unit_test(test_index_model),
        cmocka_unit_test(test_pool_touch_free),
        cmocka_unit_test(test_index_children_model),
        cmocka_unit_test(test_reply_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
