/* act8.h — the rounding of f32 activations to int8 codes, one rule for the
 * int8 products of compute/kquant.c (blocks of 256) and compute/q32.c
 * (blocks of 32), written once as their scalar paths' oracle.
 *
 * A block's amax is the largest |x|, keeping the first of equal values and
 * skipping NaN as vmaxps(|x|, acc) does; its scale is 127 / amax, or 0 for
 * a block of zeros. A code is iscale * x clamped to +-127 as vmaxps/vminps
 * clamp (NaN goes to -127), rounded to even as vcvtps2dq rounds. The SIMD
 * quantizers of both files follow these steps operation for operation, so
 * every path writes the same codes (test_matmul compares the bytes).
 *
 * Also here, since both files' SIMD kernels need them: the size of a
 * group of quantized tokens (act8_group_tokens), the parking of a tile's
 * accumulators in the output between slices of a row (act8_outs_load,
 * act8_outs_store) and an f16 scale read by F16C (act8_f16).
 */
#ifndef MN_ACT8_H
#define MN_ACT8_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float act8_amax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        float ax = fabsf(x[j]);
        amax = ax > amax ? ax : amax;
    }
    return amax;
}

static inline float act8_iscale(float amax) { return amax > 0.0f ? 127.0f / amax : 0.0f; }

static inline int8_t act8_code(float iscale, float x) {
    float v = iscale * x;
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    return (int8_t)lrintf(v);
}

/* kquant.c's step, which multiplies a code back: 1 / iscale (0 for 0). */
static inline float act8_step(float iscale) { return iscale > 0.0f ? 1.0f / iscale : 0.0f; }

/* Tokens of quantized activations come in two layouts (kquant.c, q32.c):
 * rows, tok_bytes a token, for fewer than min_tiled tokens; tiles of
 * `lanes` tokens, tile_bytes a tile, from min_tiled on. The most tokens,
 * at most n_tok, whose layout fits in `bytes`; 0 if not even one does. */
static inline int act8_group_tokens(int n_tok, size_t bytes, size_t tok_bytes, size_t tile_bytes, int lanes,
                                    int min_tiled) {
    if (n_tok <= 0) return 0;
    size_t need = n_tok >= min_tiled ? (size_t)((n_tok + lanes - 1) / lanes) * tile_bytes : (size_t)n_tok * tok_bytes;
    if (need <= bytes) return n_tok;
    size_t tiles = bytes / tile_bytes; /* whole tiles */
    if (tiles * (size_t)lanes < (size_t)n_tok && tiles * (size_t)lanes >= (size_t)min_tiled) return (int)tiles * lanes;
    size_t n = bytes / tok_bytes; /* the rows layout */
    if (n > (size_t)min_tiled - 1) n = (size_t)min_tiled - 1;
    return n < (size_t)n_tok ? (int)n : n_tok;
}

/* A tiles layout's kernels keep `lanes` accumulators per weight row, one
 * per token of a tile, and park them in the output matrix between slices
 * of the row (a stored f32 reads back the same): row r's outputs for
 * tokens t0.. (nt of them, the other lanes 0) from out into v, or back. */
static inline void act8_outs_load(const float *out, int64_t n_out, long r, int t0, int nt, int lanes, float *v) {
    for (int t = 0; t < lanes; t++) v[t] = t < nt ? out[(int64_t)(t0 + t) * n_out + r] : 0.0f;
}

static inline void act8_outs_store(float *out, int64_t n_out, long r, int t0, int nt, const float *v) {
    for (int t = 0; t < nt; t++) out[(int64_t)(t0 + t) * n_out + r] = v[t];
}

#if defined(__F16C__)

/* The f16 weight scale at p as a float, by the F16C instruction (the SIMD
 * kernels of both files). */
static inline float act8_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
#endif

#endif
