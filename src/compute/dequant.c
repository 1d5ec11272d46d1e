/* dequant.c — vectorized exact dequantization of weight blocks (see
 * dequant.h).
 *
 * How it fits: matmul.c's kernel for the types without a kernel of their
 * own (all quantized types but Q8_0 and Q4_0) calls dq_row for one
 * super-block (256 elements) of each row of a tile, into a buffer in L1,
 * and multiplies that like float weights. Stateless; any thread may call it.
 *
 * Exactness, the invariant: every value written equals ttype_dequantize_row's
 * bit for bit. A weight is a * q (+ c) in f32, a the product of the block's
 * f16 scale and a sub-block's integer scale (ttype_kscales for the K-quants,
 * so the scales are the reference's own), q an integer code of at most 8
 * bits, c an offset (-(dmin * min), or Q4_1/Q5_1's min). a * q is exact in
 * f32, so the SIMD forms used here — fma(q, a, c), a table of a * i + c
 * indexed by q, mul(q, a) — all round once, where the reference does, to
 * the same value; types without an offset never add one (adding +0 would
 * turn a -0 into +0). test_matmul compares every type's output with the
 * reference bit for bit.
 *
 * AVX-512: the 4- and 5-bit types look their codes up in a table of the 16
 * (vpermps) or 32 (vpermt2ps) values of a sub-block, built with one FMA;
 * Q2_K and Q3_K do the same with tables repeated every 4 or 8 entries, so
 * a code's neighbouring bits need no masking; Q6_K and Q8_0 convert codes
 * to float and multiply. AVX2 converts every code and multiplies (or FMAs
 * the offset). The scalar path is the reference itself.
 */
#include "compute/dequant.h"

#include <assert.h>
#include <stdbool.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__) && \
    defined(__F16C__)
#define DQ_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DQ_AVX2 1
#endif

#if defined(DQ_AVX512) || defined(DQ_AVX2)
#include <immintrin.h>

#define DQ_INLINE static inline __attribute__((always_inline))

static inline float f16_at(const uint16_t *h) { return _cvtsh_ss(*h); }

static inline uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
#endif

/* ========================================================================
 * AVX-512
 * ===================================================================== */
#if defined(DQ_AVX512)

/* 16 bytes widened to 16 lanes; vpermps reads the low 4 bits of a lane, so
 * the lanes index a table by their low nibbles as they are, and by their
 * high nibbles after a shift by 4. */
DQ_INLINE __m512i bytes16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }

DQ_INLINE __m512 iota16(void) { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

DQ_INLINE __m512 iq4_levels(void) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)mn_iq4_values)));
}

/* table[i] = a * i + c for the 16 or 32 codes of a sub-block. */
DQ_INLINE __m512 table16(float a, float c) { return _mm512_fmadd_ps(iota16(), _mm512_set1_ps(a), _mm512_set1_ps(c)); }

/* Codes 16..31: the second half of a 5-bit table. */
DQ_INLINE __m512 table16_hi(float a, float c) {
    return _mm512_fmadd_ps(_mm512_add_ps(iota16(), _mm512_set1_ps(16.0f)), _mm512_set1_ps(a), _mm512_set1_ps(c));
}

/* 32 elements whose low 4 bits are nibbles as Q4_0's (qs[16]) and whose
 * bit 4 is in hbits (bit j = element j), looked up in the 32-entry table
 * (t0: codes 0..15, t1: 16..31). */
DQ_INLINE void q5_block(const uint8_t *qs, uint32_t hbits, __m512 t0, __m512 t1, float *y) {
    __m512i e = bytes16(qs), v16 = _mm512_set1_epi32(16);
    __m512i lo = _mm512_and_si512(e, _mm512_set1_epi32(0x0f)), hi = _mm512_srli_epi32(e, 4);
    lo = _mm512_mask_or_epi32(lo, (__mmask16)hbits, lo, v16);
    hi = _mm512_mask_or_epi32(hi, (__mmask16)(hbits >> 16), hi, v16);
    _mm512_storeu_ps(y, _mm512_permutex2var_ps(t0, lo, t1));
    _mm512_storeu_ps(y + 16, _mm512_permutex2var_ps(t0, hi, t1));
}

/* 32 elements of nibbles as Q4_0's, looked up in a 16-entry table. */
DQ_INLINE void q4_block(const uint8_t *qs, __m512 t, float *y) {
    __m512i e = bytes16(qs);
    _mm512_storeu_ps(y, _mm512_permutexvar_ps(e, t));
    _mm512_storeu_ps(y + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(e, 4), t));
}

static void dq_q4_0(const BlockQ4_0 *x, float *y) {
    q4_block(x->qs, _mm512_mul_ps(_mm512_set1_ps(f16_at(&x->d)), _mm512_sub_ps(iota16(), _mm512_set1_ps(8.0f))), y);
}

static void dq_q8_0(const BlockQ8_0 *x, float *y) {
    __m512 d = _mm512_set1_ps(f16_at(&x->d));
    for (int h = 0; h < 2; h++) {
        __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x->qs + 16 * h)));
        _mm512_storeu_ps(y + 16 * h, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q)));
    }
}

static void dq_q4_1(const BlockQ4_1 *x, float *y) { q4_block(x->qs, table16(f16_at(&x->d), f16_at(&x->m)), y); }

static void dq_iq4_nl(const BlockIQ4_NL *x, float *y) {
    q4_block(x->qs, _mm512_mul_ps(_mm512_set1_ps(f16_at(&x->d)), iq4_levels()), y);
}

static void dq_q5_0(const BlockQ5_0 *x, float *y) {
    float d = f16_at(&x->d);
    /* d * (q - 16): codes 0..15 are -16..-1 times d */
    __m512 t0 = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_sub_ps(iota16(), _mm512_set1_ps(16.0f)));
    __m512 t1 = _mm512_mul_ps(_mm512_set1_ps(d), iota16());
    q5_block(x->qs, u32_at(x->qh), t0, t1, y);
}

static void dq_q5_1(const BlockQ5_1 *x, float *y) {
    float d = f16_at(&x->d), m = f16_at(&x->m);
    q5_block(x->qs, u32_at(x->qh), table16(d, m), table16_hi(d, m), y);
}

/* Q2_K: sub-block s = 8h + 2j + u (16 elements) holds bits 2j.. of
 * qs[32h + 16u + l]; the table repeats its 4 values, so the bits above a
 * code do not matter. */
static void dq_q2_k(const BlockQ2_K *x, float *y) {
    float a[16], c[16];
    ttype_kscales(MN_TYPE_Q2_K, x, a, c);
    const __m512 i4 = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    for (int hu = 0; hu < 4; hu++) {
        int h = hu / 2, u = hu % 2;
        __m512i e = bytes16(x->qs + 32 * h + 16 * u);
        for (int j = 0; j < 4; j++) {
            int s = 8 * h + 2 * j + u;
            __m512 t = _mm512_fmadd_ps(i4, _mm512_set1_ps(a[s]), _mm512_set1_ps(c[s]));
            _mm512_storeu_ps(y + 16 * s, _mm512_permutexvar_ps(_mm512_srli_epi32(e, 2 * j), t));
        }
    }
}

/* Q3_K: as Q2_K, with bit 2 of the index the code's high bit (hmask);
 * table[i] = a * (i - 4), repeated every 8 entries (bit 3 is left over). */
static void dq_q3_k(const BlockQ3_K *x, float *y) {
    float a[16];
    ttype_kscales(MN_TYPE_Q3_K, x, a, NULL);
    const __m512 v = _mm512_setr_ps(-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3);
    for (int hu = 0; hu < 4; hu++) {
        int h = hu / 2, u = hu % 2;
        __m512i e = bytes16(x->qs + 32 * h + 16 * u), m = bytes16(x->hmask + 16 * u);
        for (int j = 0; j < 4; j++) {
            int s = 8 * h + 2 * j + u, bit = 4 * h + j;
            /* bits 0..1 from the code, bit 2 (and up) from hmask's bit moved there */
            __m512i hb = bit >= 2 ? _mm512_srli_epi32(m, (unsigned)(bit - 2)) : _mm512_slli_epi32(m, (unsigned)(2 - bit));
            __m512i idx = _mm512_ternarylogic_epi32(_mm512_set1_epi32(3), _mm512_srli_epi32(e, 2 * j), hb, 0xca);
            __m512 t = _mm512_mul_ps(_mm512_set1_ps(a[s]), v);
            _mm512_storeu_ps(y + 16 * s, _mm512_permutexvar_ps(idx, t));
        }
    }
}

/* Q4_K and Q5_K: sub-block s (32 elements) is the low (s even) or high
 * nibbles of qs[32(s/2) ..]; Q5_K's bit 4 is bit s of qh[l]. */
static void dq_q4_k(const BlockQ4_K *x, float *y) {
    float a[8], c[8];
    ttype_kscales(MN_TYPE_Q4_K, x, a, c);
    for (int g = 0; g < 4; g++) {
        __m512 t0 = table16(a[2 * g], c[2 * g]), t1 = table16(a[2 * g + 1], c[2 * g + 1]);
        for (int u = 0; u < 2; u++) {
            __m512i e = bytes16(x->qs + 32 * g + 16 * u);
            _mm512_storeu_ps(y + 64 * g + 16 * u, _mm512_permutexvar_ps(e, t0));
            _mm512_storeu_ps(y + 64 * g + 32 + 16 * u, _mm512_permutexvar_ps(_mm512_srli_epi32(e, 4), t1));
        }
    }
}

static void dq_q5_k(const BlockQ5_K *x, float *y) {
    float a[8], c[8];
    ttype_kscales(MN_TYPE_Q5_K, x, a, c);
    __m128i qh[2] = {_mm_loadu_si128((const __m128i *)x->qh), _mm_loadu_si128((const __m128i *)(x->qh + 16))};
    const __m512i v16 = _mm512_set1_epi32(16), low4 = _mm512_set1_epi32(0x0f);
    for (int s = 0; s < 8; s++) {
        __m512 t0 = table16(a[s], c[s]), t1 = table16_hi(a[s], c[s]);
        for (int u = 0; u < 2; u++) {
            __m512i e = bytes16(x->qs + 32 * (s / 2) + 16 * u);
            __m512i idx = s % 2 == 0 ? _mm512_and_si512(e, low4) : _mm512_srli_epi32(e, 4);
            __mmask16 hb = _mm_test_epi8_mask(qh[u], _mm_set1_epi8((char)(1 << s)));
            idx = _mm512_mask_or_epi32(idx, hb, idx, v16);
            _mm512_storeu_ps(y + 32 * s + 16 * u, _mm512_permutex2var_ps(t0, idx, t1));
        }
    }
}

/* Q6_K: codes of 6 bits, converted and multiplied; sub-block s = 8h + 2j
 * + u (16 elements), element l of it: low bits in qs[64h + 32(j & 1) + 16u
 * + l] (high nibble when j >= 2), high bits 2j.. of qh[32h + 16u + l]. */
static void dq_q6_k(const BlockQ6_K *x, float *y) {
    float a[16];
    ttype_kscales(MN_TYPE_Q6_K, x, a, NULL);
    const __m512i low4 = _mm512_set1_epi32(0x0f), hi2 = _mm512_set1_epi32(0x30), v32 = _mm512_set1_epi32(32);
    for (int hu = 0; hu < 4; hu++) {
        int h = hu / 2, u = hu % 2;
        __m512i qh = bytes16(x->qh + 32 * h + 16 * u);
        __m512i ql[2] = {bytes16(x->ql + 64 * h + 16 * u), bytes16(x->ql + 64 * h + 32 + 16 * u)};
        for (int j = 0; j < 4; j++) {
            int s = 8 * h + 2 * j + u;
            __m512i lo = j < 2 ? _mm512_and_si512(ql[j & 1], low4) : _mm512_srli_epi32(ql[j & 1], 4);
            __m512i hb = j < 2 ? _mm512_slli_epi32(qh, 4 - 2 * (unsigned)j) : _mm512_srli_epi32(qh, 2 * (unsigned)j - 4);
            /* lo | (hb & 0x30), then - 32 */
            __m512i q = _mm512_sub_epi32(_mm512_ternarylogic_epi32(lo, hb, hi2, 0xf8), v32);
            _mm512_storeu_ps(y + 16 * s, _mm512_mul_ps(_mm512_set1_ps(a[s]), _mm512_cvtepi32_ps(q)));
        }
    }
}

static void dq_iq4_xs(const BlockIQ4_XS *x, float *y) {
    float a[8];
    ttype_kscales(MN_TYPE_IQ4_XS, x, a, NULL);
    __m512 lv = iq4_levels();
    for (int s = 0; s < 8; s++) q4_block(x->qs + 16 * s, _mm512_mul_ps(_mm512_set1_ps(a[s]), lv), y + 32 * s);
}

/* ========================================================================
 * AVX2: codes widened 8 at a time, converted, multiplied
 * ===================================================================== */
#elif defined(DQ_AVX2)

/* 8 bytes widened to 8 lanes. */
DQ_INLINE __m256i bytes8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* a * q, or a * q + c (one rounding: a * q is exact). */
DQ_INLINE void put8(float *y, __m256i q, float a, const float *c) {
    __m256 qf = _mm256_cvtepi32_ps(q);
    __m256 av = _mm256_set1_ps(a);
    _mm256_storeu_ps(y, c != NULL ? _mm256_fmadd_ps(qf, av, _mm256_set1_ps(*c)) : _mm256_mul_ps(av, qf));
}

DQ_INLINE __m256i low4(__m256i e) { return _mm256_and_si256(e, _mm256_set1_epi32(0x0f)); }

/* Nibble codes of a 32-element group as Q4_0's: element 8i + l. */
DQ_INLINE __m256i nib8(const uint8_t *qs, int i) {
    __m256i e = bytes8(qs + 8 * (i & 1));
    return i < 2 ? low4(e) : _mm256_srli_epi32(e, 4);
}

/* Bits j..j+7 of hbits, one per lane, moved to bit 4. */
DQ_INLINE __m256i hbit8(uint32_t hbits, int j) {
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)(hbits >> j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(1)), 4);
}

/* The 16 IQ4 levels of 16 nibbles, as 16 signed bytes. */
DQ_INLINE __m128i iq4_lookup(__m128i nibbles) {
    return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)mn_iq4_values), nibbles);
}

/* 32 IQ4 elements (nibbles as Q4_0's) times a. */
DQ_INLINE void iq4_block(const uint8_t *qs, float a, float *y) {
    __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0f);
    __m128i lo = iq4_lookup(_mm_and_si128(b, m)), hi = iq4_lookup(_mm_and_si128(_mm_srli_epi16(b, 4), m));
    put8(y, _mm256_cvtepi8_epi32(lo), a, NULL);
    put8(y + 8, _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)), a, NULL);
    put8(y + 16, _mm256_cvtepi8_epi32(hi), a, NULL);
    put8(y + 24, _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)), a, NULL);
}

static void dq_q4_0(const BlockQ4_0 *x, float *y) {
    float d = f16_at(&x->d);
    for (int i = 0; i < 4; i++) put8(y + 8 * i, _mm256_sub_epi32(nib8(x->qs, i), _mm256_set1_epi32(8)), d, NULL);
}

static void dq_q8_0(const BlockQ8_0 *x, float *y) {
    float d = f16_at(&x->d);
    for (int i = 0; i < 4; i++)
        put8(y + 8 * i, _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * i))), d, NULL);
}

static void dq_q4_1(const BlockQ4_1 *x, float *y) {
    float d = f16_at(&x->d), m = f16_at(&x->m);
    for (int i = 0; i < 4; i++) put8(y + 8 * i, nib8(x->qs, i), d, &m);
}

static void dq_iq4_nl(const BlockIQ4_NL *x, float *y) { iq4_block(x->qs, f16_at(&x->d), y); }

static void dq_q5_0(const BlockQ5_0 *x, float *y) {
    float d = f16_at(&x->d);
    uint32_t qh = u32_at(x->qh);
    for (int i = 0; i < 4; i++) {
        __m256i q = _mm256_or_si256(nib8(x->qs, i), hbit8(qh, 8 * i));
        put8(y + 8 * i, _mm256_sub_epi32(q, _mm256_set1_epi32(16)), d, NULL);
    }
}

static void dq_q5_1(const BlockQ5_1 *x, float *y) {
    float d = f16_at(&x->d), m = f16_at(&x->m);
    uint32_t qh = u32_at(x->qh);
    for (int i = 0; i < 4; i++) put8(y + 8 * i, _mm256_or_si256(nib8(x->qs, i), hbit8(qh, 8 * i)), d, &m);
}

static void dq_q2_k(const BlockQ2_K *x, float *y) {
    float a[16], c[16];
    ttype_kscales(MN_TYPE_Q2_K, x, a, c);
    for (int s = 0; s < 16; s++) {
        int h = s / 8, j = s % 8 / 2, u = s % 2;
        for (int i = 0; i < 2; i++) {
            __m256i e = bytes8(x->qs + 32 * h + 16 * u + 8 * i);
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(e, 2 * j), _mm256_set1_epi32(3));
            put8(y + 16 * s + 8 * i, q, a[s], &c[s]);
        }
    }
}

static void dq_q3_k(const BlockQ3_K *x, float *y) {
    float a[16];
    ttype_kscales(MN_TYPE_Q3_K, x, a, NULL);
    for (int s = 0; s < 16; s++) {
        int h = s / 8, j = s % 8 / 2, u = s % 2, bit = 4 * h + j;
        for (int i = 0; i < 2; i++) {
            __m256i e = bytes8(x->qs + 32 * h + 16 * u + 8 * i), m = bytes8(x->hmask + 16 * u + 8 * i);
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(e, 2 * j), _mm256_set1_epi32(3));
            __m256i hb = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(m, bit), _mm256_set1_epi32(1)), 2);
            put8(y + 16 * s + 8 * i, _mm256_sub_epi32(_mm256_or_si256(q, hb), _mm256_set1_epi32(4)), a[s], NULL);
        }
    }
}

static void dq_q4_k(const BlockQ4_K *x, float *y) {
    float a[8], c[8];
    ttype_kscales(MN_TYPE_Q4_K, x, a, c);
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < 4; i++) {
            __m256i e = bytes8(x->qs + 32 * (s / 2) + 8 * i);
            put8(y + 32 * s + 8 * i, s % 2 == 0 ? low4(e) : _mm256_srli_epi32(e, 4), a[s], &c[s]);
        }
}

static void dq_q5_k(const BlockQ5_K *x, float *y) {
    float a[8], c[8];
    ttype_kscales(MN_TYPE_Q5_K, x, a, c);
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < 4; i++) {
            __m256i e = bytes8(x->qs + 32 * (s / 2) + 8 * i), m = bytes8(x->qh + 8 * i);
            __m256i q = s % 2 == 0 ? low4(e) : _mm256_srli_epi32(e, 4);
            __m256i hb = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(m, s), _mm256_set1_epi32(1)), 4);
            put8(y + 32 * s + 8 * i, _mm256_or_si256(q, hb), a[s], &c[s]);
        }
}

static void dq_q6_k(const BlockQ6_K *x, float *y) {
    float a[16];
    ttype_kscales(MN_TYPE_Q6_K, x, a, NULL);
    for (int s = 0; s < 16; s++) {
        int h = s / 8, j = s % 8 / 2, u = s % 2;
        for (int i = 0; i < 2; i++) {
            int l = 16 * u + 8 * i;
            __m256i e = bytes8(x->ql + 64 * h + 32 * (j & 1) + l), m = bytes8(x->qh + 32 * h + l);
            __m256i lo = j < 2 ? low4(e) : _mm256_srli_epi32(e, 4);
            __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(m, 2 * j), _mm256_set1_epi32(3)), 4);
            put8(y + 16 * s + 8 * i, _mm256_sub_epi32(_mm256_or_si256(lo, hi), _mm256_set1_epi32(32)), a[s], NULL);
        }
    }
}

static void dq_iq4_xs(const BlockIQ4_XS *x, float *y) {
    float a[8];
    ttype_kscales(MN_TYPE_IQ4_XS, x, a, NULL);
    for (int s = 0; s < 8; s++) iq4_block(x->qs + 16 * s, a[s], y + 32 * s);
}

#endif

/* ========================================================================
 * Dispatch
 * ===================================================================== */

void dq_row(MnType type, const void *src, float *dst, int64_t n) {
#if defined(DQ_AVX512) || defined(DQ_AVX2)
    const TypeTraits *t = ttype_traits(type);
    assert(t != NULL && t->is_quantized && n % (int64_t)t->block_elems == 0);
    const uint8_t *b = src;
    int64_t be = (int64_t)t->block_elems;
    for (int64_t k = 0; k < n; k += be, b += t->block_bytes) {
        float *y = dst + k;
        switch (type) {
        case MN_TYPE_Q8_0: dq_q8_0((const BlockQ8_0 *)b, y); break;
        case MN_TYPE_Q4_0: dq_q4_0((const BlockQ4_0 *)b, y); break;
        case MN_TYPE_Q4_1: dq_q4_1((const BlockQ4_1 *)b, y); break;
        case MN_TYPE_Q5_0: dq_q5_0((const BlockQ5_0 *)b, y); break;
        case MN_TYPE_Q5_1: dq_q5_1((const BlockQ5_1 *)b, y); break;
        case MN_TYPE_Q2_K: dq_q2_k((const BlockQ2_K *)b, y); break;
        case MN_TYPE_Q3_K: dq_q3_k((const BlockQ3_K *)b, y); break;
        case MN_TYPE_Q4_K: dq_q4_k((const BlockQ4_K *)b, y); break;
        case MN_TYPE_Q5_K: dq_q5_k((const BlockQ5_K *)b, y); break;
        case MN_TYPE_Q6_K: dq_q6_k((const BlockQ6_K *)b, y); break;
        case MN_TYPE_IQ4_NL: dq_iq4_nl((const BlockIQ4_NL *)b, y); break;
        case MN_TYPE_IQ4_XS: dq_iq4_xs((const BlockIQ4_XS *)b, y); break;
        default: assert(!"not a quantized type"); return;
        }
    }
#else
    ttype_dequantize_row(type, src, dst, n);
#endif
}
