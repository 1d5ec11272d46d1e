/* test_prompt.c — chat prompts and the reply memory: a remembered reply is
 * tokenized to the generated ids right after exactly the prompt it answered;
 * without an entry the whole rendering is tokenized in one piece (so the
 * prompt is exactly the rendered text's tokens, as llama-server makes it);
 * a leading BOS text the template wrote is not doubled; a template that
 * rewrites contents is tokenized whole; contents that look remembered and
 * are not cost a bounded amount of tokenizing. prompt_submit, the engine's front
 * door: each prompt form becomes the ids it should (with the engine's chat
 * format, built-in or Jinja), prompt_render gives the text a chat is made
 * of, and every refusal names its field. Instances on one Redis (a real
 * redis-server, test_redis_util.h) share their reply memory. */
#include "test_util.h"
#include "test_redis_util.h"
#include "test_engine_util.h"

#include <jansson.h>

#include "base/err.h"
#include "base/mem.h"
#include "cache/index.h"
#include "cache/reply_mem.h"
#include "engine/prompt.h"
#include "model/chat_format.h"
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

/* ---- helpers ------------------------------------------------------------------ */

/* A messages array of n (role, content) pairs. */
static json_t *msgs_json(const char *const (*pairs)[2], size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:s,s:s}", "role", pairs[i][0], "content", pairs[i][1]));
    return a;
}

static ChatFormat *builtin(const Tokenizer *t, ChatTemplate family) {
    ChatFormat *f;
    MnErr err = {0};
    assert_int_equal(chat_format_new_builtin(family, tok_text(t, tok_bos(t)), tok_text(t, tok_eos(t)), &f, &err), MN_OK);
    return f;
}

static ChatFormat *jinja(const Tokenizer *t, const char *src) {
    ChatFormat *f;
    MnErr err = {0};
    if (chat_format_new_jinja(src, strlen(src), tok_text(t, tok_bos(t)), tok_text(t, tok_eos(t)), NULL, &f, &err))
        fail_msg("%s: %s", src, err.msg);
    return f;
}

/* prompt_build_chat of msgs with the generation prompt. */
static int build(const ChatFormat *f, json_t *msgs, ReplyMemory *rm, const Hash128 *ns, TokIds *out, PromptStats *st,
                 MnErr *err) {
    ChatInput in = {msgs, NULL, NULL, true};
    return prompt_build_chat(tok, f, &in, rm, ns, out, st, err);
}

/* The tokens of f's rendering of msgs tokenized whole, BOS as the
 * vocabulary asks, after dropping drop_prefix (a BOS text the template
 * wrote) from its start. */
static void whole(const ChatFormat *f, json_t *msgs, const char *drop_prefix, TokIds *out) {
    ChatInput in = {msgs, NULL, NULL, true};
    char *text;
    size_t len;
    MnErr err = {0};
    assert_int_equal(chat_format_render(f, &in, &text, &len, &err), MN_OK);
    size_t skip = strlen(drop_prefix);
    assert_true(len >= skip && memcmp(text, drop_prefix, skip) == 0);
    assert_int_equal(tok_encode(tok, text + skip, len - skip, tok_add_bos(tok), true, out), MN_OK);
    mn_free(text);
}

static void expect_ids(const TokIds *got, const TokIds *want) {
    if (got->n != want->n || memcmp(got->ids, want->ids, got->n * sizeof(int32_t)) != 0) {
        fprintf(stderr, "got %zu ids, expected %zu:\n", got->n, want->n);
        for (size_t i = 0; i < got->n || i < want->n; i++)
            fprintf(stderr, "  %zu: %d %d\n", i, i < got->n ? got->ids[i] : -1, i < want->n ? want->ids[i] : -1);
        fail();
    }
}

/* The second turn of the conversation every reply-memory test has. */
static const char *const TURN1[][2] = {{"user", "Hello"}};
static const char *const TURN2[][2] = {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Bye"}};

/* Remember other ids for TURN2's answer after exactly p1 (TURN1's prompt)
 * in rm: TURN2's prompt is p1, those ids, then the rest. */
static void expect_reply_used(const ChatFormat *f, ReplyMemory *rm, const Hash128 *ns, const TokIds *p1) {
    json_t *turn2 = msgs_json(TURN2, 3);
    int32_t gen[3] = {100, 200, 300};
    Hash128 key = replymem_prefix_key(ns, p1->ids, p1->n);
    assert_int_equal(replymem_put(rm, &key, "Hi there", 8, gen, 3), MN_OK);
    TokIds with = {0};
    PromptStats st;
    MnErr err = {0};
    assert_int_equal(build(f, turn2, rm, ns, &with, &st, &err), MN_OK);
    assert_int_equal(st.n_remembered, 1);
    assert_true(with.n > p1->n + 3);
    assert_memory_equal(with.ids, p1->ids, p1->n * sizeof(int32_t));
    assert_memory_equal(with.ids + p1->n, gen, sizeof gen);
    tok_ids_free(&with);
    json_decref(turn2);
}

/* ---- prompt_build_chat -------------------------------------------------------- */

static void test_reply_memory_used(void **s) {
    if (tok == NULL) skip();
    ReplyMemory *rm = replymem_new(16);
    Hash128 ns = index_namespace_id("");
    ChatFormat *f = builtin(tok, CHAT_TMPL_CHATML);
    json_t *turn1 = msgs_json(TURN1, 1), *turn2 = msgs_json(TURN2, 3);
    TokIds p1 = {0}, plain = {0}, all = {0};
    PromptStats st;
    MnErr err = {0};
    assert_int_equal(build(f, turn1, rm, &ns, &p1, &st, &err), MN_OK);
    assert_int_equal(build(f, turn2, rm, &ns, &plain, &st, &err), MN_OK);
    assert_int_equal(st.n_replies, 1);
    assert_int_equal(st.n_remembered, 0);
    /* nothing remembered: the whole text's tokens, and (chatml ends the
     * generation prompt with a newline) the first turn's prompt first */
    whole(f, turn2, "", &all);
    expect_ids(&plain, &all);
    assert_true(plain.n > p1.n);
    assert_memory_equal(plain.ids, p1.ids, p1.n * sizeof(int32_t));
    expect_reply_used(f, rm, &ns, &p1);
    /* another namespace does not see it */
    Hash128 other = index_namespace_id("other");
    TokIds o = {0};
    assert_int_equal(build(f, turn2, rm, &other, &o, &st, &err), MN_OK);
    assert_int_equal(st.n_remembered, 0);
    expect_ids(&o, &plain);
    tok_ids_free(&p1);
    tok_ids_free(&plain);
    tok_ids_free(&o);
    tok_ids_free(&all);
    json_decref(turn1);
    json_decref(turn2);
    chat_format_free(f);
    replymem_free(rm);
}

/* A reply not in the reply memory stays inside its piece: llama-2's
 * template writes "[/INST] " before an answer, and SPM tokenizes " there"
 * whole but " " and "there" apart differently, so cutting the text at
 * every answer would give other ids than the rendered text's. */
static void test_unremembered_reply_not_cut(void **s) {
    if (tok == NULL) skip();
    ReplyMemory *rm = replymem_new(16);
    Hash128 ns = index_namespace_id("");
    ChatFormat *f = jinja(tok, "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
                               "{% else %} {{ m.content }} </s>{% endif %}{% endfor %}");
    const char *const t1[][2] = {{"user", "Once upon a time"}};
    const char *const t2[][2] = {{"user", "Once upon a time"}, {"assistant", "there was a cat"}, {"user", "Then"}};
    json_t *turn1 = msgs_json(t1, 1), *turn2 = msgs_json(t2, 3);
    TokIds p1 = {0}, got = {0}, all = {0}, cut = {0};
    PromptStats st;
    MnErr err = {0};
    assert_int_equal(build(f, turn1, rm, &ns, &p1, &st, &err), MN_OK);
    int32_t gen[2] = {100, 200};
    Hash128 key = replymem_prefix_key(&ns, p1.ids, p1.n);
    assert_int_equal(replymem_put(rm, &key, "there was a dog", 15, gen, 2), MN_OK);
    assert_int_equal(build(f, turn2, rm, &ns, &got, &st, &err), MN_OK);
    assert_int_equal(st.n_remembered, 0);
    whole(f, turn2, "", &all);
    expect_ids(&got, &all);
    /* the premise: cut at the answer, the ids differ */
    ChatInput in = {turn2, NULL, NULL, true};
    char *text;
    size_t len;
    assert_int_equal(chat_format_render(f, &in, &text, &len, &err), MN_OK);
    const char *at = strstr(text, "there was a cat");
    assert_non_null(at);
    assert_int_equal(tok_encode(tok, text, (size_t)(at - text), tok_add_bos(tok), true, &cut), MN_OK);
    assert_int_equal(tok_encode_cont(tok, at, 15, true, &cut), MN_OK);
    assert_int_equal(tok_encode_cont(tok, at + 15, strlen(at + 15), true, &cut), MN_OK);
    assert_false(cut.n == all.n && memcmp(cut.ids, all.ids, all.n * sizeof(int32_t)) == 0);
    mn_free(text);
    tok_ids_free(&p1);
    tok_ids_free(&got);
    tok_ids_free(&all);
    tok_ids_free(&cut);
    json_decref(turn1);
    json_decref(turn2);
    chat_format_free(f);
    replymem_free(rm);
}

/* Two remembered replies: the second is looked up after the first's
 * remembered ids and the piece between them (the key grows with the
 * prompt as it is built). */
static void test_two_replies_remembered(void **s) {
    if (tok == NULL) skip();
    ReplyMemory *rm = replymem_new(16);
    Hash128 ns = index_namespace_id("");
    ChatFormat *f = builtin(tok, CHAT_TMPL_CHATML);
    const char *const t3[][2] = {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Bye"},
                                 {"assistant", "See you"}, {"user", "Ok"}};
    json_t *turn1 = msgs_json(TURN1, 1), *turn2 = msgs_json(TURN2, 3), *turn3 = msgs_json(t3, 5);
    TokIds p1 = {0}, p2 = {0}, p3 = {0};
    PromptStats st;
    MnErr err = {0};
    assert_int_equal(build(f, turn1, rm, &ns, &p1, &st, &err), MN_OK);
    int32_t gen1[3] = {100, 200, 300}, gen2[2] = {400, 500};
    Hash128 key = replymem_prefix_key(&ns, p1.ids, p1.n);
    assert_int_equal(replymem_put(rm, &key, "Hi there", 8, gen1, 3), MN_OK);
    assert_int_equal(build(f, turn2, rm, &ns, &p2, &st, &err), MN_OK);
    assert_int_equal(st.n_remembered, 1);
    key = replymem_prefix_key(&ns, p2.ids, p2.n);
    assert_int_equal(replymem_put(rm, &key, "See you", 7, gen2, 2), MN_OK);
    assert_int_equal(build(f, turn3, rm, &ns, &p3, &st, &err), MN_OK);
    assert_int_equal(st.n_remembered, 2);
    assert_true(p3.n > p2.n + 2);
    assert_memory_equal(p3.ids, p2.ids, p2.n * sizeof(int32_t));
    assert_memory_equal(p3.ids + p2.n, gen2, sizeof gen2);
    tok_ids_free(&p1);
    tok_ids_free(&p2);
    tok_ids_free(&p3);
    json_decref(turn1);
    json_decref(turn2);
    json_decref(turn3);
    chat_format_free(f);
    replymem_free(rm);
}

/* Contents that the reply memory may hold (their text is remembered, after
 * another prefix) and does not: each is looked up with the piece before
 * it tokenized, which is then undone, and the next one tokenizes that
 * piece again, longer. The bytes undone stay within prompt.h's budget
 * (without it a chat of 400 such turns tokenizes its rendering about 200
 * times over), and the prompt is still the whole text's tokens. */
static void test_undone_pieces_bounded(void **s) {
    if (tok == NULL) skip();
    ReplyMemory *rm = replymem_new(16);
    Hash128 ns = index_namespace_id("");
    ChatFormat *f = builtin(tok, CHAT_TMPL_CHATML);
    int32_t gen[1] = {100}, other[1] = {7};
    Hash128 key = replymem_prefix_key(&ns, other, 1);
    assert_int_equal(replymem_put(rm, &key, "Sure", 4, gen, 1), MN_OK);
    json_t *msgs = json_array();
    for (int i = 0; i < 400; i++) {
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "a"));
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", "Sure"));
    }
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "b"));
    ChatInput in = {msgs, NULL, NULL, true};
    char *text;
    size_t len;
    MnErr err = {0};
    assert_int_equal(chat_format_render(f, &in, &text, &len, &err), MN_OK);
    TokIds got = {0}, all = {0};
    PromptStats st;
    assert_int_equal(build(f, msgs, rm, &ns, &got, &st, &err), MN_OK);
    assert_int_equal(st.n_replies, 400);
    assert_int_equal(st.n_remembered, 0);
    assert_true(st.bytes_undone > 0);
    assert_true(st.bytes_undone <= PROMPT_UNDONE_BYTES(len));
    whole(f, msgs, "", &all);
    expect_ids(&got, &all);
    mn_free(text);
    tok_ids_free(&got);
    tok_ids_free(&all);
    json_decref(msgs);
    chat_format_free(f);
    replymem_free(rm);
}

/* A Jinja template that writes bos_token: the vocabulary adds BOS itself,
 * so the text's leading BOS is dropped and the prompt holds one. The reply
 * memory works the same behind it. */
static void test_template_bos_not_doubled(void **s) {
    if (tok == NULL) skip();
    assert_true(tok_add_bos(tok));
    ReplyMemory *rm = replymem_new(16);
    Hash128 ns = index_namespace_id("");
    ChatFormat *f = jinja(tok, "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                               "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
    json_t *turn1 = msgs_json(TURN1, 1);
    TokIds p1 = {0}, all = {0};
    PromptStats st;
    MnErr err = {0};
    assert_int_equal(build(f, turn1, rm, &ns, &p1, &st, &err), MN_OK);
    whole(f, turn1, tok_text(tok, tok_bos(tok)), &all);
    expect_ids(&p1, &all);
    assert_int_equal(p1.ids[0], tok_bos(tok));
    assert_true(p1.ids[1] != tok_bos(tok));
    expect_reply_used(f, rm, &ns, &p1);
    tok_ids_free(&p1);
    tok_ids_free(&all);
    json_decref(turn1);
    chat_format_free(f);
    replymem_free(rm);
}

/* mistral-v3 trims assistant answers: the marker rendering cannot be mapped
 * back, so the whole text is tokenized in one piece. */
static void test_rewriting_template_falls_back(void **s) {
    if (tok == NULL) skip();
    ReplyMemory *rm = replymem_new(16);
    ChatFormat *f = builtin(tok, CHAT_TMPL_MISTRAL_V3);
    const char *const m[][2] = {{"user", "Who are you"}, {"assistant", "   I am an assistant   "}, {"user", "Why"}};
    json_t *msgs = msgs_json(m, 3);
    TokIds got = {0}, want = {0};
    PromptStats st;
    MnErr err = {0};
    Hash128 ns = index_namespace_id("");
    assert_int_equal(build(f, msgs, rm, &ns, &got, &st, &err), MN_OK);
    ChatInput in = {msgs, NULL, NULL, true};
    char *text;
    size_t len;
    assert_int_equal(chat_format_render(f, &in, &text, &len, &err), MN_OK);
    assert_null(strstr(text, "   I am")); /* the template did trim */
    whole(f, msgs, "", &want);
    expect_ids(&got, &want);
    mn_free(text);
    tok_ids_free(&got);
    tok_ids_free(&want);
    json_decref(msgs);
    chat_format_free(f);
    replymem_free(rm);
}

static void test_bad_role(void **s) {
    if (tok == NULL) skip();
    ChatFormat *f = builtin(tok, CHAT_TMPL_LLAMA2);
    const char *const m[][2] = {{"user", "a"}, {"wizard", "b"}};
    json_t *msgs = msgs_json(m, 2);
    TokIds ids = {0};
    MnErr err = {0};
    Hash128 ns = index_namespace_id("");
    assert_int_equal(build(f, msgs, NULL, &ns, &ids, NULL, &err), MN_EINVAL);
    assert_int_equal(ids.n, 0);
    assert_non_null(strstr(err.msg, "wizard"));
    json_decref(msgs);
    chat_format_free(f);
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

/* An engine serving m with chat format fmt (the caller's; NULL: none),
 * the given context overflow and the shared tier at redis_url (NULL:
 * none); NULL (the test is skipped) when m is. */
static Engine *start_engine_with(const ChatFormat *fmt, ContextOverflow overflow, const char *redis_url, Model *m) {
    if (m == NULL) return NULL;
    EngineOptions o;
    engine_options_default(&o);
    o.restore_plan = RESTORE_PLAN_KV; /* (auto's split follows measured times) */
    o.chat_format = fmt;
    o.context_overflow = overflow;
    o.redis_urls = &redis_url;
    o.n_redis_urls = redis_url ? 1 : 0;
    Engine *e;
    MnErr err = {0};
    if (engine_new(m, &o, &e, &err) != MN_OK) fail_msg("engine_new: %s", err.msg);
    return e;
}

static Engine *start_engine_overflow(const ChatFormat *fmt, ContextOverflow overflow, Model *m) {
    return start_engine_with(fmt, overflow, NULL, m);
}

static Engine *start_engine(const ChatFormat *fmt, Model *m) { return start_engine_overflow(fmt, OVERFLOW_RECOMPUTE, m); }

static void greedy(ReqParams *p, int max_tokens, float *first_logits) {
    memset(p, 0, sizeof *p);
    sampler_params_default(&p->sp);
    p->sp.temperature = 0;
    p->max_tokens = max_tokens;
    p->ignore_eos = true;
    p->first_logits = first_logits;
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
    char *ta = test_request_finish(r, &ra);
    greedy(&p, 8, lb);
    r = request_new(want, n_want, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err, NULL), MN_OK);
    char *tb = test_request_finish(r, &rb);
    assert_int_equal(ra.n_prompt, (int)n_want);
    assert_int_equal(rb.n_prompt, (int)n_want);
    assert_string_equal(ta, tb);
    assert_memory_equal(la, lb, (size_t)n_vocab * sizeof *la);
    free(ta);
    free(tb);
    free(la);
    free(lb);
}

/* A chat is rendered with the engine's format (llama2 here, not the
 * default) and tokenized with the reply memory; a text gets BOS as the
 * vocabulary asks; ids are used as given. */
static void test_submit_forms(void **s) {
    Model *m = load_stories();
    if (m == NULL) return;
    ChatFormat *f = builtin(m->tok, CHAT_TMPL_LLAMA2), *other_f = builtin(m->tok, CHAT_TMPL_DEFAULT);
    Engine *e = start_engine(f, m);
    MnErr err = {0};
    const char *const pairs[][2] = {{"user", "Once upon a time"}, {"assistant", "there was a cat"}, {"user", "and then"}};
    json_t *msgs = msgs_json(pairs, 3);
    ChatInput ci = {msgs, NULL, NULL, true};
    Hash128 ns = engine_namespace_id("");
    TokIds want = {0}, other = {0};
    assert_int_equal(prompt_build_chat(m->tok, f, &ci, engine_reply_memory(e), &ns, &want, NULL, &err), MN_OK);
    assert_int_equal(prompt_build_chat(m->tok, other_f, &ci, NULL, &ns, &other, NULL, &err), MN_OK);
    assert_false(other.n == want.n && memcmp(other.ids, want.ids, want.n * sizeof *want.ids) == 0);
    PromptInput chat = {.form = PROMPT_CHAT, .chat = &ci};
    expect_same_answer(e, &chat, want.ids, want.n, 0);
    const char *text = "Once upon a time, there was";
    TokIds tw = {0};
    assert_int_equal(tok_encode(m->tok, text, strlen(text), tok_add_bos(m->tok), true, &tw), MN_OK);
    PromptInput in_text = {.form = PROMPT_TEXT, .text = text, .text_len = strlen(text)};
    expect_same_answer(e, &in_text, tw.ids, tw.n, 0);
    int32_t ids[5] = {1, 403, 407, 261, 378};
    PromptInput in_ids = {.form = PROMPT_IDS, .ids = ids, .n_ids = 5};
    expect_same_answer(e, &in_ids, ids, 5, 0);
    /* prompt_render: the engine's format's text, as chat_format_render gives it */
    char *a, *b;
    size_t na, nb;
    assert_int_equal(prompt_render(e, &ci, &a, &na, &err), MN_OK);
    assert_int_equal(chat_format_render(f, &ci, &b, &nb, &err), MN_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    mn_free(a);
    mn_free(b);
    tok_ids_free(&want);
    tok_ids_free(&other);
    tok_ids_free(&tw);
    json_decref(msgs);
    engine_free(e);
    chat_format_free(f);
    chat_format_free(other_f);
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
    Model *m = load_stories();
    if (m == NULL) return;
    ChatFormat *f = builtin(m->tok, CHAT_TMPL_LLAMA2);
    Engine *e = start_engine(f, m);
    ReqParams p;
    greedy(&p, 4, NULL);
    const char *const bad[][2] = {{"user", "a"}, {"wizard", "b"}};
    json_t *bad_msgs = msgs_json(bad, 2);
    ChatInput ci = {bad_msgs, NULL, NULL, true};
    PromptInput in = {.form = PROMPT_CHAT, .chat = &ci};
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
    const char *const long_chat[][2] = {{"user", text}};
    json_t *long_msgs = msgs_json(long_chat, 1);
    ci = (ChatInput){long_msgs, NULL, NULL, true};
    in = (PromptInput){.form = PROMPT_CHAT, .chat = &ci};
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
    json_decref(bad_msgs);
    json_decref(long_msgs);
    engine_free(e);
    chat_format_free(f);
    model_free(m);
}

/* A Jinja template's errors are the prompt's refusals, with the template's
 * message: raise_exception (MN_EINVAL), a bound (MN_ERANGE). An engine
 * given no chat format renders with the built-in default. */
static void test_template_refusals(void **s) {
    Model *m = load_stories();
    if (m == NULL) return;
    ChatFormat *f = jinja(m->tok, "{% if messages[0].role != 'system' %}{{ raise_exception('a system message must "
                                  "come first') }}{% endif %}{% for i in range(100000000) %}{% endfor %}");
    Engine *e = start_engine(f, m);
    ReqParams p;
    greedy(&p, 4, NULL);
    const char *const user[][2] = {{"user", "a"}}, *const sys[][2] = {{"system", "a"}};
    json_t *u = msgs_json(user, 1), *sy = msgs_json(sys, 1);
    ChatInput ci = {u, NULL, NULL, true};
    PromptInput in = {.form = PROMPT_CHAT, .chat = &ci};
    expect_refusal(e, &in, &p, MN_EINVAL, REQ_FIELD_PROMPT, "a system message must come first");
    ci.messages = sy;
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "chat template: ");
    engine_free(e);
    /* an engine given no format renders with the built-in default */
    e = start_engine(NULL, m);
    char *text, *want;
    size_t len, want_len;
    MnErr err = {0};
    assert_int_equal(prompt_render(e, &ci, &text, &len, &err), MN_OK);
    assert_int_equal(chat_format_render(chat_format_default(), &ci, &want, &want_len, &err), MN_OK);
    assert_int_equal(len, want_len);
    assert_memory_equal(text, want, len);
    assert_non_null(strstr(text, "<|im_start|>system\na<|im_end|>"));
    mn_free(text);
    mn_free(want);
    engine_free(e);
    json_decref(u);
    json_decref(sy);
    chat_format_free(f);
    model_free(m);
}

/* ---- context overflow ------------------------------------------------------- */

#define LONG_TURNS 24

/* A conversation longer than stories260K's context of 512: a system
 * message, then LONG_TURNS turns of a user message and a reply (the third
 * with a tool result after its reply), then a last question. */
static json_t *long_chat(void) {
    json_t *msgs = json_array();
    char text[96];
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content",
                                          "You tell stories about a cat named Tom."));
    for (int t = 0; t < LONG_TURNS; t++) {
        snprintf(text, sizeof text, "Turn %d: what did the little dog do next in the park?", t);
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", text));
        snprintf(text, sizeof text, "In turn %d the little dog ran to the big tree and sat down.", t);
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", text));
        if (t == 2)
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "tool", "content", "the weather was sunny"));
    }
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "And how did the story end?"));
    return msgs;
}

/* The system message (msgs[0]) and msgs[from..): a new array. */
static json_t *kept_msgs(const json_t *msgs, size_t from) {
    json_t *kept = json_array();
    json_array_append(kept, json_array_get(msgs, 0));
    for (size_t i = from; i < json_array_size(msgs); i++) json_array_append(kept, json_array_get(msgs, i));
    return kept;
}

/* The prompt of the system message and msgs[from..) with f. */
static void kept_prompt(Engine *e, const ChatFormat *f, const json_t *msgs, size_t from, TokIds *out) {
    json_t *kept = kept_msgs(msgs, from);
    ChatInput ci = {kept, NULL, NULL, true};
    Hash128 ns = engine_namespace_id("");
    MnErr err = {0};
    out->n = 0;
    assert_int_equal(prompt_build_chat(engine_model(e)->tok, f, &ci, engine_reply_memory(e), &ns, out, NULL, &err),
                     MN_OK);
    json_decref(kept);
}

static const char *role_at(const json_t *msgs, size_t i) {
    return json_string_value(json_object_get(json_array_get(msgs, i), "role"));
}

/* A chat longer than the context keeps its system message and the most
 * recent whole turns that fit with max_tokens, and answers exactly as
 * those messages sent alone (recompute); the tokens dropped are counted.
 * The reference is a plain scan from the oldest turn, which the engine's
 * bisection must agree with. */
static void test_overflow_drops_oldest_turns(void **s) {
    Model *m = load_stories();
    if (m == NULL) return;
    ChatFormat *f = builtin(m->tok, CHAT_TMPL_CHATML);
    Engine *e = start_engine(f, m);
    json_t *msgs = long_chat();
    size_t n = json_array_size(msgs);
    TokIds full = {0}, want = {0};
    kept_prompt(e, f, msgs, 1, &full);
    assert_true(full.n > 512); /* it does overflow */
    size_t from = 1;
    for (;;) { /* from: the first kept message, at a user message */
        do from++;
        while (strcmp(role_at(msgs, from), "user") != 0);
        kept_prompt(e, f, msgs, from, &want);
        if (want.n + 8 <= 512) break;
    }
    assert_true(from < n - 1); /* more than the last turn fits */
    ChatInput ci = {msgs, NULL, NULL, true};
    PromptInput in = {.form = PROMPT_CHAT, .chat = &ci};
    expect_same_answer(e, &in, want.ids, want.n, (int)(full.n - want.n));
    /* so does the chat of just the kept messages, untruncated */
    json_t *kept = kept_msgs(msgs, from);
    ci.messages = kept;
    expect_same_answer(e, &in, want.ids, want.n, 0);
    tok_ids_free(&full);
    tok_ids_free(&want);
    json_decref(kept);
    json_decref(msgs);
    engine_free(e);
    chat_format_free(f);
    model_free(m);
}

/* When even the system message and the last turn do not fit (with
 * max_tokens), or in error mode, a chat is refused as before. */
static void test_overflow_refusals(void **s) {
    Model *m = load_stories();
    if (m == NULL) return;
    ChatFormat *f = builtin(m->tok, CHAT_TMPL_CHATML);
    Engine *e = start_engine(f, m);
    ReqParams p;
    greedy(&p, 8, NULL);
    char *text = calloc(20000, 1);
    for (int i = 0; i < 700; i++) strcat(text, "Once upon a ");
    const char *const last_too_long[][2] = {{"system", "Tell a story."}, {"user", "Hi"}, {"assistant", "Hello"},
                                            {"user", text}};
    json_t *lt = msgs_json(last_too_long, 4), *msgs = long_chat();
    ChatInput ci = {lt, NULL, NULL, true};
    PromptInput in = {.form = PROMPT_CHAT, .chat = &ci};
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "the context holds 512");
    ci.messages = msgs;
    p.max_tokens = 490; /* the last turn fits, but not with 490 more */
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "the context holds 512");
    engine_free(e);
    e = start_engine_overflow(f, OVERFLOW_ERROR, m);
    p.max_tokens = 8;
    expect_refusal(e, &in, &p, MN_ERANGE, REQ_FIELD_PROMPT, "the context holds 512");
    free(text);
    json_decref(lt);
    json_decref(msgs);
    engine_free(e);
    chat_format_free(f);
    model_free(m);
}

/* ---- the reply memory shared through Redis --------------------------------------- */

static int redis_setup(void **state) {
    *state = calloc(1, sizeof(RedisSrv));
    return *state ? 0 : -1;
}

static int redis_teardown(void **state) {
    redis_srv_free(*state);
    free(*state);
    return 0;
}

/* How many assistant contents of msgs e's reply memory supplies. */
static int n_remembered(Engine *e, Model *m, const ChatFormat *f, json_t *msgs) {
    ChatInput ci = {msgs, NULL, NULL, true};
    Hash128 ns = engine_namespace_id("");
    TokIds ids = {0};
    PromptStats st;
    MnErr err = {0};
    assert_int_equal(prompt_build_chat(m->tok, f, &ci, engine_reply_memory(e), &ns, &ids, &st, &err), MN_OK);
    tok_ids_free(&ids);
    return st.n_remembered;
}

/* Instances on one Redis share their reply memory: a reply instance A
 * generated is tokenized on B, which never saw it, to the ids A generated
 * (from the reply memory, as A would), so the conversation's prompt, and
 * its chain hashes, are the same on both; an instance without the shared
 * tier tokenizes the text. */
static void test_shared_reply_memory(void **s) {
    RedisSrv *srv = *s;
    if (!redis_srv_available()) {
        skip();
        return;
    }
    Model *m = load_stories();
    if (m == NULL) return;
    redis_srv_start(srv, NULL);
    ChatFormat *f = builtin(m->tok, CHAT_TMPL_LLAMA2);
    Engine *a = start_engine_with(f, OVERFLOW_RECOMPUTE, srv->url, m);
    const char *const turn1[][2] = {{"user", "Once upon a time"}};
    json_t *msgs = msgs_json(turn1, 1);
    ChatInput ci = {msgs, NULL, NULL, true};
    PromptInput in = {.form = PROMPT_CHAT, .chat = &ci};
    ReqParams p;
    greedy(&p, 12, NULL);
    Request *r = NULL;
    MnErr err = {0};
    if (prompt_submit(a, &in, &p, "", NULL, &r, NULL, &err, NULL) != MN_OK) fail_msg("prompt_submit: %s", err.msg);
    ReqResult res;
    char *reply = test_request_finish(r, &res);
    json_decref(msgs);
    assert_int_equal(replymem_count(engine_reply_memory(a)), 1);
    engine_free(a); /* (its mover finishes what is queued: the entry is shared) */
    const char *const turn2[][2] = {{"user", "Once upon a time"}, {"assistant", reply}, {"user", "and then"}};
    msgs = msgs_json(turn2, 3);
    Engine *b = start_engine_with(f, OVERFLOW_RECOMPUTE, srv->url, m), *c = start_engine(f, m);
    assert_int_equal(n_remembered(b, m, f, msgs), 1);
    assert_int_equal(n_remembered(c, m, f, msgs), 0);
    json_decref(msgs);
    free(reply);
    engine_free(b);
    engine_free(c);
    chat_format_free(f);
    model_free(m);
}

int main(void) {
    test_apply_filter();
    signal(SIGPIPE, SIG_IGN); /* as mnemo serve: a write to a dead Redis is an error, not a signal */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply_memory_used),
        cmocka_unit_test(test_unremembered_reply_not_cut),
        cmocka_unit_test(test_two_replies_remembered),
        cmocka_unit_test(test_undone_pieces_bounded),
        cmocka_unit_test(test_template_bos_not_doubled),
        cmocka_unit_test(test_rewriting_template_falls_back),
        cmocka_unit_test(test_bad_role),
        cmocka_unit_test(test_submit_forms),
        cmocka_unit_test(test_submit_refusals),
        cmocka_unit_test(test_overflow_drops_oldest_turns),
        cmocka_unit_test(test_overflow_refusals),
        cmocka_unit_test(test_template_refusals),
        cmocka_unit_test_setup_teardown(test_shared_reply_memory, redis_setup, redis_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
