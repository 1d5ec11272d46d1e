/* q32.c — Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL products with int8
 * activations (see q32.h).
 *
 * How it fits: mm_matmul (matmul.c) sends these types here. Each worker
 * quantizes a group of tokens into a buffer on its own stack
 * (q32_quantize), then multiplies its rows against them (q32_rows).
 * Stateless; any thread may call any function.
 *
 * A weight block reads, for the SIMD kernels, as 32 unsigned byte codes u
 * in element order and a bias o with c = u - o: Q4_0 the nibble, o = 8;
 * Q5_0 nibble | high bit << 4, o = 16; Q4_1 the nibble and Q5_1 the 5-bit
 * code, o = 0; with AVX-512, IQ4_NL level + 128 and Q8_0 byte + 128 (the
 * byte ^ 0x80), o = 128. AVX2 keeps IQ4_NL's and Q8_0's signed values and
 * moves their sign onto the activation, as vpmaddubsw needs (its pair sums
 * saturate at int16, which u up to 255 could reach). So
 *     S = sum of u * q  -  o * sx,
 * integer arithmetic throughout: every path computes the same S, then the
 * same f32 steps (q32.h), and a product's bits depend only on the weight
 * row and the token.
 *
 * Quantized activations come in two layouts, chosen by the number of
 * tokens n alike in q32_quantize, q32_acts_bytes and q32_rows:
 *   rows (n < TILE_MIN_TOK, and always on the scalar path): token t at
 *     t * tok_bytes: its n_in codes, then nb f32 steps d, nb f32 scaled
 *     sums s, nb int32 code sums sx (nb = n_in / 32; d and s hold f16
 *     values);
 *   tiles (SIMD paths, more tokens): LANES tokens a tile (16 with AVX-512,
 *     8 with AVX2), the last one filled up with tokens of zeros; tile i at
 *     i * tile_bytes, and in it block b at b * 44 * LANES: code word j
 *     (codes 4j..4j+3) of token 0, 1, .., LANES - 1, then word j + 1, ..,
 *     then the LANES steps d, the LANES s, the LANES sx.
 *
 * Kernels:
 *   tiles (prefill): vector lanes are tokens. A tile of PR rows is first
 *     unpacked, SLB blocks at a time, into a Pack on the stack (byte codes
 *     u, f32 scales and mins); then every token tile of the group goes by:
 *     per row and block, 8 vpdpbusd of the row's code word j, broadcast,
 *     against word j of the tile's tokens (vpmaddubsw + vpmaddwd on AVX2),
 *     starting from -o * sx, and the f32 steps for all the tile's tokens at
 *     once. No horizontal sums; the unpacking is shared by every token of
 *     the group. Rows longer than SLB blocks go slice by slice, each
 *     output's accumulator parked in `out` between slices (a stored f32
 *     reads back the same, so the sequence of steps is unchanged).
 *   rows (decode, few tokens): lanes are rows. AVX-512: per 16 rows and 2
 *     blocks, each row's 64 codes unpack into one vector and the rows' f16
 *     scales come in by one gather per block, once for all the tokens;
 *     then per token one vpdpbusd against its 64 codes, and a transpose
 *     tree sums the partials into S of both blocks for the 16 rows (lane =
 *     row). AVX2: 8 rows and two blocks a step, one token at a time: per
 *     row one vpmaddubsw pair over both blocks' codes, one sum tree for
 *     the two; the next tile's bytes are prefetched in address order
 *     (prefetch_span).
 *   scalar: q32_rows_ref.
 */
#include "compute/q32.h"

#include "compute/act8.h"

#include <assert.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__F16C__) && defined(__FMA__)
#define Q32_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q32_AVX2 1
#include <immintrin.h>
#endif

#define Q32_INLINE static inline __attribute__((always_inline))
#define Q32_MIN(a, b) ((a) < (b) ? (a) : (b))

enum { QK = MN_QK };

/* The tiles compute all LANES lanes whatever the number of tokens: below
 * TILE_MIN_TOK tokens the rows kernel costs less (bench_matmul's batch
 * mode); AVX-512 runs it for all the tokens at once, AVX2 once per token
 * against rows that stay in cache. */
#if defined(Q32_AVX512)
enum { LANES = 16, TILE_MIN_TOK = 9 };
#elif defined(Q32_AVX2)
enum { LANES = 8, TILE_MIN_TOK = 4 };
#else
enum { LANES = 1, TILE_MIN_TOK = INT_MAX };
#endif

/* A block of a tile: LANES tokens' codes, steps, scaled sums and sums. */
enum { BLOCK_BYTES = QK + 12, TILE_BLOCK_BYTES = BLOCK_BYTES * LANES };
enum { TILE_D_OFF = 32 * LANES, TILE_S_OFF = 36 * LANES, TILE_SX_OFF = 40 * LANES };

/* ---- types ------------------------------------------------------------- */

typedef struct Q32Kind {
    uint8_t blk_bytes;
    uint8_t qs_off; /* the 16 bytes of nibbles: element j < 16 low, j + 16 high;
                       Q8_0: the 32 signed byte codes, element order */
    int8_t qh_off;  /* Q5_0/Q5_1: the 32 high bits (bit j: element j), else -1 */
    uint8_t bias;   /* o (AVX-512 and scalar codes u) */
    bool has_min;   /* the f16 min at byte 2 */
    bool is_nl;     /* IQ4_NL: the nibble indexes mn_iq4_values */
    bool is_q8;     /* Q8_0: a byte a code, no nibbles */
} Q32Kind;

Q32_INLINE Q32Kind kind_of(MnType type) {
    switch (type) {
    case MN_TYPE_Q4_0: return (Q32Kind){sizeof(BlockQ4_0), offsetof(BlockQ4_0, qs), -1, 8, false, false, false};
    case MN_TYPE_Q4_1: return (Q32Kind){sizeof(BlockQ4_1), offsetof(BlockQ4_1, qs), -1, 0, true, false, false};
    case MN_TYPE_Q5_0:
        return (Q32Kind){sizeof(BlockQ5_0), offsetof(BlockQ5_0, qs), offsetof(BlockQ5_0, qh), 16, false, false, false};
    case MN_TYPE_Q5_1:
        return (Q32Kind){sizeof(BlockQ5_1), offsetof(BlockQ5_1, qs), offsetof(BlockQ5_1, qh), 0, true, false, false};
    case MN_TYPE_Q8_0: return (Q32Kind){sizeof(BlockQ8_0), offsetof(BlockQ8_0, qs), -1, 128, false, false, true};
    default: return (Q32Kind){sizeof(BlockIQ4_NL), offsetof(BlockIQ4_NL, qs), -1, 128, false, true, false};
    }
}

bool q32_has_type(MnType type) {
    switch (type) {
    case MN_TYPE_Q4_0: case MN_TYPE_Q4_1: case MN_TYPE_Q5_0: case MN_TYPE_Q5_1: case MN_TYPE_Q8_0:
    case MN_TYPE_IQ4_NL: return true;
    default: return false;
    }
}

/* ---- activation layouts ------------------------------------------------ */

static bool is_tiled(int n_tok) { return n_tok >= TILE_MIN_TOK; }
int q32_token_lanes(int n_tok) { return is_tiled(n_tok) ? LANES : 1; }
static size_t tok_bytes(int64_t n_in) { return ((size_t)n_in / QK * BLOCK_BYTES + 63) / 64 * 64; }
static size_t tile_bytes(int64_t n_in) { return (size_t)n_in / QK * TILE_BLOCK_BYTES; }

size_t q32_acts_bytes(int64_t n_in, int n_tok) {
    if (is_tiled(n_tok)) return (size_t)((n_tok + LANES - 1) / LANES) * tile_bytes(n_in);
    return (size_t)n_tok * tok_bytes(n_in);
}

int q32_group_tokens(int64_t n_in, int n_tok, size_t bytes) {
    return act8_group_tokens(n_tok, bytes, tok_bytes(n_in), tile_bytes(n_in), LANES, TILE_MIN_TOK);
}

/* One quantized block of one token, wherever the layout keeps it. */
typedef struct ActBlock {
    int8_t q[QK];
    float d;    /* the step, rounded to f16 */
    float s;    /* (amax / 127) * sx, rounded to f16: Q4_1/Q5_1's min term */
    int32_t sx; /* the sum of the codes */
} ActBlock;

static void act_put(uint8_t *acts, int64_t n_in, int n_tok, int t, int64_t b, const ActBlock *a) {
    if (is_tiled(n_tok)) {
        uint8_t *blk = acts + (size_t)(t / LANES) * tile_bytes(n_in) + (size_t)b * TILE_BLOCK_BYTES;
        int l = t % LANES;
        for (int j = 0; j < QK / 4; j++) memcpy(blk + 4 * (j * LANES + l), a->q + 4 * j, 4);
        memcpy(blk + TILE_D_OFF + 4 * l, &a->d, 4);
        memcpy(blk + TILE_S_OFF + 4 * l, &a->s, 4);
        memcpy(blk + TILE_SX_OFF + 4 * l, &a->sx, 4);
    } else {
        uint8_t *tok = acts + (size_t)t * tok_bytes(n_in);
        int64_t nb = n_in / QK;
        memcpy(tok + QK * b, a->q, QK);
        memcpy(tok + n_in + 4 * b, &a->d, 4);
        memcpy(tok + n_in + 4 * (nb + b), &a->s, 4);
        memcpy(tok + n_in + 4 * (2 * nb + b), &a->sx, 4);
    }
}

static void act_get(const uint8_t *acts, int64_t n_in, int n_tok, int t, int64_t b, ActBlock *a) {
    if (is_tiled(n_tok)) {
        const uint8_t *blk = acts + (size_t)(t / LANES) * tile_bytes(n_in) + (size_t)b * TILE_BLOCK_BYTES;
        int l = t % LANES;
        for (int j = 0; j < QK / 4; j++) memcpy(a->q + 4 * j, blk + 4 * (j * LANES + l), 4);
        memcpy(&a->d, blk + TILE_D_OFF + 4 * l, 4);
        memcpy(&a->s, blk + TILE_S_OFF + 4 * l, 4);
        memcpy(&a->sx, blk + TILE_SX_OFF + 4 * l, 4);
    } else {
        const uint8_t *tok = acts + (size_t)t * tok_bytes(n_in);
        int64_t nb = n_in / QK;
        memcpy(a->q, tok + QK * b, QK);
        memcpy(&a->d, tok + n_in + 4 * b, 4);
        memcpy(&a->s, tok + n_in + 4 * (nb + b), 4);
        memcpy(&a->sx, tok + n_in + 4 * (2 * nb + b), 4);
    }
}

/* The bytes that no block fills: zeros, so the layout is a function of x
 * alone (a tile's tokens past n_tok are computed, never stored). */
static void act_pad(uint8_t *acts, int64_t n_in, int n_tok) {
    if (!is_tiled(n_tok)) {
        size_t used = (size_t)n_in / QK * BLOCK_BYTES;
        for (int t = 0; t < n_tok; t++) memset(acts + (size_t)t * tok_bytes(n_in) + used, 0, tok_bytes(n_in) - used);
        return;
    }
    ActBlock zero;
    memset(&zero, 0, sizeof zero);
    int n_pad = (n_tok + LANES - 1) / LANES * LANES;
    for (int t = n_tok; t < n_pad; t++)
        for (int64_t b = 0; b < n_in / QK; b++) act_put(acts, n_in, n_tok, t, b, &zero);
}

/* ========================================================================
 * Reference (scalar path, and the oracle of the others)
 * ===================================================================== */

/* The f32 value of v rounded to f16, as llama.cpp stores d and s. */
static float f16_round(float v) { return mn_f16_to_f32(mn_f32_to_f16(v)); }

/* d, s and sx of a block whose codes are set: the same on every path. */
static void block_scales(ActBlock *a, float amax, int32_t sx) {
    float d = amax / 127.0f;
    a->d = f16_round(d);
    a->s = f16_round(d * (float)sx);
    a->sx = sx;
}

static void quantize_block_ref(const float *x, ActBlock *a) {
    float amax = act8_amax(x, QK), iscale = act8_iscale(amax);
    int32_t sx = 0;
    for (int j = 0; j < QK; j++) {
        a->q[j] = act8_code(iscale, x[j]);
        sx += a->q[j];
    }
    block_scales(a, amax, sx);
}

/* The layout of n_tok tokens of x, each block quantized by `block` (one
 * loop for every path: they differ only there). */
static void quantize_tokens(const float *x, int64_t n_in, int n_tok, uint8_t *dst,
                            void (*block)(const float *, ActBlock *)) {
    assert(n_in % QK == 0 && ((uintptr_t)dst & 63) == 0);
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < n_in / QK; b++) {
            ActBlock a;
            block(x + (int64_t)t * n_in + QK * b, &a);
            act_put(dst, n_in, n_tok, t, b, &a);
        }
    act_pad(dst, n_in, n_tok);
}

void q32_quantize_ref(const float *x, int64_t n_in, int n_tok, uint8_t *dst) {
    quantize_tokens(x, n_in, n_tok, dst, quantize_block_ref);
}

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return mn_f16_to_f32(h);
}

/* Code j of a block (element order): c, the value's integer factor.
 * Q8_0's too is read as u - o (u = byte ^ 0x80, o = 128), never as a
 * signed byte: GCC 12 at -O3 with VNNI vectorizes a sum of signed byte
 * times signed byte products into vpdpbusd, which takes one side as
 * unsigned (wrong code, which test_matmul's comparisons catch). */
static int code_ref(Q32Kind k, const uint8_t *blk, int j) {
    const uint8_t *qs = blk + k.qs_off;
    if (k.is_q8) return (qs[j] ^ 0x80) - k.bias;
    int u = j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
    if (k.qh_off >= 0) {
        uint32_t qh;
        memcpy(&qh, blk + k.qh_off, 4);
        u |= (int)((qh >> j) & 1) << 4;
    }
    return k.is_nl ? mn_iq4_values[u] : u - k.bias;
}

/* The f32 steps of one block, the same on every path. */
static float block_step(float acc, int32_t s, float dw, float mw, float dx, float sx_scaled, bool has_min) {
    acc = fmaf((float)s, dw * dx, acc);
    return has_min ? fmaf(mw, sx_scaled, acc) : acc;
}

void q32_rows_ref(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                  const uint8_t *acts, int n_tok, float *out, int64_t n_out) {
    assert(q32_has_type(type) && n_in % QK == 0);
    const Q32Kind k = kind_of(type);
    for (int t = 0; t < n_tok; t++)
        for (long r = r0; r < r1; r++) {
            const uint8_t *blk = w + (size_t)r * row_bytes;
            float acc = 0.0f;
            for (int64_t b = 0; b < n_in / QK; b++, blk += k.blk_bytes) {
                ActBlock a;
                act_get(acts, n_in, n_tok, t, b, &a);
                int32_t s = 0;
                for (int j = 0; j < QK; j++) s += code_ref(k, blk, j) * a.q[j];
                acc = block_step(acc, s, f16_at(blk), k.has_min ? f16_at(blk + 2) : 0.0f, a.d, a.s, k.has_min);
            }
            out[(int64_t)t * n_out + r] = acc;
        }
}

#if defined(Q32_AVX512) || defined(Q32_AVX2)

/* ========================================================================
 * Both SIMD paths: unpacked rows for the tile kernels
 * ===================================================================== */

enum {
    PR = 8,   /* rows per tile */
    SLB = 128 /* blocks unpacked at a time (a slice) */
};

/* PR rows x up to SLB blocks, unpacked: codes u (element order; AVX2
 * IQ4_NL and Q8_0: signed values), scales, mins. */
typedef struct Pack {
    _Alignas(64) uint8_t u[PR][SLB * QK];
    float d[PR][SLB];
    float m[PR][SLB];
} Pack;

static inline uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The 16 levels of IQ4_NL as bytes, + 128 for the unsigned codes of
 * AVX-512 (level ^ 0x80). */
static inline __m128i nl_levels(bool is_unsigned) {
    __m128i v = _mm_loadu_si128((const __m128i *)mn_iq4_values);
    return is_unsigned ? _mm_xor_si128(v, _mm_set1_epi8((char)0x80)) : v;
}

/* Byte j: 0xff where bit j of h is set (AVX2 has no byte masks). */
Q32_INLINE __m256i bits_to_bytes(uint32_t h) {
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick), bit);
    return _mm256_cmpeq_epi8(v, bit);
}

/* The 32 codes of a block, element order: u (AVX-512), or for AVX2 IQ4_NL
 * and Q8_0 the signed value (signed256). */
Q32_INLINE __m256i codes256(Q32Kind k, const uint8_t *blk) {
    if (k.is_q8) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(blk + k.qs_off));
#if defined(Q32_AVX512)
        q = _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80));
#endif
        return q;
    }
    __m128i q = _mm_loadu_si128((const __m128i *)(blk + k.qs_off));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    if (k.qh_off >= 0) {
#if defined(Q32_AVX512)
        v = _mm256_mask_add_epi8(v, (__mmask32)u32_at(blk + k.qh_off), v, _mm256_set1_epi8(16));
#else
        v = _mm256_or_si256(v, _mm256_and_si256(bits_to_bytes(u32_at(blk + k.qh_off)), _mm256_set1_epi8(16)));
#endif
    }
#if defined(Q32_AVX512)
    if (k.is_nl) v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(nl_levels(true)), v);
#else
    if (k.is_nl) v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(nl_levels(false)), v);
#endif
    return v;
}

#if defined(Q32_AVX512)
/* Decode streams the weights from DRAM once, faster than the hardware
 * prefetcher follows a tile's rows: a step at byte `at` of the n rows w[]
 * (len bytes each) asks for the step_bytes Q32_AHEAD on in every row, past
 * their end those of the next tile's rows (next, n_next of them,
 * row_bytes apart). bench_matmul, 1 token: Q4_0 55.5 -> 60.8 tok/s, Q8_0
 * 40.5 -> 43.5 (AVX-512), against the next tile at the same offset. The
 * AVX2 decode kernel (rows256) streams with prefetch_span instead. */
enum { Q32_AHEAD = 512 };

Q32_INLINE void prefetch_ahead(int n, const uint8_t *const w[], size_t at, size_t step_bytes, size_t len,
                               const uint8_t *next, int n_next, size_t row_bytes) {
    const size_t ahead = at + Q32_AHEAD;
    const uint8_t *base = ahead < len ? NULL : next;
    if (ahead >= len && (next == NULL || ahead - len >= len)) return;
    for (int r = 0; r < (base != NULL ? n_next : n); r++) {
        const char *p = base != NULL ? (const char *)base + r * row_bytes + (ahead - len) : (const char *)w[r] + ahead;
        _mm_prefetch(p, _MM_HINT_T0);
        if (step_bytes > 64) _mm_prefetch(p + step_bytes - 1, _MM_HINT_T0);
    }
}

/* The first Q32_AHEAD bytes of a chunk's first tile, which no tile before
 * asked for. */
Q32_INLINE void prefetch_first(int n, const uint8_t *const w[], size_t row_bytes) {
    for (size_t at = 0; at < Q32_MIN((size_t)Q32_AHEAD, row_bytes); at += 64)
        for (int i = 0; i < n; i++) _mm_prefetch((const char *)w[i] + at, _MM_HINT_T0);
}
#endif

/* Bytes [off, off + n) of the span [p, p + end), one prefetch every 64
 * bytes from off rounded down to a multiple of 64 (where two calls meet,
 * one line is asked for twice; from an unaligned p, the span's last line
 * may not be). The AVX2 decode kernel asks, as it goes through its tile,
 * for the same share of the next tile's rows, which follow in memory: one
 * stream in address order, 9 KB ahead (Q4_0 rows of 2,048), which the
 * hardware prefetchers also follow. Per row at a fixed distance
 * (prefetch_ahead) measured slower here: 8 short streams. */
Q32_INLINE void prefetch_span(const uint8_t *p, size_t off, size_t n, size_t end) {
    for (size_t o = off & ~(size_t)63; o < off + n && o < end; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

/* Blocks [s0, s0 + nbs) of the PR rows at rows[] into p, asking for the
 * same blocks of the n_next rows from next (row_bytes apart; the next
 * tile's): they arrive while this tile's tokens are multiplied. */
Q32_INLINE void pack_rows(Q32Kind k, const uint8_t *const rows[PR], int64_t s0, int nbs, Pack *p,
                          const uint8_t *next, int n_next, size_t row_bytes) {
    for (int i = 0; i < PR; i++) {
        const uint8_t *blk = rows[i] + (size_t)s0 * k.blk_bytes;
        const uint8_t *nblk = i < n_next ? next + i * row_bytes + (size_t)s0 * k.blk_bytes : NULL;
        for (int b = 0; b < nbs; b++, blk += k.blk_bytes) {
            if (nblk != NULL) {
                _mm_prefetch((const char *)nblk + b * k.blk_bytes, _MM_HINT_T0);
                _mm_prefetch((const char *)nblk + (b + 1) * k.blk_bytes - 1, _MM_HINT_T0);
            }
            _mm256_store_si256((__m256i *)(p->u[i] + QK * b), codes256(k, blk));
            p->d[i][b] = act8_f16(blk);
            if (k.has_min) p->m[i][b] = act8_f16(blk + 2);
        }
    }
}

#endif

/* ========================================================================
 * AVX-512 VNNI
 * ===================================================================== */
#if defined(Q32_AVX512)

static void quantize_block512(const float *x, ActBlock *a) {
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    __m512 m = _mm512_max_ps(_mm512_and_ps(v0, abs_mask), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_and_ps(v1, abs_mask), m);
    float amax = _mm512_reduce_max_ps(m); /* no NaN in m: any order gives the same */
    float iscale = act8_iscale(amax);
    __m512 vs = _mm512_set1_ps(iscale), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512i q0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, vs), lo), hi));
    __m512i q1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, vs), lo), hi));
    _mm_storeu_si128((__m128i *)a->q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(a->q + 16), _mm512_cvtepi32_epi8(q1));
    block_scales(a, amax, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
}

/* PR rows x LANES tokens, the blocks of one slice: acc[r] lane t. ab0 is
 * the tile's first block of the slice. */
Q32_INLINE void tile512(Q32Kind k, const Pack *p, int nbs, const uint8_t *ab0, __m512 acc[PR]) {
    const __m512i zero = _mm512_setzero_si512();
    for (int b = 0; b < nbs; b++) {
        const uint8_t *ab = ab0 + (size_t)b * TILE_BLOCK_BYTES;
        __m512i x[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) x[j] = _mm512_load_si512(ab + 64 * j);
        __m512 dx = _mm512_load_ps(ab + TILE_D_OFF);
        __m512 xs = _mm512_load_ps(ab + TILE_S_OFF);
        __m512i sx = _mm512_load_si512(ab + TILE_SX_OFF);
        __m512i init = k.bias ? _mm512_mullo_epi32(sx, _mm512_set1_epi32(-(int)k.bias)) : zero;
#pragma GCC unroll 8
        for (int r = 0; r < PR; r++) {
            const uint8_t *u = p->u[r] + QK * b;
            __m512i s = init;
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) s = _mm512_dpbusd_epi32(s, _mm512_set1_epi32((int)u32_at(u + 4 * j)), x[j]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(p->d[r][b]), dx), acc[r]);
            if (k.has_min) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(p->m[r][b]), xs, acc[r]);
        }
    }
}

/* Lane 4k + j of the result: the sum of lanes 4k..4k+3 of the j-th argument. */
Q32_INLINE __m512i sum4x4(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(u0, u1), _mm512_unpackhi_epi64(u0, u1));
}

/* The 64 codes u of the blocks at b0 and b1 (b1 may repeat b0). */
Q32_INLINE __m512i codes512(Q32Kind k, const uint8_t *b0, const uint8_t *b1) {
    if (k.is_q8) {
        __m512i z = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + k.qs_off)));
        z = _mm512_inserti64x4(z, _mm256_loadu_si256((const __m256i *)(b1 + k.qs_off)), 1);
        return _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));
    }
    __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(b0 + k.qs_off)));
    z = _mm512_mask_broadcast_i32x4(z, 0xff00, _mm_loadu_si128((const __m128i *)(b1 + k.qs_off)));
    z = _mm512_mask_srli_epi16(z, 0xff00ff00u, z, 4); /* 128-bit lanes 1 and 3: the high nibbles */
    z = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
    if (k.qh_off >= 0) {
        __mmask64 h = (__mmask64)u32_at(b0 + k.qh_off) | (__mmask64)u32_at(b1 + k.qh_off) << 32;
        z = _mm512_mask_add_epi8(z, h, z, _mm512_set1_epi8(16));
    }
    if (k.is_nl) z = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(nl_levels(true)), z);
    return z;
}

/* acc (lane = row) takes the f32 steps of one block: S (lane = row), the
 * rows' f16 d (and m) in the low (high) half of each lane of dv. */
Q32_INLINE __m512 row_step(Q32Kind k, __m512 acc, __m512i s, __m512i dv, float dx, float xs, int32_t sx) {
    if (k.bias) s = _mm512_sub_epi32(s, _mm512_set1_epi32((int)k.bias * sx));
    __m512 vdx = _mm512_set1_ps(dx);
    __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dv));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, vdx), acc);
    if (k.has_min) {
        __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dv, 16)));
        acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs), acc);
    }
    return acc;
}

/* 16 rows w[] x T tokens (rows layout, tok_bytes apart from tok0):
 * res[t][r]. The rows' codes and scales are read once for all T tokens;
 * each token's sums go through the same steps as if it were alone. Each
 * step asks for the weights ahead (prefetch_ahead; the next tile's rows
 * from pf, pf_rows of them). */
Q32_INLINE void rows512(Q32Kind k, int T, const uint8_t *const w[16], int64_t n_in, const uint8_t *tok0,
                        size_t tok_stride, const uint8_t *pf, int pf_rows, size_t row_bytes, float res[][16]) {
    const int64_t nb = n_in / QK;
    _Alignas(64) int32_t off[16];
    for (int r = 0; r < 16; r++) {
        ptrdiff_t d = w[r] - w[0];
        assert(d >= 0 && d <= INT32_MAX);
        off[r] = (int32_t)d;
    }
    const __m512i goff = _mm512_load_si512(off), zero = _mm512_setzero_si512();
    __m512 acc[TILE_MIN_TOK - 1];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const bool two = b + 1 < nb;
        const size_t at = (size_t)b * k.blk_bytes;
        __m512i xa[TILE_MIN_TOK - 1];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const int8_t *xq = (const int8_t *)(tok0 + (size_t)t * tok_stride) + QK * b;
            xa[t] = two ? _mm512_loadu_si512(xq) : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)xq));
        }
        prefetch_ahead(16, w, at, 2 * (size_t)k.blk_bytes, (size_t)nb * k.blk_bytes, pf, pf_rows, row_bytes);
        __m512i q[TILE_MIN_TOK - 1][4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i c[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const uint8_t *blk = w[4 * g + i] + at;
                c[i] = codes512(k, blk, two ? blk + k.blk_bytes : blk);
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512i p[4];
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) p[i] = _mm512_dpbusd_epi32(zero, c[i], xa[t]);
                q[t][g] = sum4x4(p[0], p[1], p[2], p[3]); /* 128-bit lane h: half h of the 2 blocks, rows 4g.. */
            }
        }
        const __m512i dv0 = _mm512_i32gather_epi32(goff, w[0] + at, 1);
        const __m512i dv1 = two ? _mm512_i32gather_epi32(goff, w[0] + at + k.blk_bytes, 1) : dv0;
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const uint8_t *tok = tok0 + (size_t)t * tok_stride;
            const float *xd = (const float *)(tok + n_in), *xs = (const float *)(tok + n_in + 4 * nb);
            const int32_t *xsx = (const int32_t *)(tok + n_in + 8 * nb);
            __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[t][0], q[t][1], 0x88),
                                           _mm512_shuffle_i32x4(q[t][0], q[t][1], 0xdd));
            __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[t][2], q[t][3], 0x88),
                                           _mm512_shuffle_i32x4(q[t][2], q[t][3], 0xdd));
            /* s01: rows 0-3 block b, rows 0-3 block b + 1, rows 4-7 block b, ... */
            __m512i v0 = _mm512_shuffle_i32x4(s01, s23, 0x88), v1 = _mm512_shuffle_i32x4(s01, s23, 0xdd);
            acc[t] = row_step(k, acc[t], v0, dv0, xd[b], xs[b], xsx[b]);
            if (two) acc[t] = row_step(k, acc[t], v1, dv1, xd[b + 1], xs[b + 1], xsx[b + 1]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) _mm512_storeu_ps(res[t], acc[t]);
}

#endif

/* ========================================================================
 * AVX2 (vpmaddubsw + vpmaddwd)
 * ===================================================================== */
#if defined(Q32_AVX2)

static void quantize_block256(const float *x, ActBlock *a) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(_mm256_and_ps(v[i], abs_mask), m);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float amax = _mm_cvtss_f32(m4); /* no NaN in m: any order gives the same */
    float iscale = act8_iscale(amax);
    __m256 vs = _mm256_set1_ps(iscale), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        __m256i q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], vs), lo), hi));
        s = _mm256_add_epi32(s, q);
        _Alignas(32) int32_t qi[8];
        _mm256_store_si256((__m256i *)qi, q);
        for (int j = 0; j < 8; j++) a->q[8 * i + j] = (int8_t)qi[j];
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    block_scales(a, amax, _mm_cvtsi128_si32(s4));
}

/* Whether the AVX2 codes are signed: IQ4_NL's levels and Q8_0's bytes,
 * whose + 128 would not fit vpmaddubsw's pair sums (255 * 127 * 2 >
 * INT16_MAX); their sign moves onto the activation instead, |c| <= 128. */
Q32_INLINE bool signed256(Q32Kind k) { return k.is_nl || k.is_q8; }

/* The AVX2 codes' bias: none for signed codes. */
Q32_INLINE int bias256(Q32Kind k) { return signed256(k) ? 0 : k.bias; }

/* Sum of u * x over each 4 bytes, for codes u (signed256: signed codes,
 * |u| * sign(x, u) pairs at most 2 * 128 * 127, exact in int16). */
Q32_INLINE __m256i dot4(Q32Kind k, __m256i u, __m256i x) {
    if (signed256(k)) {
        x = _mm256_sign_epi8(x, u);
        u = _mm256_abs_epi8(u);
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

Q32_INLINE void tile256(Q32Kind k, const Pack *p, int nbs, const uint8_t *ab0, __m256 acc[PR]) {
    for (int b = 0; b < nbs; b++) {
        const uint8_t *ab = ab0 + (size_t)b * TILE_BLOCK_BYTES;
        __m256 dx = _mm256_load_ps((const float *)(ab + TILE_D_OFF));
        __m256 xs = _mm256_load_ps((const float *)(ab + TILE_S_OFF));
        __m256i sx = _mm256_load_si256((const __m256i *)(ab + TILE_SX_OFF));
        __m256i init = _mm256_mullo_epi32(sx, _mm256_set1_epi32(-bias256(k)));
        for (int r = 0; r < PR; r++) {
            const uint8_t *u = p->u[r] + QK * b;
            __m256i s = init;
            for (int j = 0; j < 8; j++)
                s = _mm256_add_epi32(s, dot4(k, _mm256_set1_epi32((int)u32_at(u + 4 * j)),
                                             _mm256_load_si256((const __m256i *)(ab + 32 * j))));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(_mm256_set1_ps(p->d[r][b]), dx), acc[r]);
            if (k.has_min) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(p->m[r][b]), xs, acc[r]);
        }
    }
}

/* Lane r of the result: the sum of the 8 lanes of v[r]. */
Q32_INLINE __m256i sum8x8(const __m256i v[8]) {
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* The codes of two blocks a and b of a row, split for one dot product
 * over both: lo = elements 0..15 of a, then of b; hi = elements 16..31 of
 * a, then of b (as codes256 writes them). */
Q32_INLINE void codes_pair256(Q32Kind k, const uint8_t *a, const uint8_t *b, __m256i *lo, __m256i *hi) {
    if (k.is_q8) {
        __m256i qa = _mm256_loadu_si256((const __m256i *)(a + k.qs_off));
        __m256i qb = _mm256_loadu_si256((const __m256i *)(b + k.qs_off));
        *lo = _mm256_permute2x128_si256(qa, qb, 0x20);
        *hi = _mm256_permute2x128_si256(qa, qb, 0x31);
        return;
    }
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i q = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(b + k.qs_off)),
                                 _mm_loadu_si128((const __m128i *)(a + k.qs_off)));
    *lo = _mm256_and_si256(q, nib);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
    if (k.qh_off >= 0) {
        const uint32_t ha = u32_at(a + k.qh_off), hb = u32_at(b + k.qh_off);
        const __m256i b4 = _mm256_set1_epi8(16);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(bits_to_bytes((ha & 0xffffu) | hb << 16), b4));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(bits_to_bytes(ha >> 16 | (hb & 0xffff0000u)), b4));
    }
    if (k.is_nl) {
        const __m256i levels = _mm256_broadcastsi128_si256(nl_levels(false));
        *lo = _mm256_shuffle_epi8(levels, *lo);
        *hi = _mm256_shuffle_epi8(levels, *hi);
    }
}

/* dot4 of lo and hi, added: lanes 0..3 sum block a, lanes 4..7 block b.
 * Nibble codes (u <= 31) add their int16 pair sums first: 4 * 31 * 127
 * fits; signed codes' would not. */
Q32_INLINE __m256i dot_pair(Q32Kind k, __m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    if (signed256(k)) return _mm256_add_epi32(dot4(k, lo, xlo), dot4(k, hi, xhi));
    __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

Q32_INLINE uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* The f16 scales d (and mins m, has_min) of the block at byte `at` of the
 * 8 rows w[], lane = row. */
Q32_INLINE void scales256(Q32Kind k, const uint8_t *const w[8], size_t at, uint16_t d[8], uint16_t m[8]) {
    for (int r = 0; r < 8; r++) {
        d[r] = u16_at(w[r] + at);
        if (k.has_min) m[r] = u16_at(w[r] + at + 2);
    }
}

/* One block's f32 steps for the 8 rows (lane = row), as block_step: the
 * rows' sums of u * q in p8, less o * sx, the scales and mins of
 * scales256, the token's step dx and scaled sum xs. */
Q32_INLINE __m256 steps256(Q32Kind k, __m256 acc, __m256i p8, int32_t sx, const uint16_t d[8], const uint16_t m[8],
                           float dx, float xs) {
    const __m256i s = _mm256_sub_epi32(p8, _mm256_set1_epi32(bias256(k) * sx));
    const __m256 vd = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(vd, _mm256_set1_ps(dx)), acc);
    if (k.has_min)
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)m)), _mm256_set1_ps(xs), acc);
    return acc;
}

/* 8 rows w[] x one token (rows layout at tok): res[r]. Two blocks a step:
 * per row one dot product over both (codes_pair256), and one sum tree
 * (lane = row) serves both blocks; an odd last block goes alone. With
 * fetch, each step asks for its share of the next tile's rows (pf,
 * pf_rows of them, row_bytes apart; prefetch_span). bench_matmul-style
 * loop, Q4_0 2048 x 2048, 1 token, 1 thread: 2.23 -> 1.45 ns a row block
 * in L2; from DRAM, with prefetch_span, 2.9 -> 2.0. */
Q32_INLINE void rows256(Q32Kind k, const uint8_t *const w[8], int64_t n_in, const uint8_t *tok, bool fetch,
                        const uint8_t *pf, int pf_rows, size_t row_bytes, float res[8]) {
    const int64_t nb = n_in / QK;
    const int8_t *xq = (const int8_t *)tok;
    const float *xd = (const float *)(tok + n_in), *xs = (const float *)(tok + n_in + 4 * nb);
    const int32_t *xsx = (const int32_t *)(tok + n_in + 8 * nb);
    const size_t bb = k.blk_bytes, pf_end = (size_t)pf_rows * row_bytes;
    __m256 acc = _mm256_setzero_ps();
    _Alignas(16) uint16_t d[2][8], m[2][8];
    __m256i p[8];
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const size_t at = (size_t)b * bb;
        const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + QK * b));
        const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + QK * (b + 1)));
        const __m256i xlo = _mm256_permute2x128_si256(xa, xb, 0x20), xhi = _mm256_permute2x128_si256(xa, xb, 0x31);
        if (fetch) prefetch_span(pf, 8 * at, 16 * bb, pf_end);
        for (int r = 0; r < 8; r++) {
            __m256i lo, hi;
            codes_pair256(k, w[r] + at, w[r] + at + bb, &lo, &hi);
            p[r] = dot_pair(k, lo, xlo, hi, xhi);
        }
        scales256(k, w, at, d[0], m[0]);
        scales256(k, w, at + bb, d[1], m[1]);
        __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
        acc = steps256(k, acc, _mm256_permute2x128_si256(h0, h1, 0x20), xsx[b], d[0], m[0], xd[b], xs[b]);
        acc = steps256(k, acc, _mm256_permute2x128_si256(h0, h1, 0x31), xsx[b + 1], d[1], m[1], xd[b + 1], xs[b + 1]);
    }
    if (b < nb) { /* an odd last block */
        const size_t at = (size_t)b * bb;
        const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + QK * b));
        if (fetch) prefetch_span(pf, 8 * at, 8 * bb, pf_end);
        for (int r = 0; r < 8; r++) p[r] = dot4(k, codes256(k, w[r] + at), xa);
        scales256(k, w, at, d[0], m[0]);
        acc = steps256(k, acc, sum8x8(p), xsx[b], d[0], m[0], xd[b], xs[b]);
    }
    _mm256_storeu_ps(res, acc);
}

#endif

/* ========================================================================
 * Rows and tiles (either SIMD path)
 * ===================================================================== */
#if defined(Q32_AVX512) || defined(Q32_AVX2)

#if defined(Q32_AVX512)
typedef __m512 AccVec;
enum { DEC_ROWS = 16 };
#define ACC_ZERO() _mm512_setzero_ps()
#define ACC_LOAD(p) _mm512_loadu_ps(p)
#define ACC_STORE(p, v) _mm512_storeu_ps(p, v)
#define TILE_KERNEL tile512
#else
typedef __m256 AccVec;
enum { DEC_ROWS = 8 };
#define ACC_ZERO() _mm256_setzero_ps()
#define ACC_LOAD(p) _mm256_loadu_ps(p)
#define ACC_STORE(p, v) _mm256_storeu_ps(p, v)
#define TILE_KERNEL tile256
#endif

/* Rows [r0, r1) x every token of a tiled group. */
Q32_INLINE void rows_tiled(MnType type, Pack *p, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                           const uint8_t *acts, int n_tok, float *out, int64_t n_out) {
    const Q32Kind k = kind_of(type);
    const int64_t nb = n_in / QK;
    const int n_tiles = (n_tok + LANES - 1) / LANES;
    for (long r = r0; r < r1; r += PR) {
        const uint8_t *rows[PR];
        for (int i = 0; i < PR; i++) rows[i] = w + (size_t)Q32_MIN(r + i, r1 - 1) * row_bytes;
        const int n_rows = (int)Q32_MIN(PR, r1 - r);
        const int n_next = (int)Q32_MIN(PR, r1 - Q32_MIN(r1, r + PR));
        const uint8_t *next = n_next > 0 ? w + (size_t)(r + PR) * row_bytes : NULL;
        for (int64_t s0 = 0; s0 < nb; s0 += SLB) {
            const int nbs = (int)Q32_MIN(SLB, nb - s0);
            pack_rows(k, rows, s0, nbs, p, next, n_next, row_bytes);
            for (int i = 0; i < n_tiles; i++) {
                const int t0 = i * LANES, nt = Q32_MIN(LANES, n_tok - t0);
                _Alignas(64) float v[LANES];
                AccVec acc[PR];
                for (int j = 0; j < PR; j++) {
                    if (s0 > 0 && j < n_rows) {
                        act8_outs_load(out, n_out, r + j, t0, nt, LANES, v);
                        acc[j] = ACC_LOAD(v);
                    } else {
                        acc[j] = ACC_ZERO();
                    }
                }
                TILE_KERNEL(k, p, nbs, acts + (size_t)i * tile_bytes(n_in) + (size_t)s0 * TILE_BLOCK_BYTES, acc);
                for (int j = 0; j < n_rows; j++) {
                    ACC_STORE(v, acc[j]);
                    act8_outs_store(out, n_out, r + j, t0, nt, v);
                }
            }
        }
    }
}

/* Rows [r0, r1) x a few tokens in the rows layout: DEC_ROWS rows a step,
 * every token against them while they are in cache. */
Q32_INLINE void rows_decode(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                            const uint8_t *acts, int n_tok, float *out, int64_t n_out) {
    const Q32Kind k = kind_of(type);
    assert(n_tok < TILE_MIN_TOK);
    for (long r = r0; r < r1; r += DEC_ROWS) {
        const uint8_t *rows[DEC_ROWS];
        for (int i = 0; i < DEC_ROWS; i++) rows[i] = w + (size_t)Q32_MIN(r + i, r1 - 1) * row_bytes;
        float res[TILE_MIN_TOK - 1][DEC_ROWS];
        const int pf_rows = (int)Q32_MIN(DEC_ROWS, r1 - Q32_MIN(r1, r + DEC_ROWS));
        const uint8_t *pf = pf_rows > 0 ? rows[0] + DEC_ROWS * row_bytes : NULL;
#if defined(Q32_AVX512)
        if (r == r0) prefetch_first(DEC_ROWS, rows, row_bytes);
#else
        if (r == r0) prefetch_span(rows[0], 0, (size_t)Q32_MIN(DEC_ROWS, r1 - r0) * row_bytes, SIZE_MAX);
#endif
#if defined(Q32_AVX512)
        const size_t tb = tok_bytes(n_in);
#define Q32_ROWS512(T) rows512(k, T, rows, n_in, acts, tb, pf, pf_rows, row_bytes, res)
        switch (n_tok) { /* a constant T, so rows512's loops unroll */
        case 1: Q32_ROWS512(1); break;
        case 2: Q32_ROWS512(2); break;
        case 3: Q32_ROWS512(3); break;
        case 4: Q32_ROWS512(4); break;
        case 5: Q32_ROWS512(5); break;
        case 6: Q32_ROWS512(6); break;
        case 7: Q32_ROWS512(7); break;
        default: Q32_ROWS512(8); break;
        }
#undef Q32_ROWS512
        _Static_assert(TILE_MIN_TOK - 1 == 8, "rows_decode covers T = 1..8");
#else
        for (int t = 0; t < n_tok; t++) /* the first token's pass reads the rows for the others */
            rows256(k, rows, n_in, acts + (size_t)t * tok_bytes(n_in), t == 0, pf, pf_rows, row_bytes, res[t]);
#endif
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < DEC_ROWS && r + i < r1; i++) out[(int64_t)t * n_out + r + i] = res[t][i];
    }
}

/* Each type its own copy of the kernels, so kind_of folds. */
#define Q32_DISPATCH(fn, ...) \
    switch (type) { \
    case MN_TYPE_Q4_0: fn(MN_TYPE_Q4_0, __VA_ARGS__); break; \
    case MN_TYPE_Q4_1: fn(MN_TYPE_Q4_1, __VA_ARGS__); break; \
    case MN_TYPE_Q5_0: fn(MN_TYPE_Q5_0, __VA_ARGS__); break; \
    case MN_TYPE_Q5_1: fn(MN_TYPE_Q5_1, __VA_ARGS__); break; \
    case MN_TYPE_Q8_0: fn(MN_TYPE_Q8_0, __VA_ARGS__); break; \
    default: fn(MN_TYPE_IQ4_NL, __VA_ARGS__); break; \
    }

static void rows_simd(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                      const uint8_t *acts, int n_tok, float *out, int64_t n_out) {
    if (is_tiled(n_tok)) {
        Pack p; /* here, once: the dispatch inlines a rows_tiled per type */
        Q32_DISPATCH(rows_tiled, &p, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out)
    } else {
        Q32_DISPATCH(rows_decode, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out)
    }
}

#endif

/* ========================================================================
 * API
 * ===================================================================== */

/* One block, by the compiled path (all give the same bytes). */
static void quantize_block(const float *x, ActBlock *a) {
#if defined(Q32_AVX512)
    quantize_block512(x, a);
#elif defined(Q32_AVX2)
    quantize_block256(x, a);
#else
    quantize_block_ref(x, a);
#endif
}

void q32_quantize(const float *x, int64_t n_in, int n_tok, uint8_t *dst) {
    quantize_tokens(x, n_in, n_tok, dst, quantize_block);
}

/* ---- packed rows --------------------------------------------------------- */

/* The packed row is the rows layout's token without its padding: the same
 * offsets (act_put/act_get with one token), so one block's fields are
 * where a one-token layout has them. */

size_t q32_packed_bytes(int64_t n_in) { return (size_t)n_in / QK * BLOCK_BYTES; }

void q32_pack(const float *x, int64_t n_in, uint8_t *dst) {
    assert(n_in % QK == 0);
    for (int64_t b = 0; b < n_in / QK; b++) {
        ActBlock a;
        quantize_block(x + QK * b, &a);
        act_put(dst, n_in, 1, 0, b, &a);
    }
}

void q32_unpack(const uint8_t *src, int64_t n_in, int n_tok, uint8_t *dst) {
    assert(n_in % QK == 0 && ((uintptr_t)dst & 63) == 0);
    const size_t row = q32_packed_bytes(n_in);
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < n_in / QK; b++) {
            ActBlock a;
            act_get(src + (size_t)t * row, n_in, 1, 0, b, &a);
            act_put(dst, n_in, n_tok, t, b, &a);
        }
    act_pad(dst, n_in, n_tok);
}

void q32_rows(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in, const uint8_t *acts,
              int n_tok, float *out, int64_t n_out) {
    assert(q32_has_type(type) && n_in % QK == 0);
#if defined(Q32_AVX512) || defined(Q32_AVX2)
    rows_simd(type, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out);
#else
    q32_rows_ref(type, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out);
#endif
}
