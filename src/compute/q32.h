/* q32.h — products of the 32-element-block types Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0 and IQ4_NL with int8 activations (llama.cpp's Q8_0 scheme, which
 * llama.cpp pairs with Q4_0, Q5_0, Q8_0 and IQ4_NL, and Q8_1, which it
 * pairs with Q4_1 and Q5_1), mm_matmul's path for them.
 *
 * Each token's activations are quantized per 32-element block as
 * llama.cpp's Q8_0 and Q8_1 are: codes q = round-to-even((127 / amax) * x)
 * in -127..127 (compute/act8.h's rule), the step d_x = amax / 127 rounded
 * to f16, and for Q4_1/Q5_1 s_x = (amax / 127) * (sum of q) rounded to f16.
 * A weight block is the f16 scale d_w, 32 integer codes c (Q4_0: nibble -
 * 8; Q5_0: 5-bit code - 16; Q8_0: the signed byte; IQ4_NL: its level;
 * Q4_1, Q5_1: the code) and, for Q4_1 and Q5_1, the f16 min m_w. A
 * product is
 *     out[t][r] = sum over blocks b, in order, of
 *         acc = fma((float)S_b, d_w * d_x, acc),   S_b = sum of c * q
 *         and for Q4_1, Q5_1: acc = fma(m_w, s_x, acc)
 * S_b is an exact int32 (|S_b| <= 32 * 128 * 127), so every SIMD path
 * (AVX-512 VNNI, AVX2, scalar) gives the same bits whatever the tile,
 * thread or batch: the value depends only on W's row and x's row. Every
 * rounding of llama.cpp's scheme is reproduced (the f16 d_x and s_x
 * included: a step one f16 rounding apart flips codes downstream, and the
 * logits then drift by the whole quantization noise), only the f32 sums
 * run in another order; so logits meet the `llamacpp` references (to
 * ~1e-6 on files of these types alone), not `exact`.
 */
#ifndef MN_Q32_H
#define MN_Q32_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/ttype.h"

/* Whether mm_matmul multiplies `type` through this module. */
bool q32_has_type(MnType type);

/* How many tokens a product of n_tok tokens computes at once: a tile's
 * lanes (16 with AVX-512, 8 with AVX2) from the tiled layout's first
 * count on, where the last tile's spare lanes are computed for nothing;
 * else 1 (a token costs its own share). */
int q32_token_lanes(int n_tok);

/* Bytes of n_tok tokens of n_in elements (a multiple of 32) quantized by
 * q32_quantize; the layout depends on n_tok, and q32_rows reads the one
 * q32_quantize wrote for the same n_tok. */
size_t q32_acts_bytes(int64_t n_in, int n_tok);

/* The most tokens, at most n_tok, whose quantized activations fit in
 * `bytes`; 0 if not even one does. */
int q32_group_tokens(int64_t n_in, int n_tok, size_t bytes);

/* Quantize n_tok tokens x (n_tok, n_in) into dst (q32_acts_bytes bytes,
 * 64-byte aligned). Deterministic; never allocates. */
void q32_quantize(const float *x, int64_t n_in, int n_tok, uint8_t *dst);

/* q32_quantize in plain C: the same bytes (the oracle of the others). */
void q32_quantize_ref(const float *x, int64_t n_in, int n_tok, uint8_t *dst);

/* Bytes of one token's packed row (q32_pack): n_in / 32 * 44 — its n_in
 * codes, then the n_in / 32 steps d, scaled sums s (f32 holding f16
 * values) and code sums sx (int32), as the rows layout lays out a token,
 * without its padding. The same for every type of this module (only the
 * weights differ). */
size_t q32_packed_bytes(int64_t n_in);

/* dst (q32_packed_bytes) = the packed row of x: exactly what q32_quantize
 * makes of x on any path, so q32_unpack gives its bytes back. */
void q32_pack(const float *x, int64_t n_in, uint8_t *dst);

/* dst (q32_acts_bytes(n_in, n_tok) bytes, 64-byte aligned) = what
 * q32_quantize(x, n_in, n_tok) writes, from the n_tok packed rows src of
 * the tokens x (q32_pack, one after another). */
void q32_unpack(const uint8_t *src, int64_t n_in, int n_tok, uint8_t *dst);

/* out[t * n_out + r] for rows [r0, r1) of w (row_bytes apart) and the
 * n_tok tokens that q32_quantize wrote at acts. Never allocates. */
void q32_rows(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in, const uint8_t *acts,
              int n_tok, float *out, int64_t n_out);

/* The same products, one output at a time in plain C: the test oracle. */
void q32_rows_ref(MnType type, const uint8_t *w, size_t row_bytes, long r0, long r1, int64_t n_in,
                  const uint8_t *acts, int n_tok, float *out, int64_t n_out);

#endif
