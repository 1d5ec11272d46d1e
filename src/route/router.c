/* router.c — the router's HTTP side (see router.h).
 *
 * A request's life, on its connection's thread:
 *
 *   on_uri        a RouteReq with the raw request target (forwarded as
 *                 the client wrote it, query included)
 *   handle        1st call: the framing and declared size (server/http);
 *                 then body pieces up to --max-body (past it: 413 on the
 *                 socket); then the answer:
 *   route         the key (route/convkey), the plan (route/ring, and for a
 *                 stored response route/idmap first), then each backend of
 *                 the plan in turn until one gives an answer to pass on:
 *                   no head (refused, reset,   report it down, next
 *                   silent --upstream-timeout)
 *                   5xx                        keep the body, report it down, next
 *                   stored response not found  keep the body, next
 *                   anything else              pass it on: stream it
 *                 and when none answered: 503, or 504 when the last one
 *                 tried stayed silent
 *   proxy_read    the body, piece by piece, as the backend sends it (a
 *                 backend silent --upstream-timeout mid-body cuts it)
 *   proxy_free    the end (or the client went away): remember a new
 *                 response's id, release the backend, log the line
 *
 * An Upstream (route/upstream) carries one exchange at a time; idle ones
 * wait in a small stack so their connections to the backends are reused.
 * A proxied answer owns its Upstream until proxy_free gives it back.
 *
 * The id of a new response (POST /v1/responses answered 200) is the first
 * "id" member of the answer: the response object's own, which comes first
 * in mnemo's and OpenAI's answers, whole or streamed (the first event,
 * response.created, carries the response). The first ROUTER_ID_SCAN bytes
 * are looked at, and the id is remembered as soon as it is seen, before
 * the bytes that carry it go to the client: a client that continues the
 * chain at once finds it remembered. (A response that then fails is
 * remembered too; asking its backend first costs nothing.)
 */
#include "route/router.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/version.h"
#include "route/backends.h"
#include "route/convkey.h"
#include "route/idmap.h"
#include "route/ring.h"
#include "route/upstream.h"
#include "server/api_base.h"
#include "server/http.h"
#include "server/metrics.h"

/* Idle Upstream handles kept for reuse; more are freed. */
#define ROUTER_IDLE_MAX 64
/* The largest error body kept while the next backend is tried. */
#define ROUTER_KEPT_MAX (64 * 1024)
/* How far into a new response's answer its id is looked for. */
#define ROUTER_ID_SCAN 8192
/* The piece libmicrohttpd asks a stream for. */
#define ROUTER_BLOCK 16384
/* Request header lines forwarded at most. */
#define ROUTER_MAX_FWD 16

/* The request headers a server reads, forwarded as they came. */
static const char *const FWD_REQUEST[] = {
    "Authorization", "Content-Type", "Accept", "X-Session-Id", "X-Cache-Namespace", "Origin",
    "Access-Control-Request-Method", "Access-Control-Request-Headers",
};
/* The answer's headers passed back (the framing is the router's own). */
static const char *const FWD_ANSWER[] = {
    "Content-Type", "Cache-Control", "Retry-After", "WWW-Authenticate", "Allow", "Vary",
    "Access-Control-Allow-Origin", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers",
    "Access-Control-Max-Age",
};

struct Router {
    RouterOptions opt;
    HttpFront *front;
    Backends *backends;
    Ring *ring;
    IdMap *ids;
    Metrics *metrics;
    MetricFamily *f_build_info, *f_requests, *f_forwarded, *f_failovers, *f_load_skips, *f_unavailable, *f_up,
        *f_in_flight, *f_downs, *f_ids;
    atomic_uint_fast64_t rr_next; /* round-robin's next backend */
    atomic_bool stop;             /* router_free: exchanges give up */
    pthread_mutex_t idle_lock;
    Upstream *idle[ROUTER_IDLE_MAX];
    int n_idle;
    pthread_mutex_t drain_lock;   /* n_active and its condition */
    pthread_cond_t drain_cv;
    int n_active;
};

/* One request (libmicrohttpd's *con_cls from on_uri to on_completed). */
typedef struct RouteReq {
    Router *r;
    char *target;          /* the request target as sent */
    HttpBody body;
    bool is_begun;
    const char *method, *path; /* libmicrohttpd's, valid until the request completes */
} RouteReq;

/* An answer being passed on (the stream's callback context). */
typedef struct Proxy {
    Router *r;
    Upstream *up;
    int backend;
    int status;
    int n_tried;
    int64_t length, n_sent; /* the body's declared length (-1: none) and the bytes passed on */
    bool is_stream, is_remember, is_ended, is_broken;
    char method[16];
    char *target;
    char scan[ROUTER_ID_SCAN + 1]; /* the answer's first bytes, while the id is looked for */
    size_t n_scan;
    char id[CONVKEY_ID_MAX];       /* found in scan, "" until then */
} Proxy;

/* ---- upstreams and the drain count ------------------------------------------------------- */

static Upstream *take_upstream(Router *r) {
    Upstream *u = NULL;
    pthread_mutex_lock(&r->idle_lock);
    if (r->n_idle > 0) u = r->idle[--r->n_idle];
    pthread_mutex_unlock(&r->idle_lock);
    if (u == NULL && upstream_new(&u) != MN_OK) return NULL;
    return u;
}

static void give_upstream(Router *r, Upstream *u) {
    if (u == NULL) return;
    upstream_end(u);
    pthread_mutex_lock(&r->idle_lock);
    if (r->n_idle < ROUTER_IDLE_MAX) {
        r->idle[r->n_idle++] = u;
        u = NULL;
    }
    pthread_mutex_unlock(&r->idle_lock);
    upstream_free(u);
}

static void active_add(Router *r, int d) {
    pthread_mutex_lock(&r->drain_lock);
    r->n_active += d;
    if (r->n_active == 0) pthread_cond_broadcast(&r->drain_cv);
    pthread_mutex_unlock(&r->drain_lock);
}

/* ---- metrics ---------------------------------------------------------------------------- */

static void count_answer(Router *r, int status) {
    char code[16], lbl[64];
    snprintf(code, sizeof code, "%d", status);
    metrics_format_label(lbl, sizeof lbl, "status", code);
    metrics_counter_add(r->f_requests, lbl, 1);
}

/* `backend="URL"` of backend i. */
static void backend_label(const Router *r, int i, char *lbl, size_t cap) {
    metrics_format_label(lbl, cap, "backend", backends_url(r->backends, i));
}

static void count_backend(Router *r, MetricFamily *f, int i) {
    char lbl[512];
    backend_label(r, i, lbl, sizeof lbl);
    metrics_counter_add(f, lbl, 1);
}

static int metrics_setup(Router *r) {
    int rc = metrics_new(&r->metrics);
    struct {
        const char *name, *help;
        MetricType type;
        MetricFamily **out;
    } fams[] = {
        {"mnemo_build_info", "The version and commit of this build (always 1)", METRIC_GAUGE, &r->f_build_info},
        {"mnemo_route_requests_total", "Requests answered by the router, by status", METRIC_COUNTER, &r->f_requests},
        {"mnemo_route_forwarded_total", "Requests sent to a backend (each attempt)", METRIC_COUNTER, &r->f_forwarded},
        {"mnemo_route_failovers_total", "Attempts a backend failed (no answer, or 5xx) and the next one got",
         METRIC_COUNTER, &r->f_failovers},
        {"mnemo_route_load_skips_total", "Requests whose ring choice was passed over for its load", METRIC_COUNTER,
         &r->f_load_skips},
        {"mnemo_route_unavailable_total", "Requests no backend answered (503)", METRIC_COUNTER, &r->f_unavailable},
        {"mnemo_route_backend_up", "Whether a backend takes requests (1) or is down and probed (0)", METRIC_GAUGE,
         &r->f_up},
        {"mnemo_route_backend_in_flight", "Requests in progress on a backend", METRIC_GAUGE, &r->f_in_flight},
        {"mnemo_route_backend_downs_total", "Times a backend was marked down", METRIC_COUNTER, &r->f_downs},
        {"mnemo_route_response_ids", "Response ids remembered (which backend made them)", METRIC_GAUGE, &r->f_ids},
    };
    for (size_t i = 0; rc == MN_OK && i < sizeof fams / sizeof fams[0]; i++)
        rc = metrics_register(r->metrics, fams[i].name, fams[i].help, fams[i].type, NULL, 0, fams[i].out);
    char version[64], commit[96], build[sizeof version + sizeof commit];
    if (rc == MN_OK && (rc = metrics_format_label(version, sizeof version, "version", MNEMO_VERSION)) == MN_OK &&
        (rc = metrics_format_label(commit, sizeof commit, "commit", mn_build_commit())) == MN_OK) {
        snprintf(build, sizeof build, "%s,%s", version, commit);
        rc = metrics_gauge_set(r->f_build_info, build, 1);
    }
    for (int i = 0; rc == MN_OK && i < backends_count(r->backends); i++) {
        char lbl[512];
        backend_label(r, i, lbl, sizeof lbl);
        metrics_counter_add(r->f_forwarded, lbl, 0);
        metrics_counter_add(r->f_failovers, lbl, 0);
    }
    if (rc == MN_OK) metrics_counter_add(r->f_load_skips, "", 0);
    if (rc == MN_OK) metrics_counter_add(r->f_unavailable, "", 0);
    return rc;
}

/* The gauges and mirrored counters, read at scrape time. */
static void metrics_refresh(Router *r) {
    for (int i = 0; i < backends_count(r->backends); i++) {
        char lbl[512];
        backend_label(r, i, lbl, sizeof lbl);
        metrics_gauge_set(r->f_up, lbl, backends_is_up(r->backends, i) ? 1 : 0);
        metrics_gauge_set(r->f_in_flight, lbl, backends_load(r->backends, i));
        metrics_counter_set(r->f_downs, lbl, (double)backends_n_downs(r->backends, i));
    }
    metrics_gauge_set(r->f_ids, "", (double)idmap_count(r->ids));
}

/* ---- answers of the router's own --------------------------------------------------------- */

static enum MHD_Result send_body(Router *r, struct MHD_Connection *c, int status, const char *type, const char *body,
                                 size_t len, const char *allow) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL) return MHD_NO;
    if (type) MHD_add_response_header(resp, "Content-Type", type);
    if (status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    if (allow) MHD_add_response_header(resp, "Allow", allow);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    count_answer(r, status);
    return ok;
}

static enum MHD_Result send_error(Router *r, struct MHD_Connection *c, const RouteReq *q, int status,
                                  const char *msg, const char *allow) {
    char *json = api_error_json(status, msg, NULL, NULL);
    if (json == NULL) return MHD_NO;
    http_log_error(q ? q->method : NULL, q ? q->target : NULL, status, msg);
    enum MHD_Result ok = send_body(r, c, status, "application/json", json, strlen(json), allow);
    mn_free(json);
    return ok;
}

/* GET /health: 200 while a backend is up, else 503. */
static enum MHD_Result answer_health(Router *r, struct MHD_Connection *c, const RouteReq *q) {
    int n = backends_count(r->backends), n_up = 0;
    for (int i = 0; i < n; i++) n_up += backends_is_up(r->backends, i);
    if (n_up == 0) return send_error(r, c, q, 503, "no backend is up", NULL);
    char body[96];
    int len = snprintf(body, sizeof body, "{\"status\":\"ok\",\"backends\":%d,\"backends_up\":%d}", n, n_up);
    return send_body(r, c, 200, "application/json", body, (size_t)len, NULL);
}

static enum MHD_Result answer_metrics(Router *r, struct MHD_Connection *c) {
    metrics_refresh(r);
    char *text;
    size_t len;
    if (metrics_render(r->metrics, &text, &len) != MN_OK) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_COPY);
    mn_free(text);
    if (resp == NULL) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
    enum MHD_Result ok = MHD_queue_response(c, 200, resp); /* a scrape is not counted */
    MHD_destroy_response(resp);
    return ok;
}

/* ---- the plan ------------------------------------------------------------------------------ */

/* The backends to try for key, in order, into plan (room for every
 * backend); returns how many. */
static int plan_for(Router *r, const ConvKey *key, int *plan) {
    int n = backends_count(r->backends);
    int order[RING_MAX_NODES], load[RING_MAX_NODES];
    bool is_up[RING_MAX_NODES], is_skip = false;
    for (int i = 0; i < n; i++) {
        is_up[i] = backends_is_up(r->backends, i);
        load[i] = backends_load(r->backends, i);
    }
    if (r->opt.policy == ROUTE_POLICY_ROUND_ROBIN && !key->is_stored) {
        uint64_t first = atomic_fetch_add(&r->rr_next, 1) % (uint64_t)n;
        for (int i = 0; i < n; i++) order[i] = (int)((first + (uint64_t)i) % (uint64_t)n);
        ring_plan(order, n, is_up, load, 0, plan, &is_skip);
        return n;
    }
    ring_order(r->ring, key->hash, order);
    int known = key->is_stored && key->id[0] ? idmap_get(r->ids, key->id) : -1;
    if (known >= 0 && known < n) { /* the backend that made it, then the ring's order */
        int k = 0;
        plan[k++] = known;
        for (int i = 0; i < n; i++)
            if (order[i] != known && is_up[order[i]]) plan[k++] = order[i];
        for (int i = 0; i < n; i++)
            if (order[i] != known && !is_up[order[i]]) plan[k++] = order[i];
        return n;
    }
    /* a stored response nobody remembers is looked for without load bounds */
    ring_plan(order, n, is_up, load, key->is_stored ? 0 : r->opt.load_factor, plan, &is_skip);
    if (is_skip) metrics_counter_add(r->f_load_skips, "", 1);
    return n;
}

/* ---- passing an answer on ------------------------------------------------------------------- */

/* Look for the first "id":"..." in the answer's first bytes. */
static void scan_id(Proxy *p, const char *data, size_t n) {
    if (p->id[0] || p->n_scan >= ROUTER_ID_SCAN) return;
    size_t k = n < ROUTER_ID_SCAN - p->n_scan ? n : ROUTER_ID_SCAN - p->n_scan;
    memcpy(p->scan + p->n_scan, data, k);
    p->n_scan += k;
    p->scan[p->n_scan] = '\0';
    const char *at = strstr(p->scan, "\"id\"");
    if (at == NULL) return;
    at += 4;
    at += strspn(at, " \t\r\n");
    if (*at++ != ':') return;
    at += strspn(at, " \t\r\n");
    if (*at++ != '"') return;
    size_t len = strcspn(at, "\"\\");
    if (at[len] == '"' && len > 0 && len < sizeof p->id) snprintf(p->id, sizeof p->id, "%.*s", (int)len, at);
}

static ssize_t proxy_read(void *cls, uint64_t pos, char *buf, size_t max) {
    Proxy *p = cls;
    MnErr err = {0};
    ssize_t n = upstream_read(p->up, buf, max, &err);
    if (n > 0) {
        if (p->is_remember && !p->id[0]) {
            scan_id(p, buf, (size_t)n);
            /* remembered before the client has the id, so its next turn finds it */
            if (p->id[0]) idmap_put(p->r->ids, p->id, p->backend);
        }
        p->n_sent += n;
        /* with a declared length the library asks no further than it */
        if (p->n_sent == p->length) p->is_ended = true;
        return n;
    }
    if (n == 0) {
        p->is_ended = true;
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    p->is_broken = true;
    LOG_WARN("backend %s broke off an answer (%s)", backends_url(p->r->backends, p->backend), err.msg);
    if (err.code != MN_ECANCELED) backends_report_failure(p->r->backends, p->backend);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void proxy_free(void *cls) {
    Proxy *p = cls;
    Router *r = p->r;
    char detail[600];
    snprintf(detail, sizeof detail, "backend=%s tried=%d%s", backends_url(r->backends, p->backend), p->n_tried,
             p->is_broken ? " broken" : p->is_ended ? "" : " cancelled: the client went away");
    http_log_answer(p->method, p->target, p->status, p->id[0] ? p->id : NULL, p->is_stream, detail);
    give_upstream(r, p->up);
    backends_release(r->backends, p->backend);
    mn_free(p->target);
    mn_free(p);
    active_add(r, -1);
}

/* Queue the answer up carries (its head is in) as a stream of its body;
 * takes up and the backend's acquisition (released by proxy_free). */
static enum MHD_Result pass_on(Router *r, struct MHD_Connection *c, const RouteReq *q, Upstream *up, int backend,
                               int status, int n_tried, bool is_remember) {
    Proxy *p = mn_calloc(1, sizeof *p);
    char *target = mn_strdup(q->target);
    int64_t len = upstream_content_length(up);
    struct MHD_Response *resp =
        p && target ? MHD_create_response_from_callback(len >= 0 ? (uint64_t)len : MHD_SIZE_UNKNOWN, ROUTER_BLOCK,
                                                        proxy_read, p, proxy_free)
                    : NULL;
    if (resp == NULL) {
        mn_free(p);
        mn_free(target);
        give_upstream(r, up);
        backends_release(r->backends, backend);
        active_add(r, -1);
        return send_error(r, c, q, 500, "out of memory", NULL);
    }
    *p = (Proxy){.r = r, .up = up, .backend = backend, .status = status, .n_tried = n_tried, .length = len,
                 .target = target, .is_remember = is_remember, .is_ended = len == 0};
    snprintf(p->method, sizeof p->method, "%s", q->method);
    const char *type = upstream_header(up, "Content-Type");
    p->is_stream = type && strncasecmp(type, "text/event-stream", 17) == 0;
    for (size_t i = 0; i < sizeof FWD_ANSWER / sizeof FWD_ANSWER[0]; i++) {
        const char *v = upstream_header(up, FWD_ANSWER[i]);
        if (v) MHD_add_response_header(resp, FWD_ANSWER[i], v);
    }
    count_answer(r, status);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp); /* proxy_free runs when the library is done with it */
    return ok;
}

/* ---- routing a request ------------------------------------------------------------------------ */

/* The last answer a backend gave that the router did not pass on. */
typedef struct Kept {
    int status;
    char *body;
    size_t len;
    char type[128];
} Kept;

static void kept_free(Kept *k) {
    mn_free(k->body);
    memset(k, 0, sizeof *k);
}

/* A not-found answer to a stored response's request: another backend may hold it. */
static bool is_not_found(const Kept *k) {
    if (k->status == 404) return true;
    if (k->status != 400 || k->body == NULL) return false;
    return strstr(k->body, "\"previous_response_not_found\"") != NULL;
}

/* The client's headers that go to the backend, as "Name: value" lines. */
typedef struct FwdHeaders {
    char *lines[ROUTER_MAX_FWD + 1]; /* NULL-ended, each mn_malloc'd */
    int n;
    bool is_oom;
} FwdHeaders;

static enum MHD_Result fwd_add(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    FwdHeaders *h = cls;
    for (size_t i = 0; i < sizeof FWD_REQUEST / sizeof FWD_REQUEST[0]; i++) {
        if (strcasecmp(key, FWD_REQUEST[i]) != 0 || h->n == ROUTER_MAX_FWD) continue;
        size_t n = strlen(key) + strlen(value ? value : "") + 3;
        char *line = mn_malloc(n);
        if (line == NULL) {
            h->is_oom = true;
            return MHD_NO;
        }
        snprintf(line, n, "%s: %s", key, value ? value : "");
        h->lines[h->n++] = line;
    }
    return MHD_YES;
}

static void fwd_free(FwdHeaders *h) {
    for (int i = 0; i < h->n; i++) mn_free(h->lines[i]);
    h->n = 0;
}

/* The answer when no backend gave one to pass on: the last one kept, or 503. */
static enum MHD_Result answer_unavailable(Router *r, struct MHD_Connection *c, const RouteReq *q, Kept *k,
                                          int n_tried, bool is_timed_out) {
    if (k->status == 0) {
        metrics_counter_add(r->f_unavailable, "", 1);
        char msg[160];
        if (is_timed_out) { /* the last one tried accepted the request and then said nothing */
            snprintf(msg, sizeof msg, "no backend answered within --upstream-timeout (%g s; %d backend%s tried)",
                     r->opt.upstream_timeout_s, n_tried, n_tried == 1 ? "" : "s");
            return send_error(r, c, q, 504, msg, NULL);
        }
        snprintf(msg, sizeof msg, "no backend is up (%d backend%s tried, none answered)", n_tried,
                 n_tried == 1 ? "" : "s");
        return send_error(r, c, q, 503, msg, NULL);
    }
    char detail[64];
    snprintf(detail, sizeof detail, "tried=%d (the last backend's answer)", n_tried);
    http_log_answer(q->method, q->target, k->status, NULL, false, detail);
    return send_body(r, c, k->status, k->type[0] ? k->type : NULL, k->body ? k->body : "", k->len, NULL);
}

/* Try the plan's backends in turn (see the top comment). */
static enum MHD_Result route(Router *r, struct MHD_Connection *c, RouteReq *q) {
    ConvKeyInput in = {.method = q->method,
                       .path = q->path,
                       .body = q->body.data,
                       .body_len = q->body.len,
                       .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
                       .cache_namespace = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Cache-Namespace"),
                       .session = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Session-Id")};
    ConvKey key;
    convkey_of(&in, &key);
    int plan[RING_MAX_NODES];
    int n = plan_for(r, &key, plan);
    FwdHeaders fwd = {0};
    Upstream *up = take_upstream(r);
    MHD_get_connection_values(c, MHD_HEADER_KIND, fwd_add, &fwd);
    if (up == NULL || fwd.is_oom) {
        fwd_free(&fwd);
        give_upstream(r, up);
        return send_error(r, c, q, 500, "out of memory", NULL);
    }
    active_add(r, 1);
    UpstreamReq req = {.method = q->method,
                       .target = q->target,
                       .body = q->body.data,
                       .body_len = q->body.len,
                       .headers = (const char *const *)fwd.lines,
                       .connect_timeout_s = r->opt.connect_timeout_s,
                       .silence_s = r->opt.upstream_timeout_s,
                       .stop = &r->stop};
    Kept kept = {0};
    int n_tried = 0;
    bool is_timed_out = false; /* the last failure */
    for (int k = 0; k < n; k++) {
        int b = plan[k], status = 0;
        MnErr err = {0};
        req.base_url = backends_url(r->backends, b);
        backends_acquire(r->backends, b);
        count_backend(r, r->f_forwarded, b);
        n_tried++;
        int rc = upstream_begin(up, &req, &status, &err);
        if (rc == MN_OK && status < 500 && !(key.is_stored && (status == 404 || status == 400))) {
            if (key.is_stored && strcmp(q->method, "DELETE") == 0 && status == 200) idmap_drop(r->ids, key.id);
            fwd_free(&fwd);
            kept_free(&kept);
            return pass_on(r, c, q, up, b, status, n_tried, key.is_new_response && status == 200);
        }
        if (rc == MN_ECANCELED || rc == MN_ENOMEM) {
            backends_release(r->backends, b);
            break;
        }
        bool is_failure = rc != MN_OK || status >= 500;
        is_timed_out = rc != MN_OK && upstream_is_timed_out(up);
        if (rc == MN_OK) { /* an answer to keep while the next backend is asked */
            kept_free(&kept);
            kept.status = status;
            const char *type = upstream_header(up, "Content-Type");
            snprintf(kept.type, sizeof kept.type, "%s", type ? type : "");
            if (upstream_read_all(up, ROUTER_KEPT_MAX, &kept.body, &kept.len, &err) == MN_EIO) is_failure = true;
            if (!is_failure && !is_not_found(&kept)) { /* a 400 of its own: the client's to see */
                backends_release(r->backends, b);
                break;
            }
        }
        backends_release(r->backends, b);
        upstream_end(up);
        if (is_failure) {
            count_backend(r, r->f_failovers, b);
            backends_report_failure(r->backends, b);
            LOG_WARN("backend %s failed %s %s: %s", req.base_url, q->method, q->path,
                     rc != MN_OK ? err.msg : "it answered 5xx");
        }
    }
    fwd_free(&fwd);
    give_upstream(r, up);
    enum MHD_Result ok = answer_unavailable(r, c, q, &kept, n_tried, is_timed_out);
    kept_free(&kept);
    active_add(r, -1);
    return ok;
}

/* ---- libmicrohttpd's callbacks ------------------------------------------------------------------- */

static void *on_uri(void *ctx, const char *uri, struct MHD_Connection *c) {
    RouteReq *q = mn_calloc(1, sizeof *q);
    if (q == NULL) return NULL;
    q->r = ctx;
    if ((q->target = mn_strdup(uri)) == NULL) {
        mn_free(q);
        return NULL;
    }
    return q;
}

static void on_completed(void *ctx, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    RouteReq *q = *con_cls;
    if (q == NULL) return;
    http_body_free(&q->body);
    mn_free(q->target);
    mn_free(q);
    *con_cls = NULL;
}

static void on_rejected(void *ctx, const char *method, const char *path, int status, const char *msg) {
    count_answer(ctx, status);
    http_log_error(method, path, status, msg);
}

/* Whether target is a path and query that can follow a backend's base URL
 * (RFC 9112 §3.2.1's origin-form, visible ASCII, no fragment). */
static bool is_origin_form(const char *target) {
    if (target[0] != '/') return false;
    for (const char *p = target; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f || *p == '#') return false;
    return true;
}

static enum MHD_Result handle(void *ctx, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size,
                              void **con_cls) {
    Router *r = ctx;
    RouteReq *q = *con_cls;
    if (q == NULL) return MHD_NO; /* on_uri ran out of memory */
    if (!q->is_begun) {
        q->is_begun = true;
        q->method = method;
        q->path = url;
        char msg[96];
        int status = http_check_framing(c, r->opt.max_body, msg, sizeof msg);
        return status ? send_error(r, c, q, status, msg, NULL) : MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        int rc = http_body_add(&q->body, upload_data, n, r->opt.max_body);
        if (rc == MN_EFULL) {
            char msg[96];
            http_body_limit_msg(r->opt.max_body, msg, sizeof msg);
            count_answer(r, 413);
            http_log_error(method, q->target, 413, msg);
            return http_refuse_body(c, msg, NULL);
        }
        return rc == MN_OK ? MHD_YES : MHD_NO;
    }
    if (strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0) {
        if (strcmp(method, "GET") != 0) {
            char msg[96];
            snprintf(msg, sizeof msg, "%s does not accept %.16s (only GET)", url, method);
            return send_error(r, c, q, 405, msg, "GET");
        }
        return url[1] == 'h' ? answer_health(r, c, q) : answer_metrics(r, c);
    }
    if (!is_origin_form(q->target))
        return send_error(r, c, q, 400, "the request target must be a path (origin-form: /...)", NULL);
    return route(r, c, q);
}

/* ---- life cycle ------------------------------------------------------------------------------------ */

void router_options_default(RouterOptions *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8090;
    o->policy = ROUTE_POLICY_HASH;
    o->load_factor = 1.25;
    o->max_body = 1 << 20;
    o->max_response_ids = 65536;
    o->connect_timeout_s = 2;
    o->upstream_timeout_s = 600;
    o->probe_min_s = 0.25;
    o->probe_max_s = 5;
    http_limits_default(&o->limits);
    o->limits.max_connections = 256;
    o->limits.max_per_ip = 128;
}

static const char *const POLICY_NAMES[] = {"hash", "round-robin"};

int router_policy_parse(const char *name, RoutePolicy *policy) {
    for (int i = 0; i < 2; i++)
        if (strcmp(name, POLICY_NAMES[i]) == 0) {
            *policy = (RoutePolicy)i;
            return MN_OK;
        }
    return MN_EINVAL;
}

const char *router_policy_name(RoutePolicy policy) { return (unsigned)policy < 2 ? POLICY_NAMES[policy] : NULL; }

int router_new(const RouterOptions *o, Router **out, MnErr *err) {
    *out = NULL;
    if (o->load_factor != 0 && !(o->load_factor >= 1))
        return mn_err_set(err, MN_EINVAL, "--load-factor must be 0 (off) or at least 1, got %g", o->load_factor);
    if (!(o->connect_timeout_s > 0) || !(o->upstream_timeout_s > 0) || !(o->probe_min_s > 0) ||
        !(o->probe_max_s >= o->probe_min_s))
        return mn_err_set(err, MN_EINVAL, "timeouts must be > 0 and --probe-max >= --probe-min");
    int rc = http_limits_check(&o->limits, ROUTER_MAX_CONNECTIONS, err);
    if (rc != MN_OK) return rc;
    if (o->max_body < 1 || o->max_response_ids < 1)
        return mn_err_set(err, MN_EINVAL, "--max-body and --response-ids must be at least 1");
    Router *r = mn_calloc(1, sizeof *r);
    if (r == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    r->opt = *o;
    atomic_init(&r->rr_next, 0);
    atomic_init(&r->stop, false);
    pthread_mutex_init(&r->idle_lock, NULL);
    pthread_mutex_init(&r->drain_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->drain_cv, &ca);
    pthread_condattr_destroy(&ca);
    BackendsConfig bc = {.urls = o->backends,
                         .n_urls = o->n_backends,
                         .probe_min_s = o->probe_min_s,
                         .probe_max_s = o->probe_max_s,
                         .connect_timeout_s = o->connect_timeout_s};
    rc = backends_new(&bc, &r->backends, err);
    if (rc != MN_OK) {
        router_free(r);
        return rc;
    }
    const char *names[RING_MAX_NODES];
    for (int i = 0; i < o->n_backends; i++) names[i] = backends_url(r->backends, i);
    if ((rc = ring_new(names, o->n_backends, RING_VNODES, &r->ring)) != MN_OK ||
        (rc = idmap_new(o->max_response_ids, &r->ids)) != MN_OK || (rc = metrics_setup(r)) != MN_OK) {
        router_free(r);
        return mn_err_set(err, rc, "cannot set the router up: %s", mn_strerror(rc));
    }
    HttpFrontConfig fc = {.host = o->host,
                          .port = o->port,
                          .limits = o->limits,
                          .handler_fn = handle,
                          .completed_fn = on_completed,
                          .uri_fn = on_uri,
                          .rejected_fn = on_rejected,
                          .ctx = r};
    if ((rc = http_front_new(&fc, &r->front, err)) != MN_OK) {
        router_free(r);
        return rc;
    }
    *out = r;
    return MN_OK;
}

int router_port(const Router *r) { return http_front_port(r->front); }

void router_quiesce(Router *r) { http_front_quiesce(r->front); }

bool router_drain(Router *r, double timeout_s) {
    struct timespec ts = mn_timespec_of(mn_now() + timeout_s);
    pthread_mutex_lock(&r->drain_lock);
    int rc = 0;
    while (r->n_active > 0 && rc == 0) rc = pthread_cond_timedwait(&r->drain_cv, &r->drain_lock, &ts);
    bool is_drained = r->n_active == 0;
    pthread_mutex_unlock(&r->drain_lock);
    return is_drained;
}

void router_free(Router *r) {
    if (r == NULL) return;
    atomic_store(&r->stop, true);
    http_front_free(r->front); /* waits for the connection threads, which see stop */
    backends_free(r->backends);
    for (int i = 0; i < r->n_idle; i++) upstream_free(r->idle[i]);
    idmap_free(r->ids);
    ring_free(r->ring);
    metrics_free(r->metrics);
    pthread_cond_destroy(&r->drain_cv);
    pthread_mutex_destroy(&r->drain_lock);
    pthread_mutex_destroy(&r->idle_lock);
    mn_free(r);
}
