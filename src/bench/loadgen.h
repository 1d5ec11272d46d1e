/* loadgen.h — run a BenchPlan against an OpenAI-compatible server.
 *
 * bench_run plays every conversation of the plan as a closed loop: a turn
 * is sent when its conversation arrived (turn 0) or when the previous reply
 * has arrived and the user has thought for the planned time. Through chat
 * completions the history sent is the system message, every earlier user
 * turn and the replies that actually came back; through the Responses API
 * turn 0 sends its user message with the system message as instructions,
 * and every later turn only its new user message, the same instructions
 * and the previous reply's response id (the server holds the rest). A fixed pool of --concurrency workers (one libcurl
 * client each) caps the requests in flight; ready turns go out in order of
 * the time they became ready. Each request is recorded (BenchRecord). A
 * failed turn ends its conversation (its later turns count as skipped).
 * When the server is mnemo, /metrics is scraped before and after: cached
 * tokens per tier, recomputed tokens, and each tier's I/O counters (bytes
 * and seconds of reads and writes, occupancy, evictions, checksum
 * failures), from which the report derives restore bandwidth.
 */
#ifndef MN_BENCH_LOADGEN_H
#define MN_BENCH_LOADGEN_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"
#include "bench/client.h"
#include "bench/workload.h"

typedef enum BenchStatus {
    BENCH_OK,            /* 200 and a complete stream */
    BENCH_HTTP_ERROR,    /* an answer with another status */
    BENCH_CONNECT_ERROR, /* no HTTP answer (refused, reset before a status) */
    BENCH_TIMEOUT,       /* connect or idle timeout */
    BENCH_STREAM_ERROR,  /* a 200 stream broke off or ended without [DONE] */
    BENCH_SERVER_ERROR,  /* a 200 stream carried the server's error event (its message in error) */
    BENCH_STATUS__COUNT
} BenchStatus;

typedef struct BenchRecord {
    int conversation, turn;
    BenchStatus status;
    int http_status;     /* 0: none */
    long prompt_tokens;  /* from usage; -1 when not reported */
    long cached_tokens;  /* from usage; -1 when not reported */
    long recomputed_tokens;          /* from usage; -1 when not reported */
    long truncated_tokens;           /* from usage: > 0 on a turn past the context; -1 when not reported */
    long shifted_tokens;             /* from usage; -1 when not reported */
    ClientTierTokens cached_by_tier; /* from usage; n == 0 when not reported */
    long output_tokens;  /* usage's completion_tokens, else the content deltas counted */
    long request_bytes;  /* the request body sent (its JSON; headers not counted) */
    double ready_s;      /* when the turn was due, seconds since the run started */
    double send_s, end_s;/* request sent / answer complete, same clock */
    double ttft_s;       /* send -> first content delta; -1: none came */
    double tpot_s;       /* (e2e - ttft) / (output_tokens - 1); -1 with < 2 tokens */
    double e2e_s;        /* send -> end */
    int n_gaps;
    double *gaps;        /* (n_gaps) seconds between consecutive content deltas */
    char error[160];     /* "" when ok */
    char *sent;          /* keep_text: the messages (chat) or input items (responses) sent, as a JSON array; else NULL */
    char *reply;         /* keep_text: the reply text, else NULL */
} BenchRecord;

#define BENCH_MAX_TIERS 8

/* mnemo's per-tier I/O series (label tier="..."); all counters but
 * occupancy, a gauge. The histograms give their _sum and _count. */
typedef enum BenchTierIo {
    BENCH_IO_BYTES_READ,        /* mnemo_tier_bytes_read_total */
    BENCH_IO_BYTES_WRITTEN,     /* mnemo_tier_bytes_written_total */
    BENCH_IO_READ_S,            /* mnemo_tier_read_seconds_sum */
    BENCH_IO_READS,             /* mnemo_tier_read_seconds_count */
    BENCH_IO_WRITE_S,           /* mnemo_tier_write_seconds_sum */
    BENCH_IO_WRITES,            /* mnemo_tier_write_seconds_count */
    BENCH_IO_OCCUPANCY,         /* mnemo_tier_occupancy_bytes (gauge) */
    BENCH_IO_EVICTIONS,         /* mnemo_tier_evictions_total */
    BENCH_IO_CHECKSUM_FAILURES, /* mnemo_tier_checksum_failures_total */
    BENCH_IO__COUNT
} BenchTierIo;

/* mnemo's cache counters at one moment (or their change over a run). A
 * tier is listed once any series names it; a series that is absent reads
 * as 0 with its bit clear in has_io. */
typedef struct BenchMetrics {
    bool is_valid;       /* /metrics answered with mnemo's counters */
    int n_tiers;
    char tier[BENCH_MAX_TIERS][24];
    double cached[BENCH_MAX_TIERS]; /* mnemo_cached_tokens_total{tier} */
    bool has_cached[BENCH_MAX_TIERS];
    double recomputed;   /* mnemo_recomputed_tokens_total */
    double io[BENCH_MAX_TIERS][BENCH_IO__COUNT];
    unsigned has_io[BENCH_MAX_TIERS]; /* bit (1 << BenchTierIo) per series present */
    bool has_dropped;
    double dropped_blocks; /* mnemo_dropped_blocks_total */
} BenchMetrics;

typedef struct BenchRunOpts {
    const char *url;     /* base URL, e.g. http://127.0.0.1:8080 */
    const char *api_key; /* NULL: none */
    const char *model;   /* sent as "model" */
    ClientApi api;       /* chat completions (0) or the Responses API */
    float temperature;   /* < 0: not sent */
    int concurrency;     /* workers, >= 1 */
    double duration_s;   /* no conversation starts after this (0: no limit) */
    double connect_timeout_s, idle_timeout_s; /* <= 0: no limit */
    bool keep_text;      /* fill BenchRecord.sent / .reply */
    bool show_progress;  /* a progress line on stderr */
    bool handle_signals; /* SIGINT/SIGTERM: cancel what is in flight, keep what finished */
} BenchRunOpts;

typedef struct BenchResults {
    long n_records;
    BenchRecord *records; /* (n_records) in completion order */
    long n_planned;       /* the plan's requests */
    long n_skipped;       /* planned but not sent (--duration, failures, interruption) */
    int n_convs_started;
    double wall_s;        /* run start -> the last answer */
    bool is_interrupted;
    BenchMetrics before, after, delta; /* delta = after - before when both valid
                                          (gauges: the value after; a series
                                          missing before counts from 0) */
} BenchResults;

/* Run the plan. MN_OK with *out (free with bench_results_free) however many
 * requests failed; MN_ENOMEM or MN_EINVAL (bad options, err says why). */
int bench_run(const BenchPlan *plan, const BenchRunOpts *o, BenchResults **out, MnErr *err);
void bench_results_free(BenchResults *r);

/* Parse a Prometheus text body for mnemo's cache counters. */
void bench_metrics_parse(const char *text, BenchMetrics *m);

/* The change from a to b (see BenchResults.delta); d is all zero (not
 * valid) unless both are valid. */
void bench_metrics_delta(const BenchMetrics *a, const BenchMetrics *b, BenchMetrics *d);

/* Restore bandwidth of tier i of a delta in MB/s (10^6 bytes): bytes read
 * over the summed read time; NaN when either series is absent or no read
 * time passed. */
double bench_tier_read_mbps(const BenchMetrics *d, int i);

/* "ok", "http_500" style name of a record's status (buf >= 16 bytes). */
const char *bench_status_name(const BenchRecord *r, char *buf, size_t cap);

#endif
