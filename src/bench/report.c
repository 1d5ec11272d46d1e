/* report.c — statistics and report files of `mnemo bench` (see report.h).
 *
 * Everything here is computed from a finished BenchResults; nothing is
 * shared with running threads. Files are written whole with stdio and
 * checked on close, so a full disk is an error, not a short file.
 *
 * report.svg (SVG 1.1, 1000 x 480 user units, no scripts or external
 * resources): a title line, then two panels side by side, each with axes,
 * "nice" ticks (1, 2 or 5 x 10^k), grid lines, axis labels and a legend:
 *   left   TTFT p50 (solid) and p90 (dashed) against the turn number,
 *          one point per turn that has successful requests;
 *   right  the empirical CDF of TTFT, first turns against returning turns.
 */
#include "bench/report.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/mem.h"
#include "base/stats.h"

/* ---- statistics ------------------------------------------------------------------- */

double bench_percentile(const double *sorted, long n, double p) {
    if (n <= 0) return NAN;
    long rank = (long)ceil(p / 100.0 * (double)n - 1e-9);
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return sorted[rank - 1];
}

/* Sort v[0..n) and summarize it. */
static void dist_of(double *v, long n, BenchDist *d) {
    d->n = n;
    if (n == 0) {
        d->mean = d->p50 = d->p90 = d->p99 = NAN;
        return;
    }
    mn_sort_doubles(v, n);
    double sum = 0;
    for (long i = 0; i < n; i++) sum += v[i];
    d->mean = sum / (double)n;
    d->p50 = bench_percentile(v, n, 50);
    d->p90 = bench_percentile(v, n, 90);
    d->p99 = bench_percentile(v, n, 99);
}

/* Messages that differ only in numbers ("the prompt has 553 tokens") are
 * one kind of failure: digit runs become N. */
static void normalize_message(const char *in, char *out, size_t cap) {
    size_t n = 0;
    if (strncmp(in, "HTTP ", 5) == 0) { /* the status name says it already */
        const char *p = in + 5;
        while (*p >= '0' && *p <= '9') p++;
        if (p[0] == ':' && p[1] == ' ') in = p + 2;
    }
    for (const char *p = in; *p && n + 1 < cap;) {
        if (*p >= '0' && *p <= '9') {
            out[n++] = 'N';
            while (*p >= '0' && *p <= '9') p++;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
}

static void add_error(BenchSummary *s, const char *msg) {
    for (int i = 0; i < s->n_errors; i++)
        if (strcmp(s->errors[i].msg, msg) == 0) {
            s->errors[i].n++;
            return;
        }
    if (s->n_errors == BENCH_MAX_ERRORS) return;
    snprintf(s->errors[s->n_errors].msg, sizeof s->errors[0].msg, "%s", msg);
    s->errors[s->n_errors++].n = 1;
}

static int cmp_error(const void *a, const void *b) {
    long x = ((const BenchErrorCount *)a)->n, y = ((const BenchErrorCount *)b)->n;
    return x > y ? -1 : x < y;
}

/* Index of tier name in the summary, added when new; -1 when full. */
static int summary_tier(BenchSummary *s, const char *name) {
    for (int i = 0; i < s->n_tiers; i++)
        if (strcmp(s->tier[i], name) == 0) return i;
    if (s->n_tiers == BENCH_MAX_TIERS) return -1;
    int k = s->n_tiers++;
    snprintf(s->tier[k], sizeof s->tier[k], "%s", name);
    return k;
}

/* Display order: mnemo's tiers from the top down, then any other. */
static int tier_rank(const char *name) {
    static const char *const ORDER[] = {"pool", "ram", "disk", "redis"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, ORDER[i]) == 0) return i;
    return 4;
}

static void sort_tiers(BenchSummary *s) { /* insertion sort: stable, a handful of tiers */
    for (int i = 1; i < s->n_tiers; i++)
        for (int k = i; k > 0 && tier_rank(s->tier[k - 1]) > tier_rank(s->tier[k]); k--) {
            char name[sizeof s->tier[0]];
            memcpy(name, s->tier[k], sizeof name);
            memcpy(s->tier[k], s->tier[k - 1], sizeof name);
            memcpy(s->tier[k - 1], name, sizeof name);
            double c = s->tier_cached[k];
            s->tier_cached[k] = s->tier_cached[k - 1];
            s->tier_cached[k - 1] = c;
        }
}

/* The tier split, recomputed tokens and disk restore bandwidth (see
 * BenchSummary): usage first, /metrics when no answer carried the split. */
static void summarize_tiers(const BenchResults *r, BenchSummary *s) {
    long tier_prompt = 0, recomputed = 0;
    bool has_recomputed = false;
    for (long i = 0; i < r->n_records; i++) {
        const BenchRecord *x = &r->records[i];
        if (x->status != BENCH_OK) continue;
        if (x->recomputed_tokens >= 0) {
            recomputed += x->recomputed_tokens;
            has_recomputed = true;
        }
        if (x->cached_by_tier.n == 0 || x->prompt_tokens <= 0) continue;
        tier_prompt += x->prompt_tokens;
        for (int k = 0; k < x->cached_by_tier.n; k++) {
            int t = summary_tier(s, x->cached_by_tier.name[k]);
            if (t >= 0) s->tier_cached[t] += (double)x->cached_by_tier.tokens[k];
        }
    }
    const BenchMetrics *d = &r->delta;
    s->tier_source = "none";
    if (tier_prompt > 0) {
        s->tier_source = "usage";
        sort_tiers(s);
        for (int t = 0; t < s->n_tiers; t++) s->tier_hit_rate[t] = s->tier_cached[t] / (double)tier_prompt;
    } else if (d->is_valid) {
        s->n_tiers = 0;
        double total = d->recomputed;
        for (int i = 0; i < d->n_tiers; i++)
            if (d->has_cached[i]) {
                total += d->cached[i];
                int t = summary_tier(s, d->tier[i]);
                if (t >= 0) s->tier_cached[t] = d->cached[i];
            }
        if (total > 0 && s->n_tiers > 0) {
            s->tier_source = "metrics";
            sort_tiers(s);
            for (int t = 0; t < s->n_tiers; t++) s->tier_hit_rate[t] = s->tier_cached[t] / total;
        } else {
            s->n_tiers = 0;
        }
    } else {
        s->n_tiers = 0;
    }
    s->recomputed_tokens = has_recomputed ? recomputed : d->is_valid ? (long)(d->recomputed + 0.5) : -1;
    s->disk_restore_mbps = NAN;
    for (int i = 0; i < d->n_tiers; i++)
        if (strcmp(d->tier[i], "disk") == 0) s->disk_restore_mbps = bench_tier_read_mbps(d, i);
}

int bench_summarize(const BenchResults *r, BenchSummary *s) {
    memset(s, 0, sizeof *s);
    long n = r->n_records, n_gaps = 0;
    for (long i = 0; i < n; i++)
        if (r->records[i].status == BENCH_OK) n_gaps += r->records[i].n_gaps;
    double *a = mn_calloc((size_t)n + 1, sizeof *a), *b = mn_calloc((size_t)n + 1, sizeof *b);
    double *c = mn_calloc((size_t)n + 1, sizeof *c), *g = mn_calloc((size_t)n_gaps + 1, sizeof *g);
    if (!a || !b || !c || !g) {
        mn_free(a);
        mn_free(b);
        mn_free(c);
        mn_free(g);
        return MN_ENOMEM;
    }
    s->requests = n;
    s->skipped = r->n_skipped;
    s->wall_s = r->wall_s;
    long na = 0, nb = 0, nc = 0, ng = 0, n_ok = 0, usage_prompt = 0, usage_cached = 0, nd = 0;
    double *d = mn_calloc((size_t)n + 1, sizeof *d);
    if (d == NULL) {
        mn_free(a);
        mn_free(b);
        mn_free(c);
        mn_free(g);
        return MN_ENOMEM;
    }
    s->shifted_tokens = -1;
    bool has_usage_cache = false;
    for (long i = 0; i < n; i++) { /* TTFT: all, first, returning */
        const BenchRecord *x = &r->records[i];
        s->by_status[x->status]++;
        if (x->status != BENCH_OK) {
            char name[32], msg[192];
            int k = snprintf(msg, sizeof msg, "%s: ", bench_status_name(x, name, sizeof name));
            normalize_message(x->error[0] ? x->error : "no message", msg + k, sizeof msg - (size_t)k);
            add_error(s, msg);
            continue;
        }
        n_ok++;
        if (x->ttft_s >= 0) {
            a[na++] = x->ttft_s;
            if (x->turn == 0) b[nb++] = x->ttft_s;
            else c[nc++] = x->ttft_s;
            if (x->truncated_tokens > 0) d[nd++] = x->ttft_s;
        }
        if (x->shifted_tokens >= 0) s->shifted_tokens = (s->shifted_tokens > 0 ? s->shifted_tokens : 0) + x->shifted_tokens;
        for (int k = 0; k < x->n_gaps; k++) g[ng++] = x->gaps[k];
        if (x->prompt_tokens > 0) s->prompt_tokens += x->prompt_tokens;
        if (x->cached_tokens > 0) s->cached_tokens += x->cached_tokens;
        if (x->output_tokens > 0) s->output_tokens += x->output_tokens;
        if (x->prompt_tokens > 0 && x->cached_tokens >= 0) {
            has_usage_cache = true;
            usage_prompt += x->prompt_tokens;
            usage_cached += x->cached_tokens;
        }
    }
    s->failures = n - n_ok;
    dist_of(a, na, &s->ttft);
    dist_of(b, nb, &s->ttft_first);
    dist_of(c, nc, &s->ttft_returning);
    dist_of(d, nd, &s->ttft_overflow);
    mn_free(d);
    dist_of(g, ng, &s->itl);
    na = nb = nc = 0;
    for (long i = 0; i < n; i++) { /* TPOT, normalized latency, end to end */
        const BenchRecord *x = &r->records[i];
        if (x->status != BENCH_OK) continue;
        if (x->tpot_s >= 0) a[na++] = x->tpot_s;
        if (x->output_tokens > 0) b[nb++] = x->e2e_s / (double)x->output_tokens;
        c[nc++] = x->e2e_s;
    }
    dist_of(a, na, &s->tpot);
    dist_of(b, nb, &s->norm_latency);
    dist_of(c, nc, &s->e2e);
    na = nb = nc = 0;
    for (long i = 0; i < n; i++) { /* request bytes: every request sent */
        const BenchRecord *x = &r->records[i];
        s->request_bytes += x->request_bytes;
        a[na++] = (double)x->request_bytes;
        if (x->turn == 0) b[nb++] = (double)x->request_bytes;
        else c[nc++] = (double)x->request_bytes;
    }
    dist_of(a, na, &s->req_bytes);
    dist_of(b, nb, &s->req_bytes_first);
    dist_of(c, nc, &s->req_bytes_returning);
    mn_free(a);
    mn_free(b);
    mn_free(c);
    mn_free(g);
    s->throughput_rps = s->wall_s > 0 ? (double)n_ok / s->wall_s : 0;
    s->output_tps = s->wall_s > 0 ? (double)s->output_tokens / s->wall_s : 0;
    s->cached_fraction = NAN;
    s->cached_source = "none";
    if (has_usage_cache) {
        s->cached_fraction = (double)usage_cached / (double)usage_prompt;
        s->cached_source = "usage";
    } else if (r->delta.is_valid) {
        double cached = 0;
        for (int i = 0; i < r->delta.n_tiers; i++) cached += r->delta.cached[i];
        if (cached + r->delta.recomputed > 0) {
            s->cached_fraction = cached / (cached + r->delta.recomputed);
            s->cached_source = "metrics";
        }
    }
    summarize_tiers(r, s);
    qsort(s->errors, (size_t)s->n_errors, sizeof s->errors[0], cmp_error);
    return MN_OK;
}

/* ---- the summary table --------------------------------------------------------------- */

static void print_row(FILE *f, const char *name, const BenchDist *d, double unit, const char *unit_name) {
    char cells[3][32];
    double v[3] = {d->p50, d->p90, d->p99};
    for (int i = 0; i < 3; i++) {
        if (isnan(v[i])) snprintf(cells[i], sizeof cells[i], "-");
        else snprintf(cells[i], sizeof cells[i], "%.2f", v[i] * unit);
    }
    fprintf(f, "  %-26s %10s %10s %10s   (n=%ld, %s)\n", name, cells[0], cells[1], cells[2], d->n, unit_name);
}

/* One line of tier i's I/O over the run, with only the series it has. */
static void print_tier_io(FILE *f, const BenchMetrics *d, int i) {
    const double *v = d->io[i];
    unsigned has = d->has_io[i];
    const char *sep = "";
    fprintf(f, "  tier %s (/metrics):", d->tier[i]);
    if (has & (1u << BENCH_IO_BYTES_READ)) {
        fprintf(f, " read %.1f MiB", v[BENCH_IO_BYTES_READ] / 1048576.0);
        if (has & (1u << BENCH_IO_READ_S)) fprintf(f, " in %.3f s", v[BENCH_IO_READ_S]);
        double mbps = bench_tier_read_mbps(d, i);
        if (!isnan(mbps)) fprintf(f, " (restore %.1f MB/s)", mbps);
        sep = ",";
    }
    if (has & (1u << BENCH_IO_BYTES_WRITTEN)) {
        fprintf(f, "%s wrote %.1f MiB", sep, v[BENCH_IO_BYTES_WRITTEN] / 1048576.0);
        if ((has & (1u << BENCH_IO_WRITE_S)) && v[BENCH_IO_WRITE_S] > 0)
            fprintf(f, " in %.3f s (%.1f MB/s)", v[BENCH_IO_WRITE_S],
                    v[BENCH_IO_BYTES_WRITTEN] / v[BENCH_IO_WRITE_S] / 1e6);
        sep = ",";
    }
    if (has & (1u << BENCH_IO_OCCUPANCY)) {
        fprintf(f, "%s holds %.1f MiB", sep, v[BENCH_IO_OCCUPANCY] / 1048576.0);
        sep = ",";
    }
    if (has & (1u << BENCH_IO_EVICTIONS)) {
        fprintf(f, "%s %.0f evictions", sep, v[BENCH_IO_EVICTIONS]);
        sep = ",";
    }
    if (has & (1u << BENCH_IO_CHECKSUM_FAILURES))
        fprintf(f, "%s %.0f checksum failures", sep, v[BENCH_IO_CHECKSUM_FAILURES]);
    fprintf(f, "\n");
}

/* "12345" or "-" for a statistic without samples. */
static const char *bytes_cell(double v, char *buf, size_t cap) {
    if (isnan(v)) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%.0f", v);
    return buf;
}

/* Request bytes beside TTFT: the total, per request, first and returning turns. */
static void print_bytes(FILE *f, const BenchSummary *s) {
    char mean[32], p50[32], first[32], ret[32];
    fprintf(f, "  request bytes: %ld total; per request mean %s, p50 %s; p50 first turns %s, returning turns %s\n",
            s->request_bytes, bytes_cell(s->req_bytes.mean, mean, sizeof mean),
            bytes_cell(s->req_bytes.p50, p50, sizeof p50), bytes_cell(s->req_bytes_first.p50, first, sizeof first),
            bytes_cell(s->req_bytes_returning.p50, ret, sizeof ret));
}

void bench_print_summary(FILE *f, const BenchSummary *s, const BenchResults *r, const BenchInfo *info) {
    fprintf(f, "mnemo bench: %s, seed %llu, %d conversations, %s (model %s, api %s)\n", info->workload, info->seed,
            info->n_convs, info->url, info->model, info->api ? info->api : "chat");
    fprintf(f, "  requests %ld, failures %ld, skipped %ld%s; %.2f s\n", s->requests, s->failures, s->skipped,
            r->is_interrupted ? " (interrupted)" : "", s->wall_s);
    fprintf(f, "  %-26s %10s %10s %10s\n", "", "p50", "p90", "p99");
    print_row(f, "TTFT", &s->ttft, 1e3, "ms");
    print_row(f, "TTFT first turns", &s->ttft_first, 1e3, "ms");
    print_row(f, "TTFT returning turns", &s->ttft_returning, 1e3, "ms");
    if (s->ttft_overflow.n > 0) print_row(f, "TTFT turns past the context", &s->ttft_overflow, 1e3, "ms");
    print_bytes(f, s);
    print_row(f, "time per output token", &s->tpot, 1e3, "ms");
    print_row(f, "inter-token gap", &s->itl, 1e3, "ms");
    print_row(f, "normalized latency", &s->norm_latency, 1e3, "ms/token");
    print_row(f, "end-to-end latency", &s->e2e, 1e3, "ms");
    fprintf(f, "  throughput: %.3f requests/s, %.2f output tokens/s\n", s->throughput_rps, s->output_tps);
    fprintf(f, "  tokens: %ld prompt, %ld cached, %ld output", s->prompt_tokens, s->cached_tokens, s->output_tokens);
    if (s->recomputed_tokens >= 0) fprintf(f, ", %ld recomputed", s->recomputed_tokens);
    if (s->shifted_tokens > 0) fprintf(f, ", %ld shifted", s->shifted_tokens);
    fprintf(f, "\n");
    if (isnan(s->cached_fraction)) fprintf(f, "  cached fraction: unknown (no answer reported cached tokens)\n");
    else fprintf(f, "  cached fraction: %.3f (from %s)\n", s->cached_fraction, s->cached_source);
    if (s->n_tiers > 0) {
        fprintf(f, "  hit rate by tier (from %s):", s->tier_source);
        for (int i = 0; i < s->n_tiers; i++) fprintf(f, "%s %s %.3f", i ? "," : "", s->tier[i], s->tier_hit_rate[i]);
        fprintf(f, " of prompt tokens\n");
    }
    const BenchMetrics *d = &r->delta;
    if (d->is_valid) {
        fprintf(f, "  server cache (/metrics):");
        for (int i = 0; i < d->n_tiers; i++)
            if (d->has_cached[i]) fprintf(f, " %s %.0f,", d->tier[i], d->cached[i]);
        fprintf(f, " recomputed %.0f tokens", d->recomputed);
        if (d->has_dropped) fprintf(f, ", %.0f blocks dropped", d->dropped_blocks);
        fprintf(f, "\n");
    }
    for (int i = 0; d->is_valid && i < d->n_tiers; i++)
        if (d->has_io[i]) print_tier_io(f, d, i);
    for (int i = 0; i < s->n_errors; i++) fprintf(f, "  error x%ld: %s\n", s->errors[i].n, s->errors[i].msg);
}

/* ---- files ------------------------------------------------------------------------------ */

static int file_close(FILE *f, const char *path, MnErr *err) {
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    return bad ? mn_err_set(err, MN_EIO, "%s: write failed: %s", path, strerror(errno)) : MN_OK;
}

static void csv_num(FILE *f, double v, bool is_known) {
    if (is_known) fprintf(f, "%.6f", v);
}

/* A text field, quoted as RFC 4180 says (quotes doubled); line breaks
 * become spaces so that a row stays one line. Empty text: an empty field. */
static void csv_text(FILE *f, const char *s) {
    if (s[0] == '\0') return;
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
    fputc('"', f);
}

int bench_write_csv(const char *path, const BenchResults *r, MnErr *err) {
    FILE *f = fopen(path, "w");
    if (f == NULL) return mn_err_set(err, MN_EIO, "%s: %s", path, strerror(errno));
    fprintf(f, "conversation,turn,prompt_tokens,cached_tokens,output_tokens,request_bytes,ttft_s,tpot_s,e2e_s,status,"
               "error\n");
    for (long i = 0; i < r->n_records; i++) {
        const BenchRecord *x = &r->records[i];
        char name[32];
        fprintf(f, "%d,%d,", x->conversation, x->turn + 1);
        if (x->prompt_tokens >= 0) fprintf(f, "%ld", x->prompt_tokens);
        fputc(',', f);
        if (x->cached_tokens >= 0) fprintf(f, "%ld", x->cached_tokens);
        fprintf(f, ",%ld,%ld,", x->output_tokens, x->request_bytes);
        csv_num(f, x->ttft_s, x->ttft_s >= 0);
        fputc(',', f);
        csv_num(f, x->tpot_s, x->tpot_s >= 0);
        fputc(',', f);
        csv_num(f, x->e2e_s, true);
        fprintf(f, ",%s,", bench_status_name(x, name, sizeof name));
        csv_text(f, x->error);
        fputc('\n', f);
    }
    return file_close(f, path, err);
}

static json_t *jnum(double v) { return isnan(v) ? json_null() : json_real(v); }

/* summary.json keys of BenchTierIo's series, in its order. */
static const char *const TIER_IO_KEYS[BENCH_IO__COUNT] = {
    "bytes_read", "bytes_written", "read_seconds", "reads", "write_seconds",
    "writes", "occupancy_bytes", "evictions", "checksum_failures",
};

static void put_dist(json_t *o, const char *prefix, const BenchDist *d, bool with_p99) {
    char key[64];
    snprintf(key, sizeof key, "%s_p50_s", prefix);
    json_object_set_new(o, key, jnum(d->p50));
    snprintf(key, sizeof key, "%s_p90_s", prefix);
    json_object_set_new(o, key, jnum(d->p90));
    if (with_p99) {
        snprintf(key, sizeof key, "%s_p99_s", prefix);
        json_object_set_new(o, key, jnum(d->p99));
    }
    snprintf(key, sizeof key, "%s_mean_s", prefix);
    json_object_set_new(o, key, jnum(d->mean));
}

int bench_write_json(const char *path, const BenchSummary *s, const BenchResults *r, const BenchInfo *info,
                     MnErr *err) {
    json_t *o = json_object();
    json_object_set_new(o, "workload", json_string(info->workload));
    json_object_set_new(o, "url", json_string(info->url));
    json_object_set_new(o, "model", json_string(info->model));
    json_object_set_new(o, "api", json_string(info->api ? info->api : "chat"));
    json_object_set_new(o, "seed", json_integer((json_int_t)info->seed));
    json_object_set_new(o, "conversations", json_integer(info->n_convs));
    json_object_set_new(o, "conversations_started", json_integer(r->n_convs_started));
    json_object_set_new(o, "planned_requests", json_integer(r->n_planned));
    json_object_set_new(o, "requests", json_integer(s->requests));
    json_object_set_new(o, "failures", json_integer(s->failures));
    json_object_set_new(o, "skipped", json_integer(s->skipped));
    json_object_set_new(o, "interrupted", json_boolean(r->is_interrupted));
    json_object_set_new(o, "duration_s", json_real(s->wall_s));
    put_dist(o, "ttft", &s->ttft, true);
    put_dist(o, "ttft_first", &s->ttft_first, true);
    put_dist(o, "ttft_returning", &s->ttft_returning, true);
    put_dist(o, "ttft_overflow", &s->ttft_overflow, true);
    json_object_set_new(o, "overflow_requests", json_integer((json_int_t)s->ttft_overflow.n));
    json_object_set_new(o, "shifted_tokens", s->shifted_tokens >= 0 ? json_integer((json_int_t)s->shifted_tokens) : json_null());
    put_dist(o, "tpot", &s->tpot, true);
    put_dist(o, "itl", &s->itl, true);
    put_dist(o, "norm_latency", &s->norm_latency, true);
    put_dist(o, "e2e", &s->e2e, true);
    json_object_set_new(o, "request_bytes", json_integer((json_int_t)s->request_bytes));
    json_object_set_new(o, "request_bytes_mean", jnum(s->req_bytes.mean));
    json_object_set_new(o, "request_bytes_p50", jnum(s->req_bytes.p50));
    json_object_set_new(o, "request_bytes_first_p50", jnum(s->req_bytes_first.p50));
    json_object_set_new(o, "request_bytes_returning_p50", jnum(s->req_bytes_returning.p50));
    json_object_set_new(o, "throughput_rps", json_real(s->throughput_rps));
    json_object_set_new(o, "output_tps", json_real(s->output_tps));
    json_object_set_new(o, "prompt_tokens", json_integer(s->prompt_tokens));
    json_object_set_new(o, "cached_tokens", json_integer(s->cached_tokens));
    json_object_set_new(o, "output_tokens", json_integer(s->output_tokens));
    json_object_set_new(o, "cached_fraction", jnum(s->cached_fraction));
    json_object_set_new(o, "cached_fraction_source", json_string(s->cached_source));
    json_object_set_new(o, "recomputed_tokens",
                        s->recomputed_tokens >= 0 ? json_integer((json_int_t)s->recomputed_tokens) : json_null());
    if (s->n_tiers > 0) {
        json_t *cached = json_object(), *rates = json_object();
        for (int i = 0; i < s->n_tiers; i++) {
            json_object_set_new(cached, s->tier[i], json_real(s->tier_cached[i]));
            json_object_set_new(rates, s->tier[i], json_real(s->tier_hit_rate[i]));
        }
        json_object_set_new(o, "cached_tokens_by_tier", cached);
        json_object_set_new(o, "tier_hit_rates", rates);
    } else {
        json_object_set_new(o, "cached_tokens_by_tier", json_null());
        json_object_set_new(o, "tier_hit_rates", json_null());
    }
    json_object_set_new(o, "tier_source", json_string(s->tier_source));
    json_object_set_new(o, "disk_restore_mbps", jnum(s->disk_restore_mbps));
    json_object_set_new(o, "tokens_per_word", json_real(info->tokens_per_word));
    json_object_set_new(o, "tokens_per_word_measured", json_boolean(info->is_measured));
    json_t *st = json_object();
    for (long i = 0; i < r->n_records; i++) {
        char name[32];
        const char *k = bench_status_name(&r->records[i], name, sizeof name);
        json_object_set_new(st, k, json_integer(json_integer_value(json_object_get(st, k)) + 1));
    }
    json_object_set_new(o, "status", st);
    json_t *errs = json_array();
    for (int i = 0; i < s->n_errors; i++)
        json_array_append_new(errs, json_pack("{s:s,s:I}", "message", s->errors[i].msg, "count",
                                              (json_int_t)s->errors[i].n));
    json_object_set_new(o, "errors", errs);
    const BenchMetrics *d = &r->delta;
    if (d->is_valid) {
        json_t *m = json_object(), *cached = json_object(), *tiers = json_object();
        for (int i = 0; i < d->n_tiers; i++) {
            if (d->has_cached[i]) json_object_set_new(cached, d->tier[i], json_real(d->cached[i]));
            if (d->has_io[i] == 0) continue;
            json_t *t = json_object();
            for (int k = 0; k < BENCH_IO__COUNT; k++)
                if (d->has_io[i] & (1u << k)) json_object_set_new(t, TIER_IO_KEYS[k], json_real(d->io[i][k]));
            json_object_set_new(t, "restore_mbps", jnum(bench_tier_read_mbps(d, i)));
            json_object_set_new(tiers, d->tier[i], t);
        }
        json_object_set_new(m, "cached_tokens_by_tier", cached);
        json_object_set_new(m, "recomputed_tokens", json_real(d->recomputed));
        json_object_set_new(m, "tiers", tiers);
        json_object_set_new(m, "dropped_blocks", d->has_dropped ? json_real(d->dropped_blocks) : json_null());
        json_object_set_new(o, "server_metrics", m);
    } else {
        json_object_set_new(o, "server_metrics", json_null());
    }
    int rc = json_dump_file(o, path, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(o);
    return rc ? mn_err_set(err, MN_EIO, "%s: cannot write", path) : MN_OK;
}

/* ---- SVG ------------------------------------------------------------------------------------- */

#define SVG_W 1000
#define SVG_H 480
#define PANEL_W 500
#define PLOT_L 72  /* plot box inside a panel */
#define PLOT_R 480
#define PLOT_T 70
#define PLOT_B 410
static const char *const COLOR[2] = {"#1f77b4", "#e4572e"};

typedef struct Axis {
    double lo, hi, step; /* domain and tick step */
    int decimals;
} Axis;

/* Ticks from lo up past max in steps of 1, 2 or 5 x 10^k. */
static Axis nice_axis(double lo, double max, int target, bool is_integer) {
    Axis a = {.lo = lo};
    double range = max - lo;
    if (!(range > 0) || !isfinite(range)) range = 1;
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    a.step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    if (is_integer && a.step < 1) a.step = 1;
    a.hi = lo + ceil(range / a.step - 1e-9) * a.step;
    if (a.hi <= lo) a.hi = lo + a.step;
    a.decimals = a.step >= 1 ? 0 : (int)ceil(-log10(a.step) - 1e-9);
    return a;
}

static double map(const Axis *a, double v, double p0, double p1) { return p0 + (v - a->lo) / (a->hi - a->lo) * (p1 - p0); }

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
        }
    }
}

/* Axes, grid, ticks and labels of the panel at x offset ox. */
static void svg_frame(FILE *f, int ox, const Axis *x, const Axis *y, const char *title, const char *xlabel,
                      const char *ylabel, double x_first_tick) {
    fprintf(f, "<g transform=\"translate(%d,0)\">\n", ox);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">", (PLOT_L + PLOT_R) / 2,
            PLOT_T - 16);
    xml_text(f, title);
    fprintf(f, "</text>\n");
    for (double v = y->lo; v <= y->hi + y->step * 1e-6; v += y->step) {
        double py = map(y, v, PLOT_B, PLOT_T);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", PLOT_L, py, PLOT_R, py);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.*f</text>\n", PLOT_L - 6, py + 4, y->decimals, v);
    }
    for (double v = x_first_tick; v <= x->hi + x->step * 1e-6; v += x->step) {
        double px = map(x, v, PLOT_L, PLOT_R);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e0e0e0\"/>\n", px, PLOT_T, px, PLOT_B);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#000\"/>\n", px, PLOT_B, px, PLOT_B + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.*f</text>\n", px, PLOT_B + 19, x->decimals, v);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n", PLOT_L, PLOT_T,
            PLOT_R - PLOT_L, PLOT_B - PLOT_T);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (PLOT_L + PLOT_R) / 2, PLOT_B + 42);
    xml_text(f, xlabel);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 %d %d)\">", 20,
            (PLOT_T + PLOT_B) / 2, 20, (PLOT_T + PLOT_B) / 2);
    xml_text(f, ylabel);
    fprintf(f, "</text>\n");
}

static void svg_legend(FILE *f, int x, int y, int k, const char *label, bool is_dashed) {
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", x, y + 18 * k,
            x + 24, y + 18 * k, COLOR[k % 2], is_dashed ? " stroke-dasharray=\"6,4\"" : "");
    fprintf(f, "<text x=\"%d\" y=\"%d\">", x + 30, y + 18 * k + 4);
    xml_text(f, label);
    fprintf(f, "</text>\n");
}

static void svg_no_data(FILE *f) {
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#888\">no successful requests</text>\n",
            (PLOT_L + PLOT_R) / 2, (PLOT_T + PLOT_B) / 2);
}

/* Left panel: TTFT p50 and p90 by turn. */
static int svg_by_turn(FILE *f, const BenchResults *r) {
    int max_turn = 0;
    for (long i = 0; i < r->n_records; i++)
        if (r->records[i].status == BENCH_OK && r->records[i].ttft_s >= 0 && r->records[i].turn + 1 > max_turn)
            max_turn = r->records[i].turn + 1;
    double *p50 = mn_calloc((size_t)max_turn + 1, sizeof *p50), *p90 = mn_calloc((size_t)max_turn + 1, sizeof *p90);
    double *v = mn_calloc((size_t)r->n_records + 1, sizeof *v);
    long *n_turn = mn_calloc((size_t)max_turn + 1, sizeof *n_turn);
    if (!p50 || !p90 || !v || !n_turn) {
        mn_free(p50);
        mn_free(p90);
        mn_free(v);
        mn_free(n_turn);
        return MN_ENOMEM;
    }
    double ymax = 0;
    for (int t = 0; t < max_turn; t++) {
        long n = 0;
        for (long i = 0; i < r->n_records; i++)
            if (r->records[i].status == BENCH_OK && r->records[i].ttft_s >= 0 && r->records[i].turn == t)
                v[n++] = r->records[i].ttft_s;
        BenchDist d;
        dist_of(v, n, &d);
        n_turn[t] = n;
        p50[t] = d.p50;
        p90[t] = d.p90;
        if (n > 0 && d.p90 > ymax) ymax = d.p90;
    }
    Axis x = nice_axis(0, max_turn > 0 ? max_turn : 1, 8, true);
    x.lo = 0.5;
    x.hi = (max_turn > 0 ? max_turn : 1) + 0.5;
    Axis y = nice_axis(0, ymax > 0 ? ymax * 1.05 : 1, 5, false);
    svg_frame(f, 0, &x, &y, "TTFT by turn", "turn", "time to first token (s)", x.step <= 1 ? 1 : x.step);
    for (int k = 0; k < 2; k++) {
        const double *p = k == 0 ? p50 : p90;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", COLOR[k],
                k ? " stroke-dasharray=\"6,4\"" : "");
        for (int t = 0; t < max_turn; t++)
            if (!isnan(p[t])) fprintf(f, "%.1f,%.1f ", map(&x, t + 1, PLOT_L, PLOT_R), map(&y, p[t], PLOT_B, PLOT_T));
        fprintf(f, "\"/>\n");
        for (int t = 0; t < max_turn; t++)
            if (!isnan(p[t]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", map(&x, t + 1, PLOT_L, PLOT_R),
                        map(&y, p[t], PLOT_B, PLOT_T), COLOR[k]);
    }
    for (int t = 0; t < max_turn; t++) /* samples per turn, small, above the axis */
        if (n_turn[t] > 0)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"9\" fill=\"#777\">n=%ld</text>\n",
                    map(&x, t + 1, PLOT_L, PLOT_R), PLOT_B - 4, n_turn[t]);
    if (max_turn == 0) svg_no_data(f);
    svg_legend(f, PLOT_L + 12, PLOT_T + 16, 0, "p50", false);
    svg_legend(f, PLOT_L + 12, PLOT_T + 16, 1, "p90", true);
    fprintf(f, "</g>\n");
    mn_free(p50);
    mn_free(p90);
    mn_free(v);
    mn_free(n_turn);
    return MN_OK;
}

/* Right panel: CDF of TTFT, first vs returning turns. */
static int svg_cdf(FILE *f, const BenchResults *r, const BenchSummary *s) {
    double *v[2];
    long n[2] = {0, 0};
    v[0] = mn_calloc((size_t)r->n_records + 1, sizeof *v[0]);
    v[1] = mn_calloc((size_t)r->n_records + 1, sizeof *v[1]);
    if (!v[0] || !v[1]) {
        mn_free(v[0]);
        mn_free(v[1]);
        return MN_ENOMEM;
    }
    double xmax = 0;
    for (long i = 0; i < r->n_records; i++) {
        const BenchRecord *x = &r->records[i];
        if (x->status != BENCH_OK || x->ttft_s < 0) continue;
        int k = x->turn > 0;
        v[k][n[k]++] = x->ttft_s;
        if (x->ttft_s > xmax) xmax = x->ttft_s;
    }
    Axis x = nice_axis(0, xmax > 0 ? xmax * 1.02 : 1, 6, false);
    Axis y = {0, 1, 0.2, 1};
    svg_frame(f, PANEL_W, &x, &y, "TTFT distribution", "time to first token (s)", "fraction of requests", 0);
    for (int k = 0; k < 2; k++) {
        if (n[k] == 0) continue;
        mn_sort_doubles(v[k], n[k]);
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s d=\"M%d,%d", COLOR[k],
                k ? " stroke-dasharray=\"6,4\"" : "", PLOT_L, PLOT_B);
        for (long i = 0; i < n[k]; i++)
            fprintf(f, " H%.1f V%.1f", map(&x, v[k][i], PLOT_L, PLOT_R),
                    map(&y, (double)(i + 1) / (double)n[k], PLOT_B, PLOT_T));
        fprintf(f, " H%d\"/>\n", PLOT_R);
    }
    if (n[0] + n[1] == 0) svg_no_data(f);
    char label[96];
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"42\" fill=\"#fff\" fill-opacity=\"0.85\"/>\n",
            PLOT_R - 268, PLOT_B - 62, 262);
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "returning turns" : "first turns";
        double p50 = k ? s->ttft_returning.p50 : s->ttft_first.p50;
        if (n[k] > 0 && !isnan(p50)) snprintf(label, sizeof label, "%s (n=%ld, p50 %.3f s)", name, n[k], p50);
        else snprintf(label, sizeof label, "%s (none)", name);
        svg_legend(f, PLOT_R - 262, PLOT_B - 48, k, label, k == 1);
    }
    fprintf(f, "</g>\n");
    mn_free(v[0]);
    mn_free(v[1]);
    return MN_OK;
}

int bench_write_svg(const char *path, const BenchSummary *s, const BenchResults *r, const BenchInfo *info,
                    MnErr *err) {
    FILE *f = fopen(path, "w");
    if (f == NULL) return mn_err_set(err, MN_EIO, "%s: %s", path, strerror(errno));
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", SVG_W, SVG_H);
    char title[512];
    snprintf(title, sizeof title, "mnemo bench: %s, %ld requests (%ld failed), %.1f s, %s, model %s", info->workload,
             s->requests, s->failures, s->wall_s, info->url, info->model);
    fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">", SVG_W / 2);
    xml_text(f, title);
    fprintf(f, "</text>\n");
    int rc = svg_by_turn(f, r);
    if (rc == MN_OK) rc = svg_cdf(f, r, s);
    fprintf(f, "</svg>\n");
    int rc2 = file_close(f, path, err);
    if (rc) return mn_err_set(err, rc, "%s: out of memory", path);
    return rc2;
}

static int make_dirs(const char *dir, MnErr *err) {
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) return mn_err_set(err, MN_EINVAL, "--out is too long");
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) return mn_err_set(err, MN_EIO, "%s: %s", buf, strerror(errno));
            *p = c;
            if (c == '\0') break;
        }
    }
    return MN_OK;
}

int bench_write_report(const char *dir, const BenchSummary *s, const BenchResults *r, const BenchInfo *info,
                       MnErr *err) {
    int rc = make_dirs(dir, err);
    char path[1100];
    if (rc == MN_OK) {
        snprintf(path, sizeof path, "%s/requests.csv", dir);
        rc = bench_write_csv(path, r, err);
    }
    if (rc == MN_OK) {
        snprintf(path, sizeof path, "%s/summary.json", dir);
        rc = bench_write_json(path, s, r, info, err);
    }
    if (rc == MN_OK) {
        snprintf(path, sizeof path, "%s/report.svg", dir);
        rc = bench_write_svg(path, s, r, info, err);
    }
    return rc;
}
