/* matmul.c — weight-times-activation products (see matmul.h).
 *
 * How it fits: every projection of the forward pass (q/k/v/o, the FFN, the
 * output head) is one mm_matmul call on the engine thread, which spreads the
 * work over the compute pool with one tpool_share. Workers take chunks of
 * output rows from an atomic counter in the job (a worker that is not
 * running when the job begins leaves its chunks to the others); the job
 * lives on the caller's stack for the duration of the call, and each
 * output element is written by exactly one worker.
 *
 * Every quantized type multiplies int8 activations: the K-quants and
 * IQ4_XS in compute/kquant.c, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL in
 * compute/q32.c (i8_worker below: each worker quantizes a group of tokens
 * on its stack, then takes row chunks against it), at every n_tok, decode
 * included (a token's value must not depend on the batch it came in).
 * F32/F16/BF16 keep f32 activations, and so do the quantized types when a
 * token's quantized activations do not fit a worker's buffer (rows far
 * longer than any model's). Their weights are then dequantized exactly
 * through dq_rows (compute/dequant.c) — to ttype_dequantize_row's values,
 * bit for bit: an f16 scale (11 significant bits) times an integer of at
 * most 8 bits is exact in f32, and the one rounded offset addition is done
 * as the reference does it — and multiplied like float weights. So such a
 * product is bit-identical to the F32 product against the dequantized
 * matrix (test_matmul checks this for every type).
 *
 * Batch invariance, the invariant everything here is built around: the value
 * of out[t][r] depends only on W's row r, x's row t and n_in — not on n_tok,
 * the position of t, the chunking, the tile shape, the kernel or the thread
 * count. Every weight type follows one accumulation order per element:
 *
 *   AVX-512: one 16-lane f32 accumulator; lane l gets fma(w[16c+l],
 *     x[16c+l]) for chunks c = 0, 1, ... in order, the last chunk masked with
 *     zeros;
 *     then hsum16's fixed tree (l, l+8), (l, l+4), (l, l+2), (l, l+1).
 *     (Quantized rows are whole blocks, so their chunks are never masked.)
 *     Tiles of R rows x T tokens run R*T such accumulators side by side; the
 *     edge tiles use the same sequence.
 *   AVX2 and scalar paths: the same with 8 lanes / one lane.
 *
 * Kernels (AVX-512):
 *   ftile   F32/F16/BF16 weights, 6 rows x 4 tokens of accumulators, weights
 *           widened in registers. Work items are row panels that stay in L2
 *           while the token tiles go by. Decode is the T = 1 case.
 *   ktile   quantized weights, where they keep f32 activations: per step
 *           of KB (256) elements, dq_rows writes the step of each of the
 *           tile's rows into a buffer on the stack (L1), then the tile's
 *           tokens multiply it as ftile multiplies float weights. 8 rows x
 *           1 token (decode; the next tile's rows are prefetched alongside,
 *           since the weights then stream from DRAM once), 4 rows x 2..6
 *           tokens.
 *
 * The AVX2 path has the same kernels in 8 lanes, with smaller tiles (4 rows
 * x 3 tokens) and panels (128 KiB).
 *
 * Nothing here allocates and no scratch is needed. ktile keeps KR1 x KB
 * floats (8 KB) on the worker's stack; an int8 worker its group of
 * quantized tokens (I8_ACT_BYTES).
 */
#include "compute/matmul.h"

#include "base/err.h"
#include "compute/dequant.h"
#include "compute/kquant.h"
#include "compute/q32.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__) && \
    defined(__F16C__)
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
    size_t row_bytes;       /* bytes of one weight row */
    long chunk_rows;        /* rows per work item */
    long n_chunks;
    int group_tok;          /* int8 types: tokens quantized at a time */
    long n_groups;          /* int8 types: work items are (group, chunk) pairs */
    atomic_long next_chunk; /* next work item to hand out */
} MmJob;

static void rows_run(const MmJob *job, long r0, long r1);

static inline long round_up(long n, long m) { return (n + m - 1) / m * m; }

/* The quantized types, when they keep f32 activations (rows too long for
 * the int8 kernels' buffers), share ktile, which dequantizes through
 * dq_rows. */
static inline bool type_is_k(MnType t) { return ttype_traits(t)->is_quantized; }

/* ktile's step: the elements of each row dequantized at a time (a K-quant
 * super-block, or eight 32-element blocks), and their bytes (both SIMD
 * paths). */
enum { KB = MN_QK_K };
static inline size_t kb_bytes(MnType t) { return KB / ttype_traits(t)->block_elems * ttype_traits(t)->block_bytes; }

#if !defined(MM_SCALAR)
/* Decode's prefetch distance in a row (bench_matmul, F16, 1 token,
 * AVX-512: 22.2-22.8 -> 25.3-26.6 tok/s against the next tile at the same
 * offset, alternated runs). */
enum { MM_AHEAD = 1024 };

/* Float weights that stream (decode: read once, from DRAM, faster than
 * the hardware prefetcher follows a tile's short rows): at byte `at` of
 * the R rows from w0 (len bytes each), ask for the bytes MM_AHEAD on in
 * every row, past their end those of the next tile's R rows from pf0
 * (when not NULL). Call once per 64 bytes. */
MM_INLINE void stream_prefetch(int R, const uint8_t *w0, size_t row_bytes, size_t at, size_t len,
                               const uint8_t *pf0) {
    const size_t ahead = at + MM_AHEAD;
    if (ahead < len) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) _mm_prefetch((const char *)w0 + r * row_bytes + ahead, _MM_HINT_T0);
    } else if (pf0 != NULL && ahead - len < len) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) _mm_prefetch((const char *)pf0 + r * row_bytes + (ahead - len), _MM_HINT_T0);
    }
}
#endif

/* ========================================================================
 * AVX-512 path
 * ===================================================================== */
#if defined(MM_AVX512)

/* Tile shapes and cache budgets: a tile's accumulators (24) leave room in
 * the 32 vector registers for the weights and tokens it loads, and a work
 * item's weights stay in a core's L2. Tuned with tests/bench_matmul.c (on
 * which machine: docs/OPERATIONS.md, "Measuring"). */
enum {
    FR = 6,                     /* float kernel: rows per tile */
    FT = 4,                     /* float kernel: tokens per tile (6x4: 24 accumulators) */
    F_PANEL_BYTES = 512 * 1024, /* weights per work item, kept in L2 */
    KR1 = 8,                    /* quantized weights: rows per tile of one token */
    KR = 4,                     /* ... rows per tile of more tokens */
    KT = 6,                     /* ... tokens per tile (4x6: 24 accumulators) */
    KST = 4,                    /* ... tokens per tile while the weights stream */
    K_STREAM_MAX_TOK = 8,       /* at most this many tokens: weights stream from DRAM */
};

/* The one horizontal sum every result goes through. */
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
 * (n_in apart). When the weights stream, each step asks for them ahead
 * (stream_prefetch; pf0 the next tile's first row, or NULL). */
MM_INLINE void ftile(MnType type, int R, int T, const uint8_t *w0, size_t row_bytes, const float *x0,
                     int64_t n_in, float *out0, int64_t n_out, bool stream, const uint8_t *pf0) {
    const int esize = type == MN_TYPE_F32 ? 4 : 2;
    __m512 acc[FR][FT];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n_in; k += 16) {
        if (stream && (k * esize) % 64 == 0)
            stream_prefetch(R, w0, row_bytes, (size_t)k * esize, (size_t)n_in * esize, pf0);
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
    case 1: ftile(type, R, 1, w0, row_bytes, x0, n_in, out0, n_out, is_stream, pf0); break; \
    case 2: ftile(type, R, 2, w0, row_bytes, x0, n_in, out0, n_out, is_stream, pf0); break; \
    case 3: ftile(type, R, 3, w0, row_bytes, x0, n_in, out0, n_out, is_stream, pf0); break; \
    default: ftile(type, R, 4, w0, row_bytes, x0, n_in, out0, n_out, is_stream, pf0); break; \
    }
_Static_assert(FT == 4, "FTILE_CASES covers T = 1..4");

/* Rows [r0, r1): token tiles outside, row tiles inside, so a tile's
 * activations are reused across the chunk's rows while the chunk's weights
 * stay in L2 across token tiles. */
MM_INLINE void frows(MnType type, const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    int64_t n_in = w->n_in, n_out = w->n_out;
    size_t row_bytes = job->row_bytes;
    bool is_stream = job->n_tok <= 2 * FT; /* weights mostly from DRAM */
    for (int t0 = 0; t0 < job->n_tok; t0 += FT) {
        int T = MM_MIN(FT, job->n_tok - t0);
        const float *x0 = job->x + (int64_t)t0 * n_in;
        long r = r0;
        for (; r + FR <= r1; r += FR) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            /* few tokens: the weights stream from DRAM once, and the
             * hardware prefetcher restarts on every short row */
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

/* ---- quantized weights ---- */

/* out[t][r] for R rows from w0 and T tokens from x0, for any quantized
 * type: each row's weights are dequantized KB elements at a time into buf
 * (dq_row: exactly ttype_dequantize_row's values), then multiplied as
 * ftile multiplies float weights — lane l of chunk c gets w[16c + l] *
 * x[16c + l] — so the result equals the F32 product with the dequantized
 * matrix. pf0, when not NULL, is a later tile's first row: the same bytes
 * of its R rows are prefetched alongside. */
MM_INLINE void ktile(MnType type, int R, int T, const uint8_t *w0, size_t row_bytes, const float *x0, int64_t n_in,
                     float *out0, int64_t n_out, const uint8_t *pf0) {
    _Alignas(64) float buf[KR1][KB];
    __m512 acc[KR1][KT];
    const size_t kbb = kb_bytes(type);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t k0 = 0, i = 0; k0 < n_in; k0 += KB, i++) {
        int n = (int)MM_MIN(KB, n_in - k0);
        dq_rows(type, w0 + i * kbb, row_bytes, R, buf[0], KB, n);
        if (pf0 != NULL)
            for (int r = 0; r < R; r++)
                for (size_t o = 0; o < kbb; o += 64) _mm_prefetch((const char *)pf0 + r * row_bytes + i * kbb + o, _MM_HINT_T0);
        for (int c = 0; c < n / 16; c++) {
            __m512 xv[KT];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                xv[t] = _mm512_loadu_ps(x0 + t * n_in + k0 + 16 * c);
                MM_PIN(xv[t]);
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512 wv = _mm512_load_ps(buf[r] + 16 * c);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) out0[t * n_out + r] = hsum16(acc[r][t]);
}

#define KTILE(R, T) ktile(type, R, T, w0, row_bytes, x0, n_in, out0, n_out, pf0)
/* ktile with constant shapes, so its loops unroll. */
#define KTILE_CASES(R) \
    switch (T) { \
    case 1: KTILE(R, 1); break; \
    case 2: KTILE(R, 2); break; \
    case 3: KTILE(R, 3); break; \
    case 4: KTILE(R, 4); break; \
    case 5: KTILE(R, 5); break; \
    default: KTILE(R, 6); break; \
    }
_Static_assert(KT == 6, "KTILE_CASES covers T = 1..6");

/* Rows [r0, r1) of a type ktile serves: token tiles outside, row tiles
 * inside, as frows; decode (one token) takes KR1 rows a tile and, as the
 * weights then stream from DRAM, prefetches the next tile. */
static void krows(const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    const MnType type = w->type;
    int64_t n_in = w->n_in, n_out = w->n_out;
    size_t row_bytes = job->row_bytes;
    bool is_stream = job->n_tok <= K_STREAM_MAX_TOK;
    int tt = is_stream ? KST : KT;
    for (int t0 = 0; t0 < job->n_tok; t0 += tt) {
        int T = MM_MIN(tt, job->n_tok - t0);
        const float *x0 = job->x + (int64_t)t0 * n_in;
        long r = r0;
        int rt = T == 1 ? KR1 : KR;
        for (; r + rt <= r1; r += rt) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            const uint8_t *pf0 = is_stream && r + 2 * rt <= r1 ? w0 + rt * row_bytes : NULL;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            if (T == 1) KTILE(KR1, 1);
            else KTILE_CASES(KR)
        }
        for (; r < r1; r++) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            const uint8_t *pf0 = NULL;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            KTILE_CASES(1)
        }
    }
}

static void frows_f32(const MmJob *job, long r0, long r1) { frows(MN_TYPE_F32, job, r0, r1); }
static void frows_f16(const MmJob *job, long r0, long r1) { frows(MN_TYPE_F16, job, r0, r1); }
static void frows_bf16(const MmJob *job, long r0, long r1) { frows(MN_TYPE_BF16, job, r0, r1); }

static void rows_run(const MmJob *job, long r0, long r1) {
    switch (job->w->type) {
    case MN_TYPE_F32: frows_f32(job, r0, r1); break;
    case MN_TYPE_F16: frows_f16(job, r0, r1); break;
    case MN_TYPE_BF16: frows_bf16(job, r0, r1); break;
    default: krows(job, r0, r1); break;
    }
}

/* Work items: panels of rows that stay in L2 across the token loop, small
 * enough that every thread gets several. */
static void job_plan(MmJob *job, int nth) {
    const MatW *w = job->w;
    long n_out = (long)w->n_out, align = FR, cap = (long)(F_PANEL_BYTES / job->row_bytes);
    if (type_is_k(w->type)) align = job->n_tok <= K_STREAM_MAX_TOK ? KR1 : KR;
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

enum {
    FR = 4,                     /* float kernel: rows per tile */
    FT = 3,                     /* float kernel: tokens per tile (4x3: 12 accumulators of 16 registers) */
    F_PANEL_BYTES = 128 * 1024, /* weights per work item, kept in L2: bench_matmul F16 prefill, 2 threads
                                   on Zen 3, 96 -> 135 GFLOP/s against 256 KiB (alternated medians) */
};

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

/* As the AVX-512 ftile, in 8 lanes. */
MM_INLINE void ftile(MnType type, int R, int T, const uint8_t *w0, size_t row_bytes, const float *x0,
                     int64_t n_in, float *out0, int64_t n_out, bool stream, const uint8_t *pf0) {
    const int esize = type == MN_TYPE_F32 ? 4 : 2;
    __m256 acc[FR][FT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n_in; k += 8) {
        if (stream && (k * esize) % 64 == 0)
            stream_prefetch(R, w0, row_bytes, (size_t)k * esize, (size_t)n_in * esize, pf0);
        __m256 xv[FT];
        /* one load per token, not one per row folded into the FMAs (16
         * loads per 12 FMAs): bench_matmul F16 prefill, 45 -> 58 GFLOP/s a
         * thread */
        for (int t = 0; t < T; t++) {
            xv[t] = _mm256_loadu_ps(x0 + t * n_in + k);
            MM_PIN(xv[t]);
        }
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

/* ftile for quantized weights: each row's weights dequantized KB
 * elements at a time into buf (dq_row, exact), then multiplied in the
 * float order. */
MM_INLINE void ktile(MnType type, int R, int T, const uint8_t *w0, size_t row_bytes, const float *x0,
                     int64_t n_in, float *out0, int64_t n_out) {
    _Alignas(32) float buf[FR][KB];
    const size_t kbb = kb_bytes(type);
    __m256 acc[FR][FT];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t k0 = 0, i = 0; k0 < n_in; k0 += KB, i++) {
        int n = (int)MM_MIN(KB, n_in - k0);
        dq_rows(type, w0 + i * kbb, row_bytes, R, buf[0], KB, n);
        for (int c = 0; c < n / 8; c++) {
            __m256 xv[FT];
            for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x0 + t * n_in + k0 + 8 * c);
            for (int r = 0; r < R; r++) {
                __m256 wv = _mm256_load_ps(buf[r] + 8 * c);
                for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out0[t * n_out + r] = hsum8(acc[r][t]);
}

/* One tile of any type: R rows x T tokens (stream, pf0: ftile's). */
MM_INLINE void tile(MnType type, int R, int T, const uint8_t *w0, size_t row_bytes, const float *x0,
                    int64_t n_in, float *out0, int64_t n_out, bool stream, const uint8_t *pf0) {
    if (type_is_k(type)) ktile(type, R, T, w0, row_bytes, x0, n_in, out0, n_out);
    else ftile(type, R, T, w0, row_bytes, x0, n_in, out0, n_out, stream, pf0);
}

MM_INLINE void frows(MnType type, const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    int64_t n_in = w->n_in, n_out = w->n_out;
    size_t row_bytes = job->row_bytes;
    const bool is_stream = job->n_tok <= 2 * FT; /* weights mostly from DRAM */
    for (int t0 = 0; t0 < job->n_tok; t0 += FT) {
        int T = MM_MIN(FT, job->n_tok - t0);
        const float *x0 = job->x + (int64_t)t0 * n_in;
        long r = r0;
        for (; r + FR <= r1; r += FR) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            const uint8_t *pf0 = is_stream && r + 2 * FR <= r1 ? w0 + FR * row_bytes : NULL;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            if (T == 3) tile(type, FR, 3, w0, row_bytes, x0, n_in, out0, n_out, is_stream, pf0);
            else if (T == 2) tile(type, FR, 2, w0, row_bytes, x0, n_in, out0, n_out, is_stream, pf0);
            else tile(type, FR, 1, w0, row_bytes, x0, n_in, out0, n_out, is_stream, pf0);
        }
        for (; r < r1; r++) {
            const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r * row_bytes;
            float *out0 = job->out + (int64_t)t0 * n_out + r;
            if (T == 3) tile(type, 1, 3, w0, row_bytes, x0, n_in, out0, n_out, is_stream, NULL);
            else if (T == 2) tile(type, 1, 2, w0, row_bytes, x0, n_in, out0, n_out, is_stream, NULL);
            else tile(type, 1, 1, w0, row_bytes, x0, n_in, out0, n_out, is_stream, NULL);
        }
    }
}
_Static_assert(FT == 3, "frows covers T = 1..3");

static void rows_run(const MmJob *job, long r0, long r1) {
    switch (job->w->type) {
    case MN_TYPE_F32: frows(MN_TYPE_F32, job, r0, r1); break;
    case MN_TYPE_F16: frows(MN_TYPE_F16, job, r0, r1); break;
    case MN_TYPE_BF16: frows(MN_TYPE_BF16, job, r0, r1); break;
    default: frows(job->w->type, job, r0, r1); break; /* ktile */
    }
}

/* Work items: panels of rows that stay in L2 across the token loop, as
 * the AVX-512 path's. */
static void job_plan(MmJob *job, int nth) {
    long n_out = (long)job->w->n_out, cap = (long)(F_PANEL_BYTES / job->row_bytes);
    long chunk = MM_MIN((n_out + (long)nth * 4 - 1) / ((long)nth * 4), cap);
    chunk = chunk < FR ? FR : round_up(chunk, FR);
    job->chunk_rows = chunk;
    job->n_chunks = (n_out + chunk - 1) / chunk;
}

const char *mm_simd_name(void) { return "avx2"; }

/* ========================================================================
 * Scalar path
 * ===================================================================== */
#else

/* Each row is dequantized KB elements at a time (ttype_dequantize_row;
 * dq_row's scalar path is the same function) and every token's dot product
 * goes on from where the last slice left it, in out itself: one f32
 * accumulator per output, k in order. */
static void rows_run(const MmJob *job, long r0, long r1) {
    const MatW *w = job->w;
    const TypeTraits *tt = ttype_traits(w->type);
    int64_t n_in = w->n_in, n_out = w->n_out;
    float buf[KB];
    for (long r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * job->row_bytes;
        for (int t = 0; t < job->n_tok; t++) job->out[(int64_t)t * n_out + r] = 0.0f;
        for (int64_t k0 = 0; k0 < n_in; k0 += KB) {
            int64_t n = MM_MIN(KB, n_in - k0);
            ttype_dequantize_row(w->type, row + (size_t)k0 / tt->block_elems * tt->block_bytes, buf, n);
            for (int t = 0; t < job->n_tok; t++) {
                const float *xt = job->x + (int64_t)t * n_in + k0;
                float acc = job->out[(int64_t)t * n_out + r];
                for (int64_t k = 0; k < n; k++) acc += buf[k] * xt[k];
                job->out[(int64_t)t * n_out + r] = acc;
            }
        }
    }
}

static void job_plan(MmJob *job, int nth) {
    long n_out = (long)job->w->n_out;
    long chunk = (n_out + (long)nth * 4 - 1) / ((long)nth * 4);
    if (chunk < 1) chunk = 1;
    job->chunk_rows = chunk;
    job->n_chunks = (n_out + chunk - 1) / chunk;
}

const char *mm_simd_name(void) { return "scalar"; }

#endif

/* ========================================================================
 * Driver (all paths)
 * ===================================================================== */


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

/* ---- int8 activations: the K-quants and IQ4_XS (compute/kquant.c), the
 * 32-element types (compute/q32.c) ---- */

enum {
    I8_ACT_BYTES = 512 * 1024,   /* a group of quantized tokens, on the worker's stack */
    I8_PANEL_BYTES = 512 * 1024, /* weights per work item, kept in L2 across a group */
};

/* The group of tokens that fits a worker's buffer, if W takes an int8 path. */
static int i8_group(const MatW *w, int n_tok) {
    if (kq_has_type(w->type)) return kq_group_tokens(w->n_in, n_tok, I8_ACT_BYTES);
    if (q32_has_type(w->type)) return q32_group_tokens(w->n_in, n_tok, I8_ACT_BYTES);
    return 0;
}

/* Whether W takes an int8 path: its type, and a token fits the buffer. */
static bool i8_takes(const MatW *w) { return i8_group(w, 1) == 1; }

int mm_token_lanes(const MatW *w, int n_tok) {
    if (!i8_takes(w)) return 1;
    return kq_has_type(w->type) ? kq_token_lanes(n_tok) : q32_token_lanes(n_tok);
}

/* Rows [r0, r1) of job's W for the n_tok tokens quantized at acts, by W's
 * module (q32.c or kquant.c), into out (n_tok, n_out). */
static void i8_rows(const MmJob *job, long r0, long r1, const uint8_t *acts, int n_tok, float *out) {
    const MatW *w = job->w;
    if (q32_has_type(w->type)) q32_rows(w->type, w->data, job->row_bytes, r0, r1, w->n_in, acts, n_tok, out, w->n_out);
    else kq_rows(w->type, w->data, job->row_bytes, r0, r1, w->n_in, acts, n_tok, out, w->n_out);
}

/* Work items in order: group 0's row chunks, then group 1's, ... A worker
 * quantizes a group's tokens when it first takes one of its items; items
 * go out in order, so it quantizes each group at most once. The values do
 * not depend on who quantized them (kq_quantize and q32_quantize are
 * functions of x). */
static void i8_worker(void *ctx, int ith, int nth) {
    MmJob *job = ctx;
    _Alignas(64) uint8_t acts[I8_ACT_BYTES];
    const MatW *w = job->w;
    const bool is_q32 = q32_has_type(w->type);
    long cur = -1;
    for (;;) {
        long i = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed);
        if (i >= job->n_chunks * job->n_groups) break;
        long g = i / job->n_chunks, c = i % job->n_chunks;
        int t0 = (int)g * job->group_tok, n = MM_MIN(job->group_tok, job->n_tok - t0);
        const float *x = job->x + (int64_t)t0 * w->n_in;
        if (g != cur) {
            if (is_q32) q32_quantize(x, w->n_in, n, acts);
            else kq_quantize(w->type, x, w->n_in, n, acts);
            cur = g;
        }
        long r0 = c * job->chunk_rows, r1 = MM_MIN((long)w->n_out, r0 + job->chunk_rows);
        i8_rows(job, r0, r1, acts, n, job->out + (int64_t)t0 * w->n_out);
    }
}

/* Chunks of whole 16-row tiles, several per thread, within L2; groups as
 * large as the buffer holds. */
static void i8_plan(MmJob *job, int nth) {
    long n_out = (long)job->w->n_out, cap = (long)(I8_PANEL_BYTES / job->row_bytes);
    long chunk = MM_MIN((n_out + (long)nth * 4 - 1) / ((long)nth * 4), cap);
    chunk = chunk < 16 ? 16 : round_up(chunk, 16);
    job->chunk_rows = chunk;
    job->n_chunks = (n_out + chunk - 1) / chunk;
    job->group_tok = i8_group(job->w, job->n_tok);
    job->n_groups = (job->n_tok + job->group_tok - 1) / job->group_tok;
}

MmPack mm_pack_kind(const MatW *w) {
    if (!i8_takes(w)) return MM_PACK_NONE;
    return kq_has_type(w->type) ? MM_PACK_KQ : MM_PACK_Q32;
}

size_t mm_packed_row_bytes(MmPack kind, int64_t n_in) {
    assert(kind != MM_PACK_NONE);
    return kind == MM_PACK_KQ ? (size_t)(n_in / MN_QK_K) * KQ_PACKED_BYTES : q32_packed_bytes(n_in);
}

void mm_pack_row(MmPack kind, const float *x, int64_t n_in, uint8_t *dst) {
    assert(kind != MM_PACK_NONE);
    if (kind == MM_PACK_KQ) kq_pack(x, n_in, dst);
    else q32_pack(x, n_in, dst);
}

size_t mm_packed_scratch_bytes(const MatW *w, int n_tok) {
    const MmPack kind = mm_pack_kind(w);
    assert(kind != MM_PACK_NONE);
    return kind == MM_PACK_KQ ? kq_acts_bytes(w->n_in, n_tok) : q32_acts_bytes(w->n_in, n_tok);
}

/* Rows of a product whose tokens are quantized already (job->x is their
 * quantized activations, kq_quantize's or q32_quantize's layout): chunks of
 * rows for all the tokens at once. */
static void i8_worker_packed(void *ctx, int ith, int nth) {
    MmJob *job = ctx;
    for (;;) {
        long c = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed);
        if (c >= job->n_chunks) break;
        long r0 = c * job->chunk_rows, r1 = MM_MIN((long)job->w->n_out, r0 + job->chunk_rows);
        i8_rows(job, r0, r1, (const uint8_t *)job->x, job->n_tok, job->out);
    }
}

void mm_matmul_packed(ThreadPool *tp, float *out, const MatW *w, const uint8_t *packed, int n_tok,
                      uint8_t *scratch) {
    const MmPack kind = mm_pack_kind(w);
    assert(kind != MM_PACK_NONE && ((uintptr_t)scratch & 63) == 0);
    if (n_tok <= 0 || w->n_out <= 0) return;
    if (kind == MM_PACK_KQ) kq_unpack(w->type, packed, w->n_in, n_tok, scratch);
    else q32_unpack(packed, w->n_in, n_tok, scratch);
    uint64_t row_bytes = 0;
    if (ttype_row_bytes(w->type, (uint64_t)w->n_in, &row_bytes) != MN_OK) assert(!"bad weight shape");
    int nth = tp != NULL ? tpool_size(tp) : 1;
    MmJob job = {.w = w, .x = (const float *)(const void *)scratch, .out = out, .n_tok = n_tok,
                 .row_bytes = (size_t)row_bytes};
    atomic_init(&job.next_chunk, 0);
    i8_plan(&job, nth); /* (its token groups are not used: every chunk takes all the tokens) */
    if (tp != NULL && nth > 1 && job.n_chunks > 1) tpool_share(tp, i8_worker_packed, &job);
    else i8_worker_packed(&job, 0, 1);
}

void mm_matmul(ThreadPool *tp, float *out, const MatW *w, const float *x, int n_tok) {
    assert(w != NULL && out != NULL && (x != NULL || n_tok == 0));
    assert(ttype_traits(w->type) != NULL);
    if (n_tok <= 0 || w->n_out <= 0) return;
    if (w->n_in <= 0) {
        memset(out, 0, (size_t)n_tok * (size_t)w->n_out * sizeof(float));
        return;
    }
    uint64_t row_bytes = 0;
    if (ttype_row_bytes(w->type, (uint64_t)w->n_in, &row_bytes) != MN_OK) {
        assert(!"bad weight shape"); /* the model loader checks shapes */
        memset(out, 0, (size_t)n_tok * (size_t)w->n_out * sizeof(float));
        return;
    }
    int nth = tp != NULL ? tpool_size(tp) : 1;
    MmJob job = {.w = w, .x = x, .out = out, .n_tok = n_tok, .row_bytes = (size_t)row_bytes};
    atomic_init(&job.next_chunk, 0);
    if (i8_takes(w)) {
        i8_plan(&job, nth);
        if (tp != NULL && nth > 1 && job.n_chunks * job.n_groups > 1) tpool_share(tp, i8_worker, &job);
        else i8_worker(&job, 0, 1);
        return;
    }
    job_plan(&job, nth);
    if (tp != NULL && nth > 1 && job.n_chunks > 1) tpool_share(tp, mm_worker, &job);
    else mm_worker(&job, 0, 1);
}

/* ========================================================================
 * Reference
 * ===================================================================== */

/* Every type alike: dequantize a slice of the row (a whole number of
 * blocks), accumulate w * x in double. */
void mm_matmul_ref(float *out, const MatW *w, const float *x, int n_tok) {
    enum { SLICE = 256 }; /* a multiple of every block size */
    int64_t n_in = w->n_in, n_out = w->n_out;
    const TypeTraits *tt = ttype_traits(w->type);
    uint64_t row_bytes = 0;
    if (ttype_row_bytes(w->type, (uint64_t)n_in, &row_bytes) != MN_OK) assert(!"bad weight shape");
    if (i8_takes(w)) { /* int8 activations, one token at a time */
        _Alignas(64) uint8_t acts[I8_ACT_BYTES];
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (int64_t)t * n_in;
            float *ot = out + (int64_t)t * n_out;
            if (q32_has_type(w->type)) {
                q32_quantize_ref(xt, n_in, 1, acts);
                q32_rows_ref(w->type, w->data, (size_t)row_bytes, 0, (long)n_out, n_in, acts, 1, ot, n_out);
            } else {
                kq_quantize_ref(w->type, xt, n_in, 1, acts);
                kq_rows_ref(w->type, w->data, (size_t)row_bytes, 0, (long)n_out, n_in, acts, 1, ot, n_out);
            }
        }
        return;
    }
    float wbuf[SLICE];
    for (int64_t r = 0; r < n_out; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * row_bytes;
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (int64_t)t * n_in;
            double acc = 0.0;
            for (int64_t k0 = 0; k0 < n_in; k0 += SLICE) {
                int64_t n = MM_MIN(SLICE, n_in - k0);
                ttype_dequantize_row(w->type, row + (size_t)k0 / tt->block_elems * tt->block_bytes, wbuf, n);
                for (int64_t k = 0; k < n; k++) acc += (double)wbuf[k] * (double)xt[k0 + k];
            }
            out[(int64_t)t * n_out + r] = (float)acc;
        }
    }
}
