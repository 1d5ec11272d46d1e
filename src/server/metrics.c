/* metrics.c — see metrics.h.
 *
 * The registry is a list of families, each a list of series; both lists only
 * grow, in the order families are registered and series are first used,
 * which is the order they render in. Family structs are allocated one by
 * one, so a MetricFamily* handle stays valid while the family list grows;
 * series live inline in their family's array (nothing outside this file
 * points at them) and are found by a linear scan comparing label strings —
 * a family has a handful of series, and the scan does not allocate.
 *
 * Threads: the Metrics struct owns one mutex, `lock`, which guards every
 * family list, series list and value. Registration, updates, reads and
 * rendering each hold it for their whole run; handles carry a pointer to
 * their registry to find it. metrics_free is the only call that must not
 * race with others.
 *
 * Invariants (under lock): f->series[0..n_series) have distinct label
 * strings, each valid per labels_valid; for a histogram series,
 * bucket_counts[b] counts observations in (buckets[b-1], buckets[b]] (the
 * first one from -inf), so the sum of bucket_counts is at most count and the
 * rest fell into +Inf; values render cumulatively.
 */
#include "server/metrics.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/utf8.h"

/* ================================================================== types */

typedef struct MetricSeries {
    char *labels;            /* owned; "" for none */
    double value;            /* counter, gauge */
    double sum;              /* histogram: sum of observations */
    uint64_t count;          /* histogram: number of observations */
    uint64_t *bucket_counts; /* histogram: (n_buckets) per bucket, not cumulative */
} MetricSeries;

struct MetricFamily {
    Metrics *owner; /* for the lock */
    char *name;
    char *help;
    MetricType type;
    double *buckets; /* (n_buckets) increasing finite upper bounds; histograms */
    size_t n_buckets;
    MetricSeries *series; /* (cap_series) first n_series in use */
    size_t n_series;
    size_t cap_series;
};

struct Metrics {
    pthread_mutex_t lock;
    MetricFamily **fams; /* (cap_fams) first n_fams in use */
    size_t n_fams;
    size_t cap_fams;
};

/* A growable NUL-terminated text whose allocation failure is sticky, so the
 * renderer appends freely and checks once. */
typedef struct TextBuf {
    char *data;
    size_t len;
    size_t cap;
    bool is_oom;
} TextBuf;

/* ================================================================ helpers */

static bool is_name_char(char c, bool is_first, bool allow_colon) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
    if (allow_colon && c == ':') return true;
    return !is_first && c >= '0' && c <= '9';
}

/* Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names without the colon. */
static bool name_valid(const char *s, size_t len, bool allow_colon) {
    if (len == 0) return false;
    for (size_t i = 0; i < len; i++)
        if (!is_name_char(s[i], i == 0, allow_colon)) return false;
    return true;
}

/* A label string: empty, or name="value"(,name="value")* where a value is
 * UTF-8 with \\, \" and \n as its only escapes and no raw newline. Sets
 * *has_le when one of the names is "le". */
static bool labels_valid(const char *s, bool *has_le) {
    *has_le = false;
    size_t i = 0, n = strlen(s);
    if (n == 0) return true;
    if (!utf8_is_valid(s, n)) return false;
    for (;;) {
        size_t start = i;
        while (i < n && s[i] != '=') i++;
        if (i == n || !name_valid(s + start, i - start, false)) return false;
        if (i - start == 2 && s[start] == 'l' && s[start + 1] == 'e') *has_le = true;
        i++; /* '=' */
        if (i >= n || s[i] != '"') return false;
        i++;
        while (i < n && s[i] != '"') {
            if (s[i] == '\n') return false;
            if (s[i] == '\\') {
                if (i + 1 >= n || (s[i + 1] != '\\' && s[i + 1] != '"' && s[i + 1] != 'n')) return false;
                i++;
            }
            i++;
        }
        if (i >= n) return false; /* unterminated value */
        i++;                      /* closing quote */
        if (i == n) return true;
        if (s[i] != ',') return false;
        i++;
    }
}

static MetricSeries *series_find(MetricFamily *f, const char *labels) {
    for (size_t i = 0; i < f->n_series; i++)
        if (strcmp(f->series[i].labels, labels) == 0) return &f->series[i];
    return NULL;
}

/* The series for labels, created at zero when new. Lock held. */
static int series_get(MetricFamily *f, const char *labels, MetricSeries **out) {
    MetricSeries *s = series_find(f, labels);
    if (s != NULL) {
        *out = s;
        return MN_OK;
    }
    bool has_le;
    if (!labels_valid(labels, &has_le)) return MN_EINVAL;
    if (has_le && f->type == METRIC_HISTOGRAM) return MN_EINVAL;
    if (f->n_series >= METRICS_MAX_SERIES) return MN_EFULL;
    if (f->n_series == f->cap_series) {
        size_t cap = f->cap_series ? f->cap_series * 2 : 4;
        MetricSeries *grown = mn_realloc(f->series, cap * sizeof *grown); /* cap <= 2 * METRICS_MAX_SERIES */
        if (grown == NULL) return MN_ENOMEM;
        f->series = grown;
        f->cap_series = cap;
    }
    MetricSeries fresh = {0};
    fresh.labels = mn_strdup(labels);
    if (fresh.labels == NULL) return MN_ENOMEM;
    if (f->type == METRIC_HISTOGRAM && f->n_buckets > 0) {
        fresh.bucket_counts = mn_calloc(f->n_buckets, sizeof *fresh.bucket_counts);
        if (fresh.bucket_counts == NULL) {
            mn_free(fresh.labels);
            return MN_ENOMEM;
        }
    }
    f->series[f->n_series] = fresh;
    *out = &f->series[f->n_series++];
    return MN_OK;
}

/* ---- text output --------------------------------------------------------- */

static void tb_append(TextBuf *b, const char *s, size_t n) {
    if (b->is_oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1) cap *= 2; /* in-memory sizes: no overflow */
        char *data = mn_realloc(b->data, cap);
        if (data == NULL) {
            b->is_oom = true;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void tb_puts(TextBuf *b, const char *s) { tb_append(b, s, strlen(s)); }

/* A sample value or bucket bound as Prometheus reads it: integers without
 * a fraction or exponent (below 1e15), else the shortest %g that reads back
 * exactly; NaN, +Inf, -Inf spelled so. */
static void format_value(double v, char out[40]) {
    if (isnan(v)) {
        strcpy(out, "NaN");
    } else if (isinf(v)) {
        strcpy(out, v > 0 ? "+Inf" : "-Inf");
    } else if (v == 0.0) {
        strcpy(out, "0"); /* also -0 */
    } else if (v == trunc(v) && fabs(v) < 1e15) {
        snprintf(out, 40, "%.0f", v);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(out, 40, "%.*g", prec, v);
            if (strtod(out, NULL) == v) break;
        }
    }
}

/* "# HELP name text" with \ and newline escaped. */
static void render_help(TextBuf *b, const MetricFamily *f) {
    tb_puts(b, "# HELP ");
    tb_puts(b, f->name);
    tb_puts(b, " ");
    for (const char *p = f->help; *p; p++) {
        if (*p == '\\')
            tb_puts(b, "\\\\");
        else if (*p == '\n')
            tb_puts(b, "\\n");
        else
            tb_append(b, p, 1);
    }
    tb_puts(b, "\n");
}

/* One sample line: name suffix {labels[,le="bound"]} value. */
static void render_sample(TextBuf *b, const MetricFamily *f, const char *suffix, const char *labels,
                          const char *le, double v) {
    char num[40];
    tb_puts(b, f->name);
    tb_puts(b, suffix);
    if (labels[0] || le) {
        tb_puts(b, "{");
        tb_puts(b, labels);
        if (le) {
            tb_puts(b, labels[0] ? ",le=\"" : "le=\"");
            tb_puts(b, le);
            tb_puts(b, "\"");
        }
        tb_puts(b, "}");
    }
    format_value(v, num);
    tb_puts(b, " ");
    tb_puts(b, num);
    tb_puts(b, "\n");
}

static void render_family(TextBuf *b, const MetricFamily *f) {
    static const char *const TYPE_NAMES[] = {"counter", "gauge", "histogram"};
    render_help(b, f);
    tb_puts(b, "# TYPE ");
    tb_puts(b, f->name);
    tb_puts(b, " ");
    tb_puts(b, TYPE_NAMES[f->type]);
    tb_puts(b, "\n");
    for (size_t i = 0; i < f->n_series; i++) {
        const MetricSeries *s = &f->series[i];
        if (f->type != METRIC_HISTOGRAM) {
            render_sample(b, f, "", s->labels, NULL, s->value);
            continue;
        }
        uint64_t cumulative = 0;
        char le[40];
        for (size_t k = 0; k < f->n_buckets; k++) {
            cumulative += s->bucket_counts[k];
            format_value(f->buckets[k], le);
            render_sample(b, f, "_bucket", s->labels, le, (double)cumulative);
        }
        render_sample(b, f, "_bucket", s->labels, "+Inf", (double)s->count);
        render_sample(b, f, "_sum", s->labels, NULL, s->sum);
        render_sample(b, f, "_count", s->labels, NULL, (double)s->count);
    }
}

static void family_free(MetricFamily *f) {
    if (f == NULL) return;
    for (size_t i = 0; i < f->n_series; i++) {
        mn_free(f->series[i].labels);
        mn_free(f->series[i].bucket_counts);
    }
    mn_free(f->series);
    mn_free(f->buckets);
    mn_free(f->help);
    mn_free(f->name);
    mn_free(f);
}

static MetricFamily *family_find(const Metrics *m, const char *name) {
    for (size_t i = 0; i < m->n_fams; i++)
        if (strcmp(m->fams[i]->name, name) == 0) return m->fams[i];
    return NULL;
}

/* The shared path of every update: lock, check the type, find or create the
 * series, apply op, unlock. */
typedef enum UpdateOp { OP_COUNTER_ADD, OP_GAUGE_SET, OP_GAUGE_ADD, OP_OBSERVE } UpdateOp;

static int update(MetricFamily *f, const char *labels, UpdateOp op, double v) {
    assert(f != NULL);
    static const MetricType OP_TYPE[] = {METRIC_COUNTER, METRIC_GAUGE, METRIC_GAUGE, METRIC_HISTOGRAM};
    if (f->type != OP_TYPE[op]) return MN_EINVAL;
    if (op == OP_COUNTER_ADD && !(v >= 0.0)) return MN_EINVAL; /* also NaN */
    if (labels == NULL) labels = "";
    pthread_mutex_t *lock = &f->owner->lock;
    pthread_mutex_lock(lock);
    MetricSeries *s;
    int rc = series_get(f, labels, &s);
    if (rc == MN_OK) {
        switch (op) {
        case OP_COUNTER_ADD:
        case OP_GAUGE_ADD: s->value += v; break;
        case OP_GAUGE_SET: s->value = v; break;
        case OP_OBSERVE: {
            size_t k = 0;
            while (k < f->n_buckets && !(v <= f->buckets[k])) k++;
            if (k < f->n_buckets) s->bucket_counts[k]++;
            s->count++;
            s->sum += v;
            break;
        }
        }
    }
    pthread_mutex_unlock(lock);
    return rc;
}

/* ============================================================= public API */

int metrics_new(Metrics **out) {
    assert(out != NULL);
    *out = NULL;
    Metrics *m = mn_calloc(1, sizeof *m);
    if (m == NULL) return MN_ENOMEM;
    if (pthread_mutex_init(&m->lock, NULL) != 0) {
        mn_free(m);
        return MN_ENOMEM;
    }
    *out = m;
    return MN_OK;
}

void metrics_free(Metrics *m) {
    if (m == NULL) return;
    for (size_t i = 0; i < m->n_fams; i++) family_free(m->fams[i]);
    mn_free(m->fams);
    pthread_mutex_destroy(&m->lock);
    mn_free(m);
}

int metrics_register(Metrics *m, const char *name, const char *help, MetricType type,
                     const double *buckets, size_t n_buckets, MetricFamily **out) {
    assert(m != NULL);
    if (out) *out = NULL;
    if (name == NULL || !name_valid(name, strlen(name), true)) return MN_EINVAL;
    if (type != METRIC_COUNTER && type != METRIC_GAUGE && type != METRIC_HISTOGRAM) return MN_EINVAL;
    if (type != METRIC_HISTOGRAM && n_buckets > 0) return MN_EINVAL;
    if (n_buckets > 0 && buckets == NULL) return MN_EINVAL;
    for (size_t k = 0; k < n_buckets; k++)
        if (!isfinite(buckets[k]) || (k > 0 && !(buckets[k] > buckets[k - 1]))) return MN_EINVAL;

    MetricFamily *f = mn_calloc(1, sizeof *f);
    if (f == NULL) return MN_ENOMEM;
    f->owner = m;
    f->type = type;
    f->name = mn_strdup(name);
    f->help = mn_strdup(help ? help : "");
    if (n_buckets > 0) f->buckets = mn_calloc(n_buckets, sizeof *f->buckets);
    if (f->name == NULL || f->help == NULL || (n_buckets > 0 && f->buckets == NULL)) {
        family_free(f);
        return MN_ENOMEM;
    }
    if (n_buckets > 0) memcpy(f->buckets, buckets, n_buckets * sizeof *buckets);
    f->n_buckets = n_buckets;

    int rc = MN_OK;
    pthread_mutex_lock(&m->lock);
    if (family_find(m, name) != NULL) {
        rc = MN_EINVAL;
    } else if (m->n_fams == m->cap_fams) {
        size_t cap = m->cap_fams ? m->cap_fams * 2 : 16;
        MetricFamily **grown = mn_realloc(m->fams, cap * sizeof *grown);
        if (grown == NULL) {
            rc = MN_ENOMEM;
        } else {
            m->fams = grown;
            m->cap_fams = cap;
        }
    }
    if (rc == MN_OK) m->fams[m->n_fams++] = f;
    pthread_mutex_unlock(&m->lock);

    if (rc != MN_OK) {
        family_free(f);
        return rc;
    }
    if (out) *out = f;
    return MN_OK;
}

MetricFamily *metrics_find(Metrics *m, const char *name) {
    assert(m != NULL && name != NULL);
    pthread_mutex_lock(&m->lock);
    MetricFamily *f = family_find(m, name);
    pthread_mutex_unlock(&m->lock);
    return f;
}

int metrics_counter_add(MetricFamily *f, const char *labels, double v) {
    return update(f, labels, OP_COUNTER_ADD, v);
}

int metrics_gauge_set(MetricFamily *f, const char *labels, double v) {
    return update(f, labels, OP_GAUGE_SET, v);
}

int metrics_gauge_add(MetricFamily *f, const char *labels, double v) {
    return update(f, labels, OP_GAUGE_ADD, v);
}

int metrics_histogram_observe(MetricFamily *f, const char *labels, double v) {
    return update(f, labels, OP_OBSERVE, v);
}

int metrics_counter_set(MetricFamily *f, const char *labels, double v) {
    if (f->type != METRIC_COUNTER || !(v >= 0.0)) return MN_EINVAL;
    pthread_mutex_lock(&f->owner->lock);
    MetricSeries *s;
    int rc = series_get(f, labels ? labels : "", &s);
    if (rc == MN_OK && v < s->value) rc = MN_EINVAL;
    if (rc == MN_OK) s->value = v;
    pthread_mutex_unlock(&f->owner->lock);
    return rc;
}

int metrics_histogram_set(MetricFamily *f, const char *labels, const uint64_t *counts, size_t n_counts, double sum) {
    if (f->type != METRIC_HISTOGRAM || n_counts != f->n_buckets + 1) return MN_EINVAL;
    pthread_mutex_lock(&f->owner->lock);
    MetricSeries *s;
    int rc = series_get(f, labels ? labels : "", &s);
    if (rc == MN_OK) {
        s->count = 0;
        for (size_t k = 0; k < n_counts; k++) {
            if (k < f->n_buckets) s->bucket_counts[k] = counts[k];
            s->count += counts[k];
        }
        s->sum = sum;
    }
    pthread_mutex_unlock(&f->owner->lock);
    return rc;
}

int metrics_value(MetricFamily *f, const char *labels, double *out) {
    assert(f != NULL && out != NULL);
    pthread_mutex_lock(&f->owner->lock);
    MetricSeries *s = series_find(f, labels ? labels : "");
    if (s != NULL) *out = f->type == METRIC_HISTOGRAM ? (double)s->count : s->value;
    pthread_mutex_unlock(&f->owner->lock);
    return s ? MN_OK : MN_ENOTFOUND;
}

int metrics_render(Metrics *m, char **out, size_t *out_len) {
    assert(m != NULL && out != NULL);
    TextBuf b = {0};
    tb_append(&b, "", 0); /* an empty registry still gives "" */
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->n_fams; i++) render_family(&b, m->fams[i]);
    pthread_mutex_unlock(&m->lock);
    if (b.is_oom) {
        mn_free(b.data);
        *out = NULL;
        if (out_len) *out_len = 0;
        return MN_ENOMEM;
    }
    *out = b.data;
    if (out_len) *out_len = b.len;
    return MN_OK;
}

int metrics_format_label(char *buf, size_t cap, const char *key, const char *value) {
    assert(buf != NULL || cap == 0);
    if (cap > 0) buf[0] = '\0';
    if (key == NULL || !name_valid(key, strlen(key), false)) return MN_EINVAL;
    if (value == NULL) value = "";
    size_t n = 0;
    /* write c if it fits, always count it */
#define PUT(c)                                         \
    do {                                               \
        if (n + 1 < cap) buf[n] = (c);                 \
        n++;                                           \
    } while (0)
    for (const char *p = key; *p; p++) PUT(*p);
    PUT('=');
    PUT('"');
    for (const char *p = value; *p; p++) {
        if (*p == '\\' || *p == '"') {
            PUT('\\');
            PUT(*p);
        } else if (*p == '\n') {
            PUT('\\');
            PUT('n');
        } else {
            PUT(*p);
        }
    }
    PUT('"');
#undef PUT
    if (n + 1 > cap) {
        if (cap > 0) buf[0] = '\0';
        return MN_ERANGE;
    }
    buf[n] = '\0';
    return MN_OK;
}
