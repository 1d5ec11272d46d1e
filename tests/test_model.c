/* test_model.c — model_load's checks: a model whose metadata or tensors do
 * not fit together is refused with a message naming the problem, and never
 * half-loaded. Each case rewrites stories260K.gguf with one thing changed. */
#include "test_util.h"

#include <math.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/err.h"
#include "model/gguf.h"
#include "model/model.h"

/* Open stories260K and a writer for its edited copy. */
static GgufWriter *copy_begin(Gguf **g) {
    char path[512];
    test_data_path(path, sizeof path, "models/stories260K.gguf");
    MnErr err = {0};
    assert_int_equal(gguf_open(path, g, &err), MN_OK);
    return gguf_writer_new();
}

/* Write the copy to a temp file and close both; returns its path (static buffer). */
static const char *copy_end(Gguf *g, GgufWriter *w) {
    static char out[64];
    MnErr err = {0};
    snprintf(out, sizeof out, "/tmp/mnemo-model-%d.gguf", (int)getpid());
    assert_int_equal(gguf_writer_write(w, out, &err), MN_OK);
    gguf_writer_free(w);
    gguf_close(g);
    return out;
}

/* Copy stories260K to a temp file, skipping tensor `drop`, replacing the u32
 * KV `key` by `value` (when key is not NULL) and giving tensor `reshape` the
 * dims of `shape_like`. Returns the path (static buffer). */
static const char *variant(const char *drop, const char *key, uint32_t value, const char *reshape,
                           const char *shape_like) {
    Gguf *g = NULL;
    GgufWriter *w = copy_begin(&g);
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        if (key && strcmp(gguf_kv_key(g, i), key) == 0) assert_int_equal(gguf_writer_add_u32(w, key, value), MN_OK);
        else assert_int_equal(gguf_writer_copy_kv(w, g, i), MN_OK);
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const GgufTensor *t = gguf_tensor(g, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        const GgufTensor *shape = t;
        if (reshape && strcmp(t->name, reshape) == 0) shape = gguf_find_tensor(g, shape_like);
        if (shape->n_bytes != t->n_bytes) shape = t; /* only same-size reshapes keep the data valid */
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, shape->n_dims, shape->ne, t->data, t->n_bytes), MN_OK);
    }
    return copy_end(g, w);
}

/* Copy stories260K to a temp file with RoPE scaling keys (scaling NULL:
 * none written), when factors is not NULL a tensor factors_name of
 * n_factors values (rope_freqs.weight, rope_factors_long.weight, ...), and when swa > 0 a sliding window. Returns the path (static buffer). */
static const char *with_keys(const char *scaling, float factor, const char *factors_name, const float *factors,
                             uint64_t n_factors, uint32_t swa) {
    Gguf *g = NULL;
    GgufWriter *w = copy_begin(&g);
    for (int64_t i = 0; i < gguf_n_kv(g); i++) assert_int_equal(gguf_writer_copy_kv(w, g, i), MN_OK);
    if (scaling) {
        assert_int_equal(gguf_writer_add_str(w, "llama.rope.scaling.type", scaling), MN_OK);
        assert_int_equal(gguf_writer_add_f32(w, "llama.rope.scaling.factor", factor), MN_OK);
    }
    if (swa > 0) assert_int_equal(gguf_writer_add_u32(w, "llama.attention.sliding_window", swa), MN_OK);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const GgufTensor *t = gguf_tensor(g, i);
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes), MN_OK);
    }
    if (factors)
        assert_int_equal(gguf_writer_add_tensor(w, factors_name, MN_TYPE_F32, 1, &n_factors, factors,
                                                n_factors * sizeof(float)), MN_OK);
    return copy_end(g, w);
}

static Model *load_ok(const char *path) {
    Model *m = NULL;
    MnErr err = {0};
    if (model_load(path, &m, &err) != MN_OK) fail_msg("%s", err.msg);
    unlink(path);
    return m;
}

static void expect_refused(const char *path, const char *needle) {
    Model *m = (Model *)0x1;
    MnErr err = {0};
    int rc = model_load(path, &m, &err);
    assert_int_not_equal(rc, MN_OK);
    assert_null(m);
    if (strstr(err.msg, needle) == NULL) fail_msg("message '%s' lacks '%s'", err.msg, needle);
    unlink(path);
}

static void test_missing_tensor(void **s) {
    char p[512];
    if (!test_require_file(test_data_path(p, sizeof p, "models/stories260K.gguf"))) return;
    expect_refused(variant("blk.3.ffn_up.weight", NULL, 0, NULL, NULL), "blk.3.ffn_up.weight");
    expect_refused(variant("output_norm.weight", NULL, 0, NULL, NULL), "output_norm.weight");
    expect_refused(variant("token_embd.weight", NULL, 0, NULL, NULL), "token_embd.weight");
}

static void test_inconsistent_metadata(void **s) {
    char p[512];
    if (!test_require_file(test_data_path(p, sizeof p, "models/stories260K.gguf"))) return;
    /* 7 heads do not divide a dimension of 64 */
    expect_refused(variant(NULL, "llama.attention.head_count", 7, NULL, NULL), "inconsistent");
    /* a wrong dimension makes every tensor's shape disagree */
    expect_refused(variant(NULL, "llama.embedding_length", 96, NULL, NULL), "shape");
    /* more layers than the file has */
    expect_refused(variant(NULL, "llama.block_count", 6, NULL, NULL), "blk.5");
    /* RoPE over more dimensions than a head has */
    expect_refused(variant(NULL, "llama.rope.dimension_count", 64, NULL, NULL), "rope");
}

static void test_wrong_shape(void **s) {
    char p[512];
    if (!test_require_file(test_data_path(p, sizeof p, "models/stories260K.gguf"))) return;
    /* the unchanged copy loads */
    const char *path = variant(NULL, NULL, 0, NULL, NULL);
    Model *m = NULL;
    MnErr err = {0};
    assert_int_equal(model_load(path, &m, &err), MN_OK);
    assert_int_equal(m->cfg.n_layer, 5);
    model_free(m);
    unlink(path);
    /* ffn_gate [64, 172] stored with ffn_down's transposed dims [172, 64] */
    expect_refused(variant(NULL, NULL, 0, "blk.2.ffn_gate.weight", "blk.2.ffn_down.weight"), "blk.2.ffn_gate.weight");
}

/* RoPE frequency scaling: linear scaling and per-pair factors change the
 * inverse frequencies as the file says; a scaling mnemo does not run is
 * refused by name, as are factors that are not positive. */
static void test_rope_scaling(void **s) {
    char p[512];
    if (!test_require_file(test_data_path(p, sizeof p, "models/stories260K.gguf"))) return;
    Model *m = load_ok(with_keys(NULL, 0, NULL, NULL, 0, 0));
    const int half = m->cfg.n_rot / 2; /* stories260K: head 8, 4 pairs */
    assert_true(half > 1 && half <= 16);
    double plain[16], got[16];
    model_rope_inv_freq(m, false, 512, plain);
    for (int i = 0; i < half; i++) assert_true(fabs(plain[i] - pow(10000.0, -2.0 * i / m->cfg.n_rot)) < 1e-15);
    assert_null(m->rope_factors);
    model_free(m);

    m = load_ok(with_keys("linear", 4.0f, NULL, NULL, 0, 0));
    model_rope_inv_freq(m, false, 512, got);
    for (int i = 0; i < half; i++) assert_true(got[i] == plain[i] * 0.25);
    model_free(m);

    float factors[16];
    for (int i = 0; i < half; i++) factors[i] = 1.0f + (float)i;
    m = load_ok(with_keys(NULL, 0, "rope_freqs.weight", factors, (uint64_t)half, 0));
    assert_non_null(m->rope_factors);
    model_rope_inv_freq(m, false, 512, got);
    for (int i = 0; i < half; i++) assert_true(got[i] == plain[i] / (double)factors[i]);
    model_free(m);

    expect_refused(with_keys("yarn", 4.0f, NULL, NULL, 0, 0), "RoPE scaling 'yarn'");
    expect_refused(with_keys("longrope", 4.0f, NULL, NULL, 0, 0), "RoPE scaling 'longrope'");
    expect_refused(with_keys("linear", 0.5f, NULL, NULL, 0, 0), "rope.scaling.factor");
    factors[1] = 0.0f;
    expect_refused(with_keys(NULL, 0, "rope_freqs.weight", factors, (uint64_t)half, 0), "rope_freqs.weight[1]");
    expect_refused(with_keys(NULL, 0, "rope_freqs.weight", factors, (uint64_t)half + 1, 0), "rope_freqs.weight");
    factors[1] = 2.0f;
    expect_refused(with_keys(NULL, 0, "rope_factors_long.weight", factors, (uint64_t)half, 0), "rope_factors_short");
}

/* A declared sliding window applies to every layer of a llama file. */
static void test_sliding_window_key(void **s) {
    char p[512];
    if (!test_require_file(test_data_path(p, sizeof p, "models/stories260K.gguf"))) return;
    Model *m = load_ok(with_keys(NULL, 0, NULL, NULL, 0, 0));
    for (int il = 0; il < m->cfg.n_layer; il++) assert_int_equal(m->layers[il].window, 0);
    model_free(m);
    m = load_ok(with_keys(NULL, 0, NULL, NULL, 0, 128));
    assert_int_equal(m->cfg.n_swa, 128);
    for (int il = 0; il < m->cfg.n_layer; il++) assert_int_equal(m->layers[il].window, 128);
    model_free(m);
}

/* Hyper-parameters that would size the model's f32 copies of its norms and
 * biases at gigabytes, in a file of a few hundred kilobytes whose only
 * tensor is an embedding of that width: the loader must refuse it by the
 * tensor it lacks before allocating for tensors it has not found (a GGUF
 * from anywhere must not make mnemo allocate what the file cannot back).
 * Loaded in a child whose address space is capped a gigabyte above what it
 * uses: an allocation of gigabytes fails there (ENOMEM, or under ASan an
 * abort) instead of succeeding lazily as it would on an overcommitting
 * machine. */
static void test_absurd_shape_refused_before_allocating(void **s) {
    (void)s;
    static const uint64_t ne[2] = {65536, 1};
    static uint16_t row[65536]; /* f16 zeros */
    char path[64];
    snprintf(path, sizeof path, "/tmp/mnemo-model-absurd-%d.gguf", (int)getpid());
    GgufWriter *w = gguf_writer_new();
    assert_non_null(w);
    gguf_writer_add_str(w, "general.architecture", "qwen2");
    gguf_writer_add_u32(w, "qwen2.embedding_length", 65536);
    gguf_writer_add_u32(w, "qwen2.block_count", 1024);
    gguf_writer_add_u32(w, "qwen2.attention.head_count", 1024);
    gguf_writer_add_u32(w, "qwen2.attention.head_count_kv", 1024);
    gguf_writer_add_u32(w, "qwen2.attention.key_length", 1024); /* q_dim = kv_dim = 2^20: biases of 12 MiB a layer */
    gguf_writer_add_u32(w, "qwen2.feed_forward_length", 1);
    gguf_writer_add_u32(w, "qwen2.context_length", 16);
    gguf_writer_add_tensor(w, "token_embd.weight", MN_TYPE_F16, 2, ne, row, sizeof row);
    MnErr err = {0};
    assert_int_equal(gguf_writer_write(w, path, &err), MN_OK);
    gguf_writer_free(w);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        long pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (f == NULL || fscanf(f, "%ld", &pages) != 1) _exit(2);
        fclose(f);
        rlim_t cap = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (1ull << 30);
        struct rlimit rl = {cap, cap};
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(2);
        Model *m = NULL;
        int rc = model_load(path, &m, &err);
        fprintf(stderr, "    model_load: %d %s\n", rc, err.msg);
        _exit(rc == MN_EFORMAT && strstr(err.msg, "blk.0.attn_q.weight") != NULL ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    unlink(path);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_inconsistent_metadata),
        cmocka_unit_test(test_wrong_shape),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_sliding_window_key),
        cmocka_unit_test(test_absurd_shape_refused_before_allocating),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
