/* test_serve_util.h — start and stop a `mnemo serve` (or `mnemo route`)
 * process on a free loopback port for the integration tests, talk HTTP to it and read its
 * metrics (header-only; each test is one .c). The binary is $MNEMO_BIN
 * (tests/run.sh sets it to the build's mnemo). */
#ifndef MN_TEST_SERVE_UTIL_H
#define MN_TEST_SERVE_UTIL_H

#include <curl/curl.h>
#include <jansson.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

typedef struct Srv {
    pid_t pid;
    int port;
    char log[64];
    char model[128]; /* the served id, as /v1/models lists it: the model's file name */
} Srv;

/* The port from the server's start-up line ("serving ... on
 * http://127.0.0.1:PORT") into s->port, once it is in the log; else 0. */
static inline int srv_port(Srv *s) {
    char *log = test_read_file(s->log, NULL);
    char *p = log ? strstr(log, "on http://127.0.0.1:") : NULL;
    if (p) s->port = atoi(p + strlen("on http://127.0.0.1:"));
    free(log);
    return s->port;
}

/* Start `mnemo ARGS` (a command that logs "... on http://127.0.0.1:PORT"
 * once it listens: serve, route); returns 0 once it listens. A process
 * that exits first, or is not listening after TEST_HANG_GUARD_S, fails the
 * test. */
static inline int srv_start_cmd(Srv *s, const char *args) {
    char cmd[4096];
    snprintf(s->log, sizeof s->log, "/tmp/mnemo-test-srv-%d-XXXXXX", (int)getpid());
    int fd = mkstemp(s->log);
    close(fd);
    const char *bin = getenv("MNEMO_BIN") ? getenv("MNEMO_BIN") : "./build/release/mnemo";
    snprintf(cmd, sizeof cmd, "exec %s %s 2>%s", bin, args, s->log);
    s->pid = fork();
    if (s->pid == 0) {
        /* a test that fails skips its srv_stop: the server dies with the
         * test process instead of outliving it, and holds none of its
         * pipes (a caller reading them to the end would wait for good) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_RDWR);
        for (int std = 0; std < 2 && null >= 0; std++) dup2(null, std);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    s->port = 0;
    TEST_WAIT_UNTIL(srv_port(s) > 0 || waitpid(s->pid, &status, WNOHANG) == s->pid,
                    "the server is not listening after %d s; see %s", TEST_HANG_GUARD_S, s->log);
    if (s->port <= 0) {
        s->pid = 0; /* reaped: nothing to stop */
        fail_msg("the server exited (status 0x%x) before listening; see %s", status, s->log);
    }
    return 0;
}

/* Start `mnemo serve -m PATH --port 0 --block-tokens 8 EXTRA` for a model
 * file anywhere (s->model is its file name), as srv_start_cmd. */
static inline int srv_start_path(Srv *s, const char *path, const char *extra) {
    char args[2048];
    const char *base = strrchr(path, '/');
    snprintf(s->model, sizeof s->model, "%.100s", base ? base + 1 : path);
    snprintf(args, sizeof args, "serve -m %s --port 0 --block-tokens 8 %s", path, extra);
    return srv_start_cmd(s, args);
}

/* srv_start_path for ../shared/data/models/MODEL.gguf; -1 when the file is
 * missing (the test is skipped). */
static inline int srv_start(Srv *s, const char *model, const char *extra) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "models/%s.gguf", model);
    test_data_path(path, sizeof path, rel);
    if (!test_require_file(path)) return -1;
    return srv_start_path(s, path, extra);
}

/* SIGTERM, and the server must exit 0. Its pid is 0 afterwards, so a
 * teardown stops only a server a failed test left running. */
static inline void srv_stop(Srv *s) {
    kill(s->pid, SIGTERM);
    int st;
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(s->log);
}

/* ---- HTTP (thread-safe: never asserts, so helper threads may call it) ---- */

typedef struct SrvBuf {
    char *data;         /* NUL-terminated; NULL once growing it failed */
    size_t len;
    size_t abort_after; /* hang up once this many bytes came (0 = never) */
} SrvBuf;

static inline size_t srv_on_data(char *p, size_t sz, size_t n, void *ctx) {
    SrvBuf *b = ctx;
    char *grown = b->data ? realloc(b->data, b->len + sz * n + 1) : NULL;
    if (grown == NULL) return 0;
    b->data = grown;
    memcpy(b->data + b->len, p, sz * n);
    b->len += sz * n;
    b->data[b->len] = '\0';
    if (b->abort_after && b->len >= b->abort_after) return 0;
    return sz * n;
}

/* A request to the server. method: NULL for GET (body NULL) or POST,
 * "HEAD", or another method by name; headers: NULL-ended extra lines
 * (Content-Type: application/json is always sent); abort_after: hang up
 * once that many body bytes came (0 = never), keeping the status.
 * Returns the status (-1: no answer); *out the body and *head_out the
 * response's header block, malloc'd and never NULL unless out of memory
 * (either pointer may be NULL to drop it). */
static inline long srv_http(const Srv *s, const char *method, const char *path, const char *body,
                            const char *const *headers, char **out, char **head_out, size_t abort_after) {
    CURL *c = curl_easy_init();
    char url[1024];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, path);
    SrvBuf b = {calloc(1, 1), 0, abort_after}, h = {calloc(1, 1), 0, 0};
    struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
    for (int i = 0; headers && headers[i]; i++) hs = curl_slist_append(hs, headers[i]);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, srv_on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, srv_on_data);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    if (method && strcmp(method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    else if (method) curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK && !(abort_after && rc == CURLE_WRITE_ERROR)) {
        /* say why, so that a failure under load can be told apart */
        fprintf(stderr, "srv_http %s %s: %s\n", method ? method : (body ? "POST" : "GET"), path, curl_easy_strerror(rc));
        status = -1;
    }
    curl_slist_free_all(hs);
    curl_easy_cleanup(c);
    if (out) *out = b.data;
    else free(b.data);
    if (head_out) *head_out = h.data;
    else free(h.data);
    return status;
}

/* ---- raw sockets ------------------------------------------------------------ */

/* Send p[0..n) on a socket, giving up quietly when the peer has closed (a
 * server may answer and close before a request's end; a fake backend's
 * client may go away). */
static inline void srv_send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        p += k;
        n -= (size_t)k;
    }
}

/* ---- answers ---------------------------------------------------------------- */

/* text parsed as JSON (the test fails when it is not); json_decref it. */
static inline json_t *srv_json(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (j == NULL) fail_msg("not JSON (%s): %.300s", e.text, text);
    return j;
}

/* What a whole chat answer says: the reply (malloc'd) and its usage. */
typedef struct SrvTurn {
    char *reply;
    long prompt_tokens, cached_tokens, completion_tokens;
} SrvTurn;

static inline SrvTurn srv_turn_of(const json_t *answer) {
    SrvTurn t;
    t.reply = strdup(json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(answer, "choices"), 0), "message"), "content")));
    const json_t *u = json_object_get(answer, "usage");
    t.prompt_tokens = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
    t.completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
    t.cached_tokens = (long)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    return t;
}

/* ---- metrics ---------------------------------------------------------------- */

/* The value of the sample line `series` (a name and its labels, as
 * printed) in Prometheus text; -1 when there is none. Only sample lines
 * count: a "# HELP name ..." line names the series too. */
static inline double srv_metric_in(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ') return atof(p + n + 1);
    return -1;
}

/* GET /metrics (the test fails unless it answers 200); the caller frees it. */
static inline char *srv_metrics_text(const Srv *s) {
    char *out = NULL;
    long st = srv_http(s, NULL, "/metrics", NULL, NULL, &out, NULL, 0);
    if (st != 200) {
        free(out);
        fail_msg("/metrics: status %ld", st);
    }
    return out;
}

/* The value of one series on the server's /metrics now (-1: absent). */
static inline double srv_metric(const Srv *s, const char *series) {
    char *text = srv_metrics_text(s);
    double v = srv_metric_in(text, series);
    free(text);
    return v;
}

#endif
