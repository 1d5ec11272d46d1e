/* server.h — the OpenAI-compatible HTTP server (libmicrohttpd).
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions (both with
 * stream), GET /v1/models, POST /tokenize, POST /detokenize, GET /health,
 * GET /metrics. Requests are parsed and validated here (server/openai),
 * turned into prompt ids (engine/prompt, with the reply memory) and handed
 * to the engine; their text comes back through the Request's channel and
 * goes out whole or as Server-Sent Events. A client that disconnects while
 * streaming cancels its request.
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
#include "model/chat_template.h"

typedef struct ServerOptions {
    const char *host;          /* default "127.0.0.1" */
    int port;                  /* default 8080; 0 = any free port */
    const char *model_name;    /* what /v1/models lists (alias or file name) */
    const char **api_keys;     /* each key is its own cache namespace */
    int n_api_keys;
    size_t max_body;           /* bytes; default 1 MiB */
    const char **cors_origins; /* origins whose pages may call the API ("*": any) */
    int n_cors_origins;
    int default_max_tokens;    /* for requests without max_tokens; <= 0 (default): until
                                  the context or the pool is full */
    ChatTemplate chat_template;
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
