/* http.h — the HTTP front every listener of mnemo shares: server/gate in
 * front of a libmicrohttpd daemon with a thread per connection, the checks
 * of a request's framing and body size, and the request log's line.
 *
 * server/server.c (the OpenAI API over the engine) and route/ (the router
 * in front of several servers) are both built on it, so both answer a
 * malformed head, a smuggling framing or an oversized body alike. Nothing
 * here knows the engine.
 *
 * Threads: the gate thread hands connections to the daemon; the daemon runs
 * one thread per connection, which calls the handler. An HttpFront's own
 * fields are read-only after http_front_new.
 */
#ifndef MN_HTTP_H
#define MN_HTTP_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

/* ---- the front: gate + daemon ---------------------------------------------------- */

/* How many connections the front holds and how long an idle one stays.
 * Each connection holds a thread, so a client that opens many and sends
 * nothing would otherwise shut everyone else out. */
typedef struct HttpLimits {
    int max_connections;  /* open connections at most (1..HTTP_MAX_CONNECTIONS; default 512) */
    int max_per_ip;       /* from one client address at most (0: no limit; default 256; above
                             max_connections it never binds) */
    double idle_timeout_s; /* a connection that sends nothing this long is closed (default 30) */
} HttpLimits;

/* The daemon polls with select(), which takes descriptors below 1024 only:
 * room is left for the gate's waiting connections and the process's files. */
#define HTTP_MAX_CONNECTIONS 900
/* The shortest --idle-timeout accepted: well above the streams' ping
 * interval (a second), so a stream is never cut between two pings. */
#define HTTP_MIN_IDLE_TIMEOUT_S 5.0
/* The longest --idle-timeout accepted (a day). */
#define HTTP_MAX_IDLE_TIMEOUT_S 86400.0

void http_limits_default(HttpLimits *l);
/* MN_OK, or MN_EINVAL with the offending flag named in err;
 * max_connections is the command's own ceiling (HTTP_MAX_CONNECTIONS or
 * below), the range the message states. */
int http_limits_check(const HttpLimits *l, int max_connections, MnErr *err);

typedef struct HttpFrontConfig {
    const char *host; /* IPv4 address to listen on */
    int port;         /* 0: any free port */
    HttpLimits limits;
    /* libmicrohttpd's callbacks, each given ctx: the access handler, and
     * optionally the end of a request, a connection's start and end, and
     * the raw request target at a request's start (whose result becomes
     * the request's *con_cls, so the handler's first call sees it) */
    MHD_AccessHandlerCallback handler_fn;
    MHD_RequestCompletedCallback completed_fn;
    MHD_NotifyConnectionCallback connection_fn;
    void *(*uri_fn)(void *ctx, const char *uri, struct MHD_Connection *c);
    /* the gate answered a malformed head itself (for the log and metrics;
     * method and path are "-" when the request line was unusable) */
    void (*rejected_fn)(void *ctx, const char *method, const char *path, int status, const char *msg);
    void *ctx;
} HttpFrontConfig;

typedef struct HttpFront HttpFront;

/* Listen and start the threads. MN_OK and *out; MN_EINVAL (host is not an
 * IPv4 address), MN_EIO (cannot listen or start), MN_ENOMEM, with err set.
 * cfg's callbacks and ctx must outlive the front. */
int http_front_new(const HttpFrontConfig *cfg, HttpFront **out, MnErr *err);
/* The port bound (useful with port 0). */
int http_front_port(const HttpFront *f);
/* Stop accepting new connections; open ones are served to the end. */
void http_front_quiesce(HttpFront *f);
/* Stop accepting, wait for the connection threads to end, free (NULL is
 * fine). A handler blocked on something else must be released first. */
void http_front_free(HttpFront *f);

/* ---- a request's body -------------------------------------------------------------- */

/* The body as it arrives, NUL-terminated once it holds a byte. */
typedef struct HttpBody {
    char *data;
    size_t len, cap;
} HttpBody;

/* 0 when the head's framing and declared size are acceptable; else the
 * status of the answer (400: framings a proxy could read otherwise than
 * libmicrohttpd does — Content-Lengths that differ, both Content-Length and
 * Transfer-Encoding, a coding other than chunked, RFC 9112 §6.1/§6.3, the
 * ways a second request hides in a body; 413: a declared length over
 * max_body) with its message in msg. */
int http_check_framing(struct MHD_Connection *c, size_t max_body, char *msg, size_t cap);

/* Append a piece: MN_OK, MN_EFULL when the body would pass max_body
 * (nothing appended), MN_ENOMEM. */
int http_body_add(HttpBody *b, const char *data, size_t n, size_t max_body);
/* Free the bytes and zero b. */
void http_body_free(HttpBody *b);

/* "the request body is larger than N bytes (--max-body)". */
void http_body_limit_msg(size_t max_body, char *msg, size_t cap);

/* Answer 413 (msg; extra_headers: CRLF-ended lines or NULL) on c's socket
 * for a body that passed the limit while it arrived, and return MHD_NO so
 * the library drops the connection instead of reading the rest:
 * libmicrohttpd 0.9.75 queues no answer between the head and the body's
 * end (it logs "Application reported internal error"). */
enum MHD_Result http_refuse_body(struct MHD_Connection *c, const char *msg, const char *extra_headers);

/* Whether c's client has closed its side (a shutdown of its writing side
 * counts; bytes it sent before do not hide it) or the connection failed,
 * while its answer is being made: a handler that waits for a whole answer
 * asks now and then, and gives up on a client that went away (as nginx
 * does). A client that stays, bytes of a next request waiting or not, is
 * not gone. Call it on c's own thread. */
bool http_peer_gone(struct MHD_Connection *c);

/* ---- the request log ---------------------------------------------------------------- */

/* One line per answer, its fields in a fixed order: UTC time, method, path
 * (escaped: it comes from the client), status, id (the answer's `id`; "-"
 * when none), stream (1: an event stream), then detail. NULL method or path
 * is "-". */
void http_log_answer(const char *method, const char *path, int status, const char *id, bool is_stream,
                     const char *detail);
/* The line of an error answer without an id: detail error="msg" (escaped). */
void http_log_error(const char *method, const char *path, int status, const char *msg);

#endif
