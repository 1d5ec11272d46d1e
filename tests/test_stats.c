/* test_stats.c — base/stats: sorting doubles and their median (odd and
 * even counts, one value, ties, negative values and infinities). */
#include "test_util.h"

#include <math.h>

#include "base/stats.h"

static void test_median(void **state) {
    (void)state;
    double one[] = {3.5};
    assert_true(mn_median_sort(one, 1) == 3.5);
    double odd[] = {0.12, 0.027, 0.031, 0.2, 0.029};
    assert_true(mn_median_sort(odd, 5) == 0.031);
    assert_true(odd[0] == 0.027 && odd[4] == 0.2); /* sorted in place */
    double even[] = {4, -1, 2, 2};
    assert_true(mn_median_sort(even, 4) == 2);
    double halves[] = {1, 4};
    assert_true(mn_median_sort(halves, 2) == 2.5);
}

static void test_sort(void **state) {
    (void)state;
    double v[] = {2, INFINITY, -3, 0, -INFINITY, 2};
    mn_sort_doubles(v, 6);
    for (int i = 1; i < 6; i++) assert_true(v[i - 1] <= v[i]);
    assert_true(isinf(v[0]) && v[0] < 0 && isinf(v[5]));
    mn_sort_doubles(v, 0); /* nothing to do */
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_median),
        cmocka_unit_test(test_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
