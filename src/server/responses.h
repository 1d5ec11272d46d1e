/* responses.h — OpenAI's Responses API: the stateful routes.
 *
 *   POST   /v1/responses                    a turn (whole or streamed)
 *   GET    /v1/responses/{id}               a stored response
 *   DELETE /v1/responses/{id}               delete it
 *   GET    /v1/responses/{id}/input_items   its input items (a list page)
 *
 * A client continues a conversation by sending only its new input with
 * previous_response_id; the server keeps the rest. Responses are stored
 * (unless "store": false) in the cache's SQLite database (cache/store.h):
 * the disk tier's, so they survive a restart, or — without a disk tier —
 * an in-memory one the service owns. Each belongs to the namespace of the
 * request that made it: another namespace's id is not found (404). They
 * expire after ttl_s of not being used (made or continued).
 * engine/resp_chain.h rebuilds a continued turn's prompt.
 *
 * This module is HTTP-agnostic: server.c hands it a call (method, path,
 * body, namespace, query) and sends back the RespAnswer — an error, a
 * JSON body or a stream of Server-Sent Events read with resp_stream_read.
 * The JSON shapes are OpenAI's (docs/API.md lists them and mnemo's usage
 * additions).
 *
 * Threads: resp_handle is called on HTTP threads, concurrently; the
 * service is read-only after resp_service_new (the store locks itself).
 * A RespStream belongs to the thread that reads it.
 */
#ifndef MN_RESPONSES_H
#define MN_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "base/err.h"
#include "cache/store.h"
#include "engine/engine.h"

/* The default --response-ttl: thirty days, as OpenAI keeps responses. */
#define RESP_TTL_DEFAULT_S (30.0 * 86400.0)

typedef struct RespConfig {
    Engine *e;
    CacheStore *store;       /* the engine's database; NULL: an in-memory one of our own */
    const char *model_name;  /* answers name it (borrowed, outlives the service) */
    const char *fingerprint; /* unused by OpenAI's shape; kept for the log (may be NULL) */
    double ttl_s;            /* unused this long: deleted; 0 = never */
    /* unix seconds now; NULL: the wall clock. Tests move time with it. */
    double (*wall_now_fn)(void *ctx);
    void *clock_ctx;
    /* each finished generation, for the server's metrics; may be NULL */
    void (*on_finish_fn)(void *ctx, const ReqResult *res);
    void *finish_ctx;
} RespConfig;

typedef struct RespService RespService;
typedef struct RespStream RespStream;

/* MN_OK and *out, or MN_ENOMEM (err). */
int resp_service_new(const RespConfig *cfg, RespService **out, MnErr *err);
void resp_service_free(RespService *rs); /* NULL is fine */

/* The methods a path under /v1/responses takes ("POST, OPTIONS", ...),
 * or NULL when it is no route of ours. sub is the path after
 * "/v1/responses" ("", "/ID", "/ID/input_items"). */
const char *resp_route_methods(const char *sub);

typedef struct RespCall {
    const char *method; /* "POST", "GET", "DELETE" (the route takes it) */
    const char *sub;    /* as for resp_route_methods */
    const char *body;   /* POST: (body_len) bytes */
    size_t body_len;
    const char *ns;     /* the request's namespace */
    const char *limit, *order, *after; /* input_items' query arguments; NULL: absent */
    /* A turn answered whole asks it now and then whether its client went
     * away, and if so cancels and answers RESP_STATUS_GONE (nothing to
     * send). NULL: it never asks. */
    bool (*is_gone_fn)(void *ctx);
    void *gone_ctx;
} RespCall;

#define RESP_STATUS_GONE 499 /* the client went away (nginx's code): send nothing */

/* What to send: an error (error_msg set), a JSON body, or a stream. */
typedef struct RespAnswer {
    int status;
    char *json;           /* 2xx: the body, mn_malloc'd (the caller frees) */
    RespStream *stream;   /* 200 text/event-stream: read it, then resp_stream_free */
    char error_msg[512];  /* an error: the message, */
    char param[64];       /* its "param" ("" for none) */
    const char *code;     /* and "code" (static or NULL) */
    char id[64];          /* the response it is about, for the log ("" none) */
} RespAnswer;

/* Serve one call. Never fails: every outcome is in *ans (zeroed first). */
void resp_handle(RespService *rs, const RespCall *call, RespAnswer *ans);

#define RESP_STREAM_END (-1)   /* the stream is complete */
#define RESP_STREAM_ERROR (-2) /* it cannot go on (out of memory): drop the connection */

/* Up to max bytes of the stream into buf: a count > 0, or one of the
 * above. Blocks until the engine has more; a comment line is sent after a
 * second without output, so a vanished client is noticed. */
ssize_t resp_stream_read(RespStream *st, char *buf, size_t max);
/* Free the stream; a generation still running is cancelled. */
void resp_stream_free(RespStream *st);

#endif
