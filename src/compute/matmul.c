/* matmul.c — weight-times-activation products (see matmul.h).
 *
 * How it fits: every projection of the forward pass (q/k/v/o, the FFN, the
 * output head) is one mm_matmul call on the engine thread, which spreads the
 * work over the compute pool with one tpool_run (two for quantized weights
 * with at least 2 tokens per thread: the activations are quantized first,
 * split by token). Workers take chunks of output rows from an atomic counter
 * in the job; the job lives on the caller's stack for the duration of the
 * call, and each output element is written by exactly one worker.
 *
 * Batch invariance, the invariant everything here is built around: the value
 * of out[t][r] depends only on W's row r, x's row t and n_in — not on n_tok,
 * the position of t, the chunking, the tile shape or the thread count. Each
 * code path therefore fixes one accumulation order per element:
 *
 *   float weights (AVX-512): one 16-lane f32 accumulator; lane l gets
 *     fma(w[16c+l], x[16c+l]) for chunks c = 0, 1, ... in order, the last
 *     chunk masked with zeros; then hsum16's fixed tree (l, l+8), (l, l+4),
 *     (l, l+2), (l, l+1). Tiles of R rows x T tokens run R*T such
 *     accumulators side by side; the edge tiles use the same sequence.
 *   quantized weights (AVX-512): activations are quantized to Q8_0 exactly
 *     as ttype_quantize_row does. Blocks are taken 16 at a time ("a group");
 *     lane i of a group vector belongs to block 16g+i. The block's integer
 *     dot product is exact (int32), so it may be formed in any order; then
 *     acc_lane_i = fma(float(dot_i), dw_i * dx_i, acc_lane_i) group after
 *     group (missing blocks of a last partial group count as zero), and the
 *     same hsum16 tree. Accumulators may be parked in memory between K
 *     blocks; that changes no lane's sequence.
 *   AVX2 and scalar paths: the same idea with 8 lanes / one lane, natural
 *     block order.
 *
 * Kernels (AVX-512):
 *   ftile          float weights, 6 rows x 4 tokens of accumulators; weights
 *                  widened in registers. Work items are row panels that stay
 *                  in L2 while the token tiles go by. Decode is the T = 1 case.
 *   qtile_direct   quantized weights, < 8 tokens: one row at a time, its
 *                  GGUF blocks transposed in registers (wgroup_load) and used
 *                  for every token; prefetches a few rows ahead so several
 *                  DRAM streams are in flight.
 *   qtile_packed   quantized weights, >= 8 tokens: a panel of rows is first
 *                  transposed into a stack buffer (qpack_panel), then 2 rows
 *                  x 6 tokens of VPDPBUSD accumulators run over it in K blocks
 *                  of 2048 elements so the token tile stays in L1; the next
 *                  panel is prefetched into L2 a few lines per group meanwhile.
 * The two quantized kernels produce the same integers and the same FMA
 * sequence, so they agree bit for bit.
 *
 * Integer dot products on AVX-512 use VPDPBUSD (unsigned x signed bytes):
 * the weight byte is biased, wu = w + 128 in [0, 255], and the bias is
 * removed by starting the int32 accumulator at -128 * sum(x of the block),
 * which the quantizer stores beside each activation block. So the sum is
 * exactly sum(w * x).
 *
 * Scratch layout of quantized activations, per token (AVX-512 path), one
 * 640-byte record per group of 16 blocks:
 *     [0,512)   8 vectors of 64 bytes: vector j, lane i = bytes 4j..4j+3 of
 *               block 16g+i (signed Q8_0 values)
 *     [512,576) 16 f32: the block scales, as f16 rounded then widened
 *     [576,640) 16 int32: -128 * (sum of the block's 32 values)
 * Blocks past the end of the row are zero everywhere. The packed weight
 * panel uses the same transposition: per row and group, 8 x 64 bytes of
 * biased weights then 16 f32 scales (576 bytes). The AVX2 and scalar paths
 * use plain BlockQ8_0 rows from ttype_quantize_row.
 *
 * Nothing here allocates. The packed kernel keeps its panel (160 KB) and
 * parked accumulators (24 KB) on the worker's stack, so mm_matmul needs
 * about 200 KB of stack on every pool thread.
 */
#include "compute/matmul.h"

#include "base/err.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#define MM_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MM_AVX2 1
#else
#define MM_SCALAR 1
#endif

#if !defined(MM_SCALAR)
#include <immintrin.h>
#endif

#define MM_INLINE static inline __attribute__((always_inline))
#define MM_MIN(a, b) ((a) < (b) ? (a) : (b))

/* Keeps a loaded vector in a register: without it GCC folds the load into
 * every instruction that uses the value, multiplying the loads per FMA. */
#define MM_PIN(v) __asm__("" : "+v"(v))

/* ---- job description and work split ----------------------------------- */

typedef struct MmJob {
    const MatW *w;
    const float *x;         /* (n_tok, n_in) */
    float *out;             /* (n_tok, n_out) */
    int n_tok;
    const uint8_t *xq;      /* quantized activations, (n_tok, xq_stride) */
    size_t xq_stride;
    bool is_packed;         /* quantized weights: use the panel kernel */
    long chunk_rows;        /* rows per work item */
    long n_chunks;
    atomic_long next_chunk; /* next work item to hand out */
} MmJob;

typedef struct MmQuantJob {
    const float *x;
    int64_t n_in;
    int n_tok;
    uint8_t *xq;
    size_t xq_stride;
} MmQuantJob;

static void rows_run(const MmJob *job, long r0, long r1);
static void act_quantize_row(const float *x, int64_t n_in, uint8_t *dst);
static size_t act_row_bytes(int64_t n_in);

static inline long round_up(long n, long m) { return (n + m - 1) / m * m; }

/* ========================================================================
 * AVX-512 path
 * ===================================================================== */
#if defined(MM_AVX512)

/* Tile shapes and cache budgets, measured on Zen 5 (2 cores, 48 KB L1d,
 * 1 MB L2 per core) with tests/bench_matmul.c. */
enum {
    FR = 6,                      /* float kernel: rows per tile */
    FT = 4,                      /* float kernel: tokens per tile (6x4: 24 accumulators) */
    F_PANEL_BYTES = 512 * 1024,  /* float weights per work item, kept in L2 */
    QDT = 8,                     /* direct quantized kernel: tokens per tile */
    QD_PF_ROWS = 4,              /* direct kernel: prefetch this many rows ahead */
    QR = 2,                      /* packed quantized kernel: rows per tile */
    QT = 6,                      /* packed quantized kernel: tokens per tile */
    MM_PANEL_BYTES = 160 * 1024, /* packed weight panel on the worker's stack */
    MM_KB = 4,                   /* packed kernel: groups per K block (2048 elements) */
    MM_KB_ROWS = 64,             /* panel rows when K is blocked (parked accumulators) */
    MM_PACK_MIN_TOK = 8,         /* fewer tokens: the direct kernel */
    QG_XBYTES = 640,             /* activation record per group (see top) */
    QG_WBYTES = 576,             /* packed weight record per group: 8 x 64 + 16 f32 */
};

/* The one horizontal sum every float result goes through. */
MM_INLINE float hsum16(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}

/* ---- float weights ---- */

MM_INLINE __m512 ldw(MnType type, const uint8_t *row, int64_t k) {
    switch (type) {
    case MN_TYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * k)));
    case MN_TYPE_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * k))), 16));
    default:
        return _mm512_loadu_ps((const float *)row + k);
    }
}

MM_INLINE __m512 ldw_mask(MnType type, const uint8_t *row, int64_t k, __mmask16 m) {
    switch (type) {
    case MN_TYPE_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
    case MN_TYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * k)), 16));
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    }
}

/* out[t][r] for R rows from w0 (row_bytes apart) and T tokens from x0
 * (n_in apart). pf0, when not NULL, is a later tile's first row: its R rows
 * are prefetched alongside (decode streams weights; see frows). */
MM_INLINE void ftile(MnType type, int R, int T, const uint8_t *w0, size_t row_bytes, const float *x0,
                     int64_t n_in, float *out0, int64_t n_out, const uint8_t *pf0) {
    const int esize = type == MN_TYPE_F32 ? 4 : 2;
    __m512 acc[FR][FT];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n_in; k += 16) {
        if (pf0 != NULL && (k * esize) % 64 == 0)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)pf0 + r * row_bytes + k * esize, _MM_HINT_T0);
        __m512 xv[FT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            xv[t] = _mm512_loadu_ps(x0 + t * n_in + k);
            MM_PIN(xv[t]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = ldw(type, w0 + r * row_bytes, k);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (k < n_in) {
        __mmask16 m = (__mmask16)((1u << (n_in - k)) - 1);
        __m512 xv[FT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) xv[t] = _mm512_maskz_loadu_ps(m, x0 + t * n_in + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = ldw_mask(type, w0 + r * row_bytes, k, m);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) out0[t * n_out + r] = hsum16(acc[r][t]);
}

/* ftile with a constant token count T (1..FT), so its loops unroll. */
#define FTILE_CASES(type, R) \
    switch (T) { \
    case 1: ftile(type, R, 1, w0, row_bytes, x0, n_in, out0, n_out, pf0); break; \
    case 2: ftile(type, R, 2, w0, row_bytes, x0, n_in, out0, n_out, pf0); break; \
    case 3: ftile(type, R, 3, w0, row_bytes, x0, n_in, out0, n_out, pf0); break; \
    default: ftile(type, R, 4, w0, row_bytes, x0, n_in, out0, n_out, pf0); break; \
    }
_Static_assert(FT == 4, "FTILE_CASES covers T = 1..4");

/* Rows [r0, r1): token tiles outside, row tiles inside, so a tile's
 * activations are reused across the chunk's rows while the chunk's weights
 * stay in L2 across token tiles. */
MM_INLINE void frows(MnType type, const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    int64_t n_in = w->n_in, n_out = w->n_out;
    size_t row_bytes = (size_t)n_in * (type == MN_TYPE_F32 ? 4 : 2);
    bool is_stream = job->n_tok <= 2 * FT; /* weights mostly from DRAM */
    for (int t0 = 0; t0 < job->n_tok; t0 += FT) {
        int T = MM_MIN(FT, job->n_tok - t0);
        const float *x0 = job->x + (int64_t)t0 * n_in;
        long r = r0;
        for (; r + FR <= r1; r += FR) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            /* one token tile: weights stream from DRAM once, so fetch the
             * next tile's rows too (the hardware prefetcher restarts on
             * every short row) */
            const uint8_t *pf0 = is_stream && r + 2 * FR <= r1 ? w0 + FR * row_bytes : NULL;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            FTILE_CASES(type, FR)
        }
        for (; r < r1; r++) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            const uint8_t *pf0 = NULL;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            FTILE_CASES(type, 1)
        }
    }
}

static void frows_f32(const MmJob *job, long r0, long r1) { frows(MN_TYPE_F32, job, r0, r1); }
static void frows_f16(const MmJob *job, long r0, long r1) { frows(MN_TYPE_F16, job, r0, r1); }
static void frows_bf16(const MmJob *job, long r0, long r1) { frows(MN_TYPE_BF16, job, r0, r1); }

/* ---- activation quantization ---- */

static size_t act_row_bytes(int64_t n_in) {
    int64_t ng = (n_in / 32 + 15) / 16;
    return (size_t)ng * QG_XBYTES;
}

/* roundf() on every lane: nearest integer, halves away from zero. */
MM_INLINE __m512 round_away(__m512 v) {
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_sub_ps(v, t); /* exact */
    __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(frac), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u));
    __m512 one = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_mask_add_ps(t, m, t, one);
}

static void act_quantize_row(const float *x, int64_t n_in, uint8_t *dst) {
    int64_t nb = n_in / 32, ng = (nb + 15) / 16;
    if (nb % 16 != 0) memset(dst + (ng - 1) * QG_XBYTES, 0, QG_XBYTES);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *grp = dst + (b / 16) * QG_XBYTES;
        int i = (int)(b % 16);
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        /* the reference's arithmetic, step for step */
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(v0, vid)));
        __m512i q1 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(v1, vid)));
        uint32_t words[8];
        _mm_storeu_si128((__m128i *)words, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(words + 4), _mm512_cvtepi32_epi8(q1));
        for (int j = 0; j < 8; j++) memcpy(grp + 64 * j + 4 * i, &words[j], 4);
        float dx = mn_f16_to_f32(mn_f32_to_f16(d));
        int32_t corr = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        memcpy(grp + 512 + 4 * i, &dx, 4);
        memcpy(grp + 576 + 4 * i, &corr, 4);
    }
}

/* ---- quantized weights: one group of 16 blocks, transposed ---- */

/* 4x4 transpose of 32-bit elements inside each 128-bit lane. */
MM_INLINE void transpose4_epi32(__m512i a0, __m512i a1, __m512i a2, __m512i a3, __m512i u[4]) {
    __m512i t01lo = _mm512_unpacklo_epi32(a0, a1), t01hi = _mm512_unpackhi_epi32(a0, a1);
    __m512i t23lo = _mm512_unpacklo_epi32(a2, a3), t23hi = _mm512_unpackhi_epi32(a2, a3);
    u[0] = _mm512_unpacklo_epi64(t01lo, t23lo);
    u[1] = _mm512_unpackhi_epi64(t01lo, t23lo);
    u[2] = _mm512_unpacklo_epi64(t01hi, t23hi);
    u[3] = _mm512_unpackhi_epi64(t01hi, t23hi);
}

/* Scales of 16 blocks `stride` bytes apart (f16 at offset 0 of each).
 * Scalar loads through a stack array: a vector gather costs more here, and
 * the integer pipes are otherwise idle in these kernels. */
MM_INLINE __m512 load_scales(const uint8_t *blk0, int stride) {
    uint16_t h[16];
    for (int i = 0; i < 16; i++) memcpy(&h[i], blk0 + i * stride, 2);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

/* Group g of a weight row as 8 biased byte vectors wu[j] (lane i = bytes
 * 4j..4j+3 of block i, plus 128) and the 16 scales. n_valid < 16 only for
 * the last group of a row: missing blocks read as zero. */
MM_INLINE void wgroup_load(MnType type, const uint8_t *blk0, int n_valid, __m512i wu[8], __m512 *dw) {
    if (type == MN_TYPE_Q8_0) {
        BlockQ8_0 pad[16];
        if (n_valid < 16) {
            memset(pad, 0, sizeof pad);
            memcpy(pad, blk0, (size_t)n_valid * sizeof(BlockQ8_0));
            blk0 = (const uint8_t *)pad;
        }
#define QS8(i) ((const __m256i *)(blk0 + (i) * 34 + 2))
        __m512i z[8];
        for (int k = 0; k < 4; k++) {
            z[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(QS8(k))),
                                      _mm256_loadu_si256(QS8(k + 4)), 1);
            z[4 + k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(QS8(k + 8))),
                                          _mm256_loadu_si256(QS8(k + 12)), 1);
        }
#undef QS8
        /* z[k] lanes: block k dwords 0-3, 4-7, block k+4 dwords 0-3, 4-7 */
        __m512i u[4], v[4];
        transpose4_epi32(z[0], z[1], z[2], z[3], u);
        transpose4_epi32(z[4], z[5], z[6], z[7], v);
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        for (int m = 0; m < 4; m++) {
            wu[m] = _mm512_xor_si512(_mm512_shuffle_i32x4(u[m], v[m], _MM_SHUFFLE(2, 0, 2, 0)), bias);
            wu[m + 4] = _mm512_xor_si512(_mm512_shuffle_i32x4(u[m], v[m], _MM_SHUFFLE(3, 1, 3, 1)), bias);
        }
        *dw = load_scales(blk0, 34);
    } else {
        BlockQ4_0 pad[16];
        if (n_valid < 16) {
            memset(pad, 0, sizeof pad);
            memcpy(pad, blk0, (size_t)n_valid * sizeof(BlockQ4_0));
            blk0 = (const uint8_t *)pad;
        }
#define QS4(i) ((const __m128i *)(blk0 + (i) * 18 + 2))
        __m512i z[4];
        for (int k = 0; k < 4; k++) {
            __m512i a = _mm512_castsi128_si512(_mm_loadu_si128(QS4(k)));
            a = _mm512_inserti32x4(a, _mm_loadu_si128(QS4(k + 4)), 1);
            a = _mm512_inserti32x4(a, _mm_loadu_si128(QS4(k + 8)), 2);
            z[k] = _mm512_inserti32x4(a, _mm_loadu_si128(QS4(k + 12)), 3);
        }
#undef QS4
        /* z[k] lane L = block k + 4L; after the transpose u[m] lane i holds
         * packed-nibble dword m of block i */
        __m512i u[4];
        transpose4_epi32(z[0], z[1], z[2], z[3], u);
        const __m512i lo = _mm512_set1_epi8(0x0f), bias = _mm512_set1_epi8(120); /* q - 8 + 128 */
        for (int m = 0; m < 4; m++) {
            wu[m] = _mm512_add_epi8(_mm512_and_si512(u[m], lo), bias);
            wu[m + 4] = _mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi16(u[m], 4), lo), bias);
        }
        *dw = load_scales(blk0, 18);
    }
}

/* ---- quantized weights, direct kernel: 1 row x T tokens from GGUF blocks ---- */

MM_INLINE void qtile_direct(MnType type, int T, const uint8_t *row, int64_t nb, const uint8_t *xq0,
                            size_t xq_stride, float *out0, int64_t n_out, const uint8_t *pf_ahead) {
    const size_t blk_bytes = type == MN_TYPE_Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
    int64_t ng = (nb + 15) / 16;
    __m512 acc[QDT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512i wu[8];
        __m512 dw;
        int n_valid = (int)MM_MIN(16, nb - 16 * g);
        if (pf_ahead != NULL)
            for (size_t off = 0; off < 16 * blk_bytes; off += 64)
                _mm_prefetch((const char *)pf_ahead + (size_t)g * 16 * blk_bytes + off, _MM_HINT_T0);
        wgroup_load(type, row + (size_t)g * 16 * blk_bytes, n_valid, wu, &dw);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const uint8_t *xg = xq0 + t * xq_stride + g * QG_XBYTES;
            __m512i a0 = _mm512_loadu_si512(xg + 576), a1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                a0 = _mm512_dpbusd_epi32(a0, wu[j], _mm512_loadu_si512(xg + 64 * j));
                a1 = _mm512_dpbusd_epi32(a1, wu[j + 4], _mm512_loadu_si512(xg + 64 * (j + 4)));
            }
            __m512 sc = _mm512_mul_ps(dw, _mm512_loadu_ps((const float *)(xg + 512)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), sc, acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) out0[t * n_out] = hsum16(acc[t]);
}

#define QDIRECT_CASES(type) \
    switch (T) { \
    case 1: qtile_direct(type, 1, row, nb, xq0, xq_stride, out0, n_out, pf_ahead); break; \
    case 2: qtile_direct(type, 2, row, nb, xq0, xq_stride, out0, n_out, pf_ahead); break; \
    case 3: qtile_direct(type, 3, row, nb, xq0, xq_stride, out0, n_out, pf_ahead); break; \
    case 4: qtile_direct(type, 4, row, nb, xq0, xq_stride, out0, n_out, pf_ahead); break; \
    case 5: qtile_direct(type, 5, row, nb, xq0, xq_stride, out0, n_out, pf_ahead); break; \
    case 6: qtile_direct(type, 6, row, nb, xq0, xq_stride, out0, n_out, pf_ahead); break; \
    case 7: qtile_direct(type, 7, row, nb, xq0, xq_stride, out0, n_out, pf_ahead); break; \
    default: qtile_direct(type, 8, row, nb, xq0, xq_stride, out0, n_out, pf_ahead); break; \
    }
_Static_assert(QDT == 8, "QDIRECT_CASES covers T = 1..8");

MM_INLINE void qrows_direct(MnType type, const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    int64_t nb = w->n_in / 32, n_out = w->n_out;
    size_t row_bytes = (size_t)nb * (type == MN_TYPE_Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0));
    size_t xq_stride = job->xq_stride;
    for (long r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
        /* a later row of this chunk, fetched alongside: more streams in
         * flight than the hardware prefetcher keeps for one sequential row */
        const uint8_t *pf_ahead = QD_PF_ROWS > 0 && r + QD_PF_ROWS < r1 ? row + QD_PF_ROWS * row_bytes : NULL;
        for (int t0 = 0; t0 < job->n_tok; t0 += QDT) {
            int T = MM_MIN(QDT, job->n_tok - t0);
            const uint8_t *xq0 = job->xq + (size_t)t0 * xq_stride;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            QDIRECT_CASES(type)
        }
    }
}

/* ---- quantized weights, packed kernel: R panel rows x T tokens ---- */

/* Prefetch cursor: the packed kernel pulls the next panel's GGUF rows into
 * L2 a few lines per group, so packing it later does not wait on DRAM. */
typedef struct MmPrefetch {
    const char *next, *end;
    int per_group; /* lines per group iteration */
} MmPrefetch;

/* Groups [0, ng) of wp0 / xq0 (already offset to the first group of this K
 * block). The f32 accumulators start at zero (is_first) or from io, and end
 * in out (is_last) or back in io: io[r * QT + t], parking them between K
 * blocks does not change any lane's sequence of FMAs. */
MM_INLINE void qtile_packed(int R, int T, const uint8_t *wp0, size_t wp_stride, int64_t ng, const uint8_t *xq0,
                            size_t xq_stride, __m512 *io, bool is_first, bool is_last, float *out0, int64_t n_out,
                            MmPrefetch *pf) {
    __m512 acc[QR][QT];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = is_first ? _mm512_setzero_ps() : io[r * QT + t];
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = wp0 + g * QG_WBYTES, *xg = xq0 + g * QG_XBYTES;
        for (int i = 0; i < pf->per_group && pf->next < pf->end; i++, pf->next += 64)
            _mm_prefetch(pf->next, _MM_HINT_T1);
        __m512i ai[QR][QT];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) ai[r][t] = _mm512_loadu_si512(xg + t * xq_stride + 576);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i xv[QT];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_si512(xg + t * xq_stride + 64 * j);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512i wv = _mm512_loadu_si512(wg + r * wp_stride + 64 * j);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) ai[r][t] = _mm512_dpbusd_epi32(ai[r][t], wv, xv[t]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 dw = _mm512_loadu_ps((const float *)(wg + r * wp_stride + 512));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512 sc = _mm512_mul_ps(dw, _mm512_loadu_ps((const float *)(xg + t * xq_stride + 512)));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r][t]), sc, acc[r][t]);
            }
        }
    }
    if (is_last) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) out0[t * n_out + r] = hsum16(acc[r][t]);
    } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) io[r * QT + t] = acc[r][t];
    }
}

#define QPACKED_CASES(R) \
    switch (T) { \
    case 1: qtile_packed(R, 1, wp0, wp_stride, kb_n, xq0, xq_stride, io, is_first, is_last, out0, n_out, &pf); break; \
    case 2: qtile_packed(R, 2, wp0, wp_stride, kb_n, xq0, xq_stride, io, is_first, is_last, out0, n_out, &pf); break; \
    case 3: qtile_packed(R, 3, wp0, wp_stride, kb_n, xq0, xq_stride, io, is_first, is_last, out0, n_out, &pf); break; \
    case 4: qtile_packed(R, 4, wp0, wp_stride, kb_n, xq0, xq_stride, io, is_first, is_last, out0, n_out, &pf); break; \
    case 5: qtile_packed(R, 5, wp0, wp_stride, kb_n, xq0, xq_stride, io, is_first, is_last, out0, n_out, &pf); break; \
    default: qtile_packed(R, 6, wp0, wp_stride, kb_n, xq0, xq_stride, io, is_first, is_last, out0, n_out, &pf); break; \
    }
_Static_assert(QT == 6, "QPACKED_CASES covers T = 1..6");

/* Rows per panel that fit MM_PANEL_BYTES, a multiple of QR (0: none fit);
 * at most MM_KB_ROWS when K is blocked, for the parked accumulators. */
static long panel_rows(int64_t n_in) {
    int64_t ng = (n_in / 32 + 15) / 16;
    long rows = (long)(MM_PANEL_BYTES / ((size_t)ng * QG_WBYTES));
    if (ng > MM_KB && rows > MM_KB_ROWS) rows = MM_KB_ROWS;
    return rows / QR * QR;
}

MM_INLINE void qpack_panel(MnType type, const MatW *w, long r0, long r1, uint8_t *panel) {
    int64_t nb = w->n_in / 32, ng = (nb + 15) / 16;
    size_t blk_bytes = type == MN_TYPE_Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
    size_t row_bytes = (size_t)nb * blk_bytes, wp_stride = (size_t)ng * QG_WBYTES;
    for (long r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
        uint8_t *dst = panel + (size_t)(r - r0) * wp_stride;
        for (int64_t g = 0; g < ng; g++) {
            __m512i wu[8];
            __m512 dw;
            wgroup_load(type, row + (size_t)g * 16 * blk_bytes, (int)MM_MIN(16, nb - 16 * g), wu, &dw);
            for (int j = 0; j < 8; j++) _mm512_store_si512(dst + g * QG_WBYTES + 64 * j, wu[j]);
            _mm512_store_ps(dst + g * QG_WBYTES + 512, dw);
        }
    }
}

static void qrows_packed(const MmJob *job, long r0, long r1) {
    _Alignas(64) uint8_t panel[MM_PANEL_BYTES];
    __m512 parked[MM_KB_ROWS * QT]; /* accumulators between K blocks */
    const MatW *w = job->w;
    int64_t ng = (w->n_in / 32 + 15) / 16, n_out = w->n_out;
    size_t wp_stride = (size_t)ng * QG_WBYTES, xq_stride = job->xq_stride;
    long max_rows = panel_rows(w->n_in);
    bool is_blocked = ng > MM_KB;
    assert(!is_blocked || max_rows <= MM_KB_ROWS);
    size_t row_bytes = (size_t)(w->n_in / 32) * (w->type == MN_TYPE_Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0));
    for (long p0 = r0; p0 < r1; p0 += max_rows) {
        long p1 = MM_MIN(r1, p0 + max_rows);
        if (w->type == MN_TYPE_Q8_0) qpack_panel(MN_TYPE_Q8_0, w, p0, p1, panel);
        else qpack_panel(MN_TYPE_Q4_0, w, p0, p1, panel);
        /* spread the next panel's lines over this panel's group iterations */
        long next_rows = MM_MIN(r1, p1 + max_rows) - p1;
        long n_iters = (long)((job->n_tok + QT - 1) / QT) * ((p1 - p0 + QR - 1) / QR) * (long)ng;
        long n_lines = (long)(((size_t)next_rows * row_bytes + 63) / 64);
        MmPrefetch pf = {.next = (const char *)w->data + (size_t)p1 * row_bytes,
                         .end = (const char *)w->data + (size_t)(p1 + next_rows) * row_bytes,
                         .per_group = (int)((n_lines + n_iters - 1) / n_iters)};
        for (int t0 = 0; t0 < job->n_tok; t0 += QT) {
            int T = MM_MIN(QT, job->n_tok - t0);
            /* K blocks of MM_KB groups keep the token tile in L1 */
            for (int64_t g0 = 0; g0 < ng; g0 += MM_KB) {
                int64_t kb_n = MM_MIN(MM_KB, ng - g0);
                bool is_first = g0 == 0, is_last = g0 + kb_n == ng;
                const uint8_t *xq0 = job->xq + (size_t)t0 * xq_stride + g0 * QG_XBYTES;
                long r = p0;
                for (; r + QR <= p1; r += QR) {
                    const uint8_t *wp0 = panel + (size_t)(r - p0) * wp_stride + g0 * QG_WBYTES;
                    __m512 *io = is_blocked ? parked + (r - p0) * QT : NULL;
                    float *out0 = job->out + (int64_t)t0 * n_out + r;
                    QPACKED_CASES(QR)
                }
                for (; r < p1; r++) {
                    const uint8_t *wp0 = panel + (size_t)(r - p0) * wp_stride + g0 * QG_WBYTES;
                    __m512 *io = is_blocked ? parked + (r - p0) * QT : NULL;
                    float *out0 = job->out + (int64_t)t0 * n_out + r;
                    QPACKED_CASES(1)
                }
            }
        }
    }
}

static void qrows_direct_q8(const MmJob *job, long r0, long r1) { qrows_direct(MN_TYPE_Q8_0, job, r0, r1); }
static void qrows_direct_q4(const MmJob *job, long r0, long r1) { qrows_direct(MN_TYPE_Q4_0, job, r0, r1); }

static void rows_run(const MmJob *job, long r0, long r1) {
    switch (job->w->type) {
    case MN_TYPE_F32: frows_f32(job, r0, r1); break;
    case MN_TYPE_F16: frows_f16(job, r0, r1); break;
    case MN_TYPE_BF16: frows_bf16(job, r0, r1); break;
    case MN_TYPE_Q8_0:
        if (job->is_packed) qrows_packed(job, r0, r1);
        else qrows_direct_q8(job, r0, r1);
        break;
    case MN_TYPE_Q4_0:
        if (job->is_packed) qrows_packed(job, r0, r1);
        else qrows_direct_q4(job, r0, r1);
        break;
    }
}

/* Work items: panels of rows that stay in L2 across the token loop, small
 * enough that every thread gets several. */
static void job_plan(MmJob *job, int nth) {
    const MatW *w = job->w;
    long n_out = (long)w->n_out, align, cap;
    if (w->type == MN_TYPE_Q8_0 || w->type == MN_TYPE_Q4_0) {
        long prows = panel_rows(w->n_in);
        job->is_packed = job->n_tok >= MM_PACK_MIN_TOK && prows >= QR;
        align = job->is_packed ? prows : QR; /* whole panels: the next one is prefetched */
        cap = 1L << 30;
    } else {
        size_t row_bytes = (size_t)w->n_in * (w->type == MN_TYPE_F32 ? 4 : 2);
        align = FR;
        cap = (long)(F_PANEL_BYTES / row_bytes);
    }
    long per = (n_out + (long)nth * 4 - 1) / ((long)nth * 4);
    long chunk = MM_MIN(per, cap);
    chunk = chunk < align ? align : round_up(chunk, align);
    job->chunk_rows = chunk;
    job->n_chunks = (n_out + chunk - 1) / chunk;
}

const char *mm_simd_name(void) { return "avx512"; }

/* ========================================================================
 * AVX2 path
 * ===================================================================== */
#elif defined(MM_AVX2)

enum { FR = 4, FT = 2, QDT = 4 };

MM_INLINE float hsum8(__m256 v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}

MM_INLINE __m256 ldw8(MnType type, const uint8_t *row, int64_t k) {
    switch (type) {
    case MN_TYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * k)));
    case MN_TYPE_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * k))), 16));
    default: return _mm256_loadu_ps((const float *)row + k);
    }
}

/* The last partial chunk of a row, widened and zero-padded. */
static void tail8(MnType type, const uint8_t *row, int64_t k, int64_t n, float dst[8]) {
    for (int i = 0; i < 8; i++) {
        float v = 0.0f;
        if (k + i < n) {
            uint16_t h;
            switch (type) {
            case MN_TYPE_F16: memcpy(&h, row + 2 * (k + i), 2); v = mn_f16_to_f32(h); break;
            case MN_TYPE_BF16: memcpy(&h, row + 2 * (k + i), 2); v = mn_bf16_to_f32(h); break;
            default: memcpy(&v, row + 4 * (k + i), 4); break;
            }
        }
        dst[i] = v;
    }
}

MM_INLINE void ftile(MnType type, int R, int T, const uint8_t *w0, size_t row_bytes, const float *x0,
                     int64_t n_in, float *out0, int64_t n_out) {
    __m256 acc[FR][FT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n_in; k += 8) {
        __m256 xv[FT];
        for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x0 + t * n_in + k);
        for (int r = 0; r < R; r++) {
            __m256 wv = ldw8(type, w0 + r * row_bytes, k);
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (k < n_in) {
        float buf[8];
        __m256 xv[FT];
        for (int t = 0; t < T; t++) {
            tail8(MN_TYPE_F32, (const uint8_t *)(x0 + t * n_in), k, n_in, buf);
            xv[t] = _mm256_loadu_ps(buf);
        }
        for (int r = 0; r < R; r++) {
            tail8(type, w0 + r * row_bytes, k, n_in, buf);
            __m256 wv = _mm256_loadu_ps(buf);
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out0[t * n_out + r] = hsum8(acc[r][t]);
}

MM_INLINE void frows(MnType type, const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    int64_t n_in = w->n_in, n_out = w->n_out;
    size_t row_bytes = (size_t)n_in * (type == MN_TYPE_F32 ? 4 : 2);
    for (int t0 = 0; t0 < job->n_tok; t0 += FT) {
        int T = MM_MIN(FT, job->n_tok - t0);
        const float *x0 = job->x + (int64_t)t0 * n_in;
        long r = r0;
        for (; r + FR <= r1; r += FR) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            if (T == FT) ftile(type, FR, FT, w0, row_bytes, x0, n_in, out0, n_out);
            else ftile(type, FR, 1, w0, row_bytes, x0, n_in, out0, n_out);
        }
        for (; r < r1; r++) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            if (T == FT) ftile(type, 1, FT, w0, row_bytes, x0, n_in, out0, n_out);
            else ftile(type, 1, 1, w0, row_bytes, x0, n_in, out0, n_out);
        }
    }
}

static size_t act_row_bytes(int64_t n_in) { return (size_t)(n_in / 32) * sizeof(BlockQ8_0); }

static void act_quantize_row(const float *x, int64_t n_in, uint8_t *dst) {
    ttype_quantize_row(MN_TYPE_Q8_0, x, dst, n_in);
}

/* Block b of a weight row as 32 signed bytes, and its scale. */
MM_INLINE __m256i wblock8(MnType type, const uint8_t *row, int64_t b, float *d) {
    if (type == MN_TYPE_Q8_0) {
        const BlockQ8_0 *blk = (const BlockQ8_0 *)row + b;
        *d = _cvtsh_ss(blk->d);
        return _mm256_loadu_si256((const __m256i *)blk->qs);
    }
    const BlockQ4_0 *blk = (const BlockQ4_0 *)row + b;
    *d = _cvtsh_ss(blk->d);
    __m128i q = _mm_loadu_si128((const __m128i *)blk->qs);
    __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0f));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0f));
    return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
}

MM_INLINE void qtile_direct(MnType type, int T, const uint8_t *row, int64_t nb, const uint8_t *xq0,
                            size_t xq_stride, float *out0, int64_t n_out) {
    __m256 acc[QDT];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        float dw;
        __m256i wv = wblock8(type, row, b, &dw);
        __m256i aw = _mm256_sign_epi8(wv, wv);
        for (int t = 0; t < T; t++) {
            const BlockQ8_0 *xb = (const BlockQ8_0 *)(xq0 + t * xq_stride) + b;
            __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xb->qs), wv);
            __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
            __m256 sc = _mm256_set1_ps(dw * _cvtsh_ss(xb->d));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), sc, acc[t]);
        }
    }
    for (int t = 0; t < T; t++) out0[t * n_out] = hsum8(acc[t]);
}

MM_INLINE void qrows_direct(MnType type, const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    int64_t nb = w->n_in / 32, n_out = w->n_out;
    size_t row_bytes = (size_t)nb * (type == MN_TYPE_Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0));
    for (long r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
        for (int t0 = 0; t0 < job->n_tok; t0 += QDT) {
            int T = MM_MIN(QDT, job->n_tok - t0);
            const uint8_t *xq0 = job->xq + (size_t)t0 * job->xq_stride;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            if (T == QDT) qtile_direct(type, QDT, row, nb, xq0, job->xq_stride, out0, n_out);
            else
                for (int t = 0; t < T; t++)
                    qtile_direct(type, 1, row, nb, xq0 + t * job->xq_stride, job->xq_stride, out0 + t * n_out,
                                 n_out);
        }
    }
}

static void rows_run(const MmJob *job, long r0, long r1) {
    switch (job->w->type) {
    case MN_TYPE_F32: frows(MN_TYPE_F32, job, r0, r1); break;
    case MN_TYPE_F16: frows(MN_TYPE_F16, job, r0, r1); break;
    case MN_TYPE_BF16: frows(MN_TYPE_BF16, job, r0, r1); break;
    case MN_TYPE_Q8_0: qrows_direct(MN_TYPE_Q8_0, job, r0, r1); break;
    case MN_TYPE_Q4_0: qrows_direct(MN_TYPE_Q4_0, job, r0, r1); break;
    }
}

static void job_plan(MmJob *job, int nth) {
    long n_out = (long)job->w->n_out;
    long chunk = round_up((n_out + (long)nth * 4 - 1) / ((long)nth * 4), FR);
    job->is_packed = false;
    job->chunk_rows = chunk;
    job->n_chunks = (n_out + chunk - 1) / chunk;
}

const char *mm_simd_name(void) { return "avx2"; }

/* ========================================================================
 * Scalar path
 * ===================================================================== */
#else

static size_t act_row_bytes(int64_t n_in) { return (size_t)(n_in / 32) * sizeof(BlockQ8_0); }

static void act_quantize_row(const float *x, int64_t n_in, uint8_t *dst) {
    ttype_quantize_row(MN_TYPE_Q8_0, x, dst, n_in);
}

static float wval(MnType type, const uint8_t *row, int64_t k) {
    uint16_t h;
    float v;
    switch (type) {
    case MN_TYPE_F16: memcpy(&h, row + 2 * k, 2); return mn_f16_to_f32(h);
    case MN_TYPE_BF16: memcpy(&h, row + 2 * k, 2); return mn_bf16_to_f32(h);
    default: memcpy(&v, row + 4 * k, 4); return v;
    }
}

static void rows_run(const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    int64_t n_in = w->n_in, n_out = w->n_out, nb = n_in / 32;
    bool is_q = w->type == MN_TYPE_Q8_0 || w->type == MN_TYPE_Q4_0;
    size_t row_bytes = w->type == MN_TYPE_Q8_0   ? (size_t)nb * sizeof(BlockQ8_0)
                       : w->type == MN_TYPE_Q4_0 ? (size_t)nb * sizeof(BlockQ4_0)
                       : w->type == MN_TYPE_F32  ? (size_t)n_in * 4
                                                 : (size_t)n_in * 2;
    for (long r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
        for (int t = 0; t < job->n_tok; t++) {
            float acc = 0.0f;
            if (!is_q) {
                const float *xt = job->x + (int64_t)t * n_in;
                for (int64_t k = 0; k < n_in; k++) acc += wval(w->type, row, k) * xt[k];
            } else {
                const BlockQ8_0 *xb = (const BlockQ8_0 *)(job->xq + (size_t)t * job->xq_stride);
                for (int64_t b = 0; b < nb; b++) {
                    int32_t sum = 0;
                    float dw;
                    if (w->type == MN_TYPE_Q8_0) {
                        const BlockQ8_0 *wb = (const BlockQ8_0 *)row + b;
                        dw = mn_f16_to_f32(wb->d);
                        for (int j = 0; j < 32; j++) sum += wb->qs[j] * xb[b].qs[j];
                    } else {
                        const BlockQ4_0 *wb = (const BlockQ4_0 *)row + b;
                        dw = mn_f16_to_f32(wb->d);
                        for (int j = 0; j < 16; j++) {
                            sum += ((wb->qs[j] & 0x0f) - 8) * xb[b].qs[j];
                            sum += ((wb->qs[j] >> 4) - 8) * xb[b].qs[j + 16];
                        }
                    }
                    acc += (float)sum * (dw * mn_f16_to_f32(xb[b].d));
                }
            }
            job->out[(int64_t)t * n_out + r] = acc;
        }
    }
}

static void job_plan(MmJob *job, int nth) {
    long n_out = (long)job->w->n_out;
    long chunk = (n_out + (long)nth * 4 - 1) / ((long)nth * 4);
    if (chunk < 1) chunk = 1;
    job->is_packed = false;
    job->chunk_rows = chunk;
    job->n_chunks = (n_out + chunk - 1) / chunk;
}

const char *mm_simd_name(void) { return "scalar"; }

#endif

/* ========================================================================
 * Driver (all paths)
 * ===================================================================== */

static bool type_is_quant(MnType t) { return t == MN_TYPE_Q8_0 || t == MN_TYPE_Q4_0; }

size_t mm_scratch_bytes(MnType wtype, int64_t n_in, int n_tok) {
    if (!type_is_quant(wtype) || n_tok <= 0) return 0;
    /* the SIMD layout and the reference's BlockQ8_0 rows; 64-bit sizes */
    size_t simd = (size_t)n_tok * act_row_bytes(n_in);
    size_t ref = (size_t)n_tok * (size_t)(n_in / 32) * sizeof(BlockQ8_0);
    size_t n = simd > ref ? simd : ref;
    return (n + 63) / 64 * 64;
}

static void quant_worker(void *ctx, int ith, int nth) {
    const MmQuantJob *q = ctx;
    long lo, hi;
    tpool_split(q->n_tok, 1, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) act_quantize_row(q->x + t * q->n_in, q->n_in, q->xq + (size_t)t * q->xq_stride);
}

static void mm_worker(void *ctx, int ith, int nth) {
    MmJob *job = ctx;
    for (;;) {
        long c = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed);
        if (c >= job->n_chunks) break;
        long r0 = c * job->chunk_rows;
        long r1 = MM_MIN((long)job->w->n_out, r0 + job->chunk_rows);
        rows_run(job, r0, r1);
    }
}

void mm_matmul(ThreadPool *tp, float *out, const MatW *w, const float *x, int n_tok, void *scratch) {
    assert(w != NULL && out != NULL && (x != NULL || n_tok == 0));
    assert(ttype_traits(w->type) != NULL);
    if (n_tok <= 0 || w->n_out <= 0) return;
    int nth = tp != NULL ? tpool_size(tp) : 1;
    MmJob job = {.w = w, .x = x, .out = out, .n_tok = n_tok};
    atomic_init(&job.next_chunk, 0);
    if (type_is_quant(w->type)) {
        assert(w->n_in % 32 == 0 && scratch != NULL);
        MmQuantJob q = {.x = x, .n_in = w->n_in, .n_tok = n_tok, .xq = scratch, .xq_stride = act_row_bytes(w->n_in)};
        if (tp != NULL && nth > 1 && n_tok >= 2 * nth) tpool_run(tp, quant_worker, &q);
        else quant_worker(&q, 0, 1);
        job.xq = scratch;
        job.xq_stride = q.xq_stride;
    }
    job_plan(&job, nth);
    if (tp != NULL && nth > 1 && job.n_chunks > 1) tpool_run(tp, mm_worker, &job);
    else mm_worker(&job, 0, 1);
}

/* ========================================================================
 * Reference
 * ===================================================================== */

void mm_matmul_ref(float *out, const MatW *w, const float *x, int n_tok, void *scratch) {
    int64_t n_in = w->n_in, n_out = w->n_out;
    uint64_t row_bytes = 0;
    if (ttype_row_bytes(w->type, (uint64_t)n_in, &row_bytes) != MN_OK) assert(!"bad weight shape");
    if (type_is_quant(w->type)) {
        int64_t nb = n_in / 32;
        BlockQ8_0 *xq = scratch;
        for (int t = 0; t < n_tok; t++) ttype_quantize_row(MN_TYPE_Q8_0, x + (int64_t)t * n_in, xq + t * nb, n_in);
        for (int64_t r = 0; r < n_out; r++) {
            const uint8_t *row = (const uint8_t *)w->data + r * row_bytes;
            for (int t = 0; t < n_tok; t++) {
                const BlockQ8_0 *xb = xq + t * nb;
                double acc = 0.0;
                for (int64_t b = 0; b < nb; b++) {
                    int8_t wq[32];
                    float dw;
                    if (w->type == MN_TYPE_Q8_0) {
                        const BlockQ8_0 *wb = (const BlockQ8_0 *)row + b;
                        dw = mn_f16_to_f32(wb->d);
                        memcpy(wq, wb->qs, 32);
                    } else {
                        const BlockQ4_0 *wb = (const BlockQ4_0 *)row + b;
                        dw = mn_f16_to_f32(wb->d);
                        for (int j = 0; j < 16; j++) {
                            wq[j] = (int8_t)((wb->qs[j] & 0x0f) - 8);
                            wq[j + 16] = (int8_t)((wb->qs[j] >> 4) - 8);
                        }
                    }
                    int32_t sum = 0;
                    for (int j = 0; j < 32; j++) sum += wq[j] * xb[b].qs[j];
                    acc += (double)dw * (double)mn_f16_to_f32(xb[b].d) * (double)sum;
                }
                out[(int64_t)t * n_out + r] = (float)acc;
            }
        }
        return;
    }
    /* float weights: dequantize a slice at a time, accumulate in double */
    enum { SLICE = 256 };
    float wbuf[SLICE];
    size_t elem = ttype_traits(w->type)->block_bytes;
    for (int64_t r = 0; r < n_out; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * row_bytes;
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (int64_t)t * n_in;
            double acc = 0.0;
            for (int64_t k0 = 0; k0 < n_in; k0 += SLICE) {
                int64_t n = MM_MIN(SLICE, n_in - k0);
                ttype_dequantize_row(w->type, row + (size_t)k0 * elem, wbuf, n);
                for (int64_t k = 0; k < n; k++) acc += (double)wbuf[k] * (double)xt[k0 + k];
            }
            out[(int64_t)t * n_out + r] = (float)acc;
        }
    }
}
