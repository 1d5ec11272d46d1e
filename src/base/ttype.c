/* ttype.c — tensor element types: traits, half-precision conversions and the
 * reference quantize / dequantize (see ttype.h). Portable scalar code only;
 * these are the oracle the SIMD kernels in src/compute/ are tested against.
 */
#include "base/ttype.h"

#include <assert.h>
#include <stddef.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "base/err.h"

/* ---- traits ------------------------------------------------------------- */

const int8_t mn_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

#define QTRAITS(name, blk, type) {name, blk, sizeof(type), true}
static const TypeTraits traits_f32 = {"f32", 1, 4, false};
static const TypeTraits traits_f16 = {"f16", 1, 2, false};
static const TypeTraits traits_bf16 = {"bf16", 1, 2, false};
static const TypeTraits traits_q8_0 = QTRAITS("q8_0", MN_QK8_0, BlockQ8_0);
static const TypeTraits traits_q4_0 = QTRAITS("q4_0", MN_QK4_0, BlockQ4_0);
static const TypeTraits traits_q4_1 = QTRAITS("q4_1", MN_QK, BlockQ4_1);
static const TypeTraits traits_q5_0 = QTRAITS("q5_0", MN_QK, BlockQ5_0);
static const TypeTraits traits_q5_1 = QTRAITS("q5_1", MN_QK, BlockQ5_1);
static const TypeTraits traits_q2_k = QTRAITS("q2_k", MN_QK_K, BlockQ2_K);
static const TypeTraits traits_q3_k = QTRAITS("q3_k", MN_QK_K, BlockQ3_K);
static const TypeTraits traits_q4_k = QTRAITS("q4_k", MN_QK_K, BlockQ4_K);
static const TypeTraits traits_q5_k = QTRAITS("q5_k", MN_QK_K, BlockQ5_K);
static const TypeTraits traits_q6_k = QTRAITS("q6_k", MN_QK_K, BlockQ6_K);
static const TypeTraits traits_iq4_nl = QTRAITS("iq4_nl", MN_QK, BlockIQ4_NL);
static const TypeTraits traits_iq4_xs = QTRAITS("iq4_xs", MN_QK_K, BlockIQ4_XS);
#undef QTRAITS

_Static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");
_Static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must be 18 bytes");
_Static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block must be 20 bytes");
_Static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block must be 22 bytes");
_Static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block must be 24 bytes");
_Static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block must be 84 bytes");
_Static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block must be 110 bytes");
_Static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block must be 144 bytes");
_Static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block must be 176 bytes");
_Static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block must be 210 bytes");
_Static_assert(sizeof(BlockIQ4_NL) == 18, "IQ4_NL block must be 18 bytes");
_Static_assert(sizeof(BlockIQ4_XS) == 136, "IQ4_XS block must be 136 bytes");

const TypeTraits *ttype_traits(uint32_t type) {
    switch (type) {
    case MN_TYPE_F32: return &traits_f32;
    case MN_TYPE_F16: return &traits_f16;
    case MN_TYPE_BF16: return &traits_bf16;
    case MN_TYPE_Q8_0: return &traits_q8_0;
    case MN_TYPE_Q4_0: return &traits_q4_0;
    case MN_TYPE_Q4_1: return &traits_q4_1;
    case MN_TYPE_Q5_0: return &traits_q5_0;
    case MN_TYPE_Q5_1: return &traits_q5_1;
    case MN_TYPE_Q2_K: return &traits_q2_k;
    case MN_TYPE_Q3_K: return &traits_q3_k;
    case MN_TYPE_Q4_K: return &traits_q4_k;
    case MN_TYPE_Q5_K: return &traits_q5_k;
    case MN_TYPE_Q6_K: return &traits_q6_k;
    case MN_TYPE_IQ4_NL: return &traits_iq4_nl;
    case MN_TYPE_IQ4_XS: return &traits_iq4_xs;
    default: return NULL;
    }
}

/* GGML type ids as published in the GGUF specification (4, 5 and 31..33
 * were removed or never shipped). */
static const char *const ggml_names[] = {
    [0] = "f32",     [1] = "f16",     [2] = "q4_0",   [3] = "q4_1",  [6] = "q5_0",
    [7] = "q5_1",    [8] = "q8_0",    [9] = "q8_1",   [10] = "q2_k", [11] = "q3_k",
    [12] = "q4_k",   [13] = "q5_k",   [14] = "q6_k",  [15] = "q8_k", [16] = "iq2_xxs",
    [17] = "iq2_xs", [18] = "iq3_xxs", [19] = "iq1_s", [20] = "iq4_nl", [21] = "iq3_s",
    [22] = "iq2_s",  [23] = "iq4_xs", [24] = "i8",    [25] = "i16",  [26] = "i32",
    [27] = "i64",    [28] = "f64",    [29] = "iq1_m", [30] = "bf16", [34] = "tq1_0",
    [35] = "tq2_0",  [39] = "mxfp4",
};

const char *ttype_ggml_name(uint32_t type) {
    if (type >= sizeof ggml_names / sizeof ggml_names[0]) return NULL;
    return ggml_names[type];
}

/* Every supported type, in the order messages list them. */
static const MnType supported[] = {MN_TYPE_F32,  MN_TYPE_F16,  MN_TYPE_BF16, MN_TYPE_Q8_0,   MN_TYPE_Q4_0,
                                   MN_TYPE_Q4_1, MN_TYPE_Q5_0, MN_TYPE_Q5_1, MN_TYPE_Q2_K,   MN_TYPE_Q3_K,
                                   MN_TYPE_Q4_K, MN_TYPE_Q5_K, MN_TYPE_Q6_K, MN_TYPE_IQ4_NL, MN_TYPE_IQ4_XS};

int ttype_from_name(const char *name, MnType *out) {
    for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++) {
        if (strcasecmp(name, ttype_traits(supported[i])->name) == 0) {
            *out = supported[i];
            return MN_OK;
        }
    }
    return MN_EINVAL;
}

const char *ttype_supported_names(void) {
    return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs";
}

int ttype_row_bytes(uint32_t type, uint64_t n_elems, uint64_t *out_bytes) {
    const TypeTraits *t = ttype_traits(type);
    if (t == NULL) return MN_EUNSUPPORTED;
    if (n_elems % t->block_elems != 0) return MN_EFORMAT;
    uint64_t n_blocks = n_elems / t->block_elems;
    if (n_blocks > UINT64_MAX / t->block_bytes) return MN_EFORMAT;
    *out_bytes = n_blocks * t->block_bytes;
    return MN_OK;
}

/* ---- half precision ------------------------------------------------------ */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float mn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf / nan */
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* subnormal: value = mant * 2^-24 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t mn_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan (keep nan quiet and non-zero) */
        return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 | ((abs >> 13) & 0x3ff) : 0));
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65536: inf */
    if (abs < 0x38800000u) {
        /* result is subnormal (or zero): round abs * 2^24 to an integer, ties to even */
        float v = bits_f32(abs) * 0x1p24f;
        float r = nearbyintf(v); /* default rounding mode: nearest even */
        return (uint16_t)(sign | (uint32_t)r);
    }
    uint32_t mant = abs & 0x7fffff;
    uint32_t exp = (abs >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* carries into exponent correctly */
    return (uint16_t)(sign | h);
}

float mn_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t mn_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- reference dequantization --------------------------------------------- */

/* Sub-block j's 6-bit scale and min of a Q4_K/Q5_K super-block: scales and
 * mins 0..3 are the low 6 bits of bytes 0..3 and 4..7; 4..7 have their low
 * 4 bits in the nibbles of bytes 8..11 (scale low, min high) and their top
 * 2 bits in the top bits of bytes 0..3 (scales) and 4..7 (mins). */
static void k4_scale_min(const uint8_t sc[12], int j, int *scale, int *min) {
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0x0f) | (sc[j - 4] >> 6) << 4;
        *min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
    }
}

/* Sub-block i's biased 6-bit scale of a Q3_K super-block: the low 4 bits
 * in the nibbles of bytes 0..7 (i < 8: low nibble of byte i, else high
 * nibble of byte i - 8), the top 2 bits in bits 2(i/4).. of byte 8 + i%4. */
static int k3_scale(const uint8_t sc[12], int i) {
    int lo = i < 8 ? sc[i] & 0x0f : sc[i - 8] >> 4;
    int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    return lo | hi << 4;
}

static uint32_t le32_at(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Element j (0..31) of a block whose low 4 bits are nibbles as Q4_0's. */
static int nibble(const uint8_t *qs, int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; }

static void dequant_q4_1(const BlockQ4_1 *x, float *y) {
    float d = mn_f16_to_f32(x->d), m = mn_f16_to_f32(x->m);
    for (int j = 0; j < MN_QK; j++) y[j] = d * (float)nibble(x->qs, j) + m;
}

static void dequant_q5_0(const BlockQ5_0 *x, float *y) {
    float d = mn_f16_to_f32(x->d);
    uint32_t qh = le32_at(x->qh);
    for (int j = 0; j < MN_QK; j++) y[j] = d * (float)((nibble(x->qs, j) | (int)((qh >> j) & 1) << 4) - 16);
}

static void dequant_q5_1(const BlockQ5_1 *x, float *y) {
    float d = mn_f16_to_f32(x->d), m = mn_f16_to_f32(x->m);
    uint32_t qh = le32_at(x->qh);
    for (int j = 0; j < MN_QK; j++) y[j] = d * (float)(nibble(x->qs, j) | (int)((qh >> j) & 1) << 4) + m;
}

static void dequant_iq4_nl(const BlockIQ4_NL *x, float *y) {
    float d = mn_f16_to_f32(x->d);
    for (int j = 0; j < MN_QK; j++) y[j] = d * (float)mn_iq4_values[nibble(x->qs, j)];
}

int ttype_kscales(MnType type, const void *blk, float *a, float *c) {
    switch (type) {
    case MN_TYPE_Q2_K: {
        const BlockQ2_K *x = blk;
        float d = mn_f16_to_f32(x->d), ndmin = -mn_f16_to_f32(x->dmin);
        for (int s = 0; s < 16; s++) {
            a[s] = d * (float)(x->scales[s] & 0x0f);
            c[s] = ndmin * (float)(x->scales[s] >> 4);
        }
        return 16;
    }
    case MN_TYPE_Q3_K: {
        const BlockQ3_K *x = blk;
        float d = mn_f16_to_f32(x->d);
        for (int s = 0; s < 16; s++) a[s] = d * (float)(k3_scale(x->scales, s) - 32);
        return 16;
    }
    case MN_TYPE_Q4_K:
    case MN_TYPE_Q5_K: {
        /* the two layouts start alike: d, dmin, scales[12] */
        const BlockQ4_K *x = blk;
        float d = mn_f16_to_f32(x->d), ndmin = -mn_f16_to_f32(x->dmin);
        for (int s = 0; s < 8; s++) {
            int sc, mn;
            k4_scale_min(x->scales, s, &sc, &mn);
            a[s] = d * (float)sc;
            c[s] = ndmin * (float)mn;
        }
        return 8;
    }
    case MN_TYPE_Q6_K: {
        const BlockQ6_K *x = blk;
        float d = mn_f16_to_f32(x->d);
        for (int s = 0; s < 16; s++) a[s] = d * (float)x->scales[s];
        return 16;
    }
    case MN_TYPE_IQ4_XS: {
        const BlockIQ4_XS *x = blk;
        float d = mn_f16_to_f32(x->d);
        for (int s = 0; s < 8; s++) {
            int ls = ((x->scales_l[s / 2] >> (4 * (s % 2))) & 0x0f) | ((x->scales_h >> (2 * s)) & 3) << 4;
            a[s] = d * (float)(ls - 32);
        }
        return 8;
    }
    default: assert(!"not a K-quant"); return 0;
    }
}
_Static_assert(offsetof(BlockQ4_K, scales) == offsetof(BlockQ5_K, scales), "Q4_K and Q5_K share their header");

/* Q2_K and Q3_K share the placement of the 2-bit codes: sub-block s (16
 * elements; s = 8h + 2j + u) reads bits 2j.. of qs[32h + 16u + l]. */
static int k2_code(const uint8_t *qs, int s, int l) { return (qs[32 * (s / 8) + 16 * (s % 2) + l] >> (2 * (s % 8 / 2))) & 3; }

/* Q4_K and Q5_K: sub-block s (32 elements) reads the low (s even) or high
 * nibbles of qs[32(s/2) .. 32(s/2) + 31]. */
static int k4_code(const uint8_t *qs, int s, int l) { return (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f; }

/* Element l of sub-block s as an integer code, for every K-quant type. */
static int kcode(MnType type, const void *blk, int s, int l) {
    switch (type) {
    case MN_TYPE_Q2_K: return k2_code(((const BlockQ2_K *)blk)->qs, s, l);
    case MN_TYPE_Q3_K: {
        const BlockQ3_K *x = blk;
        int bit = 4 * (s / 8) + s % 8 / 2; /* hmask bit of element 128h + 32j + l: 4h + j */
        return k2_code(x->qs, s, l) - ((x->hmask[16 * (s % 2) + l] >> bit) & 1 ? 0 : 4);
    }
    case MN_TYPE_Q4_K: return k4_code(((const BlockQ4_K *)blk)->qs, s, l);
    case MN_TYPE_Q5_K: {
        const BlockQ5_K *x = blk;
        return k4_code(x->qs, s, l) | ((x->qh[l] >> s) & 1) << 4;
    }
    case MN_TYPE_Q6_K: {
        const BlockQ6_K *x = blk;
        int h = s / 8, j = s % 8 / 2, i = 16 * (s % 2) + l; /* element 128h + 32j + i */
        int lo = (x->ql[64 * h + 32 * (j & 1) + i] >> (4 * (j / 2))) & 0x0f;
        int hi = (x->qh[32 * h + i] >> (2 * j)) & 3;
        return (lo | hi << 4) - 32;
    }
    case MN_TYPE_IQ4_XS: return mn_iq4_values[nibble(((const BlockIQ4_XS *)blk)->qs + 16 * s, l)];
    default: assert(!"not a K-quant"); return 0;
    }
}

static void dequant_k(MnType type, const void *blk, float *y) {
    float a[16], c[16];
    int n_sub = ttype_kscales(type, blk, a, c), sub = MN_QK_K / n_sub;
    bool has_min = type == MN_TYPE_Q2_K || type == MN_TYPE_Q4_K || type == MN_TYPE_Q5_K;
    for (int s = 0; s < n_sub; s++)
        for (int l = 0; l < sub; l++) {
            float v = a[s] * (float)kcode(type, blk, s, l);
            y[s * sub + l] = has_min ? v + c[s] : v;
        }
}

static void dequant_q8_0(const BlockQ8_0 *x, float *y) {
    float d = mn_f16_to_f32(x->d);
    for (int j = 0; j < MN_QK8_0; j++) y[j] = d * (float)x->qs[j];
}

static void dequant_q4_0(const BlockQ4_0 *x, float *y) {
    float d = mn_f16_to_f32(x->d);
    for (int j = 0; j < MN_QK4_0; j++) y[j] = d * (float)(nibble(x->qs, j) - 8);
}

void ttype_dequantize_row(MnType type, const void *src, float *dst, int64_t n) {
    const TypeTraits *t = ttype_traits(type);
    assert(t != NULL && n % (int64_t)t->block_elems == 0);
    const uint8_t *b = src;
    int64_t be = (int64_t)t->block_elems;
    switch (type) {
    case MN_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return;
    case MN_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = mn_f16_to_f32(((const uint16_t *)src)[i]);
        return;
    case MN_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = mn_bf16_to_f32(((const uint16_t *)src)[i]);
        return;
    default: break;
    }
    for (int64_t k = 0; k < n; k += be, b += t->block_bytes) {
        float *y = dst + k;
        switch (type) {
        case MN_TYPE_Q8_0: dequant_q8_0((const BlockQ8_0 *)b, y); break;
        case MN_TYPE_Q4_0: dequant_q4_0((const BlockQ4_0 *)b, y); break;
        case MN_TYPE_Q4_1: dequant_q4_1((const BlockQ4_1 *)b, y); break;
        case MN_TYPE_Q5_0: dequant_q5_0((const BlockQ5_0 *)b, y); break;
        case MN_TYPE_Q5_1: dequant_q5_1((const BlockQ5_1 *)b, y); break;
        case MN_TYPE_IQ4_NL: dequant_iq4_nl((const BlockIQ4_NL *)b, y); break;
        case MN_TYPE_Q2_K:
        case MN_TYPE_Q3_K:
        case MN_TYPE_Q4_K:
        case MN_TYPE_Q5_K:
        case MN_TYPE_Q6_K:
        case MN_TYPE_IQ4_XS: dequant_k(type, b, y); break;
        default: assert(!"not a quantized type"); return;
        }
    }
}

/* ---- reference quantization ---------------------------------------------- */

/* The quantizers below only need to write valid blocks close to their
 * input: gen-model's random models and the tests use them. Scales are
 * rounded to f16 (and sub-block scales to their integers) before the codes
 * are chosen, so every code is the nearest one under the stored scales. */

/* The signed value of largest magnitude of x[0..n). */
static float signed_amax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* round(v / a) clamped to [lo, hi] (0, clamped, when a is 0). */
static int code_of(float v, float a, int lo, int hi) {
    float t = a != 0.0f ? v / a : 0.0f;
    if (!(t > (float)lo)) return t == t ? lo : clampi(0, lo, hi); /* NaN: 0 */
    if (t >= (float)hi) return hi;
    return (int)lrintf(t);
}

/* Index of the IQ4 level nearest v / a. */
static int iq4_code(float v, float a) {
    if (a == 0.0f) return 8; /* level 1 of 127: value ~0 */
    float t = v / a;
    int best = 0;
    for (int i = 1; i < 16; i++)
        if (fabsf(t - (float)mn_iq4_values[i]) < fabsf(t - (float)mn_iq4_values[best])) best = i;
    return best;
}

static void quantize_q8_0(const float *x, BlockQ8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < MN_QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = mn_f32_to_f16(d);
    for (int j = 0; j < MN_QK8_0; j++) y->qs[j] = (int8_t)roundf(x[j] * id);
}

static void quantize_q4_0(const float *x, BlockQ4_0 *y) {
    float d = signed_amax(x, MN_QK4_0) / -8.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = mn_f32_to_f16(d);
    for (int j = 0; j < MN_QK4_0 / 2; j++) {
        int q0 = (int)(x[j] * id + 8.5f);
        int q1 = (int)(x[j + MN_QK4_0 / 2] * id + 8.5f);
        q0 = q0 > 15 ? 15 : q0;
        q1 = q1 > 15 ? 15 : q1;
        y->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* Nibbles of 32 codes, placed as Q4_0's. */
static void put_nibbles(uint8_t *qs, const int *q) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
}

/* Q4_1 / Q5_1: the block's min and (max - min) / levels. */
static void quantize_minmax32(const float *x, int levels, uint16_t *dh, uint16_t *mh, int *q) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < MN_QK; j++) {
        mn = fminf(mn, x[j]);
        mx = fmaxf(mx, x[j]);
    }
    *dh = mn_f32_to_f16((mx - mn) / (float)levels);
    *mh = mn_f32_to_f16(mn);
    float d = mn_f16_to_f32(*dh), m = mn_f16_to_f32(*mh);
    for (int j = 0; j < MN_QK; j++) q[j] = code_of(x[j] - m, d, 0, levels);
}

static void quantize_q4_1(const float *x, BlockQ4_1 *y) {
    int q[MN_QK];
    quantize_minmax32(x, 15, &y->d, &y->m, q);
    put_nibbles(y->qs, q);
}

static void put_q5(uint8_t *qs, uint8_t qh[4], const int *q) {
    uint32_t h = 0;
    for (int j = 0; j < MN_QK; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(h >> (8 * i));
    put_nibbles(qs, q);
}

static void quantize_q5_0(const float *x, BlockQ5_0 *y) {
    y->d = mn_f32_to_f16(signed_amax(x, MN_QK) / -16.0f);
    float d = mn_f16_to_f32(y->d);
    int q[MN_QK];
    for (int j = 0; j < MN_QK; j++) q[j] = code_of(x[j], d, -16, 15) + 16;
    put_q5(y->qs, y->qh, q);
}

static void quantize_q5_1(const float *x, BlockQ5_1 *y) {
    int q[MN_QK];
    quantize_minmax32(x, 31, &y->d, &y->m, q);
    put_q5(y->qs, y->qh, q);
}

static void quantize_iq4_nl(const float *x, BlockIQ4_NL *y) {
    y->d = mn_f32_to_f16(signed_amax(x, MN_QK) / -127.0f);
    float d = mn_f16_to_f32(y->d);
    int q[MN_QK];
    for (int j = 0; j < MN_QK; j++) q[j] = iq4_code(x[j], d);
    put_nibbles(y->qs, q);
}

/* K-quants with a min (Q2_K, Q4_K, Q5_K): n_sub sub-blocks of x, each with
 * scale (max - min) / levels and min min(0, smallest); both quantized to
 * sc_max steps of the super-block's d and dmin. Writes the f16 d and dmin,
 * the integer scales and mins, and the codes. */
static void quantize_kmin(const float *x, int n_sub, int levels, int sc_max, uint16_t *dh, uint16_t *dminh,
                          int *sc, int *mn, int *q) {
    int sub = MN_QK_K / n_sub;
    float scale[16], min[16], max_scale = 0.0f, max_min = 0.0f;
    for (int s = 0; s < n_sub; s++) {
        float lo = 0.0f, hi = x[s * sub];
        for (int l = 0; l < sub; l++) {
            lo = fminf(lo, x[s * sub + l]);
            hi = fmaxf(hi, x[s * sub + l]);
        }
        scale[s] = (hi - lo) / (float)levels;
        min[s] = -lo;
        max_scale = fmaxf(max_scale, scale[s]);
        max_min = fmaxf(max_min, min[s]);
    }
    *dh = mn_f32_to_f16(max_scale / (float)sc_max);
    *dminh = mn_f32_to_f16(max_min / (float)sc_max);
    float d = mn_f16_to_f32(*dh), dmin = mn_f16_to_f32(*dminh);
    for (int s = 0; s < n_sub; s++) {
        sc[s] = code_of(scale[s], d, 0, sc_max);
        mn[s] = code_of(min[s], dmin, 0, sc_max);
        float dl = d * (float)sc[s], ml = dmin * (float)mn[s];
        for (int l = 0; l < sub; l++) q[s * sub + l] = code_of(x[s * sub + l] + ml, dl, 0, levels);
    }
}

/* Q2_K and Q3_K: the 2-bit codes of 16 sub-blocks of 16, placed. */
static void put_k2(uint8_t qs[64], const int *q) {
    memset(qs, 0, 64);
    for (int s = 0; s < 16; s++)
        for (int l = 0; l < 16; l++)
            qs[32 * (s / 8) + 16 * (s % 2) + l] |= (uint8_t)((q[16 * s + l] & 3) << (2 * (s % 8 / 2)));
}

static void quantize_q2_k(const float *x, BlockQ2_K *y) {
    int sc[16], mn[16], q[MN_QK_K];
    quantize_kmin(x, 16, 3, 15, &y->d, &y->dmin, sc, mn, q);
    for (int s = 0; s < 16; s++) y->scales[s] = (uint8_t)(sc[s] | mn[s] << 4);
    put_k2(y->qs, q);
}

/* The 12 bytes of Q4_K/Q5_K scales and mins (the inverse of k4_scale_min). */
static void put_k4_scales(uint8_t out[12], const int *sc, const int *mn) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        out[j + 4] = (uint8_t)((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
        out[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | (mn[j + 4] & 0x0f) << 4);
    }
}

static void put_k4_codes(uint8_t qs[128], const int *q) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) qs[32 * g + l] = (uint8_t)((q[64 * g + l] & 0x0f) | (q[64 * g + 32 + l] & 0x0f) << 4);
}

static void quantize_q4_k(const float *x, BlockQ4_K *y) {
    int sc[8], mn[8], q[MN_QK_K];
    quantize_kmin(x, 8, 15, 63, &y->d, &y->dmin, sc, mn, q);
    put_k4_scales(y->scales, sc, mn);
    put_k4_codes(y->qs, q);
}

static void quantize_q5_k(const float *x, BlockQ5_K *y) {
    int sc[8], mn[8], q[MN_QK_K];
    quantize_kmin(x, 8, 31, 63, &y->d, &y->dmin, sc, mn, q);
    put_k4_scales(y->scales, sc, mn);
    put_k4_codes(y->qs, q);
    memset(y->qh, 0, sizeof y->qh);
    for (int s = 0; s < 8; s++)
        for (int l = 0; l < 32; l++) y->qh[l] |= (uint8_t)(((q[32 * s + l] >> 4) & 1) << s);
}

/* Symmetric sub-block scales (Q3_K, Q6_K, IQ4_XS): each sub-block's scale
 * maps its value of largest magnitude to the level `lowest` (negative);
 * the scales are quantized to sc_max steps of the super-block's d.
 * Writes d (f16) and the signed integer scales. */
static void quantize_ksym(const float *x, int n_sub, float lowest, int sc_max, uint16_t *dh, int *sc) {
    int sub = MN_QK_K / n_sub;
    float scale[16], amax = 0.0f;
    for (int s = 0; s < n_sub; s++) {
        scale[s] = signed_amax(x + s * sub, sub) / lowest;
        amax = fmaxf(amax, fabsf(scale[s]));
    }
    *dh = mn_f32_to_f16(amax / (float)sc_max);
    float d = mn_f16_to_f32(*dh);
    for (int s = 0; s < n_sub; s++) sc[s] = code_of(scale[s], d, -sc_max, sc_max);
}

static void quantize_q3_k(const float *x, BlockQ3_K *y) {
    int sc[16], q[MN_QK_K];
    quantize_ksym(x, 16, -4.0f, 31, &y->d, sc);
    float d = mn_f16_to_f32(y->d);
    memset(y->hmask, 0, sizeof y->hmask);
    memset(y->scales, 0, sizeof y->scales);
    for (int s = 0; s < 16; s++) {
        int u = sc[s] + 32; /* biased 6-bit scale */
        y->scales[s % 8] |= (uint8_t)((u & 0x0f) << (4 * (s / 8)));
        y->scales[8 + s % 4] |= (uint8_t)((u >> 4) << (2 * (s / 4)));
        float dl = d * (float)sc[s];
        int bit = 4 * (s / 8) + s % 8 / 2;
        for (int l = 0; l < 16; l++) {
            int c = code_of(x[16 * s + l], dl, -4, 3) + 4; /* 0..7: bit 2 is the hmask bit */
            q[16 * s + l] = c;
            y->hmask[16 * (s % 2) + l] |= (uint8_t)((c >> 2) << bit);
        }
    }
    put_k2(y->qs, q);
}

static void quantize_q6_k(const float *x, BlockQ6_K *y) {
    int sc[16];
    quantize_ksym(x, 16, -32.0f, 127, &y->d, sc);
    float d = mn_f16_to_f32(y->d);
    memset(y->ql, 0, sizeof y->ql);
    memset(y->qh, 0, sizeof y->qh);
    for (int s = 0; s < 16; s++) {
        y->scales[s] = (int8_t)sc[s];
        int h = s / 8, j = s % 8 / 2, u = s % 2;
        float dl = d * (float)sc[s];
        for (int l = 16 * u; l < 16 * u + 16; l++) {
            int c = code_of(x[16 * s + l - 16 * u], dl, -32, 31) + 32;
            y->ql[64 * h + 32 * (j & 1) + l] |= (uint8_t)((c & 0x0f) << (4 * (j / 2)));
            y->qh[32 * h + l] |= (uint8_t)((c >> 4) << (2 * j));
        }
    }
}

static void quantize_iq4_xs(const float *x, BlockIQ4_XS *y) {
    int sc[8];
    quantize_ksym(x, 8, -127.0f, 31, &y->d, sc);
    float d = mn_f16_to_f32(y->d);
    y->scales_h = 0;
    memset(y->scales_l, 0, sizeof y->scales_l);
    for (int s = 0; s < 8; s++) {
        int ls = sc[s] + 32;
        y->scales_l[s / 2] |= (uint8_t)((ls & 0x0f) << (4 * (s % 2)));
        y->scales_h |= (uint16_t)((ls >> 4) << (2 * s));
        float dl = d * (float)sc[s];
        int q[32];
        for (int j = 0; j < 32; j++) q[j] = iq4_code(x[32 * s + j], dl);
        put_nibbles(y->qs + 16 * s, q);
    }
}

void ttype_quantize_row(MnType type, const float *src, void *dst, int64_t n) {
    const TypeTraits *t = ttype_traits(type);
    assert(t != NULL && n % (int64_t)t->block_elems == 0);
    switch (type) {
    case MN_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return;
    case MN_TYPE_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = mn_f32_to_f16(src[i]);
        return;
    case MN_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = mn_f32_to_bf16(src[i]);
        return;
    default: break;
    }
    uint8_t *b = dst;
    int64_t be = (int64_t)t->block_elems;
    for (int64_t k = 0; k < n; k += be, b += t->block_bytes) {
        const float *x = src + k;
        switch (type) {
        case MN_TYPE_Q8_0: quantize_q8_0(x, (BlockQ8_0 *)b); break;
        case MN_TYPE_Q4_0: quantize_q4_0(x, (BlockQ4_0 *)b); break;
        case MN_TYPE_Q4_1: quantize_q4_1(x, (BlockQ4_1 *)b); break;
        case MN_TYPE_Q5_0: quantize_q5_0(x, (BlockQ5_0 *)b); break;
        case MN_TYPE_Q5_1: quantize_q5_1(x, (BlockQ5_1 *)b); break;
        case MN_TYPE_Q2_K: quantize_q2_k(x, (BlockQ2_K *)b); break;
        case MN_TYPE_Q3_K: quantize_q3_k(x, (BlockQ3_K *)b); break;
        case MN_TYPE_Q4_K: quantize_q4_k(x, (BlockQ4_K *)b); break;
        case MN_TYPE_Q5_K: quantize_q5_k(x, (BlockQ5_K *)b); break;
        case MN_TYPE_Q6_K: quantize_q6_k(x, (BlockQ6_K *)b); break;
        case MN_TYPE_IQ4_NL: quantize_iq4_nl(x, (BlockIQ4_NL *)b); break;
        case MN_TYPE_IQ4_XS: quantize_iq4_xs(x, (BlockIQ4_XS *)b); break;
        default: assert(!"not a quantized type"); return;
        }
    }
}
