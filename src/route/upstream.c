/* upstream.c — an exchange with a backend over libcurl (see upstream.h).
 *
 * Each Upstream owns a curl multi handle with one easy handle in it, driven
 * by the thread that pulls: "pump" runs curl_multi_perform and, when that
 * brought nothing, waits in curl_multi_poll for at most a second (so the
 * stop flag is seen), until the head is in (upstream_begin) or body bytes
 * are (upstream_read). libcurl's callbacks run inside curl_multi_perform on
 * that same thread: the header callback keeps the final head's lines (a
 * "HTTP/" status line starts a head afresh, so an interim 100 Continue is
 * forgotten) and marks the head complete at its empty line; the write
 * callback appends to the body buffer, which the reader drains. At most
 * what one curl_multi_perform receives is held, never the whole body.
 * "Expect:" is sent empty so a large body goes at once instead of waiting
 * for a 100 Continue, and a request without a Content-Type of its own gets
 * none (libcurl would add a form type to a POST). The multi handle keeps
 * its connections between exchanges: a finished exchange leaves its
 * connection for the next one to the same backend; one cut short closes
 * it. A backend that stays silent longer than the request's silence_s
 * (it accepted the connection but never answers, or stopped mid-body)
 * ends the exchange as timed out, so it cannot hold the router's thread.
 */
#include "route/upstream.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/clock.h"
#include "base/mem.h"

/* How long one wait for the backend lasts before the stop flag is looked at. */
#define UPSTREAM_POLL_MS 1000
/* The largest head kept (bytes of header lines); later lines are dropped. */
#define UPSTREAM_HEAD_MAX 16384

struct Upstream {
    CURLM *multi;
    CURL *easy;
    bool is_attached;         /* an exchange is in progress: easy is in multi */
    bool is_head_done, is_done;
    CURLcode result;          /* is_done: how the transfer ended */
    struct curl_slist *hs;
    char *url;
    char head[UPSTREAM_HEAD_MAX]; /* the head's lines, each "Name: value" and a NUL */
    size_t head_len;
    char *body;               /* received, not yet read: body[body_off..body_len) */
    size_t body_len, body_off, body_cap;
    bool is_oom, is_timed_out;
    double silence_s;         /* the exchange's UpstreamReq.silence_s */
    const atomic_bool *stop;
    char errbuf[CURL_ERROR_SIZE];
};

/* ---- libcurl's callbacks ---------------------------------------------------------------- */

static size_t on_header(char *p, size_t sz, size_t n, void *ctx) {
    Upstream *u = ctx;
    size_t len = sz * n, k = len;
    while (k > 0 && (p[k - 1] == '\n' || p[k - 1] == '\r')) k--;
    if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) { /* a status line: a new head */
        u->head_len = 0;
        u->is_head_done = false;
    } else if (k == 0) { /* the empty line: the head is complete unless it was an interim 1xx */
        long status = 0;
        curl_easy_getinfo(u->easy, CURLINFO_RESPONSE_CODE, &status);
        if (status >= 200) u->is_head_done = true;
    } else if (u->head_len + k + 1 <= sizeof u->head) {
        memcpy(u->head + u->head_len, p, k);
        u->head[u->head_len + k] = '\0';
        u->head_len += k + 1;
    }
    return len;
}

static size_t on_body(char *p, size_t sz, size_t n, void *ctx) {
    Upstream *u = ctx;
    size_t len = sz * n;
    if (u->body_off == u->body_len) u->body_off = u->body_len = 0;
    if (mn_reserve(&u->body, &u->body_cap, u->body_len + len + 1) != MN_OK) {
        u->is_oom = true;
        return 0; /* aborts the transfer */
    }
    memcpy(u->body + u->body_len, p, len);
    u->body_len += len;
    return len;
}

/* ---- the pump ------------------------------------------------------------------------------ */

static bool head_is_in(const Upstream *u) { return u->is_head_done; }
static bool body_is_in(const Upstream *u) { return u->body_len > u->body_off; }

/* Drive the transfer until ready(u) holds or it ended (or the backend was
 * silent for u->silence_s: it ends as timed out): MN_OK, or MN_ECANCELED
 * when the stop flag was set first. */
static int pump(Upstream *u, bool (*ready)(const Upstream *u)) {
    double give_up = u->silence_s > 0 ? mn_now() + u->silence_s : 0;
    for (;;) {
        int running = 0;
        CURLMcode mc = curl_multi_perform(u->multi, &running);
        int n_left;
        CURLMsg *msg;
        while ((msg = curl_multi_info_read(u->multi, &n_left)) != NULL)
            if (msg->msg == CURLMSG_DONE && !u->is_timed_out) {
                u->is_done = true;
                u->result = msg->data.result;
            }
        if (mc != CURLM_OK && !u->is_done) {
            u->is_done = true;
            u->result = CURLE_FAILED_INIT;
            snprintf(u->errbuf, sizeof u->errbuf, "%s", curl_multi_strerror(mc));
        }
        if (ready(u) || u->is_done) return MN_OK;
        if (u->stop && atomic_load(u->stop)) return MN_ECANCELED;
        int wait_ms = UPSTREAM_POLL_MS;
        if (give_up > 0) {
            double left = give_up - mn_now();
            if (left <= 0) {
                u->is_done = u->is_timed_out = true;
                u->result = CURLE_OPERATION_TIMEDOUT;
                snprintf(u->errbuf, sizeof u->errbuf, "the backend sent nothing for %g s", u->silence_s);
                return MN_OK;
            }
            if (left * 1000 < wait_ms) wait_ms = (int)(left * 1000) + 1;
        }
        curl_multi_poll(u->multi, NULL, 0, wait_ms, NULL);
    }
}

/* The reason a transfer failed, into err. */
static int transfer_error(Upstream *u, MnErr *err) {
    if (u->is_oom) return mn_err_set(err, MN_ENOMEM, "out of memory");
    return mn_err_set(err, MN_EIO, "%s%s%s", curl_easy_strerror(u->result), u->errbuf[0] ? ": " : "", u->errbuf);
}

/* ---- API ------------------------------------------------------------------------------------ */

int upstream_new(Upstream **out) {
    *out = NULL;
    Upstream *u = mn_calloc(1, sizeof *u);
    if (u == NULL) return MN_ENOMEM;
    u->multi = curl_multi_init();
    u->easy = curl_easy_init();
    if (u->multi == NULL || u->easy == NULL) {
        upstream_free(u);
        return MN_ENOMEM;
    }
    *out = u;
    return MN_OK;
}

void upstream_free(Upstream *u) {
    if (u == NULL) return;
    upstream_end(u);
    if (u->easy) curl_easy_cleanup(u->easy);
    if (u->multi) curl_multi_cleanup(u->multi);
    mn_free(u->body);
    mn_free(u);
}

/* Append a line to the request's headers (u->hs, freed by upstream_end). */
static int add_header(Upstream *u, const char *line) {
    struct curl_slist *hs = curl_slist_append(u->hs, line);
    if (hs == NULL) return MN_ENOMEM;
    u->hs = hs;
    return MN_OK;
}

/* The request's options on a freshly reset easy handle. */
static int set_request(Upstream *u, const UpstreamReq *req) {
    size_t n = strlen(req->base_url) + strlen(req->target) + 1;
    u->url = mn_malloc(n);
    if (u->url == NULL) return MN_ENOMEM;
    snprintf(u->url, n, "%s%s", req->base_url, req->target);
    bool has_type = false;
    int rc = add_header(u, "Expect:");
    for (int i = 0; rc == MN_OK && req->headers && req->headers[i]; i++) {
        has_type = has_type || strncasecmp(req->headers[i], "Content-Type:", 13) == 0;
        rc = add_header(u, req->headers[i]);
    }
    if (rc == MN_OK && !has_type) rc = add_header(u, "Content-Type:");
    if (rc != MN_OK) return rc;
    CURL *h = u->easy;
    curl_easy_setopt(h, CURLOPT_URL, u->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, u->hs);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(req->connect_timeout_s * 1000 + 0.5));
    if (req->timeout_s > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(req->timeout_s * 1000 + 0.5));
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, u);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, u);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, u->errbuf);
    if (strcmp(req->method, "GET") == 0) {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    } else if (strcmp(req->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else {
        if (strcmp(req->method, "POST") != 0) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
        if (strcmp(req->method, "POST") == 0 || req->body_len > 0) {
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, req->body ? req->body : "");
        }
    }
    return MN_OK;
}

int upstream_begin(Upstream *u, const UpstreamReq *req, int *status, MnErr *err) {
    upstream_end(u);
    *status = 0;
    curl_easy_reset(u->easy);
    u->stop = req->stop;
    u->silence_s = req->silence_s;
    if (set_request(u, req) != MN_OK) {
        upstream_end(u);
        return mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    if (curl_multi_add_handle(u->multi, u->easy) != CURLM_OK) {
        upstream_end(u);
        return mn_err_set(err, MN_ENOMEM, "cannot start a transfer");
    }
    u->is_attached = true;
    if (pump(u, head_is_in) == MN_ECANCELED) return mn_err_set(err, MN_ECANCELED, "the router is stopping");
    if (!u->is_head_done) return transfer_error(u, err);
    long st = 0;
    curl_easy_getinfo(u->easy, CURLINFO_RESPONSE_CODE, &st);
    *status = (int)st;
    return MN_OK;
}

bool upstream_is_timed_out(const Upstream *u) { return u->is_timed_out; }

const char *upstream_header(const Upstream *u, const char *name) {
    size_t n = strlen(name);
    for (size_t at = 0; at < u->head_len; at += strlen(u->head + at) + 1) {
        const char *line = u->head + at;
        if (strncasecmp(line, name, n) != 0 || line[n] != ':') continue;
        const char *v = line + n + 1;
        while (*v == ' ' || *v == '\t') v++;
        return v;
    }
    return NULL;
}

int64_t upstream_content_length(const Upstream *u) {
    curl_off_t n = -1;
    if (curl_easy_getinfo(u->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &n) != CURLE_OK) return -1;
    return (int64_t)n;
}

ssize_t upstream_read(Upstream *u, char *buf, size_t max, MnErr *err) {
    if (!u->is_attached) return 0;
    if (!body_is_in(u) && pump(u, body_is_in) == MN_ECANCELED) {
        mn_err_set(err, MN_ECANCELED, "the router is stopping");
        return -1;
    }
    if (body_is_in(u)) {
        size_t k = u->body_len - u->body_off;
        if (k > max) k = max;
        memcpy(buf, u->body + u->body_off, k);
        u->body_off += k;
        return (ssize_t)k;
    }
    if (u->result == CURLE_OK && !u->is_oom) return 0;
    transfer_error(u, err);
    return -1;
}

int upstream_read_all(Upstream *u, size_t max, char **out, size_t *len, MnErr *err) {
    char *all = NULL;
    size_t n = 0, cap = 0;
    int rc = MN_OK;
    for (;;) { /* up to max + 1 bytes: one more than max says it is longer */
        size_t want = max + 1 - n < 4096 ? max + 1 - n : 4096;
        if (mn_reserve(&all, &cap, n + want + 1) != MN_OK) {
            rc = mn_err_set(err, MN_ENOMEM, "out of memory");
            break;
        }
        ssize_t k = upstream_read(u, all + n, want, err);
        if (k < 0) {
            rc = err->code ? err->code : MN_EIO;
            break;
        }
        n += (size_t)k;
        if (k == 0) break;
        if (n > max) {
            n = max;
            rc = MN_EFULL;
            break;
        }
    }
    if (all) all[n] = '\0';
    *out = all;
    *len = all ? n : 0;
    return rc;
}

void upstream_end(Upstream *u) {
    if (u->is_attached) curl_multi_remove_handle(u->multi, u->easy);
    u->is_attached = u->is_head_done = u->is_done = u->is_oom = u->is_timed_out = false;
    u->result = CURLE_OK;
    curl_slist_free_all(u->hs);
    u->hs = NULL;
    mn_free(u->url);
    u->url = NULL;
    u->head_len = 0;
    u->body_len = u->body_off = 0;
    u->errbuf[0] = '\0';
    u->stop = NULL;
}
