/* test_route_server.c — `mnemo route` end to end: real processes on
 * 127.0.0.1, and fake backends in this process for what a real server
 * cannot be made to do on cue.
 *
 * Two `mnemo serve` on stories260K behind the router:
 *   - every turn of a conversation reaches one backend (each backend's
 *     mnemo_requests_total counted after every conversation), its second
 *     turn finds the first cached (usage), and 32 conversations spread
 *     over both;
 *   - answers through the router are the backend's own (the other
 *     backend, asked directly in the same cache state): whole ones byte
 *     for byte but the per-request id and created time, streamed ones
 *     event for event (how tokens group into chunks follows the engine's
 *     timing, so the fake stream below checks the bytes);
 *   - a killed backend's conversations go to the other and every request
 *     succeeds; restarted on its port, it is probed back up and its
 *     conversations return to it;
 *   - a malformed request gets the backend's 400 as the backend wrote it;
 *     a body over --max-body gets the router's 413; with both backends
 *     gone, 503 with an OpenAI error object, and /health says so;
 *   - the Responses API: a chain continued through the router (which
 *     remembers where each response lives), read and deleted, and
 *     continued again through a new router that remembers nothing;
 *   - `mnemo bench --url ROUTER` runs without a failure.
 * Fake backends (a thread per connection that answers when the test
 * releases it):
 *   - bounded loads: with two requests in flight on the ring's choice, a
 *     third of its conversations goes to the other backend;
 *   - a 5xx before any byte moves the request to the next backend (and
 *     marks the first down); 5xx everywhere passes the last one on;
 *   - a stream's first chunk reaches the client while the backend still
 *     holds the rest (nothing buffered whole), and the whole stream, a
 *     few hundred KiB with CRLF and LF event ends, arrives byte for byte.
 * Nothing waits on time: the test waits for conditions (a counter, a
 * metric, bytes received) under the one-minute hang guard.
 */
#include "test_serve_util.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "route/convkey.h"
#include "route/ring.h"

#define MODEL "stories260K"
/* the router's flags in every test: probes often, so a backend that is
 * back is seen back soon (the tests wait for it, never for a time) */
#define ROUTE_FLAGS "--port 0 --probe-min 0.05 --probe-max 0.2"

/* ---- helpers -------------------------------------------------------------------------- */

static long post(const Srv *s, const char *path, const char *body, char **out) {
    return srv_http(s, NULL, path, body, NULL, out, NULL, 0);
}

/* 200 answers a backend has counted (0 before the first). */
static long n_ok(const Srv *s) {
    double v = srv_metric(s, "mnemo_requests_total{status=\"200\"}");
    return v < 0 ? 0 : (long)v;
}

static double route_metric(const Srv *r, const char *name, const Srv *backend) {
    char series[256];
    if (backend) snprintf(series, sizeof series, "%s{backend=\"http://127.0.0.1:%d\"}", name, backend->port);
    else snprintf(series, sizeof series, "%s", name);
    return srv_metric(r, series);
}

/* `mnemo route` in front of backends[0..n) with extra flags. */
static void route_start(Srv *r, const Srv *const *backends, int n, const char *extra) {
    char args[1024];
    int k = snprintf(args, sizeof args, "route " ROUTE_FLAGS " %s", extra ? extra : "");
    for (int i = 0; i < n; i++)
        k += snprintf(args + k, sizeof args - (size_t)k, " --backend http://127.0.0.1:%d", backends[i]->port);
    srv_start_cmd(r, args);
}

/* A chat body: system, then msgs alternating user and assistant. */
static char *chat_body(const char *const *msgs, int n, int max_tokens, bool stream) {
    json_t *arr = json_array();
    json_array_append_new(arr, json_pack("{s:s,s:s}", "role", "system", "content", "You tell short stories."));
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:s,s:s}", "role", i % 2 ? "assistant" : "user", "content", msgs[i]));
    json_t *o = json_pack("{s:o,s:i,s:f,s:b}", "messages", arr, "max_tokens", max_tokens, "temperature", 0.0,
                          "stream", stream);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

typedef SrvTurn Turn;

/* One non-streamed chat turn through s; fails the test unless it is 200. */
static Turn chat(const Srv *s, const char *const *msgs, int n) {
    char *body = chat_body(msgs, n, 8, false), *out = NULL;
    long st = post(s, "/v1/chat/completions", body, &out);
    if (st != 200) fail_msg("chat: status %ld: %s", st, out ? out : "");
    json_t *j = srv_json(out);
    Turn t = srv_turn_of(j);
    json_decref(j);
    free(body);
    free(out);
    return t;
}

/* The text with every "id":"..." and "created":N made alike, so two
 * answers compare byte for byte but for the per-request values. */
static void normalize(char *text) {
    static const char *const keys[] = {"\"id\":\"", "\"created\":"};
    for (int k = 0; k < 2; k++)
        for (char *p = strstr(text, keys[k]); p; p = strstr(p + 1, keys[k])) {
            char *v = p + strlen(keys[k]), *end = v;
            if (k == 0) end = strchr(v, '"');
            else
                while (*end >= '0' && *end <= '9') end++;
            if (end == NULL) return;
            memmove(v, end, strlen(end) + 1);
        }
}

/* What a chat stream says, whatever its chunking: every event's fields
 * but id, created and the delta's content, in order, chunks that carry
 * content alone left out, then "[DONE]" if it came, then the whole
 * content (pings are not events). malloc'd. */
static char *stream_summary(const char *text) {
    size_t cap = strlen(text) + 64, n = 0;
    char *out = calloc(1, cap), *content = calloc(1, cap);
    size_t n_content = 0;
    for (const char *p = strstr(text, "data: "); p; p = strstr(p, "\ndata: ")) {
        p += *p == '\n' ? 7 : 6;
        const char *end = strstr(p, "\n\n");
        if (end == NULL) break;
        if (strncmp(p, "[DONE]", 6) == 0) {
            n += (size_t)snprintf(out + n, cap - n, "[DONE]");
            break;
        }
        json_t *j = json_loadb(p, (size_t)(end - p), 0, NULL);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        json_t *delta = json_object_get(choice, "delta");
        const char *c = json_string_value(json_object_get(delta, "content"));
        if (c) {
            memcpy(content + n_content, c, strlen(c));
            n_content += strlen(c);
        }
        json_object_del(j, "id");
        json_object_del(j, "created");
        json_object_del(delta, "content");
        bool is_plain = json_object_size(delta) == 0 && json_is_null(json_object_get(choice, "finish_reason"));
        if (!is_plain) {
            char *e = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
            n += (size_t)snprintf(out + n, cap - n, "%s\n", e);
            free(e);
        }
        json_decref(j);
    }
    size_t len = strlen(out) + n_content + 16;
    char *all = malloc(len);
    snprintf(all, len, "%scontent=%s", out, content);
    free(out);
    free(content);
    return all;
}

/* ---- real backends -------------------------------------------------------------------------- */

typedef struct Pair {
    Srv a, b, r;
} Pair;

/* The processes of the test running; a test that fails leaves them to
 * teardown. */
static Pair procs;

static int teardown(void **st) {
    Srv *all[] = {&procs.a, &procs.b, &procs.r};
    for (int i = 0; i < 3; i++)
        if (all[i]->pid > 0) {
            kill(all[i]->pid, SIGKILL);
            waitpid(all[i]->pid, NULL, 0);
            all[i]->pid = 0;
        }
    return 0;
}

static int pair_start(Pair *p, const char *route_extra) {
    if (srv_start(&p->a, MODEL, "") != 0) return -1;
    srv_start(&p->b, MODEL, "");
    const Srv *bs[] = {&p->a, &p->b};
    route_start(&p->r, bs, 2, route_extra);
    return 0;
}

static void pair_stop(Pair *p) {
    if (p->r.pid) srv_stop(&p->r);
    if (p->a.pid) srv_stop(&p->a);
    if (p->b.pid) srv_stop(&p->b);
}

static void first_msg(char *buf, size_t cap, int conv) {
    snprintf(buf, cap, "Conversation %d: once upon a time there was a %s.", conv, conv % 2 ? "cat" : "dog");
}

/* Which backend (0: a, 1: b) took the requests since before[]; fails
 * unless exactly n came, all to one backend. */
static int took(const Pair *p, const long before[2], long n) {
    long da = n_ok(&p->a) - before[0], db = n_ok(&p->b) - before[1];
    if (!((da == n && db == 0) || (da == 0 && db == n)))
        fail_msg("%ld requests split %ld / %ld over the backends", n, da, db);
    return da == n ? 0 : 1;
}

static void test_turns_stay_on_one_backend(void **st) {
    Pair *pp = &procs;
    if (pair_start(pp, NULL) != 0) return;
    int per[2] = {0, 0};
    for (int c = 0; c < 32; c++) {
        char first[128];
        first_msg(first, sizeof first, c);
        long before[2] = {n_ok(&pp->a), n_ok(&pp->b)};
        Turn t1 = chat(&pp->r, (const char *const[]){first}, 1);
        const char *msgs[] = {first, t1.reply, "And then what happened?"};
        Turn t2 = chat(&pp->r, msgs, 3);
        /* the second turn found the first turn's prompt cached (whole blocks of 8) */
        assert_true(t2.cached_tokens >= t1.prompt_tokens / 8 * 8);
        per[took(pp, before, 2)]++;
        free(t1.reply);
        free(t2.reply);
    }
    if (per[0] == 0 || per[1] == 0) fail_msg("32 conversations all went to one backend (%d / %d)", per[0], per[1]);
    assert_int_equal(route_metric(&pp->r, "mnemo_route_failovers_total", &pp->a), 0);
    pair_stop(pp);
}

/* The same body through the router and to the other backend directly,
 * both cold for it: equal but for ids and times. */
static void check_equal_direct(Pair *p, const char *body) {
    long before[2] = {n_ok(&p->a), n_ok(&p->b)};
    char *via = NULL, *direct = NULL, *head_via = NULL, *head_direct = NULL;
    assert_int_equal(srv_http(&p->r, NULL, "/v1/chat/completions", body, NULL, &via, &head_via, 0), 200);
    const Srv *other = took(p, before, 1) == 0 ? &p->b : &p->a;
    assert_int_equal(srv_http(other, NULL, "/v1/chat/completions", body, NULL, &direct, &head_direct, 0), 200);
    char type_via[128] = "", type_direct[128] = "";
    const char *tv = strcasestr(head_via, "Content-Type:"), *td = strcasestr(head_direct, "Content-Type:");
    assert_non_null(tv);
    assert_non_null(td);
    sscanf(tv, "%*s %127[^\r\n]", type_via);
    sscanf(td, "%*s %127[^\r\n]", type_direct);
    assert_string_equal(type_via, type_direct);
    assert_true(strlen(via) > 0);
    if (strstr(type_via, "text/event-stream")) { /* chunking follows the engine's timing: compare what the chunks say */
        char *sv = stream_summary(via), *sd = stream_summary(direct);
        assert_string_equal(sv, sd);
        free(sv);
        free(sd);
    } else {
        normalize(via);
        normalize(direct);
        assert_string_equal(via, direct);
    }
    free(via);
    free(direct);
    free(head_via);
    free(head_direct);
}

static void test_answers_equal_the_backends(void **st) {
    Pair *pp = &procs;
    if (pair_start(pp, NULL) != 0) return;
    const char *m1[] = {"The little robot found a key."};
    char *whole = chat_body(m1, 1, 24, false);
    check_equal_direct(pp, whole);
    const char *m2[] = {"A dragon lived under the bridge."};
    char *stream = chat_body(m2, 1, 24, true);
    check_equal_direct(pp, stream);
    free(whole);
    free(stream);
    pair_stop(pp);
}

static void test_failover_and_return(void **st) {
    Pair *pp = &procs;
    if (pair_start(pp, NULL) != 0) return;
    /* at least 8 conversations, and more until each backend has one: the
     * ring places the backends by their URLs, whose ports differ from run
     * to run, so 8 fixed conversations all went to one backend in about
     * one run of a hundred */
    enum { N_MAX = 64 };
    char first[N_MAX][128];
    Turn t1[N_MAX];
    int home[N_MAX], n_on_a = 0, N = 0;
    while (N < 8 || ((n_on_a == 0 || n_on_a == N) && N < N_MAX)) {
        int c = N++;
        first_msg(first[c], sizeof first[c], 100 + c);
        long before[2] = {n_ok(&pp->a), n_ok(&pp->b)};
        t1[c] = chat(&pp->r, (const char *const[]){first[c]}, 1);
        home[c] = took(pp, before, 1);
        n_on_a += home[c] == 0;
    }
    if (n_on_a == 0 || n_on_a == N) fail_msg("all %d conversations on one backend (%d on a)", N, n_on_a);
    /* a dies: every second turn still succeeds, all on b */
    int a_port = pp->a.port;
    kill(pp->a.pid, SIGKILL);
    waitpid(pp->a.pid, NULL, 0);
    pp->a.pid = 0;
    long b_before = n_ok(&pp->b);
    for (int c = 0; c < N; c++) {
        const char *msgs[] = {first[c], t1[c].reply, "What did they do next?"};
        Turn t2 = chat(&pp->r, msgs, 3);
        if (home[c] == 1) assert_true(t2.cached_tokens > 0); /* b's own conversations keep their cache */
        free(t2.reply);
    }
    assert_int_equal(n_ok(&pp->b) - b_before, N);
    TEST_WAIT_UNTIL(route_metric(&pp->r, "mnemo_route_backend_up", &pp->a) == 0, "a was not marked down");
    assert_true(route_metric(&pp->r, "mnemo_route_failovers_total", &pp->a) >= 1);
    /* a comes back on its port: probed up, and its conversations return to it */
    char extra[32];
    snprintf(extra, sizeof extra, "--port %d", a_port);
    srv_start(&pp->a, MODEL, extra);
    assert_int_equal(pp->a.port, a_port);
    TEST_WAIT_UNTIL(route_metric(&pp->r, "mnemo_route_backend_up", &pp->a) == 1, "a was not probed back up");
    long a_before = n_ok(&pp->a);
    b_before = n_ok(&pp->b);
    for (int c = 0; c < N; c++) {
        const char *msgs[] = {first[c], t1[c].reply, "Where did they go?"};
        free(chat(&pp->r, msgs, 3).reply);
    }
    assert_int_equal(n_ok(&pp->a) - a_before, n_on_a);
    assert_int_equal(n_ok(&pp->b) - b_before, N - n_on_a);
    for (int c = 0; c < N; c++) free(t1[c].reply);
    pair_stop(pp);
}

/* An error answer's error.type and message (or NULL to skip). */
static void expect_error(const char *out, const char *type, const char *in_message) {
    json_t *j = srv_json(out);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    if (in_message) assert_non_null(strstr(json_string_value(json_object_get(e, "message")), in_message));
    json_decref(j);
}

static void test_errors_pass_through(void **st) {
    Pair *pp = &procs;
    if (pair_start(pp, "--max-body 1") != 0) return;
    static const char *const bad[] = {
        "{not json",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":\"many\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"no_such_field\":1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *via = NULL, *direct = NULL;
        assert_int_equal(post(&pp->r, "/v1/chat/completions", bad[i], &via), 400);
        assert_int_equal(post(&pp->a, "/v1/chat/completions", bad[i], &direct), 400);
        assert_string_equal(via, direct);
        free(via);
        free(direct);
    }
    char *out = NULL;
    assert_int_equal(post(&pp->r, "/v1/no-such-route", "{}", &out), 404);
    free(out);
    /* the router's own limit */
    char big[2048];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    big[0] = '{';
    big[sizeof big - 2] = '}';
    assert_int_equal(post(&pp->r, "/v1/chat/completions", big, &out), 413);
    expect_error(out, "invalid_request_error", "--max-body");
    free(out);
    /* nobody home */
    srv_stop(&pp->a);
    srv_stop(&pp->b);
    assert_int_equal(post(&pp->r, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &out),
                     503);
    expect_error(out, "unavailable_error", "no backend is up");
    free(out);
    TEST_WAIT_UNTIL(route_metric(&pp->r, "mnemo_route_backend_up", &pp->b) == 0, "b was not marked down");
    assert_int_equal(srv_http(&pp->r, NULL, "/health", NULL, NULL, &out, NULL, 0), 503);
    expect_error(out, "unavailable_error", NULL);
    free(out);
    assert_true(route_metric(&pp->r, "mnemo_route_unavailable_total", NULL) >= 1);
    pair_stop(pp);
}

/* POST /v1/responses through s: the new response's id (malloc'd). */
static char *respond(const Srv *s, const char *input, const char *previous) {
    json_t *o = json_pack("{s:s,s:i}", "input", input, "max_output_tokens", 8);
    if (previous) json_object_set_new(o, "previous_response_id", json_string(previous));
    char *body = json_dumps(o, JSON_COMPACT), *out = NULL;
    json_decref(o);
    long status = post(s, "/v1/responses", body, &out);
    if (status != 200) fail_msg("responses: status %ld: %s", status, out);
    json_t *j = srv_json(out);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    free(body);
    free(out);
    return id;
}

static void test_responses_api(void **st) {
    Pair *pp = &procs;
    if (pair_start(pp, NULL) != 0) return;
    char *id1 = respond(&pp->r, "Once upon a time", NULL);
    char *id2 = respond(&pp->r, "Then what?", id1);
    char *other = respond(&pp->r, "A different story", NULL);
    assert_int_equal(route_metric(&pp->r, "mnemo_route_response_ids", NULL), 3);
    char path[256], *out = NULL;
    snprintf(path, sizeof path, "/v1/responses/%s", other);
    long forwarded = (long)(route_metric(&pp->r, "mnemo_route_forwarded_total", &pp->a) +
                            route_metric(&pp->r, "mnemo_route_forwarded_total", &pp->b));
    assert_int_equal(srv_http(&pp->r, NULL, path, NULL, NULL, &out, NULL, 0), 200);
    free(out);
    /* remembered: asked of its backend alone */
    assert_int_equal((long)(route_metric(&pp->r, "mnemo_route_forwarded_total", &pp->a) +
                            route_metric(&pp->r, "mnemo_route_forwarded_total", &pp->b)),
                     forwarded + 1);
    assert_int_equal(srv_http(&pp->r, "DELETE", path, NULL, NULL, &out, NULL, 0), 200);
    free(out);
    assert_int_equal(route_metric(&pp->r, "mnemo_route_response_ids", NULL), 2);
    assert_int_equal(srv_http(&pp->r, NULL, path, NULL, NULL, &out, NULL, 0), 404);
    expect_error(out, "invalid_request_error", "not found");
    free(out);
    free(other);
    /* a new router remembers nothing, and still finds the chain */
    srv_stop(&pp->r);
    const Srv *bs[] = {&pp->a, &pp->b};
    route_start(&pp->r, bs, 2, NULL);
    char *id3 = respond(&pp->r, "And at last?", id2);
    free(respond(&pp->r, "The end.", id3));
    free(id1);
    free(id2);
    free(id3);
    pair_stop(pp);
}

static void test_bench_through_router(void **st) {
    Pair *pp = &procs;
    if (pair_start(pp, NULL) != 0) return;
    char dir[] = "/tmp/mnemo-test-route-bench-XXXXXX", cmd[1024], path[256];
    assert_non_null(mkdtemp(dir));
    const char *bin = getenv("MNEMO_BIN") ? getenv("MNEMO_BIN") : "./build/release/mnemo";
    snprintf(cmd, sizeof cmd,
             "%s bench --url http://127.0.0.1:%d --workload multiturn --conversations 4 --turns 3 "
             "--question-tokens 16 --output-tokens 4 --rate 0 --think-mean 0 -q --out %s >%s/out.txt 2>&1",
             bin, pp->r.port, dir, dir);
    int rc = system(cmd);
    snprintf(path, sizeof path, "%s/summary.json", dir);
    char *text = test_read_file(path, NULL);
    if (rc != 0 || text == NULL) fail_msg("bench through the router failed (%d); see %s/out.txt", rc, dir);
    json_t *j = srv_json(text);
    assert_int_equal(json_integer_value(json_object_get(j, "requests")), 12);
    assert_int_equal(json_integer_value(json_object_get(j, "failures")), 0);
    assert_true(json_real_value(json_object_get(j, "cached_fraction")) > 0);
    json_decref(j);
    free(text);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    pair_stop(pp);
}

/* ---- fake backends ------------------------------------------------------------------------------- */

/* A backend in this process: GET /health answers 200 at once; any other
 * request is counted and answered `status` once the test has released as
 * many as it is (is_stream, one request: a 200 event stream whose first
 * chunk goes at once, a second at the first release, the rest at the
 * second). Every answer closes its connection. */
typedef struct Fake {
    int fd, port;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int status;
    bool is_stream, is_stopping;
    int n_arrived, n_released, n_threads;
    pthread_t conns[64];
} Fake;

typedef struct FakeConn {
    Fake *f;
    int fd;
} FakeConn;

/* Read a request's head and its Content-Length body; false at EOF. */
static bool read_request(int fd, char *head, size_t cap) {
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t k = recv(fd, head + n, 1, 0);
        if (k <= 0) return false;
        head[++n] = '\0';
        if (n >= 4 && memcmp(head + n - 4, "\r\n\r\n", 4) == 0) break;
    }
    const char *cl = strcasestr(head, "Content-Length:");
    long body = cl ? atol(cl + 15) : 0;
    char sink[4096];
    while (body > 0) {
        ssize_t k = recv(fd, sink, body < (long)sizeof sink ? (size_t)body : sizeof sink, 0);
        if (k <= 0) return false;
        body -= k;
    }
    return true;
}

/* The rest of a fake stream after its first chunk: many events of every
 * byte value a line may hold, half of them ended by CRLF, then [DONE]
 * (malloc'd, *n its length). */
static char *stream_rest(size_t *n) {
    enum { N_EVENTS = 1000, PAD = 200 };
    char *b = malloc(N_EVENTS * (PAD + 32) + 32);
    size_t k = 0;
    for (int i = 0; i < N_EVENTS; i++) {
        k += (size_t)sprintf(b + k, "data: %d ", i);
        for (int j = 0; j < PAD; j++) b[k++] = (char)(0x20 + (i * 7 + j) % 0x5f);
        k += (size_t)sprintf(b + k, i % 2 ? "\r\n\r\n" : "\n\n");
    }
    k += (size_t)sprintf(b + k, "data: [DONE]\n\n");
    *n = k;
    return b;
}

static void *fake_conn_main(void *arg) {
    FakeConn *fc = arg;
    Fake *f = fc->f;
    char head[8192];
    if (read_request(fc->fd, head, sizeof head)) {
        char out[512];
        if (strncmp(head, "GET /health ", 12) == 0) {
            static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n"
                                     "Connection: close\r\n\r\n{\"status\":\"ok\"}";
            srv_send_all(fc->fd, ok, sizeof ok - 1);
        } else {
            pthread_mutex_lock(&f->mu);
            int me = ++f->n_arrived, status = f->status;
            bool is_stream = f->is_stream;
            pthread_cond_broadcast(&f->cv);
            if (is_stream) {
                static const char h[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                        "Connection: close\r\n\r\ndata: first\n\n";
                srv_send_all(fc->fd, h, sizeof h - 1);
            }
            while (f->n_released < me && !f->is_stopping) pthread_cond_wait(&f->cv, &f->mu);
            if (is_stream) { /* a second chunk, and the rest at the next release */
                pthread_mutex_unlock(&f->mu);
                srv_send_all(fc->fd, "data: second\n\n", 14);
                pthread_mutex_lock(&f->mu);
                while (f->n_released < me + 1 && !f->is_stopping) pthread_cond_wait(&f->cv, &f->mu);
            }
            pthread_mutex_unlock(&f->mu);
            if (is_stream) {
                size_t n;
                char *rest = stream_rest(&n);
                srv_send_all(fc->fd, rest, n);
                free(rest);
            } else {
                char body[64];
                int len = snprintf(body, sizeof body, "{\"fake\":%d,\"status\":%d}", f->port, status);
                int n = snprintf(out, sizeof out,
                                 "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                                 "Connection: close\r\n\r\n%s",
                                 status, len, body);
                srv_send_all(fc->fd, out, (size_t)n);
            }
        }
    }
    close(fc->fd);
    free(fc);
    return NULL;
}

static void *fake_main(void *arg) {
    Fake *f = arg;
    for (;;) {
        int fd = accept(f->fd, NULL, NULL);
        if (fd < 0) return NULL; /* shut down */
        FakeConn *fc = malloc(sizeof *fc);
        *fc = (FakeConn){f, fd};
        pthread_mutex_lock(&f->mu);
        if (f->n_threads < 64 && pthread_create(&f->conns[f->n_threads], NULL, fake_conn_main, fc) == 0) f->n_threads++;
        else {
            close(fd);
            free(fc);
        }
        pthread_mutex_unlock(&f->mu);
    }
}

static void fake_start(Fake *f, int status) {
    memset(f, 0, sizeof *f);
    f->status = status;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(f->fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f->fd, 64), 0);
    getsockname(f->fd, (struct sockaddr *)&a, &len);
    f->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_release(Fake *f, int n) {
    pthread_mutex_lock(&f->mu);
    f->n_released += n;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static int fake_arrived(Fake *f) {
    pthread_mutex_lock(&f->mu);
    int n = f->n_arrived;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void fake_stop(Fake *f) {
    pthread_mutex_lock(&f->mu);
    f->is_stopping = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    shutdown(f->fd, SHUT_RDWR);
    pthread_join(f->thread, NULL);
    for (int i = 0; i < f->n_threads; i++) pthread_join(f->conns[i], NULL);
    close(f->fd);
}

/* A chat body whose conversation the ring of the router in front of
 * fakes[0..2) sends to fakes[want] first; seq picks among them. */
static char *body_for(const Fake *fakes, int want, int *seq) {
    char a[64], b[64];
    snprintf(a, sizeof a, "http://127.0.0.1:%d", fakes[0].port);
    snprintf(b, sizeof b, "http://127.0.0.1:%d", fakes[1].port);
    const char *names[] = {a, b};
    Ring *ring = NULL;
    assert_int_equal(ring_new(names, 2, RING_VNODES, &ring), MN_OK);
    for (;; (*seq)++) {
        char msg[64];
        snprintf(msg, sizeof msg, "question %d", *seq);
        const char *msgs[] = {msg};
        char *body = chat_body(msgs, 1, 4, false);
        ConvKeyInput in = {"POST", "/v1/chat/completions", body, strlen(body), NULL, NULL, NULL};
        ConvKey k;
        convkey_of(&in, &k);
        int order[2];
        ring_order(ring, k.hash, order);
        if (order[0] == want) {
            (*seq)++;
            ring_free(ring);
            return body;
        }
        free(body);
    }
}

typedef struct Client {
    const Srv *r;
    char *body;
    long status;
    char *out;
    pthread_t thread;
} Client;

static void *client_main(void *arg) {
    Client *c = arg;
    c->status = post(c->r, "/v1/chat/completions", c->body, &c->out);
    return NULL;
}

static void client_start(Client *c, const Srv *r, char *body) {
    *c = (Client){.r = r, .body = body};
    assert_int_equal(pthread_create(&c->thread, NULL, client_main, c), 0);
}

/* The client's answer came from fake f with status. */
static void client_join(Client *c, const Fake *f, long status) {
    pthread_join(c->thread, NULL);
    assert_int_equal(c->status, status);
    char want[64];
    snprintf(want, sizeof want, "\"fake\":%d", f->port);
    if (strstr(c->out, want) == NULL) fail_msg("answer %s is not from port %d", c->out, f->port);
    free(c->body);
    free(c->out);
}

static void fakes_route(Srv *r, const Fake *fakes, const char *extra) {
    char args[512];
    snprintf(args, sizeof args, "route " ROUTE_FLAGS " %s --backend http://127.0.0.1:%d --backend http://127.0.0.1:%d",
             extra, fakes[0].port, fakes[1].port);
    srv_start_cmd(r, args);
}

static void test_bounded_load(void **st) {
    Fake f[2];
    fake_start(&f[0], 200);
    fake_start(&f[1], 200);
    Srv *rr = &procs.r;
    fakes_route(rr, f, "--load-factor 1.25");
    int seq = 0;
    Client c[3];
    /* two of f0's conversations in flight on it: cap ceil(1.25 * 2 / 2) = 2 */
    client_start(&c[0], rr, body_for(f, 0, &seq));
    TEST_WAIT_UNTIL(fake_arrived(&f[0]) == 1, "the first request did not reach its backend");
    client_start(&c[1], rr, body_for(f, 0, &seq));
    TEST_WAIT_UNTIL(fake_arrived(&f[0]) == 2, "the second request did not reach its backend");
    /* a third: ceil(1.25 * 3 / 2) = 2 on f0 already, so f1 takes it */
    client_start(&c[2], rr, body_for(f, 0, &seq));
    TEST_WAIT_UNTIL(fake_arrived(&f[1]) == 1, "the third request did not go to the other backend");
    assert_int_equal(fake_arrived(&f[0]), 2);
    assert_int_equal(route_metric(rr, "mnemo_route_load_skips_total", NULL), 1);
    fake_release(&f[0], 2);
    fake_release(&f[1], 1);
    client_join(&c[0], &f[0], 200);
    client_join(&c[1], &f[0], 200);
    client_join(&c[2], &f[1], 200);
    /* with nothing in flight, f0's conversations are f0's again */
    client_start(&c[0], rr, body_for(f, 0, &seq));
    fake_release(&f[0], 1);
    client_join(&c[0], &f[0], 200);
    srv_stop(rr);
    fake_stop(&f[0]);
    fake_stop(&f[1]);
}

/* A backend that takes the request and never answers holds a router
 * thread no longer than --upstream-timeout: the request moves to the next
 * backend (nothing was sent to the client yet), and with no other backend
 * the client gets 504 with an OpenAI error object. The hang guard, far
 * above the timeouts, is the only time bound. While a backend answers,
 * the timeout is 5 s, not 1: the answering one must not be taken for
 * silent on a loaded machine. */
static void test_silent_backend(void **st) {
    Fake f[2];
    fake_start(&f[0], 200); /* never released: silent */
    fake_start(&f[1], 200);
    fake_release(&f[1], 1000);
    Srv *rr = &procs.r;
    fakes_route(rr, f, "--upstream-timeout 5");
    int seq = 0;
    Client c;
    client_start(&c, rr, body_for(f, 0, &seq));
    TEST_WAIT_UNTIL(fake_arrived(&f[1]) == 1, "the request did not move on from the silent backend");
    client_join(&c, &f[1], 200);
    assert_int_equal(fake_arrived(&f[0]), 1);
    srv_stop(rr);
    char args[256];
    snprintf(args, sizeof args, "route " ROUTE_FLAGS " --upstream-timeout 1 --backend http://127.0.0.1:%d", f[0].port);
    srv_start_cmd(rr, args);
    client_start(&c, rr, body_for(f, 0, &seq));
    TEST_WAIT_UNTIL(pthread_tryjoin_np(c.thread, NULL) == 0, "no answer while the only backend is silent");
    assert_int_equal(fake_arrived(&f[0]), 2);
    assert_int_equal(c.status, 504);
    json_t *j = srv_json(c.out);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    if (msg == NULL || strstr(msg, "--upstream-timeout") == NULL) fail_msg("504 without the reason: %s", c.out);
    json_decref(j);
    free(c.body);
    free(c.out);
    srv_stop(rr);
    fake_stop(&f[0]);
    fake_stop(&f[1]);
}

static void test_5xx_fails_over(void **st) {
    Fake f[2];
    fake_start(&f[0], 500);
    fake_start(&f[1], 200);
    fake_release(&f[0], 1000);
    fake_release(&f[1], 1000);
    Srv *rr = &procs.r;
    fakes_route(rr, f, "");
    int seq = 0;
    Client c;
    client_start(&c, rr, body_for(f, 0, &seq));
    client_join(&c, &f[1], 200);
    assert_int_equal(fake_arrived(&f[0]), 1);
    char series[128];
    snprintf(series, sizeof series, "mnemo_route_failovers_total{backend=\"http://127.0.0.1:%d\"}", f[0].port);
    assert_int_equal(srv_metric(rr, series), 1);
    snprintf(series, sizeof series, "mnemo_route_backend_downs_total{backend=\"http://127.0.0.1:%d\"}", f[0].port);
    TEST_WAIT_UNTIL(srv_metric(rr, series) >= 1, "f0 was not marked down");
    /* 5xx everywhere: the last backend's answer is passed on (f0 back up
     * first, so the plan is f0 then f1) */
    snprintf(series, sizeof series, "mnemo_route_backend_up{backend=\"http://127.0.0.1:%d\"}", f[0].port);
    TEST_WAIT_UNTIL(srv_metric(rr, series) == 1, "f0 was not probed back up");
    pthread_mutex_lock(&f[1].mu);
    f[1].status = 502;
    pthread_mutex_unlock(&f[1].mu);
    client_start(&c, rr, body_for(f, 0, &seq));
    client_join(&c, &f[1], 502);
    srv_stop(rr);
    fake_stop(&f[0]);
    fake_stop(&f[1]);
}

/* A streaming client that counts what it received. */
typedef struct Reader {
    const Srv *r;
    pthread_mutex_t mu;
    char *got; /* NUL-terminated */
    size_t n;
    long status;
    pthread_t thread;
} Reader;

static size_t reader_data(char *p, size_t sz, size_t n, void *ctx) {
    Reader *rd = ctx;
    pthread_mutex_lock(&rd->mu);
    char *grown = realloc(rd->got, rd->n + sz * n + 1);
    if (grown) {
        rd->got = grown;
        memcpy(rd->got + rd->n, p, sz * n);
        rd->n += sz * n;
        rd->got[rd->n] = '\0';
    }
    pthread_mutex_unlock(&rd->mu);
    return grown ? sz * n : 0;
}

static void *reader_main(void *arg) {
    Reader *rd = arg;
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", rd->r->port);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{\"stream\":true}");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, reader_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, rd);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &rd->status);
    curl_easy_cleanup(c);
    return NULL;
}

static bool reader_has(Reader *rd, const char *text) {
    pthread_mutex_lock(&rd->mu);
    bool has = rd->got && strstr(rd->got, text) != NULL;
    pthread_mutex_unlock(&rd->mu);
    return has;
}

static void test_stream_is_not_buffered(void **st) {
    Fake f[2];
    fake_start(&f[0], 200);
    fake_start(&f[1], 200);
    f[0].is_stream = f[1].is_stream = true;
    Srv *rr = &procs.r;
    fakes_route(rr, f, "");
    Reader rd = {.r = rr};
    pthread_mutex_init(&rd.mu, NULL);
    assert_int_equal(pthread_create(&rd.thread, NULL, reader_main, &rd), 0);
    /* each chunk arrives while the backend holds the rest */
    TEST_WAIT_UNTIL(reader_has(&rd, "data: first\n\n"), "the first chunk did not come through before the end");
    fake_release(&f[0], 1);
    fake_release(&f[1], 1);
    TEST_WAIT_UNTIL(reader_has(&rd, "data: second\n\n"), "the second chunk did not come through before the end");
    assert_false(reader_has(&rd, "[DONE]"));
    fake_release(&f[0], 1);
    fake_release(&f[1], 1);
    pthread_join(rd.thread, NULL);
    assert_int_equal(rd.status, 200);
    size_t n_rest;
    char *rest = stream_rest(&n_rest);
    static const char first[] = "data: first\n\ndata: second\n\n";
    assert_int_equal(rd.n, sizeof first - 1 + n_rest); /* byte for byte as the backend sent it */
    assert_memory_equal(rd.got, first, sizeof first - 1);
    assert_memory_equal(rd.got + sizeof first - 1, rest, n_rest);
    free(rest);
    free(rd.got);
    srv_stop(rr);
    fake_stop(&f[0]);
    fake_stop(&f[1]);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_turns_stay_on_one_backend, teardown),
        cmocka_unit_test_teardown(test_answers_equal_the_backends, teardown),
        cmocka_unit_test_teardown(test_failover_and_return, teardown),
        cmocka_unit_test_teardown(test_errors_pass_through, teardown),
        cmocka_unit_test_teardown(test_responses_api, teardown),
        cmocka_unit_test_teardown(test_bench_through_router, teardown),
        cmocka_unit_test_teardown(test_bounded_load, teardown),
        cmocka_unit_test_teardown(test_5xx_fails_over, teardown),
        cmocka_unit_test_teardown(test_silent_backend, teardown),
        cmocka_unit_test_teardown(test_stream_is_not_buffered, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
