/* client.c — streaming chat client over libcurl (see client.h).
 *
 * The response body goes through an SSE parser (bench/sse.c) as it
 * arrives, so an event may be cut anywhere by the network and lines may
 * end in LF, CRLF or CR. Each event's data is parsed as JSON (jansson).
 * One parser reads both APIs' streams, told apart by the event's type:
 * chat completions send unnamed events ("message") whose
 * choices[0].delta.content goes to the callback, a usage object, and
 * "[DONE]" at the end; the Responses API names its events
 * (response.created and response.completed/incomplete carry the response
 * object, with its id and usage, and end the stream;
 * response.output_text.delta carries the text). An error (an `error`
 * event, a chunk with an "error" member as llama-server and OpenAI send
 * one mid-stream, or response.failed) is kept as the server's message,
 * which no later transport failure overwrites. A non-SSE body (an error
 * object with a non-200 status) is kept whole for the error message and
 * its code. Timeouts and the cancel flag (client_set_timeouts,
 * client_set_cancel) are set again on every request, since each one
 * starts with curl_easy_reset.
 */
#include "bench/client.h"

#include <curl/curl.h>
#include <jansson.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/mem.h"
#include "bench/sse.h"

struct ChatClient {
    CURL *curl;
    char *base_url;
    char *auth;
    long connect_ms, idle_s; /* 0: no limit */
    const atomic_int *cancel; /* NULL: never */
};

/* ---- API names ------------------------------------------------------------------ */

static const char *const API_NAMES[CLIENT_API__COUNT] = {"chat", "responses"};

const char *client_api_name(ClientApi api) { return (unsigned)api < CLIENT_API__COUNT ? API_NAMES[api] : NULL; }

int client_api_parse(const char *name, ClientApi *api) {
    for (int i = 0; i < CLIENT_API__COUNT; i++)
        if (strcmp(name, API_NAMES[i]) == 0) {
            *api = (ClientApi)i;
            return MN_OK;
        }
    return MN_EINVAL;
}

/* ---- the client ------------------------------------------------------------------- */

int client_global_init(void) { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? MN_OK : MN_EIO; }

void client_global_deinit(void) { curl_global_cleanup(); }

int client_new(const char *base_url, const char *api_key, ChatClient **out) {
    *out = NULL;
    ChatClient *c = mn_calloc(1, sizeof *c);
    if (c == NULL) return MN_ENOMEM;
    c->curl = curl_easy_init();
    c->base_url = mn_strdup(base_url);
    if (api_key) {
        size_t n = strlen(api_key) + 32;
        c->auth = mn_malloc(n);
        if (c->auth) snprintf(c->auth, n, "Authorization: Bearer %s", api_key);
    }
    if (!c->curl || !c->base_url || (api_key && !c->auth)) {
        client_free(c);
        return MN_ENOMEM;
    }
    size_t n = strlen(c->base_url);
    while (n > 0 && c->base_url[n - 1] == '/') c->base_url[--n] = '\0';
    *out = c;
    return MN_OK;
}

void client_set_timeouts(ChatClient *c, double connect_s, double idle_s) {
    c->connect_ms = connect_s > 0 ? (long)(connect_s * 1000 + 0.5) : 0;
    c->idle_s = idle_s > 0 ? (long)(idle_s + 0.999) : 0;
}

void client_set_cancel(ChatClient *c, const atomic_int *flag) { c->cancel = flag; }

static int on_progress(void *ctx, curl_off_t dl_total, curl_off_t dl_now, curl_off_t ul_total, curl_off_t ul_now) {
    const atomic_int *cancel = ctx;
    return atomic_load(cancel) ? 1 : 0;
}

/* Options every request shares, after curl_easy_reset. */
static void set_common(ChatClient *c, CURL *h) {
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (c->cancel) {
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, (void *)c->cancel);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    }
    if (c->connect_ms > 0) curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->connect_ms);
    if (c->idle_s > 0) { /* less than 1 byte/s for idle_s seconds aborts */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, c->idle_s);
    }
}

void client_free(ChatClient *c) {
    if (c == NULL) return;
    if (c->curl) curl_easy_cleanup(c->curl);
    mn_free(c->base_url);
    mn_free(c->auth);
    mn_free(c);
}

typedef struct Stream {
    ClientResult *res;
    ClientDeltaFn fn;
    void *ctx;
    double t0;
    SseParser sse;
    char *content;
    size_t n_content, cap_content;
    char *raw;       /* first bytes of the body, for a non-SSE error answer */
    size_t n_raw;
    bool is_done, is_oom;
} Stream;

/* usage's cached_tokens_by_tier object -> t (see ClientTierTokens). */
static void parse_tiers(json_t *obj, ClientTierTokens *t) {
    t->n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) { /* a NULL or non-object obj has no members */
        if (t->n == CLIENT_MAX_TIERS) break;
        if (!json_is_integer(v) || strlen(key) >= sizeof t->name[0]) continue;
        snprintf(t->name[t->n], sizeof t->name[0], "%s", key);
        t->tokens[t->n++] = (long)json_integer_value(v);
    }
}

/* Chat's usage (prompt_/completion_tokens, prompt_tokens_details) or the
 * Responses API's (input_/output_tokens, input_tokens_details). */
static void on_usage(Stream *s, json_t *u) {
    bool is_responses = json_object_get(u, "input_tokens") != NULL;
    s->res->prompt_tokens = (long)json_integer_value(json_object_get(u, is_responses ? "input_tokens" : "prompt_tokens"));
    s->res->completion_tokens =
        (long)json_integer_value(json_object_get(u, is_responses ? "output_tokens" : "completion_tokens"));
    json_t *details = json_object_get(u, is_responses ? "input_tokens_details" : "prompt_tokens_details");
    json_t *cached = json_object_get(details, "cached_tokens");
    if (json_is_integer(cached)) s->res->cached_tokens = (long)json_integer_value(cached);
    json_t *recomputed = json_object_get(details, "recomputed_tokens");
    if (!json_is_integer(recomputed)) recomputed = json_object_get(u, "recomputed_tokens");
    if (json_is_integer(recomputed)) s->res->recomputed_tokens = (long)json_integer_value(recomputed);
    json_t *truncated = json_object_get(details, "truncated_tokens"), *shifted = json_object_get(details, "shifted_tokens");
    if (json_is_integer(truncated)) s->res->truncated_tokens = (long)json_integer_value(truncated);
    if (json_is_integer(shifted)) s->res->shifted_tokens = (long)json_integer_value(shifted);
    parse_tiers(json_object_get(details, "cached_tokens_by_tier"), &s->res->cached_by_tier);
}

static void on_text(Stream *s, const char *text, size_t len) {
    if (s->res->ttft_s < 0) s->res->ttft_s = mn_now() - s->t0;
    s->res->n_deltas++;
    if (mn_reserve(&s->content, &s->cap_content, s->n_content + len + 1) != MN_OK) s->is_oom = true;
    else {
        memcpy(s->content + s->n_content, text, len);
        s->n_content += len;
        s->content[s->n_content] = '\0';
    }
    if (s->fn) s->fn(s->ctx, text, len);
}

/* The server's error event: err is the error value (an object with a
 * message, or a string; NULL when the data was not JSON), data the event's
 * text. The first one is kept. */
static void on_server_error(Stream *s, json_t *err, const char *data, size_t len) {
    if (s->res->is_server_error) return;
    s->res->is_server_error = true;
    const char *msg = json_is_string(err) ? json_string_value(err) : json_string_value(json_object_get(err, "message"));
    if (msg && msg[0]) snprintf(s->res->error, sizeof s->res->error, "%s", msg);
    else snprintf(s->res->error, sizeof s->res->error, "%.*s", (int)(len < 255 ? len : 255), data);
}

/* A Responses API event (type "response.*"): the response object's id
 * and usage, the text's deltas, the end of the stream or its failure. */
static void on_response_event(Stream *s, const char *type, json_t *j) {
    json_t *resp = json_object_get(j, "response");
    const char *id = json_string_value(json_object_get(resp, "id"));
    if (id && strlen(id) < sizeof s->res->response_id) snprintf(s->res->response_id, sizeof s->res->response_id, "%s", id);
    if (strcmp(type, "response.output_text.delta") == 0) {
        const char *text = json_string_value(json_object_get(j, "delta"));
        if (text && text[0]) on_text(s, text, strlen(text));
    } else if (strcmp(type, "response.completed") == 0 || strcmp(type, "response.incomplete") == 0) {
        json_t *u = json_object_get(resp, "usage");
        if (json_is_object(u)) on_usage(s, u);
        s->is_done = true;
    } else if (strcmp(type, "response.failed") == 0) {
        json_t *err = json_object_get(resp, "error");
        on_server_error(s, json_is_null(err) || err == NULL ? j : err, "response.failed", 15);
    }
}

/* One SSE event: a chunk of the reply (content delta, usage, or an error
 * object as OpenAI and llama-server send it), an `error` event, [DONE], or
 * a Responses API event. */
static void on_event(void *ctx, const char *type, const char *data, size_t len) {
    Stream *s = ctx;
    bool is_error_event = strcmp(type, "error") == 0;
    if (!is_error_event && len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        s->is_done = true;
        return;
    }
    json_t *j = json_loadb(data, len, 0, NULL);
    if (strncmp(type, "response.", 9) == 0) {
        if (j) on_response_event(s, type, j);
        json_decref(j);
        return;
    }
    json_t *err = json_object_get(j, "error");
    if (err != NULL && !json_is_null(err)) on_server_error(s, err, data, len);
    else if (is_error_event) on_server_error(s, j, data, len);
    if (j == NULL) return;
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(json_object_get(choice, "delta"), "content"));
    if (text == NULL) text = json_string_value(json_object_get(choice, "text"));
    if (text && text[0]) on_text(s, text, strlen(text));
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) on_usage(s, u);
    json_decref(j);
}

static size_t on_body(char *p, size_t sz, size_t n, void *ctx) {
    Stream *s = ctx;
    size_t len = sz * n;
    if (s->n_raw < 4096) { /* keep the start for error messages */
        size_t k = len < 4096 - s->n_raw ? len : 4096 - s->n_raw;
        memcpy(s->raw + s->n_raw, p, k);
        s->n_raw += k;
        s->raw[s->n_raw] = '\0';
    }
    if (sse_feed(&s->sse, p, len) != MN_OK) {
        s->is_oom = true;
        return 0;
    }
    return len;
}

static json_t *messages_of(const ClientMsg *msgs, size_t n) {
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:s,s:s}", "role", msgs[i].role, "content", msgs[i].content));
    return arr;
}

/* The generation fields both APIs share; max_tokens under its API's name. */
static void put_params(json_t *req, const ClientParams *p, const char *max_tokens_name) {
    json_object_set_new(req, "model", json_string(p && p->model ? p->model : "mnemo"));
    json_object_set_new(req, "stream", json_true());
    if (p && p->max_tokens > 0) json_object_set_new(req, max_tokens_name, json_integer(p->max_tokens));
    if (p && p->temperature >= 0) json_object_set_new(req, "temperature", json_real(p->temperature));
    if (p && p->ignore_eos) json_object_set_new(req, "ignore_eos", json_true());
    if (p && p->seed >= 0) json_object_set_new(req, "seed", json_integer(p->seed));
}

/* req's JSON (mn_free), consuming req; NULL when out of memory. */
static char *dump_request(json_t *req) {
    char *s = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    return s;
}

/* POST body (a JSON request for a stream, taken: freed here) to path and
 * read the stream (see client_chat); last_event names the event that ends
 * it, for the message when it does not come. */
static int stream_post(ChatClient *c, const char *path, char *body, const char *last_event, ClientDeltaFn fn,
                       void *ctx, ClientResult *res) {
    memset(res, 0, sizeof *res);
    res->prompt_tokens = res->cached_tokens = res->completion_tokens = res->recomputed_tokens = -1;
    res->truncated_tokens = res->shifted_tokens = -1;
    res->ttft_s = -1;
    char url[1024];
    snprintf(url, sizeof url, "%s%s", c->base_url, path);
    Stream s = {.res = res, .fn = fn, .ctx = ctx};
    s.raw = mn_malloc(4097);
    if (body == NULL || s.raw == NULL) {
        mn_free(body);
        mn_free(s.raw);
        return MN_ENOMEM;
    }
    res->request_bytes = (long)strlen(body);
    s.raw[0] = '\0';
    sse_init(&s.sse, on_event, &s);
    struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
    if (c->auth) hs = curl_slist_append(hs, c->auth);
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    set_common(c, h);
    s.t0 = mn_now();
    CURLcode rc = curl_easy_perform(h);
    res->total_s = mn_now() - s.t0;
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    res->http_status = (int)status;
    if (!s.is_oom && sse_end(&s.sse) != MN_OK) s.is_oom = true;
    res->is_timeout = rc == CURLE_OPERATION_TIMEDOUT;
    res->is_canceled = rc == CURLE_ABORTED_BY_CALLBACK;
    int out = MN_OK;
    if (status != 200 && status != 0) { /* the body is an error object, not a stream */
        res->is_server_error = false;
        res->response_id[0] = '\0';
        json_t *j = json_loads(s.raw, 0, NULL);
        json_t *e = json_object_get(j, "error");
        const char *msg = json_string_value(json_object_get(e, "message"));
        const char *code = json_string_value(json_object_get(e, "code"));
        snprintf(res->error, sizeof res->error, "HTTP %ld: %s", status, msg ? msg : s.raw);
        if (code) snprintf(res->error_code, sizeof res->error_code, "%s", code);
        json_decref(j);
        if (rc != CURLE_OK) out = MN_EIO;
    } else if (res->is_server_error) { /* its message is in res->error, whatever happened next */
        out = MN_EIO;
    } else if (rc != CURLE_OK) {
        snprintf(res->error, sizeof res->error, "%s", curl_easy_strerror(rc));
        out = MN_EIO;
    } else if (!s.is_done) {
        snprintf(res->error, sizeof res->error, "the stream ended before %s", last_event);
        out = MN_EIO;
    }
    res->content = s.content ? s.content : mn_strdup("");
    curl_slist_free_all(hs);
    mn_free(body);
    sse_deinit(&s.sse);
    mn_free(s.raw);
    return s.is_oom ? MN_ENOMEM : out;
}

int client_chat(ChatClient *c, const ClientMsg *msgs, size_t n, const ClientParams *p, ClientDeltaFn fn, void *ctx,
                ClientResult *res) {
    json_t *req = json_object();
    json_object_set_new(req, "messages", messages_of(msgs, n));
    json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
    put_params(req, p, "max_tokens");
    return stream_post(c, "/v1/chat/completions", dump_request(req), "[DONE]", fn, ctx, res);
}

int client_respond(ChatClient *c, const ClientTurn *t, const ClientParams *p, ClientDeltaFn fn, void *ctx,
                   ClientResult *res) {
    json_t *req = json_object();
    bool is_one_user_msg = t->n_msgs == 1 && strcmp(t->msgs[0].role, "user") == 0;
    json_object_set_new(req, "input", is_one_user_msg ? json_string(t->msgs[0].content) : messages_of(t->msgs, t->n_msgs));
    if (t->instructions) json_object_set_new(req, "instructions", json_string(t->instructions));
    if (t->previous_id) json_object_set_new(req, "previous_response_id", json_string(t->previous_id));
    put_params(req, p, "max_output_tokens");
    return stream_post(c, "/v1/responses", dump_request(req), "response.completed", fn, ctx, res);
}

typedef struct Body {
    char *data;
    size_t len, cap;
} Body;

static size_t on_get(char *p, size_t sz, size_t n, void *ctx) {
    Body *b = ctx;
    if (mn_reserve(&b->data, &b->cap, b->len + sz * n + 1) != MN_OK) return 0;
    memcpy(b->data + b->len, p, sz * n);
    b->len += sz * n;
    b->data[b->len] = '\0';
    return sz * n;
}

/* GET (json == NULL) or POST json to path. */
static int request(ChatClient *c, const char *path, const char *json, char **body, int *status) {
    char url[1024];
    snprintf(url, sizeof url, "%s%s", c->base_url, path);
    Body b = {0};
    struct curl_slist *hs = c->auth ? curl_slist_append(NULL, c->auth) : NULL;
    if (json) hs = curl_slist_append(hs, "Content-Type: application/json");
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_get);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    if (json) curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
    set_common(c, h);
    CURLcode rc = curl_easy_perform(h);
    long st = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    curl_slist_free_all(hs);
    *status = (int)st;
    *body = b.data ? b.data : mn_strdup("");
    return rc == CURLE_OK ? MN_OK : MN_EIO;
}

int client_get(ChatClient *c, const char *path, char **body, int *status) {
    return request(c, path, NULL, body, status);
}

int client_post(ChatClient *c, const char *path, const char *json, char **body, int *status) {
    return request(c, path, json, body, status);
}
