/* gate.h — the listening socket in front of libmicrohttpd.
 *
 * libmicrohttpd 0.9.75 (Debian 12's) answers some malformed request heads
 * itself, before any callback of ours runs: an unparseable Content-Length
 * gets a broken reply (its 400 or 413 header block written twice, then
 * HTML), an unsupported HTTP version, a request line or head too large and
 * a header line without a colon get HTML pages, a bad request line gets no
 * answer at all. The gate accepts each connection, peeks (without reading)
 * at the head of its first request, answers those heads itself with one
 * well-formed response carrying an OpenAI error object, and hands every
 * other connection to the server unread. Later requests on a kept-alive
 * connection go to libmicrohttpd directly: the gate cannot see them.
 *
 * Threads: one gate thread owns the listening socket (until quiesced) and
 * the connections whose head it is waiting for; gate_quiesce and gate_free
 * may be called from any one other thread.
 */
#ifndef MN_GATE_H
#define MN_GATE_H

#include <netinet/in.h>
#include <stddef.h>

#include "base/err.h"

/* The largest head the gate waits for; a longer one is answered 414 or
 * 431. The server lets libmicrohttpd hold larger heads than this, so a
 * head the gate passes never hits the library's own limits. */
#define GATE_HEAD_MAX 16384
/* Header lines at most (each costs libmicrohttpd memory beyond its bytes). */
#define GATE_MAX_HEADERS 128

typedef struct GateCallbacks {
    /* Take a connection whose first head passed (or that the gate stopped
     * waiting for): the callee owns fd from now on, closed on failure. */
    void (*hand_over_fn)(void *ctx, int fd, const struct sockaddr_in *addr);
    /* The gate answered a head with status (for the request log and the
     * metrics); method and path are "-" when the request line was unusable. */
    void (*rejected_fn)(void *ctx, const char *method, const char *path, int status, const char *msg);
    void *ctx;
} GateCallbacks;

typedef struct Gate Gate;

/* Listen on addr (port 0: any free port) and start the gate thread; a
 * head is waited for at most head_wait_s (capped at the gate's own wait)
 * before the connection goes to the server unchecked.
 * Returns MN_OK and *out, or MN_EIO (cannot listen) / MN_ENOMEM with err set;
 * cb must stay valid until gate_free. */
int gate_new(const struct sockaddr_in *addr, double head_wait_s, const GateCallbacks *cb, Gate **out, MnErr *err);
/* The port bound. */
int gate_port(const Gate *g);
/* Stop accepting: on return new connections are refused. Connections
 * already accepted are still checked and handed over. */
void gate_quiesce(Gate *g);
/* Stop the thread, close the connections still waiting, free (NULL is fine). */
void gate_free(Gate *g);

/* Write a whole error answer to a connected socket: status line, Date,
 * Content-Type, Content-Length, Connection: close, extra_headers (CRLF-ended
 * lines, or NULL) and the OpenAI error object of msg. For answers
 * libmicrohttpd cannot queue; the caller closes the socket afterwards.
 * Returns MN_OK, MN_ENOMEM or MN_EIO (the peer is gone or does not read). */
int gate_write_error(int fd, int status, const char *msg, const char *extra_headers);

#endif
