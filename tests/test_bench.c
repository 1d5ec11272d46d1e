/* test_bench.c — `mnemo bench`: plans are reproducible and follow their
 * workload; against a real `mnemo serve` (stories260K) every planned turn
 * is sent once, conversations are closed loops, each turn's history holds
 * the actual earlier replies, the concurrency cap holds, and requests.csv /
 * summary.json agree with the summary; report.svg is well-formed XML.
 * Through the Responses API (--api responses) the same plan gets the same
 * prompts and replies while later turns send only their new message:
 * fewer request bytes than chat's for every turn after the first.
 * Against a fake server (libmicrohttpd) and a closed port, HTTP 500s, cut
 * streams and refused connections are counted as failures and the report
 * is still written. A fake mnemo with tiers has its usage split by tier,
 * recomputed tokens and /metrics tier I/O (restore bandwidth) reported; a
 * fake plain OpenAI server without them has none of it shown. The SSE
 * parser gives the same events however a stream is cut; the client reads
 * streams with CRLF or CR line ends, `data:` without its space and events
 * split across reads (gated on the deltas received, not on time), and
 * * keeps the server's own message from an error event (llama-server's
 * shapes, mnemo's), which bench reports as server_error. (`mnemo
 * disk-probe`, a tool of tools/, is tested in test_diskprobe.c.) */
#include "test_util.h"
#include "test_serve_util.h"

#include <math.h>
#include <stdbool.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/mem.h"
#include "bench/bench.h"
#include "bench/client.h"
#include "bench/loadgen.h"
#include "bench/report.h"
#include "bench/sse.h"
#include "bench/workload.h"

/* ---- a fake server: 500s and cut streams ------------------------------------------ */

/* FAKE_TIERS: a mnemo with RAM and disk tiers (usage split by tier, tier
 * I/O in /metrics); FAKE_PLAIN: another OpenAI server (usage with cached
 * tokens only, no /metrics). Both answer every turn with two deltas.
 * FAKE_SCRIPT streams the exact bytes of a FakeScript. */
typedef enum FakeMode { FAKE_500, FAKE_CUT, FAKE_NO_DONE, FAKE_TIERS, FAKE_PLAIN, FAKE_SCRIPT } FakeMode;

/* A chat stream's body, piece by piece: each piece is one read of the
 * response (one HTTP chunk), produced only once the client has had
 * gates[k] content deltas (fake_on_delta counts them), so a piece after a
 * gate reaches the client in a read of its own whatever the machine's
 * timing. The stream then ends cleanly, or without its last chunk when
 * is_cut (a broken connection). */
typedef struct FakeScript {
    const char *pieces[4];
    int gates[4];        /* all 0: no gates */
    int n_pieces;
    bool is_cut;
} FakeScript;

typedef struct Fake {
    struct MHD_Daemon *d;
    FakeMode mode;
    int port;
    atomic_int n_metrics; /* GET /metrics answered so far */
    const FakeScript *script;
    pthread_mutex_t mu;   /* guards n_deltas and is_stopping */
    pthread_cond_t cv;
    int n_deltas;         /* content deltas the client has had */
    bool is_stopping;     /* fake_stop: gates open */
} Fake;

typedef struct FakeStream {
    FakeMode mode;
    int step;
    Fake *f;
} FakeStream;

/* A ClientDeltaFn (ctx: the Fake) that opens the gates. */
static void fake_on_delta(void *ctx, const char *text, size_t len) {
    Fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->n_deltas++;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static void fake_wait_deltas(Fake *f, int n) {
    pthread_mutex_lock(&f->mu);
    while (f->n_deltas < n && !f->is_stopping) pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
}

static const char CHUNK[] = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi \"}}]}\n\n";
static const char USAGE_TIERS[] =
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":2,\"total_tokens\":102,"
    "\"prompt_tokens_details\":{\"cached_tokens\":70,\"cached_tokens_by_tier\":{\"disk\":20,\"pool\":40,\"ram\":10},"
    "\"recomputed_tokens\":30}}}\n\n";
static const char USAGE_PLAIN[] = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":2,"
                                  "\"prompt_tokens_details\":{\"cached_tokens\":50}}}\n\n";
static const char DONE[] = "data: [DONE]\n\n";

/* /metrics of FAKE_TIERS before the run and after it: over the run the
 * disk tier read 300 MB in 0.25 s (1200 MB/s); write and eviction series
 * and dropped blocks appear only after (they count from 0). */
static const char METRICS_BEFORE[] =
    "# HELP mnemo_cached_tokens_total Prompt tokens served from cache, by tier\n"
    "# TYPE mnemo_cached_tokens_total counter\n"
    "mnemo_cached_tokens_total{tier=\"pool\"} 100\n"
    "mnemo_recomputed_tokens_total 1000\n"
    "mnemo_tier_bytes_read_total{tier=\"disk\"} 100000000\n"
    "mnemo_tier_read_seconds_bucket{tier=\"disk\",le=\"0.001\"} 3\n"
    "mnemo_tier_read_seconds_bucket{tier=\"disk\",le=\"+Inf\"} 4\n"
    "mnemo_tier_read_seconds_sum{tier=\"disk\"} 0.5\n"
    "mnemo_tier_read_seconds_count{tier=\"disk\"} 4\n"
    "mnemo_tier_occupancy_bytes{tier=\"disk\"} 5000\n";
static const char METRICS_AFTER[] =
    "mnemo_cached_tokens_total{tier=\"pool\"} 180\n"
    "mnemo_cached_tokens_total{tier=\"ram\"} 30\n"
    "mnemo_cached_tokens_total{tier=\"disk\"} 60\n"
    "mnemo_recomputed_tokens_total 1090\n"
    "mnemo_tier_bytes_read_total{tier=\"disk\"} 400000000\n"
    "mnemo_tier_read_seconds_bucket{tier=\"disk\",le=\"0.001\"} 9\n"
    "mnemo_tier_read_seconds_sum{tier=\"disk\"} 0.75\n"
    "mnemo_tier_read_seconds_count{tier=\"disk\"} 10\n"
    "mnemo_tier_bytes_written_total{tier=\"disk\"} 2097152\n"
    "mnemo_tier_write_seconds_sum{tier=\"disk\"} 0.01\n"
    "mnemo_tier_occupancy_bytes{tier=\"disk\"} 7000\n"
    "mnemo_tier_evictions_total{tier=\"disk\"} 2\n"
    "mnemo_tier_checksum_failures_total{tier=\"disk\"} 0\n"
    "mnemo_tier_bytes_read_total{tier=\"ram\"} 5000000\n"
    "mnemo_dropped_blocks_total 3\n";

static ssize_t put_str(char *buf, size_t max, const char *s, size_t n) {
    if (max < n) return 0; /* libmicrohttpd asks again with room */
    memcpy(buf, s, n);
    return (ssize_t)n;
}

static ssize_t script_read(FakeStream *st, char *buf, size_t max) {
    const FakeScript *sc = st->f->script;
    if (st->step == sc->n_pieces) return sc->is_cut ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    fake_wait_deltas(st->f, sc->gates[st->step]);
    const char *piece = sc->pieces[st->step];
    ssize_t n = put_str(buf, max, piece, strlen(piece));
    if (n > 0) st->step++;
    return n;
}

static ssize_t fake_read(void *cls, uint64_t pos, char *buf, size_t max) {
    FakeStream *st = cls;
    if (st->mode == FAKE_SCRIPT) return script_read(st, buf, max);
    if (st->step < 2 && max >= sizeof CHUNK) {
        st->step++;
        memcpy(buf, CHUNK, sizeof CHUNK - 1);
        return (ssize_t)(sizeof CHUNK - 1);
    }
    if (st->mode == FAKE_TIERS || st->mode == FAKE_PLAIN) {
        if (st->step == 2) {
            const char *u = st->mode == FAKE_TIERS ? USAGE_TIERS : USAGE_PLAIN;
            ssize_t n = put_str(buf, max, u, strlen(u));
            if (n > 0) st->step++;
            return n;
        }
        if (st->step == 3) {
            ssize_t n = put_str(buf, max, DONE, sizeof DONE - 1);
            if (n > 0) st->step++;
            return n;
        }
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    return st->mode == FAKE_CUT ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
}

static void fake_free(void *cls) { free(cls); }

static enum MHD_Result fake_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                    const char *version, const char *upload, size_t *upload_size, void **state) {
    Fake *f = cls;
    if (*state == NULL) { /* first call: headers only */
        *state = f;
        return MHD_YES;
    }
    if (*upload_size > 0) { /* swallow the body */
        *upload_size = 0;
        return MHD_YES;
    }
    struct MHD_Response *r;
    unsigned status = 200;
    if (strcmp(url, "/metrics") == 0 && f->mode == FAKE_TIERS) {
        const char *m = atomic_fetch_add(&f->n_metrics, 1) == 0 ? METRICS_BEFORE : METRICS_AFTER;
        r = MHD_create_response_from_buffer(strlen(m), (void *)m, MHD_RESPMEM_PERSISTENT);
    } else if ((strcmp(url, "/v1/chat/completions") != 0 && !(f->mode == FAKE_SCRIPT && strcmp(url, "/v1/responses") == 0)) ||
               f->mode == FAKE_500) {
        static const char err[] = "{\"error\":{\"message\":\"fake failure\",\"type\":\"server_error\"}}";
        r = MHD_create_response_from_buffer(sizeof err - 1, (void *)err, MHD_RESPMEM_PERSISTENT);
        status = strcmp(url, "/v1/chat/completions") == 0 ? 500 : 404;
    } else {
        FakeStream *st = calloc(1, sizeof *st);
        st->mode = f->mode;
        st->f = f;
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, fake_read, st, fake_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
    }
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static void fake_start_with(Fake *f, FakeMode mode, const FakeScript *script) {
    f->mode = mode;
    atomic_init(&f->n_metrics, 0);
    f->script = script;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->n_deltas = 0;
    f->is_stopping = false;
    f->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL,
                            fake_handler, f, MHD_OPTION_END);
    assert_non_null(f->d);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(f->d, MHD_DAEMON_INFO_BIND_PORT);
    assert_non_null(info);
    f->port = info->port;
}

static void fake_start(Fake *f, FakeMode mode) { fake_start_with(f, mode, NULL); }

static void fake_stop(Fake *f) {
    pthread_mutex_lock(&f->mu); /* a stream waiting at a gate ends */
    f->is_stopping = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    MHD_stop_daemon(f->d);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
}

/* A loopback port with nothing listening. */
static int closed_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

/* ---- helpers -------------------------------------------------------------------------- */

static void small_config(BenchConfig *c, BenchWorkload w, int n_convs, int n_turns) {
    bench_config_init(c);
    c->workload = w;
    c->n_conversations = n_convs;
    c->n_turns = n_turns;
    c->question_tokens = 12;
    c->output_tokens = 4;
    c->rate = 0;
    c->think_mean_s = 0.01f;
    c->concurrency = 2;
    MnErr err = {0};
    assert_int_equal(bench_config_resolve(c, &err), MN_OK);
}

static BenchResults *run_plan_api(const BenchPlan *p, int port, int concurrency, bool keep_text, ClientApi api) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    BenchRunOpts o = {.url = url, .model = "test", .api = api, .temperature = 0, .concurrency = concurrency,
                      .connect_timeout_s = TEST_HANG_GUARD_S, .idle_timeout_s = TEST_HANG_GUARD_S,
                      .keep_text = keep_text};
    BenchResults *r = NULL;
    MnErr err = {0};
    int rc = bench_run(p, &o, &r, &err);
    if (rc) fail_msg("bench_run: %s", err.msg);
    return r;
}

static BenchResults *run_plan(const BenchPlan *p, int port, int concurrency, bool keep_text) {
    return run_plan_api(p, port, concurrency, keep_text, CLIENT_API_CHAT);
}

typedef struct Tokenizer {
    ChatClient *c;
} Tokenizer;

static int count_via_server(void *ctx, const char *text, long *n) {
    Tokenizer *t = ctx;
    json_t *req = json_pack("{s:s,s:b}", "content", text, "add_special", 0);
    char *body = json_dumps(req, 0), *resp = NULL;
    json_decref(req);
    int status = 0, rc = client_post(t->c, "/tokenize", body, &resp, &status);
    free(body);
    json_t *j = rc == MN_OK && status == 200 ? json_loads(resp, 0, NULL) : NULL;
    mn_free(resp);
    if (j == NULL) return MN_EIO;
    *n = (long)json_array_size(json_object_get(j, "tokens"));
    json_decref(j);
    return MN_OK;
}

/* Well-formedness of an XML document: one root, balanced tags, quoted
 * attributes, entities only of the XML set or numeric. Returns NULL or a
 * message. */
static const char *xml_check(const char *s) {
    const char *stack[64];
    size_t lens[64];
    int depth = 0, roots = 0;
    while (*s) {
        if (*s == '&') {
            const char *e = strchr(s, ';');
            if (e == NULL || e - s > 8) return "bad entity";
            if (!(strncmp(s, "&amp;", 5) == 0 || strncmp(s, "&lt;", 4) == 0 || strncmp(s, "&gt;", 4) == 0 ||
                  strncmp(s, "&quot;", 6) == 0 || strncmp(s, "&apos;", 6) == 0 || s[1] == '#'))
                return "unknown entity";
            s = e + 1;
            continue;
        }
        if (*s == '>') return "stray >";
        if (*s != '<') {
            if (depth == 0 && !(*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')) return "text outside the root";
            s++;
            continue;
        }
        if (strncmp(s, "<?", 2) == 0) {
            const char *e = strstr(s, "?>");
            if (e == NULL) return "unterminated <?";
            s = e + 2;
            continue;
        }
        if (strncmp(s, "<!--", 4) == 0) {
            const char *e = strstr(s, "-->");
            if (e == NULL) return "unterminated comment";
            s = e + 3;
            continue;
        }
        bool closing = s[1] == '/';
        const char *name = s + (closing ? 2 : 1);
        size_t n = strcspn(name, " \t\n/>");
        if (n == 0) return "empty tag name";
        const char *p = name + n;
        bool self = false;
        while (*p && *p != '>') { /* attributes */
            if (*p == '"' || *p == '\'') {
                const char *q = strchr(p + 1, *p);
                if (q == NULL) return "unterminated attribute";
                if (memchr(p + 1, '<', (size_t)(q - p - 1))) return "< in an attribute";
                p = q + 1;
                continue;
            }
            if (*p == '=' && p[1] != '"' && p[1] != '\'') return "unquoted attribute";
            if (*p == '/' && p[1] == '>') self = true;
            if (*p == '<') return "< inside a tag";
            p++;
        }
        if (*p != '>') return "unterminated tag";
        if (closing) {
            if (depth == 0 || lens[depth - 1] != n || strncmp(stack[depth - 1], name, n) != 0) return "mismatched tag";
            depth--;
        } else if (!self) {
            if (depth == 0 && roots++ > 0) return "two roots";
            if (depth == 64) return "too deep";
            stack[depth] = name;
            lens[depth++] = n;
        } else if (depth == 0) {
            return "self-closing root";
        }
        s = p + 1;
    }
    if (depth != 0) return "unclosed tags";
    return roots == 1 ? NULL : "no root";
}

/* CSV rows as arrays of fields (all strings malloc'd; the quoted error
 * field unquoted). */
typedef struct Csv {
    int n_rows;
    char *fields[512][11];
} Csv;

/* The last field of a row: empty, or quoted with quotes doubled. */
static char *csv_last(const char *p) {
    if (p[0] == '\0') return strdup("");
    assert_true(p[0] == '"');
    char *out = malloc(strlen(p)), *o = out;
    for (p++; !(p[0] == '"' && p[1] != '"'); p++) {
        assert_true(p[0] != '\0');
        if (p[0] == '"') p++; /* a doubled quote */
        *o++ = *p;
    }
    assert_true(p[1] == '\0');
    *o = '\0';
    return out;
}

static Csv *csv_read(const char *path) {
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    Csv *c = calloc(1, sizeof *c);
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    assert_string_equal(line, "conversation,turn,prompt_tokens,cached_tokens,output_tokens,request_bytes,ttft_s,tpot_s,"
                              "e2e_s,status,error");
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        assert_true(c->n_rows < 512);
        char *p = line;
        for (int k = 0; k < 10; k++) {
            size_t n = strcspn(p, ",");
            c->fields[c->n_rows][k] = strndup(p, n);
            assert_true(p[n] == ',');
            p += n + 1;
        }
        c->fields[c->n_rows][10] = csv_last(p);
        c->n_rows++;
    }
    free(text);
    return c;
}

static void csv_free(Csv *c) {
    for (int i = 0; i < c->n_rows; i++)
        for (int k = 0; k < 11; k++) free(c->fields[i][k]);
    free(c);
}

static double json_num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (json_is_null(v)) return NAN;
    assert_true(json_is_number(v));
    return json_number_value(v);
}

static void assert_close(double a, double b, double tol) {
    if (isnan(a) && isnan(b)) return;
    if (!(fabs(a - b) <= tol)) fail_msg("%.9g != %.9g", a, b);
}

/* The report in dir agrees with the summary s and the results r. */
static void check_report(const char *dir, const BenchSummary *s, const BenchResults *r) {
    char path[256];
    snprintf(path, sizeof path, "%s/requests.csv", dir);
    Csv *csv = csv_read(path);
    assert_int_equal(csv->n_rows, s->requests);
    long failures = 0, prompt = 0, cached = 0, out = 0, request_bytes = 0;
    double ttft[512], ttft_ret[512];
    long n_ttft = 0, n_ret = 0;
    for (int i = 0; i < csv->n_rows; i++) {
        char **f = csv->fields[i];
        bool ok = strcmp(f[9], "ok") == 0;
        failures += !ok;
        assert_string_equal(f[10], r->records[i].error); /* rows in record order */
        assert_int_equal(atol(f[5]), r->records[i].request_bytes);
        request_bytes += atol(f[5]);
        if (!ok) continue;
        if (f[2][0] && f[3][0]) {
            prompt += atol(f[2]);
            cached += atol(f[3]);
        }
        out += atol(f[4]);
        if (f[6][0]) {
            ttft[n_ttft++] = atof(f[6]);
            if (atoi(f[1]) > 1) ttft_ret[n_ret++] = atof(f[6]);
        }
    }
    assert_int_equal(failures, s->failures);
    assert_int_equal(out, s->output_tokens);
    assert_int_equal(request_bytes, s->request_bytes);
    csv_free(csv);
    /* percentiles of the CSV column (6 decimals) equal the summary's */
    for (long i = 1; i < n_ttft; i++) /* insertion sort: tiny arrays */
        for (long k = i; k > 0 && ttft[k - 1] > ttft[k]; k--) {
            double t = ttft[k];
            ttft[k] = ttft[k - 1];
            ttft[k - 1] = t;
        }
    for (long i = 1; i < n_ret; i++)
        for (long k = i; k > 0 && ttft_ret[k - 1] > ttft_ret[k]; k--) {
            double t = ttft_ret[k];
            ttft_ret[k] = ttft_ret[k - 1];
            ttft_ret[k - 1] = t;
        }
    if (n_ttft > 0) {
        assert_close(bench_percentile(ttft, n_ttft, 50), s->ttft.p50, 1e-6);
        assert_close(bench_percentile(ttft, n_ttft, 90), s->ttft.p90, 1e-6);
        assert_close(bench_percentile(ttft, n_ttft, 99), s->ttft.p99, 1e-6);
    } else {
        assert_true(isnan(s->ttft.p50));
    }
    if (n_ret > 0) assert_close(bench_percentile(ttft_ret, n_ret, 50), s->ttft_returning.p50, 1e-6);
    if (prompt > 0) assert_close((double)cached / (double)prompt, s->cached_fraction, 1e-9);

    snprintf(path, sizeof path, "%s/summary.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (j == NULL) fail_msg("summary.json: %s", je.text);
    assert_int_equal(json_integer_value(json_object_get(j, "requests")), s->requests);
    assert_int_equal(json_integer_value(json_object_get(j, "failures")), s->failures);
    assert_close(json_num(j, "ttft_p50_s"), s->ttft.p50, 1e-8);
    assert_close(json_num(j, "ttft_p90_s"), s->ttft.p90, 1e-8);
    assert_close(json_num(j, "ttft_p99_s"), s->ttft.p99, 1e-8);
    assert_close(json_num(j, "ttft_returning_p50_s"), s->ttft_returning.p50, 1e-8);
    assert_close(json_num(j, "tpot_p50_s"), s->tpot.p50, 1e-8);
    assert_close(json_num(j, "throughput_rps"), s->throughput_rps, 1e-6 * (1 + s->throughput_rps));
    assert_close(json_num(j, "output_tps"), s->output_tps, 1e-6 * (1 + s->output_tps));
    assert_close(json_num(j, "cached_fraction"), s->cached_fraction, 1e-8);
    assert_int_equal(json_integer_value(json_object_get(j, "skipped")), r->n_skipped);
    assert_int_equal(json_integer_value(json_object_get(j, "request_bytes")), s->request_bytes);
    assert_close(json_num(j, "request_bytes_p50"), s->req_bytes.p50, 1e-8);
    assert_close(json_num(j, "request_bytes_returning_p50"), s->req_bytes_returning.p50, 1e-8);
    json_decref(j);

    snprintf(path, sizeof path, "%s/report.svg", dir);
    char *svg = test_read_file(path, NULL);
    assert_non_null(svg);
    const char *why = xml_check(svg);
    if (why) fail_msg("report.svg is not well-formed XML: %s", why);
    assert_non_null(strstr(svg, "<svg"));
    assert_non_null(strstr(svg, "TTFT by turn"));
    assert_non_null(strstr(svg, "TTFT distribution"));
    free(svg);
}

static long sum_turns(const BenchPlan *p) {
    long n = 0;
    for (int i = 0; i < p->n_convs; i++) n += p->convs[i].n_turns;
    return n;
}

/* ---- plans ------------------------------------------------------------------------------ */

static void test_percentile(void **state) {
    double v[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    assert_true(bench_percentile(v, 10, 50) == 5);
    assert_true(bench_percentile(v, 10, 90) == 9);
    assert_true(bench_percentile(v, 10, 99) == 10);
    assert_true(bench_percentile(v, 10, 100) == 10);
    assert_true(bench_percentile(v, 1, 50) == 1);
    assert_true(bench_percentile(v, 2, 50) == 1);
    assert_true(isnan(bench_percentile(v, 0, 50)));
}

static void test_metrics_parse(void **state) {
    BenchMetrics m;
    bench_metrics_parse("# HELP x\nmnemo_requests_total{status=\"200\"} 3\n"
                        "mnemo_cached_tokens_total{tier=\"pool\"} 120\nmnemo_cached_tokens_total{tier=\"disk\"} 7\n"
                        "mnemo_recomputed_tokens_total 55\n",
                        &m);
    assert_true(m.is_valid);
    assert_int_equal(m.n_tiers, 2);
    assert_string_equal(m.tier[0], "pool");
    assert_true(m.cached[0] == 120 && m.cached[1] == 7 && m.recomputed == 55);
    bench_metrics_parse("some_other_metric 1\n", &m);
    assert_false(m.is_valid);
    assert_int_equal(m.n_tiers, 0);

    /* tier I/O: labels in any order, escapes, histogram buckets ignored */
    BenchMetrics a, b, d;
    bench_metrics_parse("mnemo_tier_bytes_read_total{kind=\"x\\\"}\",tier=\"disk\"} 1e6\n"
                        "mnemo_tier_read_seconds_bucket{tier=\"disk\",le=\"0.5\"} 99\n"
                        "mnemo_tier_read_seconds_sum{tier=\"disk\"} 0.5\n"
                        "mnemo_tier_occupancy_bytes{tier=\"ram\"} 10\n"
                        "mnemo_tier_bytes_read_total 5\n" /* no tier label: not used */
                        "mnemo_tier_evictions_total{tier=\"disk\"} garbage\n"
                        "mnemo_recomputed_tokens_total 7\n",
                        &a);
    assert_true(a.is_valid);
    assert_int_equal(a.n_tiers, 2);
    assert_string_equal(a.tier[0], "disk");
    assert_string_equal(a.tier[1], "ram");
    assert_false(a.has_cached[0]);
    assert_int_equal(a.has_io[0], 1u << BENCH_IO_BYTES_READ | 1u << BENCH_IO_READ_S);
    assert_true(a.io[0][BENCH_IO_BYTES_READ] == 1e6 && a.io[0][BENCH_IO_READ_S] == 0.5);
    assert_int_equal(a.has_io[1], 1u << BENCH_IO_OCCUPANCY);
    assert_false(a.has_dropped);
    assert_true(fabs(bench_tier_read_mbps(&a, 0) - 2.0) < 1e-12); /* 1e6 bytes in 0.5 s */
    assert_true(isnan(bench_tier_read_mbps(&a, 1)));                /* ram: no read series */
    assert_true(isnan(bench_tier_read_mbps(&a, 5)));
    bench_metrics_parse("mnemo_tier_bytes_read_total{tier=\"disk\"} 3e6\n"
                        "mnemo_tier_read_seconds_sum{tier=\"disk\"} 1.5\n"
                        "mnemo_tier_occupancy_bytes{tier=\"ram\"} 4\n"
                        "mnemo_tier_bytes_written_total{tier=\"ram\"} 8\n"
                        "mnemo_dropped_blocks_total 2\n"
                        "mnemo_recomputed_tokens_total 10\n",
                        &b);
    bench_metrics_delta(&a, &b, &d);
    assert_true(d.is_valid);
    assert_true(d.io[0][BENCH_IO_BYTES_READ] == 2e6 && d.io[0][BENCH_IO_READ_S] == 1.0);
    assert_true(fabs(bench_tier_read_mbps(&d, 0) - 2.0) < 1e-12);
    assert_true(d.io[1][BENCH_IO_OCCUPANCY] == 4);     /* a gauge: the value after */
    assert_true(d.io[1][BENCH_IO_BYTES_WRITTEN] == 8); /* new series: from 0 */
    assert_true(d.has_dropped && d.dropped_blocks == 2 && d.recomputed == 3);
    bench_metrics_parse("mnemo_tier_read_seconds_sum{tier=\"disk\"} 0.5\n", &b); /* no reads over the run */
    bench_metrics_delta(&a, &b, &d);
    assert_true(isnan(bench_tier_read_mbps(&d, 0)));
    bench_metrics_parse("other 1\n", &b);
    bench_metrics_delta(&a, &b, &d);
    assert_false(d.is_valid);
}

/* The /metrics fallback of the tier split: no answer carried usage details. */
static void test_tiers_from_metrics(void **state) {
    BenchRecord rec = {.status = BENCH_OK, .prompt_tokens = 100, .cached_tokens = -1, .recomputed_tokens = -1,
                       .output_tokens = 2, .ttft_s = 0.1, .tpot_s = 0.1, .e2e_s = 0.2, .end_s = 1};
    BenchResults r = {.n_records = 1, .records = &rec, .n_planned = 1, .wall_s = 1};
    bench_metrics_parse("mnemo_cached_tokens_total{tier=\"disk\"} 25\nmnemo_cached_tokens_total{tier=\"pool\"} 50\n"
                        "mnemo_recomputed_tokens_total 25\nmnemo_tier_bytes_read_total{tier=\"ram\"} 1\n",
                        &r.delta);
    BenchSummary s;
    assert_int_equal(bench_summarize(&r, &s), MN_OK);
    assert_string_equal(s.tier_source, "metrics");
    assert_int_equal(s.n_tiers, 2); /* ram has I/O but no cached series */
    assert_string_equal(s.tier[0], "pool");
    assert_string_equal(s.tier[1], "disk");
    assert_true(fabs(s.tier_hit_rate[0] - 0.5) < 1e-12 && fabs(s.tier_hit_rate[1] - 0.25) < 1e-12);
    assert_int_equal(s.recomputed_tokens, 25);
    assert_true(isnan(s.disk_restore_mbps));
    rec.cached_by_tier = (ClientTierTokens){.n = 1, .name = {"pool"}, .tokens = {60}}; /* usage wins */
    rec.recomputed_tokens = 40;
    assert_int_equal(bench_summarize(&r, &s), MN_OK);
    assert_string_equal(s.tier_source, "usage");
    assert_int_equal(s.n_tiers, 1);
    assert_true(fabs(s.tier_hit_rate[0] - 0.6) < 1e-12);
    assert_int_equal(s.recomputed_tokens, 40);
    memset(&r.delta, 0, sizeof r.delta); /* neither */
    rec.cached_by_tier.n = 0;
    rec.recomputed_tokens = -1;
    assert_int_equal(bench_summarize(&r, &s), MN_OK);
    assert_string_equal(s.tier_source, "none");
    assert_int_equal(s.n_tiers, 0);
    assert_int_equal(s.recomputed_tokens, -1);
}

static void test_config_resolve(void **state) {
    BenchConfig c;
    MnErr err = {0};
    bench_config_init(&c);
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK); /* sharegpt-synth defaults */
    assert_true(fabsf(c.question_tokens - 37.8f) < 1e-4f && fabsf(c.output_tokens - 204.6f) < 1e-3f);
    assert_false(c.is_output_fixed);
    bench_config_init(&c);
    c.scale = 0.5f;
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
    assert_true(fabsf(c.output_tokens - 102.3f) < 1e-3f);
    bench_config_init(&c);
    c.workload = BENCH_MULTIROUND_QA;
    c.rate = 2;
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
    assert_true(c.is_think_fixed && c.think_mean_s == 4.0f); /* 8 users / 2 qps */
    bench_config_init(&c);
    c.rate = -3; /* "unset" is any negative: the default */
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
    bench_config_init(&c);
    c.concurrency = 0;
    assert_int_equal(bench_config_resolve(&c, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "--concurrency"));
    bench_config_init(&c);
    c.workload = BENCH_MULTITURN;
    c.n_turns = 0;
    assert_int_equal(bench_config_resolve(&c, &err), MN_EINVAL);
    BenchWorkload w;
    assert_int_equal(bench_workload_parse("multiround-qa", &w), MN_OK);
    assert_int_equal(w, BENCH_MULTIROUND_QA);
    assert_int_equal(bench_workload_parse("nope", &w), MN_EINVAL);
}

static void test_plan_reproducible(void **state) {
    for (int w = 0; w < BENCH_WORKLOAD__COUNT; w++) {
        BenchConfig c;
        bench_config_init(&c);
        c.workload = (BenchWorkload)w;
        c.scale = 0.1f;
        c.n_conversations = 12;
        MnErr err = {0};
        assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
        BenchPlan *a, *b, *d, *bigger;
        assert_int_equal(bench_plan_new(&c, NULL, NULL, &a, &err), MN_OK);
        assert_int_equal(bench_plan_new(&c, NULL, NULL, &b, &err), MN_OK);
        assert_true(bench_plan_equal(a, b)); /* same flags: same conversations and schedule */
        assert_int_equal(a->n_requests, sum_turns(a));
        c.seed = 2;
        assert_int_equal(bench_plan_new(&c, NULL, NULL, &d, &err), MN_OK);
        assert_false(bench_plan_equal(a, d));
        c.seed = 1;
        c.n_conversations = 20; /* conversation i does not depend on how many there are */
        assert_int_equal(bench_plan_new(&c, NULL, NULL, &bigger, &err), MN_OK);
        for (int i = 0; i < a->n_convs; i++) {
            assert_int_equal(a->convs[i].n_turns, bigger->convs[i].n_turns);
            assert_string_equal(a->convs[i].turns[0].user, bigger->convs[i].turns[0].user);
            assert_true(a->convs[i].start_s == bigger->convs[i].start_s);
        }
        for (int i = 1; i < a->n_convs; i++) assert_true(a->convs[i].start_s >= a->convs[i - 1].start_s);
        if (w == BENCH_MULTIROUND_QA) { /* evenly staggered; fixed pause users / rate; shared system prompt */
            assert_true(fabs(a->convs[3].start_s - 3.0) < 1e-9);
            assert_true(fabs(a->convs[0].turns[1].think_s - 12.0) < 1e-6);
            assert_string_equal(a->convs[0].system, a->convs[5].system);
            assert_true(strlen(a->convs[0].turns[0].user) > strlen(a->convs[0].turns[1].user)); /* history */
        }
        if (w == BENCH_MULTITURN) {
            assert_null(a->convs[0].system);
            for (int i = 0; i < a->n_convs; i++) assert_int_equal(a->convs[i].n_turns, 5);
            assert_int_equal(a->convs[0].turns[2].output_tokens, 6); /* 64 x 0.1 */
        }
        bench_plan_free(a);
        bench_plan_free(b);
        bench_plan_free(d);
        bench_plan_free(bigger);
    }
}

/* --past-context K keeps K turns after the one --max-context would end a
 * conversation at; it needs --max-context. */
static void test_plan_past_context(void **state) {
    BenchConfig c;
    MnErr err = {0};
    bench_config_init(&c);
    c.workload = BENCH_MULTITURN;
    c.n_conversations = 2;
    c.n_turns = 100;
    c.question_tokens = 100;
    c.output_tokens = 16;
    c.max_context = 1000;
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
    BenchPlan *cut, *past;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &cut, &err), MN_OK);
    c.past_context = 3;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &past, &err), MN_OK);
    for (int i = 0; i < cut->n_convs; i++) {
        assert_true(cut->convs[i].n_turns > 1 && cut->convs[i].n_turns < 100);
        assert_int_equal(past->convs[i].n_turns, cut->convs[i].n_turns + 3);
    }
    assert_int_equal(past->n_requests, sum_turns(past));
    bench_plan_free(cut);
    bench_plan_free(past);
    bench_config_init(&c);
    c.past_context = 2;
    assert_int_equal(bench_config_resolve(&c, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "--past-context needs --max-context"));
}

/* Turns whose usage reported truncated tokens make the overflow TTFT; the
 * shifted tokens add up. */
static void test_summary_overflow(void **state) {
    BenchRecord recs[3] = {{.turn = 0, .status = BENCH_OK, .ttft_s = 0.1, .truncated_tokens = 0, .shifted_tokens = 0},
                           {.turn = 5, .status = BENCH_OK, .ttft_s = 0.5, .truncated_tokens = 40, .shifted_tokens = 300},
                           {.turn = 6, .status = BENCH_OK, .ttft_s = 0.7, .truncated_tokens = 80, .shifted_tokens = 250}};
    for (int i = 0; i < 3; i++) recs[i].prompt_tokens = recs[i].cached_tokens = recs[i].recomputed_tokens = -1;
    BenchResults r = {.n_records = 3, .records = recs, .n_planned = 3, .wall_s = 1};
    BenchSummary s;
    assert_int_equal(bench_summarize(&r, &s), MN_OK);
    assert_int_equal(s.ttft_overflow.n, 2);
    assert_true(fabs(s.ttft_overflow.mean - 0.6) < 1e-9);
    assert_int_equal(s.shifted_tokens, 550);
    recs[1].truncated_tokens = recs[2].truncated_tokens = -1; /* a server that does not say */
    recs[0].shifted_tokens = recs[1].shifted_tokens = recs[2].shifted_tokens = -1;
    assert_int_equal(bench_summarize(&r, &s), MN_OK);
    assert_int_equal(s.ttft_overflow.n, 0);
    assert_int_equal(s.shifted_tokens, -1);
}

static void test_sharegpt_synth_stats(void **state) {
    BenchConfig c;
    bench_config_init(&c);
    c.n_conversations = 3000;
    c.scale = 0.05f;
    c.rate = 10;
    MnErr err = {0};
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
    BenchPlan *p;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    double turns = (double)p->n_requests / p->n_convs, out = 0, user = 0;
    for (int i = 0; i < p->n_convs; i++)
        for (int t = 0; t < p->convs[i].n_turns; t++) {
            out += p->convs[i].turns[t].output_tokens;
            user += p->convs[i].turns[t].user_tokens;
        }
    out /= (double)p->n_requests;
    user /= (double)p->n_requests;
    assert_true(turns > 5.2 && turns < 5.9);
    assert_true(out > 0.9 * 204.6 * 0.05 && out < 1.1 * 204.6 * 0.05);
    assert_true(user > 1.5 && user < 2.6); /* mean 1.89, but at least one token each */
    double last = p->convs[p->n_convs - 1].start_s; /* Poisson at 10/s: 3000 arrivals in about 300 s */
    assert_true(last > 270 && last < 330);
    bench_plan_free(p);
    c.n_turns = 2; /* a cap */
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    for (int i = 0; i < p->n_convs; i++) assert_true(p->convs[i].n_turns >= 1 && p->convs[i].n_turns <= 2);
    bench_plan_free(p);
}

static void test_sharegpt_file(void **state) {
    char path[] = "/tmp/mnemo-test-sharegpt-XXXXXX";
    int fd = mkstemp(path);
    static const char doc[] =
        "[{\"id\":\"a\",\"conversations\":[{\"from\":\"human\",\"value\":\"Hello there\"},"
        "{\"from\":\"gpt\",\"value\":\"Hi! How can I help you today with anything at all?\"},"
        "{\"from\":\"human\",\"value\":\"Tell me a story\"},{\"from\":\"human\",\"value\":\"about a cat\"},"
        "{\"from\":\"gpt\",\"value\":\"Once upon a time\"}]},"
        "{\"id\":\"b\",\"conversations\":[{\"from\":\"gpt\",\"value\":\"only a bot\"}]},"
        "{\"id\":\"c\",\"conversations\":[{\"from\":\"system\",\"value\":\"Be brief.\"},"
        "{\"from\":\"human\",\"value\":\"Why?\"}]}]";
    assert_true(write(fd, doc, sizeof doc - 1) == (ssize_t)(sizeof doc - 1));
    close(fd);
    BenchConfig c;
    bench_config_init(&c);
    c.sharegpt_path = path;
    MnErr err = {0};
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
    BenchPlan *p;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    assert_int_equal(p->n_convs, 2); /* "b" has no human turn */
    bool seen_a = false, seen_c = false;
    for (int i = 0; i < p->n_convs; i++) {
        BenchConv *cv = &p->convs[i];
        if (strcmp(cv->turns[0].user, "Hello there") == 0) {
            seen_a = true;
            assert_int_equal(cv->n_turns, 2);
            assert_string_equal(cv->turns[1].user, "Tell me a story\nabout a cat");
            assert_null(cv->system);
            assert_int_equal(cv->turns[0].output_tokens, 13); /* 52 chars x 0.25 */
        } else {
            seen_c = true;
            assert_string_equal(cv->turns[0].user, "Why?");
            assert_string_equal(cv->system, "Be brief.");
            assert_int_equal(cv->turns[0].output_tokens, 205); /* no reply recorded: the default */
        }
    }
    assert_true(seen_a && seen_c);
    bench_plan_free(p);
    bench_config_init(&c); /* --output-tokens fixes every reply */
    c.sharegpt_path = path;
    c.output_tokens = 7;
    c.n_conversations = 1;
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    assert_int_equal(p->n_convs, 1);
    assert_int_equal(p->convs[0].turns[0].output_tokens, 7);
    bench_plan_free(p);
    /* broken files name the problem */
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(write(fd, "[{\"conversations\": [", 20) == 20);
    close(fd);
    bench_config_init(&c);
    c.sharegpt_path = path;
    assert_int_equal(bench_config_resolve(&c, &err), MN_OK);
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_EFORMAT);
    assert_non_null(strstr(err.msg, path));
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(write(fd, "{\"a\": 1}", 8) == 8);
    close(fd);
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_EFORMAT);
    unlink(path);
    c.sharegpt_path = "/nonexistent/file.json";
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_EFORMAT);
}

/* ---- against mnemo serve ------------------------------------------------------------------ */

static int stop_server(void **state) { /* teardown: also after a failed assertion */
    Srv *s = *state;
    if (s && s->pid > 0) srv_stop(s);
    free(s);
    return 0;
}

/* `mnemo bench ARGV` (writing to out_dir) succeeds with n_requests
 * requests, none failed; its summary.json (the caller decrefs). */
static json_t *run_command(int argc, char **argv, const char *out_dir, long n_requests) {
    assert_int_equal(bench_main(argc, argv), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/summary.json", out_dir);
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "requests")), n_requests);
    assert_int_equal(json_integer_value(json_object_get(j, "failures")), 0);
    return j;
}

static void test_real_server(void **state) {
    Srv *s = calloc(1, sizeof *s);
    *state = s;
    if (srv_start(s, "stories260K", "") != 0) return;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s->port);
    ChatClient *tc;
    assert_int_equal(client_new(url, NULL, &tc), MN_OK);
    Tokenizer tok = {tc};

    BenchConfig c;
    small_config(&c, BENCH_MULTITURN, 4, 3);
    c.system_tokens = 6;
    MnErr err = {0};
    BenchPlan *p, *p2;
    assert_int_equal(bench_plan_new(&c, count_via_server, &tok, &p, &err), MN_OK);
    assert_true(p->is_measured);
    assert_int_equal(bench_plan_new(&c, count_via_server, &tok, &p2, &err), MN_OK);
    assert_true(bench_plan_equal(p, p2)); /* reproducible with the server's tokenizer too */
    bench_plan_free(p2);

    BenchResults *r = run_plan(p, s->port, 2, true);
    long n_gaps = 0;
    /* counts */
    assert_int_equal(r->n_records, sum_turns(p));
    assert_int_equal(r->n_records, p->n_requests);
    assert_int_equal(r->n_skipped, 0);
    assert_int_equal(r->n_convs_started, p->n_convs);
    for (long i = 0; i < r->n_records; i++) {
        const BenchRecord *x = &r->records[i];
        if (x->status != BENCH_OK) fail_msg("request %ld failed: %s", i, x->error);
        assert_int_equal(x->output_tokens, 4);
        assert_true(x->prompt_tokens > 0 && x->ttft_s >= 0 && x->ttft_s <= x->e2e_s);
        assert_true(x->tpot_s >= 0); /* gaps: a delta may carry several tokens, or none */
        n_gaps += x->n_gaps;
        /* mnemo's usage details: the tiers add up to the cached tokens, the rest is recomputed */
        assert_int_equal(x->recomputed_tokens, x->prompt_tokens - x->cached_tokens);
        assert_true(x->cached_by_tier.n >= 1);
        long by_tier = 0;
        for (int k = 0; k < x->cached_by_tier.n; k++) by_tier += x->cached_by_tier.tokens[k];
        assert_int_equal(by_tier, x->cached_tokens);
    }
    assert_true(n_gaps > 0);
    /* closed loops and history */
    for (int ci = 0; ci < p->n_convs; ci++) {
        const BenchRecord *turns[8] = {0};
        for (long i = 0; i < r->n_records; i++)
            if (r->records[i].conversation == ci) {
                int t = r->records[i].turn;
                assert_true(t >= 0 && t < p->convs[ci].n_turns);
                assert_null(turns[t]); /* each turn once */
                turns[t] = &r->records[i];
            }
        for (int t = 0; t < p->convs[ci].n_turns; t++) {
            assert_non_null(turns[t]);
            if (t > 0) { /* sent only after the previous reply arrived (plus think time) */
                assert_true(turns[t]->send_s >= turns[t - 1]->end_s);
                assert_true(turns[t]->ready_s >= turns[t - 1]->end_s);
            }
            assert_true(turns[t]->send_s >= turns[t]->ready_s - 1e-6);
            /* the history: system, then user/assistant pairs with the actual replies */
            json_t *msgs = json_loads(turns[t]->sent, 0, NULL);
            assert_non_null(msgs);
            assert_int_equal(json_array_size(msgs), 2 + 2 * (size_t)t);
            assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "role")), "system");
            assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "content")),
                                p->convs[ci].system);
            for (int k = 0; k <= t; k++) {
                json_t *u = json_array_get(msgs, 1 + 2 * (size_t)k);
                assert_string_equal(json_string_value(json_object_get(u, "role")), "user");
                assert_string_equal(json_string_value(json_object_get(u, "content")), p->convs[ci].turns[k].user);
                if (k < t) {
                    json_t *a = json_array_get(msgs, 2 + 2 * (size_t)k);
                    assert_string_equal(json_string_value(json_object_get(a, "role")), "assistant");
                    assert_string_equal(json_string_value(json_object_get(a, "content")), turns[k]->reply);
                }
            }
            json_decref(msgs);
            if (t > 0) assert_true(turns[t]->cached_tokens > 0); /* mnemo's prefix cache saw the history */
        }
    }
    /* the concurrency cap: at most 2 requests overlap */
    for (long i = 0; i < r->n_records; i++) {
        int overlap = 0;
        double t = r->records[i].send_s + 1e-9;
        for (long k = 0; k < r->n_records; k++)
            if (r->records[k].send_s <= t && t < r->records[k].end_s) overlap++;
        assert_true(overlap <= 2);
    }
    assert_true(r->delta.is_valid); /* scraped /metrics */
    assert_true(r->delta.n_tiers >= 1 && r->delta.cached[0] > 0);

    BenchSummary sum;
    assert_int_equal(bench_summarize(r, &sum), MN_OK);
    assert_int_equal(sum.requests, p->n_requests);
    assert_int_equal(sum.failures, 0);
    assert_int_equal(sum.ttft_first.n, p->n_convs);
    assert_int_equal(sum.ttft_returning.n, p->n_requests - p->n_convs);
    assert_true(sum.cached_fraction > 0 && sum.cached_fraction < 1 && strcmp(sum.cached_source, "usage") == 0);
    assert_string_equal(sum.tier_source, "usage");
    assert_true(sum.n_tiers >= 1 && strcmp(sum.tier[0], "pool") == 0 && sum.tier_hit_rate[0] > 0);
    assert_int_equal(sum.recomputed_tokens, sum.prompt_tokens - sum.cached_tokens);
    assert_true(sum.throughput_rps > 0 && sum.output_tps > 0);
    char *dir = test_tmpdir_new("bench-out");
    BenchInfo info = {"multiturn", url, "test", c.seed, p->n_convs, p->tokens_per_word, p->is_measured, "chat"};
    assert_int_equal(bench_write_report(dir, &sum, r, &info, &err), MN_OK);
    check_report(dir, &sum, r);
    test_tmpdir_free(dir);
    bench_results_free(r);
    bench_plan_free(p);

    /* the command itself, end to end */
    dir = test_tmpdir_new("bench-out");
    char out_arg[96];
    snprintf(out_arg, sizeof out_arg, "%s/sub", dir);
    char *argv[] = {"--url", url, "--workload", "multiround-qa", "--conversations", "2", "--turns", "2",
                    "--system-tokens", "8", "--history-tokens", "10", "--question-tokens", "6", "--output-tokens",
                    "3", "--rate", "0", "--think-mean", "0", "--quiet", "--out", out_arg};
    json_t *j = run_command((int)(sizeof argv / sizeof argv[0]), argv, out_arg, 4);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "stories260K.gguf");
    assert_true(json_is_object(json_object_get(j, "server_metrics")));
    json_decref(j);
    test_rm_dir(out_arg);
    test_tmpdir_free(dir);
    client_free(tc);
}

/* The record of (conversation, turn) in r; the test fails when there is none. */
static const BenchRecord *record_of(const BenchResults *r, int conv, int turn) {
    for (long i = 0; i < r->n_records; i++)
        if (r->records[i].conversation == conv && r->records[i].turn == turn) return &r->records[i];
    fail_msg("no record of conversation %d turn %d", conv, turn);
    return NULL;
}

/* The same plan through chat completions and through the Responses API:
 * every request answered in both, the same prompts and (greedy) replies,
 * and from turn 2 on the Responses API sends only the new user message
 * after the previous response's id: fewer request bytes than chat's
 * history for the same turn, whatever the machine's speed. */
static void test_real_server_responses(void **state) {
    Srv *s = calloc(1, sizeof *s);
    *state = s;
    if (srv_start(s, "stories260K", "") != 0) return;
    BenchConfig c;
    small_config(&c, BENCH_MULTITURN, 3, 3);
    c.system_tokens = 6;
    MnErr err = {0};
    BenchPlan *p;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    BenchResults *chat = run_plan_api(p, s->port, 2, true, CLIENT_API_CHAT);
    BenchResults *resp = run_plan_api(p, s->port, 2, true, CLIENT_API_RESPONSES);
    assert_int_equal(chat->n_records, p->n_requests);
    assert_int_equal(resp->n_records, p->n_requests);
    for (int ci = 0; ci < p->n_convs; ci++)
        for (int t = 0; t < p->convs[ci].n_turns; t++) {
            const BenchRecord *a = record_of(chat, ci, t), *b = record_of(resp, ci, t);
            if (a->status != BENCH_OK || b->status != BENCH_OK)
                fail_msg("conversation %d turn %d: chat '%s', responses '%s'", ci, t, a->error, b->error);
            assert_int_equal(b->output_tokens, 4); /* ignore_eos holds through the Responses API too */
            assert_int_equal(b->prompt_tokens, a->prompt_tokens); /* the server rebuilt the same prompt */
            assert_string_equal(b->reply, a->reply);
            assert_true(a->request_bytes > 0 && b->request_bytes > 0);
            /* what went out: the new user message alone (the system prompt goes as instructions) */
            json_t *sent = json_loads(b->sent, 0, NULL);
            assert_non_null(sent);
            assert_int_equal(json_array_size(sent), 1);
            assert_string_equal(json_string_value(json_object_get(json_array_get(sent, 0), "content")),
                                p->convs[ci].turns[t].user);
            json_decref(sent);
            if (t > 0) {
                assert_true(b->request_bytes < a->request_bytes);
                assert_true(b->cached_tokens > 0); /* the stored chain's KV was found */
            }
        }
    BenchSummary sa, sb;
    assert_int_equal(bench_summarize(chat, &sa), MN_OK);
    assert_int_equal(bench_summarize(resp, &sb), MN_OK);
    assert_int_equal(sa.requests - sa.failures, sb.requests - sb.failures);
    assert_true(sb.req_bytes_returning.p50 < sa.req_bytes_returning.p50);
    assert_true(sb.request_bytes < sa.request_bytes);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    BenchInfo info = {"multiturn", "x", "test", 1, 3, 1.3, false, "responses"};
    bench_print_summary(f, &sb, resp, &info);
    fclose(f);
    char want[160];
    snprintf(want, sizeof want, "request bytes: %ld total;", sb.request_bytes);
    if (!strstr(text, want) || !strstr(text, "api responses)")) fail_msg("%s", text);
    free(text);
    bench_results_free(chat);
    bench_results_free(resp);
    bench_plan_free(p);

    /* the command: --api responses, named in summary.json */
    char *dir = test_tmpdir_new("bench-out"), url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s->port);
    char *argv[] = {"--url", url, "--api", "responses", "--workload", "multiturn", "--conversations", "2", "--turns",
                    "2", "--question-tokens", "6", "--output-tokens", "3", "--rate", "0", "--think-mean", "0",
                    "--quiet", "--out", dir};
    json_t *j = run_command((int)(sizeof argv / sizeof argv[0]), argv, dir, 4);
    assert_string_equal(json_string_value(json_object_get(j, "api")), "responses");
    assert_true(json_integer_value(json_object_get(j, "request_bytes")) > 0);
    json_decref(j);
    char *bad[] = {"--url", url, "--api", "stateful"};
    assert_int_equal(bench_main(4, bad), 2);
    test_tmpdir_free(dir);
}

/* ---- failures ------------------------------------------------------------------------------- */

/* Run 3 conversations x 2 turns against port; every first turn fails with
 * `expect` (and the message expect_error, when not NULL), second turns are
 * skipped; the report is written and consistent. */
static void run_failing(int port, BenchStatus expect, const char *expect_status, const char *expect_error) {
    BenchConfig c;
    small_config(&c, BENCH_MULTITURN, 3, 2);
    MnErr err = {0};
    BenchPlan *p;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    BenchResults *r = run_plan(p, port, 2, false);
    assert_int_equal(r->n_records, 3);
    assert_int_equal(r->n_skipped, 3);
    for (long i = 0; i < r->n_records; i++) {
        char name[32];
        assert_int_equal(r->records[i].turn, 0);
        assert_int_equal(r->records[i].status, expect);
        assert_string_equal(bench_status_name(&r->records[i], name, sizeof name), expect_status);
        assert_true(r->records[i].error[0] != '\0');
        if (expect_error) assert_string_equal(r->records[i].error, expect_error);
    }
    BenchSummary s;
    assert_int_equal(bench_summarize(r, &s), MN_OK);
    assert_int_equal(s.requests, 3);
    assert_int_equal(s.failures, 3);
    assert_int_equal(s.skipped, 3);
    assert_true(isnan(s.ttft.p50));
    assert_true(s.n_errors >= 1 && s.errors[0].n >= 1);
    if (expect_error && strpbrk(expect_error, "0123456789") == NULL) { /* no digits to normalize */
        char want[192];
        snprintf(want, sizeof want, "%s: %s", expect_status, expect_error);
        assert_string_equal(s.errors[0].msg, want);
    }
    FILE *devnull = fopen("/dev/null", "w");
    BenchInfo info = {"multiturn", "x", "test", 1, 3, 1.3, false, "chat"};
    bench_print_summary(devnull, &s, r, &info);
    fclose(devnull);
    char *dir = test_tmpdir_new("bench-out");
    assert_int_equal(bench_write_report(dir, &s, r, &info, &err), MN_OK);
    check_report(dir, &s, r);
    char path[160];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    assert_true(json_is_null(json_object_get(j, "ttft_p50_s")));
    assert_int_equal(json_array_size(json_object_get(j, "errors")), (size_t)s.n_errors);
    json_decref(j);
    test_tmpdir_free(dir);
    bench_results_free(r);
    bench_plan_free(p);
}

static void test_connection_refused(void **state) { run_failing(closed_port(), BENCH_CONNECT_ERROR, "connect_error", NULL); }

static void test_http_500(void **state) {
    Fake f;
    fake_start(&f, FAKE_500);
    run_failing(f.port, BENCH_HTTP_ERROR, "http_500", "HTTP 500: fake failure");
    fake_stop(&f);
}

static void test_stream_cut(void **state) {
    Fake f;
    fake_start(&f, FAKE_CUT); /* the connection drops mid-stream */
    run_failing(f.port, BENCH_STREAM_ERROR, "stream_error", NULL);
    fake_stop(&f);
    fake_start(&f, FAKE_NO_DONE); /* a clean end without [DONE] */
    run_failing(f.port, BENCH_STREAM_ERROR, "stream_error", "the stream ended before [DONE]");
    fake_stop(&f);
}

/* ---- SSE shapes: the parser, and the client against each shape ------------------------ */

typedef struct SseLog {
    char text[512]; /* "type|data;" per event */
} SseLog;

static void sse_log_event(void *ctx, const char *type, const char *data, size_t len) {
    SseLog *l = ctx;
    assert_int_equal(strlen(data), len);
    size_t n = strlen(l->text);
    snprintf(l->text + n, sizeof l->text - n, "%s|%s;", type, data);
}

/* Parse stream cut in two at every byte, and one byte at a time: the
 * events are always `expect`. */
static void sse_expect(const char *stream, const char *expect) {
    size_t len = strlen(stream);
    for (size_t cut = 0; cut <= len + 1; cut++) { /* cut == len + 1: byte by byte */
        SseLog log = {{0}};
        SseParser p;
        sse_init(&p, sse_log_event, &log);
        if (cut <= len) {
            assert_int_equal(sse_feed(&p, stream, cut), MN_OK);
            assert_int_equal(sse_feed(&p, stream + cut, len - cut), MN_OK);
        } else {
            for (size_t i = 0; i < len; i++) assert_int_equal(sse_feed(&p, stream + i, 1), MN_OK);
        }
        assert_int_equal(sse_end(&p), MN_OK);
        sse_deinit(&p);
        if (strcmp(log.text, expect) != 0) fail_msg("cut at %zu of %zu: got\n%s\nwant\n%s", cut, len, log.text, expect);
    }
}

static void test_sse_parser(void **state) {
    /* LF, CRLF and CR endings; "data:" with and without its space; a
     * comment; typed events (`event: error`, llama-server's `error:` line);
     * data over two lines; fields that are ignored; an empty data field;
     * an unterminated last event */
    sse_expect("data: a\n\ndata:b\r\n\r\n: ping\n\nevent: error\ndata: {\"x\":1}\n\n"
               "error: {\"m\":2}\r\rdata: l1\ndata: l2\n\nid: 7\nretry: 5\n\ndata\n\ndata: [DONE]",
               "message|a;message|b;error|{\"x\":1};error|{\"m\":2};message|l1\nl2;message|;message|[DONE];");
    /* a byte-order mark; only one space after the colon is dropped; a
     * type does not outlive its event; a CR alone, then LF pairs */
    sse_expect("\xEF\xBB\xBF" "data:  two\n\nevent: x\ndata: y\n\ndata: z\r\n\r\ndata: w\r\r\n\n",
               "message| two;x|y;message|z;message|w;");
    /* events without data dispatch nothing, nor does a stream of comments */
    sse_expect(": keep-alive\n\nevent: ping\n\n\n\n", "");
}

#define SSE_A "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}"
#define SSE_B "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}"
#define SSE_USAGE "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}"
#define LLAMA_ERROR "{\"code\":500,\"message\":\"Context size has been exceeded.\",\"type\":\"server_error\"}"
/* the Responses API's events (mnemo's and OpenAI's shapes, cut short) */
#define RESP_CREATED "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}"
#define RESP_A "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}"
#define RESP_B "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}"
#define RESP_DONE                                                                                                    \
    "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":"   \
    "{\"input_tokens\":9,\"input_tokens_details\":{\"cached_tokens\":8},\"output_tokens\":2}}}"
#define RESP_ERROR "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"engine failed\"}"
#define RESP_FAILED                                                                                                  \
    "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"error\":"         \
    "{\"code\":\"server_error\",\"message\":\"out of memory\"}}}"

typedef struct StreamCase {
    const char *what;
    FakeScript script;
    int rc;                /* client_chat's */
    bool is_server_error;
    const char *error;     /* res.error */
    bool is_responses;     /* client_respond (else client_chat) */
} StreamCase;

static const StreamCase STREAM_CASES[] = {
    {"CRLF line ends", {{SSE_A "\r\n\r\n" SSE_B "\r\n\r\n" SSE_USAGE "\r\n\r\ndata: [DONE]\r\n\r\n"}, {0}, 1, false},
     MN_OK, false, "", false},
    {"CR line ends", {{SSE_A "\r\r" SSE_B "\r\r" SSE_USAGE "\r\rdata: [DONE]\r\r"}, {0}, 1, false}, MN_OK, false, "", false},
    {"data: without its space",
     {{"data:{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata:{\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n"
       "data:{\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\ndata:[DONE]\n\n"},
      {0}, 1, false},
     MN_OK, false, "", false},
    /* the second event cut in its JSON and between CR and LF; the second
     * piece is sent after the first delta came through */
    {"an event split across reads",
     {{SSE_A "\n\ndata: {\"choi", "ces\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\r",
       "\n\r\n: ping\n\n" SSE_USAGE "\n\ndata: [DONE]\n\n"},
      {0, 1, 1}, 3, false},
     MN_OK, false, "", false},
    /* llama-server: the error as a chunk, then the end without [DONE] */
    {"llama-server's error chunk", {{SSE_A "\n\n" SSE_B "\n\n", "data: {\"error\":" LLAMA_ERROR "}\n\n"}, {0}, 2, false},
     MN_EIO, true, "Context size has been exceeded.", false},
    {"llama-server's older error line", {{SSE_A "\n\n" SSE_B "\n\nerror: " LLAMA_ERROR "\n\n"}, {0}, 1, false}, MN_EIO,
     true, "Context size has been exceeded.", false},
    {"an error event",
     {{SSE_A "\n\n" SSE_B "\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"message\":\"Overloaded\"}}\n\n"},
      {0}, 1, false},
     MN_EIO, true, "Overloaded", false},
    {"an error string", {{SSE_A "\n\n" SSE_B "\n\ndata: {\"error\":\"model unloaded\"}\n\n"}, {0}, 1, false}, MN_EIO,
     true, "model unloaded", false},
    /* mnemo: the error chunk, then [DONE] */
    {"an error, then [DONE]",
     {{SSE_A "\n\n" SSE_B "\n\ndata: {\"error\":{\"message\":\"engine failed\"}}\n\ndata: [DONE]\n\n"}, {0}, 1, false},
     MN_EIO, true, "engine failed", false},
    /* the error survives the broken connection after it */
    {"an error, then a cut", {{SSE_A "\n\n" SSE_B "\n\ndata: {\"error\":" LLAMA_ERROR "}\n\n"}, {0}, 1, true}, MN_EIO,
     true, "Context size has been exceeded.", false},
    {"no [DONE], no error", {{SSE_A "\n\n" SSE_B "\n\n"}, {0}, 1, false}, MN_EIO, false,
     "the stream ended before [DONE]", false},
    {"responses: completed", {{RESP_CREATED "\n\n" RESP_A "\n\n" RESP_B "\n\n" RESP_DONE "\n\n"}, {0}, 1, false},
     MN_OK, false, "", true},
    {"responses: an error, then response.failed",
     {{RESP_CREATED "\n\n" RESP_A "\n\n" RESP_B "\n\n" RESP_ERROR "\n\n" RESP_FAILED "\n\n"}, {0}, 1, false}, MN_EIO,
     true, "engine failed", true},
    {"responses: response.failed alone",
     {{RESP_CREATED "\n\n" RESP_A "\n\n" RESP_B "\n\n" RESP_FAILED "\n\n"}, {0}, 1, false}, MN_EIO, true,
     "out of memory", true},
    {"responses: no response.completed", {{RESP_CREATED "\n\n" RESP_A "\n\n" RESP_B "\n\n"}, {0}, 1, false}, MN_EIO,
     false, "the stream ended before response.completed", true},
};

/* client_chat (and client_respond) against each shape of stream: the two
 * deltas arrive, and the result says what the stream said (with the
 * Responses API, the response's id and its usage). */
static void test_client_stream_shapes(void **state) {
    int n_wrong = 0; /* every case runs, and each wrong one is told */
    for (size_t i = 0; i < sizeof STREAM_CASES / sizeof STREAM_CASES[0]; i++) {
        const StreamCase *k = &STREAM_CASES[i];
        Fake f;
        fake_start_with(&f, FAKE_SCRIPT, &k->script);
        char url[64];
        snprintf(url, sizeof url, "http://127.0.0.1:%d", f.port);
        ChatClient *c;
        assert_int_equal(client_new(url, NULL, &c), MN_OK);
        client_set_timeouts(c, 10, 60); /* only a broken parser waits at a gate: fail, not hang */
        ClientMsg m = {"user", "hi"};
        ClientTurn t = {&m, 1, NULL, NULL};
        ClientResult res;
        int rc = k->is_responses ? client_respond(c, &t, NULL, fake_on_delta, &f, &res)
                                 : client_chat(c, &m, 1, NULL, fake_on_delta, &f, &res);
        fake_stop(&f);
        client_free(c);
        if (rc != k->rc || res.is_server_error != k->is_server_error || strcmp(res.error, k->error) != 0 ||
            strcmp(res.content, "ab") != 0 || res.n_deltas != 2 || res.http_status != 200 ||
            (k->rc == MN_OK && res.completion_tokens != 2) ||
            (k->is_responses && (strcmp(res.response_id, "resp_1") != 0 || (k->rc == MN_OK && res.cached_tokens != 8)))) {
            n_wrong++;
            print_message("%s: rc %d (want %d), server error %d, error \"%s\" (want \"%s\"), content \"%s\", %d deltas, "
                     "HTTP %d\n",
                     k->what, rc, k->rc, res.is_server_error, res.error, k->error, res.content, res.n_deltas,
                     res.http_status);
        }
        mn_free(res.content);
    }
    assert_int_equal(n_wrong, 0);
}

/* A stream that carries llama-server's error mid-reply is a server_error
 * with the server's message in the records, the summary, requests.csv
 * and summary.json; a broken connection after it does not hide it. */
static void test_server_error(void **state) {
    for (int cut = 0; cut < 2; cut++) {
        FakeScript sc = {{SSE_A "\n\n", "data: {\"error\":" LLAMA_ERROR "}\n\n"}, {0}, 2, cut == 1};
        Fake f;
        fake_start_with(&f, FAKE_SCRIPT, &sc);
        run_failing(f.port, BENCH_SERVER_ERROR, "server_error", "Context size has been exceeded.");
        fake_stop(&f);
    }
}

static void test_command_failures(void **state) {
    char url[64], *dir = test_tmpdir_new("bench-out");
    snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
    char *argv[] = {"--url", url, "--workload", "multiturn", "--conversations", "2", "--turns", "2",
                    "--output-tokens", "2", "--rate", "0", "--quiet", "--out", dir};
    assert_int_equal(bench_main((int)(sizeof argv / sizeof argv[0]), argv), 1); /* nothing succeeded */
    char path[160];
    snprintf(path, sizeof path, "%s/requests.csv", dir);
    char *csv = test_read_file(path, NULL);
    assert_non_null(csv);
    assert_non_null(strstr(csv, ",connect_error,\""));
    free(csv);
    test_tmpdir_free(dir);
    char *bad1[] = {"--rate", "-1x"};
    assert_int_equal(bench_main(2, bad1), 2);
    char *bad2[] = {"--workload", "nope"};
    assert_int_equal(bench_main(2, bad2), 2);
    char *bad3[] = {"--url", "localhost:8080"};
    assert_int_equal(bench_main(2, bad3), 2);
}

/* --duration: no conversation starts after it. The plan's arrivals are
 * set here so that the outcome cannot depend on how fast a loaded machine
 * sends: ten conversations are due within 0.2 s of a duration as long as
 * the tests' hang guard, the rest after it (the run does not wait for
 * those: they never start). */
static void test_duration(void **state) {
    Fake f;
    fake_start(&f, FAKE_500);
    BenchConfig c;
    small_config(&c, BENCH_MULTITURN, 30, 1);
    MnErr err = {0};
    BenchPlan *p;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    for (int i = 0; i < p->n_convs; i++) p->convs[i].start_s = i < 10 ? 0.02 * i : TEST_HANG_GUARD_S + i;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", f.port);
    BenchRunOpts o = {.url = url, .model = "m", .concurrency = 4, .duration_s = TEST_HANG_GUARD_S,
                      .connect_timeout_s = TEST_HANG_GUARD_S, .idle_timeout_s = TEST_HANG_GUARD_S};
    BenchResults *r = NULL;
    assert_int_equal(bench_run(p, &o, &r, &err), MN_OK);
    bool started[30] = {0};
    for (long i = 0; i < r->n_records; i++) started[r->records[i].conversation] = true;
    for (int i = 0; i < p->n_convs; i++) assert_true(started[i] == (i < 10));
    assert_int_equal(r->n_records + r->n_skipped, p->n_requests);
    bench_results_free(r);
    bench_plan_free(p);
    fake_stop(&f);
}

/* ---- tiers: a fake mnemo with tiers, a fake plain server ------------------------------ */

/* The summary as printed, in a malloc'd string. */
static char *summary_text(const BenchSummary *s, const BenchResults *r) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    BenchInfo info = {"multiturn", "x", "test", 1, 3, 1.3, false, "chat"};
    bench_print_summary(f, s, r, &info);
    fclose(f);
    return text;
}

static void test_tiers_fake_mnemo(void **state) {
    Fake f;
    fake_start(&f, FAKE_TIERS);
    BenchConfig c;
    small_config(&c, BENCH_MULTITURN, 3, 2);
    MnErr err = {0};
    BenchPlan *p;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    BenchResults *r = run_plan(p, f.port, 2, false);
    assert_int_equal(r->n_records, 6);
    for (long i = 0; i < r->n_records; i++) { /* per request, as usage said */
        const BenchRecord *x = &r->records[i];
        if (x->status != BENCH_OK) fail_msg("request %ld failed: %s", i, x->error);
        assert_int_equal(x->prompt_tokens, 100);
        assert_int_equal(x->cached_tokens, 70);
        assert_int_equal(x->recomputed_tokens, 30);
        assert_int_equal(x->cached_by_tier.n, 3);
        assert_string_equal(x->cached_by_tier.name[0], "disk"); /* the server's order */
        assert_int_equal(x->cached_by_tier.tokens[0], 20);
        assert_int_equal(x->cached_by_tier.tokens[2], 10);
    }
    BenchSummary s;
    assert_int_equal(bench_summarize(r, &s), MN_OK);
    assert_string_equal(s.tier_source, "usage");
    assert_int_equal(s.n_tiers, 3);
    static const char *const names[] = {"pool", "ram", "disk"}; /* shown from the top down */
    static const double rates[] = {0.4, 0.1, 0.2};
    for (int i = 0; i < 3; i++) {
        assert_string_equal(s.tier[i], names[i]);
        assert_true(fabs(s.tier_hit_rate[i] - rates[i]) < 1e-12);
    }
    assert_int_equal(s.recomputed_tokens, 180);
    assert_true(fabs(s.disk_restore_mbps - 1200.0) < 1e-6); /* 300 MB in 0.25 s */
    const BenchMetrics *d = &r->delta;
    assert_true(d->is_valid);
    assert_true(d->has_dropped && d->dropped_blocks == 3);
    char *text = summary_text(&s, r);
    if (!strstr(text, "hit rate by tier (from usage): pool 0.400, ram 0.100, disk 0.200") ||
        !strstr(text, ", 180 recomputed") || !strstr(text, "restore 1200.0 MB/s") ||
        !strstr(text, "server cache (/metrics): pool 80, ram 30, disk 60, recomputed 90 tokens, 3 blocks dropped") ||
        !strstr(text, "2 evictions, 0 checksum failures"))
        fail_msg("summary:\n%s", text);
    free(text);

    char *dir = test_tmpdir_new("bench-out");
    BenchInfo info = {"multiturn", "x", "test", 1, 3, 1.3, false, "chat"};
    assert_int_equal(bench_write_report(dir, &s, r, &info, &err), MN_OK);
    check_report(dir, &s, r);
    char path[160];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "recomputed_tokens")), 180);
    assert_string_equal(json_string_value(json_object_get(j, "tier_source")), "usage");
    assert_close(json_num(json_object_get(j, "tier_hit_rates"), "disk"), 0.2, 1e-9);
    assert_close(json_num(json_object_get(j, "cached_tokens_by_tier"), "pool"), 240, 1e-9);
    assert_close(json_num(j, "disk_restore_mbps"), 1200.0, 1e-6);
    json_t *disk = json_object_get(json_object_get(json_object_get(j, "server_metrics"), "tiers"), "disk");
    assert_close(json_num(disk, "bytes_read"), 3e8, 1e-3);
    assert_close(json_num(disk, "read_seconds"), 0.25, 1e-9);
    assert_close(json_num(disk, "restore_mbps"), 1200.0, 1e-6);
    assert_close(json_num(disk, "occupancy_bytes"), 7000, 1e-9);
    assert_close(json_num(json_object_get(j, "server_metrics"), "dropped_blocks"), 3, 1e-9);
    json_t *ram = json_object_get(json_object_get(json_object_get(j, "server_metrics"), "tiers"), "ram");
    assert_true(json_is_null(json_object_get(ram, "restore_mbps"))); /* bytes but no seconds */
    json_decref(j);
    test_tmpdir_free(dir);
    bench_results_free(r);
    bench_plan_free(p);
    fake_stop(&f);
}

static void test_tiers_plain_server(void **state) {
    Fake f;
    fake_start(&f, FAKE_PLAIN);
    BenchConfig c;
    small_config(&c, BENCH_MULTITURN, 2, 2);
    MnErr err = {0};
    BenchPlan *p;
    assert_int_equal(bench_plan_new(&c, NULL, NULL, &p, &err), MN_OK);
    BenchResults *r = run_plan(p, f.port, 2, false);
    assert_int_equal(r->n_records, 4);
    for (long i = 0; i < r->n_records; i++) {
        assert_int_equal(r->records[i].status, BENCH_OK);
        assert_int_equal(r->records[i].cached_tokens, 50);
        assert_int_equal(r->records[i].recomputed_tokens, -1);
        assert_int_equal(r->records[i].cached_by_tier.n, 0);
    }
    assert_false(r->delta.is_valid); /* /metrics is a 404 */
    BenchSummary s;
    assert_int_equal(bench_summarize(r, &s), MN_OK);
    assert_true(fabs(s.cached_fraction - 0.5) < 1e-12);
    assert_int_equal(s.n_tiers, 0);
    assert_string_equal(s.tier_source, "none");
    assert_int_equal(s.recomputed_tokens, -1);
    assert_true(isnan(s.disk_restore_mbps));
    char *text = summary_text(&s, r);
    if (strstr(text, "tier") || strstr(text, "recomputed") || strstr(text, "/metrics")) fail_msg("summary:\n%s", text);
    free(text);
    char *dir = test_tmpdir_new("bench-out");
    BenchInfo info = {"multiturn", "x", "test", 1, 2, 1.3, false, "chat"};
    assert_int_equal(bench_write_report(dir, &s, r, &info, &err), MN_OK);
    check_report(dir, &s, r);
    char path[160];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    static const char *const nulls[] = {"recomputed_tokens", "tier_hit_rates", "cached_tokens_by_tier",
                                        "disk_restore_mbps", "server_metrics"};
    for (int i = 0; i < 5; i++)
        if (!json_is_null(json_object_get(j, nulls[i]))) fail_msg("%s is not null", nulls[i]);
    json_decref(j);
    test_tmpdir_free(dir);
    bench_results_free(r);
    bench_plan_free(p);
    fake_stop(&f);
}

int main(void) {
    test_apply_filter();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_percentile),
        cmocka_unit_test(test_metrics_parse),
        cmocka_unit_test(test_config_resolve),
        cmocka_unit_test(test_plan_reproducible),
        cmocka_unit_test(test_plan_past_context),
        cmocka_unit_test(test_summary_overflow),
        cmocka_unit_test(test_sharegpt_synth_stats),
        cmocka_unit_test(test_sharegpt_file),
        cmocka_unit_test_teardown(test_real_server, stop_server),
        cmocka_unit_test_teardown(test_real_server_responses, stop_server),
        cmocka_unit_test(test_connection_refused),
        cmocka_unit_test(test_http_500),
        cmocka_unit_test(test_stream_cut),
        cmocka_unit_test(test_sse_parser),
        cmocka_unit_test(test_client_stream_shapes),
        cmocka_unit_test(test_server_error),
        cmocka_unit_test(test_command_failures),
        cmocka_unit_test(test_duration),
        cmocka_unit_test(test_tiers_from_metrics),
        cmocka_unit_test(test_tiers_fake_mnemo),
        cmocka_unit_test(test_tiers_plain_server),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
