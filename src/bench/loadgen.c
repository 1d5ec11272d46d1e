/* loadgen.c — closed-loop conversations against a server (see loadgen.h).
 *
 * Threads and ownership. The calling thread owns the Run: it scrapes
 * /metrics, starts the workers, prints progress (and takes SIGINT/SIGTERM
 * when asked), joins the workers and builds the results. Every field of
 * the Run below `mu` is guarded by it. A conversation is at any moment in
 * exactly one place: not yet started or waiting in the ready heap (keyed by
 * the time its next turn is due, then by its index), held by the one worker
 * that is sending its turn, or finished. That is what makes conversations
 * closed loops: no conversation ever has two requests in flight. The worker
 * holding a conversation owns its history; replies in the history are owned
 * (mn_free), user and system texts are borrowed from the plan.
 *
 * Cancellation: a signal sets `cancel`, which every client checks between
 * bytes; canceled requests are not recorded (they count as skipped), and no
 * further turn is sent.
 *
 * Worker loop:   heap top due? -> pop -> send (unlocked) -> record ->
 *                push back with due = end + think | finish the conversation
 */
#include "bench/loadgen.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/mem.h"
#include "bench/client.h"

/* ---- types ------------------------------------------------------------------------ */

typedef struct ConvState {
    int next_turn;
    double ready_s;       /* when next_turn is due, run clock */
    size_t n_msgs;
    ClientMsg *msgs;      /* (1 + 2 n_turns) at most; assistant contents owned */
    char prev_id[CLIENT_ID_MAX]; /* responses: the last reply's response id ("" before the first) */
} ConvState;

typedef struct Run {
    const BenchPlan *plan;
    const BenchRunOpts *o;
    double t0;            /* CLOCK_MONOTONIC seconds at the start */
    atomic_int cancel;
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* the heap or the counters changed */
    ConvState *convs;     /* (plan->n_convs) */
    int *heap;            /* (plan->n_convs) conversation indices, a min-heap by (ready_s, index) */
    int n_heap;
    int n_active;         /* conversations neither finished nor dropped */
    int n_in_flight, n_started;
    long n_failed, n_skipped;
    bool is_stopping;
    int rc;               /* first fatal error (MN_ENOMEM) */
    long n_records;
    BenchRecord *records; /* (plan->n_requests) */
} Run;

/* ---- ready heap ---------------------------------------------------------------------- */

static bool heap_less(const Run *r, int a, int b) {
    double x = r->convs[a].ready_s, y = r->convs[b].ready_s;
    return x < y || (x == y && a < b);
}

static void heap_push(Run *r, int ci) {
    int i = r->n_heap++;
    r->heap[i] = ci;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!heap_less(r, r->heap[i], r->heap[p])) break;
        int t = r->heap[i];
        r->heap[i] = r->heap[p];
        r->heap[p] = t;
        i = p;
    }
}

static int heap_pop(Run *r) {
    int top = r->heap[0];
    r->heap[0] = r->heap[--r->n_heap];
    for (int i = 0;;) {
        int l = 2 * i + 1, m = i;
        if (l < r->n_heap && heap_less(r, r->heap[l], r->heap[m])) m = l;
        if (l + 1 < r->n_heap && heap_less(r, r->heap[l + 1], r->heap[m])) m = l + 1;
        if (m == i) break;
        int t = r->heap[i];
        r->heap[i] = r->heap[m];
        r->heap[m] = t;
        i = m;
    }
    return top;
}

/* ---- metrics -------------------------------------------------------------------------- */

/* The series read, by family name (histograms by their _sum/_count). */
typedef struct TierFamily {
    const char *name;
    int io; /* a BenchTierIo, or -1 for mnemo_cached_tokens_total */
} TierFamily;

static const TierFamily TIER_FAMILIES[] = {
    {"mnemo_cached_tokens_total", -1},
    {"mnemo_tier_bytes_read_total", BENCH_IO_BYTES_READ},
    {"mnemo_tier_bytes_written_total", BENCH_IO_BYTES_WRITTEN},
    {"mnemo_tier_read_seconds_sum", BENCH_IO_READ_S},
    {"mnemo_tier_read_seconds_count", BENCH_IO_READS},
    {"mnemo_tier_write_seconds_sum", BENCH_IO_WRITE_S},
    {"mnemo_tier_write_seconds_count", BENCH_IO_WRITES},
    {"mnemo_tier_occupancy_bytes", BENCH_IO_OCCUPANCY},
    {"mnemo_tier_evictions_total", BENCH_IO_EVICTIONS},
    {"mnemo_tier_checksum_failures_total", BENCH_IO_CHECKSUM_FAILURES},
};

/* One sample line of the text format: name, optional {labels}, value. */
typedef struct Sample {
    const char *name;
    size_t name_len;
    const char *labels; /* inside the braces; NULL when there are none */
    size_t labels_len;
    double value;
} Sample;

/* Parse [line, end) as a sample; false for comments, blank or malformed lines. */
static bool sample_parse(const char *line, const char *end, Sample *s) {
    const char *p = line;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (p == end || *p == '#') return false;
    s->name = p;
    while (p < end && *p != '{' && *p != ' ' && *p != '\t') p++;
    s->name_len = (size_t)(p - s->name);
    s->labels = NULL;
    s->labels_len = 0;
    if (p < end && *p == '{') {
        s->labels = ++p;
        bool in_quotes = false;
        for (; p < end && (in_quotes || *p != '}'); p++) {
            if (in_quotes && *p == '\\' && p + 1 < end) p++;
            else if (*p == '"') in_quotes = !in_quotes;
        }
        if (p == end) return false;
        s->labels_len = (size_t)(p - s->labels);
        p++;
    }
    char num[64];
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    size_t n = 0;
    while (p + n < end && p[n] != ' ' && p[n] != '\t' && p[n] != '\r' && n < sizeof num - 1) n++;
    if (n == 0) return false;
    memcpy(num, p, n);
    num[n] = '\0';
    char *stop;
    s->value = strtod(num, &stop);
    return stop != num && *stop == '\0';
}

/* The value of label key in a sample's labels, unescaped into out; false
 * when absent or longer than cap - 1. */
static bool label_value(const Sample *s, const char *key, char *out, size_t cap) {
    const char *p = s->labels, *end = s->labels ? s->labels + s->labels_len : NULL;
    size_t key_len = strlen(key);
    while (p && p < end) {
        while (p < end && (*p == ' ' || *p == ',')) p++;
        const char *name = p;
        while (p < end && *p != '=') p++;
        size_t name_len = (size_t)(p - name);
        while (name_len > 0 && name[name_len - 1] == ' ') name_len--;
        if (p + 1 >= end || p[1] != '"') return false;
        p += 2;
        size_t n = 0;
        bool fits = true;
        for (; p < end && *p != '"'; p++) {
            char c = *p;
            if (c == '\\' && p + 1 < end) {
                c = *++p;
                if (c == 'n') c = '\n';
            }
            if (n + 1 < cap) out[n++] = c;
            else fits = false;
        }
        if (p == end) return false;
        p++;
        if (name_len == key_len && memcmp(name, key, key_len) == 0) {
            out[n] = '\0';
            return fits;
        }
    }
    return false;
}

/* Index of tier name in m, added when new; -1 when there is no room. */
static int tier_slot(BenchMetrics *m, const char *name) {
    for (int i = 0; i < m->n_tiers; i++)
        if (strcmp(m->tier[i], name) == 0) return i;
    if (m->n_tiers == BENCH_MAX_TIERS) return -1;
    int k = m->n_tiers++;
    snprintf(m->tier[k], sizeof m->tier[k], "%s", name);
    return k;
}

static bool name_is(const Sample *s, const char *name) {
    return strlen(name) == s->name_len && memcmp(s->name, name, s->name_len) == 0;
}

void bench_metrics_parse(const char *text, BenchMetrics *m) {
    memset(m, 0, sizeof *m);
    for (const char *line = text; line && *line;) {
        const char *eol = strchr(line, '\n'), *end = eol ? eol : line + strlen(line);
        Sample s;
        if (sample_parse(line, end, &s)) {
            if (name_is(&s, "mnemo_recomputed_tokens_total")) {
                m->recomputed = s.value;
                m->is_valid = true;
            } else if (name_is(&s, "mnemo_dropped_blocks_total")) {
                m->dropped_blocks = s.value;
                m->has_dropped = m->is_valid = true;
            } else {
                char tier[24];
                for (size_t f = 0; f < sizeof TIER_FAMILIES / sizeof TIER_FAMILIES[0]; f++) {
                    if (!name_is(&s, TIER_FAMILIES[f].name)) continue;
                    int k = label_value(&s, "tier", tier, sizeof tier) ? tier_slot(m, tier) : -1;
                    if (k < 0) break;
                    int io = TIER_FAMILIES[f].io;
                    if (io < 0) {
                        m->cached[k] = s.value;
                        m->has_cached[k] = true;
                    } else {
                        m->io[k][io] = s.value;
                        m->has_io[k] |= 1u << io;
                    }
                    m->is_valid = true;
                    break;
                }
            }
        }
        line = eol ? eol + 1 : NULL;
    }
}

static void scrape_metrics(ChatClient *c, BenchMetrics *m) {
    char *body = NULL;
    int status = 0;
    memset(m, 0, sizeof *m);
    if (client_get(c, "/metrics", &body, &status) == MN_OK && status == 200 && body) bench_metrics_parse(body, m);
    mn_free(body);
}

void bench_metrics_delta(const BenchMetrics *a, const BenchMetrics *b, BenchMetrics *d) {
    memset(d, 0, sizeof *d);
    if (!a->is_valid || !b->is_valid) return;
    *d = *b;
    for (int i = 0; i < d->n_tiers; i++)
        for (int k = 0; k < a->n_tiers; k++) {
            if (strcmp(a->tier[k], d->tier[i]) != 0) continue;
            d->cached[i] -= a->cached[k];
            for (int f = 0; f < BENCH_IO__COUNT; f++)
                if (f != BENCH_IO_OCCUPANCY && (a->has_io[k] & (1u << f))) d->io[i][f] -= a->io[k][f];
        }
    d->recomputed -= a->recomputed;
    if (a->has_dropped) d->dropped_blocks -= a->dropped_blocks;
}

double bench_tier_read_mbps(const BenchMetrics *d, int i) {
    unsigned need = 1u << BENCH_IO_BYTES_READ | 1u << BENCH_IO_READ_S;
    if (i < 0 || i >= d->n_tiers || (d->has_io[i] & need) != need || !(d->io[i][BENCH_IO_READ_S] > 0)) return NAN;
    return d->io[i][BENCH_IO_BYTES_READ] / d->io[i][BENCH_IO_READ_S] / 1e6;
}

/* ---- one request ------------------------------------------------------------------------ */

const char *bench_status_name(const BenchRecord *r, char *buf, size_t cap) {
    switch (r->status) {
    case BENCH_OK: return "ok";
    case BENCH_HTTP_ERROR: snprintf(buf, cap, "http_%d", r->http_status); return buf;
    case BENCH_CONNECT_ERROR: return "connect_error";
    case BENCH_TIMEOUT: return "timeout";
    case BENCH_STREAM_ERROR: return "stream_error";
    case BENCH_SERVER_ERROR: return "server_error";
    case BENCH_STATUS__COUNT: break;
    }
    return "unknown";
}

typedef struct Deltas {
    double *t;   /* arrival time of each content delta */
    int n, cap;
    bool is_oom;
} Deltas;

static void on_delta(void *ctx, const char *text, size_t len) {
    Deltas *d = ctx;
    if (d->n == d->cap) {
        int c = d->cap ? 2 * d->cap : 64;
        double *t = mn_realloc(d->t, (size_t)c * sizeof *t);
        if (t == NULL) {
            d->is_oom = true;
            return;
        }
        d->t = t;
        d->cap = c;
    }
    d->t[d->n++] = mn_now();
}

static char *messages_json(const ClientMsg *msgs, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:s,s:s}", "role", msgs[i].role, "content", msgs[i].content));
    char *s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    char *out = s ? mn_strdup(s) : NULL;
    mn_free(s);
    return out;
}

/* Send turn `turn` of conversation ci: its history (chat) or its new
 * message after the previous response (responses); fill rec. Returns
 * MN_OK, MN_ECANCELED (not to be recorded) or MN_ENOMEM. On success with
 * a 200 answer *reply is the reply text (owned). */
static int send_turn(Run *r, ChatClient *c, int ci, int turn, ConvState *cs, BenchRecord *rec, char **reply) {
    const BenchTurn *u = &r->plan->convs[ci].turns[turn];
    const BenchRunOpts *o = r->o;
    *reply = NULL;
    memset(rec, 0, sizeof *rec);
    rec->conversation = ci;
    rec->turn = turn;
    rec->ready_s = cs->ready_s;
    rec->ttft_s = rec->tpot_s = -1;
    const BenchConv *pc = &r->plan->convs[ci];
    bool is_responses = o->api == CLIENT_API_RESPONSES, is_continued = cs->prev_id[0] != '\0';
    size_t first = pc->system ? 1 : 0; /* responses: the system message goes as instructions */
    ClientTurn t = {.msgs = is_continued ? &cs->msgs[cs->n_msgs - 1] : &cs->msgs[first],
                    .n_msgs = is_continued ? 1 : cs->n_msgs - first,
                    .instructions = pc->system,
                    .previous_id = is_continued ? cs->prev_id : NULL};
    if (o->keep_text && (rec->sent = is_responses ? messages_json(t.msgs, t.n_msgs)
                                                  : messages_json(cs->msgs, cs->n_msgs)) == NULL)
        return MN_ENOMEM;
    ClientParams p = {.model = o->model, .max_tokens = u->output_tokens, .temperature = o->temperature,
                      .ignore_eos = true, .seed = (long)u->seed};
    Deltas d = {0};
    ClientResult res;
    double t_send = mn_now();
    int rc = is_responses ? client_respond(c, &t, &p, on_delta, &d, &res)
                          : client_chat(c, cs->msgs, cs->n_msgs, &p, on_delta, &d, &res);
    rec->send_s = t_send - r->t0;
    rec->request_bytes = res.request_bytes;
    rec->e2e_s = res.total_s;
    rec->end_s = rec->send_s + res.total_s;
    rec->http_status = res.http_status;
    rec->prompt_tokens = res.prompt_tokens;
    rec->cached_tokens = res.cached_tokens;
    rec->recomputed_tokens = res.recomputed_tokens;
    rec->truncated_tokens = res.truncated_tokens;
    rec->shifted_tokens = res.shifted_tokens;
    rec->cached_by_tier = res.cached_by_tier;
    rec->output_tokens = res.completion_tokens >= 0 ? res.completion_tokens : res.n_deltas;
    rec->ttft_s = res.ttft_s;
    if (rec->ttft_s >= 0 && rec->output_tokens >= 2 && rec->e2e_s > rec->ttft_s)
        rec->tpot_s = (rec->e2e_s - rec->ttft_s) / (double)(rec->output_tokens - 1);
    if (d.n > 1 && (rec->gaps = mn_malloc((size_t)(d.n - 1) * sizeof *rec->gaps)) != NULL) {
        rec->n_gaps = d.n - 1;
        for (int i = 1; i < d.n; i++) rec->gaps[i - 1] = d.t[i] - d.t[i - 1];
    }
    mn_free(d.t);
    if (res.is_canceled) {
        mn_free(res.content);
        return MN_ECANCELED;
    }
    if (rc == MN_ENOMEM || d.is_oom) {
        mn_free(res.content);
        return MN_ENOMEM;
    }
    if (res.http_status != 0 && res.http_status != 200) rec->status = BENCH_HTTP_ERROR;
    else if (res.is_server_error) rec->status = BENCH_SERVER_ERROR; /* the cause, whatever broke after it */
    else if (rc != MN_OK)
        rec->status = res.is_timeout ? BENCH_TIMEOUT : res.http_status == 0 ? BENCH_CONNECT_ERROR : BENCH_STREAM_ERROR;
    else rec->status = BENCH_OK;
    snprintf(rec->error, sizeof rec->error, "%.159s", rec->status == BENCH_OK ? "" : res.error);
    if (rec->status == BENCH_OK) {
        snprintf(cs->prev_id, sizeof cs->prev_id, "%s", res.response_id); /* "": the next turn starts a new chain */
        *reply = res.content;
        if (o->keep_text && (rec->reply = mn_strdup(res.content)) == NULL) return MN_ENOMEM;
    } else {
        mn_free(res.content);
    }
    return MN_OK;
}

/* ---- workers -------------------------------------------------------------------------------- */

static void conv_finish(Run *r, int ci) {
    ConvState *cs = &r->convs[ci];
    for (size_t i = 0; i < cs->n_msgs; i++)
        if (strcmp(cs->msgs[i].role, "assistant") == 0) mn_free((char *)cs->msgs[i].content);
    mn_free(cs->msgs);
    cs->msgs = NULL;
    cs->n_msgs = 0;
    r->n_active--;
}

/* Drop every conversation still waiting (stopping, or out of time). */
static void drop_waiting(Run *r) {
    while (r->n_heap > 0) {
        int ci = heap_pop(r);
        r->n_skipped += r->plan->convs[ci].n_turns - r->convs[ci].next_turn;
        conv_finish(r, ci);
    }
}

typedef struct Worker {
    Run *run;
    ChatClient *client;
    pthread_t thread;
} Worker;

static void *worker_main(void *arg) {
    Worker *w = arg;
    Run *r = w->run;
    const BenchRunOpts *o = r->o;
    pthread_mutex_lock(&r->mu);
    while (r->n_active > 0) {
        if (r->is_stopping && r->n_heap > 0) {
            drop_waiting(r);
            pthread_cond_broadcast(&r->cv);
            continue;
        }
        if (r->n_heap == 0) {
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        int ci = r->heap[0];
        ConvState *cs = &r->convs[ci];
        double now = mn_now() - r->t0;
        bool is_late = o->duration_s > 0 && cs->next_turn == 0 && cs->ready_s >= o->duration_s;
        if (cs->ready_s > now && !is_late) {
            struct timespec ts = mn_timespec_of(r->t0 + cs->ready_s);
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            continue;
        }
        heap_pop(r);
        const BenchConv *pc = &r->plan->convs[ci];
        if (cs->next_turn == 0) {
            if (is_late || (o->duration_s > 0 && now >= o->duration_s)) { /* out of time: never starts */
                r->n_skipped += pc->n_turns;
                conv_finish(r, ci);
                pthread_cond_broadcast(&r->cv);
                continue;
            }
            cs->msgs = mn_calloc(1 + 2 * (size_t)pc->n_turns, sizeof *cs->msgs);
            if (cs->msgs == NULL) {
                r->rc = MN_ENOMEM;
                r->is_stopping = true;
                r->n_skipped += pc->n_turns;
                conv_finish(r, ci);
                pthread_cond_broadcast(&r->cv);
                continue;
            }
            if (pc->system) cs->msgs[cs->n_msgs++] = (ClientMsg){"system", pc->system};
            r->n_started++;
        }
        int turn = cs->next_turn;
        cs->msgs[cs->n_msgs++] = (ClientMsg){"user", pc->turns[turn].user};
        r->n_in_flight++;
        pthread_mutex_unlock(&r->mu);

        BenchRecord rec;
        char *reply = NULL;
        int rc = send_turn(r, w->client, ci, turn, cs, &rec, &reply);

        pthread_mutex_lock(&r->mu);
        r->n_in_flight--;
        if (rc == MN_OK) {
            r->records[r->n_records++] = rec;
            if (rec.status != BENCH_OK) r->n_failed++;
        } else {
            mn_free(rec.gaps);
            mn_free(rec.sent);
            mn_free(rec.reply);
            if (rc == MN_ENOMEM) {
                r->rc = MN_ENOMEM;
                r->is_stopping = true;
            }
        }
        if (rc == MN_OK && rec.status == BENCH_OK && !r->is_stopping) {
            cs->msgs[cs->n_msgs++] = (ClientMsg){"assistant", reply};
            cs->next_turn++;
            if (cs->next_turn == pc->n_turns) {
                conv_finish(r, ci);
            } else {
                cs->ready_s = rec.end_s + pc->turns[cs->next_turn].think_s;
                heap_push(r, ci);
            }
        } else {
            mn_free(reply);
            cs->n_msgs--; /* the user turn that got no answer */
            r->n_skipped += pc->n_turns - turn - (rc == MN_OK ? 1 : 0);
            conv_finish(r, ci);
        }
        pthread_cond_broadcast(&r->cv);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- progress ------------------------------------------------------------------------------- */

static void progress(Run *r, bool is_tty, bool is_final) {
    pthread_mutex_lock(&r->mu);
    long done = r->n_records, total = r->plan->n_requests - r->n_skipped, failed = r->n_failed;
    int in_flight = r->n_in_flight;
    pthread_mutex_unlock(&r->mu);
    fprintf(stderr, "%sbench: %ld/%ld requests, %ld errors, %d in flight, %.1f s%s", is_tty ? "\r\033[K" : "", done,
            total, failed, in_flight, mn_now() - r->t0, is_tty && !is_final ? "" : "\n");
    fflush(stderr);
}

/* ---- run ------------------------------------------------------------------------------------- */

static void records_free(BenchRecord *rs, long n) {
    for (long i = 0; i < n; i++) {
        mn_free(rs[i].gaps);
        mn_free(rs[i].sent);
        mn_free(rs[i].reply);
    }
    mn_free(rs);
}

int bench_run(const BenchPlan *plan, const BenchRunOpts *o, BenchResults **out, MnErr *err) {
    *out = NULL;
    if (o->url == NULL || o->concurrency < 1) return mn_err_set(err, MN_EINVAL, "bench_run needs a URL and workers");
    int n_workers = o->concurrency < plan->n_convs ? o->concurrency : plan->n_convs;
    Run r = {.plan = plan, .o = o, .n_active = plan->n_convs};
    atomic_init(&r.cancel, 0);
    BenchResults *res = mn_calloc(1, sizeof *res);
    r.convs = mn_calloc((size_t)plan->n_convs + 1, sizeof *r.convs);
    r.heap = mn_calloc((size_t)plan->n_convs + 1, sizeof *r.heap);
    r.records = mn_calloc((size_t)plan->n_requests + 1, sizeof *r.records);
    Worker *ws = mn_calloc((size_t)n_workers + 1, sizeof *ws);
    ChatClient *meta = NULL;
    int rc = MN_OK;
    if (!res || !r.convs || !r.heap || !r.records || !ws || client_new(o->url, o->api_key, &meta) != MN_OK) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory starting the run");
        goto fail;
    }
    client_set_timeouts(meta, o->connect_timeout_s > 0 ? o->connect_timeout_s : 10, 10);
    for (int i = 0; i < n_workers; i++) {
        ws[i].run = &r;
        if (client_new(o->url, o->api_key, &ws[i].client) != MN_OK) {
            rc = mn_err_set(err, MN_ENOMEM, "out of memory creating clients");
            goto fail;
        }
        client_set_timeouts(ws[i].client, o->connect_timeout_s, o->idle_timeout_s);
        client_set_cancel(ws[i].client, &r.cancel);
    }
    scrape_metrics(meta, &res->before);

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&r.mu, NULL);
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    if (o->handle_signals) pthread_sigmask(SIG_BLOCK, &sigs, &old); /* workers inherit the mask */

    r.t0 = mn_now();
    for (int i = 0; i < plan->n_convs; i++) {
        r.convs[i].ready_s = plan->convs[i].start_s;
        heap_push(&r, i);
    }
    int n_started = 0;
    for (; n_started < n_workers; n_started++)
        if (pthread_create(&ws[n_started].thread, NULL, worker_main, &ws[n_started]) != 0) break;
    if (n_started == 0 && n_workers > 0) {
        pthread_mutex_lock(&r.mu);
        drop_waiting(&r);
        pthread_mutex_unlock(&r.mu);
        rc = mn_err_set(err, MN_ENOMEM, "cannot start worker threads");
    }
    bool is_tty = isatty(STDERR_FILENO);
    double next_print = mn_now() + (is_tty ? 0.25 : 10.0);
    pthread_mutex_lock(&r.mu);
    while (r.n_active > 0) {
        struct timespec ts = mn_timespec_of(mn_now() + 0.1);
        pthread_cond_timedwait(&r.cv, &r.mu, &ts);
        pthread_mutex_unlock(&r.mu);
        if (o->handle_signals) {
            struct timespec zero = {0, 0};
            if (sigtimedwait(&sigs, NULL, &zero) > 0) {
                if (o->show_progress) fprintf(stderr, "\nbench: interrupted, canceling the requests in flight\n");
                atomic_store(&r.cancel, 1);
                pthread_mutex_lock(&r.mu);
                r.is_stopping = true;
                res->is_interrupted = true;
                pthread_cond_broadcast(&r.cv);
                pthread_mutex_unlock(&r.mu);
            }
        }
        if (o->show_progress && mn_now() >= next_print) {
            progress(&r, is_tty, false);
            next_print = mn_now() + (is_tty ? 0.25 : 10.0);
        }
        pthread_mutex_lock(&r.mu);
    }
    pthread_mutex_unlock(&r.mu);
    for (int i = 0; i < n_started; i++) pthread_join(ws[i].thread, NULL);
    if (o->show_progress) progress(&r, is_tty, true);
    if (o->handle_signals) pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);

    scrape_metrics(meta, &res->after);
    bench_metrics_delta(&res->before, &res->after, &res->delta);
    if (rc == MN_OK && r.rc) rc = mn_err_set(err, r.rc, "out of memory during the run");
    res->records = r.records;
    res->n_records = r.n_records;
    res->n_planned = plan->n_requests;
    res->n_skipped = r.n_skipped;
    res->n_convs_started = r.n_started;
    for (long i = 0; i < r.n_records; i++)
        if (r.records[i].end_s > res->wall_s) res->wall_s = r.records[i].end_s;
    r.records = NULL;
    for (int i = 0; i < n_workers; i++) client_free(ws[i].client);
    client_free(meta);
    mn_free(ws);
    mn_free(r.heap);
    mn_free(r.convs);
    if (rc != MN_OK) {
        bench_results_free(res);
        return rc;
    }
    *out = res;
    return MN_OK;

fail:
    for (int i = 0; ws && i < n_workers; i++) client_free(ws[i].client);
    client_free(meta);
    mn_free(ws);
    mn_free(r.records);
    mn_free(r.heap);
    mn_free(r.convs);
    mn_free(res);
    return rc;
}

void bench_results_free(BenchResults *r) {
    if (r == NULL) return;
    records_free(r->records, r->n_records);
    mn_free(r);
}
