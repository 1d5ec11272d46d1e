/* test_store.c — the cache's SQLite database (cache/store.h).
 *
 * Create and reopen (what was committed is there, the WAL ends empty, no
 * -shm file); a second opener is refused while the first holds it; a
 * database of another schema version, or one with tables but no version
 * (not ours), is refused with MN_EUNSUPPORTED and a message naming the
 * file and both versions; another identity (fingerprint, KV format,
 * layers, block size) with MN_EINVAL naming what differs; a garbage file
 * and a database with a damaged page with MN_EFORMAT; a missing directory
 * with MN_ENOTFOUND. Run records: put (and replace), touch, delete,
 * foreach in id order with exact bytes and times, early stop, 64-bit
 * ids. Replies: put, replace, load the newest into a ReplyMemory and get
 * them back, trim. Conversations: put, replace, count, foreach in order
 * of activity, expire, id 0 ignored, the full 64-bit id range.
 * Namespaces: run rows keep theirs (or none); a database of schema 1 is
 * upgraded in place; store_purge deletes one namespace's replies and
 * conversations (and replies of none) and leaves none of their bytes in
 * the database or WAL, not even of rows trimmed before.
 */
#include "test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "base/hash.h"
#include "cache/reply_mem.h"
#include "cache/store.h"
#include "model/tokenizer.h"

/* ---- helpers ------------------------------------------------------------- */

static void make_dir(char *dir) {
    strcpy(dir, "/tmp/mnemo-store-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static StoreIdentity ident(uint8_t fp) {
    StoreIdentity id = {.kv_format = 1 | 32u << 8, .n_layer = 6, .block_bytes = 8192};
    memset(id.model_fingerprint.b, fp, 16);
    return id;
}

static bool file_exists(const char *dir, const char *name, off_t *size) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    if (stat(path, &st) != 0) return false;
    if (size) *size = st.st_size;
    return true;
}

static CacheStore *open_ok(const char *dir, const StoreIdentity *id) {
    CacheStore *s = NULL;
    MnErr err = {0};
    int rc = store_open(dir, id, &s, &err);
    if (rc != MN_OK) fail_msg("store_open %s: %s (%s)", dir, mn_strerror(rc), err.msg);
    return s;
}

/* Run SQL on DIR/mnemo.db with a plain connection (making foreign files). */
static void raw_sql(const char *dir, const char *sql) {
    char path[512];
    snprintf(path, sizeof path, "%s/mnemo.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) fail_msg("%s: %s", sql, msg);
    sqlite3_close(db);
}

/* ---- open, reopen -------------------------------------------------------- */

static void test_store_create_reopen(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x11);
    CacheStore *s = open_ok(dir, &id);
    char want[128];
    snprintf(want, sizeof want, "%s/mnemo.db", dir);
    assert_string_equal(store_path(s), want);
    assert_true(hash128_eq(&store_identity(s)->model_fingerprint, &id.model_fingerprint));
    assert_int_equal(store_identity(s)->n_layer, 6);
    assert_int_equal(store_run_put(s, 5, "hello", 5, 100.5, NULL), MN_OK);
    assert_false(file_exists(dir, "mnemo.db-shm", NULL)); /* exclusive: the WAL index is in memory */
    /* another connection cannot have it meanwhile */
    CacheStore *s2 = (CacheStore *)1;
    MnErr err = {0};
    assert_int_equal(store_open(dir, &id, &s2, &err), MN_EBUSY);
    assert_null(s2);
    assert_non_null(strstr(err.msg, "another process"));
    assert_int_equal(store_checkpoint(s), MN_OK);
    off_t wal = -1;
    assert_true(file_exists(dir, "mnemo.db-wal", &wal));
    assert_int_equal(wal, 0);
    store_close(s);
    store_close(NULL);

    s = open_ok(dir, &id);
    int64_t n = -1;
    assert_int_equal(store_run_count(s, &n), MN_OK);
    assert_int_equal(n, 1);
    store_close(s);
    assert_true(file_exists(dir, "mnemo.db", NULL));
    wal = -1;
    assert_true(!file_exists(dir, "mnemo.db-wal", &wal) || wal == 0);

    /* a directory that is not there */
    char missing[128];
    snprintf(missing, sizeof missing, "%s/no/such", dir);
    assert_int_equal(store_open(missing, &id, &s2, &err), MN_ENOTFOUND);
    assert_non_null(strstr(err.msg, "no/such"));
    assert_int_equal(store_open("", &id, &s2, &err), MN_EINVAL);
    test_rm_dir(dir);
}

static void test_store_version(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x22);
    store_close(open_ok(dir, &id));
    raw_sql(dir, "PRAGMA user_version = 7");
    CacheStore *s = (CacheStore *)1;
    MnErr err = {0};
    assert_int_equal(store_open(dir, &id, &s, &err), MN_EUNSUPPORTED);
    assert_null(s);
    assert_non_null(strstr(err.msg, "mnemo.db"));
    assert_non_null(strstr(err.msg, "version 7"));
    assert_non_null(strstr(err.msg, "uses 3"));
    assert_non_null(strstr(err.msg, "move"));
    /* refused, not changed: still version 7 */
    assert_int_equal(store_open(dir, &id, &s, &err), MN_EUNSUPPORTED);
    test_rm_dir(dir);

    /* someone else's database: tables, no version */
    make_dir(dir);
    raw_sql(dir, "CREATE TABLE t(x); INSERT INTO t VALUES (1)");
    assert_int_equal(store_open(dir, &id, &s, &err), MN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "not a mnemo cache store"));
    test_rm_dir(dir);

    /* an empty file is a new database */
    make_dir(dir);
    char path[128];
    snprintf(path, sizeof path, "%s/mnemo.db", dir);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    store_close(open_ok(dir, &id));
    test_rm_dir(dir);
}

static void test_store_identity(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x33);
    store_close(open_ok(dir, &id));
    CacheStore *s = (CacheStore *)1;
    MnErr err = {0};
    StoreIdentity other = ident(0x34);
    assert_int_equal(store_open(dir, &other, &s, &err), MN_EINVAL);
    assert_null(s);
    assert_non_null(strstr(err.msg, "model fingerprint 3333"));
    assert_non_null(strstr(err.msg, "this model 3434"));
    other = id;
    other.n_layer = 7;
    assert_int_equal(store_open(dir, &other, &s, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "6 layers, now 7"));
    assert_null(strstr(err.msg, "fingerprint"));
    other = id;
    other.kv_format = 0;
    other.block_bytes = 4096;
    assert_int_equal(store_open(dir, &other, &s, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "KV format"));
    assert_non_null(strstr(err.msg, "8192 bytes per block, now 4096"));
    store_close(open_ok(dir, &id)); /* still fine for its own */
    test_rm_dir(dir);
}

static void test_store_garbage(void **state) {
    char dir[64], path[128];
    make_dir(dir);
    snprintf(path, sizeof path, "%s/mnemo.db", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t x = 12345;
    for (int i = 0; i < 8192; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        fputc((int)(x >> 56), f);
    }
    fclose(f);
    StoreIdentity id = ident(0x44);
    CacheStore *s = (CacheStore *)1;
    MnErr err = {0};
    assert_int_equal(store_open(dir, &id, &s, &err), MN_EFORMAT);
    assert_null(s);
    assert_non_null(strstr(err.msg, "mnemo.db"));
    assert_non_null(strstr(err.msg, "not a SQLite database"));
    test_rm_dir(dir);

    /* a real database with a damaged table page */
    make_dir(dir);
    snprintf(path, sizeof path, "%s/mnemo.db", dir);
    s = open_ok(dir, &id);
    for (int i = 1; i <= 50; i++) assert_int_equal(store_run_put(s, (uint64_t)i, path, sizeof path, i, NULL), MN_OK);
    store_close(s);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_true(st.st_size >= 3 * 4096);
    uint8_t junk[64];
    memset(junk, 0xee, sizeof junk);
    for (off_t pg = 4096; pg < st.st_size; pg += 4096) assert_int_equal(pwrite(fd, junk, sizeof junk, pg), 64);
    close(fd);
    assert_int_equal(store_open(dir, &id, &s, &err), MN_EFORMAT);
    assert_non_null(strstr(err.msg, "corrupt"));
    test_rm_dir(dir);
}

/* ---- runs -------------------------------------------------------------------- */

typedef struct Seen {
    int n;
    uint64_t ids[16];
    char recs[16][32];
    size_t lens[16];
    double used[16];
    bool has_ns[16];
    Hash128 ns[16];
    int stop_after; /* 0 = never */
} Seen;

static int on_run(void *ctx, uint64_t run_id, const void *record, size_t len, double last_used,
                  const Hash128 *ns_id) {
    Seen *s = ctx;
    assert_true(s->n < 16 && len < 32);
    s->has_ns[s->n] = ns_id != NULL;
    if (ns_id) s->ns[s->n] = *ns_id;
    s->ids[s->n] = run_id;
    memcpy(s->recs[s->n], record, len);
    s->lens[s->n] = len;
    s->used[s->n] = last_used;
    s->n++;
    return s->stop_after && s->n == s->stop_after ? 42 : 0;
}

static void test_store_runs(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x55);
    CacheStore *s = open_ok(dir, &id);
    uint64_t big = (1ull << 47) + 3;
    Hash128 ns_a = hash128("a", 1), ns_b = hash128("b", 1);
    assert_int_equal(store_run_put(s, 9, "nine", 4, 1000.25, &ns_a), MN_OK);
    assert_int_equal(store_run_put(s, 2, "two\0x", 5, 2000.5, &ns_a), MN_OK); /* bytes, NUL included */
    assert_int_equal(store_run_put(s, big, "big", 3, 3000, NULL), MN_OK);
    assert_int_equal(store_run_put(s, 4, "four", 4, 4000, &ns_a), MN_OK);
    assert_int_equal(store_run_put(s, 9, "NINE!", 5, 5000, &ns_b), MN_OK); /* replaced */
    assert_int_equal(store_run_touch(s, 2, 6000.75), MN_OK);
    assert_int_equal(store_run_touch(s, 77, 1), MN_OK); /* no such row: nothing */
    assert_int_equal(store_run_delete(s, 4), MN_OK);
    assert_int_equal(store_run_delete(s, 4), MN_OK);
    store_close(s);

    s = open_ok(dir, &id);
    Seen seen = {0};
    assert_int_equal(store_run_foreach(s, on_run, &seen), MN_OK);
    assert_int_equal(seen.n, 3);
    assert_int_equal(seen.ids[0], 2);
    assert_int_equal(seen.lens[0], 5);
    assert_memory_equal(seen.recs[0], "two\0x", 5);
    assert_true(seen.used[0] == 6000.75);
    assert_true(seen.has_ns[0] && hash128_eq(&seen.ns[0], &ns_a));
    assert_int_equal(seen.ids[1], 9);
    assert_memory_equal(seen.recs[1], "NINE!", 5);
    assert_true(seen.used[1] == 5000);
    assert_true(seen.has_ns[1] && hash128_eq(&seen.ns[1], &ns_b));
    assert_int_equal(seen.ids[2], big);
    assert_memory_equal(seen.recs[2], "big", 3);
    assert_false(seen.has_ns[2]);
    int64_t n = 0;
    assert_int_equal(store_run_count(s, &n), MN_OK);
    assert_int_equal(n, 3);
    /* a non-zero return stops the walk and comes back; the next walk starts over */
    Seen stop = {.stop_after = 2};
    assert_int_equal(store_run_foreach(s, on_run, &stop), 42);
    assert_int_equal(stop.n, 2);
    Seen again = {0};
    assert_int_equal(store_run_foreach(s, on_run, &again), MN_OK);
    assert_int_equal(again.n, 3);
    store_close(s);
    test_rm_dir(dir);
}

/* ---- replies ------------------------------------------------------------------- */

static void test_store_replies(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x66);
    CacheStore *s = open_ok(dir, &id);
    Hash128 ns = hash128("tenant", 6);
    Hash128 keys[5];
    int32_t ids[5][4];
    char texts[5][24];
    for (int i = 0; i < 5; i++) {
        int32_t prefix[2] = {i, -i};
        keys[i] = replymem_prefix_key(&ns, prefix, 2);
        snprintf(texts[i], sizeof texts[i], "reply %d", i);
        for (int k = 0; k < 4; k++) ids[i][k] = 1000 * i + k - 2; /* negatives too */
        assert_int_equal(store_reply_put(s, &ns, &keys[i], texts[i], strlen(texts[i]), ids[i], (size_t)(1 + i % 4), i),
                         MN_OK);
    }
    /* the same key and text again: replaced, and now the newest */
    int32_t new_ids[3] = {7, 8, 9};
    assert_int_equal(store_reply_put(s, &ns, &keys[1], texts[1], strlen(texts[1]), new_ids, 3, 10), MN_OK);
    /* an empty reply is fine too */
    Hash128 k_empty = hash128("empty", 5);
    assert_int_equal(store_reply_put(s, NULL, &k_empty, "", 0, NULL, 0, 11), MN_OK);
    int64_t n = 0;
    assert_int_equal(store_reply_count(s, &n), MN_OK);
    assert_int_equal(n, 6);
    store_close(s);

    s = open_ok(dir, &id);
    /* the newest 4, oldest first: 3, 4, 1 (replaced), empty */
    ReplyMemory *rm = replymem_new(16);
    assert_non_null(rm);
    assert_int_equal(store_reply_load(s, rm, 4), MN_OK);
    assert_int_equal(replymem_count(rm), 4);
    TokIds out = {0};
    for (int i = 0; i < 5; i++) {
        out.n = 0;
        int got = replymem_get(rm, &keys[i], texts[i], strlen(texts[i]), &out);
        if (i == 0 || i == 2) {
            assert_int_equal(got, 0);
            continue;
        }
        assert_int_equal(got, 1);
        if (i == 1) {
            assert_int_equal(out.n, 3);
            assert_memory_equal(out.ids, new_ids, sizeof new_ids);
        } else {
            assert_int_equal(out.n, (size_t)(1 + i % 4));
            assert_memory_equal(out.ids, ids[i], out.n * sizeof(int32_t));
        }
    }
    out.n = 0;
    assert_int_equal(replymem_get(rm, &k_empty, "", 0, &out), 1);
    assert_int_equal(out.n, 0);
    replymem_free(rm);

    /* a small memory keeps the newest: the load goes oldest first */
    rm = replymem_new(2);
    assert_int_equal(store_reply_load(s, rm, 100), MN_OK);
    assert_int_equal(replymem_count(rm), 2);
    out.n = 0;
    assert_int_equal(replymem_get(rm, &keys[1], texts[1], strlen(texts[1]), &out), 1);
    assert_int_equal(replymem_get(rm, &keys[4], texts[4], strlen(texts[4]), &out), 0);
    replymem_free(rm);

    /* trim keeps the newest */
    assert_int_equal(store_reply_trim(s, 10), MN_OK);
    assert_int_equal(store_reply_count(s, &n), MN_OK);
    assert_int_equal(n, 6);
    assert_int_equal(store_reply_trim(s, 2), MN_OK);
    assert_int_equal(store_reply_count(s, &n), MN_OK);
    assert_int_equal(n, 2);
    rm = replymem_new(8);
    assert_int_equal(store_reply_load(s, rm, 8), MN_OK);
    assert_int_equal(replymem_count(rm), 2);
    out.n = 0;
    assert_int_equal(replymem_get(rm, &keys[1], texts[1], strlen(texts[1]), &out), 1);
    assert_int_equal(replymem_get(rm, &keys[4], texts[4], strlen(texts[4]), &out), 0);
    replymem_free(rm);
    assert_int_equal(store_reply_trim(s, 0), MN_OK);
    assert_int_equal(store_reply_count(s, &n), MN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(store_reply_trim(s, -1), MN_EINVAL);
    tok_ids_free(&out);
    store_close(s);
    test_rm_dir(dir);
}

/* ---- conversations -------------------------------------------------------------- */

typedef struct Convs {
    int n;
    uint64_t conv[8];
    Hash128 ns[8];
    double active[8];
    int64_t tokens[8];
} Convs;

static int on_conv(void *ctx, uint64_t conv, const Hash128 *ns_id, double last_active, int64_t n_tokens) {
    Convs *c = ctx;
    assert_true(c->n < 8);
    c->conv[c->n] = conv;
    c->ns[c->n] = *ns_id;
    c->active[c->n] = last_active;
    c->tokens[c->n] = n_tokens;
    c->n++;
    return 0;
}

static void test_store_convs(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x77);
    CacheStore *s = open_ok(dir, &id);
    Hash128 a = hash128("a", 1), b = hash128("b", 1);
    assert_int_equal(store_conv_put(s, 0, &a, 1, 1), MN_OK); /* not stored */
    assert_int_equal(store_conv_put(s, 10, &a, 300, 64), MN_OK);
    assert_int_equal(store_conv_put(s, UINT64_MAX, &b, 100, 5), MN_OK);
    assert_int_equal(store_conv_put(s, 7, &b, 200, 1ll << 40), MN_OK);
    assert_int_equal(store_conv_put(s, 10, &b, 400, 96), MN_OK); /* replaced */
    int64_t n = 0;
    assert_int_equal(store_conv_count(s, &n), MN_OK);
    assert_int_equal(n, 3);
    store_close(s);

    s = open_ok(dir, &id);
    Convs c = {0};
    assert_int_equal(store_conv_foreach(s, on_conv, &c), MN_OK);
    assert_int_equal(c.n, 3);
    assert_true(c.conv[0] == UINT64_MAX && c.active[0] == 100 && c.tokens[0] == 5 && hash128_eq(&c.ns[0], &b));
    assert_true(c.conv[1] == 7 && c.active[1] == 200 && c.tokens[1] == 1ll << 40);
    assert_true(c.conv[2] == 10 && c.active[2] == 400 && c.tokens[2] == 96 && hash128_eq(&c.ns[2], &b));
    assert_int_equal(store_conv_expire(s, 200), MN_OK); /* strictly before */
    assert_int_equal(store_conv_count(s, &n), MN_OK);
    assert_int_equal(n, 2);
    assert_int_equal(store_conv_expire(s, 1e12), MN_OK);
    assert_int_equal(store_conv_count(s, &n), MN_OK);
    assert_int_equal(n, 0);
    store_close(s);
    test_rm_dir(dir);
}

/* ---- responses ------------------------------------------------------------------- */

/* Store response id (two input items, "input of ID" and a system one)
 * with output as its reply, made at `when`. */
static void put_resp(CacheStore *s, const Hash128 *ns, const char *id, const char *prev, const char *output,
                     double when) {
    char input[64], body[96];
    snprintf(input, sizeof input, "input of %s", id);
    snprintf(body, sizeof body, "{\"id\":\"%s\"}", id);
    StoreRespItem items[2] = {{"msg_1", "developer", "be kind", 7}, {"msg_2", "user", input, strlen(input)}};
    StoreResp r = {.id = id, .previous_id = prev, .created = when, .body = body, .body_len = strlen(body),
                   .output = output, .output_len = strlen(output), .inputs = items, .n_inputs = 2};
    assert_int_equal(store_resp_put(s, ns, &r), MN_OK);
}

/* Responses round-trip (body, output, previous id, inputs in order), are
 * found only in their namespace, expire by last use (a touch keeps them),
 * are deleted with their inputs, and survive a reopen; an in-memory
 * store holds them the same way. */
static void check_responses(CacheStore *s, const char *dir) {
    Hash128 a = hash128("a", 1), b = hash128("b", 1);
    put_resp(s, &a, "resp_1", NULL, "first answer", 100);
    put_resp(s, &a, "resp_2", "resp_1", "second answer", 200);
    StoreResp r;
    assert_int_equal(store_resp_get(s, &a, "resp_2", 0, &r), MN_OK);
    assert_string_equal(r.previous_id, "resp_1");
    assert_string_equal(r.body, "{\"id\":\"resp_2\"}");
    assert_int_equal(r.output_len, strlen("second answer"));
    assert_string_equal(r.output, "second answer");
    assert_int_equal(r.n_inputs, 2);
    assert_string_equal(r.inputs[0].role, "developer");
    assert_string_equal(r.inputs[1].content, "input of resp_2");
    assert_string_equal(r.inputs[1].item_id, "msg_2");
    assert_true(r.created == 200 && r.used == 200);
    store_resp_deinit(&r);
    assert_int_equal(store_resp_get(s, &a, "resp_1", 0, &r), MN_OK);
    assert_null(r.previous_id);
    store_resp_deinit(&r);
    assert_int_equal(store_resp_get(s, &b, "resp_1", 0, &r), MN_ENOTFOUND); /* another namespace's */
    assert_null(r.body);
    assert_int_equal(store_resp_delete(s, &b, "resp_1"), MN_ENOTFOUND);
    /* used at 100: gone for a cutoff past it, unless touched */
    assert_int_equal(store_resp_get(s, &a, "resp_1", 150, &r), MN_ENOTFOUND);
    const char *ids[] = {"resp_1"};
    assert_int_equal(store_resp_touch(s, &b, ids, 1, 300), MN_OK); /* not b's: no effect */
    assert_int_equal(store_resp_get(s, &a, "resp_1", 150, &r), MN_ENOTFOUND);
    assert_int_equal(store_resp_touch(s, &a, ids, 1, 300), MN_OK);
    assert_int_equal(store_resp_get(s, &a, "resp_1", 250, &r), MN_OK);
    store_resp_deinit(&r);
    int64_t n = -1;
    assert_int_equal(store_resp_expire(s, 250, &n), MN_OK); /* resp_2, used at 200 */
    assert_int_equal(n, 1);
    assert_int_equal(store_resp_get(s, &a, "resp_2", 0, &r), MN_ENOTFOUND);
    if (dir) {
        store_close(s);
        StoreIdentity id = ident(0x77);
        s = open_ok(dir, &id);
    }
    assert_int_equal(store_resp_get(s, &a, "resp_1", 0, &r), MN_OK);
    assert_int_equal(r.n_inputs, 2);
    store_resp_deinit(&r);
    assert_int_equal(store_resp_delete(s, &a, "resp_1"), MN_OK);
    assert_int_equal(store_resp_get(s, &a, "resp_1", 0, &r), MN_ENOTFOUND);
    assert_int_equal(store_resp_count(s, &n), MN_OK);
    assert_int_equal(n, 0);
    put_resp(s, &a, "resp_1", NULL, "again", 400); /* its inputs went with it */
    store_close(s);
}

static void test_store_responses(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x77);
    check_responses(open_ok(dir, &id), dir);
    test_rm_dir(dir);
    CacheStore *mem = NULL;
    MnErr err = {0};
    assert_int_equal(store_open_memory(&mem, &err), MN_OK);
    check_responses(mem, NULL);
}

/* ---- main ------------------------------------------------------------------ */

/* ---- upgrade, purge ---------------------------------------------------------- */

/* A database of schema version 1 (no namespace columns) opens: upgraded
 * in place to version 3 (through 2), its rows kept with no namespace, and a purge of
 * any namespace takes its replies. */
static void test_store_upgrade(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x88);
    char sql[2048];
    snprintf(sql, sizeof sql,
             "PRAGMA journal_mode = WAL;"
             "CREATE TABLE identity(id INTEGER PRIMARY KEY CHECK (id = 1), model_fingerprint BLOB NOT NULL,"
             " kv_format INTEGER NOT NULL, n_layer INTEGER NOT NULL, block_bytes INTEGER NOT NULL,"
             " created REAL NOT NULL);"
             "CREATE TABLE runs(run_id INTEGER PRIMARY KEY, record BLOB NOT NULL, last_used REAL NOT NULL);"
             "CREATE TABLE replies(seq INTEGER PRIMARY KEY, entry BLOB NOT NULL UNIQUE, key BLOB NOT NULL,"
             " text BLOB NOT NULL, ids BLOB NOT NULL, used REAL NOT NULL);"
             "CREATE TABLE conversations(conv INTEGER PRIMARY KEY, ns_id BLOB NOT NULL, last_active REAL NOT NULL,"
             " n_tokens INTEGER NOT NULL);"
             "CREATE INDEX conversations_by_active ON conversations(last_active);"
             "INSERT INTO identity VALUES (1, x'88888888888888888888888888888888', %u, %d, %llu, 1);"
             "INSERT INTO runs VALUES (3, x'0102', 10);"
             "INSERT INTO replies VALUES (1, x'00', x'11111111111111111111111111111111', CAST('old text' AS BLOB),"
             " x'01000000', 5);"
             "PRAGMA user_version = 1;",
             id.kv_format, id.n_layer, (unsigned long long)id.block_bytes);
    raw_sql(dir, sql);
    CacheStore *s = open_ok(dir, &id);
    Seen seen = {0};
    assert_int_equal(store_run_foreach(s, on_run, &seen), MN_OK);
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.ids[0], 3);
    assert_false(seen.has_ns[0]);
    Hash128 ns = hash128("tenant", 6);
    assert_int_equal(store_run_put(s, 4, "new", 3, 20, &ns), MN_OK);
    store_close(s);
    /* a tool's open (no model) holds the database as a server's does */
    CacheStore *tool = NULL, *server = (CacheStore *)1;
    MnErr err = {0};
    assert_int_equal(store_open_existing(dir, &tool, &err), MN_OK);
    assert_true(hash128_eq(&store_identity(tool)->model_fingerprint, &id.model_fingerprint));
    assert_int_equal(store_identity(tool)->n_layer, id.n_layer);
    assert_int_equal(store_open(dir, &id, &server, &err), MN_EBUSY);
    assert_null(server);
    store_close(tool);
    s = open_ok(dir, &id); /* version 3 now: opens as it is */
    memset(&seen, 0, sizeof seen);
    assert_int_equal(store_run_foreach(s, on_run, &seen), MN_OK);
    assert_int_equal(seen.n, 2);
    assert_true(seen.has_ns[1] && hash128_eq(&seen.ns[1], &ns));
    StorePurged np;
    Hash128 other = hash128("other", 5);
    assert_int_equal(store_purge(s, &other, &np), MN_OK);
    assert_int_equal(np.n_replies, 1); /* of no known namespace */
    int64_t n_resp = -1;
    assert_int_equal(store_resp_count(s, &n_resp), MN_OK); /* the response tables came with the upgrade */
    assert_int_equal(n_resp, 0);
    store_close(s);
    assert_false(test_dir_contains(dir, "mnemo.db", "old text", 8));
    test_rm_dir(dir);
}

/* store_purge deletes one namespace's replies and conversations and leaves
 * none of their bytes in the database or its WAL, also of rows replaced
 * and trimmed earlier; the other namespace's rows stay. NULL: all. */
static void test_store_purge(void **state) {
    char dir[64];
    make_dir(dir);
    StoreIdentity id = ident(0x99);
    CacheStore *s = open_ok(dir, &id);
    Hash128 a = hash128("a", 1), b = hash128("b", 1);
    const char *text_a = "the secret reply of tenant a", *text_b = "the reply of tenant b";
    for (int i = 0; i < 40; i++) { /* replaced, then trimmed away: in free pages */
        char old[64];
        int32_t v = i;
        snprintf(old, sizeof old, "an older reply of tenant a, number %d", i);
        Hash128 key = hash128(old, strlen(old));
        assert_int_equal(store_reply_put(s, &a, &key, old, strlen(old), &v, 1, i), MN_OK);
    }
    assert_int_equal(store_reply_trim(s, 0), MN_OK);
    int32_t v = 1;
    Hash128 ka = hash128(text_a, strlen(text_a)), kb = hash128(text_b, strlen(text_b));
    assert_int_equal(store_reply_put(s, &a, &ka, text_a, strlen(text_a), &v, 1, 100), MN_OK);
    assert_int_equal(store_reply_put(s, &b, &kb, text_b, strlen(text_b), &v, 1, 101), MN_OK);
    assert_int_equal(store_conv_put(s, 1, &a, 100, 8), MN_OK);
    assert_int_equal(store_conv_put(s, 2, &b, 100, 8), MN_OK);
    assert_true(test_dir_contains(dir, "mnemo.db", text_a, strlen(text_a)));

    const char *answer_a = "the stored answer of tenant a", *answer_b = "the stored answer of tenant b";
    put_resp(s, &a, "resp_a", NULL, answer_a, 100);
    put_resp(s, &b, "resp_b", NULL, answer_b, 100);
    assert_true(test_dir_contains(dir, "mnemo.db", answer_a, strlen(answer_a)));

    StorePurged np = {-1, -1, -1};
    assert_int_equal(store_purge(s, &a, &np), MN_OK);
    assert_int_equal(np.n_replies, 1);
    assert_int_equal(np.n_convs, 1);
    assert_int_equal(np.n_responses, 1);
    assert_false(test_dir_contains(dir, "mnemo.db", answer_a, strlen(answer_a)));
    assert_false(test_dir_contains(dir, "mnemo.db", "input of resp_a", 15));
    assert_true(test_dir_contains(dir, "mnemo.db", answer_b, strlen(answer_b)));
    assert_false(test_dir_contains(dir, "mnemo.db", text_a, strlen(text_a)));
    assert_false(test_dir_contains(dir, "mnemo.db", "an older reply of tenant a", 26));
    assert_true(test_dir_contains(dir, "mnemo.db", text_b, strlen(text_b)));
    int64_t n = -1;
    assert_int_equal(store_reply_count(s, &n), MN_OK);
    assert_int_equal(n, 1);
    Convs c = {0};
    assert_int_equal(store_conv_foreach(s, on_conv, &c), MN_OK);
    assert_int_equal(c.n, 1);
    assert_true(hash128_eq(&c.ns[0], &b));
    store_close(s);

    s = open_ok(dir, &id);
    assert_int_equal(store_purge(s, NULL, &np), MN_OK);
    assert_int_equal(np.n_replies, 1);
    assert_int_equal(np.n_convs, 1);
    assert_int_equal(np.n_responses, 1);
    store_close(s);
    assert_false(test_dir_contains(dir, "mnemo.db", text_b, strlen(text_b)));
    test_rm_dir(dir);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_create_reopen), cmocka_unit_test(test_store_version),
        cmocka_unit_test(test_store_identity),      cmocka_unit_test(test_store_garbage),
        cmocka_unit_test(test_store_runs),          cmocka_unit_test(test_store_replies),
        cmocka_unit_test(test_store_convs),         cmocka_unit_test(test_store_upgrade),
        cmocka_unit_test(test_store_purge), cmocka_unit_test(test_store_responses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
