/* pacer.c — sizing a step's prefill from a step-time target (see pacer.h).
 *
 * The fit. Each measured pass adds its features x = (1 - chunk,
 * n_decode, n_prefill, n_keys, chunk) and seconds t to decayed sums
 * (older passes weigh PACER_DECAY less per pass), and the coefficients
 * are the non-negative least-squares solution of those sums: with five
 * coefficients, every subset of them is solved exactly (the others held
 * at 0) and the subset with the smallest residual among those whose
 * coefficients are all >= 0 wins, the larger subset on a tie — but a
 * subset with s only when its residual is clearly smaller than the best
 * without it. A coefficient whose feature no pass has shown (a while
 * every pass holds a whole chunk, s before any chunk) is left out of the
 * solve, and the prediction puts the other per-pass cost in its place
 * (fitted). A negative coefficient would mean a
 * longer chunk or a deeper one is cheaper, and the scheduler would then
 * overfill a step. A decode-only pass has no prompt tokens, so however
 * many of them come, the sums keep what earlier chunks showed of b'
 * (they decay, but in proportion). Each solve
 * scales the normal equations to a unit diagonal and adds a tiny ridge, so
 * passes that all look alike (every decode step is) leave the system
 * solvable; what they cannot tell apart is split evenly, which the next
 * differing pass corrects.
 *
 * The level. Machine load moves every pass's time at once, which a
 * decayed fit would follow only over tens of passes, its shape bent
 * meanwhile by old and new passes disagreeing. So the time is split in
 * two: scale, the machine's current speed, a fast average of each pass's
 * seconds over what the fit gives for it; and the fit itself, of seconds
 * divided by scale, which keeps its shape when the whole machine slows
 * down. The prediction is their product. Scale moves only once the fit
 * has seen PACER_MATURE passes: a young fit's errors are its own, not the
 * machine's.
 */
#include "engine/pacer.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#define PACER_DECAY 0.95      /* weight of a pass per later pass: the fit's memory */
#define PACER_MATURE 8        /* passes before scale moves */
#define PACER_SCALE_GAIN 0.5  /* share of the newest pass in scale */
#define PACER_RATIO_MAX 4.0   /* a pass counts at most this factor off scale */
#define PACER_RIDGE 1e-9      /* on the unit diagonal: conditioning only */

/* ---- the fit ---------------------------------------------------------------- */

static void features(PacerShape s, double x[PACER_N_COEF]) {
    x[0] = 1 - s.chunk;
    x[1] = s.n_decode;
    x[2] = s.n_prefill;
    x[3] = s.n_keys;
    x[4] = s.chunk;
}

/* Solve the normal equations for the coefficients in mask (the others 0)
 * into coef, and the residual sum of squares into *rss. False when a
 * coefficient comes out negative. */
static bool solve_subset(const Pacer *p, unsigned mask, double coef[PACER_N_COEF], double *rss) {
    int idx[PACER_N_COEF], k = 0;
    double d[PACER_N_COEF];
    for (int i = 0; i < PACER_N_COEF; i++)
        if (mask >> i & 1u && p->sxx[i][i] > 0) idx[k++] = i;
    if (k == 0) return false;
    double m[PACER_N_COEF][PACER_N_COEF + 1];
    for (int r = 0; r < k; r++) d[r] = sqrt(p->sxx[idx[r]][idx[r]]);
    for (int r = 0; r < k; r++) {
        for (int c = 0; c < k; c++) m[r][c] = p->sxx[idx[r]][idx[c]] / (d[r] * d[c]) + (r == c ? PACER_RIDGE : 0);
        m[r][k] = p->sxt[idx[r]] / d[r];
    }
    for (int c = 0; c < k; c++) { /* Gaussian elimination, partial pivoting */
        int piv = c;
        for (int r = c + 1; r < k; r++)
            if (fabs(m[r][c]) > fabs(m[piv][c])) piv = r;
        for (int j = 0; j <= k; j++) {
            double t = m[c][j];
            m[c][j] = m[piv][j];
            m[piv][j] = t;
        }
        for (int r = c + 1; r < k; r++) {
            double f = m[r][c] / m[c][c];
            for (int j = c; j <= k; j++) m[r][j] -= f * m[c][j];
        }
    }
    double u[PACER_N_COEF] = {0}; /* every u[j] read is set first; GCC 12 cannot see it on some -march */
    for (int r = k - 1; r >= 0; r--) {
        double v = m[r][k];
        for (int j = r + 1; j < k; j++) v -= m[r][j] * u[j];
        u[r] = v / m[r][r];
    }
    memset(coef, 0, PACER_N_COEF * sizeof *coef);
    for (int r = 0; r < k; r++) {
        if (!(u[r] >= 0)) return false; /* negative, or NaN */
        coef[idx[r]] = u[r] / d[r];
    }
    double e = p->stt;
    for (int i = 0; i < PACER_N_COEF; i++) {
        e -= 2 * coef[i] * p->sxt[i];
        for (int j = 0; j < PACER_N_COEF; j++) e += coef[i] * p->sxx[i][j] * coef[j];
    }
    *rss = e;
    return true;
}

/* The non-negative least-squares coefficients of the sums (see the top). */
static void refit(Pacer *p) {
    /* larger subsets first, those without s (bit 4) before those with
     * it: a later one replaces the best only when its residual is
     * clearly smaller */
    static const unsigned masks[] = {15, 7, 11, 13, 14, 3, 5, 6, 9, 10, 12, 1, 2, 4, 8, 31, 23, 27, 29, 30, 19, 21,
                                     22, 25, 26, 28, 17, 18, 20, 24, 16};
    double best_rss = INFINITY, coef[PACER_N_COEF], rss;
    for (size_t i = 0; i < sizeof masks / sizeof *masks; i++) {
        if (!solve_subset(p, masks[i], coef, &rss)) continue;
        if (rss < best_rss - 1e-9 * p->stt) {
            best_rss = rss;
            memcpy(p->coef, coef, sizeof coef);
        }
    }
}

/* The fit's seconds for shape s. A per-pass cost no measured pass has
 * shown (no pass with layers of decodes alone, or none with a chunk) is
 * taken to be the other's: a guess until such a pass comes, and one that
 * errs towards smaller chunks. */
static double fitted(const Pacer *p, PacerShape s) {
    double x[PACER_N_COEF], coef[PACER_N_COEF], t = 0;
    features(s, x);
    memcpy(coef, p->coef, sizeof coef);
    if (p->sxx[0][0] == 0) coef[0] = coef[4];
    if (p->sxx[4][4] == 0) coef[4] = coef[0];
    for (int i = 0; i < PACER_N_COEF; i++) t += coef[i] * x[i];
    return t;
}

/* ---- API -------------------------------------------------------------------- */

void pacer_init(Pacer *p, double target_s, int probe_tokens) {
    memset(p, 0, sizeof *p);
    p->target_s = target_s;
    p->probe_tokens = probe_tokens > 0 ? probe_tokens : 1;
    p->scale = 1;
}

void pacer_observe(Pacer *p, PacerShape s, double seconds) {
    if (!(seconds >= 0) || !isfinite(seconds) || s.n_decode + s.n_prefill <= 0) return;
    double fit = fitted(p, s);
    if (p->n_obs >= PACER_MATURE && fit > 0) {
        double lo = p->scale / PACER_RATIO_MAX, hi = p->scale * PACER_RATIO_MAX, level = seconds / fit;
        level = level < lo ? lo : level > hi ? hi : level;
        p->scale = (1 - PACER_SCALE_GAIN) * p->scale + PACER_SCALE_GAIN * level;
    }
    double t = seconds / p->scale, x[PACER_N_COEF];
    features(s, x);
    for (int i = 0; i < PACER_N_COEF; i++) {
        for (int j = 0; j < PACER_N_COEF; j++) p->sxx[i][j] = PACER_DECAY * p->sxx[i][j] + x[i] * x[j];
        p->sxt[i] = PACER_DECAY * p->sxt[i] + x[i] * t;
    }
    p->stt = PACER_DECAY * p->stt + t * t;
    p->n_obs++;
    refit(p);
}

double pacer_predict(const Pacer *p, PacerShape s) { return p->n_obs > 0 ? p->scale * fitted(p, s) : 0; }

PacerShape pacer_range(int32_t pos, int n) {
    return (PacerShape){0, n, (double)n * (double)pos + (double)n * (n + 1) / 2, n > 0};
}

PacerShape pacer_decode(int32_t pos) { return (PacerShape){1, 0, (double)pos + 1, 0}; }

/* A pass holds at most one split chunk, and a whole chunk's tiles run in
 * every layer: the pass's chunk term is the larger of the two. */
PacerShape pacer_add(PacerShape a, PacerShape b) {
    return (PacerShape){a.n_decode + b.n_decode, a.n_prefill + b.n_prefill, a.n_keys + b.n_keys,
                        a.chunk > b.chunk ? a.chunk : b.chunk};
}

PacerShape pacer_part(PacerShape s, double share) {
    return (PacerShape){s.n_decode, s.n_prefill * share, s.n_keys * share, s.chunk * share};
}

/* The most tokens at [pos, pos + n), n <= max_n, that keep a step holding
 * base within limit_s seconds. The predicted time grows with n (the
 * coefficients are >= 0): bisection. */
static int fit_within(const Pacer *p, PacerShape base, int32_t pos, int max_n, double limit_s) {
    int lo = 0, hi = max_n;
    if (pacer_predict(p, pacer_add(base, pacer_range(pos, hi))) <= limit_s) return hi;
    while (hi - lo > 1) { /* lo fits (or is 0), hi does not */
        int mid = lo + (hi - lo) / 2;
        if (pacer_predict(p, pacer_add(base, pacer_range(pos, mid))) <= limit_s) lo = mid;
        else hi = mid;
    }
    return lo;
}

int pacer_fit(const Pacer *p, PacerShape base, int32_t pos, int max_n, bool is_first) {
    return pacer_fit_target(p, base, pos, max_n, is_first, p->target_s);
}

int pacer_fit_target(const Pacer *p, PacerShape base, int32_t pos, int max_n, bool is_first, double target_s) {
    if (max_n <= 0) return 0;
    if (p->n_obs == 0) return max_n < p->probe_tokens ? max_n : p->probe_tokens;
    int n = fit_within(p, base, pos, max_n, target_s);
    if (!is_first) return n;
    int share = fit_within(p, base, pos, max_n, 2 * pacer_predict(p, base));
    n = share > n ? share : n;
    return n > 0 ? n : 1;
}

int pacer_fit_layers(const Pacer *p, PacerShape base, PacerShape chunk, int n_layer, int max_layers, double limit_s) {
    if (p->n_obs == 0) return max_layers;
    int k = 1; /* the predicted time grows with the layers */
    while (k < max_layers && pacer_predict(p, pacer_add(base, pacer_part(chunk, (double)(k + 1) / n_layer))) <= limit_s)
        k++;
    return k;
}
