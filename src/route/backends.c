/* backends.c — the backend table and its health thread (see backends.h).
 *
 * The health thread sleeps on the inbox's condition (CLOCK_MONOTONIC)
 * until a report comes or the next probe is due. Each round it takes the
 * reports (marking those backends down and scheduling their first probe
 * probe_min_s away), then probes at most one due backend with the inbox
 * unlocked, so reports never wait behind a probe. A probe is GET /health
 * through the thread's own Upstream, bounded by BACKENDS_PROBE_TIMEOUT_S,
 * so a backend that accepts and never answers delays the others' probes
 * by that much at most.
 *
 * Owners: url is immutable; is_up, n_downs are written by the health
 * thread only; in_flight by the connection threads (atomic adds);
 * is_reported and is_stopping are under the inbox lock; next_probe_s,
 * backoff_s and the probe Upstream belong to the health thread.
 */
#include "route/backends.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "route/ring.h"
#include "route/upstream.h"

/* A probe's whole exchange at most. */
#define BACKENDS_PROBE_TIMEOUT_S 5.0

typedef struct Backend {
    char *url;
    atomic_bool is_up;
    atomic_int in_flight;
    atomic_uint_fast64_t n_downs;
    double next_probe_s, backoff_s; /* the health thread's */
    bool is_reported;               /* under the inbox lock */
} Backend;

struct Backends {
    Backend *b; /* (n) */
    int n;
    double probe_min_s, probe_max_s, connect_timeout_s;
    pthread_mutex_t lock; /* the inbox */
    pthread_cond_t cv;
    bool is_stopping;     /* under the lock */
    atomic_bool stop;     /* the same, for a probe in progress */
    bool has_thread;
    pthread_t thread;
    Upstream *probe;      /* the health thread's */
};

/* ---- the health thread ------------------------------------------------------------------- */

/* GET /health of backend i answered 200. */
static bool probe_ok(Backends *bs, int i) {
    UpstreamReq req = {.base_url = bs->b[i].url,
                       .method = "GET",
                       .target = "/health",
                       .connect_timeout_s = bs->connect_timeout_s,
                       .timeout_s = BACKENDS_PROBE_TIMEOUT_S,
                       .stop = &bs->stop};
    MnErr err = {0};
    int status = 0;
    bool ok = upstream_begin(bs->probe, &req, &status, &err) == MN_OK && status == 200;
    char *body = NULL;
    size_t len;
    if (ok && upstream_read_all(bs->probe, 4096, &body, &len, &err) != MN_OK) ok = false;
    mn_free(body);
    upstream_end(bs->probe);
    return ok;
}

/* Take the reports (under the lock): mark those backends down. */
static void take_reports(Backends *bs) {
    for (int i = 0; i < bs->n; i++) {
        Backend *b = &bs->b[i];
        if (!b->is_reported) continue;
        b->is_reported = false;
        if (!atomic_load(&b->is_up)) continue; /* a report from before it went down */
        atomic_store(&b->is_up, false);
        atomic_fetch_add(&b->n_downs, 1);
        b->backoff_s = bs->probe_min_s;
        b->next_probe_s = mn_now() + b->backoff_s;
        LOG_WARN("backend %s is down: its requests go to the next on the ring; probing GET /health", b->url);
    }
}

static void wait_until(Backends *bs, double when_s) {
    if (isinf(when_s)) {
        pthread_cond_wait(&bs->cv, &bs->lock);
        return;
    }
    /* mn_now is CLOCK_MONOTONIC, the condition's clock */
    struct timespec ts = mn_timespec_of(when_s);
    pthread_cond_timedwait(&bs->cv, &bs->lock, &ts);
}

static void *health_main(void *arg) {
    Backends *bs = arg;
    pthread_mutex_lock(&bs->lock);
    while (!bs->is_stopping) {
        take_reports(bs);
        double now = mn_now(), earliest = INFINITY;
        int due = -1;
        for (int i = 0; i < bs->n; i++) {
            if (atomic_load(&bs->b[i].is_up)) continue;
            if (due < 0 && bs->b[i].next_probe_s <= now) due = i;
            if (bs->b[i].next_probe_s < earliest) earliest = bs->b[i].next_probe_s;
        }
        if (due < 0) {
            wait_until(bs, earliest);
            continue;
        }
        pthread_mutex_unlock(&bs->lock);
        Backend *b = &bs->b[due];
        bool ok = probe_ok(bs, due);
        if (ok) {
            atomic_store(&b->is_up, true);
            LOG_INFO("backend %s is up again (GET /health answered 200)", b->url);
        } else {
            b->backoff_s = fmin(2 * b->backoff_s, bs->probe_max_s);
            b->next_probe_s = mn_now() + b->backoff_s;
        }
        pthread_mutex_lock(&bs->lock);
    }
    pthread_mutex_unlock(&bs->lock);
    return NULL;
}

/* ---- the table -------------------------------------------------------------------------------- */

int backends_new(const BackendsConfig *cfg, Backends **out, MnErr *err) {
    *out = NULL;
    if (cfg->n_urls < 1 || cfg->n_urls > RING_MAX_NODES)
        return mn_err_set(err, MN_EINVAL, "between 1 and %d backends, got %d", RING_MAX_NODES, cfg->n_urls);
    for (int i = 0; i < cfg->n_urls; i++)
        if (strncmp(cfg->urls[i], "http://", 7) != 0 || cfg->urls[i][7] == '\0')
            return mn_err_set(err, MN_EINVAL, "--backend must be http://HOST:PORT, got '%s'", cfg->urls[i]);
    Backends *bs = mn_calloc(1, sizeof *bs);
    if (bs == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    bs->n = cfg->n_urls;
    bs->probe_min_s = cfg->probe_min_s;
    bs->probe_max_s = cfg->probe_max_s;
    bs->connect_timeout_s = cfg->connect_timeout_s;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&bs->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&bs->lock, NULL);
    bs->b = mn_calloc((size_t)bs->n, sizeof *bs->b);
    int rc = bs->b ? upstream_new(&bs->probe) : MN_ENOMEM;
    for (int i = 0; rc == MN_OK && i < bs->n; i++) {
        Backend *b = &bs->b[i];
        if ((b->url = mn_strdup(cfg->urls[i])) == NULL) rc = MN_ENOMEM;
        else {
            size_t len = strlen(b->url);
            while (len > 7 && b->url[len - 1] == '/') b->url[--len] = '\0';
        }
        atomic_init(&b->is_up, true);
        atomic_init(&b->in_flight, 0);
        atomic_init(&b->n_downs, 0);
    }
    if (rc != MN_OK) {
        backends_free(bs);
        return mn_err_set(err, rc, "out of memory");
    }
    atomic_init(&bs->stop, false);
    if (pthread_create(&bs->thread, NULL, health_main, bs) != 0) {
        backends_free(bs);
        return mn_err_set(err, MN_EIO, "cannot start the health thread");
    }
    bs->has_thread = true;
    *out = bs;
    return MN_OK;
}

void backends_free(Backends *bs) {
    if (bs == NULL) return;
    if (bs->has_thread) {
        pthread_mutex_lock(&bs->lock);
        bs->is_stopping = true;
        atomic_store(&bs->stop, true);
        pthread_cond_signal(&bs->cv);
        pthread_mutex_unlock(&bs->lock);
        pthread_join(bs->thread, NULL);
    }
    for (int i = 0; bs->b && i < bs->n; i++) mn_free(bs->b[i].url);
    mn_free(bs->b);
    upstream_free(bs->probe);
    pthread_cond_destroy(&bs->cv);
    pthread_mutex_destroy(&bs->lock);
    mn_free(bs);
}

int backends_count(const Backends *bs) { return bs->n; }

const char *backends_url(const Backends *bs, int i) { return bs->b[i].url; }

bool backends_is_up(const Backends *bs, int i) { return atomic_load(&bs->b[i].is_up); }

int backends_load(const Backends *bs, int i) { return atomic_load(&bs->b[i].in_flight); }

uint64_t backends_n_downs(const Backends *bs, int i) { return atomic_load(&bs->b[i].n_downs); }

void backends_acquire(Backends *bs, int i) { atomic_fetch_add(&bs->b[i].in_flight, 1); }

void backends_release(Backends *bs, int i) { atomic_fetch_sub(&bs->b[i].in_flight, 1); }

void backends_report_failure(Backends *bs, int i) {
    pthread_mutex_lock(&bs->lock);
    bs->b[i].is_reported = true;
    pthread_cond_signal(&bs->cv);
    pthread_mutex_unlock(&bs->lock);
}
