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
 *    of fused multiply-adds with AVX-512 (products then sums elsewhere,
 *    in 8-lane registers with AVX2),
 *    then soft-capped: each score alone;
 *  - max over the window (the same in any order); e(p) = exp(score(p) -
 *    max) (exp16 with AVX-512, exp8 with AVX2, expf elsewhere);
 *  - sum = 16 lanes, lane l adding e(p) for the window's p = l (mod 16) in
 *    ascending p (positions outside the window add nothing), then the
 *    lanes summed in a fixed tree; w(p) = e(p) * (1 / sum) (normalized
 *    before V, as llama.cpp does: the K-quant reference tests follow its
 *    activation roundings, which normalizing afterwards can flip);
 *  - out = acc over ascending p from the window's first position of
 *    acc + w(p) * v_p, a fused multiply-add per element with AVX-512 and
 *    head_dim 64 or 128, a product then a sum otherwise (with AVX2 and
 *    head_dim a multiple of 32, in registers, two rows sharing each V load).
 * With an f16 cache, head_dim 64 or 128 and AVX512_BF16 (attn_uses_bf16)
 * the products are 16-bit, twice as many an instruction: q, k_p, w(p) and
 * v_p are rounded to bf16 (to nearest even; k_p and v_p from their f16),
 * and vdpbf16ps adds two exact products to an f32 lane at a time —
 * score(p) a chain over the pairs of dimensions (0, 1), (2, 3), ..., out
 * a chain over the pairs of positions (2j, 2j + 1) from the pair holding
 * the window's first position (a position outside the window weighs 0).
 * The softmax stays f32. This moves the logits of a 1.1B-shape F16 model
 * over 1,200 tokens by up to 9e-3 from an f32 cache, the f16 storage alone
 * by 1.2e-3; an f32 cache keeps every product f32.
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
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define ATTN_BF16 1 /* 16-bit products for an f16 KV cache: see the top */
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ATTN_AVX2 1 /* scores, softmax and V in 8-lane registers */
#endif

#define ATTN_INLINE static inline __attribute__((always_inline))

enum {
    ATTN_TILE_MAX = 16, /* = ATTN_TILE below */
    ATTN_VB = 32,       /* V rows converted at a time */
    ATTN_PB = 16,       /* positions per block of scores (one register of lanes) */
};

bool attn_uses_bf16(MnType kv_type, int head_dim) {
#if defined(ATTN_BF16)
    return kv_type == MN_TYPE_F16 && (head_dim == 64 || head_dim == 128);
#else
    (void)kv_type;
    (void)head_dim;
    return false;
#endif
}

size_t attn_scratch_floats(int max_ctx, int n_head, int n_head_kv, int head_dim) {
    size_t group = (size_t)(n_head / n_head_kv);
    /* scores (tile, group, ctx rounded out to whole blocks of 16
     * positions), two transposed blocks of K rows, a block of V rows as
     * f32 and the tile's queries as bf16 */
    return ATTN_TILE_MAX * group * ((size_t)max_ctx + 2 * ATTN_PB) + (2 * ATTN_PB + ATTN_VB) * (size_t)head_dim +
           ATTN_TILE_MAX * group * (size_t)head_dim / 2 + 16;
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

#if defined(ATTN_AVX2) && defined(__F16C__)
/* Elements [c, c + 8) of an f16 row, as f32 (exact). */
ATTN_INLINE __m256 f16x8_at(const uint8_t *row, int c) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)c)));
}
#endif

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
#elif defined(ATTN_AVX2) && defined(__F16C__)
    if (head_dim % 8 == 0) {
        for (int d = 0; d < head_dim; d += 8) _mm256_storeu_ps(buf + d, f16x8_at(row, d));
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

#if defined(ATTN_AVX2)
/* r[j] = column j of the 8 x 8 matrix whose rows are r[0..8). */
ATTN_INLINE void transpose8(__m256 r[8]) {
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        const __m256 lo = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20), hi = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
        r[i] = lo;
        r[i + 4] = hi;
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
#elif defined(ATTN_AVX2) && defined(__F16C__)
    if (hd % 8 == 0) { /* as the AVX-512 path, 8 x 8 at a time */
        for (int h = 0; h < ATTN_PB; h += 8) {
            const uint8_t *rows[8];
            for (int l = 0; l < 8; l++)
                rows[l] = P0 + h + l >= lo && P0 + h + l <= hi ? kv_addr(kv, s, P0 + h + l, kvh, hd, 0) : NULL;
            for (int c = 0; c < hd; c += 8) {
                __m256 r[8];
                for (int l = 0; l < 8; l++) {
                    if (rows[l] == NULL)
                        r[l] = _mm256_setzero_ps();
                    else if (kv->kv_type == MN_TYPE_F32)
                        r[l] = _mm256_loadu_ps((const float *)rows[l] + c);
                    else
                        r[l] = f16x8_at(rows[l], c);
                }
                transpose8(r);
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(kT + (size_t)(c + j) * ATTN_PB + h, r[j]);
            }
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

#if defined(ATTN_AVX2)
/* block_scores_r's plain-C arithmetic in 8-lane registers, RG rows x NB
 * blocks side by side (RG * NB * 2 accumulators: at most 8, so they, the
 * K lanes and q fit the 16 registers): the same product then sum per
 * lane and d, so the same bits. */
ATTN_INLINE void scores_avx2(float *s, size_t s_stride, const float *q, const float *restrict kT, int hd,
                             float scale, int RG, int NB) {
    __m256 acc[4][2][2];
    for (int r = 0; r < RG; r++)
        for (int j = 0; j < NB; j++) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m256 k[2][2];
        for (int j = 0; j < NB; j++) {
            const float *kd = kT + ((size_t)j * hd + d) * ATTN_PB;
            k[j][0] = _mm256_loadu_ps(kd);
            k[j][1] = _mm256_loadu_ps(kd + 8);
        }
        for (int r = 0; r < RG; r++) {
            const __m256 qd = _mm256_set1_ps(q[(size_t)r * hd + d]);
            for (int j = 0; j < NB; j++) {
                acc[r][j][0] = _mm256_add_ps(acc[r][j][0], _mm256_mul_ps(qd, k[j][0]));
                acc[r][j][1] = _mm256_add_ps(acc[r][j][1], _mm256_mul_ps(qd, k[j][1]));
            }
        }
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int r = 0; r < RG; r++)
        for (int j = 0; j < NB; j++) {
            float *sr = s + (size_t)r * s_stride + j * ATTN_PB;
            _mm256_storeu_ps(sr, _mm256_mul_ps(acc[r][j][0], vs));
            _mm256_storeu_ps(sr + 8, _mm256_mul_ps(acc[r][j][1], vs));
        }
}
#endif

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
#elif defined(ATTN_AVX2)
    const int RG = NB == 2 ? 2 : 4; /* R is 8, 4 or 1: a multiple of RG, or less */
    if (R < RG) scores_avx2(s, s_stride, q, kT, hd, scale, R, NB);
    else
        for (int r = 0; r < R; r += RG)
            scores_avx2(s + (size_t)r * s_stride, s_stride, q + (size_t)r * hd, kT, hd, scale, RG, NB);
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

#if defined(ATTN_AVX512) || defined(ATTN_AVX2)
/* e^r's Taylor polynomial of degree 7, highest coefficient first. */
static const float EXP_TAYLOR[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                    1.0f / 6.0f,    0.5f,           1.0f,           1.0f};
#endif

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
    __m512 p = _mm512_set1_ps(EXP_TAYLOR[0]);
#pragma GCC unroll 7
    for (int i = 1; i < 8; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_TAYLOR[i]));
    return _mm512_scalef_ps(p, n);
}

/* Lanes of the block at P0 whose position is in [lo, hi]. */
ATTN_INLINE __mmask16 lanes_in(int32_t P0, int32_t lo, int32_t hi) {
    const __m512i p = _mm512_add_epi32(_mm512_set1_epi32(P0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                                                 12, 13, 14, 15));
    return _mm512_cmpge_epi32_mask(p, _mm512_set1_epi32(lo)) & _mm512_cmple_epi32_mask(p, _mm512_set1_epi32(hi));
}
#endif

#if defined(ATTN_AVX2)
/* e^x per lane for x <= 0, as exp16 in 8 lanes: the same reduction and
 * polynomial, then 2^n built in the exponent field; lanes below -87.3
 * (where e^x is no longer a normal float) give 0. */
ATTN_INLINE __m256 exp8(__m256 x) {
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(EXP_TAYLOR[0]);
#pragma GCC unroll 7
    for (int i = 1; i < 8; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_TAYLOR[i]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* All-ones lanes for the positions P0..P0+7 that are in [lo, hi]. */
ATTN_INLINE __m256 lanes8_in(int32_t P0, int32_t lo, int32_t hi) {
    const __m256i p = _mm256_add_epi32(_mm256_set1_epi32(P0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i below = _mm256_cmpgt_epi32(_mm256_set1_epi32(lo), p), above = _mm256_cmpgt_epi32(p, _mm256_set1_epi32(hi));
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_or_si256(below, above), _mm256_set1_epi32(-1)));
}
#endif

/* The softmax of one row's scores over [lo, hi] (sc[p - base] holds
 * position p, base a multiple of ATTN_PB): replaces each score by
 * e^(score - max) * (1 / sum), positions outside [lo, hi] in its blocks
 * by 0 — as bf16, sc as uint16_t[], if to_bf16 (AVX512_BF16 only); the
 * row's other entries are left for no one to read. The sum is taken in
 * ATTN_PB lanes, lane l adding the positions p = l (mod ATTN_PB) in
 * ascending order, then the lanes are summed in a fixed tree; the max is
 * the same in any order. */
static void softmax_row(float *sc, int32_t base, int32_t lo, int32_t hi, bool to_bf16) {
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
    for (int32_t P0 = b0; P0 <= b1; P0 += ATTN_PB) {
        const __m512 w = _mm512_mul_ps(_mm512_loadu_ps(sc + (P0 - base)), inv);
#if defined(ATTN_BF16)
        /* the halves written trail the floats read, which are in registers */
        if (to_bf16) {
            _mm256_storeu_si256((__m256i *)((uint16_t *)sc + (P0 - base)), (__m256i)_mm512_cvtneps_pbh(w));
            continue;
        }
#endif
        _mm512_storeu_ps(sc + (P0 - base), w);
    }
#elif defined(ATTN_AVX2)
    assert(!to_bf16);
    const int32_t b0 = lo - lo % ATTN_PB, b1 = hi - hi % ATTN_PB;
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int32_t P = b0; P <= b1 + ATTN_PB - 8; P += 8)
        m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(sc + (P - base)),
                                              lanes8_in(P, lo, hi)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const __m256 max = _mm256_set1_ps(_mm_cvtss_f32(m4));
    __m256 sum_lo = _mm256_setzero_ps(), sum_hi = _mm256_setzero_ps(); /* lanes 0..7, 8..15 */
    for (int32_t P0 = b0; P0 <= b1; P0 += ATTN_PB) {
        float *x = sc + (P0 - base);
        const __m256 e0 = _mm256_and_ps(lanes8_in(P0, lo, hi), exp8(_mm256_sub_ps(_mm256_loadu_ps(x), max)));
        const __m256 e1 = _mm256_and_ps(lanes8_in(P0 + 8, lo, hi), exp8(_mm256_sub_ps(_mm256_loadu_ps(x + 8), max)));
        sum_lo = _mm256_add_ps(sum_lo, e0);
        sum_hi = _mm256_add_ps(sum_hi, e1);
        _mm256_storeu_ps(x, e0);
        _mm256_storeu_ps(x + 8, e1);
    }
    /* the scalar path's tree: lane j += lane j + 8, + 4, + 2, + 1 */
    const __m256 s8 = _mm256_add_ps(sum_lo, sum_hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    const __m256 inv = _mm256_set1_ps(1.0f / _mm_cvtss_f32(s4));
    for (int32_t P = b0; P <= b1 + ATTN_PB - 8; P += 8)
        _mm256_storeu_ps(sc + (P - base), _mm256_mul_ps(_mm256_loadu_ps(sc + (P - base)), inv));
#else
    assert(!to_bf16);
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

#if defined(ATTN_AVX2)
/* accum_v for one row and 64 of its dimensions (o, vb's rows hd apart),
 * the 8 vectors of the row in registers across the block: per position
 * a product, then a sum, in ascending p, as accum_v. */
ATTN_INLINE void accum_v8(float *restrict o, const float *restrict w, const float *restrict vb, int pb, int p0,
                          int p1, int hd) {
    __m256 acc[8];
    for (int c = 0; c < 8; c++) acc[c] = _mm256_loadu_ps(o + 8 * c);
    for (int p = p0; p < p1; p++) {
        const __m256 wp = _mm256_set1_ps(w[p - pb]);
        const float *vp = vb + (size_t)(p - pb) * (size_t)hd;
        for (int c = 0; c < 8; c++) acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(wp, _mm256_loadu_ps(vp + 8 * c)));
    }
    for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + 8 * c, acc[c]);
}

/* accum_v8 for two rows (o and o + hd, weights w and w + w_stride) and 32
 * of their dimensions: each V vector loaded once serves both rows, the 8
 * accumulators and the 4 vectors fitting the 16 registers. The same
 * chains, so the same bits. */
ATTN_INLINE void accum_v8_2r(float *restrict o, const float *restrict w, size_t w_stride, const float *restrict vb,
                             int pb, int p0, int p1, int hd) {
    __m256 acc[2][4];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm256_loadu_ps(o + (size_t)r * hd + 8 * c);
    for (int p = p0; p < p1; p++) {
        const float *vp = vb + (size_t)(p - pb) * (size_t)hd;
        __m256 v[4];
        for (int c = 0; c < 4; c++) v[c] = _mm256_loadu_ps(vp + 8 * c);
        for (int r = 0; r < 2; r++) {
            const __m256 wp = _mm256_set1_ps(w[(size_t)r * w_stride + (size_t)(p - pb)]);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(wp, v[c]));
        }
    }
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(o + (size_t)r * hd + 8 * c, acc[r][c]);
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
#elif defined(ATTN_AVX2)
    if (hd % 32 == 0)
        for (; r + 2 <= n; r += 2)
            for (int d = 0; d < hd; d += 32)
                accum_v8_2r(o + (size_t)r * hd + d, w + r * w_stride, w_stride, vb + d, pb, p0, p1, hd);
    if (hd % 64 == 0) {
        for (; r < n; r++)
            for (int d = 0; d < hd; d += 64) accum_v8(o + (size_t)r * hd + d, w + r * w_stride, vb + d, pb, p0, p1, hd);
    }
#endif
    for (; r < n; r++) accum_v(o + (size_t)r * hd, w + r * w_stride, vb, pb, p0, p1, hd);
}

#if defined(ATTN_BF16)
/* The 16-bit path. Values are rounded to bf16 (to nearest even) and
 * multiplied in pairs by vdpbf16ps: acc + x[2j] * y[2j] + x[2j+1] *
 * y[2j+1] per f32 lane, the pair's products exact. A pair is always two
 * consecutive head dimensions (scores) or two consecutive absolute
 * positions, the first even (values), so a lane's chain is the same in
 * every tile. */

/* dst[j] = (x[2j], x[2j+1]) as bf16 in one 32-bit word, j < n / 2 (n a
 * multiple of 32). */
ATTN_INLINE void bf16_pairs(uint32_t *dst, const float *x, int n) {
    for (int d = 0; d < n; d += 32)
        _mm512_storeu_si512(dst + d / 2,
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + d + 16), _mm512_loadu_ps(x + d)));
}

/* The f16 row at `row`, elements [c, c + 32), as 32 bf16; zero if row is
 * NULL. */
ATTN_INLINE __m512i bf16_of_f16(const uint8_t *row, int c) {
    if (row == NULL) return _mm512_setzero_si512();
    const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)c)));
    const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)c + 32)));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* load_k_block for the 16-bit path: kTb (head_dim / 2, ATTN_PB) words,
 * word (j, l) the pair of dimensions 2j, 2j + 1 of position P0 + l. */
static void load_k_block_bf16(uint32_t *restrict kTb, const AttnKv *kv, const AttnSeq *s, int32_t P0, int32_t lo,
                              int32_t hi, int kvh, int hd) {
    for (int l = 0; l < ATTN_PB; l++) kv_prefetch(kv, s, P0 + ATTN_PB + l, hi + 1, kvh, hd, 0);
    const uint8_t *rows[ATTN_PB];
    for (int l = 0; l < ATTN_PB; l++)
        rows[l] = P0 + l >= lo && P0 + l <= hi ? kv_addr(kv, s, P0 + l, kvh, hd, 0) : NULL;
    for (int c = 0; c < hd; c += 32) {
        __m512 r[16];
        for (int l = 0; l < ATTN_PB; l++) r[l] = _mm512_castsi512_ps(bf16_of_f16(rows[l], c));
        transpose16(r);
        for (int j = 0; j < 16; j++) _mm512_storeu_ps((float *)kTb + (size_t)(c / 2 + j) * ATTN_PB, r[j]);
    }
}

/* block_scores_r on the 16-bit path: qb row r at qb + r * hd / 2 (pairs),
 * block j at kTb + j * hd / 2 * ATTN_PB; per lane a chain of vdpbf16ps
 * over the pairs in order, then times scale. */
ATTN_INLINE void block_scores_bf16_r(float *s, size_t s_stride, const uint32_t *qb, const uint32_t *restrict kTb,
                                     int hd, float scale, int R, int NB) {
    const int hp = hd / 2;
    __m512 acc[16];
    for (int j = 0; j < R * NB; j++) acc[j] = _mm512_setzero_ps();
    for (int d = 0; d < hp; d++) {
        __m512i k[2];
        for (int j = 0; j < NB; j++) k[j] = _mm512_loadu_si512(kTb + ((size_t)j * hp + d) * ATTN_PB);
        for (int r = 0; r < R; r++) {
            const __m512bh qd = (__m512bh)_mm512_set1_epi32((int)qb[(size_t)r * hp + d]);
            for (int j = 0; j < NB; j++) acc[r * NB + j] = _mm512_dpbf16_ps(acc[r * NB + j], qd, (__m512bh)k[j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NB; j++)
            _mm512_storeu_ps(s + (size_t)r * s_stride + j * ATTN_PB,
                             _mm512_mul_ps(acc[r * NB + j], _mm512_set1_ps(scale)));
}

ATTN_INLINE void block_scores_bf16_n(float *s, size_t s_stride, const uint32_t *qb, const uint32_t *restrict kTb,
                                     int hd, float scale, int n, int NB) {
    int r = 0;
    for (; r + 8 <= n; r += 8)
        block_scores_bf16_r(s + (size_t)r * s_stride, s_stride, qb + (size_t)r * hd / 2, kTb, hd, scale, 8, NB);
    for (; r + 4 <= n; r += 4)
        block_scores_bf16_r(s + (size_t)r * s_stride, s_stride, qb + (size_t)r * hd / 2, kTb, hd, scale, 4, NB);
    for (; r < n; r++)
        block_scores_bf16_r(s + (size_t)r * s_stride, s_stride, qb + (size_t)r * hd / 2, kTb, hd, scale, 1, NB);
}

/* block_scores on the 16-bit path (hd 64 or 128). */
static void block_scores_bf16(float *s, size_t s_stride, const uint32_t *qb, const uint32_t *restrict kTb, int hd,
                              float scale, int n, int nb) {
    assert((nb == 1 || nb == 2) && (hd == 64 || hd == 128));
    if (nb == 2)
        hd == 64 ? block_scores_bf16_n(s, s_stride, qb, kTb, 64, scale, n, 2)
                 : block_scores_bf16_n(s, s_stride, qb, kTb, 128, scale, n, 2);
    else
        hd == 64 ? block_scores_bf16_n(s, s_stride, qb, kTb, 64, scale, n, 1)
                 : block_scores_bf16_n(s, s_stride, qb, kTb, 128, scale, n, 1);
}

/* vb (pairs of positions from pb, even) = the V rows of [pb, pe) as bf16,
 * interleaved: pair k's word d holds dimension d of positions pb + 2k and
 * pb + 2k + 1. Rows outside [lo, hi] are zeros (their weights are zero,
 * and zero times an unread row could be NaN). */
static void load_v_pairs_bf16(uint32_t *restrict vb, const AttnKv *kv, const AttnSeq *s, int32_t pb, int32_t pe,
                              int32_t lo, int32_t hi, int kvh, int hd) {
    const __m512i even = _mm512_setr_epi32(0x00200000, 0x00210001, 0x00220002, 0x00230003, 0x00240004, 0x00250005,
                                           0x00260006, 0x00270007, 0x00280008, 0x00290009, 0x002a000a, 0x002b000b,
                                           0x002c000c, 0x002d000d, 0x002e000e, 0x002f000f);
    const __m512i odd = _mm512_add_epi16(even, _mm512_set1_epi16(16));
    for (int32_t p = pb; p < pe; p += 2) {
        kv_prefetch(kv, s, p + ATTN_PF_AHEAD, hi + 1, kvh, hd, 1);
        kv_prefetch(kv, s, p + ATTN_PF_AHEAD + 1, hi + 1, kvh, hd, 1);
        const uint8_t *a = p >= lo && p <= hi ? kv_addr(kv, s, p, kvh, hd, 1) : NULL;
        const uint8_t *b = p + 1 >= lo && p + 1 <= hi ? kv_addr(kv, s, p + 1, kvh, hd, 1) : NULL;
        uint32_t *dst = vb + (size_t)((p - pb) / 2) * (size_t)hd;
        for (int c = 0; c < hd; c += 32) {
            const __m512i x = bf16_of_f16(a, c), y = bf16_of_f16(b, c);
            _mm512_storeu_si512(dst + c, _mm512_permutex2var_epi16(x, even, y));
            _mm512_storeu_si512(dst + c + 16, _mm512_permutex2var_epi16(x, odd, y));
        }
    }
}

/* o[d] += w[p] * v[p][d] + w[p + 1] * v[p + 1][d] for the pairs p = p0,
 * p0 + 2, ... below p1 (p0 even), of R rows (o + r*16*NC; weights: bf16
 * at wb + r*w_stride words, pair p at word (p - pb) / 2), one vdpbf16ps a
 * pair, the rows' chains side by side. */
ATTN_INLINE void accum_v16_bf16(float *restrict o, const uint32_t *restrict wb, size_t w_stride,
                                const uint32_t *restrict vb, int pb, int p0, int p1, int NC, int R) {
    __m512 acc[16];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++) acc[r * NC + c] = _mm512_loadu_ps(o + (size_t)r * 16 * NC + 16 * c);
    const size_t k1 = (size_t)(p1 - pb + 1) / 2;
    for (size_t k = (size_t)(p0 - pb) / 2; k < k1; k++) {
        const uint32_t *vp = vb + k * (size_t)(16 * NC);
        for (int c = 0; c < NC; c++) {
            __m512i v = _mm512_loadu_si512(vp + 16 * c);
            __asm__("" : "+v"(v)); /* as in accum_v16 */
            for (int r = 0; r < R; r++) {
                const __m512bh w = (__m512bh)_mm512_set1_epi32((int)wb[(size_t)r * w_stride + k]);
                acc[r * NC + c] = _mm512_dpbf16_ps(acc[r * NC + c], w, (__m512bh)v);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(o + (size_t)r * 16 * NC + 16 * c, acc[r * NC + c]);
}

/* accum_v16_bf16 for n rows, hd = 64 or 128. */
static void accum_v_rows_bf16(float *restrict o, const uint32_t *restrict wb, size_t w_stride,
                              const uint32_t *restrict vb, int pb, int p0, int p1, int hd, int n) {
    int r = 0;
    if (hd == 64) {
        for (; r + 4 <= n; r += 4)
            accum_v16_bf16(o + (size_t)r * hd, wb + r * w_stride, w_stride, vb, pb, p0, p1, 4, 4);
        for (; r < n; r++) accum_v16_bf16(o + (size_t)r * hd, wb + r * w_stride, w_stride, vb, pb, p0, p1, 4, 1);
    } else {
        assert(hd == 128);
        for (; r + 2 <= n; r += 2)
            accum_v16_bf16(o + (size_t)r * hd, wb + r * w_stride, w_stride, vb, pb, p0, p1, 8, 2);
        for (; r < n; r++) accum_v16_bf16(o + (size_t)r * hd, wb + r * w_stride, w_stride, vb, pb, p0, p1, 8, 1);
    }
}
#endif

/* Queries of one sequence taken together: each K and V row is converted
 * once per tile instead of once per query. */
enum { ATTN_TILE = ATTN_TILE_MAX };

/* The first position query token t attends to. */
static inline int32_t window_lo(const AttnBatch *b, int t) {
    int32_t lo = b->window > 0 ? b->pos[t] - b->window + 1 : 0;
    return lo > 0 ? lo : 0;
}

/* What the passes over one (tile of query tokens, KV head) unit share. */
typedef struct Tile {
    const AttnBatch *b;
    const AttnKv *kv;
    const AttnSeq *s;
    int t0, n_q, kvh, group, hd;
    int32_t min_lo, max_pos; /* the positions the unit's queries attend to */
    int32_t base;            /* the first scored position, a multiple of ATTN_PB */
    size_t stride;           /* scores of a row: positions [base, base + stride) */
    float scale;
    bool bf16;               /* attn_uses_bf16 */
    float *scores;           /* (n_q, group, stride) */
    float *kT;               /* two blocks of K: 2 x (head_dim, ATTN_PB) */
    float *vbuf;             /* V rows: (ATTN_VB, head_dim) f32 or (ATTN_VB, head_dim) bf16 pairs */
    uint32_t *qb;            /* bf16: the queries in pairs, (n_q, group, head_dim / 2) */
} Tile;

/* Query head g of the group of the tile's i-th token, its scores, its output. */
static inline const float *tile_q(const Tile *t, int i) {
    return t->b->q + ((size_t)(t->t0 + i) * (size_t)t->b->n_head + (size_t)t->kvh * (size_t)t->group) * (size_t)t->hd;
}
static inline float *tile_s(const Tile *t, int i, int g) {
    return t->scores + ((size_t)i * (size_t)t->group + (size_t)g) * t->stride;
}
static inline float *tile_o(const Tile *t, float *out, int i) {
    return out + ((size_t)(t->t0 + i) * (size_t)t->b->n_head + (size_t)t->kvh * (size_t)t->group) * (size_t)t->hd;
}

/* Every score of the unit, two blocks of positions at a time: a row that
 * attends to both gets them side by side. */
static void tile_scores(const Tile *t) {
    const int hd = t->hd;
    const float cap = t->b->softcap;
    float *kT1 = t->kT + (size_t)hd * ATTN_PB;
#if defined(ATTN_BF16)
    uint32_t *kTb = (uint32_t *)t->kT, *kTb1 = kTb + (size_t)hd / 2 * ATTN_PB;
#endif
    for (int32_t P0 = t->base; P0 <= t->max_pos; P0 += 2 * ATTN_PB) {
        const int32_t P1 = P0 + ATTN_PB;
#if defined(ATTN_BF16)
        if (t->bf16) {
            load_k_block_bf16(kTb, t->kv, t->s, P0, t->min_lo, t->max_pos, t->kvh, hd);
            if (P1 <= t->max_pos) load_k_block_bf16(kTb1, t->kv, t->s, P1, t->min_lo, t->max_pos, t->kvh, hd);
        }
#endif
        if (!t->bf16) {
            load_k_block(t->kT, t->kv, t->s, P0, t->min_lo, t->max_pos, t->kvh, hd, t->vbuf);
            if (P1 <= t->max_pos) load_k_block(kT1, t->kv, t->s, P1, t->min_lo, t->max_pos, t->kvh, hd, t->vbuf);
        }
        for (int i = 0; i < t->n_q; i++) {
            const int32_t lo = window_lo(t->b, t->t0 + i), pos = t->b->pos[t->t0 + i];
            const bool in0 = P0 <= pos && P0 + ATTN_PB > lo, in1 = P1 <= pos && P1 + ATTN_PB > lo;
            if (!in0 && !in1) continue;
            float *sb = tile_s(t, i, 0) + (P0 - t->base) + (in0 ? 0 : ATTN_PB);
            const int nb = in0 && in1 ? 2 : 1;
#if defined(ATTN_BF16)
            if (t->bf16)
                block_scores_bf16(sb, t->stride, t->qb + (size_t)i * t->group * (size_t)(hd / 2), in0 ? kTb : kTb1,
                                  hd, t->scale, t->group, nb);
#endif
            if (!t->bf16) block_scores(sb, t->stride, tile_q(t, i), in0 ? t->kT : kT1, hd, t->scale, t->group, nb);
            if (cap > 0.0f)
                for (int g = 0; g < t->group; g++)
                    for (int l = 0; l < nb * ATTN_PB; l++)
                        sb[(size_t)g * t->stride + l] = cap * tanhf(sb[(size_t)g * t->stride + l] / cap);
        }
    }
}

/* out of the unit's rows += their weights times the V rows, f32: the V
 * rows converted a block at a time, then added into every output row of
 * the unit that attends to them. */
static void tile_values(const Tile *t, float *out) {
    const int32_t max_pos = t->max_pos;
    for (int32_t pb = t->min_lo; pb <= max_pos; pb += ATTN_VB) {
        const int32_t pe = pb + ATTN_VB <= max_pos + 1 ? pb + ATTN_VB : max_pos + 1;
        for (int32_t p = pb; p < pe; p++) {
            kv_prefetch(t->kv, t->s, p + ATTN_PF_AHEAD, max_pos + 1, t->kvh, t->hd, 1);
            float *vrow = t->vbuf + (size_t)(p - pb) * (size_t)t->hd;
            const float *v = kv_row(t->kv, t->s, p, t->kvh, t->hd, 1, vrow);
            if (v != vrow) memcpy(vrow, v, (size_t)t->hd * sizeof(float));
        }
        for (int i = 0; i < t->n_q; i++) {
            const int32_t lo = window_lo(t->b, t->t0 + i), hi = t->b->pos[t->t0 + i] + 1;
            const int32_t p0 = lo > pb ? lo : pb, p1 = hi < pe ? hi : pe;
            if (p0 >= p1) continue;
            accum_v_rows(tile_o(t, out, i), tile_s(t, i, 0) + (pb - t->base), t->stride, t->vbuf, pb, p0, p1, t->hd,
                         t->group);
        }
    }
}

#if defined(ATTN_BF16)
/* tile_values in bf16: the V rows in pairs of positions from an even one
 * (the buffer holds twice as many), the weights bf16 pairs too. */
static void tile_values_bf16(const Tile *t, float *out) {
    const int32_t max_pos = t->max_pos;
    uint32_t *vb = (uint32_t *)t->vbuf;
    for (int32_t pb = t->min_lo - t->min_lo % 2; pb <= max_pos; pb += 2 * ATTN_VB) {
        const int32_t pe = pb + 2 * ATTN_VB <= max_pos + 1 ? pb + 2 * ATTN_VB : max_pos + 1;
        load_v_pairs_bf16(vb, t->kv, t->s, pb, pe, t->min_lo, max_pos, t->kvh, t->hd);
        for (int i = 0; i < t->n_q; i++) {
            const int32_t lo = window_lo(t->b, t->t0 + i), hi = t->b->pos[t->t0 + i] + 1;
            const int32_t p0 = lo > pb ? lo - lo % 2 : pb, p1 = hi < pe ? hi : pe;
            if (p0 >= p1) continue;
            accum_v_rows_bf16(tile_o(t, out, i), (const uint32_t *)tile_s(t, i, 0) + (pb - t->base) / 2, t->stride,
                              vb, pb, p0, p1, t->hd, t->group);
        }
    }
}
#endif

/* One (tile of query tokens, KV head) unit. Each query's arithmetic is the
 * same whatever tile it is in (see the top of the file): scores by blocks
 * of ATTN_PB absolute positions, the softmax's sum in lanes keyed by
 * position, V accumulated in ascending positions. */
static void attn_tile(const AttnJob *job, int t0, int n_q, int kvh, float *scratch) {
    const AttnBatch *b = job->b;
    Tile t = {.b = b, .kv = job->kv, .s = &b->seqs[b->seq[t0]], .t0 = t0, .n_q = n_q, .kvh = kvh,
              .group = b->n_head / b->n_head_kv, .hd = b->head_dim, .max_pos = 0, .min_lo = INT32_MAX};
    for (int i = 0; i < n_q; i++) {
        assert(b->pos[t0 + i] >= 0 && b->pos[t0 + i] / t.kv->block_tokens < t.s->n_blocks);
        t.max_pos = b->pos[t0 + i] > t.max_pos ? b->pos[t0 + i] : t.max_pos;
        t.min_lo = window_lo(b, t0 + i) < t.min_lo ? window_lo(b, t0 + i) : t.min_lo;
    }
    t.base = t.min_lo - t.min_lo % ATTN_PB;
    t.stride = (size_t)(t.max_pos - t.max_pos % ATTN_PB + ATTN_PB - t.base);
    t.scale = b->scale > 0.0f ? b->scale : 1.0f / sqrtf((float)t.hd);
    t.bf16 = attn_uses_bf16(t.kv->kv_type, t.hd);
    t.scores = scratch;
    t.kT = t.scores + (size_t)n_q * (size_t)t.group * t.stride;
    t.vbuf = t.kT + (size_t)t.hd * 2 * ATTN_PB;
    t.qb = (uint32_t *)(t.vbuf + (size_t)t.hd * ATTN_VB);
#if defined(ATTN_BF16)
    if (t.bf16)
        for (int i = 0; i < n_q; i++)
            for (int g = 0; g < t.group; g++)
                bf16_pairs(t.qb + ((size_t)i * t.group + g) * (size_t)(t.hd / 2), tile_q(&t, i) + (size_t)g * t.hd,
                           t.hd);
#endif
    tile_scores(&t);
    for (int i = 0; i < n_q; i++)
        for (int g = 0; g < t.group; g++)
            softmax_row(tile_s(&t, i, g), t.base, window_lo(b, t0 + i), b->pos[t0 + i], t.bf16);
    for (int i = 0; i < n_q; i++) memset(tile_o(&t, job->out, i), 0, (size_t)t.group * (size_t)t.hd * sizeof(float));
#if defined(ATTN_BF16)
    if (t.bf16) {
        tile_values_bf16(&t, job->out);
        return;
    }
#endif
    tile_values(&t, job->out);
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
