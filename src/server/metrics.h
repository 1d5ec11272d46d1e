/* metrics.h — a thread-safe registry of Prometheus metrics.
 *
 * The server owns one Metrics registry. Families are registered at start-up
 * (name, help, type, and for histograms the bucket upper bounds); after
 * that any thread — HTTP threads, the engine thread — updates series and
 * GET /metrics renders the text exposition format. One mutex guards the
 * whole registry; updates are a lookup and an add under it.
 *
 * A series is named by its label string, written as it appears between the
 * braces: `status="200"`, `route="chat",status="200"`, or "" for none. The
 * first update with a new label string creates the series (validating the
 * string); later updates with the same string find it and never allocate.
 * Label strings must be spelled identically to hit the same series.
 * metrics_format_label builds one pair with the value escaped.
 *
 * A series that was never updated is not rendered; to show a 0 from start,
 * touch it once (metrics_counter_add(f, labels, 0)).
 */
#ifndef MN_METRICS_H
#define MN_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef enum MetricType { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM } MetricType;

/* Most series one family may hold, so that a label made from client input
 * cannot grow the registry without bound. */
#define METRICS_MAX_SERIES 1024

typedef struct Metrics Metrics;
typedef struct MetricFamily MetricFamily; /* owned by its registry */

/* A new empty registry in *out. MN_OK or MN_ENOMEM. */
int metrics_new(Metrics **out);

/* Free the registry and all its families; their handles become invalid.
 * No other thread may be using it. NULL is fine. */
void metrics_free(Metrics *m);

/* Register a family. name must match [a-zA-Z_:][a-zA-Z0-9_:]* and be new
 * in m; help is any text (escaped on output; NULL is ""); for METRIC_HISTOGRAM,
 * buckets[0..n_buckets) are finite, strictly increasing upper bounds (the
 * +Inf bucket is implicit; n_buckets may be 0); other types take
 * buckets NULL / 0. On MN_OK *out (if not NULL) is a handle valid until
 * metrics_free. MN_EINVAL for a bad name, duplicate, bad buckets or type;
 * MN_ENOMEM. Families render in registration order. */
int metrics_register(Metrics *m, const char *name, const char *help, MetricType type,
                     const double *buckets, size_t n_buckets, MetricFamily **out);

/* The family registered under name, or NULL. */
MetricFamily *metrics_find(Metrics *m, const char *name);

/* Updates. Each returns MN_OK; MN_EINVAL when f has another type, labels is
 * not a valid label string (NULL counts as ""; a histogram may not use the
 * label "le") or, for a counter, v is negative or NaN; MN_EFULL when a new
 * series would exceed METRICS_MAX_SERIES; MN_ENOMEM. */
int metrics_counter_add(MetricFamily *f, const char *labels, double v);
int metrics_gauge_set(MetricFamily *f, const char *labels, double v);
int metrics_gauge_add(MetricFamily *f, const char *labels, double v);
/* Counts v into the first bucket whose bound is >= v (else +Inf) and adds
 * it to _sum and _count. */
int metrics_histogram_observe(MetricFamily *f, const char *labels, double v);

/* Mirror totals kept elsewhere (another component's counters, read at
 * scrape time). A counter is set to v — MN_EINVAL if that would lower it;
 * a histogram takes per-bucket (not cumulative) counts[0..n_buckets], the
 * last one being the +Inf bucket, their total as _count, and sum —
 * MN_EINVAL when n_counts != n_buckets + 1. Also MN_EINVAL for a wrong
 * type or labels, MN_EFULL, MN_ENOMEM as for updates. */
int metrics_counter_set(MetricFamily *f, const char *labels, double v);
int metrics_histogram_set(MetricFamily *f, const char *labels, const uint64_t *counts, size_t n_counts, double sum);

/* Read a series back: the value of a counter or gauge, the _count of a
 * histogram. MN_OK, or MN_ENOTFOUND when the series does not exist. */
int metrics_value(MetricFamily *f, const char *labels, double *out);

/* Render every family in the text exposition format (version 0.0.4):
 * "# HELP", "# TYPE", then the series in first-use order, histograms as
 * cumulative _bucket lines ending with le="+Inf", then _sum and _count.
 * On MN_OK *out is an mn_malloc'd NUL-terminated text (caller frees with
 * mn_free) and *out_len (if not NULL) its length; MN_ENOMEM otherwise. */
int metrics_render(Metrics *m, char **out, size_t *out_len);

/* Write `key="value"` to buf with value escaped (\\, \", \n) for use as
 * (part of) a label string. MN_OK, MN_EINVAL for a bad key, MN_ERANGE when
 * buf (cap bytes) is too small (buf then holds "" if cap > 0). */
int metrics_format_label(char *buf, size_t cap, const char *key, const char *value);

#endif
