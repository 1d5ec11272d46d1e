/* ops.h — the element-wise and row-wise kernels of the forward pass:
 * RMS norm, RoPE, SwiGLU, residual add, and f16 row conversion.
 *
 * Every reduction here is taken in a fixed order that depends only on the
 * row length (16 interleaved partial sums, then a fixed pairwise tree), so a
 * row's result never depends on the batch it is in (DESIGN.md, batch
 * invariance). The project builds in ISO C mode, so the compiler does not
 * contract a*b+c into FMA behind our back: scalar and vectorized code agree.
 */
#ifndef MN_OPS_H
#define MN_OPS_H

#include <stdint.h>

/* out = x / sqrt(mean(x^2) + eps) * w, one row of n. out may alias x. */
void ops_rmsnorm(float *out, const float *x, const float *w, int n, float eps);


/* Rotate the first n_rot dims of each of n_heads heads (head_dim apart) of
 * one token at position pos, the rotation scaled by mscale (1: a pure
 * rotation; LongRoPE's attention factor otherwise). adjacent: pairs
 * (2i, 2i+1); else pairs (i, i + n_rot/2) (NEOX / "halves"). */
void ops_rope(float *x, int n_heads, int head_dim, int n_rot, const double *inv_freq, int32_t pos, float mscale,
              int adjacent);

/* A pure rotation by position pos, for ops_rope_apply: cs[2i] = cos(pos *
 * inv_freq[i]), cs[2i+1] = sin(pos * inv_freq[i]), i < n_rot/2, as ops_rope
 * computes them (no attention factor: K already carries it once). */
void ops_rope_angles(float *cs, int n_rot, const double *inv_freq, int32_t pos);

/* Rotate as ops_rope does, by the angles of ops_rope_angles: RoPE is a
 * rotation, R(p + d) = R(d)·R(p), so K cached at p moves to p + d this way. */
void ops_rope_apply(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int adjacent);

/* out[i] = silu(gate[i]) * up[i]. out may alias gate. */
void ops_swiglu(float *out, const float *gate, const float *up, int n);

/* out[i] = gelu(gate[i]) * up[i], GELU in its tanh form
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out may alias gate. */
void ops_geglu(float *out, const float *gate, const float *up, int n);

/* x[i] = cap * tanh(x[i] / cap): soft capping (cap > 0). */
void ops_softcap(float *x, float cap, int n);

/* x[i] *= s */
void ops_scale(float *x, float s, int n);

/* y[i] += x[i] */
void ops_add(float *y, const float *x, int n);

/* Row conversions between f32 and f16 (round to nearest even). */
void ops_f32_to_f16(uint16_t *dst, const float *src, int n);
void ops_f16_to_f32(float *dst, const uint16_t *src, int n);

#endif
