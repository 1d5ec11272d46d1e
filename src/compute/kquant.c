/* kquant.c — Q4_K and Q6_K products with int8 activations (see kquant.h).
 *
 * How it fits: mm_matmul (matmul.c) sends these two types here. Each
 * worker quantizes a group of tokens into a buffer on its own stack
 * (kq_quantize), then multiplies its rows against them (kq_rows).
 * Stateless; any thread may call any function.
 *
 * Quantized activations, one KqBlock per 256 elements of a token:
 *   qs    the 256 codes; for Q4_K weights the 32-code chunks are stored in
 *         the order 0 2 1 3 4 6 5 7, so that one 64-byte load matches the
 *         low (or high) nibbles of 64 bytes of Q4_K codes (chunks 2g and
 *         2g + 1 share the bytes of qs[32g..]); Q6_K keeps natural order;
 *   aux   Q4_K: the sums of the 8 chunks' codes (s16); Q6_K: -16 times the
 *         sum of each 16 codes, twice (words 2s and 2s + 1), so that one
 *         vpdpwssd against the doubled scales adds -32 * scale * sum, the
 *         Q6_K code offset;
 *   d     the scale.
 *
 * Invariant: everything but the last f32 steps is exact integer
 * arithmetic, and those steps are the same few operations in the same
 * order on every path (kquant.h), so a product's bits depend only on the
 * weight row and the token. Range: a Q6_K code (0..63) times an int8 code
 * summed over 2 (one vpmaddubsw word) is at most 16002, so the 16-bit
 * words never saturate; every int32 sum is below 2^31 by the same kind of
 * bound (Q4_K: 8 * 63 * 32 * 15 * 127 < 2^25).
 *
 * AVX-512 (VNNI): tiles of 16 outputs, 4 rows x 4 tokens (prefill) or 16
 * rows x 1 token (decode). Per super-block and output: 4 vpmaddubsw of
 * 64 codes and 4 vpdpwssd against the sub-block scales (Q6_K: one more
 * for the code offset); then the 16 outputs' int32 vectors are summed into one vector
 * (lane = output) by a transpose tree, and the f32 steps run on 16 outputs
 * at once. The scalar path is kq_rows_ref; the AVX2 path uses it too.
 */
#include "compute/kquant.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__F16C__)
#define KQ_AVX512 1
#include <immintrin.h>
#endif

#define KQ_INLINE static inline __attribute__((always_inline))
#define KQ_MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- types ------------------------------------------------------------- */

typedef struct KqBlock {
    int8_t qs[MN_QK_K]; /* codes (Q4_K: chunk order Q4K_CHUNK) */
    int16_t aux[32];    /* Q4_K: chunk sums (8); Q6_K: -16 * 16-code sums, each twice */
    float d;
    uint8_t pad[KQ_BLOCK_BYTES - MN_QK_K - 64 - 4];
} KqBlock;
_Static_assert(sizeof(KqBlock) == KQ_BLOCK_BYTES, "KqBlock is KQ_BLOCK_BYTES");

/* Q4_K storage: position p of qs holds chunk Q4K_CHUNK[p] (self-inverse). */
static const int Q4K_CHUNK[8] = {0, 2, 1, 3, 4, 6, 5, 7};

bool kq_has_type(MnType type) { return type == MN_TYPE_Q4_K || type == MN_TYPE_Q6_K; }

/* ========================================================================
 * Reference (scalar path, and the oracle of the others)
 * ===================================================================== */

/* The scale of a block: 127 / amax, or 0 for a block of zeros. amax keeps
 * the first of equal values and skips NaN, as vmaxps(|x|, acc) does. */
static float block_iscale(const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < MN_QK_K; j++) {
        float ax = fabsf(x[j]);
        amax = ax > amax ? ax : amax;
    }
    return amax > 0.0f ? 127.0f / amax : 0.0f;
}

/* One code: iscale * x clamped to +-127 as vmaxps/vminps clamp (NaN goes
 * to -127), rounded to even as vcvtps2dq rounds. */
static int8_t code_of(float iscale, float x) {
    float v = iscale * x;
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    return (int8_t)lrintf(v);
}

/* The aux words of a block from its 16 sums of 16 codes. */
static void block_aux(MnType type, const int32_t sum16[16], int16_t aux[32]) {
    memset(aux, 0, 32 * sizeof aux[0]);
    for (int s = 0; s < 16; s++) {
        if (type == MN_TYPE_Q4_K) aux[s / 2] = (int16_t)(aux[s / 2] + sum16[s]);
        else aux[2 * s] = aux[2 * s + 1] = (int16_t)(-16 * sum16[s]);
    }
}

static void quantize_ref(MnType type, const float *x, int64_t n_in, KqBlock *y) {
    for (int64_t b = 0; b < n_in / MN_QK_K; b++, x += MN_QK_K, y++) {
        float iscale = block_iscale(x);
        int32_t sum16[16] = {0};
        for (int j = 0; j < MN_QK_K; j++) {
            int8_t q = code_of(iscale, x[j]);
            int pos = type == MN_TYPE_Q4_K ? Q4K_CHUNK[j / 32] * 32 + j % 32 : j;
            y->qs[pos] = q;
            sum16[j / 16] += q;
        }
        block_aux(type, sum16, y->aux);
        y->d = iscale > 0.0f ? 1.0f / iscale : 0.0f;
        memset(y->pad, 0, sizeof y->pad);
    }
}

/* Code j (natural order) of an activation block. */
static int act_code(MnType type, const KqBlock *a, int j) {
    return type == MN_TYPE_Q4_K ? a->qs[Q4K_CHUNK[j / 32] * 32 + j % 32] : a->qs[j];
}

static float f16_value(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return mn_f16_to_f32(h);
}

/* Q4_K scales and mins of a super-block (6 bits each, see ttype.c). */
static void q4k_scales(const uint8_t sc[12], int scale[8], int min[8]) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            scale[j] = sc[j] & 63;
            min[j] = sc[j + 4] & 63;
        } else {
            scale[j] = (sc[j + 4] & 0x0f) | (sc[j - 4] >> 6) << 4;
            min[j] = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
        }
    }
}

static float dot_q4k_ref(const BlockQ4_K *w, const KqBlock *a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w++, a++) {
        int scale[8], min[8];
        q4k_scales(w->scales, scale, min);
        int32_t s_sum = 0, m_sum = 0;
        for (int s = 0; s < 8; s++) {
            int32_t dot = 0;
            for (int l = 0; l < 32; l++)
                dot += ((w->qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f) * act_code(MN_TYPE_Q4_K, a, 32 * s + l);
            s_sum += scale[s] * dot;
            m_sum += min[s] * a->aux[s];
        }
        float dd = f16_value((const uint8_t *)&w->d) * a->d, dm = f16_value((const uint8_t *)&w->dmin) * a->d;
        acc = fmaf((float)s_sum, dd, acc);
        acc = fmaf(-(float)m_sum, dm, acc);
    }
    return acc;
}

static float dot_q6k_ref(const BlockQ6_K *w, const KqBlock *a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w++, a++) {
        int32_t s_sum = 0;
        for (int s = 0; s < 16; s++) {
            int h = s / 8, j = s % 8 / 2;
            int32_t dot = 0;
            for (int l = 0; l < 16; l++) {
                int i = 16 * (s % 2) + l; /* element 128h + 32j + i */
                int lo = (w->ql[64 * h + 32 * (j & 1) + i] >> (4 * (j / 2))) & 0x0f;
                int hi = (w->qh[32 * h + i] >> (2 * j)) & 3;
                dot += (lo | hi << 4) * act_code(MN_TYPE_Q6_K, a, 16 * s + l);
            }
            s_sum += w->scales[s] * (dot + 2 * a->aux[2 * s]); /* aux: -16 * the codes' sum */
        }
        acc = fmaf((float)s_sum, f16_value((const uint8_t *)&w->d) * a->d, acc);
    }
    return acc;
}

void kq_rows_ref(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                 const uint8_t *acts, size_t tok_bytes, int n_tok, float *out, int64_t n_out) {
    int64_t nb = n_in / MN_QK_K;
    for (int t = 0; t < n_tok; t++) {
        const KqBlock *a = (const KqBlock *)(acts + (size_t)t * tok_bytes);
        for (long r = r0; r < r1; r++) {
            const uint8_t *row = w + (size_t)r * row_bytes;
            out[(int64_t)t * n_out + r] = type == MN_TYPE_Q4_K ? dot_q4k_ref((const BlockQ4_K *)row, a, nb)
                                                                : dot_q6k_ref((const BlockQ6_K *)row, a, nb);
        }
    }
}

/* ========================================================================
 * AVX-512 VNNI
 * ===================================================================== */
#if defined(KQ_AVX512)

/* Lane 4k + j of the result: the sum of lanes 4k..4k+3 of v[j] (four
 * vectors whose 128-bit lane k holds four partial sums of one output). */
KQ_INLINE __m512i sum4x4(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(u0, u1), _mm512_unpackhi_epi64(u0, u1));
}

/* Lane o of the result: the sum of the 16 lanes of v[o]. */
KQ_INLINE __m512i sum16x16(const __m512i v[16]) {
    __m512i q[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) q[i] = sum4x4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    /* q[i]'s 128-bit lane k: outputs 4i..4i+3, partial over lane k */
    __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[0], q[1], 0x88), _mm512_shuffle_i32x4(q[0], q[1], 0xdd));
    __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[2], q[3], 0x88), _mm512_shuffle_i32x4(q[2], q[3], 0xdd));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(s01, s23, 0x88), _mm512_shuffle_i32x4(s01, s23, 0xdd));
}

static void quantize_avx512(MnType type, const float *x, int64_t n_in, KqBlock *y) {
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < n_in / MN_QK_K; b++, x += MN_QK_K, y++) {
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < 16; i++) m = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(x + 16 * i), abs_mask), m);
        float amax = _mm512_reduce_max_ps(m); /* no NaN in m: any order gives the same */
        float iscale = amax > 0.0f ? 127.0f / amax : 0.0f;
        __m512 vs = _mm512_set1_ps(iscale), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
        __m512i q[16];
        for (int i = 0; i < 16; i++) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), vs);
            q[i] = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));
            int pos = type == MN_TYPE_Q4_K ? Q4K_CHUNK[i / 2] * 32 + 16 * (i % 2) : 16 * i;
            _mm_storeu_si128((__m128i *)(y->qs + pos), _mm512_cvtepi32_epi8(q[i]));
        }
        __m512i sums = sum16x16(q); /* lane s: the sum of codes 16s..16s+15 */
        if (type == MN_TYPE_Q4_K) {
            __m512i pairs = _mm512_add_epi32(sums, _mm512_srli_epi64(sums, 32));
            _mm_storeu_si128((__m128i *)y->aux, _mm512_cvtepi64_epi16(pairs));
            memset(y->aux + 8, 0, 24 * sizeof y->aux[0]);
        } else {
            __m512i v = _mm512_mullo_epi32(sums, _mm512_set1_epi32(-16));
            v = _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(v, 16));
            _mm512_storeu_si512(y->aux, v);
        }
        y->d = iscale > 0.0f ? 1.0f / iscale : 0.0f;
        memset(y->pad, 0, sizeof y->pad);
    }
}

/* A word index vector for vpermw: words 8i..8i+7 take word s_i of the
 * source (the scales), matching the words of vpmaddubsw on 64 codes. */
KQ_INLINE __m512i scale_index(int s0, int s1, int s2, int s3) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_setr_m128i(_mm_set1_epi16((short)s0), _mm_set1_epi16((short)s1))),
        _mm256_setr_m128i(_mm_set1_epi16((short)s2), _mm_set1_epi16((short)s3)), 1);
}

/* Output o of a 16-output tile: R = 16 rows x 1 token (o = r) or 4 x 4
 * (o = 4r + t). */
KQ_INLINE int tile_out(int R, int r, int t) { return R == 16 ? r : 4 * r + t; }

/* The 16 token scales of a tile, lane o. */
KQ_INLINE __m512 tile_dx(int R, const KqBlock *const a[4]) {
    if (R == 16) return _mm512_set1_ps(a[0]->d);
    return _mm512_broadcast_f32x4(_mm_setr_ps(a[0]->d, a[1]->d, a[2]->d, a[3]->d));
}

/* Lane o: the byte offset of output o's row from w[0]'s (for gathers of
 * the rows' f16 scales). */
KQ_INLINE __m512i tile_row_offsets(int R, const uint8_t *const w[16]) {
    _Alignas(64) int32_t off[16];
    for (int o = 0; o < 16; o++) {
        ptrdiff_t d = w[R == 16 ? o : o / 4] - w[0];
        assert(d >= 0 && d <= INT32_MAX);
        off[o] = (int32_t)d;
    }
    return _mm512_load_si512(off);
}

/* res[o] for a tile of Q4_K rows w[r] (R of them) and tokens a0[t]. Per
 * row and super-block: the codes' 4 vectors of 64 (nibbles), the scales
 * widened per word; per output: 4 vpmaddubsw + 4 vpdpwssd, and the mins
 * against the chunk sums in one 128-bit vpdpwssd, put in 128-bit lane
 * o / 4 of mv[o % 4] (sum4x4 then adds each output's 4 partials). */
KQ_INLINE void q4k_tile(int R, int T, const uint8_t *const w[16], const KqBlock *const a0[4], int64_t nb,
                        float res[16]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i idx[4] = {scale_index(0, 0, 2, 2), scale_index(1, 1, 3, 3), scale_index(4, 4, 6, 6),
                            scale_index(5, 5, 7, 7)};
    const uint32_t m6 = 0x3f3f3f3f, m4s = 0x0f0f0f0f, m2 = 0x03030303;
    const __m512i goff = tile_row_offsets(R, w);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const KqBlock *a[4];
        for (int t = 0; t < 4; t++) a[t] = a0[t < T ? t : 0] + b;
        __m512i sacc[16], mv[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                                   _mm512_setzero_si512()};
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w[r] + b * (int64_t)sizeof(BlockQ4_K);
            uint32_t u0, u1, u2;
            memcpy(&u0, blk + 4, 4);
            memcpy(&u1, blk + 8, 4);
            memcpy(&u2, blk + 12, 4);
            __m256i s16 = _mm256_cvtepu8_epi16(_mm_setr_epi32((int)(u0 & m6), (int)((u2 & m4s) | ((u0 >> 6) & m2) << 4),
                                                               (int)(u1 & m6),
                                                               (int)(((u2 >> 4) & m4s) | ((u1 >> 6) & m2) << 4)));
            __m512i s512 = _mm512_castsi256_si512(s16);
            __m128i mins = _mm256_extracti128_si256(s16, 1);
            __m512i qa = _mm512_loadu_si512(blk + 16), qb = _mm512_loadu_si512(blk + 80);
            __m512i wv[4] = {_mm512_and_si512(qa, m4), _mm512_and_si512(_mm512_srli_epi16(qa, 4), m4),
                             _mm512_and_si512(qb, m4), _mm512_and_si512(_mm512_srli_epi16(qb, 4), m4)};
            __m512i sc[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) sc[v] = _mm512_permutexvar_epi16(idx[v], s512);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int8_t *xq = a[t]->qs;
                __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++)
                    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(wv[v], _mm512_loadu_si512(xq + 64 * v)), sc[v]);
                int o = tile_out(R, r, t);
                sacc[o] = s;
                __m128i m = _mm_dpwssd_epi32(_mm_setzero_si128(), mins, _mm_loadu_si128((const __m128i *)a[t]->aux));
                /* into 128-bit lane o / 4; a mask rather than an immediate,
                 * which -O1 builds need not fold */
                mv[o % 4] = _mm512_mask_broadcast_i32x4(mv[o % 4], (__mmask16)(0xf << (4 * (o / 4))), m);
            }
        }
        __m512i sv = sum16x16(sacc), msum = sum4x4(mv[0], mv[1], mv[2], mv[3]);
        __m512i dv = _mm512_i32gather_epi32(goff, w[0] + b * (int64_t)sizeof(BlockQ4_K), 1); /* d | dmin << 16 */
        __m512 dx = tile_dx(R, a);
        __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(dv)), dx);
        __m512 dmin = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dv, 16))), dx);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sv), dd, acc);
        acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), dmin, acc);
    }
    _mm512_storeu_ps(res, acc);
}

/* res[o] for a tile of Q6_K rows: codes built from ql and qh 64 at a
 * time, per output 4 vpmaddubsw + 4 vpdpwssd and one more vpdpwssd for
 * the code offset (aux against the doubled scales). */
KQ_INLINE void q6k_tile(int R, int T, const uint8_t *const w[16], const KqBlock *const a0[4], int64_t nb,
                        float res[16]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i idx[4] = {scale_index(0, 1, 2, 3), scale_index(4, 5, 6, 7), scale_index(8, 9, 10, 11),
                            scale_index(12, 13, 14, 15)};
    const __m512i idxd = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7,
                         6, 5, 4, 3, 2, 1, 0),
        1);
    /* qh bits 2j..2j+1 to bits 4..5: codes 0..31 of a half take j = 0 (<< 4)
     * and 32..63 j = 1 (<< 2); the high-nibble codes j = 2 (as is), 3 (>> 2) */
    const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i goff = tile_row_offsets(R, w);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const KqBlock *a[4];
        for (int t = 0; t < 4; t++) a[t] = a0[t < T ? t : 0] + b;
        __m512i sacc[16];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w[r] + b * (int64_t)sizeof(BlockQ6_K);
            __m512i s512 = _mm512_castsi256_si512(
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + offsetof(BlockQ6_K, scales)))));
            __m512i wv[4], sc[4];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i ql = _mm512_loadu_si512(blk + 64 * h);
                __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
                wv[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, sh_lo), m30));
                wv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                _mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m30));
            }
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) sc[v] = _mm512_permutexvar_epi16(idx[v], s512);
            __m512i scd = _mm512_permutexvar_epi16(idxd, s512);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int8_t *xq = a[t]->qs;
                __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(a[t]->aux), scd);
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++)
                    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(wv[v], _mm512_loadu_si512(xq + 64 * v)), sc[v]);
                sacc[tile_out(R, r, t)] = s;
            }
        }
        __m512i sv = sum16x16(sacc);
        /* the 4 bytes before a block's end: scales 14, 15 and d */
        __m512i dv = _mm512_i32gather_epi32(goff, w[0] + b * (int64_t)sizeof(BlockQ6_K) + sizeof(BlockQ6_K) - 4, 1);
        __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dv, 16))), tile_dx(R, a));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sv), dd, acc);
    }
    _mm512_storeu_ps(res, acc);
}

/* One tile: rows r..r+R-1 and tokens t..t+T-1, those past r1 / n_tok
 * computed on copies of the last one and not stored. */
KQ_INLINE void tile_run(MnType type, int R, int T, const uint8_t *w, size_t row_bytes, long r, long r1,
                        const uint8_t *acts, size_t tok_bytes, int t, int n_tok, int64_t nb, float *out, int64_t n_out) {
    const uint8_t *rows[16];
    const KqBlock *toks[4];
    for (int i = 0; i < R; i++) rows[i] = w + (size_t)KQ_MIN(r + i, r1 - 1) * row_bytes;
    for (int j = 0; j < T; j++) toks[j] = (const KqBlock *)(acts + (size_t)KQ_MIN(t + j, n_tok - 1) * tok_bytes);
    float res[16];
    if (type == MN_TYPE_Q4_K) q4k_tile(R, T, rows, toks, nb, res);
    else q6k_tile(R, T, rows, toks, nb, res);
    for (int i = 0; i < R && r + i < r1; i++)
        for (int j = 0; j < T && t + j < n_tok; j++) out[(int64_t)(t + j) * n_out + r + i] = res[tile_out(R, i, j)];
}

static void rows_avx512(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                        const uint8_t *acts, size_t tok_bytes, int n_tok, float *out, int64_t n_out) {
    int64_t nb = n_in / MN_QK_K;
    int t4 = n_tok / 4 * 4;
    for (int t = 0; t < t4; t += 4)
        for (long r = r0; r < r1; r += 4) tile_run(type, 4, 4, w, row_bytes, r, r1, acts, tok_bytes, t, n_tok, nb, out, n_out);
    for (int t = t4; t < n_tok; t++)
        for (long r = r0; r < r1; r += 16)
            tile_run(type, 16, 1, w, row_bytes, r, r1, acts, tok_bytes, t, n_tok, nb, out, n_out);
}

#endif

/* ========================================================================
 * API
 * ===================================================================== */

void kq_quantize(MnType type, const float *x, int64_t n_in, uint8_t *dst) {
    assert(kq_has_type(type) && n_in % MN_QK_K == 0 && ((uintptr_t)dst & 63) == 0);
#if defined(KQ_AVX512)
    quantize_avx512(type, x, n_in, (KqBlock *)dst);
#else
    quantize_ref(type, x, n_in, (KqBlock *)dst);
#endif
}

void kq_quantize_ref(MnType type, const float *x, int64_t n_in, uint8_t *dst) {
    assert(kq_has_type(type) && n_in % MN_QK_K == 0 && ((uintptr_t)dst & 63) == 0);
    quantize_ref(type, x, n_in, (KqBlock *)dst);
}

void kq_rows(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in, const uint8_t *acts,
             size_t tok_bytes, int n_tok, float *out, int64_t n_out) {
    assert(kq_has_type(type) && n_in % MN_QK_K == 0);
#if defined(KQ_AVX512)
    rows_avx512(type, w, row_bytes, r0, r1, n_in, acts, tok_bytes, n_tok, out, n_out);
#else
    kq_rows_ref(type, w, row_bytes, r0, r1, n_in, acts, tok_bytes, n_tok, out, n_out);
#endif
}
