/* fuzz_request.c — libFuzzer target for the HTTP API's request parser
 * (server/openai.h: api_parse_request) and its UTF-8 sanitizer.
 *
 * The input is a request body. It is parsed as the body of every route that
 * has one (chat completions, completions, /tokenize, /detokenize,
 * /v1/responses, /apply-template), as a client could send any bytes to any
 * of them. Beyond never crashing,
 * leaking or reading out of bounds (ASan, UBSan), each parse must keep
 * openai.h's contract: a failure is MN_EINVAL with a message (and a
 * NUL-terminated param that is a prefix of it) or MN_ENOMEM, and leaves the
 * request zeroed; a success holds what the header promises of the route
 * (a chat's messages as objects with a chat role and a string or parts
 * content; Responses items with static roles and owned contents; exactly one prompt form,
 * ids >= 0, non-empty stops, in-range sampling fields). The input also goes
 * through api_utf8_sanitize, whose output must be valid UTF-8 and equal to
 * the input when that is valid. Seeds: fuzz/corpus/request; dictionary:
 * fuzz/request.dict (the field names and values the parser knows).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"
#include "base/utf8.h"
#include "server/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool is_zero(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0) return false;
    return true;
}

/* Chat roles are "system", "user" or "assistant"; Responses input items
 * keep "developer" as given. */
static bool is_role(const char *r, bool is_responses) {
    return r != NULL && (strcmp(r, "system") == 0 || strcmp(r, "user") == 0 || strcmp(r, "assistant") == 0 ||
                         (is_responses && strcmp(r, "developer") == 0));
}

/* A chat's messages (ApiRequest.messages): a non-empty array of objects
 * {"role", "content"}, the role a chat role, the content a string or an
 * array of parts. */
static bool is_chat_messages(const json_t *m) {
    if (!json_is_array(m) || json_array_size(m) == 0) return false;
    for (size_t i = 0; i < json_array_size(m); i++) {
        const json_t *msg = json_array_get(m, i), *content = json_object_get(msg, "content");
        if (!json_is_object(msg) || json_object_size(msg) != 2 ||
            !is_role(json_string_value(json_object_get(msg, "role")), false) ||
            !(json_is_string(content) || json_is_array(content)))
            return false;
    }
    return true;
}

/* What a successful parse of route promises (openai.h, ApiRequest). */
static void check_request(ApiRoute route, const ApiRequest *r) {
    if (r->route != route) abort();
    bool is_responses = route == API_ROUTE_RESPONSES;
    bool is_chat = route == API_ROUTE_CHAT || route == API_ROUTE_APPLY_TEMPLATE;
    if (is_chat) {
        if (!is_chat_messages(r->messages) || r->msgs != NULL || r->n_msgs != 0) abort();
        if ((r->tools && !json_is_array(r->tools)) || (r->template_vars && !json_is_object(r->template_vars))) abort();
    } else if (r->messages != NULL || r->tools != NULL || r->template_vars != NULL) {
        abort();
    }
    if (is_responses) {
        if (r->n_msgs < 1 || r->msgs == NULL) abort();
        for (size_t i = 0; i < r->n_msgs; i++)
            if (!is_role(r->msgs[i].role, true) || r->msgs[i].content == NULL) abort();
    } else if (r->n_msgs != 0 || r->instructions != NULL || r->previous_response_id != NULL) {
        abort();
    }
    if (route == API_ROUTE_COMPLETION && (r->text != NULL) == (r->tokens != NULL && r->n_tokens >= 1)) abort();
    if (route == API_ROUTE_TOKENIZE && r->text == NULL) abort();
    if (r->n_tokens > 0 && r->tokens == NULL) abort();
    for (size_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < 0) abort();
    if (is_chat || route == API_ROUTE_COMPLETION || is_responses) {
        if (r->model == NULL) abort();
        if (r->n_stop > API_MAX_STOP) abort();
        for (size_t i = 0; i < r->n_stop; i++)
            if (r->stop[i] == NULL || r->stop[i][0] == '\0') abort();
        if (r->max_tokens != -1 && r->max_tokens < 1) abort();
        if (r->top_logprobs < 0 || r->top_logprobs > API_MAX_TOP_LOGPROBS) abort();
        for (size_t i = 0; i < r->n_logit_bias; i++) {
            const SamplerBias *b = &r->logit_bias[i];
            if (b->id < 0 || !(b->bias >= -API_MAX_LOGIT_BIAS && b->bias <= API_MAX_LOGIT_BIAS)) abort();
        }
        const SamplerParams *s = &r->sampler;
        if (s->logit_bias != r->logit_bias || (size_t)s->n_logit_bias != r->n_logit_bias) abort();
        if (!(s->temperature >= 0 && s->temperature <= 2) || !(s->top_p > 0 && s->top_p <= 1) ||
            !(s->min_p >= 0 && s->min_p <= 1) || s->top_k < 0 || !(s->repeat_penalty > 0))
            abort();
    }
}

static void parse_as(ApiRoute route, const char *body, size_t len) {
    ApiRequest r;
    MnErr err = {0};
    char param[API_PARAM_MAX];
    memset(param, 'x', sizeof param);
    int rc = api_parse_request(route, body, len, &r, &err, param);
    if (memchr(param, '\0', sizeof param) == NULL) abort();
    if (rc == MN_OK) {
        if (param[0] != '\0') abort();
        check_request(route, &r);
        api_request_deinit(&r);
        if (!is_zero(&r, sizeof r)) abort();
        return;
    }
    if ((rc != MN_EINVAL && rc != MN_ENOMEM) || err.code != rc || err.msg[0] == '\0') abort();
    if (strncmp(err.msg, param, strlen(param)) != 0) abort();
    if (!is_zero(&r, sizeof r)) abort();
}

static void check_sanitize(const char *s, size_t len) {
    size_t n = 0;
    char *out = api_utf8_sanitize(s, len, &n);
    if (out == NULL) abort();
    if (out[n] != '\0' || n > 3 * len || !utf8_is_valid(out, n)) abort();
    if (utf8_is_valid(s, len) && (n != len || memcmp(out, s, len) != 0)) abort();
    mn_free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    static const ApiRoute routes[] = {API_ROUTE_CHAT,        API_ROUTE_COMPLETION, API_ROUTE_TOKENIZE,
                                      API_ROUTE_DETOKENIZE,  API_ROUTE_RESPONSES,  API_ROUTE_APPLY_TEMPLATE};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) parse_as(routes[i], body, size);
    check_sanitize(body, size);
    return 0;
}
