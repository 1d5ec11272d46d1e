/* test_prompt.c — chat prompts and the reply memory: a remembered reply is
 * tokenized to the generated ids right after exactly the prompt it answered;
 * without an entry the same pieces are tokenized; a template that rewrites
 * contents falls back to tokenizing the whole rendering. */
#include "test_util.h"

#include "base/err.h"
#include "cache/index.h"
#include "cache/reply_mem.h"
#include "engine/prompt.h"
#include "model/gguf.h"
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

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply_memory_used),
        cmocka_unit_test(test_rewriting_template_falls_back),
        cmocka_unit_test(test_bad_role),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
