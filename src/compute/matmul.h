/* matmul.h — weight-times-activation products for every supported weight
 * type, with AVX-512, AVX2 and scalar code paths chosen at compile time.
 *
 * A weight matrix W is row-major: n_out rows of n_in elements, each row
 * stored in W's type (GGUF layout: ne[0] = n_in, ne[1] = n_out). Activations
 * x are f32, n_tok rows of n_in. mm_matmul computes
 *     out[t][r] = sum_k W[r][k] * x[t][k]      out is (n_tok, n_out), f32.
 * Activations stay in f32 for F32/F16/BF16. The quantized types quantize
 * them to int8 as llama.cpp does: the K-quants (Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K) and IQ4_XS per 256 (compute/kquant.h), Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0 and IQ4_NL per 32 (compute/q32.h); each equal on every path to
 * mm_matmul_ref, which then does the same in plain C, and logits meet
 * `llamacpp` (2e-2 for Q8_0 and Q4_0, 5e-2 for the K-quants; past 64
 * tokens, where one rounding flips, 5e-2 and 1e-1), not `exact`. (Rows too
 * long for a worker's buffer of quantized activations, far beyond any
 * model's, keep f32 activations: their weights are dequantized exactly, to
 * ttype_dequantize_row's values, and multiplied like float weights.)
 *
 * Batch invariance (DESIGN.md): out[t][r] is bit-identical whatever n_tok,
 * whatever row t sits at in x, and whatever the thread count: every output
 * element is reduced in one fixed order that depends only on n_in. Work is
 * split across threads by output rows / tokens, never along k.
 * The scalar path (mm_matmul_ref) is the test oracle; SIMD results agree with
 * it to float rounding, not bit for bit.
 */
#ifndef MN_MATMUL_H
#define MN_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "base/ttype.h"

/* MatW, the weight-matrix view, is in base/ttype.h: the model layer below
 * builds them, this layer multiplies them. */

/* out (n_tok, n_out) = x (n_tok, n_in) * W^T, parallel over tp (may be NULL
 * for single-threaded). Never allocates. */
void mm_matmul(ThreadPool *tp, float *out, const MatW *w, const float *x, int n_tok);

/* How many tokens mm_matmul computes at once for W in a product of n_tok
 * tokens: the int8 kernels' tile of tokens (q32_token_lanes,
 * kq_token_lanes), whose spare lanes cost as much as used ones, so a
 * product of n_tok tokens costs about what one of n_tok rounded up to a
 * multiple of this does; 1 where each token costs its own share (float
 * weights, few tokens, the scalar path). */
int mm_token_lanes(const MatW *w, int n_tok);

/* Whether mm_matmul quantizes the activations for W to int8, and how a
 * token's quantized row is packed for mm_matmul_packed: MM_PACK_KQ for
 * the K-quants and IQ4_XS (kq_pack: n_in / 256 * KQ_PACKED_BYTES bytes),
 * MM_PACK_Q32 for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL (q32_pack: n_in
 * / 32 * 44 bytes); MM_PACK_NONE when W multiplies f32 activations.
 * Weights of one kind take the same packed row, whatever their type. */
typedef enum MmPack { MM_PACK_NONE, MM_PACK_KQ, MM_PACK_Q32 } MmPack;
MmPack mm_pack_kind(const MatW *w);

/* Bytes of one token's packed row of n_in elements (kind not NONE). */
size_t mm_packed_row_bytes(MmPack kind, int64_t n_in);

/* dst (mm_packed_row_bytes) = x's packed row: exactly the int8 operand
 * mm_matmul makes of x for a W of that kind, on any path. */
void mm_pack_row(MmPack kind, const float *x, int64_t n_in, uint8_t *dst);

/* Bytes of the scratch mm_matmul_packed needs for n_tok tokens (W's
 * mm_pack_kind not NONE). */
size_t mm_packed_scratch_bytes(const MatW *w, int n_tok);

/* mm_matmul for a W whose mm_pack_kind is not NONE, from activations
 * already quantized: packed holds n_tok rows of mm_pack_row(kind, x). out
 * is bit-identical to mm_matmul(w, x) for the x those rows were packed
 * from. scratch: mm_packed_scratch_bytes, 64-byte aligned. */
void mm_matmul_packed(ThreadPool *tp, float *out, const MatW *w, const uint8_t *packed, int n_tok,
                      uint8_t *scratch);

/* Scalar reference for tests; same contract, single-threaded. */
void mm_matmul_ref(float *out, const MatW *w, const float *x, int n_tok);

/* Name of the compiled SIMD path: "avx512", "avx2" or "scalar". */
const char *mm_simd_name(void);

#endif
