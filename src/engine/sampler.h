/* sampler.h — choose the next token from a row of logits.
 *
 * The chain, in llama.cpp's default order: logit bias -> penalties
 * (repetition over the last repeat_last_n accepted tokens, frequency,
 * presence) -> top-k ->
 * top-p -> min-p -> temperature -> draw with the sampler's own seeded RNG.
 * temperature <= 0 is greedy (argmax after penalties; ties go to the lowest
 * id). The same params, seed and sequence of logits give the same tokens.
 * A Sampler belongs to one sequence; it allocates only in sampler_new.
 */
#ifndef MN_SAMPLER_H
#define MN_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

/* A bias added to one token's logit before anything else (OpenAI's
 * logit_bias: -100 all but bans the token, 100 all but forces it). */
typedef struct SamplerBias {
    int32_t id;  /* in [0, n_vocab) */
    float bias;  /* finite */
} SamplerBias;

typedef struct SamplerParams {
    float temperature;       /* default 0.8; <= 0 greedy */
    int32_t top_k;           /* default 40; <= 0 off */
    float top_p;             /* default 0.95; >= 1 off */
    float min_p;             /* default 0.05; <= 0 off */
    float repeat_penalty;    /* default 1.0 (off) */
    int32_t repeat_last_n;   /* default 64 */
    float presence_penalty;  /* default 0 */
    float frequency_penalty; /* default 0 */
    uint64_t seed;           /* default 0xFFFFFFFF-style "random" is the caller's job */
    const SamplerBias *logit_bias; /* (n_logit_bias) borrowed: sampler_new copies it; an id
                                      given twice adds both biases. Default none */
    int32_t n_logit_bias;
} SamplerParams;

/* A token and its log-probability. */
typedef struct TokenProb {
    int32_t id;
    float logprob;
} TokenProb;

#define SAMPLER_MAX_TOP_LOGPROBS 20 /* OpenAI's limit on top_logprobs */

typedef struct Sampler Sampler;

void sampler_params_default(SamplerParams *p);
/* Whether sampler_new takes p for a vocabulary of n_vocab: every field in
 * its range, every logit_bias id inside the vocabulary. */
bool sampler_params_valid(const SamplerParams *p, int32_t n_vocab);
/* MN_OK, MN_EINVAL where sampler_params_valid is false, MN_ENOMEM. */
int sampler_new(const SamplerParams *p, int32_t n_vocab, Sampler **out);
void sampler_free(Sampler *s);
/* Record a token of the sequence (prompt or generated) for the penalties. */
void sampler_accept(Sampler *s, int32_t token);
/* Pick the next token; logits (n_vocab) may be modified. */
int32_t sampler_sample(Sampler *s, float *logits);

/* The log-probabilities of the model's distribution: the log-softmax of
 * logits (n_vocab, unchanged) as they come from the model, before bias,
 * penalties, temperature and truncation — what OpenAI's logprobs report.
 * *chosen gets token's; top[0..n_top) the n_top most likely tokens, best
 * first, ties to the lower id (0 <= n_top <= SAMPLER_MAX_TOP_LOGPROBS;
 * top may be NULL when n_top is 0). Logits are sanitized as the sampler
 * does (NaN as -FLT_MAX, infinities clamped), so every result is finite
 * and <= 0. Never allocates. */
void sampler_logprobs(const float *logits, int32_t n_vocab, int32_t token, int n_top, TokenProb *chosen,
                      TokenProb *top);

#endif
