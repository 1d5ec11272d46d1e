/* test_tier_dir.c — the disk tier's data at rest: the directory is made
 * 0700 and every file in it 0600 whatever the umask, an earlier mnemo's
 * readable ones are tightened; a directory others can write, or another
 * user's, or a symlink in a cache file's place is refused. purge_disk_tier
 * erases one namespace — its runs are not held afterwards, and a raw look
 * at the slab, database and WAL bytes finds neither its KV (nor an earlier
 * dropped run's) nor its reply text, while the other namespace's runs read
 * back exact — and is refused while a server holds the directory. (Split
 * from test_tier.c.)
 */
#include <sys/statvfs.h>
#include "test_tier_util.h"

/* ---- disk: data at rest -------------------------------------------------------- */

/* A store and a disk tier on dir (made when missing), a few runs written:
 * slab files, the database and its WAL exist. */
static void open_and_fill(const char *dir, KvPool *p) {
    PFix fx = {.backend = AIO_BACKEND_AUTO, .capacity = 1 << 20, .slab_bytes = 64 << 10, .is_durable = true};
    snprintf(fx.dir, sizeof fx.dir, "%s", dir);
    pfx_open(&fx, p);
    for (int r = 0; r < 3; r++) assert_int_equal(put_range(fx.tier, p, 10 * (uint32_t)r, 4, 4 * r), MN_OK);
    static const char *const files[] = {"mnemo.db", "mnemo.db-wal", "slab-00000.dat"};
    test_expect_private(dir, files, 3); /* while open: the WAL is there */
    pfx_close(&fx);
    test_expect_private(dir, files, 1);
}

/* The tier's directory is made 0700 and every file in it 0600, whatever
 * the umask (022, the usual one that made mnemo.db 0644, and 0277, which
 * takes even the owner's write bit): the database, its WAL, the slabs,
 * and the directory of a tier without a store. A directory and database
 * left readable by an earlier mnemo are tightened when opened. */
static void test_disk_dir_private(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 16, MN_TYPE_F16), MN_OK);
    mode_t old = umask(022);
    char base[64], dir[128];
    strcpy(base, "/tmp/mnemo-private-XXXXXX");
    assert_non_null(mkdtemp(base));
    static const mode_t masks[] = {022, 0277, 0};
    for (int m = 0; m < 3; m++) {
        umask(masks[m]);
        snprintf(dir, sizeof dir, "%s/tier%d", base, m); /* missing: made by store_open */
        open_and_fill(dir, &p);
        test_rm_dir(dir);
    }
    /* without a store, tier_disk_new makes the directory */
    umask(022);
    snprintf(dir, sizeof dir, "%s/bare", base);
    TierDiskConfig cfg = {.dir = dir, .capacity_bytes = 1 << 20, .n_layer = p.n_layer, .block_bytes = p.block_bytes,
                          .kv_format = 1 | (uint32_t)p.block_tokens << 8, .slab_bytes = 64 << 10};
    Tier *t = NULL;
    MnErr err = {0};
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_OK);
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
    static const char *const slab[] = {"slab-00000.dat"};
    test_expect_private(dir, slab, 1);
    tier_free(t);
    test_rm_dir(dir);
    /* an earlier mnemo's 0755 directory and 0644 database: made private */
    snprintf(dir, sizeof dir, "%s/old", base);
    open_and_fill(dir, &p);
    char db[160];
    snprintf(db, sizeof db, "%s/mnemo.db", dir);
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(chmod(db, 0644), 0);
    open_and_fill(dir, &p);
    test_rm_dir(dir);
    rmdir(base);
    umask(old);
    kvpool_deinit(&p);
}

/* Open dir as a server would (store, then tier) and as a tier alone:
 * both must refuse it with MN_EINVAL and a message naming `names` and
 * saying `fix`. */
static void expect_refused(const char *dir, const KvPool *p, const char *names, const char *fix) {
    StoreIdentity id = pool_identity(p);
    CacheStore *s = (CacheStore *)1;
    MnErr err = {0};
    assert_int_equal(store_open(dir, &id, &s, &err), MN_EINVAL);
    assert_null(s);
    if (strstr(err.msg, names) == NULL || strstr(err.msg, fix) == NULL)
        fail_msg("store_open: \"%s\" names no %s or no \"%s\"", err.msg, names, fix);
    TierDiskConfig cfg = {.dir = dir, .capacity_bytes = 1 << 20, .n_layer = p->n_layer, .block_bytes = p->block_bytes,
                          .kv_format = 1 | (uint32_t)p->block_tokens << 8};
    Tier *t = (Tier *)1;
    memset(&err, 0, sizeof err);
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_EINVAL);
    assert_null(t);
    if (strstr(err.msg, names) == NULL || strstr(err.msg, fix) == NULL)
        fail_msg("tier_disk_new: \"%s\" names no %s or no \"%s\"", err.msg, names, fix);
}

/* A tier directory that other users can write (group, others, the sticky
 * /tmp kind) is refused, and left as it was; so is one owned by another
 * user, a database or slab owned by another user, and a symlink where a
 * cache file belongs. */
static void test_disk_dir_refused(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 16, MN_TYPE_F16), MN_OK);
    char dir[64], path[128];
    strcpy(dir, "/tmp/mnemo-refused-XXXXXX");
    assert_non_null(mkdtemp(dir));
    static const mode_t loose[] = {0770, 0720, 0702, 01777};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(chmod(dir, loose[i]), 0);
        expect_refused(dir, &p, dir, "chmod 700");
        struct stat st;
        assert_int_equal(stat(dir, &st), 0);
        assert_int_equal(st.st_mode & 07777, loose[i]); /* not tightened behind the operator's back */
        snprintf(path, sizeof path, "%s/mnemo.db", dir);
        assert_int_equal(access(path, F_OK), -1); /* nothing made in it */
    }
    assert_int_equal(chmod(dir, 0700), 0);
    open_and_fill(dir, &p);
    /* a symlink where the database or a slab belongs */
    static const char *const names[] = {"mnemo.db", "slab-00000.dat"};
    for (int i = 0; i < 2; i++) {
        char moved[160];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(moved, sizeof moved, "%s.real", path);
        assert_int_equal(rename(path, moved), 0);
        assert_int_equal(symlink(moved, path), 0);
        expect_refused(dir, &p, path, "not a regular file");
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rename(moved, path), 0);
    }
    if (geteuid() == 0) { /* another owner: only root can make one */
        assert_int_equal(chown(dir, 65534, 65534), 0);
        expect_refused(dir, &p, dir, "belongs to uid 65534");
        assert_int_equal(chown(dir, 0, 0), 0);
        snprintf(path, sizeof path, "%s/slab-00000.dat", dir);
        assert_int_equal(chown(path, 65534, 65534), 0);
        expect_refused(dir, &p, path, "belongs to uid 65534");
        assert_int_equal(chown(path, 0, 0), 0);
    } else {
        fprintf(stderr, "(not root: the foreign-owner cases are skipped)\n");
    }
    open_and_fill(dir, &p); /* fine again */
    test_rm_dir(dir);
    kvpool_deinit(&p);
}

/* Blocks ids first.. of a run in namespace ns (NULL: not known), each
 * filled with the byte `fill` in every layer: a pattern a raw look at the
 * slab files can find. */
static void put_marked(Tier *t, KvPool *p, uint32_t first, int n, const Hash128 *ns, uint8_t fill) {
    Hash128 h[16];
    int32_t slots[16];
    for (int i = 0; i < n; i++) {
        h[i] = h_of(first + (uint32_t)i);
        slots[i] = i;
        for (int l = 0; l < p->n_layer; l++) memset(kvpool_k(p, l, i), fill, p->block_bytes);
    }
    TierRunInfo info = {.ns_id = ns};
    assert_int_equal(tier_put_run(t, h, n, p, slots, &info), MN_OK);
}

static void expect_marked(Tier *t, KvPool *p, uint32_t first, int n, uint8_t fill) {
    uint8_t want[4096];
    assert_true(p->block_bytes <= sizeof want);
    memset(want, fill, p->block_bytes);
    for (int i = 0; i < n; i++) {
        Hash128 h = h_of(first + (uint32_t)i);
        for (int l = 0; l < p->n_layer; l++) {
            assert_int_equal(tier_read_layer(t, &h, 1, l, p, &(int32_t){8}), MN_OK);
            assert_memory_equal(kvpool_k(p, l, 8), want, p->block_bytes);
        }
    }
}

/* Whether a slab file of dir holds 64 bytes of `fill`. */
static bool slabs_hold(const char *dir, uint8_t fill) {
    uint8_t pat[64];
    memset(pat, fill, sizeof pat);
    return test_dir_contains(dir, "slab-", pat, sizeof pat);
}

/* Whether mnemo.db or its WAL holds text. */
static bool db_holds(const char *dir, const char *text) {
    return test_dir_contains(dir, "mnemo.db", text, strlen(text));
}

static void put_reply(CacheStore *s, const Hash128 *ns, const char *text, int32_t id) {
    Hash128 key = hash128(text, strlen(text));
    assert_int_equal(store_reply_put(s, ns, &key, text, strlen(text), &id, 1, 1000 + id), MN_OK);
}

enum { MARK_A = 0xa7, MARK_B = 0x5c, MARK_OLD = 0xe1 };
static const char TEXT_A[] = "the reply of tenant A, secret", TEXT_B[] = "the reply of tenant B, kept",
                  TEXT_OLD[] = "a reply stored before namespaces were", KEY_A[] = "key-of-tenant-a";

/* A new directory (store and tier open) with tenants A and B: runs (and
 * a run of A dropped before, its bytes still in the slab), reply memory
 * and conversations of each, plus a run and a reply of no known
 * namespace. */
static void tenants_new(PFix *fx, KvPool *p) {
    assert_int_equal(kvpool_init(p, 3, 8, 4, 16, MN_TYPE_F16), MN_OK);
    pfx_new(fx, &P_DISK_URING, p, 1 << 20, 64 << 10);
    Hash128 a = index_namespace_id(KEY_A), b = index_namespace_id("key-of-tenant-b");
    put_marked(fx->tier, p, 1, 4, &a, MARK_A);
    put_marked(fx->tier, p, 5, 2, &a, MARK_A);
    put_marked(fx->tier, p, 10, 4, &b, MARK_B);
    put_marked(fx->tier, p, 20, 2, NULL, MARK_OLD);
    put_marked(fx->tier, p, 30, 3, &a, MARK_A);
    Hash128 h = h_of(30);
    assert_int_equal(tier_drop_run(fx->tier, &h), MN_OK); /* evicted, say: its row goes, its bytes stay */
    put_reply(fx->store, &a, TEXT_A, 1);
    put_reply(fx->store, &b, TEXT_B, 2);
    put_reply(fx->store, NULL, TEXT_OLD, 3);
    assert_int_equal(store_conv_put(fx->store, 41, &a, 100, 64), MN_OK);
    assert_int_equal(store_conv_put(fx->store, 42, &b, 100, 64), MN_OK);
}

/* A budget larger than the directory's filesystem has room for is cut to
 * fit (with a warning) when the tier opens, instead of failing writes
 * once the slabs fill the disk: 2^60 bytes (1 EiB) is more than any
 * filesystem here. A budget that fits is kept as given. */
static void test_disk_budget_over_free_space(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 16, MN_TYPE_F16), MN_OK);
    char dir[64];
    strcpy(dir, "/tmp/mnemo-space-XXXXXX");
    assert_non_null(mkdtemp(dir));
    TierDiskConfig cfg = {.dir = dir, .capacity_bytes = 1ull << 60, .n_layer = p.n_layer, .block_bytes = p.block_bytes,
                          .kv_format = 1 | (uint32_t)p.block_tokens << 8, .is_clamped_to_room = true};
    Tier *t = NULL;
    MnErr err = {0};
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_OK);
    TierStats st;
    tier_stats(t, &st);
    struct statvfs vfs;
    assert_int_equal(statvfs(dir, &vfs), 0);
    uint64_t total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
    if (!(st.capacity_bytes > 0 && st.capacity_bytes < total))
        fail_msg("a 1 EiB budget became %llu bytes on a filesystem of %llu", (unsigned long long)st.capacity_bytes,
                 (unsigned long long)total);
    tier_free(t);
    cfg.capacity_bytes = 1 << 20;
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_OK);
    tier_stats(t, &st);
    assert_int_equal(st.capacity_bytes, 1 << 20);
    tier_free(t);
    test_rm_dir(dir);
    kvpool_deinit(&p);
}

/* mnemo cache purge, namespace A: afterwards A's runs are not held, and
 * neither their KV bytes (nor those of A's earlier, dropped run) nor A's
 * reply text are anywhere in the slab, database or WAL files; B's runs
 * still read back exact, its reply and conversation are kept. What has no
 * known namespace goes with any purge. Then --all leaves nothing: slab
 * data areas all zero, no reply text. */
static void test_disk_purge(void **state) {
    KvPool p;
    PFix fx;
    tenants_new(&fx, &p);
    pfx_close(&fx);
    /* the raw look finds them before */
    assert_true(slabs_hold(fx.dir, MARK_A));
    assert_true(slabs_hold(fx.dir, MARK_OLD));
    assert_true(db_holds(fx.dir, TEXT_A));
    assert_true(db_holds(fx.dir, TEXT_OLD));

    PurgeReport r;
    MnErr err = {0};
    int rc = purge_disk_tier(fx.dir, KEY_A, &r, &err);
    if (rc != MN_OK) fail_msg("purge: %s", err.msg);
    assert_int_equal(r.n_runs, 3); /* A's two, and the one of no namespace */
    assert_int_equal(r.n_blocks, 8);
    assert_int_equal(r.n_replies, 2);
    assert_int_equal(r.n_convs, 1);
    assert_true(r.n_zeroed_bytes >= 3ull * 3 * 4096); /* three runs' extents at least, of 3 layers */
    assert_false(slabs_hold(fx.dir, MARK_A));
    assert_false(slabs_hold(fx.dir, MARK_OLD));
    assert_true(slabs_hold(fx.dir, MARK_B));
    assert_false(db_holds(fx.dir, TEXT_A));
    assert_false(db_holds(fx.dir, TEXT_OLD));
    assert_true(db_holds(fx.dir, TEXT_B));
    static const char *const files[] = {"mnemo.db", "slab-00000.dat"};
    test_expect_private(fx.dir, files, 2);

    pfx_open(&fx, &p);
    expect_held(fx.tier, 1, 6, false);
    expect_held(fx.tier, 20, 2, false);
    expect_held(fx.tier, 10, 4, true);
    expect_marked(fx.tier, &p, 10, 4, MARK_B);
    int64_t n = -1;
    assert_int_equal(store_reply_count(fx.store, &n), MN_OK);
    assert_int_equal(n, 1);
    assert_int_equal(store_conv_count(fx.store, &n), MN_OK);
    assert_int_equal(n, 1);
    pfx_close(&fx);

    /* again, nothing of A is left to purge */
    assert_int_equal(purge_disk_tier(fx.dir, KEY_A, &r, &err), MN_OK);
    assert_int_equal(r.n_runs + r.n_replies + r.n_convs, 0);
    /* every namespace */
    assert_int_equal(purge_disk_tier(fx.dir, NULL, &r, &err), MN_OK);
    assert_int_equal(r.n_runs, 1);
    assert_int_equal(r.n_replies, 1);
    assert_int_equal(r.n_convs, 1);
    assert_false(slabs_hold(fx.dir, MARK_B));
    assert_false(db_holds(fx.dir, TEXT_B));
    char path[128];
    snprintf(path, sizeof path, "%s/slab-00000.dat", fx.dir);
    size_t len = 0;
    uint8_t *slab = (uint8_t *)test_read_file(path, &len);
    assert_non_null(slab);
    assert_true(len > 4096);
    for (size_t i = 4096; i < len; i++)
        if (slab[i] != 0) fail_msg("byte %zu of %s is %#x after purging everything", i, path, slab[i]);
    free(slab);
    pfx_open(&fx, &p);
    TierStats st;
    tier_stats(fx.tier, &st);
    assert_int_equal(st.n_runs, 0);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* A purge on a directory a server holds (its store open) is refused with
 * MN_EBUSY and a message that says to stop the server; nothing changed. */
static void test_disk_purge_busy(void **state) {
    KvPool p;
    PFix fx;
    tenants_new(&fx, &p);
    PurgeReport r;
    MnErr err = {0};
    assert_int_equal(purge_disk_tier(fx.dir, KEY_A, &r, &err), MN_EBUSY);
    assert_non_null(strstr(err.msg, fx.dir));
    assert_non_null(strstr(err.msg, "stop the server"));
    assert_non_null(strstr(err.msg, "nothing was changed"));
    expect_held(fx.tier, 1, 6, true); /* the holder goes on */
    expect_marked(fx.tier, &p, 1, 4, MARK_A);
    pfx_reopen(&fx, &p);
    expect_held(fx.tier, 1, 6, true);
    int64_t n = -1;
    assert_int_equal(store_reply_count(fx.store, &n), MN_OK);
    assert_int_equal(n, 3);
    pfx_close(&fx);
    assert_true(slabs_hold(fx.dir, MARK_A));
    assert_true(db_holds(fx.dir, TEXT_A));
    /* no cache there at all */
    char empty[128];
    snprintf(empty, sizeof empty, "%s/none", fx.dir);
    assert_int_equal(purge_disk_tier(empty, NULL, &r, &err), MN_ENOTFOUND);
    assert_int_equal(mkdir(empty, 0700), 0);
    assert_int_equal(purge_disk_tier(empty, NULL, &r, &err), MN_ENOTFOUND);
    assert_non_null(strstr(err.msg, "mnemo.db"));
    assert_int_equal(rmdir(empty), 0);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disk_dir_private),
        cmocka_unit_test(test_disk_dir_refused),
        cmocka_unit_test(test_disk_budget_over_free_space),
        cmocka_unit_test(test_disk_purge),
        cmocka_unit_test(test_disk_purge_busy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
