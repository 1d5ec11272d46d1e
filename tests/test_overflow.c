/* test_overflow.c — context overflow end to end, against `mnemo serve` on
 * stories260K with a small --ctx: a conversation runs 30 turns past the
 * context with every turn answered, through /v1/chat/completions with
 * the whole history and through /v1/responses with previous_response_id
 * (the same answers, prompt and truncated tokens); each overflowing turn
 * answers exactly as a request that sends only the kept messages — the
 * system message and the most recent turns — does (recompute is exact);
 * the log line counts the dropped tokens. --context-overflow error keeps
 * the 400, /v1/completions always does, shift is refused at start-up,
 * and `mnemo chat` goes on past the context with either API. */
#include "test_util.h"
#include "test_serve_util.h"

#include <jansson.h>

#define CTX 160      /* the server's --ctx */
#define REPLY 16     /* max_tokens of every turn */
#define N_PAST 30    /* turns to run past the context */
#define SYSTEM "Tell a story about a cat."

/* ---- HTTP ---------------------------------------------------------------------------- */

/* POST body (taken) to path; the status must be want; the parsed answer. */
static json_t *post(const Srv *s, const char *path, json_t *body, long want) {
    char *text = json_dumps(body, 0), *out = NULL;
    json_decref(body);
    long st = srv_http(s, NULL, path, text, NULL, &out, NULL, 0);
    if (st != want) fail_msg("POST %s: status %ld, want %ld: %.400s", path, st, want, out);
    free(text);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (j == NULL) fail_msg("not JSON (%s): %.300s", e.text, out);
    free(out);
    return j;
}

/* The member at a dotted path ("usage.prompt_tokens", "choices.0.message"). */
static json_t *at(json_t *o, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok(buf, "."); k && o; k = strtok(NULL, "."))
        o = k[0] >= '0' && k[0] <= '9' ? json_array_get(o, (size_t)atoi(k)) : json_object_get(o, k);
    if (o == NULL) fail_msg("no %s", path);
    return o;
}

static long num(json_t *o, const char *path) {
    json_t *v = at(o, path);
    if (!json_is_integer(v)) fail_msg("%s is not an integer", path);
    return (long)json_integer_value(v);
}

static const char *str(json_t *o, const char *path) {
    json_t *v = at(o, path);
    if (!json_is_string(v)) fail_msg("%s is not a string", path);
    return json_string_value(v);
}

/* A greedy chat completion of msgs (borrowed), REPLY tokens. */
static json_t *chat(const Srv *s, json_t *msgs, long want) {
    json_t *b = json_pack("{s:O, s:i, s:f, s:b}", "messages", msgs, "max_tokens", REPLY, "temperature", 0.0,
                          "ignore_eos", 1);
    return post(s, "/v1/chat/completions", b, want);
}

static json_t *msg(const char *role, const char *content) {
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* ---- tests ---------------------------------------------------------------------------- */

/* The system message and history's turns after the oldest n_drop,
 * greedy, sent alone: its answer. */
static json_t *chat_dropped(const Srv *s, json_t *history, size_t n_drop) {
    size_t n = json_array_size(history); /* system, (user, assistant)*, user */
    json_t *kept = json_array();
    json_array_append(kept, json_array_get(history, 0));
    for (size_t i = 1 + 2 * n_drop; i < n; i++) json_array_append(kept, json_array_get(history, i));
    json_t *r = chat(s, kept, 200);
    json_decref(kept);
    return r;
}

/* An overflowing turn answers as the system message and the most recent
 * turns that fit, sent alone. *n_drop: the oldest turns the previous
 * overflowing turn dropped (fewer cannot fit now: the history only grew),
 * updated. Drop one more at a time until a request needs no truncation:
 * that is the kept conversation; one turn more must not fit; its answer
 * and prompt must be the turn's. */
static void expect_kept_answer(const Srv *s, json_t *history, json_t *answer, size_t *n_drop) {
    size_t n_turns = json_array_size(history) / 2;
    if (*n_drop > 0) {
        json_t *r = chat_dropped(s, history, *n_drop - 1);
        assert_true(num(r, "usage.prompt_tokens_details.truncated_tokens") > 0);
        json_decref(r);
    }
    for (; *n_drop < n_turns; ++*n_drop) {
        json_t *r = *n_drop > 0 ? chat_dropped(s, history, *n_drop) : NULL;
        if (r && num(r, "usage.prompt_tokens_details.truncated_tokens") == 0) {
            assert_int_equal(num(r, "usage.prompt_tokens"), num(answer, "usage.prompt_tokens"));
            assert_string_equal(str(r, "choices.0.message.content"), str(answer, "choices.0.message.content"));
            json_decref(r);
            return;
        }
        json_decref(r);
    }
    fail_msg("even the last turn alone was truncated");
}

/* N_PAST turns past the context, each answered; chat completions and the
 * Responses chain agree turn by turn. */
static void test_overflow_conversation(void **state) {
    Srv *s = *state;
    char extra[64];
    snprintf(extra, sizeof extra, "--ctx %d", CTX); /* the default mode: recompute */
    if (srv_start(s, "stories260K", extra) != 0) return;
    json_t *history = json_array();
    json_array_append_new(history, msg("system", SYSTEM));
    char prev[128] = "", line[64], want_log[96] = "";
    int n_past = 0, n_turns = 0;
    size_t n_drop = 0;
    for (; n_past < N_PAST; n_turns++) {
        assert_true(n_turns < 200); /* the conversation must overflow */
        snprintf(line, sizeof line, "Turn %d. And then what did the cat do?", n_turns);
        json_array_append_new(history, msg("user", line));
        json_t *r = chat(s, history, 200);
        long prompt = num(r, "usage.prompt_tokens"), truncated = num(r, "usage.prompt_tokens_details.truncated_tokens");
        assert_true(prompt + REPLY <= CTX);
        assert_int_equal(num(r, "usage.completion_tokens"), REPLY);
        if (truncated > 0) n_past++;
        else assert_int_equal(n_past, 0); /* the history only grows: once past, always past */
        const char *reply = str(r, "choices.0.message.content");

        json_t *b = json_pack("{s:s, s:s, s:i, s:f, s:b}", "input", line, "instructions", SYSTEM, "max_output_tokens",
                              REPLY, "temperature", 0.0, "ignore_eos", 1);
        if (prev[0]) json_object_set_new(b, "previous_response_id", json_string(prev));
        json_t *rr = post(s, "/v1/responses", b, 200);
        assert_string_equal(str(rr, "output.0.content.0.text"), reply);
        assert_int_equal(num(rr, "usage.input_tokens"), prompt);
        assert_int_equal(num(rr, "usage.input_tokens_details.truncated_tokens"), truncated);
        assert_string_equal(str(rr, "truncation"), "auto"); /* what the server does */
        snprintf(prev, sizeof prev, "%s", str(rr, "id"));
        json_decref(rr);

        if (truncated > 0) {
            expect_kept_answer(s, history, r, &n_drop);
            snprintf(want_log, sizeof want_log, "prompt=%ld truncated=%ld ", prompt, truncated);
        }
        json_array_append_new(history, msg("assistant", reply));
        json_decref(r);
    }
    assert_true(n_turns > N_PAST); /* some turns fit before */
    char *log = test_read_file(s->log, NULL);
    if (strstr(log, want_log) == NULL) fail_msg("no '%s' in the log:\n%.2000s", want_log, log);
    free(log);
    json_decref(history);
    srv_stop(s);
}

/* A history that passes the context: system, then turns of long lines. */
static json_t *long_history(void) {
    json_t *h = json_array();
    json_array_append_new(h, msg("system", SYSTEM));
    for (int i = 0; i < 12; i++) {
        json_array_append_new(h, msg("user", "Once upon a time there was a little cat who liked to play."));
        json_array_append_new(h, msg("assistant", "The cat ran to the garden and found a big red ball there."));
    }
    json_array_append_new(h, msg("user", "What happened next?"));
    return h;
}

/* /v1/completions has no turns to drop: a prompt past the context is 400
 * in recompute mode too. */
static void expect_completion_refused(const Srv *s) {
    char text[4096] = "";
    for (int i = 0; i < 40; i++) strcat(text, "Once upon a time there was a cat. ");
    json_t *r = post(s, "/v1/completions", json_pack("{s:s, s:i}", "prompt", text, "max_tokens", 8), 400);
    assert_string_equal(str(r, "error.param"), "prompt");
    json_decref(r);
}

/* recompute (the default) serves the long history, truncated; a reply
 * that runs into the context ends there with finish_reason "length";
 * error mode answers the history 400 as before; completions are refused
 * in both. */
static void test_overflow_modes(void **state) {
    Srv *s = *state;
    if (srv_start(s, "stories260K", "--ctx 128") != 0) return;
    json_t *h = long_history();
    json_t *r = chat(s, h, 200);
    assert_true(num(r, "usage.prompt_tokens_details.truncated_tokens") > 0);
    json_decref(r);
    /* no max_tokens: the kept prompt leaves room, the reply fills it */
    r = post(s, "/v1/chat/completions", json_pack("{s:O, s:f, s:b}", "messages", h, "temperature", 0.0, "ignore_eos", 1),
             200);
    assert_true(num(r, "usage.prompt_tokens_details.truncated_tokens") > 0);
    assert_int_equal(num(r, "usage.prompt_tokens") + num(r, "usage.completion_tokens"), 128);
    assert_string_equal(str(r, "choices.0.finish_reason"), "length");
    json_decref(r);
    expect_completion_refused(s);
    srv_stop(s);
    assert_int_equal(srv_start(s, "stories260K", "--ctx 128 --context-overflow error"), 0);
    r = chat(s, h, 400);
    assert_string_equal(str(r, "error.param"), "messages");
    assert_non_null(strstr(str(r, "error.message"), "the context holds 128"));
    json_decref(r);
    /* a chat that fits says it dropped nothing */
    json_t *one = json_array();
    json_array_append_new(one, msg("user", "Hello"));
    r = chat(s, one, 200);
    assert_int_equal(num(r, "usage.prompt_tokens_details.truncated_tokens"), 0);
    json_decref(r);
    json_decref(one);
    expect_completion_refused(s);
    srv_stop(s);
    json_decref(h);
}

static const char *bin(void) { return getenv("MNEMO_BIN") ? getenv("MNEMO_BIN") : "./build/release/mnemo"; }

/* The output of sh -c cmd (malloc'd) and its exit status. */
static int run(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    *out = calloc(cap, 1);
    for (size_t got; (got = fread(*out + n, 1, cap - 1 - n, p)) > 0;) n += got;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* shift is not built: serve refuses it at start-up in one line. */
static void test_overflow_shift_refused(void **state) {
    char model[512], cmd[1024], *out;
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    snprintf(cmd, sizeof cmd, "%s serve -m %s --port 0 --context-overflow shift 2>&1", bin(), model);
    assert_int_equal(run(cmd, &out), 2);
    assert_string_equal(out, "mnemo serve: --context-overflow shift is not built yet; use recompute or error\n");
    free(out);
}

/* mnemo chat goes on past the context, through either API: every line is
 * answered, no error. */
static void test_overflow_chat_goes_on(void **state) {
    Srv *s = *state;
    if (srv_start(s, "stories260K", "--ctx 128") != 0) return;
    static const char *const apis[] = {"chat", "responses"};
    for (int a = 0; a < 2; a++) {
        char cmd[2048], *out;
        snprintf(cmd, sizeof cmd,
                 "for i in $(seq 1 12); do echo \"Line $i: and then what?\"; done | %s chat --url http://127.0.0.1:%d "
                 "--api %s --system '" SYSTEM "' -n %d --temp 0 --ignore-eos 2>&1 >/dev/null",
                 bin(), s->port, apis[a], REPLY);
        int st = run(cmd, &out);
        int n_answers = 0;
        for (const char *p = out; (p = strstr(p, "from cache]")) != NULL; p++) n_answers++;
        if (st != 0 || n_answers != 12 || strstr(out, "mnemo chat:") != NULL)
            fail_msg("--api %s: exit %d, %d answers:\n%s", apis[a], st, n_answers, out);
        free(out);
    }
    srv_stop(s);
}

/* Each server test's Srv, stopped after a failed assertion too (it would
 * hold the test's output open). */
static int srv_setup(void **state) {
    *state = calloc(1, sizeof(Srv));
    return *state ? 0 : -1;
}

static int srv_teardown(void **state) {
    Srv *s = *state;
    if (s->pid > 0) srv_stop(s);
    free(s);
    return 0;
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_overflow_conversation, srv_setup, srv_teardown),
        cmocka_unit_test_setup_teardown(test_overflow_modes, srv_setup, srv_teardown),
        cmocka_unit_test(test_overflow_shift_refused),
        cmocka_unit_test_setup_teardown(test_overflow_chat_goes_on, srv_setup, srv_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
