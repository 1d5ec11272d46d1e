/* upstream.h — one HTTP exchange with a backend, read as it arrives
 * (libcurl).
 *
 * The router's connection thread sends a request (upstream_begin returns
 * once the answer's head is in: its status and the headers worth passing
 * on) and then pulls the body piece by piece (upstream_read). So it can
 * decide, before its client has seen a byte, whether to pass the answer on
 * or try another backend, and then stream it through as it comes, without
 * holding it whole. An Upstream is reused exchange after exchange and
 * keeps its connections to the backends open between them.
 *
 * Blocking; an Upstream is used by one thread at a time. Needs libcurl's
 * process-wide set-up done (main.c does it for every command).
 */
#ifndef MN_UPSTREAM_H
#define MN_UPSTREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/err.h"

typedef struct UpstreamReq {
    const char *base_url;        /* "http://host:port", no trailing slash */
    const char *method;          /* "GET", "POST", "DELETE", ... */
    const char *target;          /* the path and query, as the client sent them */
    const char *body;            /* NULL: none */
    size_t body_len;
    const char *const *headers;  /* "Name: value" lines to send, NULL-ended; may be NULL */
    double connect_timeout_s;    /* > 0 */
    double timeout_s;            /* the whole exchange at most (a probe); 0: no limit */
    double silence_s;            /* the backend sends nothing this long (before its head, or within its
                                    body): the exchange fails as timed out; 0: no limit */
    const atomic_bool *stop;     /* give up (within about a second) once set; may be NULL */
} UpstreamReq;

typedef struct Upstream Upstream;

/* MN_OK and *out, or MN_ENOMEM. */
int upstream_new(Upstream **out);
/* Ends any exchange in progress. NULL is fine. */
void upstream_free(Upstream *u);

/* Send req (ending any earlier exchange) and wait for the answer's head.
 * MN_OK with *status (100-class heads are skipped); MN_EIO when no head
 * came — refused, reset, timed out connecting, closed before a status —
 * with the reason in err; MN_ECANCELED when req->stop was set; MN_ENOMEM.
 * req's strings are borrowed until upstream_end. */
int upstream_begin(Upstream *u, const UpstreamReq *req, int *status, MnErr *err);

/* Whether the exchange failed because the backend stayed silent longer
 * than req->silence_s (until upstream_end). */
bool upstream_is_timed_out(const Upstream *u);

/* The value of the answer's header name (case-insensitive; the first
 * one), valid until upstream_end; NULL when absent. */
const char *upstream_header(const Upstream *u, const char *name);

/* The body's length as the head declared it, or -1. */
int64_t upstream_content_length(const Upstream *u);

/* Up to max bytes of the body into buf, waiting until some arrive: > 0
 * bytes, 0 at the body's end, -1 when the exchange broke off (reason in
 * err; MN_ECANCELED in err->code when stop was set). */
ssize_t upstream_read(Upstream *u, char *buf, size_t max, MnErr *err);

/* The whole rest of the body, at most max bytes, into *out (mn_malloc'd,
 * NUL-terminated, *len its length): MN_OK; MN_EFULL when it is longer
 * (*out holds the first max bytes); MN_EIO when it broke off; MN_ENOMEM. */
int upstream_read_all(Upstream *u, size_t max, char **out, size_t *len, MnErr *err);

/* End the exchange (cutting it short if the body is not all read) so the
 * Upstream can begin another. */
void upstream_end(Upstream *u);

#endif
