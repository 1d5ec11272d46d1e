/* test_pacer.c — the step-time model (engine/pacer.h): it recovers a
 * linear cost exactly (passes with a chunk's share of the layers too),
 * keeps its coefficients non-negative, sizes chunks
 * as a brute-force search over the true cost would, starts with the probe,
 * and follows a machine that slows down within a few passes. Times are
 * made up: nothing here runs a model or reads a clock. */
#include "test_util.h"

#include <math.h>

#include "engine/pacer.h"

/* seconds of a pass of this shape, by a known linear cost: per pass, per
 * decode token, per prompt token, per attended key */
typedef struct Cost {
    double a, b, bp, c;
} Cost;

static double cost_of(Cost k, PacerShape s) { return k.a + k.b * s.n_decode + k.bp * s.n_prefill + k.c * s.n_keys; }

/* A spread of shapes: the i-th has a chunk of 0..199 prompt tokens at
 * depth 0..1499 and 0..3 decode tokens (at least one token in all). */
static PacerShape varied_shape(int i) {
    int n = (i * 37) % 200, n_decode = i % 4;
    PacerShape s = pacer_range((i * 101) % 1500, n == 0 && n_decode == 0 ? 1 : n);
    for (int k = 0; k < n_decode; k++) s = pacer_add(s, pacer_decode(300 + 250 * k + i));
    return s;
}

static const Cost COST = {0.02, 0.001, 0.003, 1e-6};

static void observe_n(Pacer *p, Cost k, int from, int n) {
    for (int i = from; i < from + n; i++) pacer_observe(p, varied_shape(i), cost_of(k, varied_shape(i)));
}

static void assert_near(double got, double want, double rel) {
    if (!(fabs(got - want) <= rel * fabs(want))) fail_msg("%.9g, want %.9g (within %g)", got, want, rel);
}

/* Passes of an exactly linear cost: the fit is that cost. Every pass
 * holds a chunk, so s (coef[4]) takes the per-pass cost and a stays
 * unmeasured (0); a decode-only pass is predicted with s in its place. */
static void test_recovers_linear_cost(void **s) {
    Cost k = COST;
    Pacer p;
    pacer_init(&p, 0.25, 32);
    observe_n(&p, k, 0, 30);
    assert_true(p.coef[0] == 0);
    assert_near(p.coef[1], k.b, 1e-5);
    assert_near(p.coef[2], k.bp, 1e-6);
    assert_near(p.coef[3], k.c, 1e-5);
    assert_near(p.coef[4], k.a, 1e-6);
    for (int i = 100; i < 110; i++) assert_near(pacer_predict(&p, varied_shape(i)), cost_of(k, varied_shape(i)), 1e-6);
    PacerShape d = pacer_add(pacer_decode(400), pacer_decode(900));
    assert_near(pacer_predict(&p, d), cost_of(k, d), 1e-5);
}

/* Passes where a chunk costs a step more than its tokens (the int8
 * kernels' first tile), every third one decode-only: the fit keeps the
 * decode-only passes' per-pass cost in a (coef[0]) and the chunks' in s
 * (coef[4]), a plus the step, so a decode-only pass is predicted at its
 * own cost, not at a share of the chunks' step. */
static void test_prompt_pass_step(void **s) {
    const Cost k = COST;
    const double step = 0.05;
    Pacer p;
    pacer_init(&p, 0.25, 32);
    for (int i = 0; i < 60; i++) {
        PacerShape sh = varied_shape(i);
        if (i % 3 == 0) sh = pacer_add(pacer_decode(400 + i), pacer_decode(900 + i));
        pacer_observe(&p, sh, cost_of(k, sh) + (sh.n_prefill > 0 ? step : 0));
    }
    assert_near(p.coef[0], k.a, 1e-4);
    assert_near(p.coef[4], k.a + step, 1e-4);
    for (int n_dec = 1; n_dec <= 6; n_dec++) {
        PacerShape d = {0};
        for (int j = 0; j < n_dec; j++) d = pacer_add(d, pacer_decode(500 + 100 * j));
        assert_near(pacer_predict(&p, d), cost_of(k, d), 1e-3);
        PacerShape c = pacer_add(d, pacer_range(700, 40));
        assert_near(pacer_predict(&p, c), cost_of(k, c) + step, 1e-3);
    }
}

/* Passes of decodes alone, of whole chunks, and of a chunk's share of the
 * layers (pacer_part) beside decodes, where a chunk's pass has a smaller
 * per-pass cost than a decode-only one (its layers read the weights under
 * their arithmetic): a pass running share f of a chunk's layers costs
 * (1 - f) times the decodes' per-pass cost, f times the chunk's, and f of
 * the chunk's tokens and keys. The fit recovers it, and
 * pacer_fit_layers gives the most layers whose pass that cost keeps
 * within a limit (one at least). */
static void test_split_share(void **s) {
    const Cost k = COST;
    const double chunk_step = 0.008, L = 22; /* the chunk's per-pass cost, under the decodes' k.a */
    Pacer p;
    pacer_init(&p, 0.25, 32);
    for (int i = 0; i < 90; i++) {
        PacerShape d = pacer_decode(500 + i);
        for (int j = 0; j < i % 4; j++) d = pacer_add(d, pacer_decode(800 + 3 * i + 100 * j));
        PacerShape sh = i % 3 == 0 ? d : pacer_add(d, pacer_part(pacer_range(100 + 7 * i, 40 + i % 90), i % 3 == 1 ? 1 : (1 + i % 21) / L));
        double f = sh.chunk;
        pacer_observe(&p, sh, (1 - f) * k.a + f * chunk_step + k.b * sh.n_decode + k.bp * sh.n_prefill + k.c * sh.n_keys);
    }
    assert_near(p.coef[0], k.a, 1e-4);
    assert_near(p.coef[4], chunk_step, 1e-3);
    PacerShape d = pacer_add(pacer_decode(700), pacer_decode(1100)), chunk = pacer_range(600, 128);
    for (int layers = 1; layers <= 22; layers++) {
        PacerShape sh = pacer_add(d, pacer_part(chunk, layers / L));
        double f = layers / L, want = (1 - f) * k.a + f * chunk_step + k.b * 2 + k.bp * sh.n_prefill + k.c * sh.n_keys;
        assert_near(pacer_predict(&p, sh), want, 1e-4);
    }
    double limit = pacer_predict(&p, pacer_add(d, pacer_part(chunk, 5 / L))) * 1.0001;
    assert_int_equal(pacer_fit_layers(&p, d, chunk, 22, 22, limit), 5);
    assert_int_equal(pacer_fit_layers(&p, d, chunk, 22, 3, limit), 3);
    assert_int_equal(pacer_fit_layers(&p, d, chunk, 22, 22, 0), 1);
}

/* Data whose least-squares fit would make deeper chunks cheaper: the
 * attention coefficient is held at 0 instead, every coefficient is >= 0,
 * and predictions never fall as a chunk grows. */
static void test_coefficients_non_negative(void **s) {
    Pacer p;
    pacer_init(&p, 0.25, 32);
    for (int i = 0; i < 30; i++) {
        PacerShape sh = varied_shape(i);
        pacer_observe(&p, sh, 0.05 + 0.003 * (sh.n_decode + sh.n_prefill) - 2e-7 * sh.n_keys);
    }
    for (int i = 0; i < PACER_N_COEF; i++) assert_true(p.coef[i] >= 0);
    assert_true(p.coef[3] == 0);
    double last = 0;
    for (int n = 1; n <= 300; n++) {
        double t = pacer_predict(&p, pacer_range(1000, n));
        assert_true(t >= last);
        last = t;
    }
}

/* The largest chunk whose pass the true cost keeps within the target. */
static int brute_force_fit(Cost k, double target, PacerShape base, int32_t pos, int max_n) {
    int n = 0;
    while (n < max_n && cost_of(k, pacer_add(base, pacer_range(pos, n + 1))) <= target) n++;
    return n;
}

/* pacer_fit: the probe before any pass; then, once the cost is learnt,
 * the chunk a brute-force search over the true cost finds (a chunk one
 * token longer may land exactly on the target: within one token), 0
 * when the step is full already, max_n when everything fits; and
 * pacer_fit_target likewise for a target other than the pacer's. */
static void test_fit_chunk(void **s) {
    Cost k = COST;
    const double target = 0.25;
    Pacer p;
    pacer_init(&p, target, 32);
    assert_int_equal(pacer_fit(&p, (PacerShape){0}, 0, 500, false), 32);
    assert_int_equal(pacer_fit(&p, (PacerShape){0}, 0, 20, false), 20);
    assert_int_equal(pacer_fit_target(&p, (PacerShape){0}, 0, 500, false, 4 * target), 32);
    assert_true(pacer_predict(&p, pacer_range(0, 10)) == 0);
    observe_n(&p, k, 0, 30);
    PacerShape decodes = pacer_add(pacer_decode(900), pacer_decode(1500));
    for (int pos = 0; pos <= 2000; pos += 250) {
        int got = pacer_fit(&p, decodes, pos, 512, false), want = brute_force_fit(k, target, decodes, pos, 512);
        if (abs(got - want) > 1) fail_msg("at position %d: a chunk of %d tokens, want %d", pos, got, want);
        assert_true(got > 0);
        /* pacer_fit_target: the same search for another target */
        int got2 = pacer_fit_target(&p, decodes, pos, 512, false, 2 * target),
            want2 = brute_force_fit(k, 2 * target, decodes, pos, 512);
        if (abs(got2 - want2) > 1)
            fail_msg("at position %d, twice the target: a chunk of %d tokens, want %d", pos, got2, want2);
        assert_true(want2 > want + 1);
    }
    assert_int_equal(pacer_fit(&p, pacer_range(0, 100), 0, 512, false), 0); /* 0.32 s already */
    assert_int_equal(pacer_fit(&p, decodes, 0, 5, false), 5);
    assert_int_equal(pacer_fit(&p, decodes, 0, 0, true), 0);
}

/* A step whose decodes alone take longer than the target: a later chunk
 * gets nothing, the step's first chunk as long as the decodes take (the
 * most tokens that keep the pass within twice theirs); where the target
 * leaves more, the first chunk gets that. */
static void test_first_chunk_share(void **s) {
    Cost k = COST;
    Pacer p;
    pacer_init(&p, 0.03, 32);
    observe_n(&p, k, 0, 30);
    PacerShape decodes = pacer_add(pacer_decode(3000), pacer_add(pacer_decode(3200), pacer_decode(3400)));
    double alone = cost_of(k, decodes);
    assert_true(alone > 0.03);
    assert_int_equal(pacer_fit(&p, decodes, 500, 512, false), 0);
    int n = pacer_fit(&p, decodes, 500, 512, true);
    assert_true(n > 0);
    if (!(cost_of(k, pacer_add(decodes, pacer_range(500, n))) <= 2 * alone * (1 + 1e-6) &&
          cost_of(k, pacer_add(decodes, pacer_range(500, n + 1))) > 2 * alone * (1 - 1e-6)))
        fail_msg("a first chunk of %d tokens beside decodes of %.4f s", n, alone);
    pacer_init(&p, 0.5, 32);
    observe_n(&p, k, 0, 30);
    assert_int_equal(pacer_fit(&p, decodes, 500, 512, true), pacer_fit(&p, decodes, 500, 512, false));
}

/* Until it has seen as many passes as coefficients, the fit cannot tell
 * them apart; it must not then promise more than the passes showed: a
 * chunk four times the one measured is predicted to cost at least four
 * times its per-token share. */
static void test_young_fit_is_cautious(void **s) {
    Cost k = COST;
    Pacer p;
    pacer_init(&p, 0.25, 32);
    PacerShape first = pacer_range(0, 32);
    pacer_observe(&p, first, cost_of(k, first));
    assert_near(pacer_predict(&p, first), cost_of(k, first), 1e-6);
    PacerShape big = pacer_range(0, 128);
    assert_true(pacer_predict(&p, big) >= cost_of(k, big));
    assert_true(p.scale == 1);
}

/* The j-th step of a server working through a prompt: three decodes
 * and a chunk of about 60 tokens, each deeper than the last. */
static PacerShape serving_shape(int j) {
    PacerShape s = pacer_range(200 + 60 * j, 60 + (j * 7) % 9);
    for (int k = 0; k < 3; k++) s = pacer_add(s, pacer_decode(800 + 100 * k + j));
    return s;
}

/* Every pass takes twice as long from some point on (the machine got
 * busy): after three such steps of a server, the next one is predicted
 * within 5% of its new cost (the decayed fit alone would still be off by
 * more than a quarter), and after many passes of every shape, every shape
 * within 10%. */
static void test_follows_slowdown(void **s) {
    Cost k = COST, slow = {2 * k.a, 2 * k.b, 2 * k.bp, 2 * k.c};
    Pacer p;
    pacer_init(&p, 0.25, 32);
    observe_n(&p, k, 0, 30);
    for (int j = 0; j < 3; j++) pacer_observe(&p, serving_shape(j), cost_of(slow, serving_shape(j)));
    assert_near(pacer_predict(&p, serving_shape(3)), cost_of(slow, serving_shape(3)), 0.05);
    observe_n(&p, slow, 30, 200);
    for (int i = 200; i < 230; i++) assert_near(pacer_predict(&p, varied_shape(i)), cost_of(slow, varied_shape(i)), 0.10);
}

/* A long run of decode-only passes (no prompt tokens) after chunks were
 * measured: the prompt-token cost is still known, so the first chunk
 * after them is sized as before, within 2%. */
static void test_decodes_keep_prompt_cost(void **s) {
    Cost k = COST;
    Pacer p;
    pacer_init(&p, 0.5, 32);
    observe_n(&p, k, 0, 40);
    PacerShape decodes = pacer_add(pacer_decode(1000), pacer_decode(1200));
    int before = pacer_fit(&p, decodes, 100, 512, false);
    for (int i = 0; i < 300; i++) {
        PacerShape d = pacer_decode(1000 + i);
        for (int j = 0; j < i % 4; j++) d = pacer_add(d, pacer_decode(400 + 100 * j + i));
        pacer_observe(&p, d, cost_of(k, d));
    }
    int after = pacer_fit(&p, decodes, 100, 512, false);
    assert_true(before > 50);
    if (abs(after - before) * 50 > before) fail_msg("a chunk of %d tokens before the decodes, %d after", before, after);
}

/* Nonsense measurements (negative, NaN, an empty pass) are ignored. */
static void test_ignores_bad_measurements(void **s) {
    Pacer p;
    pacer_init(&p, 0.25, 32);
    pacer_observe(&p, pacer_range(0, 10), -1);
    pacer_observe(&p, pacer_range(0, 10), NAN);
    pacer_observe(&p, pacer_range(0, 10), INFINITY);
    pacer_observe(&p, (PacerShape){0}, 0.1);
    assert_int_equal(p.n_obs, 0);
    assert_int_equal(pacer_fit(&p, (PacerShape){0}, 0, 500, false), 32);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recovers_linear_cost),
        cmocka_unit_test(test_coefficients_non_negative),
        cmocka_unit_test(test_prompt_pass_step),
        cmocka_unit_test(test_split_share),
        cmocka_unit_test(test_fit_chunk),
        cmocka_unit_test(test_first_chunk_share),
        cmocka_unit_test(test_young_fit_is_cautious),
        cmocka_unit_test(test_follows_slowdown),
        cmocka_unit_test(test_decodes_keep_prompt_cost),
        cmocka_unit_test(test_ignores_bad_measurements),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
