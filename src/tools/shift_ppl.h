/* shift_ppl.h — `mnemo shift-ppl`: what moving cached KV to new positions
 * (context overflow, shift; engine/kv_shift.h) costs in perplexity.
 *
 * A text of keep + drop + kept tokens is computed whole. Then its middle
 * `drop` tokens are cut out, as context overflow cuts old turns, and the
 * held-out continuation of `eval` tokens is scored after the truncated
 * context twice: once with the kept tokens' KV computed again at their new
 * positions (recompute, exact), once with their KV from the whole text
 * moved there by kvshift_layer (shift) — the engine's own kernel, with the
 * engine's rules: the first keep tokens' full blocks are the whole text's
 * (same tokens, same positions), the rest of their last block is computed,
 * and the context's last token is computed (its logits score the first
 * held-out token). The perplexity of the held-out tokens under each, over
 * `trials` texts, is the measurement.
 *
 * The texts are windows of a token file (--text, tokenized with the
 * model's vocabulary) or, without one, sampled from the model itself at
 * temperature 1 (seeded), so a small model is scored on text of its own
 * distribution. */
#ifndef MN_TOOLS_SHIFT_PPL_H
#define MN_TOOLS_SHIFT_PPL_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/model.h"

typedef struct ShiftPplConfig {
    int keep;          /* tokens before the cut (a system prompt), BOS included */
    int drop;          /* tokens cut out */
    int kept;          /* tokens after the cut (the recent turns) */
    int eval;          /* held-out tokens scored */
    int trials;        /* texts measured */
    int block_tokens;  /* the pool's block size */
    int n_threads;
    uint64_t seed;     /* sampled texts */
    const int32_t *text; /* (n_text) token ids the texts are windows of; NULL: sample them */
    size_t n_text;
} ShiftPplConfig;

typedef struct ShiftPplResult {
    double ppl_shift, ppl_recompute; /* exp of the mean negative log-likelihood per held-out token */
    long n_scored;                   /* held-out tokens scored in all */
    double max_logit_diff;           /* largest |shift - recompute| of a held-out logit */
} ShiftPplResult;

/* Defaults: keep 32, drop 128, kept 256, eval 64, 4 trials, blocks of 32,
 * 2 threads, seed 1, sampled texts. */
void shiftppl_config_default(ShiftPplConfig *c);

/* Measure m. MN_EINVAL (err says why) when the sizes do not fit the
 * model's context or the text is too short; MN_ENOMEM; the forward pass's
 * errors. */
int shiftppl_measure(const Model *m, const ShiftPplConfig *c, ShiftPplResult *out, MnErr *err);

/* argv[0] is the first argument after "shift-ppl". 0 after printing the
 * figures, 1 when the model cannot be loaded or measured, 2 for bad options. */
int shiftppl_main(int argc, char **argv);

#endif
