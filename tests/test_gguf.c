/* test_gguf.c — the GGUF reader and writer: real files open with the right
 * metadata, every real file round-trips byte for byte through the writer,
 * a writer-built file with every value type reads back, and malformed input
 * (bad versions, truncations at every length, random byte flips, hand-made
 * hostile headers) is rejected with a message and never crashes. Run under
 * ASan, the truncation test copies each prefix into a buffer of exactly that
 * size so that any over-read is caught. */
#include "test_util.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>

#include "base/mem.h"
#include "base/rng.h"
#include "base/ttype.h"
#include "model/gguf.h"

/* ---- helpers --------------------------------------------------------------- */

static bool msg_has(const MnErr *err, const char *needle) { return strstr(err->msg, needle) != NULL; }

static bool str_eq(GgufStr s, const char *c) { return s.len == strlen(c) && memcmp(s.data, c, s.len) == 0; }

/* A temporary path; the file mkstemp creates is replaced by the writer. */
static void temp_path(char *buf, size_t cap) {
    snprintf(buf, cap, "/tmp/test_gguf_XXXXXX");
    int fd = mkstemp(buf);
    assert_true(fd >= 0);
    close(fd);
}

/* Open a copy of image in a buffer of exactly n bytes. */
static int open_exact(const uint8_t *image, size_t n, MnErr *err, Gguf **out) {
    uint8_t *buf = malloc(n ? n : 1);
    assert_non_null(buf);
    if (n > 0) memcpy(buf, image, n);
    err->msg[0] = '\0';
    Gguf *g = NULL;
    int rc = gguf_open_memory(buf, n, &g, err);
    if (out != NULL && rc == MN_OK) {
        *out = g; /* caller closes it and frees gguf_file_data */
        return rc;
    }
    gguf_close(g);
    free(buf);
    return rc;
}

/* Touch every getter on an opened file (to shake out bad reads). */
static void exercise(const Gguf *g, FILE *sink) {
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        assert_int_equal(gguf_find_key(g, key), i);
        uint32_t u;
        int64_t s;
        float f;
        bool b;
        GgufStr str;
        GgufType et;
        uint64_t n;
        (void)gguf_get_u32(g, key, &u);
        (void)gguf_get_i64(g, key, &s);
        (void)gguf_get_f32(g, key, &f);
        (void)gguf_get_bool(g, key, &b);
        (void)gguf_get_str(g, key, &str);
        if (gguf_get_arr(g, key, &et, &n) == MN_OK && n > 0) {
            (void)gguf_arr_str(g, key, n - 1, &str);
            (void)gguf_arr_f32(g, key, n - 1, &f);
            (void)gguf_arr_i64(g, key, 0, &s);
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const GgufTensor *t = gguf_tensor(g, i);
        assert_ptr_equal(gguf_find_tensor(g, t->name), t);
        if (t->n_bytes > 0) {
            volatile uint8_t x = ((const uint8_t *)t->data)[t->n_bytes - 1];
            (void)x;
        }
    }
    gguf_dump(g, sink);
}

/* A little-endian byte builder for hand-made files. */
typedef struct Bld {
    uint8_t *p;
    size_t n, cap;
} Bld;

static void b_bytes(Bld *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void b_u32(Bld *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    b_bytes(b, x, 4);
}

static void b_u64(Bld *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    b_bytes(b, x, 8);
}

static void b_str(Bld *b, const char *s) {
    b_u64(b, strlen(s));
    b_bytes(b, s, strlen(s));
}

static void b_pad(Bld *b, size_t align, uint8_t fill) {
    while (b->n % align) b_bytes(b, &fill, 1);
}

static void b_header(Bld *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->n = 0;
    b_bytes(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}

static void b_tensor(Bld *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, ne[d]);
    b_u32(b, type);
    b_u64(b, off);
}

static void b_data(Bld *b, size_t n_bytes) {
    b_pad(b, 32, 0);
    for (size_t i = 0; i < n_bytes; i++) {
        uint8_t x = (uint8_t)i;
        b_bytes(b, &x, 1);
    }
}

/* The built image must be rejected with code and a message holding needle. */
static void expect_reject(const Bld *b, int code, const char *needle) {
    MnErr err = {0};
    int rc = open_exact(b->p, b->n, &err, NULL);
    if (rc != code || !msg_has(&err, needle))
        fail_msg("expected code %d with \"%s\", got %d: %s", code, needle, rc, err.msg);
}

static Gguf *expect_open(const Bld *b) {
    MnErr err = {0};
    Gguf *g = NULL;
    int rc = open_exact(b->p, b->n, &err, &g);
    if (rc != MN_OK) fail_msg("expected success, got %d: %s", rc, err.msg);
    return g;
}

static void close_exact(Gguf *g) {
    void *buf = (void *)gguf_file_data(g);
    gguf_close(g);
    free(buf);
}

/* stories260K.gguf's path into path and its bytes (*n bytes, the
 * caller's to free), or NULL when the data is not there (skipped). */
static char *read_stories(char *path, size_t cap, size_t *n) {
    test_data_path(path, cap, "models/stories260K.gguf");
    if (!test_require_file(path)) return NULL;
    char *file = test_read_file(path, n);
    assert_non_null(file);
    return file;
}

/* ---- real files ------------------------------------------------------------- */

static void test_open_stories(void **state) {
    char path[512];
    test_data_path(path, sizeof path, "models/stories260K.gguf");
    if (!test_require_file(path)) return;
    Gguf *g = NULL;
    MnErr err = {0};
    int rc = gguf_open(path, &g, &err);
    if (rc != MN_OK) fail_msg("%s", err.msg);
    assert_int_equal(gguf_version(g), 3);
    assert_int_equal(gguf_alignment(g), 32);
    assert_int_equal(gguf_data_offset(g), 14144);
    assert_int_equal(gguf_file_bytes(g), 1185344);
    assert_int_equal(gguf_n_kv(g), 18);

    GgufStr s;
    assert_int_equal(gguf_get_str(g, "general.architecture", &s), MN_OK);
    assert_true(str_eq(s, "llama"));
    uint32_t u;
    assert_int_equal(gguf_get_u32(g, "llama.embedding_length", &u), MN_OK);
    assert_int_equal(u, 64);
    assert_int_equal(gguf_get_u32(g, "llama.block_count", &u), MN_OK);
    assert_int_equal(u, 5);
    int64_t i64;
    assert_int_equal(gguf_get_i64(g, "llama.attention.head_count_kv", &i64), MN_OK);
    assert_int_equal(i64, 4);
    float f;
    assert_int_equal(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), MN_OK);
    assert_true(fabsf(f - 1e-5f) < 1e-9f);

    /* wrong types and absent keys */
    assert_int_equal(gguf_get_u32(g, "general.architecture", &u), MN_EFORMAT);
    assert_int_equal(gguf_get_f32(g, "llama.block_count", &f), MN_EFORMAT);
    bool b;
    assert_int_equal(gguf_get_bool(g, "llama.block_count", &b), MN_EFORMAT);
    assert_int_equal(gguf_get_u32(g, "no.such.key", &u), MN_ENOTFOUND);
    assert_int_equal(gguf_find_key(g, "no.such.key"), -1);
    assert_int_equal(gguf_kv_type(g, gguf_find_key(g, "llama.block_count")), GGUF_TYPE_UINT32);

    /* arrays */
    GgufType et;
    uint64_t n;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n), MN_OK);
    assert_int_equal(et, GGUF_TYPE_STRING);
    assert_int_equal(n, 512);
    assert_int_equal(gguf_arr_str(g, "tokenizer.ggml.tokens", 1, &s), MN_OK);
    assert_true(str_eq(s, "<s>"));
    assert_int_equal(gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &s), MN_OK);
    assert_true(str_eq(s, "<unk>"));
    assert_int_equal(gguf_arr_str(g, "tokenizer.ggml.tokens", 511, &s), MN_OK);
    assert_int_equal(gguf_arr_str(g, "tokenizer.ggml.tokens", 512, &s), MN_ERANGE);
    assert_int_equal(gguf_arr_f32(g, "tokenizer.ggml.tokens", 0, &f), MN_EFORMAT);
    assert_int_equal(gguf_arr_f32(g, "tokenizer.ggml.scores", 0, &f), MN_OK);
    assert_int_equal(gguf_arr_i64(g, "tokenizer.ggml.token_type", 0, &i64), MN_OK);
    assert_int_equal(i64, 2);
    assert_int_equal(gguf_arr_i64(g, "tokenizer.ggml.token_type", 1, &i64), MN_OK);
    assert_int_equal(i64, 3);
    assert_int_equal(gguf_arr_i64(g, "tokenizer.ggml.scores", 0, &i64), MN_EFORMAT);
    assert_int_equal(gguf_get_arr(g, "llama.block_count", &et, &n), MN_EFORMAT);

    /* tensors */
    assert_int_equal(gguf_n_tensors(g), 48);
    const GgufTensor *t = gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, MN_TYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->ne[3], 1);
    assert_int_equal(t->n_bytes, 64 * 512 * 4);
    assert_ptr_equal(t->data, (const uint8_t *)gguf_file_data(g) + gguf_data_offset(g) + t->offset);
    t = gguf_find_tensor(g, "blk.4.ffn_norm.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 1);
    assert_null(gguf_find_tensor(g, "blk.5.ffn_norm.weight"));

    /* dump names everything */
    char *dump = NULL;
    size_t dump_len = 0;
    FILE *mf = open_memstream(&dump, &dump_len);
    assert_non_null(mf);
    gguf_dump(g, mf);
    fclose(mf);
    assert_non_null(strstr(dump, "general.architecture"));
    assert_non_null(strstr(dump, "\"llama\""));
    assert_non_null(strstr(dump, "arr[str, 512]"));
    assert_non_null(strstr(dump, "output.weight"));
    assert_non_null(strstr(dump, "[64, 512]"));
    free(dump);
    gguf_close(g);
}

/* The line of /proc/self/maps whose range holds p, into line (empty when
 * none does). */
static void mapping_of(const void *p, char *line, size_t cap) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    line[0] = '\0';
    while (fgets(line, (int)cap, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi) break;
        line[0] = '\0';
    }
    fclose(f);
}

/* Whether writing a byte of p kills a child process (the page is
 * read-only). */
static bool write_faults(const void *p) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* not cmocka's handler, which would go on testing */
        *(volatile uint8_t *)p = 1;
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Both ways of holding a file give its bytes. GGUF_READ's image is
 * anonymous memory on a huge-page boundary, read-only (a write faults);
 * GGUF_MAP's is the file's mapping. */
static void test_open_holds(void **state) {
    char path[512];
    size_t n = 0;
    char *file = read_stories(path, sizeof path, &n);
    if (file == NULL) return;
    for (int hold = GGUF_READ; hold <= GGUF_MAP; hold++) {
        Gguf *g = NULL;
        MnErr err = {0};
        if (gguf_open_with(path, (GgufHold)hold, &g, &err) != MN_OK) fail_msg("%s", err.msg);
        const uint8_t *image = gguf_file_data(g);
        assert_int_equal(gguf_file_bytes(g), n);
        assert_memory_equal(image, file, n);
        assert_int_equal(gguf_n_tensors(g), 48);
        char line[1024];
        mapping_of(image, line, sizeof line);
        assert_true(line[0] != '\0');
        assert_non_null(strstr(line, " r--p ")); /* read-only, private */
        if (hold == GGUF_READ) {
            assert_int_equal((uintptr_t)image % MN_HUGE_ALIGN, 0);
            assert_null(strstr(line, "stories260K.gguf"));
        } else {
            assert_non_null(strstr(line, "stories260K.gguf"));
        }
        assert_true(write_faults(image + n / 2));
        gguf_close(g);
    }
    /* a truncated file on disk is rejected either way, naming it */
    char cut[64];
    temp_path(cut, sizeof cut);
    FILE *f = fopen(cut, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(file, 1, 5000, f), 5000);
    fclose(f);
    for (int hold = GGUF_READ; hold <= GGUF_MAP; hold++) {
        Gguf *g = (Gguf *)1;
        MnErr err = {0};
        assert_int_equal(gguf_open_with(cut, (GgufHold)hold, &g, &err), MN_EFORMAT);
        assert_null(g);
        assert_true(msg_has(&err, cut));
        assert_true(msg_has(&err, "file truncated"));
    }
    unlink(cut);
    /* a file that ends before its stated size while it is read (a sysfs
     * file says 4096 bytes and gives a line) is an I/O error, not a
     * short image */
    const char *sysfs = "/sys/kernel/mm/transparent_hugepage/enabled";
    struct stat st;
    if (stat(sysfs, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        Gguf *g = (Gguf *)1;
        MnErr err = {0};
        assert_int_equal(gguf_open(sysfs, &g, &err), MN_EIO);
        assert_null(g);
        if (!msg_has(&err, "while it was read")) fail_msg("%s", err.msg);
    }
    free(file);
}

static void test_open_missing(void **state) {
    Gguf *g = (Gguf *)1;
    MnErr err = {0};
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &g, &err), MN_ENOTFOUND);
    assert_null(g);
    assert_true(msg_has(&err, "/nonexistent/x.gguf"));
    assert_int_equal(gguf_open("/tmp", &g, &err), MN_EIO);
}

/* Read path, copy every KV and tensor into a writer, write, compare bytes. */
static void round_trip(const char *rel) {
    char path[512], out[64];
    test_data_path(path, sizeof path, rel);
    if (!test_require_file(path)) return;
    Gguf *g = NULL;
    MnErr err = {0};
    if (gguf_open(path, &g, &err) != MN_OK) fail_msg("%s", err.msg);
    GgufWriter *w = gguf_writer_new();
    assert_non_null(w);
    gguf_writer_set_version(w, gguf_version(g));
    for (int64_t i = 0; i < gguf_n_kv(g); i++) assert_int_equal(gguf_writer_copy_kv(w, g, i), MN_OK);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const GgufTensor *t = gguf_tensor(g, i);
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes), MN_OK);
    }
    temp_path(out, sizeof out);
    if (gguf_writer_write(w, out, &err) != MN_OK) fail_msg("%s", err.msg);
    gguf_writer_free(w);

    size_t n = 0;
    char *copy = test_read_file(out, &n);
    assert_non_null(copy);
    assert_int_equal(n, gguf_file_bytes(g));
    const uint8_t *orig = gguf_file_data(g);
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)copy[i] != orig[i]) fail_msg("%s: first difference at byte %zu", rel, i);
    free(copy);
    unlink(out);
    gguf_close(g);
}

static void test_round_trip_stories(void **state) { round_trip("models/stories260K.gguf"); }
static void test_round_trip_q8_0(void **state) { round_trip("models/tiny-llama-spm-q8_0.gguf"); }
static void test_round_trip_qwen2(void **state) { round_trip("models/tiny-qwen2-gpt2-f32.gguf"); }
static void test_round_trip_vocab(void **state) { round_trip("vocab/ggml-vocab-gpt-2.gguf"); }

static void test_bad_v1(void **state) {
    char path[512];
    test_data_path(path, sizeof path, "models/bad-stories260K-f32-gguf-v1.gguf");
    if (!test_require_file(path)) return;
    Gguf *g = NULL;
    MnErr err = {0};
    assert_int_equal(gguf_open(path, &g, &err), MN_EUNSUPPORTED);
    assert_null(g);
    assert_true(msg_has(&err, "version 1"));
    assert_true(msg_has(&err, "bad-stories260K-f32-gguf-v1.gguf"));
}

static void test_bad_unaligned_rows(void **state) {
    char path[512];
    test_data_path(path, sizeof path, "models/bad-stories260K-q8_0-v2-unaligned-rows.gguf");
    if (!test_require_file(path)) return;
    Gguf *g = NULL;
    MnErr err = {0};
    assert_int_equal(gguf_open(path, &g, &err), MN_EFORMAT);
    assert_null(g);
    assert_true(msg_has(&err, "row length 172"));
    assert_true(msg_has(&err, "block size 32"));
    assert_true(msg_has(&err, "q8_0"));
}

/* ---- writer ------------------------------------------------------------------ */

static void fill_tensor(float *x, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) x[i] = sinf((float)(i * 7 + seed)) * 3.0f;
}

static void test_writer_all_types(void **state) {
    GgufWriter *w = gguf_writer_new();
    assert_non_null(w);
    gguf_writer_set_version(w, 2);

    uint8_t raw[64];
    raw[0] = 200;
    assert_int_equal(gguf_writer_add_raw(w, "t.u8", GGUF_TYPE_UINT8, raw, 1), MN_OK);
    raw[0] = (uint8_t)-5;
    assert_int_equal(gguf_writer_add_raw(w, "t.i8", GGUF_TYPE_INT8, raw, 1), MN_OK);
    raw[0] = 0xff, raw[1] = 0xff;
    assert_int_equal(gguf_writer_add_raw(w, "t.u16", GGUF_TYPE_UINT16, raw, 2), MN_OK);
    int16_t i16 = -300;
    memcpy(raw, &i16, 2);
    assert_int_equal(gguf_writer_add_raw(w, "t.i16", GGUF_TYPE_INT16, raw, 2), MN_OK);
    assert_int_equal(gguf_writer_add_u32(w, "t.u32", 4000000000u), MN_OK);
    assert_int_equal(gguf_writer_add_i32(w, "t.i32", -7), MN_OK);
    assert_int_equal(gguf_writer_add_f32(w, "t.f32", 1.5f), MN_OK);
    assert_int_equal(gguf_writer_add_bool(w, "t.bool", true), MN_OK);
    assert_int_equal(gguf_writer_add_str(w, "t.str", "héllo"), MN_OK);
    uint64_t u64 = (1ull << 63) + 5;
    memcpy(raw, &u64, 8);
    assert_int_equal(gguf_writer_add_raw(w, "t.u64", GGUF_TYPE_UINT64, raw, 8), MN_OK);
    u64 = 1ull << 40;
    memcpy(raw, &u64, 8);
    assert_int_equal(gguf_writer_add_raw(w, "t.u64small", GGUF_TYPE_UINT64, raw, 8), MN_OK);
    int64_t i64 = -(1ll << 40);
    memcpy(raw, &i64, 8);
    assert_int_equal(gguf_writer_add_raw(w, "t.i64", GGUF_TYPE_INT64, raw, 8), MN_OK);
    double f64 = 2.25;
    memcpy(raw, &f64, 8);
    assert_int_equal(gguf_writer_add_raw(w, "t.f64", GGUF_TYPE_FLOAT64, raw, 8), MN_OK);
    const char *strs[] = {"a", "", "three"};
    assert_int_equal(gguf_writer_add_arr_str(w, "t.arr_str", strs, 3), MN_OK);
    assert_int_equal(gguf_writer_add_arr_str(w, "t.arr_str_empty", strs, 0), MN_OK);
    const float fs[] = {0.5f, -1.0f, 3.25f};
    assert_int_equal(gguf_writer_add_arr_f32(w, "t.arr_f32", fs, 3), MN_OK);
    const int32_t is[] = {-1, 2, 2000000000};
    assert_int_equal(gguf_writer_add_arr_i32(w, "t.arr_i32", is, 3), MN_OK);
    /* nested: [[1, 2, 3] as u16, [] as u8] */
    Bld b = {0};
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u64(&b, 2);
    b_u32(&b, GGUF_TYPE_UINT16);
    b_u64(&b, 3);
    uint8_t three[6] = {1, 0, 2, 0, 3, 0};
    b_bytes(&b, three, 6);
    b_u32(&b, GGUF_TYPE_UINT8);
    b_u64(&b, 0);
    assert_int_equal(gguf_writer_add_raw(w, "t.nested", GGUF_TYPE_ARRAY, b.p, b.n), MN_OK);
    /* array of f64 and of bool */
    b.n = 0;
    b_u32(&b, GGUF_TYPE_FLOAT64);
    b_u64(&b, 2);
    b_bytes(&b, &f64, 8);
    f64 = -0.125;
    b_bytes(&b, &f64, 8);
    assert_int_equal(gguf_writer_add_raw(w, "t.arr_f64", GGUF_TYPE_ARRAY, b.p, b.n), MN_OK);
    assert_int_equal(gguf_writer_add_u32(w, "general.alignment", 64), MN_OK);

    /* tensors of every supported type */
    enum { N_T = 15 };
    const uint32_t types[N_T] = {MN_TYPE_F32,  MN_TYPE_F16,  MN_TYPE_BF16,  MN_TYPE_Q8_0,   MN_TYPE_Q4_0,
                                 MN_TYPE_Q4_1, MN_TYPE_Q5_0, MN_TYPE_Q5_1,  MN_TYPE_Q2_K,   MN_TYPE_Q3_K,
                                 MN_TYPE_Q4_K, MN_TYPE_Q5_K, MN_TYPE_Q6_K,  MN_TYPE_IQ4_NL, MN_TYPE_IQ4_XS};
    const uint64_t shapes[N_T][4] = {{8, 3, 1, 1},   {16, 2, 1, 1},  {5, 1, 1, 1},   {64, 2, 1, 1},  {32, 3, 2, 1},
                                     {64, 2, 1, 1},  {32, 3, 1, 1},  {96, 1, 1, 1},  {256, 2, 1, 1}, {512, 1, 1, 1},
                                     {256, 3, 1, 1}, {256, 1, 2, 1}, {512, 2, 1, 1}, {32, 2, 1, 1},  {256, 2, 1, 1}};
    const uint32_t dims[N_T] = {2, 2, 1, 2, 3, 2, 2, 1, 2, 1, 2, 3, 2, 2, 2};
    const char *names[N_T] = {"w.f32",  "w.f16",  "w.bf16", "w.q8_0", "w.q4_0", "w.q4_1",   "w.q5_0",  "w.q5_1",
                              "w.q2_k", "w.q3_k", "w.q4_k", "w.q5_k", "w.q6_k", "w.iq4_nl", "w.iq4_xs"};
    void *data[N_T];
    uint64_t sizes[N_T];
    for (int k = 0; k < N_T; k++) {
        uint64_t n_rows = shapes[k][1] * shapes[k][2] * shapes[k][3], row_bytes;
        assert_int_equal(ttype_row_bytes(types[k], shapes[k][0], &row_bytes), MN_OK);
        sizes[k] = row_bytes * n_rows;
        data[k] = malloc(sizes[k]);
        float row[512];
        for (uint64_t r = 0; r < n_rows; r++) {
            fill_tensor(row, (int64_t)shapes[k][0], (uint32_t)(r + 10 * k));
            ttype_quantize_row((MnType)types[k], row, (uint8_t *)data[k] + r * row_bytes, (int64_t)shapes[k][0]);
        }
        assert_int_equal(gguf_writer_add_tensor(w, names[k], types[k], dims[k], shapes[k], data[k], sizes[k]), MN_OK);
    }
    char out[64];
    temp_path(out, sizeof out);
    MnErr err = {0};
    if (gguf_writer_write(w, out, &err) != MN_OK) fail_msg("%s", err.msg);
    gguf_writer_free(w);
    free(b.p);

    Gguf *g = NULL;
    if (gguf_open(out, &g, &err) != MN_OK) fail_msg("%s", err.msg);
    assert_int_equal(gguf_version(g), 2);
    assert_int_equal(gguf_alignment(g), 64);
    assert_int_equal(gguf_data_offset(g) % 64, 0);
    assert_int_equal(gguf_file_bytes(g) % 64, 0);

    uint32_t u;
    int64_t s;
    float f;
    bool bo;
    GgufStr str;
    GgufType et;
    uint64_t n;
    assert_int_equal(gguf_get_u32(g, "t.u8", &u), MN_OK);
    assert_int_equal(u, 200);
    assert_int_equal(gguf_kv_type(g, gguf_find_key(g, "t.u8")), GGUF_TYPE_UINT8);
    assert_int_equal(gguf_get_u32(g, "t.i8", &u), MN_EFORMAT);
    assert_int_equal(gguf_get_i64(g, "t.i8", &s), MN_OK);
    assert_int_equal(s, -5);
    assert_int_equal(gguf_get_u32(g, "t.u16", &u), MN_OK);
    assert_int_equal(u, 65535);
    assert_int_equal(gguf_get_i64(g, "t.i16", &s), MN_OK);
    assert_int_equal(s, -300);
    assert_int_equal(gguf_get_u32(g, "t.u32", &u), MN_OK);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(gguf_get_i64(g, "t.i32", &s), MN_OK);
    assert_int_equal(s, -7);
    assert_int_equal(gguf_get_u32(g, "t.i32", &u), MN_EFORMAT);
    assert_int_equal(gguf_get_f32(g, "t.f32", &f), MN_OK);
    assert_true(f == 1.5f);
    assert_int_equal(gguf_get_bool(g, "t.bool", &bo), MN_OK);
    assert_true(bo);
    assert_int_equal(gguf_get_str(g, "t.str", &str), MN_OK);
    assert_true(str_eq(str, "héllo"));
    assert_int_equal(gguf_get_i64(g, "t.u64", &s), MN_EFORMAT);
    assert_int_equal(gguf_get_u32(g, "t.u64small", &u), MN_EFORMAT);
    assert_int_equal(gguf_get_i64(g, "t.u64small", &s), MN_OK);
    assert_int_equal(s, 1ll << 40);
    assert_int_equal(gguf_get_i64(g, "t.i64", &s), MN_OK);
    assert_int_equal(s, -(1ll << 40));
    assert_int_equal(gguf_get_f32(g, "t.f64", &f), MN_OK);
    assert_true(f == 2.25f);
    assert_int_equal(gguf_get_arr(g, "t.arr_str", &et, &n), MN_OK);
    assert_int_equal(et, GGUF_TYPE_STRING);
    assert_int_equal(n, 3);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(gguf_arr_str(g, "t.arr_str", (uint64_t)k, &str), MN_OK);
        assert_true(str_eq(str, strs[k]));
    }
    assert_int_equal(gguf_get_arr(g, "t.arr_str_empty", &et, &n), MN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(gguf_arr_str(g, "t.arr_str_empty", 0, &str), MN_ERANGE);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(gguf_arr_f32(g, "t.arr_f32", (uint64_t)k, &f), MN_OK);
        assert_true(f == fs[k]);
        assert_int_equal(gguf_arr_i64(g, "t.arr_i32", (uint64_t)k, &s), MN_OK);
        assert_int_equal(s, is[k]);
        assert_int_equal(gguf_arr_f32(g, "t.arr_i32", (uint64_t)k, &f), MN_OK);
        assert_true(f == (float)is[k]);
    }
    assert_int_equal(gguf_arr_i64(g, "t.arr_f32", 0, &s), MN_EFORMAT);
    assert_int_equal(gguf_get_arr(g, "t.nested", &et, &n), MN_OK);
    assert_int_equal(et, GGUF_TYPE_ARRAY);
    assert_int_equal(n, 2);
    assert_int_equal(gguf_arr_i64(g, "t.nested", 0, &s), MN_EFORMAT);
    assert_int_equal(gguf_arr_str(g, "t.nested", 0, &str), MN_EFORMAT);
    assert_int_equal(gguf_arr_f32(g, "t.arr_f64", 1, &f), MN_OK);
    assert_true(f == -0.125f);

    assert_int_equal(gguf_n_tensors(g), N_T);
    for (int k = 0; k < N_T; k++) {
        const GgufTensor *t = gguf_tensor(g, k);
        assert_string_equal(t->name, names[k]);
        assert_int_equal(t->type, types[k]);
        assert_int_equal(t->n_dims, dims[k]);
        for (int d = 0; d < 4; d++) assert_int_equal(t->ne[d], shapes[k][d]);
        assert_int_equal(t->n_bytes, sizes[k]);
        assert_int_equal(t->offset % 64, 0);
        assert_memory_equal(t->data, data[k], sizes[k]);
        free(data[k]);
    }
    FILE *sink = fopen("/dev/null", "w");
    assert_non_null(sink);
    gguf_dump(g, sink);
    fclose(sink);
    gguf_close(g);
    unlink(out);
}

static void test_writer_errors(void **state) {
    MnErr err = {0};
    /* unwritable path */
    GgufWriter *w = gguf_writer_new();
    assert_int_equal(gguf_writer_add_u32(w, "a", 1), MN_OK);
    assert_int_equal(gguf_writer_write(w, "/nonexistent-dir-for-test/out.gguf", &err), MN_EIO);
    assert_true(msg_has(&err, "nonexistent-dir-for-test"));
    gguf_writer_free(w);

    /* a path that is not a regular file (a FIFO, a directory) is never
     * replaced: the writer renames its temporary file over the path */
    char special[64];
    snprintf(special, sizeof special, "/tmp/mnemo-gguf-fifo-%d", (int)getpid());
    assert_int_equal(mkfifo(special, 0600), 0);
    w = gguf_writer_new();
    assert_int_equal(gguf_writer_add_u32(w, "a", 1), MN_OK);
    assert_int_equal(gguf_writer_write(w, special, &err), MN_EINVAL);
    assert_true(msg_has(&err, "not a regular file"));
    struct stat st;
    assert_int_equal(lstat(special, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    unlink(special);
    assert_int_equal(mkdir(special, 0700), 0);
    assert_int_equal(gguf_writer_write(w, special, &err), MN_EINVAL);
    assert_int_equal(lstat(special, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    rmdir(special);
    gguf_writer_free(w);

    /* a failed add is sticky */
    w = gguf_writer_new();
    assert_int_equal(gguf_writer_add_u32(w, "a", 1), MN_OK);
    assert_int_equal(gguf_writer_add_u32(w, "a", 2), MN_EINVAL);
    char out[64];
    temp_path(out, sizeof out);
    err.msg[0] = '\0';
    assert_int_equal(gguf_writer_write(w, out, &err), MN_EINVAL);
    assert_true(msg_has(&err, "duplicate key 'a'"));
    gguf_writer_free(w);

    /* bad tensors */
    w = gguf_writer_new();
    uint64_t ne[2] = {64, 2};
    uint8_t buf[512] = {0};
    assert_int_equal(gguf_writer_add_tensor(w, "x", 16, 2, ne, buf, 176), MN_EUNSUPPORTED); /* iq2_xxs */
    gguf_writer_free(w);
    w = gguf_writer_new();
    assert_int_equal(gguf_writer_add_tensor(w, "x", MN_TYPE_F32, 2, ne, buf, 100), MN_EINVAL);
    gguf_writer_free(w);
    w = gguf_writer_new();
    ne[0] = 48;
    assert_int_equal(gguf_writer_add_tensor(w, "x", MN_TYPE_Q8_0, 2, ne, buf, 102), MN_EINVAL);
    gguf_writer_free(w);
    w = gguf_writer_new();
    ne[0] = 4;
    assert_int_equal(gguf_writer_add_tensor(w, "x", MN_TYPE_F32, 2, ne, buf, 32), MN_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "x", MN_TYPE_F32, 2, ne, buf, 32), MN_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "y", MN_TYPE_F32, 0, ne, buf, 32), MN_EINVAL);
    gguf_writer_free(w);

    /* malformed raw values */
    w = gguf_writer_new();
    uint8_t s[11] = {100, 0, 0, 0, 0, 0, 0, 0, 'a', 'b', 'c'};
    assert_int_equal(gguf_writer_add_raw(w, "s", GGUF_TYPE_STRING, s, 11), MN_EINVAL);
    gguf_writer_free(w);
    w = gguf_writer_new();
    uint8_t v[5] = {1, 2, 3, 4, 5};
    assert_int_equal(gguf_writer_add_raw(w, "v", GGUF_TYPE_UINT32, v, 5), MN_EINVAL);
    gguf_writer_free(w);
    w = gguf_writer_new();
    assert_int_equal(gguf_writer_add_raw(w, "v", (GgufType)13, v, 1), MN_EINVAL);
    gguf_writer_free(w);

    /* bad alignment */
    w = gguf_writer_new();
    assert_int_equal(gguf_writer_add_u32(w, "general.alignment", 48), MN_OK);
    assert_int_equal(gguf_writer_write(w, out, &err), MN_EINVAL);
    assert_true(msg_has(&err, "power of two"));
    gguf_writer_free(w);

    /* bad version */
    w = gguf_writer_new();
    gguf_writer_set_version(w, 1);
    assert_int_equal(gguf_writer_write(w, out, &err), MN_EINVAL);
    gguf_writer_free(w);

    /* the temporary file never stays behind */
    char tmp[80];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    assert_int_equal(access(tmp, F_OK), -1);
    unlink(out);
}

/* ---- malformed input ----------------------------------------------------------- */

static void test_truncations(void **state) {
    char path[512];
    size_t n = 0;
    uint8_t *image = (uint8_t *)read_stories(path, sizeof path, &n);
    if (image == NULL) return;
    MnErr err = {0};
    Gguf *g = NULL;
    assert_int_equal(open_exact(image, n, &err, &g), MN_OK);
    size_t data_off = (size_t)gguf_data_offset(g);
    close_exact(g);

    size_t n_tried = 0;
    for (size_t len = 0; len < n; len = len < data_off ? len + 1 : len + 997) {
        int rc = open_exact(image, len, &err, NULL);
        if (rc == MN_OK) fail_msg("truncation to %zu bytes was accepted", len);
        if (err.msg[0] == '\0') fail_msg("truncation to %zu bytes: no message", len);
        n_tried++;
    }
    assert_int_equal(open_exact(image, n - 1, &err, NULL), MN_EFORMAT);
    assert_true(msg_has(&err, "output.weight"));
    assert_int_equal(open_exact(image, 100, &err, NULL), MN_EFORMAT);
    assert_true(msg_has(&err, "key/value count 18 is impossible"));
    assert_int_equal(open_exact(image, 5000, &err, NULL), MN_EFORMAT);
    assert_true(msg_has(&err, "key 'tokenizer.ggml.tokens': file truncated"));
    printf("truncations: %zu lengths rejected\n", n_tried);
    free(image);
}

static void test_random_flips(void **state) {
    char path[512];
    size_t n = 0;
    char *file = read_stories(path, sizeof path, &n);
    if (file == NULL) return;
    uint8_t *image = malloc(n); /* exactly n bytes: ASan sees over-reads */
    memcpy(image, file, n);
    free(file);
    MnErr err = {0};
    Gguf *g = NULL;
    assert_int_equal(gguf_open_memory(image, n, &g, &err), MN_OK);
    size_t region = (size_t)gguf_data_offset(g);
    gguf_close(g);

    FILE *sink = fopen("/dev/null", "w");
    assert_non_null(sink);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int n_ok = 0, n_bad = 0;
    for (int iter = 0; iter < 2000; iter++) {
        size_t pos[4];
        uint8_t old[4];
        int k = 1 + (int)(rng_splitmix64(&seed) % 4);
        for (int j = 0; j < k; j++) {
            /* bias half the flips to the header and first key/values */
            size_t lim = (rng_splitmix64(&seed) & 1) ? 256 : region;
            pos[j] = (size_t)(rng_splitmix64(&seed) % lim);
            old[j] = image[pos[j]];
            image[pos[j]] ^= (uint8_t)(1 + rng_splitmix64(&seed) % 255);
        }
        err.msg[0] = '\0';
        g = NULL;
        int rc = gguf_open_memory(image, n, &g, &err);
        if (rc == MN_OK) {
            exercise(g, sink);
            gguf_close(g);
            n_ok++;
        } else {
            assert_null(g);
            if (err.msg[0] == '\0') fail_msg("iteration %d: error %d without a message", iter, rc);
            n_bad++;
        }
        for (int j = k - 1; j >= 0; j--) image[pos[j]] = old[j];
    }
    fclose(sink);
    printf("random flips: %d opened, %d rejected\n", n_ok, n_bad);
    free(image);
}

static void test_handmade_header(void **state) {
    Bld b = {0};
    b.n = 0;
    expect_reject(&b, MN_EFORMAT, "truncated");
    b_bytes(&b, "GGUX", 4);
    b_u32(&b, 3);
    expect_reject(&b, MN_EFORMAT, "not a GGUF file");
    b_header(&b, 4, 0, 0);
    expect_reject(&b, MN_EUNSUPPORTED, "version 4");
    b_header(&b, 0x03000000, 0, 0);
    expect_reject(&b, MN_EUNSUPPORTED, "big-endian");
    b_header(&b, 1, 0, 0);
    expect_reject(&b, MN_EUNSUPPORTED, "version 1");
    b_header(&b, 3, 0, 1ull << 62);
    expect_reject(&b, MN_EFORMAT, "key/value count");
    b_header(&b, 3, 1ull << 62, 0);
    expect_reject(&b, MN_EFORMAT, "tensor count");
    b_header(&b, 3, 0, 0);
    Gguf *g = expect_open(&b); /* empty but valid */
    assert_int_equal(gguf_n_kv(g), 0);
    close_exact(g);
    free(b.p);
}

static void test_handmade_kv(void **state) {
    Bld b = {0};
    /* huge key length */
    b_header(&b, 3, 0, 1);
    b_u64(&b, ~0ull);
    b_bytes(&b, "abcdefgh", 8);
    expect_reject(&b, MN_EFORMAT, "truncated");
    /* huge string length */
    b_header(&b, 3, 0, 1);
    b_str(&b, "a.str");
    b_u32(&b, GGUF_TYPE_STRING);
    b_u64(&b, 1ull << 63);
    b_bytes(&b, "abcdefgh", 8);
    expect_reject(&b, MN_EFORMAT, "key 'a.str'");
    /* huge array counts of every element kind */
    const uint32_t kinds[] = {GGUF_TYPE_UINT32, GGUF_TYPE_UINT8, GGUF_TYPE_FLOAT64, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        b_header(&b, 3, 0, 1);
        b_str(&b, "a.arr");
        b_u32(&b, GGUF_TYPE_ARRAY);
        b_u32(&b, kinds[k]);
        b_u64(&b, 1ull << 60);
        b_bytes(&b, "abcdefghabcdefghabcdefgh", 24);
        expect_reject(&b, MN_EFORMAT, "count");
    }
    /* unknown value types */
    b_header(&b, 3, 0, 1);
    b_str(&b, "a.x");
    b_u32(&b, 13);
    b_u32(&b, 0);
    expect_reject(&b, MN_EFORMAT, "unknown value type 13");
    b_header(&b, 3, 0, 1);
    b_str(&b, "a.x");
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, 13);
    b_u64(&b, 0);
    expect_reject(&b, MN_EFORMAT, "unknown array element type 13");
    /* duplicate key */
    b_header(&b, 3, 0, 2);
    for (int k = 0; k < 2; k++) {
        b_str(&b, "a.dup");
        b_u32(&b, GGUF_TYPE_UINT32);
        b_u32(&b, 7);
    }
    expect_reject(&b, MN_EFORMAT, "duplicate key");
    /* key with a NUL byte */
    b_header(&b, 3, 0, 1);
    b_u64(&b, 3);
    b_bytes(&b, "a\0b", 3);
    b_u32(&b, GGUF_TYPE_UINT8);
    b_bytes(&b, "x", 1);
    expect_reject(&b, MN_EFORMAT, "NUL");
    /* nesting: 8 levels accepted, 9 rejected */
    for (int depth = 8; depth <= 9; depth++) {
        b_header(&b, 3, 0, 1);
        b_str(&b, "a.deep");
        b_u32(&b, GGUF_TYPE_ARRAY);
        for (int d = 1; d < depth; d++) {
            b_u32(&b, GGUF_TYPE_ARRAY);
            b_u64(&b, 1);
        }
        b_u32(&b, GGUF_TYPE_UINT8);
        b_u64(&b, 1);
        b_bytes(&b, "z", 1);
        if (depth == 8) {
            Gguf *g = expect_open(&b);
            FILE *sink = fopen("/dev/null", "w");
            exercise(g, sink);
            fclose(sink);
            close_exact(g);
        } else {
            expect_reject(&b, MN_EFORMAT, "nested");
        }
    }
    /* general.alignment: wrong type, zero, not a power of two */
    const uint32_t bad_align[] = {0, 48, 3};
    for (size_t k = 0; k < 3; k++) {
        b_header(&b, 3, 0, 1);
        b_str(&b, "general.alignment");
        b_u32(&b, GGUF_TYPE_UINT32);
        b_u32(&b, bad_align[k]);
        expect_reject(&b, MN_EFORMAT, "power of two");
    }
    b_header(&b, 3, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, GGUF_TYPE_UINT64);
    b_u64(&b, 32);
    expect_reject(&b, MN_EFORMAT, "expected u32");
    /* truncated scalar */
    b_header(&b, 3, 0, 1);
    b_str(&b, "a.u64");
    b_u32(&b, GGUF_TYPE_UINT64);
    b_u32(&b, 1);
    expect_reject(&b, MN_EFORMAT, "truncated");
    free(b.p);
}

static void b_align_kv(Bld *b, uint32_t align) {
    b_str(b, "general.alignment");
    b_u32(b, GGUF_TYPE_UINT32);
    b_u32(b, align);
}

static void test_handmade_tensors(void **state) {
    Bld b = {0};
    const uint64_t ne8[1] = {8}, ne16[1] = {16};
    /* a valid minimal file first */
    b_header(&b, 3, 1, 1);
    b_str(&b, "general.name");
    b_u32(&b, GGUF_TYPE_STRING);
    b_str(&b, "tiny");
    b_tensor(&b, "t", 1, ne8, MN_TYPE_F32, 0);
    b_data(&b, 32);
    Gguf *g = expect_open(&b);
    assert_int_equal(gguf_n_tensors(g), 1);
    assert_int_equal(gguf_data_offset(g) % 32, 0);
    close_exact(g);
    /* offset past EOF */
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "t", 1, ne8, MN_TYPE_F32, 32);
    b_data(&b, 32);
    expect_reject(&b, MN_EFORMAT, "past the end");
    /* huge offset (no overflow in the bounds check) */
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "t", 1, ne8, MN_TYPE_F32, ~0ull - 31);
    b_data(&b, 32);
    expect_reject(&b, MN_EFORMAT, "past the end");
    /* misaligned offset */
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "t", 1, ne8, MN_TYPE_F32, 4);
    b_data(&b, 64);
    expect_reject(&b, MN_EFORMAT, "alignment");
    /* overlapping tensors (alignment 16 so the offsets are legal) */
    b_header(&b, 3, 2, 1);
    b_align_kv(&b, 16);
    b_tensor(&b, "t0", 1, ne16, MN_TYPE_F32, 0);
    b_tensor(&b, "t1", 1, ne16, MN_TYPE_F32, 48);
    b_data(&b, 128);
    expect_reject(&b, MN_EFORMAT, "overlaps");
    /* ... and the same tensors side by side are fine */
    b_header(&b, 3, 2, 1);
    b_align_kv(&b, 16);
    b_tensor(&b, "t0", 1, ne16, MN_TYPE_F32, 0);
    b_tensor(&b, "t1", 1, ne16, MN_TYPE_F32, 64);
    b_data(&b, 128);
    g = expect_open(&b);
    assert_int_equal(gguf_alignment(g), 16);
    assert_int_equal(gguf_find_tensor(g, "t1")->offset, 64);
    close_exact(g);
    /* duplicate names */
    b_header(&b, 3, 2, 0);
    b_tensor(&b, "t", 1, ne8, MN_TYPE_F32, 0);
    b_tensor(&b, "t", 1, ne8, MN_TYPE_F32, 32);
    b_data(&b, 64);
    expect_reject(&b, MN_EFORMAT, "duplicate tensor name");
    /* n_dims 0 and 5 */
    const uint64_t ne5[5] = {8, 1, 1, 1, 1};
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "t", 0, ne5, MN_TYPE_F32, 0);
    b_data(&b, 32);
    expect_reject(&b, MN_EFORMAT, "dimensions");
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "t", 5, ne5, MN_TYPE_F32, 0);
    b_data(&b, 32);
    expect_reject(&b, MN_EFORMAT, "dimensions");
    /* unknown and unsupported types */
    const uint64_t ne_q[2] = {256, 4};
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "blk.0.attn_q.weight", 2, ne_q, 57, 0);
    b_data(&b, 4096);
    expect_reject(&b, MN_EFORMAT, "tensor 'blk.0.attn_q.weight': unknown tensor type 57");
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "blk.0.attn_q.weight", 2, ne_q, 16, 0);
    b_data(&b, 4096);
    expect_reject(&b, MN_EUNSUPPORTED,
                  "tensor 'blk.0.attn_q.weight': tensor type iq2_xxs is not supported "
                  "(supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, "
                  "iq4_nl, iq4_xs)");
    /* rows that are not whole blocks */
    const uint64_t ne_r[2] = {40, 2};
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "w", 2, ne_r, MN_TYPE_Q4_0, 0);
    b_data(&b, 256);
    expect_reject(&b, MN_EFORMAT, "row length 40 is not a multiple of the q4_0 block size 32");
    /* overflowing shapes */
    const uint64_t ne_big[2] = {1ull << 32, 1ull << 32};
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "w", 2, ne_big, MN_TYPE_F32, 0);
    b_data(&b, 32);
    expect_reject(&b, MN_EFORMAT, "overflow");
    const uint64_t ne_huge[1] = {1ull << 63};
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "w", 1, ne_huge, MN_TYPE_F32, 0);
    b_data(&b, 32);
    expect_reject(&b, MN_EFORMAT, "too large");
    const uint64_t ne_bytes[2] = {1ull << 60, 4};
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "w", 2, ne_bytes, MN_TYPE_F32, 0);
    b_data(&b, 32);
    expect_reject(&b, MN_EFORMAT, "overflow");
    /* zero-sized dims are fine and take no bytes */
    const uint64_t ne_zero[3] = {0, 4, 1ull << 62};
    b_header(&b, 3, 2, 0);
    b_tensor(&b, "empty", 3, ne_zero, MN_TYPE_Q8_0, 0);
    b_tensor(&b, "t", 1, ne8, MN_TYPE_F32, 0);
    b_data(&b, 32);
    g = expect_open(&b);
    assert_int_equal(gguf_find_tensor(g, "empty")->n_bytes, 0);
    assert_int_equal(gguf_find_tensor(g, "t")->n_bytes, 32);
    close_exact(g);
    /* data section beyond EOF */
    b_header(&b, 3, 1, 0);
    b_tensor(&b, "t", 1, ne8, MN_TYPE_F32, 0);
    expect_reject(&b, MN_EFORMAT, "truncated");
    /* truncated tensor info */
    b_header(&b, 3, 1, 0);
    b_str(&b, "t");
    b_u32(&b, 4);
    b_u64(&b, 8);
    b_u64(&b, 8);
    b_u64(&b, 8);
    expect_reject(&b, MN_EFORMAT, "tensor 't': file truncated: dimension");
    free(b.p);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_stories),
        cmocka_unit_test(test_open_holds),
        cmocka_unit_test(test_open_missing),
        cmocka_unit_test(test_round_trip_stories),
        cmocka_unit_test(test_round_trip_q8_0),
        cmocka_unit_test(test_round_trip_qwen2),
        cmocka_unit_test(test_round_trip_vocab),
        cmocka_unit_test(test_bad_v1),
        cmocka_unit_test(test_bad_unaligned_rows),
        cmocka_unit_test(test_writer_all_types),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_random_flips),
        cmocka_unit_test(test_handmade_header),
        cmocka_unit_test(test_handmade_kv),
        cmocka_unit_test(test_handmade_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
