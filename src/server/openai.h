/* openai.h — the OpenAI-compatible wire format: request parsing and
 * validation, response and error building. Pure functions, no I/O, no
 * locks; safe from any thread.
 *
 * Parsing: api_parse_* take the raw request body, check every field the
 * server understands and fill an ApiRequest that owns copies of everything
 * it holds. Chat and completion requests are checked member by member, as
 * OpenAI does: a field mnemo does not know is refused, and so is one it
 * knows but does not implement (response_format, tool_choice "required",
 * ...) unless it holds the value that asks for nothing (docs/API.md lists
 * them), so no field is ever silently ignored. /apply-template takes a
 * chat body, checked the same way. /tokenize and /detokenize (llama.cpp's
 * routes) ignore unknown fields, as llama.cpp does. A field set to JSON
 * null counts as absent. Failures return MN_EINVAL with a message in err
 * that names the offending field ("messages[2].content must be a string or
 * an array of text parts"), meant for an HTTP 400, and that field's path
 * in param (OpenAI's "param"); MN_ENOMEM on allocation failure. On any
 * failure the ApiRequest is left zeroed (nothing to free).
 *
 * Building: the api_*_json builders return a NUL-terminated compact JSON
 * text allocated with mn_malloc (free with mn_free), or NULL when memory
 * runs out. Every string argument is borrowed for the call and may hold
 * invalid UTF-8: the builders are the one place text is made valid — each
 * passes its strings through api_utf8_sanitize — so callers hand them the
 * engine's bytes as they come, and a streamed answer and the same answer
 * sent whole carry identical text. The error object, the sanitizer and
 * the serializer the builders share are server/api_base's (included here).
 */
#ifndef MN_OPENAI_H
#define MN_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"
#include "server/api_base.h"
#include "engine/sampler.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

/* ============================================================== requests */

#define API_MAX_STOP 4 /* OpenAI's limit on stop sequences */
#define API_MAX_TOP_LOGPROBS ENGINE_MAX_TOP_LOGPROBS /* OpenAI's limit on top_logprobs */
#define API_MAX_LOGIT_BIAS 100.0 /* |bias| at most, as OpenAI has it */
#define API_PARAM_MAX 64 /* bytes of a failed field's path, NUL included */

/* /tokenize defaults, as llama.cpp's server has them. */
#define API_TOKENIZE_ADD_SPECIAL_DEFAULT false
#define API_TOKENIZE_PARSE_SPECIAL_DEFAULT true

typedef enum ApiRoute {
    API_ROUTE_CHAT,       /* POST /v1/chat/completions */
    API_ROUTE_COMPLETION, /* POST /v1/completions */
    API_ROUTE_TOKENIZE,   /* POST /tokenize */
    API_ROUTE_DETOKENIZE, /* POST /detokenize */
    API_ROUTE_MODELS,     /* GET /v1/models: no body (api_parse_request refuses it) */
    API_ROUTE_RESPONSES,  /* POST /v1/responses (server/responses) */
    API_ROUTE_APPLY_TEMPLATE, /* POST /apply-template: a chat body, rendered only */
} ApiRoute;

/* Bits of ApiRequest.fields_set: which optional fields the client gave
 * (with a non-null value). Unset fields hold the defaults listed below. */
enum {
    API_SET_TEMPERATURE = 1u << 0,
    API_SET_TOP_P = 1u << 1,
    API_SET_TOP_K = 1u << 2,
    API_SET_MIN_P = 1u << 3,
    API_SET_SEED = 1u << 4,
    API_SET_PRESENCE_PENALTY = 1u << 5,
    API_SET_FREQUENCY_PENALTY = 1u << 6,
    API_SET_REPEAT_PENALTY = 1u << 7,
    API_SET_MAX_TOKENS = 1u << 8, /* max_tokens or max_completion_tokens */
    API_SET_STOP = 1u << 9,
};

/* One parsed request of any route. Fields a route does not use stay zero.
 * Everything pointed to is owned by the request and released by
 * api_request_deinit. */
typedef struct ApiRequest {
    ApiRoute route;
    char *model;      /* chat, completion: the client's "model", "" if absent (mnemo
                         serves one model: it answers whatever the name) */
    char *session_id; /* chat, completion: NULL if absent */

    /* chat, apply-template: the conversation, ready for the chat format
     * (model/chat_format.h's ChatInput). messages is an array of >= 1
     * objects {"role", "content"}: role "system", "user" or "assistant"
     * ("developer" arrives as "system"), content a string, the client's
     * array of text parts ({"type": "text", "text"}) as sent, or "" for a
     * null assistant content. tools is the client's array of tool
     * definitions (objects), template_vars its "chat_template_kwargs"
     * object (both NULL when absent). All three are owned references. */
    json_t *messages;
    json_t *tools;
    json_t *template_vars;
    bool add_generation_prompt; /* "add_generation_prompt", default true */

    /* responses: the input items, n_msgs >= 1: role as given, content owned
     * (never NULL; text parts joined with "\n"). */
    ChatMsg *msgs;
    size_t n_msgs;

    /* responses: "input" is in msgs (a string is one user message; roles
     * are "user", "assistant", "system" or "developer" as given), and the
     * generation fields as in chat ("max_output_tokens" is max_tokens;
     * only temperature, top_p and seed are taken). instructions and
     * previous_response_id are NULL when absent; is_store defaults to true. */
    char *instructions;
    char *previous_response_id;
    bool is_store;

    /* completion: the prompt as text (text != NULL) or as token ids
     * (tokens != NULL, n_tokens >= 1) — exactly one of the two.
     * tokenize: text is the content to tokenize.
     * detokenize: tokens[0..n_tokens) are the ids (each >= 0; n_tokens may
     * be 0, and then tokens may be NULL). */
    char *text;
    size_t text_len;
    int32_t *tokens;
    size_t n_tokens;

    /* tokenize */
    bool add_special;   /* default API_TOKENIZE_ADD_SPECIAL_DEFAULT */
    bool parse_special; /* default API_TOKENIZE_PARSE_SPECIAL_DEFAULT */

    /* chat, completion: generation. sampler holds OpenAI's defaults for
     * what the client left unset: temperature 1, top_p 1, top_k 0 (off),
     * min_p 0 (off), presence/frequency penalty 0, repeat_penalty 1 (off),
     * repeat_last_n from sampler_params_default, seed 0 (meaningful only
     * with API_SET_SEED; a negative client seed is taken modulo 2^64).
     * sampler.logit_bias points into logit_bias below. */
    SamplerParams sampler;
    uint32_t fields_set;          /* API_SET_* bits */
    int64_t max_tokens;           /* >= 1, or -1 when unset (no upper bound here: the
                                     engine knows the context and the pool) */
    SamplerBias *logit_bias;      /* (n_logit_bias) "logit_bias": ids >= 0 (the engine
                                     checks them against the vocabulary), biases in
                                     [-100, 100] */
    size_t n_logit_bias;
    bool is_logprobs;             /* chat "logprobs": true; completion "logprobs" given */
    int32_t top_logprobs;         /* chat "top_logprobs", completion "logprobs":
                                     0..API_MAX_TOP_LOGPROBS alternatives per token */
    char *stop[API_MAX_STOP];     /* non-empty strings, stop[0..n_stop) */
    size_t n_stop;
    bool is_stream;               /* "stream" */
    bool include_usage;           /* "stream_options": {"include_usage"} */
    bool ignore_eos;              /* extension */
} ApiRequest;

/* Parse and validate a request body (body[0..len), need not be
 * NUL-terminated) for route into *out (overwritten; the caller does not
 * initialize it). MN_OK, MN_EINVAL (err names the field, or says the body is
 * not valid JSON / not an object) or MN_ENOMEM; on failure *out is zeroed.
 * param (API_PARAM_MAX bytes; may be NULL) gets the path of the field at
 * fault ("logit_bias", "messages[2].content"), or "" when the message is
 * about the body as a whole (and on success). */
int api_parse_request(ApiRoute route, const char *body, size_t len, ApiRequest *out, MnErr *err, char *param);

/* Release what r owns and zero it. Fine on a zeroed or already released
 * request and on NULL. */
void api_request_deinit(ApiRequest *r);

/* ============================================================= responses */

typedef enum ApiFinish {
    API_FINISH_NONE,   /* still running: finish_reason null */
    API_FINISH_STOP,   /* "stop": EOS or a stop sequence */
    API_FINISH_LENGTH, /* "length": max_tokens or the context ran out */
} ApiFinish;

/* "stop", "length", or NULL for API_FINISH_NONE (and out of range). */
const char *api_finish_name(ApiFinish f);

/* What every completion object and chunk repeats. Strings borrowed. */
typedef struct ApiMeta {
    const char *id;    /* "chatcmpl-..." / "cmpl-...", the caller's choice */
    const char *model; /* the model that answers */
    int64_t created;   /* Unix seconds */
    const char *system_fingerprint; /* NULL: no "system_fingerprint" member */
} ApiMeta;

/* The logprobs of a choice (or of one chunk's tokens): the engine's records,
 * their token ids rendered with tok (special tokens by their text). Token
 * strings are the token's bytes when they are valid UTF-8, else
 * "bytes:\xNN..." (OpenAI's form for part of a character); a logprob
 * below -9999 is written -9999 (OpenAI's floor). Borrowed for the call. */
typedef struct ApiLogprobs {
    const Tokenizer *tok;
    const ReqLogprob *tokens; /* (n_tokens) */
    size_t n_tokens;
} ApiLogprobs;

#define API_USAGE_MAX_TIERS 4

/* Cached prompt tokens found in one cache tier ("pool", "ram", "disk"). */
typedef struct ApiUsageTier {
    const char *name; /* borrowed; a static string in practice */
    int64_t n_tokens;
} ApiUsageTier;

/* Token accounting. total_tokens is computed as prompt + completion.
 * Rendered as
 *   {"prompt_tokens","completion_tokens","total_tokens",
 *    "prompt_tokens_details":{"cached_tokens",
 *        "cached_tokens_by_tier":{NAME:n,...},   (only the tiers given)
 *        "restored_by":{"kv","hidden","recompute"},
 *        "recomputed_tokens","truncated_tokens","shifted_tokens"}} */
typedef struct ApiUsage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t cached_tokens;     /* prompt tokens not computed for this request */
    int64_t recomputed_tokens; /* prompt tokens computed again after eviction */
    int64_t truncated_tokens;  /* prompt tokens dropped to fit the context (chat only; else 0) */
    int64_t shifted_tokens;    /* cached tokens whose KV was moved to new positions (context overflow, shift) */
    int64_t restored_by[RESTORE_PATH_COUNT]; /* ReqResult.n_restored_by */
    ApiUsageTier tiers[API_USAGE_MAX_TIERS];
    int n_tiers;
} ApiUsage;

/* Append (name, n_tokens) to u's tiers. MN_OK, or MN_EFULL when
 * API_USAGE_MAX_TIERS are already there. name is borrowed for as long as u
 * is used. */
int api_usage_add_tier(ApiUsage *u, const char *name, int64_t n_tokens);

/* {"id","object":"chat.completion","created","model","system_fingerprint",
 *  "choices":[{"index":0,"message":{"role":"assistant","content"},
 *  "logprobs","finish_reason"}],"usage"}. usage NULL: no "usage" member.
 * logprobs: lp NULL gives null, else {"content":[{"token","logprob",
 * "bytes":[...],"top_logprobs":[{"token","logprob","bytes"},...]},...],
 * "refusal":null}, one entry per record, top_logprobs its n_top. */
char *api_chat_completion_json(const ApiMeta *m, const char *content, ApiFinish finish,
                               const ApiUsage *usage, const ApiLogprobs *lp);

/* One SSE payload: {"id","object":"chat.completion.chunk","created","model",
 * "system_fingerprint","choices":[{"index":0,"delta":{...},"logprobs",
 * "finish_reason"}]}. The delta holds "role":"assistant" when with_role (the
 * first chunk) and "content" when content is not NULL; the last chunk passes
 * content NULL and a finish reason, giving "delta":{}. logprobs as in
 * api_chat_completion_json, for this chunk's tokens. */
char *api_chat_chunk_json(const ApiMeta *m, bool with_role, const char *content, ApiFinish finish,
                          const ApiLogprobs *lp);

/* Hand a stream's next bytes to the HTTP library: out[*off..len) into buf,
 * at most max bytes, advancing *off; with nothing pending (len == *off) an
 * SSE comment ": ping", which keeps the connection open while the engine
 * works. Returns the bytes written (at least 1 when max > 0). */
size_t api_sse_emit(const char *out, size_t len, size_t *off, char *buf, size_t max);

/* {"id","object":"text_completion","created","model","system_fingerprint",
 *  "choices":[{"text","index":0,"logprobs","finish_reason"}],"usage"}.
 * usage may be NULL. logprobs: lp NULL gives null, else the legacy form
 * {"tokens":[...],"token_logprobs":[...],"top_logprobs":[{TOKEN:logprob,...},
 * ...],"text_offset":[...]}: each top_logprobs object holds the record's
 * n_top alternatives and the generated token itself (so up to n_top + 1, as
 * OpenAI documents; of tokens with the same string, the likelier is kept);
 * text_offset is the record's (code points into the choice's text). */
char *api_text_completion_json(const ApiMeta *m, const char *text, ApiFinish finish,
                               const ApiUsage *usage, const ApiLogprobs *lp);

/* The streamed form of the above: the same object with one piece of text
 * (NULL means "") and no "usage"; logprobs of this piece's tokens. */
char *api_text_chunk_json(const ApiMeta *m, const char *text, ApiFinish finish, const ApiLogprobs *lp);

/* The usage-only chunk sent last when stream_options.include_usage:
 * {"id","object":"chat.completion.chunk" (is_chat) or "text_completion",
 *  "created","model","choices":[],"usage"}. */
char *api_usage_chunk_json(const ApiMeta *m, bool is_chat, const ApiUsage *usage);

/* The HTTP status for an MN_* code from parsing or serving: MN_EINVAL,
 * MN_EFORMAT, MN_ERANGE, MN_EUNSUPPORTED 400; MN_ENOTFOUND 404; MN_EBUSY,
 * MN_EFULL, MN_ECANCELED (shutting down) 503; MN_OK 200; anything else
 * (MN_ENOMEM included) 500. */
int api_http_status(int code);

/* {"object":"list","data":[{"id":NAME,"object":"model","created",
 *  "owned_by":"mnemo"},...]} for names[0..n_names). */
char *api_models_json(const char *const *names, size_t n_names, int64_t created);

/* One entry of that list: {"id":name,"object":"model","created","owned_by":"mnemo"}
 * (GET /v1/models/{id}). */
char *api_model_json(const char *name, int64_t created);

/* {"tokens":[...]} for tokens[0..n_tokens) (tokens may be NULL if 0). */
char *api_tokenize_json(const int32_t *tokens, size_t n_tokens);

/* {"content":TEXT} for text[0..len) (may hold NUL bytes: written \u0000). */
char *api_detokenize_json(const char *text, size_t len);

/* {"prompt":TEXT} for text[0..len) (may hold NUL bytes: written \u0000):
 * the answer of /apply-template. */
char *api_apply_template_json(const char *text, size_t len);

#endif
