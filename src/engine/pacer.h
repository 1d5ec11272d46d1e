/* pacer.h — how many prompt tokens fit in an engine step, from a step-time
 * target and the steps measured so far.
 *
 * A step's forward pass costs about
 *
 *     t = a * (1 - chunk) + s * chunk + b * n_decode + b' * n_prefill + c * n_keys
 *
 * seconds: a per pass of decode tokens alone (reading the weights, which
 * dominates a decode-only step), s per pass that holds a prompt chunk
 * (chunk 1; its layers read the weights under its arithmetic, and the
 * int8 kernels' tiles of 9 or more tokens cost a step of their own, so s
 * may be below a or above it — with one per-pass cost a fit through both
 * kinds of pass predicted a decode-only pass at about twice its time),
 * b per decode token and b' per prompt token (the matmuls: a few decode
 * tokens ride on the weights' reading, a prompt chunk is bound by
 * arithmetic, so the two differ, and decode-only steps teach nothing of
 * b'), c per attended key (each token at position p reads p + 1 keys, so
 * a chunk's attention grows with its length and with how deep in its
 * sequence it sits), all times a level for how fast the machine runs now
 * (other work on its cores). The pacer learns a, s, b, b' and c (all
 * >= 0) from the passes the engine measures, by least squares over
 * recent passes (older ones weigh less), and the level within a few
 * passes. The scheduler asks it how many tokens of a prefill fit beside
 * what the step already holds, and how many layers of a chunk spread
 * over several passes: such a chunk's tokens, keys and chunk term count
 * by the share f of the model's layers a pass runs of it (every layer's
 * matmuls and attention cost alike), so that pass costs a (1 - f) + s f
 * per pass.
 *
 * A plain value: no heap, no locks; the engine thread owns it.
 */
#ifndef MN_PACER_H
#define MN_PACER_H

#include <stdbool.h>
#include <stdint.h>

/* What a pass costs by: its tokens, and the keys they attend to. A prompt
 * chunk whose layers are spread over passes (forward.h, n_split) counts in
 * a pass by its share of the layers it runs there (pacer_part). */
typedef struct PacerShape {
    int n_decode;     /* tokens of sequences with one token pending */
    double n_prefill; /* tokens of prompt chunks */
    double n_keys;    /* sum over the tokens of position + 1 */
    double chunk;     /* 1: the pass holds a prompt chunk (whole; a split one: its share) */
} PacerShape;

#define PACER_N_COEF 5 /* a, b, b', c, s */

typedef struct Pacer {
    double target_s;    /* the step-time target */
    int probe_tokens;   /* a prefill chunk before any pass was measured */
    int n_obs;          /* passes measured */
    /* decayed sums over measured passes of x x^T, x t and t^2, with
     * x = (1 - chunk, n_decode, n_prefill, n_keys, chunk) and t their
     * seconds over scale */
    double sxx[PACER_N_COEF][PACER_N_COEF], sxt[PACER_N_COEF], stt;
    double coef[PACER_N_COEF]; /* the fit: a, b, b', c, s (>= 0) */
    double scale;       /* the level: recent measured over fitted seconds */
} Pacer;

/* A pacer aiming at target_s seconds a step that, before it has measured
 * a pass, lets probe_tokens prompt tokens into one (>= 1). */
void pacer_init(Pacer *p, double target_s, int probe_tokens);

/* A pass of this shape took seconds (its compute, waits left out). */
void pacer_observe(Pacer *p, PacerShape s, double seconds);

/* Seconds a pass of this shape is expected to take; 0 before any pass was
 * measured. */
double pacer_predict(const Pacer *p, PacerShape s);

/* The shape of n prompt tokens at positions [pos, pos + n). */
PacerShape pacer_range(int32_t pos, int n);
/* The shape of a decode token at position pos. */
PacerShape pacer_decode(int32_t pos);

/* The shapes a and b together. */
PacerShape pacer_add(PacerShape a, PacerShape b);
/* A prompt chunk's shape s in a pass that runs `share` of its layers. */
PacerShape pacer_part(PacerShape s, double share);

/* How many prompt tokens at positions [pos, pos + n) may join a step
 * that already holds base, at most max_n: the most whose pass is
 * predicted within the target (0 when base alone is not). The step's
 * first chunk (is_first) gets at least as much time as the rest of the
 * step is predicted to take, and at least one token: when the decodes
 * alone fill the target (a loaded machine, a target set too short), a
 * step takes at most twice as long as they do, and prompts still
 * progress at no less than half the machine. Before any measured pass,
 * min(max_n, probe_tokens). */
int pacer_fit(const Pacer *p, PacerShape base, int32_t pos, int max_n, bool is_first);
/* pacer_fit aiming at target_s instead of the pacer's target (a step
 * whose time matters less, or more). */
int pacer_fit_target(const Pacer *p, PacerShape base, int32_t pos, int max_n, bool is_first, double target_s);
/* How many of a prompt chunk's n_layer layers (its shape: chunk, whole)
 * may join a step that holds base, at most max_layers: the most whose
 * pass is predicted within limit_s, at least 1. Before any measured
 * pass, max_layers. */
int pacer_fit_layers(const Pacer *p, PacerShape base, PacerShape chunk, int n_layer, int max_layers, double limit_s);

#endif
