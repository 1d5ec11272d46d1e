/* responses.c — OpenAI's Responses API (see responses.h).
 *
 * A turn: parse (server/openai), expire what is past the TTL, make the
 * ids, submit through engine/resp_chain, then either collect the answer
 * or stream it. The finished response object is stored before the client
 * sees it complete (the whole answer, or the stream's last event), so a
 * client that continues at once finds it. What is stored is the object as
 * answered (GET gives it back byte for byte), the reply's text exactly as
 * generated (the chain's assistant message: the reply memory knows its
 * ids by that text) and the input items.
 *
 * The stream's events, in order (OpenAI's; each "event: TYPE" + "data:"
 * with a sequence_number from 0):
 *   response.created, response.in_progress         the object, in_progress
 *   response.output_item.added                     the message, no content
 *   response.content_part.added                    an empty output_text
 *   response.output_text.delta ...                 the text as it comes
 *   response.output_text.done, response.content_part.done,
 *   response.output_item.done                      the whole text
 *   response.completed | response.incomplete       the stored object
 * and on a failure after the start: error, then response.failed.
 *
 * Ids: "resp_" / "msg_" + 48 hex digits from getrandom, so they do not
 * repeat across restarts or guess.
 */
#include "server/responses.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/resp_chain.h"
#include "server/openai.h"

/* ---- types ----------------------------------------------------------------------- */

struct RespService {
    RespConfig cfg;
    CacheStore *own_store; /* without a disk tier: ours (in memory) */
    CacheStore *store;     /* cfg.store or own_store */
};

#define RESP_ID_LEN 64

/* One turn, from submission to the stored response. */
typedef struct Turn {
    RespService *rs;
    Request *req;
    ApiRequest ar;           /* the parsed request (owns the input) */
    char id[RESP_ID_LEN], msg_id[RESP_ID_LEN];
    char (*item_ids)[RESP_ID_LEN]; /* (ar.n_msgs) the input items' ids */
    const char *ns;          /* borrowed for resp_handle; NULL once streaming */
    Hash128 ns_id;
    double created;
    char *text;              /* the reply so far, as generated */
    size_t text_len;
    ReqResult res;
    int n_truncated;         /* prompt tokens dropped to fit the context */
} Turn;

struct RespStream {
    Turn *t;
    char *out;               /* formatted, not yet sent */
    size_t out_len, out_off;
    int seq;                 /* the next sequence_number */
    bool is_started, is_finished, is_ended;
};

/* ---- helpers ----------------------------------------------------------------------- */

static double wall_now(const RespService *rs) {
    return rs->cfg.wall_now_fn ? rs->cfg.wall_now_fn(rs->cfg.clock_ctx) : mn_wall_now();
}

static void make_id(char *buf, const char *prefix) {
    uint8_t r[24];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) { /* no entropy yet: still unique per call */
        uint64_t x = (uint64_t)(mn_now() * 1e9) ^ (uint64_t)(uintptr_t)buf;
        for (size_t i = 0; i < sizeof r; i++) r[i] = (uint8_t)((x >> (8 * (i % 8))) + i * 0x9d);
    }
    int n = snprintf(buf, RESP_ID_LEN, "%s", prefix);
    for (size_t i = 0; i < sizeof r && n + 2 < RESP_ID_LEN; i++) n += snprintf(buf + n, 3, "%02x", r[i]);
}

static void set_error(RespAnswer *a, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void set_error(RespAnswer *a, int status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->error_msg, sizeof a->error_msg, fmt, ap);
    va_end(ap);
    a->status = status;
    snprintf(a->param, sizeof a->param, "%s", param ? param : "");
    a->code = code;
}

/* A JSON string of s[0..len), made valid UTF-8. */
static json_t *jtext(const char *s, size_t len) {
    size_t n;
    char *clean = api_utf8_sanitize(s ? s : "", s ? len : 0, &n);
    if (clean == NULL) return NULL;
    json_t *j = json_stringn_nocheck(clean, n);
    mn_free(clean);
    return j;
}

static bool put(json_t *o, const char *key, json_t *v) { return json_object_set_new(o, key, v) == 0; }

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s == NULL) return NULL;
    char *copy = mn_strdup(s); /* the answer is freed with mn_free */
    free(s);
    return copy;
}

/* ---- the objects --------------------------------------------------------------- */

/* {"type":"output_text","annotations":[],"logprobs":[],"text"} */
static json_t *text_part(const char *text, size_t len) {
    json_t *o = json_object();
    bool ok = o && put(o, "type", json_string("output_text")) && put(o, "annotations", json_array()) &&
              put(o, "logprobs", json_array()) && put(o, "text", jtext(text, len));
    if (!ok) json_decref(o);
    return ok ? o : NULL;
}

/* The assistant message item; content NULL: no parts yet. */
static json_t *message_item(const Turn *t, const char *status, bool with_text) {
    json_t *o = json_object(), *content = json_array();
    bool ok = o && content && (!with_text || json_array_append_new(content, text_part(t->text, t->text_len)) == 0);
    ok = ok && put(o, "id", json_string(t->msg_id)) && put(o, "type", json_string("message")) &&
         put(o, "status", json_string(status)) && put(o, "content", json_incref(content)) &&
         put(o, "role", json_string("assistant"));
    json_decref(content);
    if (!ok) json_decref(o);
    return ok ? o : NULL;
}

/* usage: OpenAI's, with mnemo's tier split and recomputed tokens beside
 * cached_tokens (as chat completions' prompt_tokens_details has them). */
static json_t *usage_object(const ReqResult *res, int n_truncated) {
    json_t *u = json_object(), *in = json_object(), *tiers = json_object(), *out = json_object(),
           *paths = json_object();
    bool ok = u && in && tiers && out && paths;
    for (int i = 0; ok && i < SRC_COUNT; i++) ok = put(tiers, engine_source_name(i), json_integer(res->n_cached_by[i]));
    for (int i = 0; ok && i < RESTORE_PATH_COUNT; i++)
        ok = put(paths, engine_restore_path_name(i), json_integer(res->n_restored_by[i]));
    ok = ok && put(in, "cached_tokens", json_integer(res->n_cached)) &&
         put(in, "cached_tokens_by_tier", json_incref(tiers)) &&
         put(in, "restored_by", json_incref(paths)) &&
         put(in, "recomputed_tokens", json_integer(res->n_prompt - res->n_cached)) &&
         put(in, "truncated_tokens", json_integer(n_truncated)) &&
         put(in, "shifted_tokens", json_integer(res->n_shifted)) &&
         put(out, "reasoning_tokens", json_integer(0)) && put(u, "input_tokens", json_integer(res->n_prompt)) &&
         put(u, "input_tokens_details", json_incref(in)) && put(u, "output_tokens", json_integer(res->n_generated)) &&
         put(u, "output_tokens_details", json_incref(out)) &&
         put(u, "total_tokens", json_integer(res->n_prompt + res->n_generated));
    json_decref(tiers);
    json_decref(paths);
    json_decref(in);
    json_decref(out);
    if (!ok) json_decref(u);
    return ok ? u : NULL;
}

/* OpenAI's name for what the server does with a conversation too long for
 * the context: "auto" drops its oldest turns, "disabled" refuses it. */
static const char *truncation(const Turn *t) {
    return engine_context_overflow(t->rs->cfg.e) != OVERFLOW_ERROR ? "auto" : "disabled";
}

static json_t *nullable_string(const char *s) { return s ? jtext(s, strlen(s)) : json_null(); }

/* The response object. status: "in_progress" (no output, no usage),
 * "completed", "incomplete" (max_output_tokens or the context) or
 * "failed" (error_msg). */
static json_t *response_object(const Turn *t, const char *status, const char *error_msg) {
    const ApiRequest *ar = &t->ar;
    bool is_done = strcmp(status, "in_progress") != 0;
    json_t *o = json_object(), *output = json_array(), *reasoning = json_object(), *text = json_object(),
           *format = json_object(), *err = json_null(), *incomplete = json_null();
    bool ok = o && output && reasoning && text && format;
    if (ok && is_done && error_msg == NULL) ok = json_array_append_new(output, message_item(t, "completed", true)) == 0;
    if (ok && error_msg) {
        err = json_object();
        ok = err && put(err, "code", json_string("server_error")) && put(err, "message", jtext(error_msg, strlen(error_msg)));
    }
    if (ok && strcmp(status, "incomplete") == 0) {
        incomplete = json_object();
        ok = incomplete && put(incomplete, "reason", json_string("max_output_tokens"));
    }
    ok = ok && put(format, "type", json_string("text")) && put(text, "format", json_incref(format)) &&
         put(reasoning, "effort", json_null()) && put(reasoning, "summary", json_null());
    ok = ok && put(o, "id", json_string(t->id)) && put(o, "object", json_string("response")) &&
         put(o, "created_at", json_integer((json_int_t)t->created)) && put(o, "status", json_string(status)) &&
         put(o, "background", json_false()) && put(o, "error", json_incref(err)) &&
         put(o, "incomplete_details", json_incref(incomplete)) &&
         put(o, "instructions", nullable_string(ar->instructions)) &&
         put(o, "max_output_tokens", ar->max_tokens > 0 ? json_integer(ar->max_tokens) : json_null()) &&
         put(o, "max_tool_calls", json_null()) && put(o, "model", json_string(t->rs->cfg.model_name)) &&
         put(o, "output", json_incref(output)) && put(o, "parallel_tool_calls", json_true()) &&
         put(o, "previous_response_id", nullable_string(ar->previous_response_id)) &&
         put(o, "reasoning", json_incref(reasoning)) && put(o, "service_tier", json_string("default")) &&
         put(o, "store", json_boolean(ar->is_store)) && put(o, "temperature", json_real(ar->sampler.temperature)) &&
         put(o, "text", json_incref(text)) && put(o, "tool_choice", json_string("auto")) &&
         put(o, "tools", json_array()) && put(o, "top_logprobs", json_integer(0)) &&
         put(o, "top_p", json_real(ar->sampler.top_p)) && put(o, "truncation", json_string(truncation(t))) &&
         put(o, "usage", is_done && error_msg == NULL ? usage_object(&t->res, t->n_truncated) : json_null()) &&
         put(o, "user", json_null()) && put(o, "metadata", json_object());
    json_decref(output);
    json_decref(reasoning);
    json_decref(text);
    json_decref(format);
    json_decref(err);
    json_decref(incomplete);
    if (!ok) json_decref(o);
    return ok ? o : NULL;
}

/* The final status of a finished turn. */
static const char *final_status(const Turn *t) {
    if (t->res.finish == FINISH_ERROR) return "failed";
    return t->res.finish == FINISH_LENGTH ? "incomplete" : "completed";
}

/* ---- turns -------------------------------------------------------------------------- */

static void turn_free(Turn *t) {
    if (t == NULL) return;
    request_unref(t->req);
    api_request_deinit(&t->ar);
    mn_free(t->item_ids);
    mn_free(t->text);
    mn_free(t);
}

/* The generation parameters a Responses request sets (temperature, top_p,
 * seed, max_output_tokens); the engine fills in the rest. */
static ReqParams turn_params(const ApiRequest *ar) {
    ReqParams p;
    memset(&p, 0, sizeof p);
    p.sp = ar->sampler;
    p.is_seed_random = !(ar->fields_set & API_SET_SEED);
    p.max_tokens = ar->max_tokens > INT32_MAX ? INT32_MAX : ar->max_tokens > 0 ? (int)ar->max_tokens : 0;
    return p;
}

/* The request field a refusal names, by its Responses name. */
static const char *field_param(ReqField f) {
    switch (f) {
    case REQ_FIELD_PROMPT: return "input";
    case REQ_FIELD_MAX_TOKENS: return "max_output_tokens";
    default: return NULL;
    }
}

/* Parse, expire, submit. NULL with *ans set on a refusal. */
static Turn *turn_start(RespService *rs, const RespCall *call, RespAnswer *ans) {
    Turn *t = mn_calloc(1, sizeof *t);
    if (t == NULL) {
        set_error(ans, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    t->rs = rs;
    MnErr err = {0};
    char param[API_PARAM_MAX];
    int rc = api_parse_request(API_ROUTE_RESPONSES, call->body ? call->body : "", call->body_len, &t->ar, &err, param);
    if (rc != MN_OK) {
        set_error(ans, api_http_status(rc), param[0] ? param : NULL, NULL, "%s", err.msg);
        turn_free(t);
        return NULL;
    }
    double now = wall_now(rs);
    t->created = now;
    t->ns = call->ns;
    t->ns_id = engine_namespace_id(call->ns);
    make_id(t->id, "resp_");
    make_id(t->msg_id, "msg_");
    snprintf(ans->id, sizeof ans->id, "%s", t->id);
    t->item_ids = mn_calloc(t->ar.n_msgs, sizeof *t->item_ids);
    if (t->item_ids == NULL) {
        set_error(ans, 500, NULL, NULL, "out of memory");
        turn_free(t);
        return NULL;
    }
    for (size_t i = 0; i < t->ar.n_msgs; i++) make_id(t->item_ids[i], "msg_");
    if (rs->cfg.ttl_s > 0) {
        int64_t n = 0;
        if (store_resp_expire(rs->store, now - rs->cfg.ttl_s, &n) == MN_OK && n > 0)
            LOG_INFO("responses: %lld expired (unused for %.0f s)", (long long)n, rs->cfg.ttl_s);
    }
    RespTurn rt = {.id = t->id,
                   .instructions = t->ar.instructions,
                   .previous_id = t->ar.previous_response_id,
                   .input = t->ar.msgs,
                   .n_input = t->ar.n_msgs,
                   .cutoff = rs->cfg.ttl_s > 0 ? now - rs->cfg.ttl_s : -1e300,
                   .now = now};
    ReqParams p = turn_params(&t->ar);
    ReqField field = REQ_FIELD_NONE;
    rc = respchain_submit(rs->cfg.e, rs->store, &rt, &p, call->ns, &t->req, &t->n_truncated, &err, &field);
    if (rc == MN_ENOTFOUND) {
        set_error(ans, 400, "previous_response_id", "previous_response_not_found", "%s", err.msg);
    } else if (rc != MN_OK) {
        set_error(ans, api_http_status(rc), field_param(field), NULL, "%s", err.msg);
    }
    if (rc != MN_OK) {
        turn_free(t);
        return NULL;
    }
    return t;
}

/* Append o's text to the turn's reply. */
static int turn_append(Turn *t, const ReqOutput *o) {
    if (o->len == 0) return MN_OK;
    char *b = mn_realloc(t->text, t->text_len + o->len + 1);
    if (b == NULL) return MN_ENOMEM;
    t->text = b;
    memcpy(t->text + t->text_len, o->text, o->len);
    t->text_len += o->len;
    t->text[t->text_len] = '\0';
    return MN_OK;
}

/* Store the finished turn (when asked to) with body as its object. */
static int turn_store(Turn *t, const char *body) {
    if (!t->ar.is_store) return MN_OK;
    StoreRespItem *items = mn_calloc(t->ar.n_msgs, sizeof *items);
    if (items == NULL) return MN_ENOMEM;
    for (size_t i = 0; i < t->ar.n_msgs; i++)
        items[i] = (StoreRespItem){t->item_ids[i], t->ar.msgs[i].role, t->ar.msgs[i].content,
                                   strlen(t->ar.msgs[i].content)};
    StoreResp r = {.id = t->id,
                   .previous_id = t->ar.previous_response_id,
                   .created = t->created,
                   .body = body,
                   .body_len = strlen(body),
                   .output = t->text ? t->text : "",
                   .output_len = t->text_len,
                   .inputs = items,
                   .n_inputs = t->ar.n_msgs};
    int rc = store_resp_put(t->rs->store, &t->ns_id, &r);
    mn_free(items);
    return rc;
}

static void turn_finished(Turn *t) {
    if (t->rs->cfg.on_finish_fn) t->rs->cfg.on_finish_fn(t->rs->cfg.finish_ctx, &t->res);
    LOG_INFO("POST /v1/responses id=%s prompt=%d truncated=%d cached=%d generated=%d ttft=%.3fs %s", t->id,
             t->res.n_prompt, t->n_truncated, t->res.n_cached, t->res.n_generated, t->res.ttft_s, final_status(t));
}

/* The whole answer of a turn that does not stream. */
static void turn_run(Turn *t, const RespCall *call, RespAnswer *ans) {
    for (;;) {
        ReqOutput o;
        if (request_read(t->req, &o, 1000) != MN_OK) {
            engine_cancel(t->rs->cfg.e, t->req);
            set_error(ans, 500, NULL, NULL, "out of memory");
            return;
        }
        if (!o.is_done && call->is_gone_fn && call->is_gone_fn(call->gone_ctx)) {
            request_output_deinit(&o);
            engine_cancel(t->rs->cfg.e, t->req);
            LOG_INFO("POST /v1/responses id=%s cancelled: the client went away", t->id);
            set_error(ans, RESP_STATUS_GONE, NULL, NULL, "the client went away");
            return;
        }
        int rc = turn_append(t, &o);
        bool done = o.is_done;
        if (done) t->res = o.res;
        request_output_deinit(&o);
        if (rc != MN_OK) {
            engine_cancel(t->rs->cfg.e, t->req);
            set_error(ans, 500, NULL, NULL, "out of memory");
            return;
        }
        if (done) break;
    }
    turn_finished(t);
    if (t->res.finish == FINISH_ERROR) {
        set_error(ans, 500, NULL, NULL, "%s", t->res.error);
        return;
    }
    char *body = dump(response_object(t, final_status(t), NULL));
    if (body == NULL) {
        set_error(ans, 500, NULL, NULL, "out of memory");
        return;
    }
    int rc = turn_store(t, body);
    if (rc != MN_OK) {
        mn_free(body);
        set_error(ans, 500, NULL, NULL, "cannot store the response: %s", mn_strerror(rc));
        return;
    }
    ans->status = 200;
    ans->json = body;
}

/* ---- streams ------------------------------------------------------------------------- */

/* Append event `type` with data o (taken; "type" and "sequence_number"
 * are added first). */
static int sse_event(RespStream *st, const char *type, json_t *o) {
    json_t *ev = json_object();
    bool ok = o && ev && put(ev, "type", json_string(type)) && put(ev, "sequence_number", json_integer(st->seq++)) &&
              json_object_update(ev, o) == 0;
    json_decref(o);
    char *data = ok ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    if (data == NULL) return MN_ENOMEM;
    size_t n = strlen(data), need = st->out_len + n + strlen(type) + 16;
    char *b = mn_realloc(st->out, need + 1);
    if (b == NULL) {
        free(data);
        return MN_ENOMEM;
    }
    st->out = b;
    st->out_len += (size_t)snprintf(st->out + st->out_len, need + 1 - st->out_len, "event: %s\ndata: %s\n\n", type, data);
    free(data);
    return MN_OK;
}

/* {"response": the object with status} */
static json_t *with_response(const Turn *t, const char *status, const char *error_msg) {
    json_t *o = json_object();
    if (o && !put(o, "response", response_object(t, status, error_msg))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* {"output_index":0, "item_id", "content_index":0} and what follows */
static json_t *at_part(const Turn *t) {
    json_t *o = json_object();
    bool ok = o && put(o, "item_id", json_string(t->msg_id)) && put(o, "output_index", json_integer(0)) &&
              put(o, "content_index", json_integer(0));
    if (!ok) json_decref(o);
    return ok ? o : NULL;
}

static json_t *with(json_t *o, const char *key, json_t *v) {
    if (o && !put(o, key, v)) {
        json_decref(o);
        return NULL;
    }
    if (o == NULL) json_decref(v);
    return o;
}

static int stream_start(RespStream *st) {
    Turn *t = st->t;
    st->is_started = true;
    json_t *item = json_object();
    item = with(with(item, "output_index", json_integer(0)), "item", message_item(t, "in_progress", false));
    int rc = sse_event(st, "response.created", with_response(t, "in_progress", NULL));
    if (rc == MN_OK) rc = sse_event(st, "response.in_progress", with_response(t, "in_progress", NULL));
    if (rc == MN_OK) rc = sse_event(st, "response.output_item.added", item);
    else json_decref(item);
    if (rc == MN_OK) rc = sse_event(st, "response.content_part.added", with(at_part(t), "part", text_part("", 0)));
    return rc;
}

static int stream_delta(RespStream *st, const ReqOutput *o) {
    json_t *ev = with(with(at_part(st->t), "delta", jtext(o->text, o->len)), "logprobs", json_array());
    return sse_event(st, "response.output_text.delta", ev);
}

/* The closing events: stored first, then told. */
static int stream_finish(RespStream *st) {
    Turn *t = st->t;
    turn_finished(t);
    if (t->res.finish == FINISH_ERROR) {
        json_t *e = json_object();
        e = with(with(with(e, "code", json_string("server_error")), "message", jtext(t->res.error, strlen(t->res.error))),
                 "param", json_null());
        int rc = sse_event(st, "error", e);
        return rc == MN_OK ? sse_event(st, "response.failed", with_response(t, "failed", t->res.error)) : rc;
    }
    const char *status = final_status(t);
    char *body = dump(response_object(t, status, NULL));
    int rc = body ? turn_store(t, body) : MN_ENOMEM;
    mn_free(body);
    if (rc != MN_OK) {
        char msg[128];
        snprintf(msg, sizeof msg, "cannot store the response: %s", mn_strerror(rc));
        json_t *e = with(with(with(json_object(), "code", json_string("server_error")), "message", json_string(msg)),
                         "param", json_null());
        rc = sse_event(st, "error", e);
        return rc == MN_OK ? sse_event(st, "response.failed", with_response(t, "failed", msg)) : rc;
    }
    rc = sse_event(st, "response.output_text.done",
                   with(with(at_part(t), "text", jtext(t->text, t->text_len)), "logprobs", json_array()));
    if (rc == MN_OK)
        rc = sse_event(st, "response.content_part.done", with(at_part(t), "part", text_part(t->text, t->text_len)));
    if (rc == MN_OK)
        rc = sse_event(st, "response.output_item.done",
                       with(with(json_object(), "output_index", json_integer(0)), "item",
                            message_item(t, "completed", true)));
    const char *type = strcmp(status, "completed") == 0 ? "response.completed" : "response.incomplete";
    return rc == MN_OK ? sse_event(st, type, with_response(t, status, NULL)) : rc;
}

ssize_t resp_stream_read(RespStream *st, char *buf, size_t max) {
    while (st->out_off == st->out_len) {
        st->out_len = st->out_off = 0;
        if (st->is_ended) return RESP_STREAM_END;
        int rc = st->is_started ? MN_OK : stream_start(st);
        if (rc == MN_OK && st->out_len == 0) {
            ReqOutput o;
            if (request_read(st->t->req, &o, 1000) != MN_OK) return RESP_STREAM_ERROR;
            rc = turn_append(st->t, &o);
            if (rc == MN_OK && o.len > 0) rc = stream_delta(st, &o);
            if (o.is_done) {
                st->t->res = o.res;
                st->is_finished = true;
                if (rc == MN_OK) rc = stream_finish(st);
                st->is_ended = true;
            }
            request_output_deinit(&o);
        }
        if (rc != MN_OK) return RESP_STREAM_ERROR;
        if (st->out_len == 0) break; /* nothing yet: api_sse_emit pings */
    }
    return (ssize_t)api_sse_emit(st->out, st->out_len, &st->out_off, buf, max);
}

void resp_stream_free(RespStream *st) {
    if (st == NULL) return;
    if (!st->is_finished) {
        engine_cancel(st->t->rs->cfg.e, st->t->req);
        LOG_INFO("POST /v1/responses id=%s cancelled: the client went away", st->t->id);
    }
    turn_free(st->t);
    mn_free(st->out);
    mn_free(st);
}

/* ---- stored responses ------------------------------------------------------------------ */

/* The id in sub ("/ID" or "/ID/input_items") into id; false when it does
 * not fit. */
static bool sub_id(const char *sub, char *id, size_t cap) {
    size_t n = strcspn(sub + 1, "/");
    if (n == 0 || n >= cap) return false;
    memcpy(id, sub + 1, n);
    id[n] = '\0';
    return true;
}

static bool get_stored(RespService *rs, const RespCall *call, const char *id, StoreResp *r, RespAnswer *ans) {
    double cutoff = rs->cfg.ttl_s > 0 ? wall_now(rs) - rs->cfg.ttl_s : -1e300;
    Hash128 ns_id = engine_namespace_id(call->ns);
    int rc = store_resp_get(rs->store, &ns_id, id, cutoff, r);
    if (rc == MN_ENOTFOUND) set_error(ans, 404, NULL, NULL, "Response with id '%.80s' not found.", id);
    else if (rc != MN_OK) set_error(ans, 500, NULL, NULL, "cannot read the response: %s", mn_strerror(rc));
    return rc == MN_OK;
}

/* One input item as listed: {"id","type":"message","role","content":[part],"status"}. */
static json_t *input_item(const StoreRespItem *it) {
    bool is_assistant = strcmp(it->role, "assistant") == 0;
    json_t *part = is_assistant ? text_part(it->content, it->content_len) : json_object();
    if (part && !is_assistant) part = with(with(part, "type", json_string("input_text")), "text",
                                            jtext(it->content, it->content_len));
    json_t *content = json_array();
    if (content && part) json_array_append_new(content, part);
    else json_decref(part);
    json_t *o = with(with(json_object(), "id", json_string(it->item_id)), "type", json_string("message"));
    return with(with(with(o, "role", json_string(it->role)), "content", content), "status", json_string("completed"));
}

/* A page of input items: order "desc" (the default) or "asc", after an
 * item id, up to limit (1..100, default 20). */
static void list_inputs(const StoreResp *r, const RespCall *call, RespAnswer *ans) {
    long limit = 20;
    if (call->limit) {
        char *end;
        limit = strtol(call->limit, &end, 10);
        if (*end != '\0' || limit < 1 || limit > 100) {
            set_error(ans, 400, "limit", NULL, "limit must be an integer between 1 and 100");
            return;
        }
    }
    bool is_asc = call->order && strcmp(call->order, "asc") == 0;
    if (call->order && !is_asc && strcmp(call->order, "desc") != 0) {
        set_error(ans, 400, "order", NULL, "order must be \"asc\" or \"desc\"");
        return;
    }
    size_t n = r->n_inputs, start = 0;
    if (call->after) {
        size_t k = 0;
        while (k < n && strcmp(r->inputs[is_asc ? k : n - 1 - k].item_id, call->after) != 0) k++;
        if (k == n) {
            set_error(ans, 400, "after", NULL, "after: no input item '%.80s' in this response", call->after);
            return;
        }
        start = k + 1;
    }
    json_t *data = json_array();
    size_t end = start + (size_t)limit < n ? start + (size_t)limit : n;
    for (size_t k = start; data && k < end; k++)
        if (json_array_append_new(data, input_item(&r->inputs[is_asc ? k : n - 1 - k])) != 0) {
            json_decref(data);
            data = NULL;
        }
    const char *first = end > start ? r->inputs[is_asc ? start : n - 1 - start].item_id : NULL;
    const char *last = end > start ? r->inputs[is_asc ? end - 1 : n - end].item_id : NULL;
    json_t *o = with(with(json_object(), "object", json_string("list")), "data", data);
    o = with(with(o, "first_id", first ? json_string(first) : json_null()), "last_id",
             last ? json_string(last) : json_null());
    ans->json = dump(with(o, "has_more", json_boolean(end < n)));
    if (ans->json == NULL) set_error(ans, 500, NULL, NULL, "out of memory");
    else ans->status = 200;
}

static void handle_stored(RespService *rs, const RespCall *call, RespAnswer *ans) {
    char id[RESP_ID_LEN * 2];
    if (!sub_id(call->sub, id, sizeof id)) {
        set_error(ans, 404, NULL, NULL, "Response with id '%.80s' not found.", call->sub + 1);
        return;
    }
    snprintf(ans->id, sizeof ans->id, "%.63s", id);
    bool is_items = strchr(call->sub + 1, '/') != NULL;
    if (strcmp(call->method, "DELETE") == 0) {
        Hash128 ns_id = engine_namespace_id(call->ns);
        int rc = store_resp_delete(rs->store, &ns_id, id);
        if (rc == MN_ENOTFOUND) set_error(ans, 404, NULL, NULL, "Response with id '%.80s' not found.", id);
        else if (rc != MN_OK) set_error(ans, 500, NULL, NULL, "cannot delete the response: %s", mn_strerror(rc));
        else {
            ans->json = dump(with(with(with(json_object(), "id", json_string(id)), "object", json_string("response")),
                                  "deleted", json_true()));
            ans->status = ans->json ? 200 : 500;
            if (ans->json == NULL) set_error(ans, 500, NULL, NULL, "out of memory");
        }
        return;
    }
    StoreResp r;
    if (!get_stored(rs, call, id, &r, ans)) return;
    if (is_items) {
        list_inputs(&r, call, ans);
    } else {
        ans->json = mn_strdup(r.body);
        ans->status = ans->json ? 200 : 500;
        if (ans->json == NULL) set_error(ans, 500, NULL, NULL, "out of memory");
    }
    store_resp_deinit(&r);
}

/* ---- API --------------------------------------------------------------------------------- */

const char *resp_route_methods(const char *sub) {
    if (sub[0] == '\0') return "POST, OPTIONS";
    if (sub[0] != '/' || sub[1] == '\0') return NULL;
    const char *slash = strchr(sub + 1, '/');
    if (slash == NULL) return "GET, DELETE, OPTIONS";
    return strcmp(slash, "/input_items") == 0 ? "GET, OPTIONS" : NULL;
}

void resp_handle(RespService *rs, const RespCall *call, RespAnswer *ans) {
    memset(ans, 0, sizeof *ans);
    if (call->sub[0] != '\0') {
        handle_stored(rs, call, ans);
        return;
    }
    Turn *t = turn_start(rs, call, ans);
    if (t == NULL) return;
    if (!t->ar.is_stream) {
        turn_run(t, call, ans);
        turn_free(t);
        return;
    }
    RespStream *st = mn_calloc(1, sizeof *st);
    if (st == NULL) {
        engine_cancel(rs->cfg.e, t->req);
        turn_free(t);
        set_error(ans, 500, NULL, NULL, "out of memory");
        return;
    }
    t->ns = NULL; /* the call's strings end with this function */
    st->t = t;
    ans->status = 200;
    ans->stream = st;
}

int resp_service_new(const RespConfig *cfg, RespService **out, MnErr *err) {
    *out = NULL;
    RespService *rs = mn_calloc(1, sizeof *rs);
    if (rs == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    rs->cfg = *cfg;
    rs->store = cfg->store;
    if (rs->store == NULL) {
        int rc = store_open_memory(&rs->own_store, err);
        if (rc != MN_OK) {
            mn_free(rs);
            return rc;
        }
        rs->store = rs->own_store;
    }
    *out = rs;
    return MN_OK;
}

void resp_service_free(RespService *rs) {
    if (rs == NULL) return;
    store_close(rs->own_store);
    mn_free(rs);
}
