/* sampler.h — choose the next token from a row of logits.
 *
 * The chain, in llama.cpp's default order: penalties (repetition over the
 * last repeat_last_n accepted tokens, frequency, presence) -> top-k ->
 * top-p -> min-p -> temperature -> draw with the sampler's own seeded RNG.
 * temperature <= 0 is greedy (argmax after penalties; ties go to the lowest
 * id). The same params, seed and sequence of logits give the same tokens.
 * A Sampler belongs to one sequence; it allocates only in sampler_new.
 */
#ifndef MN_SAMPLER_H
#define MN_SAMPLER_H

#include <stdint.h>

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
} SamplerParams;

typedef struct Sampler Sampler;

void sampler_params_default(SamplerParams *p);
/* MN_OK, MN_EINVAL for out-of-range params, MN_ENOMEM. */
int sampler_new(const SamplerParams *p, int32_t n_vocab, Sampler **out);
void sampler_free(Sampler *s);
/* Record a token of the sequence (prompt or generated) for the penalties. */
void sampler_accept(Sampler *s, int32_t token);
/* Pick the next token; logits (n_vocab) may be modified. */
int32_t sampler_sample(Sampler *s, float *logits);

#endif
