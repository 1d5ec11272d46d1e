/* model.c — loading a llama-family transformer from GGUF (see model.h).
 *
 * Loading happens in three steps: read the hyper-parameters from metadata
 * (config_read), bind every tensor by name and check its type and shape
 * against them (bind_layer_matrices / bind_matrix, then bind_layer_vectors /
 * bind_vector), then load the tokenizer. Matrices stay in the mapping; 1-D
 * tensors are converted to f32 into one owned array (`vectors`) so the
 * kernels see a single type. That array is sized by the hyper-parameters,
 * so it is allocated only once every matrix has been found in the file
 * (bind_all says why that bounds it).
 */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"

/* ---- architectures ------------------------------------------------------ */

typedef struct ArchInfo {
    const char *name;
    ModelArch arch;
    RopeStyle rope_style;
    bool has_qkv_bias;
    bool has_qk_norm;
    bool is_gemma;       /* scaled embeddings, post norms, GELU, logit soft cap */
    int swa_period;      /* of every swa_period layers all but the last slide (0: all, when a window is set) */
    uint32_t n_swa;      /* the window when the file gives none; 0: no sliding layers */
    float attn_softcap;  /* defaults when the file gives none */
    float final_softcap;
} ArchInfo;

static const ArchInfo arch_table[] = {
    {"llama", ARCH_LLAMA, ROPE_ADJACENT, false, false, false, 0, 0, 0.0f, 0.0f},
    {"qwen2", ARCH_QWEN2, ROPE_HALVES, true, false, false, 0, 0, 0.0f, 0.0f},
    {"qwen3", ARCH_QWEN3, ROPE_HALVES, false, true, false, 0, 0, 0.0f, 0.0f},
    {"gemma2", ARCH_GEMMA2, ROPE_HALVES, false, false, true, 2, 4096, 50.0f, 30.0f},
    {"gemma3", ARCH_GEMMA3, ROPE_HALVES, false, true, true, 6, 0, 0.0f, 0.0f},
    {"phi3", ARCH_PHI3, ROPE_HALVES, false, false, false, 0, 0, 0.0f, 0.0f},
};
#define N_ARCHS (sizeof arch_table / sizeof arch_table[0])

const char *model_supported_archs(void) { return "llama, qwen2, qwen3, gemma2, gemma3, phi3"; }

/* Whether layer il slides (given a window): of every swa_period layers
 * all but the last; every layer when swa_period is 0. */
static bool layer_slides(const ModelConfig *c, int il) {
    return c->swa_period == 0 || il % c->swa_period < c->swa_period - 1;
}

/* ---- metadata ----------------------------------------------------------- */

static int get_arch_u32(const Gguf *g, const char *arch, const char *suffix, uint32_t *out,
                        bool required, MnErr *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_u32(g, key, out);
    if (rc == MN_ENOTFOUND && !required) return MN_OK;
    if (rc != MN_OK) return mn_err_set(err, MN_EFORMAT, "metadata %s is %s", key,
                                      rc == MN_ENOTFOUND ? "missing" : "not an unsigned integer");
    return MN_OK;
}

static int get_arch_f32(const Gguf *g, const char *arch, const char *suffix, float *out, MnErr *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(g, key, out);
    if (rc == MN_ENOTFOUND) return MN_OK; /* keep the default */
    if (rc != MN_OK) return mn_err_set(err, MN_EFORMAT, "metadata %s is not a float", key);
    return MN_OK;
}

/* ARCH.rope.scaling.type: none (or absent) and linear are run; yarn,
 * longrope and anything else are refused by name rather than run wrongly. */
static int rope_scaling_read(const Gguf *g, const char *arch, ModelConfig *c, MnErr *err) {
    char key[128];
    GgufStr s;
    c->rope_freq_scale = 1.0f;
    c->rope_attn_factor = 1.0f;
    uint32_t orig = (uint32_t)c->n_ctx;
    int rc = get_arch_u32(g, arch, "rope.scaling.original_context_length", &orig, false, err);
    if (rc == MN_OK) rc = get_arch_f32(g, arch, "rope.scaling.attn_factor", &c->rope_attn_factor, err);
    if (rc) return rc;
    if (orig == 0 || orig > 1u << 24 || !(c->rope_attn_factor > 0.0f && c->rope_attn_factor < 16.0f))
        return mn_err_set(err, MN_EFORMAT, "%s.rope.scaling: original context %u or attention factor %g out of range",
                          arch, orig, c->rope_attn_factor);
    c->n_ctx_orig = (int)orig;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    char type[32] = "none";
    if (gguf_get_str(g, key, &s) == MN_OK) snprintf(type, sizeof type, "%.*s", (int)(s.len < 31 ? s.len : 31), s.data);
    if (strcmp(type, "none") == 0) return MN_OK;
    if (strcmp(type, "linear") != 0)
        return mn_err_set(err, MN_EUNSUPPORTED, "RoPE scaling '%s' (%s) is not supported (supported: none, linear)",
                          type, key);
    float factor = 1.0f;
    rc = get_arch_f32(g, arch, "rope.scaling.factor", &factor, err);
    if (rc) return rc;
    if (!(factor >= 1.0f && factor <= 1024.0f))
        return mn_err_set(err, MN_EFORMAT, "%s.rope.scaling.factor %g is out of range [1, 1024]", arch, factor);
    c->rope_freq_scale = 1.0f / factor;
    return MN_OK;
}

static int config_read(const Gguf *g, ModelConfig *c, MnErr *err) {
    GgufStr s;
    if (gguf_get_str(g, "general.architecture", &s) != MN_OK)
        return mn_err_set(err, MN_EFORMAT, "metadata general.architecture is missing");
    char arch[64];
    snprintf(arch, sizeof arch, "%.*s", (int)(s.len < 63 ? s.len : 63), s.data);
    const ArchInfo *ai = NULL;
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strcmp(arch, arch_table[i].name) == 0) ai = &arch_table[i];
    if (ai == NULL)
        return mn_err_set(err, MN_EUNSUPPORTED, "architecture '%s' is not supported (supported: %s)", arch,
                          model_supported_archs());
    memset(c, 0, sizeof *c);
    c->arch = ai->arch;
    c->rope_style = ai->rope_style;
    c->has_qkv_bias = ai->has_qkv_bias;
    c->has_qk_norm = ai->has_qk_norm;
    c->has_post_norms = ai->is_gemma;
    c->ffn_act = ai->is_gemma ? FFN_GELU : FFN_SILU;
    c->attn_softcap = ai->attn_softcap;
    c->final_softcap = ai->final_softcap;

    uint32_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_ctx = 0, n_rot = 0;
    int rc;
    if ((rc = get_arch_u32(g, arch, "embedding_length", &n_embd, true, err)) ||
        (rc = get_arch_u32(g, arch, "block_count", &n_layer, true, err)) ||
        (rc = get_arch_u32(g, arch, "attention.head_count", &n_head, true, err)) ||
        (rc = get_arch_u32(g, arch, "feed_forward_length", &n_ff, true, err)) ||
        (rc = get_arch_u32(g, arch, "context_length", &n_ctx, true, err)))
        return rc;
    n_head_kv = n_head;
    if ((rc = get_arch_u32(g, arch, "attention.head_count_kv", &n_head_kv, false, err))) return rc;
    uint32_t n_swa = ai->n_swa;
    if ((rc = get_arch_u32(g, arch, "attention.sliding_window", &n_swa, false, err))) return rc;
    if ((rc = get_arch_f32(g, arch, "attn_logit_softcapping", &c->attn_softcap, err)) ||
        (rc = get_arch_f32(g, arch, "final_logit_softcapping", &c->final_softcap, err)))
        return rc;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    GgufType elem;
    uint64_t n_elem;
    if (gguf_get_arr(g, key, &elem, &n_elem) == MN_OK)
        return mn_err_set(err, MN_EUNSUPPORTED, "%s as a per-layer array is not supported (only a period)", key);
    uint32_t period = (uint32_t)ai->swa_period;
    if ((rc = get_arch_u32(g, arch, "attention.sliding_window_pattern", &period, false, err))) return rc;
    if (period > 1024) return mn_err_set(err, MN_EFORMAT, "%s %u is out of range", key, period);
    c->swa_period = (int)period;
    if (!(c->attn_softcap >= 0.0f) || !(c->final_softcap >= 0.0f))
        return mn_err_set(err, MN_EFORMAT, "soft caps must not be negative (%g, %g)", c->attn_softcap,
                          c->final_softcap);
    if (n_swa > 1u << 24) return mn_err_set(err, MN_EFORMAT, "%s.attention.sliding_window %u is too large", arch, n_swa);
    c->n_swa = (int)n_swa;
    c->rope_base = 10000.0f;
    c->rms_eps = 1e-5f;
    if ((rc = get_arch_f32(g, arch, "rope.freq_base", &c->rope_base, err))) return rc;
    c->rope_base_swa = c->arch == ARCH_GEMMA3 ? 10000.0f : c->rope_base; /* gemma3's sliding layers: their own */
    if ((rc = get_arch_f32(g, arch, "rope.freq_base_swa", &c->rope_base_swa, err)) ||
        (rc = get_arch_f32(g, arch, "attention.layer_norm_rms_epsilon", &c->rms_eps, err)))
        return rc;

    if (n_embd == 0 || n_embd > 65536 || n_layer == 0 || n_layer > 1024 || n_head == 0 ||
        n_head > 1024 || n_embd % n_head != 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || n_ff == 0 ||
        n_ff > 1 << 20 || n_ctx == 0 || n_ctx > 1 << 24)
        return mn_err_set(err, MN_EFORMAT,
                          "inconsistent hyper-parameters: embedding %u, layers %u, heads %u, kv heads %u, "
                          "ffn %u, context %u",
                          n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx);
    c->n_embd = (int)n_embd;
    c->n_layer = (int)n_layer;
    c->n_head = (int)n_head;
    c->n_head_kv = (int)n_head_kv;
    uint32_t key_len = n_embd / n_head, value_len = 0;
    if ((rc = get_arch_u32(g, arch, "attention.key_length", &key_len, false, err))) return rc;
    value_len = key_len;
    if ((rc = get_arch_u32(g, arch, "attention.value_length", &value_len, false, err))) return rc;
    if (key_len == 0 || key_len > 1024 || value_len != key_len)
        return mn_err_set(err, MN_EUNSUPPORTED, "attention key length %u and value length %u are not supported "
                          "(they must be equal, 1..1024)", key_len, value_len);
    c->head_dim = (int)key_len;
    c->q_dim = c->n_head * c->head_dim;
    c->kv_dim = c->n_head_kv * c->head_dim;
    c->embd_scale = ai->is_gemma ? sqrtf((float)c->n_embd) : 1.0f;
    /* gemma's 27B models (told apart by their layer count, as the reference
     * implementation does) scale queries by the model dimension per head */
    bool is_27b = (c->arch == ARCH_GEMMA2 && n_layer == 46) || (c->arch == ARCH_GEMMA3 && n_layer == 62);
    c->attn_scale = 1.0f / sqrtf(is_27b ? (float)(n_embd / n_head) : (float)c->head_dim);
    c->n_ff = (int)n_ff;
    c->n_ctx = (int)n_ctx;
    n_rot = (uint32_t)c->head_dim;
    if ((rc = get_arch_u32(g, arch, "rope.dimension_count", &n_rot, false, err))) return rc;
    if (n_rot == 0 || n_rot > (uint32_t)c->head_dim || n_rot % 2 != 0)
        return mn_err_set(err, MN_EFORMAT, "rope.dimension_count %u does not fit head size %d", n_rot,
                          c->head_dim);
    c->n_rot = (int)n_rot;
    if (!(c->rope_base > 0.0f) || !(c->rope_base_swa > 0.0f) || !(c->rms_eps > 0.0f))
        return mn_err_set(err, MN_EFORMAT, "rope base and RMS epsilon must be positive");
    return rope_scaling_read(g, arch, c, err);
}

/* ---- tensors ------------------------------------------------------------ */

static int find_tensor(const Gguf *g, const char *name, const GgufTensor **out, MnErr *err) {
    *out = gguf_find_tensor(g, name);
    if (*out == NULL) return mn_err_set(err, MN_EFORMAT, "tensor '%s' is missing", name);
    return MN_OK;
}

/* Bind a 2-D weight of shape (n_in, n_out) in GGUF's ne order. */
static int bind_matrix(const Gguf *g, const char *name, int64_t n_in, int64_t n_out, MatW *w, MnErr *err) {
    const GgufTensor *t;
    int rc = find_tensor(g, name, &t, err);
    if (rc) return rc;
    if (t->n_dims != 2 || (int64_t)t->ne[0] != n_in || (int64_t)t->ne[1] != n_out)
        return mn_err_set(err, MN_EFORMAT, "tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
                          (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)n_in,
                          (long long)n_out);
    const TypeTraits *tr = ttype_traits(t->type);
    if (tr == NULL) return mn_err_set(err, MN_EUNSUPPORTED, "tensor '%s' has an unsupported type", name);
    w->type = (MnType)t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->data = t->data;
    return MN_OK;
}

/* w's rows [r0, r0 + n) as a matrix of their own (a view of the same data). */
static void matrix_rows(const MatW *w, int64_t r0, int64_t n, MatW *out) {
    uint64_t row_bytes = 0;
    ttype_row_bytes(w->type, (uint64_t)w->n_in, &row_bytes); /* checked when w was bound */
    *out = *w;
    out->n_out = n;
    out->data = (const uint8_t *)w->data + (uint64_t)r0 * row_bytes;
}

/* Convert a 1-D tensor of n elements to f32 at dst. */
static int bind_vector(const Gguf *g, const char *name, int64_t n, float *dst, MnErr *err) {
    const GgufTensor *t;
    int rc = find_tensor(g, name, &t, err);
    if (rc) return rc;
    if (t->n_dims != 1 || (int64_t)t->ne[0] != n)
        return mn_err_set(err, MN_EFORMAT, "tensor '%s' has %llu elements in %u dims, expected %lld", name,
                          (unsigned long long)t->ne[0], t->n_dims, (long long)n);
    if (ttype_traits(t->type) == NULL || n % (int64_t)ttype_traits(t->type)->block_elems != 0)
        return mn_err_set(err, MN_EUNSUPPORTED, "tensor '%s' has an unsupported type", name);
    ttype_dequantize_row((MnType)t->type, t->data, dst, n);
    return MN_OK;
}

/* Floats needed for all 1-D tensors. */
static size_t vector_floats(const ModelConfig *c) {
    size_t per_layer = 2 * (size_t)c->n_embd;
    if (c->has_qkv_bias) per_layer += (size_t)c->q_dim + 2 * (size_t)c->kv_dim;
    if (c->has_qk_norm) per_layer += 2 * (size_t)c->head_dim;
    if (c->has_post_norms) per_layer += 2 * (size_t)c->n_embd;
    return per_layer * (size_t)c->n_layer + (size_t)c->n_embd + 3 * ((size_t)c->n_rot / 2);
}

/* Layer il's matrices: bound in place, nothing allocated. */
static int bind_layer_matrices(const Gguf *g, const ModelConfig *c, int il, LayerWeights *L, MnErr *err) {
    char name[96];
    int rc;
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", il, suffix), name)
    MatW fused;
    if (gguf_find_tensor(g, NAME("attn_qkv.weight")) != NULL) { /* Q, K and V as one matrix's rows */
        if ((rc = bind_matrix(g, name, c->n_embd, c->q_dim + 2 * c->kv_dim, &fused, err))) return rc;
        matrix_rows(&fused, 0, c->q_dim, &L->wq);
        matrix_rows(&fused, c->q_dim, c->kv_dim, &L->wk);
        matrix_rows(&fused, c->q_dim + c->kv_dim, c->kv_dim, &L->wv);
    } else if ((rc = bind_matrix(g, NAME("attn_q.weight"), c->n_embd, c->q_dim, &L->wq, err)) ||
               (rc = bind_matrix(g, NAME("attn_k.weight"), c->n_embd, c->kv_dim, &L->wk, err)) ||
               (rc = bind_matrix(g, NAME("attn_v.weight"), c->n_embd, c->kv_dim, &L->wv, err))) {
        return rc;
    }
    if (c->arch == ARCH_PHI3) { /* gate and up as one matrix's rows, gate first */
        if ((rc = bind_matrix(g, NAME("ffn_up.weight"), c->n_embd, 2 * (int64_t)c->n_ff, &fused, err))) return rc;
        matrix_rows(&fused, 0, c->n_ff, &L->w_gate);
        matrix_rows(&fused, c->n_ff, c->n_ff, &L->w_up);
    } else if ((rc = bind_matrix(g, NAME("ffn_gate.weight"), c->n_embd, c->n_ff, &L->w_gate, err)) ||
               (rc = bind_matrix(g, NAME("ffn_up.weight"), c->n_embd, c->n_ff, &L->w_up, err))) {
        return rc;
    }
    if ((rc = bind_matrix(g, NAME("attn_output.weight"), c->q_dim, c->n_embd, &L->wo, err)) ||
        (rc = bind_matrix(g, NAME("ffn_down.weight"), c->n_ff, c->n_embd, &L->w_down, err)))
        return rc;
#undef NAME
    return MN_OK;
}

/* Layer il's 1-D tensors, converted to f32 at *vec (advanced past them). */
static int bind_layer_vectors(const Gguf *g, const ModelConfig *c, int il, LayerWeights *L, float **vec,
                              MnErr *err) {
    char name[96];
    int rc;
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", il, suffix), name)
    L->window = layer_slides(c, il) ? c->n_swa : 0;
    L->attn_norm = *vec;
    if ((rc = bind_vector(g, NAME("attn_norm.weight"), c->n_embd, *vec, err))) return rc;
    *vec += c->n_embd;
    L->ffn_norm = *vec;
    if ((rc = bind_vector(g, NAME("ffn_norm.weight"), c->n_embd, *vec, err))) return rc;
    *vec += c->n_embd;
    if (c->has_qkv_bias) {
        L->bq = *vec;
        if ((rc = bind_vector(g, NAME("attn_q.bias"), c->q_dim, *vec, err))) return rc;
        *vec += c->q_dim;
        L->bk = *vec;
        if ((rc = bind_vector(g, NAME("attn_k.bias"), c->kv_dim, *vec, err))) return rc;
        *vec += c->kv_dim;
        L->bv = *vec;
        if ((rc = bind_vector(g, NAME("attn_v.bias"), c->kv_dim, *vec, err))) return rc;
        *vec += c->kv_dim;
    }
    if (c->has_post_norms) {
        L->attn_post_norm = *vec;
        if ((rc = bind_vector(g, NAME("post_attention_norm.weight"), c->n_embd, *vec, err))) return rc;
        *vec += c->n_embd;
        L->ffn_post_norm = *vec;
        if ((rc = bind_vector(g, NAME("post_ffw_norm.weight"), c->n_embd, *vec, err))) return rc;
        *vec += c->n_embd;
    }
    if (c->has_qk_norm) {
        L->q_norm = *vec;
        if ((rc = bind_vector(g, NAME("attn_q_norm.weight"), c->head_dim, *vec, err))) return rc;
        *vec += c->head_dim;
        L->k_norm = *vec;
        if ((rc = bind_vector(g, NAME("attn_k_norm.weight"), c->head_dim, *vec, err))) return rc;
        *vec += c->head_dim;
    }
#undef NAME
    return MN_OK;
}

static int bind_all(Model *m, MnErr *err) {
    ModelConfig *c = &m->cfg;
    const GgufTensor *te = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (te == NULL) return mn_err_set(err, MN_EFORMAT, "tensor 'token_embd.weight' is missing");
    if (te->n_dims != 2 || te->ne[1] == 0 || te->ne[1] > (1u << 24))
        return mn_err_set(err, MN_EFORMAT, "tensor 'token_embd.weight' has an invalid shape");
    c->n_vocab = (int)te->ne[1];
    int rc = bind_matrix(m->gguf, "token_embd.weight", c->n_embd, c->n_vocab, &m->tok_embd, err);
    if (rc) return rc;
    if (gguf_find_tensor(m->gguf, "output.weight") != NULL) {
        rc = bind_matrix(m->gguf, "output.weight", c->n_embd, c->n_vocab, &m->output, err);
        if (rc) return rc;
    } else {
        m->output = m->tok_embd;
        m->is_output_tied = true;
    }
    m->layers = mn_calloc((size_t)c->n_layer, sizeof *m->layers);
    if (m->layers == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    for (int il = 0; il < c->n_layer; il++)
        if ((rc = bind_layer_matrices(m->gguf, c, il, &m->layers[il], err))) return rc;
    /* Only now, with every matrix found in the file, is `vectors` sized.
     * Its size comes from the hyper-parameters alone, which a small file
     * can set to ask for gigabytes; but a layer's matrices hold about as
     * many elements as its 1-D tensors or more (wq alone has n_embd * q_dim),
     * at a third of a byte or more each, and they lie in the file without
     * overlapping: a file that got this far is within a small factor of
     * the allocation's size. */
    m->vectors = mn_calloc(vector_floats(c), sizeof(float));
    if (m->vectors == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    float *vec = m->vectors;
    m->out_norm = vec;
    if ((rc = bind_vector(m->gguf, "output_norm.weight", c->n_embd, vec, err))) return rc;
    vec += c->n_embd;
    for (int il = 0; il < c->n_layer; il++)
        if ((rc = bind_layer_vectors(m->gguf, c, il, &m->layers[il], &vec, err))) return rc;
    /* per-pair RoPE factors: Llama 3.1+'s, and LongRoPE's two sets */
    static const char *const factor_names[] = {"rope_freqs.weight", "rope_factors_long.weight",
                                               "rope_factors_short.weight"};
    const float **factors[] = {&m->rope_factors, &m->rope_long, &m->rope_short};
    for (int f = 0; f < 3; f++) {
        if (gguf_find_tensor(m->gguf, factor_names[f]) == NULL) continue;
        if ((rc = bind_vector(m->gguf, factor_names[f], c->n_rot / 2, vec, err))) return rc;
        for (int i = 0; i < c->n_rot / 2; i++)
            if (!(vec[i] > 0.0f) || !isfinite(vec[i]))
                return mn_err_set(err, MN_EFORMAT, "%s[%d] is %g; factors must be positive", factor_names[f], i,
                                  vec[i]);
        *factors[f] = vec;
        vec += c->n_rot / 2;
    }
    if ((m->rope_long == NULL) != (m->rope_short == NULL))
        return mn_err_set(err, MN_EFORMAT, "LongRoPE needs both rope_factors_long and rope_factors_short");
    for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) m->weight_bytes += gguf_tensor(m->gguf, i)->n_bytes;
    return MN_OK;
}

/* ---- API ---------------------------------------------------------------- */

int model_load(const char *path, Model **out, MnErr *err) { return model_load_with(path, GGUF_READ, out, err); }

int model_load_with(const char *path, GgufHold hold, Model **out, MnErr *err) {
    *out = NULL;
    Model *m = mn_calloc(1, sizeof *m);
    if (m == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    int rc = gguf_open_with(path, hold, &m->gguf, err); /* its messages name the file */
    if (rc != MN_OK) {
        model_free(m);
        return rc;
    }
    rc = config_read(m->gguf, &m->cfg, err);
    if (rc == MN_OK) rc = bind_all(m, err);
    if (rc == MN_OK) rc = tok_load(m->gguf, &m->tok, err);
    if (rc == MN_OK) m->fingerprint = hash128(gguf_file_data(m->gguf), gguf_file_bytes(m->gguf));
    if (rc == MN_OK && tok_n_vocab(m->tok) > m->cfg.n_vocab)
        rc = mn_err_set(err, MN_EFORMAT, "vocabulary has %d tokens but token_embd has only %d rows",
                        tok_n_vocab(m->tok), m->cfg.n_vocab);
    if (rc != MN_OK) {
        mn_err_prefix(err, "%s", path);
        model_free(m);
        return rc;
    }
    *out = m;
    return MN_OK;
}

void model_free(Model *m) {
    if (m == NULL) return;
    tok_free(m->tok);
    mn_free(m->layers);
    mn_free(m->vectors);
    gguf_close(m->gguf);
    mn_free(m);
}

void model_rope_inv_freq(const Model *m, bool is_swa, int n_ctx, double *inv_freq) {
    const ModelConfig *c = &m->cfg;
    const float *factors = m->rope_factors;
    if (factors == NULL && m->rope_long) factors = n_ctx > c->n_ctx_orig ? m->rope_long : m->rope_short;
    double base = is_swa ? (double)c->rope_base_swa : (double)c->rope_base;
    bool is_scaled = !(is_swa && c->arch == ARCH_GEMMA3); /* gemma3 scales its global layers only */
    for (int i = 0; i < c->n_rot / 2; i++) {
        double f = pow(base, -2.0 * i / (double)c->n_rot);
        if (factors) f /= (double)factors[i];
        inv_freq[i] = is_scaled ? f * (double)c->rope_freq_scale : f;
    }
}

void model_embed(const Model *m, int32_t id, float *out) {
    const MatW *e = &m->tok_embd;
    uint64_t row_bytes = 0;
    ttype_row_bytes(e->type, (uint64_t)e->n_in, &row_bytes);
    ttype_dequantize_row(e->type, (const char *)e->data + (uint64_t)id * row_bytes, out, e->n_in);
}
