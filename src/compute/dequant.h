/* dequant.h — fast dequantization of quantized weight blocks to f32, with
 * AVX-512, AVX2 and scalar code paths chosen at compile time (the same
 * choice as matmul.c's).
 *
 * dq_row gives exactly ttype_dequantize_row's values, bit for bit, for every
 * quantized type: each value is computed by the same f32 operations in the
 * same order (the block comments of base/ttype.h; every product of scales
 * and codes is exact, and the one addition of an offset is rounded once),
 * only vectorized. The matmul kernels of the types without a kernel of
 * their own multiply what it writes, so their products equal the F32
 * product against the dequantized matrix (test_matmul checks both).
 */
#ifndef MN_DEQUANT_H
#define MN_DEQUANT_H

#include <stddef.h>
#include <stdint.h>

#include "base/ttype.h"

/* dst[0..n) = the n elements of whole blocks at src, dequantized. n is a
 * multiple of the type's block size; dst holds n floats (no alignment
 * needed). Never allocates. */
void dq_row(MnType type, const void *src, float *dst, int64_t n);

/* dq_row for n_rows rows: row r from src + r * src_stride (bytes) to
 * dst + r * dst_stride (floats). One call per kernel step for a tile's rows. */
void dq_rows(MnType type, const void *src, size_t src_stride, int n_rows, float *dst, size_t dst_stride, int64_t n);

#endif
