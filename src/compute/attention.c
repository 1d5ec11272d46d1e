/* attention.c — paged multi-token causal attention (see attention.h).
 *
 * A work unit is a tile of up to 16 consecutive query tokens of one
 * sequence and one KV head: the K row of each position is converted to f32
 * once and dotted with every query of the tile and every query head of the
 * group (GQA), scores are soft-maxed per query and head, and V rows are
 * converted a block of positions at a time (kept in L1) and accumulated
 * into every output row of the unit, in ascending position order. Units
 * are dealt to threads round-robin, so a prefill's long-context tokens
 * spread over all workers.
 *
 * The arithmetic of one output element is fixed whatever the tile: the
 * score is the dot product in dot_row's order times the scale, and the
 * output is acc = acc + w[p] * v[p] (a product, then a sum: no fused
 * multiply-add) over ascending p from 0, so blocking the positions changes
 * nothing.
 */
#include "compute/attention.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compute/ops.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define ATTN_AVX512 1
#endif

#define ATTN_INLINE static inline __attribute__((always_inline))

enum {
    ATTN_TILE_MAX = 16, /* = ATTN_TILE below */
    ATTN_VB = 32,       /* V rows converted at a time */
};

size_t attn_scratch_floats(int max_ctx, int n_head, int n_head_kv, int head_dim) {
    size_t group = (size_t)(n_head / n_head_kv);
    /* scores (tile, group, ctx) + a K row + a block of V rows as f32 */
    return ATTN_TILE_MAX * group * (size_t)max_ctx + (ATTN_VB + 1) * (size_t)head_dim + 16;
}

typedef struct AttnJob {
    float *out;
    const AttnBatch *b;
    const AttnKv *kv;
    float *scratch;
    size_t scratch_per_thread;
} AttnJob;

/* Where the row of head kvh at position p of a sequence is stored. */
ATTN_INLINE const uint8_t *kv_addr(const AttnKv *kv, const AttnSeq *s, int32_t p, int kvh, int head_dim, int is_v) {
    int32_t slot = s->blocks[p / kv->block_tokens];
    size_t elem = kv->kv_type == MN_TYPE_F16 ? 2 : 4;
    return kv->arena + (size_t)slot * kv->block_bytes + (is_v ? kv->v_offset : 0) +
           ((size_t)(p % kv->block_tokens) * (size_t)kv->kv_dim + (size_t)kvh * (size_t)head_dim) * elem;
}

/* Positions ahead whose rows are fetched while one is used: a head's rows
 * are short and scattered over the blocks, so the hardware prefetcher
 * does not see them coming, and decode reads them from DRAM. */
enum { ATTN_PF_AHEAD = 8 };

/* Starts loading the row at position p, if the sequence has it. */
ATTN_INLINE void kv_prefetch(const AttnKv *kv, const AttnSeq *s, int32_t p, int32_t end, int kvh, int head_dim,
                             int is_v) {
    if (p >= end) return;
    const char *row = (const char *)kv_addr(kv, s, p, kvh, head_dim, is_v);
    size_t bytes = (size_t)head_dim * (kv->kv_type == MN_TYPE_F16 ? 2 : 4);
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
    __builtin_prefetch(row + bytes - 1, 0, 3);
}

/* Row of head kvh at position p of a sequence, as f32 in buf (or in place). */
ATTN_INLINE const float *kv_row(const AttnKv *kv, const AttnSeq *s, int32_t p, int kvh, int head_dim, int is_v,
                           float *buf) {
    const uint8_t *row = kv_addr(kv, s, p, kvh, head_dim, is_v);
    if (kv->kv_type == MN_TYPE_F32) return (const float *)row;
#if defined(ATTN_AVX512)
    if (head_dim % 16 == 0) { /* exact, as ops_f16_to_f32, without the call */
        for (int d = 0; d < head_dim; d += 16)
            _mm512_storeu_ps(buf + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)d))));
        return buf;
    }
#endif
    ops_f16_to_f32(buf, (const uint16_t *)row, head_dim);
    return buf;
}

/* sum_i a[i] * b[i] over a head's n elements in a fixed order of 16
 * lanes: lane l takes the elements l, l + 16, ..., then the lanes are
 * summed pairwise (l, l + 8), (l, l + 4), (l, l + 2), (l, l + 1), the order
 * of AVX-512's reduction. With AVX-512 and n a multiple of 16 the lanes
 * are one register of fused multiply-adds. Inline: decode calls it group
 * times per cached position. */
enum { DOT_LANES = 16 };
ATTN_INLINE float dot_row(const float *a, const float *b, int n) {
#if defined(ATTN_AVX512)
    if (n % DOT_LANES == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int i = 0; i < n; i += DOT_LANES)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        return _mm512_reduce_add_ps(acc);
    }
#endif
    float acc[DOT_LANES] = {0};
    int i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int j = 0; j < DOT_LANES; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i + j < n; j++) acc[j] += a[i + j] * b[i + j];
    for (int w = DOT_LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* o[d] += w[p] * v[p][d] for p in [p0, p1), rows of hd from vb (row p at
 * vb + (p - pb) * hd): a product, then a sum, in ascending p. */
static inline void accum_v(float *restrict o, const float *restrict w, const float *restrict vb, int pb, int p0,
                           int p1, int hd) {
    for (int p = p0; p < p1; p++) {
        const float wp = w[p];
        const float *vp = vb + (size_t)(p - pb) * (size_t)hd;
        for (int d = 0; d < hd; d++) o[d] += wp * vp[d];
    }
}

#if defined(ATTN_AVX512)
/* accum_v for hd = 16 * NC, the row kept in NC registers across the block. */
ATTN_INLINE void accum_v16(float *restrict o, const float *restrict w, const float *restrict vb, int pb, int p0,
                           int p1, int NC) {
    __m512 acc[8];
    for (int c = 0; c < NC; c++) acc[c] = _mm512_loadu_ps(o + 16 * c);
    for (int p = p0; p < p1; p++) {
        const __m512 wp = _mm512_set1_ps(w[p]);
        const float *vp = vb + (size_t)(p - pb) * (size_t)(16 * NC);
        for (int c = 0; c < NC; c++) acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(wp, _mm512_loadu_ps(vp + 16 * c)));
    }
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
}
#endif

/* accum_v by head size: the usual ones with the row in registers. */
static void accum_v_any(float *restrict o, const float *restrict w, const float *restrict vb, int pb, int p0, int p1,
                        int hd) {
#if defined(ATTN_AVX512)
    switch (hd) {
    case 64: accum_v16(o, w, vb, pb, p0, p1, 4); return;
    case 128: accum_v16(o, w, vb, pb, p0, p1, 8); return;
    default: break;
    }
#endif
    accum_v(o, w, vb, pb, p0, p1, hd);
}

/* The largest of x[0..n), n >= 1: the same value in any order (no NaN
 * scores: they come from finite rows). */
static float max_of(const float *x, int n) {
    int i = 0;
    float max = x[0];
#if defined(ATTN_AVX512)
    if (n >= 16) {
        __m512 m = _mm512_loadu_ps(x);
        for (i = 16; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
        max = _mm512_reduce_max_ps(m);
    }
#endif
    for (; i < n; i++) max = x[i] > max ? x[i] : max;
    return max;
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
    float *vbuf = kbuf + hd;                                      /* (ATTN_VB, head_dim) */
    const float scale = b->scale > 0.0f ? b->scale : 1.0f / sqrtf((float)hd);
#define Q_OF(i) (b->q + ((size_t)(t0 + (i)) * (size_t)b->n_head + (size_t)kvh * (size_t)group) * (size_t)hd)
#define S_OF(i, g) (scores + ((size_t)(i) * (size_t)group + (size_t)(g)) * stride)

    const float cap = b->softcap;
    for (int32_t p = min_lo; p <= max_pos; p++) {
        kv_prefetch(kv, s, p + ATTN_PF_AHEAD, max_pos + 1, kvh, hd, 0);
        const float *k = kv_row(kv, s, p, kvh, hd, 0, kbuf);
        for (int i = 0; i < n_q; i++) {
            if (p > b->pos[t0 + i] || p < window_lo(b, t0 + i)) continue;
            const float *q0 = Q_OF(i);
            for (int g = 0; g < group; g++) {
                float sc = dot_row(q0 + (size_t)g * hd, k, hd) * scale;
                S_OF(i, g)[p] = cap > 0.0f ? cap * tanhf(sc / cap) : sc;
            }
        }
    }
    for (int i = 0; i < n_q; i++) {
        const int lo = window_lo(b, t0 + i), n_ctx = b->pos[t0 + i] + 1;
        for (int g = 0; g < group; g++) {
            float *sg = S_OF(i, g);
            const float max = max_of(sg + lo, n_ctx - lo);
            for (int p = lo; p < n_ctx; p++) sg[p] = expf(sg[p] - max);
            double sum = 0.0; /* in ascending positions, apart from the exps so they pipeline */
            for (int p = lo; p < n_ctx; p++) sum += (double)sg[p];
            float inv = (float)(1.0 / sum);
            for (int p = lo; p < n_ctx; p++) sg[p] *= inv;
        }
    }
    /* V rows converted a block at a time, then added into every output row
     * of the unit that attends to them */
#define O_OF(i, g) (job->out + ((size_t)(t0 + (i)) * (size_t)b->n_head + (size_t)kvh * (size_t)group + (size_t)(g)) * (size_t)hd)
    for (int i = 0; i < n_q; i++) memset(O_OF(i, 0), 0, (size_t)group * (size_t)hd * sizeof(float));
    for (int32_t pb = min_lo; pb <= max_pos; pb += ATTN_VB) {
        const int32_t pe = pb + ATTN_VB <= max_pos + 1 ? pb + ATTN_VB : max_pos + 1;
        for (int32_t p = pb; p < pe; p++) {
            kv_prefetch(kv, s, p + ATTN_PF_AHEAD, max_pos + 1, kvh, hd, 1);
            float *vrow = vbuf + (size_t)(p - pb) * (size_t)hd;
            const float *v = kv_row(kv, s, p, kvh, hd, 1, vrow);
            if (v != vrow) memcpy(vrow, v, (size_t)hd * sizeof(float));
        }
        for (int i = 0; i < n_q; i++) {
            const int32_t lo = window_lo(b, t0 + i), hi = b->pos[t0 + i] + 1;
            const int32_t p0 = lo > pb ? lo : pb, p1 = hi < pe ? hi : pe;
            if (p0 >= p1) continue;
            for (int g = 0; g < group; g++) accum_v_any(O_OF(i, g), S_OF(i, g), vbuf, pb, p0, p1, hd);
        }
    }
#undef O_OF
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
