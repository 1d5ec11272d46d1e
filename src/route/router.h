/* router.h — `mnemo route`: an HTTP front that sends each request to the
 * mnemo server most likely to hold its conversation's cache.
 *
 * Every request but GET /health and GET /metrics (the router's own) is
 * passed to one backend: method, request target, body and the headers a
 * server reads (Authorization, Content-Type, Accept, X-Session-Id,
 * X-Cache-Namespace, Origin, Access-Control-Request-*) go out as they
 * came; the answer's status, body and headers (Content-Type,
 * Cache-Control, Retry-After, WWW-Authenticate, Allow, Vary,
 * Access-Control-*) come back as they are, a stream chunk by chunk as it
 * arrives.
 *
 * Which backend: route/convkey names the conversation, route/ring places
 * it (policy hash: consistent hashing with bounded loads; round-robin: the
 * backends in turn, for comparison), and a request that needs a stored
 * response goes first to the backend that made it (route/idmap). A backend
 * that refuses the connection, breaks off before its head, or answers 5xx
 * is reported down (route/backends) and the request goes to the next in
 * the plan; when a stored response is not found where it was looked for
 * (404, or 400 previous_response_not_found) the next backend is asked too.
 * When every backend failed, the last backend's answer is passed on (5xx
 * or not-found), or, when none answered at all, 503 with an OpenAI error
 * object. Nothing is retried once a byte of the answer went to the client.
 *
 * Threads: server/http's front (a thread per client connection, which
 * blocks on its backend), the health thread of route/backends. The
 * Router's fields are read-only after router_new except the idle Upstream
 * handles (under their lock), the drain count (under its lock), the
 * round-robin counter and the stop flag (atomics), and the thread-safe
 * metrics registry and id map.
 */
#ifndef MN_ROUTER_H
#define MN_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"
#include "server/http.h"

typedef enum RoutePolicy { ROUTE_POLICY_HASH, ROUTE_POLICY_ROUND_ROBIN } RoutePolicy;

/* Client connections at most: each may hold a connection to a backend
 * too, and both need descriptors below select()'s 1024. */
#define ROUTER_MAX_CONNECTIONS (HTTP_MAX_CONNECTIONS / 2)

typedef struct RouterOptions {
    const char *host;            /* default "127.0.0.1" */
    int port;                    /* default 8090; 0 = any free port */
    const char *const *backends; /* base URLs, "http://host:port" */
    int n_backends;              /* 1..RING_MAX_NODES */
    RoutePolicy policy;          /* default ROUTE_POLICY_HASH */
    double load_factor;          /* bounded loads' c (>= 1; 0: load never moves a request); default 1.25 */
    size_t max_body;             /* request body bytes at most (default 1 MiB, as serve's) */
    size_t max_response_ids;     /* response ids remembered (default 65536) */
    double connect_timeout_s;    /* a backend's connection at most (default 2) */
    double upstream_timeout_s;   /* a backend silent this long, before its head or within its body, has
                                    failed (default 600) */
    double probe_min_s;          /* first health probe after a failure (default 0.25) */
    double probe_max_s;          /* longest wait between probes (default 5) */
    HttpLimits limits;           /* client connections: max_connections at most ROUTER_MAX_CONNECTIONS
                                    (default 256, max_per_ip 128) */
} RouterOptions;

typedef struct Router Router;

void router_options_default(RouterOptions *o);
/* "hash" or "round-robin" -> *policy: MN_OK or MN_EINVAL. */
int router_policy_parse(const char *name, RoutePolicy *policy);
const char *router_policy_name(RoutePolicy policy);

/* Listen and start. MN_OK and *out; MN_EINVAL (a bad option, named in
 * err), MN_EIO (cannot listen), MN_ENOMEM. */
int router_new(const RouterOptions *o, Router **out, MnErr *err);
/* The port bound (useful with port 0). */
int router_port(const Router *r);
/* Stop accepting connections; requests in progress go on. */
void router_quiesce(Router *r);
/* Wait until no request is in progress, at most timeout_s seconds: true
 * when none is. */
bool router_drain(Router *r, double timeout_s);
/* Cut what is still in progress (within about a second), stop, free.
 * NULL is fine. */
void router_free(Router *r);

#endif
