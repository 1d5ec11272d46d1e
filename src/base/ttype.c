/* ttype.c — tensor element types: traits, half-precision conversions and the
 * reference quantize / dequantize (see ttype.h). Portable scalar code only;
 * these are the oracle the SIMD kernels in src/compute/ are tested against.
 */
#include "base/ttype.h"

#include <assert.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "base/err.h"

/* ---- traits ------------------------------------------------------------- */

static const TypeTraits traits_f32 = {"f32", 1, 4, false};
static const TypeTraits traits_f16 = {"f16", 1, 2, false};
static const TypeTraits traits_bf16 = {"bf16", 1, 2, false};
static const TypeTraits traits_q8_0 = {"q8_0", MN_QK8_0, sizeof(BlockQ8_0), true};
static const TypeTraits traits_q4_0 = {"q4_0", MN_QK4_0, sizeof(BlockQ4_0), true};

_Static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");
_Static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must be 18 bytes");

const TypeTraits *ttype_traits(uint32_t type) {
    switch (type) {
    case MN_TYPE_F32: return &traits_f32;
    case MN_TYPE_F16: return &traits_f16;
    case MN_TYPE_BF16: return &traits_bf16;
    case MN_TYPE_Q8_0: return &traits_q8_0;
    case MN_TYPE_Q4_0: return &traits_q4_0;
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

int ttype_from_name(const char *name, MnType *out) {
    static const MnType all[] = {MN_TYPE_F32, MN_TYPE_F16, MN_TYPE_BF16, MN_TYPE_Q8_0, MN_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcasecmp(name, ttype_traits(all[i])->name) == 0) {
            *out = all[i];
            return MN_OK;
        }
    }
    return MN_EINVAL;
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

/* ---- reference quantization ---------------------------------------------- */

static void quantize_q8_0(const float *x, BlockQ8_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / MN_QK8_0; b++) {
        const float *xb = x + b * MN_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < MN_QK8_0; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = mn_f32_to_f16(d);
        for (int j = 0; j < MN_QK8_0; j++) y[b].qs[j] = (int8_t)roundf(xb[j] * id);
    }
}

static void quantize_q4_0(const float *x, BlockQ4_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / MN_QK4_0; b++) {
        const float *xb = x + b * MN_QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < MN_QK4_0; j++) {
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = mn_f32_to_f16(d);
        for (int j = 0; j < MN_QK4_0 / 2; j++) {
            int q0 = (int)(xb[j] * id + 8.5f);
            int q1 = (int)(xb[j + MN_QK4_0 / 2] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void ttype_quantize_row(MnType type, const float *src, void *dst, int64_t n) {
    switch (type) {
    case MN_TYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case MN_TYPE_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = mn_f32_to_f16(src[i]);
        break;
    case MN_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = mn_f32_to_bf16(src[i]);
        break;
    case MN_TYPE_Q8_0: assert(n % MN_QK8_0 == 0); quantize_q8_0(src, dst, n); break;
    case MN_TYPE_Q4_0: assert(n % MN_QK4_0 == 0); quantize_q4_0(src, dst, n); break;
    }
}

void ttype_dequantize_row(MnType type, const void *src, float *dst, int64_t n) {
    switch (type) {
    case MN_TYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case MN_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = mn_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case MN_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = mn_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case MN_TYPE_Q8_0: {
        const BlockQ8_0 *x = src;
        for (int64_t b = 0; b < n / MN_QK8_0; b++) {
            float d = mn_f16_to_f32(x[b].d);
            for (int j = 0; j < MN_QK8_0; j++) dst[b * MN_QK8_0 + j] = d * (float)x[b].qs[j];
        }
        break;
    }
    case MN_TYPE_Q4_0: {
        const BlockQ4_0 *x = src;
        for (int64_t b = 0; b < n / MN_QK4_0; b++) {
            float d = mn_f16_to_f32(x[b].d);
            for (int j = 0; j < MN_QK4_0 / 2; j++) {
                dst[b * MN_QK4_0 + j] = d * (float)((x[b].qs[j] & 0x0f) - 8);
                dst[b * MN_QK4_0 + j + MN_QK4_0 / 2] = d * (float)((x[b].qs[j] >> 4) - 8);
            }
        }
        break;
    }
    }
}
