/* test_sampler.c — the sampling chain: greedy and its tie rule, determinism,
 * each filter degenerating to greedy at its extreme, the drawn distribution
 * against the softmax, temperature, penalties, parameter validation and
 * broken logits. Includes sampler.c to check the top-k selection against a
 * full qsort on random rows with ties. */
#include "test_util.h"

#include <math.h>

#include "base/err.h"
#include "engine/sampler.c"

/* ---------------------------------------------------------------- helpers */

/* The test's own generator, independent of the sampler's. */
static uint64_t test_rng_state = 0x1234567ull;

static uint32_t test_rand(void) {
    test_rng_state = test_rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(test_rng_state >> 33);
}

static float test_randf(float lo, float hi) {
    return lo + (hi - lo) * (float)(test_rand() & 0xFFFFFF) / (float)0x1000000;
}

static SamplerParams params_plain(float temperature) {
    SamplerParams p;
    sampler_params_default(&p);
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

static Sampler *make(const SamplerParams *p, int32_t n_vocab) {
    Sampler *s = NULL;
    assert_int_equal(sampler_new(p, n_vocab, &s), MN_OK);
    assert_non_null(s);
    return s;
}

/* The sampler's total order for qsort: logit descending, then id. */
static int cand_cmp(const void *pa, const void *pb) {
    const SamplerCand *a = pa, *b = pb;
    if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Index of the largest value; ties to the lowest index. */
static int32_t ref_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Draw n_draws from a sampler over fixed logits and count each id. */
static void histogram(Sampler *s, const float *logits, int32_t n, int n_draws, int *counts) {
    float row[64];
    assert_true(n <= 64);
    for (int32_t i = 0; i < n; i++) counts[i] = 0;
    for (int d = 0; d < n_draws; d++) {
        memcpy(row, logits, (size_t)n * sizeof *row);
        int32_t t = sampler_sample(s, row);
        assert_true(t >= 0 && t < n);
        counts[t]++;
    }
}

/* ------------------------------------------------------------------ tests */

static void test_defaults(void **state) {
    SamplerParams p;
    sampler_params_default(&p);
    assert_true(p.temperature == 0.8f);
    assert_int_equal(p.top_k, 40);
    assert_true(p.top_p == 0.95f);
    assert_true(p.min_p == 0.05f);
    assert_true(p.repeat_penalty == 1.0f);
    assert_int_equal(p.repeat_last_n, 64);
    assert_true(p.presence_penalty == 0.0f);
    assert_true(p.frequency_penalty == 0.0f);
    assert_int_equal(p.seed, 0);
    Sampler *s = make(&p, 32000);
    sampler_free(s);
    sampler_free(NULL);
}

static void test_invalid_params(void **state) {
    SamplerParams good;
    sampler_params_default(&good);
    Sampler *s = (Sampler *)&good; /* must be reset to NULL on failure */

    assert_int_equal(sampler_new(&good, 0, &s), MN_EINVAL);
    assert_null(s);
    assert_int_equal(sampler_new(&good, -5, &s), MN_EINVAL);
    assert_int_equal(sampler_new(NULL, 10, &s), MN_EINVAL);
    assert_int_equal(sampler_new(&good, 10, NULL), MN_EINVAL);

    SamplerParams bad[16];
    int n_bad = 0;
    for (int i = 0; i < 16; i++) bad[i] = good;
    bad[n_bad++].temperature = -0.1f;
    bad[n_bad++].temperature = NAN;
    bad[n_bad++].temperature = INFINITY;
    bad[n_bad++].top_p = 0.0f;
    bad[n_bad++].top_p = -1.0f;
    bad[n_bad++].top_p = NAN;
    bad[n_bad++].min_p = -0.01f;
    bad[n_bad++].min_p = 1.01f;
    bad[n_bad++].min_p = NAN;
    bad[n_bad++].repeat_penalty = 0.0f;
    bad[n_bad++].repeat_penalty = -1.0f;
    bad[n_bad++].repeat_penalty = INFINITY;
    bad[n_bad++].repeat_last_n = -1;
    bad[n_bad++].presence_penalty = NAN;
    bad[n_bad++].frequency_penalty = -INFINITY;
    for (int i = 0; i < n_bad; i++) {
        s = (Sampler *)&good;
        assert_int_equal(sampler_new(&bad[i], 10, &s), MN_EINVAL);
        assert_null(s);
    }

    /* Edges that are allowed. */
    SamplerParams ok = good;
    ok.temperature = 0.0f;
    ok.top_p = 1.5f; /* >= 1 is off */
    ok.min_p = 1.0f;
    ok.repeat_last_n = 0;
    ok.top_k = -3;
    ok.presence_penalty = -2.0f;
    s = make(&ok, 1);
    float one = 0.0f;
    assert_int_equal(sampler_sample(s, &one), 0);
    sampler_free(s);
}

static void test_greedy(void **state) {
    SamplerParams p = params_plain(0.0f);
    Sampler *s = make(&p, 6);
    float a[6] = {0.5f, 3.0f, -1.0f, 2.9f, 3.0f, 1.0f};
    assert_int_equal(sampler_sample(s, a), 1); /* tie 1 vs 4: lowest id */
    float b[6] = {-2.0f, -1.0f, -1.0f, -3.0f, -5.0f, -1.0f};
    assert_int_equal(sampler_sample(s, b), 1);
    float c[6] = {NAN, -1.0f, NAN, 4.0f, NAN, 4.0f};
    assert_int_equal(sampler_sample(s, c), 3); /* NaN never wins */
    float d[6] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    assert_int_equal(sampler_sample(s, d), 0);
    sampler_free(s);

    /* Greedy on random rows matches a plain argmax. */
    p.temperature = -1.0f; /* rejected: temperature must be >= 0 */
    assert_int_equal(sampler_new(&p, 6, &s), MN_EINVAL);
    p.temperature = 0.0f;
    enum { N = 1000 };
    s = make(&p, N);
    float row[N], copy[N];
    for (int it = 0; it < 50; it++) {
        for (int i = 0; i < N; i++) row[i] = (float)(int)(test_rand() % 200) - 100.0f; /* ties */
        memcpy(copy, row, sizeof row);
        assert_int_equal(sampler_sample(s, copy), ref_argmax(row, N));
    }
    sampler_free(s);
}

/* Run a sampler for n_steps over a pseudo-random logits sequence that
 * depends only on logit_seed, accepting every token, and record the tokens. */
static void run_sequence(const SamplerParams *p, int32_t n_vocab, uint64_t logit_seed, int n_steps,
                         int32_t *tokens) {
    Sampler *s = make(p, n_vocab);
    float *row = malloc((size_t)n_vocab * sizeof *row);
    assert_non_null(row);
    uint64_t saved = test_rng_state;
    test_rng_state = logit_seed;
    for (int i = 0; i < 10; i++) sampler_accept(s, (int32_t)(test_rand() % (uint32_t)n_vocab));
    for (int t = 0; t < n_steps; t++) {
        for (int32_t i = 0; i < n_vocab; i++) row[i] = test_randf(-2.0f, 2.0f);
        tokens[t] = sampler_sample(s, row);
        assert_true(tokens[t] >= 0 && tokens[t] < n_vocab);
        sampler_accept(s, tokens[t]);
    }
    test_rng_state = saved;
    free(row);
    sampler_free(s);
}

static void test_determinism(void **state) {
    enum { STEPS = 300, V = 500 };
    SamplerParams p;
    sampler_params_default(&p);
    p.temperature = 1.5f;
    p.top_k = 100;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.repeat_penalty = 1.1f;
    p.frequency_penalty = 0.1f;
    p.presence_penalty = 0.1f;
    p.seed = 42;
    int32_t a[STEPS], b[STEPS], c[STEPS];
    run_sequence(&p, V, 99, STEPS, a);
    run_sequence(&p, V, 99, STEPS, b);
    assert_memory_equal(a, b, sizeof a);
    p.seed = 43;
    run_sequence(&p, V, 99, STEPS, c);
    int n_diff = 0;
    for (int i = 0; i < STEPS; i++) n_diff += a[i] != c[i];
    assert_true(n_diff > STEPS / 4);

    /* Same again with every filter off (no sorting at all). */
    SamplerParams q = params_plain(1.0f);
    q.seed = 7;
    run_sequence(&q, V, 5, STEPS, a);
    run_sequence(&q, V, 5, STEPS, b);
    assert_memory_equal(a, b, sizeof a);
    q.seed = 8;
    run_sequence(&q, V, 5, STEPS, c);
    n_diff = 0;
    for (int i = 0; i < STEPS; i++) n_diff += a[i] != c[i];
    assert_true(n_diff > STEPS / 4);
}

/* A filter at its extreme leaves only the best token, whatever the
 * temperature; rows have ties so the tie rule is exercised too. */
static void check_equals_greedy(SamplerParams p, bool allow_ties) {
    enum { N = 2000 };
    float row[N], copy[N];
    for (int ti = 0; ti < 3; ti++) {
        static const float temps[3] = {0.3f, 1.0f, 25.0f};
        p.temperature = temps[ti];
        p.seed = (uint64_t)ti;
        Sampler *s = make(&p, N);
        for (int it = 0; it < 40; it++) {
            for (int i = 0; i < N; i++) {
                row[i] = allow_ties ? (float)(int)(test_rand() % 300) * 0.01f
                                    : test_randf(-3.0f, 3.0f) + (float)i * 1e-4f;
            }
            memcpy(copy, row, sizeof row);
            assert_int_equal(sampler_sample(s, copy), ref_argmax(row, N));
        }
        sampler_free(s);
    }
}

static void test_top_k_one_is_greedy(void **state) {
    SamplerParams p = params_plain(1.0f);
    p.top_k = 1;
    check_equals_greedy(p, true);
    p.top_p = 0.5f;
    p.min_p = 0.3f;
    check_equals_greedy(p, true);
}

static void test_top_p_tiny_is_greedy(void **state) {
    SamplerParams p = params_plain(1.0f);
    p.top_p = 1e-6f;
    check_equals_greedy(p, true);
}

static void test_min_p_one_is_greedy(void **state) {
    /* min-p keeps every token tied with the best, so rows have no ties. */
    SamplerParams p = params_plain(1.0f);
    p.min_p = 1.0f;
    check_equals_greedy(p, false);
}

static void test_tiny_temperature_is_greedy(void **state) {
    SamplerParams p = params_plain(1e-30f);
    Sampler *s = make(&p, 5);
    for (int it = 0; it < 100; it++) {
        float row[5] = {1.0f, 2.0f, 2.0001f, -1.0f, 0.0f};
        assert_int_equal(sampler_sample(s, row), 2);
    }
    sampler_free(s);
}

static void test_distribution(void **state) {
    static const double probs[4] = {0.1, 0.2, 0.3, 0.4};
    float logits[4];
    for (int i = 0; i < 4; i++) logits[i] = (float)log(probs[i]) + 1.7f; /* shift-invariant */
    enum { DRAWS = 20000 };
    int counts[4];
    SamplerParams p = params_plain(1.0f);
    p.seed = 12345;
    Sampler *s = make(&p, 4);
    histogram(s, logits, 4, DRAWS, counts);
    for (int i = 0; i < 4; i++) {
        double f = (double)counts[i] / DRAWS;
        assert_true(fabs(f - probs[i]) < 0.015);
    }
    sampler_free(s);

    /* Top-k with k > 1 keeps the softmax among the kept tokens: the best two
     * in ratio 3:4. */
    p.top_k = 2;
    s = make(&p, 4);
    histogram(s, logits, 4, DRAWS, counts);
    assert_int_equal(counts[0] + counts[1], 0);
    assert_true(fabs((double)counts[3] / DRAWS - 4.0 / 7.0) < 0.015);
    sampler_free(s);
}

static void test_temperature(void **state) {
    static const double probs[4] = {0.1, 0.2, 0.3, 0.4};
    float logits[4];
    for (int i = 0; i < 4; i++) logits[i] = (float)log(probs[i]);
    static const float temps[4] = {0.25f, 0.5f, 1.0f, 3.0f};
    enum { DRAWS = 20000 };
    double top_share[4];
    for (int ti = 0; ti < 4; ti++) {
        SamplerParams p = params_plain(temps[ti]);
        p.seed = 77;
        Sampler *s = make(&p, 4);
        int counts[4];
        histogram(s, logits, 4, DRAWS, counts);
        top_share[ti] = (double)counts[3] / DRAWS;
        /* Expected: p_i^(1/T), normalized. */
        double z = 0.0;
        for (int i = 0; i < 4; i++) z += pow(probs[i], 1.0 / temps[ti]);
        assert_true(fabs(top_share[ti] - pow(0.4, 1.0 / temps[ti]) / z) < 0.015);
        sampler_free(s);
    }
    for (int ti = 1; ti < 4; ti++) assert_true(top_share[ti - 1] > top_share[ti]);
}

static void test_top_p_set(void **state) {
    /* Sorted probabilities 0.5, 0.3, 0.15, 0.05 (ids shuffled). */
    static const double probs[4] = {0.15, 0.5, 0.05, 0.3};
    float logits[4];
    for (int i = 0; i < 4; i++) logits[i] = (float)log(probs[i]);
    int counts[4];
    SamplerParams p = params_plain(1.0f);
    p.top_p = 0.79f; /* 0.5 + 0.3 reaches it: keep {1, 3} */
    Sampler *s = make(&p, 4);
    histogram(s, logits, 4, 5000, counts);
    assert_int_equal(counts[0] + counts[2], 0);
    assert_true(fabs((double)counts[1] / 5000 - 0.5 / 0.8) < 0.03);
    sampler_free(s);

    p.top_p = 0.81f; /* needs the third: keep {1, 3, 0} */
    s = make(&p, 4);
    histogram(s, logits, 4, 5000, counts);
    assert_int_equal(counts[2], 0);
    assert_true(counts[0] > 0 && counts[1] > 0 && counts[3] > 0);
    sampler_free(s);
}

static void test_min_p_set(void **state) {
    static const double probs[4] = {0.15, 0.5, 0.05, 0.3};
    float logits[4];
    for (int i = 0; i < 4; i++) logits[i] = (float)log(probs[i]);
    int counts[4];
    SamplerParams p = params_plain(1.0f);
    p.min_p = 0.2f; /* threshold 0.1: drops id 2 only */
    Sampler *s = make(&p, 4);
    histogram(s, logits, 4, 5000, counts);
    assert_int_equal(counts[2], 0);
    assert_true(counts[0] > 0 && counts[1] > 0 && counts[3] > 0);
    sampler_free(s);

    p.min_p = 0.62f; /* threshold 0.31: keeps id 1 only */
    s = make(&p, 4);
    histogram(s, logits, 4, 200, counts);
    assert_int_equal(counts[1], 200);
    sampler_free(s);
}

static void test_repeat_penalty(void **state) {
    SamplerParams p = params_plain(0.0f);
    p.repeat_penalty = 2.0f;
    Sampler *s = make(&p, 4);
    float a[4] = {2.0f, 1.5f, 0.0f, -1.0f};
    assert_int_equal(sampler_sample(s, a), 0);
    sampler_accept(s, 0);
    float b[4] = {2.0f, 1.5f, 0.0f, -1.0f};
    assert_int_equal(sampler_sample(s, b), 1); /* 2 / 2 = 1 < 1.5 */
    assert_true(b[0] == 1.0f && b[1] == 1.5f);

    /* Once per distinct token, however often it occurs. */
    sampler_accept(s, 0);
    sampler_accept(s, 0);
    float c[4] = {4.0f, 1.5f, 0.0f, -1.0f};
    assert_int_equal(sampler_sample(s, c), 0);
    assert_true(c[0] == 2.0f);
    sampler_free(s);

    /* Negative logits are multiplied, so they fall too. */
    s = make(&p, 4);
    sampler_accept(s, 0);
    float d[4] = {-1.0f, -1.5f, -3.0f, -4.0f};
    assert_int_equal(sampler_sample(s, d), 1); /* -2 < -1.5 */
    sampler_free(s);
}

static void test_frequency_presence(void **state) {
    SamplerParams p = params_plain(0.0f);
    p.frequency_penalty = 0.2f;
    Sampler *s = make(&p, 3);
    sampler_accept(s, 0);
    sampler_accept(s, 0);
    float a[3] = {2.0f, 1.5f, 0.0f};
    assert_int_equal(sampler_sample(s, a), 0); /* 2 - 0.4 = 1.6 */
    sampler_accept(s, 0);
    float b[3] = {2.0f, 1.5f, 0.0f};
    assert_int_equal(sampler_sample(s, b), 1); /* 2 - 0.6 = 1.4 */
    sampler_free(s);

    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.6f;
    s = make(&p, 3);
    sampler_accept(s, 0);
    float c[3] = {2.0f, 1.5f, 0.0f};
    assert_int_equal(sampler_sample(s, c), 1); /* 2 - 0.6 = 1.4, count-independent */
    for (int i = 0; i < 10; i++) sampler_accept(s, 0);
    float d[3] = {2.0f, 1.5f, 0.0f};
    sampler_sample(s, d);
    assert_true(fabsf(d[0] - 1.4f) < 1e-6f);
    sampler_free(s);

    /* Greedy generation with a penalty moves off a token it keeps accepting. */
    p = params_plain(0.0f);
    p.repeat_penalty = 1.3f;
    p.presence_penalty = 0.5f;
    s = make(&p, 8);
    int32_t first = -1, switched = 0;
    for (int step = 0; step < 5; step++) {
        float row[8] = {3.0f, 2.5f, 2.4f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        int32_t t = sampler_sample(s, row);
        if (step == 0) first = t;
        else if (t != first) switched = 1;
        sampler_accept(s, t);
    }
    assert_int_equal(first, 0);
    assert_true(switched);
    sampler_free(s);
}

static void test_window(void **state) {
    SamplerParams p = params_plain(0.0f);
    p.repeat_penalty = 10.0f;
    p.frequency_penalty = 1.0f;
    p.repeat_last_n = 2;
    Sampler *s = make(&p, 4);
    sampler_accept(s, 0);
    float a[4] = {2.0f, 1.0f, 0.0f, 0.0f};
    assert_int_equal(sampler_sample(s, a), 1);
    sampler_accept(s, 2);
    sampler_accept(s, 3); /* 0 leaves the window */
    float b[4] = {2.0f, 1.0f, 0.0f, 0.0f};
    assert_int_equal(sampler_sample(s, b), 0);
    assert_true(b[0] == 2.0f && b[1] == 1.0f);
    /* Out-of-range ids are ignored and do not disturb the window. */
    sampler_accept(s, -1);
    sampler_accept(s, 4);
    assert_int_equal(s->n_window, 2);
    int32_t sum = 0;
    for (int i = 0; i < 4; i++) sum += s->counts[i];
    assert_int_equal(sum, 2);
    assert_int_equal(s->counts[2], 1);
    assert_int_equal(s->counts[3], 1);
    sampler_free(s);

    /* repeat_last_n = 0: no history, no penalty. */
    p.repeat_last_n = 0;
    s = make(&p, 4);
    sampler_accept(s, 0);
    float c[4] = {2.0f, 1.0f, 0.0f, 0.0f};
    assert_int_equal(sampler_sample(s, c), 0);
    sampler_free(s);
}

/* The window counts against a plain recount of the last n accepted ids. */
static void test_window_model(void **state) {
    enum { V = 17, W = 5, STEPS = 500 };
    SamplerParams p = params_plain(1.0f);
    p.repeat_last_n = W;
    Sampler *s = make(&p, V);
    int32_t hist[STEPS];
    for (int t = 0; t < STEPS; t++) {
        hist[t] = (int32_t)(test_rand() % V);
        sampler_accept(s, hist[t]);
        int32_t ref[V] = {0};
        for (int j = t; j >= 0 && j > t - W; j--) ref[hist[j]]++;
        assert_memory_equal(ref, s->counts, sizeof ref);
        assert_int_equal(s->n_window, t + 1 < W ? t + 1 : W);
    }
    sampler_free(s);
}

/* top_k_select against a full sort, with many ties. */
static void test_top_k_select_model(void **state) {
    enum { MAXN = 3000 };
    static SamplerCand c[MAXN], ref[MAXN];
    for (int it = 0; it < 300; it++) {
        int32_t n = 2 + (int32_t)(test_rand() % (MAXN - 1));
        int32_t k = 1 + (int32_t)(test_rand() % (uint32_t)n); /* k = n: full sort */
        uint32_t spread = 1 + test_rand() % 1000;
        for (int32_t i = 0; i < n; i++) {
            c[i] = (SamplerCand){.id = i, .logit = (float)(test_rand() % spread), .prob = 0};
            ref[i] = c[i];
        }
        qsort(ref, (size_t)n, sizeof *ref, cand_cmp);
        assert_int_equal(top_k_select(c, n, k), k);
        for (int32_t i = 0; i < k; i++) {
            assert_int_equal(c[i].id, ref[i].id);
            assert_true(c[i].logit == ref[i].logit);
        }
    }
}

/* The nucleus found after top_p_prefilter equals the one of a full sort,
 * on flat and peaked rows. */
static int32_t nucleus_of(SamplerCand *c, int32_t n, double target) {
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].prob;
        if (cum >= target) return i + 1;
    }
    return n;
}

static void test_top_p_prefilter_model(void **state) {
    enum { MAXN = 5000 };
    static SamplerCand a[MAXN], b[MAXN];
    int n_filtered = 0;
    for (int it = 0; it < 300; it++) {
        int32_t n = 2 + (int32_t)(test_rand() % (MAXN - 1));
        float scale = test_randf(0.01f, 30.0f);
        float top_p = test_randf(0.01f, 0.999f);
        for (int32_t i = 0; i < n; i++) {
            float l = (it % 3 == 0) ? (float)(test_rand() % 50) : test_randf(-scale, scale);
            a[i] = (SamplerCand){.id = i, .logit = l, .prob = 0};
        }
        float max_l = a[0].logit;
        for (int32_t i = 1; i < n; i++) max_l = fmaxf(max_l, a[i].logit);
        double sum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            a[i].prob = expf(a[i].logit - max_l);
            sum += a[i].prob;
        }
        memcpy(b, a, (size_t)n * sizeof *a);
        double target = (double)top_p * sum;
        qsort(a, (size_t)n, sizeof *a, cand_cmp);
        int32_t keep_a = nucleus_of(a, n, target);
        int32_t m = top_p_prefilter(b, n, sum, target);
        n_filtered += m < n;
        top_k_select(b, m, m);
        int32_t keep_b = nucleus_of(b, m, target);
        assert_int_equal(keep_a, keep_b);
        for (int32_t i = 0; i < keep_a; i++) assert_int_equal(a[i].id, b[i].id);
    }
    assert_true(n_filtered > 100); /* the filter did cut something */
}

static void test_large_vocab(void **state) {
    enum { N = 151936 };
    float *row = malloc(N * sizeof *row), *copy = malloc(N * sizeof *copy);
    assert_non_null(row);
    assert_non_null(copy);
    for (int i = 0; i < N; i++) row[i] = test_randf(-10.0f, 10.0f);
    /* The 40 best, for membership. */
    static SamplerCand c[N];
    for (int i = 0; i < N; i++) c[i] = (SamplerCand){.id = i, .logit = row[i], .prob = 0};
    qsort(c, N, sizeof *c, cand_cmp);

    SamplerParams p;
    sampler_params_default(&p);
    p.temperature = 2.0f;
    Sampler *s = make(&p, N);
    for (int it = 0; it < 20; it++) {
        memcpy(copy, row, N * sizeof *row);
        int32_t t = sampler_sample(s, copy);
        bool found = false;
        for (int i = 0; i < 40; i++) found |= c[i].id == t;
        assert_true(found);
    }
    sampler_free(s);

    /* top-k off, top-p on: full sort; the token lies in the nucleus. */
    p.top_k = 0;
    p.top_p = 0.5f;
    p.min_p = 0.0f;
    p.temperature = 1.0f;
    s = make(&p, N);
    double max_l = c[0].logit, z = 0.0;
    for (int i = 0; i < N; i++) z += exp(c[i].logit - max_l);
    int32_t nucleus = 0;
    for (double cum = 0.0; cum < 0.5 * z; nucleus++) cum += exp(c[nucleus].logit - max_l);
    for (int it = 0; it < 10; it++) {
        memcpy(copy, row, N * sizeof *row);
        int32_t t = sampler_sample(s, copy);
        bool found = false;
        for (int i = 0; i < nucleus + 1; i++) found |= c[i].id == t;
        assert_true(found);
    }
    sampler_free(s);
    free(copy);
    free(row);
}

static void test_broken_logits(void **state) {
    SamplerParams p = params_plain(1.0f);
    Sampler *s = make(&p, 5);
    for (int it = 0; it < 200; it++) {
        float a[5] = {NAN, -INFINITY, 1.0f, NAN, -INFINITY};
        assert_int_equal(sampler_sample(s, a), 2);
        float b[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        int32_t t = sampler_sample(s, b);
        assert_true(t >= 0 && t < 5);
        float c[5] = {0.0f, INFINITY, 3.0f, NAN, 1e38f};
        t = sampler_sample(s, c);
        assert_true(t == 1 || t == 4); /* +inf clamps to FLT_MAX, near 1e38 */
        float d[5] = {NAN, NAN, NAN, NAN, NAN};
        t = sampler_sample(s, d);
        assert_true(t >= 0 && t < 5);
    }
    sampler_free(s);

    SamplerParams q;
    sampler_params_default(&q);
    q.top_k = 3;
    q.repeat_penalty = 1.5f;
    q.frequency_penalty = 1e30f;
    s = make(&q, 5);
    sampler_accept(s, 0);
    sampler_accept(s, 0);
    for (int it = 0; it < 50; it++) {
        float a[5] = {-FLT_MAX, NAN, INFINITY, 2.0f, -INFINITY};
        int32_t t = sampler_sample(s, a);
        assert_true(t >= 0 && t < 5);
    }
    sampler_free(s);
}

/* logit_bias is added before anything else: it moves greedy's choice, bans
 * a token under sampling, adds twice for an id given twice, and survives
 * the caller's array going away (the sampler keeps a copy). */
static void test_logit_bias(void **state) {
    float row[6] = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, -1.0f};
    SamplerParams p = params_plain(0.0f);
    SamplerBias *b = malloc(2 * sizeof *b);
    b[0] = (SamplerBias){.id = 4, .bias = 0.2f};
    b[1] = (SamplerBias){.id = 4, .bias = 0.2f};
    p.logit_bias = b;
    p.n_logit_bias = 2;
    Sampler *s = make(&p, 6);
    free(b);
    float a[6];
    memcpy(a, row, sizeof a);
    assert_int_equal(sampler_sample(s, a), 4); /* 2.9 + 0.4 beats 3.0 */
    sampler_free(s);

    SamplerBias ban[2] = {{.id = 1, .bias = -100.0f}, {.id = 4, .bias = -100.0f}};
    p = params_plain(1.0f);
    p.logit_bias = ban;
    p.n_logit_bias = 2;
    s = make(&p, 6);
    for (int it = 0; it < 500; it++) {
        memcpy(a, row, sizeof a);
        int32_t t = sampler_sample(s, a);
        assert_true(t != 1 && t != 4);
    }
    sampler_free(s);

    SamplerBias bad_id[1] = {{.id = 6, .bias = 1.0f}}, bad_val[1] = {{.id = 0, .bias = NAN}};
    Sampler *none = NULL;
    p.logit_bias = bad_id;
    p.n_logit_bias = 1;
    assert_int_equal(sampler_new(&p, 6, &none), MN_EINVAL);
    p.logit_bias = bad_val;
    assert_int_equal(sampler_new(&p, 6, &none), MN_EINVAL);
    p.logit_bias = NULL;
    assert_int_equal(sampler_new(&p, 6, &none), MN_EINVAL);
    assert_null(none);
}

/* log-softmax computed here in long double, straight from the definition. */
static double ref_logprob(const float *x, int32_t n, int32_t id) {
    long double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += expl((long double)x[i]);
    return (double)((long double)x[id] - logl(sum));
}

/* sampler_logprobs against the definition on random rows with ties: the
 * chosen token's value, the top list (values, and order by logit then id,
 * against a full sort), n_top 0 and n_top above the vocabulary. */
static void test_logprobs(void **state) {
    enum { N = 300 };
    float *row = malloc(N * sizeof *row);
    SamplerCand *sorted = malloc(N * sizeof *sorted);
    for (int it = 0; it < 50; it++) {
        for (int32_t i = 0; i < N; i++) row[i] = (float)(int)(test_randf(-8.0f, 8.0f) * 4) / 4; /* ties */
        int32_t token = (int32_t)(test_rand() % N);
        TokenProb chosen, top[SAMPLER_MAX_TOP_LOGPROBS];
        int n_top = it % (SAMPLER_MAX_TOP_LOGPROBS + 1);
        sampler_logprobs(row, N, token, n_top, &chosen, top);
        assert_int_equal(chosen.id, token);
        assert_float_equal(chosen.logprob, ref_logprob(row, N, token), 1e-5);
        for (int32_t i = 0; i < N; i++) sorted[i] = (SamplerCand){.id = i, .logit = row[i]};
        qsort(sorted, N, sizeof *sorted, cand_cmp);
        for (int k = 0; k < n_top; k++) {
            assert_int_equal(top[k].id, sorted[k].id);
            assert_float_equal(top[k].logprob, ref_logprob(row, N, sorted[k].id), 1e-5);
        }
    }
    /* more alternatives than tokens: all of them; probabilities sum to 1 */
    float small[3] = {0.0f, 1.0f, 0.0f};
    TokenProb chosen, top[SAMPLER_MAX_TOP_LOGPROBS];
    sampler_logprobs(small, 3, 0, 5, &chosen, top);
    assert_int_equal(top[0].id, 1);
    assert_int_equal(top[1].id, 0);
    assert_int_equal(top[2].id, 2);
    assert_float_equal(exp(top[0].logprob) + exp(top[1].logprob) + exp(top[2].logprob), 1.0, 1e-6);
    /* broken logits: NaN as -FLT_MAX, +inf as FLT_MAX; every value finite */
    float broken[4] = {NAN, INFINITY, 0.0f, -INFINITY};
    sampler_logprobs(broken, 4, 0, 4, &chosen, top);
    assert_int_equal(top[0].id, 1);
    assert_float_equal(top[0].logprob, 0.0, 1e-6);
    assert_true(isfinite(chosen.logprob) && chosen.logprob < -1e30f);
    for (int k = 0; k < 4; k++) assert_true(isfinite(top[k].logprob) && top[k].logprob <= 0.0f);
    free(sorted);
    free(row);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_invalid_params),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_top_k_one_is_greedy),
        cmocka_unit_test(test_top_p_tiny_is_greedy),
        cmocka_unit_test(test_min_p_one_is_greedy),
        cmocka_unit_test(test_tiny_temperature_is_greedy),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_p_set),
        cmocka_unit_test(test_min_p_set),
        cmocka_unit_test(test_repeat_penalty),
        cmocka_unit_test(test_frequency_presence),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_window_model),
        cmocka_unit_test(test_top_k_select_model),
        cmocka_unit_test(test_top_p_prefilter_model),
        cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_broken_logits),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_logprobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
