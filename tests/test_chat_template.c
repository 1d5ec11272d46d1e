/* test_chat_template.c — chat template detection and rendering.
 *
 * Golden test: every case of ../shared/data/chat-templates.json (a real
 * tokenizer.chat_template string and llama.cpp's built-in rendering of one
 * fixed conversation) must be detected and rendered byte for byte. Then
 * hand-written cases: no generation prompt, no system message, a lone
 * system message, empty conversations, BOS/EOS texts, rejected roles, the
 * name table, the no-template default, and allocation failure at every
 * allocation. Includes chat_template.c (with mn_realloc routed through a
 * failure injector) to reach the string buffer and trim helpers.
 *
 * Needs jansson: link with -ljansson.
 */
#include "test_util.h"

#include <jansson.h>
#include <stdbool.h>

#include "base/err.h"
#include "base/mem.h"

static void *ct_realloc(void *ptr, size_t n_bytes);
#define mn_realloc ct_realloc
#include "model/chat_template.c"
#undef mn_realloc

/* ---------------------------------------------------- failure injection */

/* -1: never fail; k >= 0: the (k+1)-th allocation from now fails, and so
 * does every one after it until reset. */
static long ct_fail_after = -1;
static long ct_n_calls = 0; /* allocations attempted, for sizing the loops */

static void *ct_realloc(void *ptr, size_t n_bytes) {
    ct_n_calls++;
    if (ct_fail_after == 0) return NULL;
    if (ct_fail_after > 0) ct_fail_after--;
    return mn_realloc(ptr, n_bytes);
}

/* ---------------------------------------------------------------- helpers */

/* The conversation of chat-templates.json, also used by hand-written cases. */
static const ChatMsg CONV[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define N_CONV (sizeof CONV / sizeof CONV[0])

/* The conversation without its system message. */
static const ChatMsg *const CONV_NOSYS = CONV + 1;
#define N_CONV_NOSYS (N_CONV - 1)

static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n && s[i] != '\0'; i++) {
        if (s[i] == '\n') fputs("\\n", stderr);
        else if (s[i] == '\t') fputs("\\t", stderr);
        else fputc(s[i], stderr);
    }
}

/* Compare; on a mismatch print the case, the first differing byte and
 * context from both strings. Returns true when equal. */
static bool same_text(const char *what, const char *expected, const char *got) {
    if (strcmp(expected, got) == 0) return true;
    size_t at = 0;
    while (expected[at] != '\0' && expected[at] == got[at]) at++;
    size_t from = at > 24 ? at - 24 : 0;
    fprintf(stderr, "MISMATCH %s: first difference at byte %zu (expected %zu bytes, got %zu)\n", what, at,
            strlen(expected), strlen(got));
    fputs("  expected: ...", stderr);
    print_escaped(expected + from, 72);
    fputs("\n  got:      ...", stderr);
    print_escaped(got + from, 72);
    fputs("\n", stderr);
    return false;
}

/* Render and return a malloc'd (mn_malloc) string, failing the test on error. */
static char *render(ChatTemplate t, const ChatMsg *msgs, size_t n, bool is_gen, const char *bos, const char *eos) {
    char *out = NULL;
    size_t len = 0;
    MnErr err = {0};
    int rc = chat_template_apply(t, msgs, n, is_gen, bos, eos, &out, &len, &err);
    if (rc != MN_OK) fail_msg("apply(%s) failed: %s: %s", chat_template_name(t), mn_strerror(rc), err.msg);
    assert_non_null(out);
    assert_int_equal(len, strlen(out));
    return out;
}

static void expect_render(ChatTemplate t, const ChatMsg *msgs, size_t n, bool is_gen, const char *bos,
                          const char *eos, const char *expected) {
    char *out = render(t, msgs, n, is_gen, bos, eos);
    char what[96];
    snprintf(what, sizeof what, "%s (n=%zu, gen=%d)", chat_template_name(t), n, (int)is_gen);
    bool ok = same_text(what, expected, out);
    mn_free(out);
    assert_true(ok);
}

static ChatTemplate by_name(const char *name) {
    ChatTemplate t = CHAT_TMPL__COUNT;
    assert_int_equal(chat_template_from_name(name, &t), MN_OK);
    return t;
}

/* ------------------------------------------------------------ golden data */

static void test_json_cases(void **state) {
    (void)state;
    char path[512];
    test_data_path(path, sizeof path, "chat-templates.json");
    if (!test_require_file(path)) return;

    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (root == NULL) fail_msg("%s:%d: %s", path, jerr.line, jerr.text);
    json_t *conv = json_object_get(root, "conversation");
    json_t *cases = json_object_get(root, "cases");
    assert_true(json_is_array(conv));
    assert_true(json_is_array(cases));
    bool is_gen = json_is_true(json_object_get(root, "add_generation_prompt"));

    size_t n_msgs = json_array_size(conv);
    ChatMsg *msgs = calloc(n_msgs ? n_msgs : 1, sizeof *msgs);
    assert_non_null(msgs);
    for (size_t i = 0; i < n_msgs; i++) {
        json_t *m = json_array_get(conv, i);
        msgs[i].role = json_string_value(json_object_get(m, "role"));
        msgs[i].content = json_string_value(json_object_get(m, "content"));
        assert_non_null(msgs[i].role);
        assert_non_null(msgs[i].content);
    }

    size_t n_cases = json_array_size(cases), n_pass = 0;
    for (size_t c = 0; c < n_cases; c++) {
        json_t *jc = json_array_get(cases, c);
        const char *name = json_string_value(json_object_get(jc, "name"));
        const char *tmpl = json_string_value(json_object_get(jc, "template"));
        const char *expected = json_string_value(json_object_get(jc, "expected"));
        const char *bos = json_string_value(json_object_get(jc, "bos_token"));
        const char *eos = json_string_value(json_object_get(jc, "eos_token"));
        assert_non_null(name);
        assert_non_null(tmpl);
        assert_non_null(expected);

        ChatTemplate t;
        int rc = chat_template_detect(tmpl, &t);
        if (rc != MN_OK) {
            fprintf(stderr, "FAIL case %zu \"%s\": not detected (%s)\n", c, name, mn_strerror(rc));
            continue;
        }
        char *out = NULL;
        size_t len = 0;
        MnErr err = {0};
        rc = chat_template_apply(t, msgs, n_msgs, is_gen, bos, eos, &out, &len, &err);
        if (rc != MN_OK) {
            fprintf(stderr, "FAIL case %zu \"%s\" as %s: %s\n", c, name, chat_template_name(t), err.msg);
            continue;
        }
        char what[256];
        snprintf(what, sizeof what, "case %zu \"%s\" as %s", c, name, chat_template_name(t));
        if (same_text(what, expected, out) && len == strlen(expected)) n_pass++;
        mn_free(out);
    }
    fprintf(stderr, "chat-templates.json: %zu/%zu cases pass\n", n_pass, n_cases);
    free(msgs);
    json_decref(root);
    assert_true(n_cases > 0);
    assert_int_equal(n_pass, n_cases);
}

/* Ling-lite, from llama.cpp's test suite (not in the JSON). */
static void test_bailing_case(void **state) {
    (void)state;
    const char *tmpl =
        "{% for message in messages %}{% set role = message['role'] | lower %}{% if role == 'user' %}"
        "{% set role = 'HUMAN' %}{% endif %}{% set role = role | upper %}{{ '<role>' + role + '</role>' + "
        "message['content'] }}{% endfor %}{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}";
    ChatTemplate t;
    assert_int_equal(chat_template_detect(tmpl, &t), MN_OK);
    assert_int_equal(t, CHAT_TMPL_BAILING);
    expect_render(t, CONV, N_CONV, true, NULL, NULL,
                  "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>ASSISTANT</role>Hi "
                  "there<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am an assistant   "
                  "<role>HUMAN</role>Another question<role>ASSISTANT</role>");
}

/* ------------------------------------------------------- hand-written cases */

static void test_no_generation_prompt(void **state) {
    (void)state;
    expect_render(CHAT_TMPL_CHATML, CONV, N_CONV, false, NULL, NULL,
                  "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                  "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
                  "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother "
                  "question<|im_end|>\n");
    expect_render(CHAT_TMPL_LLAMA3, CONV, N_CONV, false, NULL, NULL,
                  "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>");
    expect_render(CHAT_TMPL_GEMMA, CONV, N_CONV, false, NULL, NULL,
                  "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
                  "<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n"
                  "<start_of_turn>model\nI am an assistant<end_of_turn>\n"
                  "<start_of_turn>user\nAnother question<end_of_turn>\n");
    expect_render(CHAT_TMPL_PHI3, CONV_NOSYS, 2, false, NULL, NULL,
                  "<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n");
    /* [INST] families end a user turn ready for the answer: the flag changes nothing. */
    char *with = render(CHAT_TMPL_MISTRAL_V7, CONV, N_CONV, true, NULL, NULL);
    char *without = render(CHAT_TMPL_MISTRAL_V7, CONV, N_CONV, false, NULL, NULL);
    assert_string_equal(with, without);
    mn_free(with);
    mn_free(without);
}

/* A lone system message without a generation prompt (llama.cpp's
 * format-single-system facts). */
static void test_lone_system(void **state) {
    (void)state;
    static const struct {
        const char *name, *expected;
    } cases[] = {
        {"chatml", "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"},
        {"mistral-v1", " [INST] You are a helpful assistant\n\n"},
        {"mistral-v3", "[INST] You are a helpful assistant\n\n"},
        {"mistral-v3-tekken", "[INST]You are a helpful assistant\n\n"},
        {"mistral-v7", "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT]"},
        {"llama2", "[INST] You are a helpful assistant\n"},
        {"llama2-sys", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\n"},
        {"gemma", ""},
        {"llama3", "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"},
        {"gigachat", "<s>You are a helpful assistant<|message_sep|>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_render(by_name(cases[i].name), CONV, 1, false, NULL, NULL, cases[i].expected);
    ChatTemplate t;
    assert_int_equal(chat_template_detect("mistral", &t), MN_OK); /* old pre-v1 name */
    assert_int_equal(t, CHAT_TMPL_LLAMA2);
}

static void test_no_system_message(void **state) {
    (void)state;
    const ChatMsg *m = CONV_NOSYS;
    size_t n = N_CONV_NOSYS;
    expect_render(CHAT_TMPL_CHATML, m, n, true, NULL, NULL,
                  "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
                  "<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   "
                  "<|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n");
    expect_render(CHAT_TMPL_LLAMA2_SYS, m, n, true, NULL, NULL,
                  "[INST] Hello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>"
                  "[INST] Another question [/INST]");
    expect_render(CHAT_TMPL_MISTRAL_V1, m, n, true, NULL, NULL,
                  " [INST] Hello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s>"
                  " [INST] Another question [/INST]");
    expect_render(CHAT_TMPL_GEMMA, m, n, true, NULL, NULL,
                  "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n"
                  "<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an "
                  "assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n"
                  "<start_of_turn>model\n");
    expect_render(CHAT_TMPL_ORION, m, 3, true, NULL, NULL,
                  "Human: Hello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssistant: </s>");
    expect_render(CHAT_TMPL_GIGACHAT, m, 3, true, NULL, NULL,
                  "<s>user<|role_sep|>Hello<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
                  "assistant<|role_sep|>Hi there<|message_sep|>user<|role_sep|>Who are you<|message_sep|>"
                  "available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>");
    expect_render(CHAT_TMPL_LLAMA3, m, 1, true, NULL, NULL,
                  "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Families not in the JSON, from llama.cpp's formats. */
static void test_other_families(void **state) {
    (void)state;
    const ChatMsg m[] = {{"system", " sys "}, {"user", "hi"}, {"assistant", " yo "}, {"user", "q"}};
    size_t n = sizeof m / sizeof m[0];
    expect_render(CHAT_TMPL_ZEPHYR, m, n, true, NULL, NULL,
                  "<|system|>\n sys <|endoftext|>\n<|user|>\nhi<|endoftext|>\n<|assistant|>\n yo <|endoftext|>\n"
                  "<|user|>\nq<|endoftext|>\n<|assistant|>\n");
    expect_render(CHAT_TMPL_FALCON3, m, n, true, NULL, NULL,
                  "<|system|>\n sys \n<|user|>\nhi\n<|assistant|>\n yo \n<|user|>\nq\n<|assistant|>\n");
    expect_render(CHAT_TMPL_DEEPSEEK3, m, n, true, NULL, NULL,
                  " sys \n\n<｜User｜>hi<｜Assistant｜> yo <｜end▁of▁sentence｜><｜User｜>q<｜Assistant｜>");
    expect_render(CHAT_TMPL_EXAONE3, m, n, true, NULL, NULL,
                  "[|system|]sys[|endofturn|]\n[|user|]hi\n[|assistant|]yo[|endofturn|]\n[|user|]q\n[|assistant|]");
    expect_render(CHAT_TMPL_RWKV_WORLD, m, n, true, NULL, NULL,
                  "System: sys\n\nUser: hi\n\nAssistant: yo\n\nUser: q\n\nAssistant:");
    expect_render(CHAT_TMPL_LLAMA4, m, n, true, NULL, NULL,
                  "<|header_start|>system<|header_end|>\n\nsys<|eot|><|header_start|>user<|header_end|>\n\nhi<|eot|>"
                  "<|header_start|>assistant<|header_end|>\n\nyo<|eot|><|header_start|>user<|header_end|>\n\nq<|eot|>"
                  "<|header_start|>assistant<|header_end|>\n\n");
    expect_render(CHAT_TMPL_SMOLVLM, m, n, true, NULL, NULL,
                  "<|im_start|> sys \n\nUser: hi<end_of_utterance>\nAssistant:  yo <end_of_utterance>\nUser: "
                  "q<end_of_utterance>\nAssistant:");
    expect_render(CHAT_TMPL_DOTS1, m, n, true, NULL, NULL,
                  "<|system|> sys <|endofsystem|><|userprompt|>hi<|endofuserprompt|><|response|> yo "
                  "<|endofresponse|><|userprompt|>q<|endofuserprompt|><|response|>");
    expect_render(CHAT_TMPL_MISTRAL_V7_TEKKEN, m, n, true, NULL, NULL,
                  "[SYSTEM_PROMPT] sys [/SYSTEM_PROMPT][INST]hi[/INST] yo </s>[INST]q[/INST]");
    /* gemma: several system messages merge (trimmed) into the next user turn,
     * skipping model turns; a system text that trims to nothing adds nothing. */
    const ChatMsg g[] = {{"system", " a "}, {"assistant", "x"}, {"system", "b"}, {"user", "u"}};
    expect_render(CHAT_TMPL_GEMMA, g, 4, false, NULL, NULL,
                  "<start_of_turn>model\nx<end_of_turn>\n<start_of_turn>user\nab\n\nu<end_of_turn>\n");
    const ChatMsg g2[] = {{"system", " \n "}, {"user", "u"}};
    expect_render(CHAT_TMPL_GEMMA, g2, 2, false, NULL, NULL, "<start_of_turn>user\nu<end_of_turn>\n");
    /* tool messages where the format names roles verbatim */
    const ChatMsg tool[] = {{"user", "u"}, {"tool", "42"}};
    expect_render(CHAT_TMPL_CHATML, tool, 2, true, NULL, NULL,
                  "<|im_start|>user\nu<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n");
    expect_render(CHAT_TMPL_EXAONE4, tool, 2, false, NULL, NULL, "[|user|]u\n[|tool|]42[|endofturn|]\n");
}

static void test_empty_conversation(void **state) {
    (void)state;
    expect_render(CHAT_TMPL_CHATML, NULL, 0, true, NULL, NULL, "<|im_start|>assistant\n");
    expect_render(CHAT_TMPL_CHATML, NULL, 0, false, NULL, NULL, "");
    expect_render(CHAT_TMPL_LLAMA2, NULL, 0, true, NULL, NULL, "[INST] ");
    expect_render(CHAT_TMPL_MISTRAL_V3, NULL, 0, true, NULL, NULL, "");
    expect_render(CHAT_TMPL_CHATGLM4, NULL, 0, true, NULL, NULL, "[gMASK]<sop><|assistant|>");
    /* every family renders the empty conversation and the full one */
    for (int t = 0; t < CHAT_TMPL__COUNT; t++) {
        mn_free(render((ChatTemplate)t, NULL, 0, true, NULL, NULL));
        mn_free(render((ChatTemplate)t, CONV, N_CONV, true, NULL, NULL));
        mn_free(render((ChatTemplate)t, CONV_NOSYS, N_CONV_NOSYS, false, "<s>", "</s>"));
    }
}

static void test_bos_eos_texts(void **state) {
    (void)state;
    const ChatMsg *m = CONV_NOSYS;
    expect_render(CHAT_TMPL_LLAMA2_SYS_BOS, m, 3, true, "<B>", "<E>",
                  "[INST] Hello [/INST]Hi there<E><B>[INST] Who are you [/INST]");
    expect_render(CHAT_TMPL_LLAMA2_SYS_BOS, m, 3, true, "", NULL,
                  "[INST] Hello [/INST]Hi there</s><s>[INST] Who are you [/INST]");
    expect_render(CHAT_TMPL_MONARCH, m, 2, true, "<B>", "<E>", "user\nHello<E>\n<B>assistant\nHi there<E>\n<B>assistant\n");
    expect_render(CHAT_TMPL_DEEPSEEK2, m, 2, false, NULL, NULL, "User: Hello\n\nAssistant: Hi there<｜end▁of▁sentence｜>");
    expect_render(CHAT_TMPL_DEEPSEEK2, m, 2, false, NULL, "<E>", "User: Hello\n\nAssistant: Hi there<E>");
    /* vicuna's Jinja writes "</s>" literally, whatever the EOS text */
    expect_render(CHAT_TMPL_VICUNA, m, 2, false, NULL, "<E>", "USER: Hello\nASSISTANT: Hi there</s>\n");
}

static void test_rejected_messages(void **state) {
    (void)state;
    char *out = (char *)"sentinel";
    size_t len = 99;
    MnErr err = {0};

    const ChatMsg tool[] = {{"user", "u"}, {"tool", "42"}};
    assert_int_equal(chat_template_apply(CHAT_TMPL_GEMMA, tool, 2, true, NULL, NULL, &out, &len, &err), MN_EINVAL);
    assert_null(out);
    assert_int_equal(len, 0);
    assert_non_null(strstr(err.msg, "gemma"));
    assert_non_null(strstr(err.msg, "message 1"));
    assert_non_null(strstr(err.msg, "tool"));

    const ChatMsg bogus[] = {{"user", "u"}, {"developer", "x"}};
    assert_int_equal(chat_template_apply(CHAT_TMPL_CHATML, bogus, 2, true, NULL, NULL, &out, NULL, &err), MN_EINVAL);
    assert_null(out);
    assert_non_null(strstr(err.msg, "developer"));

    const ChatMsg upper[] = {{"User", "u"}};
    assert_int_equal(chat_template_apply(CHAT_TMPL_CHATML, upper, 1, true, NULL, NULL, &out, NULL, NULL), MN_EINVAL);

    const ChatMsg no_content[] = {{"user", NULL}};
    assert_int_equal(chat_template_apply(CHAT_TMPL_CHATML, no_content, 1, true, NULL, NULL, &out, NULL, &err),
                     MN_EINVAL);
    assert_non_null(strstr(err.msg, "content"));
    const ChatMsg no_role[] = {{NULL, "x"}};
    assert_int_equal(chat_template_apply(CHAT_TMPL_CHATML, no_role, 1, true, NULL, NULL, &out, NULL, &err), MN_EINVAL);

    const ChatMsg late_sys[] = {{"user", "u"}, {"system", "s"}};
    assert_int_equal(chat_template_apply(CHAT_TMPL_GIGACHAT, late_sys, 2, true, NULL, NULL, &out, NULL, &err),
                     MN_EINVAL);
    assert_non_null(strstr(err.msg, "first"));
    assert_int_equal(chat_template_apply(CHAT_TMPL_CHATML, late_sys, 2, true, NULL, NULL, &out, NULL, &err), MN_OK);
    mn_free(out);

    assert_int_equal(chat_template_apply(CHAT_TMPL__COUNT, CONV, 1, true, NULL, NULL, &out, NULL, &err), MN_EINVAL);
    assert_null(out);
    assert_int_equal(chat_template_apply(CHAT_TMPL_CHATML, NULL, 3, true, NULL, NULL, &out, NULL, &err), MN_EINVAL);
    assert_null(out);
}

/* --------------------------------------------------- names and detection */

static void test_names(void **state) {
    (void)state;
    for (int t = 0; t < CHAT_TMPL__COUNT; t++) {
        const char *name = chat_template_name((ChatTemplate)t);
        assert_non_null(name);
        assert_string_not_equal(name, "unknown");
        for (int u = 0; u < t; u++) assert_string_not_equal(name, chat_template_name((ChatTemplate)u));
        ChatTemplate back = CHAT_TMPL__COUNT;
        assert_int_equal(chat_template_from_name(name, &back), MN_OK);
        assert_int_equal(back, t);
        back = CHAT_TMPL__COUNT;
        assert_int_equal(chat_template_detect(name, &back), MN_OK); /* a name is also a template */
        assert_int_equal(back, t);
        assert_non_null(FAMILIES[t].render_fn);
    }
    static const char *const required[] = {"chatml", "llama2", "llama3", "mistral-v7", "gemma", "phi3", "zephyr"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) by_name(required[i]);

    ChatTemplate t = CHAT_TMPL_LLAMA3;
    assert_int_equal(chat_template_from_name("no-such-template", &t), MN_EINVAL);
    assert_int_equal(chat_template_from_name("ChatML", &t), MN_EINVAL);
    assert_int_equal(chat_template_from_name("", &t), MN_EINVAL);
    assert_int_equal(chat_template_from_name(NULL, &t), MN_EINVAL);
    assert_int_equal(t, CHAT_TMPL_LLAMA3); /* untouched */
    assert_string_equal(chat_template_name(CHAT_TMPL__COUNT), "unknown");
    assert_string_equal(chat_template_name((ChatTemplate)-1), "unknown");
}

static void test_detect_unknown(void **state) {
    (void)state;
    ChatTemplate t = CHAT_TMPL_GEMMA;
    assert_int_equal(chat_template_detect("INVALID TEMPLATE", &t), MN_ENOTFOUND);
    assert_int_equal(chat_template_detect("{% for m in messages %}{{ m['content'] }}{% endfor %}", &t), MN_ENOTFOUND);
    assert_int_equal(chat_template_detect("", &t), MN_ENOTFOUND);
    assert_int_equal(chat_template_detect(NULL, &t), MN_EINVAL);
    assert_int_equal(t, CHAT_TMPL_GEMMA); /* untouched */
    assert_int_equal(chat_template_for_model("INVALID TEMPLATE", &t), MN_ENOTFOUND);

    /* marker precedence: <|im_start|> decides before [INST] */
    assert_int_equal(chat_template_detect("<|im_start|> [INST]", &t), MN_OK);
    assert_int_equal(t, CHAT_TMPL_CHATML);
    assert_int_equal(chat_template_detect("<|im_start|><|im_sep|>", &t), MN_OK);
    assert_int_equal(t, CHAT_TMPL_PHI4);
    assert_int_equal(chat_template_detect("<|assistant|><|user|></s>", &t), MN_OK);
    assert_int_equal(t, CHAT_TMPL_FALCON3);
    assert_int_equal(chat_template_detect("<|user|>x<|endoftext|>", &t), MN_OK);
    assert_int_equal(t, CHAT_TMPL_ZEPHYR);
}

/* A model without a tokenizer.chat_template gets ChatML. */
static void test_default_without_template(void **state) {
    (void)state;
    ChatTemplate t = CHAT_TMPL_GEMMA;
    assert_int_equal(chat_template_for_model(NULL, &t), MN_OK);
    assert_int_equal(t, CHAT_TMPL_CHATML);
    t = CHAT_TMPL_GEMMA;
    assert_int_equal(chat_template_for_model("", &t), MN_OK);
    assert_int_equal(t, CHAT_TMPL_DEFAULT);
    expect_render(t, CONV, 2, true, NULL, NULL,
                  "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                  "<|im_start|>assistant\n");
    assert_int_equal(chat_template_for_model("{{ '<start_of_turn>' }}", &t), MN_OK);
    assert_int_equal(t, CHAT_TMPL_GEMMA);
}

/* -------------------------------------------------- internals and failure */

static void test_trim(void **state) {
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"", ""}, {"   ", ""}, {" \t\r\n\v\f", ""}, {"a", "a"}, {"  a b  ", "a b"}, {"\na\n", "a"},
        {"\xc2\xa0x", "\xc2\xa0x"}, /* non-ASCII space is content */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *s = cases[i].in;
        size_t n = strlen(s);
        span_trim(&s, &n);
        assert_int_equal(n, strlen(cases[i].out));
        assert_memory_equal(s, cases[i].out, n);
    }
}

/* The buffer grows through many reallocations; a failure at any of them
 * is sticky, leaks nothing, and leaves the earlier text intact. */
static void test_strbuf_growth_and_failure(void **state) {
    (void)state;
    StrBuf sb;
    sb_init(&sb);
    ct_n_calls = 0;
    for (int i = 0; i < 1000; i++) sb_put(&sb, "0123456789");
    long n_allocs = ct_n_calls;
    assert_true(n_allocs > 5); /* it did grow, step by step */
    assert_false(sb.is_oom);
    assert_int_equal(sb.len, 10000);
    assert_int_equal(strlen(sb.data), 10000);
    assert_true(sb.len < sb.cap);
    mn_free(sb.data);

    for (long k = 0; k < n_allocs; k++) {
        sb_init(&sb);
        ct_fail_after = k;
        size_t n_ok = 0;
        for (int i = 0; i < 1000; i++) {
            sb_put(&sb, "0123456789");
            if (!sb.is_oom) n_ok = sb.len;
        }
        ct_fail_after = -1;
        assert_true(sb.is_oom);
        if (sb.data != NULL) assert_int_equal(strlen(sb.data), n_ok);
        mn_free(sb.data);
    }
    sb_init(&sb);
    sb_reserve(&sb, SIZE_MAX);
    assert_true(sb.is_oom);
    assert_null(sb.data);
}

/* chat_template_apply with the k-th allocation failing, for every k until
 * it succeeds: MN_ENOMEM with *out NULL, then the right text. */
static void test_apply_alloc_failure(void **state) {
    (void)state;
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    const ChatMsg m[] = {{"system", "s"}, {"user", big}, {"assistant", big}, {"user", "q"}};
    char *ref = render(CHAT_TMPL_LLAMA3, m, 4, true, NULL, NULL);
    bool is_done = false;
    for (long k = 0; k < 64 && !is_done; k++) {
        char *out = (char *)"sentinel";
        size_t len = 7;
        MnErr err = {0};
        ct_fail_after = k;
        int rc = chat_template_apply(CHAT_TMPL_LLAMA3, m, 4, true, NULL, NULL, &out, &len, &err);
        ct_fail_after = -1;
        if (rc == MN_ENOMEM) {
            assert_null(out);
            assert_int_equal(len, 0);
            assert_non_null(strstr(err.msg, "out of memory"));
        } else {
            assert_int_equal(rc, MN_OK);
            assert_string_equal(out, ref);
            mn_free(out);
            is_done = true;
        }
    }
    assert_true(is_done);
    mn_free(ref);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_cases),
        cmocka_unit_test(test_bailing_case),
        cmocka_unit_test(test_no_generation_prompt),
        cmocka_unit_test(test_lone_system),
        cmocka_unit_test(test_no_system_message),
        cmocka_unit_test(test_other_families),
        cmocka_unit_test(test_empty_conversation),
        cmocka_unit_test(test_bos_eos_texts),
        cmocka_unit_test(test_rejected_messages),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_detect_unknown),
        cmocka_unit_test(test_default_without_template),
        cmocka_unit_test(test_trim),
        cmocka_unit_test(test_strbuf_growth_and_failure),
        cmocka_unit_test(test_apply_alloc_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
