/* ops.c — see ops.h. Plain C written so that GCC vectorizes the lane loops;
 * F16C intrinsics for half-precision rows when the target has them. */
#include "compute/ops.h"

#include <math.h>

#include "base/ttype.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif
#if defined(__F16C__) && defined(__AVX__)
#define OPS_HAVE_F16C 1
#endif

void ops_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    /* the sum of squares in double, in index order (as GGML does), so the
     * scale is as close to exact as the inputs allow */
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* Rotate pair (i0, i1) of each of n_heads heads by (c, s). */
static void rope_pair(float *x, int n_heads, int head_dim, int i0, int i1, float c, float s) {
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (long)h * head_dim;
        float a = xh[i0], b = xh[i1];
        xh[i0] = a * c - b * s;
        xh[i1] = a * s + b * c;
    }
}

void ops_rope(float *x, int n_heads, int head_dim, int n_rot, const double *inv_freq, int32_t pos, float mscale,
              int adjacent) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * inv_freq[i];
        float c = (float)(cos(theta) * mscale), s = (float)(sin(theta) * mscale);
        rope_pair(x, n_heads, head_dim, adjacent ? 2 * i : i, adjacent ? 2 * i + 1 : i + half, c, s);
    }
}

void ops_rope_angles(float *cs, int n_rot, const double *inv_freq, int32_t pos) {
    for (int i = 0; i < n_rot / 2; i++) {
        double theta = (double)pos * inv_freq[i];
        cs[2 * i] = (float)cos(theta);
        cs[2 * i + 1] = (float)sin(theta);
    }
}

void ops_rope_apply(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int adjacent) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++)
        rope_pair(x, n_heads, head_dim, adjacent ? 2 * i : i, adjacent ? 2 * i + 1 : i + half, cs[2 * i], cs[2 * i + 1]);
}

void ops_swiglu(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void ops_geglu(float *out, const float *gate, const float *up, int n) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
    }
}

void ops_softcap(float *x, float cap, int n) {
    for (int i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void ops_scale(float *x, float s, int n) {
    for (int i = 0; i < n; i++) x[i] *= s;
}

void ops_add(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

void ops_f32_to_f16(uint16_t *dst, const float *src, int n) {
    int i = 0;
#ifdef OPS_HAVE_F16C
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        __m128i h = _mm_cvtps_ph(_mm_set_ss(src[i]), _MM_FROUND_TO_NEAREST_INT);
        dst[i] = (uint16_t)_mm_extract_epi16(h, 0);
    }
#else
    for (; i < n; i++) dst[i] = mn_f32_to_f16(src[i]);
#endif
}

void ops_f16_to_f32(float *dst, const uint16_t *src, int n) {
    int i = 0;
#ifdef OPS_HAVE_F16C
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = mn_f16_to_f32(src[i]);
}
