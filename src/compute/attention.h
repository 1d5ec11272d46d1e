/* attention.h — multi-token causal attention over paged KV.
 *
 * One kernel for prefill, decode and partial recompute: every query token
 * carries its sequence and position, and attends to positions 0..pos of its
 * own sequence (or, with a sliding window of W, to the W positions
 * pos-W+1..pos), whose K/V rows are found through the sequence's block table
 * (logical block i holds positions [i*block_tokens, (i+1)*block_tokens)),
 * wherever those blocks lie in the arena. Query tokens of one sequence may
 * have any positions — a leading range being recomputed and a trailing range
 * of new tokens with cached blocks between them is just two runs of
 * positions; no KV is copied. The caller guarantees that K/V for every
 * position <= pos of each query token is in place.
 *
 * Batch invariance: each (token, head) output is computed from its query,
 * its position, its window and the KV of its sequence only, in an order
 * fixed by absolute positions: each score is a chain over head_dim, the
 * softmax sum is taken in 16 lanes (lane = position mod 16, ascending
 * positions in each lane) then summed in a fixed tree, and the output is
 * accumulated over ascending positions of the normalized weights (see
 * attention.c for the exact operations). Work is split over (token, kv
 * head) units, never along positions, and no arithmetic depends on which
 * tokens share a unit.
 */
#ifndef MN_ATTENTION_H
#define MN_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "base/ttype.h"

/* Where one layer's KV lives: block slot b's K rows (block_tokens, kv_dim)
 * start at arena + b*block_bytes, its V rows v_offset bytes later. */
typedef struct AttnKv {
    const uint8_t *arena;
    size_t block_bytes;
    size_t v_offset;
    int block_tokens;
    int kv_dim;
    MnType kv_type; /* MN_TYPE_F16 or MN_TYPE_F32 */
} AttnKv;

typedef struct AttnSeq {
    const int32_t *blocks; /* (n_blocks) logical block -> slot */
    int n_blocks;
} AttnSeq;

typedef struct AttnBatch {
    int n_tok;
    const float *q;        /* (n_tok, n_head * head_dim), RoPE applied */
    const int32_t *seq;    /* (n_tok) index into seqs */
    const int32_t *pos;    /* (n_tok) */
    const AttnSeq *seqs;
    int n_head, n_head_kv, head_dim;
    float scale;           /* scores are q.k times this; 0: 1/sqrt(head_dim) */
    int window;            /* sliding window: attend to the last `window` positions; 0: all */
    float softcap;         /* scores become softcap * tanh(score / softcap); 0: none */
} AttnBatch;

/* Whether attn_forward multiplies in bf16 for this KV type and head size
 * on this build: an f16 KV cache, head_dim 64 or 128, and a CPU with
 * AVX512_BF16 (the build's -march). Then q, K, V and the softmax's
 * weights are rounded to bf16 (to nearest even) and their products summed
 * in f32 (see attention.c); otherwise every product is f32. */
bool attn_uses_bf16(MnType kv_type, int head_dim);

/* Floats of scratch attn_forward needs per thread for contexts up to
 * max_ctx positions. */
size_t attn_scratch_floats(int max_ctx, int n_head, int n_head_kv, int head_dim);

/* out (n_tok, n_head * head_dim) = softmax(q k^T * scale) v over
 * each query's window, scores soft-capped when softcap > 0.
 * scratch: tpool_size(tp) * attn_scratch_floats(...) floats. */
void attn_forward(ThreadPool *tp, float *out, const AttnBatch *b, const AttnKv *kv, float *scratch,
                  size_t scratch_per_thread);

#endif
