/* backends.h — the router's backends: where each one is, whether it is up,
 * how many requests each holds, and the health thread that brings a failed
 * one back.
 *
 * Every backend is up at the start. A request that finds one refusing
 * connections, breaking off before its answer's head, or answering 5xx
 * before any byte went to the client reports it (backends_report_failure)
 * and tries the next one. The health thread owns the up flags: it marks a
 * reported backend down at once, then asks it GET /health — first after
 * probe_min_s, then after twice as long each time the probe fails, up to
 * probe_max_s — and marks it up again at the first 200. A backend is
 * never marked down by a probe, only by a request's report: one that is
 * up is not probed.
 *
 * Threads: connection threads read the up flags and count their requests
 * in flight per backend (atomics), and hand their reports to the health
 * thread through its inbox (a pending flag per backend under the inbox
 * lock, so repeated reports of one backend coalesce). Only the health
 * thread writes the up flags and the probe schedule.
 */
#ifndef MN_BACKENDS_H
#define MN_BACKENDS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

typedef struct BackendsConfig {
    const char *const *urls;  /* "http://host:port" each (copied, trailing slashes dropped) */
    int n_urls;               /* 1..RING_MAX_NODES */
    double probe_min_s;       /* the first probe after a failure, > 0 */
    double probe_max_s;       /* the longest wait between probes, >= probe_min_s */
    double connect_timeout_s; /* a probe's connection at most; > 0 */
} BackendsConfig;

typedef struct Backends Backends;

/* The table and its health thread. MN_OK and *out; MN_EINVAL (a URL that
 * is not http://...), MN_ENOMEM, MN_EIO (no thread), with err set. */
int backends_new(const BackendsConfig *cfg, Backends **out, MnErr *err);
/* Stop the health thread (within about a second) and free. NULL is fine. */
void backends_free(Backends *b);

int backends_count(const Backends *b);
/* Backend i's URL, without a trailing slash; valid until backends_free. */
const char *backends_url(const Backends *b, int i);

bool backends_is_up(const Backends *b, int i);
/* Requests in flight on backend i. */
int backends_load(const Backends *b, int i);
/* Times backend i was marked down since the start. */
uint64_t backends_n_downs(const Backends *b, int i);

/* A request begins (acquire) or ends (release) on backend i. */
void backends_acquire(Backends *b, int i);
void backends_release(Backends *b, int i);

/* Backend i failed a request before its client saw a byte: the health
 * thread marks it down (if it is up) and probes it. */
void backends_report_failure(Backends *b, int i);

#endif
