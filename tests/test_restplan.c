/* test_restplan.c — the restore planner's arithmetic (cache/restplan.h):
 * the pipeline of reads and projections, with its bubble before the first
 * projection; HCache's split of hidden and K/V layers where reads and
 * projections end together, on hand-worked figures; that the split is
 * never slower than K/V alone; ties; eligible layers that are not the
 * first ones. Figures are the test's own: nothing is timed. */
#include "test_util.h"

#include <math.h>

#include "base/rng.h"
#include "cache/restplan.h"

/* Reads only: their sum. Projections: each after its layer's read and
 * the projection before it. */
static void test_pipe(void **s) {
    RestPipe p = {0};
    for (int l = 0; l < 3; l++) restplan_layer(&p, 1.0, 0);
    assert_true(restplan_end(&p) == 3.0);
    p = (RestPipe){0};
    restplan_layer(&p, 0.5, 2.0); /* read by 0.5, projected by 2.5 */
    restplan_layer(&p, 0.5, 2.0); /* read by 1.0, projected by 4.5 */
    restplan_layer(&p, 1.0, 0);   /* read by 2.0 */
    assert_true(restplan_end(&p) == 4.5);
    p = (RestPipe){0};
    restplan_layer(&p, 1.0, 0.25); /* projected by 1.25 */
    restplan_layer(&p, 1.0, 0.25); /* read by 2.0, projected by 2.25 */
    assert_true(restplan_end(&p) == 2.25);
}

/* restplan_time reads the mask: the same as the pipeline by hand. */
static void test_time(void **s) {
    RestFigures f = {.kv_read_s = 1.0, .hidden_read_s = 0.5, .project_s = 2.0};
    assert_true(restplan_time(&f, 3, 0) == 3.0);
    assert_true(restplan_time(&f, 3, 0x3) == 4.5);
    assert_true(restplan_time(&f, 3, 0x1) == 2.5); /* projected by 2.5, read by 2.5 */
}

/* Four layers, K/V read in 1, hidden states in 0.5, projected in 0.6.
 * All hidden: reads end at 2, projections at 0.5 + 4 x 0.6 = 2.9 (the
 * first waits for its read). Three hidden: reads at 2.5, projections at
 * 2.3: 2.5, the least — ending the reads and projections together. (A
 * model without the bubble, max(reads, 4 x 0.6 = 2.4), would take all
 * four.) */
static void test_split_meets(void **s) {
    RestFigures f = {.kv_read_s = 1.0, .hidden_read_s = 0.5, .project_s = 0.6};
    assert_int_equal(restplan_split(&f, 4, 0xf), 0x7);
    assert_true(fabs(restplan_time(&f, 4, 0x7) - 2.5) < 1e-12);
    /* fast projections: every layer; slow ones: none */
    f.project_s = 0.1;
    assert_int_equal(restplan_split(&f, 4, 0xf), 0xf);
    f.project_s = 10;
    assert_int_equal(restplan_split(&f, 4, 0xf), 0);
    /* hidden states larger than K/V (GQA with f32 rows): never */
    f = (RestFigures){.kv_read_s = 1.0, .hidden_read_s = 2.0, .project_s = 0};
    assert_int_equal(restplan_split(&f, 4, 0xf), 0);
}

/* On a CPU, where projections take the threads the pass computes on, a
 * layer is stored as hidden states only when reading and projecting it
 * beats reading its K/V with no overlap: the figures above whose split
 * relies on overlap (0.5 + 0.6 against 1.0) keep K/V; with reads slow
 * enough (0.5 + 0.4 < 1.0), the overlap model's split. */
static void test_split_shared(void **s) {
    RestFigures f = {.kv_read_s = 1.0, .hidden_read_s = 0.5, .project_s = 0.6};
    assert_int_equal(restplan_split(&f, 4, 0xf), 0x7);
    assert_int_equal(restplan_split_shared(&f, 4, 0xf), 0);
    f.project_s = 0.5; /* equal: no gain without overlap */
    assert_int_equal(restplan_split_shared(&f, 4, 0xf), 0);
    f.project_s = 0.4;
    assert_int_equal(restplan_split_shared(&f, 4, 0xf), restplan_split(&f, 4, 0xf));
    assert_true(restplan_split_shared(&f, 4, 0xf) != 0);
    f = (RestFigures){.kv_read_s = 1.0, .hidden_read_s = 2.0, .project_s = 0};
    assert_int_equal(restplan_split_shared(&f, 4, 0xf), 0);
}

/* Only the eligible layers, the first of them first; and layers past 64
 * (always K/V) count in the time. */
static void test_split_eligible(void **s) {
    RestFigures f = {.kv_read_s = 1.0, .hidden_read_s = 0.25, .project_s = 0.5};
    assert_int_equal(restplan_split(&f, 4, 0xa), 0xa);
    f.project_s = 1.4; /* layer 1: projected by 2.65, reads end at 3.25; layer 3 too: projected by 4.05 */
    assert_int_equal(restplan_split(&f, 4, 0xa), 0x2);
    assert_int_equal(restplan_split(&f, 3, 0xff), restplan_split(&f, 3, 0x7)); /* no layer 3..7 */
    assert_true(restplan_time(&f, 70, 0) == 70.0);
}

/* Equal times: the most hidden layers when they are the smaller form. */
static void test_split_ties(void **s) {
    RestFigures f = {.kv_read_s = 1.0, .hidden_read_s = 0.5, .project_s = 0.5}; /* 1.0 either way */
    assert_int_equal(restplan_split(&f, 1, 0x1), 0x1);
    f = (RestFigures){.kv_read_s = 1.0, .hidden_read_s = 1.0, .project_s = 0}; /* 3.0 whatever the split */
    assert_int_equal(restplan_split(&f, 3, 0x7), 0);
}

/* Never slower than K/V alone, and never slower than any other first-h
 * choice, over many figures. */
static void test_split_best(void **s) {
    Rng r;
    rng_seed(&r, 24, 0);
    for (int k = 0; k < 2000; k++) {
        RestFigures f = {.kv_read_s = 1e-6 + rng_unit(&r), .hidden_read_s = 1e-6 + rng_unit(&r),
                         .project_s = 3 * rng_unit(&r)};
        int n = 1 + (int)rng_below(&r, 70);
        uint64_t eligible = rng_next(&r);
        uint64_t split = restplan_split(&f, n, eligible);
        double t = restplan_time(&f, n, split);
        assert_true(t <= restplan_time(&f, n, 0));
        uint64_t mask = 0, left = n < 64 ? eligible & ((1ull << n) - 1) : eligible;
        while (left) {
            mask |= left & (~left + 1);
            left &= left - 1;
            assert_true(t <= restplan_time(&f, n, mask));
        }
        assert_true((split & ~eligible) == 0);
    }
}

/* A model deeper than a layer set (70 layers): layers 64..69 are always
 * read as K/V, whatever the mask's bits, and the split names only the
 * first 64 — here all of them, hidden states being cheap. */
static void test_deep_model(void **s) {
    RestFigures f = {.kv_read_s = 1.0, .hidden_read_s = 0.25, .project_s = 0.01};
    /* 64 hidden: read by 16, the last projection by 16.01; then 6 K/V reads */
    assert_true(restplan_time(&f, 70, UINT64_MAX) == 64 * 0.25 + 6 * 1.0);
    assert_true(restplan_time(&f, 70, 0) == 70.0);
    assert_int_equal(restplan_split(&f, 70, UINT64_MAX), UINT64_MAX);
    assert_int_equal(restplan_split(&f, 64, UINT64_MAX), UINT64_MAX);
    assert_int_equal(restplan_split(&f, 3, UINT64_MAX), 0x7);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipe),
        cmocka_unit_test(test_time),
        cmocka_unit_test(test_split_meets),
        cmocka_unit_test(test_split_shared),
        cmocka_unit_test(test_split_eligible),
        cmocka_unit_test(test_split_ties),
        cmocka_unit_test(test_split_best),
        cmocka_unit_test(test_deep_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
