/* test_template_server.c — `mnemo serve` renders chat templates: the
 * shared cases end to end over HTTP, and how the template is chosen.
 *
 * Golden: every case of ../shared/data/chat-templates-jinja.json (real
 * templates rendered by jinja2 as transformers sets it up) through a server
 * started with --chat-template-file for the case's template and
 * --template-date 2026-01-15 (the reference's strftime_now):
 *   - POST /apply-template answers the case's expected text byte for byte,
 *     or, where the reference raised, 400 with its message in the OpenAI
 *     error object (and the server keeps serving);
 *   - a chat request with the same body answers exactly as a completion
 *     whose prompt is the expected text: the same text, token logprobs and
 *     usage.prompt_tokens at temperature 0, so the chat's prompt is the
 *     tokens of exactly that text (with the one difference llama-server
 *     makes too: a leading BOS text the template wrote is the BOS the
 *     vocabulary adds, so the completion is given the text after it).
 * The case's variables travel as a request can carry them, in llama-server's
 * fields: add_generation_prompt, tools, and chat_template_kwargs for the
 * case's bos_token / eos_token (which override the model's) and its extra
 * variables (firefunction's functions and datetime).
 *
 * The model is stories260K's first layer with its context raised to 8192
 * (a copy written at test time): the templates' special tokens are not in its vocabulary,
 * so they are plain text on both sides, and the longest rendering (a tool
 * prompt) needs about 4000 of its tokens.
 *
 * Choice: a GGUF with tokenizer.chat_template is served with it by default
 * (start-up line "chat template: gguf (tokenizer.chat_template)"); --chat-
 * template-file and --chat-template override it; a model without one gets
 * the built-in default; a template that does not parse stops start-up with
 * a message naming the options; a render error at request time (raise, a
 * bound) is a 400 and the server keeps serving; /apply-template asks for
 * the API key as the other routes do.
 */
#include "test_util.h"
#include "test_serve_util.h"

#include <jansson.h>
#include <stdbool.h>

#include "base/mem.h"
#include "model/gguf.h"

/* ---- fixtures ------------------------------------------------------------------- */

/* Write dir/name: stories260K cut to its first layer (the sanitized build
 * prefills the longest prompts in a fifth of the time), with
 * llama.context_length = n_ctx and, when tmpl is not NULL,
 * tokenizer.chat_template = tmpl. path gets the file's path. false (the
 * test is skipped) when stories260K is missing. */
static bool write_model(const char *dir, const char *name, int n_ctx, const char *tmpl, char *path, size_t cap) {
    char src[512];
    test_data_path(src, sizeof src, "models/stories260K.gguf");
    if (!test_require_file(src)) return false;
    Gguf *g;
    MnErr err = {0};
    if (gguf_open(src, &g, &err) != MN_OK) fail_msg("%s", err.msg);
    GgufWriter *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (strcmp(key, "llama.context_length") == 0) assert_int_equal(gguf_writer_add_u32(w, key, (uint32_t)n_ctx), MN_OK);
        else if (strcmp(key, "llama.block_count") == 0) assert_int_equal(gguf_writer_add_u32(w, key, 1), MN_OK);
        else if (strcmp(key, "tokenizer.chat_template") != 0) assert_int_equal(gguf_writer_copy_kv(w, g, i), MN_OK);
    }
    if (tmpl) assert_int_equal(gguf_writer_add_str(w, "tokenizer.chat_template", tmpl), MN_OK);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const GgufTensor *t = gguf_tensor(g, i);
        if (strncmp(t->name, "blk.", 4) == 0 && strncmp(t->name, "blk.0.", 6) != 0) continue;
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes), MN_OK);
    }
    snprintf(path, cap, "%s/%s", dir, name);
    if (gguf_writer_write(w, path, &err) != MN_OK) fail_msg("%s", err.msg);
    gguf_writer_free(w);
    gguf_close(g);
    return true;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

/* ---- HTTP ----------------------------------------------------------------------- */

/* POST body (a JSON tree, not stolen) to path; the status, *out the parsed
 * answer (the caller's). */
static long post_json(const Srv *s, const char *path, const json_t *body, const char *header, json_t **out) {
    char *text = json_dumps(body, JSON_COMPACT);
    char *answer = NULL;
    const char *headers[] = {header, NULL};
    long status = srv_http(s, NULL, path, text, headers, &answer, NULL, 0);
    json_error_t je;
    *out = json_loads(answer ? answer : "", JSON_ALLOW_NUL, &je);
    if (*out == NULL) fail_msg("%s: status %ld, not JSON (%s): %.300s", path, status, je.text, answer ? answer : "");
    free(text);
    free(answer);
    return status;
}

/* An OpenAI error answer of status 400 whose message holds want. */
static void expect_400(long status, json_t *answer, const char *want, const char *what) {
    json_t *e = json_object_get(answer, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (status != 400 || msg == NULL || strstr(msg, want) == NULL)
        fail_msg("%s: status %ld, expected 400 with '%s': %s", what, status, want, json_dumps(answer, 0));
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
}

/* ---- the shared cases ----------------------------------------------------------- */

/* The body of a case's request, with the case's variables in the fields a
 * request carries them in. */
static json_t *case_body(const json_t *c) {
    json_t *vars = json_pack("{s:O,s:O}", "bos_token", json_object_get(c, "bos_token"), "eos_token",
                             json_object_get(c, "eos_token"));
    json_object_update(vars, json_object_get(c, "extra_vars"));
    json_t *body = json_pack("{s:O,s:O,s:o}", "messages", json_object_get(c, "messages"), "add_generation_prompt",
                             json_object_get(c, "add_generation_prompt"), "chat_template_kwargs", vars);
    if (!json_is_null(json_object_get(c, "tools"))) json_object_set(body, "tools", json_object_get(c, "tools"));
    return body;
}

/* The generation fields both requests of the comparison share. */
static void set_greedy(json_t *body) {
    json_object_set_new(body, "max_tokens", json_integer(3));
    json_object_set_new(body, "temperature", json_real(0));
    json_object_set_new(body, "ignore_eos", json_true());
}

/* The chat answer and the completion answer are the same generation: text,
 * each token and its logprob, and the prompt's length. */
static void expect_same_generation(const json_t *chat, const json_t *cmpl, const char *name) {
    json_t *ch = json_array_get(json_object_get(chat, "choices"), 0);
    json_t *cc = json_array_get(json_object_get(cmpl, "choices"), 0);
    const char *a = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    const char *b = json_string_value(json_object_get(cc, "text"));
    if (a == NULL || b == NULL || strcmp(a, b) != 0) fail_msg("%s: chat answered '%s', the completion '%s'", name, a, b);
    json_int_t pa = json_integer_value(json_object_get(json_object_get(chat, "usage"), "prompt_tokens"));
    json_int_t pb = json_integer_value(json_object_get(json_object_get(cmpl, "usage"), "prompt_tokens"));
    if (pa != pb || pa <= 0) fail_msg("%s: prompt_tokens %lld (chat) and %lld (completion)", name, (long long)pa, (long long)pb);
    json_t *la = json_object_get(json_object_get(ch, "logprobs"), "content");
    json_t *lb = json_object_get(cc, "logprobs");
    assert_int_equal(json_array_size(la), 3);
    assert_int_equal(json_array_size(json_object_get(lb, "tokens")), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *t = json_array_get(la, i);
        const char *tok = json_string_value(json_object_get(t, "token"));
        if (strcmp(tok, json_string_value(json_array_get(json_object_get(lb, "tokens"), i))) != 0 ||
            json_real_value(json_object_get(t, "logprob")) !=
                json_real_value(json_array_get(json_object_get(lb, "token_logprobs"), i)))
            fail_msg("%s: token %zu differs: chat %s, completion %s", name, i, json_dumps(t, 0), json_dumps(lb, 0));
    }
}

/* One case on a server that renders its template. Returns true when it
 * rendered (false: it raised, as the reference did). */
static bool check_case(const Srv *s, const json_t *c, const char *bos_text) {
    char name[256];
    snprintf(name, sizeof name, "%s/%s", json_string_value(json_object_get(c, "template_name")),
             json_string_value(json_object_get(c, "conversation")));
    const json_t *expected = json_object_get(c, "expected");
    const char *error = json_string_value(json_object_get(c, "error"));
    json_t *body = case_body(c), *answer;
    long st = post_json(s, "/apply-template", body, NULL, &answer);
    if (error) {
        expect_400(st, answer, error, name);
        json_decref(answer);
        set_greedy(body);
        st = post_json(s, "/v1/chat/completions", body, NULL, &answer);
        expect_400(st, answer, error, name);
        json_decref(answer);
        json_decref(body);
        return false;
    }
    json_t *prompt = json_object_get(answer, "prompt");
    if (st != 200 || !json_is_string(prompt)) fail_msg("%s: /apply-template status %ld: %s", name, st, json_dumps(answer, 0));
    if (json_string_length(prompt) != json_string_length(expected) ||
        memcmp(json_string_value(prompt), json_string_value(expected), json_string_length(expected)) != 0)
        fail_msg("%s: /apply-template gave\n%s\nexpected\n%s", name, json_string_value(prompt), json_string_value(expected));
    json_decref(answer);

    set_greedy(body);
    json_object_set_new(body, "logprobs", json_true());
    json_t *chat, *cmpl;
    if ((st = post_json(s, "/v1/chat/completions", body, NULL, &chat)) != 200)
        fail_msg("%s: chat status %ld: %s", name, st, json_dumps(chat, 0));
    const char *text = json_string_value(expected);
    size_t skip = strncmp(text, bos_text, strlen(bos_text)) == 0 ? strlen(bos_text) : 0;
    json_t *cbody = json_pack("{s:s%,s:i}", "prompt", text + skip, json_string_length(expected) - skip, "logprobs", 0);
    set_greedy(cbody);
    if ((st = post_json(s, "/v1/completions", cbody, NULL, &cmpl)) != 200)
        fail_msg("%s: completion status %ld: %s", name, st, json_dumps(cmpl, 0));
    expect_same_generation(chat, cmpl, name);
    json_decref(chat);
    json_decref(cmpl);
    json_decref(cbody);
    json_decref(body);
    return true;
}

/* The model's BOS text is the token the vocabulary adds: "<s>" parses to
 * the id an empty text gets with add_special. */
static void expect_bos_text(const Srv *s, const char *bos_text) {
    json_t *a, *b, *q = json_pack("{s:s}", "content", bos_text), *e = json_pack("{s:s,s:b}", "content", "", "add_special", 1);
    assert_int_equal(post_json(s, "/tokenize", q, NULL, &a), 200);
    assert_int_equal(post_json(s, "/tokenize", e, NULL, &b), 200);
    assert_true(json_equal(json_object_get(a, "tokens"), json_object_get(b, "tokens")));
    assert_int_equal(json_array_size(json_object_get(a, "tokens")), 1);
    json_decref(a);
    json_decref(b);
    json_decref(q);
    json_decref(e);
}

static void test_shared_cases(void **state) {
    char path[512], model[512], tmpl_path[600];
    if (!test_require_file(test_data_path(path, sizeof path, "chat-templates-jinja.json"))) return;
    char *dir = test_tmpdir_new("tmplsrv");
    if (!write_model(dir, "stories-8k.gguf", 8192, NULL, model, sizeof model)) {
        test_tmpdir_free(dir);
        return;
    }
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) fail_msg("%s: %s", path, je.text);
    json_t *cases = json_object_get(root, "cases");
    size_t n = json_array_size(cases), n_rendered = 0, n_raised = 0, n_servers = 0;
    snprintf(tmpl_path, sizeof tmpl_path, "%s/template.jinja", dir);
    char extra[800];
    snprintf(extra, sizeof extra, "--chat-template-file %s --template-date 2026-01-15 --evict lru", tmpl_path);
    /* the cases of one template come together: one server for each run of them */
    for (size_t i = 0; i < n;) {
        json_t *c = json_array_get(cases, i);
        const char *tmpl = json_string_value(json_object_get(c, "template"));
        write_text(tmpl_path, tmpl);
        Srv s;
        srv_start_path(&s, model, extra);
        n_servers++;
        if (i == 0) expect_bos_text(&s, "<s>");
        for (; i < n && strcmp(json_string_value(json_object_get(json_array_get(cases, i), "template")), tmpl) == 0; i++)
            check_case(&s, json_array_get(cases, i), "<s>") ? n_rendered++ : n_raised++;
        srv_stop(&s);
    }
    fprintf(stderr, "shared chat templates over HTTP: %zu cases (%zu rendered, %zu raised) on %zu servers\n", n,
            n_rendered, n_raised, n_servers);
    assert_int_equal(n_rendered + n_raised, n);
    assert_true(n_raised > 0 && n_rendered > n_raised);
    json_decref(root);
    test_tmpdir_free(dir);
}

/* ---- choosing the template ------------------------------------------------------ */

#define GGUF_TMPL                                                                                                     \
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{% if add_generation_prompt %}" \
    ">{% endif %}{% if messages[0].content == 'raise' %}{{ raise_exception('no raising here') }}{% endif %}"        \
    "{% if messages[0].content == 'spin' %}{% for i in range(1000000000) %}{% endfor %}{% endif %}"

/* POST /apply-template {"messages": [{"role": "user", "content": content}]}:
 * the status, *prompt the answer's prompt (malloc'd; NULL when none). */
static long apply(const Srv *s, const char *content, const char *header, char **prompt, json_t **answer) {
    json_t *body = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", content), *a;
    long st = post_json(s, "/apply-template", body, header, &a);
    const char *p = json_string_value(json_object_get(a, "prompt"));
    *prompt = p ? strdup(p) : NULL;
    if (answer) *answer = a;
    else json_decref(a);
    json_decref(body);
    return st;
}

/* The server's start-up log holds line. */
static void expect_log(const Srv *s, const char *line) {
    char *log = test_read_file(s->log, NULL);
    if (log == NULL || strstr(log, line) == NULL) fail_msg("no '%s' in the log:\n%s", line, log ? log : "");
    free(log);
}

static void test_gguf_template_by_default(void **state) {
    char *dir = test_tmpdir_new("tmplsrv");
    char model[512], plain[512], file[600], extra[800];
    if (!write_model(dir, "with.gguf", 512, GGUF_TMPL, model, sizeof model) ||
        !write_model(dir, "without.gguf", 512, NULL, plain, sizeof plain)) {
        test_tmpdir_free(dir);
        return;
    }
    Srv s;
    char *p;
    json_t *a;
    srv_start_path(&s, model, "--evict lru");
    expect_log(&s, "mnemo: chat template: gguf (tokenizer.chat_template)\n");
    assert_int_equal(apply(&s, "hi", NULL, &p, NULL), 200);
    assert_string_equal(p, "<s>[user:hi]>");
    free(p);
    /* a chat is rendered so too: the prompt's tokens are those of the text
     * after the BOS text, with BOS (stories260K: 1 + 7 tokens for "[user:hi]>") */
    json_t *body = json_pack("{s:[{s:s,s:s}],s:i,s:f}", "messages", "role", "user", "content", "hi", "max_tokens", 1,
                             "temperature", 0.0), *tb = json_pack("{s:s,s:b}", "content", "[user:hi]>", "add_special", 1);
    assert_int_equal(post_json(&s, "/v1/chat/completions", body, NULL, &a), 200);
    json_t *t;
    assert_int_equal(post_json(&s, "/tokenize", tb, NULL, &t), 200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "usage"), "prompt_tokens")),
                     (json_int_t)json_array_size(json_object_get(t, "tokens")));
    json_decref(a);
    json_decref(t);
    json_decref(tb);
    /* render errors at request time: 400 with the template's message, on
     * both routes, and the server goes on */
    assert_int_equal(apply(&s, "raise", NULL, &p, &a), 400);
    expect_400(400, a, "no raising here", "raise");
    assert_null(p);
    json_decref(a);
    json_object_set_new(json_array_get(json_object_get(body, "messages"), 0), "content", json_string("raise"));
    long st = post_json(&s, "/v1/chat/completions", body, NULL, &a);
    expect_400(st, a, "no raising here", "chat raise");
    json_decref(a);
    assert_int_equal(apply(&s, "spin", NULL, &p, &a), 400);
    expect_400(400, a, "chat template: ", "spin");
    json_decref(a);
    assert_int_equal(apply(&s, "still here", NULL, &p, NULL), 200);
    assert_string_equal(p, "<s>[user:still here]>");
    free(p);
    json_decref(body);
    srv_stop(&s);

    /* a file, then a built-in format, instead of the model's template */
    snprintf(file, sizeof file, "%s/t.jinja", dir);
    write_text(file, "{{ messages[0].content | upper }}|{{ strftime_now('%d %b %Y') }}");
    snprintf(extra, sizeof extra, "--chat-template-file %s --template-date 2031-02-03 --evict lru", file);
    srv_start_path(&s, model, extra);
    char line[700];
    snprintf(line, sizeof line, "mnemo: chat template: file %s\n", file);
    expect_log(&s, line);
    assert_int_equal(apply(&s, "hi", NULL, &p, NULL), 200);
    assert_string_equal(p, "HI|03 Feb 2031");
    free(p);
    srv_stop(&s);
    srv_start_path(&s, model, "--chat-template llama2 --evict lru");
    expect_log(&s, "mnemo: chat template: built-in llama2\n");
    assert_int_equal(apply(&s, "hi", NULL, &p, NULL), 200);
    assert_string_equal(p, "[INST] hi [/INST]");
    free(p);
    srv_stop(&s);
    /* no template in the model: the built-in default */
    srv_start_path(&s, plain, "--evict lru --api-key k");
    expect_log(&s, "mnemo: chat template: built-in chatml (the model has no chat template)\n");
    /* /apply-template asks for the key as the other routes do */
    assert_int_equal(apply(&s, "hi", NULL, &p, &a), 401);
    json_decref(a);
    assert_int_equal(apply(&s, "hi", "Authorization: Bearer k", &p, NULL), 200);
    assert_string_equal(p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(p);
    srv_stop(&s);
    test_tmpdir_free(dir);
}

/* Run `mnemo serve ARGS` expecting it to exit with status before serving;
 * its stderr must hold each of want[0..n_want). */
static void expect_serve_fails(const char *args, int status, const char *const *want, int n_want) {
    char cmd[1600], log[] = "/tmp/mnemo-test-tmplsrv-err-XXXXXX";
    int fd = mkstemp(log);
    close(fd);
    const char *bin = getenv("MNEMO_BIN") ? getenv("MNEMO_BIN") : "./build/release/mnemo";
    snprintf(cmd, sizeof cmd, "%s serve --port 0 %s 2>%s", bin, args, log);
    int st = system(cmd);
    char *text = test_read_file(log, NULL);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != status) fail_msg("%s: status 0x%x, expected exit %d:\n%s", args, st, status, text);
    for (int i = 0; i < n_want; i++)
        if (strstr(text, want[i]) == NULL) fail_msg("%s: no '%s' in:\n%s", args, want[i], text);
    free(text);
    unlink(log);
}

/* A template that does not parse stops start-up, naming the problem and
 * the options that choose another; so do bad options. */
static void test_unparsable_template(void **state) {
    char *dir = test_tmpdir_new("tmplsrv");
    char model[512], file[600], args[1200];
    if (!write_model(dir, "bad.gguf", 512, "{% for m in messages %}{{ m.content }}", model, sizeof model)) {
        test_tmpdir_free(dir);
        return;
    }
    snprintf(args, sizeof args, "-m %s", model);
    const char *const want_gguf[] = {"the model's chat template (tokenizer.chat_template) does not parse",
                                     "line 1", "endfor", "--chat-template-file FILE", "--chat-template NAME"};
    expect_serve_fails(args, 1, want_gguf, 5);
    snprintf(file, sizeof file, "%s/t.jinja", dir);
    write_text(file, "{{ messages[0].content }");
    snprintf(args, sizeof args, "-m %s --chat-template-file %s", model, file);
    const char *const want_file[] = {"the chat template", "t.jinja does not parse", "--chat-template NAME"};
    expect_serve_fails(args, 1, want_file, 3);
    snprintf(args, sizeof args, "-m %s --chat-template-file %s/none.jinja", model, dir);
    const char *const want_missing[] = {"cannot read the chat template file"};
    expect_serve_fails(args, 1, want_missing, 1);
    snprintf(args, sizeof args, "-m %s --chat-template-file %s --chat-template chatml", model, file);
    const char *const want_both[] = {"exclude each other"};
    expect_serve_fails(args, 1, want_both, 1);
    snprintf(args, sizeof args, "-m %s --template-date 2026-02-30", model);
    const char *const want_date[] = {"--template-date"};
    expect_serve_fails(args, 2, want_date, 1);
    /* the built-in format chosen by name still serves that model */
    Srv s;
    char *p;
    srv_start_path(&s, model, "--chat-template zephyr --evict lru");
    assert_int_equal(apply(&s, "hi", NULL, &p, NULL), 200);
    assert_non_null(strstr(p, "<|user|>\nhi"));
    free(p);
    srv_stop(&s);
    test_tmpdir_free(dir);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_template_by_default),
        cmocka_unit_test(test_unparsable_template),
        cmocka_unit_test(test_shared_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
