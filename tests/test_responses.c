/* test_responses.c — the Responses API (/v1/responses) end to end over
 * HTTP, against an engine and a server made in this process (so the test
 * owns the responses' clock): a continued turn is the equivalent chat
 * completion (same prompt tokens, same greedy answer, its history cached);
 * ids belong to their namespace; responses expire by the TTL on a clock the
 * test moves; they survive a restart on a disk tier; bad requests get
 * OpenAI errors; and the official openai npm client works unmodified
 * (tests/node, installed by scripts/setup; skipped only without node). */
#include "test_util.h"
#include "test_serve_util.h"

#include <jansson.h>
#include <stdbool.h>

#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"

/* ---- a server in this process ---------------------------------------------------- */

typedef struct Fix {
    Model *m;
    Engine *e;
    Server *srv;
    Srv s;            /* its port, for srv_http */
    double now;       /* the responses' clock (unix s) */
    char *dir;        /* a disk tier's directory, or NULL */
} Fix;

static double fix_clock(void *ctx) { return ((Fix *)ctx)->now; }

/* Start an engine (block_tokens 8, greedy-friendly) and a server on a
 * free port; keys: NULL-ended API keys or NULL; ttl_s the response TTL. */
static void fix_start(Fix *f, const char *const *keys, double ttl_s) {
    if (f->m == NULL) {
        char path[512];
        test_data_path(path, sizeof path, "models/stories260K.gguf");
        if (!test_require_file(path)) return;
        MnErr err = {0};
        if (model_load(path, &f->m, &err)) fail_msg("%s", err.msg);
    }
    EngineOptions o;
    engine_options_default(&o);
    o.block_tokens = 8;
    o.n_threads = 1;
    o.pool_blocks = 256;
    o.disk_tier_dir = f->dir;
    MnErr err = {0};
    if (engine_new(f->m, &o, &f->e, &err)) fail_msg("%s", err.msg);
    ServerOptions so;
    server_options_default(&so);
    so.port = 0;
    so.model_name = "stories260K.gguf";
    so.response_ttl_s = ttl_s;
    so.test_wall_now_fn = fix_clock;
    so.test_clock_ctx = f;
    int n_keys = 0;
    while (keys && keys[n_keys]) n_keys++;
    so.api_keys = (const char **)keys;
    so.n_api_keys = n_keys;
    if (server_new(f->e, &so, &f->srv, &err)) fail_msg("%s", err.msg);
    f->s.port = server_port(f->srv);
}

static void fix_stop(Fix *f) {
    engine_shutdown(f->e);
    server_free(f->srv);
    engine_free(f->e);
    f->srv = NULL;
    f->e = NULL;
}

static int fix_setup(void **state) {
    Fix *f = calloc(1, sizeof *f);
    f->now = 1.7e9;
    *state = f;
    return 0;
}

static int fix_teardown(void **state) {
    Fix *f = *state;
    if (f->srv) fix_stop(f);
    model_free(f->m);
    test_tmpdir_free(f->dir);
    free(f);
    return 0;
}

/* ---- HTTP -------------------------------------------------------------------------- */

static json_t *parse(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (j == NULL) fail_msg("not JSON (%s): %.300s", e.text, text);
    return j;
}

/* method (NULL: POST with body, GET without) on path with key (NULL: none);
 * expects status want; returns the parsed body (caller decrefs). */
static json_t *call(const Fix *f, const char *method, const char *path, const char *body, const char *key, long want) {
    char auth[128];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key ? key : "");
    const char *headers[] = {key ? auth : NULL, NULL};
    char *out = NULL;
    long st = srv_http(&f->s, method, path, body, headers, &out, NULL, 0);
    if (st != want) fail_msg("%s %s: status %ld, want %ld: %.400s", method ? method : "-", path, st, want, out);
    json_t *j = parse(out);
    free(out);
    return j;
}

/* The JSON on one line of an event stream ("data: {...}\n"). */
static json_t *parse_line(const char *p) {
    json_error_t e;
    json_t *j = json_loadb(p, strcspn(p, "\n"), 0, &e);
    if (j == NULL) fail_msg("not JSON (%s): %.300s", e.text, p);
    return j;
}

static const char *jstr(json_t *o, const char *path) {
    json_t *v = o;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok(buf, "."); k && v; k = strtok(NULL, ".")) v = k[0] >= '0' && k[0] <= '9' ? json_array_get(v, (size_t)atoi(k)) : json_object_get(v, k);
    if (!json_is_string(v)) fail_msg("%s is not a string", path);
    return json_string_value(v);
}

static long jint(json_t *o, const char *path) {
    json_t *v = o;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok(buf, "."); k && v; k = strtok(NULL, ".")) v = json_object_get(v, k);
    if (!json_is_integer(v)) fail_msg("%s is not an integer", path);
    return (long)json_integer_value(v);
}

/* A turn: input text, after prev (NULL: none), greedy, 12 tokens. */
static json_t *turn(const Fix *f, const char *input, const char *prev, const char *key, long want) {
    json_t *b = json_pack("{s:s, s:s, s:f, s:i}", "input", input, "instructions", "Tell a story.", "temperature", 0.0,
                          "max_output_tokens", 12);
    if (prev) json_object_set_new(b, "previous_response_id", json_string(prev));
    char *body = json_dumps(b, 0);
    json_decref(b);
    json_t *r = call(f, NULL, "/v1/responses", body, key, want);
    free(body);
    return r;
}

static const char *text_of(json_t *r) { return jstr(r, "output.0.content.0.text"); }

/* ---- tests -------------------------------------------------------------------------- */

/* Turn 2 sent with previous_response_id is the chat completion of the
 * whole history: the same prompt tokens, the same greedy answer, and the
 * history (turn 1's prompt and reply, in whole blocks) found cached. */
static void test_responses_match_chat(void **state) {
    Fix *f = *state;
    fix_start(f, NULL, 0);
    json_t *r1 = turn(f, "Once upon a time", NULL, NULL, 200);
    json_t *r2 = turn(f, "Tell me more.", jstr(r1, "id"), NULL, 200);
    json_t *chat = json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:s},{s:s,s:s}], s:f, s:i}", "messages", "role", "system",
                             "content", "Tell a story.", "role", "user", "content", "Once upon a time", "role",
                             "assistant", "content", text_of(r1), "role", "user", "content", "Tell me more.",
                             "temperature", 0.0, "max_tokens", 12);
    char *body = json_dumps(chat, 0);
    json_t *c = call(f, NULL, "/v1/chat/completions", body, NULL, 200);
    free(body);
    long hist = jint(r1, "usage.input_tokens") + jint(r1, "usage.output_tokens");
    long cached = jint(r2, "usage.input_tokens_details.cached_tokens");
    assert_int_equal(jint(r2, "usage.input_tokens"), jint(c, "usage.prompt_tokens"));
    assert_string_equal(text_of(r2), jstr(c, "choices.0.message.content"));
    assert_true(cached >= hist - 8 && cached <= hist);
    assert_int_equal(cached, jint(r2, "usage.input_tokens_details.cached_tokens_by_tier.pool"));
    assert_string_equal(jstr(r2, "previous_response_id"), jstr(r1, "id"));
    assert_string_equal(jstr(r2, "status"), "incomplete"); /* 12 tokens and not done */
    /* a third turn on the second: the whole chain again */
    json_t *r3 = turn(f, "And then?", jstr(r2, "id"), NULL, 200);
    assert_true(jint(r3, "usage.input_tokens_details.cached_tokens") >=
                jint(r2, "usage.input_tokens") + jint(r2, "usage.output_tokens") - 8);
    json_decref(r3);
    json_decref(c);
    json_decref(chat);
    json_decref(r1);
    json_decref(r2);
}

/* An id made under one API key is not found under another: GET, DELETE,
 * input_items and continuing it. */
static void test_responses_namespaces(void **state) {
    Fix *f = *state;
    const char *keys[] = {"key-one", "key-two", NULL};
    fix_start(f, keys, 0);
    json_t *r1 = turn(f, "Once upon a time", NULL, "key-one", 200);
    char path[256], items[300];
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(r1, "id"));
    snprintf(items, sizeof items, "%s/input_items", path);
    json_decref(call(f, NULL, path, NULL, "key-two", 404));
    json_decref(call(f, NULL, items, NULL, "key-two", 404));
    json_decref(call(f, "DELETE", path, NULL, "key-two", 404));
    json_t *e = turn(f, "More.", jstr(r1, "id"), "key-two", 400);
    assert_string_equal(jstr(e, "error.code"), "previous_response_not_found");
    assert_string_equal(jstr(e, "error.param"), "previous_response_id");
    json_decref(e);
    json_t *got = call(f, NULL, path, NULL, "key-one", 200);
    assert_string_equal(jstr(got, "id"), jstr(r1, "id"));
    assert_string_equal(text_of(got), text_of(r1));
    json_decref(got);
    json_t *r2 = turn(f, "More.", jstr(r1, "id"), "key-one", 200);
    json_decref(r2);
    json_t *del = call(f, "DELETE", path, NULL, "key-one", 200);
    assert_true(json_is_true(json_object_get(del, "deleted")));
    json_decref(del);
    json_decref(call(f, NULL, path, NULL, "key-one", 404));
    json_decref(r1);
}

/* --response-ttl: a response unused for the TTL is gone; continuing a
 * chain keeps every response in it. Time is the test's clock. */
static void test_responses_ttl(void **state) {
    Fix *f = *state;
    fix_start(f, NULL, 1000);
    double t0 = f->now;
    json_t *r1 = turn(f, "Once upon a time", NULL, NULL, 200);
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "/v1/responses/%s", jstr(r1, "id"));
    f->now = t0 + 600;
    json_t *r2 = turn(f, "Tell me more.", jstr(r1, "id"), NULL, 200); /* uses r1 at +600 */
    snprintf(p2, sizeof p2, "/v1/responses/%s", jstr(r2, "id"));
    f->now = t0 + 1400; /* r1 made 1400 s ago, but used 800 s ago */
    json_decref(call(f, NULL, p1, NULL, NULL, 200));
    json_decref(call(f, NULL, p2, NULL, NULL, 200));
    f->now = t0 + 1700;
    json_decref(call(f, NULL, p1, NULL, NULL, 404));
    json_decref(call(f, NULL, p2, NULL, NULL, 404));
    json_t *e = turn(f, "And then?", jstr(r2, "id"), NULL, 400);
    assert_string_equal(jstr(e, "error.code"), "previous_response_not_found");
    json_decref(e);
    json_decref(r1);
    json_decref(r2);
}

/* Errors in OpenAI's shape; store false; input_items pages. */
static void test_responses_requests(void **state) {
    Fix *f = *state;
    fix_start(f, NULL, 0);
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{}", "input"},
        {"{\"input\": 3}", "input"},
        {"{\"input\": [{\"role\": \"robot\", \"content\": \"hi\"}]}", "input[0].role"},
        {"{\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"x\", \"output\": \"y\"}]}", "input[0].type"},
        {"{\"input\": \"hi\", \"tools\": [{\"type\": \"web_search\"}]}", "tools"},
        {"{\"input\": \"hi\", \"truncation\": \"auto\"}", "truncation"},
        {"{\"input\": \"hi\", \"max_output_tokens\": 0}", "max_output_tokens"},
        {"{\"input\": \"hi\", \"frobnicate\": 1}", "frobnicate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *e = call(f, NULL, "/v1/responses", bad[i].body, NULL, 400);
        assert_string_equal(jstr(e, "error.type"), "invalid_request_error");
        if (strcmp(jstr(e, "error.param"), bad[i].param) != 0)
            fail_msg("%s: param %s, want %s", bad[i].body, jstr(e, "error.param"), bad[i].param);
        json_decref(e);
    }
    json_decref(call(f, "PUT", "/v1/responses", "{}", NULL, 405));
    json_decref(call(f, NULL, "/v1/responses/resp_x/cancel", NULL, NULL, 404));
    /* not stored: not found */
    json_t *r = call(f, NULL, "/v1/responses", "{\"input\": \"hi\", \"store\": false, \"max_output_tokens\": 2}", NULL, 200);
    assert_true(json_is_false(json_object_get(r, "store")));
    char path[256];
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(r, "id"));
    json_decref(call(f, NULL, path, NULL, NULL, 404));
    json_decref(r);
    /* three input items, listed newest first by default, one per page */
    r = call(f, NULL, "/v1/responses",
             "{\"input\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
             "[{\"type\": \"input_text\", \"text\": \"Hello\"}]}, {\"type\": \"message\", \"role\": \"user\", "
             "\"content\": \"Once upon a time\"}], \"max_output_tokens\": 2}",
             NULL, 200);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", jstr(r, "id"));
    json_t *l = call(f, NULL, path, NULL, NULL, 200);
    assert_string_equal(jstr(l, "object"), "list");
    assert_int_equal(json_array_size(json_object_get(l, "data")), 3);
    assert_string_equal(jstr(l, "data.0.content.0.text"), "Once upon a time");
    assert_string_equal(jstr(l, "data.2.role"), "developer");
    char page[400];
    snprintf(page, sizeof page, "%s?order=asc&limit=1&after=%s", path, jstr(l, "data.2.id"));
    json_t *p = call(f, NULL, page, NULL, NULL, 200);
    assert_int_equal(json_array_size(json_object_get(p, "data")), 1);
    assert_string_equal(jstr(p, "data.0.content.0.text"), "Hello");
    assert_true(json_is_true(json_object_get(p, "has_more")));
    json_decref(p);
    json_decref(l);
    json_decref(r);
}

/* A stream: Responses events in order, the deltas make the stored text. */
static void test_responses_stream(void **state) {
    Fix *f = *state;
    fix_start(f, NULL, 0);
    char *out = NULL;
    long st = srv_http(&f->s, NULL, "/v1/responses",
                       "{\"input\": \"Once upon a time\", \"stream\": true, \"temperature\": 0, \"max_output_tokens\": 8}",
                       NULL, &out, NULL, 0);
    assert_int_equal(st, 200);
    static const char *const order[] = {"response.created", "response.in_progress", "response.output_item.added",
                                        "response.content_part.added", "response.output_text.delta",
                                        "response.output_text.done", "response.content_part.done",
                                        "response.output_item.done", "response.incomplete"};
    const char *at = out;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        char ev[96];
        snprintf(ev, sizeof ev, "event: %s\n", order[i]);
        const char *hit = strstr(at, ev);
        if (hit == NULL) fail_msg("no %s after the events before it: %.2000s", order[i], out);
        at = hit;
    }
    const char *data = strstr(at, "data: ");
    json_t *last = parse_line(data + 6);
    json_t *resp = json_object_get(last, "response");
    char text[1024] = "";
    for (const char *d = strstr(out, "\"delta\":\""); d; d = strstr(d + 1, "\"delta\":\"")) {
        const char *line = d;
        while (line > out && line[-1] != '\n') line--;
        json_t *ev = parse_line(line + 6);
        strncat(text, json_string_value(json_object_get(ev, "delta")), sizeof text - strlen(text) - 1);
        json_decref(ev);
    }
    assert_string_equal(text, text_of(resp));
    char path[256];
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(resp, "id"));
    json_t *got = call(f, NULL, path, NULL, NULL, 200);
    assert_string_equal(text_of(got), text);
    json_decref(got);
    json_decref(last);
    free(out);
}

/* With a disk tier, a chain survives a restart: the stored response comes
 * back as it was, and continuing it finds the history on disk. */
static void test_responses_restart(void **state) {
    Fix *f = *state;
    f->dir = test_tmpdir_new("responses");
    fix_start(f, NULL, 0);
    json_t *r1 = turn(f, "Once upon a time", NULL, NULL, 200);
    json_t *r2 = turn(f, "Tell me more.", jstr(r1, "id"), NULL, 200);
    char path[256];
    snprintf(path, sizeof path, "/v1/responses/%s", jstr(r2, "id"));
    json_t *before = call(f, NULL, path, NULL, NULL, 200);
    fix_stop(f);
    fix_start(f, NULL, 0);
    json_t *after = call(f, NULL, path, NULL, NULL, 200);
    assert_true(json_equal(before, after));
    json_t *r3 = turn(f, "And then?", jstr(r2, "id"), NULL, 200);
    long hist = jint(r2, "usage.input_tokens") + jint(r2, "usage.output_tokens");
    assert_true(jint(r3, "usage.input_tokens_details.cached_tokens") >= hist - 8);
    assert_true(jint(r3, "usage.input_tokens_details.cached_tokens_by_tier.disk") > 0);
    /* restored from disk as K/V (the default plan): restored_by says so */
    assert_int_equal(jint(r3, "usage.input_tokens_details.restored_by.kv"),
                     jint(r3, "usage.input_tokens_details.cached_tokens_by_tier.disk") +
                         jint(r3, "usage.input_tokens_details.cached_tokens_by_tier.ram"));
    assert_int_equal(jint(r3, "usage.input_tokens_details.restored_by.hidden"), 0);
    json_decref(r3);
    json_decref(after);
    json_decref(before);
    json_decref(r1);
    json_decref(r2);
}

/* The official openai npm client, unmodified: three turns (whole,
 * streamed, whole) chained by previous_response_id, then a restart on the
 * same disk tier and a fourth. Skipped only when node is absent. */
static void test_responses_openai_client(void **state) {
    Fix *f = *state;
    if (system("node --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipping: node is not installed (the openai client test needs Node.js 20)\n");
        skip();
    }
    char mod[512];
    snprintf(mod, sizeof mod, "tests/node/node_modules/openai/package.json");
    if (access(mod, R_OK) != 0) fail_msg("%s is missing: run scripts/setup (it installs the openai client)", mod);
    f->dir = test_tmpdir_new("responses-node");
    char stfile[600], cmd[1024];
    snprintf(stfile, sizeof stfile, "%s/last-id", f->dir);
    for (int phase = 0; phase < 2; phase++) {
        fix_start(f, NULL, 0);
        snprintf(cmd, sizeof cmd, "node tests/node/responses.mjs %d %s %s", f->s.port, phase ? "restart" : "first",
                 stfile);
        int rc = system(cmd);
        if (rc != 0) fail_msg("%s failed (status 0x%x)", cmd, rc);
        fix_stop(f);
    }
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_responses_match_chat, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_responses_namespaces, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_responses_ttl, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_responses_requests, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_responses_stream, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_responses_restart, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_responses_openai_client, fix_setup, fix_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
