/* fuzz_gguf.c — libFuzzer target for the GGUF reader (model/gguf.h) and
 * everything that loads a model from what it reads: the tokenizer
 * (tok_load) and the model loader (model_load: hyper-parameters, tensor
 * binding, 1-D tensors converted to f32).
 *
 * The input is a file image. gguf_open_memory validates it; when it opens,
 * every key/value is read back through every getter that fits its type
 * (every element of every array too), every tensor is looked up by name,
 * the whole handle is dumped, and the tokenizer is loaded and run on a
 * short text. The image is then written to a memory file and loaded as a
 * model by path, as `mnemo serve -m` would. When the image does not open
 * whole, its metadata alone is tried (gguf_open_metadata, what reads the
 * chat template of a file whose tensors mnemo cannot load) and walked the
 * same way. Beyond no crash, leak or out-of-bounds access (ASan, UBSan):
 *   - failures carry a message and a code equal to the return value, and
 *     leave the output NULL;
 *   - every string, array and tensor the reader hands out lies inside the
 *     image, every tensor's data is aligned, and names find what they name;
 *   - a loaded model's shapes are consistent and its embeddings readable.
 * The fuzzer's memory limit (make fuzz: -rss_limit_mb=2048, which also caps
 * a single allocation) turns an allocation sized by an untrusted count into
 * a finding: the reader must refuse such files with a message instead.
 * Seeds: fuzz/corpus/gguf (tiny models of every architecture, made by
 * fuzz/gen-gguf-seeds); `make fuzz` adds the shared models' headers
 * (fuzz/seeds-gguf).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/err.h"
#include "base/mem.h"
#include "base/tok_ids.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"

/* Made once in LLVMFuzzerInitialize (the harness's main). */
static int image_fd = -1;  /* a memory file holding the current input */
static char image_path[64]; /* /proc/self/fd/N: the path model_load opens */
static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    image_fd = memfd_create("mnemo-fuzz-gguf", MFD_CLOEXEC);
    devnull = fopen("/dev/null", "w");
    if (image_fd < 0 || devnull == NULL) abort();
    snprintf(image_path, sizeof image_path, "/proc/self/fd/%d", image_fd);
    return 0;
}

/* ---- checks -------------------------------------------------------------- */

static void check_failure(int rc, const void *out, const MnErr *err) {
    if (rc == MN_OK || out != NULL || err->code != rc || err->msg[0] == '\0') abort();
}

/* p[0..n) lies inside the image of g. */
static void check_inside(const Gguf *g, const void *p, uint64_t n) {
    const uint8_t *base = gguf_file_data(g), *q = p;
    if (q < base || (uint64_t)(q - base) > gguf_file_bytes(g) || n > gguf_file_bytes(g) - (uint64_t)(q - base))
        abort();
}

static void check_str(const Gguf *g, GgufStr s) {
    if (s.len > 0) check_inside(g, s.data, s.len);
}

/* Every element through every element getter, and one past the end: a
 * getter gives the element when its type fits, else MN_EFORMAT; past the
 * end, MN_ERANGE whatever the type. */
static void walk_array(const Gguf *g, const char *key) {
    GgufType et;
    uint64_t n;
    if (gguf_get_arr(g, key, &et, &n) != MN_OK || n > gguf_file_bytes(g)) abort();
    bool is_number = et != GGUF_TYPE_STRING && et != GGUF_TYPE_ARRAY && et != GGUF_TYPE_BOOL;
    for (uint64_t i = 0; i <= n; i++) {
        GgufStr s;
        float f;
        int64_t v;
        int rs = gguf_arr_str(g, key, i, &s), rf = gguf_arr_f32(g, key, i, &f), ri = gguf_arr_i64(g, key, i, &v);
        if (i == n) {
            if (rs != MN_ERANGE || rf != MN_ERANGE || ri != MN_ERANGE) abort();
            break;
        }
        if (rs != (et == GGUF_TYPE_STRING ? MN_OK : MN_EFORMAT)) abort();
        if (rf != (is_number ? MN_OK : MN_EFORMAT)) abort();
        if (ri != MN_OK && ri != MN_EFORMAT) abort();
        if (rs == MN_OK) check_str(g, s);
    }
}

static void walk_metadata(const Gguf *g) {
    if (gguf_version(g) != 2 && gguf_version(g) != 3) abort();
    uint64_t a = gguf_alignment(g);
    if (a == 0 || (a & (a - 1)) != 0) abort();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (key == NULL || gguf_find_key(g, key) != i) abort();
        uint32_t u32;
        int64_t i64;
        float f;
        bool b;
        GgufStr s;
        switch (gguf_kv_type(g, i)) {
        case GGUF_TYPE_STRING:
            if (gguf_get_str(g, key, &s) != MN_OK) abort();
            check_str(g, s);
            break;
        case GGUF_TYPE_ARRAY: walk_array(g, key); break;
        case GGUF_TYPE_BOOL:
            if (gguf_get_bool(g, key, &b) != MN_OK) abort();
            break;
        case GGUF_TYPE_FLOAT32:
        case GGUF_TYPE_FLOAT64:
            if (gguf_get_f32(g, key, &f) != MN_OK) abort();
            break;
        default: { /* integers: a getter takes the value when it fits, else MN_EFORMAT */
            int ru = gguf_get_u32(g, key, &u32), ri = gguf_get_i64(g, key, &i64);
            if ((ru != MN_OK && ru != MN_EFORMAT) || (ri != MN_OK && ri != MN_EFORMAT)) abort();
            break;
        }
        }
    }
    if (gguf_find_key(g, "no such key\x01") != -1) abort();
}

static void walk_tensors(const Gguf *g) {
    uint64_t a = gguf_alignment(g);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const GgufTensor *t = gguf_tensor(g, i);
        if (t == NULL || gguf_find_tensor(g, t->name) != t) abort();
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS || t->offset % a != 0) abort();
        if (t->data == NULL || (const uint8_t *)t->data != (const uint8_t *)gguf_file_data(g) +
                                                               gguf_data_offset(g) + t->offset)
            abort();
        check_inside(g, t->data, t->n_bytes);
    }
}

/* Load the tokenizer (when the file has one) and run it on a short text. */
static void try_tokenizer(const Gguf *g) {
    Tokenizer *tok = NULL;
    MnErr err = {0};
    int rc = tok_load(g, &tok, &err);
    if (rc != MN_OK) {
        check_failure(rc, tok, &err);
        return;
    }
    static const char text[] = "Hello world, <s> 12345 caf\xc3\xa9 \xe4\xb8\x96 \xff!";
    TokIds ids = {0};
    rc = tok_encode(tok, text, sizeof text - 1, true, true, &ids);
    if (rc != MN_OK && rc != MN_ERANGE) abort();
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= tok_n_vocab(tok)) abort();
    char *back = NULL;
    if (tok_decode(tok, ids.ids, ids.n, true, &back, NULL) != MN_OK) abort();
    mn_free(back);
    tok_ids_free(&ids);
    tok_free(tok);
}

static void check_model(const Model *m) {
    const ModelConfig *c = &m->cfg;
    if (c->n_embd < 1 || c->n_layer < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->n_vocab < 1 ||
        c->q_dim != c->n_head * c->head_dim || c->kv_dim != c->n_head_kv * c->head_dim || c->n_rot < 2 ||
        c->n_rot > c->head_dim || tok_n_vocab(m->tok) > c->n_vocab || m->layers == NULL)
        abort();
    float *row = mn_malloc((size_t)c->n_embd * sizeof *row);
    double *inv_freq = mn_malloc((size_t)(c->n_rot / 2) * sizeof *inv_freq);
    if (row == NULL || inv_freq == NULL) abort();
    model_embed(m, 0, row);
    model_embed(m, c->n_vocab - 1, row);
    model_rope_inv_freq(m, false, c->n_ctx, inv_freq);
    model_rope_inv_freq(m, true, c->n_ctx, inv_freq);
    mn_free(inv_freq);
    mn_free(row);
}

/* ---- the target ---------------------------------------------------------- */

static void set_image(const uint8_t *data, size_t size) {
    if (ftruncate(image_fd, 0) != 0 || pwrite(image_fd, data, size, 0) != (ssize_t)size) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Gguf *g = NULL;
    MnErr err = {0};
    int rc = gguf_open_memory(data, size, &g, &err);
    set_image(data, size);
    if (rc != MN_OK) {
        check_failure(rc, g, &err);
        err = (MnErr){0};
        rc = gguf_open_metadata(image_path, &g, &err);
        if (rc != MN_OK) {
            check_failure(rc, g, &err);
            return 0;
        }
        if (gguf_n_tensors(g) != 0) abort();
        walk_metadata(g);
        try_tokenizer(g);
        gguf_close(g);
        return 0;
    }
    walk_metadata(g);
    walk_tensors(g);
    gguf_dump(g, devnull);
    try_tokenizer(g);
    gguf_close(g);

    Model *m = NULL;
    err = (MnErr){0};
    rc = model_load(image_path, &m, &err);
    if (rc != MN_OK) {
        check_failure(rc, m, &err);
        return 0;
    }
    check_model(m);
    model_free(m);
    return 0;
}
