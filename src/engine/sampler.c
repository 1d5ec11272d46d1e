/* sampler.c — see sampler.h.
 *
 * A Sampler turns one row of logits into one token id. It belongs to a
 * single sequence and is used only by the engine thread, so it holds no
 * locks. Everything it needs per call is allocated in sampler_new: a
 * candidate array of n_vocab (id, logit) pairs, a ring of the last
 * repeat_last_n accepted tokens, a per-token count of how often each id
 * occurs in that ring and a copy of the logit biases. sampler_sample never
 * allocates.
 *
 * The chain, in order:
 *
 *   logit bias   logit += bias for each (id, bias) of the request
 *   penalties    on the logits of the tokens in the window, once per
 *                distinct token: repetition (CTRL style, logit > 0 ?
 *                logit / penalty : logit * penalty), then
 *                logit -= count * frequency + (count > 0) * presence
 *   greedy       temperature <= 0: argmax, ties to the lowest id
 *   top-k        keep the k best (a size-k min-heap, then heapsort: O(n log k))
 *   top-p        keep the shortest prefix (best first) whose probability
 *                mass reaches top_p; needs the candidates sorted (without
 *                top-k, only those that can matter: top_p_prefilter)
 *   min-p        keep p >= min_p * p_max
 *   temperature  softmax of (logit - max) / T over what is left, one draw
 *
 * top-p and min-p see temperature-1 probabilities, as in llama.cpp's default
 * chain. Candidates are ordered totally (logit descending, then id
 * ascending) so that the same params, seed and logits always give the same
 * token. Logits are sanitized when copied into candidates (NaN -> -FLT_MAX,
 * +-inf clamped to +-FLT_MAX) so a broken row still samples something.
 *
 * Invariants: 0 <= n_window <= repeat_last_n; counts[t] is the number of
 * times t occurs in ring[0..n_window); the sum of counts equals n_window.
 * Every non-greedy sample consumes exactly one 64-bit draw of its Rng
 * (base/rng, stream 0 of the seed).
 *
 * sampler_logprobs is separate from the chain: it reports the model's own
 * distribution (log-softmax of the raw row), which is what a client asking
 * for logprobs wants to see whatever sampling settings it chose.
 */
#include "engine/sampler.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"
#include "base/rng.h"

/* ------------------------------------------------------------------ types */

typedef struct SamplerCand {
    int32_t id;
    float logit; /* sanitized and penalized */
    float prob;  /* scratch: exp((logit - max) / T), unnormalized */
} SamplerCand;

struct Sampler {
    SamplerParams params;
    int32_t n_vocab;
    SamplerCand *cands; /* (n_vocab) */
    int32_t *ring;      /* (max(repeat_last_n, 1)) last accepted tokens */
    int32_t ring_head;  /* next slot to write */
    int32_t n_window;   /* valid entries in ring */
    int32_t *counts;    /* (n_vocab) occurrences of each id in the ring */
    SamplerBias *bias;  /* (params.n_logit_bias) owned copy; params.logit_bias points here */
    Rng rng;            /* base/rng: seeded with params.seed, stream 0 */
};

/* --------------------------------------------------------------------- API */

void sampler_params_default(SamplerParams *p) {
    assert(p != NULL);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
}

/* Written as positive checks so that NaN fails every one of them. */
static bool params_valid(const SamplerParams *p) {
    if (!(isfinite(p->temperature) && p->temperature >= 0.0f)) return false;
    if (!(isfinite(p->top_p) && p->top_p > 0.0f)) return false;
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return false;
    if (!(isfinite(p->repeat_penalty) && p->repeat_penalty > 0.0f)) return false;
    if (p->repeat_last_n < 0) return false;
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty)) return false;
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && p->logit_bias == NULL)) return false;
    return true;
}

static bool bias_valid(const SamplerParams *p, int32_t n_vocab) {
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const SamplerBias *b = &p->logit_bias[i];
        if (b->id < 0 || b->id >= n_vocab || !isfinite(b->bias)) return false;
    }
    return true;
}

bool sampler_params_valid(const SamplerParams *p, int32_t n_vocab) {
    return p != NULL && n_vocab > 0 && params_valid(p) && bias_valid(p, n_vocab);
}

int sampler_new(const SamplerParams *p, int32_t n_vocab, Sampler **out) {
    if (out == NULL) return MN_EINVAL;
    *out = NULL;
    if (!sampler_params_valid(p, n_vocab)) return MN_EINVAL;

    Sampler *s = mn_calloc(1, sizeof *s);
    if (s == NULL) return MN_ENOMEM;
    s->params = *p;
    s->n_vocab = n_vocab;
    /* Sizes go through mn_calloc's overflow check (repeat_last_n may be huge). */
    s->cands = mn_calloc((size_t)n_vocab, sizeof *s->cands);
    s->counts = mn_calloc((size_t)n_vocab, sizeof *s->counts);
    s->ring = mn_calloc(p->repeat_last_n > 0 ? (size_t)p->repeat_last_n : 1, sizeof *s->ring);
    s->bias = mn_calloc(p->n_logit_bias > 0 ? (size_t)p->n_logit_bias : 1, sizeof *s->bias);
    if (s->cands == NULL || s->counts == NULL || s->ring == NULL || s->bias == NULL) {
        sampler_free(s);
        return MN_ENOMEM;
    }
    if (p->n_logit_bias > 0) memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    s->params.logit_bias = s->bias;
    rng_seed(&s->rng, p->seed, 0);
    *out = s;
    return MN_OK;
}

void sampler_free(Sampler *s) {
    if (s == NULL) return;
    mn_free(s->bias);
    mn_free(s->ring);
    mn_free(s->counts);
    mn_free(s->cands);
    mn_free(s);
}

/* Ids outside [0, n_vocab) are ignored: they cannot be penalized and must
 * not index counts. */
void sampler_accept(Sampler *s, int32_t token) {
    assert(s != NULL);
    int32_t cap = s->params.repeat_last_n;
    if (cap == 0 || token < 0 || token >= s->n_vocab) return;
    if (s->n_window == cap) {
        s->counts[s->ring[s->ring_head]]--; /* evict the oldest, overwritten below */
    } else {
        s->n_window++;
    }
    s->ring[s->ring_head] = token;
    s->counts[token]++;
    s->ring_head = (s->ring_head + 1 == cap) ? 0 : s->ring_head + 1;
}

/* The sampler's view of a logit: NaN as -FLT_MAX, infinities clamped. */
static inline float logit_clean(float l) {
    if (isnan(l)) return -FLT_MAX;
    if (l > FLT_MAX) return FLT_MAX;
    if (l < -FLT_MAX) return -FLT_MAX;
    return l;
}

static void apply_penalties(Sampler *s, float *logits);
static int32_t argmax(const float *logits, int32_t n);
static int32_t top_k_select(SamplerCand *c, int32_t n, int32_t k);
static int32_t sample_filtered(Sampler *s, int32_t n_cand, bool is_sorted);

int32_t sampler_sample(Sampler *s, float *logits) {
    assert(s != NULL && logits != NULL);
    const SamplerParams *p = &s->params;
    int32_t n = s->n_vocab;

    for (int32_t i = 0; i < p->n_logit_bias; i++) logits[p->logit_bias[i].id] += p->logit_bias[i].bias;
    apply_penalties(s, logits);
    if (p->temperature <= 0.0f) return argmax(logits, n);

    for (int32_t i = 0; i < n; i++) s->cands[i] = (SamplerCand){.id = i, .logit = logit_clean(logits[i]), .prob = 0.0f};

    int32_t n_cand = n;
    bool is_sorted = false;
    if (p->top_k > 0 && p->top_k < n) {
        n_cand = top_k_select(s->cands, n, p->top_k);
        is_sorted = true;
    }
    return sample_filtered(s, n_cand, is_sorted);
}

/* logit - lse as a float; -FLT_MAX - FLT_MAX (a NaN row entry beside an
 * infinite one) would round to -inf, so it is clamped. */
static float logprob_of(float logit, double lse) {
    double x = (double)logit - lse;
    return x < -FLT_MAX ? -FLT_MAX : (float)x;
}

void sampler_logprobs(const float *logits, int32_t n_vocab, int32_t token, int n_top, TokenProb *chosen,
                      TokenProb *top) {
    assert(logits != NULL && n_vocab > 0 && token >= 0 && token < n_vocab && chosen != NULL);
    assert(n_top >= 0 && n_top <= SAMPLER_MAX_TOP_LOGPROBS && (n_top == 0 || top != NULL));
    if (n_top > n_vocab) n_top = n_vocab;
    /* One pass keeps the max and the n_top best (insertion into a short
     * sorted list: most candidates are rejected with one comparison);
     * top[].logprob holds the logit until the end. */
    float max_l = -FLT_MAX;
    int n_have = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        float l = logit_clean(logits[i]);
        if (l > max_l) max_l = l;
        if (n_top == 0 || (n_have == n_top && !(l > top[n_have - 1].logprob))) continue;
        int at = n_have < n_top ? n_have++ : n_top - 1; /* equal logits keep the lower id first */
        while (at > 0 && l > top[at - 1].logprob) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = (TokenProb){.id = i, .logprob = l};
    }
    /* log-sum-exp around the max: every term is in (0, 1], the sum >= 1 */
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)logit_clean(logits[i]) - max_l);
    double lse = (double)max_l + log(sum);
    for (int i = 0; i < n_have; i++) top[i].logprob = logprob_of(top[i].logprob, lse);
    chosen->id = token;
    chosen->logprob = logprob_of(logit_clean(logits[token]), lse);
}

/* ----------------------------------------------------------------- helpers */

/* Penalize each distinct token of the window once. A visited token's count
 * is negated as a mark and restored afterwards, so no scratch set is needed. */
static void apply_penalties(Sampler *s, float *logits) {
    const SamplerParams *p = &s->params;
    if (s->n_window == 0) return;
    if (p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f)
        return;
    for (int32_t i = 0; i < s->n_window; i++) {
        int32_t t = s->ring[i];
        int32_t count = s->counts[t];
        if (count <= 0) continue; /* already visited */
        float l = logits[t];
        l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)count * p->frequency_penalty + p->presence_penalty;
        logits[t] = l;
        s->counts[t] = -count;
    }
    for (int32_t i = 0; i < s->n_window; i++) {
        int32_t t = s->ring[i];
        if (s->counts[t] < 0) s->counts[t] = -s->counts[t];
    }
}

/* NaN never wins; an all-NaN row gives id 0. */
static int32_t argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    float best_l = logits[0];
    for (int32_t i = 1; i < n; i++) {
        if (logits[i] > best_l || (isnan(best_l) && !isnan(logits[i]))) {
            best = i;
            best_l = logits[i];
        }
    }
    return best;
}

/* The total order of candidates: a ranks before b. */
static inline bool cand_before(const SamplerCand *a, const SamplerCand *b) {
    if (a->logit != b->logit) return a->logit > b->logit;
    return a->id < b->id;
}

/* Sift down in a heap whose root is the candidate that ranks last. */
static void heap_sift_down(SamplerCand *h, int32_t n, int32_t i) {
    SamplerCand x = h[i];
    for (;;) {
        int32_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && cand_before(&h[child], &h[child + 1])) child++;
        if (!cand_before(&x, &h[child])) break;
        h[i] = h[child];
        i = child;
    }
    h[i] = x;
}

/* Move the k best of c[0..n) to c[0..k), sorted best first; 0 < k <= n.
 * A heap of the k best seen so far, rooted at the worst of them, rejects
 * most candidates with one comparison; heapsort then orders the k. With
 * k = n it is a plain heapsort, which top-p uses instead of qsort: glibc's
 * qsort may malloc, and the sampler must not allocate after sampler_new. */
static int32_t top_k_select(SamplerCand *c, int32_t n, int32_t k) {
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_sift_down(c, k, i);
    for (int32_t i = k; i < n; i++) {
        if (cand_before(&c[i], &c[0])) {
            c[0] = c[i];
            heap_sift_down(c, k, 0);
        }
    }
    for (int32_t end = k - 1; end > 0; end--) {
        SamplerCand t = c[0];
        c[0] = c[end];
        c[end] = t;
        heap_sift_down(c, end, 0);
    }
    return k;
}

/* Before top-p sorts a whole vocabulary, move the candidates with
 * prob >= tau = (1 - top_p) * sum / n to the front. Those below tau hold less
 * than (1 - top_p) of the mass together, so the front alone reaches the
 * target. prob is monotone in logit, so the front is a prefix of the total
 * order and sorting it gives exactly the first entries of a full sort. The
 * check (with a margin for summation order) keeps that exact; if it fails,
 * every candidate is still in c and the caller sorts them all. Returns how
 * many to sort. c[i].prob holds exp(logit - max). */
static int32_t top_p_prefilter(SamplerCand *c, int32_t n, double sum, double target) {
    double tau = (sum - target) / n, mass = 0.0;
    int32_t front = 0;
    for (int32_t i = 0; i < n; i++) {
        if (c[i].prob >= tau) {
            mass += c[i].prob;
            SamplerCand t = c[front];
            c[front++] = c[i];
            c[i] = t;
        }
    }
    return mass * (1.0 - 1e-9) >= target ? front : n;
}

/* top-p, min-p, temperature and the draw over c[0..n_cand). */
static int32_t sample_filtered(Sampler *s, int32_t n_cand, bool is_sorted) {
    const SamplerParams *p = &s->params;
    SamplerCand *c = s->cands;

    if (p->top_p < 1.0f && n_cand > 1) {
        float max_l = c[0].logit;
        if (!is_sorted)
            for (int32_t i = 1; i < n_cand; i++) max_l = fmaxf(max_l, c[i].logit);
        double sum = 0.0;
        for (int32_t i = 0; i < n_cand; i++) {
            c[i].prob = expf(c[i].logit - max_l);
            sum += c[i].prob;
        }
        double target = (double)p->top_p * sum, cum = 0.0;
        if (!is_sorted) {
            n_cand = top_p_prefilter(c, n_cand, sum, target);
            top_k_select(c, n_cand, n_cand);
            is_sorted = true;
        }
        int32_t keep = n_cand;
        for (int32_t i = 0; i < n_cand; i++) {
            cum += c[i].prob;
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
        n_cand = keep;
    }

    /* p_i >= min_p * p_max  <=>  exp(l_i - max) >= min_p. The best candidate
     * has exp(0) = 1 >= min_p and always stays; order is preserved. */
    if (p->min_p > 0.0f && n_cand > 1) {
        float max_l = c[0].logit;
        if (!is_sorted)
            for (int32_t i = 1; i < n_cand; i++) max_l = fmaxf(max_l, c[i].logit);
        int32_t kept = 0;
        for (int32_t i = 0; i < n_cand; i++) {
            if (expf(c[i].logit - max_l) >= p->min_p) c[kept++] = c[i];
        }
        n_cand = kept;
    }

    float max_l = c[0].logit;
    for (int32_t i = 1; i < n_cand; i++) max_l = fmaxf(max_l, c[i].logit);
    /* (l - max) <= 0, so even a denormal T gives exp(-inf) = 0 or exp(0) = 1;
     * multiplying by 1/T instead could make 0 * inf = NaN. */
    float t = p->temperature;
    double sum = 0.0;
    for (int32_t i = 0; i < n_cand; i++) {
        c[i].prob = expf((c[i].logit - max_l) / t);
        sum += c[i].prob;
    }
    double u = rng_unit(&s->rng) * sum, cum = 0.0;
    for (int32_t i = 0; i < n_cand; i++) {
        cum += c[i].prob;
        if (u < cum) return c[i].id;
    }
    /* Rounding left u at or past the total: take the last with mass. */
    for (int32_t i = n_cand - 1; i > 0; i--)
        if (c[i].prob > 0.0f) return c[i].id;
    return c[0].id;
}
