/* gate.c — the listening socket in front of libmicrohttpd (see gate.h).
 *
 * The gate thread polls the listening socket, a wake-up eventfd and the
 * accepted connections whose first head is not complete yet (`pending`,
 * owned by the gate thread alone). It never reads a pending connection: it
 * peeks (MSG_PEEK) at what arrived and sets SO_RCVLOWAT one byte above it,
 * so poll wakes it only when more came. When the head is complete it is
 * checked (head_check): a good one goes to the server unread, with
 * SO_RCVLOWAT back at 1; a bad one is answered here and closed. A
 * connection whose head does not complete within GATE_HEAD_WAIT_S, or that
 * must make room for a newer one, goes to the server unchecked — the gate
 * only ever answers heads it has seen whole, so it never serves anyone
 * worse than libmicrohttpd alone would.
 *
 * head_check mirrors what libmicrohttpd 0.9.75 rejects on its own before
 * calling the server (src/microhttpd/connection.c: parse_http_version,
 * parse_connection_headers, process_header_line, get_next_header_line),
 * plus whitespace before a header's colon (RFC 9112 §5.1: a server MUST
 * reject it; libmicrohttpd keeps the space in the name, so a
 * "Content-Length :" would be ignored). Everything else about a request is
 * the server's to judge.
 */
#include "server/gate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "server/api_base.h"

/* Connections waiting for their head at most; one more hands the oldest over. */
#define GATE_MAX_PENDING 64
/* How long a head may take to arrive before the gate hands it over unchecked. */
#define GATE_HEAD_WAIT_S 10.0
/* How long the listening socket is left out of the poll once the process
 * is out of descriptors or memory (it stays readable: polled, it would spin). */
#define GATE_FD_PAUSE_S 0.1
/* How long writing an answer may wait for the peer to take bytes. */
#define GATE_WRITE_WAIT_MS 5000

/* ---- types ---------------------------------------------------------------------- */

typedef struct Pending {
    int fd;
    struct sockaddr_in addr;
    double since;  /* mn_now() at accept */
} Pending;

struct Gate {
    GateCallbacks cb;
    int listen_fd;         /* the gate thread closes it once quiesced */
    int wake_fd;           /* eventfd: quiesce or stop */
    int port;
    double head_wait_s;    /* GATE_HEAD_WAIT_S, or the server's idle timeout when shorter */
    double accept_paused_until; /* mn_now() until which accepting waits (out of descriptors or memory) */
    bool is_fd_short;      /* the last accept failed for want of a descriptor or memory (said once) */
    atomic_bool is_quiesced, is_stopping;
    pthread_t thread;
    bool has_thread;
    Pending pending[GATE_MAX_PENDING]; /* owner: the gate thread */
    int n_pending;
    char peek[GATE_HEAD_MAX];          /* owner: the gate thread */
};

typedef enum HeadVerdict { HEAD_MORE, HEAD_PASS, HEAD_BAD } HeadVerdict;

/* What head_check found out about a head it refused. */
typedef struct HeadCheck {
    int status;
    char msg[160];
    char method[24], path[200]; /* "-" when the request line was unusable */
} HeadCheck;

/* ---- the head check --------------------------------------------------------------- */

static bool is_tchar(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* The next line of buf[*pos..n) without its CRLF (or bare LF, which
 * libmicrohttpd accepts too); false when no line end has arrived yet. */
static bool next_line(const char *buf, size_t n, size_t *pos, const char **line, size_t *len) {
    const char *nl = memchr(buf + *pos, '\n', n - *pos);
    if (nl == NULL) return false;
    *line = buf + *pos;
    *len = (size_t)(nl - *line);
    if (*len > 0 && (*line)[*len - 1] == '\r') (*len)--;
    *pos = (size_t)(nl - buf) + 1;
    return true;
}

static HeadVerdict head_bad(HeadCheck *hc, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static HeadVerdict head_bad(HeadCheck *hc, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(hc->msg, sizeof hc->msg, fmt, ap);
    va_end(ap);
    hc->status = status;
    return HEAD_BAD;
}

/* "METHOD TARGET HTTP/1.x", words split on runs of spaces as libmicrohttpd
 * splits them; fills hc's method and path for the log. */
static HeadVerdict check_request_line(const char *line, size_t len, HeadCheck *hc) {
    const char *word[3] = {NULL, NULL, NULL}; /* first, second, last */
    size_t word_len[3] = {0, 0, 0};
    int n_words = 0;
    for (size_t i = 0; i < len;) {
        if (line[i] == ' ') {
            i++;
            continue;
        }
        size_t start = i;
        while (i < len && line[i] != ' ') i++;
        int slot = n_words < 2 ? n_words : 2;
        word[slot] = line + start;
        word_len[slot] = i - start;
        n_words++;
    }
    if (n_words >= 1) {
        bool is_token = word_len[0] < sizeof hc->method;
        for (size_t i = 0; is_token && i < word_len[0]; i++) is_token = is_tchar(word[0][i]);
        if (!is_token) return head_bad(hc, 400, "malformed request line: the method is not a token");
        snprintf(hc->method, sizeof hc->method, "%.*s", (int)word_len[0], word[0]);
    }
    if (n_words >= 2) snprintf(hc->path, sizeof hc->path, "%.*s", (int)word_len[1], word[1]);
    if (n_words < 3) return head_bad(hc, 400, "malformed request line: expected METHOD TARGET HTTP/1.1");
    const char *v = word[2];
    if (word_len[2] != 8 || memcmp(v, "HTTP/", 5) != 0 || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' ||
        v[7] > '9')
        return head_bad(hc, 400, "malformed request line: '%.*s' is not an HTTP version", (int)(word_len[2] < 16 ? word_len[2] : 16), v);
    if (v[5] != '1') return head_bad(hc, 505, "%.8s is not supported: this server speaks HTTP/1.1", v);
    return HEAD_PASS;
}

/* A Content-Length value as libmicrohttpd parses it: digits only (no
 * surrounding whitespace after the leading OWS it skips), fitting 64 bits. */
static HeadVerdict check_content_length(const char *value, size_t len, HeadCheck *hc) {
    uint64_t v = 0;
    bool is_digits = len > 0, is_overflow = false;
    for (size_t i = 0; is_digits && i < len; i++) {
        is_digits = value[i] >= '0' && value[i] <= '9';
        unsigned d = (unsigned)(value[i] - '0');
        if (is_digits && v > (UINT64_MAX - d) / 10) is_overflow = true;
        v = v * 10 + d;
    }
    int shown = len < 32 ? (int)len : 32;
    if (!is_digits) return head_bad(hc, 400, "Content-Length '%.*s' is not a number", shown, value);
    if (is_overflow)
        return head_bad(hc, 413, "Content-Length %.*s%s is too large", shown, value, (size_t)shown < len ? "..." : "");
    return HEAD_PASS;
}

/* Judge the head at the start of buf[0..n); is_full: n is all the gate
 * will ever look at. */
static HeadVerdict head_check(const char *buf, size_t n, bool is_full, HeadCheck *hc) {
    memset(hc, 0, sizeof *hc);
    strcpy(hc->method, "-");
    strcpy(hc->path, "-");
    size_t pos = 0, len;
    const char *line;
    do { /* empty lines before the request line are skipped, as libmicrohttpd does */
        if (!next_line(buf, n, &pos, &line, &len))
            return is_full ? head_bad(hc, 414, "the request line is longer than %d bytes", GATE_HEAD_MAX) : HEAD_MORE;
    } while (len == 0);
    HeadVerdict v = check_request_line(line, len, hc);
    if (v != HEAD_PASS) return v;
    bool is_after_cl = false; /* the previous header line was Content-Length */
    for (int n_lines = 0;; n_lines++) {
        if (!next_line(buf, n, &pos, &line, &len))
            return is_full ? head_bad(hc, 431, "the request head is larger than %d bytes", GATE_HEAD_MAX) : HEAD_MORE;
        if (len == 0) return HEAD_PASS;
        if (n_lines == GATE_MAX_HEADERS) return head_bad(hc, 431, "more than %d header lines", GATE_MAX_HEADERS);
        if (line[0] == ' ' || line[0] == '\t') { /* obs-fold: libmicrohttpd joins it to the previous value */
            if (n_lines == 0 || is_after_cl) return head_bad(hc, 400, "malformed header: a folded line");
            continue;
        }
        const char *colon = memchr(line, ':', len);
        if (colon == NULL) return head_bad(hc, 400, "malformed header: '%.*s' has no colon", len < 32 ? (int)len : 32, line);
        size_t name_len = (size_t)(colon - line);
        for (size_t i = 0; i < name_len; i++)
            if (!is_tchar(line[i]))
                return head_bad(hc, 400, "malformed header: the name '%.*s' is not a token",
                                name_len < 32 ? (int)name_len : 32, line);
        if (name_len == 0) return head_bad(hc, 400, "malformed header: no name before the colon");
        is_after_cl = name_len == 14 && strncasecmp(line, "Content-Length", 14) == 0;
        if (is_after_cl) {
            const char *value = colon + 1, *end = line + len;
            while (value < end && (*value == ' ' || *value == '\t')) value++;
            if ((v = check_content_length(value, (size_t)(end - value), hc)) != HEAD_PASS) return v;
        }
    }
}

/* ---- answers on raw sockets ----------------------------------------------------------- */

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd w = {.fd = fd, .events = POLLOUT};
            if (poll(&w, 1, GATE_WRITE_WAIT_MS) != 1) return MN_EIO;
        } else {
            return MN_EIO;
        }
    }
    return MN_OK;
}

/* An HTTP date (RFC 9110 §5.6.7) of now; English names whatever the locale. */
static void http_date(char *buf, size_t cap) {
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(buf, cap, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday], tm.tm_mday, months[tm.tm_mon],
             tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

int gate_write_error(int fd, int status, const char *msg, const char *extra_headers) {
    char *json = api_error_json(status, msg, NULL, NULL);
    if (json == NULL) return MN_ENOMEM;
    const char *reason = MHD_get_reason_phrase_for((unsigned)status);
    char date[64], head[1024];
    http_date(date, sizeof date);
    size_t body_len = strlen(json);
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n%s\r\n",
                     status, reason[0] ? reason : "Error", date, body_len, extra_headers ? extra_headers : "");
    int rc = n > 0 && (size_t)n < sizeof head ? write_all(fd, head, (size_t)n) : MN_EINVAL;
    if (rc == MN_OK) rc = write_all(fd, json, body_len);
    mn_free(json);
    return rc;
}

/* ---- the gate thread -------------------------------------------------------------------- */

static void pending_remove(Gate *g, int i) {
    g->pending[i] = g->pending[--g->n_pending];
}

static void hand_over(Gate *g, int i) {
    int one = 1;
    Pending p = g->pending[i];
    pending_remove(g, i);
    setsockopt(p.fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    g->cb.hand_over_fn(g->cb.ctx, p.fd, &p.addr);
}

static void pending_close(Gate *g, int i) {
    close(g->pending[i].fd);
    pending_remove(g, i);
}

/* Answer a refused head: drop what was peeked (so closing does not reset
 * the connection over unread bytes the client already sent), write the
 * error, close. */
static void refuse(Gate *g, int i, size_t n_peeked, const HeadCheck *hc) {
    int fd = g->pending[i].fd;
    while (n_peeked > 0) {
        ssize_t k = recv(fd, g->peek, n_peeked, MSG_DONTWAIT);
        if (k <= 0) break;
        n_peeked -= (size_t)k;
    }
    g->cb.rejected_fn(g->cb.ctx, hc->method, hc->path, hc->status, hc->msg); /* logged before it is seen */
    gate_write_error(fd, hc->status, hc->msg, NULL);
    shutdown(fd, SHUT_WR);
    pending_close(g, i);
}

/* Something happened on pending connection i (revents): look at its head. */
static void pending_check(Gate *g, int i, short revents) {
    int fd = g->pending[i].fd;
    ssize_t n = recv(fd, g->peek, sizeof g->peek, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) { /* gone, or closed before sending anything */
        pending_close(g, i);
        return;
    }
    HeadCheck hc;
    switch (head_check(g->peek, (size_t)n, (size_t)n == sizeof g->peek, &hc)) {
    case HEAD_PASS: hand_over(g, i); return;
    case HEAD_BAD: refuse(g, i, (size_t)n, &hc); return;
    case HEAD_MORE:
        if (revents & (POLLRDHUP | POLLHUP | POLLERR)) { /* the client stopped sending mid-head */
            pending_close(g, i);
            return;
        }
        int lowat = (int)n + 1; /* wake when more than what was seen has come */
        setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat);
        return;
    }
}

static void accept_one(Gate *g) {
    Pending p;
    socklen_t len = sizeof p.addr;
    p.fd = accept4(g->listen_fd, (struct sockaddr *)&p.addr, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (p.fd < 0) {
        /* out of descriptors or of kernel memory: the connection waits in
         * the backlog (the kernel fails before taking it off the queue) */
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            if (!g->is_fd_short)
                LOG_WARN("accept: %s: new connections wait in the listen backlog", strerror(errno));
            g->is_fd_short = true;
            g->accept_paused_until = mn_now() + GATE_FD_PAUSE_S;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
            LOG_WARN("accept: %s", strerror(errno));
        }
        return;
    }
    g->is_fd_short = false;
    p.since = mn_now();
    if (g->n_pending == GATE_MAX_PENDING) { /* make room: the oldest goes over unchecked */
        int oldest = 0;
        for (int i = 1; i < g->n_pending; i++)
            if (g->pending[i].since < g->pending[oldest].since) oldest = i;
        hand_over(g, oldest);
    }
    g->pending[g->n_pending++] = p;
}

/* Until the first pending head's wait ends, or accepting resumes. */
static int poll_timeout_ms(const Gate *g, double now) {
    bool is_paused = g->accept_paused_until > now;
    if (g->n_pending == 0 && !is_paused) return -1;
    double next = is_paused ? g->accept_paused_until : g->pending[0].since + g->head_wait_s;
    for (int i = 0; i < g->n_pending; i++)
        if (g->pending[i].since + g->head_wait_s < next) next = g->pending[i].since + g->head_wait_s;
    double wait_s = next - now;
    return wait_s <= 0 ? 0 : (int)(wait_s * 1000) + 1;
}

static void *gate_main(void *arg) {
    Gate *g = arg;
    struct pollfd pfd[2 + GATE_MAX_PENDING];
    while (!atomic_load(&g->is_stopping)) {
        if (g->listen_fd >= 0 && atomic_load(&g->is_quiesced)) {
            close(g->listen_fd);
            g->listen_fd = -1;
        }
        /* one reading of the clock for the poll set and its timeout: read
         * twice, the rest could end between the two — the listening socket
         * left out and, nothing else pending, a poll with no timeout */
        double now = mn_now();
        int n = 0, listen_at = -1;
        pfd[n++] = (struct pollfd){.fd = g->wake_fd, .events = POLLIN};
        if (g->listen_fd >= 0 && now >= g->accept_paused_until) {
            listen_at = n;
            pfd[n++] = (struct pollfd){.fd = g->listen_fd, .events = POLLIN};
        }
        int first_pending = n;
        for (int i = 0; i < g->n_pending; i++)
            pfd[n++] = (struct pollfd){.fd = g->pending[i].fd, .events = POLLIN | POLLRDHUP};
        if (poll(pfd, (nfds_t)n, poll_timeout_ms(g, now)) < 0) {
            if (errno != EINTR) LOG_WARN("gate: poll: %s", strerror(errno));
            continue;
        }
        if (pfd[0].revents) {
            uint64_t v;
            if (read(g->wake_fd, &v, sizeof v) < 0) { /* nothing to do: the flags say why */
            }
        }
        /* backwards, so removing i (the last one moves into i) skips nothing unseen */
        now = mn_now();
        for (int i = g->n_pending - 1; i >= 0; i--) {
            if (pfd[first_pending + i].revents) pending_check(g, i, pfd[first_pending + i].revents);
            else if (now - g->pending[i].since >= g->head_wait_s) hand_over(g, i);
        }
        if (listen_at >= 0 && (pfd[listen_at].revents & POLLIN) && !atomic_load(&g->is_quiesced)) accept_one(g);
    }
    while (g->n_pending > 0) pending_close(g, g->n_pending - 1);
    return NULL;
}

/* ---- life cycle ----------------------------------------------------------------------- */

int gate_new(const struct sockaddr_in *addr, double head_wait_s, const GateCallbacks *cb, Gate **out, MnErr *err) {
    *out = NULL;
    Gate *g = mn_calloc(1, sizeof *g);
    if (g == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    g->cb = *cb;
    g->head_wait_s = head_wait_s < GATE_HEAD_WAIT_S ? head_wait_s : GATE_HEAD_WAIT_S;
    g->wake_fd = -1;
    atomic_init(&g->is_quiesced, false);
    atomic_init(&g->is_stopping, false);
    int one = 1;
    g->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (g->listen_fd < 0 || setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(g->listen_fd, (const struct sockaddr *)addr, sizeof *addr) != 0 || listen(g->listen_fd, SOMAXCONN) != 0) {
        int e = errno;
        gate_free(g);
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &addr->sin_addr, ip, sizeof ip);
        return mn_err_set(err, MN_EIO, "cannot listen on %s:%d: %s", ip, ntohs(addr->sin_port), strerror(e));
    }
    struct sockaddr_in bound;
    socklen_t len = sizeof bound;
    getsockname(g->listen_fd, (struct sockaddr *)&bound, &len);
    g->port = ntohs(bound.sin_port);
    if ((g->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        pthread_create(&g->thread, NULL, gate_main, g) != 0) {
        gate_free(g);
        return mn_err_set(err, MN_ENOMEM, "cannot start the listening thread");
    }
    g->has_thread = true;
    *out = g;
    return MN_OK;
}

int gate_port(const Gate *g) { return g->port; }

static void gate_wake(Gate *g) {
    uint64_t one = 1;
    if (write(g->wake_fd, &one, sizeof one) < 0) LOG_WARN("gate: wake: %s", strerror(errno));
}

void gate_quiesce(Gate *g) {
    if (atomic_load(&g->is_quiesced)) return;
    /* a listening socket shut down refuses connections at once; the gate
     * thread, its owner, closes it */
    shutdown(g->listen_fd, SHUT_RDWR);
    atomic_store(&g->is_quiesced, true);
    gate_wake(g);
}

void gate_free(Gate *g) {
    if (g == NULL) return;
    if (g->has_thread) {
        atomic_store(&g->is_stopping, true);
        gate_wake(g);
        pthread_join(g->thread, NULL);
    }
    if (g->listen_fd >= 0) close(g->listen_fd);
    if (g->wake_fd >= 0) close(g->wake_fd);
    mn_free(g);
}
