/* test_rng.c — base/rng: the generators against their published reference
 * outputs, the seeded streams pinned (a sampled reply, a bench plan and a
 * generated model are functions of them: a change here would change those
 * silently), and the distributions' ranges and means on fixed seeds. */
#include "test_util.h"

#include <math.h>

#include "base/rng.h"

/* splitmix64 from 1234567 and xoshiro256** from the state {1, 2, 3, 4}:
 * the first outputs their authors' reference code prints. */
static void test_reference_outputs(void **state) {
    (void)state;
    uint64_t x = 1234567;
    assert_true(rng_splitmix64(&x) == 6457827717110365317ull);
    assert_true(rng_splitmix64(&x) == 3203168211198807973ull);
    assert_true(rng_splitmix64(&x) == 9817491932198370423ull);
    Rng r = {{1, 2, 3, 4}};
    assert_true(rng_next(&r) == 11520ull);
    assert_true(rng_next(&r) == 0ull);
    assert_true(rng_next(&r) == 1509978240ull);
    assert_true(rng_next(&r) == 1215971899390074240ull);
}

/* Stream 0 of a seed starts from the seed itself (the sampler's seeding);
 * another stream from seed ^ stream * 0xd1b54a32d192ed03 (the bench's).
 * The values are what the sampler's and the workload's own generators
 * gave before they became this one. */
static void test_streams_pinned(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 42, 0);
    uint64_t x = 42;
    for (int i = 0; i < 4; i++) assert_true(r.s[i] == rng_splitmix64(&x));
    assert_true(rng_next(&r) == 0x15780b2e0c2ec716ull);
    assert_true(rng_next(&r) == 0x6104d9866d113a7eull);
    assert_true(rng_next(&r) == 0xae17533239e499a1ull);
    rng_seed(&r, 42, 1003);
    assert_true(rng_next(&r) == 0xc9c2eff541d302e3ull);
    assert_true(rng_next(&r) == 0x91f87088f4fb0287ull);
    assert_true(rng_next(&r) == 0x1137be6e089689f9ull);
    /* rng_unit is the top 53 bits of one draw; rng_below one draw modulo n */
    Rng a, b;
    rng_seed(&a, 7, 2);
    rng_seed(&b, 7, 2);
    assert_true(rng_unit(&a) == (double)(rng_next(&b) >> 11) * 0x1.0p-53);
    assert_true(rng_below(&a, 1000) == rng_next(&b) % 1000);
    assert_true(rng_below(&a, 0) == 0);
    assert_true(memcmp(&a, &b, sizeof a) == 0); /* n == 0 draws nothing */
}

/* Ranges always, and means within a few standard errors on a fixed seed
 * (deterministic: the same numbers every run). */
static void test_distributions(void **state) {
    (void)state;
    enum { N = 200000 };
    Rng r;
    rng_seed(&r, 3, 0);
    double s_unit = 0, s_exp = 0, s_norm = 0, s_norm2 = 0, s_logn = 0, s_geo = 0;
    for (int i = 0; i < N; i++) {
        double u = rng_unit(&r);
        assert_true(u >= 0.0 && u < 1.0);
        assert_true(rng_below(&r, 7) < 7);
        double e = rng_exp(&r, 2.0), z = rng_normal(&r), l = rng_lognormal(&r, 37.8, 1.0);
        int g = rng_geometric(&r, 5.56);
        assert_true(e >= 0.0 && l > 0.0 && g >= 1);
        s_unit += u;
        s_exp += e;
        s_norm += z;
        s_norm2 += z * z;
        s_logn += l;
        s_geo += g;
    }
    assert_true(fabs(s_unit / N - 0.5) < 0.005);
    assert_true(fabs(s_exp / N - 2.0) < 0.03);
    assert_true(fabs(s_norm / N) < 0.01);
    assert_true(fabs(s_norm2 / N - 1.0) < 0.02);
    assert_true(fabs(s_logn / N - 37.8) < 1.0);
    assert_true(fabs(s_geo / N - 5.56) < 0.1);
    assert_true(rng_exp(&r, 0.0) == 0.0);
    assert_int_equal(rng_geometric(&r, 1.0), 1);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_outputs),
        cmocka_unit_test(test_streams_pinned),
        cmocka_unit_test(test_distributions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
