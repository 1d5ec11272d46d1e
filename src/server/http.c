/* http.c — the HTTP front shared by the server and the router (see http.h).
 *
 * The daemon has no listening socket of its own: server/gate owns it,
 * answers the heads libmicrohttpd would answer badly and hands the rest
 * over (MHD_add_connection). The daemon runs a thread per connection, so a
 * handler may block (on the engine, on a backend) without stalling other
 * connections. libmicrohttpd may hold heads four times the largest the
 * gate passes, so a passed head never meets the library's own limits.
 *
 * --max-connections is counted here, not by libmicrohttpd: 0.9.75 adds an
 * external connection in two steps (MHD_add_connection checks its limit
 * and queues the socket; the daemon thread checks again when it takes the
 * queue), and when that second check finds the limit reached it returns
 * with a mutex still locked — the daemon thread then waits on itself for
 * good, every connection after it is reset and SIGTERM cannot stop the
 * server. The gate hands connections over in bursts (all those whose head
 * wait ended together), so a burst past the limit reached that path. So
 * the front counts the connections it handed over that the library has
 * not yet closed and refuses the rest itself, and the library's own limit
 * is one it can never reach (see front_hand_over). The per-IP limit stays
 * the library's: its refusal happens in the first step, which is sound.
 */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/utf8.h"
#include "server/gate.h"

struct HttpFront {
    HttpFrontConfig cfg;
    struct MHD_Daemon *daemon;
    Gate *gate;
    /* Connections handed to the daemon and not yet closed by it. The gate
     * thread adds, the daemon's thread subtracts (on NOTIFY_CLOSED), so it
     * is atomic; a count rather than a flag because both sides move it by
     * one per connection and a refusal must see the exact number. */
    atomic_int open;
};

/* ---- the front ------------------------------------------------------------------------ */

/* libmicrohttpd's own messages, through the project's log. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) msg[--n] = '\0';
    LOG_INFO("libmicrohttpd: %s", msg);
}

/* The place counted here is given back when the library reports the
 * connection closed. libmicrohttpd 0.9.75 reports NOTIFY_CLOSED for every
 * connection it reported STARTED (on its close, or when the connection's
 * thread cannot start) and neither for one MHD_add_connection refused
 * (MHD_NO: given back below). The one way a place stays taken is the
 * daemon thread failing to allocate the connection's memory pool after
 * MHD_add_connection said yes: out of memory, it drops the connection
 * without a word — one place lost per such failure. */
static void front_hand_over(void *ctx, int fd, const struct sockaddr_in *addr) {
    HttpFront *f = ctx;
    /* only this (the gate's) thread adds, so a place counted here is ours */
    if (atomic_fetch_add(&f->open, 1) >= f->cfg.limits.max_connections) {
        atomic_fetch_sub(&f->open, 1);
        close(fd);
        LOG_WARN("cannot take a connection: --max-connections reached (%d)", f->cfg.limits.max_connections);
        return;
    }
    bool fits_select = fd < FD_SETSIZE; /* the library refuses others, with ENFILE too */
    if (MHD_add_connection(f->daemon, fd, (const struct sockaddr *)addr, sizeof *addr) == MHD_YES) return;
    atomic_fetch_sub(&f->open, 1);
    /* the library closed it; ENFILE is its word for a limit */
    if (errno == ENFILE)
        LOG_WARN("cannot take a connection: %s",
                 fits_select ? "--max-per-ip reached" : "its descriptor is past those select() takes");
    else LOG_WARN("cannot take a connection: %s", strerror(errno));
}

/* Gives a connection's place back, then calls the configured callback. */
static void front_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode toe) {
    HttpFront *f = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) atomic_fetch_sub(&f->open, 1);
    if (f->cfg.connection_fn) f->cfg.connection_fn(f->cfg.ctx, c, socket_context, toe);
}

/* The library's unescaping of paths and query arguments, in place: %HH
 * decoded, except %00, which stays as it is written. Decoded, a NUL would
 * end the string every handler reads, so that /health%00x answered as
 * /health and /v1/responses/ID%00x acted on ID. */
static size_t front_unescape(void *cls, struct MHD_Connection *c, char *s) {
    char *w = s;
    for (const char *r = s; *r;) {
        int hi = r[0] == '%' ? utf8_hex_digit(r[1]) : -1, lo = hi >= 0 ? utf8_hex_digit(r[2]) : -1;
        if (lo >= 0 && (hi | lo) != 0) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

static void front_rejected(void *ctx, const char *method, const char *path, int status, const char *msg) {
    HttpFront *f = ctx;
    if (f->cfg.rejected_fn) f->cfg.rejected_fn(f->cfg.ctx, method, path, status, msg);
}

void http_limits_default(HttpLimits *l) {
    l->max_connections = 512;
    l->max_per_ip = 256;
    l->idle_timeout_s = 30;
}

int http_limits_check(const HttpLimits *l, int max_connections, MnErr *err) {
    if (max_connections > HTTP_MAX_CONNECTIONS) max_connections = HTTP_MAX_CONNECTIONS;
    if (l->max_connections < 1 || l->max_connections > max_connections)
        return mn_err_set(err, MN_EINVAL, "--max-connections must be in 1..%d, got %d", max_connections,
                          l->max_connections);
    /* a cap above max_connections is not refused: it only never binds, and
     * the default one (256) must not turn away a lower --max-connections */
    if (l->max_per_ip < 0)
        return mn_err_set(err, MN_EINVAL, "--max-per-ip must be 0 (no limit) or more, got %d", l->max_per_ip);
    if (!(l->idle_timeout_s >= HTTP_MIN_IDLE_TIMEOUT_S && l->idle_timeout_s <= HTTP_MAX_IDLE_TIMEOUT_S))
        return mn_err_set(err, MN_EINVAL, "--idle-timeout must be in %g..%g seconds, got %g", HTTP_MIN_IDLE_TIMEOUT_S,
                          HTTP_MAX_IDLE_TIMEOUT_S, l->idle_timeout_s);
    return MN_OK;
}

int http_front_new(const HttpFrontConfig *cfg, HttpFront **out, MnErr *err) {
    *out = NULL;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)cfg->port);
    if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1)
        return mn_err_set(err, MN_EINVAL, "--host %s is not an IPv4 address", cfg->host);
    int rc = http_limits_check(&cfg->limits, HTTP_MAX_CONNECTIONS, err);
    if (rc != MN_OK) return rc;
    HttpFront *f = mn_calloc(1, sizeof *f);
    if (f == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    f->cfg = *cfg;
    atomic_init(&f->open, 0);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG |
                     MHD_USE_ITC | MHD_USE_NO_LISTEN_SOCKET;
    /* the optional callbacks are added only when given */
    struct MHD_OptionItem opts[11];
    size_t n = 0;
    const HttpLimits *l = &cfg->limits;
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)mhd_log, NULL};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)(4 * GATE_HEAD_MAX), NULL};
    /* the library's timeout counts from a connection's last byte in or out:
     * a handler blocked on the engine is not timed (the answer it queues
     * restarts the count) and a stream sends a ping at least every second */
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)(l->idle_timeout_s + 0.5), NULL};
    /* a limit the library cannot reach (see the top of this file): it
     * counts only connections front_hand_over counted (at most
     * max_connections, itself at most HTTP_MAX_CONNECTIONS, below
     * FD_SETSIZE) plus, while its daemon thread cleans up, the one it has
     * reported closed (our place given back) and not yet uncounted; its
     * firm check runs on that same thread, after the clean-up */
    _Static_assert(HTTP_MAX_CONNECTIONS + 1 < FD_SETSIZE, "the library's own limit must stay out of reach");
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, FD_SETSIZE, NULL};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT, l->max_per_ip, NULL};
    if (cfg->completed_fn)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)cfg->completed_fn, cfg->ctx};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)front_connection, f};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)front_unescape, NULL};
    if (cfg->uri_fn) opts[n++] = (struct MHD_OptionItem){MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)cfg->uri_fn, cfg->ctx};
    opts[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    f->daemon = MHD_start_daemon(flags, 0, NULL, NULL, cfg->handler_fn, cfg->ctx, MHD_OPTION_ARRAY, opts,
                                 MHD_OPTION_END);
    if (f->daemon == NULL) {
        http_front_free(f);
        return mn_err_set(err, MN_EIO, "cannot start the HTTP server");
    }
    GateCallbacks cb = {.hand_over_fn = front_hand_over, .rejected_fn = front_rejected, .ctx = f};
    rc = gate_new(&addr, l->idle_timeout_s, &cb, &f->gate, err);
    if (rc != MN_OK) {
        http_front_free(f);
        return rc;
    }
    *out = f;
    return MN_OK;
}

int http_front_port(const HttpFront *f) { return gate_port(f->gate); }

void http_front_quiesce(HttpFront *f) { gate_quiesce(f->gate); }

void http_front_free(HttpFront *f) {
    if (f == NULL) return;
    gate_free(f->gate); /* first: it hands connections to the daemon */
    if (f->daemon) MHD_stop_daemon(f->daemon);
    mn_free(f);
}

/* ---- a request's body ------------------------------------------------------------------ */

/* The body's framing as the head declares it. */
typedef struct Framing {
    int n_lengths, n_codings;
    const char *length;   /* the first Content-Length */
    bool is_conflicting;  /* Content-Lengths that differ */
    bool is_chunked_only; /* every Transfer-Encoding is exactly "chunked" */
} Framing;

static enum MHD_Result framing_add(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    Framing *f = cls;
    if (strcasecmp(key, "Content-Length") == 0) {
        if (f->n_lengths++ == 0) f->length = value;
        else if (strcmp(value, f->length) != 0) f->is_conflicting = true;
    } else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        f->n_codings++;
        f->is_chunked_only = f->is_chunked_only && strcasecmp(value, "chunked") == 0;
    }
    return MHD_YES;
}

void http_body_limit_msg(size_t max_body, char *msg, size_t cap) {
    snprintf(msg, cap, "the request body is larger than %zu bytes (--max-body)", max_body);
}

int http_check_framing(struct MHD_Connection *c, size_t max_body, char *msg, size_t cap) {
    Framing f = {.is_chunked_only = true};
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_add, &f);
    const char *why = NULL;
    if (f.is_conflicting) why = "conflicting Content-Length headers";
    else if (f.n_lengths > 0 && f.n_codings > 0) why = "both Content-Length and Transfer-Encoding are set";
    else if (f.n_codings > 0 && !(f.n_codings == 1 && f.is_chunked_only))
        why = "unsupported Transfer-Encoding (only chunked is)";
    if (why) {
        snprintf(msg, cap, "%s", why);
        return 400;
    }
    /* libmicrohttpd parsed the value: digits that fit 64 bits */
    if (f.n_lengths > 0 && strtoull(f.length, NULL, 10) > max_body) {
        http_body_limit_msg(max_body, msg, cap);
        return 413;
    }
    return 0;
}

int http_body_add(HttpBody *b, const char *data, size_t n, size_t max_body) {
    if (b->len + n > max_body) return MN_EFULL;
    if (mn_reserve(&b->data, &b->cap, b->len + n + 1) != MN_OK) return MN_ENOMEM;
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return MN_OK;
}

void http_body_free(HttpBody *b) {
    mn_free(b->data);
    memset(b, 0, sizeof *b);
}

bool http_peer_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL) return false;
    /* POLLRDHUP, not a peek: a close after a byte nobody read is still a
     * close (a peek sees the byte and nothing after it) */
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

enum MHD_Result http_refuse_body(struct MHD_Connection *c, const char *msg, const char *extra_headers) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info) gate_write_error(info->connect_fd, 413, msg, extra_headers);
    return MHD_NO;
}

/* ---- the request log --------------------------------------------------------------------- */

/* src with quotes, backslashes and control characters escaped (the path and
 * messages come from the client), cut to fit cap. */
static void log_escape(char *dst, size_t cap, const char *src) {
    size_t n = 0;
    for (; *src && n + 5 < cap; src++) {
        unsigned char ch = (unsigned char)*src;
        if (ch == '"' || ch == '\\') n += (size_t)snprintf(dst + n, cap - n, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) n += (size_t)snprintf(dst + n, cap - n, "\\x%02x", ch);
        else dst[n++] = (char)ch;
    }
    dst[n] = '\0';
}

void http_log_answer(const char *method, const char *path, int status, const char *id, bool is_stream,
                     const char *detail) {
    char when[40], safe_path[256];
    double now = mn_wall_now();
    time_t t = (time_t)now;
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03dZ", (int)((now - (double)t) * 1000) % 1000);
    log_escape(safe_path, sizeof safe_path, path ? path : "-");
    LOG_INFO("%s %s %s %d id=%s stream=%d %s", when, method ? method : "-", safe_path, status, id ? id : "-",
             is_stream, detail);
}

void http_log_error(const char *method, const char *path, int status, const char *msg) {
    char detail[600];
    strcpy(detail, "error=\"");
    log_escape(detail + 7, sizeof detail - 8, msg ? msg : "");
    strcat(detail, "\"");
    http_log_answer(method, path, status, NULL, false, detail);
}
