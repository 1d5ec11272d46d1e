/* server.c — the HTTP server (see server.h).
 *
 * Connections come through server/http's front (server/gate answers the
 * heads libmicrohttpd would answer badly and hands the rest to the
 * daemon, a thread per connection). One access-handler call
 * chain per request: libmicrohttpd calls handle_request first with the
 * headers (begin_request checks the body's framing and declared size and
 * may answer at once), then with body pieces (collected into the
 * connection's Conn up to max_body; past it, refuse_body answers 413 on the
 * socket and drops the connection), then once more to answer.
 * Answers are JSON built by server/openai; streams are SSE produced by
 * stream_read, which blocks on the Request's channel (allowed with a thread
 * per connection) and sends a comment line every second so a vanished
 * client is noticed. stream_free runs when the response ends for any reason
 * and cancels the request if it is still running.
 *
 * Every answer names the model as /v1/models lists it (whatever the request
 * said), a system_fingerprint that changes when the model file or the mnemo
 * binary does (what decides the numbers a seed reproduces), and an id of a
 * random per-process prefix and a counter, so ids never repeat across
 * restarts. Logprobs travel from the engine as records with the text
 * (ReqOutput) and are rendered here with the tokenizer.
 */
#include "server/server.h"

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/version.h"
#include "engine/prompt.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/responses.h"

/* Allow-Headers of a CORS preflight, besides those the browser asks for. */
#define CORS_ALLOW_HEADERS "Authorization, Content-Type, X-Session-Id"
/* How long a browser may cache a preflight answer (seconds). */
#define CORS_MAX_AGE "600"

struct Server {
    Engine *e;
    const Model *m;
    ServerOptions opt;
    HttpFront *front;           /* the gate and libmicrohttpd */
    Metrics *metrics;
    RespService *resp;          /* the Responses API's routes */
    MetricFamily *f_tier_read, *f_tier_written, *f_tier_read_s, *f_tier_write_s, *f_tier_occupancy, *f_tier_stored, *f_tier_evictions,
        *f_tier_checksum, *f_dropped, *f_prefetched, *f_restored, *f_tier_missing, *f_tier_io_errors, *f_tier_up,
        *f_tier_read_rate,
        *f_tier_resets, *f_shared_lookups, *f_preemptions, *f_preempt_recomputed;
    MetricFamily *f_build_info, *f_requests, *f_prompt, *f_generated, *f_cached, *f_cached_partial, *f_recomputed,
        *f_shifted, *f_ttft, *f_tpot, *f_pool,
        *f_queue, *f_running;
    atomic_uint_fast64_t next_id;
    char id_prefix[24];         /* random per process: "chatcmpl-<prefix>-<n>" */
    char fingerprint[24];       /* system_fingerprint: "fp_" + hex of model and binary */
    int64_t created;            /* when the model was loaded (/v1/models) */
};

/* One per connection (libmicrohttpd's socket context, made and freed by
 * conn_notify); with a thread per connection it holds one request at a
 * time, whose fields begin_request resets. */
typedef struct Conn {
    const char *method, *url; /* the current request's: libmicrohttpd's strings, valid until it completes */
    HttpBody body;
} Conn;

void server_options_default(ServerOptions *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->model_name = "mnemo";
    o->response_ttl_s = RESP_TTL_DEFAULT_S;
    o->max_body = 1 << 20;
    http_limits_default(&o->limits);
}

/* ---- responses ------------------------------------------------------------------ */

static void count_request(Server *s, int status) {
    char lbl[64];
    char code[16];
    snprintf(code, sizeof code, "%d", status);
    metrics_format_label(lbl, sizeof lbl, "status", code);
    metrics_counter_add(s->f_requests, lbl, 1);
}

static Conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? info->socket_context : NULL;
}

/* The request's Origin when --cors-origin lists it ("*" lists every one), else NULL. */
static const char *cors_origin(const Server *s, struct MHD_Connection *c) {
    if (s->opt.n_cors_origins == 0) return NULL;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    for (int i = 0; origin && i < s->opt.n_cors_origins; i++)
        if (strcmp(s->opt.cors_origins[i], "*") == 0 || strcmp(s->opt.cors_origins[i], origin) == 0) return origin;
    return NULL;
}

/* Queue r (and release it) with the headers every answer of its status
 * carries. With CORS origins set every answer varies by Origin, so a cache
 * never gives one origin's answer to another. */
static enum MHD_Result queue_answer(Server *s, struct MHD_Connection *c, int status, struct MHD_Response *r,
                                    const char *allow) {
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (allow) MHD_add_response_header(r, "Allow", allow);
    if (s->opt.n_cors_origins > 0) MHD_add_response_header(r, "Vary", "Origin");
    const char *origin = cors_origin(s, c);
    if (origin) MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_body(Server *s, struct MHD_Connection *c, int status, const char *type, const char *body,
                                 size_t len, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    return queue_answer(s, c, status, r, allow);
}

static enum MHD_Result send_json(Server *s, struct MHD_Connection *c, int status, char *json) {
    if (json == NULL) return MHD_NO;
    count_request(s, status);
    enum MHD_Result ok = send_body(s, c, status, "application/json", json, strlen(json), NULL);
    mn_free(json);
    return ok;
}

/* An OpenAI error answer; param, code and allow (an Allow header) may be NULL. */
static enum MHD_Result send_error_full(Server *s, struct MHD_Connection *c, int status, const char *msg,
                                       const char *param, const char *code, const char *allow) {
    char *json = api_error_json(status, msg, param, code);
    if (json == NULL) return MHD_NO;
    count_request(s, status);
    Conn *conn = conn_of(c);
    http_log_error(conn ? conn->method : NULL, conn ? conn->url : NULL, status, msg);
    enum MHD_Result ok = send_body(s, c, status, "application/json", json, strlen(json), allow);
    mn_free(json);
    return ok;
}

static enum MHD_Result send_error(Server *s, struct MHD_Connection *c, int status, const char *msg,
                                  const char *param) {
    return send_error_full(s, c, status, msg, param, NULL, NULL);
}

/* ---- metrics --------------------------------------------------------------- */

/* `tier="NAME"` of a cache source. */
static const char *tier_label(CacheSource src) {
    static const char *const labels[SRC_COUNT] = {"tier=\"pool\"", "tier=\"ram\"", "tier=\"disk\"",
                                                  "tier=\"redis\""};
    return labels[src];
}

static int metrics_setup(Server *s) {
    static const double ttft_b[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double tpot_b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
    int rc = metrics_new(&s->metrics);
    if (rc) return rc;
    struct {
        const char *name, *help;
        MetricType type;
        const double *b;
        size_t nb;
        MetricFamily **out;
    } fams[] = {
        {"mnemo_build_info", "The version and commit of this build (always 1)", METRIC_GAUGE, NULL, 0,
         &s->f_build_info},
        {"mnemo_requests_total", "HTTP requests answered, by status", METRIC_COUNTER, NULL, 0, &s->f_requests},
        {"mnemo_prompt_tokens_total", "Prompt tokens of completed requests", METRIC_COUNTER, NULL, 0, &s->f_prompt},
        {"mnemo_generated_tokens_total", "Tokens generated", METRIC_COUNTER, NULL, 0, &s->f_generated},
        {"mnemo_cached_tokens_total", "Prompt tokens served from cache, by tier", METRIC_COUNTER, NULL, 0, &s->f_cached},
        {"mnemo_cached_partial_tokens_total",
         "Prompt tokens served from cache as rows of a pool block that matched in part (in mnemo_cached_tokens_total too)",
         METRIC_COUNTER, NULL, 0, &s->f_cached_partial},
        {"mnemo_recomputed_tokens_total", "Prompt tokens computed", METRIC_COUNTER, NULL, 0, &s->f_recomputed},
        {"mnemo_shifted_tokens_total", "Cached prompt tokens whose KV was moved to new positions (context overflow)",
         METRIC_COUNTER, NULL, 0, &s->f_shifted},
        {"mnemo_ttft_seconds", "Time to first token", METRIC_HISTOGRAM, ttft_b, sizeof ttft_b / sizeof *ttft_b, &s->f_ttft},
        {"mnemo_time_per_output_token_seconds", "Time per output token after the first", METRIC_HISTOGRAM, tpot_b,
         sizeof tpot_b / sizeof *tpot_b, &s->f_tpot},
        {"mnemo_pool_blocks", "KV pool blocks by state", METRIC_GAUGE, NULL, 0, &s->f_pool},
        {"mnemo_queue_depth", "Requests waiting for admission", METRIC_GAUGE, NULL, 0, &s->f_queue},
        {"mnemo_running_sequences", "Sequences being served", METRIC_GAUGE, NULL, 0, &s->f_running},
        {"mnemo_tier_bytes_read_total", "Bytes read from a cache tier", METRIC_COUNTER, NULL, 0, &s->f_tier_read},
        {"mnemo_tier_bytes_written_total", "Bytes written to a cache tier", METRIC_COUNTER, NULL, 0,
         &s->f_tier_written},
        {"mnemo_tier_read_seconds", "Time of one restore read from a cache tier (every layer of a load)",
         METRIC_HISTOGRAM, mover_io_bounds, MOVER_IO_BUCKETS, &s->f_tier_read_s},
        {"mnemo_tier_write_seconds", "Time of one run written to a cache tier", METRIC_HISTOGRAM, mover_io_bounds,
         MOVER_IO_BUCKETS, &s->f_tier_write_s},
        {"mnemo_tier_occupancy_bytes", "Bytes held by a cache tier", METRIC_GAUGE, NULL, 0, &s->f_tier_occupancy},
        {"mnemo_tier_stored_bytes",
         "Bytes of the layers a cache tier stores, by representation: K/V or hidden states (payload, without "
         "padding and headers)",
         METRIC_GAUGE, NULL, 0, &s->f_tier_stored},
        {"mnemo_tier_evictions_total", "Blocks evicted from a cache tier", METRIC_COUNTER, NULL, 0,
         &s->f_tier_evictions},
        {"mnemo_tier_checksum_failures_total", "Stored extents that failed their checksum (recomputed)",
         METRIC_COUNTER, NULL, 0, &s->f_tier_checksum},
        {"mnemo_tier_missing_runs_total", "Runs a shared tier no longer had when read (recomputed)",
         METRIC_COUNTER, NULL, 0, &s->f_tier_missing},
        {"mnemo_tier_io_errors_total", "Times a cache tier failed and went off (I/O error, a store not answering)",
         METRIC_COUNTER, NULL, 0, &s->f_tier_io_errors},
        {"mnemo_tier_reconnects_total", "Times a failed cache tier came back (reset after a back-off)",
         METRIC_COUNTER, NULL, 0, &s->f_tier_resets},
        {"mnemo_tier_up", "Whether a cache tier is in use (0: off after a failure)", METRIC_GAUGE, NULL, 0,
         &s->f_tier_up},
        {"mnemo_tier_read_rate_bytes",
         "The read rate (bytes/s) the restore planner takes for a cache tier: what its restores read so far, "
         "else what was measured at start, else a guess",
         METRIC_GAUGE, NULL, 0, &s->f_tier_read_rate},
        {"mnemo_shared_tier_lookups_total", "New requests' blocks looked up in the shared tier, by result",
         METRIC_COUNTER, NULL, 0, &s->f_shared_lookups},
        {"mnemo_dropped_blocks_total", "Cached blocks gone from every tier", METRIC_COUNTER, NULL, 0, &s->f_dropped},
        {"mnemo_prefetched_blocks_total", "Blocks of waiting requests brought into the pool or the RAM tier",
         METRIC_COUNTER, NULL, 0, &s->f_prefetched},
        {"mnemo_preemptions_total",
         "Prompts whose computation gave their slot to a request with far fewer tokens to compute (resumed later)",
         METRIC_COUNTER, NULL, 0, &s->f_preemptions},
        {"mnemo_preempted_recomputed_tokens_total",
         "Prompt tokens preempted prompts computed again when admitted again (evicted while they waited)",
         METRIC_COUNTER, NULL, 0, &s->f_preempt_recomputed},
        {"mnemo_restored_tokens_total",
         "Tokens of cached blocks brought back into the pool, by path: loaded as KV, projected from hidden "
         "states, recomputed (dropped leading blocks)",
         METRIC_COUNTER, NULL, 0, &s->f_restored},
    };
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++)
        if ((rc = metrics_register(s->metrics, fams[i].name, fams[i].help, fams[i].type, fams[i].b, fams[i].nb,
                                   fams[i].out)))
            return rc;
    char version[64], commit[96], build[sizeof version + sizeof commit];
    if ((rc = metrics_format_label(version, sizeof version, "version", MNEMO_VERSION)) ||
        (rc = metrics_format_label(commit, sizeof commit, "commit", mn_build_commit())))
        return rc;
    snprintf(build, sizeof build, "%s,%s", version, commit);
    if ((rc = metrics_gauge_set(s->f_build_info, build, 1))) return rc;
    for (int i = 0; i < SRC_COUNT; i++) metrics_counter_add(s->f_cached, tier_label(i), 0);
    metrics_counter_add(s->f_dropped, "", 0);
    metrics_counter_add(s->f_preemptions, "", 0);
    metrics_counter_add(s->f_preempt_recomputed, "", 0);
    metrics_counter_add(s->f_prefetched, "into=\"pool\"", 0);
    metrics_counter_add(s->f_prefetched, "into=\"ram\"", 0);
    metrics_counter_add(s->f_restored, "path=\"kv\"", 0);
    metrics_counter_add(s->f_restored, "path=\"hidden\"", 0);
    metrics_counter_add(s->f_restored, "path=\"recompute\"", 0);
    metrics_counter_add(s->f_prompt, "", 0);
    metrics_counter_add(s->f_generated, "", 0);
    metrics_counter_add(s->f_recomputed, "", 0);
    metrics_counter_add(s->f_shifted, "", 0);
    metrics_counter_add(s->f_cached_partial, "", 0);
    return MN_OK;
}

static void metrics_on_finish(Server *s, const ReqResult *res) {
    metrics_counter_add(s->f_prompt, "", res->n_prompt);
    metrics_counter_add(s->f_generated, "", res->n_generated);
    for (int i = 0; i < SRC_COUNT; i++) metrics_counter_add(s->f_cached, tier_label(i), res->n_cached_by[i]);
    metrics_counter_add(s->f_cached_partial, "", res->n_cached_partial);
    metrics_counter_add(s->f_recomputed, "", res->n_prompt - res->n_cached);
    metrics_counter_add(s->f_shifted, "", res->n_shifted);
    if (res->n_generated > 0) metrics_histogram_observe(s->f_ttft, "", res->ttft_s);
    if (res->n_generated > 1)
        metrics_histogram_observe(s->f_tpot, "", (res->total_s - res->ttft_s) / (res->n_generated - 1));
}

static enum MHD_Result handle_metrics(Server *s, struct MHD_Connection *c) {
    EngineStats st;
    engine_stats(s->e, &st);
    metrics_gauge_set(s->f_pool, "state=\"free\"", st.pool_free);
    metrics_gauge_set(s->f_pool, "state=\"used\"", st.pool_used);
    metrics_gauge_set(s->f_pool, "state=\"cached\"", st.pool_cached);
    metrics_gauge_set(s->f_queue, "", st.queue_depth);
    metrics_gauge_set(s->f_running, "", st.running);
    metrics_counter_set(s->f_dropped, "", (double)st.dropped_blocks);
    metrics_counter_set(s->f_preemptions, "", (double)st.preemptions);
    metrics_counter_set(s->f_preempt_recomputed, "", (double)st.preempt_recomputed_tokens);
    metrics_counter_set(s->f_prefetched, "into=\"pool\"", (double)st.prefetched_blocks);
    metrics_counter_set(s->f_prefetched, "into=\"ram\"", (double)st.promoted_blocks);
    metrics_counter_set(s->f_restored, "path=\"kv\"", (double)st.restored_kv_tokens);
    metrics_counter_set(s->f_restored, "path=\"hidden\"", (double)st.restored_hidden_tokens);
    metrics_counter_set(s->f_restored, "path=\"recompute\"", (double)st.restored_recompute_tokens);
    /* the pool as a tier: the bytes of its used and cached blocks */
    double block_bytes = st.pool_blocks > 0 ? (double)st.pool_bytes / st.pool_blocks : 0;
    metrics_gauge_set(s->f_tier_occupancy, "tier=\"pool\"", block_bytes * (st.pool_used + st.pool_cached));
    metrics_counter_set(s->f_tier_evictions, "tier=\"pool\"", (double)st.pool_evictions);
    for (int i = 0; i < st.n_tiers; i++) {
        const MoverTierStats *t = &st.tiers[i];
        char label[64];
        snprintf(label, sizeof label, "tier=\"%s\"", t->tier.name);
        metrics_counter_set(s->f_tier_read, label, (double)t->tier.bytes_read);
        metrics_counter_set(s->f_tier_written, label, (double)t->tier.bytes_written);
        metrics_histogram_set(s->f_tier_read_s, label, t->reads.counts, MOVER_IO_BUCKETS + 1, t->reads.sum);
        metrics_histogram_set(s->f_tier_write_s, label, t->writes.counts, MOVER_IO_BUCKETS + 1, t->writes.sum);
        metrics_gauge_set(s->f_tier_occupancy, label, (double)t->tier.occupancy_bytes);
        char repr[96];
        snprintf(repr, sizeof repr, "tier=\"%s\",repr=\"kv\"", t->tier.name);
        metrics_gauge_set(s->f_tier_stored, repr, (double)t->tier.kv_bytes);
        snprintf(repr, sizeof repr, "tier=\"%s\",repr=\"hidden\"", t->tier.name);
        metrics_gauge_set(s->f_tier_stored, repr, (double)t->tier.hidden_bytes);
        metrics_counter_set(s->f_tier_evictions, label, (double)t->tier.n_evicted_blocks);
        metrics_counter_set(s->f_tier_checksum, label, (double)t->tier.n_checksum_failures);
        metrics_counter_set(s->f_tier_missing, label, (double)t->tier.n_missing_runs);
        metrics_counter_set(s->f_tier_io_errors, label, (double)t->tier.n_io_errors);
        metrics_counter_set(s->f_tier_resets, label, (double)t->tier.n_resets);
        metrics_gauge_set(s->f_tier_up, label, t->tier.is_failed ? 0 : 1);
        metrics_gauge_set(s->f_tier_read_rate, label, st.tier_read_bps[i]);
        if (strcmp(t->tier.name, "redis") == 0) {
            metrics_counter_set(s->f_shared_lookups, "result=\"found\"", (double)st.shared_found_blocks);
            metrics_counter_set(s->f_shared_lookups, "result=\"not_found\"",
                                (double)(st.shared_lookup_blocks - st.shared_found_blocks));
        }
    }
    char *text; /* a scrape is not counted in mnemo_requests_total */
    size_t len;
    if (metrics_render(s->metrics, &text, &len)) return MHD_NO;
    enum MHD_Result ok = send_body(s, c, 200, "text/plain; version=0.0.4", text, len, NULL);
    mn_free(text);
    return ok;
}

/* ---- generation requests ------------------------------------------------------- */

typedef struct Gen {
    Server *s;
    Request *req;
    bool is_chat, is_stream, include_usage, is_logprobs;
    char id[64];
    int64_t created;
    double t0;
    int n_truncated;     /* prompt tokens dropped to fit the context */
    /* streaming state */
    char *out;           /* bytes formatted but not yet sent */
    size_t out_len, out_off;
    bool sent_role, is_finished, is_done_sent;
    ReqResult res;
    char *text;          /* whole answer (non-streaming) */
    size_t text_len;
    ReqLogprob *lp;      /* its logprobs (non-streaming, is_logprobs) */
    size_t n_lp;
    const char *path;
} Gen;

static void gen_free(Gen *g) {
    if (g == NULL) return;
    request_unref(g->req);
    mn_free(g->out);
    mn_free(g->text);
    mn_free(g->lp);
    mn_free(g);
}

static ApiFinish api_finish(FinishReason f) {
    return f == FINISH_LENGTH ? API_FINISH_LENGTH : API_FINISH_STOP;
}

static void fill_usage(const Gen *g, ApiUsage *u) {
    const ReqResult *res = &g->res;
    memset(u, 0, sizeof *u);
    u->truncated_tokens = g->n_truncated;
    u->shifted_tokens = res->n_shifted;
    u->prompt_tokens = res->n_prompt;
    u->completion_tokens = res->n_generated;
    u->cached_tokens = res->n_cached;
    u->recomputed_tokens = res->n_prompt - res->n_cached;
    for (int i = 0; i < SRC_COUNT; i++) api_usage_add_tier(u, engine_source_name(i), res->n_cached_by[i]);
    for (int i = 0; i < RESTORE_PATH_COUNT; i++) u->restored_by[i] = res->n_restored_by[i];
}

/* The log line of a finished generation, with the id its answer carries. */
static void log_request(const Gen *g, int status) {
    char detail[512];
    int n = snprintf(detail, sizeof detail, "prompt=%d truncated=%d shifted=%d cached=%d", g->res.n_prompt,
                     g->n_truncated, g->res.n_shifted, g->res.n_cached);
    for (int i = 0; i < SRC_COUNT && n > 0 && (size_t)n < sizeof detail; i++)
        n += snprintf(detail + n, sizeof detail - (size_t)n, " cached_%s=%d", engine_source_name(i), g->res.n_cached_by[i]);
    if (n > 0 && (size_t)n < sizeof detail)
        n += snprintf(detail + n, sizeof detail - (size_t)n, " cached_partial=%d", g->res.n_cached_partial);
    if (n > 0 && (size_t)n < sizeof detail)
        snprintf(detail + n, sizeof detail - (size_t)n,
                 " generated=%d ttft=%.3fs queue=%.3fs restore=%.3fs total=%.3fs preempted=%d%s", g->res.n_generated,
                 g->res.ttft_s, g->res.queue_s, g->res.restore_s, mn_now() - g->t0, g->res.n_preempted,
                 g->res.finish == FINISH_CANCELLED ? " cancelled" : "");
    http_log_answer("POST", g->path, status, g->id, g->is_stream, detail);
}

/* Append an SSE event with json as its data (takes json). */
static int sse_append(Gen *g, char *json) {
    if (json == NULL) return MN_ENOMEM;
    size_t n = strlen(json), need = g->out_len + n + 8;
    char *b = mn_realloc(g->out, need);
    if (b == NULL) {
        mn_free(json);
        return MN_ENOMEM;
    }
    g->out = b;
    memcpy(g->out + g->out_len, "data: ", 6);
    memcpy(g->out + g->out_len + 6, json, n);
    memcpy(g->out + g->out_len + 6 + n, "\n\n", 2);
    g->out_len += n + 8;
    mn_free(json);
    return MN_OK;
}

/* The meta of g's answer. */
static ApiMeta gen_meta(const Gen *g) {
    return (ApiMeta){g->id, g->s->opt.model_name, g->created, g->s->fingerprint};
}

/* A chunk of o's text and logprobs (the builders sanitize the text). */
static int sse_text(Gen *g, const ReqOutput *o) {
    ApiMeta meta = gen_meta(g);
    ApiLogprobs lp = {engine_model(g->s->e)->tok, o->logprobs, o->n_logprobs};
    const ApiLogprobs *lpp = o->n_logprobs > 0 ? &lp : NULL;
    char *json = g->is_chat ? api_chat_chunk_json(&meta, !g->sent_role, o->text, API_FINISH_NONE, lpp)
                            : api_text_chunk_json(&meta, o->text, API_FINISH_NONE, lpp);
    g->sent_role = true;
    return sse_append(g, json);
}

static int sse_finish(Gen *g) {
    ApiMeta meta = gen_meta(g);
    int rc = MN_OK;
    if (g->res.finish != FINISH_ERROR) {
        char *json = g->is_chat ? api_chat_chunk_json(&meta, !g->sent_role, "", api_finish(g->res.finish), NULL)
                                : api_text_chunk_json(&meta, "", api_finish(g->res.finish), NULL);
        rc = sse_append(g, json);
        if (rc == MN_OK && g->include_usage) {
            ApiUsage u;
            fill_usage(g, &u);
            rc = sse_append(g, api_usage_chunk_json(&meta, g->is_chat, &u));
        }
    } else {
        rc = sse_append(g, api_error_json(500, g->res.error, NULL, NULL));
    }
    if (rc == MN_OK) {
        static const char done[] = "data: [DONE]\n\n";
        char *b = mn_realloc(g->out, g->out_len + sizeof done);
        if (b == NULL) return MN_ENOMEM;
        g->out = b;
        memcpy(g->out + g->out_len, done, sizeof done - 1);
        g->out_len += sizeof done - 1;
    }
    return rc;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    Gen *g = cls;
    (void)pos;
    while (g->out_off == g->out_len) {
        g->out_len = g->out_off = 0;
        if (g->is_done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        ReqOutput o;
        if (request_read(g->req, &o, 1000) != MN_OK) return MHD_CONTENT_READER_END_WITH_ERROR;
        int rc = o.len > 0 || o.n_logprobs > 0 ? sse_text(g, &o) : MN_OK;
        bool done = o.is_done;
        if (done) g->res = o.res;
        request_output_deinit(&o);
        if (rc == MN_OK && done) {
            g->is_finished = true;
            rc = sse_finish(g);
            g->is_done_sent = true;
            metrics_on_finish(g->s, &g->res);
            log_request(g, 200);
        }
        if (rc != MN_OK) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->out_len == 0) break; /* nothing yet: api_sse_emit pings */
    }
    return (ssize_t)api_sse_emit(g->out, g->out_len, &g->out_off, buf, max);
}

static void stream_free(void *cls) {
    Gen *g = cls;
    if (!g->is_finished) {
        engine_cancel(g->s->e, g->req);
        http_log_answer("POST", g->path, 200, g->id, true, "cancelled: the client went away");
    }
    gen_free(g);
}

/* Run a prepared generation: answer whole or start the stream. */
static enum MHD_Result run_generation(Server *s, struct MHD_Connection *c, Gen *g) {
    if (g->is_stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, g, stream_free);
        if (r == NULL) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        count_request(s, 200);
        return queue_answer(s, c, 200, r, NULL);
    }
    for (;;) {
        ReqOutput o;
        if (request_read(g->req, &o, 1000) != MN_OK) {
            gen_free(g);
            return send_error(s, c, 500, "out of memory", NULL);
        }
        if (!o.is_done && http_peer_gone(c)) { /* as a stream's client that goes away */
            request_output_deinit(&o);
            engine_cancel(s->e, g->req);
            count_request(s, 499);
            http_log_answer("POST", g->path, 499, g->id, false, "cancelled: the client went away");
            gen_free(g);
            return MHD_NO; /* the library logs "Application reported internal error" and closes */
        }
        char *b = mn_realloc(g->text, g->text_len + o.len + 1);
        if (b) g->text = b;
        ReqLogprob *lp = NULL;
        if (o.n_logprobs && (lp = mn_realloc(g->lp, (g->n_lp + o.n_logprobs) * sizeof *lp)) != NULL) g->lp = lp;
        if (b == NULL || (o.n_logprobs && lp == NULL)) {
            request_output_deinit(&o);
            engine_cancel(s->e, g->req);
            gen_free(g);
            return send_error(s, c, 500, "out of memory", NULL);
        }
        memcpy(g->text + g->text_len, o.text, o.len);
        g->text_len += o.len;
        g->text[g->text_len] = '\0';
        if (o.n_logprobs) memcpy(g->lp + g->n_lp, o.logprobs, o.n_logprobs * sizeof *lp);
        g->n_lp += o.n_logprobs;
        bool done = o.is_done;
        if (done) g->res = o.res;
        request_output_deinit(&o);
        if (done) break;
    }
    metrics_on_finish(s, &g->res);
    if (g->res.finish == FINISH_ERROR) { /* send_error logs it */
        enum MHD_Result ok = send_error(s, c, 500, g->res.error, NULL);
        gen_free(g);
        return ok;
    }
    ApiUsage u;
    fill_usage(g, &u);
    ApiMeta meta = gen_meta(g);
    ApiLogprobs lp = {engine_model(s->e)->tok, g->lp, g->n_lp};
    const ApiLogprobs *lpp = g->is_logprobs ? &lp : NULL;
    char *json = g->is_chat ? api_chat_completion_json(&meta, g->text, api_finish(g->res.finish), &u, lpp)
                            : api_text_completion_json(&meta, g->text, api_finish(g->res.finish), &u, lpp);
    log_request(g, 200);
    gen_free(g);
    return send_json(s, c, 200, json);
}

/* Namespace of a request: its API key, or the trusted front end's header. */
static const char *request_namespace(Server *s, struct MHD_Connection *c, const char *key) {
    if (s->opt.n_api_keys > 0) return key;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Cache-Namespace");
    return h ? h : "";
}

/* The conversation of a chat or apply-template request: views into ar. */
static ChatInput chat_input(const ApiRequest *ar) {
    return (ChatInput){ar->messages, ar->tools, ar->template_vars, ar->add_generation_prompt};
}

/* The prompt as the engine takes it: views into ar (and *chat, which the
 * caller keeps as long as the result). */
static PromptInput prompt_input(const ApiRequest *ar, const ChatInput *chat) {
    PromptInput in = {.form = ar->route == API_ROUTE_CHAT ? PROMPT_CHAT : ar->text ? PROMPT_TEXT : PROMPT_IDS};
    in.chat = chat;
    in.text = ar->text;
    in.text_len = ar->text_len;
    in.ids = ar->tokens;
    in.n_ids = ar->n_tokens;
    return in;
}

/* The generation parameters of ar; what the client left unset stays for
 * the engine to fill in (max_tokens 0, is_seed_random). */
static ReqParams req_params(const ApiRequest *ar) {
    ReqParams p;
    memset(&p, 0, sizeof p);
    p.sp = ar->sampler;
    p.is_seed_random = !(ar->fields_set & API_SET_SEED);
    /* more than INT32_MAX is as far out of range as INT32_MAX: engine_submit
     * refuses it with the allowed range */
    p.max_tokens = ar->max_tokens > INT32_MAX ? INT32_MAX : ar->max_tokens > 0 ? (int)ar->max_tokens : 0;
    p.ignore_eos = ar->ignore_eos;
    p.is_logprobs = ar->is_logprobs;
    p.n_top_logprobs = ar->top_logprobs;
    for (size_t i = 0; i < ar->n_stop && i < ENGINE_MAX_STOP; i++) p.stop[p.n_stop++] = ar->stop[i];
    return p;
}

/* OpenAI's "param" for a field the engine refused (NULL: none). */
static const char *field_param(ApiRoute route, ReqField f) {
    switch (f) {
    case REQ_FIELD_PROMPT: return route == API_ROUTE_CHAT ? "messages" : "prompt";
    case REQ_FIELD_MAX_TOKENS: return "max_tokens";
    case REQ_FIELD_LOGIT_BIAS: return "logit_bias";
    default: return NULL;
    }
}

static enum MHD_Result handle_generation(Server *s, struct MHD_Connection *c, ApiRoute route, const char *path,
                                         Conn *conn, const char *key) {
    ApiRequest ar;
    MnErr err = {0};
    char param[API_PARAM_MAX];
    if (api_parse_request(route, conn->body.data ? conn->body.data : "", conn->body.len, &ar, &err, param) != MN_OK)
        return send_error(s, c, 400, err.msg, param[0] ? param : NULL);
    Gen *g = mn_calloc(1, sizeof *g);
    if (g == NULL) {
        api_request_deinit(&ar);
        return send_error(s, c, 500, "out of memory", NULL);
    }
    g->s = s;
    g->path = path;
    g->is_chat = route == API_ROUTE_CHAT;
    g->is_stream = ar.is_stream;
    g->include_usage = ar.include_usage;
    g->is_logprobs = ar.is_logprobs;
    g->created = (int64_t)time(NULL);
    g->t0 = mn_now();
    snprintf(g->id, sizeof g->id, "%s-%s-%llu", g->is_chat ? "chatcmpl" : "cmpl", s->id_prefix,
             (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    ChatInput chat = chat_input(&ar);
    PromptInput in = prompt_input(&ar, &chat);
    ReqParams p = req_params(&ar);
    const char *session = ar.session_id ? ar.session_id : MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Session-Id");
    ReqField field;
    int rc = prompt_submit(s->e, &in, &p, request_namespace(s, c, key), session, &g->req, &g->n_truncated, &err,
                           &field);
    api_request_deinit(&ar);
    if (rc != MN_OK) {
        gen_free(g);
        return send_error(s, c, api_http_status(rc), err.msg, field_param(route, field));
    }
    return run_generation(s, c, g);
}

/* POST /apply-template: the text a chat request with this body is made of. */
static enum MHD_Result handle_apply_template(Server *s, struct MHD_Connection *c, Conn *conn) {
    ApiRequest ar;
    MnErr err = {0};
    char param[API_PARAM_MAX];
    if (api_parse_request(API_ROUTE_APPLY_TEMPLATE, conn->body.data ? conn->body.data : "", conn->body.len, &ar, &err, param) != MN_OK)
        return send_error(s, c, 400, err.msg, param[0] ? param : NULL);
    ChatInput chat = chat_input(&ar);
    char *text = NULL;
    size_t len = 0;
    int rc = prompt_render(s->e, &chat, &text, &len, &err);
    api_request_deinit(&ar);
    enum MHD_Result ok = rc == MN_OK ? send_json(s, c, 200, api_apply_template_json(text, len))
                                     : send_error(s, c, api_http_status(rc), err.msg, "messages");
    mn_free(text);
    return ok;
}

static enum MHD_Result handle_tokenize(Server *s, struct MHD_Connection *c, ApiRoute route, Conn *conn) {
    ApiRequest ar;
    MnErr err = {0};
    bool is_detok = route == API_ROUTE_DETOKENIZE;
    char param[API_PARAM_MAX];
    if (api_parse_request(route, conn->body.data ? conn->body.data : "", conn->body.len, &ar, &err, param) != MN_OK)
        return send_error(s, c, 400, err.msg, param[0] ? param : NULL);
    const Tokenizer *tok = engine_model(s->e)->tok;
    enum MHD_Result ok;
    if (!is_detok) {
        TokIds ids = {0};
        if (tok_encode(tok, ar.text, ar.text_len, ar.add_special && tok_add_bos(tok), ar.parse_special, &ids))
            ok = send_error(s, c, 500, "cannot tokenize", NULL);
        else
            ok = send_json(s, c, 200, api_tokenize_json(ids.ids, ids.n));
        tok_ids_free(&ids);
    } else {
        for (size_t i = 0; i < ar.n_tokens; i++)
            if (ar.tokens[i] >= tok_n_vocab(tok)) {
                char msg[96];
                snprintf(msg, sizeof msg, "tokens[%zu]: id %d is out of range", i, ar.tokens[i]);
                api_request_deinit(&ar);
                return send_error(s, c, 400, msg, "tokens");
            }
        char *text = NULL;
        size_t len = 0;
        if (tok_decode(tok, ar.tokens, ar.n_tokens, false, &text, &len)) ok = send_error(s, c, 500, "out of memory", NULL);
        else ok = send_json(s, c, 200, api_detokenize_json(text, len));
        mn_free(text);
    }
    api_request_deinit(&ar);
    return ok;
}

/* ---- dispatch ------------------------------------------------------------------ */

/* The API's routes by path (/v1/models is GET, the others POST). */
typedef struct ApiPath {
    const char *path;
    ApiRoute route;
} ApiPath;

static const ApiPath api_paths[] = {
    {"/v1/models", API_ROUTE_MODELS},
    {"/v1/chat/completions", API_ROUTE_CHAT},
    {"/v1/completions", API_ROUTE_COMPLETION},
    {"/tokenize", API_ROUTE_TOKENIZE},
    {"/detokenize", API_ROUTE_DETOKENIZE},
    {"/apply-template", API_ROUTE_APPLY_TEMPLATE},
};

/* The API key of the request when keys are set: NULL if missing or wrong.
 * The scheme is case-insensitive (RFC 9110 §11.1), one or more spaces
 * follow it. */
static const char *check_key(Server *s, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ') h++;
    for (int i = 0; i < s->opt.n_api_keys; i++)
        if (strcmp(h, s->opt.api_keys[i]) == 0) return s->opt.api_keys[i];
    return NULL;
}

/* The first call of a request, with its head: reset the connection's
 * request state and check the framing. Framings a proxy in front could
 * read otherwise than libmicrohttpd does (RFC 9112 §6.1, §6.3: Content-
 * Lengths that differ, a length by both Content-Length and Transfer-
 * Encoding, a coding other than chunked) would let a second request hide
 * in the body (request smuggling): 400. A declared length over --max-body
 * is answered 413 before the body is read. An answer queued now closes the
 * connection once sent: libmicrohttpd reads no body after it. */
static enum MHD_Result begin_request(Server *s, struct MHD_Connection *c, const char *url, const char *method,
                                     void **con_cls) {
    Conn *conn = conn_of(c);
    if (conn == NULL) return MHD_NO;
    conn->method = method;
    conn->url = url;
    conn->body.len = 0;
    *con_cls = conn;
    char msg[96];
    int status = http_check_framing(c, s->opt.max_body, msg, sizeof msg);
    return status ? send_error(s, c, status, msg, NULL) : MHD_YES;
}

/* A body that passes --max-body while it arrives: only a chunked one can
 * (a declared length was judged by begin_request); answered 413 on the
 * socket, with the CORS headers the answer would have had. */
static enum MHD_Result refuse_body(Server *s, struct MHD_Connection *c, const Conn *conn) {
    char msg[96], cors[512] = "";
    http_body_limit_msg(s->opt.max_body, msg, sizeof msg);
    const char *origin = cors_origin(s, c);
    if (origin) snprintf(cors, sizeof cors, "Vary: Origin\r\nAccess-Control-Allow-Origin: %.400s\r\n", origin);
    else if (s->opt.n_cors_origins > 0) strcpy(cors, "Vary: Origin\r\n");
    count_request(s, 413);
    http_log_error(conn->method, conn->url, 413, msg);
    return http_refuse_body(c, msg, cors);
}

/* OPTIONS on a route: its methods, and for a listed Origin the CORS
 * preflight answer. No key is asked: browsers send preflights without. */
static enum MHD_Result answer_options(Server *s, struct MHD_Connection *c, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (r == NULL) return MHD_NO;
    if (cors_origin(s, c)) {
        /* the headers the page asks for are allowed too (the openai
         * client sends its own X-Stainless-* ones) */
        const char *asked = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        char headers[1024];
        snprintf(headers, sizeof headers, "%s%s%.900s", CORS_ALLOW_HEADERS, asked && *asked ? ", " : "",
                 asked ? asked : "");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", allow);
        MHD_add_response_header(r, "Access-Control-Allow-Headers", headers);
        MHD_add_response_header(r, "Access-Control-Max-Age", CORS_MAX_AGE);
    }
    count_request(s, 204);
    return queue_answer(s, c, 204, r, allow);
}

static enum MHD_Result send_method_error(Server *s, struct MHD_Connection *c, const char *url, const char *method,
                                         const char *allow) {
    char msg[128];
    snprintf(msg, sizeof msg, "%.64s does not accept %.16s (only %s)", url, method, allow);
    return send_error_full(s, c, 405, msg, NULL, NULL, allow);
}

/* GET /v1/models/{id}: the served model, or 404 in OpenAI's shape. */
static enum MHD_Result handle_model(Server *s, struct MHD_Connection *c, const char *method, const char *url) {
    static const char allow[] = "GET, OPTIONS";
    if (strcmp(method, "OPTIONS") == 0) return answer_options(s, c, allow);
    if (strcmp(method, "GET") != 0) return send_method_error(s, c, "/v1/models/{id}", method, allow);
    if (s->opt.n_api_keys > 0 && check_key(s, c) == NULL)
        return send_error(s, c, 401, "a valid API key is required (Authorization: Bearer KEY)", NULL);
    const char *id = url + strlen("/v1/models/");
    if (strcmp(id, s->opt.model_name) == 0) return send_json(s, c, 200, api_model_json(id, s->created));
    char msg[160];
    snprintf(msg, sizeof msg, "The model '%.100s' does not exist", id);
    return send_error_full(s, c, 404, msg, "model", "model_not_found", NULL);
}

/* The Responses API (server/responses): the HTTP side. */
static ssize_t resp_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = resp_stream_read(cls, buf, max);
    if (n == RESP_STREAM_END) return MHD_CONTENT_READER_END_OF_STREAM;
    return n == RESP_STREAM_ERROR ? MHD_CONTENT_READER_END_WITH_ERROR : n;
}

static void resp_free(void *cls) { resp_stream_free(cls); }

static void resp_on_finish(void *ctx, const ReqResult *res) { metrics_on_finish(ctx, res); }

/* Whether the list allow ("GET, DELETE, OPTIONS") names method. */
static bool allows(const char *allow, const char *method) {
    size_t n = strlen(method);
    for (const char *p = allow; *p; p += strspn(p, ", ")) {
        size_t len = strcspn(p, ", ");
        if (len == n && strncmp(p, method, n) == 0) return true;
        p += len;
    }
    return false;
}

static bool peer_gone(void *c) { return http_peer_gone(c); }

/* /v1/responses and below: methods and key here, the rest in server/responses. */
static enum MHD_Result handle_responses(Server *s, struct MHD_Connection *c, const char *method, const char *url,
                                        Conn *conn) {
    const char *sub = url + strlen("/v1/responses"), *allow = resp_route_methods(sub);
    if (strcmp(method, "OPTIONS") == 0) return answer_options(s, c, allow);
    if (!allows(allow, method)) return send_method_error(s, c, url, method, allow);
    const char *key = NULL;
    if (s->opt.n_api_keys > 0 && (key = check_key(s, c)) == NULL)
        return send_error(s, c, 401, "a valid API key is required (Authorization: Bearer KEY)", NULL);
    RespCall call = {.method = method,
                     .sub = sub,
                     .body = conn->body.data,
                     .body_len = conn->body.len,
                     .ns = request_namespace(s, c, key),
                     .limit = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit"),
                     .order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order"),
                     .after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after")};
    call.is_gone_fn = peer_gone;
    call.gone_ctx = c;
    RespAnswer a;
    resp_handle(s->resp, &call, &a);
    if (a.status == RESP_STATUS_GONE) {
        count_request(s, 499);
        return MHD_NO; /* as run_generation's */
    }
    if (a.stream != NULL) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, resp_read, a.stream, resp_free);
        if (r == NULL) {
            resp_stream_free(a.stream);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        count_request(s, 200);
        http_log_answer(method, url, 200, a.id, true, "");
        return queue_answer(s, c, 200, r, NULL);
    }
    if (a.json == NULL) return send_error_full(s, c, a.status, a.error_msg, a.param[0] ? a.param : NULL, a.code, NULL);
    if (strcmp(method, "POST") != 0) http_log_answer(method, url, a.status, a.id, false, "");
    return send_json(s, c, a.status, a.json);
}

static enum MHD_Result handle_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                      const char *version, const char *upload_data, size_t *upload_data_size,
                                      void **con_cls) {
    Server *s = cls;
    if (*con_cls == NULL) return begin_request(s, c, url, method, con_cls);
    Conn *conn = *con_cls;
    if (*upload_data_size > 0) { /* a piece of the body */
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        int rc = http_body_add(&conn->body, upload_data, n, s->opt.max_body);
        if (rc == MN_EFULL) return refuse_body(s, c, conn);
        return rc == MN_OK ? MHD_YES : MHD_NO;
    }
    bool is_get = strcmp(method, "GET") == 0, is_post = strcmp(method, "POST") == 0,
         is_options = strcmp(method, "OPTIONS") == 0;
    /* /health and /metrics: never a key, not counted in mnemo_requests_total */
    if (strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0) {
        if (is_options) return answer_options(s, c, "GET, OPTIONS");
        if (!is_get) return send_method_error(s, c, url, method, "GET, OPTIONS");
        if (strcmp(url, "/metrics") == 0) return handle_metrics(s, c);
        static const char ok[] = "{\"status\":\"ok\"}";
        return send_body(s, c, 200, "application/json", ok, sizeof ok - 1, NULL);
    }
    if (strncmp(url, "/v1/models/", strlen("/v1/models/")) == 0) return handle_model(s, c, method, url);
    if (strncmp(url, "/v1/responses", strlen("/v1/responses")) == 0 && resp_route_methods(url + strlen("/v1/responses")))
        return handle_responses(s, c, method, url, conn);
    const ApiPath *ap = NULL;
    for (size_t i = 0; i < sizeof api_paths / sizeof *api_paths; i++)
        if (strcmp(url, api_paths[i].path) == 0) ap = &api_paths[i];
    if (ap == NULL) {
        char msg[128];
        snprintf(msg, sizeof msg, "no route %.16s %.64s", method, url);
        return send_error(s, c, 404, msg, NULL);
    }
    bool is_get_route = ap->route == API_ROUTE_MODELS;
    const char *allow = is_get_route ? "GET, OPTIONS" : "POST, OPTIONS";
    if (is_options) return answer_options(s, c, allow);
    if (is_get_route ? !is_get : !is_post) return send_method_error(s, c, url, method, allow);
    const char *key = NULL;
    if (s->opt.n_api_keys > 0 && (key = check_key(s, c)) == NULL)
        return send_error(s, c, 401, "a valid API key is required (Authorization: Bearer KEY)", NULL);
    switch (ap->route) {
    case API_ROUTE_MODELS: {
        const char *names[] = {s->opt.model_name};
        return send_json(s, c, 200, api_models_json(names, 1, s->created));
    }
    case API_ROUTE_CHAT:
    case API_ROUTE_COMPLETION: return handle_generation(s, c, ap->route, ap->path, conn, key);
    case API_ROUTE_TOKENIZE:
    case API_ROUTE_DETOKENIZE: return handle_tokenize(s, c, ap->route, conn);
    case API_ROUTE_RESPONSES: break; /* by path, above */
    case API_ROUTE_APPLY_TEMPLATE: return handle_apply_template(s, c, conn);
    }
    return MHD_NO; /* every route is handled above */
}

/* A request ended: drop its body (a connection kept alive holds none). */
static void request_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    Conn *conn = *con_cls;
    if (conn == NULL) return;
    http_body_free(&conn->body);
    conn->method = conn->url = NULL;
    *con_cls = NULL;
}

/* A connection's Conn lives as long as the connection. */
static void conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode toe) {
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = mn_calloc(1, sizeof(Conn)); /* NULL: begin_request drops the connection */
    } else {
        Conn *conn = *socket_context;
        if (conn) http_body_free(&conn->body);
        mn_free(conn);
        *socket_context = NULL;
    }
}

/* ---- life cycle ---------------------------------------------------------------- */

static void on_rejected(void *ctx, const char *method, const char *path, int status, const char *msg) {
    Server *s = ctx;
    count_request(s, status);
    http_log_error(method, path, status, msg);
}

/* "fp_" + 16 hex digits of the model's fingerprint and this binary's hash. */
static void server_fingerprint(Server *s) {
    Hash128 exe;
    if (hash128_file("/proc/self/exe", &exe) != MN_OK) LOG_WARN("cannot read /proc/self/exe: system_fingerprint covers the model only");
    Hasher h;
    hasher_init(&h);
    hasher_update(&h, s->m->fingerprint.b, sizeof s->m->fingerprint.b);
    hasher_update(&h, exe.b, sizeof exe.b);
    Hash128 fp = hasher_final(&h);
    char hex[33];
    hash128_hex(&fp, hex);
    snprintf(s->fingerprint, sizeof s->fingerprint, "fp_%.16s", hex);
}

int server_new(Engine *e, const ServerOptions *o, Server **out, MnErr *err) {
    *out = NULL;
    Server *s = mn_calloc(1, sizeof *s);
    if (s == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    s->e = e;
    s->m = engine_model(e);
    s->opt = *o;
    atomic_init(&s->next_id, 1);
    s->created = (int64_t)time(NULL);
    uint64_t nonce;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) /* no entropy yet: still differs by run */
        nonce = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() ^ (uint64_t)(mn_now() * 1e9);
    snprintf(s->id_prefix, sizeof s->id_prefix, "%016llx", (unsigned long long)nonce);
    server_fingerprint(s);
    if (metrics_setup(s) != MN_OK) {
        server_free(s);
        return mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    RespConfig rc_resp = {.e = e,
                          .store = engine_store(e),
                          .model_name = o->model_name,
                          .ttl_s = o->response_ttl_s,
                          .wall_now_fn = o->test_wall_now_fn,
                          .clock_ctx = o->test_clock_ctx,
                          .on_finish_fn = resp_on_finish,
                          .finish_ctx = s};
    if (resp_service_new(&rc_resp, &s->resp, err) != MN_OK) {
        server_free(s);
        return MN_ENOMEM;
    }
    HttpFrontConfig fc = {.host = o->host,
                          .port = o->port,
                          .limits = o->limits,
                          .handler_fn = handle_request,
                          .completed_fn = request_completed,
                          .connection_fn = conn_notify,
                          .rejected_fn = on_rejected,
                          .ctx = s};
    int rc = http_front_new(&fc, &s->front, err);
    if (rc != MN_OK) {
        server_free(s);
        return rc;
    }
    *out = s;
    return MN_OK;
}

int server_port(const Server *s) { return http_front_port(s->front); }

void server_quiesce(Server *s) { http_front_quiesce(s->front); }

void server_free(Server *s) {
    if (s == NULL) return;
    http_front_free(s->front);
    resp_service_free(s->resp); /* after the front: no call is running */
    metrics_free(s->metrics);
    mn_free(s);
}
