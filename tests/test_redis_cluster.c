/* test_redis_cluster.c — the shared tier's Redis client in cluster mode
 * (cache/redis_cluster.c). The Redis Cluster specification's pure parts:
 * CRC16 and hash slots against the specification's own examples (and
 * against CLUSTER KEYSLOT of a real node), MOVED and ASK replies parsed.
 * Then the client against a real three-node cluster (test_redis_util.h):
 * every key reaches the node of its slot, pipelined, replies in the order
 * asked; a slot moved after the map was read (MOVED: followed, the map
 * updated), also for large writes kept past the client's bound (read
 * early); a slot mid-migration (ASK: ASKING and the command at the
 * target, the map left alone); a killed node fails the call (MN_EIO) and a
 * reconnection through a live seed serves the other nodes' slots; the
 * seeds' URL rules; credentials the cluster refuses appear in no log
 * line. And the tier on the cluster: two instances share runs,
 * each run's keys on one node, the runs spread over the nodes, a moved
 * run's slot still read.
 */
#include "test_redis_util.h"
#include "test_tier_util.h"

#include "cache/redis_cluster.h"

/* ---- the specification's pure parts ------------------------------------------ */

static int slot_of(const char *key) { return rcluster_key_slot(key, strlen(key)); }
static int crc_slot(const char *key) { return rcluster_crc16(key, strlen(key)) & 16383; }

/* The specification's CRC16 reference value, and slots of known keys. */
static void test_crc16_spec(void **state) {
    assert_int_equal(rcluster_crc16("123456789", 9), 0x31C3);
    assert_int_equal(rcluster_crc16("", 0), 0);
    assert_int_equal(slot_of("123456789"), 0x31C3 & 16383);
    assert_int_equal(slot_of("foo"), 12182);
    assert_int_equal(slot_of("bar"), 5061);
    assert_int_equal(slot_of("hello"), 866);
}

/* Hash tags, as the specification's examples have them. */
static void test_hash_tags(void **state) {
    assert_int_equal(slot_of("{user1000}.following"), slot_of("user1000"));
    assert_int_equal(slot_of("{user1000}.followers"), slot_of("user1000"));
    assert_int_equal(slot_of("foo{}{bar}"), crc_slot("foo{}{bar}")); /* an empty tag: the whole key */
    assert_int_equal(slot_of("foo{{bar}}zap"), crc_slot("{bar"));     /* from the first '{' to the first '}' */
    assert_int_equal(slot_of("foo{bar}{zap}"), crc_slot("bar"));      /* the first tag only */
    assert_int_equal(slot_of("foo{bar"), crc_slot("foo{bar"));        /* no '}': the whole key */
    assert_int_equal(slot_of("a}b{c"), crc_slot("a}b{c"));            /* a '}' before the '{' does not close it */
    assert_int_equal(slot_of("{"), crc_slot("{"));
    assert_int_equal(slot_of("x{}"), crc_slot("x{}"));
    /* binary keys: the length counts, not a NUL */
    assert_int_equal(rcluster_key_slot("{a\0b}c", 6), rcluster_crc16("a\0b", 3) & 16383);
    /* the tier's keys: every layer of a run in the slot of its tag */
    const char *tag = "0123456789abcdef0123456789abcdef";
    char k0[128], k7[128];
    snprintf(k0, sizeof k0, "mnemo:kv1:3c3c3c3c3c3c3c3c:0000000000000000:{%s}:0", tag);
    snprintf(k7, sizeof k7, "mnemo:kv1:3c3c3c3c3c3c3c3c:0000000000000000:{%s}:7", tag);
    assert_int_equal(slot_of(k0), crc_slot(tag));
    assert_int_equal(slot_of(k7), crc_slot(tag));
}

static void expect_redirect(const char *s, RedisRedirectKind kind, int slot, const char *host, int port) {
    RedisRedirect rd;
    int rc = rcluster_parse_redirect(s, strlen(s), &rd);
    if (rc != MN_OK) fail_msg("'%s': %s", s, mn_strerror(rc));
    assert_int_equal(rd.kind, kind);
    assert_int_equal(rd.slot, slot);
    assert_string_equal(rd.host, host);
    assert_int_equal(rd.port, port);
}

static void expect_no_redirect(const char *s, int want) {
    RedisRedirect rd;
    int rc = rcluster_parse_redirect(s, strlen(s), &rd);
    if (rc != want) fail_msg("'%s': %s, not %s", s, mn_strerror(rc), mn_strerror(want));
}

/* MOVED and ASK as Redis writes them; other errors are none; malformed
 * ones are refused. */
static void test_parse_redirect(void **state) {
    expect_redirect("MOVED 3999 127.0.0.1:6381", RCLUSTER_MOVED, 3999, "127.0.0.1", 6381);
    expect_redirect("ASK 3999 127.0.0.1:6381", RCLUSTER_ASK, 3999, "127.0.0.1", 6381);
    expect_redirect("MOVED 0 redis-2.example:6379", RCLUSTER_MOVED, 0, "redis-2.example", 6379);
    expect_redirect("MOVED 16383 ::1:7000", RCLUSTER_MOVED, 16383, "::1", 7000); /* IPv6: the last ':' */
    expect_redirect("ASK 12 :7001", RCLUSTER_ASK, 12, "", 7001);                /* no endpoint announced */
    expect_no_redirect("ERR unknown command", MN_ENOTFOUND);
    expect_no_redirect("CLUSTERDOWN The cluster is down", MN_ENOTFOUND);
    expect_no_redirect("TRYAGAIN Multiple keys request during rehashing of slot", MN_ENOTFOUND);
    expect_no_redirect("MOVEDX 1 h:1", MN_ENOTFOUND);
    expect_no_redirect("MOVED", MN_ENOTFOUND);
    expect_no_redirect("MOVED 16384 h:1", MN_EFORMAT);
    expect_no_redirect("MOVED -1 h:1", MN_EFORMAT);
    expect_no_redirect("MOVED x h:1", MN_EFORMAT);
    expect_no_redirect("MOVED 1 h", MN_EFORMAT);
    expect_no_redirect("MOVED 1 h:0", MN_EFORMAT);
    expect_no_redirect("MOVED 1 h:70000", MN_EFORMAT);
    expect_no_redirect("MOVED 1 h:", MN_EFORMAT);
    expect_no_redirect("ASK 1", MN_EFORMAT);
    expect_no_redirect("ASK 1 h:1 extra", MN_EFORMAT);
}

/* The seeds' rules: several URLs only for a cluster, a cluster's seeds TCP
 * and database 0; messages name no credential. */
static void test_cluster_config(void **state) {
    static const struct {
        const char *urls[2];
        int n;
        bool is_cluster;
        int want;
    } cases[] = {
        {{"redis://a:1", "redis://b:2"}, 2, false, MN_EINVAL},
        {{"unix:///tmp/x.sock"}, 1, true, MN_EINVAL},
        {{"redis://u:hunter2@h:1/3"}, 1, true, MN_EINVAL},
        {{"redis://h:1", "rediss://u:hunter2@h:2"}, 2, true, MN_EUNSUPPORTED},
        {{"redis://h:1", ""}, 2, true, MN_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        RedisClusterConfig cfg = {.urls = cases[i].urls, .n_urls = cases[i].n, .is_cluster = cases[i].is_cluster,
                                  .timeout_ms = 1000};
        RedisCluster *c = NULL;
        MnErr err = {0};
        int rc = rcluster_new(&cfg, &c, &err);
        if (rc != cases[i].want) fail_msg("case %zu: %s, not %s (%s)", i, mn_strerror(rc), mn_strerror(cases[i].want), err.msg);
        assert_null(c);
        if (strstr(err.msg, "hunter2")) fail_msg("case %zu: the message names the password: %s", i, err.msg);
    }
    const char *seeds[] = {"redis://u:hunter2@127.0.0.1:1", "redis://127.0.0.1:2"};
    RedisClusterConfig cfg = {.urls = seeds, .n_urls = 2, .is_cluster = true, .timeout_ms = 1000};
    RedisCluster *c = NULL;
    MnErr err = {0};
    assert_int_equal(rcluster_new(&cfg, &c, &err), MN_OK);
    assert_string_equal(rcluster_shown(c), "cluster redis://***@127.0.0.1:1/0, redis://127.0.0.1:2/0");
    assert_false(rcluster_is_connected(c));
    redisReply *rep;
    assert_int_equal(rcluster_take(c, &rep, "reading from"), MN_EIO);
    rcluster_free(c);
}

/* ---- the client on a real cluster --------------------------------------------- */

typedef struct CFix {
    RedisClusterSrv cl;
    RedisCluster *c[3];
    KvPool p;
    Tier *a, *b;
} CFix;

static int cfix_setup(void **state) {
    *state = calloc(1, sizeof(CFix));
    return *state ? 0 : -1;
}

static int cfix_teardown(void **state) {
    CFix *f = *state;
    for (int i = 0; i < 3; i++) rcluster_free(f->c[i]);
    tier_free(f->a);
    tier_free(f->b);
    if (f->p.n_layer > 0) kvpool_deinit(&f->p);
    redis_cluster_free(&f->cl);
    free(f);
    return 0;
}

static bool cfix_open(CFix *f) {
    if (!redis_srv_available()) {
        skip();
        return false;
    }
    redis_cluster_start(&f->cl);
    return true;
}

/* A client on the cluster's seeds [first, 3), the map read; max_kept as
 * RedisClusterConfig's (0: default). */
static RedisCluster *client(CFix *f, int first, uint64_t max_kept) {
    RedisClusterConfig cfg = {.urls = f->cl.urls + first,
                              .n_urls = REDIS_CLUSTER_NODES - first,
                              .is_cluster = true,
                              .timeout_ms = 5000,
                              .max_kept_bytes = max_kept};
    RedisCluster *c = NULL;
    MnErr err = {0};
    if (rcluster_new(&cfg, &c, &err) != MN_OK) fail_msg("rcluster_new: %s", err.msg);
    assert_int_equal(rcluster_connect(c), MN_OK);
    return c;
}

static void append2(RedisCluster *c, const char *cmd, const char *key) {
    const char *argv[] = {cmd, key};
    size_t lens[] = {strlen(cmd), strlen(key)};
    assert_int_equal(rcluster_append(c, 2, argv, lens), MN_OK);
}

static void append_set(RedisCluster *c, const char *key, const char *v, size_t len) {
    const char *argv[] = {"SET", key, v};
    size_t lens[] = {3, strlen(key), len};
    assert_int_equal(rcluster_append(c, 3, argv, lens), MN_OK);
}

/* The next reply must be the string want (NULL: the status OK). */
static void expect_reply(RedisCluster *c, const char *want) {
    redisReply *rep = NULL;
    int rc = rcluster_take(c, &rep, "reading from");
    if (rc != MN_OK) {
        rcluster_dump(c);
        fail_msg("take: %s", mn_strerror(rc));
    }
    if (want == NULL) {
        if (rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "OK") != 0)
            fail_msg("not +OK: type %d '%s'", rep->type, rep->str ? rep->str : "");
    } else if (rep->type != REDIS_REPLY_STRING || rep->len != strlen(want) || memcmp(rep->str, want, rep->len) != 0) {
        fail_msg("not '%s': type %d '%s'", want, rep->type, rep->str ? rep->str : "");
    }
    freeReplyObject(rep);
}

static void set_keys(RedisCluster *c, const char *fmt, int n) {
    char key[64], val[80];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, fmt, i);
        snprintf(val, sizeof val, "v-%s", key);
        append_set(c, key, val, strlen(val));
    }
    assert_int_equal(rcluster_flush(c, "writing to"), MN_OK);
    for (int i = 0; i < n; i++) expect_reply(c, NULL);
}

static void get_keys(RedisCluster *c, const char *fmt, int n) {
    char key[64], val[80];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, fmt, i);
        append2(c, "GET", key);
    }
    assert_int_equal(rcluster_flush(c, "reading from"), MN_OK);
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, fmt, i);
        snprintf(val, sizeof val, "v-%s", key);
        expect_reply(c, val);
    }
}

/* A GET of key fails with MN_EIO, wherever: appending (no connection),
 * sending or reading. */
static void get_fails(RedisCluster *c, const char *key) {
    const char *argv[] = {"GET", key};
    size_t lens[] = {3, strlen(key)};
    redisReply *rep = NULL;
    int rc = rcluster_append(c, 2, argv, lens);
    if (rc == MN_OK) rc = rcluster_flush(c, "reading from");
    if (rc == MN_OK) rc = rcluster_take(c, &rep, "reading from");
    assert_int_equal(rc, MN_EIO);
    assert_null(rep);
}

static RedisClusterStats stats_of(const RedisCluster *c) {
    RedisClusterStats s;
    rcluster_stats(c, &s);
    return s;
}

/* Keys written and read pipelined over the three nodes: each lands on the
 * node its slot names (the slot function agrees with CLUSTER KEYSLOT),
 * every node gets some, replies come back in the order asked, and no
 * redirection was needed. */
static void test_cluster_routing(void **state) {
    CFix *f = *state;
    if (!cfix_open(f)) return;
    RedisCluster *c = f->c[0] = client(f, 0, 0);
    set_keys(c, "key:%d", 60);
    get_keys(c, "key:%d", 60);
    int per_node[REDIS_CLUSTER_NODES] = {0};
    for (int i = 0; i < 60; i++) {
        char key[32];
        snprintf(key, sizeof key, "key:%d", i);
        assert_int_equal(redis_srv_int(&f->cl.node[0], "CLUSTER KEYSLOT %s", key), slot_of(key));
        int owner = redis_cluster_owner0(slot_of(key));
        assert_int_equal(redis_cluster_holder(&f->cl, key), owner);
        per_node[owner]++;
    }
    for (int i = 0; i < REDIS_CLUSTER_NODES; i++) assert_true(per_node[i] > 0);
    static const char *const known[] = {"foo", "bar", "hello", "123456789", "{user1000}.following", "foo{}{bar}"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        assert_int_equal(redis_srv_int(&f->cl.node[1], "CLUSTER KEYSLOT %s", known[i]), slot_of(known[i]));
    RedisClusterStats s = stats_of(c);
    assert_int_equal(s.n_map_loads, 1);
    assert_int_equal(s.n_nodes, 3);
    assert_int_equal(s.n_moved + s.n_ask, 0);
}

/* A slot moved (the whole reshard) after the clients read the map: their
 * commands meet MOVED, are sent again to the new owner, and the replies
 * still come in the order asked, mixed with other slots' direct ones; the
 * map is updated (the next command goes straight there). Large writes
 * past the keep bound are read early, and redirected from their copies. */
static void test_cluster_moved(void **state) {
    CFix *f = *state;
    if (!cfix_open(f)) return;
    RedisCluster *c = f->c[0] = client(f, 0, 0);
    RedisCluster *stale = f->c[1] = client(f, 1, 0);
    RedisCluster *small = f->c[2] = client(f, 2, 16 << 10);
    set_keys(c, "{m}:%d", 4);
    set_keys(c, "o:%d", 20);
    int slot = slot_of("m"), src = redis_cluster_owner0(slot), dst = (src + 1) % REDIS_CLUSTER_NODES;
    assert_int_equal(redis_cluster_move_slot(&f->cl, slot, src, dst, -1, true), 4);
    assert_int_equal(redis_cluster_holder(&f->cl, "{m}:0"), dst);
    /* one GET: MOVED once, then the map knows */
    get_keys(c, "{m}:%d", 1);
    assert_int_equal(stats_of(c).n_moved, 1);
    get_keys(c, "{m}:%d", 4);
    assert_int_equal(stats_of(c).n_moved, 1);
    /* twenty GETs of the moved slot between twenty of other slots, all
     * sent before a reply is read: each of the twenty is redirected */
    char key[32], val[40];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof key, "{m}:%d", i % 4);
        append2(stale, "GET", key);
        snprintf(key, sizeof key, "o:%d", i);
        append2(stale, "GET", key);
    }
    assert_int_equal(rcluster_flush(stale, "reading from"), MN_OK);
    for (int i = 0; i < 20; i++) {
        snprintf(val, sizeof val, "v-{m}:%d", i % 4);
        expect_reply(stale, val);
        snprintf(val, sizeof val, "v-o:%d", i);
        expect_reply(stale, val);
    }
    assert_int_equal(stats_of(stale).n_moved, 20);
    assert_int_equal(rcluster_n_owed(stale), 0);
    /* forty 4 KiB writes to the moved slot through a client that keeps
     * 16 KiB: it reads replies early (so fewer than forty go to the old
     * owner), and those redirected are sent again from their copies */
    char *big = malloc(4096);
    for (int i = 0; i < 40; i++) {
        memset(big, 'a' + i % 26, 4096);
        snprintf(key, sizeof key, "{m}:big%d", i);
        append_set(small, key, big, 4096);
    }
    assert_int_equal(rcluster_flush(small, "writing to"), MN_OK);
    for (int i = 0; i < 40; i++) expect_reply(small, NULL);
    uint64_t moved = stats_of(small).n_moved;
    if (!(moved >= 1 && moved < 40)) fail_msg("%llu of 40 writes redirected", (unsigned long long)moved);
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "{m}:big%d", i);
        assert_int_equal(redis_cluster_holder(&f->cl, key), dst);
        redisReply *rep = redis_srv_cmd(&f->cl.node[dst], "GET %s", key);
        memset(big, 'a' + i % 26, 4096);
        assert_int_equal(rep->len, 4096);
        assert_memory_equal(rep->str, big, 4096);
        freeReplyObject(rep);
    }
    free(big);
}

/* A slot mid-migration: the keys already at the target are answered with
 * ASK, read there after ASKING, the others at the source directly; a new
 * key is written at the target; the map still names the source (the next
 * read asks again). */
static void test_cluster_ask(void **state) {
    CFix *f = *state;
    if (!cfix_open(f)) return;
    RedisCluster *c = f->c[0] = client(f, 0, 0);
    set_keys(c, "{a}:%d", 6);
    int slot = slot_of("a"), src = redis_cluster_owner0(slot), dst = (src + 2) % REDIS_CLUSTER_NODES;
    assert_int_equal(redis_cluster_move_slot(&f->cl, slot, src, dst, 3, false), 3);
    int at_dst = 0;
    for (int i = 0; i < 6; i++) {
        char key[16];
        snprintf(key, sizeof key, "{a}:%d", i);
        at_dst += redis_cluster_holder(&f->cl, key) == dst;
    }
    assert_int_equal(at_dst, 3);
    get_keys(c, "{a}:%d", 6);
    RedisClusterStats s = stats_of(c);
    assert_int_equal(s.n_ask, 3);
    assert_int_equal(s.n_moved, 0);
    get_keys(c, "{a}:%d", 6);
    assert_int_equal(stats_of(c).n_ask, 6);
    /* a key the source does not have goes to the target */
    set_keys(c, "{a}:new%d", 1);
    assert_int_equal(redis_cluster_holder(&f->cl, "{a}:new0"), dst);
    get_keys(c, "{a}:new%d", 1);
    assert_int_equal(stats_of(c).n_ask, 8);
}

/* A node killed: a command for its slots fails the call (MN_EIO, the
 * client closed); connecting again reads the map from a live seed but
 * fails while the map names the dead node (so the tier stays off, backing
 * off, rather than flapping); a client whose first seed is the dead node
 * reads the map from the next one; with every node gone, no map. */
static void test_cluster_node_down(void **state) {
    CFix *f = *state;
    if (!cfix_open(f)) return;
    char fmt[REDIS_CLUSTER_NODES][16];
    for (int want = 0, i = 0; want < REDIS_CLUSTER_NODES; i++) { /* a key on each node */
        char key[16];
        snprintf(key, sizeof key, "n%d", i);
        if (redis_cluster_owner0(slot_of(key)) != want) continue;
        snprintf(fmt[want++], sizeof fmt[0], "n%d%%.0d", i);
    }
    RedisCluster *c = f->c[0] = client(f, 0, 0);
    for (int i = 0; i < REDIS_CLUSTER_NODES; i++) set_keys(c, fmt[i], 1);
    redis_srv_kill(&f->cl.node[1]);
    char key[16];
    snprintf(key, sizeof key, fmt[1], 0);
    get_fails(c, key); /* on the connection the SET opened */
    assert_false(rcluster_is_connected(c));
    assert_int_equal(rcluster_n_owed(c), 0);
    /* the map (from a live seed) still names the dead node: not open,
     * nothing sent */
    assert_int_equal(rcluster_connect(c), MN_EIO);
    assert_false(rcluster_is_connected(c));
    get_fails(c, key);
    char other[16];
    snprintf(other, sizeof other, fmt[0], 0);
    get_fails(c, other);
    assert_int_equal(stats_of(c).n_map_loads, 2);
    /* seeds: the dead node first: the map comes from the next one */
    RedisClusterConfig cfg = {.urls = f->cl.urls + 1, .n_urls = 2, .is_cluster = true, .timeout_ms = 5000};
    MnErr err = {0};
    assert_int_equal(rcluster_new(&cfg, &f->c[1], &err), MN_OK);
    assert_int_equal(rcluster_connect(f->c[1]), MN_EIO);
    assert_int_equal(stats_of(f->c[1]).n_map_loads, 1);
    /* every node gone: no map */
    redis_srv_kill(&f->cl.node[0]);
    redis_srv_kill(&f->cl.node[2]);
    assert_int_equal(rcluster_connect(f->c[1]), MN_EIO);
    assert_int_equal(stats_of(f->c[1]).n_map_loads, 1);
}

typedef struct AuthTry {
    const char *const *urls;
    int rc;
} AuthTry;

static void connect_seeds(void *ctx) {
    AuthTry *at = ctx;
    RedisClusterConfig cfg = {.urls = at->urls, .n_urls = 2, .is_cluster = true, .timeout_ms = 5000};
    RedisCluster *c = NULL;
    MnErr err = {0};
    assert_int_equal(rcluster_new(&cfg, &c, &err), MN_OK);
    at->rc = rcluster_connect(c);
    rcluster_free(c);
}

/* Seeds with credentials the cluster refuses: connecting fails, and
 * neither the log nor the client's name for itself shows the password. */
static void test_cluster_credentials_not_logged(void **state) {
    CFix *f = *state;
    if (!cfix_open(f)) return;
    char a[128], b[128];
    snprintf(a, sizeof a, "redis://mnemo:hunter2@127.0.0.1:%d", f->cl.node[0].port);
    snprintf(b, sizeof b, "redis://hunter2@127.0.0.1:%d", f->cl.node[1].port);
    const char *urls[] = {a, b};
    AuthTry at = {urls, MN_OK};
    char *log = redis_capture_stderr(connect_seeds, &at);
    assert_int_equal(at.rc, MN_EIO);
    if (strstr(log, "hunter2")) fail_msg("the log names the password:\n%s", log);
    assert_non_null(strstr(log, "***@127.0.0.1"));
    free(log);
}

/* ---- the tier on the cluster ----------------------------------------------------- */

static Tier *cluster_tier(CFix *f) {
    TierRedisConfig cfg = {.urls = f->cl.urls,
                           .n_urls = REDIS_CLUSTER_NODES,
                           .is_cluster = true,
                           .n_layer = f->p.n_layer,
                           .block_bytes = f->p.block_bytes,
                           .kv_format = 1 | (uint32_t)f->p.block_tokens << 8,
                           .timeout_ms = 5000};
    memset(cfg.model_fingerprint.b, 0x3c, 16);
    Tier *t = NULL;
    MnErr err = {0};
    if (tier_redis_new(&cfg, &t, &err) != MN_OK) fail_msg("tier_redis_new: %s", err.msg);
    assert_false(tier_is_failed(t));
    return t;
}

static int probe_seq(Tier *t, uint32_t first, int n) {
    Hash128 h[64];
    uint8_t want[64];
    for (int i = 0; i < n; i++) {
        h[i] = h_of(first + (uint32_t)i);
        want[i] = 1;
    }
    return tier_redis_probe(t, h, want, n, 8, NULL);
}

/* Every layer of blocks [first, first + n) through one streamed read. */
static void read_seq(Tier *t, KvPool *p, uint32_t first, int n) {
    uint32_t ids[64];
    int32_t slots[64];
    for (int i = 0; i < n; i++) {
        ids[i] = first + (uint32_t)i;
        slots[i] = 32 + i;
    }
    scramble_pool(p, 500 + first);
    LayerLog lg;
    int rc = read_all_layers(t, p, ids, slots, n, &lg);
    if (rc != MN_OK) {
        tier_dump(t);
        fail_msg("reading blocks %u..%u: %s", first, first + (uint32_t)n - 1, mn_strerror(rc));
    }
    assert_int_equal(lg.n_calls, p->n_layer);
}

/* The node holding each run's layer keys (all on one node, or -1), by
 * KEYS on every node; *n_nodes_used = how many nodes hold some. */
static int runs_per_node(CFix *f, int *n_nodes_used) {
    int n_runs = 0;
    *n_nodes_used = 0;
    for (int i = 0; i < REDIS_CLUSTER_NODES; i++) {
        redisReply *keys = redis_srv_keys(&f->cl.node[i], "mnemo:kv1:*:0");
        n_runs += (int)keys->elements;
        *n_nodes_used += keys->elements > 0;
        for (size_t k = 0; k < keys->elements; k++) { /* its other layers on this node too */
            char pat[160];
            snprintf(pat, sizeof pat, "%.*s*", (int)(strlen(keys->element[k]->str) - 1), keys->element[k]->str);
            redisReply *layers = redis_srv_keys(&f->cl.node[i], pat);
            assert_int_equal(layers->elements, f->p.n_layer);
            freeReplyObject(layers);
        }
        freeReplyObject(keys);
    }
    return n_runs;
}

/* Two instances' tiers on the cluster: A puts eight runs, B finds them by
 * probing and reads them bit-exact, several runs in one streamed read;
 * each run's layer values sit on one node and the runs use more than one
 * node. A run's slot moved (MOVED) is still read, by A, which knew it. */
static void test_cluster_tier_shared(void **state) {
    CFix *f = *state;
    if (!cfix_open(f)) return;
    assert_int_equal(kvpool_init(&f->p, 4, 128, 8, 64, MN_TYPE_F16), MN_OK);
    f->a = cluster_tier(f);
    f->b = cluster_tier(f);
    for (uint32_t r = 0; r < 8; r++) assert_int_equal(put_range(f->a, &f->p, 3 * r, 3, (int32_t)(3 * r)), MN_OK);
    int n_used;
    assert_int_equal(runs_per_node(f, &n_used), 8);
    assert_true(n_used >= 2);
    assert_int_equal(probe_seq(f->b, 0, 24), 8);
    read_seq(f->b, &f->p, 0, 24);
    expect_range(f->b, &f->p, 9, 3, 40);
    tier_check(f->b);
    /* the slot of run 0's values moves to another node */
    redisReply *keys = NULL;
    int holder = -1;
    for (int i = 0; i < REDIS_CLUSTER_NODES && holder < 0; i++) {
        keys = redis_srv_keys(&f->cl.node[i], "mnemo:kv1:*:0");
        for (size_t k = 0; k < keys->elements && holder < 0; k++) {
            int slot = slot_of(keys->element[k]->str);
            Hash128 h[3] = {h_of(0), h_of(1), h_of(2)};
            Hash128 tag = hash128(h, sizeof h);
            char hex[33];
            hash128_hex(&tag, hex);
            if (strstr(keys->element[k]->str, hex)) {
                holder = i;
                assert_int_equal(redis_cluster_move_slot(&f->cl, slot, i, (i + 1) % REDIS_CLUSTER_NODES, -1, true),
                                 f->p.n_layer);
            }
        }
        freeReplyObject(keys);
    }
    assert_true(holder >= 0);
    read_seq(f->a, &f->p, 0, 3);
    RedisClusterStats s;
    tier_redis_client_stats(f->a, &s);
    assert_true(s.n_moved >= 1);
    TierStats ts;
    tier_stats(f->a, &ts);
    assert_int_equal(ts.n_io_errors + ts.n_checksum_failures + ts.n_missing_runs, 0);
}

int main(void) {
    test_apply_filter();
    signal(SIGPIPE, SIG_IGN); /* as mnemo serve: a write to a killed node is an error, not a signal */
#define CT(fn) cmocka_unit_test_setup_teardown(fn, cfix_setup, cfix_teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16_spec), cmocka_unit_test(test_hash_tags), cmocka_unit_test(test_parse_redirect),
        cmocka_unit_test(test_cluster_config), CT(test_cluster_routing), CT(test_cluster_moved),
        CT(test_cluster_ask), CT(test_cluster_node_down), CT(test_cluster_credentials_not_logged),
        CT(test_cluster_tier_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
