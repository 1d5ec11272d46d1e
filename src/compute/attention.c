/* attention.c — paged multi-token causal attention (see attention.h).
 *
 * A work unit is one (query token, KV head) pair: the K row of each position
 * is converted to f32 once and dotted with every query head of the group
 * (GQA), scores are soft-maxed per head, and V rows are accumulated in
 * ascending position order. Units are dealt to threads round-robin, so a
 * prefill's long-context tokens spread over all workers.
 */
#include "compute/attention.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "compute/ops.h"

size_t attn_scratch_floats(int max_ctx, int n_head, int n_head_kv, int head_dim) {
    size_t group = (size_t)(n_head / n_head_kv);
    return group * (size_t)max_ctx + 2 * (size_t)head_dim + 16;
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

static void attn_unit(const AttnJob *job, int t, int kvh, float *scratch) {
    const AttnBatch *b = job->b;
    const AttnKv *kv = job->kv;
    const int hd = b->head_dim, group = b->n_head / b->n_head_kv;
    const int32_t pos = b->pos[t];
    const AttnSeq *s = &b->seqs[b->seq[t]];
    assert(pos >= 0 && pos / kv->block_tokens < s->n_blocks);
    const int n_ctx = pos + 1;
    float *scores = scratch;                         /* (group, n_ctx) */
    float *kbuf = scratch + (size_t)group * (size_t)n_ctx; /* (head_dim) */
    const float scale = 1.0f / sqrtf((float)hd);
    const float *q0 = b->q + ((size_t)t * (size_t)b->n_head + (size_t)kvh * (size_t)group) * (size_t)hd;

    for (int32_t p = 0; p < n_ctx; p++) {
        const float *k = kv_row(kv, s, p, kvh, hd, 0, kbuf);
        for (int g = 0; g < group; g++) scores[(size_t)g * n_ctx + p] = ops_dot(q0 + (size_t)g * hd, k, hd) * scale;
    }
    for (int g = 0; g < group; g++) {
        float *sg = scores + (size_t)g * n_ctx;
        float max = sg[0];
        for (int p = 1; p < n_ctx; p++) max = sg[p] > max ? sg[p] : max;
        double sum = 0.0;
        for (int p = 0; p < n_ctx; p++) {
            sg[p] = expf(sg[p] - max);
            sum += (double)sg[p];
        }
        float inv = (float)(1.0 / sum);
        for (int p = 0; p < n_ctx; p++) sg[p] *= inv;
    }
    float *o0 = job->out + ((size_t)t * (size_t)b->n_head + (size_t)kvh * (size_t)group) * (size_t)hd;
    memset(o0, 0, (size_t)group * (size_t)hd * sizeof(float));
    for (int32_t p = 0; p < n_ctx; p++) {
        const float *v = kv_row(kv, s, p, kvh, hd, 1, kbuf);
        for (int g = 0; g < group; g++) {
            float w = scores[(size_t)g * n_ctx + p];
            float *o = o0 + (size_t)g * hd;
            for (int i = 0; i < hd; i++) o[i] += w * v[i];
        }
    }
}

static void attn_worker(void *ctx, int ith, int nth) {
    const AttnJob *job = ctx;
    float *scratch = job->scratch + (size_t)ith * job->scratch_per_thread;
    long n_units = (long)job->b->n_tok * job->b->n_head_kv;
    for (long u = ith; u < n_units; u += nth) attn_unit(job, (int)(u / job->b->n_head_kv), (int)(u % job->b->n_head_kv), scratch);
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
