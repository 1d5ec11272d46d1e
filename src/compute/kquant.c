/* kquant.c — K-quant and IQ4_XS products with int8 activations (see kquant.h).
 *
 * How it fits: mm_matmul (matmul.c) sends Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and
 * IQ4_XS here. Each worker quantizes a group of tokens into a buffer on its
 * own stack (kq_quantize), then multiplies its rows against them (kq_rows).
 * Stateless; any thread may call any function.
 *
 * Every weight super-block reads, for this module, as 256 integer codes
 * u (0..127), 16 sub-block scales sc[c] and mins mn[c] (one per 16
 * elements; types with 32-element sub-blocks repeat them), and a code
 * offset o: the element is d * sc[c] * (u - o) - dmin * mn[c] (IQ4_XS: u is
 * |level| and the level's sign goes onto the activation). Then
 *     S = sum over c of sc[c] * (sum of u * a - o * (sum of a)),
 *     M = sum over c of mn[c] * (sum of a)
 * over the 16 elements of each c, a the int8 activation codes: both exact
 * int32 (bounds below), whatever the order of the additions.
 *
 * Quantized activations, in the rows layout (fewer than KT_MIN_TOK tokens,
 * and always on the scalar path) one KqBlock per 256 elements of a token:
 *   qs     the 256 codes, in the order that the type's packed weight codes
 *          unpack to (kind_pos): 16-code chunk c sits at position pos[c].
 *          Q4_K/Q5_K: a 64-byte load of weight nibbles holds chunks 0 1 4 5
 *          (low) or 2 3 6 7 (high); IQ4_XS: 0 2 4 6 (low) or 1 3 5 7;
 *          Q2_K, Q3_K, Q6_K natural;
 *   sum16  the 16 chunks' sums, natural order (the mins of Q2_K);
 *   sum16x2 each of them twice (words 2c and 2c + 1), so one vpmaddwd
 *          against the doubled -o/2 * sc adds -o * sc * sum (Q3_K, Q6_K);
 *   sum32  the 8 sums of 32 (the mins of Q4_K and Q5_K);
 *   d      the scale.
 * In the tiles layout (SIMD paths, KT_MIN_TOK tokens or more), KT_LANES
 * tokens a tile (16 with AVX-512, 8 with AVX2), the last filled up with
 * tokens of zeros; tile i at i * tile_bytes, and in it super-block b at
 * b * KT_BLOCK: code word w (codes 4w..4w+3 of qs) of token 0, 1, ..,
 * KT_LANES - 1, then word w + 1, ..; the KT_LANES steps d; with AVX-512,
 * per unit (the words that share a scale: 32 codes for Q4_K and Q5_K,
 * else 16) -o * the unit's code sum of every token; per pair of min units
 * (Q2_K's chunks, Q4_K's and Q5_K's sub-blocks; with AVX2 also the
 * offset's chunks of Q3_K and Q6_K) the two code sums as int16 words;
 * zeros where a type has no use for a field.
 *
 * Invariant: everything but the last f32 steps is exact integer
 * arithmetic, and those steps are the same few operations in the same
 * order on every path (kquant.h), so a product's bits depend only on the
 * weight row and the token. Range: a code (u <= 127, the IQ4_XS levels'
 * magnitudes included) times an int8 code summed over 2 (one vpmaddubsw
 * word) is at most 32258, so 16-bit words never saturate; the int32 sums
 * stay below 2^31 (the largest, IQ4_XS: 8 * 32 * 32 * 127 * 127 < 2^28).
 *
 * AVX-512 (VNNI), tiles layout (prefill): lanes are tokens. A tile of
 * KT_PR rows is unpacked (kind_decode512), KT_SLB super-blocks at a time,
 * into a KPack on the stack: codes as bytes in the activations' order
 * (IQ4_XS: level + 128, o = 128), each unit's scale, the min pairs. Then
 * every token tile of the group goes by: per unit its code words stay in
 * registers while each row runs a chain of vpdpbusd (the row's code word
 * broadcast) from -o * sum and adds it times the unit's scale (vpmulld)
 * into S; M is one vpdpwssd per min pair; the f32 steps run on the tile's
 * 16 tokens at once. No horizontal sums, and the unpacking is shared by
 * the group's tokens. Rows longer than a slice park each output's
 * accumulator in `out` between slices (a stored f32 reads back the same).
 * Rows layout (decode, few tokens): tiles of 16 outputs, 4 rows x 4 tokens
 * or 16 rows x 1 token. Per super-block and row the codes unpack into 4
 * vectors of 64 and the scales widen to words (kind_decode512); per output
 * 4 vpmaddubsw and 4 vpdpwssd (and one for the offset); the 16 outputs'
 * int32 vectors are summed into one vector (lane = output) by a transpose
 * tree, and the f32 steps run on 16 outputs at once.
 *
 * AVX2, tiles layout (prefill): as AVX-512's, with KT_LANES = 8 and no
 * VNNI. A row tile unpacks (kind_decode256, kind_scales256) into a KPack:
 * codes (IQ4_XS: the signed levels, whose signs go onto the activations),
 * each unit's scale as words. Per row and unit each code word, broadcast,
 * meets the tokens' word in a vpmaddubsw; G of those add up as int16
 * words (i16_words: G pair sums of the type's largest code stay below
 * 2^15), and one vpmaddwd against the unit's scale adds them into S. The
 * offset is -o times a vpmaddwd of chunk scale pairs against the tokens'
 * chunk sum pairs; the mins likewise. Rows layout (decode, few tokens):
 * the codes as 8 vectors of 32 (kind_decode256), the scales as words in
 * registers (kind_scales256, scale_pair), vpmaddubsw + vpmaddwd, tiles of
 * 1 row x up to 4 tokens. Scalar: kq_rows_ref.
 */
#include "compute/kquant.h"

#include "compute/act8.h"

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__F16C__)
#define KQ_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KQ_AVX2 1
#include <immintrin.h>
#endif

#define KQ_INLINE static inline __attribute__((always_inline))
#define KQ_MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- types ------------------------------------------------------------- */

typedef struct KqBlock {
    int8_t qs[MN_QK_K];  /* codes, chunk c at 16 * pos[c] */
    int16_t sum16x2[32]; /* chunk c's sum at words 2c and 2c + 1 */
    int16_t sum16[16];   /* chunk sums */
    int16_t sum32[8];    /* sums of 32 codes */
    float d;
    uint8_t pad[KQ_BLOCK_BYTES - MN_QK_K - 64 - 32 - 16 - 4];
} KqBlock;
_Static_assert(sizeof(KqBlock) == KQ_BLOCK_BYTES, "KqBlock is KQ_BLOCK_BYTES");

/* Activation orders: position of natural chunk c. */
enum { ORDER_NATURAL, ORDER_Q4K, ORDER_IQ4 };
static const uint8_t ORDER_POS[3][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15},
    {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15},
};
#if defined(KQ_AVX512) || defined(KQ_AVX2)
/* The inverse: the natural chunk at position p. */
static const uint8_t ORDER_CHUNK[3][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15},
    {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15},
};
#endif

/* Layouts of a group's quantized activations (the top comment): rows of
 * KqBlocks for fewer than KT_MIN_TOK tokens, and always on the scalar
 * path; tiles of KT_LANES tokens from KT_MIN_TOK on (a tile computes all
 * its lanes: with fewer tokens the rows kernels cost less, by
 * bench_matmul's batch mode on AVX-512; AVX2 starts at one full tile, a
 * choice its batch mode has not tested below 8). A tile's super-block: */
#if defined(KQ_AVX512)
enum { KT_LANES = 16, KT_MIN_TOK = 10, KT_UNIT_INITS = 16, KT_OFFSET_PAIRS = 0 };
#elif defined(KQ_AVX2)
enum { KT_LANES = 8, KT_MIN_TOK = 8, KT_UNIT_INITS = 0, KT_OFFSET_PAIRS = 1 };
#else
enum { KT_LANES = 1, KT_MIN_TOK = INT_MAX, KT_UNIT_INITS = 0, KT_OFFSET_PAIRS = 0 };
#endif
enum {
    KT_D = 64 * 4 * KT_LANES,                         /* after the 64 code words of every token: the steps d */
    KT_INIT = KT_D + 4 * KT_LANES,                    /* AVX-512, 16 units x KT_LANES: -o * the unit's code sum */
    KT_MINP = KT_INIT + KT_UNIT_INITS * 4 * KT_LANES, /* 8 pairs x KT_LANES: two code sums as int16 words */
    KT_BLOCK = KT_MINP + 8 * 4 * KT_LANES,
};

static bool is_tiled(int n_tok) { return n_tok >= KT_MIN_TOK; }
int kq_token_lanes(int n_tok) { return is_tiled(n_tok) ? KT_LANES : 1; }
static size_t tok_bytes(int64_t n_in) { return (size_t)(n_in / MN_QK_K) * KQ_BLOCK_BYTES; }
static size_t tile_bytes(int64_t n_in) { return (size_t)(n_in / MN_QK_K) * KT_BLOCK; }

/* What differs between the types, besides unpacking (kind_*). */
typedef struct KqKind {
    uint8_t order;    /* ORDER_* of the activations */
    uint8_t sub_log2; /* log2 of 16-chunks per sub-block (0 or 1) */
    uint8_t offset;   /* o: the code is u - o */
    bool has_min;     /* the f32 steps subtract M * dmin * d_x */
    uint8_t d_off;    /* the 32-bit word at d_off holds d (low or high half) and dmin (high) */
    bool d_high;
    uint16_t blk_bytes;
} KqKind;

KQ_INLINE KqKind kind_of(MnType type) {
    switch (type) {
    case MN_TYPE_Q2_K: return (KqKind){ORDER_NATURAL, 0, 0, true, offsetof(BlockQ2_K, d), false, sizeof(BlockQ2_K)};
    case MN_TYPE_Q3_K: return (KqKind){ORDER_NATURAL, 0, 4, false, sizeof(BlockQ3_K) - 4, true, sizeof(BlockQ3_K)};
    case MN_TYPE_Q4_K: return (KqKind){ORDER_Q4K, 1, 0, true, 0, false, sizeof(BlockQ4_K)};
    case MN_TYPE_Q5_K: return (KqKind){ORDER_Q4K, 1, 0, true, 0, false, sizeof(BlockQ5_K)};
    case MN_TYPE_Q6_K: return (KqKind){ORDER_NATURAL, 0, 32, false, sizeof(BlockQ6_K) - 4, true, sizeof(BlockQ6_K)};
    default: return (KqKind){ORDER_IQ4, 1, 0, false, 0, false, sizeof(BlockIQ4_XS)};
    }
}

bool kq_has_type(MnType type) {
    switch (type) {
    case MN_TYPE_Q2_K: case MN_TYPE_Q3_K: case MN_TYPE_Q4_K: case MN_TYPE_Q5_K: case MN_TYPE_Q6_K:
    case MN_TYPE_IQ4_XS: return true;
    default: return false;
    }
}

size_t kq_acts_bytes(int64_t n_in, int n_tok) {
    if (is_tiled(n_tok)) return (size_t)((n_tok + KT_LANES - 1) / KT_LANES) * tile_bytes(n_in);
    return (size_t)n_tok * tok_bytes(n_in);
}

int kq_group_tokens(int64_t n_in, int n_tok, size_t bytes) {
    return act8_group_tokens(n_tok, bytes, tok_bytes(n_in), tile_bytes(n_in), KT_LANES, KT_MIN_TOK);
}

/* ---- the tiles layout (SIMD paths): a unit is the words of codes that
 * share a scale and sit next to each other, 32 codes for Q4_K and Q5_K
 * (their order keeps a sub-block's two chunks together), else 16. ---- */

#if defined(KQ_AVX512) || defined(KQ_AVX2)
KQ_INLINE int unit_words(KqKind k) { return k.order == ORDER_Q4K ? 8 : 4; }
/* The AVX-512 tiles' o: IQ4_XS's codes there are level + 128. */
KQ_INLINE int tile_bias(MnType type, KqKind k) { return type == MN_TYPE_IQ4_XS ? 128 : k.offset; }
/* Pairs of code sums: of the min units (Q2_K's chunks, Q4_K's and Q5_K's
 * sub-blocks), and on AVX2 of the offset's units (Q3_K's, Q6_K's chunks). */
KQ_INLINE int sum_pairs(KqKind k) {
    if (k.has_min) return k.sub_log2 ? 4 : 8;
    return KT_OFFSET_PAIRS && k.offset ? 8 : 0;
}

/* A tile of KT_PR rows x up to KT_SLB super-blocks (a slice), unpacked
 * once for every token tile of a group: the 256 codes u in the
 * activations' order (IQ4_XS: AVX-512 level + 128, AVX2 the signed
 * level), each unit's scale (AVX-512 an int32 for vpmulld, AVX2 twice as
 * words for vpmaddwd), on AVX2 the pairs of chunk scales for the offset
 * (Q3_K, Q6_K) as words, the pairs of mins as words (Q2_K: chunks 2q,
 * 2q + 1; Q4_K, Q5_K: sub-blocks), d and dmin. */
enum { KT_PR = 8, KT_SLB = KT_LANES == 16 ? 16 : 8 };
typedef struct KPack {
    _Alignas(64) uint8_t u[KT_PR][KT_SLB][MN_QK_K];
    uint32_t sc[KT_PR][KT_SLB][16];
    uint32_t scp[KT_PR][KT_SLB][8];
    uint32_t mnp[KT_PR][KT_SLB][8];
    float d[KT_PR][KT_SLB];
    float dmin[KT_PR][KT_SLB];
} KPack;

/* Token lane l of a tile's super-block blk from its KqBlock y (blk zeroed
 * before). */
static void tile_put(MnType type, const KqBlock *y, uint8_t *blk, int l) {
    const KqKind k = kind_of(type);
    const int wpu = unit_words(k), bias = tile_bias(type, k);
    for (int w = 0; w < 64; w++) memcpy(blk + 4 * (w * KT_LANES + l), y->qs + 4 * w, 4);
    memcpy(blk + KT_D + 4 * l, &y->d, 4);
    for (int u = 0; u < (KT_UNIT_INITS ? 64 / wpu : 0) && bias != 0; u++) {
        int32_t a = 0;
        for (int p = u * wpu / 4; p < (u + 1) * wpu / 4; p++) a += y->sum16[ORDER_CHUNK[k.order][p]];
        int32_t init = -bias * a;
        memcpy(blk + KT_INIT + 4 * (u * KT_LANES + l), &init, 4);
    }
    for (int q = 0; q < sum_pairs(k); q++) {
        const int16_t *sums = k.sub_log2 ? y->sum32 : y->sum16;
        uint32_t v = (uint32_t)(uint16_t)sums[2 * q] | (uint32_t)(uint16_t)sums[2 * q + 1] << 16;
        memcpy(blk + KT_MINP + 4 * (q * KT_LANES + l), &v, 4);
    }
}
#endif

/* The code sums of y from its codes (chunk c at 16 * pos[c]): exact
 * integers, so the same however and wherever the codes were made. */
static void block_sums(const uint8_t *pos, KqBlock *y) {
    for (int c = 0; c < 16; c++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += y->qs[16 * pos[c] + j];
        y->sum16[c] = y->sum16x2[2 * c] = y->sum16x2[2 * c + 1] = (int16_t)sum;
        y->sum32[c / 2] = (int16_t)((c % 2 ? y->sum32[c / 2] : 0) + sum);
    }
}

/* Where token t's super-block b sits in a tiles layout. */
static size_t tile_block_at(int64_t n_in, int t, int64_t b) {
    return (size_t)(t / KT_LANES) * tile_bytes(n_in) + (size_t)b * KT_BLOCK;
}

/* Token t's super-block b into either layout (a tiles layout zeroed
 * before: tokens past n_tok, fields a type has no use for). */
static void act_put(MnType type, uint8_t *acts, int64_t n_in, int n_tok, int t, int64_t b, const KqBlock *y) {
    if (!is_tiled(n_tok)) {
        memcpy(acts + (size_t)t * tok_bytes(n_in) + (size_t)b * KQ_BLOCK_BYTES, y, sizeof *y);
        return;
    }
#if defined(KQ_AVX512) || defined(KQ_AVX2)
    tile_put(type, y, acts + tile_block_at(n_in, t, b), t % KT_LANES);
#endif
}

/* Token t's super-block b, from either layout (the sums of a tile's codes
 * computed again: they are functions of the codes). */
static void act_get(MnType type, const uint8_t *acts, int64_t n_in, int n_tok, int t, int64_t b, KqBlock *y) {
    if (!is_tiled(n_tok)) {
        memcpy(y, acts + (size_t)t * tok_bytes(n_in) + (size_t)b * KQ_BLOCK_BYTES, sizeof *y);
        return;
    }
    const uint8_t *blk = acts + tile_block_at(n_in, t, b);
    int l = t % KT_LANES;
    memset(y, 0, sizeof *y);
    for (int w = 0; w < 64; w++) memcpy(y->qs + 4 * w, blk + 4 * (w * KT_LANES + l), 4);
    memcpy(&y->d, blk + KT_D + 4 * l, 4);
    block_sums(ORDER_POS[kind_of(type).order], y);
}

/* ========================================================================
 * Reference (scalar path, and the oracle of the others)
 * ===================================================================== */

static void quantize_ref(MnType type, const float *x, int64_t n_in, KqBlock *y) {
    const uint8_t *pos = ORDER_POS[kind_of(type).order];
    for (int64_t b = 0; b < n_in / MN_QK_K; b++, x += MN_QK_K, y++) {
        float iscale = act8_iscale(act8_amax(x, MN_QK_K));
        memset(y, 0, sizeof *y);
        for (int j = 0; j < MN_QK_K; j++) y->qs[16 * pos[j / 16] + j % 16] = act8_code(iscale, x[j]);
        block_sums(pos, y);
        y->d = act8_step(iscale);
    }
}

static float f16_value(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return mn_f16_to_f32(h);
}

/* The scales sc[c] and mins mn[c] of a super-block, per 16-chunk c
 * (types with sub-blocks of 32 repeat them; mn is 0 without mins). */
static void block_scales(MnType type, const uint8_t *blk, int16_t sc[16], int16_t mn[16]) {
    for (int c = 0; c < 16; c++) {
        int s = c / 2, scale = 0, min = 0;
        switch (type) {
        case MN_TYPE_Q2_K:
            scale = ((const BlockQ2_K *)blk)->scales[c] & 0x0f;
            min = ((const BlockQ2_K *)blk)->scales[c] >> 4;
            break;
        case MN_TYPE_Q3_K: {
            const uint8_t *s3 = ((const BlockQ3_K *)blk)->scales;
            scale = ((c < 8 ? s3[c] & 0x0f : s3[c - 8] >> 4) | ((s3[8 + c % 4] >> (2 * (c / 4))) & 3) << 4) - 32;
            break;
        }
        case MN_TYPE_Q4_K: case MN_TYPE_Q5_K: {
            const uint8_t *s4 = ((const BlockQ4_K *)blk)->scales; /* Q5_K's header is Q4_K's */
            scale = s < 4 ? s4[s] & 63 : (s4[s + 4] & 0x0f) | (s4[s - 4] >> 6) << 4;
            min = s < 4 ? s4[s + 4] & 63 : (s4[s + 4] >> 4) | (s4[s] >> 6) << 4;
            break;
        }
        case MN_TYPE_Q6_K: scale = ((const BlockQ6_K *)blk)->scales[c]; break;
        default: {
            const BlockIQ4_XS *x = (const BlockIQ4_XS *)blk;
            scale = (((x->scales_l[s / 2] >> (4 * (s % 2))) & 0x0f) | ((x->scales_h >> (2 * s)) & 3) << 4) - 32;
        }
        }
        sc[c] = (int16_t)scale;
        mn[c] = (int16_t)min;
    }
}

/* Code j of a super-block (natural order) less its offset: u - o, or the
 * IQ4_XS level. */
static int block_code(MnType type, const uint8_t *blk, int j) {
    int h = j / 128, jj = j % 128 / 32, l = j % 32; /* j = 128h + 32jj + l */
    switch (type) {
    case MN_TYPE_Q2_K: return (((const BlockQ2_K *)blk)->qs[32 * h + l] >> (2 * jj)) & 3;
    case MN_TYPE_Q3_K: {
        const BlockQ3_K *x = (const BlockQ3_K *)blk;
        return ((x->qs[32 * h + l] >> (2 * jj)) & 3) + 4 * ((x->hmask[l] >> (4 * h + jj)) & 1) - 4;
    }
    case MN_TYPE_Q4_K: case MN_TYPE_Q5_K: {
        int g = j / 64, i = j % 64; /* element 64g + i */
        const uint8_t *qs = type == MN_TYPE_Q4_K ? ((const BlockQ4_K *)blk)->qs : ((const BlockQ5_K *)blk)->qs;
        int u = (qs[32 * g + i % 32] >> (4 * (i / 32))) & 0x0f;
        return type == MN_TYPE_Q4_K ? u : u | ((((const BlockQ5_K *)blk)->qh[l] >> (j / 32)) & 1) << 4;
    }
    case MN_TYPE_Q6_K: {
        const BlockQ6_K *x = (const BlockQ6_K *)blk;
        int lo = (x->ql[64 * h + 32 * (jj & 1) + l] >> (4 * (jj / 2))) & 0x0f;
        return (lo | ((x->qh[32 * h + l] >> (2 * jj)) & 3) << 4) - 32;
    }
    default: {
        const BlockIQ4_XS *x = (const BlockIQ4_XS *)blk;
        int s = j / 32, i = j % 32;
        return mn_iq4_values[(x->qs[16 * s + i % 16] >> (4 * (i / 16))) & 0x0f];
    }
    }
}

/* The f16 d and dmin of a super-block, as floats. */
static void block_d(KqKind k, const uint8_t *blk, float *d, float *dmin) {
    *d = f16_value(blk + k.d_off + (k.d_high ? 2 : 0));
    *dmin = f16_value(blk + k.d_off + 2);
}

/* The f32 steps of one super-block, the same on every path. */
KQ_INLINE float block_step(float acc, int32_t s, int32_t m, float d, float dmin, float dx, bool has_min) {
    acc = fmaf((float)s, d * dx, acc);
    return has_min ? fmaf(-(float)m, dmin * dx, acc) : acc;
}

/* Row w against token t of acts. */
static float dot_ref(MnType type, const uint8_t *w, const uint8_t *acts, int64_t n_in, int n_tok, int t) {
    KqKind k = kind_of(type);
    const uint8_t *pos = ORDER_POS[k.order];
    float acc = 0.0f;
    for (int64_t b = 0; b < n_in / MN_QK_K; b++, w += k.blk_bytes) {
        KqBlock blk;
        const KqBlock *a = &blk;
        act_get(type, acts, n_in, n_tok, t, b, &blk);
        int16_t sc[16], mn[16];
        block_scales(type, w, sc, mn);
        int32_t s_sum = 0, m_sum = 0;
        for (int c = 0; c < 16; c++) {
            int32_t dot = 0;
            for (int l = 0; l < 16; l++) dot += block_code(type, w, 16 * c + l) * a->qs[16 * pos[c] + l];
            s_sum += sc[c] * dot;
            m_sum += mn[c] * a->sum16[c];
        }
        float d, dmin;
        block_d(k, w, &d, &dmin);
        acc = block_step(acc, s_sum, m_sum, d, dmin, a->d, k.has_min);
    }
    return acc;
}

void kq_rows_ref(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                 const uint8_t *acts, int n_tok, float *out, int64_t n_out) {
    assert(kq_has_type(type) && n_in % MN_QK_K == 0);
    for (int t = 0; t < n_tok; t++)
        for (long r = r0; r < r1; r++)
            out[(int64_t)t * n_out + r] = dot_ref(type, w + (size_t)r * row_bytes, acts, n_in, n_tok, t);
}

/* ========================================================================
 * Prefetch (either SIMD path): decode reads each weight once, straight
 * from DRAM, a few rows at a time, so the hardware prefetcher (which
 * follows a handful of streams) falls behind; each step asks for the
 * weights KQ_AHEAD super-blocks on. tests/bench_matmul, 1 token, 2
 * threads, projected decode, medians of 6 alternated runs against no
 * prefetch (AVX-512 machine, 16 rows a tile): Q4_K 34.3 -> 65.2 tokens/s,
 * Q6_K 26.1 -> 47.9. On the AVX2 machine (AMD EPYC, Zen 3) one row a tile
 * and 8 super-blocks ahead (a 2048-wide row: the next row, same place)
 * decode fastest: mnemo speed tg64, 2 threads, 3 alternated rounds, 4
 * rows and 4 ahead against this: Q6_K 8.9-10.0 -> 16.3-16.5 tokens/s,
 * Q4_K_M 13.3-15.6 -> 16.2-16.5 (llama-bench the same rounds: 11.5-13.3
 * and 14.9-16.0).
 * ===================================================================== */
#if defined(KQ_AVX512) || defined(KQ_AVX2)

#if defined(KQ_AVX512)
enum { KQ_AHEAD = 4 };
#else
enum { KQ_AHEAD = 8 };
#endif

/* Q4_K/Q5_K: bytes 0..7 the 8 sub-block scales, 8..15 the 8 mins, from
 * the 12 scale bytes at p. */
KQ_INLINE __m128i k4_scale_bytes(const uint8_t *p) {
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    uint32_t u0, u1, u2;
    memcpy(&u0, p, 4);
    memcpy(&u1, p + 4, 4);
    memcpy(&u2, p + 8, 4);
    return _mm_setr_epi32((int)(u0 & m6), (int)((u2 & m4) | ((u0 >> 6) & m2) << 4), (int)(u1 & m6),
                          (int)(((u2 >> 4) & m4) | ((u1 >> 6) & m2) << 4));
}

/* IQ4_XS: the 8 sub-block scales as words. */
KQ_INLINE __m128i iq4_scale_words(const uint8_t *blk) {
    uint32_t l;
    uint16_t hh;
    memcpy(&l, blk + offsetof(BlockIQ4_XS, scales_l), 4);
    memcpy(&hh, blk + offsetof(BlockIQ4_XS, scales_h), 2);
    __m128i lw = _mm_cvtepu8_epi16(
        _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(l & 0x0f0f0f0f)), _mm_cvtsi32_si128((int)((l >> 4) & 0x0f0f0f0f))));
    const __m128i h = _mm_set1_epi32(hh), m2 = _mm_set1_epi32(3);
    __m128i hw = _mm_packs_epi32(_mm_and_si128(_mm_srlv_epi32(h, _mm_setr_epi32(0, 2, 4, 6)), m2),
                                 _mm_and_si128(_mm_srlv_epi32(h, _mm_setr_epi32(8, 10, 12, 14)), m2));
    return _mm_sub_epi16(_mm_or_si128(lw, _mm_slli_epi16(hw, 4)), _mm_set1_epi16(32));
}

/* Q3_K: the 16 scales + 32 (6 bits each, natural order) as bytes. */
KQ_INLINE __m128i q3_scale_bytes(const uint8_t *blk) {
    uint64_t lo8;
    uint32_t hb;
    memcpy(&lo8, blk + offsetof(BlockQ3_K, scales), 8);
    memcpy(&hb, blk + offsetof(BlockQ3_K, scales) + 8, 4);
    const uint64_t m4 = 0x0f0f0f0f0f0f0f0full;
    const uint32_t m2 = 0x03030303;
    uint64_t h0 = (uint64_t)(hb & m2) | (uint64_t)((hb >> 2) & m2) << 32;
    uint64_t h1 = (uint64_t)((hb >> 4) & m2) | (uint64_t)((hb >> 6) & m2) << 32;
    return _mm_set_epi64x((long long)(((lo8 >> 4) & m4) | h1 << 4), (long long)((lo8 & m4) | h0 << 4));
}

/* Where a tile's rows go on: the next tile's first row and how many rows
 * of it there are (0: none). */
typedef struct KqNext {
    const uint8_t *row;
    int n_rows;
    size_t row_bytes;
} KqNext;

/* Super-block bb of a row: each cache line it touches. */
KQ_INLINE void prefetch_block(KqKind k, const uint8_t *row, int64_t bb) {
    const char *blk = (const char *)row + bb * k.blk_bytes;
    for (int o = 0; o < k.blk_bytes; o += 64) _mm_prefetch(blk + o, _MM_HINT_T0);
    _mm_prefetch(blk + k.blk_bytes - 1, _MM_HINT_T0);
}

/* At super-block b of a tile's R rows w[] (nb per row): super-block b +
 * KQ_AHEAD of each, or past their end the next tile's. */
KQ_INLINE void prefetch_ahead(KqKind k, int R, const uint8_t *const w[], const KqNext *next, int64_t b, int64_t nb) {
    int64_t bb = b + KQ_AHEAD;
    if (bb < nb) {
        for (int r = 0; r < R; r++) prefetch_block(k, w[r], bb);
    } else if (bb - nb < nb) {
        for (int r = 0; r < next->n_rows; r++) prefetch_block(k, next->row + r * next->row_bytes, bb - nb);
    }
}

#endif

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
    const uint8_t *pos = ORDER_POS[kind_of(type).order];
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < n_in / MN_QK_K; b++, x += MN_QK_K, y++) {
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < 16; i++) m = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(x + 16 * i), abs_mask), m);
        float amax = _mm512_reduce_max_ps(m); /* no NaN in m: any order gives the same */
        float iscale = act8_iscale(amax);
        __m512 vs = _mm512_set1_ps(iscale), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
        __m512i q[16];
        for (int i = 0; i < 16; i++) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), vs);
            q[i] = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));
            _mm_storeu_si128((__m128i *)(y->qs + 16 * pos[i]), _mm512_cvtepi32_epi8(q[i]));
        }
        __m512i sums = sum16x16(q); /* lane c: the sum of chunk c */
        __m512i twice = _mm512_or_si512(_mm512_and_si512(sums, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(sums, 16));
        __m512i pairs = _mm512_add_epi32(sums, _mm512_srli_epi64(sums, 32));
        _mm512_storeu_si512(y->sum16x2, twice);
        _mm256_storeu_si256((__m256i *)y->sum16, _mm512_cvtepi32_epi16(sums));
        _mm_storeu_si128((__m128i *)y->sum32, _mm512_cvtepi64_epi16(pairs));
        y->d = act8_step(iscale);
        memset(y->pad, 0, sizeof y->pad);
    }
}

/* One super-block of a row, unpacked. */
typedef struct Dec512 {
    __m512i wv[4];    /* codes u, 64 per vector, in the activations' order */
    __m512i sw;       /* words: the sub-block scales (16, or 8 for sub-blocks of 32) */
    __m256i mins;     /* words: Q2_K's 16 mins; Q4_K/Q5_K: 8 in words 0..7 */
    __mmask64 neg[4]; /* IQ4_XS: codes of negative levels */
} Dec512;

/* A byte vector: bit lo in the low 256 bits, bit hi in the high. */
KQ_INLINE __m512i bits512(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << lo)), _mm256_set1_epi8((char)(1 << hi)), 1);
}

/* Q4_K/Q5_K: 8 scales (words 0..7) and 8 mins from the 12 scale bytes at p. */
KQ_INLINE void k4_scales512(const uint8_t *p, Dec512 *dec) {
    __m256i s16 = _mm256_cvtepu8_epi16(k4_scale_bytes(p));
    dec->sw = _mm512_castsi256_si512(s16);
    dec->mins = _mm256_castsi128_si256(_mm256_extracti128_si256(s16, 1));
}

/* Nibbles of 128 bytes at p: low of p[0..63], high, low of p[64..127], high. */
KQ_INLINE void nibbles512(const uint8_t *p, __m512i wv[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i qa = _mm512_loadu_si512(p), qb = _mm512_loadu_si512(p + 64);
    wv[0] = _mm512_and_si512(qa, m4);
    wv[1] = _mm512_and_si512(_mm512_srli_epi16(qa, 4), m4);
    wv[2] = _mm512_and_si512(qb, m4);
    wv[3] = _mm512_and_si512(_mm512_srli_epi16(qb, 4), m4);
}

/* Q2_K/Q3_K: 2-bit codes of the 64 bytes at p, natural order. */
KQ_INLINE void crumbs512(const uint8_t *p, __m512i wv[4]) {
    const __m512i m2 = _mm512_set1_epi8(3);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 32 * (v / 2))));
        __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * (v % 2))), _mm256_set1_epi16((short)(4 * (v % 2) + 2)), 1);
        wv[v] = _mm512_and_si512(_mm512_srlv_epi16(q, sh), m2);
    }
}

/* Add `add` to the codes whose bit (lo / hi half, per vector) is set in the
 * 32 bytes at p, broadcast. */
KQ_INLINE void high_bits512(const uint8_t *p, const int bit[4][2], int add, __m512i wv[4]) {
    __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    const __m512i a = _mm512_set1_epi8((char)add);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        __mmask64 m = _mm512_test_epi8_mask(h, bits512(bit[v][0], bit[v][1]));
        wv[v] = _mm512_mask_add_epi8(wv[v], m, wv[v], a);
    }
}

KQ_INLINE void kind_decode512(MnType type, const uint8_t *blk, Dec512 *dec) {
    switch (type) {
    case MN_TYPE_Q2_K: {
        __m256i sb = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)blk));
        dec->sw = _mm512_castsi256_si512(_mm256_and_si256(sb, _mm256_set1_epi16(0x0f)));
        dec->mins = _mm256_srli_epi16(sb, 4);
        crumbs512(blk + offsetof(BlockQ2_K, qs), dec->wv);
        break;
    }
    case MN_TYPE_Q3_K: {
        static const int bit[4][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
        dec->sw = _mm512_castsi256_si512(_mm256_sub_epi16(_mm256_cvtepu8_epi16(q3_scale_bytes(blk)), _mm256_set1_epi16(32)));
        crumbs512(blk + offsetof(BlockQ3_K, qs), dec->wv);
        high_bits512(blk + offsetof(BlockQ3_K, hmask), bit, 4, dec->wv);
        break;
    }
    case MN_TYPE_Q4_K:
        k4_scales512(blk + offsetof(BlockQ4_K, scales), dec);
        nibbles512(blk + offsetof(BlockQ4_K, qs), dec->wv);
        break;
    case MN_TYPE_Q5_K: {
        static const int bit[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
        k4_scales512(blk + offsetof(BlockQ5_K, scales), dec);
        nibbles512(blk + offsetof(BlockQ5_K, qs), dec->wv);
        high_bits512(blk + offsetof(BlockQ5_K, qh), bit, 16, dec->wv);
        break;
    }
    case MN_TYPE_Q6_K: {
        const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
        /* qh bits 2j..2j+1 to bits 4..5: codes 0..31 of a half take j = 0
         * (<< 4) and 32..63 j = 1 (<< 2); the high-nibble codes j = 2 (as
         * is), 3 (>> 2) */
        const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i sh_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
        dec->sw = _mm512_castsi256_si512(
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + offsetof(BlockQ6_K, scales)))));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
            dec->wv[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, sh_lo), m30));
            dec->wv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                 _mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m30));
        }
        break;
    }
    default: { /* IQ4_XS */
        const __m512i mag = _mm512_broadcast_i32x4(_mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
        dec->sw = _mm512_castsi128_si512(iq4_scale_words(blk));
        nibbles512(blk + offsetof(BlockIQ4_XS, qs), dec->wv);
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            dec->neg[v] = _mm512_cmplt_epu8_mask(dec->wv[v], _mm512_set1_epi8(8));
            dec->wv[v] = _mm512_shuffle_epi8(mag, dec->wv[v]);
        }
    }
    }
}

/* A word index vector for vpermw: words 8i..8i+7 take word s_i of the
 * source (the scales), matching the words of vpmaddubsw on 64 codes. */
KQ_INLINE __m512i scale_index(int s0, int s1, int s2, int s3) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_setr_m128i(_mm_set1_epi16((short)s0), _mm_set1_epi16((short)s1))),
        _mm256_setr_m128i(_mm_set1_epi16((short)s2), _mm_set1_epi16((short)s3)), 1);
}

/* The 16 token scales of a tile (T = 1 or 4 tokens), lane o. */
KQ_INLINE __m512 tile_dx(int T, const KqBlock *const a[4]) {
    if (T == 1) return _mm512_set1_ps(a[0]->d);
    return _mm512_broadcast_f32x4(_mm_setr_ps(a[0]->d, a[1]->d, a[2]->d, a[3]->d));
}

/* Lane o: the byte offset of output o's row from w[0]'s (for gathers of
 * the rows' f16 scales). */
KQ_INLINE __m512i tile_row_offsets(int T, const uint8_t *const w[16]) {
    _Alignas(64) int32_t off[16];
    for (int o = 0; o < 16; o++) {
        ptrdiff_t d = w[o / T] - w[0];
        assert(d >= 0 && d <= INT32_MAX);
        off[o] = (int32_t)d;
    }
    return _mm512_load_si512(off);
}

/* res[o] (o = rT + t) for R rows w[r] x T tokens a0[t], R * T = 16. Per
 * row and super-block the codes and scales unpack once; per output 4
 * vpmaddubsw + 4 vpdpwssd (IQ4_XS: the activations negated where the level
 * is), the offset as one vpdpwssd of the doubled chunk sums against
 * -o/2 * the doubled scales, and the mins in one 128-bit (Q4_K, Q5_K) or
 * 256-bit (Q2_K) vpdpwssd, put in 128-bit lane o / 4 of mv[o % 4] (sum4x4
 * then adds each output's 4 partials). */
KQ_INLINE void kind_tile(MnType type, int R, int T, const uint8_t *const w[16], const KqBlock *const a0[4],
                         int64_t nb, const KqNext *next, float res[16]) {
    const KqKind k = kind_of(type);
    const uint8_t *chunk = ORDER_CHUNK[k.order];
    const int sh = k.sub_log2;
    __m512i idx[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++)
        idx[v] = scale_index(chunk[4 * v] >> sh, chunk[4 * v + 1] >> sh, chunk[4 * v + 2] >> sh, chunk[4 * v + 3] >> sh);
    const __m512i idxd = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7,
                         6, 5, 4, 3, 2, 1, 0),
        1);
    const __m512i goff = tile_row_offsets(T, w), zero = _mm512_setzero_si512();
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const KqBlock *a[4];
        for (int t = 0; t < 4; t++) a[t] = a0[t < T ? t : 0] + b;
        prefetch_ahead(k, R, w, next, b, nb);
        __m512i sacc[16], mv[4] = {zero, zero, zero, zero};
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            Dec512 dec;
            kind_decode512(type, w[r] + b * (int64_t)k.blk_bytes, &dec);
            __m512i sc[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) sc[v] = _mm512_permutexvar_epi16(idx[v], dec.sw);
            __m512i scd = k.offset ? _mm512_mullo_epi16(_mm512_permutexvar_epi16(idxd, dec.sw),
                                                        _mm512_set1_epi16((short)(-k.offset / 2)))
                                   : zero;
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int8_t *xq = a[t]->qs;
                __m512i s = k.offset ? _mm512_dpwssd_epi32(zero, _mm512_loadu_si512(a[t]->sum16x2), scd) : zero;
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    __m512i x = _mm512_loadu_si512(xq + 64 * v);
                    if (type == MN_TYPE_IQ4_XS) x = _mm512_mask_sub_epi8(x, dec.neg[v], zero, x);
                    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(dec.wv[v], x), sc[v]);
                }
                int o = r * T + t;
                sacc[o] = s;
                if (!k.has_min) continue;
                __m128i m;
                if (k.sub_log2) {
                    m = _mm_dpwssd_epi32(_mm_setzero_si128(), _mm256_castsi256_si128(dec.mins),
                                         _mm_loadu_si128((const __m128i *)a[t]->sum32));
                } else {
                    __m256i m2 = _mm256_dpwssd_epi32(_mm256_setzero_si256(), dec.mins,
                                                     _mm256_loadu_si256((const __m256i *)a[t]->sum16));
                    m = _mm_add_epi32(_mm256_castsi256_si128(m2), _mm256_extracti128_si256(m2, 1));
                }
                /* into 128-bit lane o / 4; a mask rather than an immediate,
                 * which -O1 builds need not fold */
                mv[o % 4] = _mm512_mask_broadcast_i32x4(mv[o % 4], (__mmask16)(0xf << (4 * (o / 4))), m);
            }
        }
        __m512i dv = _mm512_i32gather_epi32(goff, w[0] + b * (int64_t)k.blk_bytes + k.d_off, 1);
        __m512 dx = tile_dx(T, a);
        __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(k.d_high ? _mm512_srli_epi32(dv, 16) : dv)), dx);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum16x16(sacc)), dd, acc);
        if (k.has_min) {
            __m512 dmin = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dv, 16))), dx);
            acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(sum4x4(mv[0], mv[1], mv[2], mv[3])), dmin, acc);
        }
    }
    _mm512_storeu_ps(res, acc);
}

/* Tile shapes: prefill (full groups of tokens) and decode. */
enum { TILE_OUTS = 16, PRE_R = 4, PRE_T = 4, DEC_R = 16 };

/* ---- tiles of tokens (prefill, KT_MIN_TOK tokens or more): lanes are tokens ---- */

/* Word index vector for vpermw: word u takes the scale of unit u. */
KQ_INLINE __m256i unit_scale_index(KqKind k) {
    _Alignas(32) int16_t idx[16];
    const int wpu = unit_words(k);
    for (int u = 0; u < 16; u++) idx[u] = (int16_t)(u < 64 / wpu ? ORDER_CHUNK[k.order][u * wpu / 4] >> k.sub_log2 : 0);
    return _mm256_load_si256((const __m256i *)idx);
}

/* Super-block blk of a tile's row i into slot b of p. */
KQ_INLINE void pack_block512(MnType type, const uint8_t *blk, KPack *p, int i, int b) {
    const KqKind k = kind_of(type);
    const __m512i sidx = _mm512_castsi256_si512(unit_scale_index(k));
    Dec512 dec;
    kind_decode512(type, blk, &dec);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        __m512i u = dec.wv[v];
        if (type == MN_TYPE_IQ4_XS) /* level + 128 */
            u = _mm512_mask_sub_epi8(_mm512_add_epi8(u, _mm512_set1_epi8((char)0x80)), dec.neg[v],
                                     _mm512_set1_epi8((char)0x80), u);
        _mm512_store_si512(p->u[i][b] + 64 * v, u);
    }
    __m256i sc = _mm512_castsi512_si256(_mm512_permutexvar_epi16(sidx, dec.sw));
    _mm512_storeu_si512(p->sc[i][b], _mm512_cvtepi16_epi32(sc));
    if (k.has_min) _mm256_storeu_si256((__m256i *)p->mnp[i][b], dec.mins);
    block_d(k, blk, &p->d[i][b], &p->dmin[i][b]);
}

/* KT_PR rows x KT_LANES tokens, the super-blocks of one slice: acc[r]
 * lane t. ab0 is the tile's first super-block of the slice. Per unit the
 * tokens' code words stay in registers while every row goes by: a chain
 * of vpdpbusd from -o * the unit's sums, times the unit's scale into S. */
KQ_INLINE void ktile16(MnType type, const KPack *p, int nbs, const uint8_t *ab0, __m512 acc[KT_PR]) {
    const KqKind k = kind_of(type);
    const int wpu = unit_words(k), nu = 64 / wpu, bias = tile_bias(type, k), np = sum_pairs(k);
    const __m512i zero = _mm512_setzero_si512();
    for (int b = 0; b < nbs; b++) {
        const uint8_t *ab = ab0 + (size_t)b * KT_BLOCK;
        __m512i S[KT_PR];
#pragma GCC unroll 8
        for (int r = 0; r < KT_PR; r++) S[r] = zero;
#pragma GCC unroll 16
        for (int u = 0; u < nu; u++) {
            __m512i x[8];
#pragma GCC unroll 8
            for (int j = 0; j < wpu; j++) x[j] = _mm512_load_si512(ab + 64 * (u * wpu + j));
            __m512i init = bias ? _mm512_load_si512(ab + KT_INIT + 64 * u) : zero;
#pragma GCC unroll 8
            for (int r = 0; r < KT_PR; r++) {
                const uint8_t *c = p->u[r][b] + 4 * u * wpu;
                __m512i t = init;
#pragma GCC unroll 8
                for (int j = 0; j < wpu; j++) {
                    uint32_t word;
                    memcpy(&word, c + 4 * j, 4);
                    t = _mm512_dpbusd_epi32(t, _mm512_set1_epi32((int)word), x[j]);
                }
                S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(t, _mm512_set1_epi32((int)p->sc[r][b][u])));
            }
        }
        __m512 dx = _mm512_load_ps((const float *)(ab + KT_D));
#pragma GCC unroll 8
        for (int r = 0; r < KT_PR; r++) {
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[r]), _mm512_mul_ps(_mm512_set1_ps(p->d[r][b]), dx), acc[r]);
            if (np == 0) continue;
            __m512i m = zero;
#pragma GCC unroll 8
            for (int q = 0; q < np; q++)
                m = _mm512_dpwssd_epi32(m, _mm512_set1_epi32((int)p->mnp[r][b][q]), _mm512_load_si512(ab + KT_MINP + 64 * q));
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(_mm512_set1_ps(p->dmin[r][b]), dx), acc[r]);
        }
    }
}

#endif

/* ========================================================================
 * AVX2 (vpmaddubsw + vpmaddwd, no VNNI)
 * ===================================================================== */
#if defined(KQ_AVX2)

/* Lane i of the result: the sum of the 8 lanes of the i-th argument. */
KQ_INLINE __m128i sum4x8(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* One super-block of a row, unpacked: vector j holds the codes of
 * activation positions 2j and 2j + 1 (the halves of Dec512's vectors). */
typedef struct Dec256 {
    __m256i wv[8];  /* codes u */
    __m256i sgn[8]; /* IQ4_XS: the levels, whose signs go onto the activations */
} Dec256;

KQ_INLINE __m256i srl16(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }
KQ_INLINE __m256i sll16(__m256i v, int n) { return _mm256_sll_epi16(v, _mm_cvtsi32_si128(n)); }

/* Codes with bit b of the byte at the same place of h get `add`. */
KQ_INLINE __m256i add_if_bit(__m256i wv, __m256i h, int b, int add) {
    __m256i bit = _mm256_set1_epi8((char)(1 << b));
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
    return _mm256_add_epi8(wv, _mm256_and_si256(set, _mm256_set1_epi8((char)add)));
}

KQ_INLINE void kind_decode256(MnType type, const uint8_t *blk, Dec256 *dec) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    switch (type) {
    case MN_TYPE_Q2_K: case MN_TYPE_Q3_K: {
        const uint8_t *qs = blk + (type == MN_TYPE_Q2_K ? offsetof(BlockQ2_K, qs) : offsetof(BlockQ3_K, qs));
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) { /* element 128h + 32jj + l, j = 4h + jj */
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 4)));
            dec->wv[j] = _mm256_and_si256(srl16(q, 2 * (j % 4)), _mm256_set1_epi8(3));
            if (type == MN_TYPE_Q3_K)
                dec->wv[j] = add_if_bit(dec->wv[j], _mm256_loadu_si256((const __m256i *)blk), j, 4);
        }
        break;
    }
    case MN_TYPE_Q6_K:
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) { /* element 128h + 32jj + l */
            int h = j / 4, jj = j % 4;
            __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (jj & 1)));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            qh = 2 * jj >= 4 ? srl16(qh, 2 * jj - 4) : sll16(qh, 4 - 2 * jj);
            dec->wv[j] = _mm256_or_si256(_mm256_and_si256(srl16(ql, 4 * (jj / 2)), m4),
                                         _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
        }
        break;
    default: { /* Q4_K, Q5_K, IQ4_XS: nibbles of 32 bytes, low then high */
        size_t off = type == MN_TYPE_Q4_K ? offsetof(BlockQ4_K, qs)
                     : type == MN_TYPE_Q5_K ? offsetof(BlockQ5_K, qs) : offsetof(BlockIQ4_XS, qs);
        const __m256i lv = _mm256_broadcastsi128_si256(_mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25,
                                                                     38, 53, 69, 89, 113));
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(blk + off + 32 * (2 * (j / 4) + j % 2)));
            dec->wv[j] = _mm256_and_si256(srl16(q, 4 * (j / 2 % 2)), m4);
            if (type == MN_TYPE_Q5_K) /* the 32 codes of sub-block s take bit s of qh */
                dec->wv[j] = add_if_bit(dec->wv[j], _mm256_loadu_si256((const __m256i *)(blk + offsetof(BlockQ5_K, qh))),
                                        (j & 4) | (j & 1) << 1 | (j >> 1 & 1), 16);
            if (type == MN_TYPE_IQ4_XS) {
                dec->sgn[j] = _mm256_shuffle_epi8(lv, dec->wv[j]);
                dec->wv[j] = _mm256_abs_epi8(dec->sgn[j]);
            }
        }
    }
    }
}

/* A super-block's scales and mins as words, one per 16-chunk, natural
 * order (block_scales' values: sub-blocks of 32 give theirs twice). */
KQ_INLINE void kind_scales256(MnType type, const uint8_t *blk, __m256i *sc, __m256i *mn) {
    switch (type) {
    case MN_TYPE_Q2_K: {
        __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + offsetof(BlockQ2_K, scales))));
        *sc = _mm256_and_si256(b, _mm256_set1_epi16(0x0f));
        *mn = _mm256_srli_epi16(b, 4);
        break;
    }
    case MN_TYPE_Q3_K:
        *sc = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3_scale_bytes(blk)), _mm256_set1_epi16(32));
        *mn = _mm256_setzero_si256();
        break;
    case MN_TYPE_Q4_K: case MN_TYPE_Q5_K: { /* Q5_K's header is Q4_K's; chunks 2s, 2s + 1 take sub-block s's */
        __m128i s8 = k4_scale_bytes(blk + offsetof(BlockQ4_K, scales));
        *sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s8, s8));
        *mn = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(s8, s8));
        break;
    }
    case MN_TYPE_Q6_K:
        *sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + offsetof(BlockQ6_K, scales))));
        *mn = _mm256_setzero_si256();
        break;
    default: { /* IQ4_XS */
        __m128i s16 = iq4_scale_words(blk);
        *sc = _mm256_setr_m128i(_mm_unpacklo_epi16(s16, s16), _mm_unpackhi_epi16(s16, s16));
        *mn = _mm256_setzero_si256();
    }
    }
}

/* Words of scales for the 32 codes of activation positions 2j (low half)
 * and 2j + 1 (high half), from the 16 chunk scales sc: positions 0..7
 * hold chunks 0..7 in every order, 8..15 chunks 8..15. */
KQ_INLINE __m256i scale_pair(const uint8_t *chunk, __m256i sc, int j) {
    /* two calls, not one with a chosen immediate, which unoptimized builds need not fold */
    __m256i half = j < 4 ? _mm256_permute4x64_epi64(sc, 0x44) : _mm256_permute4x64_epi64(sc, 0xee);
    int c0 = chunk[2 * j] & 7, c1 = chunk[2 * j + 1] & 7;
    __m256i ctrl = _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * c0)), _mm_set1_epi16((short)(0x0100 + 0x0202 * c1)));
    return _mm256_shuffle_epi8(half, ctrl);
}

/* res[o] (o = rT + t) for R rows x T tokens, R * T <= 4: per output and
 * super-block 8 vpmaddubsw + 8 vpmaddwd against the scales (words of
 * positions 2j, 2j + 1), and one vpmaddwd each for the offset and the
 * mins against the chunk sums; 4 outputs' int32 vectors then sum into
 * one vector. */
KQ_INLINE void kind_tile(MnType type, int R, int T, const uint8_t *const w[4], const KqBlock *const a0[4], int64_t nb,
                         const KqNext *next, float res[4]) {
    const KqKind k = kind_of(type);
    const uint8_t *chunk = ORDER_CHUNK[k.order];
    __m128 acc = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i sv[4] = {0}, mv[4] = {0}; /* outputs past R * T: zeros, not stored */
        _Alignas(16) float d[4] = {0}, dmin[4] = {0}, dx[4] = {0};
        prefetch_ahead(k, R, w, next, b, nb);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w[r] + b * (int64_t)k.blk_bytes;
            Dec256 dec;
            kind_decode256(type, blk, &dec);
            __m256i scv, mnv;
            kind_scales256(type, blk, &scv, &mnv);
            float bd = act8_f16(blk + k.d_off + (k.d_high ? 2 : 0)), bdmin = act8_f16(blk + k.d_off + 2);
            __m256i sw[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) sw[j] = scale_pair(chunk, scv, j);
            __m256i off = _mm256_mullo_epi16(scv, _mm256_set1_epi16((short)-k.offset));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const KqBlock *a = a0[t] + b;
                __m256i sum16 = _mm256_loadu_si256((const __m256i *)a->sum16);
                __m256i s = k.offset ? _mm256_madd_epi16(sum16, off) : _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(a->qs + 32 * j));
                    if (type == MN_TYPE_IQ4_XS) x = _mm256_sign_epi8(x, dec.sgn[j]);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(dec.wv[j], x), sw[j]));
                }
                int o = r * T + t;
                sv[o] = s;
                mv[o] = _mm256_madd_epi16(sum16, mnv);
                d[o] = bd, dmin[o] = bdmin, dx[o] = a->d;
            }
        }
        if (R * T == 1) { /* one output: S in lane 0 and M in lane 1 of one reduction */
            __m128 sm = _mm_cvtepi32_ps(sum4x8(sv[0], mv[0], sv[0], mv[0]));
            acc = _mm_fmadd_ss(sm, _mm_set_ss(d[0] * dx[0]), acc);
            if (k.has_min) acc = _mm_fnmadd_ss(_mm_movehdup_ps(sm), _mm_set_ss(dmin[0] * dx[0]), acc);
            continue;
        }
        __m128 vdx = _mm_load_ps(dx);
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(sum4x8(sv[0], sv[1], sv[2], sv[3])), _mm_mul_ps(_mm_load_ps(d), vdx), acc);
        if (k.has_min)
            acc = _mm_fnmadd_ps(_mm_cvtepi32_ps(sum4x8(mv[0], mv[1], mv[2], mv[3])), _mm_mul_ps(_mm_load_ps(dmin), vdx),
                                acc);
    }
    _mm_storeu_ps(res, acc);
}

enum { TILE_OUTS = 4, PRE_R = 1, PRE_T = 4, DEC_R = 1 }; /* DEC_R: see Prefetch */

/* ---- tiles of tokens (prefill, KT_MIN_TOK tokens or more): lanes are tokens ---- */

KQ_INLINE uint32_t word_pair(int16_t lo, int16_t hi) { return (uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16; }

/* Super-block blk of a tile's row i into slot b of p. */
KQ_INLINE void pack_block256(MnType type, const uint8_t *blk, KPack *p, int i, int b) {
    const KqKind k = kind_of(type);
    const int wpu = unit_words(k);
    Dec256 dec;
    kind_decode256(type, blk, &dec);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        _mm256_store_si256((__m256i *)(p->u[i][b] + 32 * j), type == MN_TYPE_IQ4_XS ? dec.sgn[j] : dec.wv[j]);
    __m256i scv, mnv;
    kind_scales256(type, blk, &scv, &mnv);
    _Alignas(32) int16_t sc[16], mn[16];
    _mm256_store_si256((__m256i *)sc, scv);
    _mm256_store_si256((__m256i *)mn, mnv);
    for (int u = 0; u < 64 / wpu; u++) {
        int16_t v = sc[ORDER_CHUNK[k.order][u * wpu / 4]];
        p->sc[i][b][u] = word_pair(v, v);
    }
    for (int q = 0; q < 8; q++) {
        p->scp[i][b][q] = word_pair(sc[2 * q], sc[2 * q + 1]);
        if (!k.sub_log2) p->mnp[i][b][q] = word_pair(mn[2 * q], mn[2 * q + 1]);
        else if (q < 4) p->mnp[i][b][q] = word_pair(mn[4 * q], mn[4 * q + 2]); /* sub-blocks 2q, 2q + 1 */
    }
    p->d[i][b] = act8_f16(blk + k.d_off + (k.d_high ? 2 : 0));
    p->dmin[i][b] = act8_f16(blk + k.d_off + 2);
}

/* Code words summed as int16 before the scale's vpmaddwd: G words of
 * vpmaddubsw pair sums (each at most 2 * 127 * the largest code) stay
 * below 2^15. IQ4_XS's levels reach 127: one word. */
KQ_INLINE int i16_words(MnType type) {
    switch (type) {
    case MN_TYPE_Q2_K: case MN_TYPE_Q3_K: return 4; /* codes <= 7: 4 * 1778 */
    case MN_TYPE_Q4_K: return 8;                    /* <= 15: 8 * 3810 */
    case MN_TYPE_Q5_K: return 4;                    /* <= 31: 4 * 7874 */
    case MN_TYPE_Q6_K: return 2;                    /* <= 63: 2 * 16002 */
    default: return 1;
    }
}

/* KT_PR rows x KT_LANES tokens, the super-blocks of one slice: acc[r]
 * lane t. Per row and unit, each code word broadcast against the tokens'
 * word: vpmaddubsw, G of them added as words, then one vpmaddwd against
 * the unit's scale into S; the offset (-o * the sum over chunks of scale
 * * code sum) and the mins by one vpmaddwd per pair of chunk sums. */
KQ_INLINE void ktile8(MnType type, const KPack *p, int nbs, const uint8_t *ab0, __m256 acc[KT_PR]) {
    const KqKind k = kind_of(type);
    const int wpu = unit_words(k), nu = 64 / wpu, g = i16_words(type), np = sum_pairs(k);
    const __m256i zero = _mm256_setzero_si256();
    for (int b = 0; b < nbs; b++) {
        const uint8_t *ab = ab0 + (size_t)b * KT_BLOCK;
        const __m256 dx = _mm256_load_ps((const float *)(ab + KT_D));
        for (int r = 0; r < KT_PR; r++) {
            const uint8_t *c = p->u[r][b];
            __m256i S = zero;
#pragma GCC unroll 16
            for (int u = 0; u < nu; u++) {
                const __m256i sc = _mm256_set1_epi32((int)p->sc[r][b][u]);
#pragma GCC unroll 8
                for (int j0 = 0; j0 < wpu; j0 += g) {
                    __m256i h = zero;
#pragma GCC unroll 8
                    for (int j = j0; j < j0 + g; j++) {
                        int32_t word;
                        memcpy(&word, c + 4 * (u * wpu + j), 4);
                        __m256i cw = _mm256_set1_epi32(word);
                        __m256i x = _mm256_load_si256((const __m256i *)(ab + 32 * (u * wpu + j)));
                        if (type == MN_TYPE_IQ4_XS) {
                            x = _mm256_sign_epi8(x, cw);
                            cw = _mm256_abs_epi8(cw);
                        }
                        h = _mm256_add_epi16(h, _mm256_maddubs_epi16(cw, x));
                    }
                    S = _mm256_add_epi32(S, _mm256_madd_epi16(h, sc));
                }
            }
            __m256i m = zero;
#pragma GCC unroll 8
            for (int q = 0; q < np; q++)
                m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_set1_epi32((int)(k.has_min ? p->mnp : p->scp)[r][b][q]),
                                                          _mm256_load_si256((const __m256i *)(ab + KT_MINP + 32 * q))));
            if (k.offset) S = _mm256_add_epi32(S, _mm256_mullo_epi32(m, _mm256_set1_epi32(-k.offset)));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_mul_ps(_mm256_set1_ps(p->d[r][b]), dx), acc[r]);
            if (k.has_min)
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(_mm256_set1_ps(p->dmin[r][b]), dx), acc[r]);
        }
    }
}

#endif

/* ========================================================================
 * Tiles over rows and tokens (either SIMD path)
 * ===================================================================== */
#if defined(KQ_AVX512) || defined(KQ_AVX2)

#if defined(KQ_AVX512)
typedef __m512 KtAcc;
#define KT_ACC_ZERO() _mm512_setzero_ps()
#define KT_ACC_LOAD(p) _mm512_load_ps(p)
#define KT_ACC_STORE(p, v) _mm512_store_ps(p, v)
#define KT_KERNEL ktile16
#define KT_PACK_BLOCK pack_block512
#else
typedef __m256 KtAcc;
#define KT_ACC_ZERO() _mm256_setzero_ps()
#define KT_ACC_LOAD(p) _mm256_load_ps(p)
#define KT_ACC_STORE(p, v) _mm256_store_ps(p, v)
#define KT_KERNEL ktile8
#define KT_PACK_BLOCK pack_block256
#endif

/* Super-blocks [s0, s0 + nbs) of the KT_PR rows at rows[] into p, asking
 * for the same super-blocks of the next tile's rows: they arrive while
 * this tile's tokens are multiplied. */
KQ_INLINE void pack_rows(MnType type, const uint8_t *const rows[KT_PR], int64_t s0, int nbs, KPack *p,
                         const KqNext *next) {
    const KqKind k = kind_of(type);
    for (int i = 0; i < KT_PR; i++) {
        const uint8_t *blk = rows[i] + (size_t)s0 * k.blk_bytes;
        for (int b = 0; b < nbs; b++, blk += k.blk_bytes) {
            if (i < next->n_rows) prefetch_block(k, next->row + i * next->row_bytes, s0 + b);
            KT_PACK_BLOCK(type, blk, p, i, b);
        }
    }
}

/* Rows [r0, r1) x every token of a tiled group: each tile of KT_PR rows is
 * unpacked KT_SLB super-blocks at a time, and every token tile goes by;
 * between slices an output's accumulator waits in `out` (a stored f32
 * reads back the same, so the steps are unchanged). */
KQ_INLINE void rows_tiled(MnType type, KPack *p, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                          const uint8_t *acts, int n_tok, float *out, int64_t n_out) {
    const int64_t nb = n_in / MN_QK_K;
    const int n_tiles = (n_tok + KT_LANES - 1) / KT_LANES;
    for (long r = r0; r < r1; r += KT_PR) {
        const uint8_t *rows[KT_PR];
        for (int i = 0; i < KT_PR; i++) rows[i] = w + (size_t)KQ_MIN(r + i, r1 - 1) * row_bytes;
        const int n_rows = (int)KQ_MIN(KT_PR, r1 - r);
        const int n_next = (int)KQ_MIN(KT_PR, r1 - KQ_MIN(r1, r + KT_PR));
        const KqNext next = {n_next > 0 ? w + (size_t)(r + KT_PR) * row_bytes : NULL, n_next, row_bytes};
        for (int64_t s0 = 0; s0 < nb; s0 += KT_SLB) {
            const int nbs = (int)KQ_MIN(KT_SLB, nb - s0);
            pack_rows(type, rows, s0, nbs, p, &next);
            for (int i = 0; i < n_tiles; i++) {
                const int t0 = i * KT_LANES, nt = KQ_MIN(KT_LANES, n_tok - t0);
                _Alignas(64) float v[KT_LANES];
                KtAcc acc[KT_PR];
                for (int j = 0; j < KT_PR; j++) {
                    acc[j] = KT_ACC_ZERO();
                    if (s0 == 0 || j >= n_rows) continue;
                    act8_outs_load(out, n_out, r + j, t0, nt, KT_LANES, v);
                    acc[j] = KT_ACC_LOAD(v);
                }
                KT_KERNEL(type, p, nbs, acts + (size_t)i * tile_bytes(n_in) + (size_t)s0 * KT_BLOCK, acc);
                for (int j = 0; j < n_rows; j++) {
                    KT_ACC_STORE(v, acc[j]);
                    act8_outs_store(out, n_out, r + j, t0, nt, v);
                }
            }
        }
    }
}

static void rows_tiled_any(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                           const uint8_t *acts, int n_tok, float *out, int64_t n_out) {
    KPack p; /* here, once: the switch inlines a rows_tiled per type */
    switch (type) {
    case MN_TYPE_Q2_K: rows_tiled(MN_TYPE_Q2_K, &p, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out); break;
    case MN_TYPE_Q3_K: rows_tiled(MN_TYPE_Q3_K, &p, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out); break;
    case MN_TYPE_Q4_K: rows_tiled(MN_TYPE_Q4_K, &p, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out); break;
    case MN_TYPE_Q5_K: rows_tiled(MN_TYPE_Q5_K, &p, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out); break;
    case MN_TYPE_Q6_K: rows_tiled(MN_TYPE_Q6_K, &p, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out); break;
    default: rows_tiled(MN_TYPE_IQ4_XS, &p, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out);
    }
}


/* One tile: rows r..r+R-1 and tokens t..t+T-1, those past r1 / n_tok
 * computed on copies of the last one and not stored; rows r + R.. (up to
 * r1) are the ones read next, and a first tile (r == r0) asks for its own
 * first super-blocks too. The switch gives each type its own kind_tile. */
KQ_INLINE void tile_run(MnType type, int R, int T, const uint8_t *w, size_t row_bytes, long r0, long r, long r1,
                        const uint8_t *acts, size_t stride, int t, int n_tok, int64_t nb, float *out, int64_t n_out) {
    const uint8_t *rows[TILE_OUTS];
    const KqBlock *toks[4];
    for (int i = 0; i < R; i++) rows[i] = w + (size_t)KQ_MIN(r + i, r1 - 1) * row_bytes;
    for (int j = 0; j < T; j++) toks[j] = (const KqBlock *)(acts + (size_t)KQ_MIN(t + j, n_tok - 1) * stride);
    const int next_rows = (int)KQ_MIN(R, r1 - KQ_MIN(r1, r + R));
    const KqNext next = {next_rows > 0 ? w + (size_t)(r + R) * row_bytes : NULL, next_rows, row_bytes};
    if (r == r0)
        for (int64_t b = 0; b < KQ_MIN(nb, KQ_AHEAD); b++)
            for (int i = 0; i < R; i++) prefetch_block(kind_of(type), rows[i], b);
    float res[TILE_OUTS];
    switch (type) {
    case MN_TYPE_Q2_K: kind_tile(MN_TYPE_Q2_K, R, T, rows, toks, nb, &next, res); break;
    case MN_TYPE_Q3_K: kind_tile(MN_TYPE_Q3_K, R, T, rows, toks, nb, &next, res); break;
    case MN_TYPE_Q4_K: kind_tile(MN_TYPE_Q4_K, R, T, rows, toks, nb, &next, res); break;
    case MN_TYPE_Q5_K: kind_tile(MN_TYPE_Q5_K, R, T, rows, toks, nb, &next, res); break;
    case MN_TYPE_Q6_K: kind_tile(MN_TYPE_Q6_K, R, T, rows, toks, nb, &next, res); break;
    default: kind_tile(MN_TYPE_IQ4_XS, R, T, rows, toks, nb, &next, res);
    }
    for (int i = 0; i < R && r + i < r1; i++)
        for (int j = 0; j < T && t + j < n_tok; j++) out[(int64_t)(t + j) * n_out + r + i] = res[i * T + j];
}

static void rows_simd(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                      const uint8_t *acts, int n_tok, float *out, int64_t n_out) {
    int64_t nb = n_in / MN_QK_K;
    const size_t stride = tok_bytes(n_in);
    if (is_tiled(n_tok)) {
        rows_tiled_any(type, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out);
        return;
    }
    int tf = n_tok / PRE_T * PRE_T;
    for (int t = 0; t < tf; t += PRE_T)
        for (long r = r0; r < r1; r += PRE_R)
            tile_run(type, PRE_R, PRE_T, w, row_bytes, r0, r, r1, acts, stride, t, n_tok, nb, out, n_out);
#if defined(KQ_AVX2)
    /* the last 1..3 tokens in one pass over the rows (DEC_R is 1) */
    for (long r = r0; r < r1 && tf < n_tok; r += DEC_R) {
        switch (n_tok - tf) {
        case 1: tile_run(type, DEC_R, 1, w, row_bytes, r0, r, r1, acts, stride, tf, n_tok, nb, out, n_out); break;
        case 2: tile_run(type, DEC_R, 2, w, row_bytes, r0, r, r1, acts, stride, tf, n_tok, nb, out, n_out); break;
        default: tile_run(type, DEC_R, 3, w, row_bytes, r0, r, r1, acts, stride, tf, n_tok, nb, out, n_out);
        }
    }
#else
    for (int t = tf; t < n_tok; t++)
        for (long r = r0; r < r1; r += DEC_R)
            tile_run(type, DEC_R, 1, w, row_bytes, r0, r, r1, acts, stride, t, n_tok, nb, out, n_out);
#endif
}

#endif

/* ========================================================================
 * API
 * ===================================================================== */

/* n_tok tokens x into dst, quantizing a super-block at a time with fn. */
static void quantize_group(MnType type, const float *x, int64_t n_in, int n_tok, uint8_t *dst,
                           void (*fn)(MnType, const float *, int64_t, KqBlock *)) {
    if (!is_tiled(n_tok)) {
        for (int t = 0; t < n_tok; t++) fn(type, x + (int64_t)t * n_in, n_in, (KqBlock *)(dst + (size_t)t * tok_bytes(n_in)));
        return;
    }
    memset(dst, 0, kq_acts_bytes(n_in, n_tok));
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < n_in / MN_QK_K; b++) {
            KqBlock y;
            fn(type, x + (int64_t)t * n_in + MN_QK_K * b, MN_QK_K, &y);
            act_put(type, dst, n_in, n_tok, t, b, &y);
        }
}

void kq_quantize(MnType type, const float *x, int64_t n_in, int n_tok, uint8_t *dst) {
    assert(kq_has_type(type) && n_in % MN_QK_K == 0 && ((uintptr_t)dst & 63) == 0);
#if defined(KQ_AVX512)
    quantize_group(type, x, n_in, n_tok, dst, quantize_avx512);
#else
    quantize_group(type, x, n_in, n_tok, dst, quantize_ref);
#endif
}

void kq_quantize_ref(MnType type, const float *x, int64_t n_in, int n_tok, uint8_t *dst) {
    assert(kq_has_type(type) && n_in % MN_QK_K == 0 && ((uintptr_t)dst & 63) == 0);
    quantize_group(type, x, n_in, n_tok, dst, quantize_ref);
}

/* The packed form is d and the natural codes, as kq_quantize made them
 * (for Q2_K: natural order), so it is a function of x alone; unpacking
 * recomputes the sums, exact integers, as quantize_ref does. */
void kq_pack(const float *x, int64_t n_in, uint8_t *dst) {
    assert(n_in % MN_QK_K == 0);
    _Alignas(64) KqBlock y;
    for (int64_t b = 0; b < n_in / MN_QK_K; b++, x += MN_QK_K, dst += KQ_PACKED_BYTES) {
        kq_quantize(MN_TYPE_Q2_K, x, MN_QK_K, 1, (uint8_t *)&y); /* one token: a KqBlock */
        memcpy(dst, &y.d, sizeof y.d);
        memcpy(dst + sizeof y.d, y.qs, MN_QK_K);
    }
}

/* The KqBlock of type that quantizing made, from one packed block. */
static void unpack_block(MnType type, const uint8_t *src, KqBlock *y) {
    const uint8_t *pos = ORDER_POS[kind_of(type).order];
    memset(y, 0, sizeof *y);
    memcpy(&y->d, src, sizeof y->d);
    for (int c = 0; c < 16; c++) memcpy(y->qs + 16 * pos[c], src + sizeof y->d + 16 * c, 16);
    block_sums(pos, y);
}

/* As quantize_group lays the blocks out for n_tok tokens. */
void kq_unpack(MnType type, const uint8_t *src, int64_t n_in, int n_tok, uint8_t *dst) {
    assert(kq_has_type(type) && n_in % MN_QK_K == 0 && ((uintptr_t)dst & 63) == 0);
    const int64_t nb = n_in / MN_QK_K;
    if (is_tiled(n_tok)) memset(dst, 0, kq_acts_bytes(n_in, n_tok));
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < nb; b++) {
            KqBlock y;
            unpack_block(type, src + (size_t)(t * nb + b) * KQ_PACKED_BYTES, &y);
            act_put(type, dst, n_in, n_tok, t, b, &y);
        }
}

void kq_rows(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in, const uint8_t *acts,
             int n_tok, float *out, int64_t n_out) {
    assert(kq_has_type(type) && n_in % MN_QK_K == 0);
#if defined(KQ_AVX512) || defined(KQ_AVX2)
    rows_simd(type, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out);
#else
    kq_rows_ref(type, w, row_bytes, r0, r1, n_in, acts, n_tok, out, n_out);
#endif
}
