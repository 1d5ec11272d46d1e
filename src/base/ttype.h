/* ttype.h — tensor element types: traits, f16/bf16 conversion, and the
 * reference (scalar, portable) quantize / dequantize of rows.
 *
 * The numeric values of MnType are the GGML type ids used in GGUF files.
 * Quantized types store rows as a sequence of blocks; a row's element count
 * must be a multiple of the block size. The SIMD kernels live in
 * src/compute/; the functions here are the reference they are tested against.
 */
#ifndef MN_TTYPE_H
#define MN_TTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum MnType {
    MN_TYPE_F32 = 0,
    MN_TYPE_F16 = 1,
    MN_TYPE_Q4_0 = 2,
    MN_TYPE_Q4_1 = 3,
    MN_TYPE_Q5_0 = 6,
    MN_TYPE_Q5_1 = 7,
    MN_TYPE_Q8_0 = 8,
    MN_TYPE_Q2_K = 10,
    MN_TYPE_Q3_K = 11,
    MN_TYPE_Q4_K = 12,
    MN_TYPE_Q5_K = 13,
    MN_TYPE_Q6_K = 14,
    MN_TYPE_IQ4_NL = 20,
    MN_TYPE_IQ4_XS = 23,
    MN_TYPE_BF16 = 30,
} MnType;

#define MN_QK8_0 32
#define MN_QK4_0 32
#define MN_QK 32    /* elements of a block of the 32-element types (Q4_0 .. Q8_0, IQ4_NL) */
#define MN_QK_K 256 /* elements of a K-quant (and IQ4_XS) super-block */

/* GGML's block layouts (GGUF byte layout, little-endian; f16 fields as
 * uint16_t bits). Each comment gives element k's value as the reference
 * dequantization computes it, in f32, each operation rounded (the build has
 * no FMA contraction). Every product of scales and codes below is exact in
 * f32 (at most 24 significant bits), so the only rounding is the one
 * addition of an offset (Q4_1, Q5_1 and the K-quants with a min). */
typedef struct {
    uint16_t d;           /* f16 scale */
    int8_t qs[MN_QK8_0];  /* x = d * q */
} BlockQ8_0;              /* 34 bytes */

typedef struct {
    uint16_t d;               /* f16 scale */
    uint8_t qs[MN_QK4_0 / 2]; /* low nibbles = elements 0..15, high = 16..31; x = d * (q - 8) */
} BlockQ4_0;                  /* 18 bytes */

typedef struct {
    uint16_t d, m;         /* f16 scale and min */
    uint8_t qs[MN_QK / 2]; /* nibbles as Q4_0; x = d * q + m */
} BlockQ4_1;               /* 20 bytes */

typedef struct {
    uint16_t d;            /* f16 scale */
    uint8_t qh[4];         /* bit k (little-endian u32) = bit 4 of element k's code */
    uint8_t qs[MN_QK / 2]; /* low 4 bits as Q4_0; x = d * (q - 16) */
} BlockQ5_0;               /* 22 bytes */

typedef struct {
    uint16_t d, m;         /* f16 scale and min */
    uint8_t qh[4];         /* as Q5_0 */
    uint8_t qs[MN_QK / 2]; /* as Q5_0; x = d * q + m */
} BlockQ5_1;               /* 24 bytes */

/* The K-quants: a 256-element super-block of sub-blocks of 16 or 32
 * elements, each sub-block with its own scale (and min) quantized against
 * the super-block's f16 d (and dmin). */
typedef struct {
    uint8_t scales[16];  /* sub-block s (16 elements): scale = low nibble, min = high nibble */
    uint8_t qs[64];      /* 2-bit codes: element 128h + 32j + 16u + l is bits 2j..2j+1 of qs[32h + 16u + l] */
    uint16_t d, dmin;    /* x = (d * scale) * q - dmin * min */
} BlockQ2_K;             /* 84 bytes */

typedef struct {
    uint8_t hmask[32];   /* element 128h + 32j + l: bit 4h + j of hmask[l] set = code not lowered by 4 */
    uint8_t qs[64];      /* low 2 bits, placed as Q2_K's */
    uint8_t scales[12];  /* 16 6-bit scales, biased by 32 (see ttype.c) */
    uint16_t d;          /* x = (d * (scale - 32)) * (q - (high bit ? 0 : 4)) */
} BlockQ3_K;             /* 110 bytes */

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];  /* 8 6-bit scales and 8 6-bit mins (see ttype.c) */
    uint8_t qs[128];     /* element 64g + l: low nibble of qs[32g + l] (l < 32), else high nibble of qs[32g + l - 32] */
} BlockQ4_K;             /* 144 bytes; x = (d * scale) * q - dmin * min, sub-blocks of 32 */

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];  /* as Q4_K */
    uint8_t qh[32];      /* element 32s + l: bit s of qh[l] = bit 4 of its code */
    uint8_t qs[128];     /* low 4 bits, placed as Q4_K's */
} BlockQ5_K;             /* 176 bytes; x = (d * scale) * q - dmin * min */

typedef struct {
    uint8_t ql[128];     /* low 4 bits: element 128h + 32j + l in qs[64h + 32(j & 1) + l], high nibble when j >= 2 */
    uint8_t qh[64];      /* high 2 bits: bits 2j..2j+1 of qh[32h + l] */
    int8_t scales[16];   /* one per 16 elements */
    uint16_t d;          /* x = (d * scale) * (q - 32) */
} BlockQ6_K;             /* 210 bytes */

typedef struct {
    uint16_t d;            /* f16 scale */
    uint8_t qs[MN_QK / 2]; /* nibbles as Q4_0; x = d * mn_iq4_values[q] */
} BlockIQ4_NL;             /* 18 bytes */

typedef struct {
    uint16_t d;           /* f16 scale */
    uint16_t scales_h;    /* bits 2s..2s+1: high bits of sub-block s's 6-bit scale */
    uint8_t scales_l[4];  /* low 4 bits of the scales, two per byte (s even: low nibble) */
    uint8_t qs[128];      /* sub-block s (32 elements): nibbles of qs[16s..16s+15] as Q4_0 */
} BlockIQ4_XS;            /* 136 bytes; x = (d * (scale - 32)) * mn_iq4_values[q] */

/* The 16 levels of IQ4_NL / IQ4_XS (a fixed non-linear table of the format). */
extern const int8_t mn_iq4_values[16];

typedef struct TypeTraits {
    const char *name;    /* "f32", "q4_k", ... (GGML's lower-case name) */
    size_t block_elems;  /* 1 for float types */
    size_t block_bytes;  /* bytes of one block */
    bool is_quantized;
} TypeTraits;

/* A row-major weight matrix in one of these types: n_out rows of n_in
 * elements (GGUF ne[0] = n_in, ne[1] = n_out). A view: data is borrowed,
 * e.g. from a GGUF mapping. The model builds them, compute/ multiplies them. */
typedef struct MatW {
    MnType type;
    int64_t n_in;     /* elements per row (whole blocks for quantized types) */
    int64_t n_out;    /* rows */
    const void *data; /* (n_out, row_bytes) */
} MatW;

/* Traits of a supported type, or NULL if mnemo does not support it. */
const TypeTraits *ttype_traits(uint32_t type);

/* Name of any GGML type id known to exist (e.g. "q5_k"), supported or not;
 * NULL for ids that no GGML version defines. Used in error messages. */
const char *ttype_ggml_name(uint32_t type);

/* Parse a supported type's name ("q4_k", case-insensitive); 0 or MN_EINVAL. */
int ttype_from_name(const char *name, MnType *out);

/* The supported types' names, comma-separated, for messages and --help. */
const char *ttype_supported_names(void);

/* Bytes of a row of n_elems elements: MN_OK, MN_EUNSUPPORTED for an
 * unsupported type, MN_EFORMAT when n_elems is not a whole number of blocks. */
int ttype_row_bytes(uint32_t type, uint64_t n_elems, uint64_t *out_bytes);

float mn_f16_to_f32(uint16_t h);
uint16_t mn_f32_to_f16(float f);   /* round to nearest even, IEEE semantics */
float mn_bf16_to_f32(uint16_t h);
uint16_t mn_f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN */

/* Reference conversions of one row of n elements (n a multiple of the block
 * size for quantized types). ttype_dequantize_row is the definition of a
 * quantized weight's value (see the block comments above); the kernels in
 * src/compute/ compute exactly these values. ttype_quantize_row writes valid
 * blocks close to src: Q8_0 and Q4_0 follow GGML's reference (Q8_0 d =
 * amax/127, q = round(x/d); Q4_0 d = max/-8 (signed value of largest
 * magnitude), q = min(15, (int)(x/d + 8.5))); the other types use simple
 * per-(sub-)block min/max or absmax scales of their own, not GGML's search. */
void ttype_dequantize_row(MnType type, const void *src, float *dst, int64_t n);
void ttype_quantize_row(MnType type, const float *src, void *dst, int64_t n);

/* The sub-block scales of one super-block of a K-quant or IQ4_XS: element
 * l of sub-block s is a[s] * q + c[s] (Q2_K, Q4_K, Q5_K: c[s] = -(dmin *
 * min), the addition rounded once) or a[s] * q (Q3_K, Q6_K, IQ4_XS; c is
 * not written), q its integer code as the block comments above define it
 * (Q3_K: -4..3, Q6_K: -32..31, IQ4_XS: an mn_iq4_values level). a[s] is
 * the product of the super-block's d and the sub-block's integer scale.
 * Writes 16 (Q2_K, Q3_K, Q6_K: sub-blocks of 16) or 8 entries; returns
 * that count. */
int ttype_kscales(MnType type, const void *blk, float *a, float *c);

#endif
