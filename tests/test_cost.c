/* test_cost.c — the recompute cost model: interpolation and extrapolation,
 * monotonicity, validation, the profile file (round trip, another model or
 * machine ignored, truncated and corrupt files rejected), and profiling the
 * stories260K model. Nothing here depends on absolute timings. */
#include "test_util.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/mem.h"
#include "base/version.h"
#include "cache/cost.h"
#include "engine/profile.h"
#include "model/model.h"

/* ---- helpers -------------------------------------------------------------- */

static CostKey test_key(void) {
    CostKey k;
    Hash128 fp = hash128("model", 5);
    cost_key_init(&k, &fp, 4, 32, MN_TYPE_F16);
    return k;
}

static CostModel sample_model(void) {
    CostKey key = test_key();
    const int32_t ctx[] = {64, 128, 256, 480};
    const double attn[] = {1e-6, 3e-6, 3e-6, 7.25e-6};
    CostModel cm;
    MnErr err;
    if (cost_init(&cm, &key, 1.0 / 3.0, ctx, attn, 4, &err)) fail_msg("%s", err.msg);
    return cm;
}

typedef struct TmpDir {
    char dir[64];
    char path[128];
} TmpDir;

static void tmp_open(TmpDir *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/mnemo_test_cost_XXXXXX");
    assert_non_null(mkdtemp(t->dir));
    snprintf(t->path, sizeof t->path, "%s/cost.profile", t->dir);
}

static void tmp_close(TmpDir *t) {
    unlink(t->path);
    assert_int_equal(rmdir(t->dir), 0); /* also proves no temporary file is left */
}

static void write_bytes(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static bool close_to(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(a) + fabs(b)) + 1e-300; }

static void assert_models_equal(const CostModel *a, const CostModel *b) {
    assert_true(cost_key_eq(&a->key, &b->key));
    assert_true(a->tok_sec == b->tok_sec); /* bit-exact through %.17g */
    assert_int_equal(a->n_knots, b->n_knots);
    for (int i = 0; i < a->n_knots; i++) {
        assert_int_equal(a->knot_ctx[i], b->knot_ctx[i]);
        assert_true(a->knot_attn_sec[i] == b->knot_attn_sec[i]);
    }
}

/* Replace the body of a valid file (everything before the checksum line)
 * and give it a correct checksum, to test what the checksum cannot catch. */
static void write_with_checksum(const char *path, const char *body) {
    char hex[33], text[4096];
    Hash128 h = hash128(body, strlen(body));
    hash128_hex(&h, hex);
    snprintf(text, sizeof text, "%schecksum %s\n", body, hex);
    write_bytes(path, text, strlen(text));
}

/* ---- interpolation -------------------------------------------------------- */

static void test_interpolation(void **state) {
    (void)state;
    CostModel cm = sample_model();
    /* below the first knot: the line through (0, 0) */
    assert_true(cost_attn_per_token(&cm, 0) == 0);
    assert_true(cost_attn_per_token(&cm, -10) == 0);
    assert_true(cost_attn_per_token(&cm, NAN) == 0);
    assert_true(close_to(cost_attn_per_token(&cm, 32), 0.5e-6));
    /* at and between knots */
    assert_true(close_to(cost_attn_per_token(&cm, 64), 1e-6));
    assert_true(close_to(cost_attn_per_token(&cm, 96), 2e-6));
    assert_true(close_to(cost_attn_per_token(&cm, 128), 3e-6));
    assert_true(close_to(cost_attn_per_token(&cm, 200), 3e-6));
    assert_true(close_to(cost_attn_per_token(&cm, 368), 5.125e-6));
    assert_true(close_to(cost_attn_per_token(&cm, 480), 7.25e-6));
    /* above the last knot: proportional to the context */
    assert_true(close_to(cost_attn_per_token(&cm, 960), 14.5e-6));
    /* a block's cost */
    assert_true(close_to(cost_block(&cm, 0), 32.0 / 3.0));
    assert_true(close_to(cost_block(&cm, 96), 32.0 * (1.0 / 3.0 + 2e-6)));

    /* No knots: attention is free, every block costs the same. */
    CostKey key = test_key();
    CostModel flat;
    assert_int_equal(cost_init(&flat, &key, 1e-5, NULL, NULL, 0, NULL), MN_OK);
    assert_true(cost_attn_per_token(&flat, 5000) == 0);
    assert_true(close_to(cost_block(&flat, 5000), 32e-5));

    /* A linear model is reproduced exactly at every context, in and beyond
     * the knots. */
    CostModel lin;
    assert_int_equal(cost_init_linear(&lin, &key, 2e-5, 3e-9, 4096, NULL), MN_OK);
    assert_int_equal(lin.n_knots, 13); /* 1, 2, ..., 4096 */
    for (int c = 0; c <= 20000; c += 37) assert_true(close_to(cost_attn_per_token(&lin, c), 3e-9 * c));
}

static void test_monotonic(void **state) {
    (void)state;
    uint64_t s = 99;
    CostKey key = test_key();
    for (int round = 0; round < 50; round++) {
        int32_t ctx[COST_MAX_KNOTS];
        double attn[COST_MAX_KNOTS];
        int n = 1 + round % COST_MAX_KNOTS;
        int32_t c = 0;
        double a = 0;
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            c += 1 + (int32_t)((s >> 33) % 500);
            a += (double)((s >> 20) % 1000) * 1e-9 * (round % 3 == 0 ? 0 : 1); /* some flat */
            ctx[i] = c;
            attn[i] = a;
        }
        CostModel cm;
        assert_int_equal(cost_init(&cm, &key, 1e-5, ctx, attn, n, NULL), MN_OK);
        double prev_a = -1, prev_b = -1;
        for (int p = 0; p < c * 2 + 100; p += 7) {
            double av = cost_attn_per_token(&cm, p), bv = cost_block(&cm, p);
            assert_true(isfinite(av) && isfinite(bv) && bv > 0);
            assert_true(av >= prev_a);
            assert_true(bv >= prev_b);
            prev_a = av;
            prev_b = bv;
        }
    }
}

static void test_validation(void **state) {
    (void)state;
    CostKey key = test_key();
    CostModel cm = sample_model();
    CostModel before = cm;
    MnErr err = {0};
    const int32_t up[] = {64, 128}, flat[] = {64, 64}, zero[] = {0, 64};
    const double ok[] = {1e-6, 2e-6}, neg[] = {1e-6, -1e-6}, nan2[] = {NAN, 1e-6}, inf2[] = {1e-6, INFINITY};
    assert_int_equal(cost_init(&cm, &key, 1e-5, flat, ok, 2, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "knot 1"));
    assert_int_equal(cost_init(&cm, &key, 1e-5, zero, ok, 2, NULL), MN_EINVAL);
    assert_int_equal(cost_init(&cm, &key, 1e-5, up, neg, 2, NULL), MN_EINVAL);
    assert_int_equal(cost_init(&cm, &key, 1e-5, up, nan2, 2, NULL), MN_EINVAL);
    assert_int_equal(cost_init(&cm, &key, 1e-5, up, inf2, 2, NULL), MN_EINVAL);
    assert_int_equal(cost_init(&cm, &key, 0, up, ok, 2, NULL), MN_EINVAL);
    assert_int_equal(cost_init(&cm, &key, NAN, up, ok, 2, NULL), MN_EINVAL);
    assert_int_equal(cost_init(&cm, &key, 1e-5, up, ok, -1, NULL), MN_EINVAL);
    assert_int_equal(cost_init(&cm, &key, 1e-5, up, ok, COST_MAX_KNOTS + 1, NULL), MN_EINVAL);
    CostKey bad = key;
    bad.block_tokens = 0;
    assert_int_equal(cost_init(&cm, &bad, 1e-5, up, ok, 2, NULL), MN_EINVAL);
    bad = key;
    snprintf(bad.cpu, sizeof bad.cpu, "two\nlines");
    assert_int_equal(cost_init(&cm, &bad, 1e-5, up, ok, 2, NULL), MN_EINVAL);
    bad = key;
    snprintf(bad.build, sizeof bad.build, "0.1\n+x");
    assert_int_equal(cost_init(&cm, &bad, 1e-5, up, ok, 2, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "build"));
    memset(bad.build, 'a', sizeof bad.build); /* not terminated */
    assert_int_equal(cost_init(&cm, &bad, 1e-5, up, ok, 2, NULL), MN_EINVAL);
    assert_int_equal(cost_init(&cm, NULL, 1e-5, up, ok, 2, NULL), MN_EINVAL); /* zero key: no block size */
    assert_models_equal(&cm, &before); /* failures leave the output alone */
}

static void test_key_init(void **state) {
    (void)state;
    CostKey a = test_key(), b = test_key();
    assert_true(cost_key_eq(&a, &b));
    assert_true(strlen(a.cpu) > 0);
    for (const char *c = a.cpu; *c; c++) assert_true(*c >= 0x20 && *c < 0x7f);
    assert_true(a.n_cpus > 0);
    assert_int_equal(a.n_threads, 4);
    assert_int_equal(a.block_tokens, 32);
    assert_int_equal(a.kv_type, MN_TYPE_F16);
    b.n_threads = 2;
    assert_false(cost_key_eq(&a, &b));
    b = a;
    b.model.b[15] ^= 1;
    assert_false(cost_key_eq(&a, &b));
    b = a;
    b.cpu[0] ^= 1;
    assert_false(cost_key_eq(&a, &b));
    b = a;
    b.kv_type = MN_TYPE_F32;
    assert_false(cost_key_eq(&a, &b));
    /* the build that measured it: its own, as "VERSION+COMMIT" */
    char build[COST_BUILD_LEN];
    snprintf(build, sizeof build, "%s+%s", MNEMO_VERSION, mn_build_commit());
    assert_string_equal(a.build, build);
    b = a;
    b.build[strlen(b.build) - 1] ^= 1;
    assert_false(cost_key_eq(&a, &b));
}

/* ---- the profile file ----------------------------------------------------- */

/* Keys that differ in any field name different files; equal keys the same. */
static void test_key_file_name(void **state) {
    (void)state;
    CostKey keys[7];
    for (int i = 0; i < 7; i++) keys[i] = test_key();
    keys[1].model.b[15] ^= 1;
    keys[2].n_threads = 2;
    keys[3].block_tokens = 16;
    keys[4].kv_type = MN_TYPE_F32;
    keys[5].cpu[0] ^= 1;
    keys[6].n_cpus += 1;
    char names[7][COST_FILE_NAME_LEN + 1];
    for (int i = 0; i < 7; i++) {
        names[i][COST_FILE_NAME_LEN] = '\0';
        cost_key_file_name(&keys[i], names[i], COST_FILE_NAME_LEN);
        assert_true(strlen(names[i]) < COST_FILE_NAME_LEN - 1); /* not cut short */
        assert_int_equal(strncmp(names[i], "cost-", 5), 0);
        assert_null(strchr(names[i], '/'));
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0) fail_msg("keys %d and %d share %s", i, j, names[i]);
    }
    CostKey again = test_key();
    char name[COST_FILE_NAME_LEN];
    cost_key_file_name(&again, name, sizeof name);
    assert_string_equal(name, names[0]);
    assert_non_null(strstr(name, "-t4-b32-f16-"));
}

static void test_file_round_trip(void **state) {
    (void)state;
    TmpDir t;
    tmp_open(&t);
    CostModel cm = sample_model(), got;
    MnErr err = {0};
    assert_int_equal(cost_save(&cm, t.path, &err), MN_OK);
    memset(&got, 0, sizeof got);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_OK);
    assert_models_equal(&cm, &got);
    assert_int_equal(cost_load(t.path, NULL, &got, &err), MN_OK); /* any key */
    assert_models_equal(&cm, &got);

    /* Overwriting replaces the file (no knots this time). */
    CostModel flat;
    assert_int_equal(cost_init(&flat, &cm.key, 2e-5, NULL, NULL, 0, NULL), MN_OK);
    assert_int_equal(cost_save(&flat, t.path, &err), MN_OK);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_OK);
    assert_models_equal(&flat, &got);

    /* An invalid model is not written. */
    CostModel bad = cm;
    bad.tok_sec = -1;
    assert_int_equal(cost_save(&bad, t.path, &err), MN_EINVAL);
    /* An unwritable place fails cleanly. */
    assert_int_equal(cost_save(&cm, "/nonexistent-dir/x/cost.profile", &err), MN_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir"));
    tmp_close(&t);
}

static void test_file_other_key_ignored(void **state) {
    (void)state;
    TmpDir t;
    tmp_open(&t);
    CostModel cm = sample_model(), got = sample_model(), untouched = got;
    assert_int_equal(cost_save(&cm, t.path, NULL), MN_OK);
    CostKey other = cm.key;
    other.model = hash128("another model", 13);
    MnErr err = {0};
    assert_int_equal(cost_load(t.path, &other, &got, &err), MN_ENOTFOUND);
    assert_non_null(strstr(err.msg, "another model, machine or build"));
    other = cm.key;
    other.n_threads = 8;
    assert_int_equal(cost_load(t.path, &other, &got, NULL), MN_ENOTFOUND);
    other = cm.key;
    snprintf(other.cpu, sizeof other.cpu, "Some Other CPU");
    assert_int_equal(cost_load(t.path, &other, &got, NULL), MN_ENOTFOUND);
    other = cm.key;
    other.block_tokens = 16;
    assert_int_equal(cost_load(t.path, &other, &got, NULL), MN_ENOTFOUND);
    /* another build of mnemo (new kernels) measures again */
    other = cm.key;
    snprintf(other.build, sizeof other.build, "0.0.1+0123456789ab");
    err = (MnErr){0};
    assert_int_equal(cost_load(t.path, &other, &got, &err), MN_ENOTFOUND);
    assert_non_null(strstr(err.msg, cm.key.build)); /* the log says which build measured it */
    assert_models_equal(&got, &untouched);
    /* no file at all */
    unlink(t.path);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_ENOTFOUND);
    tmp_close(&t);
}

static void test_file_corrupt_rejected(void **state) {
    (void)state;
    TmpDir t;
    tmp_open(&t);
    CostModel cm = sample_model(), got;
    assert_int_equal(cost_save(&cm, t.path, NULL), MN_OK);
    size_t len = 0;
    char *good = test_read_file(t.path, &len);
    assert_non_null(good);
    assert_true(len > 100);
    MnErr err = {0};

    /* Every truncation. */
    for (size_t n = 0; n < len; n++) {
        write_bytes(t.path, good, n);
        assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);
    }
    /* Every single-byte change (a flipped bit) is caught. */
    char *bad = malloc(len);
    assert_non_null(bad);
    for (size_t i = 0; i < len; i++) {
        memcpy(bad, good, len);
        bad[i] ^= 0x04;
        write_bytes(t.path, bad, len);
        int rc = cost_load(t.path, &cm.key, &got, &err);
        if (rc != MN_EFORMAT) fail_msg("byte %zu changed: load returned %d (%s)", i, rc, err.msg);
    }
    /* Extra bytes after the checksum line. */
    memcpy(bad, good, len);
    write_bytes(t.path, good, len);
    FILE *f = fopen(t.path, "ab");
    fputs("x\n", f);
    fclose(f);
    assert_int_equal(cost_load(t.path, &cm.key, &got, NULL), MN_EFORMAT);
    /* Binary junk and a too-large file. */
    write_bytes(t.path, "\0\1\2\3checksum 00000000000000000000000000000000\n", 46);
    assert_int_equal(cost_load(t.path, &cm.key, &got, NULL), MN_EFORMAT);
    char *big = calloc(70000, 1);
    memset(big, 'a', 70000);
    write_bytes(t.path, big, 70000);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);
    free(big);

    /* Checksummed but wrong: another format version, a bad value, a
     * missing line, knots out of order. */
    char body[4096];
    size_t body_len = (size_t)(strstr(good, "checksum ") - good);
    memcpy(body, good, body_len);
    body[body_len] = '\0';
    char edited[4096];
    snprintf(edited, sizeof edited, "%s", body);
    edited[strlen("mnemo-cost-profile ")] = '9';
    write_with_checksum(t.path, edited);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);
    assert_non_null(strstr(err.msg, "version"));

    snprintf(edited, sizeof edited, "%s", body);
    char *p = strstr(edited, "tok_sec ");
    memcpy(p + 8, "-1.0000", 7);
    write_with_checksum(t.path, edited);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);

    snprintf(edited, sizeof edited, "%s", body);
    p = strstr(edited, "n_cpus ");
    char *eol = strchr(p, '\n');
    memmove(p, eol + 1, strlen(eol + 1) + 1);
    write_with_checksum(t.path, edited);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);
    assert_non_null(strstr(err.msg, "n_cpus"));

    /* the build line: too long for CostKey.build, or not printable */
    snprintf(edited, sizeof edited, "%s", body);
    p = strstr(edited, "build ") + 6;
    eol = strchr(p, '\n');
    char tail[4096];
    snprintf(tail, sizeof tail, "%s", eol);
    snprintf(p, sizeof edited - (size_t)(p - edited), "%0*d%s", COST_BUILD_LEN, 7, tail);
    write_with_checksum(t.path, edited);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);
    assert_non_null(strstr(err.msg, "too long"));
    snprintf(edited, sizeof edited, "%s", body);
    p = strstr(edited, "build ") + 6;
    p[0] = '\t';
    write_with_checksum(t.path, edited);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);
    assert_non_null(strstr(err.msg, "build"));

    snprintf(edited, sizeof edited, "%s", body);
    p = strstr(edited, "knot 128 ");
    memcpy(p, "knot 028 ", 9); /* 28 < 64 */
    write_with_checksum(t.path, edited);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);

    snprintf(edited, sizeof edited, "%s", body);
    p = strstr(edited, "knots 4");
    p[6] = '5'; /* more knots announced than present */
    write_with_checksum(t.path, edited);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_EFORMAT);

    /* The unedited body still loads: the edits above were the only faults. */
    write_with_checksum(t.path, body);
    assert_int_equal(cost_load(t.path, &cm.key, &got, &err), MN_OK);
    assert_models_equal(&cm, &got);

    free(bad);
    free(good);
    tmp_close(&t);
}

/* ---- profiling ------------------------------------------------------------ */

static void test_profile_stories(void **state) {
    (void)state;
    char path[512];
    test_data_path(path, sizeof path, "models/stories260K.gguf");
    if (!test_require_file(path)) return;
    Model *m = NULL;
    MnErr err = {0};
    if (model_load(path, &m, &err)) fail_msg("%s", err.msg);

    ProfileOptions o;
    profile_options_default(&o);
    o.n_threads = 2;
    o.budget_sec = 0.5;
    CostModel cm;
    /* how long it took is the machine's business; that the budget bounds
     * the contexts measured is checked below, with none and with plenty */
    if (profile_measure(m, &o, &cm, &err)) fail_msg("%s", err.msg);
    cost_dump(&cm);
    assert_int_equal(cost_validate(&cm, NULL), MN_OK);
    assert_true(hash128_eq(&cm.key.model, &m->fingerprint));
    assert_int_equal(cm.key.block_tokens, 32);
    assert_int_equal(cm.key.n_threads, 2);
    assert_true(isfinite(cm.tok_sec) && cm.tok_sec > 0);
    /* The contexts measured are a prefix of 64, 128, ..., and the last
     * block that fits the model's context. */
    int cap = m->cfg.n_ctx < o.max_ctx ? m->cfg.n_ctx : o.max_ctx;
    assert_true(cap >= 256);
    assert_true(cm.n_knots >= 1);
    for (int i = 0; i < cm.n_knots; i++) {
        int32_t want = 64 << i;
        if (want > cap - 32) want = cap - 32; /* 480 for stories260K's 512 */
        assert_int_equal(cm.knot_ctx[i], want);
    }
    double prev = 0;
    for (int p = 0; p < 4 * cap; p += 32) {
        double c = cost_block(&cm, p);
        assert_true(isfinite(c) && c > 0);
        assert_true(c >= prev); /* monotonic by construction */
        prev = c;
    }

    /* Cached across restarts: the second call loads what the first saved. */
    TmpDir t;
    tmp_open(&t);
    CostModel a, b;
    bool loaded = true;
    if (profile_load_or_measure(m, &o, t.path, &a, &loaded, &err)) fail_msg("%s", err.msg);
    assert_false(loaded);
    if (profile_load_or_measure(m, &o, t.path, &b, &loaded, &err)) fail_msg("%s", err.msg);
    assert_true(loaded);
    assert_models_equal(&a, &b);
    /* Another thread count is another machine set-up: measured again. */
    o.n_threads = 1;
    if (profile_load_or_measure(m, &o, t.path, &b, &loaded, &err)) fail_msg("%s", err.msg);
    assert_false(loaded);
    assert_int_equal(b.key.n_threads, 1);
    tmp_close(&t);

    /* Bad options are refused. */
    profile_options_default(&o);
    o.block_tokens = 0;
    assert_int_equal(profile_measure(m, &o, &cm, &err), MN_EINVAL);
    profile_options_default(&o);
    o.max_ctx = 16; /* shorter than one block */
    assert_int_equal(profile_measure(m, &o, &cm, &err), MN_EINVAL);
    profile_options_default(&o);
    o.budget_sec = NAN;
    assert_int_equal(profile_measure(m, &o, &cm, &err), MN_EINVAL);
    profile_options_default(&o);
    o.kv_type = MN_TYPE_Q8_0;
    assert_int_equal(profile_measure(m, &o, &cm, &err), MN_EINVAL);

    /* A zero budget still measures one context. */
    profile_options_default(&o);
    o.budget_sec = 0;
    o.kv_type = MN_TYPE_F32;
    if (profile_measure(m, &o, &cm, &err)) fail_msg("%s", err.msg);
    assert_int_equal(cm.n_knots, 1);
    assert_int_equal(cm.knot_ctx[0], 64);
    assert_int_equal(cm.key.kv_type, MN_TYPE_F32);
    /* A generous budget measures every context up to the cap (the run
     * still ends as soon as they are done), and the cap bounds them. */
    profile_options_default(&o);
    o.budget_sec = 60;
    o.max_ctx = 200;
    o.reps = 1;
    if (profile_measure(m, &o, &cm, &err)) fail_msg("%s", err.msg);
    assert_int_equal(cm.n_knots, 2);
    assert_int_equal(cm.knot_ctx[0], 64);
    assert_int_equal(cm.knot_ctx[1], 128); /* the last block, at 168, lies close above: not measured */
    model_free(m);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interpolation),
        cmocka_unit_test(test_monotonic),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_key_init),
        cmocka_unit_test(test_key_file_name),
        cmocka_unit_test(test_file_round_trip),
        cmocka_unit_test(test_file_other_key_ignored),
        cmocka_unit_test(test_file_corrupt_rejected),
        cmocka_unit_test(test_profile_stories),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
