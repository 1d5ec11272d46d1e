/* kquant.h — K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS products
 * with int8 activations (llama.cpp's Q8_K scheme, which llama.cpp pairs
 * with each of these types), the fast path of mm_matmul for them.
 *
 * Each token's activations are quantized per 256-element block: d = amax /
 * 127 as 1 / (127 / amax), q = round-to-even((127 / amax) * x) in
 * -127..127, plus the block's sums of 16 and 32 codes; a product is then
 *     out[t][r] = sum over blocks b, in order, of
 *         acc = fma((float)S_b, d_w * d_x, acc)
 *         and for Q2_K, Q4_K, Q5_K: acc = fma(-(float)M_b, dmin_w * d_x, acc)
 * where S_b (the scaled sum of weight code times activation code) and M_b
 * (the mins against the code sums) are exact int32 sums of integers: so
 * every SIMD path (AVX-512 VNNI, AVX2, scalar) gives the same bits,
 * whatever the tile, thread or batch (the value depends only on W's row
 * and x's row). It equals llama.cpp's dot product of these types with
 * Q8_K but for f32 rounding (the sign of llama.cpp's scale, -127 / max,
 * cancels exactly between d and q), so logits meet the `llamacpp`
 * references (5e-2), not `exact` (5e-3).
 */
#ifndef MN_KQUANT_H
#define MN_KQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/ttype.h"

/* Bytes of one 256-element block of quantized activations (the rows
 * layout). */
#define KQ_BLOCK_BYTES 384

/* Whether mm_matmul multiplies `type` through this module. */
bool kq_has_type(MnType type);

/* How many tokens a product of n_tok tokens computes at once: a tile's
 * lanes (16 with AVX-512, 8 with AVX2) from the tiled layout's first count
 * on (its spare lanes are computed for nothing); else 1. */
int kq_token_lanes(int n_tok);

/* Bytes of n_tok tokens of n_in elements (a multiple of 256) quantized by
 * kq_quantize; the layout depends on n_tok, and kq_rows reads the one
 * kq_quantize wrote for the same n_tok. */
size_t kq_acts_bytes(int64_t n_in, int n_tok);

/* The most tokens, at most n_tok, whose quantized activations fit in
 * `bytes`; 0 if not even one does. */
int kq_group_tokens(int64_t n_in, int n_tok, size_t bytes);

/* Quantize n_tok tokens x (n_tok, n_in) for weights of `type` into dst
 * (kq_acts_bytes bytes, 64-byte aligned). Deterministic; never allocates. */
void kq_quantize(MnType type, const float *x, int64_t n_in, int n_tok, uint8_t *dst);

/* kq_quantize in plain C: the same bytes (the oracle of the others). */
void kq_quantize_ref(MnType type, const float *x, int64_t n_in, int n_tok, uint8_t *dst);

/* Bytes of one 256-element block of quantized activations in the packed
 * form (kq_pack): the scale d (f32) then the 256 codes in natural order.
 * What the codes of one token are does not depend on the weight type —
 * only their order inside a KqBlock does — so one packed row serves the
 * products with weights of any of these types. */
#define KQ_PACKED_BYTES 260

/* dst (n_in / 256 * KQ_PACKED_BYTES bytes) = the packed form of x's
 * activations: exactly kq_quantize's d and codes (whatever the SIMD
 * path), so kq_unpack gives back kq_quantize's blocks bit for bit. */
void kq_pack(const float *x, int64_t n_in, uint8_t *dst);
/* dst (kq_acts_bytes(n_in, n_tok) bytes, 64-byte aligned) = what
 * kq_quantize(type, x, n_in, n_tok) writes, from the packed rows src of
 * the n_tok tokens x (kq_pack, one after another): the same codes, code
 * sums and d in the same layout. */
void kq_unpack(MnType type, const uint8_t *src, int64_t n_in, int n_tok, uint8_t *dst);

/* out[t * n_out + r] for rows [r0, r1) of w (row_bytes apart) and the
 * n_tok tokens that kq_quantize wrote at acts. Never allocates. */
void kq_rows(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in, const uint8_t *acts,
             int n_tok, float *out, int64_t n_out);

/* The same products, one output at a time in plain C: the test oracle. */
void kq_rows_ref(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                 const uint8_t *acts, int n_tok, float *out, int64_t n_out);

#endif
