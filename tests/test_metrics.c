/* test_metrics.c — the Prometheus registry.
 *
 * The exact exposition text of a small registry (HELP escaping, label-less
 * and labelled series, histogram buckets cumulated with le="+Inf", _sum and
 * _count, registration and first-use order, a family with no series);
 * histogram bucket edges; number formatting; every rejected argument;
 * the series cap; label formatting; 4 threads updating (and one rendering)
 * at once with exact totals; allocation failure at every allocation.
 *
 * Includes metrics.c with the mn_* allocators routed through an injector.
 */
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/err.h"
#include "base/mem.h"

static void *mt_calloc(size_t n, size_t size);
static void *mt_realloc(void *p, size_t n);
static char *mt_strdup(const char *s);
#define mn_calloc mt_calloc
#define mn_realloc mt_realloc
#define mn_strdup mt_strdup
#include "server/metrics.c"
#undef mn_calloc
#undef mn_realloc
#undef mn_strdup

/* ---------------------------------------------------- failure injection */

/* -1: never fail; k >= 0: the (k+1)-th allocation from now fails, and so
 * does every later one until reset. Only the single-threaded tests set it. */
static long mt_fail_after = -1;

static bool mt_should_fail(void) {
    if (mt_fail_after == 0) return true;
    if (mt_fail_after > 0) mt_fail_after--;
    return false;
}

static void *mt_calloc(size_t n, size_t size) { return mt_should_fail() ? NULL : mn_calloc(n, size); }
static void *mt_realloc(void *p, size_t n) { return mt_should_fail() ? NULL : mn_realloc(p, n); }
static char *mt_strdup(const char *s) { return mt_should_fail() ? NULL : mn_strdup(s); }

/* ---------------------------------------------------------------- helpers */

static Metrics *make(void) {
    Metrics *m = NULL;
    assert_int_equal(metrics_new(&m), MN_OK);
    assert_non_null(m);
    return m;
}

static MetricFamily *reg(Metrics *m, const char *name, const char *help, MetricType type, const double *b,
                         size_t n) {
    MetricFamily *f = NULL;
    assert_int_equal(metrics_register(m, name, help, type, b, n, &f), MN_OK);
    assert_non_null(f);
    return f;
}

static char *render(Metrics *m) {
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(metrics_render(m, &text, &len), MN_OK);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    return text;
}

static void expect_text(Metrics *m, const char *want) {
    char *got = render(m);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "---- expected:\n%s---- got:\n%s----\n", want, got);
        mn_free(got);
        fail();
    }
    mn_free(got);
}

/* ------------------------------------------------------------------ tests */

static void test_render_exact(void **state) {
    (void)state;
    Metrics *m = make();
    MetricFamily *req = reg(m, "mnemo_requests_total", "Requests served, by status.", METRIC_COUNTER, NULL, 0);
    MetricFamily *busy = reg(m, "mnemo_busy_slots", "Busy \\ slots\nright now.", METRIC_GAUGE, NULL, 0);
    const double b[] = {0.25, 0.5, 1};
    MetricFamily *lat = reg(m, "mnemo_latency_seconds", "Request latency.", METRIC_HISTOGRAM, b, 3);
    reg(m, "mnemo_unused_total", "", METRIC_COUNTER, NULL, 0);

    assert_int_equal(metrics_counter_add(req, "status=\"200\"", 1), MN_OK);
    assert_int_equal(metrics_counter_add(req, "status=\"400\"", 2), MN_OK);
    assert_int_equal(metrics_counter_add(req, "status=\"200\"", 2), MN_OK);
    assert_int_equal(metrics_gauge_set(busy, "", 3), MN_OK);
    assert_int_equal(metrics_gauge_add(busy, NULL, -0.5), MN_OK); /* NULL is "" */
    assert_int_equal(metrics_histogram_observe(lat, "route=\"chat\",stream=\"no\"", 0.125), MN_OK);
    assert_int_equal(metrics_histogram_observe(lat, "", 0.375), MN_OK);
    assert_int_equal(metrics_histogram_observe(lat, "route=\"chat\",stream=\"no\"", 0.25), MN_OK);
    assert_int_equal(metrics_histogram_observe(lat, "route=\"chat\",stream=\"no\"", 0.75), MN_OK);
    assert_int_equal(metrics_histogram_observe(lat, "route=\"chat\",stream=\"no\"", 3), MN_OK);

    expect_text(m, "# HELP mnemo_requests_total Requests served, by status.\n"
                   "# TYPE mnemo_requests_total counter\n"
                   "mnemo_requests_total{status=\"200\"} 3\n"
                   "mnemo_requests_total{status=\"400\"} 2\n"
                   "# HELP mnemo_busy_slots Busy \\\\ slots\\nright now.\n"
                   "# TYPE mnemo_busy_slots gauge\n"
                   "mnemo_busy_slots 2.5\n"
                   "# HELP mnemo_latency_seconds Request latency.\n"
                   "# TYPE mnemo_latency_seconds histogram\n"
                   "mnemo_latency_seconds_bucket{route=\"chat\",stream=\"no\",le=\"0.25\"} 2\n"
                   "mnemo_latency_seconds_bucket{route=\"chat\",stream=\"no\",le=\"0.5\"} 2\n"
                   "mnemo_latency_seconds_bucket{route=\"chat\",stream=\"no\",le=\"1\"} 3\n"
                   "mnemo_latency_seconds_bucket{route=\"chat\",stream=\"no\",le=\"+Inf\"} 4\n"
                   "mnemo_latency_seconds_sum{route=\"chat\",stream=\"no\"} 4.125\n"
                   "mnemo_latency_seconds_count{route=\"chat\",stream=\"no\"} 4\n"
                   "mnemo_latency_seconds_bucket{le=\"0.25\"} 0\n"
                   "mnemo_latency_seconds_bucket{le=\"0.5\"} 1\n"
                   "mnemo_latency_seconds_bucket{le=\"1\"} 1\n"
                   "mnemo_latency_seconds_bucket{le=\"+Inf\"} 1\n"
                   "mnemo_latency_seconds_sum 0.375\n"
                   "mnemo_latency_seconds_count 1\n"
                   "# HELP mnemo_unused_total \n"
                   "# TYPE mnemo_unused_total counter\n");

    double v = 0;
    assert_int_equal(metrics_value(req, "status=\"200\"", &v), MN_OK);
    assert_true(v == 3);
    assert_int_equal(metrics_value(busy, "", &v), MN_OK);
    assert_true(v == 2.5);
    assert_int_equal(metrics_value(lat, "route=\"chat\",stream=\"no\"", &v), MN_OK);
    assert_true(v == 4);
    assert_int_equal(metrics_value(req, "status=\"500\"", &v), MN_ENOTFOUND);
    assert_ptr_equal(metrics_find(m, "mnemo_busy_slots"), busy);
    assert_null(metrics_find(m, "mnemo_nope"));

    /* touching a series at 0 makes it show */
    assert_int_equal(metrics_counter_add(metrics_find(m, "mnemo_unused_total"), "", 0), MN_OK);
    char *text = render(m);
    assert_non_null(strstr(text, "# TYPE mnemo_unused_total counter\nmnemo_unused_total 0\n"));
    mn_free(text);
    metrics_free(m);

    /* an empty registry renders as "" */
    m = make();
    expect_text(m, "");
    metrics_free(m);
    metrics_free(NULL);
}

static void test_histogram_buckets(void **state) {
    (void)state;
    Metrics *m = make();
    const double b[] = {-1, 0, 1, 10};
    MetricFamily *h = reg(m, "h", "h", METRIC_HISTOGRAM, b, 4);
    /* each bound goes into its own bucket (le is "less or equal") */
    const double obs[] = {-5, -1, -0.5, 0, 0.5, 1, 1, 9.99, 10, 10.01, 1e300, INFINITY};
    double sum = 0;
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++) {
        assert_int_equal(metrics_histogram_observe(h, "", obs[i]), MN_OK);
        sum += obs[i];
    }
    (void)sum;
    expect_text(m, "# HELP h h\n# TYPE h histogram\n"
                   "h_bucket{le=\"-1\"} 2\n"
                   "h_bucket{le=\"0\"} 4\n"
                   "h_bucket{le=\"1\"} 7\n"
                   "h_bucket{le=\"10\"} 9\n"
                   "h_bucket{le=\"+Inf\"} 12\n"
                   "h_sum +Inf\n"
                   "h_count 12\n");
    metrics_free(m);

    /* no finite buckets: only +Inf */
    m = make();
    h = reg(m, "only_inf", "x", METRIC_HISTOGRAM, NULL, 0);
    assert_int_equal(metrics_histogram_observe(h, "a=\"b\"", 2), MN_OK);
    assert_int_equal(metrics_histogram_observe(h, "a=\"b\"", 0.5), MN_OK);
    expect_text(m, "# HELP only_inf x\n# TYPE only_inf histogram\n"
                   "only_inf_bucket{a=\"b\",le=\"+Inf\"} 2\n"
                   "only_inf_sum{a=\"b\"} 2.5\n"
                   "only_inf_count{a=\"b\"} 2\n");
    metrics_free(m);
}

static void test_number_format(void **state) {
    (void)state;
    static const struct {
        double v;
        const char *text;
    } CASES[] = {
        {0, "0"},
        {-0.0, "0"},
        {1, "1"},
        {-3, "-3"},
        {400000, "400000"},
        {123456789012345, "123456789012345"},
        {1e15, "1e+15"},
        {1e20, "1e+20"},
        {0.1, "0.1"},
        {2.5, "2.5"},
        {-0.001, "-0.001"},
        {1.0 / 3.0, "0.3333333333333333"},
        {1e-9, "1e-09"},
        {NAN, "NaN"},
        {INFINITY, "+Inf"},
        {-INFINITY, "-Inf"},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char out[40];
        format_value(CASES[i].v, out);
        if (strcmp(out, CASES[i].text) != 0) fail_msg("case %zu: got %s, want %s", i, out, CASES[i].text);
    }
    /* and through a gauge */
    Metrics *m = make();
    MetricFamily *g = reg(m, "g", "g", METRIC_GAUGE, NULL, 0);
    assert_int_equal(metrics_gauge_set(g, "k=\"nan\"", NAN), MN_OK);
    assert_int_equal(metrics_gauge_set(g, "k=\"inf\"", -INFINITY), MN_OK);
    expect_text(m, "# HELP g g\n# TYPE g gauge\ng{k=\"nan\"} NaN\ng{k=\"inf\"} -Inf\n");
    metrics_free(m);
}

static void test_rejected(void **state) {
    (void)state;
    Metrics *m = make();
    MetricFamily *f = (MetricFamily *)1;
    const double good[] = {1, 2};
    const double unsorted[] = {2, 1};
    const double dup[] = {1, 1};
    const double nan_b[] = {1, NAN};
    const double inf_b[] = {1, INFINITY};
    assert_int_equal(metrics_register(m, "", "x", METRIC_COUNTER, NULL, 0, &f), MN_EINVAL);
    assert_null(f);
    assert_int_equal(metrics_register(m, NULL, "x", METRIC_COUNTER, NULL, 0, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "9lives", "x", METRIC_COUNTER, NULL, 0, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "has-dash", "x", METRIC_COUNTER, NULL, 0, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "has space", "x", METRIC_COUNTER, NULL, 0, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "c", "x", (MetricType)7, NULL, 0, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "c", "x", METRIC_COUNTER, good, 2, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "h", "x", METRIC_HISTOGRAM, NULL, 2, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "h", "x", METRIC_HISTOGRAM, unsorted, 2, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "h", "x", METRIC_HISTOGRAM, dup, 2, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "h", "x", METRIC_HISTOGRAM, nan_b, 2, NULL), MN_EINVAL);
    assert_int_equal(metrics_register(m, "h", "x", METRIC_HISTOGRAM, inf_b, 2, NULL), MN_EINVAL);

    MetricFamily *c = reg(m, "ns:c_total", NULL, METRIC_COUNTER, NULL, 0); /* colons, NULL help */
    MetricFamily *g = reg(m, "g", "x", METRIC_GAUGE, NULL, 0);
    MetricFamily *h = reg(m, "h", "x", METRIC_HISTOGRAM, good, 2);
    assert_int_equal(metrics_register(m, "g", "again", METRIC_GAUGE, NULL, 0, NULL), MN_EINVAL);

    /* wrong type for the update */
    assert_int_equal(metrics_gauge_set(c, "", 1), MN_EINVAL);
    assert_int_equal(metrics_gauge_add(c, "", 1), MN_EINVAL);
    assert_int_equal(metrics_histogram_observe(c, "", 1), MN_EINVAL);
    assert_int_equal(metrics_counter_add(g, "", 1), MN_EINVAL);
    assert_int_equal(metrics_histogram_observe(g, "", 1), MN_EINVAL);
    assert_int_equal(metrics_counter_add(h, "", 1), MN_EINVAL);
    assert_int_equal(metrics_gauge_set(h, "", 1), MN_EINVAL);
    /* counters only go up */
    assert_int_equal(metrics_counter_add(c, "", -1), MN_EINVAL);
    assert_int_equal(metrics_counter_add(c, "", NAN), MN_EINVAL);

    /* label strings */
    static const char *const BAD_LABELS[] = {
        "status",           "status=",          "status=200",       "status=\"200",   "=\"x\"",
        "1a=\"x\"",         "a-b=\"x\"",        "a:b=\"x\"",        "a=\"x\",",       "a=\"x\"b=\"y\"",
        "a=\"x\" ",         " a=\"x\"",         "a=\"x\ny\"",       "a=\"\\t\"",      "a=\"\\\"",
        "a=\"\xFF\"",       "a=\"x\",,b=\"y\"", "{a=\"x\"}",
    };
    for (size_t i = 0; i < sizeof BAD_LABELS / sizeof BAD_LABELS[0]; i++) {
        if (metrics_counter_add(c, BAD_LABELS[i], 1) != MN_EINVAL) fail_msg("label %zu accepted: %s", i, BAD_LABELS[i]);
    }
    static const char *const GOOD_LABELS[] = {
        "a=\"\"", "a=\"x\",b=\"y\"", "_a1=\"q\\\"uo\\\\te\\n\"", "a=\"caf\xC3\xA9, {}=\"",
    };
    for (size_t i = 0; i < sizeof GOOD_LABELS / sizeof GOOD_LABELS[0]; i++)
        assert_int_equal(metrics_counter_add(c, GOOD_LABELS[i], 1), MN_OK);
    /* "le" belongs to the histogram */
    assert_int_equal(metrics_histogram_observe(h, "le=\"1\"", 1), MN_EINVAL);
    assert_int_equal(metrics_histogram_observe(h, "a=\"b\",le=\"1\"", 1), MN_EINVAL);
    assert_int_equal(metrics_gauge_set(g, "le=\"1\"", 1), MN_OK);
    assert_int_equal(metrics_histogram_observe(h, "lex=\"1\"", 1), MN_OK);

    char *text = render(m);
    assert_non_null(strstr(text, "# HELP ns:c_total \n# TYPE ns:c_total counter\nns:c_total{a=\"\"} 1\n"));
    assert_null(strstr(text, "status"));
    mn_free(text);
    metrics_free(m);
}

static void test_series_cap(void **state) {
    (void)state;
    Metrics *m = make();
    MetricFamily *c = reg(m, "c", "x", METRIC_COUNTER, NULL, 0);
    char label[64];
    for (int i = 0; i < METRICS_MAX_SERIES; i++) {
        snprintf(label, sizeof label, "id=\"%d\"", i);
        assert_int_equal(metrics_counter_add(c, label, 1), MN_OK);
    }
    assert_int_equal(metrics_counter_add(c, "id=\"new\"", 1), MN_EFULL);
    assert_int_equal(metrics_counter_add(c, "id=\"7\"", 1), MN_OK); /* existing ones still work */
    double v = 0;
    assert_int_equal(metrics_value(c, "id=\"7\"", &v), MN_OK);
    assert_true(v == 2);
    metrics_free(m);
}

static void test_format_label(void **state) {
    (void)state;
    char buf[64];
    assert_int_equal(metrics_format_label(buf, sizeof buf, "tier", "pool"), MN_OK);
    assert_string_equal(buf, "tier=\"pool\"");
    assert_int_equal(metrics_format_label(buf, sizeof buf, "model", "a\\b\"c\nd"), MN_OK);
    assert_string_equal(buf, "model=\"a\\\\b\\\"c\\nd\"");
    assert_int_equal(metrics_format_label(buf, sizeof buf, "k", NULL), MN_OK);
    assert_string_equal(buf, "k=\"\"");
    /* exactly fitting, and one short */
    assert_int_equal(metrics_format_label(buf, 9, "k", "abcd"), MN_OK); /* k="abcd" is 8 + NUL */
    assert_string_equal(buf, "k=\"abcd\"");
    assert_int_equal(metrics_format_label(buf, 8, "k", "abcd"), MN_ERANGE);
    assert_string_equal(buf, "");
    assert_int_equal(metrics_format_label(NULL, 0, "k", "v"), MN_ERANGE);
    assert_int_equal(metrics_format_label(buf, sizeof buf, "bad-key", "v"), MN_EINVAL);
    assert_int_equal(metrics_format_label(buf, sizeof buf, "a:b", "v"), MN_EINVAL);
    assert_int_equal(metrics_format_label(buf, sizeof buf, NULL, "v"), MN_EINVAL);

    /* what it makes is accepted as a series */
    Metrics *m = make();
    MetricFamily *g = reg(m, "g", "g", METRIC_GAUGE, NULL, 0);
    assert_int_equal(metrics_format_label(buf, sizeof buf, "model", "x\"y\\z\n"), MN_OK);
    assert_int_equal(metrics_gauge_set(g, buf, 1), MN_OK);
    metrics_free(m);
}

/* ------------------------------------------------------------ concurrency */

#define N_THREADS 4
#define N_ITERS 50000

typedef struct Shared {
    Metrics *m;
    MetricFamily *c, *g, *h;
    atomic_int is_done;
} Shared;

static void *worker(void *arg) {
    Shared *s = arg;
    char label[32];
    for (int i = 0; i < N_ITERS; i++) {
        snprintf(label, sizeof label, "parity=\"%d\"", i & 1);
        if (metrics_counter_add(s->c, "", 1) != MN_OK) abort();
        if (metrics_counter_add(s->c, label, 2) != MN_OK) abort();
        if (metrics_gauge_add(s->g, "", 1) != MN_OK) abort();
        if (metrics_gauge_add(s->g, "", -0.5) != MN_OK) abort();
        if (metrics_histogram_observe(s->h, label, (double)(i % 4) * 0.5) != MN_OK) abort();
    }
    return NULL;
}

static void *scraper(void *arg) {
    Shared *s = arg;
    while (!atomic_load(&s->is_done)) {
        char *text = NULL;
        if (metrics_render(s->m, &text, NULL) != MN_OK) abort();
        mn_free(text);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    Shared s = {0};
    s.m = make();
    s.c = reg(s.m, "c_total", "c", METRIC_COUNTER, NULL, 0);
    s.g = reg(s.m, "g", "g", METRIC_GAUGE, NULL, 0);
    const double b[] = {0.5, 1};
    s.h = reg(s.m, "h", "h", METRIC_HISTOGRAM, b, 2);

    pthread_t th[N_THREADS], sc;
    assert_int_equal(pthread_create(&sc, NULL, scraper, &s), 0);
    for (int t = 0; t < N_THREADS; t++) assert_int_equal(pthread_create(&th[t], NULL, worker, &s), 0);
    for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
    atomic_store(&s.is_done, 1);
    pthread_join(sc, NULL);

    const double total = (double)N_THREADS * N_ITERS;
    double v = 0;
    assert_int_equal(metrics_value(s.c, "", &v), MN_OK);
    assert_true(v == total);
    assert_int_equal(metrics_value(s.c, "parity=\"0\"", &v), MN_OK);
    assert_true(v == total); /* half the iterations, 2 each */
    assert_int_equal(metrics_value(s.g, "", &v), MN_OK);
    assert_true(v == total * 0.5);
    assert_int_equal(metrics_value(s.h, "parity=\"1\"", &v), MN_OK);
    assert_true(v == total / 2);

    /* observations cycle 0, 0.5, 1, 1.5: odd i see 0.5 and 1.5 */
    char want[1024];
    snprintf(want, sizeof want,
             "h_bucket{parity=\"0\",le=\"0.5\"} %.0f\n"
             "h_bucket{parity=\"0\",le=\"1\"} %.0f\n"
             "h_bucket{parity=\"0\",le=\"+Inf\"} %.0f\n"
             "h_sum{parity=\"0\"} %.0f\n"
             "h_count{parity=\"0\"} %.0f\n"
             "h_bucket{parity=\"1\",le=\"0.5\"} %.0f\n"
             "h_bucket{parity=\"1\",le=\"1\"} %.0f\n"
             "h_bucket{parity=\"1\",le=\"+Inf\"} %.0f\n"
             "h_sum{parity=\"1\"} %.0f\n"
             "h_count{parity=\"1\"} %.0f\n",
             total / 4, total / 2, total / 2, total / 4 * 1.0, total / 2, total / 4, total / 4, total / 2,
             total / 4 * 2.0, total / 2);
    char *text = render(s.m);
    if (strstr(text, want) == NULL) fail_msg("histogram totals wrong:\n%s\nwanted:\n%s", text, want);
    mn_free(text);
    metrics_free(s.m);
}

/* ------------------------------------------------------ allocation failure */

/* Build a registry, update and render it with the k-th allocation failing,
 * for every k; every call must fail cleanly, nothing may leak. */
static void test_alloc_failure(void **state) {
    (void)state;
    const double b[] = {1, 2, 3};
    for (long k = 0;; k++) {
        mt_fail_after = k;
        Metrics *m = NULL;
        int rc = metrics_new(&m);
        MetricFamily *c = NULL, *h = NULL;
        if (rc == MN_OK) rc = metrics_register(m, "c", "c", METRIC_COUNTER, NULL, 0, &c);
        if (rc == MN_OK) rc = metrics_register(m, "h", "h", METRIC_HISTOGRAM, b, 3, &h);
        for (int i = 0; rc == MN_OK && i < 20; i++) {
            char label[32];
            snprintf(label, sizeof label, "i=\"%d\"", i);
            rc = metrics_counter_add(c, label, 1);
            if (rc == MN_OK) rc = metrics_histogram_observe(h, label, i);
        }
        char *text = NULL;
        size_t len = 7;
        if (rc == MN_OK) {
            rc = metrics_render(m, &text, &len);
            if (rc != MN_OK) {
                assert_null(text);
                assert_int_equal(len, 0);
            }
        }
        bool was_hit = mt_fail_after == 0;
        mt_fail_after = -1;
        if (rc != MN_OK) assert_int_equal(rc, MN_ENOMEM);
        mn_free(text);
        metrics_free(m);
        if (!was_hit) {
            assert_int_equal(rc, MN_OK);
            break;
        }
        assert_true(k < 10000);
    }
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_exact),
        cmocka_unit_test(test_histogram_buckets),
        cmocka_unit_test(test_number_format),
        cmocka_unit_test(test_rejected),
        cmocka_unit_test(test_series_cap),
        cmocka_unit_test(test_format_label),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_alloc_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
