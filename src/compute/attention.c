/* attention.c — paged multi-token causal attention (see attention.h).
 *
 * A work unit is a tile of up to 16 consecutive query tokens of one
 * sequence and one KV head, done in three passes:
 *  - scores: the K rows are taken a block of 16 positions at a time, the
 *    block starting at a multiple of 16, converted to f32 and transposed
 *    once (lane l holds position P0 + l), and every query row of the tile
 *    and of the head's query group (GQA) attending to the block gets its 16
 *    scores from head_dim broadcast multiply-adds, no reduction per score
 *    (two blocks at a time, side by side, where a row attends to both);
 *  - softmax per row over its window, exp vectorized;
 *  - V rows converted a block of positions at a time (kept in L1) and
 *    accumulated into every output row of the unit, several rows side by
 *    side.
 * Units are dealt to threads round-robin, so a prefill's long-context
 * tokens spread over all workers.
 *
 * The arithmetic of one output element depends only on its query, its
 * position and its window, never on the tile:
 *  - score(p) = (q . k_p) * scale, q . k_p a chain over d = 0..head_dim-1
 *    of fused multiply-adds with AVX-512 (products then sums elsewhere),
 *    then soft-capped: each score alone;
 *  - max over the window (the same in any order); e(p) = exp(score(p) -
 *    max) (exp16 with AVX-512, expf elsewhere);
 *  - sum = 16 lanes, lane l adding e(p) for the window's p = l (mod 16) in
 *    ascending p (positions outside the window add nothing), then the
 *    lanes summed in a fixed tree; w(p) = e(p) * (1 / sum) (normalized
 *    before V, as llama.cpp does: the K-quant reference tests follow its
 *    activation roundings, which normalizing afterwards can flip);
 *  - out = acc over ascending p from the window's first position of
 *    acc + w(p) * v_p, a fused multiply-add per element with AVX-512 and
 *    head_dim 64 or 128, a product then a sum otherwise.
 * Blocks of positions only group this work: every sum is in absolute
 * positions, so a row gets the same bits in any tile, alone as a decode
 * token, or with any thread count.
 */
#include "compute/attention.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
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
    ATTN_PB = 16,       /* positions per block of scores (one register of lanes) */
};

size_t attn_scratch_floats(int max_ctx, int n_head, int n_head_kv, int head_dim) {
    size_t group = (size_t)(n_head / n_head_kv);
    /* scores (tile, group, ctx rounded out to whole blocks of 16
     * positions), their 1/sums, a transposed block of K rows and a block
     * of V rows as f32 */
    return ATTN_TILE_MAX * group * ((size_t)max_ctx + 2 * ATTN_PB) + (2 * ATTN_PB + ATTN_VB) * (size_t)head_dim + 16;
}

typedef struct AttnJob {
    float *out;
    const AttnBatch *b;
    const AttnKv *kv;
    float *scratch;
    size_t scratch_per_thread;
    atomic_long next_unit; /* next (tile, KV head) unit to hand out */
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

/* Scores are computed for blocks of ATTN_PB positions starting at a
 * multiple of ATTN_PB: lane l of a block holds position P0 + l, so a lane
 * stands for the same absolute positions in every tile. */
#if defined(ATTN_AVX512)
/* r[j] = column j of the 16 x 16 matrix whose rows are r[0..16). */
ATTN_INLINE void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}
#endif

/* kT (head_dim, ATTN_PB) = the K rows of head kvh at positions P0 + l,
 * lane l; lanes whose position is outside [lo, hi] are zero (their rows
 * may not exist). Converted and transposed once per tile and block. */
static void load_k_block(float *restrict kT, const AttnKv *kv, const AttnSeq *s, int32_t P0, int32_t lo,
                         int32_t hi, int kvh, int hd, float *restrict rowbuf) {
    for (int l = 0; l < ATTN_PB; l++) kv_prefetch(kv, s, P0 + ATTN_PB + l, hi + 1, kvh, hd, 0);
#if defined(ATTN_AVX512)
    if (hd % 16 == 0) {
        const uint8_t *rows[ATTN_PB];
        for (int l = 0; l < ATTN_PB; l++)
            rows[l] = P0 + l >= lo && P0 + l <= hi ? kv_addr(kv, s, P0 + l, kvh, hd, 0) : NULL;
        for (int c = 0; c < hd; c += 16) {
            __m512 r[16];
            for (int l = 0; l < ATTN_PB; l++) {
                if (rows[l] == NULL)
                    r[l] = _mm512_setzero_ps();
                else if (kv->kv_type == MN_TYPE_F32)
                    r[l] = _mm512_loadu_ps((const float *)rows[l] + c);
                else
                    r[l] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rows[l] + 2 * (size_t)c)));
            }
            transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_ps(kT + (size_t)(c + j) * ATTN_PB, r[j]);
        }
        return;
    }
#endif
    for (int l = 0; l < ATTN_PB; l++) {
        if (P0 + l < lo || P0 + l > hi) {
            for (int d = 0; d < hd; d++) kT[(size_t)d * ATTN_PB + l] = 0.0f;
            continue;
        }
        const float *k = kv_row(kv, s, P0 + l, kvh, hd, 0, rowbuf);
        for (int d = 0; d < hd; d++) kT[(size_t)d * ATTN_PB + l] = k[d];
    }
}

/* Raw scores q . k of R query rows (q + r*hd) for NB blocks side by side
 * (block j: kT + j*hd*ATTN_PB, into s + j*ATTN_PB), row r at s +
 * r*s_stride: per lane, a chain over d = 0, 1, ... of fused multiply-adds
 * (AVX-512) or of products then sums (other builds). The rows and blocks
 * run side by side only to hide the multiply-adds' latency: each lane's
 * chain is the same whatever R and NB. */
ATTN_INLINE void block_scores_r(float *s, size_t s_stride, const float *q, const float *restrict kT, int hd,
                                float scale, int R, int NB) {
#if defined(ATTN_AVX512)
    __m512 acc[16];
    for (int j = 0; j < R * NB; j++) acc[j] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m512 k[2];
        for (int j = 0; j < NB; j++) k[j] = _mm512_loadu_ps(kT + ((size_t)j * hd + d) * ATTN_PB);
        for (int r = 0; r < R; r++) {
            const __m512 qd = _mm512_set1_ps(q[(size_t)r * hd + d]);
            for (int j = 0; j < NB; j++) acc[r * NB + j] = _mm512_fmadd_ps(qd, k[j], acc[r * NB + j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NB; j++)
            _mm512_storeu_ps(s + (size_t)r * s_stride + j * ATTN_PB,
                             _mm512_mul_ps(acc[r * NB + j], _mm512_set1_ps(scale)));
#else
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NB; j++) {
            float acc[ATTN_PB] = {0};
            const float *qr = q + (size_t)r * hd, *kj = kT + (size_t)j * hd * ATTN_PB;
            for (int d = 0; d < hd; d++)
                for (int l = 0; l < ATTN_PB; l++) acc[l] += qr[d] * kj[(size_t)d * ATTN_PB + l];
            for (int l = 0; l < ATTN_PB; l++) s[(size_t)r * s_stride + j * ATTN_PB + l] = acc[l] * scale;
        }
#endif
}

/* block_scores_r for n rows: by 8, then 4, then one at a time. */
ATTN_INLINE void block_scores_n(float *s, size_t s_stride, const float *q, const float *restrict kT, int hd,
                                float scale, int n, int NB) {
    int r = 0;
    for (; r + 8 <= n; r += 8)
        block_scores_r(s + (size_t)r * s_stride, s_stride, q + (size_t)r * hd, kT, hd, scale, 8, NB);
    for (; r + 4 <= n; r += 4)
        block_scores_r(s + (size_t)r * s_stride, s_stride, q + (size_t)r * hd, kT, hd, scale, 4, NB);
    for (; r < n; r++) block_scores_r(s + (size_t)r * s_stride, s_stride, q + (size_t)r * hd, kT, hd, scale, 1, NB);
}

/* Scores of n rows for nb (1 or 2) blocks. Inlined with a constant hd for
 * the usual head sizes: the rows' addresses then take no registers (with a
 * variable one, gcc spills the K lanes to make room for them). */
static void block_scores(float *s, size_t s_stride, const float *q, const float *restrict kT, int hd, float scale,
                         int n, int nb) {
    assert(nb == 1 || nb == 2);
    if (hd == 64 && nb == 2)
        block_scores_n(s, s_stride, q, kT, 64, scale, n, 2);
    else if (hd == 64)
        block_scores_n(s, s_stride, q, kT, 64, scale, n, 1);
    else if (hd == 128 && nb == 2)
        block_scores_n(s, s_stride, q, kT, 128, scale, n, 2);
    else if (hd == 128)
        block_scores_n(s, s_stride, q, kT, 128, scale, n, 1);
    else if (nb == 2)
        block_scores_n(s, s_stride, q, kT, hd, scale, n, 2);
    else
        block_scores_n(s, s_stride, q, kT, hd, scale, n, 1);
}

#if defined(ATTN_AVX512)
/* e^x per lane for x <= 0 (lanes below -104 give 0): x = n ln2 + r with
 * n = round(x / ln2) and ln2 in two parts, e^r by its degree-7 Taylor
 * polynomial (|r| <= ln2 / 2), times 2^n. Within a few ulp of expf. */
ATTN_INLINE __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Lanes of the block at P0 whose position is in [lo, hi]. */
ATTN_INLINE __mmask16 lanes_in(int32_t P0, int32_t lo, int32_t hi) {
    const __m512i p = _mm512_add_epi32(_mm512_set1_epi32(P0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                                                 12, 13, 14, 15));
    return _mm512_cmpge_epi32_mask(p, _mm512_set1_epi32(lo)) & _mm512_cmple_epi32_mask(p, _mm512_set1_epi32(hi));
}
#endif

/* The softmax of one row's scores over [lo, hi] (sc[p - base] holds
 * position p, base a multiple of ATTN_PB): replaces each score by
 * e^(score - max) * (1 / sum); the row's other entries are left for no
 * one to read. The sum is taken in ATTN_PB lanes, lane l adding the
 * positions p = l (mod ATTN_PB) in ascending order, then the lanes are
 * summed in a fixed tree; the max is the same in any order. */
static void softmax_row(float *sc, int32_t base, int32_t lo, int32_t hi) {
#if defined(ATTN_AVX512)
    const int32_t b0 = lo - lo % ATTN_PB, b1 = hi - hi % ATTN_PB;
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int32_t P0 = b0; P0 <= b1; P0 += ATTN_PB)
        m = _mm512_mask_max_ps(m, lanes_in(P0, lo, hi), m, _mm512_loadu_ps(sc + (P0 - base)));
    const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (int32_t P0 = b0; P0 <= b1; P0 += ATTN_PB) {
        float *x = sc + (P0 - base);
        const __m512 e = _mm512_maskz_mov_ps(lanes_in(P0, lo, hi), exp16(_mm512_sub_ps(_mm512_loadu_ps(x), max)));
        sum = _mm512_add_ps(sum, e);
        _mm512_storeu_ps(x, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int32_t P0 = b0; P0 <= b1; P0 += ATTN_PB)
        _mm512_storeu_ps(sc + (P0 - base), _mm512_mul_ps(_mm512_loadu_ps(sc + (P0 - base)), inv));
#else
    float max = sc[lo - base];
    for (int32_t p = lo; p <= hi; p++) max = sc[p - base] > max ? sc[p - base] : max;
    float lane[ATTN_PB] = {0};
    for (int32_t p = lo; p <= hi; p++) {
        sc[p - base] = expf(sc[p - base] - max);
        lane[p % ATTN_PB] += sc[p - base];
    }
    for (int w = ATTN_PB / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) lane[j] += lane[j + w];
    const float inv = 1.0f / lane[0];
    for (int32_t p = lo; p <= hi; p++) sc[p - base] *= inv;
#endif
}

/* o[d] += w[p - pb] * v[p][d] for p in [p0, p1), rows of hd from vb (row
 * p at vb + (p - pb) * hd): a product, then a sum, in ascending p. */
static inline void accum_v(float *restrict o, const float *restrict w, const float *restrict vb, int pb, int p0,
                           int p1, int hd) {
    for (int p = p0; p < p1; p++) {
        const float wp = w[p - pb];
        const float *vp = vb + (size_t)(p - pb) * (size_t)hd;
        for (int d = 0; d < hd; d++) o[d] += wp * vp[d];
    }
}

#if defined(ATTN_AVX512)
/* accum_v for R rows at once (o + r*hd, weights w + r*w_stride), hd =
 * 16 * NC, the rows kept in R*NC registers across the block; a fused
 * multiply-add per position. Each row's chain is its own, in ascending p:
 * the rows run side by side only to hide the adds' latency. */
ATTN_INLINE void accum_v16(float *restrict o, const float *restrict w, size_t w_stride, const float *restrict vb,
                           int pb, int p0, int p1, int NC, int R) {
    __m512 acc[16];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++) acc[r * NC + c] = _mm512_loadu_ps(o + (size_t)r * 16 * NC + 16 * c);
    for (int p = p0; p < p1; p++) {
        const float *vp = vb + (size_t)(p - pb) * (size_t)(16 * NC);
        for (int c = 0; c < NC; c++) {
            __m512 v = _mm512_loadu_ps(vp + 16 * c);
            /* kept in a register: gcc would fold the load into each of
             * the R multiply-adds, and a 512-bit load costs as much as one */
            __asm__("" : "+v"(v));
            for (int r = 0; r < R; r++)
                acc[r * NC + c] = _mm512_fmadd_ps(_mm512_set1_ps(w[(size_t)r * w_stride + (size_t)(p - pb)]), v,
                                                  acc[r * NC + c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(o + (size_t)r * 16 * NC + 16 * c, acc[r * NC + c]);
}
#endif

/* accum_v for n rows (o + r*hd, weights w + r*w_stride), the usual head
 * sizes with the rows in registers, several at a time. */
static void accum_v_rows(float *restrict o, const float *restrict w, size_t w_stride, const float *restrict vb,
                         int pb, int p0, int p1, int hd, int n) {
    int r = 0;
#if defined(ATTN_AVX512)
    if (hd == 64) {
        for (; r + 4 <= n; r += 4) accum_v16(o + (size_t)r * hd, w + r * w_stride, w_stride, vb, pb, p0, p1, 4, 4);
        for (; r < n; r++) accum_v16(o + (size_t)r * hd, w + r * w_stride, w_stride, vb, pb, p0, p1, 4, 1);
    } else if (hd == 128) {
        for (; r + 2 <= n; r += 2) accum_v16(o + (size_t)r * hd, w + r * w_stride, w_stride, vb, pb, p0, p1, 8, 2);
        for (; r < n; r++) accum_v16(o + (size_t)r * hd, w + r * w_stride, w_stride, vb, pb, p0, p1, 8, 1);
    }
#endif
    for (; r < n; r++) accum_v(o + (size_t)r * hd, w + r * w_stride, vb, pb, p0, p1, hd);
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
 * same whatever tile it is in (see the top of the file): scores by blocks
 * of ATTN_PB absolute positions, the softmax's sum in lanes keyed by
 * position, V accumulated in ascending positions, then normalized. */
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
    /* scores of positions [base, base + stride): whole blocks */
    const int32_t base = min_lo - min_lo % ATTN_PB;
    const size_t stride = (size_t)(max_pos - max_pos % ATTN_PB + ATTN_PB - base);
    float *scores = scratch;                                      /* (n_q, group, stride) */
    float *kT = scores + (size_t)n_q * (size_t)group * stride;    /* 2 x (head_dim, ATTN_PB) */
    float *vbuf = kT + (size_t)hd * 2 * ATTN_PB;                  /* (ATTN_VB, head_dim) */
    const float scale = b->scale > 0.0f ? b->scale : 1.0f / sqrtf((float)hd);
#define Q_OF(i) (b->q + ((size_t)(t0 + (i)) * (size_t)b->n_head + (size_t)kvh * (size_t)group) * (size_t)hd)
#define S_OF(i, g) (scores + ((size_t)(i) * (size_t)group + (size_t)(g)) * stride)

    const float cap = b->softcap;
    /* two blocks at a time: a row that attends to both gets them side by side */
    for (int32_t P0 = base; P0 <= max_pos; P0 += 2 * ATTN_PB) {
        const int32_t P1 = P0 + ATTN_PB;
        float *kT1 = kT + (size_t)hd * ATTN_PB;
        load_k_block(kT, kv, s, P0, min_lo, max_pos, kvh, hd, vbuf);
        if (P1 <= max_pos) load_k_block(kT1, kv, s, P1, min_lo, max_pos, kvh, hd, vbuf);
        for (int i = 0; i < n_q; i++) {
            const int32_t lo = window_lo(b, t0 + i), pos = b->pos[t0 + i];
            const bool in0 = P0 <= pos && P0 + ATTN_PB > lo, in1 = P1 <= pos && P1 + ATTN_PB > lo;
            float *sb = S_OF(i, 0) + (P0 - base);
            if (in0 || in1)
                block_scores(in0 ? sb : sb + ATTN_PB, stride, Q_OF(i), in0 ? kT : kT1, hd, scale, group,
                             in0 && in1 ? 2 : 1);
            if (cap > 0.0f && (in0 || in1))
                for (int g = 0; g < group; g++)
                    for (int l = in0 ? 0 : ATTN_PB; l < (in1 ? 2 * ATTN_PB : ATTN_PB); l++)
                        sb[(size_t)g * stride + l] = cap * tanhf(sb[(size_t)g * stride + l] / cap);
        }
    }
    for (int i = 0; i < n_q; i++)
        for (int g = 0; g < group; g++)
            softmax_row(S_OF(i, g), base, window_lo(b, t0 + i), b->pos[t0 + i]);
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
            accum_v_rows(O_OF(i, 0), S_OF(i, 0) + (pb - base), stride, vbuf, pb, p0, p1, hd, group);
        }
    }
#undef O_OF
#undef Q_OF
#undef S_OF
}

/* Tiles are runs of at most ATTN_TILE consecutive batch tokens of one
 * sequence; units (tile, KV head) are numbered in order. Every worker walks
 * the same tiling and runs the units whose numbers it takes from the job's
 * counter (taken in increasing order, so one walk finds them all). */
static void attn_worker(void *ctx, int ith, int nth) {
    AttnJob *job = ctx;
    const AttnBatch *b = job->b;
    float *scratch = job->scratch + (size_t)ith * job->scratch_per_thread;
    long u = 0, mine = atomic_fetch_add_explicit(&job->next_unit, 1, memory_order_relaxed);
    for (int t0 = 0; t0 < b->n_tok;) {
        int n_q = 1;
        while (n_q < ATTN_TILE && t0 + n_q < b->n_tok && b->seq[t0 + n_q] == b->seq[t0]) n_q++;
        for (int kvh = 0; kvh < b->n_head_kv; kvh++, u++) {
            if (u != mine) continue;
            attn_tile(job, t0, n_q, kvh, scratch);
            mine = atomic_fetch_add_explicit(&job->next_unit, 1, memory_order_relaxed);
        }
        t0 += n_q;
    }
}

void attn_forward(ThreadPool *tp, float *out, const AttnBatch *b, const AttnKv *kv, float *scratch,
                  size_t scratch_per_thread) {
    assert(b->n_head % b->n_head_kv == 0);
    AttnJob job = {.out = out, .b = b, .kv = kv, .scratch = scratch, .scratch_per_thread = scratch_per_thread};
    atomic_init(&job.next_unit, 0);
    if (tp == NULL)
        attn_worker(&job, 0, 1);
    else
        tpool_share(tp, attn_worker, &job);
}
