/* gen_model.c — `mnemo gen-model` (see gen_model.h).
 *
 * Writes the model in one pass of gguf_writer: the architecture's
 * metadata, the tokenizer's keys copied from VOCAB.gguf, then the tensors
 * in llama.cpp's order (embeddings, each block's norm, attention and
 * feed-forward weights, qwen2's Q/K/V biases, the output norm and head).
 * Weights are uniform with the standard deviation 1/sqrt(fan-in), so a
 * forward pass keeps about unit spread; norms are ones. Every value comes
 * from one splitmix64 stream (base/rng) of --seed in that order, so a
 * seed names a file bit for bit. The quantized rows are kept until the
 * writer has written them (GenTensors owns them).
 */
#include "tools/gen_model.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/cli.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/rng.h"
#include "base/ttype.h"
#include "model/gguf.h"

#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- random tensors ---------------------------------------------------------- */

/* A uniform float in [-1, 1) from one splitmix64 step (base/rng). */
static float uniform_pm1(uint64_t *state) { return (float)((double)(rng_splitmix64(state) >> 40) * 0x1p-23 - 1.0); }

typedef struct GenTensors {
    void **bufs;
    int n, cap;
} GenTensors;

/* Add a tensor of random values with standard deviation std (or all `fill`
 * when std is 0) to w, quantized to type. */
static int gen_tensor(GgufWriter *w, GenTensors *keep, uint64_t *rng, const char *name, MnType type, uint64_t n_in,
                      uint64_t n_out, float std, float fill) {
    uint64_t row_bytes;
    if (ttype_row_bytes(type, n_in, &row_bytes)) return MN_EINVAL;
    void *data = mn_malloc(row_bytes * n_out);
    float *row = mn_malloc(n_in * sizeof(float));
    if (keep->n == keep->cap) {
        int cap = keep->cap ? 2 * keep->cap : 64;
        void **b = mn_realloc(keep->bufs, (size_t)cap * sizeof *b);
        if (b == NULL) {
            mn_free(data);
            mn_free(row);
            return MN_ENOMEM;
        }
        keep->bufs = b;
        keep->cap = cap;
    }
    if (data == NULL || row == NULL) {
        mn_free(data);
        mn_free(row);
        return MN_ENOMEM;
    }
    float a = std * 1.7320508f; /* uniform on [-a, a] has standard deviation a / sqrt(3) */
    for (uint64_t r = 0; r < n_out; r++) {
        for (uint64_t i = 0; i < n_in; i++) row[i] = std > 0 ? a * uniform_pm1(rng) : fill;
        ttype_quantize_row(type, row, (char *)data + r * row_bytes, (int64_t)n_in);
    }
    mn_free(row);
    keep->bufs[keep->n++] = data;
    uint64_t ne[2] = {n_in, n_out};
    return gguf_writer_add_tensor(w, name, type, n_out > 1 ? 2 : 1, ne, data, row_bytes * n_out);
}

/* ---- the command -------------------------------------------------------------- */

int gen_model_main(int argc, char **argv) {
    const char *arch = "llama", *type_name = "f32", *vocab = NULL, *out = NULL;
    int dim = 64, layers = 2, heads = 4, kv_heads = 0, ffn = 0, ctx = 2048;
    uint64_t seed = 1;
    CliOpt opts[] = {
        {"arch", 0, CLI_STR, &arch, "llama|qwen2", "architecture (default llama)"},
        {"dim", 0, CLI_INT, &dim, "D", "model dimension (default 64)"},
        {"layers", 0, CLI_INT, &layers, "L", "layers (default 2)"},
        {"heads", 0, CLI_INT, &heads, "H", "attention heads (default 4)"},
        {"kv-heads", 0, CLI_INT, &kv_heads, "K", "KV heads (default = heads)"},
        {"ffn", 0, CLI_INT, &ffn, "F", "feed-forward size (default 3 x dim)"},
        {"ctx", 0, CLI_INT, &ctx, "C", "context length (default 2048)"},
        {"type", 0, CLI_STR, &type_name, "T", "weights (default f32), one of the types mnemo loads (README)"},
        {"seed", 0, CLI_U64, &seed, "S", "random seed (default 1)"},
        {"vocab-from", 0, CLI_STR, &vocab, "FILE", "GGUF whose tokenizer to copy (required)"},
        {"output", 'o', CLI_STR, &out, "FILE", "where to write the model (required)"},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv,
                            "mnemo gen-model --vocab-from VOCAB.gguf -o OUT.gguf [--arch llama|qwen2] [--dim D] "
                            "[--layers L] [--heads H] [--kv-heads K] [--ffn F] [--ctx C] [--type T] [--seed S]",
                            opts, N_OPTS(opts), pos, 0, &n_pos);
    if (rc >= 0) return rc;
    if (kv_heads <= 0) kv_heads = heads;
    if (ffn <= 0) ffn = 3 * dim;
    MnType type;
    bool is_qwen2 = strcmp(arch, "qwen2") == 0;
    if (!cli_require(vocab != NULL, "gen-model", "needs the tokenizer's file: --vocab-from VOCAB.gguf") ||
        !cli_require(out != NULL, "gen-model", "needs the output file: -o OUT.gguf") ||
        !cli_require(is_qwen2 || strcmp(arch, "llama") == 0, "gen-model", "--arch must be llama or qwen2, got '%s'", arch) ||
        !cli_require(ttype_from_name(type_name, &type) == MN_OK, "gen-model",
                     "--type must be one of %s, got '%s'", ttype_supported_names(), type_name) ||
        !cli_require(dim > 0 && layers > 0 && heads > 0 && ctx > 0, "gen-model",
                     "--dim, --layers, --heads and --ctx must be positive") ||
        !cli_require(dim % heads == 0, "gen-model", "--dim %d is not divisible by --heads %d", dim, heads) ||
        !cli_require(heads % kv_heads == 0, "gen-model", "--heads %d is not divisible by --kv-heads %d", heads, kv_heads))
        return 2;
    const size_t blk = ttype_traits(type)->block_elems;
    if ((size_t)dim % blk || (size_t)ffn % blk) {
        fprintf(stderr, "mnemo gen-model: --dim and --ffn must be multiples of %zu for %s\n", blk, type_name);
        return 2;
    }
    MnErr err = {0};
    Gguf *vg = NULL;
    if (gguf_open(vocab, &vg, &err)) return cli_fail(&err);
    GgufType et;
    uint64_t n_vocab = 0;
    if (gguf_get_arr(vg, "tokenizer.ggml.tokens", &et, &n_vocab) || et != GGUF_TYPE_STRING || n_vocab == 0) {
        fprintf(stderr, "mnemo gen-model: %s has no tokenizer.ggml.tokens\n", vocab);
        gguf_close(vg);
        return 1;
    }
    GgufWriter *w = gguf_writer_new();
    GenTensors keep = {0};
    uint64_t rng = seed; /* splitmix64 state */
    char key[128];
    int head_dim = dim / heads, kv_dim = kv_heads * head_dim;
    /* general.file_type (llama.cpp's ftype; one type throughout: the K-quants' _S) */
    static const uint32_t file_types[] = {[MN_TYPE_F32] = 0,     [MN_TYPE_F16] = 1,     [MN_TYPE_Q4_0] = 2,
                                          [MN_TYPE_Q4_1] = 3,    [MN_TYPE_Q8_0] = 7,    [MN_TYPE_Q5_0] = 8,
                                          [MN_TYPE_Q5_1] = 9,    [MN_TYPE_Q2_K] = 10,   [MN_TYPE_Q3_K] = 11,
                                          [MN_TYPE_Q4_K] = 14,   [MN_TYPE_Q5_K] = 16,   [MN_TYPE_Q6_K] = 18,
                                          [MN_TYPE_IQ4_NL] = 25, [MN_TYPE_IQ4_XS] = 30, [MN_TYPE_BF16] = 32};
    rc = w ? MN_OK : MN_ENOMEM;
#define KV_U32(suffix, v) (snprintf(key, sizeof key, "%s.%s", arch, suffix), gguf_writer_add_u32(w, key, (uint32_t)(v)))
#define KV_F32(suffix, v) (snprintf(key, sizeof key, "%s.%s", arch, suffix), gguf_writer_add_f32(w, key, (float)(v)))
    if (rc == MN_OK)
        rc = gguf_writer_add_str(w, "general.architecture", arch) || gguf_writer_add_str(w, "general.name", "mnemo random weights") ||
             gguf_writer_add_u32(w, "general.file_type", file_types[type]) || KV_U32("context_length", ctx) ||
             KV_U32("embedding_length", dim) || KV_U32("block_count", layers) || KV_U32("feed_forward_length", ffn) ||
             KV_U32("attention.head_count", heads) || KV_U32("attention.head_count_kv", kv_heads) ||
             KV_U32("rope.dimension_count", head_dim) || KV_F32("rope.freq_base", is_qwen2 ? 1000000.0 : 10000.0) ||
             KV_F32("attention.layer_norm_rms_epsilon", is_qwen2 ? 1e-6 : 1e-5);
#undef KV_U32
#undef KV_F32
    for (int64_t i = 0; rc == MN_OK && i < gguf_n_kv(vg); i++)
        if (strncmp(gguf_kv_key(vg, i), "tokenizer.", 10) == 0) rc = gguf_writer_copy_kv(w, vg, i);
    const float s_dim = 1.0f / sqrtf((float)dim), s_ffn = 1.0f / sqrtf((float)ffn);
    if (rc == MN_OK) rc = gen_tensor(w, &keep, &rng, "token_embd.weight", type, (uint64_t)dim, n_vocab, 1.0f, 0);
    for (int il = 0; rc == MN_OK && il < layers; il++) {
        char n[96];
#define T(suffix, ty, nin, nout, std, fill) \
    (snprintf(n, sizeof n, "blk.%d.%s", il, suffix), gen_tensor(w, &keep, &rng, n, ty, nin, nout, std, fill))
        rc = T("attn_norm.weight", MN_TYPE_F32, dim, 1, 0, 1.0f) || T("attn_q.weight", type, dim, dim, s_dim, 0) ||
             T("attn_k.weight", type, dim, kv_dim, s_dim, 0) || T("attn_v.weight", type, dim, kv_dim, s_dim, 0) ||
             (is_qwen2 && (T("attn_q.bias", MN_TYPE_F32, dim, 1, 0.1f, 0) ||
                           T("attn_k.bias", MN_TYPE_F32, kv_dim, 1, 0.1f, 0) ||
                           T("attn_v.bias", MN_TYPE_F32, kv_dim, 1, 0.1f, 0))) ||
             T("attn_output.weight", type, dim, dim, s_dim, 0) || T("ffn_norm.weight", MN_TYPE_F32, dim, 1, 0, 1.0f) ||
             T("ffn_gate.weight", type, dim, ffn, s_dim, 0) || T("ffn_up.weight", type, dim, ffn, s_dim, 0) ||
             T("ffn_down.weight", type, ffn, dim, s_ffn, 0);
#undef T
    }
    if (rc == MN_OK) rc = gen_tensor(w, &keep, &rng, "output_norm.weight", MN_TYPE_F32, (uint64_t)dim, 1, 0, 1.0f);
    if (rc == MN_OK) rc = gen_tensor(w, &keep, &rng, "output.weight", type, (uint64_t)dim, n_vocab, s_dim, 0);
    if (rc == MN_OK) rc = gguf_writer_write(w, out, &err);
    else mn_err_set(&err, rc, "building the model: %s", mn_strerror(rc));
    for (int i = 0; i < keep.n; i++) mn_free(keep.bufs[i]);
    mn_free(keep.bufs);
    gguf_writer_free(w);
    gguf_close(vg);
    if (rc) return cli_fail(&err);
    fprintf(stderr, "mnemo: wrote %s (%s, dim %d, %d layers, %d heads, %d kv heads, ffn %d, vocab %" PRIu64 ", %s)\n",
            out, arch, dim, layers, heads, kv_heads, ffn, n_vocab, type_name);
    return 0;
}
