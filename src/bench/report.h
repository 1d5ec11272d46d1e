/* report.h — what `mnemo bench` tells: a summary table, requests.csv,
 * summary.json and report.svg.
 *
 * Percentiles are nearest-rank: the p-th percentile of n sorted samples is
 * the sample at 1-based rank ceil(p/100 * n), so it is always an observed
 * value. Latency statistics (TTFT, TPOT, inter-token gaps, normalized
 * latency, end-to-end) are over successful requests only; a statistic
 * without samples is NaN on stdout ("-") and null in JSON. What a server
 * does not report (usage details, mnemo's /metrics) is left out of the
 * summary table and null in summary.json.
 */
#ifndef MN_BENCH_REPORT_H
#define MN_BENCH_REPORT_H

#include <stdio.h>

#include "base/err.h"
#include "bench/loadgen.h"

typedef struct BenchDist {
    long n;
    double mean, p50, p90, p99; /* NaN when n == 0 */
} BenchDist;

#define BENCH_MAX_ERRORS 8

typedef struct BenchErrorCount {
    char msg[192];
    long n;
} BenchErrorCount;

typedef struct BenchSummary {
    long requests;          /* sent and answered or failed (= records) */
    long failures;          /* requests whose status is not ok */
    long skipped;           /* planned turns never sent */
    long by_status[BENCH_STATUS__COUNT];
    double wall_s;
    BenchDist ttft, ttft_first, ttft_returning; /* first: turn 1; returning: turns 2.. */
    BenchDist ttft_overflow;    /* turns past the context: usage reported truncated_tokens > 0 */
    long shifted_tokens;        /* usage's shifted_tokens summed; -1 when no answer reported it */
    BenchDist tpot, itl, norm_latency, e2e;     /* itl: inter-token (delta) gaps */
    /* request body bytes, over every request sent (answered or not): what
     * the client paid to send its turns, the whole history each time
     * through chat completions, the new message through the Responses API */
    long request_bytes;
    BenchDist req_bytes, req_bytes_first, req_bytes_returning;
    double throughput_rps;  /* successful requests / wall_s */
    double output_tps;      /* output tokens of successful requests / wall_s */
    long prompt_tokens, cached_tokens, output_tokens; /* sums over successful requests */
    double cached_fraction; /* cached / prompt tokens; NaN when unknown */
    const char *cached_source; /* "usage", "metrics" or "none" */
    /* the cache split by tier (pool, ram, disk first, then as reported):
     * from usage's cached_tokens_by_tier over the successful requests that
     * report it (hit rate = the tier's cached tokens / those requests'
     * prompt tokens), else from mnemo's /metrics (cached / cached +
     * recomputed); n_tiers == 0 when the server tells neither */
    int n_tiers;
    char tier[BENCH_MAX_TIERS][24];
    double tier_cached[BENCH_MAX_TIERS];
    double tier_hit_rate[BENCH_MAX_TIERS];
    const char *tier_source;    /* "usage", "metrics" or "none" */
    long recomputed_tokens;     /* usage's sum, else /metrics' change; -1 when unknown */
    double disk_restore_mbps;   /* /metrics: tier "disk" bytes read / read seconds, MB/s; NaN when absent */
    int n_errors;
    BenchErrorCount errors[BENCH_MAX_ERRORS]; /* distinct failure messages, most frequent first */
} BenchSummary;

/* Facts about the run for the report headers. */
typedef struct BenchInfo {
    const char *workload, *url, *model;
    unsigned long long seed;
    int n_convs;
    double tokens_per_word;
    bool is_measured;
    const char *api;     /* "chat" or "responses"; NULL: chat */
} BenchInfo;

/* Nearest-rank percentile of sorted[0..n) (n >= 1), p in (0, 100]. */
double bench_percentile(const double *sorted, long n, double p);

/* MN_OK or MN_ENOMEM. */
int bench_summarize(const BenchResults *r, BenchSummary *s);

void bench_print_summary(FILE *f, const BenchSummary *s, const BenchResults *r, const BenchInfo *info);

/* One row per request, header
 * conversation,turn,prompt_tokens,cached_tokens,output_tokens,request_bytes,ttft_s,tpot_s,e2e_s,status,error
 * (turns 1-based; unknown values empty; request_bytes: the request body
 * sent; error: a failed request's message, quoted, empty when ok). */
int bench_write_csv(const char *path, const BenchResults *r, MnErr *err);
int bench_write_json(const char *path, const BenchSummary *s, const BenchResults *r, const BenchInfo *info,
                     MnErr *err);
/* Two plots: TTFT p50/p90 by turn, and the TTFT CDF of first and returning turns. */
int bench_write_svg(const char *path, const BenchSummary *s, const BenchResults *r, const BenchInfo *info,
                    MnErr *err);

/* Create dir (and its parents) and write the three files into it. */
int bench_write_report(const char *dir, const BenchSummary *s, const BenchResults *r, const BenchInfo *info,
                       MnErr *err);

#endif
