/* test_route.c — the router's pure parts: the hash ring, the plan with
 * bounded loads, conversation keys, and the response id map.
 *
 * Ring: every preference list is a permutation; two and five backends get
 * even shares of many keys; removing a backend moves only the keys it had
 * (the others keep their backend); the order does not depend on the
 * order the names were given in. Plan: the ring's choice while it fits
 * the bound, the next one when it does not, down backends last, and
 * ring_load_cap's arithmetic; the waits' far times (base/clock). Keys: every turn of a chat (and of a
 * completion, a Responses chain, a session) has its first turn's key;
 * other conversations, namespaces and sessions differ; stored-response
 * requests name their id; bodies that are not JSON fall back to the
 * namespace. IdMap: side by side with a linear-search model of the same
 * ring of slots, under random puts, gets and drops.
 */
#include "test_util.h"

#include <stdbool.h>

#include "base/clock.h"
#include "base/rng.h"
#include "route/convkey.h"
#include "route/idmap.h"
#include "route/ring.h"

/* ---- the ring --------------------------------------------------------------------------- */

static Ring *ring_of(const char *const *names, int n) {
    Ring *r = NULL;
    assert_int_equal(ring_new(names, n, RING_VNODES, &r), MN_OK);
    return r;
}

static uint64_t key_n(int i) { return ring_hash(&i, sizeof i); }

static void test_ring_order_is_a_permutation(void **state) {
    const char *names[] = {"http://a:1", "http://b:2", "http://c:3", "http://d:4"};
    Ring *r = ring_of(names, 4);
    for (int i = 0; i < 1000; i++) {
        int order[4], seen[4] = {0};
        ring_order(r, key_n(i), order);
        for (int k = 0; k < 4; k++) {
            assert_true(order[k] >= 0 && order[k] < 4);
            seen[order[k]]++;
        }
        for (int k = 0; k < 4; k++) assert_int_equal(seen[k], 1);
    }
    ring_free(r);
    Ring *bad = NULL;
    assert_int_equal(ring_new(names, 0, RING_VNODES, &bad), MN_EINVAL);
    assert_int_equal(ring_new(names, 4, 0, &bad), MN_EINVAL);
    assert_null(bad);
}

/* Shares of 20000 keys over n backends, each within [lo, hi] of equal. */
static void check_shares(const char *const *names, int n, double lo, double hi) {
    Ring *r = ring_of(names, n);
    int count[RING_MAX_NODES] = {0};
    const int n_keys = 20000;
    for (int i = 0; i < n_keys; i++) {
        int order[RING_MAX_NODES];
        ring_order(r, key_n(i), order);
        count[order[0]]++;
    }
    for (int k = 0; k < n; k++) {
        double share = (double)count[k] * n / n_keys;
        if (share < lo || share > hi) fail_msg("backend %s got %.3f of an equal share", names[k], share);
    }
    ring_free(r);
}

static void test_ring_shares_are_even(void **state) {
    const char *two[] = {"http://127.0.0.1:8001", "http://127.0.0.1:8002"};
    check_shares(two, 2, 0.85, 1.15);
    const char *five[] = {"http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080",
                          "http://10.0.0.4:8080", "http://10.0.0.5:8080"};
    check_shares(five, 5, 0.75, 1.25);
}

static void test_ring_removal_moves_only_its_keys(void **state) {
    const char *all[] = {"http://a:1", "http://b:2", "http://c:3"};
    const char *without_b[] = {"http://a:1", "http://c:3"};
    Ring *r3 = ring_of(all, 3), *r2 = ring_of(without_b, 2);
    int moved = 0;
    for (int i = 0; i < 5000; i++) {
        int o3[3], o2[2];
        ring_order(r3, key_n(i), o3);
        ring_order(r2, key_n(i), o2);
        const char *before = all[o3[0]], *after = without_b[o2[0]];
        if (o3[0] != 1) assert_string_equal(before, after); /* a's and c's keys stay */
        else {
            moved++;
            assert_string_equal(after, all[o3[1]]); /* b's go to its next on the ring */
        }
    }
    assert_true(moved > 0);
    ring_free(r3);
    ring_free(r2);
}

static void test_ring_ignores_name_order(void **state) {
    const char *ab[] = {"http://a:1", "http://b:2"}, *ba[] = {"http://b:2", "http://a:1"};
    Ring *r1 = ring_of(ab, 2), *r2 = ring_of(ba, 2);
    for (int i = 0; i < 2000; i++) {
        int o1[2], o2[2];
        ring_order(r1, key_n(i), o1);
        ring_order(r2, key_n(i), o2);
        assert_string_equal(ab[o1[0]], ba[o2[0]]);
    }
    ring_free(r1);
    ring_free(r2);
}

/* ---- the waits ---------------------------------------------------------------------------------- */

/* The health thread waits until the next probe and the drain until its
 * timeout, both as a struct timespec: a time past time_t's range (--probe-max
 * 1e30, a backend down) is the far future, not a past time that ends the
 * wait at once (the health thread spun on a core). */
static void test_timespec_of(void **state) {
    struct timespec ts = mn_timespec_of(1.5);
    assert_int_equal(ts.tv_sec, 1);
    assert_int_equal(ts.tv_nsec, 500000000L);
    ts = mn_timespec_of(1e30);
    assert_true((double)ts.tv_sec >= MN_TIME_FAR_S - 1);
    assert_true(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);
    ts = mn_timespec_of(-2.5);
    assert_true(ts.tv_sec == 0 && ts.tv_nsec == 0);
    ts = mn_timespec_of(0.0 / 0.0);
    assert_true(ts.tv_sec == 0 && ts.tv_nsec == 0);
    ts = mn_timespec_of(2.9999999999999996); /* a fraction that rounds to a whole second */
    assert_true(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);
}

/* ---- the plan -------------------------------------------------------------------------------- */

static void test_load_cap(void **state) {
    assert_int_equal(ring_load_cap(0, 2, 1.25), 1);  /* ceil(0.625) */
    assert_int_equal(ring_load_cap(1, 2, 1.25), 2);  /* ceil(1.25) */
    assert_int_equal(ring_load_cap(2, 2, 1.25), 2);  /* ceil(1.875) */
    assert_int_equal(ring_load_cap(7, 2, 1.25), 5);  /* 1.25 * 8 / 2 = 5 exactly */
    assert_int_equal(ring_load_cap(8, 4, 1.0), 3);   /* ceil(2.25) */
    assert_int_equal(ring_load_cap(5, 2, 0), INT32_MAX);
    assert_int_equal(ring_load_cap(5, 0, 1.25), INT32_MAX);
    /* a huge factor (--load-factor 1e30) never bounds: no wrap to a cap of 1 */
    assert_int_equal(ring_load_cap(0, 1, 1e30), INT32_MAX);
    assert_int_equal(ring_load_cap(3, 2, 3e9), INT32_MAX);
}

static void test_plan(void **state) {
    int order[3] = {2, 0, 1}, plan[3];
    bool up[3] = {true, true, true}, is_skip;
    int load[3] = {0, 0, 0};
    ring_plan(order, 3, up, load, 1.25, plan, &is_skip);
    assert_int_equal(plan[0], 2);
    assert_int_equal(plan[1], 0);
    assert_int_equal(plan[2], 1);
    assert_false(is_skip);

    /* node 2 holds 4 of 4 in flight: cap = ceil(1.25 * 5 / 3) = 3, so 0 takes it */
    load[2] = 4;
    ring_plan(order, 3, up, load, 1.25, plan, &is_skip);
    assert_int_equal(plan[0], 0);
    assert_int_equal(plan[1], 2);
    assert_int_equal(plan[2], 1);
    assert_true(is_skip);
    /* no bound: the ring's choice whatever its load */
    ring_plan(order, 3, up, load, 0, plan, &is_skip);
    assert_int_equal(plan[0], 2);
    assert_false(is_skip);
    /* within the bound: cap = ceil(1.25 * 3 / 3) = 2, node 2 holds 1 */
    load[2] = 1;
    load[0] = 1;
    ring_plan(order, 3, up, load, 1.25, plan, &is_skip);
    assert_int_equal(plan[0], 2);

    /* down nodes go last, in ring order; all down: ring order */
    load[0] = load[2] = 0;
    up[2] = false;
    ring_plan(order, 3, up, load, 1.25, plan, &is_skip);
    assert_int_equal(plan[0], 0);
    assert_int_equal(plan[1], 1);
    assert_int_equal(plan[2], 2);
    up[0] = up[1] = false;
    ring_plan(order, 3, up, load, 1.25, plan, &is_skip);
    assert_int_equal(plan[0], 2);
    assert_int_equal(plan[1], 0);
    assert_int_equal(plan[2], 1);
}

/* ---- conversation keys ------------------------------------------------------------------------ */

static ConvKey key_of(const char *method, const char *path, const char *body, const char *auth, const char *ns,
                      const char *session) {
    ConvKeyInput in = {method, path, body, body ? strlen(body) : 0, auth, ns, session};
    ConvKey k;
    convkey_of(&in, &k);
    return k;
}

static ConvKey chat_key(const char *body) { return key_of("POST", "/v1/chat/completions", body, NULL, NULL, NULL); }

static void test_chat_turns_share_a_key(void **state) {
    ConvKey t1 = chat_key("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                          "{\"role\":\"user\",\"content\":\"Hi there\"}],\"max_tokens\":5}");
    ConvKey t2 = chat_key("{\"stream\":true,\"messages\":[{\"content\":\"Be brief.\",\"role\":\"system\"},"
                          "{\"role\":\"user\",\"content\":\"Hi there\",\"name\":\"bob\"},"
                          "{\"role\":\"assistant\",\"content\":\"Hello.\"},{\"role\":\"user\",\"content\":\"More\"}]}");
    assert_false(t1.is_stored);
    assert_false(t1.is_new_response);
    assert_true(t1.hash == t2.hash);
    /* another first question, another system prompt: other keys */
    ConvKey other = chat_key("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                             "{\"role\":\"user\",\"content\":\"Hi there!\"}]}");
    ConvKey other_sys = chat_key("{\"messages\":[{\"role\":\"system\",\"content\":\"Be long.\"},"
                                 "{\"role\":\"user\",\"content\":\"Hi there\"}]}");
    assert_true(t1.hash != other.hash);
    assert_true(t1.hash != other_sys.hash);
    /* content as parts: its canonical JSON, the same whatever the key order */
    ConvKey p1 = chat_key("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}]}");
    ConvKey p2 = chat_key("{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\",\"type\":\"text\"}]},"
                          "{\"role\":\"assistant\",\"content\":\"b\"}]}");
    assert_true(p1.hash == p2.hash);
}

static void test_namespace_and_session(void **state) {
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    ConvKey none = key_of("POST", "/v1/chat/completions", body, NULL, NULL, NULL);
    ConvKey a = key_of("POST", "/v1/chat/completions", body, "Bearer a", NULL, NULL);
    ConvKey b = key_of("POST", "/v1/chat/completions", body, "Bearer b", NULL, NULL);
    ConvKey ns = key_of("POST", "/v1/chat/completions", body, NULL, "tenant", NULL);
    assert_true(none.hash != a.hash && a.hash != b.hash && none.hash != ns.hash);
    /* a session names the conversation, whatever the messages */
    ConvKey s1 = key_of("POST", "/v1/chat/completions", body, NULL, NULL, "s-1");
    ConvKey s1b = key_of("POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Other\"}]}",
                         NULL, NULL, "s-1");
    ConvKey s1_body = chat_key("{\"session_id\":\"s-1\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    ConvKey s2 = key_of("POST", "/v1/chat/completions", body, NULL, NULL, "s-2");
    assert_true(s1.hash == s1b.hash && s1.hash == s1_body.hash);
    assert_true(s1.hash != s2.hash && s1.hash != none.hash);
}

static void test_completion_keys(void **state) {
    char long1[600], long2[700];
    memset(long1, 'a', sizeof long1 - 1);
    long1[sizeof long1 - 1] = '\0';
    memset(long2, 'a', sizeof long2 - 1);
    long2[sizeof long2 - 1] = '\0';
    long2[400] = 'b'; /* past CONVKEY_PROMPT_BYTES */
    char b1[800], b2[900];
    snprintf(b1, sizeof b1, "{\"prompt\":\"%s\"}", long1);
    snprintf(b2, sizeof b2, "{\"prompt\":\"%s\",\"max_tokens\":3}", long2);
    ConvKey k1 = key_of("POST", "/v1/completions", b1, NULL, NULL, NULL);
    ConvKey k2 = key_of("POST", "/v1/completions", b2, NULL, NULL, NULL);
    assert_true(k1.hash == k2.hash);
    long2[10] = 'c'; /* within it */
    snprintf(b2, sizeof b2, "{\"prompt\":\"%s\"}", long2);
    ConvKey k3 = key_of("POST", "/v1/completions", b2, NULL, NULL, NULL);
    assert_true(k1.hash != k3.hash);
    ConvKey ids1 = key_of("POST", "/v1/completions", "{\"prompt\":[1,2,3]}", NULL, NULL, NULL);
    ConvKey ids2 = key_of("POST", "/v1/completions", "{\"prompt\":[1,2,4]}", NULL, NULL, NULL);
    assert_true(ids1.hash != ids2.hash);
}

static void test_responses_keys(void **state) {
    ConvKey first = key_of("POST", "/v1/responses", "{\"input\":\"Hi\",\"instructions\":\"Be brief.\"}", NULL, NULL, NULL);
    ConvKey items = key_of("POST", "/v1/responses",
                           "{\"instructions\":\"Be brief.\",\"input\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                           "{\"role\":\"assistant\",\"content\":\"Hello\"}]}",
                           NULL, NULL, NULL);
    assert_true(first.is_new_response && !first.is_stored);
    assert_true(first.hash == items.hash);
    ConvKey next = key_of("POST", "/v1/responses", "{\"input\":\"More\",\"previous_response_id\":\"resp_abc\"}", NULL,
                          NULL, NULL);
    assert_true(next.is_stored && next.is_new_response);
    assert_string_equal(next.id, "resp_abc");
    ConvKey get = key_of("GET", "/v1/responses/resp_abc", NULL, NULL, NULL, NULL);
    ConvKey items_of = key_of("GET", "/v1/responses/resp_abc/input_items", NULL, NULL, NULL, NULL);
    ConvKey del = key_of("DELETE", "/v1/responses/resp_abc", NULL, NULL, NULL, NULL);
    assert_true(get.is_stored && items_of.is_stored && del.is_stored);
    assert_false(get.is_new_response);
    assert_string_equal(get.id, "resp_abc");
    assert_string_equal(items_of.id, "resp_abc");
    assert_true(get.hash == next.hash && del.hash == next.hash);
    /* an id too long to keep: stored, but nothing to remember it by */
    char path[400] = "/v1/responses/";
    memset(path + strlen(path), 'x', 300);
    ConvKey lng = key_of("GET", path, NULL, NULL, NULL, NULL);
    assert_true(lng.is_stored);
    assert_string_equal(lng.id, "");
}

static void test_other_requests_key_by_namespace(void **state) {
    ConvKey bad = key_of("POST", "/v1/chat/completions", "{bad json", "Bearer k", NULL, NULL);
    ConvKey models = key_of("GET", "/v1/models", NULL, "Bearer k", NULL, NULL);
    ConvKey tok = key_of("POST", "/tokenize", "{\"content\":\"x\"}", "Bearer k", NULL, NULL);
    ConvKey arr = key_of("POST", "/v1/chat/completions", "[1,2]", "Bearer k", NULL, NULL);
    assert_true(bad.hash == models.hash && models.hash == tok.hash && tok.hash == arr.hash);
    assert_false(bad.is_stored || models.is_stored);
    ConvKey other = key_of("GET", "/v1/models", NULL, "Bearer j", NULL, NULL);
    assert_true(other.hash != models.hash);
}

/* ---- the id map beside a plain model ------------------------------------------------------------ */

enum { MODEL_IDS = 20, MODEL_CAP = 8 };

/* The model, by linear search: MODEL_CAP slots taken in turn by new ids
 * (the one a new id takes loses what it held), a dropped id's slot left
 * empty until its turn comes again. */
typedef struct Model {
    int id[MODEL_CAP]; /* -1: empty */
    int backend[MODEL_CAP];
    int next;
} Model;

static int model_find(const Model *m, int id) {
    for (int i = 0; i < MODEL_CAP; i++)
        if (m->id[i] == id) return i;
    return -1;
}

static void test_idmap_against_model(void **state) {
    IdMap *map = NULL;
    assert_int_equal(idmap_new(0, &map), MN_EINVAL);
    assert_int_equal(idmap_new(MODEL_CAP, &map), MN_OK);
    Model m = {.next = 0};
    for (int i = 0; i < MODEL_CAP; i++) m.id[i] = -1;
    Rng rng;
    rng_seed(&rng, 7, 0);
    for (int step = 0; step < 20000; step++) {
        int k = (int)(rng_next(&rng) % MODEL_IDS);
        char id[32];
        snprintf(id, sizeof id, "resp_%d", k);
        unsigned op = (unsigned)(rng_next(&rng) % 10);
        int i = model_find(&m, k);
        if (op < 5) {
            int b = (int)(rng_next(&rng) % 4);
            idmap_put(map, id, b);
            if (i < 0) {
                i = m.next;
                m.next = (m.next + 1) % MODEL_CAP;
                m.id[i] = k;
            }
            m.backend[i] = b;
        } else if (op == 9) {
            idmap_drop(map, id);
            if (i >= 0) m.id[i] = -1;
        } else {
            int got = idmap_get(map, id), want = i >= 0 ? m.backend[i] : -1;
            if (got != want) fail_msg("step %d: %s gives %d, the model %d", step, id, got, want);
        }
        size_t n_held = 0;
        for (int j = 0; j < MODEL_CAP; j++) n_held += m.id[j] >= 0;
        assert_int_equal(idmap_count(map), n_held);
    }
    idmap_free(map);
}

static void test_idmap_basics(void **state) {
    IdMap *map = NULL;
    assert_int_equal(idmap_new(3, &map), MN_OK);
    idmap_put(map, "a", 0);
    idmap_put(map, "b", 1);
    idmap_put(map, "c", 2);
    assert_int_equal(idmap_count(map), 3);
    idmap_put(map, "a", 5); /* replaces, keeps its place */
    assert_int_equal(idmap_get(map, "a"), 5);
    idmap_put(map, "d", 3); /* the oldest, a, goes */
    assert_int_equal(idmap_get(map, "a"), -1);
    assert_int_equal(idmap_get(map, "b"), 1);
    assert_int_equal(idmap_get(map, "d"), 3);
    char lng[CONVKEY_ID_MAX + 8];
    memset(lng, 'x', sizeof lng - 1);
    lng[sizeof lng - 1] = '\0';
    idmap_put(map, lng, 1); /* too long: not kept */
    assert_int_equal(idmap_get(map, lng), -1);
    assert_int_equal(idmap_count(map), 3);
    idmap_drop(map, "b");
    idmap_drop(map, "nothing");
    assert_int_equal(idmap_count(map), 2);
    idmap_free(map);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_order_is_a_permutation),
        cmocka_unit_test(test_ring_shares_are_even),
        cmocka_unit_test(test_ring_removal_moves_only_its_keys),
        cmocka_unit_test(test_ring_ignores_name_order),
        cmocka_unit_test(test_timespec_of),
        cmocka_unit_test(test_load_cap),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_chat_turns_share_a_key),
        cmocka_unit_test(test_namespace_and_session),
        cmocka_unit_test(test_completion_keys),
        cmocka_unit_test(test_responses_keys),
        cmocka_unit_test(test_other_requests_key_by_namespace),
        cmocka_unit_test(test_idmap_basics),
        cmocka_unit_test(test_idmap_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
