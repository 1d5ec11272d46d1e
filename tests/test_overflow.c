/* test_overflow.c — context overflow end to end, against `mnemo serve` on
 * stories260K with a small --ctx: a conversation runs 30 turns past the
 * context with every turn answered, in shift mode (the default) and in
 * recompute mode, through /v1/chat/completions with the whole history and
 * through /v1/responses with previous_response_id (the same answers,
 * prompt and truncated tokens); in recompute mode each
 * overflowing turn answers exactly as a request that sends only the kept
 * messages — the system message and the most recent turns — does
 * (recompute is exact), in shift mode turns report the tokens whose KV
 * was moved (usage and /metrics); the log line counts the dropped tokens.
 * Shift finds the KV to move wherever it is: in the pool, in the RAM tier
 * (the pool filled by another conversation), on disk (after a restart);
 * each time the first token's log-probabilities stay close to a
 * recompute server's for the same messages, and the kept messages sent
 * alone afterwards answer exactly as a server without a prefix cache
 * (the moved KV is never taken for exact KV). --context-overflow error
 * keeps the 400, /v1/completions always does, and `mnemo chat` goes on
 * past the context with either API. */
#include "test_util.h"
#include "test_serve_util.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>

#define CTX 512      /* the server's --ctx: stories260K's own */
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
 * Responses chain agree turn by turn. mode: the --context-overflow flag
 * ("": the default, shift). */
static void overflow_conversation(Srv *s, const char *mode) {
    char extra[96];
    bool is_shift = strcmp(mode, "recompute") != 0;
    snprintf(extra, sizeof extra, "--ctx %d %s%s", CTX, mode[0] ? "--context-overflow " : "", mode);
    if (srv_start(s, "stories260K", extra) != 0) return;
    long n_shifted = 0, n_metric = 0;
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
        /* (the Responses turn finds what the chat turn moved, in its domain) */
        long shifted = num(r, "usage.prompt_tokens_details.shifted_tokens"),
             shifted_rr = num(rr, "usage.input_tokens_details.shifted_tokens");
        if (!is_shift || truncated == 0) assert_int_equal(shifted + shifted_rr, 0);
        assert_true(shifted <= num(r, "usage.prompt_tokens_details.cached_tokens"));
        n_shifted += shifted;
        n_metric += shifted + shifted_rr;
        assert_string_equal(str(rr, "truncation"), "auto"); /* what the server does */
        snprintf(prev, sizeof prev, "%s", str(rr, "id"));
        json_decref(rr);

        if (truncated > 0) {
            if (!is_shift) expect_kept_answer(s, history, r, &n_drop);
            snprintf(want_log, sizeof want_log, "prompt=%ld truncated=%ld ", prompt, truncated);
        }
        json_array_append_new(history, msg("assistant", reply));
        json_decref(r);
    }
    assert_true(n_turns > N_PAST); /* some turns fit before */
    if (is_shift) assert_true(n_shifted > 0);
    assert_true(srv_metric(s, "mnemo_shifted_tokens_total") == (double)n_metric);
    char *log = test_read_file(s->log, NULL);
    if (log == NULL) fail_msg("cannot read the server's log %s", s->log);
    if (strstr(log, want_log) == NULL) fail_msg("no '%s' in the log:\n%.2000s", want_log, log);
    free(log);
    json_decref(history);
    srv_stop(s);
}

static void test_overflow_conversation_shift(void **state) { overflow_conversation(*state, ""); }
static void test_overflow_conversation_recompute(void **state) { overflow_conversation(*state, "recompute"); }

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

/* An unknown mode is refused at start-up in one line. */
static void test_overflow_bad_mode(void **state) {
    (void)state;
    char model[512], cmd[1024], *out;
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    snprintf(cmd, sizeof cmd, "%s serve -m %s --port 0 --context-overflow rotate 2>&1", bin(), model);
    assert_int_equal(run(cmd, &out), 2);
    assert_string_equal(out, "mnemo serve: --context-overflow must be shift, recompute or error, got 'rotate'\n");
    free(out);
}

/* ---- shift from each tier ----------------------------------------------------------- */

/* Bound from the runs of these tests: the first token's log-probabilities
 * under shifted KV stay this close to recompute's (stories260K: 0.018 from
 * the pool, 0.020 from RAM and disk, ~300 tokens moved; the in-process
 * test_shift bounds the whole logits row). */
#define SHIFT_LOGPROB_BOUND 0.1

/* A greedy chat turn of msgs with the first token's top-5 logprobs. */
static json_t *chat_lp(const Srv *s, json_t *msgs) {
    json_t *b = json_pack("{s:O, s:i, s:f, s:b, s:b, s:i}", "messages", msgs, "max_tokens", REPLY, "temperature", 0.0,
                          "ignore_eos", 1, "logprobs", 1, "top_logprobs", 5);
    return post(s, "/v1/chat/completions", b, 200);
}

/* The first token's top logprobs of a and b: every token both list is
 * within bound of each other, and at least three are in both. Returns the
 * largest difference. */
static double expect_close_logprobs(json_t *a, json_t *b, double bound) {
    double worst = 0;
    json_t *ta = at(a, "choices.0.logprobs.content.0.top_logprobs"), *tb = at(b, "choices.0.logprobs.content.0.top_logprobs");
    int n_common = 0;
    for (size_t i = 0; i < json_array_size(ta); i++)
        for (size_t k = 0; k < json_array_size(tb); k++) {
            json_t *x = json_array_get(ta, i), *y = json_array_get(tb, k);
            if (strcmp(json_string_value(json_object_get(x, "token")), json_string_value(json_object_get(y, "token"))))
                continue;
            double d = fabs(json_number_value(json_object_get(x, "logprob")) - json_number_value(json_object_get(y, "logprob")));
            if (d > bound) fail_msg("token '%s': logprob differs by %g", json_string_value(json_object_get(x, "token")), d);
            worst = fmax(worst, d);
            n_common++;
        }
    assert_true(n_common >= 3);
    return worst;
}

/* The cached tokens of usage r that tier `tier` held. */
static long tier_tokens(json_t *r, const char *tier) {
    char path[96];
    snprintf(path, sizeof path, "usage.prompt_tokens_details.cached_tokens_by_tier.%s", tier);
    return num(r, path);
}

/* Servers of a tier case: the shift server under test, a recompute server
 * (the reference for closeness) and one without a prefix cache (the
 * reference for exactness). */
typedef struct TierCase {
    Srv shift, rec, plain;
    char *dir;
} TierCase;

/* The next turn of the conversation history on c->shift: the first token
 * close to recompute's, dropped and shifted tokens reported, the KV to
 * move found in `tier`; then the kept messages sent alone answer exactly
 * as without a prefix cache. Appends the turn's reply to history. */
static void expect_shifted_turn(TierCase *c, json_t *history, const char *tier) {
    json_t *r = chat_lp(&c->shift, history), *ref = chat_lp(&c->rec, history);
    long truncated = num(r, "usage.prompt_tokens_details.truncated_tokens");
    assert_true(truncated > 0);
    assert_int_equal(truncated, num(ref, "usage.prompt_tokens_details.truncated_tokens"));
    long shifted = num(r, "usage.prompt_tokens_details.shifted_tokens");
    if (shifted <= 0 || tier_tokens(r, tier) <= 0)
        fail_msg("no KV moved from the %s tier: shifted %ld, %s %ld", tier, shifted, tier, tier_tokens(r, tier));
    double d = expect_close_logprobs(r, ref, SHIFT_LOGPROB_BOUND);
    print_message("%s: %ld tokens shifted, first-token logprobs within %.4f of recompute\n", tier, shifted, d);
    /* the kept messages alone, as the recompute server kept them */
    size_t n_drop = 1;
    json_t *alone = NULL;
    for (; n_drop < json_array_size(history) / 2; n_drop++) {
        alone = chat_dropped(&c->plain, history, n_drop);
        if (num(alone, "usage.prompt_tokens_details.truncated_tokens") == 0) break;
        json_decref(alone);
        alone = NULL;
    }
    assert_non_null(alone);
    json_t *again = chat_dropped(&c->shift, history, n_drop);
    assert_int_equal(num(again, "usage.prompt_tokens_details.shifted_tokens"), 0);
    assert_string_equal(str(again, "choices.0.message.content"), str(alone, "choices.0.message.content"));
    json_array_append_new(history, msg("assistant", str(r, "choices.0.message.content")));
    json_decref(again);
    json_decref(alone);
    json_decref(r);
    json_decref(ref);
}

/* Turns of history until one overflows (the recompute server tells,
 * without touching the shift server's cache): that turn is checked with
 * its KV moved from the pool. The turns before are the shift server's. */
static void grow_until_shifted(TierCase *c, json_t *history, int *turn) {
    for (;; ++*turn) {
        assert_true(*turn < 100);
        char line[64];
        snprintf(line, sizeof line, "Turn %d. And then what did the cat do?", *turn);
        json_array_append_new(history, msg("user", line));
        json_t *probe = chat(&c->rec, history, 200);
        bool is_past = num(probe, "usage.prompt_tokens_details.truncated_tokens") > 0;
        json_decref(probe);
        if (is_past) {
            expect_shifted_turn(c, history, "pool");
            ++*turn;
            return;
        }
        json_t *r = chat(&c->shift, history, 200);
        json_array_append_new(history, msg("assistant", str(r, "choices.0.message.content")));
        json_decref(r);
    }
}

/* A question longer than a turn so far: the cut must drop more turns for
 * it than for the turn before, so the KV to move is not already at its
 * place in the previous turn's shifted domain. */
#define LONG_LINE                                                                                        \
    "And then what did the cat do next, after it ran to the big tree in the garden with the red ball, " \
    "and what did the little dog and the bird say to it when the sun went down?"

static void tier_case_start(TierCase *c, const char *shift_flags) {
    char flags[1024];
    snprintf(flags, sizeof flags, "--ctx %d --threads 1 %s", CTX, shift_flags);
    srv_start(&c->shift, "stories260K", flags);
    snprintf(flags, sizeof flags, "--ctx %d --threads 1 --context-overflow recompute", CTX);
    srv_start(&c->rec, "stories260K", flags);
    snprintf(flags, sizeof flags, "--ctx %d --threads 1 --context-overflow recompute --no-prefix-cache", CTX);
    srv_start(&c->plain, "stories260K", flags);
}

/* KV moved from the pool, then from the RAM tier once other prompts have
 * filled the pool (lru: this conversation's blocks go first; the pool
 * holds a turn's blocks and the blocks their KV is moved from). */
static void test_overflow_shift_ram(void **state) {
    TierCase *c = *state;
    char model[512];
    if (!test_require_file(test_data_path(model, sizeof model, "models/stories260K.gguf"))) return;
    tier_case_start(c, "--pool-blocks 160 --evict lru --ram-tier-mb 4");
    json_t *history = json_array();
    json_array_append_new(history, msg("system", SYSTEM));
    int turn = 0;
    grow_until_shifted(c, history, &turn);
    for (int i = 0; i < 7; i++) { /* other prompts of ~40 blocks each: more than the pool */
        char text[2048] = "";
        for (int k = 0; k < 24; k++) snprintf(text + strlen(text), sizeof text - strlen(text), "Dog %d ran %d. ", i, k);
        json_t *other = json_array();
        json_array_append_new(other, msg("user", text));
        json_decref(chat(&c->shift, other, 200));
        json_decref(other);
    }
    json_array_append_new(history, msg("user", LONG_LINE));
    expect_shifted_turn(c, history, "ram");
    json_decref(history);
}

/* KV moved from the disk tier: the server restarted on its directory
 * (SIGTERM flushed the pool to it) holds nothing in its pool. */
static void test_overflow_shift_disk(void **state) {
    TierCase *c = *state;
    char model[512], flags[600];
    if (!test_require_file(test_data_path(model, sizeof model, "models/stories260K.gguf"))) return;
    c->dir = test_tmpdir_new("overflow-disk");
    snprintf(flags, sizeof flags, "--disk-tier %s --disk-tier-mb 16", c->dir);
    tier_case_start(c, flags);
    json_t *history = json_array();
    json_array_append_new(history, msg("system", SYSTEM));
    int turn = 0;
    grow_until_shifted(c, history, &turn);
    srv_stop(&c->shift);
    snprintf(flags, sizeof flags, "--ctx %d --threads 1 --disk-tier %s --disk-tier-mb 16", CTX, c->dir);
    srv_start(&c->shift, "stories260K", flags);
    json_array_append_new(history, msg("user", LONG_LINE));
    expect_shifted_turn(c, history, "disk");
    json_decref(history);
}

static int tier_setup(void **state) {
    *state = calloc(1, sizeof(TierCase));
    return *state ? 0 : -1;
}

static int tier_teardown(void **state) {
    TierCase *c = *state;
    Srv *all[] = {&c->shift, &c->rec, &c->plain};
    for (int i = 0; i < 3; i++)
        if (all[i]->pid > 0) srv_stop(all[i]);
    if (c->dir) test_tmpdir_free(c->dir);
    free(c);
    return 0;
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
        cmocka_unit_test_setup_teardown(test_overflow_conversation_shift, srv_setup, srv_teardown),
        cmocka_unit_test_setup_teardown(test_overflow_conversation_recompute, srv_setup, srv_teardown),
        cmocka_unit_test_setup_teardown(test_overflow_modes, srv_setup, srv_teardown),
        cmocka_unit_test(test_overflow_bad_mode),
        cmocka_unit_test_setup_teardown(test_overflow_shift_ram, tier_setup, tier_teardown),
        cmocka_unit_test_setup_teardown(test_overflow_shift_disk, tier_setup, tier_teardown),
        cmocka_unit_test_setup_teardown(test_overflow_chat_goes_on, srv_setup, srv_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
