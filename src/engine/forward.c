/* forward.c — the transformer, layer by layer over a batch (see forward.h).
 *
 * For each layer, the whole batch goes through: RMS norm, Q/K/V projections
 * (+ biases; qwen3: an RMS norm of each Q and K head), RoPE at each token's position, K/V written into the pool,
 * paged attention, output projection (gemma: and an RMS norm) and residual,
 * then RMS norm and the gated feed-forward (SwiGLU, or GeGLU for gemma; gemma:
 * an RMS norm after it) and residual. Sliding layers attend over a window,
 * with RoPE frequencies of their own where the architecture has them. Matmuls and attention split their work
 * over the compute pool by output; the element-wise stages in between split
 * it by token. The final norm and the vocabulary
 * projection run only for the rows whose logits were asked for.
 *
 * A split chunk (FwdBatch.n_split) sits at the batch's tail, so a layer
 * it does not run is the same layer over a shorter batch, the first
 * n_tok - n_split rows; its residual rows stay in x meanwhile, and between
 * passes in its carry slot. Every token's arithmetic is the same as in one whole
 * pass, so the split changes no bit.
 *
 * Buffers (all (rows, width) row-major f32, sized at fwd_new):
 *   x     (max_tokens, n_embd)   residual stream
 *   xb    (max_tokens, n_embd)   normed input / attention output
 *   q     (max_tokens, q_dim)
 *   k, v  (max_tokens, kv_dim)
 *   att   (max_tokens, q_dim)
 *   hb, hb2 (max_tokens, n_ff)
 *   xl    (max_logits, n_embd)   normed rows for the vocabulary projection
 *   logits (max_logits, n_vocab)
 *   carry (max_splits, max_tokens, n_embd)  split chunks' residual rows between passes
 */
#include "engine/forward.h"

#include <stdatomic.h>
#include <string.h>

#include "base/mem.h"
#include "compute/matmul.h"
#include "compute/ops.h"

/* Blocks one projection of hidden states multiplies at once. */
#define PROJ_BLOCKS 4

struct Forward {
    const Model *m;
    KvPool *pool;
    FwdOptions opt;
    ThreadPool *tp;
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *xl, *logits;
    float *carry;         /* (max_splits, max_tokens, n_embd): in slot i, carry_n[i] rows of a
                             split chunk entering layer carry_layer[i] (0: nothing carried) */
    int *carry_n, *carry_layer; /* (max_splits) */
    float *attn_scratch;
    size_t attn_scratch_per_thread;
    double *inv_freq;     /* (n_rot / 2) RoPE's inverse frequencies, global layers */
    double *inv_freq_swa; /* (n_rot / 2) sliding layers' */
    MmPack hid_pack;      /* how hidden rows are packed (fwd_hidden_row_bytes); NONE: f32 rows */
    size_t hid_row;       /* bytes of one token's hidden row */
    uint8_t *proj_in;     /* (PROJ_BLOCKS * block_tokens) hidden rows, gathered */
    float *proj_k, *proj_v; /* (PROJ_BLOCKS * block_tokens, kv_dim) */
    uint8_t *proj_scratch;  /* mm_matmul_packed's */
};

/* Every layer's K and V projections take int8 activations packed alike
 * (the K-quants' or the 32-element types'): only then is one packed form
 * their whole operand; else the f32 row (NONE). */
static MmPack hidden_pack(const Model *m) {
    const MmPack kind = mm_pack_kind(&m->layers[0].wk);
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (mm_pack_kind(&m->layers[l].wk) != kind || mm_pack_kind(&m->layers[l].wv) != kind) return MM_PACK_NONE;
    return kind;
}

static size_t hidden_row_bytes(const Model *m, MmPack kind) {
    const int64_t d = m->cfg.n_embd;
    return kind != MM_PACK_NONE ? mm_packed_row_bytes(kind, d) : (size_t)d * sizeof(float);
}

size_t fwd_hidden_row_bytes(const Model *m) { return hidden_row_bytes(m, hidden_pack(m)); }

static float *alloc_rows(size_t rows, int width) {
    return mn_alloc_aligned(rows * (size_t)width * sizeof(float), 64);
}

int fwd_new(const Model *m, KvPool *pool, const FwdOptions *opt, Forward **out, MnErr *err) {
    const ModelConfig *c = &m->cfg;
    *out = NULL;
    if (opt->max_tokens < 1 || opt->max_logits < 1 || opt->max_ctx < 1 || opt->n_threads < 1 || opt->max_splits < 0)
        return mn_err_set(err, MN_EINVAL, "forward: batch sizes and thread count must be positive");
    if (pool->n_layer != c->n_layer || pool->kv_dim != c->kv_dim)
        return mn_err_set(err, MN_EINVAL, "forward: KV pool does not match the model");
    Forward *f = mn_calloc(1, sizeof *f);
    if (f == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    f->m = m;
    f->pool = pool;
    f->opt = *opt;
    int T = opt->max_tokens, L = opt->max_logits;
    f->tp = tpool_new(opt->n_threads);
    f->x = alloc_rows(T, c->n_embd);
    f->xb = alloc_rows(T, c->n_embd);
    f->q = alloc_rows(T, c->q_dim);
    f->k = alloc_rows(T, c->kv_dim);
    f->v = alloc_rows(T, c->kv_dim);
    f->att = alloc_rows(T, c->q_dim);
    f->hb = alloc_rows(T, c->n_ff);
    f->hb2 = alloc_rows(T, c->n_ff);
    f->xl = alloc_rows(L, c->n_embd);
    f->logits = alloc_rows(L, c->n_vocab);
    int S = opt->max_splits;
    const size_t carry_rows = (size_t)S * (size_t)T;
    f->carry = alloc_rows(carry_rows > 0 ? carry_rows : 1, c->n_embd);
    f->carry_n = mn_calloc((size_t)S + 1, sizeof(int));
    f->carry_layer = mn_calloc((size_t)S + 1, sizeof(int));
    f->attn_scratch_per_thread = attn_scratch_floats(opt->max_ctx, c->n_head, c->n_head_kv, c->head_dim);
    f->attn_scratch = mn_alloc_aligned(f->attn_scratch_per_thread * sizeof(float) * (size_t)opt->n_threads, 64);
    f->inv_freq = mn_calloc((size_t)c->n_rot / 2, sizeof(double));
    f->inv_freq_swa = mn_calloc((size_t)c->n_rot / 2, sizeof(double));
    if (!f->tp || !f->x || !f->xb || !f->q || !f->k || !f->v || !f->att || !f->hb || !f->hb2 || !f->xl ||
        !f->logits || !f->carry || !f->carry_n || !f->carry_layer || !f->attn_scratch || !f->inv_freq || !f->inv_freq_swa) {
        fwd_free(f);
        return mn_err_set(err, MN_ENOMEM, "forward: out of memory for %d-token batches", T);
    }
    f->hid_pack = hidden_pack(m);
    f->hid_row = hidden_row_bytes(m, f->hid_pack);
    if (pool->hid_arenas != NULL) {
        const int P = PROJ_BLOCKS * pool->block_tokens;
        if (pool->hidden_row_bytes != f->hid_row) {
            fwd_free(f);
            return mn_err_set(err, MN_EINVAL, "forward: the pool's hidden rows are not the model's");
        }
        size_t scratch = 0;
        for (int l = 0; f->hid_pack != MM_PACK_NONE && l < c->n_layer; l++) {
            size_t sk = mm_packed_scratch_bytes(&m->layers[l].wk, P), sv = mm_packed_scratch_bytes(&m->layers[l].wv, P);
            scratch = sk > scratch ? sk : scratch;
            scratch = sv > scratch ? sv : scratch;
        }
        f->proj_in = mn_alloc_aligned((size_t)P * f->hid_row, 64);
        f->proj_k = alloc_rows(P, c->kv_dim);
        f->proj_v = alloc_rows(P, c->kv_dim);
        f->proj_scratch = mn_alloc_aligned(scratch > 0 ? scratch : 64, 64);
        if (!f->proj_in || !f->proj_k || !f->proj_v || !f->proj_scratch) {
            fwd_free(f);
            return mn_err_set(err, MN_ENOMEM, "forward: out of memory for projections");
        }
    }
    model_rope_inv_freq(m, false, opt->max_ctx, f->inv_freq);
    model_rope_inv_freq(m, true, opt->max_ctx, f->inv_freq_swa);
    *out = f;
    return MN_OK;
}

void fwd_free(Forward *f) {
    if (f == NULL) return;
    tpool_free(f->tp);
    float *bufs[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->hb,
                     f->hb2, f->xl, f->logits, f->carry, f->attn_scratch, f->proj_k, f->proj_v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mn_free_aligned(bufs[i]);
    mn_free_aligned(f->proj_in);
    mn_free_aligned(f->proj_scratch);
    mn_free(f->inv_freq);
    mn_free(f->inv_freq_swa);
    mn_free(f->carry_n);
    mn_free(f->carry_layer);
    mn_free(f);
}

ThreadPool *fwd_tpool(Forward *f) { return f->tp; }

/* ---- helpers -------------------------------------------------------------- */

/* A split chunk's layers are a range of the model's, and a chunk that
 * does not start at layer 0 goes on from the carried rows; its logits
 * come only with its last layer. */
static int check_split(const Forward *f, const FwdBatch *b, MnErr *err) {
    const int L = f->m->cfg.n_layer;
    if (b->n_split == 0) return MN_OK;
    const int s = b->split_slot;
    if (b->n_split < 0 || b->n_split > b->n_tok || b->split_first < 0 || b->split_first >= b->split_end ||
        b->split_end > L || s < 0 || s >= f->opt.max_splits)
        return mn_err_set(err, MN_EINVAL, "split chunk of %d tokens, layers [%d, %d) of %d, slot %d of %d", b->n_split,
                          b->split_first, b->split_end, L, s, f->opt.max_splits);
    if (b->split_first > 0 && (f->carry_layer[s] != b->split_first || f->carry_n[s] != b->n_split))
        return mn_err_set(err, MN_EINVAL, "split chunk of %d tokens from layer %d: slot %d carries %d rows to layer %d",
                          b->n_split, b->split_first, s, f->carry_n[s], f->carry_layer[s]);
    for (int i = 0; b->split_end < L && i < b->n_logits; i++)
        if (b->logit_idx[i] >= b->n_tok - b->n_split)
            return mn_err_set(err, MN_EINVAL, "logits of a split chunk's token before its last layer");
    return MN_OK;
}

static int check_batch(const Forward *f, const FwdBatch *b, MnErr *err) {
    const ModelConfig *c = &f->m->cfg;
    if (b->n_tok < 1 || b->n_tok > f->opt.max_tokens)
        return mn_err_set(err, MN_EINVAL, "batch of %d tokens (limit %d)", b->n_tok, f->opt.max_tokens);
    if (b->n_logits < 0 || b->n_logits > f->opt.max_logits)
        return mn_err_set(err, MN_EINVAL, "%d logit rows asked for (limit %d)", b->n_logits, f->opt.max_logits);
    for (int t = 0; t < b->n_tok; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->n_vocab)
            return mn_err_set(err, MN_EINVAL, "token id %d out of range [0, %d)", b->tokens[t], c->n_vocab);
        if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs)
            return mn_err_set(err, MN_EINVAL, "token %d names sequence %d of %d", t, b->seq[t], b->n_seqs);
        int32_t p = b->pos[t];
        if (p < 0 || p >= f->opt.max_ctx)
            return mn_err_set(err, MN_EINVAL, "position %d out of range [0, %d)", p, f->opt.max_ctx);
        const AttnSeq *s = &b->seqs[b->seq[t]];
        if (p / f->pool->block_tokens >= s->n_blocks)
            return mn_err_set(err, MN_EINVAL, "position %d lies past the sequence's %d blocks", p, s->n_blocks);
        for (int i = 0; i <= p / f->pool->block_tokens; i++)
            if (s->blocks[i] < 0 || s->blocks[i] >= f->pool->n_blocks)
                return mn_err_set(err, MN_EINVAL, "block table entry %d is slot %d of %d", i, s->blocks[i],
                                  f->pool->n_blocks);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_idx[i] < 0 || b->logit_idx[i] >= b->n_tok)
            return mn_err_set(err, MN_EINVAL, "logit row %d out of range", b->logit_idx[i]);
    return check_split(f, b, err);
}

/* ---- per-token stages -------------------------------------------------------
 * The element-wise work between the matmuls, split over the compute pool by
 * token: every token's arithmetic is the same whatever the split. */

typedef enum Stage {
    STAGE_ATTN_NORM,   /* xb = rmsnorm(x) */
    STAGE_QKV_POST,    /* biases, RoPE, K/V into the pool */
    STAGE_ATTN_RESID,  /* x += xb (attention output, gemma: normed); xb = rmsnorm(x) for the FFN */
    STAGE_GATE,        /* hb = act(hb) * hb2 */
    STAGE_FFN_RESID,   /* x += xb (gemma: normed) */
} Stage;

typedef struct StageJob {
    Forward *f;
    const FwdBatch *b;
    int il;
    Stage stage;
    long per;              /* tokens a worker takes at a time */
    atomic_long next_tok;  /* the first token not yet taken */
} StageJob;

/* Write one token's K and V rows of layer il into row `row` of slot. */
static void store_kv_row(const KvPool *p, int il, int32_t slot, int row, const float *k, const float *v) {
    const int kvd = p->kv_dim;
    size_t at = (size_t)row * (size_t)kvd;
    if (p->kv_type == MN_TYPE_F16) {
        ops_f32_to_f16((uint16_t *)kvpool_k(p, il, slot) + at, k, kvd);
        ops_f32_to_f16((uint16_t *)kvpool_v(p, il, slot) + at, v, kvd);
    } else {
        memcpy((float *)kvpool_k(p, il, slot) + at, k, (size_t)kvd * sizeof(float));
        memcpy((float *)kvpool_v(p, il, slot) + at, v, (size_t)kvd * sizeof(float));
    }
}

/* Write token t's K and V rows of layer il into its block, and with
 * hidden arenas the operand the K and V projections took: xb's row, or
 * its int8 quantization (the same bits the matmul made of it). */
static void store_kv(Forward *f, const FwdBatch *b, int il, int t) {
    const KvPool *p = f->pool;
    const AttnSeq *s = &b->seqs[b->seq[t]];
    int32_t slot = s->blocks[b->pos[t] / p->block_tokens];
    int row = b->pos[t] % p->block_tokens;
    store_kv_row(p, il, slot, row, f->k + (size_t)t * p->kv_dim, f->v + (size_t)t * p->kv_dim);
    if (il >= p->n_hidden_layers) return; /* (0 without hidden arenas) */
    const int64_t D = f->m->cfg.n_embd;
    uint8_t *h = (uint8_t *)kvpool_h(p, il, slot) + (size_t)row * p->hidden_row_bytes;
    if (f->hid_pack != MM_PACK_NONE) mm_pack_row(f->hid_pack, f->xb + t * D, D, h);
    else memcpy(h, f->xb + t * D, (size_t)D * sizeof(float));
    p->hid_rows[(size_t)slot * (size_t)p->block_tokens + (size_t)row] = 1;
}

/* What the pass does to a token's K and V after their projections, before
 * they are stored: biases, qwen3's K norm, RoPE at pos. One function for
 * the forward pass and for projections of hidden states, so both give the
 * same bits. */
static void kv_post(const Forward *f, int il, float *k, float *v, int32_t pos) {
    const ModelConfig *c = &f->m->cfg;
    const LayerWeights *lw = &f->m->layers[il];
    if (lw->bk) ops_add(k, lw->bk, c->kv_dim);
    if (lw->bv) ops_add(v, lw->bv, c->kv_dim);
    const int hd = c->head_dim;
    for (int h = 0; lw->k_norm && h < c->n_head_kv; h++)
        ops_rmsnorm(k + h * hd, k + h * hd, lw->k_norm, hd, c->rms_eps);
    const double *inv_freq = lw->window > 0 ? f->inv_freq_swa : f->inv_freq;
    ops_rope(k, c->n_head_kv, c->head_dim, c->n_rot, inv_freq, pos, c->rope_attn_factor,
             c->rope_style == ROPE_ADJACENT);
}

static void stage_token(const StageJob *j, int t) {
    Forward *f = j->f;
    const ModelConfig *c = &f->m->cfg;
    const LayerWeights *lw = &f->m->layers[j->il];
    const size_t D = (size_t)c->n_embd, QD = (size_t)c->q_dim, KV = (size_t)c->kv_dim, F = (size_t)c->n_ff;
    float *x = f->x + t * D, *xb = f->xb + t * D;
    switch (j->stage) {
    case STAGE_ATTN_NORM: ops_rmsnorm(xb, x, lw->attn_norm, (int)D, c->rms_eps); break;
    case STAGE_QKV_POST: {
        float *q = f->q + t * QD;
        if (lw->bq) ops_add(q, lw->bq, (int)QD);
        const int hd = c->head_dim;
        for (int h = 0; lw->q_norm && h < c->n_head; h++) /* in place: x is read whole first */
            ops_rmsnorm(q + h * hd, q + h * hd, lw->q_norm, hd, c->rms_eps);
        const double *inv_freq = lw->window > 0 ? f->inv_freq_swa : f->inv_freq;
        ops_rope(q, c->n_head, c->head_dim, c->n_rot, inv_freq, j->b->pos[t], c->rope_attn_factor,
                 c->rope_style == ROPE_ADJACENT);
        kv_post(f, j->il, f->k + t * KV, f->v + t * KV, j->b->pos[t]);
        store_kv(f, j->b, j->il, t);
        break;
    }
    case STAGE_ATTN_RESID:
        if (lw->attn_post_norm) ops_rmsnorm(xb, xb, lw->attn_post_norm, (int)D, c->rms_eps);
        ops_add(x, xb, (int)D);
        ops_rmsnorm(xb, x, lw->ffn_norm, (int)D, c->rms_eps);
        break;
    case STAGE_GATE:
        if (c->ffn_act == FFN_GELU) ops_geglu(f->hb + t * F, f->hb + t * F, f->hb2 + t * F, (int)F);
        else ops_swiglu(f->hb + t * F, f->hb + t * F, f->hb2 + t * F, (int)F);
        break;
    case STAGE_FFN_RESID:
        if (lw->ffn_post_norm) ops_rmsnorm(xb, xb, lw->ffn_post_norm, (int)D, c->rms_eps);
        ops_add(x, xb, (int)D);
        break;
    }
}

static void stage_worker(void *ctx, int ith, int nth) {
    StageJob *j = ctx;
    for (;;) {
        long lo = atomic_fetch_add_explicit(&j->next_tok, j->per, memory_order_relaxed);
        if (lo >= j->b->n_tok) break;
        long hi = lo + j->per < j->b->n_tok ? lo + j->per : j->b->n_tok;
        for (long t = lo; t < hi; t++) stage_token(j, (int)t);
    }
}

/* A stage's tokens in runs of a quarter of a worker's share. */
static void run_stage(Forward *f, const FwdBatch *b, int il, Stage stage) {
    const long n_runs = 4L * tpool_size(f->tp);
    StageJob j = {.f = f, .b = b, .il = il, .stage = stage, .per = (b->n_tok + n_runs - 1) / n_runs};
    atomic_init(&j.next_tok, 0);
    if (b->n_tok == 1) stage_worker(&j, 0, 1);
    else tpool_share(f->tp, stage_worker, &j);
}

/* Layer il over batch b (its first b->n_tok tokens: a split chunk that
 * does not run il is left out). */
static void layer_forward(Forward *f, const FwdBatch *b, int il) {
    const ModelConfig *c = &f->m->cfg;
    const LayerWeights *lw = &f->m->layers[il];
    const int T = b->n_tok;
    run_stage(f, b, il, STAGE_ATTN_NORM);
    mm_matmul(f->tp, f->q, &lw->wq, f->xb, T);
    mm_matmul(f->tp, f->k, &lw->wk, f->xb, T);
    mm_matmul(f->tp, f->v, &lw->wv, f->xb, T);
    run_stage(f, b, il, STAGE_QKV_POST);
    if (b->wait_layer) b->wait_layer(b->wait_ctx, il);
    const KvPool *p = f->pool;
    AttnKv kv = {p->arenas[il], p->block_bytes, p->block_bytes / 2, p->block_tokens, p->kv_dim, p->kv_type};
    AttnBatch ab = {.n_tok = T, .q = f->q, .seq = b->seq, .pos = b->pos, .seqs = b->seqs, .n_head = c->n_head,
                    .n_head_kv = c->n_head_kv, .head_dim = c->head_dim, .scale = c->attn_scale,
                    .window = lw->window, .softcap = c->attn_softcap};
    attn_forward(f->tp, f->att, &ab, &kv, f->attn_scratch, f->attn_scratch_per_thread);
    mm_matmul(f->tp, f->xb, &lw->wo, f->att, T);
    run_stage(f, b, il, STAGE_ATTN_RESID);
    mm_matmul(f->tp, f->hb, &lw->w_gate, f->xb, T);
    mm_matmul(f->tp, f->hb2, &lw->w_up, f->xb, T);
    run_stage(f, b, il, STAGE_GATE);
    mm_matmul(f->tp, f->xb, &lw->w_down, f->hb, T);
    run_stage(f, b, il, STAGE_FFN_RESID);
}

/* ---- projections of hidden states ------------------------------------------ */

/* K and V of blocks [0, n) (at most PROJ_BLOCKS) of layer il from their
 * hidden rows, into their slots. */
static void project_group(Forward *f, int il, const int32_t *slots, const int32_t *pos0, int n) {
    const KvPool *p = f->pool;
    const LayerWeights *lw = &f->m->layers[il];
    const int bt = p->block_tokens, T = n * bt, KV = f->m->cfg.kv_dim;
    for (int i = 0; i < n; i++) memcpy(f->proj_in + (size_t)i * p->hidden_bytes, kvpool_h(p, il, slots[i]), p->hidden_bytes);
    if (f->hid_pack != MM_PACK_NONE) {
        mm_matmul_packed(f->tp, f->proj_k, &lw->wk, f->proj_in, T, f->proj_scratch);
        mm_matmul_packed(f->tp, f->proj_v, &lw->wv, f->proj_in, T, f->proj_scratch);
    } else {
        mm_matmul(f->tp, f->proj_k, &lw->wk, (const float *)(const void *)f->proj_in, T);
        mm_matmul(f->tp, f->proj_v, &lw->wv, (const float *)(const void *)f->proj_in, T);
    }
    for (int i = 0; i < n; i++)
        for (int r = 0; r < bt; r++) {
            float *k = f->proj_k + (size_t)(i * bt + r) * KV, *v = f->proj_v + (size_t)(i * bt + r) * KV;
            kv_post(f, il, k, v, pos0[i] + r);
            store_kv_row(p, il, slots[i], r, k, v);
        }
}

int fwd_project(Forward *f, int layer, const int32_t *slots, const int32_t *pos0, int n, MnErr *err) {
    const KvPool *p = f->pool;
    if (layer < 0 || layer >= p->n_hidden_layers)
        return mn_err_set(err, MN_EINVAL, "forward: no hidden states to project in layer %d", layer);
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= p->n_blocks || pos0[i] < 0 || pos0[i] % p->block_tokens != 0 ||
            pos0[i] + p->block_tokens > f->opt.max_ctx)
            return mn_err_set(err, MN_EINVAL, "forward: block %d (slot %d, position %d) cannot be projected", i,
                              slots[i], pos0[i]);
    for (int i = 0; i < n; i += PROJ_BLOCKS)
        project_group(f, layer, slots + i, pos0 + i, n - i < PROJ_BLOCKS ? n - i : PROJ_BLOCKS);
    return MN_OK;
}

/* ---- API ------------------------------------------------------------------ */

int fwd_token_lanes(const Model *m, int n_tok) { return mm_token_lanes(&m->layers[0].w_up, n_tok); }

int fwd_run(Forward *f, const FwdBatch *b, const float **logits, MnErr *err) {
    int rc = check_batch(f, b, err);
    if (rc) return rc;
    const ModelConfig *c = &f->m->cfg;
    const int D = c->n_embd, n_whole = b->n_tok - b->n_split;
    const size_t split_bytes = (size_t)b->n_split * (size_t)D * sizeof(float);
    float *split_x = f->x + (size_t)n_whole * D;
    const bool is_carried = b->n_split > 0 && b->split_first > 0;
    float *carry = b->n_split > 0 ? f->carry + (size_t)b->split_slot * (size_t)f->opt.max_tokens * (size_t)D : NULL;
    for (int t = 0; t < (is_carried ? n_whole : b->n_tok); t++) {
        model_embed(f->m, b->tokens[t], f->x + (size_t)t * D);
        if (c->embd_scale != 1.0f) ops_scale(f->x + (size_t)t * D, c->embd_scale, D);
    }
    if (is_carried) memcpy(split_x, carry, split_bytes);
    FwdBatch part = *b; /* the batch of one layer: without the split chunk outside its layers */
    for (int il = 0; il < c->n_layer; il++) {
        bool has_split = b->n_split == 0 || (il >= b->split_first && il < b->split_end);
        part.n_tok = has_split ? b->n_tok : n_whole;
        if (part.n_tok > 0) layer_forward(f, &part, il);
    }
    if (b->n_split > 0) {
        bool is_last = b->split_end == c->n_layer;
        if (!is_last) memcpy(carry, split_x, split_bytes);
        f->carry_n[b->split_slot] = is_last ? 0 : b->n_split;
        f->carry_layer[b->split_slot] = is_last ? 0 : b->split_end;
    }
    for (int i = 0; i < b->n_logits; i++)
        ops_rmsnorm(f->xl + (size_t)i * D, f->x + (size_t)b->logit_idx[i] * D, f->m->out_norm, D, c->rms_eps);
    if (b->n_logits > 0) mm_matmul(f->tp, f->logits, &f->m->output, f->xl, b->n_logits);
    if (c->final_softcap > 0.0f) ops_softcap(f->logits, c->final_softcap, b->n_logits * c->n_vocab);
    *logits = f->logits;
    return MN_OK;
}
