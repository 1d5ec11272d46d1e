/* test_server.c — `mnemo serve` end to end over HTTP on a free loopback
 * port: multi-turn conversations on every test model report their earlier
 * prompt + reply as cached and give the same greedy text with the prefix
 * cache on and off; 16 concurrent conversations equal their solo runs;
 * streams are valid SSE equal to the whole answer; every error case answers
 * with its status and an OpenAI error object and the server keeps serving;
 * a client that disconnects mid-stream frees its request. */
#include "test_util.h"
#include "test_serve_util.h"

#include "base/version.h"

#include <stdbool.h>

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/runner.h"
#include "model/model.h"

/* ---- HTTP ----------------------------------------------------------------------- */

/* method GET when body is NULL. Returns the status; *out the body (free). */
static long http(const Srv *s, const char *path, const char *body, const char *header, char **out, size_t abort_after) {
    const char *headers[] = {header, NULL};
    return srv_http(s, NULL, path, body, headers, out, NULL, abort_after);
}

/* The value of header name in a response's header block (case-insensitive
 * name), copied into buf; NULL when absent. */
static const char *header_value(const char *head, const char *name, char *buf, size_t cap) {
    size_t n = strlen(name);
    for (const char *line = head; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncasecmp(line, name, n) != 0 || line[n] != ':') continue;
        const char *v = line + n + 1;
        while (*v == ' ') v++;
        size_t len = strcspn(v, "\r\n");
        snprintf(buf, cap, "%.*s", (int)len, v);
        return buf;
    }
    return NULL;
}

/* How many lines of text begin with prefix. */
static int count_lines(const char *text, const char *prefix) {
    int n = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        n += strncmp(l, prefix, strlen(prefix)) == 0;
    return n;
}

/* ---- conversations ---------------------------------------------------------------- */

typedef SrvTurn Turn;

/* A request body for msgs (user, assistant, user, ...) as JSON. */
static char *chat_body_ex(const char *const *msgs, int n, int max_tokens, bool stream, double temperature, int seed) {
    json_t *arr = json_array();
    json_array_append_new(arr, json_pack("{s:s,s:s}", "role", "system", "content", "You tell short stories."));
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:s,s:s}", "role", i % 2 ? "assistant" : "user", "content", msgs[i]));
    json_t *req = json_pack("{s:s,s:o,s:i,s:f,s:b,s:b,s:i}", "model", "test", "messages", arr, "max_tokens", max_tokens,
                            "temperature", temperature, "ignore_eos", 1, "stream", stream, "seed", seed);
    char *s = json_dumps(req, 0);
    json_decref(req);
    return s;
}

static char *chat_body(const char *const *msgs, int n, int max_tokens, bool stream) {
    return chat_body_ex(msgs, n, max_tokens, stream, 0.0, 1);
}

/* The whole answer (choices[0].message.content) of a body; malloc'd. */
static char *whole_answer(const Srv *s, const char *body) {
    char *out;
    assert_int_equal(http(s, "/v1/chat/completions", body, NULL, &out, 0), 200);
    json_t *j = srv_json(out);
    char *text = strdup(json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content")));
    json_decref(j);
    free(out);
    return text;
}

/* In a helper thread (in_thread) failures are returned as the reply text,
 * since cmocka's asserts work only on the test's own thread. */
static Turn chat_turn_ex(const Srv *s, const char *const *msgs, int n, int max_tokens, const char *header,
                         bool in_thread) {
    char *body = chat_body(msgs, n, max_tokens, false), *out;
    long st = http(s, "/v1/chat/completions", body, header, &out, 0);
    if (st != 200 && in_thread) {
        Turn bad = {0};
        size_t cap = strlen(out) + 32;
        bad.reply = malloc(cap);
        snprintf(bad.reply, cap, "HTTP %ld: %s", st, out);
        bad.completion_tokens = -1;
        free(out);
        free(body);
        return bad;
    }
    if (st != 200) fail_msg("status %ld: %s", st, out);
    json_t *j = srv_json(out);
    Turn t = srv_turn_of(j);
    /* the model that answered, whatever the request named ("test") */
    assert_string_equal(json_string_value(json_object_get(j, "model")), s->model);
    json_decref(j);
    free(out);
    free(body);
    return t;
}

static Turn chat_turn(const Srv *s, const char *const *msgs, int n, int max_tokens, const char *header) {
    return chat_turn_ex(s, msgs, n, max_tokens, header, false);
}

/* Three turns; each later turn must find the previous prompt + reply cached,
 * all of it: the full blocks of 8 and the rows of the last, partial one.
 * Returns the replies joined, for comparisons. */
static char *conversation_ex(const Srv *s, const char *first, bool expect_cache, const char *header, bool in_thread) {
    const char *msgs[6] = {first, NULL, "Tell me more.", NULL, "And then?", NULL};
    char *all = calloc(1, 1);
    long prev_total = 0;
    for (int turn = 0; turn < 3; turn++) {
        Turn t = chat_turn_ex(s, msgs, 2 * turn + 1, 12, header, in_thread);
        if (!in_thread) assert_int_equal(t.completion_tokens, 12);
        long expected = expect_cache && turn > 0 ? prev_total : 0;
        if (!in_thread && t.cached_tokens != expected)
            fail_msg("turn %d: cached_tokens %ld, expected %ld (previous prompt + reply = %ld tokens)", turn + 1,
                     t.cached_tokens, expected, prev_total);
        prev_total = t.prompt_tokens + t.completion_tokens;
        msgs[2 * turn + 1] = t.reply;
        all = realloc(all, strlen(all) + strlen(t.reply) + 2);
        strcat(all, t.reply);
        strcat(all, "|");
    }
    free((char *)msgs[1]);
    free((char *)msgs[3]);
    free((char *)msgs[5]);
    return all;
}

static char *conversation(const Srv *s, const char *first, bool expect_cache, const char *header) {
    return conversation_ex(s, first, expect_cache, header, false);
}

static void check_multi_turn(const char *model) {
    Srv on, off;
    if (srv_start(&on, model, "") != 0) return;
    srv_start(&off, model, "--no-prefix-cache");
    char *a = conversation(&on, "Once upon a time there was a dragon.", true, NULL);
    char *b = conversation(&off, "Once upon a time there was a dragon.", false, NULL);
    assert_string_equal(a, b);
    /* the last turn's reply is also remembered: a fourth request repeating
     * the same conversation again hits everything but the new tail */
    free(a);
    free(b);
    srv_stop(&on);
    srv_stop(&off);
}

static void test_multi_turn_stories(void **st) { check_multi_turn("stories260K"); }
static void test_multi_turn_llama_f32(void **st) { check_multi_turn("tiny-llama-spm-f32"); }
static void test_multi_turn_llama_q8_0(void **st) { check_multi_turn("tiny-llama-spm-q8_0"); }
static void test_multi_turn_llama_q4_0(void **st) { check_multi_turn("tiny-llama-spm-q4_0"); }
static void test_multi_turn_qwen2(void **st) { check_multi_turn("tiny-qwen2-gpt2-f32"); }
static void test_multi_turn_mha_f16(void **st) { check_multi_turn("tiny-mha-spm-f16"); }

/* ---- concurrency ---------------------------------------------------------------- */

typedef struct Conv {
    const Srv *s;
    char first[64];
    char *result;
} Conv;

static void *conv_main(void *arg) {
    Conv *c = arg;
    c->result = conversation_ex(c->s, c->first, false, NULL, true);
    return NULL;
}

static void test_concurrent(void **st) {
    Srv s;
    if (srv_start(&s, "tiny-llama-spm-q8_0", "--parallel 4") != 0) return;
    enum { N = 16 };
    Conv cs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        cs[i].s = &s;
        snprintf(cs[i].first, sizeof cs[i].first, "Story number %d begins here.", i);
        pthread_create(&th[i], NULL, conv_main, &cs[i]);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    srv_stop(&s);
    /* each alone, on a fresh server without the cache */
    Srv solo;
    srv_start(&solo, "tiny-llama-spm-q8_0", "--no-prefix-cache --parallel 1");
    for (int i = 0; i < N; i++) {
        char *alone = conversation(&solo, cs[i].first, false, NULL);
        assert_string_equal(cs[i].result, alone);
        free(alone);
        free(cs[i].result);
    }
    srv_stop(&solo);
}

/* ---- streaming ------------------------------------------------------------------ */

/* Random-weight models emit byte tokens that do not form valid UTF-8: they
 * must become U+FFFD the same way in the stream and in the whole answer. */
/* temperature > 0: sample (seeded) until the answer holds a U+FFFD, so the
 * replacement of invalid UTF-8 is exercised. */
static void check_stream(const char *model, double temperature) {
    Srv s;
    if (srv_start(&s, model, "") != 0) return;
    const char *msgs[1] = {"Once upon a time"};
    int seed = 1;
    int n_tokens = temperature > 0 ? 200 : 40;
    char *whole = NULL;
    for (; seed <= 30; seed++) {
        char *wb = chat_body_ex(msgs, 1, n_tokens, false, temperature, seed);
        whole = whole_answer(&s, wb);
        free(wb);
        if (temperature == 0 || strstr(whole, "\xEF\xBF\xBD")) break;
        free(whole);
        whole = NULL;
    }
    assert_non_null(whole); /* a sampled answer with a replacement character was found */
    char *body = chat_body_ex(msgs, 1, n_tokens, true, temperature, seed), *out;
    assert_int_equal(http(&s, "/v1/chat/completions", body, NULL, &out, 0), 200);
    /* valid SSE: "data: " lines separated by blank lines, ending with [DONE] */
    char *all = calloc(1, 1);
    bool saw_done = false, saw_finish = false;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == ':') continue;
        assert_true(strncmp(line, "data: ", 6) == 0);
        assert_false(saw_done);
        if (strcmp(line + 6, "[DONE]") == 0) {
            saw_done = true;
            continue;
        }
        json_t *j = srv_json(line + 6);
        assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *piece = json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
        if (piece) {
            all = realloc(all, strlen(all) + strlen(piece) + 1);
            strcat(all, piece);
        }
        if (json_is_string(json_object_get(ch, "finish_reason"))) saw_finish = true;
        json_decref(j);
    }
    assert_true(saw_done && saw_finish);
    assert_string_equal(all, whole);
    free(whole);
    free(all);
    free(out);
    free(body);
    srv_stop(&s);
}

static void test_stream(void **st) { check_stream("stories260K", 0.0); }
static void test_stream_bytes(void **st) { check_stream("tiny-llama-spm-q4_0", 2.0); }

/* ---- errors ---------------------------------------------------------------------- */

/* An error answer: its status, an OpenAI error object whose message holds
 * in_message (NULL: any) and, when is_param, whose param is param (NULL:
 * JSON null). */
static void expect_error_param(const Srv *s, const char *path, const char *body, const char *header, long status,
                               const char *in_message, bool is_param, const char *param) {
    char *out;
    long got = http(s, path, body, header, &out, 0);
    if (got != status) fail_msg("%s %s: status %ld, expected %ld: %s", path, body ? body : "", got, status, out);
    json_t *j = srv_json(out);
    json_t *e = json_object_get(j, "error");
    assert_non_null(e);
    const char *msg = json_string_value(json_object_get(e, "message"));
    assert_non_null(msg);
    assert_non_null(json_string_value(json_object_get(e, "type")));
    if (in_message && !strstr(msg, in_message)) fail_msg("message '%s' lacks '%s'", msg, in_message);
    json_t *pj = json_object_get(e, "param");
    if (is_param && param == NULL) assert_true(json_is_null(pj));
    if (is_param && param && (!json_is_string(pj) || strcmp(json_string_value(pj), param) != 0))
        fail_msg("%s: param %s, expected %s", body, json_is_string(pj) ? json_string_value(pj) : "null", param);
    json_decref(j);
    free(out);
}

static void expect_error(const Srv *s, const char *path, const char *body, const char *header, long status,
                         const char *in_message) {
    expect_error_param(s, path, body, header, status, in_message, false, NULL);
}

static void expect_param(const Srv *s, const char *path, const char *body, long status, const char *in_message,
                         const char *param) {
    expect_error_param(s, path, body, NULL, status, in_message, true, param);
}

static void test_errors(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--max-body 1") != 0) return;
    expect_error(&s, "/v1/chat/completions", "{not json", NULL, 400, "JSON");
    expect_error(&s, "/v1/chat/completions", "{\"messages\": 3}", NULL, 400, "messages");
    expect_error(&s, "/v1/chat/completions", "{\"messages\": [{\"role\":\"user\",\"content\":\"hi\"}], \"n\": 2}", NULL, 400, "n");
    expect_error(&s, "/v1/chat/completions", "{\"messages\": [{\"role\":\"user\",\"content\":\"hi\"}], \"temperature\": \"hot\"}", NULL, 400, "temperature");
    expect_error(&s, "/v1/chat/completions", "{\"messages\": [{\"role\":\"user\",\"content\":\"hi\"}], \"max_tokens\": 100000}", NULL, 400, "context");
    expect_error(&s, "/v1/completions", "{\"prompt\": [1, 99999]}", NULL, 400, "out of range");
    expect_error(&s, "/detokenize", "{\"tokens\": [5, 100000]}", NULL, 400, "range");
    expect_error(&s, "/v1/nothing", "{}", NULL, 404, NULL);
    expect_error(&s, "/v1/chat/completions", NULL, NULL, 405, "GET");
    expect_error(&s, "/v1/chat/completions", "{\"messages\": [{\"role\":\"user\",\"content\":\"hi\"}], \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", NULL, 400, "stop");
    char big[2048];
    memset(big, ' ', sizeof big - 1);
    big[0] = '{';
    big[sizeof big - 2] = '}';
    big[sizeof big - 1] = '\0';
    expect_error(&s, "/v1/chat/completions", big, NULL, 413, NULL);
    /* still serving */
    char *out;
    assert_int_equal(http(&s, "/health", NULL, NULL, &out, 0), 200);
    free(out);
    assert_int_equal(http(&s, "/v1/models", NULL, NULL, &out, 0), 200);
    assert_non_null(strstr(out, "stories260K.gguf"));
    free(out);
    assert_int_equal(http(&s, "/tokenize", "{\"content\": \"Once upon a time\", \"add_special\": true}", NULL, &out, 0), 200);
    assert_string_equal(out, "{\"tokens\":[1,403,407,261,378]}");
    free(out);
    assert_int_equal(http(&s, "/detokenize", "{\"tokens\": [403,407,261,378]}", NULL, &out, 0), 200);
    assert_string_equal(out, "{\"content\":\"Once upon a time\"}");
    free(out);
    assert_int_equal(http(&s, "/v1/completions", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4, \"temperature\": 0}", NULL, &out, 0), 200);
    assert_non_null(strstr(out, "text_completion"));
    free(out);
    srv_stop(&s);
}

static void test_api_keys(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--api-key alpha --api-key beta") != 0) return;
    expect_error(&s, "/v1/models", NULL, NULL, 401, NULL);
    expect_error(&s, "/v1/models", NULL, "Authorization: Bearer wrong", 401, NULL);
    char *out;
    assert_int_equal(http(&s, "/health", NULL, NULL, &out, 0), 200);
    free(out);
    assert_int_equal(http(&s, "/metrics", NULL, NULL, &out, 0), 200);
    free(out);
    /* each key is its own namespace: beta never hits alpha's entries, and the
     * namespace header is ignored when keys are set */
    const char *msgs[1] = {"Once upon a time there was a cat."};
    Turn a = chat_turn(&s, msgs, 1, 8, "Authorization: Bearer alpha");
    Turn a2 = chat_turn(&s, msgs, 1, 8, "Authorization: Bearer alpha");
    assert_true(a2.cached_tokens > 0);
    Turn b = chat_turn(&s, msgs, 1, 8, "Authorization: Bearer beta");
    assert_int_equal(b.cached_tokens, 0);
    assert_string_equal(a.reply, b.reply);
    free(a.reply);
    free(a2.reply);
    free(b.reply);
    srv_stop(&s);
    /* without keys, the namespace header separates tenants */
    if (srv_start(&s, "stories260K", "") != 0) return;
    Turn x = chat_turn(&s, msgs, 1, 8, "X-Cache-Namespace: one");
    Turn y = chat_turn(&s, msgs, 1, 8, "X-Cache-Namespace: two");
    Turn z = chat_turn(&s, msgs, 1, 8, "X-Cache-Namespace: one");
    assert_int_equal(y.cached_tokens, 0);
    assert_true(z.cached_tokens > 0);
    free(x.reply);
    free(y.reply);
    free(z.reply);
    srv_stop(&s);
}

static long metric(const Srv *s, const char *name) { return (long)srv_metric(s, name); }

/* The start-up line and mnemo_build_info name the version and the commit
 * that `mnemo --version` reports; the line says "mnemo: version ...", not
 * "mnemo: mnemo ...". */
static void test_build_info(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
    char cmd[600], want[512], line[128];
    snprintf(cmd, sizeof cmd, "%s --version", getenv("MNEMO_BIN") ? getenv("MNEMO_BIN") : "./build/release/mnemo");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(line, sizeof line, p));
    assert_int_equal(pclose(p), 0);
    line[strcspn(line, "\n")] = '\0'; /* "mnemo VERSION (commit HASH)" */
    assert_memory_equal(line, "mnemo ", 6);
    char *log = test_read_file(s.log, NULL);
    snprintf(want, sizeof want, "\nmnemo: version %s serving stories260K.gguf on http://", line + 6);
    if (strstr(log, want) == NULL) fail_msg("no '%s' in the log:\n%s", want + 1, log);
    assert_null(strstr(log, "mnemo: mnemo"));
    free(log);
    char commit[64];
    const char *c = strstr(line, "(commit ");
    assert_non_null(c);
    snprintf(commit, sizeof commit, "%.*s", (int)strcspn(c + 8, ")"), c + 8);
    snprintf(want, sizeof want, "mnemo_build_info{version=\"%s\",commit=\"%s\"} 1\n", MNEMO_VERSION, commit);
    char *out;
    assert_int_equal(http(&s, "/metrics", NULL, NULL, &out, 0), 200);
    if (strstr(out, want) == NULL) fail_msg("no '%s' in /metrics:\n%.2000s", want, out);
    free(out);
    srv_stop(&s);
}

/* --step-ms sets the step-time target, which the start-up line names (a
 * negative one is refused: test_cli's one-line errors). */
static void test_step_ms_flag(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--step-ms 250") != 0) return;
    char *log = test_read_file(s.log, NULL);
    if (strstr(log, "batch 512 tokens, steps of 250 ms)") == NULL) fail_msg("log:\n%s", log);
    free(log);
    srv_stop(&s);
}

/* llama-server's flags: -np, --ctx-size, -b and -n set mnemo's options (-n:
 * max_tokens of a request that gives none); -ngl and -fa are accepted with
 * one warning. */
static void test_llama_flags(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "-np 2 --ctx-size 256 -b 64 -n 3 -ngl 99 -fa on") != 0) return;
    char *log = test_read_file(s.log, NULL);
    if (strstr(log, "(context 256, 2 parallel, batch 64 tokens, steps of 500 ms)") == NULL ||
        count_lines(log, "mnemo serve: warning: -ngl (--n-gpu-layers) and -fa (--flash-attn) do nothing") != 1)
        fail_msg("log:\n%s", log);
    free(log);
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], "
                       "\"ignore_eos\": true, \"temperature\": 0}";
    char *out;
    assert_int_equal(http(&s, "/v1/chat/completions", body, NULL, &out, 0), 200);
    json_t *j = srv_json(out);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                          "finish_reason")),
                        "length");
    json_decref(j);
    free(out);
    /* a request's own max_tokens wins */
    const char *body5 = "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], "
                        "\"ignore_eos\": true, \"max_tokens\": 5}";
    assert_int_equal(http(&s, "/v1/chat/completions", body5, NULL, &out, 0), 200);
    j = srv_json(out);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 5);
    json_decref(j);
    free(out);
    srv_stop(&s);
}

/* The cost profile cached under ~/.cache/mnemo is keyed by everything it
 * depends on: a server with another thread count measures its own and
 * leaves the first one's in place, so the first set-up loads it again. */
static void test_profile_per_setup(void **st) {
    char home[] = "/tmp/mnemo-test-home-XXXXXX";
    test_make_dir(home);
    const char *old_home = getenv("HOME");
    char *saved = old_home ? strdup(old_home) : NULL;
    setenv("HOME", home, 1);
    static const struct {
        const char *flags, *want;
    } runs[] = {
        {"-t 1", "cost profile measured, cached in"},
        {"-t 2", "cost profile measured, cached in"},
        {"-t 1", "cost profile loaded from"},
        {"-t 2", "cost profile loaded from"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        Srv s;
        if (srv_start(&s, "stories260K", runs[i].flags) != 0) break;
        char *log = test_read_file(s.log, NULL);
        char want[700];
        snprintf(want, sizeof want, "%s %s/.cache/mnemo/cost-", runs[i].want, home);
        if (strstr(log, want) == NULL) fail_msg("start %zu (%s): no '%s' in\n%s", i, runs[i].flags, want, log);
        free(log);
        srv_stop(&s);
    }
    if (saved) setenv("HOME", saved, 1);
    else unsetenv("HOME");
    free(saved);
    test_rm_home(home);
}

static void test_disconnect_and_queue(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--parallel 1 --max-queue 1") != 0) return;
    const char *msgs[1] = {"Once upon a time"};
    char *body = chat_body(msgs, 1, 400, true);
    /* read the first bytes of a long stream, then hang up */
    assert_int_equal(http(&s, "/v1/chat/completions", body, NULL, NULL, 10), 200);
    /* the request may still be queued when the client hangs up: wait until
     * it has been admitted and cancelled, holding no block */
    long running = -1, used = -1;
    TEST_WAIT_UNTIL((running = metric(&s, "mnemo_running_sequences"),
                     used = metric(&s, "mnemo_pool_blocks{state=\"used\"}"), running == 0 && used == 0),
                    "the hung-up request still runs (%ld running, %ld pool blocks used)", running, used);
    free(body);
    srv_stop(&s);
}

typedef struct Slow {
    const Srv *s;
    long status;
} Slow;

static void *slow_main(void *arg) {
    Slow *w = arg;
    const char *msgs[1] = {"Once upon a time"};
    char *body = chat_body(msgs, 1, 300, false);
    w->status = http(w->s, "/v1/chat/completions", body, NULL, NULL, 0);
    free(body);
    return NULL;
}

static void test_queue_full(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--parallel 1 --max-queue 1") != 0) return;
    enum { N = 6 };
    Slow w[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        w[i].s = &s;
        pthread_create(&th[i], NULL, slow_main, &w[i]);
    }
    int n_503 = 0, n_200 = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        n_503 += w[i].status == 503;
        n_200 += w[i].status == 200;
    }
    assert_true(n_503 >= 1);
    assert_true(n_200 >= 1);
    assert_int_equal(n_503 + n_200, N);
    srv_stop(&s);
}

/* SIGTERM drains: a stream in flight runs to its end, then the server
 * exits 0; with --drain-timeout it is cancelled when the time is up. */
typedef struct Drain {
    const Srv *s;
    atomic_int got_bytes;
    long status;
    char *out;
} Drain;

static size_t drain_data(char *p, size_t sz, size_t n, void *ctx) {
    Drain *d = ctx;
    size_t len = strlen(d->out);
    d->out = realloc(d->out, len + sz * n + 1);
    memcpy(d->out + len, p, sz * n);
    d->out[len + sz * n] = '\0';
    atomic_store(&d->got_bytes, 1);
    return sz * n;
}

static void *drain_main(void *arg) {
    Drain *d = arg;
    const char *msgs[1] = {"Once upon a time"};
    char *body = chat_body_ex(msgs, 1, 420, true, 0.0, 1);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", d->s->port);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, drain_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, d);
    curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &d->status);
    curl_easy_cleanup(c);
    free(body);
    return NULL;
}

/* Start a server with flags, stream n long answers at once, SIGTERM it
 * once they all stream; the server must exit 0. d[i].out: stream i's
 * bytes (the caller frees them); returns the server's log (freed by the
 * caller), or NULL when the model is missing. */
static char *sigterm_mid_stream(const char *flags, Drain *d, int n) {
    Srv s;
    if (srv_start(&s, "stories260K", flags) != 0) return NULL;
    pthread_t th[4];
    assert_true(n <= 4);
    for (int i = 0; i < n; i++) {
        d[i] = (Drain){.s = &s, .out = calloc(1, 1)};
        atomic_init(&d[i].got_bytes, 0);
        pthread_create(&th[i], NULL, drain_main, &d[i]);
    }
    for (int i = 0; i < n; i++)
        while (!atomic_load(&d[i].got_bytes)) usleep(1000);
    kill(s.pid, SIGTERM);
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(d[i].status, 200); /* the stream had begun */
    }
    int status;
    waitpid(s.pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *log = test_read_file(s.log, NULL);
    assert_non_null(log);
    unlink(s.log);
    return log;
}

static void test_sigterm_drains(void **st) {
    Drain d;
    char *log = sigterm_mid_stream("--threads 1 --drain-timeout 60", &d, 1);
    if (log == NULL) return;
    assert_non_null(strstr(d.out, "\"finish_reason\":\"length\""));
    assert_non_null(strstr(d.out, "data: [DONE]"));
    assert_non_null(strstr(log, "draining"));
    assert_null(strstr(log, "cancelled"));
    free(log);
    free(d.out);
}

/* SIGTERM with --drain-timeout 0: the streams in flight are cancelled
 * (they end early, without "length", and the log says so), and the server
 * still exits 0. */
static void test_sigterm_drain_timeout(void **st) {
    Drain d[4]; /* four long streams, so one is surely still running */
    char *log = sigterm_mid_stream("--threads 1 --parallel 4 --drain-timeout 0", d, 4);
    if (log == NULL) return;
    int n_cut = 0;
    for (int i = 0; i < 4; i++) {
        n_cut += strstr(d[i].out, "\"finish_reason\":\"length\"") == NULL;
        free(d[i].out);
    }
    assert_true(n_cut >= 1);
    assert_non_null(strstr(log, "drain timeout: cancelling"));
    assert_non_null(strstr(log, " cancelled"));
    free(log);
}

/* ---- HTTP hardening ---------------------------------------------------------------------- */

/* Raw sockets, for what curl will not send. */
static int raw_connect(const Srv *s) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Everything until the server closes the connection (or resets it after
 * its answer). The poll bound only turns a server that never answers into
 * a failure instead of a hang. */
static char *raw_read_all(int fd, size_t *len) {
    char *out = calloc(1, 1);
    size_t n = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 60000) != 1) fail_msg("no answer (and no close) within 60 s; got %zu bytes: %.200s", n, out);
        char buf[4096];
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) break;
        out = realloc(out, n + (size_t)k + 1);
        memcpy(out + n, buf, (size_t)k);
        n += (size_t)k;
        out[n] = '\0';
    }
    *len = n;
    return out;
}

/* resp[0..len) is exactly one response of status with Content-Type JSON,
 * a Content-Length that covers the rest and an OpenAI error object whose
 * message holds in_message (NULL: any). */
static void expect_one_error(const char *resp, size_t len, long status, const char *in_message) {
    char first[16], buf[128];
    snprintf(first, sizeof first, "HTTP/1.1 %ld ", status);
    if (strncmp(resp, first, strlen(first)) != 0) fail_msg("expected %s...: %.300s", first, resp);
    const char *end = strstr(resp, "\r\n\r\n");
    assert_non_null(end);
    size_t head_len = (size_t)(end - resp) + 4;
    char *head = strndup(resp, head_len);
    assert_non_null(header_value(head, "Content-Type", buf, sizeof buf));
    assert_string_equal(buf, "application/json");
    assert_non_null(header_value(head, "Content-Length", buf, sizeof buf));
    if ((size_t)atol(buf) != len - head_len)
        fail_msg("Content-Length %s but %zu bytes follow the head: %.400s", buf, len - head_len, resp);
    free(head);
    json_t *j = srv_json(resp + head_len);
    json_t *e = json_object_get(j, "error");
    assert_non_null(json_string_value(json_object_get(e, "type")));
    const char *msg = json_string_value(json_object_get(e, "message"));
    assert_non_null(msg);
    if (in_message && !strstr(msg, in_message)) fail_msg("message '%s' lacks '%s'", msg, in_message);
    json_decref(j);
}

/* Read fd to its close (and close it): one error response must have come. */
static void raw_expect_answer(int fd, long status, const char *in_message) {
    size_t len;
    char *resp = raw_read_all(fd, &len);
    close(fd);
    expect_one_error(resp, len, status, in_message);
    free(resp);
}

/* Send req on a new connection; the answer must be one error response. */
static void raw_expect(const Srv *s, const char *req, size_t req_len, long status, const char *in_message) {
    int fd = raw_connect(s);
    srv_send_all(fd, req, req_len);
    raw_expect_answer(fd, status, in_message);
}

/* The server still answers a good request. */
static void expect_serving(const Srv *s) {
    char *out;
    assert_int_equal(http(s, "/tokenize", "{\"content\": \"Once upon a time\"}", NULL, &out, 0), 200);
    assert_string_equal(out, "{\"tokens\":[403,407,261,378]}");
    free(out);
}

static void raw_expect_str(const Srv *s, const char *req, long status, const char *in_message) {
    raw_expect(s, req, strlen(req), status, in_message);
}

/* One response (head + Content-Length body) from a kept-alive connection. */
static char *raw_read_response(int fd) {
    char *out = calloc(1, 1);
    size_t n = 0, need = 0;
    while (need == 0 || n < need) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 60000) != 1) fail_msg("no answer within 60 s: %.200s", out);
        char buf[4096];
        ssize_t k = recv(fd, buf, need ? (need - n < sizeof buf ? need - n : sizeof buf) : 1, 0);
        if (k <= 0) fail_msg("connection closed after %zu bytes: %.200s", n, out);
        out = realloc(out, n + (size_t)k + 1);
        memcpy(out + n, buf, (size_t)k);
        n += (size_t)k;
        out[n] = '\0';
        char *end = need ? NULL : strstr(out, "\r\n\r\n"), cl[32];
        if (end) need = (size_t)(end - out) + 4 + (size_t)atol(header_value(out, "Content-Length", cl, sizeof cl));
    }
    return out;
}

/* Malformed framing and heads: each answered by one well-formed response
 * with an OpenAI error object (libmicrohttpd alone wrote a broken double
 * reply for a bad Content-Length, HTML for the version and size errors,
 * nothing for a bad request line, and took conflicting lengths). */
static void test_http_framing(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--max-body 1") != 0) return;
    raw_expect_str(&s, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nContent-Length: 50\r\n\r\n"
                       "{\"content\":\"hi\"}", 400, "Content-Length");
    raw_expect_str(&s, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400, "Content-Length");
    raw_expect_str(&s, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", 413,
                   "Content-Length");
    raw_expect_str(&s, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello", 400, "Content-Length");
    raw_expect_str(&s, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\nhello", 400, "header");
    raw_expect_str(&s, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "0\r\n\r\n", 400, "Transfer-Encoding");
    raw_expect_str(&s, "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "Transfer-Encoding");
    /* a declared length over --max-body is answered without waiting for the body */
    raw_expect_str(&s, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", 413, "larger than 1024");
    raw_expect_str(&s, "GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HTTP/2.0");
    raw_expect_str(&s, "GET /health HTTP/0.9\r\nHost: x\r\n\r\n", 505, "HTTP/0.9");
    raw_expect_str(&s, "GET /health\r\nHost: x\r\n\r\n", 400, "request line");
    raw_expect_str(&s, "G(T /health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "request line");
    raw_expect_str(&s, "GET /health HTTP/1.1\r\nHost x\r\n\r\n", 400, "colon");
    /* a request line or head larger than the gate looks at */
    enum { BIG = 20000 };
    char *big = malloc(BIG + 4096);
    memset(big, 'a', BIG);
    memcpy(big, "GET /", 5);
    raw_expect(&s, big, BIG, 414, "request line");
    int n = sprintf(big, "GET /health HTTP/1.1\r\n");
    for (int i = 0; n < BIG; i++) n += sprintf(big + n, "X-Filler-%d: %0100d\r\n", i, 0);
    raw_expect(&s, big, (size_t)n, 431, "head");
    n = sprintf(big, "GET /health HTTP/1.1\r\n");
    for (int i = 0; i < 200; i++) n += sprintf(big + n, "X-%d: 1\r\n", i);
    n += sprintf(big + n, "\r\n");
    raw_expect(&s, big, (size_t)n, 431, "header lines");
    free(big);
    /* a head sent in pieces is judged whole; a good one is served, and the
     * connection stays open for a second request */
    int fd = raw_connect(&s);
    srv_send_all(fd, "GET /heal", 9);
    srv_send_all(fd, "th HTTP/1.1\r\nHo", 15);
    srv_send_all(fd, "st: x\r\n\r\n", 9);
    char *resp = raw_read_response(fd);
    assert_true(strncmp(resp, "HTTP/1.1 200 ", 13) == 0);
    free(resp);
    srv_send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 33);
    resp = raw_read_response(fd);
    assert_true(strncmp(resp, "HTTP/1.1 200 ", 13) == 0);
    free(resp);
    close(fd);
    fd = raw_connect(&s);
    srv_send_all(fd, "POST /tokenize HTTP/1.1\r\nContent-Le", 35);
    srv_send_all(fd, "ngth: x5\r\n\r\n", 12);
    raw_expect_answer(fd, 400, "Content-Length");
    expect_serving(&s);
    srv_stop(&s);
}

/* A chunked body that passes --max-body is answered 413 as soon as it does
 * (it was read to its end, however long), and the connection is closed.
 * The client sends only a little past the limit and then waits: a server
 * that waits for the rest never answers. */
static void test_http_chunked_limit(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--max-body 1") != 0) return;
    const size_t limit = 1024, chunk = 256;
    int fd = raw_connect(&s);
    const char *head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n";
    srv_send_all(fd, head, strlen(head));
    char piece[512];
    int n = sprintf(piece, "%zx\r\n", chunk);
    memset(piece + n, ' ', chunk);
    memcpy(piece + n + chunk, "\r\n", 2);
    size_t sent = 0;
    while (sent <= limit) { /* stop once past the limit (or answered) */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) == 1) break;
        srv_send_all(fd, piece, (size_t)n + chunk + 2);
        sent += chunk;
    }
    assert_true(sent < 4 * limit);
    raw_expect_answer(fd, 413, "larger than 1024"); /* the answer, then the close */
    expect_serving(&s);
    srv_stop(&s);
}

/* Connections that never send a request are closed after --idle-timeout
 * (it used to be a fixed 600 s, so a client holding the connection limit
 * shut everyone else out for ten minutes), and then the server serves
 * again. The idle connections fill the per-IP limit; each must see its
 * close (EOF) within the hang guard, far above the 5 s timeout. A stream
 * still ends whole under the short timeout. */
static void test_http_idle_limit(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--max-connections 8 --max-per-ip 4 --idle-timeout 5") != 0) return;
    int fds[4];
    for (int i = 0; i < 4; i++) fds[i] = raw_connect(&s);
    for (int i = 0; i < 4; i++) {
        size_t len;
        char *got = raw_read_all(fds[i], &len); /* fails after 60 s without the close */
        assert_int_equal(len, 0);
        free(got);
        close(fds[i]);
    }
    /* the server gives a closed connection's place back a moment after
     * the client sees the close: until then the per-IP limit still counts
     * it (a request at once was refused under load) */
    TEST_WAIT_UNTIL(http(&s, "/tokenize", "{\"content\": \"Once\"}", NULL, NULL, 0) == 200,
                    "the server does not serve again after its idle connections closed; see %s", s.log);
    expect_serving(&s);
    char *out;
    assert_int_equal(http(&s, "/v1/completions",
                          "{\"prompt\":\"Once\",\"max_tokens\":64,\"ignore_eos\":true,\"stream\":true}", NULL, &out,
                          0),
                     200);
    assert_non_null(strstr(out, "data: [DONE]"));
    free(out);
    srv_stop(&s);
}

/* --max-per-ip holds: with a limit of 2, three connections from 127.0.0.1
 * that each send a whole head and then wait (the gate hands such a
 * connection over at once, so nothing waits on time) leave one refused —
 * closed unanswered, the log saying which limit — and a request on a new
 * connection is refused too while the two are held; once one of them
 * closes, requests are served again. The idle timeout is long: only the
 * limit closes a connection here. */
static void test_http_per_ip_limit(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--max-connections 8 --max-per-ip 2 --idle-timeout 3600") != 0) return;
    const char *head = "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 100\r\n\r\n";
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = raw_connect(&s);
        srv_send_all(fds[i], head, strlen(head));
    }
    int refused = -1;
    struct pollfd p[3];
    for (int i = 0; i < 3; i++) p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    TEST_WAIT_UNTIL(poll(p, 3, 0) > 0, "none of three connections was refused with --max-per-ip 2; see %s", s.log);
    for (int i = 0; i < 3; i++)
        if (p[i].revents) {
            char c;
            assert_true(recv(fds[i], &c, 1, 0) <= 0); /* closed unanswered (reset: the head was unread) */
            assert_int_equal(refused, -1);
            refused = i;
        }
    char *log = test_read_file(s.log, NULL);
    assert_non_null(strstr(log, "cannot take a connection: --max-per-ip reached"));
    free(log);
    assert_int_equal(http(&s, "/health", NULL, NULL, NULL, 0), -1); /* the two held fill the limit */
    close(fds[refused]);
    close(fds[refused == 0 ? 1 : 0]); /* one of the held ones: its slot frees */
    TEST_WAIT_UNTIL(http(&s, "/health", NULL, NULL, NULL, 0) == 200, "not served after a held connection closed");
    for (int i = 0; i < 3; i++)
        if (i != refused && i != (refused == 0 ? 1 : 0)) close(fds[i]);
    srv_stop(&s);
}

/* SIGTERM stops the server with exit status 0 (the hang guard the only
 * time bound); its log stays for srv's caller to remove. */
static void expect_sigterm_exit(Srv *s) {
    kill(s->pid, SIGTERM);
    int status = 0;
    TEST_WAIT_UNTIL(waitpid(s->pid, &status, WNOHANG) == s->pid, "no exit within %d s of SIGTERM; see %s",
                    TEST_HANG_GUARD_S, s->log);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) fail_msg("exit status 0x%x; see %s", status, s->log);
}

/* Marks closed[i] for each of fds[0..n) the server has closed (EOF or
 * reset; they were sent nothing, so nothing else arrives); true once all
 * are. */
static bool all_closed_by_server(const int *fds, bool *closed, int n) {
    bool all = true;
    for (int i = 0; i < n; i++) {
        if (closed[i]) continue;
        struct pollfd p = {.fd = fds[i], .events = POLLIN};
        char c;
        if (poll(&p, 1, 0) == 1 && recv(fds[i], &c, 1, MSG_DONTWAIT) <= 0) closed[i] = true;
        else all = false;
    }
    return all;
}

/* More silent connections than --max-connections, handed over together
 * (the gate hands each over when its head wait, capped by --idle-timeout,
 * ends): the server refuses those past the limit and times the others
 * out, then serves again and stops on SIGTERM. libmicrohttpd 0.9.75
 * deadlocked when external connections queued past its own connection
 * limit: every later connection was reset and SIGTERM did nothing, and
 * the connections it held were never closed. The hang guard is the only
 * time bound. */
static void test_http_connection_limit_burst(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--max-connections 8 --max-per-ip 0 --idle-timeout 5") != 0) return;
    enum { N = 20 };
    int fds[N];
    bool closed[N] = {false};
    for (int i = 0; i < N; i++) fds[i] = raw_connect(&s);
    TEST_WAIT_UNTIL(all_closed_by_server(fds, closed, N),
                    "the server did not close all %d silent connections (--max-connections 8); see %s", N, s.log);
    for (int i = 0; i < N; i++) close(fds[i]);
    char *log = test_read_file(s.log, NULL);
    assert_non_null(strstr(log, "cannot take a connection: --max-connections reached"));
    free(log);
    /* the timed-out connections' places come back a moment after their close */
    TEST_WAIT_UNTIL(http(&s, "/tokenize", "{\"content\": \"Once\"}", NULL, NULL, 0) == 200,
                    "the server does not serve again after the connection limit; see %s", s.log);
    expect_serving(&s);
    expect_sigterm_exit(&s);
    unlink(s.log);
}

/* SIGTERM shuts the server down promptly (exit status 0) while many
 * connections are open and idle: more than the gate holds waiting for a
 * head, so some are the library's and some the gate's. The hang guard is
 * the only time bound. */
static void test_sigterm_with_idle_connections(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
    enum { N_IDLE = 200 };
    int fds[N_IDLE];
    for (int i = 0; i < N_IDLE; i++) fds[i] = raw_connect(&s);
    expect_serving(&s); /* the idle ones do not shut it out */
    expect_sigterm_exit(&s);
    for (int i = 0; i < N_IDLE; i++) close(fds[i]);
    unlink(s.log);
}

/* A process out of descriptors does not spin on its listening socket
 * (which stays readable while accept fails): the server, started with a
 * low descriptor limit, is sent more connections than it can take; the
 * log says so once (it logged the failed accept in a busy loop, thousands
 * of lines a second), and once the connections close it serves again. */
static void test_accept_out_of_descriptors(void **st) {
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = 96; /* the server's (inherited); the test's own comes back at once */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    Srv s;
    int rc = srv_start(&s, "stories260K", "--max-connections 200 --idle-timeout 3600");
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    if (rc != 0) return;
    enum { N_CONN = 150 };
    int fds[N_CONN];
    for (int i = 0; i < N_CONN; i++) fds[i] = raw_connect(&s);
    const char *line = "accept: Too many open files";
    char *log = NULL;
    TEST_WAIT_UNTIL((free(log), log = test_read_file(s.log, NULL), log && strstr(log, line)),
                    "no accept failed with %d connections and 96 descriptors; see %s", N_CONN, s.log);
    free(log);
    /* the last connected first: those still in the backlog are closed before
     * any the server holds, so each descriptor a close frees goes to a
     * connection already gone (closed again at once). First to last, a test
     * paused between closes (a loaded machine) let the server accept a live
     * one into the freed descriptor and run short again: a second line. */
    for (int i = N_CONN - 1; i >= 0; i--) close(fds[i]);
    TEST_WAIT_UNTIL(http(&s, "/health", NULL, NULL, NULL, 0) == 200, "not served after the connections closed");
    expect_serving(&s);
    log = test_read_file(s.log, NULL);
    int n = 0;
    for (const char *at = log; (at = strstr(at, line)) != NULL; at++) n++;
    if (n != 1) fail_msg("'%s' logged %d times (once per shortage); see %s", line, n, s.log);
    free(log);
    srv_stop(&s);
}

/* --restore-plan hidden says at start-up when it will store nothing as
 * hidden states: with no cache tier, and on a model whose hidden state is
 * not smaller than its KV (stories260K, f32 activations); on qwen3 Q4_K_M,
 * whose tiers do store hidden states, it says nothing. So does auto, the
 * default: of that model, and over a RAM tier alone (then it stores KV);
 * without tiers, or where it may store hidden states, it says nothing. */
static void test_restore_plan_fallback_is_logged(void **st) {
    static const struct {
        const char *model, *flags, *want; /* want NULL: no --restore-plan line */
    } cases[] = {
        {"stories260K", "--restore-plan hidden", "--restore-plan hidden does nothing: no cache tier is set"},
        {"stories260K", "--restore-plan hidden --ram-tier-mb 4", "--restore-plan hidden: the tiers store KV"},
        {"stories260K", "--restore-plan auto --ram-tier-mb 4", "--restore-plan auto: the tiers store KV"},
        {"qwen3-q4_k_m", "--restore-plan hidden --ram-tier-mb 4", NULL},
        {"qwen3-q4_k_m", "--ram-tier-mb 4", "--restore-plan auto: the RAM tier stores KV"},
        {"qwen3-q4_k_m", "", NULL},
        {"stories260K", "", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Srv s;
        if (srv_start(&s, cases[i].model, cases[i].flags) != 0) return;
        char *log = test_read_file(s.log, NULL);
        assert_non_null(log);
        if (cases[i].want ? strstr(log, cases[i].want) == NULL : strstr(log, "--restore-plan") != NULL)
            fail_msg("%s %s: the log %s '%s':\n%s", cases[i].model, cases[i].flags,
                     cases[i].want ? "lacks" : "has", cases[i].want ? cases[i].want : "--restore-plan", log);
        free(log);
        srv_stop(&s);
    }
}

/* The Bearer scheme is case-insensitive; every 401 says which scheme. */
static void test_http_auth_scheme(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--api-key alpha") != 0) return;
    const char *ok[] = {"Authorization: bearer alpha", "Authorization: BEARER alpha", "Authorization: Bearer  alpha"};
    for (int i = 0; i < 3; i++) {
        const char *h[] = {ok[i], NULL};
        long st_ = srv_http(&s, NULL, "/v1/models", NULL, h, NULL, NULL, 0);
        if (st_ != 200) fail_msg("'%s': status %ld", ok[i], st_);
    }
    const char *bad[] = {NULL, "Authorization: Bearer wrong", "Authorization: Basic YWxwaGE6"};
    for (int i = 0; i < 3; i++) {
        const char *h[] = {bad[i], NULL};
        char *head, *out, buf[64];
        assert_int_equal(srv_http(&s, NULL, "/v1/chat/completions", "{}", h, &out, &head, 0), 401);
        if (!header_value(head, "WWW-Authenticate", buf, sizeof buf)) fail_msg("no WWW-Authenticate: %s", head);
        assert_string_equal(buf, "Bearer");
        free(head);
        free(out);
    }
    srv_stop(&s);
}

/* One request with headers: its status, and Access-Control-Allow-Origin is
 * want_origin (NULL: absent) with Vary: Origin. Returns the response's
 * header block (the caller frees it). */
static char *expect_cors(const Srv *s, const char *method, const char *path, const char *body,
                         const char *const *headers, long status, const char *want_origin) {
    char *head, *out, buf[256];
    assert_int_equal(srv_http(s, method, path, body, headers, &out, &head, 0), status);
    free(out);
    const char *got = header_value(head, "Access-Control-Allow-Origin", buf, sizeof buf);
    if (want_origin == NULL && got != NULL) fail_msg("Access-Control-Allow-Origin %s for an unlisted origin", got);
    if (want_origin) assert_string_equal(got, want_origin);
    assert_non_null(header_value(head, "Vary", buf, sizeof buf));
    assert_non_null(strstr(buf, "Origin"));
    return head;
}

/* --cors-origin: preflights and answers carry the CORS headers for the
 * listed origins only, and every answer varies by Origin. */
static void test_http_cors(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--cors-origin http://a.example --cors-origin http://b.example --api-key k") != 0)
        return;
    char buf[256];
    const char *pre[] = {"Origin: http://a.example", "Access-Control-Request-Method: POST",
                         "Access-Control-Request-Headers: authorization, content-type, x-stainless-os", NULL};
    char *head = expect_cors(&s, "OPTIONS", "/v1/chat/completions", NULL, pre, 204, "http://a.example");
    assert_non_null(strstr(header_value(head, "Access-Control-Allow-Methods", buf, sizeof buf), "POST"));
    assert_non_null(header_value(head, "Access-Control-Allow-Headers", buf, sizeof buf));
    assert_non_null(strcasestr(buf, "Authorization"));
    assert_non_null(strcasestr(buf, "Content-Type"));
    assert_non_null(strcasestr(buf, "x-stainless-os"));
    assert_non_null(header_value(head, "Access-Control-Max-Age", buf, sizeof buf));
    assert_true(atoi(buf) > 0);
    free(head);
    /* an unlisted origin gets no CORS header, so its pages cannot read answers */
    const char *other[] = {"Origin: http://evil.example", "Access-Control-Request-Method: POST", NULL};
    head = expect_cors(&s, "OPTIONS", "/v1/chat/completions", NULL, other, 204, NULL);
    assert_null(header_value(head, "Access-Control-Allow-Methods", buf, sizeof buf));
    free(head);
    /* answers: a listed origin is echoed (on errors too, so the page can read them) */
    const char *body = "{\"content\": \"Once\"}";
    const char *b[] = {"Origin: http://b.example", "Authorization: Bearer k", NULL};
    free(expect_cors(&s, NULL, "/tokenize", body, b, 200, "http://b.example"));
    const char *a_nokey[] = {"Origin: http://a.example", NULL};
    free(expect_cors(&s, NULL, "/tokenize", body, a_nokey, 401, "http://a.example"));
    const char *evil[] = {"Origin: http://evil.example", "Authorization: Bearer k", NULL};
    free(expect_cors(&s, NULL, "/tokenize", body, evil, 200, NULL));
    srv_stop(&s);
    /* without --cors-origin: no CORS headers at all */
    if (srv_start(&s, "stories260K", "") != 0) return;
    char *out;
    assert_int_equal(srv_http(&s, "OPTIONS", "/v1/chat/completions", NULL, pre, &out, &head, 0), 204);
    assert_null(header_value(head, "Access-Control-Allow-Origin", buf, sizeof buf));
    assert_null(header_value(head, "Vary", buf, sizeof buf));
    assert_non_null(strstr(header_value(head, "Allow", buf, sizeof buf), "POST"));
    free(head);
    free(out);
    srv_stop(&s);
}

/* /health and /metrics: other methods answer 405 with Allow; scrapes and
 * health checks are not counted in mnemo_requests_total. */
static void test_http_methods(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
    const char *paths[] = {"/health", "/metrics"};
    for (int i = 0; i < 2; i++) {
        char *head, *out, buf[64];
        assert_int_equal(srv_http(&s, "HEAD", paths[i], NULL, NULL, &out, &head, 0), 405);
        assert_non_null(strstr(header_value(head, "Allow", buf, sizeof buf), "GET"));
        free(head);
        free(out);
        assert_int_equal(srv_http(&s, "POST", paths[i], "{}", NULL, &out, &head, 0), 405);
        assert_non_null(strstr(header_value(head, "Allow", buf, sizeof buf), "GET"));
        free(head);
        json_t *j = srv_json(out);
        assert_non_null(json_object_get(j, "error"));
        json_decref(j);
        free(out);
    }
    char *head, *out, buf[64];
    assert_int_equal(srv_http(&s, NULL, "/v1/chat/completions", NULL, NULL, &out, &head, 0), 405);
    assert_non_null(strstr(header_value(head, "Allow", buf, sizeof buf), "POST"));
    free(head);
    free(out);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(http(&s, "/health", NULL, NULL, NULL, 0), 200);
        assert_int_equal(http(&s, "/metrics", NULL, NULL, NULL, 0), 200);
    }
    assert_int_equal(metric(&s, "mnemo_requests_total{status=\"200\"}"), -1);
    assert_int_equal(metric(&s, "mnemo_requests_total{status=\"405\"}"), 5);
    assert_int_equal(http(&s, "/tokenize", "{\"content\": \"Once\"}", NULL, NULL, 0), 200);
    assert_int_equal(metric(&s, "mnemo_requests_total{status=\"200\"}"), 1);
    srv_stop(&s);
}

/* A percent-encoded NUL in a path stays as written: it does not end the
 * path, so /health%00x is not /health. Other escapes still decode. */
static void test_http_encoded_nul(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
    raw_expect_str(&s, "GET /health%00x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, NULL);
    raw_expect_str(&s, "GET /v1/models%00/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, NULL);
    /* a stored response: ID%00x is not ID, so it is neither deleted nor found */
    char *out, *gone, path[256];
    assert_int_equal(http(&s, "/v1/responses", "{\"input\": \"Once\", \"max_output_tokens\": 2}", NULL, &out, 0), 200);
    json_t *j = srv_json(out);
    const char *id = json_string_value(json_object_get(j, "id"));
    assert_non_null(id);
    snprintf(path, sizeof path, "/v1/responses/%s%%00x", id);
    assert_int_equal(srv_http(&s, "DELETE", path, NULL, NULL, &gone, NULL, 0), 404);
    free(gone);
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    assert_int_equal(http(&s, path, NULL, NULL, &gone, 0), 200);
    free(gone);
    json_decref(j);
    free(out);
    int fd = raw_connect(&s);
    const char *req = "GET /he%61lth HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    srv_send_all(fd, req, strlen(req));
    size_t len;
    char *resp = raw_read_all(fd, &len);
    close(fd);
    assert_true(strncmp(resp, "HTTP/1.1 200 ", 13) == 0);
    free(resp);
    expect_serving(&s);
    srv_stop(&s);
}

/* The server's log has a line holding every regex of want (NULL-ended). */
static void expect_log_line(const Srv *s, const char *const *want) {
    char *log = test_read_file(s->log, NULL);
    assert_non_null(log);
    regex_t re[8];
    int n = 0;
    for (; want[n]; n++) assert_int_equal(regcomp(&re[n], want[n], REG_EXTENDED | REG_NOSUB), 0);
    bool found = false;
    for (char *line = strtok(log, "\n"); line && !found; line = strtok(NULL, "\n")) {
        found = true;
        for (int i = 0; i < n && found; i++) found = regexec(&re[i], line, 0, NULL, 0) == 0;
    }
    for (int i = 0; i < n; i++) regfree(&re[i]);
    if (!found) {
        char *again = test_read_file(s->log, NULL);
        fail_msg("no log line matches %s ...; the log:\n%s", want[0], again);
    }
    free(log);
}

#define LOG_HEAD "^mnemo: [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "

/* Request log lines: time, method, path, status, the id the client saw,
 * stream or not, the prompt tokens dropped to fit the context, the cached
 * tokens by tier; errors in the same form. */
static void test_request_log(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
    const char *msgs[3] = {"Once upon a time there was a cat.", NULL, "And then?"};
    char *body = chat_body(msgs, 1, 8, false), *out, pattern[256];
    assert_int_equal(http(&s, "/v1/chat/completions", body, NULL, &out, 0), 200);
    free(body);
    json_t *j = srv_json(out);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    msgs[1] = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    snprintf(pattern, sizeof pattern, " id=%s stream=0 ", id);
    const char *first[] = {LOG_HEAD "POST /v1/chat/completions 200 id=", pattern,
                           "prompt=[0-9]+ truncated=0 shifted=0 cached=0 cached_pool=0 cached_ram=0 cached_disk=0 cached_redis=0 "
                           "cached_partial=0 generated=8 ttft=[0-9.]+s queue=[0-9.]+s restore=[0-9.]+s total=[0-9.]+s preempted=0$",
                           NULL};
    expect_log_line(&s, first);
    free(id);
    free(out);
    /* the second turn finds the first cached in the pool, down to the rows
     * of its last block, which its prompt and reply filled in part */
    body = chat_body(msgs, 3, 4, true);
    json_decref(j);
    assert_int_equal(http(&s, "/v1/chat/completions", body, NULL, &out, 0), 200);
    free(body);
    char *p = strstr(out, "\"id\":\"");
    assert_non_null(p);
    snprintf(pattern, sizeof pattern, " id=%.*s stream=1 ", (int)strcspn(p + 6, "\""), p + 6);
    const char *second[] = {LOG_HEAD "POST /v1/chat/completions 200 id=", pattern,
                            "cached=([1-9][0-9]*) cached_pool=\\1 cached_ram=0 cached_disk=0 cached_redis=0 "
                            "cached_partial=[1-9][0-9]* generated=4 ",
                            NULL};
    expect_log_line(&s, second);
    assert_true(metric(&s, "mnemo_cached_partial_tokens_total") > 0);
    assert_int_equal(metric(&s, "mnemo_preemptions_total"), 0); /* one slot each: nothing waited */
    assert_int_equal(metric(&s, "mnemo_preempted_recomputed_tokens_total"), 0);
    free(out);
    /* errors: from the server, and from the gate */
    expect_error(&s, "/v1/chat/completions", "{not json", NULL, 400, "JSON");
    const char *e1[] = {LOG_HEAD "POST /v1/chat/completions 400 id=- stream=0 error=\"invalid JSON", NULL};
    expect_log_line(&s, e1);
    expect_error(&s, "/nope", NULL, NULL, 404, NULL);
    const char *e2[] = {LOG_HEAD "GET /nope 404 id=- stream=0 error=\"no route", NULL};
    expect_log_line(&s, e2);
    raw_expect_str(&s, "GET /x HTTP/3.0\r\n\r\n", 505, NULL);
    const char *e3[] = {LOG_HEAD "GET /x 505 id=- stream=0 error=\"HTTP/3.0", NULL};
    expect_log_line(&s, e3);
    srv_stop(&s);
}

/* ---- the OpenAI surface ------------------------------------------------------------ */

/* POST body to path, 200 expected; the parsed answer. */
static json_t *post_ok(const Srv *s, const char *path, const char *body) {
    char *out;
    long st = http(s, path, body, NULL, &out, 0);
    if (st != 200) fail_msg("%s %s: status %ld: %s", path, body, st, out);
    json_t *j = srv_json(out);
    free(out);
    return j;
}

static char *answer_id(const Srv *s) {
    json_t *j = post_ok(s, "/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}");
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    return id;
}

/* A request that names no model is answered with the served id, as
 * /v1/models and /v1/models/{id} list it; every answer and chunk carries a
 * system_fingerprint; ids differ across a restart. */
static void test_model_fingerprint_ids(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
    json_t *j = post_ok(&s, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":2}");
    assert_string_equal(json_string_value(json_object_get(j, "model")), s.model);
    const char *fp = json_string_value(json_object_get(j, "system_fingerprint"));
    assert_non_null(fp);
    assert_true(strncmp(fp, "fp_", 3) == 0 && strlen(fp) == 19);
    char *fp1 = strdup(fp);
    json_decref(j);
    char *out;
    assert_int_equal(http(&s, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,\"stream\":true,"
                          "\"stream_options\":{\"include_usage\":true}}",
                          NULL, &out, 0),
                     200);
    int n_chunks = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: {", 7) != 0) continue;
        json_t *c = srv_json(line + 6);
        assert_string_equal(json_string_value(json_object_get(c, "model")), s.model);
        assert_string_equal(json_string_value(json_object_get(c, "system_fingerprint")), fp1);
        json_decref(c);
        n_chunks++;
    }
    assert_true(n_chunks >= 3);
    free(out);
    /* /v1/models/{id} */
    char path[256];
    snprintf(path, sizeof path, "/v1/models/%s", s.model);
    assert_int_equal(http(&s, path, NULL, NULL, &out, 0), 200);
    j = srv_json(out);
    assert_string_equal(json_string_value(json_object_get(j, "id")), s.model);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "model");
    json_decref(j);
    free(out);
    assert_int_equal(http(&s, "/v1/models/gpt-4o", NULL, NULL, &out, 0), 404);
    j = srv_json(out);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "model_not_found");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "model");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "gpt-4o"));
    json_decref(j);
    free(out);
    char *id1 = answer_id(&s);
    srv_stop(&s);
    /* a restart: new ids, the same fingerprint */
    srv_start(&s, "stories260K", "");
    char *id2 = answer_id(&s);
    assert_string_not_equal(id1, id2);
    assert_true(strncmp(id2, "chatcmpl-", 9) == 0);
    j = post_ok(&s, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":2}");
    assert_string_equal(json_string_value(json_object_get(j, "system_fingerprint")), fp1);
    assert_true(strncmp(json_string_value(json_object_get(j, "id")), "cmpl-", 5) == 0);
    json_decref(j);
    free(id1);
    free(id2);
    free(fp1);
    srv_stop(&s);
}

/* The fields mnemo does not implement are refused naming them (tools
 * where the chat format cannot show them); logit_bias
 * ids must be in the vocabulary; a prompt too long names prompt or
 * messages; max_tokens past the context gives the allowed range. */
static void test_refused_and_ranges(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
#define CHAT_WITH(x) "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," x "}"
    const char *chat = "/v1/chat/completions", *cmpl = "/v1/completions";
    /* stories260K has no template: its built-in format cannot show tools */
    expect_param(&s, chat, CHAT_WITH("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"), 400,
                 "the built-in chat format chatml cannot show tools", "messages");
    expect_param(&s, chat, CHAT_WITH("\"tool_choice\":\"required\""), 400, "not supported", "tool_choice");
    expect_param(&s, chat, CHAT_WITH("\"response_format\":{\"type\":\"json_object\"}"), 400, "not supported",
                 "response_format");
    expect_param(&s, cmpl, "{\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "not supported", "suffix");
    expect_param(&s, cmpl, "{\"prompt\":\"x\",\"best_of\":3}", 400, "not supported", "best_of");
    expect_param(&s, chat, CHAT_WITH("\"frobnicate\":1"), 400, "unknown field", "frobnicate");
    expect_param(&s, chat, CHAT_WITH("\"logprobs\":true,\"top_logprobs\":21"), 400, "between 0 and 20",
                 "top_logprobs");
    expect_param(&s, chat, CHAT_WITH("\"top_logprobs\":2"), 400, "logprobs", "top_logprobs");
    expect_param(&s, cmpl, "{\"prompt\":\"x\",\"logprobs\":30}", 400, "between 0 and 20", "logprobs");
    expect_param(&s, chat, CHAT_WITH("\"logit_bias\":{\"512\":1}"), 400, "out of range", "logit_bias");
    expect_param(&s, chat, CHAT_WITH("\"logit_bias\":{\"5\":150}"), 400, "between -100 and 100", "logit_bias");
    /* the defaults that ask for nothing are accepted */
    json_decref(post_ok(&s, chat, CHAT_WITH("\"response_format\":{\"type\":\"text\"},\"tool_choice\":\"none\","
                                            "\"max_tokens\":2")));
    json_decref(post_ok(&s, cmpl, "{\"prompt\":\"x\",\"best_of\":1,\"max_tokens\":2}"));
    /* context and range */
    char *long_prompt = malloc(64 * 1024), *body = malloc(70 * 1024);
    long_prompt[0] = '\0';
    for (int i = 0; i < 700; i++) strcat(long_prompt, "Once upon a ");
    snprintf(body, 70 * 1024, "{\"prompt\":\"%s\"}", long_prompt);
    expect_param(&s, cmpl, body, 400, "the context holds", "prompt");
    snprintf(body, 70 * 1024, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}", long_prompt);
    expect_param(&s, chat, body, 400, "the context holds", "messages");
    free(long_prompt);
    free(body);
    expect_param(&s, cmpl, "{\"prompt\":[1,403,407,261,378],\"max_tokens\":1000000000000}", 400,
                 "max_tokens must be between 1 and 507", "max_tokens");
    expect_param(&s, chat, CHAT_WITH("\"max_tokens\":1000000000000"), 400, "max_tokens must be between 1 and",
                 "max_tokens");
    expect_param(&s, cmpl, "{\"prompt\":[1,403,407,261,378],\"max_tokens\":508}", 400,
                 "max_tokens must be between 1 and 507", "max_tokens");
    json_decref(post_ok(&s, cmpl, "{\"prompt\":[1,403,407,261,378],\"max_tokens\":507,\"stop\":\".\"}"));
#undef CHAT_WITH
    srv_stop(&s);
}

/* A pool smaller than the context (8 blocks of 8 tokens): a prompt that
 * fills it names prompt or messages as one that fills the context does
 * (it named max_tokens before the engine checked both); max_tokens past it
 * gives the range the pool allows, and without max_tokens the answer runs
 * to the pool's end. */
static void test_prompt_over_pool(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "--pool-blocks 8") != 0) return;
    const char *chat = "/v1/chat/completions", *cmpl = "/v1/completions";
    char ids[1024] = "{\"prompt\":[1";
    for (int i = 1; i < 70; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), ",%d", 300 + i);
    strcat(ids, "]}");
    expect_param(&s, cmpl, ids, 400, "the prompt has 70 tokens; the KV pool holds 64", "prompt");
    char body[2048] = "{\"messages\":[{\"role\":\"user\",\"content\":\"";
    for (int i = 0; i < 20; i++) strcat(body, "Once upon a time ");
    strcat(body, "\"}]}");
    expect_param(&s, chat, body, 400, "the KV pool holds 64", "messages");
    expect_param(&s, cmpl, "{\"prompt\":[1,403,407,261,378],\"max_tokens\":60}", 400,
                 "max_tokens must be between 1 and 59 for this prompt of 5 tokens (the KV pool holds 64)",
                 "max_tokens");
    json_t *j = post_ok(&s, cmpl, "{\"prompt\":[1,403,407,261,378],\"ignore_eos\":true}");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 59);
    json_decref(j);
    srv_stop(&s);
}

/* log-softmax of a runner's logits row: the model's own distribution,
 * computed without the server. */
typedef struct RowOut {
    double *lp;
    int n_vocab;
} RowOut;

static int row_logprobs(void *ctx, int idx, const float *logits) {
    RowOut *o = ctx;
    double max = logits[0], sum = 0;
    for (int i = 1; i < o->n_vocab; i++) max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < o->n_vocab; i++) sum += exp((double)logits[i] - max);
    for (int i = 0; i < o->n_vocab; i++) o->lp[i] = (double)logits[i] - max - log(sum);
    return 0;
}

/* The bytes of a token as the API writes its string. */
static void token_string(const Model *m, int32_t id, char *out, size_t cap) {
    size_t len;
    char buf[8];
    const char *p = tok_piece(m->tok, id, true, buf, &len);
    snprintf(out, cap, "%.*s", (int)len, p);
}

/* /v1/completions with logprobs: every token's logprob and its top
 * alternatives are the log-softmax of the model's logits (recomputed here
 * by a runner in this process) at its position, whatever the sampling
 * settings; the generated token is in each top_logprobs object; text_offset
 * counts characters. Streamed, the same numbers arrive piece by piece. */
static void test_completion_logprobs(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
    char path[512];
    test_data_path(path, sizeof path, "models/stories260K.gguf");
    Model *m = NULL;
    MnErr err = {0};
    assert_int_equal(model_load(path, &m, &err), MN_OK);
    const int n_vocab = m->cfg.n_vocab, N = 10, TOP = 4;
    Runner r;
    RunnerOptions ro;
    runner_options_default(&ro);
    ro.n_ctx = 64;
    assert_int_equal(runner_init(&r, m, &ro, &err), MN_OK);
    int32_t seq[64] = {1, 403, 407, 261, 378}; /* "Once upon a time" */
    double *want = malloc((size_t)n_vocab * sizeof *want);
    /* sampled at a high temperature with penalties: the numbers stay the model's */
    const char *body = "{\"prompt\":[1,403,407,261,378],\"max_tokens\":10,\"logprobs\":4,\"temperature\":1.8,"
                       "\"seed\":7,\"presence_penalty\":1.5,\"ignore_eos\":true}";
    json_t *j = post_ok(&s, "/v1/completions", body);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *lp = json_object_get(c, "logprobs");
    json_t *tokens = json_object_get(lp, "tokens"), *values = json_object_get(lp, "token_logprobs"),
           *tops = json_object_get(lp, "top_logprobs"), *offsets = json_object_get(lp, "text_offset");
    assert_int_equal(json_array_size(tokens), N);
    assert_int_equal(json_array_size(values), N);
    assert_int_equal(json_array_size(tops), N);
    assert_int_equal(json_array_size(offsets), N);
    const char *text = json_string_value(json_object_get(c, "text"));
    long chars_before = 0;
    for (int k = 0; k < N; k++) {
        RowOut ro_out = {want, n_vocab};
        runner_reset(&r);
        assert_int_equal(runner_eval(&r, seq, 5 + k, false, row_logprobs, &ro_out, &err), MN_OK);
        /* which token was generated: the one whose string the answer names */
        const char *tk = json_string_value(json_array_get(tokens, k));
        int32_t id = -1;
        double best = -1e300;
        for (int32_t v = 0; v < n_vocab; v++) {
            char str[64];
            token_string(m, v, str, sizeof str);
            if (strcmp(str, tk) == 0 && want[v] > best) {
                id = v;
                best = want[v];
            }
        }
        assert_true(id >= 0);
        assert_float_equal(json_real_value(json_array_get(values, k)), want[id], 1e-4);
        /* the TOP best of the row, and the generated token */
        json_t *d = json_array_get(tops, k);
        int32_t order[512];
        for (int v = 0; v < n_vocab; v++) order[v] = v;
        for (int a = 0; a < TOP; a++)
            for (int b = a + 1; b < n_vocab; b++)
                if (want[order[b]] > want[order[a]]) {
                    int32_t t = order[a];
                    order[a] = order[b];
                    order[b] = t;
                }
        for (int a = 0; a < TOP; a++) {
            char str[64];
            token_string(m, order[a], str, sizeof str);
            json_t *v = json_object_get(d, str);
            assert_non_null(v);
            assert_float_equal(json_real_value(v), want[order[a]], 1e-4);
        }
        assert_non_null(json_object_get(d, tk));
        assert_true(json_object_size(d) == TOP || json_object_size(d) == TOP + 1);
        assert_int_equal(json_integer_value(json_array_get(offsets, k)), chars_before);
        for (const char *p = tk; *p; p++) chars_before += ((unsigned char)*p & 0xC0) != 0x80;
        seq[5 + k] = id;
    }
    /* the same request streamed: the same arrays, piece by piece */
    char *sbody = malloc(strlen(body) + 32), *out;
    sprintf(sbody, "%.*s,\"stream\":true}", (int)strlen(body) - 1, body);
    assert_int_equal(http(&s, "/v1/completions", sbody, NULL, &out, 0), 200);
    json_t *all_tokens = json_array(), *all_values = json_array(), *all_offsets = json_array();
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: {", 7) != 0) continue;
        json_t *chunk = srv_json(line + 6);
        json_t *l = json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "logprobs");
        if (json_is_object(l)) {
            json_array_extend(all_tokens, json_object_get(l, "tokens"));
            json_array_extend(all_values, json_object_get(l, "token_logprobs"));
            json_array_extend(all_offsets, json_object_get(l, "text_offset"));
        }
        json_decref(chunk);
    }
    assert_true(json_equal(all_tokens, tokens));
    assert_true(json_equal(all_values, values));
    assert_true(json_equal(all_offsets, offsets));
    assert_non_null(text);
    json_decref(all_tokens);
    json_decref(all_values);
    json_decref(all_offsets);
    free(out);
    free(sbody);
    json_decref(j);

    /* logit_bias forces a token; the logprobs still are the model's */
    j = post_ok(&s, "/v1/completions",
                "{\"prompt\":[1,403,407,261,378],\"max_tokens\":3,\"logprobs\":0,\"temperature\":0,"
                "\"logit_bias\":{\"300\":100},\"ignore_eos\":true}");
    lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    char forced[64];
    token_string(m, 300, forced, sizeof forced);
    seq[5] = 300;
    seq[6] = 300;
    for (int k = 0; k < 3; k++) {
        assert_string_equal(json_string_value(json_array_get(json_object_get(lp, "tokens"), k)), forced);
        RowOut ro_out = {want, n_vocab};
        runner_reset(&r);
        assert_int_equal(runner_eval(&r, seq, 5 + k, false, row_logprobs, &ro_out, &err), MN_OK);
        assert_float_equal(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), k)), want[300], 1e-4);
    }
    json_decref(j);
    free(want);
    runner_deinit(&r);
    model_free(m);
    srv_stop(&s);
}

/* Chat logprobs, whole and streamed, are the same entries; each entry's
 * bytes are its token's; the tokens' strings make up the content. */
static void test_chat_logprobs(void **st) {
    Srv s;
    if (srv_start(&s, "stories260K", "") != 0) return;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],\"max_tokens\":24,"
                       "\"logprobs\":true,\"top_logprobs\":3,\"temperature\":0.9,\"seed\":3,\"stop\":\".\"}";
    json_t *j = post_ok(&s, "/v1/chat/completions", body);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    const char *content = json_string_value(json_object_get(json_object_get(c, "message"), "content"));
    json_t *whole = json_object_get(json_object_get(c, "logprobs"), "content");
    assert_true(json_array_size(whole) > 0);
    size_t joined_len = 0;
    char joined[4096] = "";
    for (size_t i = 0; i < json_array_size(whole); i++) {
        json_t *t = json_array_get(whole, i);
        const char *tk = json_string_value(json_object_get(t, "token"));
        json_t *bytes = json_object_get(t, "bytes");
        assert_int_equal(json_array_size(bytes), strlen(tk));
        for (size_t b = 0; b < strlen(tk); b++)
            assert_int_equal(json_integer_value(json_array_get(bytes, b)), (unsigned char)tk[b]);
        assert_int_equal(json_array_size(json_object_get(t, "top_logprobs")), 3);
        double lp = json_real_value(json_object_get(t, "logprob"));
        assert_true(lp <= 0);
        /* the generated token is never likelier than the best alternative */
        assert_true(lp <= json_real_value(json_object_get(json_array_get(json_object_get(t, "top_logprobs"), 0),
                                                          "logprob")) + 1e-6);
        joined_len += strlen(tk);
        strcat(joined, tk);
    }
    /* the stop string cut the last token's text, or it is all there */
    assert_true(joined_len >= strlen(content));
    assert_memory_equal(joined, content, strlen(content));
    char *sbody = malloc(strlen(body) + 32), *out;
    sprintf(sbody, "%.*s,\"stream\":true}", (int)strlen(body) - 1, body);
    assert_int_equal(http(&s, "/v1/chat/completions", sbody, NULL, &out, 0), 200);
    json_t *streamed = json_array();
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: {", 7) != 0) continue;
        json_t *chunk = srv_json(line + 6);
        json_t *l = json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "logprobs");
        if (json_is_object(l)) json_array_extend(streamed, json_object_get(l, "content"));
        json_decref(chunk);
    }
    assert_true(json_equal(streamed, whole));
    json_decref(streamed);
    free(out);
    free(sbody);
    json_decref(j);
    /* not asked for: null */
    j = post_ok(&s, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}");
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs")));
    json_decref(j);
    srv_stop(&s);
}

int main(void) {
    test_apply_filter();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_turn_stories),
        cmocka_unit_test(test_multi_turn_llama_f32),
        cmocka_unit_test(test_multi_turn_llama_q8_0),
        cmocka_unit_test(test_multi_turn_llama_q4_0),
        cmocka_unit_test(test_multi_turn_qwen2),
        cmocka_unit_test(test_multi_turn_mha_f16),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_stream_bytes),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_api_keys),
        cmocka_unit_test(test_build_info),
        cmocka_unit_test(test_llama_flags),
        cmocka_unit_test(test_step_ms_flag),
        cmocka_unit_test(test_profile_per_setup),
        cmocka_unit_test(test_model_fingerprint_ids),
        cmocka_unit_test(test_refused_and_ranges),
        cmocka_unit_test(test_prompt_over_pool),
        cmocka_unit_test(test_completion_logprobs),
        cmocka_unit_test(test_chat_logprobs),
        cmocka_unit_test(test_disconnect_and_queue),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_sigterm_drains),
        cmocka_unit_test(test_sigterm_drain_timeout),
        cmocka_unit_test(test_http_framing),
        cmocka_unit_test(test_http_chunked_limit),
        cmocka_unit_test(test_http_idle_limit),
        cmocka_unit_test(test_http_per_ip_limit),
        cmocka_unit_test(test_http_connection_limit_burst),
        cmocka_unit_test(test_sigterm_with_idle_connections),
        cmocka_unit_test(test_accept_out_of_descriptors),
        cmocka_unit_test(test_restore_plan_fallback_is_logged),
        cmocka_unit_test(test_http_auth_scheme),
        cmocka_unit_test(test_http_cors),
        cmocka_unit_test(test_http_methods),
        cmocka_unit_test(test_http_encoded_nul),
        cmocka_unit_test(test_request_log),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
