/* runner.h — one sequence driven through the forward pass: the engine as
 * the command-line tools (generate, speed) and tests use it.
 *
 * A Runner owns a KV pool sized for n_ctx tokens, a Forward and one
 * sequence. runner_eval appends tokens at the next positions, in chunks of
 * at most max_batch tokens, and hands back logits rows through a callback.
 */
#ifndef MN_RUNNER_H
#define MN_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "base/ttype.h"
#include "cache/kv_pool.h"
#include "engine/forward.h"
#include "engine/seq.h"
#include "model/model.h"

typedef struct RunnerOptions {
    int n_ctx;        /* positions the sequence may reach (default: model's) */
    int max_batch;    /* tokens per forward call (default 512) */
    int block_tokens; /* default 32 */
    int n_threads;    /* default 2 */
    MnType kv_type;   /* default f16 */
    bool all_logits;  /* room for a logits row per token of a chunk */
} RunnerOptions;

typedef struct Runner {
    const Model *m;
    RunnerOptions opt;
    KvPool pool;
    Forward *fwd;
    Seq seq;
    int n_past; /* tokens evaluated so far */
    int32_t *pos, *seqidx, *logit_idx; /* (max_batch) batch scratch */
} Runner;

/* Called for each logits row: index of the token in the evaluated span,
 * logits (n_vocab), valid during the call. Non-zero return stops the eval
 * and is returned from runner_eval. */
typedef int (*RunnerRowFn)(void *ctx, int idx, const float *logits);

void runner_options_default(RunnerOptions *o);
int runner_init(Runner *r, const Model *m, const RunnerOptions *o, MnErr *err);
void runner_deinit(Runner *r);

/* Evaluate tokens[0..n) at positions n_past.. . Logits of every token when
 * all_logits (requires opt.all_logits), else only of the last. */
int runner_eval(Runner *r, const int32_t *tokens, int n, bool all_logits, RunnerRowFn fn, void *ctx, MnErr *err);

/* Start the sequence over at position 0 (its blocks are kept for reuse). */
void runner_reset(Runner *r);

#endif
