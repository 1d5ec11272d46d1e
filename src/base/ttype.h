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
    MN_TYPE_Q8_0 = 8,
    MN_TYPE_BF16 = 30,
} MnType;

#define MN_QK8_0 32
#define MN_QK4_0 32

/* GGML's block layouts (GGUF byte layout, little-endian). */
typedef struct {
    uint16_t d;           /* f16 scale */
    int8_t qs[MN_QK8_0];  /* x = d * q */
} BlockQ8_0;              /* 34 bytes */

typedef struct {
    uint16_t d;               /* f16 scale */
    uint8_t qs[MN_QK4_0 / 2]; /* low nibbles = elements 0..15, high = 16..31; x = d * (q - 8) */
} BlockQ4_0;                  /* 18 bytes */

typedef struct TypeTraits {
    const char *name;    /* "f32", "f16", "q4_0", "q8_0", "bf16" */
    size_t block_elems;  /* 1 for float types */
    size_t block_bytes;  /* bytes of one block */
    bool is_quantized;
} TypeTraits;

/* A row-major weight matrix in one of these types: n_out rows of n_in
 * elements (GGUF ne[0] = n_in, ne[1] = n_out). A view: data is borrowed,
 * e.g. from a GGUF mapping. The model builds them, compute/ multiplies them. */
typedef struct MatW {
    MnType type;
    int64_t n_in;     /* elements per row (a multiple of 32 for quantized types) */
    int64_t n_out;    /* rows */
    const void *data; /* (n_out, row_bytes) */
} MatW;

/* Traits of a supported type, or NULL if mnemo does not support it. */
const TypeTraits *ttype_traits(uint32_t type);

/* Name of any GGML type id known to exist (e.g. "q5_k"), supported or not;
 * NULL for ids that no GGML version defines. Used in error messages. */
const char *ttype_ggml_name(uint32_t type);

/* Parse "f32", "f16", "bf16", "q8_0", "q4_0" (case-insensitive); 0 or MN_EINVAL. */
int ttype_from_name(const char *name, MnType *out);

/* Bytes of a row of n_elems elements: MN_OK, MN_EUNSUPPORTED for an
 * unsupported type, MN_EFORMAT when n_elems is not a whole number of blocks. */
int ttype_row_bytes(uint32_t type, uint64_t n_elems, uint64_t *out_bytes);

float mn_f16_to_f32(uint16_t h);
uint16_t mn_f32_to_f16(float f);   /* round to nearest even, IEEE semantics */
float mn_bf16_to_f32(uint16_t h);
uint16_t mn_f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN */

/* Reference conversions of one row of n elements (n a multiple of the block
 * size for quantized types). Quantization follows GGML's reference:
 * Q8_0 d = amax/127, q = round(x/d); Q4_0 d = max/-8 (signed value of
 * largest magnitude), q = min(15, (int)(x/d + 8.5)). */
void ttype_dequantize_row(MnType type, const void *src, float *dst, int64_t n);
void ttype_quantize_row(MnType type, const float *src, void *dst, int64_t n);

#endif
