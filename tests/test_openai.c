/* test_openai.c — OpenAI request parsing/validation and response building.
 *
 * Parsing: valid requests of every route and shape (defaults, every field
 * set, content-part arrays, developer role, null assistant content, stop as
 * string and list, prompt as text, ids and a one-string list, JSON nulls as
 * absent), then a table of invalid bodies — every field with a wrong type
 * and out of range — each of which must give MN_EINVAL, a message that
 * starts with the field's name and a zeroed request.
 * Building: every builder's output parses back with jansson and has the
 * expected members; invalid UTF-8 in any text comes out as U+FFFD, the same
 * in chunks and whole responses; api_utf8_sanitize on the classic
 * ill-formed cases; the error-type and status tables.
 * Failure: every allocation (ours through mn_*, jansson's through
 * json_set_alloc_funcs) is made to fail in turn for a parse and for each
 * builder; nothing may crash or leak (run under ASan).
 *
 * Includes openai.c and api_base.c (the error object, the sanitizer and
 * the serializer the builders share) with the mn_* allocators routed
 * through an injector.
 * Needs jansson: link with -ljansson.
 */
#include "test_util.h"

#include <jansson.h>
#include <stdbool.h>

#include "base/err.h"
#include "base/mem.h"

static void *oa_malloc(size_t n);
static void *oa_calloc(size_t n, size_t size);
static void *oa_realloc(void *p, size_t n);
static char *oa_strdup(const char *s);
static char *oa_strndup(const char *s, size_t n);
#define mn_malloc oa_malloc
#define mn_calloc oa_calloc
#define mn_realloc oa_realloc
#define mn_strdup oa_strdup
#define mn_strndup oa_strndup
#include "server/openai.c"
#include "server/api_base.c"
#undef mn_malloc
#undef mn_calloc
#undef mn_realloc
#undef mn_strdup
#undef mn_strndup

/* ---------------------------------------------------- failure injection */

/* -1: never fail; k >= 0: the (k+1)-th allocation from now fails, and so
 * does every later one until reset. Counts ours and jansson's together. */
static long oa_fail_after = -1;

static bool oa_should_fail(void) {
    if (oa_fail_after == 0) return true;
    if (oa_fail_after > 0) oa_fail_after--;
    return false;
}

static void *oa_malloc(size_t n) { return oa_should_fail() ? NULL : mn_malloc(n); }
static void *oa_calloc(size_t n, size_t size) { return oa_should_fail() ? NULL : mn_calloc(n, size); }
static void *oa_realloc(void *p, size_t n) { return oa_should_fail() ? NULL : mn_realloc(p, n); }
static char *oa_strdup(const char *s) { return oa_should_fail() ? NULL : mn_strdup(s); }
static char *oa_strndup(const char *s, size_t n) { return oa_should_fail() ? NULL : mn_strndup(s, n); }
static void *oa_json_malloc(size_t n) { return oa_should_fail() ? NULL : malloc(n); }

/* ---------------------------------------------------------------- helpers */

static int parse(ApiRoute route, const char *body, ApiRequest *r, MnErr *err) {
    return api_parse_request(route, body, strlen(body), r, err, NULL);
}

static void parse_ok(ApiRoute route, const char *body, ApiRequest *r) {
    MnErr err = {0};
    int rc = parse(route, body, r, &err);
    if (rc != MN_OK) fail_msg("parse of %s failed: %s: %s", body, mn_strerror(rc), err.msg);
    assert_int_equal(r->route, route);
}

static bool is_zero(const ApiRequest *r) {
    static const ApiRequest ZERO;
    return memcmp(r, &ZERO, sizeof ZERO) == 0;
}

/* Parse a builder's output (which is freed) back into a jansson tree. */
static json_t *reparse(char *text) {
    assert_non_null(text);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    if (j == NULL) fail_msg("builder output is not JSON (%s): %s", jerr.text, text);
    mn_free(text);
    return j;
}

static const char *str_at(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v)) fail_msg("member %s is not a string", key);
    return json_string_value(v);
}

static long long int_at(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) fail_msg("member %s is not an integer", key);
    return json_integer_value(v);
}

static json_t *only_choice(const json_t *o) {
    json_t *choices = json_object_get(o, "choices");
    assert_true(json_is_array(choices));
    assert_int_equal(json_array_size(choices), 1);
    json_t *c = json_array_get(choices, 0);
    assert_int_equal(int_at(c, "index"), 0);
    return c;
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

/* Message i of a parsed chat: its role, and its content when a string. */
static const char *msg_role(const ApiRequest *r, size_t i) {
    return json_string_value(json_object_get(json_array_get(r->messages, i), "role"));
}
static const char *msg_text(const ApiRequest *r, size_t i) {
    return json_string_value(json_object_get(json_array_get(r->messages, i), "content"));
}

/* ------------------------------------------------------------ valid chat */

static void test_chat_defaults(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(API_ROUTE_CHAT, "{" MSGS "}", &r);
    assert_string_equal(r.model, "");
    assert_null(r.session_id);
    assert_int_equal(json_array_size(r.messages), 1);
    assert_null(r.msgs); /* the Responses API's input items */
    assert_string_equal(msg_role(&r, 0), "user");
    assert_string_equal(msg_text(&r, 0), "hi");
    assert_int_equal(json_object_size(json_array_get(r.messages, 0)), 2);
    assert_null(r.tools);
    assert_null(r.template_vars);
    assert_true(r.add_generation_prompt);
    assert_float_equal(r.sampler.temperature, 1.0f, 0);
    assert_float_equal(r.sampler.top_p, 1.0f, 0);
    assert_int_equal(r.sampler.top_k, 0);
    assert_float_equal(r.sampler.min_p, 0.0f, 0);
    assert_float_equal(r.sampler.presence_penalty, 0.0f, 0);
    assert_float_equal(r.sampler.frequency_penalty, 0.0f, 0);
    assert_float_equal(r.sampler.repeat_penalty, 1.0f, 0);
    assert_true(r.sampler.repeat_last_n > 0);
    assert_int_equal(r.fields_set, 0);
    assert_int_equal(r.max_tokens, -1);
    assert_int_equal(r.n_stop, 0);
    assert_false(r.is_stream);
    assert_false(r.include_usage);
    assert_false(r.ignore_eos);
    assert_null(r.text);
    assert_null(r.tokens);
    api_request_deinit(&r);
    assert_true(is_zero(&r));
    api_request_deinit(&r); /* twice is fine */
    api_request_deinit(NULL);
}

static void test_chat_all_fields(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(API_ROUTE_CHAT,
             "{\"model\":\"tiny\",\"session_id\":\"s-1\",\"user\":\"bob\",\"metadata\":{\"x\":\"1\"},"
             "\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
             "{\"role\":\"user\",\"content\":\"hello\"},"
             "{\"role\":\"assistant\",\"content\":\"hey\"},{\"role\":\"user\",\"content\":\"again\"}],"
             "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":64,"
             "\"temperature\":0.7,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":-1,"
             "\"stop\":[\"\\n\\n\",\"END\"],\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
             "\"repeat_penalty\":1.1,\"ignore_eos\":true,\"n\":1}",
             &r);
    assert_string_equal(r.model, "tiny");
    assert_string_equal(r.session_id, "s-1");
    assert_int_equal(json_array_size(r.messages), 4);
    const char *roles[] = {"system", "user", "assistant", "user"};
    const char *texts[] = {"be brief", "hello", "hey", "again"};
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(msg_role(&r, i), roles[i]);
        assert_string_equal(msg_text(&r, i), texts[i]);
    }
    assert_true(r.is_stream);
    assert_true(r.include_usage);
    assert_true(r.ignore_eos);
    assert_int_equal(r.max_tokens, 64);
    assert_float_equal(r.sampler.temperature, 0.7f, 0);
    assert_float_equal(r.sampler.top_p, 0.9f, 0);
    assert_int_equal(r.sampler.top_k, 40);
    assert_float_equal(r.sampler.min_p, 0.05f, 0);
    assert_true(r.sampler.seed == UINT64_MAX); /* -1 modulo 2^64 */
    assert_float_equal(r.sampler.presence_penalty, 0.5f, 0);
    assert_float_equal(r.sampler.frequency_penalty, -0.5f, 0);
    assert_float_equal(r.sampler.repeat_penalty, 1.1f, 0);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "\n\n");
    assert_string_equal(r.stop[1], "END");
    uint32_t all = API_SET_TEMPERATURE | API_SET_TOP_P | API_SET_TOP_K | API_SET_MIN_P | API_SET_SEED |
                   API_SET_PRESENCE_PENALTY | API_SET_FREQUENCY_PENALTY | API_SET_REPEAT_PENALTY |
                   API_SET_MAX_TOKENS | API_SET_STOP;
    assert_int_equal(r.fields_set, all);
    api_request_deinit(&r);
}

static void test_chat_content_shapes(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(API_ROUTE_CHAT,
             "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"rules\"}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
             "{\"type\":\"text\",\"text\":\"b\"},{\"type\":\"text\",\"text\":\"\"}]},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
             "{\"role\":\"assistant\"},"
             "{\"role\":\"user\",\"content\":[]},"
             "{\"role\":\"user\",\"content\":\"caf\\u00e9 \\ud83d\\ude00\"}]}",
             &r);
    assert_int_equal(json_array_size(r.messages), 6);
    /* text parts stay as sent (the chat format reads them), the tool_calls
     * member ([]: none) is not kept */
    assert_string_equal(msg_role(&r, 0), "system");
    json_t *parts = json_object_get(json_array_get(r.messages, 0), "content");
    assert_int_equal(json_array_size(parts), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(parts, 0), "text")), "rules");
    parts = json_object_get(json_array_get(r.messages, 1), "content");
    assert_int_equal(json_array_size(parts), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(parts, 1), "text")), "b");
    assert_string_equal(msg_role(&r, 2), "assistant");
    assert_string_equal(msg_text(&r, 2), "");
    assert_int_equal(json_object_size(json_array_get(r.messages, 2)), 2);
    assert_string_equal(msg_text(&r, 3), "");
    assert_int_equal(json_array_size(json_object_get(json_array_get(r.messages, 4), "content")), 0);
    assert_string_equal(msg_text(&r, 5), "caf\xC3\xA9 \xF0\x9F\x98\x80");
    api_request_deinit(&r);
}

/* tools, chat_template_kwargs and add_generation_prompt are kept for the
 * chat template, in a chat and in an /apply-template body alike. */
static void test_chat_template_fields(void **state) {
    (void)state;
    static const char body[] = "{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                               "\"chat_template_kwargs\":{\"enable_thinking\":false,\"x\":[1]},"
                               "\"add_generation_prompt\":false,\"tool_choice\":\"auto\"}";
    ApiRoute routes[] = {API_ROUTE_CHAT, API_ROUTE_APPLY_TEMPLATE};
    for (size_t k = 0; k < 2; k++) {
        ApiRequest r;
        parse_ok(routes[k], body, &r);
        assert_int_equal(r.route, routes[k]);
        assert_int_equal(json_array_size(r.messages), 1);
        assert_string_equal(msg_text(&r, 0), "hi");
        assert_int_equal(json_array_size(r.tools), 1);
        assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(r.tools, 0), "function"),
                                                              "name")), "f");
        assert_true(json_is_false(json_object_get(r.template_vars, "enable_thinking")));
        assert_int_equal(json_array_size(json_object_get(r.template_vars, "x")), 1);
        assert_false(r.add_generation_prompt);
        api_request_deinit(&r);
        assert_true(is_zero(&r));
    }
    ApiRequest r;
    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"tools\":[],\"add_generation_prompt\":true}", &r);
    assert_int_equal(json_array_size(r.tools), 0);
    assert_true(r.add_generation_prompt);
    api_request_deinit(&r);
}

static void test_chat_stop_and_limits(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"stop\":\"###\"}", &r);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "###");
    assert_true(r.fields_set & API_SET_STOP);
    api_request_deinit(&r);

    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"stop\":[]}", &r);
    assert_int_equal(r.n_stop, 0);
    api_request_deinit(&r);

    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"stop\":[\"a\",\"b\",\"c\",\"d\"]}", &r);
    assert_int_equal(r.n_stop, 4);
    assert_string_equal(r.stop[3], "d");
    api_request_deinit(&r);

    /* max_completion_tokens wins; an integral real is an integer */
    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"max_tokens\":5,\"max_completion_tokens\":7.0}", &r);
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.fields_set & API_SET_MAX_TOKENS);
    api_request_deinit(&r);
    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"max_completion_tokens\":2147483647}", &r);
    assert_int_equal(r.max_tokens, INT32_MAX);
    api_request_deinit(&r);

    /* range ends that are inside */
    parse_ok(API_ROUTE_CHAT,
             "{" MSGS ",\"temperature\":0,\"top_p\":1,\"min_p\":1,\"presence_penalty\":-2,"
             "\"frequency_penalty\":2,\"top_k\":0,\"seed\":9007199254740993}",
             &r);
    assert_float_equal(r.sampler.temperature, 0.0f, 0);
    assert_float_equal(r.sampler.top_p, 1.0f, 0);
    assert_float_equal(r.sampler.min_p, 1.0f, 0);
    assert_int_equal(r.sampler.top_k, 0);
    assert_true(r.fields_set & API_SET_TOP_K);
    assert_true(r.sampler.seed == 9007199254740993ull);
    api_request_deinit(&r);
    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"temperature\":2}", &r);
    assert_float_equal(r.sampler.temperature, 2.0f, 0);
    api_request_deinit(&r);
    /* the ends as floats: 1e30 rounds up to 1.0000000150e30, the float of
     * the bound itself; the smallest float above 0 */
    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"repeat_penalty\":1e30,\"top_p\":1.5e-45}", &r);
    assert_float_equal(r.sampler.repeat_penalty, 1e30f, 0);
    assert_true(r.sampler.top_p > 0.0f);
    api_request_deinit(&r);
}

static void test_chat_nulls_are_absent(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(API_ROUTE_CHAT,
             "{" MSGS ",\"model\":null,\"session_id\":null,\"stream\":null,\"stream_options\":null,"
             "\"max_tokens\":null,\"max_completion_tokens\":null,\"temperature\":null,\"top_p\":null,"
             "\"top_k\":null,\"min_p\":null,\"seed\":null,\"stop\":null,\"presence_penalty\":null,"
             "\"frequency_penalty\":null,\"repeat_penalty\":null,\"ignore_eos\":null,\"n\":null,\"user\":null}",
             &r);
    assert_string_equal(r.model, "");
    assert_null(r.session_id);
    assert_int_equal(r.fields_set, 0);
    assert_int_equal(r.max_tokens, -1);
    assert_float_equal(r.sampler.temperature, 1.0f, 0);
    api_request_deinit(&r);

    parse_ok(API_ROUTE_CHAT, "{" MSGS ",\"stream_options\":{\"include_usage\":null}}", &r);
    assert_false(r.include_usage);
    api_request_deinit(&r);
}

/* ----------------------------------------------------- valid other routes */

static void test_completion_shapes(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(API_ROUTE_COMPLETION, "{\"model\":\"m\",\"prompt\":\"Once upon\",\"max_tokens\":3,\"echo\":false}",
             &r);
    assert_string_equal(r.text, "Once upon");
    assert_int_equal(r.text_len, 9);
    assert_null(r.tokens);
    assert_int_equal(r.max_tokens, 3);
    assert_string_equal(r.model, "m");
    assert_null(r.messages);
    api_request_deinit(&r);

    parse_ok(API_ROUTE_COMPLETION, "{\"prompt\":[1, 15043, 0, 2147483647],\"stream\":true}", &r);
    assert_null(r.text);
    assert_int_equal(r.n_tokens, 4);
    assert_int_equal(r.tokens[0], 1);
    assert_int_equal(r.tokens[1], 15043);
    assert_int_equal(r.tokens[2], 0);
    assert_int_equal(r.tokens[3], INT32_MAX);
    assert_true(r.is_stream);
    api_request_deinit(&r);

    parse_ok(API_ROUTE_COMPLETION, "{\"prompt\":[\"only one\"]}", &r);
    assert_string_equal(r.text, "only one");
    api_request_deinit(&r);

    parse_ok(API_ROUTE_COMPLETION, "{\"prompt\":\"\",\"stop\":\"x\",\"seed\":42,\"echo\":null}", &r);
    assert_string_equal(r.text, "");
    assert_int_equal(r.text_len, 0);
    assert_true(r.fields_set & API_SET_SEED);
    assert_true(r.sampler.seed == 42);
    api_request_deinit(&r);
}

static void test_tokenize_detokenize(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(API_ROUTE_TOKENIZE, "{\"content\":\"Hello world\"}", &r);
    assert_string_equal(r.text, "Hello world");
    assert_int_equal(r.text_len, 11);
    assert_int_equal(r.add_special, API_TOKENIZE_ADD_SPECIAL_DEFAULT);
    assert_int_equal(r.parse_special, API_TOKENIZE_PARSE_SPECIAL_DEFAULT);
    api_request_deinit(&r);

    parse_ok(API_ROUTE_TOKENIZE, "{\"content\":\"x\",\"add_special\":true,\"parse_special\":false,\"with_pieces\":false}",
             &r);
    assert_true(r.add_special);
    assert_false(r.parse_special);
    api_request_deinit(&r);
    parse_ok(API_ROUTE_TOKENIZE, "{\"content\":\"x\",\"add_special\":false,\"parse_special\":true}", &r);
    assert_false(r.add_special);
    assert_true(r.parse_special);
    api_request_deinit(&r);

    parse_ok(API_ROUTE_DETOKENIZE, "{\"tokens\":[1,2,3]}", &r);
    assert_int_equal(r.n_tokens, 3);
    assert_int_equal(r.tokens[2], 3);
    api_request_deinit(&r);
    parse_ok(API_ROUTE_DETOKENIZE, "{\"tokens\":[]}", &r);
    assert_int_equal(r.n_tokens, 0);
    api_request_deinit(&r);

    /* llama.cpp's routes ignore fields they do not know, as llama.cpp does
     * (the bench sizes text with one body for several servers' /tokenize) */
    parse_ok(API_ROUTE_TOKENIZE, "{\"content\":\"a\",\"prompt\":\"a\",\"add_special_tokens\":false}", &r);
    api_request_deinit(&r);
    parse_ok(API_ROUTE_DETOKENIZE, "{\"tokens\":[7],\"model\":\"m\"}", &r);
    assert_int_equal(r.tokens[0], 7);
    api_request_deinit(&r);
    /* the body need not be NUL-terminated: only len bytes are read */
    MnErr err = {0};
    const char *b = "{" MSGS "}";
    assert_int_equal(api_parse_request(API_ROUTE_CHAT, b, strlen(b) - 1, &r, &err, NULL), MN_EINVAL);
}

/* ---------------------------------------------------------- invalid input */

typedef struct BadCase {
    ApiRoute route;
    const char *body;
    const char *field; /* the message must start with this */
} BadCase;

#define CHAT API_ROUTE_CHAT
#define CMPL API_ROUTE_COMPLETION
#define TOK API_ROUTE_TOKENIZE
#define DETOK API_ROUTE_DETOKENIZE
#define WITH(field_json) "{" MSGS "," field_json "}"

static const BadCase BAD_CASES[] = {
    /* the body itself */
    {CHAT, "", "invalid JSON"},
    {CHAT, "not json", "invalid JSON"},
    {CHAT, "{\"messages\":[", "invalid JSON"},
    {CHAT, "{" MSGS "} trailing", "invalid JSON"},
    {CHAT, "{\"a\":\"\\u0000\"}", "a string holds \\u0000 (NUL), which is not supported (line 1"},
    {CHAT, "[1,2]", "request body"},
    {CHAT, "\"text\"", "request body"},
    {TOK, "null", "request body"},
    /* messages */
    {CHAT, "{}", "messages"},
    {CHAT, "{\"messages\":null}", "messages"},
    {CHAT, "{\"messages\":[]}", "messages"},
    {CHAT, "{\"messages\":\"hi\"}", "messages"},
    {CHAT, "{\"messages\":{}}", "messages"},
    {CHAT, "{\"messages\":[1]}", "messages[0]"},
    {CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role"},
    {CHAT, "{\"messages\":[{\"role\":5,\"content\":\"x\"}]}", "messages[0].role"},
    {CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].role"},
    {CHAT, "{\"messages\":[{\"role\":\"User\",\"content\":\"x\"}]}", "messages[0].role"},
    {CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content"},
    {CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":null}]}", "messages[0].content"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":3}]}",
     "messages[1].content"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":{\"text\":\"a\"}}]}", "messages[0].content"},
    {CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":true}]}", "messages[0].content"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[\"a\"]}]}", "messages[0].content[0]"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}", "messages[0].content[0].type"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":1,\"text\":\"a\"}]}]}",
     "messages[0].content[0].type"},
    {CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
     "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
     "messages[0].content[1].type"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "messages[0].content[0].text"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":null}]}]}",
     "messages[0].content[0].text"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":[]}]}]}",
     "messages[0].content[0].text"},
    /* strings and flags */
    {CHAT, WITH("\"model\":1"), "model"},
    {CHAT, WITH("\"model\":[\"a\"]"), "model"},
    {CHAT, WITH("\"session_id\":12"), "session_id"},
    {CHAT, WITH("\"stream\":\"yes\""), "stream"},
    {CHAT, WITH("\"stream\":1"), "stream"},
    {CHAT, WITH("\"stream_options\":1"), "stream_options"},
    {CHAT, WITH("\"stream_options\":[]"), "stream_options"},
    {CHAT, WITH("\"stream_options\":{\"include_usage\":1}"), "stream_options.include_usage"},
    {CHAT, WITH("\"ignore_eos\":\"true\""), "ignore_eos"},
    /* integers */
    {CHAT, WITH("\"max_tokens\":0"), "max_tokens"},
    {CHAT, WITH("\"max_tokens\":-5"), "max_tokens"},
    {CHAT, WITH("\"max_tokens\":\"10\""), "max_tokens"},
    {CHAT, WITH("\"max_tokens\":1.5"), "max_tokens"},
    {CHAT, WITH("\"max_tokens\":true"), "max_tokens"},
    {CHAT, WITH("\"max_completion_tokens\":0"), "max_completion_tokens"},
    {CHAT, WITH("\"max_completion_tokens\":\"x\""), "max_completion_tokens"},
    {CHAT, WITH("\"top_k\":-1"), "top_k"},
    {CHAT, WITH("\"top_k\":2.5"), "top_k"},
    {CHAT, WITH("\"top_k\":\"40\""), "top_k"},
    {CHAT, WITH("\"top_k\":1e10"), "top_k"},
    {CHAT, WITH("\"seed\":1.5"), "seed"},
    {CHAT, WITH("\"seed\":\"42\""), "seed"},
    {CHAT, WITH("\"seed\":1e300"), "seed"},
    {CHAT, WITH("\"n\":2"), "n: only n=1 is supported"},
    {CHAT, WITH("\"n\":0"), "n: only n=1 is supported"},
    {CHAT, WITH("\"n\":\"1\""), "n"},
    /* reals */
    {CHAT, WITH("\"temperature\":-0.1"), "temperature"},
    {CHAT, WITH("\"temperature\":2.01"), "temperature"},
    {CHAT, WITH("\"temperature\":\"0.5\""), "temperature"},
    {CHAT, WITH("\"temperature\":[]"), "temperature"},
    {CHAT, WITH("\"top_p\":0"), "top_p"},
    {CHAT, WITH("\"top_p\":-0.5"), "top_p"},
    {CHAT, WITH("\"top_p\":1.0001"), "top_p"},
    {CHAT, WITH("\"top_p\":false"), "top_p"},
    {CHAT, WITH("\"top_p\":1e-300"), "top_p"}, /* in (0, 1], but 0 as a float */
    {CHAT, WITH("\"top_p\":1e-46"), "top_p"},
    {CHAT, WITH("\"min_p\":-0.01"), "min_p"},
    {CHAT, WITH("\"min_p\":1.5"), "min_p"},
    {CHAT, WITH("\"min_p\":true"), "min_p"},
    {CHAT, WITH("\"presence_penalty\":-2.5"), "presence_penalty"},
    {CHAT, WITH("\"presence_penalty\":2.5"), "presence_penalty"},
    {CHAT, WITH("\"presence_penalty\":\"1\""), "presence_penalty"},
    {CHAT, WITH("\"frequency_penalty\":-3"), "frequency_penalty"},
    {CHAT, WITH("\"frequency_penalty\":3"), "frequency_penalty"},
    {CHAT, WITH("\"frequency_penalty\":{}"), "frequency_penalty"},
    {CHAT, WITH("\"repeat_penalty\":0"), "repeat_penalty"},
    {CHAT, WITH("\"repeat_penalty\":-1"), "repeat_penalty"},
    {CHAT, WITH("\"repeat_penalty\":\"1.1\""), "repeat_penalty"},
    {CHAT, WITH("\"repeat_penalty\":1e31"), "repeat_penalty"},
    {CHAT, WITH("\"repeat_penalty\":1e-46"), "repeat_penalty"},
    /* stop */
    {CHAT, WITH("\"stop\":\"\""), "stop"},
    {CHAT, WITH("\"stop\":5"), "stop"},
    {CHAT, WITH("\"stop\":{\"a\":1}"), "stop"},
    {CHAT, WITH("\"stop\":[1]"), "stop[0]"},
    {CHAT, WITH("\"stop\":[\"a\",\"\"]"), "stop[1]"},
    {CHAT, WITH("\"stop\":[\"a\",null]"), "stop[1]"},
    {CHAT, WITH("\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]"), "stop"},
    /* completions */
    {CMPL, "{}", "prompt"},
    {CMPL, "{\"prompt\":null}", "prompt"},
    {CMPL, "{\"prompt\":5}", "prompt"},
    {CMPL, "{\"prompt\":{}}", "prompt"},
    {CMPL, "{\"prompt\":[]}", "prompt"},
    {CMPL, "{\"prompt\":[1,-1]}", "prompt[1]"},
    {CMPL, "{\"prompt\":[1,\"a\"]}", "prompt[1]"},
    {CMPL, "{\"prompt\":[1.5]}", "prompt[0]"},
    {CMPL, "{\"prompt\":[2147483648]}", "prompt[0]"},
    {CMPL, "{\"prompt\":[null]}", "prompt[0]"},
    {CMPL, "{\"prompt\":[\"a\",\"b\"]}", "prompt"},
    {CMPL, "{\"prompt\":\"x\",\"echo\":true}", "echo"},
    {CMPL, "{\"prompt\":\"x\",\"echo\":\"no\"}", "echo"},
    {CMPL, "{\"prompt\":\"x\",\"temperature\":3}", "temperature"},
    {CMPL, "{\"prompt\":\"x\",\"stop\":[\"\"]}", "stop[0]"},
    {CMPL, "{\"prompt\":\"x\",\"n\":3}", "n: only n=1 is supported"},
    {CMPL, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens"},
    /* tokenize */
    {TOK, "{}", "content"},
    {TOK, "{\"content\":1}", "content"},
    {TOK, "{\"content\":null}", "content"},
    {TOK, "{\"content\":\"x\",\"add_special\":\"yes\"}", "add_special"},
    {TOK, "{\"content\":\"x\",\"parse_special\":0}", "parse_special"},
    {TOK, "{\"content\":\"x\",\"with_pieces\":true}", "with_pieces"},
    /* detokenize */
    {DETOK, "{}", "tokens"},
    {DETOK, "{\"tokens\":\"1 2\"}", "tokens"},
    {DETOK, "{\"tokens\":{}}", "tokens"},
    {DETOK, "{\"tokens\":[-1]}", "tokens[0]"},
    {DETOK, "{\"tokens\":[1,2.5]}", "tokens[1]"},
    {DETOK, "{\"tokens\":[1,\"a\"]}", "tokens[1]"},
    {DETOK, "{\"tokens\":[3000000000]}", "tokens[0]"},
    {DETOK, "{\"tokens\":[[1]]}", "tokens[0]"},
};

static void test_invalid_requests(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof BAD_CASES / sizeof BAD_CASES[0]; i++) {
        const BadCase *c = &BAD_CASES[i];
        ApiRequest r;
        memset(&r, 0x5A, sizeof r); /* parse must overwrite whatever was there */
        MnErr err = {0};
        int rc = parse(c->route, c->body, &r, &err);
        if (rc != MN_EINVAL) fail_msg("case %zu (%s): rc %d, want MN_EINVAL", i, c->body, rc);
        if (strncmp(err.msg, c->field, strlen(c->field)) != 0)
            fail_msg("case %zu (%s): message \"%s\" does not start with \"%s\"", i, c->body, err.msg, c->field);
        if (!is_zero(&r)) fail_msg("case %zu (%s): request not zeroed after failure", i, c->body);
        api_request_deinit(&r);
    }
    /* a NULL body of length 0 and a NULL err are fine */
    ApiRequest r;
    assert_int_equal(api_parse_request(API_ROUTE_CHAT, NULL, 0, &r, NULL, NULL), MN_EINVAL);
    assert_true(is_zero(&r));
    assert_int_equal(parse(CHAT, WITH("\"top_p\":0"), &r, NULL), MN_EINVAL);
    /* an unknown route */
    MnErr err = {0};
    assert_int_equal(api_parse_request((ApiRoute)99, "{}", 2, &r, &err, NULL), MN_EINVAL);
    assert_true(is_zero(&r));
    /* GET /v1/models has no body to parse */
    assert_int_equal(api_parse_request(API_ROUTE_MODELS, "{}", 2, &r, &err, NULL), MN_EINVAL);
    assert_true(is_zero(&r));
}

/* ------------------------------------------- fields refused or accepted */

typedef struct Refused {
    ApiRoute route;
    const char *body;
    const char *param;   /* the field it names (OpenAI's "param") */
    const char *message; /* a part of the message */
} Refused;

static const Refused REFUSED[] = {
    /* not implemented yet: refused unless at the value that asks for nothing */
    {CHAT, WITH("\"tool_choice\":\"required\""), "tool_choice", "not supported"},
    {CHAT, WITH("\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"), "tool_choice", "not supported"},
    {CHAT, WITH("\"parallel_tool_calls\":false"), "parallel_tool_calls", "not supported"},
    {CHAT, WITH("\"response_format\":{\"type\":\"json_object\"}"), "response_format", "not supported"},
    {CHAT, WITH("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}"), "response_format", "not supported"},
    {CHAT, WITH("\"response_format\":{\"type\":\"text\",\"x\":1}"), "response_format", "not supported"},
    {CHAT, WITH("\"functions\":[]"), "functions", "not supported"},
    {CHAT, WITH("\"function_call\":\"auto\""), "function_call", "not supported"},
    {CHAT, WITH("\"audio\":{\"voice\":\"x\"}"), "audio", "not supported"},
    {CHAT, WITH("\"modalities\":[\"text\",\"audio\"]"), "modalities", "not supported"},
    {CHAT, WITH("\"prediction\":{\"type\":\"content\",\"content\":\"x\"}"), "prediction", "not supported"},
    {CHAT, WITH("\"reasoning_effort\":\"low\""), "reasoning_effort", "not supported"},
    {CHAT, WITH("\"verbosity\":\"low\""), "verbosity", "not supported"},
    {CHAT, WITH("\"web_search_options\":{}"), "web_search_options", "not supported"},
    {CHAT, WITH("\"store\":true"), "store", "not supported"},
    {CHAT, WITH("\"stream\":true,\"stream_options\":{\"include_obfuscation\":true}"),
     "stream_options.include_obfuscation", "not supported"},
    {CMPL, "{\"prompt\":\"x\",\"suffix\":\"end\"}", "suffix", "not supported"},
    {CMPL, "{\"prompt\":\"x\",\"best_of\":2}", "best_of", "not supported"},
    {CMPL, "{\"prompt\":\"x\",\"echo\":true}", "echo", "not supported"},
    /* fields of messages */
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"bob\"}]}", "messages[0].name", "not supported"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null,"
           "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
     "messages[1].tool_calls", "not supported"},
    {CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"refusal\":\"no\"}]}", "messages[0].refusal",
     "not supported"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\",\"cache\":1}]}]}",
     "messages[0].content[0].cache", "unknown field"},
    /* fields nobody defined */
    {CHAT, WITH("\"unknown\":{\"x\":[1]}"), "unknown", "unknown field"},
    {CHAT, WITH("\"cache_prompt\":true"), "cache_prompt", "unknown field"},
    {CMPL, "{\"prompt\":\"x\",\"top_logprobs\":2}", "top_logprobs", "unknown field"},
    {CMPL, "{\"prompt\":\"x\",\"messages\":[]}", "messages", "unknown field"},
    {CHAT, WITH("\"prompt\":\"x\""), "prompt", "unknown field"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"nmae\":\"typo\"}]}", "messages[0].nmae",
     "unknown field"},
    /* logprobs */
    {CHAT, WITH("\"top_logprobs\":3"), "top_logprobs", "needs"},
    {CHAT, WITH("\"logprobs\":false,\"top_logprobs\":3"), "top_logprobs", "needs"},
    {CHAT, WITH("\"logprobs\":true,\"top_logprobs\":21"), "top_logprobs", "between 0 and 20"},
    {CHAT, WITH("\"logprobs\":true,\"top_logprobs\":-1"), "top_logprobs", "between 0 and 20"},
    {CHAT, WITH("\"logprobs\":1"), "logprobs", "boolean"},
    {CMPL, "{\"prompt\":\"x\",\"logprobs\":21}", "logprobs", "between 0 and 20"},
    {CMPL, "{\"prompt\":\"x\",\"logprobs\":-1}", "logprobs", "between 0 and 20"},
    {CMPL, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs", "between 0 and 20"},
    /* logit_bias */
    {CHAT, WITH("\"logit_bias\":[1]"), "logit_bias", "object"},
    {CHAT, WITH("\"logit_bias\":{\"abc\":1}"), "logit_bias", "not a token id"},
    {CHAT, WITH("\"logit_bias\":{\"-1\":1}"), "logit_bias", "not a token id"},
    {CHAT, WITH("\"logit_bias\":{\"1.5\":1}"), "logit_bias", "not a token id"},
    {CHAT, WITH("\"logit_bias\":{\"\":1}"), "logit_bias", "not a token id"},
    {CHAT, WITH("\"logit_bias\":{\"99999999999\":1}"), "logit_bias", "not a token id"},
    {CHAT, WITH("\"logit_bias\":{\"2147483648\":1}"), "logit_bias", "not a token id"},
    {CHAT, WITH("\"logit_bias\":{\"5\":101}"), "logit_bias", "between -100 and 100"},
    {CHAT, WITH("\"logit_bias\":{\"5\":-100.5}"), "logit_bias", "between -100 and 100"},
    {CHAT, WITH("\"logit_bias\":{\"5\":\"1\"}"), "logit_bias", "between -100 and 100"},
    {CMPL, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":null}}", "logit_bias", "between -100 and 100"},
    /* the range of max_tokens is said */
    {CHAT, WITH("\"max_tokens\":0"), "max_tokens", ">= 1"},
    /* the chat template's fields */
    {CHAT, WITH("\"tools\":{}"), "tools", "must be an array"},
    {CHAT, WITH("\"tools\":[1]"), "tools[0]", "must be an object"},
    {CHAT, WITH("\"chat_template_kwargs\":[]"), "chat_template_kwargs", "must be an object"},
    {CHAT, WITH("\"add_generation_prompt\":1"), "add_generation_prompt", "boolean"},
    {CMPL, "{\"prompt\":\"x\",\"chat_template_kwargs\":{}}", "chat_template_kwargs", "unknown field"},
    /* /apply-template checks a chat body as a chat request does */
    {API_ROUTE_APPLY_TEMPLATE, "{\"messages\":[]}", "messages", "non-empty array"},
    {API_ROUTE_APPLY_TEMPLATE, WITH("\"temperature\":3"), "temperature", "between 0 and 2"},
    {API_ROUTE_APPLY_TEMPLATE, WITH("\"prompt\":\"x\""), "prompt", "unknown field"},
};

/* Every field mnemo does not act on is refused with its name as param. */
static void test_refused_fields(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof REFUSED / sizeof REFUSED[0]; i++) {
        const Refused *c = &REFUSED[i];
        ApiRequest r;
        MnErr err = {0};
        char param[API_PARAM_MAX];
        memset(param, 'x', sizeof param);
        int rc = api_parse_request(c->route, c->body, strlen(c->body), &r, &err, param);
        if (rc != MN_EINVAL) fail_msg("case %zu (%s): rc %d, want MN_EINVAL", i, c->body, rc);
        if (strcmp(param, c->param) != 0) fail_msg("case %zu (%s): param \"%s\", want \"%s\"", i, c->body, param, c->param);
        if (strstr(err.msg, c->message) == NULL)
            fail_msg("case %zu (%s): message \"%s\" lacks \"%s\"", i, c->body, err.msg, c->message);
        if (!is_zero(&r)) fail_msg("case %zu (%s): request not zeroed after failure", i, c->body);
    }
    /* a message about the body as a whole names no field */
    ApiRequest r;
    MnErr err = {0};
    char param[API_PARAM_MAX] = "x";
    assert_int_equal(api_parse_request(CHAT, "[1]", 3, &r, &err, param), MN_EINVAL);
    assert_string_equal(param, "");
    assert_int_equal(api_parse_request(CHAT, "{" MSGS "}", strlen("{" MSGS "}"), &r, &err, param), MN_OK);
    assert_string_equal(param, "");
    api_request_deinit(&r);
}

/* The values that ask for nothing, and the fields that change nothing,
 * are accepted (docs/API.md lists them). */
static void test_accepted_defaults(void **state) {
    (void)state;
    static const struct {
        ApiRoute route;
        const char *body;
    } OK[] = {
        {CHAT, WITH("\"response_format\":{\"type\":\"text\"}")},
        {CHAT, WITH("\"tool_choice\":\"none\"")},
        {CHAT, WITH("\"tool_choice\":\"auto\"")},
        {CHAT, WITH("\"function_call\":\"none\"")},
        {CHAT, WITH("\"store\":false,\"metadata\":{\"k\":\"v\"}")},
        {CHAT, WITH("\"modalities\":[\"text\"]")},
        {CHAT, WITH("\"user\":\"u\",\"service_tier\":\"auto\",\"prompt_cache_key\":\"k\",\"safety_identifier\":\"s\"")},
        {CHAT, WITH("\"tools\":null,\"tool_choice\":null,\"response_format\":null,\"audio\":null,\"logit_bias\":null,"
                    "\"logprobs\":null,\"top_logprobs\":null,\"parallel_tool_calls\":null")},
        {CHAT, WITH("\"stream\":true,\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false}")},
        /* an answer the SDK returned, sent back as it came */
        {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\","
               "\"refusal\":null,\"annotations\":[],\"audio\":null,\"function_call\":null,\"tool_calls\":null},"
               "{\"role\":\"user\",\"content\":\"z\"}]}"},
        {CMPL, "{\"prompt\":\"x\",\"best_of\":1,\"echo\":false,\"suffix\":null,\"user\":\"u\"}"},
    };
    for (size_t i = 0; i < sizeof OK / sizeof OK[0]; i++) {
        ApiRequest r;
        parse_ok(OK[i].route, OK[i].body, &r);
        assert_false(r.is_logprobs);
        assert_int_equal(r.n_logit_bias, 0);
        api_request_deinit(&r);
    }
}

static void test_logprobs_and_bias_fields(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(CHAT, WITH("\"logprobs\":true"), &r);
    assert_true(r.is_logprobs);
    assert_int_equal(r.top_logprobs, 0);
    api_request_deinit(&r);
    parse_ok(CHAT, WITH("\"logprobs\":true,\"top_logprobs\":20"), &r);
    assert_true(r.is_logprobs);
    assert_int_equal(r.top_logprobs, 20);
    api_request_deinit(&r);
    parse_ok(CHAT, WITH("\"logprobs\":false"), &r);
    assert_false(r.is_logprobs);
    api_request_deinit(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\",\"logprobs\":0}", &r);
    assert_true(r.is_logprobs);
    assert_int_equal(r.top_logprobs, 0);
    api_request_deinit(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\",\"logprobs\":5}", &r);
    assert_true(r.is_logprobs);
    assert_int_equal(r.top_logprobs, 5);
    api_request_deinit(&r);

    parse_ok(CHAT, WITH("\"logit_bias\":{\"50256\":-100,\"7\":2.5,\"0\":100}"), &r);
    assert_int_equal(r.n_logit_bias, 3);
    assert_ptr_equal(r.sampler.logit_bias, r.logit_bias);
    assert_int_equal(r.sampler.n_logit_bias, 3);
    assert_int_equal(r.logit_bias[0].id, 50256);
    assert_float_equal(r.logit_bias[0].bias, -100.0f, 0);
    assert_int_equal(r.logit_bias[1].id, 7);
    assert_float_equal(r.logit_bias[1].bias, 2.5f, 0);
    assert_int_equal(r.logit_bias[2].id, 0);
    api_request_deinit(&r);
    parse_ok(CMPL, "{\"prompt\":\"x\",\"logit_bias\":{}}", &r);
    assert_int_equal(r.n_logit_bias, 0);
    api_request_deinit(&r);

    /* max_tokens past any context parses: the server answers with the range */
    parse_ok(CHAT, WITH("\"max_tokens\":1000000000000"), &r);
    assert_true(r.max_tokens == 1000000000000LL);
    api_request_deinit(&r);
}

/* ---------------------------------------------------------------- UTF-8 */

static void expect_sanitized(const char *in, size_t len, const char *want) {
    size_t n = 0;
    char *out = api_utf8_sanitize(in, len, &n);
    assert_non_null(out);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(out, want, n);
    assert_int_equal(out[n], '\0');
    mn_free(out);
}

#define FFFD "\xEF\xBF\xBD"

static void test_utf8_sanitize(void **state) {
    (void)state;
    expect_sanitized("", 0, "");
    char *empty = api_utf8_sanitize(NULL, 0, NULL);
    assert_string_equal(empty, "");
    mn_free(empty);
    expect_sanitized("plain ascii", 11, "plain ascii");
    expect_sanitized("caf\xC3\xA9 \xF0\x9F\x98\x80", 10, "caf\xC3\xA9 \xF0\x9F\x98\x80");
    expect_sanitized("a\x80" "b", 3, "a" FFFD "b");               /* lone continuation */
    expect_sanitized("\xC0\x80", 2, FFFD FFFD);                   /* overlong NUL */
    expect_sanitized("\xED\xA0\x80", 3, FFFD FFFD FFFD);          /* surrogate */
    expect_sanitized("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD); /* above U+10FFFF */
    expect_sanitized("\xFF\xFE", 2, FFFD FFFD);
    expect_sanitized("a\xF0\x9F\x98" "b", 5, "a" FFFD "b");       /* maximal subpart of 3 */
    expect_sanitized("end\xF0\x9F\x98", 6, "end" FFFD);           /* cut short at the end */
    expect_sanitized("end\xE2\x82", 5, "end" FFFD);
    size_t n = 0; /* NUL is valid UTF-8 */
    char *s = api_utf8_sanitize("x\0y", 3, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(s, "x\0y", 4);
    mn_free(s);
}

/* ------------------------------------------------------------- builders */

static const ApiMeta META = {"chatcmpl-abc", "tiny", 1700000000, "fp_0123"};

static ApiUsage sample_usage(void) {
    ApiUsage u = {.prompt_tokens = 30, .completion_tokens = 12, .cached_tokens = 20, .recomputed_tokens = 4,
                  .truncated_tokens = 9, .shifted_tokens = 7, .restored_by = {3, 5, 2}};
    assert_int_equal(api_usage_add_tier(&u, "pool", 16), MN_OK);
    assert_int_equal(api_usage_add_tier(&u, "disk", 4), MN_OK);
    return u;
}

static void check_usage(const json_t *u, bool has_tiers) {
    assert_true(json_is_object(u));
    assert_int_equal(int_at(u, "prompt_tokens"), 30);
    assert_int_equal(int_at(u, "completion_tokens"), 12);
    assert_int_equal(int_at(u, "total_tokens"), 42);
    json_t *d = json_object_get(u, "prompt_tokens_details");
    assert_int_equal(int_at(d, "cached_tokens"), 20);
    assert_int_equal(int_at(d, "recomputed_tokens"), 4);
    assert_int_equal(int_at(d, "truncated_tokens"), 9);
    assert_int_equal(int_at(d, "shifted_tokens"), 7);
    json_t *r = json_object_get(d, "restored_by");
    assert_int_equal(json_object_size(r), 3);
    assert_int_equal(int_at(r, "kv"), 3);
    assert_int_equal(int_at(r, "hidden"), 5);
    assert_int_equal(int_at(r, "recompute"), 2);
    json_t *t = json_object_get(d, "cached_tokens_by_tier");
    assert_true(json_is_object(t));
    if (has_tiers) {
        assert_int_equal(json_object_size(t), 2);
        assert_int_equal(int_at(t, "pool"), 16);
        assert_int_equal(int_at(t, "disk"), 4);
        assert_null(json_object_get(t, "ram"));
    } else {
        assert_int_equal(json_object_size(t), 0);
    }
}

static void check_meta(const json_t *o, const char *object) {
    assert_string_equal(str_at(o, "id"), "chatcmpl-abc");
    assert_string_equal(str_at(o, "object"), object);
    assert_int_equal(int_at(o, "created"), 1700000000);
    assert_string_equal(str_at(o, "model"), "tiny");
    assert_string_equal(str_at(o, "system_fingerprint"), "fp_0123");
}

static void test_usage_tiers(void **state) {
    (void)state;
    ApiUsage u = {0};
    for (int i = 0; i < API_USAGE_MAX_TIERS; i++) assert_int_equal(api_usage_add_tier(&u, "t", i), MN_OK);
    assert_int_equal(api_usage_add_tier(&u, "x", 1), MN_EFULL);
    assert_int_equal(u.n_tiers, API_USAGE_MAX_TIERS);
}

static void test_chat_completion_object(void **state) {
    (void)state;
    ApiUsage u = sample_usage();
    json_t *o = reparse(api_chat_completion_json(&META, "Hello there!", API_FINISH_STOP, &u, NULL));
    check_meta(o, "chat.completion");
    json_t *c = only_choice(o);
    json_t *msg = json_object_get(c, "message");
    assert_string_equal(str_at(msg, "role"), "assistant");
    assert_string_equal(str_at(msg, "content"), "Hello there!");
    assert_string_equal(str_at(c, "finish_reason"), "stop");
    assert_true(json_is_null(json_object_get(c, "logprobs")));
    check_usage(json_object_get(o, "usage"), true);
    json_decref(o);

    ApiUsage plain = {.prompt_tokens = 30, .completion_tokens = 12, .cached_tokens = 20, .recomputed_tokens = 4,
                      .truncated_tokens = 9, .shifted_tokens = 7, .restored_by = {3, 5, 2}};
    o = reparse(api_chat_completion_json(&META, "", API_FINISH_LENGTH, &plain, NULL));
    c = only_choice(o);
    assert_string_equal(str_at(json_object_get(c, "message"), "content"), "");
    assert_string_equal(str_at(c, "finish_reason"), "length");
    check_usage(json_object_get(o, "usage"), false);
    json_decref(o);

    o = reparse(api_chat_completion_json(&META, NULL, API_FINISH_NONE, NULL, NULL));
    c = only_choice(o);
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    assert_null(json_object_get(o, "usage"));
    json_decref(o);

    /* compact output, members in order */
    char *text = api_chat_completion_json(&META, "x", API_FINISH_STOP, NULL, NULL);
    assert_string_equal(text, "{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion\",\"created\":1700000000,"
                              "\"model\":\"tiny\",\"system_fingerprint\":\"fp_0123\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                              "\"content\":\"x\"},\"logprobs\":null,\"finish_reason\":\"stop\"}]}");
    mn_free(text);
}

static void test_chat_chunks(void **state) {
    (void)state;
    /* first: role and the first piece */
    json_t *o = reparse(api_chat_chunk_json(&META, true, "", API_FINISH_NONE, NULL));
    check_meta(o, "chat.completion.chunk");
    json_t *c = only_choice(o);
    json_t *delta = json_object_get(c, "delta");
    assert_string_equal(str_at(delta, "role"), "assistant");
    assert_string_equal(str_at(delta, "content"), "");
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    assert_null(json_object_get(o, "usage"));
    json_decref(o);

    /* middle: content only */
    o = reparse(api_chat_chunk_json(&META, false, "Hel\"lo\n", API_FINISH_NONE, NULL));
    delta = json_object_get(only_choice(o), "delta");
    assert_int_equal(json_object_size(delta), 1);
    assert_string_equal(str_at(delta, "content"), "Hel\"lo\n");
    json_decref(o);

    /* last: empty delta and the reason */
    o = reparse(api_chat_chunk_json(&META, false, NULL, API_FINISH_LENGTH, NULL));
    c = only_choice(o);
    assert_int_equal(json_object_size(json_object_get(c, "delta")), 0);
    assert_string_equal(str_at(c, "finish_reason"), "length");
    json_decref(o);

    /* the usage-only chunk */
    ApiUsage u = sample_usage();
    o = reparse(api_usage_chunk_json(&META, true, &u));
    check_meta(o, "chat.completion.chunk");
    assert_true(json_is_array(json_object_get(o, "choices")));
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 0);
    check_usage(json_object_get(o, "usage"), true);
    json_decref(o);
}

static void test_text_completion(void **state) {
    (void)state;
    ApiUsage u = sample_usage();
    json_t *o = reparse(api_text_completion_json(&META, " there was a cat", API_FINISH_LENGTH, &u, NULL));
    check_meta(o, "text_completion");
    json_t *c = only_choice(o);
    assert_string_equal(str_at(c, "text"), " there was a cat");
    assert_string_equal(str_at(c, "finish_reason"), "length");
    assert_true(json_is_null(json_object_get(c, "logprobs")));
    check_usage(json_object_get(o, "usage"), true);
    json_decref(o);

    o = reparse(api_text_chunk_json(&META, " there", API_FINISH_NONE, NULL));
    check_meta(o, "text_completion");
    c = only_choice(o);
    assert_string_equal(str_at(c, "text"), " there");
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    assert_null(json_object_get(o, "usage"));
    json_decref(o);

    o = reparse(api_text_chunk_json(&META, NULL, API_FINISH_STOP, NULL));
    c = only_choice(o);
    assert_string_equal(str_at(c, "text"), "");
    assert_string_equal(str_at(c, "finish_reason"), "stop");
    json_decref(o);

    o = reparse(api_usage_chunk_json(&META, false, &u));
    check_meta(o, "text_completion");
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 0);
    check_usage(json_object_get(o, "usage"), true);
    json_decref(o);
}

/* Invalid UTF-8 anywhere a caller's text goes becomes U+FFFD, and a
 * streamed piece comes out as the whole answer does. */
static void test_invalid_utf8_in_responses(void **state) {
    (void)state;
    const char *bad = "ok \xE2\x82 \xFF done";
    const char *want = "ok " FFFD " " FFFD " done";
    json_t *o = reparse(api_chat_completion_json(&META, bad, API_FINISH_STOP, NULL, NULL));
    assert_string_equal(str_at(json_object_get(only_choice(o), "message"), "content"), want);
    json_decref(o);
    o = reparse(api_chat_chunk_json(&META, false, bad, API_FINISH_NONE, NULL));
    assert_string_equal(str_at(json_object_get(only_choice(o), "delta"), "content"), want);
    json_decref(o);
    o = reparse(api_text_completion_json(&META, bad, API_FINISH_STOP, NULL, NULL));
    assert_string_equal(str_at(only_choice(o), "text"), want);
    json_decref(o);
    o = reparse(api_text_chunk_json(&META, bad, API_FINISH_NONE, NULL));
    assert_string_equal(str_at(only_choice(o), "text"), want);
    json_decref(o);
    o = reparse(api_detokenize_json(bad, strlen(bad)));
    assert_string_equal(str_at(o, "content"), want);
    json_decref(o);
    o = reparse(api_error_json(400, bad, "\xC0", NULL));
    json_t *e = json_object_get(o, "error");
    assert_string_equal(str_at(e, "message"), want);
    assert_string_equal(str_at(e, "param"), FFFD);
    json_decref(o);

    /* and in the metadata and the names of tiers and models */
    ApiMeta m = {"id\xFF", "model\xC3", 1, "fp\xFF"};
    ApiUsage u = {0};
    api_usage_add_tier(&u, "p\x80", 3);
    o = reparse(api_usage_chunk_json(&m, true, &u));
    assert_string_equal(str_at(o, "id"), "id" FFFD);
    assert_string_equal(str_at(o, "model"), "model" FFFD);
    json_t *t = json_object_get(json_object_get(json_object_get(o, "usage"), "prompt_tokens_details"),
                                "cached_tokens_by_tier");
    assert_int_equal(int_at(t, "p" FFFD), 3);
    json_decref(o);
    const char *names[] = {"bad\xFE"};
    o = reparse(api_models_json(names, 1, 5));
    assert_string_equal(str_at(json_array_get(json_object_get(o, "data"), 0), "id"), "bad" FFFD);
    json_decref(o);
}

static void test_error_objects(void **state) {
    (void)state;
    json_t *o = reparse(api_error_json(400, "messages must be a non-empty array", "messages", NULL));
    json_t *e = json_object_get(o, "error");
    assert_int_equal(json_object_size(o), 1);
    assert_string_equal(str_at(e, "message"), "messages must be a non-empty array");
    assert_string_equal(str_at(e, "type"), "invalid_request_error");
    assert_string_equal(str_at(e, "param"), "messages");
    assert_true(json_is_null(json_object_get(e, "code")));
    json_decref(o);

    /* OpenAI answers an unknown model (404) as an invalid request */
    o = reparse(api_error_json(404, "model not found", NULL, "model_not_found"));
    e = json_object_get(o, "error");
    assert_string_equal(str_at(e, "type"), "invalid_request_error");
    assert_true(json_is_null(json_object_get(e, "param")));
    assert_string_equal(str_at(e, "code"), "model_not_found");
    json_decref(o);

    o = reparse(api_error_json(500, NULL, NULL, NULL));
    e = json_object_get(o, "error");
    assert_string_equal(str_at(e, "message"), "");
    assert_string_equal(str_at(e, "type"), "server_error");
    json_decref(o);

    static const struct {
        int status;
        const char *type;
    } TYPES[] = {
        {400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"},
        {404, "invalid_request_error"}, {405, "invalid_request_error"}, {413, "invalid_request_error"},
        {422, "invalid_request_error"}, {429, "rate_limit_error"},     {500, "server_error"},
        {501, "not_supported_error"},   {502, "server_error"},         {503, "unavailable_error"},
        {200, "server_error"},          {0, "server_error"},
    };
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        assert_string_equal(api_error_type(TYPES[i].status), TYPES[i].type);

    assert_int_equal(api_http_status(MN_OK), 200);
    assert_int_equal(api_http_status(MN_EINVAL), 400);
    assert_int_equal(api_http_status(MN_EFORMAT), 400);
    assert_int_equal(api_http_status(MN_ERANGE), 400);
    assert_int_equal(api_http_status(MN_EUNSUPPORTED), 400);
    assert_int_equal(api_http_status(MN_ENOTFOUND), 404);
    assert_int_equal(api_http_status(MN_EBUSY), 503);
    assert_int_equal(api_http_status(MN_EFULL), 503);
    assert_int_equal(api_http_status(MN_ECANCELED), 503); /* the engine is shutting down */
    assert_int_equal(api_http_status(MN_ENOMEM), 500);
    assert_int_equal(api_http_status(MN_EIO), 500);

    assert_string_equal(api_finish_name(API_FINISH_STOP), "stop");
    assert_string_equal(api_finish_name(API_FINISH_LENGTH), "length");
    assert_null(api_finish_name(API_FINISH_NONE));
    assert_null(api_finish_name((ApiFinish)42));
}

static void text_is(char *text, const char *want) {
    assert_non_null(text);
    assert_string_equal(text, want);
    mn_free(text);
}

static void test_models_and_tokens(void **state) {
    (void)state;
    const char *names[] = {"stories260K", "tiny-llama"};
    json_t *o = reparse(api_models_json(names, 2, 1700000001));
    assert_string_equal(str_at(o, "object"), "list");
    json_t *data = json_object_get(o, "data");
    assert_int_equal(json_array_size(data), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *m = json_array_get(data, i);
        assert_string_equal(str_at(m, "id"), names[i]);
        assert_string_equal(str_at(m, "object"), "model");
        assert_int_equal(int_at(m, "created"), 1700000001);
        assert_string_equal(str_at(m, "owned_by"), "mnemo");
    }
    json_decref(o);
    o = reparse(api_models_json(NULL, 0, 0));
    assert_int_equal(json_array_size(json_object_get(o, "data")), 0);
    json_decref(o);
    /* one entry alone (GET /v1/models/{id}) */
    text_is(api_model_json("stories260K", 7), "{\"id\":\"stories260K\",\"object\":\"model\",\"created\":7,\"owned_by\":\"mnemo\"}");

    const int32_t toks[] = {1, 15043, 0, INT32_MAX};
    char *text = api_tokenize_json(toks, 4);
    assert_string_equal(text, "{\"tokens\":[1,15043,0,2147483647]}");
    mn_free(text);
    text = api_tokenize_json(NULL, 0);
    assert_string_equal(text, "{\"tokens\":[]}");
    mn_free(text);

    text = api_detokenize_json("a\0b \"q\"", 7);
    assert_string_equal(text, "{\"content\":\"a\\u0000b \\\"q\\\"\"}");
    mn_free(text);
    text = api_detokenize_json(NULL, 0);
    assert_string_equal(text, "{\"content\":\"\"}");
    mn_free(text);
    text = api_apply_template_json("<s>a\0b\n", 7);
    assert_string_equal(text, "{\"prompt\":\"<s>a\\u0000b\\n\"}");
    mn_free(text);
}

/* The stories260K tokenizer (SentencePiece: 403 is "▁Once", 229 the byte
 * 0xE2, 2 the control token "</s>"), or NULL (test skipped) without the data. */
static Tokenizer *stories_tok(void) {
    char path[512];
    test_data_path(path, sizeof path, "models/stories260K.gguf");
    if (!test_require_file(path)) return NULL;
    Gguf *g = NULL;
    Tokenizer *tok = NULL;
    MnErr err = {0};
    assert_int_equal(gguf_open(path, &g, &err), MN_OK);
    assert_int_equal(tok_load(g, &tok, &err), MN_OK);
    gguf_close(g);
    return tok;
}

/* Two generated tokens: " Once" (with " Once", the byte 0xE2 and "</s>" as
 * alternatives) and the byte 0xE2 at a probability below OpenAI's floor. */
static const ReqLogprob SAMPLE_LP[2] = {
    {.token = {403, -0.25f}, .top = {{403, -0.25f}, {229, -1.5f}, {2, -3.0f}}, .n_top = 3, .text_offset = 0},
    {.token = {229, -12345.0f}, .top = {{403, -0.5f}}, .n_top = 1, .text_offset = 5},
};

static void check_chat_token(const json_t *t, const char *token, double logprob, const int *bytes, size_t n_bytes) {
    assert_string_equal(str_at(t, "token"), token);
    assert_float_equal(json_real_value(json_object_get(t, "logprob")), logprob, 1e-6);
    json_t *b = json_object_get(t, "bytes");
    assert_int_equal(json_array_size(b), n_bytes);
    for (size_t i = 0; i < n_bytes; i++) assert_int_equal(json_integer_value(json_array_get(b, i)), bytes[i]);
}

/* The chat shape (token, logprob, bytes, top_logprobs), the same in a chunk;
 * a partial character as "bytes:\x.."; the -9999 floor; no tokens gives an
 * empty content list; NULL gives null. */
static void test_chat_logprobs_object(void **state) {
    (void)state;
    Tokenizer *tok = stories_tok();
    if (tok == NULL) return;
    static const int ONCE[] = {' ', 'O', 'n', 'c', 'e'}, E2[] = {0xE2}, EOS[] = {'<', '/', 's', '>'};
    ApiLogprobs lp = {tok, SAMPLE_LP, 2};
    for (int is_chunk = 0; is_chunk < 2; is_chunk++) {
        json_t *o = reparse(is_chunk ? api_chat_chunk_json(&META, false, " Once\xE2", API_FINISH_NONE, &lp)
                                     : api_chat_completion_json(&META, " Once\xE2", API_FINISH_STOP, NULL, &lp));
        json_t *l = json_object_get(only_choice(o), "logprobs");
        assert_true(json_is_null(json_object_get(l, "refusal")));
        json_t *content = json_object_get(l, "content");
        assert_int_equal(json_array_size(content), 2);
        json_t *t0 = json_array_get(content, 0), *t1 = json_array_get(content, 1);
        check_chat_token(t0, " Once", -0.25, ONCE, 5);
        json_t *top = json_object_get(t0, "top_logprobs");
        assert_int_equal(json_array_size(top), 3);
        check_chat_token(json_array_get(top, 0), " Once", -0.25, ONCE, 5);
        check_chat_token(json_array_get(top, 1), "bytes:\\xe2", -1.5, E2, 1);
        check_chat_token(json_array_get(top, 2), "</s>", -3.0, EOS, 4);
        check_chat_token(t1, "bytes:\\xe2", -9999.0, E2, 1);
        assert_int_equal(json_array_size(json_object_get(t1, "top_logprobs")), 1);
        json_decref(o);
    }
    ApiLogprobs none = {tok, NULL, 0};
    json_t *o = reparse(api_chat_completion_json(&META, "", API_FINISH_STOP, NULL, &none));
    json_t *l = json_object_get(only_choice(o), "logprobs");
    assert_true(json_is_array(json_object_get(l, "content")));
    assert_int_equal(json_array_size(json_object_get(l, "content")), 0);
    json_decref(o);
    o = reparse(api_chat_chunk_json(&META, false, "x", API_FINISH_NONE, NULL));
    assert_true(json_is_null(json_object_get(only_choice(o), "logprobs")));
    json_decref(o);
    tok_free(tok);
}

/* The legacy completions shape: tokens, token_logprobs, top_logprobs as
 * {token: logprob} with the generated token added, text_offset. */
static void test_text_logprobs_object(void **state) {
    (void)state;
    Tokenizer *tok = stories_tok();
    if (tok == NULL) return;
    ApiLogprobs lp = {tok, SAMPLE_LP, 2};
    for (int is_chunk = 0; is_chunk < 2; is_chunk++) {
        json_t *o = reparse(is_chunk ? api_text_chunk_json(&META, " Once\xE2", API_FINISH_NONE, &lp)
                                     : api_text_completion_json(&META, " Once\xE2", API_FINISH_STOP, NULL, &lp));
        json_t *l = json_object_get(only_choice(o), "logprobs");
        json_t *tokens = json_object_get(l, "tokens"), *values = json_object_get(l, "token_logprobs"),
               *tops = json_object_get(l, "top_logprobs"), *offsets = json_object_get(l, "text_offset");
        assert_int_equal(json_array_size(tokens), 2);
        assert_string_equal(json_string_value(json_array_get(tokens, 0)), " Once");
        assert_string_equal(json_string_value(json_array_get(tokens, 1)), "bytes:\\xe2");
        assert_float_equal(json_real_value(json_array_get(values, 0)), -0.25, 1e-6);
        assert_float_equal(json_real_value(json_array_get(values, 1)), -9999.0, 1e-6);
        assert_int_equal(json_integer_value(json_array_get(offsets, 0)), 0);
        assert_int_equal(json_integer_value(json_array_get(offsets, 1)), 5);
        json_t *d0 = json_array_get(tops, 0), *d1 = json_array_get(tops, 1);
        assert_int_equal(json_object_size(d0), 3); /* the generated token is one of the three */
        assert_float_equal(json_real_value(json_object_get(d0, " Once")), -0.25, 1e-6);
        assert_float_equal(json_real_value(json_object_get(d0, "bytes:\\xe2")), -1.5, 1e-6);
        assert_float_equal(json_real_value(json_object_get(d0, "</s>")), -3.0, 1e-6);
        assert_int_equal(json_object_size(d1), 2); /* one alternative and the generated token */
        assert_float_equal(json_real_value(json_object_get(d1, " Once")), -0.5, 1e-6);
        assert_float_equal(json_real_value(json_object_get(d1, "bytes:\\xe2")), -9999.0, 1e-6);
        json_decref(o);
    }
    json_t *o = reparse(api_text_chunk_json(&META, "x", API_FINISH_NONE, NULL));
    assert_true(json_is_null(json_object_get(only_choice(o), "logprobs")));
    json_decref(o);
    tok_free(tok);
}

/* ------------------------------------------------------ allocation failure */

/* Run build() with the k-th allocation failing, for every k until it
 * succeeds with no failure hit; each failing run must return NULL. */
static void each_failure(char *(*build)(void)) {
    json_set_alloc_funcs(oa_json_malloc, free);
    for (long k = 0;; k++) {
        oa_fail_after = k;
        char *out = build();
        bool was_hit = oa_fail_after == 0;
        oa_fail_after = -1;
        if (!was_hit) {
            assert_non_null(out);
            mn_free(out);
            break;
        }
        mn_free(out); /* a failure that was absorbed may still give a result */
        assert_true(k < 10000);
    }
    json_set_alloc_funcs(malloc, free);
}

static char *build_chat(void) {
    ApiUsage u = sample_usage();
    return api_chat_completion_json(&META, "bad \xFF text", API_FINISH_STOP, &u, NULL);
}
static char *build_chunk(void) { return api_chat_chunk_json(&META, true, "piece", API_FINISH_NONE, NULL); }
static char *build_text(void) {
    ApiUsage u = sample_usage();
    return api_text_completion_json(&META, "t", API_FINISH_LENGTH, &u, NULL);
}
static char *build_usage_chunk(void) {
    ApiUsage u = sample_usage();
    return api_usage_chunk_json(&META, false, &u);
}
static char *build_error(void) { return api_error_json(400, "m\xFF", "p", "c"); }
static char *build_models(void) {
    const char *names[] = {"a", "b", "c"};
    return api_models_json(names, 3, 1);
}
static char *build_tokens(void) {
    int32_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = i * 1000;
    return api_tokenize_json(toks, 100);
}
static char *build_detok(void) { return api_detokenize_json("x\xC0y", 3); }
static char *build_model(void) { return api_model_json("m", 1); }
static Tokenizer *g_tok; /* for the logprob builders */
static char *build_chat_logprobs(void) {
    ApiLogprobs lp = {g_tok, SAMPLE_LP, 2};
    return api_chat_completion_json(&META, "t", API_FINISH_STOP, NULL, &lp);
}
static char *build_text_logprobs(void) {
    ApiLogprobs lp = {g_tok, SAMPLE_LP, 2};
    return api_text_chunk_json(&META, "t", API_FINISH_NONE, &lp);
}

static void test_builder_alloc_failure(void **state) {
    (void)state;
    each_failure(build_chat);
    each_failure(build_chunk);
    each_failure(build_text);
    each_failure(build_usage_chunk);
    each_failure(build_error);
    each_failure(build_models);
    each_failure(build_tokens);
    each_failure(build_detok);
    each_failure(build_model);
    if ((g_tok = stories_tok()) == NULL) return;
    each_failure(build_chat_logprobs);
    each_failure(build_text_logprobs);
    tok_free(g_tok);
}

static void test_parse_alloc_failure(void **state) {
    (void)state;
    static const struct {
        ApiRoute route;
        const char *body;
    } BODIES[] = {
        {CHAT, "{\"model\":\"m\",\"session_id\":\"s\",\"stop\":[\"a\",\"b\"],\"messages\":[{\"role\":\"system\","
               "\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
               "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null}]}"},
        {CHAT, "{" MSGS ",\"stop\":\"x\"}"},
        {CMPL, "{\"prompt\":[1,2,3]}"},
        {CMPL, "{\"prompt\":\"x\",\"logit_bias\":{\"1\":2,\"3\":-4},\"logprobs\":2}"},
        {CMPL, "{\"prompt\":\"text\"}"},
        {TOK, "{\"content\":\"text\"}"},
        {DETOK, "{\"tokens\":[1,2,3]}"},
    };
    json_set_alloc_funcs(oa_json_malloc, free);
    for (size_t i = 0; i < sizeof BODIES / sizeof BODIES[0]; i++) {
        for (long k = 0;; k++) {
            ApiRequest r;
            MnErr err = {0};
            oa_fail_after = k;
            int rc = parse(BODIES[i].route, BODIES[i].body, &r, &err);
            bool was_hit = oa_fail_after == 0;
            oa_fail_after = -1;
            if (!was_hit) {
                assert_int_equal(rc, MN_OK);
                api_request_deinit(&r);
                break;
            }
            /* jansson's lexer reports some of its allocation failures as
             * syntax errors, so MN_EINVAL is possible too */
            if (rc != MN_ENOMEM && rc != MN_EINVAL && rc != MN_OK)
                fail_msg("body %zu, failure %ld: rc %d: %s", i, k, rc, err.msg);
            if (rc != MN_OK) assert_true(is_zero(&r));
            api_request_deinit(&r);
            assert_true(k < 10000);
        }
    }
    json_set_alloc_funcs(malloc, free);
}

/* api_sse_emit: pending bytes in pieces of at most max, then a ping. */
static void test_sse_emit(void **state) {
    (void)state;
    char buf[8];
    size_t off = 0;
    const char *out = "data: x\n\n"; /* 9 bytes */
    assert_int_equal(api_sse_emit(out, 9, &off, buf, 8), 8);
    assert_memory_equal(buf, "data: x\n", 8);
    assert_int_equal(off, 8);
    assert_int_equal(api_sse_emit(out, 9, &off, buf, 8), 1);
    assert_int_equal(buf[0], '\n');
    assert_int_equal(off, 9);
    assert_int_equal(api_sse_emit(out, 9, &off, buf, 8), 8); /* nothing left: ": ping\n\n" */
    assert_memory_equal(buf, ": ping\n\n", 8);
    assert_int_equal(off, 9);
    assert_int_equal(api_sse_emit(out, 9, &off, buf, 3), 3);
    assert_memory_equal(buf, ": p", 3);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_defaults),
        cmocka_unit_test(test_chat_all_fields),
        cmocka_unit_test(test_chat_content_shapes),
        cmocka_unit_test(test_chat_template_fields),
        cmocka_unit_test(test_chat_stop_and_limits),
        cmocka_unit_test(test_chat_nulls_are_absent),
        cmocka_unit_test(test_completion_shapes),
        cmocka_unit_test(test_tokenize_detokenize),
        cmocka_unit_test(test_invalid_requests),
        cmocka_unit_test(test_refused_fields),
        cmocka_unit_test(test_accepted_defaults),
        cmocka_unit_test(test_logprobs_and_bias_fields),
        cmocka_unit_test(test_utf8_sanitize),
        cmocka_unit_test(test_usage_tiers),
        cmocka_unit_test(test_chat_completion_object),
        cmocka_unit_test(test_chat_chunks),
        cmocka_unit_test(test_text_completion),
        cmocka_unit_test(test_chat_logprobs_object),
        cmocka_unit_test(test_text_logprobs_object),
        cmocka_unit_test(test_invalid_utf8_in_responses),
        cmocka_unit_test(test_error_objects),
        cmocka_unit_test(test_models_and_tokens),
        cmocka_unit_test(test_builder_alloc_failure),
        cmocka_unit_test(test_parse_alloc_failure),
        cmocka_unit_test(test_sse_emit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
