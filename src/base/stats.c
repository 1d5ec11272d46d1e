/* stats.c — order statistics of a handful of doubles (see stats.h). */
#include "base/stats.h"

#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void mn_sort_doubles(double *v, long n) {
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_double);
}

double mn_median_sort(double *v, long n) {
    mn_sort_doubles(v, n);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
