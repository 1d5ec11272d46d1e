/* attention.c — paged multi-token causal attention (see attention.h).
 *
 * A work unit is a tile of up to 16 consecutive query tokens of one
 * sequence and one KV head: the K row of each position is converted to f32
 * once and dotted with every query of the tile and every query head of the
 * group (GQA), scores are soft-maxed per query and head, and V rows are
 * accumulated in ascending position order. Units are dealt to threads
 * round-robin, so a prefill's long-context tokens spread over all workers.
 */
#include "compute/attention.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compute/ops.h"

enum { ATTN_TILE_MAX = 16 }; /* = ATTN_TILE below */

size_t attn_scratch_floats(int max_ctx, int n_head, int n_head_kv, int head_dim) {
    size_t group = (size_t)(n_head / n_head_kv);
    /* scores (tile, group, ctx) + a K row + V rows as f32 (ctx, head_dim) + an accumulator */
    return ATTN_TILE_MAX * group * (size_t)max_ctx + (size_t)max_ctx * (size_t)head_dim + 3 * (size_t)head_dim + 16;
}

typedef struct AttnJob {
    float *out;
    const AttnBatch *b;
    const AttnKv *kv;
    float *scratch;
    size_t scratch_per_thread;
} AttnJob;

/* Row of head kvh at position p of a sequence, as f32 in buf (or in place). */
static const float *kv_row(const AttnKv *kv, const AttnSeq *s, int32_t p, int kvh, int head_dim, int is_v,
                           float *buf) {
    int32_t slot = s->blocks[p / kv->block_tokens];
    size_t elem = kv->kv_type == MN_TYPE_F16 ? 2 : 4;
    const uint8_t *row = kv->arena + (size_t)slot * kv->block_bytes + (is_v ? kv->v_offset : 0) +
                         ((size_t)(p % kv->block_tokens) * (size_t)kv->kv_dim + (size_t)kvh * (size_t)head_dim) * elem;
    if (kv->kv_type == MN_TYPE_F32) return (const float *)row;
    ops_f16_to_f32(buf, (const uint16_t *)row, head_dim);
    return buf;
}

/* acc = sum over p in [lo, n_ctx) of w[p] * v[p] (rows of hd), in ascending p. */
static inline void accum_v(float *restrict acc, const float *restrict w, const float *restrict v, int lo, int n_ctx,
                           int hd) {
    for (int d = 0; d < hd; d++) acc[d] = 0.0f;
    for (int p = lo; p < n_ctx; p++) {
        const float wp = w[p];
        const float *vp = v + (size_t)p * (size_t)hd;
        for (int d = 0; d < hd; d++) acc[d] += wp * vp[d];
    }
}

/* Queries of one sequence taken together: each K and V row is converted
 * once per tile instead of once per query. */
enum { ATTN_TILE = ATTN_TILE_MAX };

/* The first position query token t attends to. */
static inline int32_t window_lo(const AttnBatch *b, int t) {
    int32_t lo = b->window > 0 ? b->pos[t] - b->window + 1 : 0;
    return lo > 0 ? lo : 0;
}

/* One (tile of query tokens, KV head) unit. Each query's arithmetic is the
 * same whatever tile it is in: scores as dot * scale (soft-capped), the
 * softmax over its window in ascending positions (sum in double), V
 * accumulated in ascending positions. */
static void attn_tile(const AttnJob *job, int t0, int n_q, int kvh, float *scratch) {
    const AttnBatch *b = job->b;
    const AttnKv *kv = job->kv;
    const int hd = b->head_dim, group = b->n_head / b->n_head_kv;
    const AttnSeq *s = &b->seqs[b->seq[t0]];
    int32_t max_pos = 0, min_lo = INT32_MAX;
    for (int i = 0; i < n_q; i++) {
        assert(b->pos[t0 + i] >= 0 && b->pos[t0 + i] / kv->block_tokens < s->n_blocks);
        max_pos = b->pos[t0 + i] > max_pos ? b->pos[t0 + i] : max_pos;
        min_lo = window_lo(b, t0 + i) < min_lo ? window_lo(b, t0 + i) : min_lo;
    }
    const size_t stride = (size_t)max_pos + 1;
    float *scores = scratch;                                  /* (n_q, group, stride) */
    float *kbuf = scratch + (size_t)n_q * (size_t)group * stride; /* (head_dim) */
    float *acc = kbuf + hd;                                   /* (head_dim) */
    float *vbuf = acc + hd;                                   /* (max_pos + 1, head_dim) */
    const float scale = b->scale > 0.0f ? b->scale : 1.0f / sqrtf((float)hd);
#define Q_OF(i) (b->q + ((size_t)(t0 + (i)) * (size_t)b->n_head + (size_t)kvh * (size_t)group) * (size_t)hd)
#define S_OF(i, g) (scores + ((size_t)(i) * (size_t)group + (size_t)(g)) * stride)

    const float cap = b->softcap;
    for (int32_t p = min_lo; p <= max_pos; p++) {
        const float *k = kv_row(kv, s, p, kvh, hd, 0, kbuf);
        for (int i = 0; i < n_q; i++) {
            if (p > b->pos[t0 + i] || p < window_lo(b, t0 + i)) continue;
            const float *q0 = Q_OF(i);
            for (int g = 0; g < group; g++) {
                float sc = ops_dot(q0 + (size_t)g * hd, k, hd) * scale;
                S_OF(i, g)[p] = cap > 0.0f ? cap * tanhf(sc / cap) : sc;
            }
        }
    }
    for (int i = 0; i < n_q; i++) {
        const int lo = window_lo(b, t0 + i), n_ctx = b->pos[t0 + i] + 1;
        for (int g = 0; g < group; g++) {
            float *sg = S_OF(i, g);
            float max = sg[lo];
            for (int p = lo + 1; p < n_ctx; p++) max = sg[p] > max ? sg[p] : max;
            for (int p = lo; p < n_ctx; p++) sg[p] = expf(sg[p] - max);
            double sum = 0.0; /* in ascending positions, apart from the exps so they pipeline */
            for (int p = lo; p < n_ctx; p++) sum += (double)sg[p];
            float inv = (float)(1.0 / sum);
            for (int p = lo; p < n_ctx; p++) sg[p] *= inv;
        }
    }
    /* V rows converted once, then each output accumulated over ascending
     * positions in a local row */
    for (int32_t p = min_lo; p <= max_pos; p++) {
        const float *v = kv_row(kv, s, p, kvh, hd, 1, vbuf + (size_t)p * (size_t)hd);
        if (v != vbuf + (size_t)p * (size_t)hd) memcpy(vbuf + (size_t)p * (size_t)hd, v, (size_t)hd * sizeof(float));
    }
    for (int i = 0; i < n_q; i++) {
        float *o0 = job->out + ((size_t)(t0 + i) * (size_t)b->n_head + (size_t)kvh * (size_t)group) * (size_t)hd;
        const int lo = window_lo(b, t0 + i), n_ctx = b->pos[t0 + i] + 1;
        for (int g = 0; g < group; g++) {
            if (hd == 64) accum_v(acc, S_OF(i, g), vbuf, lo, n_ctx, 64);
            else accum_v(acc, S_OF(i, g), vbuf, lo, n_ctx, hd);
            memcpy(o0 + (size_t)g * hd, acc, (size_t)hd * sizeof(float));
        }
    }
#undef Q_OF
#undef S_OF
}

/* Tiles are runs of at most ATTN_TILE consecutive batch tokens of one
 * sequence; units (tile, KV head) are dealt round-robin. Every worker walks
 * the same tiling, so no shared state is needed. */
static void attn_worker(void *ctx, int ith, int nth) {
    const AttnJob *job = ctx;
    const AttnBatch *b = job->b;
    float *scratch = job->scratch + (size_t)ith * job->scratch_per_thread;
    long u = 0;
    for (int t0 = 0; t0 < b->n_tok;) {
        int n_q = 1;
        while (n_q < ATTN_TILE && t0 + n_q < b->n_tok && b->seq[t0 + n_q] == b->seq[t0]) n_q++;
        for (int kvh = 0; kvh < b->n_head_kv; kvh++, u++)
            if (u % nth == ith) attn_tile(job, t0, n_q, kvh, scratch);
        t0 += n_q;
    }
}

void attn_forward(ThreadPool *tp, float *out, const AttnBatch *b, const AttnKv *kv, float *scratch,
                  size_t scratch_per_thread) {
    assert(b->n_head % b->n_head_kv == 0);
    AttnJob job = {out, b, kv, scratch, scratch_per_thread};
    if (tp == NULL)
        attn_worker(&job, 0, 1);
    else
        tpool_run(tp, attn_worker, &job);
}
