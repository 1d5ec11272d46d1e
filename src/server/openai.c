/* openai.c — see openai.h.
 *
 * The HTTP layer hands this module request bodies and gets back either a
 * validated ApiRequest or a message for a 400; the engine's results come
 * back through the builders as JSON texts ready to send (whole, or as the
 * payload of one SSE "data:" line). jansson does the JSON in both
 * directions; this file converts its failures to MN_* codes at the edge.
 *
 * Parsing walks the jansson tree with small typed getters (get_bool,
 * get_real, get_int, get_string) that treat an absent member and a JSON
 * null alike and fill err with "<field> must be ..." on a type or range
 * error. Every message about a field starts with its path ("stop[1] must
 * be", "logit_bias: ...") followed by a space or a colon; the entry point
 * takes that path as OpenAI's "param" (messages about the body as a whole
 * come from load_object, which sets no param). Before any field is read,
 * check_fields holds every member of a chat or completion object (and of
 * each message, content part and stream_options) against its table of
 * fields: unknown ones and unimplemented ones not at their do-nothing
 * value are refused. The request owns copies of all strings, so the
 * jansson tree is dropped before the parse returns. Invariant of a parsed
 * request: every pointer member is NULL or owned, and fields a route does
 * not use are zero; after a failure the whole request is zero.
 *
 * Building makes a jansson tree and serializes it compactly into an
 * mn_malloc'd buffer (server/api_base's api_json_finish), so the caller
 * frees the result with mn_free like everything else. Every caller string
 * goes in through jtext (api_json_text), which substitutes the
 * api_utf8_sanitize form for invalid UTF-8, so a broken byte in generated
 * text degrades the text, never the response. Allocation failure anywhere in a builder frees the
 * partial tree and returns NULL.
 *
 * No state, no locks: every function may run on any thread.
 */
#include "server/openai.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/utf8.h"

/* ================================================================ parsing */

/* A member of obj, or NULL when it is absent or JSON null. */
static json_t *member(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* ---- typed getters: leave *out untouched and *is_set false when the member
 * is absent; MN_EINVAL with "<key> must be ..." on a wrong type or value. */

static int get_bool(const json_t *obj, const char *key, bool *out, MnErr *err) {
    json_t *v = member(obj, key);
    if (v == NULL) return MN_OK;
    if (!json_is_boolean(v)) return mn_err_set(err, MN_EINVAL, "%s must be a boolean", key);
    *out = json_is_true(v);
    return MN_OK;
}

/* A number in [lo, hi], or (lo, hi] when is_lo_open. range names the range
 * for the message ("between 0 and 2"). Written as positive checks so NaN
 * could never pass (jansson does not produce it, but the check is free).
 * The float the sampler gets is checked too: 1e-300 is in (0, 1] but its
 * float is 0. */
static int get_real(const json_t *obj, const char *key, double lo, bool is_lo_open, double hi,
                    const char *range, float *out, bool *is_set, MnErr *err) {
    *is_set = false;
    json_t *v = member(obj, key);
    if (v == NULL) return MN_OK;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    bool is_ok = is_lo_open ? x > lo : x >= lo;
    if (!(is_ok && x <= hi)) return mn_err_set(err, MN_EINVAL, "%s must be a number %s", key, range);
    float f = (float)x, flo = (float)lo;
    is_ok = is_lo_open ? f > flo : f >= flo;
    if (!(is_ok && f <= (float)hi))
        return mn_err_set(err, MN_EINVAL, "%s must be a number %s as a 32-bit float (%g is %g)", key, range, x,
                          (double)f);
    *out = f;
    *is_set = true;
    return MN_OK;
}

/* An integer in [lo, hi]. A real with an integral value (10.0) is accepted,
 * as JSON makes no difference between the two. what completes the message
 * ("a positive integer"). */
static int get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, const char *what,
                   int64_t *out, bool *is_set, MnErr *err) {
    *is_set = false;
    json_t *v = member(obj, key);
    if (v == NULL) return MN_OK;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && fabs(json_real_value(v)) <= 9007199254740992.0 &&
               json_real_value(v) == trunc(json_real_value(v))) {
        x = (int64_t)json_real_value(v); /* |v| <= 2^53: exact */
    } else {
        return mn_err_set(err, MN_EINVAL, "%s must be %s", key, what);
    }
    if (x < lo || x > hi) return mn_err_set(err, MN_EINVAL, "%s must be %s", key, what);
    *out = x;
    *is_set = true;
    return MN_OK;
}

/* An owned copy of a string member; *out stays NULL when absent. */
static int get_string(const json_t *obj, const char *key, char **out, MnErr *err) {
    json_t *v = member(obj, key);
    if (v == NULL) return MN_OK;
    if (!json_is_string(v)) return mn_err_set(err, MN_EINVAL, "%s must be a string", key);
    *out = mn_strndup(json_string_value(v), json_string_length(v));
    return *out ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
}

/* A token id array element: an integer in [0, INT32_MAX]. */
static bool token_value(const json_t *v, int32_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > INT32_MAX) return false;
    *out = (int32_t)x;
    return true;
}

/* Copy an array of token ids. field names it in messages. */
static int parse_token_array(const json_t *arr, const char *field, ApiRequest *r, MnErr *err) {
    size_t n = json_array_size(arr);
    r->tokens = mn_calloc(n ? n : 1, sizeof *r->tokens);
    if (r->tokens == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!token_value(json_array_get(arr, i), &r->tokens[i]))
            return mn_err_set(err, MN_EINVAL, "%s[%zu] must be a token id (an integer >= 0)", field, i);
    }
    r->n_tokens = n;
    return MN_OK;
}

/* Parse the body into a jansson tree that must be an object. */
static int load_object(const char *body, size_t len, json_t **out, MnErr *err) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY, &jerr);
    /* jansson flags some allocation failures with json_error_out_of_memory
     * and one (lexer set-up) by leaving the text empty; others inside the
     * lexer it reports as syntax errors, which then read as a 400. */
    if (root == NULL && (json_error_code(&jerr) == json_error_out_of_memory || jerr.text[0] == '\0'))
        return mn_err_set(err, MN_ENOMEM, "out of memory");
    /* "\u0000" is valid JSON, but the strings go on as C strings (cut at
     * the NUL): refused, in the client's words rather than jansson's
     * ("... not allowed without JSON_ALLOW_NUL") */
    if (root == NULL && json_error_code(&jerr) == json_error_null_character)
        return mn_err_set(err, MN_EINVAL, "a string holds \\u0000 (NUL), which is not supported (line %d, column %d)",
                          jerr.line, jerr.column);
    if (root == NULL)
        return mn_err_set(err, MN_EINVAL, "invalid JSON at line %d, column %d: %s", jerr.line,
                          jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return mn_err_set(err, MN_EINVAL, "request body must be a JSON object");
    }
    *out = root;
    return MN_OK;
}

/* ---- the fields a request may hold -------------------------------------- */

typedef enum FieldKind {
    FIELD_USED,        /* parsed below and acted on */
    FIELD_NO_EFFECT,   /* accepted: asks for nothing mnemo would do otherwise (docs/API.md) */
    FIELD_UNSUPPORTED, /* refused unless is_default accepts its value */
} FieldKind;

typedef struct ApiField {
    const char *name;
    FieldKind kind;
    bool (*is_default)(const json_t *v); /* FIELD_UNSUPPORTED: the values that ask for nothing */
} ApiField;

static bool is_false(const json_t *v) { return json_is_false(v); }
static bool is_none_string(const json_t *v) { return json_is_string(v) && strcmp(json_string_value(v), "none") == 0; }
/* "auto" (what no tool_choice means with tools) or "none": the model
 * decides, and its answer comes back as text */
static bool is_model_choice(const json_t *v) {
    return is_none_string(v) || (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0);
}
static bool is_one(const json_t *v) { return json_is_number(v) && json_number_value(v) == 1.0; }
static bool is_empty_array(const json_t *v) { return json_is_array(v) && json_array_size(v) == 0; }

static bool is_zero_number(const json_t *v) { return json_is_number(v) && json_number_value(v) == 0.0; }
static bool is_string_of(const json_t *v, const char *a, const char *b) {
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    return s && (strcmp(s, a) == 0 || (b && strcmp(s, b) == 0));
}
static bool is_none_or_auto(const json_t *v) { return is_string_of(v, "none", "auto"); }
static bool is_disabled_string(const json_t *v) { return is_string_of(v, "disabled", NULL); }

static bool is_text_format(const json_t *v) {
    json_t *type = json_object_get(v, "type");
    return json_is_object(v) && json_object_size(v) == 1 && json_is_string(type) &&
           strcmp(json_string_value(type), "text") == 0;
}

/* Responses' "text": {"format": {"type": "text"}} (and a "verbosity" of
 * null), the default. */
static bool is_text_config(const json_t *v) {
    const char *key;
    json_t *m;
    json_object_foreach((json_t *)v, key, m) {
        if (strcmp(key, "format") == 0 ? !is_text_format(m) : !json_is_null(m)) return false;
    }
    return json_is_object(v);
}

static bool is_text_modality(const json_t *v) {
    json_t *m = json_array_get(v, 0);
    return json_is_array(v) && json_array_size(v) == 1 && json_is_string(m) && strcmp(json_string_value(m), "text") == 0;
}

#define USED(name) {name, FIELD_USED, NULL}
#define NO_EFFECT(name) {name, FIELD_NO_EFFECT, NULL}
#define UNSUPPORTED(name, is_default) {name, FIELD_UNSUPPORTED, is_default}

/* parse_generation's, in both routes */
static const ApiField GEN_FIELDS[] = {
    USED("model"), USED("session_id"), USED("stream"), USED("stream_options"), USED("ignore_eos"),
    USED("max_tokens"), USED("max_completion_tokens"), USED("temperature"), USED("top_p"), USED("min_p"),
    USED("presence_penalty"), USED("frequency_penalty"), USED("repeat_penalty"), USED("top_k"), USED("seed"),
    USED("n"), USED("stop"), USED("logit_bias"), USED("logprobs"),
    NO_EFFECT("user"), /* an end-user id for OpenAI's abuse monitoring */
    {NULL, FIELD_USED, NULL},
};

static const ApiField CHAT_FIELDS[] = {
    USED("messages"), USED("top_logprobs"), USED("tools"), USED("chat_template_kwargs"), USED("add_generation_prompt"),
    /* about OpenAI's accounts, storage and routing: nothing to do here */
    NO_EFFECT("metadata"), NO_EFFECT("service_tier"), NO_EFFECT("prompt_cache_key"), NO_EFFECT("safety_identifier"),
    UNSUPPORTED("store", is_false),
    UNSUPPORTED("tool_choice", is_model_choice), UNSUPPORTED("parallel_tool_calls", NULL),
    UNSUPPORTED("functions", NULL), UNSUPPORTED("function_call", is_none_string),
    UNSUPPORTED("response_format", is_text_format), UNSUPPORTED("modalities", is_text_modality),
    UNSUPPORTED("audio", NULL), UNSUPPORTED("prediction", NULL), UNSUPPORTED("reasoning_effort", NULL),
    UNSUPPORTED("verbosity", NULL), UNSUPPORTED("web_search_options", NULL),
    {NULL, FIELD_USED, NULL},
};

static const ApiField COMPLETION_FIELDS[] = {
    USED("prompt"), UNSUPPORTED("echo", is_false), UNSUPPORTED("best_of", is_one), UNSUPPORTED("suffix", NULL),
    {NULL, FIELD_USED, NULL},
};

static const ApiField MESSAGE_FIELDS[] = {
    USED("role"), USED("content"),
    NO_EFFECT("annotations"), /* citations the API attached to an earlier answer */
    UNSUPPORTED("name", NULL), UNSUPPORTED("tool_calls", is_empty_array), UNSUPPORTED("tool_call_id", NULL),
    UNSUPPORTED("function_call", NULL), UNSUPPORTED("refusal", NULL), UNSUPPORTED("audio", NULL),
    {NULL, FIELD_USED, NULL},
};

static const ApiField PART_FIELDS[] = {USED("type"), USED("text"), {NULL, FIELD_USED, NULL}};

/* POST /v1/responses: its own names for the generation fields, and no
 * tools, reasoning or structured output (refused unless they ask for
 * nothing). truncation: the server's --context-overflow decides, not the
 * request, so only the default is accepted. seed
 * and ignore_eos are mnemo's extensions, as in chat (`mnemo bench` fixes
 * reply lengths with ignore_eos through either API). */
static const ApiField RESPONSES_FIELDS[] = {
    USED("model"), USED("input"), USED("instructions"), USED("previous_response_id"), USED("store"),
    USED("max_output_tokens"), USED("temperature"), USED("top_p"), USED("stream"), USED("seed"), USED("ignore_eos"),
    NO_EFFECT("metadata"), NO_EFFECT("user"), NO_EFFECT("service_tier"), NO_EFFECT("prompt_cache_key"),
    NO_EFFECT("safety_identifier"), NO_EFFECT("parallel_tool_calls"),
    UNSUPPORTED("tools", is_empty_array), UNSUPPORTED("tool_choice", is_none_or_auto),
    UNSUPPORTED("text", is_text_config), UNSUPPORTED("truncation", is_disabled_string),
    UNSUPPORTED("include", is_empty_array), UNSUPPORTED("background", is_false), UNSUPPORTED("reasoning", NULL),
    UNSUPPORTED("top_logprobs", is_zero_number), UNSUPPORTED("max_tool_calls", NULL), UNSUPPORTED("prompt", NULL),
    UNSUPPORTED("conversation", NULL), UNSUPPORTED("stream_options", NULL),
    {NULL, FIELD_USED, NULL},
};

/* An input item of a response: a message (type "message", or no type). */
static const ApiField INPUT_ITEM_FIELDS[] = {
    USED("type"), USED("role"), USED("content"), NO_EFFECT("id"), NO_EFFECT("status"), {NULL, FIELD_USED, NULL},
};

static const ApiField INPUT_PART_FIELDS[] = {
    USED("type"), USED("text"), NO_EFFECT("annotations"), NO_EFFECT("logprobs"), {NULL, FIELD_USED, NULL},
};

static const ApiField STREAM_OPTION_FIELDS[] = {
    USED("include_usage"), UNSUPPORTED("include_obfuscation", is_false), {NULL, FIELD_USED, NULL},
};

#undef USED
#undef NO_EFFECT
#undef UNSUPPORTED

static const ApiField *field_find(const ApiField *table, const char *key) {
    for (; table && table->name; table++)
        if (strcmp(table->name, key) == 0) return table;
    return NULL;
}

/* Every non-null member of obj must be in table or extra (may be NULL), and
 * an unsupported one at its default. path prefixes the names in messages
 * ("" at the top, "messages[2]."). */
static int check_fields(const json_t *obj, const ApiField *table, const ApiField *extra, const char *path,
                        MnErr *err) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (json_is_null(v)) continue;
        const ApiField *f = field_find(table, key);
        if (f == NULL) f = field_find(extra, key);
        if (f == NULL) return mn_err_set(err, MN_EINVAL, "%s%.64s: unknown field", path, key);
        if (f->kind == FIELD_UNSUPPORTED && !(f->is_default && f->is_default(v)))
            return mn_err_set(err, MN_EINVAL, "%s%s: not supported", path, key);
    }
    return MN_OK;
}

/* "logit_bias": {"TOKEN_ID": bias, ...}, ids as decimal strings. */
static int parse_logit_bias(const json_t *root, ApiRequest *r, MnErr *err) {
    json_t *lb = member(root, "logit_bias");
    if (lb == NULL) return MN_OK;
    if (!json_is_object(lb))
        return mn_err_set(err, MN_EINVAL, "logit_bias must be an object of token ids (as strings) to numbers");
    size_t n = json_object_size(lb);
    r->logit_bias = mn_calloc(n ? n : 1, sizeof *r->logit_bias);
    if (r->logit_bias == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        size_t len = strlen(key);
        bool is_id = len > 0 && len <= 10;
        for (size_t i = 0; is_id && i < len; i++) is_id = key[i] >= '0' && key[i] <= '9';
        long long id = is_id ? strtoll(key, NULL, 10) : -1;
        if (!is_id || id > INT32_MAX)
            return mn_err_set(err, MN_EINVAL, "logit_bias: \"%.32s\" is not a token id (a decimal integer >= 0)", key);
        double b = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(b >= -API_MAX_LOGIT_BIAS && b <= API_MAX_LOGIT_BIAS))
            return mn_err_set(err, MN_EINVAL, "logit_bias: the bias of token %lld must be a number between -100 and 100",
                              id);
        r->logit_bias[r->n_logit_bias++] = (SamplerBias){.id = (int32_t)id, .bias = (float)b};
    }
    r->sampler.logit_bias = r->logit_bias;
    r->sampler.n_logit_bias = (int32_t)r->n_logit_bias;
    return MN_OK;
}

/* chat: "logprobs": bool, "top_logprobs": 0..20 (only with logprobs);
 * completion: "logprobs": 0..20, the number of alternatives. */
static int parse_logprobs(const json_t *root, bool is_chat, ApiRequest *r, MnErr *err) {
    int64_t x;
    bool is_set;
    int rc;
    if (!is_chat) {
        if ((rc = get_int(root, "logprobs", 0, API_MAX_TOP_LOGPROBS, "an integer between 0 and 20", &x, &is_set,
                          err)) != MN_OK)
            return rc;
        r->is_logprobs = is_set;
        r->top_logprobs = is_set ? (int32_t)x : 0;
        return MN_OK;
    }
    if ((rc = get_bool(root, "logprobs", &r->is_logprobs, err)) != MN_OK) return rc;
    if ((rc = get_int(root, "top_logprobs", 0, API_MAX_TOP_LOGPROBS, "an integer between 0 and 20", &x, &is_set,
                      err)) != MN_OK)
        return rc;
    if (is_set && !r->is_logprobs) return mn_err_set(err, MN_EINVAL, "top_logprobs needs \"logprobs\": true");
    r->top_logprobs = is_set ? (int32_t)x : 0;
    return MN_OK;
}

/* ---- generation fields shared by chat and completions ------------------- */

static int parse_stop(const json_t *root, ApiRequest *r, MnErr *err) {
    json_t *v = member(root, "stop");
    if (v == NULL) return MN_OK;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return mn_err_set(err, MN_EINVAL, "stop must be a non-empty string or an array of up to %d non-empty strings",
                              API_MAX_STOP);
        r->stop[0] = mn_strndup(json_string_value(v), json_string_length(v));
        if (r->stop[0] == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
        r->n_stop = 1;
    } else if (json_is_array(v)) {
        if (json_array_size(v) > API_MAX_STOP)
            return mn_err_set(err, MN_EINVAL, "stop must have at most %d strings", API_MAX_STOP);
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *s = json_array_get(v, i);
            if (!json_is_string(s) || json_string_length(s) == 0)
                return mn_err_set(err, MN_EINVAL, "stop[%zu] must be a non-empty string", i);
            r->stop[i] = mn_strndup(json_string_value(s), json_string_length(s));
            if (r->stop[i] == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
            r->n_stop = i + 1;
        }
    } else {
        return mn_err_set(err, MN_EINVAL, "stop must be a non-empty string or an array of up to %d non-empty strings",
                          API_MAX_STOP);
    }
    r->fields_set |= API_SET_STOP;
    return MN_OK;
}

/* A float sampler field: get_real plus its API_SET bit. */
#define GEN_REAL(key, lo, is_lo_open, hi, range, dst, bit)                                    \
    do {                                                                                      \
        bool is_set_;                                                                         \
        int rc_ = get_real(root, key, lo, is_lo_open, hi, range, dst, &is_set_, err);         \
        if (rc_ != MN_OK) return rc_;                                                         \
        if (is_set_) r->fields_set |= (bit);                                                  \
    } while (0)

static int parse_generation(const json_t *root, ApiRequest *r, MnErr *err) {
    int rc;
    bool is_set;
    int64_t x;

    sampler_params_default(&r->sampler);
    r->sampler.temperature = 1.0f;
    r->sampler.top_k = 0;
    r->sampler.top_p = 1.0f;
    r->sampler.min_p = 0.0f;
    r->sampler.repeat_penalty = 1.0f;
    r->sampler.presence_penalty = 0.0f;
    r->sampler.frequency_penalty = 0.0f;
    r->sampler.seed = 0;
    r->max_tokens = -1;

    if ((rc = get_string(root, "model", &r->model, err)) != MN_OK) return rc;
    if (r->model == NULL && (r->model = mn_strdup("")) == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    if ((rc = get_string(root, "session_id", &r->session_id, err)) != MN_OK) return rc;

    if ((rc = get_bool(root, "stream", &r->is_stream, err)) != MN_OK) return rc;
    json_t *so = member(root, "stream_options");
    if (so != NULL) {
        if (!json_is_object(so)) return mn_err_set(err, MN_EINVAL, "stream_options must be an object");
        if ((rc = check_fields(so, STREAM_OPTION_FIELDS, NULL, "stream_options.", err)) != MN_OK) return rc;
        json_t *iu = member(so, "include_usage");
        if (iu != NULL && !json_is_boolean(iu))
            return mn_err_set(err, MN_EINVAL, "stream_options.include_usage must be a boolean");
        r->include_usage = json_is_true(iu);
    }
    if ((rc = get_bool(root, "ignore_eos", &r->ignore_eos, err)) != MN_OK) return rc;

    /* max_completion_tokens is the newer name; it wins when both are given.
     * The upper bound is the context's, which the server checks. */
    if ((rc = get_int(root, "max_tokens", 1, INT64_MAX, "an integer >= 1", &x, &is_set, err)) != MN_OK) return rc;
    if (is_set) r->max_tokens = x;
    if ((rc = get_int(root, "max_completion_tokens", 1, INT64_MAX, "an integer >= 1", &x, &is_set, err)) != MN_OK)
        return rc;
    if (is_set) r->max_tokens = x;
    if (r->max_tokens > 0) r->fields_set |= API_SET_MAX_TOKENS;

    GEN_REAL("temperature", 0.0, false, 2.0, "between 0 and 2", &r->sampler.temperature, API_SET_TEMPERATURE);
    GEN_REAL("top_p", 0.0, true, 1.0, "in (0, 1]", &r->sampler.top_p, API_SET_TOP_P);
    GEN_REAL("min_p", 0.0, false, 1.0, "between 0 and 1", &r->sampler.min_p, API_SET_MIN_P);
    GEN_REAL("presence_penalty", -2.0, false, 2.0, "between -2 and 2", &r->sampler.presence_penalty,
             API_SET_PRESENCE_PENALTY);
    GEN_REAL("frequency_penalty", -2.0, false, 2.0, "between -2 and 2", &r->sampler.frequency_penalty,
             API_SET_FREQUENCY_PENALTY);
    GEN_REAL("repeat_penalty", 0.0, true, 1e30, "> 0", &r->sampler.repeat_penalty, API_SET_REPEAT_PENALTY);

    if ((rc = get_int(root, "top_k", 0, INT32_MAX, "an integer >= 0", &x, &is_set, err)) != MN_OK) return rc;
    if (is_set) {
        r->sampler.top_k = (int32_t)x;
        r->fields_set |= API_SET_TOP_K;
    }
    if ((rc = get_int(root, "seed", INT64_MIN, INT64_MAX, "an integer", &x, &is_set, err)) != MN_OK) return rc;
    if (is_set) {
        r->sampler.seed = (uint64_t)x;
        r->fields_set |= API_SET_SEED;
    }
    if ((rc = get_int(root, "n", INT64_MIN, INT64_MAX, "an integer", &x, &is_set, err)) != MN_OK) return rc;
    if (is_set && x != 1) return mn_err_set(err, MN_EINVAL, "n: only n=1 is supported");

    if ((rc = parse_logit_bias(root, r, err)) != MN_OK) return rc;
    if ((rc = parse_logprobs(root, r->route == API_ROUTE_CHAT || r->route == API_ROUTE_APPLY_TEMPLATE, r, err)) != MN_OK)
        return rc;
    return parse_stop(root, r, err);
}

#undef GEN_REAL

/* ---- chat messages ------------------------------------------------------ */

/* The roles a request may use; "developer" (OpenAI's newer name for the
 * system role) arrives as ROLE_SYSTEM. */
typedef enum ApiRole { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_NONE } ApiRole;

static const char *const ROLE_NAMES[ROLE_NONE] = {"system", "user", "assistant"};

static ApiRole chat_role(const char *s) {
    if (strcmp(s, "system") == 0 || strcmp(s, "developer") == 0) return ROLE_SYSTEM;
    if (strcmp(s, "user") == 0) return ROLE_USER;
    if (strcmp(s, "assistant") == 0) return ROLE_ASSISTANT;
    return ROLE_NONE;
}

/* The "text" members of parts (checked strings, total bytes with the
 * separators), joined by "\n" (as llama.cpp and vLLM join them) into *out. */
static int join_texts(const json_t *parts, size_t total, char **out, MnErr *err) {
    char *s = mn_malloc(total + 1);
    if (s == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    size_t at = 0;
    for (size_t k = 0; k < json_array_size(parts); k++) {
        json_t *text = json_object_get(json_array_get(parts, k), "text");
        if (k > 0) s[at++] = '\n';
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = '\0';
    *out = s;
    return MN_OK;
}

/* A content-parts array: objects {"type": "text", "text": string}. i is
 * the message index for messages. */
static int check_parts(const json_t *parts, size_t i, MnErr *err) {
    for (size_t k = 0; k < json_array_size(parts); k++) {
        json_t *part = json_array_get(parts, k);
        if (!json_is_object(part))
            return mn_err_set(err, MN_EINVAL, "messages[%zu].content[%zu] must be an object", i, k);
        json_t *type = json_object_get(part, "type");
        if (!json_is_string(type))
            return mn_err_set(err, MN_EINVAL, "messages[%zu].content[%zu].type must be a string", i, k);
        if (strcmp(json_string_value(type), "text") != 0)
            return mn_err_set(err, MN_EINVAL,
                              "messages[%zu].content[%zu].type \"%.64s\" is not supported (only \"text\")", i, k,
                              json_string_value(type));
        char path[API_PARAM_MAX];
        snprintf(path, sizeof path, "messages[%zu].content[%zu].", i, k);
        int rc = check_fields(part, PART_FIELDS, NULL, path, err);
        if (rc != MN_OK) return rc;
        if (!json_is_string(json_object_get(part, "text")))
            return mn_err_set(err, MN_EINVAL, "messages[%zu].content[%zu].text must be a string", i, k);
    }
    return MN_OK;
}

/* Message i into *out: a new {"role", "content"} object (see ApiRequest). */
static int parse_message(const json_t *msg, size_t i, json_t **out, MnErr *err) {
    *out = NULL;
    if (!json_is_object(msg)) return mn_err_set(err, MN_EINVAL, "messages[%zu] must be an object", i);
    char path[API_PARAM_MAX];
    snprintf(path, sizeof path, "messages[%zu].", i);
    int rc = check_fields(msg, MESSAGE_FIELDS, NULL, path, err);
    if (rc != MN_OK) return rc;
    json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role)) return mn_err_set(err, MN_EINVAL, "messages[%zu].role must be a string", i);
    ApiRole r = chat_role(json_string_value(role));
    if (r == ROLE_NONE)
        return mn_err_set(err, MN_EINVAL,
                          "messages[%zu].role must be one of system, user, assistant, developer (got \"%.64s\")", i,
                          json_string_value(role));

    json_t *content = member(msg, "content");
    if (json_is_array(content)) {
        if ((rc = check_parts(content, i, err)) != MN_OK) return rc;
        content = json_incref(content);
    } else if (json_is_string(content)) {
        content = json_incref(content);
    } else if (content == NULL && r == ROLE_ASSISTANT) {
        content = json_string(""); /* an assistant turn that only called tools */
    } else {
        return mn_err_set(err, MN_EINVAL, "messages[%zu].content must be a string or an array of text parts", i);
    }
    *out = json_pack("{s:s,s:o}", "role", ROLE_NAMES[r], "content", content);
    return *out ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
}

/* "tools": an array of tool definitions (objects), for the chat template
 * to show; "chat_template_kwargs": an object of more template variables;
 * "add_generation_prompt": a boolean (default true). */
static int parse_template_fields(const json_t *root, ApiRequest *r, MnErr *err) {
    json_t *tools = member(root, "tools"), *vars = member(root, "chat_template_kwargs");
    if (tools != NULL) {
        if (!json_is_array(tools)) return mn_err_set(err, MN_EINVAL, "tools must be an array of tool definitions");
        for (size_t i = 0; i < json_array_size(tools); i++)
            if (!json_is_object(json_array_get(tools, i)))
                return mn_err_set(err, MN_EINVAL, "tools[%zu] must be an object", i);
        r->tools = json_incref(tools);
    }
    if (vars != NULL) {
        if (!json_is_object(vars))
            return mn_err_set(err, MN_EINVAL, "chat_template_kwargs must be an object of template variables");
        r->template_vars = json_incref(vars);
    }
    r->add_generation_prompt = true;
    return get_bool(root, "add_generation_prompt", &r->add_generation_prompt, err);
}

static int parse_chat_body(const json_t *root, ApiRequest *r, MnErr *err) {
    int rc = check_fields(root, CHAT_FIELDS, GEN_FIELDS, "", err);
    if (rc != MN_OK) return rc;
    json_t *msgs = member(root, "messages");
    if (msgs == NULL) return mn_err_set(err, MN_EINVAL, "messages is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return mn_err_set(err, MN_EINVAL, "messages must be a non-empty array");
    size_t n = json_array_size(msgs);
    if ((r->messages = json_array()) == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m;
        rc = parse_message(json_array_get(msgs, i), i, &m, err);
        if (rc != MN_OK) return rc;
        if (json_array_append_new(r->messages, m)) return mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    if ((rc = parse_template_fields(root, r, err)) != MN_OK) return rc;
    return parse_generation(root, r, err);
}

/* ---- responses ---------------------------------------------------------- */

/* The text of input[i].content: a string, or text parts ("input_text";
 * "output_text" in an assistant's earlier answer) joined by "\n". */
static int input_content(const json_t *content, size_t i, bool is_assistant, char **out, MnErr *err) {
    if (json_is_string(content)) {
        *out = mn_strndup(json_string_value(content), json_string_length(content));
        return *out ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    if (!json_is_array(content))
        return mn_err_set(err, MN_EINVAL, "input[%zu].content must be a string or an array of text parts", i);
    size_t n = json_array_size(content), total = 0;
    const char *want = is_assistant ? "output_text" : "input_text";
    for (size_t k = 0; k < n; k++) {
        json_t *part = json_array_get(content, k), *type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type))
            return mn_err_set(err, MN_EINVAL, "input[%zu].content[%zu] must be an object with a type", i, k);
        if (strcmp(json_string_value(type), want) != 0)
            return mn_err_set(err, MN_EINVAL, "input[%zu].content[%zu].type \"%.64s\" is not supported (only \"%s\")",
                              i, k, json_string_value(type), want);
        char path[API_PARAM_MAX];
        snprintf(path, sizeof path, "input[%zu].content[%zu].", i, k);
        int rc = check_fields(part, INPUT_PART_FIELDS, NULL, path, err);
        if (rc != MN_OK) return rc;
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(text))
            return mn_err_set(err, MN_EINVAL, "input[%zu].content[%zu].text must be a string", i, k);
        total += json_string_length(text) + (k > 0); /* bounded by the body length */
    }
    return join_texts(content, total, out, err);
}

/* input[i]: a message item. Its role keeps "developer" apart (the input
 * items are listed back as given). */
static int parse_input_item(const json_t *item, size_t i, ChatMsg *out, MnErr *err) {
    static const char *const ROLES[] = {"user", "assistant", "system", "developer"};
    if (!json_is_object(item)) return mn_err_set(err, MN_EINVAL, "input[%zu] must be an object", i);
    json_t *type = member(item, "type");
    if (type != NULL && !(json_is_string(type) && strcmp(json_string_value(type), "message") == 0))
        return mn_err_set(err, MN_EINVAL, "input[%zu].type \"%.64s\" is not supported (only \"message\")", i,
                          json_is_string(type) ? json_string_value(type) : "?");
    char path[API_PARAM_MAX];
    snprintf(path, sizeof path, "input[%zu].", i);
    int rc = check_fields(item, INPUT_ITEM_FIELDS, NULL, path, err);
    if (rc != MN_OK) return rc;
    json_t *role = json_object_get(item, "role");
    const char *r = NULL;
    for (size_t k = 0; json_is_string(role) && k < sizeof ROLES / sizeof *ROLES; k++)
        if (strcmp(json_string_value(role), ROLES[k]) == 0) r = ROLES[k];
    if (r == NULL)
        return mn_err_set(err, MN_EINVAL, "input[%zu].role must be one of user, assistant, system, developer", i);
    char *text = NULL;
    rc = input_content(member(item, "content"), i, r == ROLES[1], &text, err);
    if (rc != MN_OK) return rc;
    out->role = r;
    out->content = text;
    return MN_OK;
}

static int parse_responses_body(const json_t *root, ApiRequest *r, MnErr *err) {
    int rc = check_fields(root, RESPONSES_FIELDS, NULL, "", err);
    if (rc != MN_OK) return rc;
    json_t *input = member(root, "input");
    if (input == NULL) return mn_err_set(err, MN_EINVAL, "input is required");
    if (json_is_string(input)) {
        r->msgs = mn_calloc(1, sizeof *r->msgs);
        char *text = mn_strndup(json_string_value(input), json_string_length(input));
        if (r->msgs == NULL || text == NULL) {
            mn_free(text);
            return mn_err_set(err, MN_ENOMEM, "out of memory");
        }
        r->msgs[0] = (ChatMsg){"user", text};
        r->n_msgs = 1;
    } else if (json_is_array(input) && json_array_size(input) > 0) {
        size_t n = json_array_size(input);
        if ((r->msgs = mn_calloc(n, sizeof *r->msgs)) == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            if ((rc = parse_input_item(json_array_get(input, i), i, &r->msgs[i], err)) != MN_OK) return rc;
            r->n_msgs = i + 1;
        }
    } else {
        return mn_err_set(err, MN_EINVAL, "input must be a string or a non-empty array of message items");
    }
    if ((rc = get_string(root, "instructions", &r->instructions, err)) != MN_OK) return rc;
    if ((rc = get_string(root, "previous_response_id", &r->previous_response_id, err)) != MN_OK) return rc;
    r->is_store = true;
    if ((rc = get_bool(root, "store", &r->is_store, err)) != MN_OK) return rc;
    /* the generation fields, under their Responses names */
    if ((rc = parse_generation(root, r, err)) != MN_OK) return rc;
    int64_t x;
    bool is_set;
    if ((rc = get_int(root, "max_output_tokens", 1, INT64_MAX, "an integer >= 1", &x, &is_set, err)) != MN_OK)
        return rc;
    if (is_set) {
        r->max_tokens = x;
        r->fields_set |= API_SET_MAX_TOKENS;
    }
    return MN_OK;
}

/* ---- completions, tokenize, detokenize ---------------------------------- */

static int copy_text(const json_t *s, ApiRequest *r, MnErr *err) {
    r->text_len = json_string_length(s);
    r->text = mn_strndup(json_string_value(s), r->text_len);
    return r->text ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
}

static int parse_completion_body(const json_t *root, ApiRequest *r, MnErr *err) {
    static const char *const BAD_PROMPT = "prompt must be a string or a non-empty array of token ids";
    int rc = check_fields(root, COMPLETION_FIELDS, GEN_FIELDS, "", err);
    if (rc != MN_OK) return rc;
    json_t *prompt = member(root, "prompt");
    if (prompt == NULL) return mn_err_set(err, MN_EINVAL, "prompt is required");
    if (json_is_string(prompt)) {
        rc = copy_text(prompt, r, err);
        if (rc != MN_OK) return rc;
    } else if (json_is_array(prompt) && json_array_size(prompt) > 0) {
        json_t *first = json_array_get(prompt, 0);
        if (json_is_string(first)) { /* a batch of prompts: only one allowed */
            if (json_array_size(prompt) > 1)
                return mn_err_set(err, MN_EINVAL, "prompt: only one prompt per request is supported");
            rc = copy_text(first, r, err);
            if (rc != MN_OK) return rc;
        } else {
            rc = parse_token_array(prompt, "prompt", r, err);
            if (rc != MN_OK) return rc;
        }
    } else {
        return mn_err_set(err, MN_EINVAL, "%s", BAD_PROMPT);
    }

    return parse_generation(root, r, err); /* echo: check_fields accepts false only */
}

static int parse_tokenize_body(const json_t *root, ApiRequest *r, MnErr *err) {
    json_t *content = member(root, "content");
    if (!json_is_string(content)) return mn_err_set(err, MN_EINVAL, "content must be a string");
    int rc = copy_text(content, r, err);
    if (rc != MN_OK) return rc;
    r->add_special = API_TOKENIZE_ADD_SPECIAL_DEFAULT;
    r->parse_special = API_TOKENIZE_PARSE_SPECIAL_DEFAULT;
    if ((rc = get_bool(root, "add_special", &r->add_special, err)) != MN_OK) return rc;
    if ((rc = get_bool(root, "parse_special", &r->parse_special, err)) != MN_OK) return rc;
    bool is_pieces = false;
    if ((rc = get_bool(root, "with_pieces", &is_pieces, err)) != MN_OK) return rc;
    if (is_pieces) return mn_err_set(err, MN_EINVAL, "with_pieces: not supported");
    return MN_OK;
}

static int parse_detokenize_body(const json_t *root, ApiRequest *r, MnErr *err) {
    json_t *tokens = member(root, "tokens");
    if (!json_is_array(tokens)) return mn_err_set(err, MN_EINVAL, "tokens must be an array of token ids");
    return parse_token_array(tokens, "tokens", r, err);
}

/* ------------------------------------------------------------- public API */

/* The path a field error's message starts with (see the top of the file). */
static void param_of(const char *msg, char *param) {
    size_t n = strcspn(msg, " :");
    if (n >= API_PARAM_MAX) n = 0;
    memcpy(param, msg, n);
    param[n] = '\0';
}

int api_parse_request(ApiRoute route, const char *body, size_t len, ApiRequest *out, MnErr *err, char *param) {
    assert(out != NULL);
    memset(out, 0, sizeof *out);
    if (param) param[0] = '\0';
    out->route = route;
    json_t *root = NULL;
    MnErr local = {0};
    if (err == NULL) err = &local; /* param needs the message */
    int rc = load_object(body, len, &root, err);
    if (rc != MN_OK) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    switch (route) {
    case API_ROUTE_CHAT:
    case API_ROUTE_APPLY_TEMPLATE: rc = parse_chat_body(root, out, err); break;
    case API_ROUTE_COMPLETION: rc = parse_completion_body(root, out, err); break;
    case API_ROUTE_TOKENIZE: rc = parse_tokenize_body(root, out, err); break;
    case API_ROUTE_DETOKENIZE: rc = parse_detokenize_body(root, out, err); break;
    case API_ROUTE_RESPONSES: rc = parse_responses_body(root, out, err); break;
    default: rc = mn_err_set(err, MN_EINVAL, "unknown route %d", (int)route); break;
    }
    json_decref(root);
    if (rc != MN_OK) {
        api_request_deinit(out);
        if (param && rc == MN_EINVAL) param_of(err->msg, param);
    }
    return rc;
}

void api_request_deinit(ApiRequest *r) {
    if (r == NULL) return;
    mn_free(r->model);
    mn_free(r->session_id);
    mn_free(r->instructions);
    mn_free(r->previous_response_id);
    for (size_t i = 0; i < r->n_msgs; i++) mn_free((void *)r->msgs[i].content); /* owned; const for ChatMsg */
    mn_free(r->msgs);
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->template_vars);
    mn_free(r->text);
    mn_free(r->tokens);
    mn_free(r->logit_bias);
    for (size_t i = 0; i < r->n_stop; i++) mn_free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* ============================================================== building */

/* A jansson string of s[0..len), sanitized when it is not valid UTF-8. */
static json_t *jtextn(const char *s, size_t len) { return api_json_text(s, len); }

static json_t *jtext(const char *s) { return jtextn(s, s ? strlen(s) : 0); }

/* Set obj[key] = v, stealing v. False when v is NULL or the set fails
 * (jansson releases v then), so calls chain as `is_ok = is_ok && put(...)`. */
static bool put(json_t *obj, const char *key, json_t *v) { return json_object_set_new(obj, key, v) == 0; }

static bool append(json_t *arr, json_t *v) { return json_array_append_new(arr, v) == 0; }

/* Serialize j compactly into an mn_malloc'd string and release j (j may be
 * NULL after a failed build: then NULL). */
static char *finish_json(json_t *j, bool is_ok) { return api_json_finish(j, is_ok); }

static json_t *finish_reason(ApiFinish f) {
    const char *name = api_finish_name(f);
    return name ? json_string_nocheck(name) : json_null();
}

static json_t *usage_object(const ApiUsage *u) {
    json_t *o = json_object(), *details = json_object(), *tiers = json_object(), *paths = json_object();
    bool is_ok = o && details && tiers && paths;
    for (int i = 0; is_ok && i < RESTORE_PATH_COUNT; i++)
        is_ok = put(paths, engine_restore_path_name(i), json_integer(u->restored_by[i]));
    for (int i = 0; is_ok && i < u->n_tiers && i < API_USAGE_MAX_TIERS; i++) {
        const char *name = u->tiers[i].name ? u->tiers[i].name : "";
        /* object keys must be valid UTF-8 too */
        char *clean = api_utf8_sanitize(name, strlen(name), NULL);
        is_ok = clean && put(tiers, clean, json_integer(u->tiers[i].n_tokens));
        mn_free(clean);
    }
    is_ok = is_ok && put(details, "cached_tokens", json_integer(u->cached_tokens));
    is_ok = is_ok && put(details, "cached_tokens_by_tier", json_incref(tiers));
    is_ok = is_ok && put(details, "restored_by", json_incref(paths));
    is_ok = is_ok && put(details, "recomputed_tokens", json_integer(u->recomputed_tokens));
    is_ok = is_ok && put(details, "truncated_tokens", json_integer(u->truncated_tokens));
    is_ok = is_ok && put(details, "shifted_tokens", json_integer(u->shifted_tokens));
    is_ok = is_ok && put(o, "prompt_tokens", json_integer(u->prompt_tokens));
    is_ok = is_ok && put(o, "completion_tokens", json_integer(u->completion_tokens));
    is_ok = is_ok && put(o, "total_tokens", json_integer(u->prompt_tokens + u->completion_tokens));
    is_ok = is_ok && put(o, "prompt_tokens_details", json_incref(details));
    json_decref(tiers);
    json_decref(paths);
    json_decref(details);
    if (!is_ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* {"id","object","created","model","system_fingerprint"} — the head of every completion object. */
static json_t *meta_object(const ApiMeta *m, const char *object) {
    assert(m != NULL);
    json_t *o = json_object();
    bool is_ok = o != NULL;
    is_ok = is_ok && put(o, "id", jtext(m->id));
    is_ok = is_ok && put(o, "object", json_string_nocheck(object));
    is_ok = is_ok && put(o, "created", json_integer(m->created));
    is_ok = is_ok && put(o, "model", jtext(m->model));
    if (m->system_fingerprint) is_ok = is_ok && put(o, "system_fingerprint", jtext(m->system_fingerprint));
    if (!is_ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- logprobs ------------------------------------------------------------ */

#define API_LOGPROB_FLOOR -9999.0 /* OpenAI writes a probability of (about) 0 so */

static json_t *jlogprob(float x) { return json_real(x < API_LOGPROB_FLOOR ? API_LOGPROB_FLOOR : (double)x); }

/* The bytes of token id (special tokens by their text). */
static const char *token_bytes(const Tokenizer *tok, int32_t id, size_t *len) {
    char buf[8];
    return tok_piece(tok, id, true, buf, len);
}

/* A token's string: its bytes if they are valid UTF-8, else "bytes:\xNN..." */
static json_t *token_string(const char *b, size_t len) {
    if (utf8_is_valid(b, len)) return json_stringn_nocheck(b, len);
    char *s = mn_malloc(6 + 4 * len + 1); /* token pieces are short: no overflow */
    if (s == NULL) return NULL;
    size_t n = (size_t)sprintf(s, "bytes:");
    for (size_t i = 0; i < len; i++) n += (size_t)sprintf(s + n, "\\x%02x", (unsigned char)b[i]);
    json_t *j = json_stringn_nocheck(s, n);
    mn_free(s);
    return j;
}

/* {"token","logprob","bytes":[...]} */
static json_t *chat_token_object(const Tokenizer *tok, const TokenProb *t) {
    size_t len;
    const char *b = token_bytes(tok, t->id, &len);
    json_t *o = json_object(), *bytes = json_array();
    bool is_ok = o && bytes;
    for (size_t i = 0; is_ok && i < len; i++) is_ok = append(bytes, json_integer((unsigned char)b[i]));
    is_ok = is_ok && put(o, "token", token_string(b, len));
    is_ok = is_ok && put(o, "logprob", jlogprob(t->logprob));
    is_ok = is_ok && put(o, "bytes", json_incref(bytes));
    json_decref(bytes);
    if (!is_ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* chat: {"content":[{token..., "top_logprobs":[{token...},...]},...],"refusal":null} */
static json_t *chat_logprobs(const ApiLogprobs *lp) {
    if (lp == NULL) return json_null();
    json_t *o = json_object(), *content = json_array();
    bool is_ok = o && content;
    for (size_t i = 0; is_ok && i < lp->n_tokens; i++) {
        const ReqLogprob *r = &lp->tokens[i];
        json_t *entry = chat_token_object(lp->tok, &r->token), *top = json_array();
        is_ok = entry && top;
        for (int k = 0; is_ok && k < r->n_top; k++) is_ok = append(top, chat_token_object(lp->tok, &r->top[k]));
        is_ok = is_ok && put(entry, "top_logprobs", json_incref(top));
        json_decref(top);
        if (is_ok) is_ok = append(content, entry);
        else json_decref(entry);
    }
    is_ok = is_ok && put(o, "content", json_incref(content));
    is_ok = is_ok && put(o, "refusal", json_null());
    json_decref(content);
    if (!is_ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* {TOKEN: logprob} += t, unless a likelier token of the same string is there. */
static bool top_add(json_t *dict, const Tokenizer *tok, const TokenProb *t) {
    size_t len;
    const char *b = token_bytes(tok, t->id, &len);
    json_t *key = token_string(b, len);
    if (key == NULL) return false;
    bool is_ok = true;
    json_t *have = json_object_getn(dict, json_string_value(key), json_string_length(key));
    if (have == NULL || json_real_value(have) < t->logprob)
        is_ok = json_object_setn_new_nocheck(dict, json_string_value(key), json_string_length(key), jlogprob(t->logprob)) == 0;
    json_decref(key);
    return is_ok;
}

/* completions (legacy): {"tokens","token_logprobs","top_logprobs","text_offset"} */
static json_t *text_logprobs(const ApiLogprobs *lp) {
    if (lp == NULL) return json_null();
    json_t *o = json_object(), *tokens = json_array(), *values = json_array(), *tops = json_array(),
           *offsets = json_array();
    bool is_ok = o && tokens && values && tops && offsets;
    for (size_t i = 0; is_ok && i < lp->n_tokens; i++) {
        const ReqLogprob *r = &lp->tokens[i];
        size_t len;
        const char *b = token_bytes(lp->tok, r->token.id, &len);
        is_ok = append(tokens, token_string(b, len));
        is_ok = is_ok && append(values, jlogprob(r->token.logprob));
        is_ok = is_ok && append(offsets, json_integer(r->text_offset));
        json_t *dict = json_object();
        is_ok = is_ok && dict != NULL;
        for (int k = 0; is_ok && k < r->n_top; k++) is_ok = top_add(dict, lp->tok, &r->top[k]);
        is_ok = is_ok && top_add(dict, lp->tok, &r->token);
        if (is_ok) is_ok = append(tops, dict);
        else json_decref(dict);
    }
    is_ok = is_ok && put(o, "tokens", json_incref(tokens));
    is_ok = is_ok && put(o, "token_logprobs", json_incref(values));
    is_ok = is_ok && put(o, "top_logprobs", json_incref(tops));
    is_ok = is_ok && put(o, "text_offset", json_incref(offsets));
    json_decref(tokens);
    json_decref(values);
    json_decref(tops);
    json_decref(offsets);
    if (!is_ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Complete a completion object: "choices":[choice] and, if usage, "usage".
 * Steals choice. */
static char *finish_completion(json_t *o, json_t *choice, const ApiUsage *usage) {
    json_t *choices = json_array();
    bool is_ok = o && choices && append(choices, choice);
    if (!(o && choices)) json_decref(choice);
    is_ok = is_ok && put(o, "choices", json_incref(choices));
    json_decref(choices);
    if (usage) is_ok = is_ok && put(o, "usage", usage_object(usage));
    return finish_json(o, is_ok);
}

/* ------------------------------------------------------------- public API */

const char *api_finish_name(ApiFinish f) {
    switch (f) {
    case API_FINISH_STOP: return "stop";
    case API_FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

int api_usage_add_tier(ApiUsage *u, const char *name, int64_t n_tokens) {
    assert(u != NULL);
    if (u->n_tiers < 0 || u->n_tiers >= API_USAGE_MAX_TIERS) return MN_EFULL;
    u->tiers[u->n_tiers].name = name;
    u->tiers[u->n_tiers].n_tokens = n_tokens;
    u->n_tiers++;
    return MN_OK;
}

char *api_chat_completion_json(const ApiMeta *m, const char *content, ApiFinish finish,
                               const ApiUsage *usage, const ApiLogprobs *lp) {
    json_t *choice = json_object(), *message = json_object();
    bool is_ok = choice && message;
    is_ok = is_ok && put(message, "role", json_string_nocheck("assistant"));
    is_ok = is_ok && put(message, "content", jtext(content));
    is_ok = is_ok && put(choice, "index", json_integer(0));
    is_ok = is_ok && put(choice, "message", json_incref(message));
    is_ok = is_ok && put(choice, "logprobs", chat_logprobs(lp));
    is_ok = is_ok && put(choice, "finish_reason", finish_reason(finish));
    json_decref(message);
    if (!is_ok) {
        json_decref(choice);
        return NULL;
    }
    return finish_completion(meta_object(m, "chat.completion"), choice, usage);
}

char *api_chat_chunk_json(const ApiMeta *m, bool with_role, const char *content, ApiFinish finish,
                          const ApiLogprobs *lp) {
    json_t *choice = json_object(), *delta = json_object();
    bool is_ok = choice && delta;
    if (with_role) is_ok = is_ok && put(delta, "role", json_string_nocheck("assistant"));
    if (content) is_ok = is_ok && put(delta, "content", jtext(content));
    is_ok = is_ok && put(choice, "index", json_integer(0));
    is_ok = is_ok && put(choice, "delta", json_incref(delta));
    is_ok = is_ok && put(choice, "logprobs", chat_logprobs(lp));
    is_ok = is_ok && put(choice, "finish_reason", finish_reason(finish));
    json_decref(delta);
    if (!is_ok) {
        json_decref(choice);
        return NULL;
    }
    return finish_completion(meta_object(m, "chat.completion.chunk"), choice, NULL);
}

/* A text_completion choice. */
static json_t *text_choice(const char *text, ApiFinish finish, const ApiLogprobs *lp) {
    json_t *choice = json_object();
    bool is_ok = choice != NULL;
    is_ok = is_ok && put(choice, "text", jtext(text));
    is_ok = is_ok && put(choice, "index", json_integer(0));
    is_ok = is_ok && put(choice, "logprobs", text_logprobs(lp));
    is_ok = is_ok && put(choice, "finish_reason", finish_reason(finish));
    if (!is_ok) {
        json_decref(choice);
        return NULL;
    }
    return choice;
}

char *api_text_completion_json(const ApiMeta *m, const char *text, ApiFinish finish,
                               const ApiUsage *usage, const ApiLogprobs *lp) {
    json_t *choice = text_choice(text, finish, lp);
    if (choice == NULL) return NULL;
    return finish_completion(meta_object(m, "text_completion"), choice, usage);
}

char *api_text_chunk_json(const ApiMeta *m, const char *text, ApiFinish finish, const ApiLogprobs *lp) {
    json_t *choice = text_choice(text, finish, lp);
    if (choice == NULL) return NULL;
    return finish_completion(meta_object(m, "text_completion"), choice, NULL);
}

char *api_usage_chunk_json(const ApiMeta *m, bool is_chat, const ApiUsage *usage) {
    assert(usage != NULL);
    json_t *o = meta_object(m, is_chat ? "chat.completion.chunk" : "text_completion");
    bool is_ok = o != NULL;
    is_ok = is_ok && put(o, "choices", json_array());
    is_ok = is_ok && put(o, "usage", usage_object(usage));
    return finish_json(o, is_ok);
}

int api_http_status(int code) {
    switch (code) {
    case MN_OK: return 200;
    case MN_EINVAL:
    case MN_EFORMAT:
    case MN_ERANGE:
    case MN_EUNSUPPORTED: return 400;
    case MN_ENOTFOUND: return 404;
    case MN_EBUSY:
    case MN_EFULL:
    case MN_ECANCELED: return 503; /* the engine is shutting down */
    default: return 500;
    }
}

static json_t *model_object(const char *name, int64_t created) {
    json_t *model = json_object();
    bool is_ok = model != NULL;
    is_ok = is_ok && put(model, "id", jtext(name));
    is_ok = is_ok && put(model, "object", json_string_nocheck("model"));
    is_ok = is_ok && put(model, "created", json_integer(created));
    is_ok = is_ok && put(model, "owned_by", json_string_nocheck("mnemo"));
    if (!is_ok) {
        json_decref(model);
        return NULL;
    }
    return model;
}

char *api_models_json(const char *const *names, size_t n_names, int64_t created) {
    assert(names != NULL || n_names == 0);
    json_t *o = json_object(), *data = json_array();
    bool is_ok = o && data;
    for (size_t i = 0; is_ok && i < n_names; i++) is_ok = append(data, model_object(names[i], created));
    is_ok = is_ok && put(o, "object", json_string_nocheck("list"));
    is_ok = is_ok && put(o, "data", json_incref(data));
    json_decref(data);
    return finish_json(o, is_ok);
}

char *api_model_json(const char *name, int64_t created) {
    json_t *o = model_object(name, created);
    return finish_json(o, o != NULL);
}

char *api_tokenize_json(const int32_t *tokens, size_t n_tokens) {
    assert(tokens != NULL || n_tokens == 0);
    json_t *o = json_object(), *arr = json_array();
    bool is_ok = o && arr;
    for (size_t i = 0; is_ok && i < n_tokens; i++) is_ok = append(arr, json_integer(tokens[i]));
    is_ok = is_ok && put(o, "tokens", json_incref(arr));
    json_decref(arr);
    return finish_json(o, is_ok);
}

/* {key: text[0..len)} */
static char *text_object_json(const char *key, const char *text, size_t len) {
    assert(text != NULL || len == 0);
    json_t *o = json_object();
    bool is_ok = o && put(o, key, jtextn(text, len));
    return finish_json(o, is_ok);
}

char *api_detokenize_json(const char *text, size_t len) { return text_object_json("content", text, len); }

char *api_apply_template_json(const char *text, size_t len) { return text_object_json("prompt", text, len); }

size_t api_sse_emit(const char *out, size_t len, size_t *off, char *buf, size_t max) {
    static const char ping[] = ": ping\n\n";
    if (*off >= len) {
        size_t n = sizeof ping - 1 < max ? sizeof ping - 1 : max;
        memcpy(buf, ping, n);
        return n;
    }
    size_t n = len - *off < max ? len - *off : max;
    memcpy(buf, out + *off, n);
    *off += n;
    return n;
}
