/* server.h — the OpenAI-compatible HTTP server (libmicrohttpd).
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions (both with
 * stream), GET /v1/models, POST /tokenize, POST /detokenize, GET /health,
 * GET /metrics, and the Responses API under /v1/responses (server/
 * responses.h). The server parses a request's JSON (server/openai: every
 * field's type and range), takes its namespace and session from the
 * connection, and hands the rest to the engine (engine/prompt.h's
 * prompt_submit), which builds the prompt, checks it against the model,
 * the context and the pool, fills in the defaults and queues it, or says
 * which field it refuses. The text comes back through the Request's
 * channel and goes out whole or as Server-Sent Events, serialized by
 * server/openai (which also makes it valid UTF-8). A client that
 * disconnects while streaming cancels its request.
 *
 * Every answer a client can see is one well-formed HTTP response with an
 * OpenAI error object, except what libmicrohttpd answers itself: a body's
 * broken chunk framing (its HTML 400 or 413), and the head errors of a
 * request after the first on a kept-alive connection (server/gate checks
 * the first; docs/API.md lists the cases).
 *
 * Threads: libmicrohttpd runs a thread per connection; each handles one
 * request at a time and blocks on its Request's channel. The Server's own
 * fields are read-only after server_new except the metrics registry
 * (thread-safe).
 */
#ifndef MN_SERVER_H
#define MN_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"
#include "server/http.h"

typedef struct ServerOptions {
    const char *host;          /* default "127.0.0.1" */
    int port;                  /* default 8080; 0 = any free port */
    const char *model_name;    /* what /v1/models lists (alias or file name) */
    const char **api_keys;     /* each key is its own cache namespace */
    int n_api_keys;
    size_t max_body;           /* bytes; default 1 MiB */
    HttpLimits limits;         /* connections (http_limits_default) */
    const char **cors_origins; /* origins whose pages may call the API ("*": any) */
    int n_cors_origins;
    double response_ttl_s;     /* stored responses unused this long are deleted; 0 = never
                                  (default RESP_TTL_DEFAULT_S) */
    /* tests only: unix seconds now for the stored responses' expiry; NULL
       normally (the wall clock) */
    double (*test_wall_now_fn)(void *ctx);
    void *test_clock_ctx;
} ServerOptions;

typedef struct Server Server;

void server_options_default(ServerOptions *o);
/* Start listening. The engine must outlive the server. */
int server_new(Engine *e, const ServerOptions *o, Server **out, MnErr *err);
/* The port actually bound (useful with port 0). */
int server_port(const Server *s);
/* Stop accepting new connections (open ones are served to the end). */
void server_quiesce(Server *s);
/* Stop accepting, close connections, free. */
void server_free(Server *s);

#endif
