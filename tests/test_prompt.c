/* test_prompt.c — chat prompts and the reply memory: a remembered reply is
 * tokenized to the generated ids right after exactly the prompt it answered;
 * without an entry the same pieces are tokenized; a template that rewrites
 * contents falls back to tokenizing the whole rendering. prompt_submit, the
 * engine's front door: each prompt form becomes the ids it should (with the
 * engine's chat template), and every refusal names its field. */
#include "test_util.h"

#include "base/err.h"
#include "cache/index.h"
#include "cache/reply_mem.h"
#include "engine/prompt.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"

static Gguf *g;
static Tokenizer *tok;

static int setup(void **s) {
    char path[512];
    test_data_path(path, sizeof path, "vocab/ggml-vocab-llama-spm.gguf");
    MnErr err = {0};
    if (gguf_open(path, &g, &err) != MN_OK || tok_load(g, &tok, &err) != MN_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, err.msg);
        const char *ci = getenv("CI");
        return ci && strcmp(ci, "true") == 0 ? -1 : 0;
    }
    return 0;
}

static int teardown(void **s) {
    tok_free(tok);
    gguf_close(g);
    return 0;
}

static void test_reply_memory_used(void **s) {
    if (tok == NULL) skip();
    ReplyMemory *rm = replymem_new(16);
    Hash128 ns = index_namespace_id("");
    ChatMsg turn1[] = {{"user", "Hello"}};
    ChatMsg turn2[] = {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Bye"}};
    TokIds p1 = {0}, plain = {0}, with = {0};
    PromptStats st;
    MnErr err = {0};
    assert_int_equal(prompt_build_chat(tok, CHAT_TMPL_CHATML, turn1, 1, rm, &ns, &p1, &st, &err), MN_OK);
    assert_int_equal(prompt_build_chat(tok, CHAT_TMPL_CHATML, turn2, 3, rm, &ns, &plain, &st, &err), MN_OK);
    assert_int_equal(st.n_replies, 1);
    assert_int_equal(st.n_remembered, 0);
    /* the second turn's prompt starts with the first turn's prompt */
    assert_true(plain.n > p1.n);
    assert_memory_equal(plain.ids, p1.ids, p1.n * sizeof(int32_t));
    /* remember other ids for "Hi there" after exactly p1: they are used */
    int32_t gen[3] = {100, 200, 300};
    Hash128 key = replymem_prefix_key(&ns, p1.ids, p1.n);
    assert_int_equal(replymem_put(rm, &key, "Hi there", 8, gen, 3), MN_OK);
    assert_int_equal(prompt_build_chat(tok, CHAT_TMPL_CHATML, turn2, 3, rm, &ns, &with, &st, &err), MN_OK);
    assert_int_equal(st.n_remembered, 1);
    assert_memory_equal(with.ids, p1.ids, p1.n * sizeof(int32_t));
    assert_memory_equal(with.ids + p1.n, gen, sizeof gen);
    /* another namespace does not see it */
    Hash128 other = index_namespace_id("other");
    TokIds o = {0};
    assert_int_equal(prompt_build_chat(tok, CHAT_TMPL_CHATML, turn2, 3, rm, &other, &o, &st, &err), MN_OK);
    assert_int_equal(st.n_remembered, 0);
    assert_int_equal(o.n, plain.n);
    assert_memory_equal(o.ids, plain.ids, o.n * sizeof(int32_t));
    tok_ids_free(&p1);
    tok_ids_free(&plain);
    tok_ids_free(&with);
    tok_ids_free(&o);
    replymem_free(rm);
}

/* mistral-v3 trims assistant answers: the marker rendering cannot be mapped
 * back, so the whole text is tokenized in one piece. */
static void test_rewriting_template_falls_back(void **s) {
    if (tok == NULL) skip();
    ChatMsg msgs[] = {{"user", "Who are you"}, {"assistant", "   I am an assistant   "}, {"user", "Why"}};
    TokIds got = {0}, want = {0};
    PromptStats st;
    MnErr err = {0};
    Hash128 ns = index_namespace_id("");
    assert_int_equal(prompt_build_chat(tok, CHAT_TMPL_MISTRAL_V3, msgs, 3, NULL, &ns, &got, &st, &err), MN_OK);
    char *text;
    size_t len;
    assert_int_equal(chat_template_apply(CHAT_TMPL_MISTRAL_V3, msgs, 3, true, "<s>", "</s>", &text, &len, &err), MN_OK);
    assert_null(strstr(text, "   I am")); /* the template did trim */
    assert_int_equal(tok_encode(tok, text, len, tok_add_bos(tok), true, &want), MN_OK);
    assert_int_equal(got.n, want.n);
    assert_memory_equal(got.ids, want.ids, got.n * sizeof(int32_t));
    free(text);
    tok_ids_free(&got);
    tok_ids_free(&want);
}

static void test_bad_role(void **s) {
    if (tok == NULL) skip();
    ChatMsg msgs[] = {{"user", "a"}, {"wizard", "b"}};
    TokIds ids = {0};
    MnErr err = {0};
    Hash128 ns = index_namespace_id("");
    assert_int_equal(prompt_build_chat(tok, CHAT_TMPL_LLAMA2, msgs, 2, NULL, &ns, &ids, NULL, &err), MN_EINVAL);
    assert_int_equal(ids.n, 0);
    assert_non_null(strstr(err.msg, "wizard"));
}

/* ---- prompt_submit ---------------------------------------------------------- */

static Model *load_stories(void) {
    char path[512];
    test_data_path(path, sizeof path, "models/stories260K.gguf");
    if (!test_require_file(path)) return NULL;
    Model *m = NULL;
    MnErr err = {0};
    if (model_load(path, &m, &err)) fail_msg("%s", err.msg);
    return m;
}

/* An engine serving stories260K with chat template tmpl; NULL (the test is
 * skipped) when the model file is missing. */
static Engine *start_engine_overflow(ChatTemplate tmpl, ContextOverflow overflow, Model **m) {
    if ((*m = load_stories()) == NULL) return NULL;
    EngineOptions o;
    engine_options_default(&o);
    o.chat_template = tmpl;
    o.context_overflow = overflow;
    Engine *e;
    MnErr err = {0};
    if (engine_new(*m, &o, &e, &err) != MN_OK) fail_msg("engine_new: %s", err.msg);
    return e;
}

static Engine *start_engine(ChatTemplate tmpl, Model **m) { return start_engine_overflow(tmpl, OVERFLOW_RECOMPUTE, m); }

static void greedy(ReqParams *p, int max_tokens, float *first_logits) {
    memset(p, 0, sizeof *p);
    sampler_params_default(&p->sp);
    p->sp.temperature = 0;
    p->max_tokens = max_tokens;
    p->ignore_eos = true;
    p->first_logits = first_logits;
}

/* Read r to its end and drop it: its text (malloc'd) and result. */
static char *finish(Request *r, ReqResult *res) {
    char *all = strdup("");
    for (;;) {
        ReqOutput o;
        assert_int_equal(request_read(r, &o, 1000), MN_OK);
        size_t n = strlen(all);
        all = realloc(all, n + o.len + 1);
        memcpy(all + n, o.text, o.len);
        all[n + o.len] = '\0';
        bool is_done = o.is_done;
        if (is_done) *res = o.res;
        request_output_deinit(&o);
        if (is_done) break;
    }
    request_unref(r);
    return all;
}

/* in through prompt_submit answers as want[0..n_want) submitted directly:
 * the same prompt length, first logits and greedy text; prompt_submit
 * says it dropped n_truncated prompt tokens. */
static void expect_same_answer(Engine *e, const PromptInput *in, const int32_t *want, size_t n_want, int n_truncated) {
    int n_vocab = engine_model(e)->cfg.n_vocab;
    float *la = calloc((size_t)n_vocab, sizeof *la), *lb = calloc((size_t)n_vocab, sizeof *lb);
    ReqParams p;
    greedy(&p, 8, la);
    Request *r = NULL;
    MnErr err = {0};
    ReqField field = REQ_FIELD_PROMPT;
    int truncated = -1;
    if (prompt_submit(e, in, &p, "", NULL, &r, &truncated, &err, &field) != MN_OK) fail_msg("prompt_submit: %s", err.msg);
    assert_non_null(r);
    assert_int_equal(field, REQ_FIELD_NONE);
    assert_int_equal(truncated, n_truncated);
    ReqResult ra, rb;
    char *ta = finish(r, &ra);
    greedy(&p, 8, lb);
    r = request_new(want, n_want, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err, NULL), MN_OK);
    char *tb = finish(r, &rb);
    assert_int_equal(ra.n_prompt, (int)n_want);
    assert_int_equal(rb.n_prompt, (int)n_want);
    assert_string_equal(ta, tb);
    assert_memory_equal(la, lb, (size_t)n_vocab * sizeof *la);
    free(ta);
    free(tb);
    free(la);
    free(lb);
}

/* A chat is rendered with the engine's template (llama2 here, not the
 * default) and tokenized with the reply memory; a text gets BOS as the
 * vocabulary asks; ids are used as given. */
static void test_submit_forms(void **s) {
    Model *m;
    Engine *e = start_engine(CHAT_TMPL_LLAMA2, &m);
    if (e == NULL) return;
    MnErr err = {0};
    ChatMsg msgs[] = {{"user", "Once upon a time"}, {"assistant", "there was a cat"}, {"user", "and then"}};
    Hash128 ns = engine_namespace_id("");
    TokIds want = {0}, other = {0};
    assert_int_equal(prompt_build_chat(m->tok, CHAT_TMPL_LLAMA2, msgs, 3, engine_reply_memory(e), &ns, &want, NULL,
                                       &err), MN_OK);
    assert_int_equal(prompt_build_chat(m->tok, CHAT_TMPL_DEFAULT, msgs, 3, NULL, &ns, &other, NULL, &err), MN_OK);
    assert_false(other.n == want.n && memcmp(other.ids, want.ids, want.n * sizeof *want.ids) == 0);
    PromptInput chat = {.form = PROMPT_CHAT, .msgs = msgs, .n_msgs = 3};
    expect_same_answer(e, &chat, want.ids, want.n, 0);
    const char *text = "Once upon a time, there was";
    TokIds tw = {0};
    assert_int_equal(tok_encode(m->tok, text, strlen(text), tok_add_bos(m->tok), true, &tw), MN_OK);
    PromptInput in_text = {.form = PROMPT_TEXT, .text = text, .text_len = strlen(text)};
    expect_same_answer(e, &in_text, tw.ids, tw.n, 0);
    int32_t ids[5] = {1, 403, 407, 261, 378};
    PromptInput in_ids = {.form = PROMPT_IDS, .ids = ids, .n_ids = 5};
    expect_same_answer(e, &in_ids, ids, 5, 0);
    tok_ids_free(&want);
    tok_ids_free(&other);
    tok_ids_free(&tw);
    engine_free(e);
    model_free(m);
}

/* prompt_submit's refusal of in: its code, field and a part of its message;
 * no request comes back. */
static void expect_refusal(Engine *e, const PromptInput *in, const ReqParams *p, int code, ReqField field,
                           const char *in_msg) {
    Request *r = (Request *)&r; /* not NULL: prompt_submit must clear it */
    MnErr err = {0};
    ReqField got = REQ_FIELD_NONE;
    assert_int_equal(prompt_submit(e, in, p, "", NULL, &r, NULL, &err, &got), code);
    assert_null(r);
    if (got != field || strstr(err.msg, in_msg) == NULL)
        fail_msg("refusal names field %d, expected %d; message '%s', expected '%s' in it", (int)got, (int)field,
                 err.msg, in_msg);
}

/* What the prompt step refuses names the prompt (a template that cannot
 * express the chat, an empty prompt); the engine's refusals come through
 * with their own fields. */
static void test_submit_refusals(void **s) {
    Model *m;
    Engine *e = start_engine(CHAT_TMPL_LLAMA2, &m);
    if (e == NULL) return;
    ReqParams p;
    greedy(&p, 4, NULL);
    ChatMsg bad[] = {{"user", "a"}, {"wizard", "b"}};
    PromptInput in = {.form = PROMPT_CHAT, .msgs = bad, .n_msgs = 2};
    expect_refusal(e, &in, &p, MN_EINVAL, REQ_FIELD_PROMPT, "wizard");
    int32_t ids[3] = {1, 600, 5};
    in = (PromptInput){.form = PROMPT_IDS, .ids = ids, .n_ids = 0};
    expect_refusal(e, &in, &p, MN_EINVAL, REQ_FIELD_PROMPT, "the prompt is empty");
    in.n_ids = 3;
    expect_refusal(e, &in, &p, MN_EINVAL, REQ_FIELD_PROMPT, "prompt: token id 600 is out of range");
    char *text = calloc(20000, 1);
    for (int i = 0; i < 700; i++) strcat(text, "Once upon a ");
    in = (PromptInput){.form = PROMPT_TEXT, .text = text, .text_len = strlen(text)};
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "the context holds 512");
    ChatMsg long_chat[] = {{"user", text}};
    in = (PromptInput){.form = PROMPT_CHAT, .msgs = long_chat, .n_msgs = 1};
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "the context holds 512");
    in = (PromptInput){.form = PROMPT_TEXT, .text = "Once", .text_len = 4};
    p.max_tokens = 1000;
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_MAX_TOKENS, "max_tokens must be between 1 and");
    SamplerBias bias = {512, 1.0f};
    p.max_tokens = 4;
    p.sp.logit_bias = &bias;
    p.sp.n_logit_bias = 1;
    expect_refusal(e, &in, &p, MN_EINVAL, REQ_FIELD_LOGIT_BIAS, "logit_bias: token id 512 is out of range");
    free(text);
    engine_free(e);
    model_free(m);
}

/* ---- context overflow ------------------------------------------------------- */

#define LONG_TURNS 24

/* A conversation longer than stories260K's context of 512: a system
 * message, then LONG_TURNS turns of a user message and a reply (the third
 * with a tool result after its reply), then a last question. */
static size_t long_chat(ChatMsg *msgs, char (*text)[96]) {
    size_t n = 0;
    msgs[n++] = (ChatMsg){"system", "You tell stories about a cat named Tom."};
    for (int t = 0; t < LONG_TURNS; t++) {
        snprintf(text[2 * t], 96, "Turn %d: what did the little dog do next in the park?", t);
        snprintf(text[2 * t + 1], 96, "In turn %d the little dog ran to the big tree and sat down.", t);
        msgs[n++] = (ChatMsg){"user", text[2 * t]};
        msgs[n++] = (ChatMsg){"assistant", text[2 * t + 1]};
        if (t == 2) msgs[n++] = (ChatMsg){"tool", "the weather was sunny"};
    }
    msgs[n++] = (ChatMsg){"user", "And how did the story end?"};
    return n;
}

/* The prompt of the system message and msgs[from..n). */
static void kept_prompt(Engine *e, const ChatMsg *msgs, size_t n, size_t from, TokIds *out) {
    ChatMsg kept[2 * LONG_TURNS + 8];
    size_t k = 0;
    kept[k++] = msgs[0];
    for (size_t i = from; i < n; i++) kept[k++] = msgs[i];
    Hash128 ns = engine_namespace_id("");
    MnErr err = {0};
    out->n = 0;
    assert_int_equal(prompt_build_chat(engine_model(e)->tok, engine_chat_template(e), kept, k, engine_reply_memory(e),
                                       &ns, out, NULL, &err), MN_OK);
}

/* A chat longer than the context keeps its system message and the most
 * recent whole turns that fit with max_tokens, and answers exactly as
 * those messages sent alone (recompute); the tokens dropped are counted.
 * The reference is a plain scan from the oldest turn, which the engine's
 * bisection must agree with. */
static void test_overflow_drops_oldest_turns(void **s) {
    Model *m;
    Engine *e = start_engine(CHAT_TMPL_CHATML, &m);
    if (e == NULL) return;
    ChatMsg msgs[2 * LONG_TURNS + 8];
    char text[2 * LONG_TURNS][96];
    size_t n = long_chat(msgs, text);
    TokIds full = {0}, want = {0};
    kept_prompt(e, msgs, n, 1, &full);
    assert_true(full.n > 512); /* it does overflow */
    size_t from = 1;
    for (;;) { /* from: the first kept message, at a user message */
        do from++;
        while (strcmp(msgs[from].role, "user") != 0);
        kept_prompt(e, msgs, n, from, &want);
        if (want.n + 8 <= 512) break;
    }
    assert_true(from < n - 1); /* more than the last turn fits */
    PromptInput in = {.form = PROMPT_CHAT, .msgs = msgs, .n_msgs = n};
    expect_same_answer(e, &in, want.ids, want.n, (int)(full.n - want.n));
    /* so does the chat of just the kept messages, untruncated */
    ChatMsg kept[2 * LONG_TURNS + 8];
    kept[0] = msgs[0];
    memcpy(kept + 1, msgs + from, (n - from) * sizeof *msgs);
    in.msgs = kept;
    in.n_msgs = 1 + n - from;
    expect_same_answer(e, &in, want.ids, want.n, 0);
    tok_ids_free(&full);
    tok_ids_free(&want);
    engine_free(e);
    model_free(m);
}

/* When even the system message and the last turn do not fit (with
 * max_tokens), or in error mode, a chat is refused as before. */
static void test_overflow_refusals(void **s) {
    Model *m;
    Engine *e = start_engine(CHAT_TMPL_CHATML, &m);
    if (e == NULL) return;
    ReqParams p;
    greedy(&p, 8, NULL);
    char *text = calloc(20000, 1);
    for (int i = 0; i < 700; i++) strcat(text, "Once upon a ");
    ChatMsg last_too_long[] = {{"system", "Tell a story."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", text}};
    PromptInput in = {.form = PROMPT_CHAT, .msgs = last_too_long, .n_msgs = 4};
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "the context holds 512");
    ChatMsg msgs[2 * LONG_TURNS + 8];
    char texts[2 * LONG_TURNS][96];
    size_t n = long_chat(msgs, texts);
    in = (PromptInput){.form = PROMPT_CHAT, .msgs = msgs, .n_msgs = n};
    p.max_tokens = 490; /* the last turn fits, but not with 490 more */
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "the context holds 512");
    engine_free(e);
    model_free(m);
    e = start_engine_overflow(CHAT_TMPL_CHATML, OVERFLOW_ERROR, &m);
    p.max_tokens = 8;
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "the context holds 512");
    free(text);
    engine_free(e);
    model_free(m);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply_memory_used),
        cmocka_unit_test(test_rewriting_template_falls_back),
        cmocka_unit_test(test_bad_role),
        cmocka_unit_test(test_submit_forms),
        cmocka_unit_test(test_submit_refusals),
        cmocka_unit_test(test_overflow_drops_oldest_turns),
        cmocka_unit_test(test_overflow_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
