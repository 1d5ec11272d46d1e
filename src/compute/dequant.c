/* dequant.c — vectorized exact dequantization of weight blocks (see
 * dequant.h).
 *
 * How it fits: matmul.c's ktile, for quantized weights where they keep f32
 * activations (the int8 kernels take every row that fits their buffers),
 * calls dq_rows for 256 elements of each row of a tile, into a buffer on
 * the worker's stack, and multiplies that like float weights. Stateless;
 * any thread may call it.
 *
 * Exactness, the invariant: every value written equals ttype_dequantize_row's
 * bit for bit. A weight is a * q (+ c) in f32, a the product of the block's
 * f16 scale and a sub-block's integer scale (exact, however computed: the
 * K-quants' are unpacked here in words, ttype_kscales' one by one), q an
 * integer code of at most 8 bits, c an offset (-(dmin * min), or Q4_1/Q5_1's
 * min). a * q is exact in f32, so the SIMD forms used here — fma(q, a, c),
 * a table of a * i + c indexed by q, mul(q, a) — all round once, where the
 * reference does, to the same value; types without an offset never add one
 * (adding +0 would turn a -0 into +0). test_matmul compares every type's
 * output with the reference bit for bit.
 *
 * AVX-512: the 4-bit types, Q5_0 and Q5_1 look their codes up in a table
 * of the 16 (vpermps) or 32 (vpermt2ps) values of a sub-block, built with
 * one FMA; Q2_K and Q3_K do the same with tables repeated every 4 or 8
 * entries, so a code's neighbouring bits need no masking; Q5_K and Q6_K put
 * their codes together 64 at a time in bytes, then widen, convert and
 * multiply (Q8_0 likewise, its codes being bytes already). A table lookup
 * costs one shuffle per 16 weights, the scarcest port here; where building
 * a code takes more than a nibble shift, the byte form was measured faster.
 * AVX2 converts every code and multiplies (or FMAs the offset). The scalar
 * path is the reference itself.
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

/* Hides a pointer's value from the optimizer, so a scale array the code
 * just stored is read back with broadcast loads (load ports) rather than
 * kept in registers and broadcast by shuffles (port 5, which the table
 * lookups need). */
#define DQ_FROM_MEMORY(p) __asm__ volatile("" : "+r"(p))

static inline float f16_at(const uint16_t *h) { return _cvtsh_ss(*h); }

static inline uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- K-quant sub-block scales, both SIMD paths ---- */

/* Declares as (the sub-block scales) and cs (the offsets, types with a
 * min) of K-quant block x, read back from memory (DQ_FROM_MEMORY). */
#define DQ_KSCALES(type, x) \
    float a_[16], c_[16]; \
    kscales(type, x, a_, c_); \
    const float *as = a_, *cs = c_; \
    DQ_FROM_MEMORY(as); \
    DQ_FROM_MEMORY(cs)

/* a[i] = d * (byte i + off) for the 8 unsigned bytes of lo (0..3) and hi (4..7). */
DQ_INLINE void scale8(float *a, uint32_t lo, uint32_t hi, int off, float d) {
    __m128i b = _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)lo), _mm_cvtsi32_si128((int)hi));
    __m256i v = _mm256_add_epi32(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(off));
    _mm256_storeu_ps(a, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(v)));
}

/* ttype_kscales for Q2_K .. Q6_K, the bit fields unpacked four at a time in
 * 32-bit words and converted in vectors: the same exact products d * scale
 * and (-dmin) * min, so the same values (test_matmul checks). */
DQ_INLINE void kscales(MnType type, const void *blk, float *a, float *c) {
    switch (type) {
    case MN_TYPE_Q2_K: {
        const BlockQ2_K *x = blk;
        const uint32_t m4 = 0x0f0f0f0f;
        float d = f16_at(&x->d), nm = -f16_at(&x->dmin);
        for (int i = 0; i < 2; i++) {
            uint32_t w0 = u32_at(x->scales + 8 * i), w1 = u32_at(x->scales + 8 * i + 4);
            scale8(a + 8 * i, w0 & m4, w1 & m4, 0, d);
            scale8(c + 8 * i, (w0 >> 4) & m4, (w1 >> 4) & m4, 0, nm);
        }
        return;
    }
    case MN_TYPE_Q3_K: {
        /* scale i: low 4 bits from byte i (i < 8) or the high nibble of byte
         * i - 8; top 2 bits from bits 2(i/4) of byte 8 + i%4 */
        const BlockQ3_K *x = blk;
        const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
        uint32_t u0 = u32_at(x->scales), u1 = u32_at(x->scales + 4), u2 = u32_at(x->scales + 8);
        float d = f16_at(&x->d);
        scale8(a, (u0 & m4) | (u2 & m2) << 4, (u1 & m4) | ((u2 >> 2) & m2) << 4, -32, d);
        scale8(a + 8, ((u0 >> 4) & m4) | ((u2 >> 4) & m2) << 4, ((u1 >> 4) & m4) | ((u2 >> 6) & m2) << 4, -32, d);
        return;
    }
    case MN_TYPE_Q4_K:
    case MN_TYPE_Q5_K: {
        /* scales 0..3 and mins 0..3: low 6 bits of bytes 0..3, 4..7; 4..7:
         * nibbles of bytes 8..11 and the top bits of bytes 0..3, 4..7 */
        const BlockQ4_K *x = blk;
        const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
        uint32_t u0 = u32_at(x->scales), u1 = u32_at(x->scales + 4), u2 = u32_at(x->scales + 8);
        scale8(a, u0 & m6, (u2 & m4) | ((u0 >> 6) & m2) << 4, 0, f16_at(&x->d));
        scale8(c, u1 & m6, ((u2 >> 4) & m4) | ((u1 >> 6) & m2) << 4, 0, -f16_at(&x->dmin));
        return;
    }
    case MN_TYPE_Q6_K: {
        const BlockQ6_K *x = blk;
        __m256 d = _mm256_set1_ps(f16_at(&x->d));
        for (int i = 0; i < 2; i++) {
            __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x->scales + 8 * i)));
            _mm256_storeu_ps(a + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
        }
        return;
    }
    default: ttype_kscales(type, blk, a, c); return;
    }
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
    DQ_KSCALES(MN_TYPE_Q2_K, x);
    const __m512 i4 = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    for (int hu = 0; hu < 4; hu++) {
        int h = hu / 2, u = hu % 2;
        __m512i e = bytes16(x->qs + 32 * h + 16 * u);
        for (int j = 0; j < 4; j++) {
            int s = 8 * h + 2 * j + u;
            __m512 t = _mm512_fmadd_ps(i4, _mm512_set1_ps(as[s]), _mm512_set1_ps(cs[s]));
            _mm512_storeu_ps(y + 16 * s, _mm512_permutexvar_ps(_mm512_srli_epi32(e, 2 * j), t));
        }
    }
}

/* Q3_K: as Q2_K, with bit 2 of the index the code's high bit (hmask);
 * table[i] = a * (i - 4), repeated every 8 entries (bit 3 is left over). */
static void dq_q3_k(const BlockQ3_K *x, float *y) {
    DQ_KSCALES(MN_TYPE_Q3_K, x);
    const __m512 v = _mm512_setr_ps(-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3);
    for (int hu = 0; hu < 4; hu++) {
        int h = hu / 2, u = hu % 2;
        __m512i e = bytes16(x->qs + 32 * h + 16 * u), m = bytes16(x->hmask + 16 * u);
        for (int j = 0; j < 4; j++) {
            int s = 8 * h + 2 * j + u, bit = 4 * h + j;
            /* bits 0..1 from the code, bit 2 (and up) from hmask's bit moved there */
            __m512i hb = bit >= 2 ? _mm512_srli_epi32(m, (unsigned)(bit - 2)) : _mm512_slli_epi32(m, (unsigned)(2 - bit));
            __m512i idx = _mm512_ternarylogic_epi32(_mm512_set1_epi32(3), _mm512_srli_epi32(e, 2 * j), hb, 0xca);
            __m512 t = _mm512_mul_ps(_mm512_set1_ps(as[s]), v);
            _mm512_storeu_ps(y + 16 * s, _mm512_permutexvar_ps(idx, t));
        }
    }
}

/* Q4_K and Q5_K: sub-block s (32 elements) is the low (s even) or high
 * nibbles of qs[32(s/2) ..]; Q5_K's bit 4 is bit s of qh[l]. */
static void dq_q4_k(const BlockQ4_K *x, float *y) {
    DQ_KSCALES(MN_TYPE_Q4_K, x);
    for (int g = 0; g < 4; g++) {
        __m512 t0 = table16(as[2 * g], cs[2 * g]), t1 = table16(as[2 * g + 1], cs[2 * g + 1]);
        for (int u = 0; u < 2; u++) {
            __m512i e = bytes16(x->qs + 32 * g + 16 * u);
            _mm512_storeu_ps(y + 64 * g + 16 * u, _mm512_permutexvar_ps(e, t0));
            _mm512_storeu_ps(y + 64 * g + 32 + 16 * u, _mm512_permutexvar_ps(_mm512_srli_epi32(e, 4), t1));
        }
    }
}

/* Q5_K: the 5-bit codes of each 64 elements (sub-blocks 2g and 2g + 1) put
 * together in bytes — low nibbles, then high nibbles, of qs[32g ..], bit 4
 * from bits 2g and 2g + 1 of qh[l] — then widened 16 at a time, converted
 * and multiplied with the offset added: fma(q, a, c), one rounding. */
static void dq_q5_k(const BlockQ5_K *x, float *y) {
    DQ_KSCALES(MN_TYPE_Q5_K, x);
    const __m512i m0f = _mm512_set1_epi8(0x0f), m01 = _mm512_set1_epi8(0x01);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
    _Alignas(64) uint8_t q[64];
    for (int g = 0; g < 4; g++) {
        __m256i l = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * g));
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(l), _mm256_srli_epi16(l, 4), 1);
        __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(qh, 2 * g)),
                                        _mm256_srli_epi16(qh, 2 * g + 1), 1);
        __m512i hb = _mm512_slli_epi16(_mm512_and_si512(hh, m01), 4);
        _mm512_store_si512(q, _mm512_ternarylogic_epi32(m0f, z, hb, 0xca));
        for (int i = 0; i < 4; i++) {
            int s = 2 * g + i / 2;
            __m512 qf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(q + 16 * i))));
            _mm512_storeu_ps(y + 64 * g + 16 * i, _mm512_fmadd_ps(qf, _mm512_set1_ps(as[s]), _mm512_set1_ps(cs[s])));
        }
    }
}

/* Q6_K: codes of 6 bits, converted and multiplied. For each half h (128
 * elements), the codes are put together 64 at a time in bytes: element
 * 128h + 32j + l has its low 4 bits in ql[64h + 32(j & 1) + l] (high nibble
 * when j >= 2) and its high 2 bits at bits 2j.. of qh[32h + l]; minus 32
 * they are signed bytes, widened 16 at a time from a buffer. */
static void dq_q6_k(const BlockQ6_K *x, float *y) {
    DQ_KSCALES(MN_TYPE_Q6_K, x);
    const __m512i m03 = _mm512_set1_epi8(0x03), m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i v32 = _mm512_set1_epi8(32);
    _Alignas(64) int8_t q[128];
    for (int h = 0; h < 2; h++) {
        __m512i l = _mm512_loadu_si512(x->ql + 64 * h);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        /* bytes 0..31: qh (j = 0, 2 read its bits 0..1, 4..5); 32..63: qh >> 2 (j = 1, 3) */
        __m512i h2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        /* j = 0, 1: low nibbles, high bits (h2 & 3) << 4 */
        __m512i hb = _mm512_slli_epi16(_mm512_and_si512(h2, m03), 4);
        __m512i q01 = _mm512_ternarylogic_epi32(m0f, l, hb, 0xca);
        /* j = 2, 3: high nibbles, high bits h2 & 0x30 */
        __m512i q23 = _mm512_ternarylogic_epi32(m0f, _mm512_srli_epi16(l, 4), _mm512_and_si512(h2, m30), 0xca);
        _mm512_store_si512(q, _mm512_sub_epi8(q01, v32));
        _mm512_store_si512(q + 64, _mm512_sub_epi8(q23, v32));
        /* q[32(j & 1) + 64(j >> 1) + l] is element 32j + l of this half */
        for (int j = 0; j < 4; j++)
            for (int u = 0; u < 2; u++) {
                int s = 8 * h + 2 * j + u;
                __m512i c = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(q + 32 * (j & 1) + 64 * (j >> 1) + 16 * u)));
                _mm512_storeu_ps(y + 16 * s, _mm512_mul_ps(_mm512_set1_ps(as[s]), _mm512_cvtepi32_ps(c)));
            }
    }
}

static void dq_iq4_xs(const BlockIQ4_XS *x, float *y) {
    DQ_KSCALES(MN_TYPE_IQ4_XS, x);
    __m512 lv = iq4_levels();
    for (int s = 0; s < 8; s++) q4_block(x->qs + 16 * s, _mm512_mul_ps(_mm512_set1_ps(as[s]), lv), y + 32 * s);
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
    DQ_KSCALES(MN_TYPE_Q2_K, x);
    for (int s = 0; s < 16; s++) {
        int h = s / 8, j = s % 8 / 2, u = s % 2;
        for (int i = 0; i < 2; i++) {
            __m256i e = bytes8(x->qs + 32 * h + 16 * u + 8 * i);
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(e, 2 * j), _mm256_set1_epi32(3));
            put8(y + 16 * s + 8 * i, q, as[s], cs + s);
        }
    }
}

static void dq_q3_k(const BlockQ3_K *x, float *y) {
    DQ_KSCALES(MN_TYPE_Q3_K, x);
    for (int s = 0; s < 16; s++) {
        int h = s / 8, j = s % 8 / 2, u = s % 2, bit = 4 * h + j;
        for (int i = 0; i < 2; i++) {
            __m256i e = bytes8(x->qs + 32 * h + 16 * u + 8 * i), m = bytes8(x->hmask + 16 * u + 8 * i);
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(e, 2 * j), _mm256_set1_epi32(3));
            __m256i hb = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(m, bit), _mm256_set1_epi32(1)), 2);
            put8(y + 16 * s + 8 * i, _mm256_sub_epi32(_mm256_or_si256(q, hb), _mm256_set1_epi32(4)), as[s], NULL);
        }
    }
}

static void dq_q4_k(const BlockQ4_K *x, float *y) {
    DQ_KSCALES(MN_TYPE_Q4_K, x);
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < 4; i++) {
            __m256i e = bytes8(x->qs + 32 * (s / 2) + 8 * i);
            put8(y + 32 * s + 8 * i, s % 2 == 0 ? low4(e) : _mm256_srli_epi32(e, 4), as[s], cs + s);
        }
}

static void dq_q5_k(const BlockQ5_K *x, float *y) {
    DQ_KSCALES(MN_TYPE_Q5_K, x);
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < 4; i++) {
            __m256i e = bytes8(x->qs + 32 * (s / 2) + 8 * i), m = bytes8(x->qh + 8 * i);
            __m256i q = s % 2 == 0 ? low4(e) : _mm256_srli_epi32(e, 4);
            __m256i hb = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(m, s), _mm256_set1_epi32(1)), 4);
            put8(y + 32 * s + 8 * i, _mm256_or_si256(q, hb), as[s], cs + s);
        }
}

static void dq_q6_k(const BlockQ6_K *x, float *y) {
    DQ_KSCALES(MN_TYPE_Q6_K, x);
    for (int s = 0; s < 16; s++) {
        int h = s / 8, j = s % 8 / 2, u = s % 2;
        for (int i = 0; i < 2; i++) {
            int l = 16 * u + 8 * i;
            __m256i e = bytes8(x->ql + 64 * h + 32 * (j & 1) + l), m = bytes8(x->qh + 32 * h + l);
            __m256i lo = j < 2 ? low4(e) : _mm256_srli_epi32(e, 4);
            __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(m, 2 * j), _mm256_set1_epi32(3)), 4);
            put8(y + 16 * s + 8 * i, _mm256_sub_epi32(_mm256_or_si256(lo, hi), _mm256_set1_epi32(32)), as[s], NULL);
        }
    }
}

static void dq_iq4_xs(const BlockIQ4_XS *x, float *y) {
    DQ_KSCALES(MN_TYPE_IQ4_XS, x);
    for (int s = 0; s < 8; s++) iq4_block(x->qs + 16 * s, as[s], y + 32 * s);
}

#endif

/* ========================================================================
 * Dispatch
 * ===================================================================== */

void dq_rows(MnType type, const void *src, size_t src_stride, int n_rows, float *dst, size_t dst_stride, int64_t n) {
    assert(ttype_traits(type) != NULL && ttype_traits(type)->is_quantized);
    assert(n % (int64_t)ttype_traits(type)->block_elems == 0);
#if defined(DQ_AVX512) || defined(DQ_AVX2)
/* the row's blocks, one function call each, for every row */
#define DQ_LOOP(fn, Block, be) \
    for (int r = 0; r < n_rows; r++) { \
        const Block *xb = (const Block *)((const uint8_t *)src + (size_t)r * src_stride); \
        float *y = dst + (size_t)r * dst_stride; \
        for (int64_t k = 0; k < n; k += (be)) fn(xb++, y + k); \
    } \
    break
    switch (type) {
    case MN_TYPE_Q8_0: DQ_LOOP(dq_q8_0, BlockQ8_0, MN_QK);
    case MN_TYPE_Q4_0: DQ_LOOP(dq_q4_0, BlockQ4_0, MN_QK);
    case MN_TYPE_Q4_1: DQ_LOOP(dq_q4_1, BlockQ4_1, MN_QK);
    case MN_TYPE_Q5_0: DQ_LOOP(dq_q5_0, BlockQ5_0, MN_QK);
    case MN_TYPE_Q5_1: DQ_LOOP(dq_q5_1, BlockQ5_1, MN_QK);
    case MN_TYPE_Q2_K: DQ_LOOP(dq_q2_k, BlockQ2_K, MN_QK_K);
    case MN_TYPE_Q3_K: DQ_LOOP(dq_q3_k, BlockQ3_K, MN_QK_K);
    case MN_TYPE_Q4_K: DQ_LOOP(dq_q4_k, BlockQ4_K, MN_QK_K);
    case MN_TYPE_Q5_K: DQ_LOOP(dq_q5_k, BlockQ5_K, MN_QK_K);
    case MN_TYPE_Q6_K: DQ_LOOP(dq_q6_k, BlockQ6_K, MN_QK_K);
    case MN_TYPE_IQ4_NL: DQ_LOOP(dq_iq4_nl, BlockIQ4_NL, MN_QK);
    case MN_TYPE_IQ4_XS: DQ_LOOP(dq_iq4_xs, BlockIQ4_XS, MN_QK_K);
    default: assert(!"not a quantized type"); break;
    }
#undef DQ_LOOP
#else
    for (int r = 0; r < n_rows; r++)
        ttype_dequantize_row(type, (const uint8_t *)src + (size_t)r * src_stride, dst + (size_t)r * dst_stride, n);
#endif
}

void dq_row(MnType type, const void *src, float *dst, int64_t n) { dq_rows(type, src, 0, 1, dst, 0, n); }
