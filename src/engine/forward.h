/* forward.h — the batched forward pass of the transformer over paged KV.
 *
 * One call processes the tokens of many sequences at once: each token is
 * tagged with its sequence and position, its K/V are written into its
 * sequence's blocks in the pool, and logits come back only for the rows the
 * caller asks for. A batch may mix prefill chunks, decode tokens and the
 * two-range form (recomputed leading tokens + new tokens) freely.
 *
 * Results are batch-invariant: a token's logits (and the K/V it writes) are
 * bit-identical however the batch is composed, chunked or threaded — and
 * however a prompt chunk's layers are spread over passes (n_split below).
 *
 * A Forward owns its activation buffers and compute thread pool, sized at
 * fwd_new for at most max_tokens tokens and max_logits logit rows per call
 * (and max_splits split chunks' rows between calls);
 * fwd_run never allocates. It borrows the Model and the KvPool, which must
 * outlive it. One thread (the engine thread) calls it.
 */
#ifndef MN_FORWARD_H
#define MN_FORWARD_H

#include <stdint.h>

#include "base/err.h"
#include "base/threadpool.h"
#include "cache/kv_pool.h"
#include "compute/attention.h"
#include "model/model.h"

typedef struct FwdBatch {
    int n_tok;
    const int32_t *tokens;    /* (n_tok) */
    const int32_t *seq;       /* (n_tok) index into seqs */
    const int32_t *pos;       /* (n_tok) */
    const AttnSeq *seqs;      /* block tables, covering every pos */
    int n_seqs;
    const int32_t *logit_idx; /* (n_logits) batch rows whose logits are wanted */
    int n_logits;
    /* Called before layer l's attention reads the pool, after the batch's
     * own K/V of that layer are written, so KV being restored into the
     * pool can be waited for one layer at a time. NULL: nothing to wait. */
    void (*wait_layer)(void *ctx, int layer);
    void *wait_ctx;
    /* The batch's last n_split tokens (0: none) are a prompt chunk whose
     * layers are spread over several passes: this pass runs only layers
     * [split_first, split_end) of them, the batch's other tokens every
     * layer. A chunk's first pass has split_first 0; each later one has
     * the same tokens, positions and block tables and starts where the
     * one before ended; between them the chunk's residual rows wait in
     * the Forward, in carry slot split_slot (< FwdOptions.max_splits;
     * passes that do not name that slot leave it be, so chunks in other
     * slots may run meanwhile). Logits may be asked of its tokens only in
     * the pass that ends at the last layer. */
    int n_split;
    int split_first, split_end;
    int split_slot;
} FwdBatch;

typedef struct FwdOptions {
    int max_tokens;  /* tokens per call */
    int max_logits;  /* logit rows per call */
    int max_ctx;     /* largest position + 1 */
    int n_threads;
    int max_splits;  /* split chunks under way at once (carry slots of max_tokens rows; 0: none) */
} FwdOptions;

typedef struct Forward Forward;

/* MN_EINVAL for options that do not fit the model or pool, MN_ENOMEM. */
int fwd_new(const Model *m, KvPool *pool, const FwdOptions *opt, Forward **out, MnErr *err);
void fwd_free(Forward *f);

/* Run one batch. *logits receives (n_logits, n_vocab) floats, valid until
 * the next call. MN_EINVAL (with err) for a batch that breaks the limits,
 * has a token id, position or block table out of range, or a split chunk
 * that does not go on where the last one stopped; nothing is written to
 * the pool then. */
int fwd_run(Forward *f, const FwdBatch *b, const float **logits, MnErr *err);

ThreadPool *fwd_tpool(Forward *f);

/* Bytes of one token's hidden row in one layer for model m: the operand
 * its K and V projections consume (docs/DESIGN.md, "Hidden-state
 * restore") — n_embd f32, or its packed int8 row (mm_pack_row: n_embd /
 * 256 * 260 bytes for the K-quants and IQ4_XS, n_embd / 32 * 44 for Q4_0,
 * Q4_1, Q5_0, Q5_1 and IQ4_NL) when every layer's K and V weights take
 * int8 activations packed alike (mm_pack_kind). A pool given
 * hidden arenas of this row size (kvpool_init_hidden) before fwd_new has
 * them filled by every pass (the layers that have them: the first
 * KVPOOL_HIDDEN_MAX_LAYERS). */
size_t fwd_hidden_row_bytes(const Model *m);

/* How many tokens m's matmuls compute at once in a pass of n_tok tokens
 * (mm_token_lanes of its FFN weights, most of a pass's arithmetic): a
 * pass costs about what one of n_tok rounded up to a multiple of this
 * does, so the scheduler fills the last lanes when it has the tokens. */
int fwd_token_lanes(const Model *m, int n_tok);

/* Project the hidden rows of layer `layer` of blocks slots[0..n) (block i's
 * first token at position pos0[i]) into their K and V, as the pass would
 * have computed them: the same kernels, biases, K norm and RoPE, so the
 * same bits. Uses the compute pool; call between passes or from
 * wait_layer, on the engine thread. MN_EINVAL (no hidden arenas in that
 * layer, a slot or position out of range). */
int fwd_project(Forward *f, int layer, const int32_t *slots, const int32_t *pos0, int n, MnErr *err);

#endif
