/* redis_cluster.c — the shared tier's Redis client: one server, or a Redis
 * Cluster, behind one pipelined interface (contract: redis_cluster.h).
 *
 * A standalone server is a cluster of one node that serves every slot and
 * never redirects: the same code path, without the slot map and without
 * keeping commands for a retry. In a cluster, the slot map comes from
 * CLUSTER SLOTS, asked of the seeds in order at each rcluster_connect; a
 * node gets its connection when the first command reaches it.
 *
 * Every command appended is an RcCmd, on two lists: the caller's (replies
 * are returned in append order) and its node's (replies arrive in send
 * order on each connection). Reading a node's next reply attaches it to
 * the head of that node's list; so the reply the caller wants next may
 * need replies of later commands read first (they wait, attached), and a
 * command redirected to another node joins the tail of that node's list.
 * A command's life:
 *
 *   rcluster_append     read_reply          resolve               rcluster_take
 *   --------------> SENT ----------> ANSWERED ------> FINAL -------------> (freed)
 *                    ^                  |    (not a redirection, or too many hops:
 *                    +------------------+     its copy freed)
 *                    redirect: MOVED (map updated) or ASK (ASKING first),
 *                    sent again from its kept copy to the node named
 *
 * An ASKING command is internal: on its node's list only, its reply
 * dropped. Deferred commands are on the caller's list and dropped by
 * rcluster_take when they come first.
 *
 * Owner: one thread at a time (the mover's); nothing locks.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/utf8.h"
#include "cache/redis_cluster.h"

/* ---- types --------------------------------------------------------------- */

#define RCLUSTER_DEFAULT_PORT 6379
#define RCLUSTER_MAX_HOPS 5                  /* redirections of one command, then its error is final */
#define RCLUSTER_DEFAULT_KEPT (8ull << 20)   /* commands kept for a redirection, then replies read early */

/* Where a server is, parsed from its URL. */
typedef struct RedisUrl {
    bool is_unix;
    char *host;     /* TCP */
    int port;
    char *path;     /* unix socket */
    char *user;     /* NULL: AUTH with the password alone (or no AUTH) */
    char *password; /* NULL: no AUTH; wiped before it is freed */
    int db;
    char *shown;    /* the URL as logs show it: no credentials */
} RedisUrl;

typedef struct RcCmd {
    struct RcCmd *next;         /* the caller's order */
    struct RcCmd *next_on_node; /* its node's order */
    char *wire;                 /* cluster: the command formatted (hiredis's
                                   allocation), kept until its reply is final */
    size_t wire_len;
    int node;                   /* where it was sent last */
    int n_hops;                 /* redirections followed */
    bool is_deferred;
    bool is_asking;             /* an internal ASKING: node list only */
    bool is_final;
    redisReply *reply;          /* read, not yet taken */
} RcCmd;

typedef struct RcNode {
    char *host;          /* cluster nodes; NULL for a standalone server */
    int port;
    char shown[300];
    redisContext *ctx;   /* NULL: not connected */
    RcCmd *head, *tail;  /* sent, reply not yet read */
} RcNode;

struct RedisCluster {
    RedisUrl *seeds;     /* (n_seeds) */
    int n_seeds;
    bool is_cluster;
    int timeout_ms;
    uint64_t max_kept;
    char *shown;
    RcNode *nodes;       /* (n_nodes, cap nodes_cap); standalone: one */
    int n_nodes, nodes_cap;
    bool is_open;        /* connected (standalone), or a slot map (cluster) */
    int16_t slot_node[RCLUSTER_SLOTS]; /* -1: no node known */
    RcCmd *first, *last; /* owed, in the caller's order */
    int n_owed;
    uint64_t kept_bytes; /* wire bytes of cluster commands not yet final */
    RedisClusterStats stats;
};

/* ---- the specification's pure parts ---------------------------------------- */

uint16_t rcluster_crc16(const void *p, size_t n) {
    const uint8_t *b = p;
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(b[i] << 8);
        for (int k = 0; k < 8; k++) crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

int rcluster_key_slot(const char *key, size_t len) {
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        const char *close = memchr(open + 1, '}', len - (size_t)(open - key) - 1);
        if (close != NULL && close > open + 1) { /* "{}" tags nothing: the whole key */
            key = open + 1;
            len = (size_t)(close - open - 1);
        }
    }
    return rcluster_crc16(key, len) & (RCLUSTER_SLOTS - 1);
}

/* The decimal 0..max in s[0..n) into *out; false when it is not one. */
static bool parse_uint(const char *s, size_t n, long max, int *out) {
    if (n == 0 || n > 9) return false;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max) return false;
    *out = (int)v;
    return true;
}

int rcluster_parse_redirect(const char *s, size_t len, RedisRedirect *out) {
    memset(out, 0, sizeof *out);
    size_t skip;
    if (len > 6 && memcmp(s, "MOVED ", 6) == 0) out->kind = RCLUSTER_MOVED, skip = 6;
    else if (len > 4 && memcmp(s, "ASK ", 4) == 0) out->kind = RCLUSTER_ASK, skip = 4;
    else return MN_ENOTFOUND;
    s += skip;
    len -= skip;
    const char *sp = memchr(s, ' ', len);
    if (sp == NULL || !parse_uint(s, (size_t)(sp - s), RCLUSTER_SLOTS - 1, &out->slot)) return MN_EFORMAT;
    const char *addr = sp + 1, *end = s + len, *colon = NULL;
    for (const char *q = addr; q < end; q++) /* the last ':' (an IPv6 address has more) */
        if (*q == ':') colon = q;
    size_t host_len = colon ? (size_t)(colon - addr) : 0;
    if (colon == NULL || host_len >= sizeof out->host || memchr(addr, ' ', (size_t)(end - addr)) ||
        !parse_uint(colon + 1, (size_t)(end - colon - 1), 65535, &out->port) || out->port == 0)
        return MN_EFORMAT;
    memcpy(out->host, addr, host_len);
    out->host[host_len] = '\0';
    return MN_OK;
}

/* ---- URLs --------------------------------------------------------------------- */

/* s[0..n) with %XX decoded, as a new string; NULL when out of memory or
 * malformed (*bad set). */
static char *pct_decode(const char *s, size_t n, bool *bad) {
    char *out = mn_malloc(n + 1);
    if (out == NULL) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            out[k++] = s[i];
            continue;
        }
        int a = i + 2 < n ? utf8_hex_digit(s[i + 1]) : -1, b = i + 2 < n ? utf8_hex_digit(s[i + 2]) : -1;
        if (a < 0 || b < 0) {
            *bad = true;
            mn_free(out);
            return NULL;
        }
        out[k++] = (char)(a * 16 + b);
        i += 2;
    }
    out[k] = '\0';
    return out;
}

static void wipe_free(char *s) {
    if (s == NULL) return;
    volatile char *v = s; /* the password must not linger in freed memory */
    while (*v) *v++ = 0;
    mn_free(s);
}

static void url_free(RedisUrl *u) {
    mn_free(u->host);
    mn_free(u->path);
    wipe_free(u->user);
    wipe_free(u->password);
    mn_free(u->shown);
    memset(u, 0, sizeof *u);
}

/* "user:password@" at the start of s[0..n): the credentials, decoded;
 * returns the bytes taken (0: none there), or a negated code (a malformed
 * escape, out of memory; err says which). */
static long parse_userinfo(RedisUrl *u, const char *s, size_t n, MnErr *err) {
    const char *slash = memchr(s, '/', n); /* credentials come before the path ('/' in them: %2F) */
    const char *at = memchr(s, '@', slash ? (size_t)(slash - s) : n);
    if (at == NULL) return 0;
    const char *colon = memchr(s, ':', (size_t)(at - s));
    bool bad = false;
    size_t user_len = colon ? (size_t)(colon - s) : (size_t)(at - s);
    if (user_len > 0 && (u->user = pct_decode(s, user_len, &bad)) == NULL) goto fail;
    if (colon && (u->password = pct_decode(colon + 1, (size_t)(at - colon - 1), &bad)) == NULL) goto fail;
    if (!colon && u->user) { /* redis://secret@host: a password alone, as redis-cli takes it */
        u->password = u->user;
        u->user = NULL;
    }
    return (long)(at - s) + 1;
fail:
    if (bad) return -(long)mn_err_set(err, MN_EINVAL, "redis tier: a bad %%-escape in the URL's credentials");
    return -(long)mn_err_set(err, MN_ENOMEM, "redis tier: out of memory");
}

/* After the credentials of a unix:// URL: /path[?db=N]. */
static int parse_unix(RedisUrl *u, const char *s, size_t n, MnErr *err) {
    const char *q = memchr(s, '?', n);
    size_t path_len = q ? (size_t)(q - s) : n;
    if (path_len == 0 || s[0] != '/') return mn_err_set(err, MN_EINVAL, "redis tier: unix:// needs an absolute socket path");
    if (q && !(strncmp(q, "?db=", 4) == 0 && parse_uint(q + 4, n - path_len - 4, 1000000, &u->db)))
        return mn_err_set(err, MN_EINVAL, "redis tier: after the socket path only ?db=N may follow");
    if ((u->path = mn_strndup(s, path_len)) == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    return MN_OK;
}

/* After the credentials of a redis:// URL: host[:port][/db], the host
 * perhaps a [v6 address]. */
static int parse_tcp(RedisUrl *u, const char *s, size_t n, MnErr *err) {
    const char *slash = memchr(s, '/', n);
    size_t hp = slash ? (size_t)(slash - s) : n; /* host and port */
    const char *host = s, *colon = memchr(s, ':', hp);
    size_t host_len = colon ? (size_t)(colon - s) : hp;
    if (hp > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', hp);
        if (close == NULL) return mn_err_set(err, MN_EINVAL, "redis tier: an unclosed [ in the URL's host");
        if (close + 1 < s + hp && close[1] != ':')
            return mn_err_set(err, MN_EINVAL, "redis tier: only :port may follow the URL's [host]");
        host = s + 1;
        host_len = (size_t)(close - s - 1);
        colon = close + 1 < s + hp ? close + 1 : NULL;
    }
    if (host_len == 0) return mn_err_set(err, MN_EINVAL, "redis tier: the URL names no host");
    if (colon && (!parse_uint(colon + 1, (size_t)(s + hp - colon - 1), 65535, &u->port) || u->port == 0))
        return mn_err_set(err, MN_EINVAL, "redis tier: the URL's port must be 1..65535");
    if (slash && slash + 1 < s + n && !parse_uint(slash + 1, n - hp - 1, 1000000, &u->db))
        return mn_err_set(err, MN_EINVAL, "redis tier: the URL's path must be a database number (/0, /1, ...)");
    if ((u->host = mn_strndup(host, host_len)) == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    return MN_OK;
}

/* redis://[user[:password]@]host[:port][/db] or
 * unix://[user[:password]@]/path[?db=N]; `shown` leaves the credentials
 * out. On failure *u holds nothing. */
static int url_parse(const char *url, RedisUrl *u, MnErr *err) {
    memset(u, 0, sizeof *u);
    u->port = RCLUSTER_DEFAULT_PORT;
    if (strncmp(url, "rediss://", 9) == 0)
        return mn_err_set(err, MN_EUNSUPPORTED,
                          "redis tier: rediss:// (TLS) needs hiredis 1.0's TLS support, and Debian 12 ships "
                          "hiredis 0.14: reach Redis over a unix socket, a private network, or a local TLS tunnel");
    bool is_tcp = strncmp(url, "redis://", 8) == 0;
    u->is_unix = strncmp(url, "unix://", 7) == 0;
    if (!is_tcp && !u->is_unix)
        return mn_err_set(err, MN_EINVAL, "redis tier: the URL must start with redis:// or unix://");
    const char *s = url + (is_tcp ? 8 : 7);
    size_t n = strlen(s);
    long taken = parse_userinfo(u, s, n, err);
    int rc = taken < 0 ? (int)-taken : MN_OK;
    if (rc == MN_OK)
        rc = u->is_unix ? parse_unix(u, s + taken, n - (size_t)taken, err) : parse_tcp(u, s + taken, n - (size_t)taken, err);
    char shown[1200];
    if (rc == MN_OK) {
        if (u->is_unix) snprintf(shown, sizeof shown, "unix://%s%.900s?db=%d", u->password ? "***@" : "", u->path, u->db);
        else snprintf(shown, sizeof shown, "redis://%s%.900s:%d/%d", u->password ? "***@" : "", u->host, u->port, u->db);
        if ((u->shown = mn_strdup(shown)) == NULL) rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    if (rc != MN_OK) url_free(u);
    return rc;
}

/* ---- commands -------------------------------------------------------------------- */

static void cmd_free(RcCmd *cmd) {
    if (cmd == NULL) return;
    if (cmd->reply) freeReplyObject(cmd->reply);
    if (cmd->wire) redisFreeCommand(cmd->wire);
    mn_free(cmd);
}

static void node_push(RcNode *nd, RcCmd *cmd) {
    cmd->next_on_node = NULL;
    if (nd->tail) nd->tail->next_on_node = cmd;
    else nd->head = cmd;
    nd->tail = cmd;
}

static RcCmd *node_pop(RcNode *nd) {
    RcCmd *cmd = nd->head;
    if (cmd == NULL) return NULL;
    nd->head = cmd->next_on_node;
    if (nd->head == NULL) nd->tail = NULL;
    return cmd;
}

/* The command's reply is final: its copy is no longer needed. */
static void cmd_settle(RedisCluster *c, RcCmd *cmd) {
    cmd->is_final = true;
    if (cmd->wire) {
        c->kept_bytes -= cmd->wire_len;
        redisFreeCommand(cmd->wire);
        cmd->wire = NULL;
    }
}

/* ---- connections ------------------------------------------------------------------- */

void rcluster_close(RedisCluster *c) {
    for (int i = 0; i < c->n_nodes; i++) {
        RcNode *nd = &c->nodes[i];
        if (nd->ctx) redisFree(nd->ctx);
        nd->ctx = NULL;
        for (RcCmd *cmd; (cmd = node_pop(nd)) != NULL;)
            if (cmd->is_asking) cmd_free(cmd); /* the others are on the caller's list */
    }
    for (RcCmd *cmd = c->first, *next; cmd; cmd = next) {
        next = cmd->next;
        cmd_free(cmd);
    }
    c->first = c->last = NULL;
    c->n_owed = 0;
    c->kept_bytes = 0;
    c->is_open = false;
}

/* A connection failed: close everything; MN_EIO for the caller to return. */
static int conn_lost(RedisCluster *c, int node, const char *what) {
    RcNode *nd = &c->nodes[node];
    LOG_WARN("redis tier: %s %s failed: %s", what, nd->shown, nd->ctx && nd->ctx->errstr[0] ? nd->ctx->errstr : "no answer");
    rcluster_close(c);
    return MN_EIO;
}

/* One command on ctx and its reply, which must not be an error; `shown`
 * names the server in the log. */
static int ctx_call(redisContext *ctx, int argc, const char **argv, const char *what, const char *shown) {
    size_t lens[4];
    for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
    redisReply *rep = redisCommandArgv(ctx, argc, argv, lens);
    if (rep == NULL) {
        LOG_WARN("redis tier: %s %s failed: %s", what, shown, ctx->errstr[0] ? ctx->errstr : "no answer");
        return MN_EIO;
    }
    int rc = MN_OK;
    if (rep->type == REDIS_REPLY_ERROR) {
        /* Redis's message names no secret ("WRONGPASS invalid username-password pair ...") */
        LOG_WARN("redis tier: %s %s refused: %s", what, shown, rep->str);
        rc = MN_EIO;
    }
    freeReplyObject(rep);
    return rc;
}

/* A connection to the server of url (a cluster node: host and port
 * instead, the seed's credentials, database 0), authenticated, its
 * database selected and PINGed; NULL (logged) when it does not answer or
 * refuses. */
static redisContext *ctx_open(const RedisCluster *c, const RedisUrl *url, const char *host, int port,
                              const char *shown) {
    struct timeval tv = {c->timeout_ms / 1000, (c->timeout_ms % 1000) * 1000};
    redisContext *ctx = host ? redisConnectWithTimeout(host, port, tv)
                             : url->is_unix ? redisConnectUnixWithTimeout(url->path, tv)
                                            : redisConnectWithTimeout(url->host, url->port, tv);
    if (ctx == NULL) return NULL; /* (hiredis out of memory) */
    if (ctx->err || redisSetTimeout(ctx, tv) != REDIS_OK) {
        LOG_WARN("redis tier: cannot connect to %s: %s", shown, ctx->errstr);
        redisFree(ctx);
        return NULL;
    }
    int rc = MN_OK;
    if (url->password) {
        const char *auth[] = {"AUTH", url->user ? url->user : url->password, url->password};
        rc = ctx_call(ctx, url->user ? 3 : 2, auth, "authenticating to", shown);
    }
    char db[16];
    snprintf(db, sizeof db, "%d", url->db);
    const char *sel[] = {"SELECT", db}, *ping[] = {"PING"};
    if (rc == MN_OK && url->db != 0 && host == NULL) rc = ctx_call(ctx, 2, sel, "selecting the database of", shown);
    if (rc == MN_OK) rc = ctx_call(ctx, 1, ping, "a PING to", shown);
    if (rc != MN_OK) {
        redisFree(ctx);
        return NULL;
    }
    return ctx;
}

/* Node i connected (a cluster node on its first command). MN_OK, MN_EIO
 * (everything closed). */
static int node_ready(RedisCluster *c, int i) {
    RcNode *nd = &c->nodes[i];
    if (nd->ctx != NULL) return MN_OK;
    nd->ctx = ctx_open(c, &c->seeds[0], nd->host, nd->port, nd->shown);
    if (nd->ctx == NULL) {
        rcluster_close(c);
        return MN_EIO;
    }
    LOG_INFO("redis tier: connected to %s", nd->shown);
    return MN_OK;
}

static void nodes_clear(RedisCluster *c) {
    for (int i = 0; i < c->n_nodes; i++) mn_free(c->nodes[i].host);
    c->n_nodes = 0;
    for (int s = 0; s < RCLUSTER_SLOTS; s++) c->slot_node[s] = -1;
}

/* The index of the cluster node host:port, added when new; -1 when out of
 * memory. */
static int node_find_or_add(RedisCluster *c, const char *host, int port) {
    for (int i = 0; i < c->n_nodes; i++)
        if (c->nodes[i].port == port && strcmp(c->nodes[i].host, host) == 0) return i;
    if (c->n_nodes == INT16_MAX) return -1;
    if (c->n_nodes == c->nodes_cap) {
        int cap = c->nodes_cap ? 2 * c->nodes_cap : 4;
        RcNode *n = mn_realloc(c->nodes, (size_t)cap * sizeof *n);
        if (n == NULL) return -1;
        c->nodes = n;
        c->nodes_cap = cap;
    }
    RcNode *nd = &c->nodes[c->n_nodes];
    memset(nd, 0, sizeof *nd);
    if ((nd->host = mn_strdup(host)) == NULL) return -1;
    nd->port = port;
    bool is_v6 = strchr(host, ':') != NULL;
    snprintf(nd->shown, sizeof nd->shown, "redis://%s%.256s%s:%d", is_v6 ? "[" : "", host, is_v6 ? "]" : "", port);
    c->stats.n_nodes = ++c->n_nodes;
    return c->n_nodes - 1;
}

/* ---- the slot map ------------------------------------------------------------------- */

/* One CLUSTER SLOTS entry: [start, end, [host, port, id, ...], replicas...];
 * an empty or "?" host is the seed's (the node did not announce one).
 * MN_OK, MN_EFORMAT, MN_ENOMEM. */
static int slots_entry(RedisCluster *c, const redisReply *e, const char *seed_host) {
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY)
        return MN_EFORMAT;
    long long start = e->element[0]->integer, end = e->element[1]->integer;
    const redisReply *m = e->element[2];
    if (start < 0 || end < start || end >= RCLUSTER_SLOTS || m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
        m->element[1]->type != REDIS_REPLY_INTEGER || m->element[1]->integer < 1 || m->element[1]->integer > 65535)
        return MN_EFORMAT;
    const char *host = m->element[0]->str;
    if (host[0] == '\0' || strcmp(host, "?") == 0) host = seed_host;
    int node = node_find_or_add(c, host, (int)m->element[1]->integer);
    if (node < 0) return MN_ENOMEM;
    for (long long s = start; s <= end; s++) c->slot_node[s] = (int16_t)node;
    return MN_OK;
}

/* Ask seed i for the slot map. MN_OK, MN_EIO (logged), MN_ENOMEM. */
static int map_load(RedisCluster *c, int i) {
    const RedisUrl *seed = &c->seeds[i];
    redisContext *ctx = ctx_open(c, seed, NULL, 0, seed->shown);
    if (ctx == NULL) return MN_EIO;
    redisReply *rep = redisCommand(ctx, "CLUSTER SLOTS");
    int rc = MN_OK;
    if (rep == NULL) {
        LOG_WARN("redis tier: asking %s for the slot map failed: %s", seed->shown, ctx->errstr);
        rc = MN_EIO;
    } else if (rep->type != REDIS_REPLY_ARRAY) {
        /* "ERR This instance has cluster support disabled": --redis-cluster on a standalone server */
        LOG_WARN("redis tier: %s gave no slot map: %s", seed->shown, rep->type == REDIS_REPLY_ERROR ? rep->str : "not an array");
        rc = MN_EIO;
    }
    nodes_clear(c);
    for (size_t e = 0; rc == MN_OK && e < rep->elements; e++)
        if ((rc = slots_entry(c, rep->element[e], seed->host)) == MN_EFORMAT) {
            LOG_WARN("redis tier: %s gave a malformed slot map", seed->shown);
            rc = MN_EIO;
        }
    int n_served = 0;
    for (int s = 0; s < RCLUSTER_SLOTS; s++) n_served += c->slot_node[s] >= 0;
    if (rc == MN_OK && n_served == 0) {
        LOG_WARN("redis tier: %s: the cluster serves no slot yet", seed->shown);
        rc = MN_EIO;
    }
    if (rc == MN_OK) {
        c->stats.n_map_loads++;
        LOG_INFO("redis tier: the cluster's slot map from %s: %d nodes, %d of %d slots served", seed->shown,
                 c->n_nodes, n_served, RCLUSTER_SLOTS);
    } else {
        nodes_clear(c);
    }
    if (rep) freeReplyObject(rep);
    redisFree(ctx);
    return rc;
}

int rcluster_connect(RedisCluster *c) {
    rcluster_close(c);
    if (!c->is_cluster) {
        RcNode *nd = &c->nodes[0];
        if ((nd->ctx = ctx_open(c, &c->seeds[0], NULL, 0, nd->shown)) == NULL) return MN_EIO;
        LOG_INFO("redis tier: connected to %s", nd->shown);
        c->is_open = true;
        return MN_OK;
    }
    int rc = MN_EIO;
    for (int i = 0; i < c->n_seeds && rc == MN_EIO; i++) rc = map_load(c, i);
    if (rc == MN_EIO) LOG_WARN("redis tier: no seed of the cluster gave its slot map");
    c->is_open = rc == MN_OK;
    /* every node the map names, now: a node that does not answer keeps
     * the client closed (and its owner backing off) until the cluster
     * answers for all its slots again (the node is back, or a replica
     * took its place and the map says so), rather than opening, failing
     * at the first command for that node, and opening again */
    for (int i = 0; i < c->n_nodes && rc == MN_OK; i++) rc = node_ready(c, i);
    return rc;
}

bool rcluster_is_connected(const RedisCluster *c) { return c->is_open; }

/* ---- the pipeline -------------------------------------------------------------------- */

/* Read the next reply on node i and attach it to the command it answers
 * (an ASKING's is dropped). MN_OK, MN_EIO (everything closed). */
static int read_reply(RedisCluster *c, int i, const char *what) {
    RcNode *nd = &c->nodes[i];
    void *rep = NULL;
    if (nd->ctx == NULL || nd->head == NULL) return conn_lost(c, i, what); /* (a broken invariant: no reply owed) */
    if (redisGetReply(nd->ctx, &rep) != REDIS_OK || rep == NULL) return conn_lost(c, i, what);
    RcCmd *cmd = node_pop(nd);
    if (cmd->is_asking) {
        if (((redisReply *)rep)->type == REDIS_REPLY_ERROR)
            LOG_WARN("redis tier: %s refused ASKING: %s", nd->shown, ((redisReply *)rep)->str);
        freeReplyObject(rep);
        cmd_free(cmd);
    } else {
        cmd->reply = rep;
    }
    return MN_OK;
}

/* Append wire (formatted) to node i's connection, for cmd. */
static int node_send(RedisCluster *c, int i, RcCmd *cmd, const char *wire, size_t len) {
    int rc = node_ready(c, i);
    if (rc != MN_OK) return rc;
    RcNode *nd = &c->nodes[i];
    if (redisAppendFormattedCommand(nd->ctx, wire, len) != REDIS_OK) return conn_lost(c, i, "a command (out of memory) to");
    cmd->node = i;
    node_push(nd, cmd);
    return MN_OK;
}

/* Send cmd again where rd points: ASKING first for an ASK, the map
 * updated for a MOVED. MN_OK, MN_EIO (everything closed). */
static int redirect(RedisCluster *c, RcCmd *cmd, const RedisRedirect *rd) {
    const char *host = rd->host[0] ? rd->host : c->nodes[cmd->node].host;
    int to = node_find_or_add(c, host, rd->port);
    if (to < 0) {
        LOG_WARN("redis tier: out of memory following a redirection");
        rcluster_close(c);
        return MN_EIO;
    }
    LOG_DEBUG("redis tier: %s: slot %d at %s", rd->kind == RCLUSTER_MOVED ? "MOVED" : "ASK", rd->slot, c->nodes[to].shown);
    freeReplyObject(cmd->reply);
    cmd->reply = NULL;
    cmd->n_hops++;
    if (rd->kind == RCLUSTER_MOVED) {
        c->slot_node[rd->slot] = (int16_t)to;
        c->stats.n_moved++;
    } else {
        c->stats.n_ask++;
        RcCmd *asking = mn_calloc(1, sizeof *asking);
        static const char wire[] = "*1\r\n$6\r\nASKING\r\n";
        if (asking == NULL) {
            LOG_WARN("redis tier: out of memory following a redirection");
            rcluster_close(c);
            return MN_EIO;
        }
        asking->is_asking = true;
        int rc = node_send(c, to, asking, wire, sizeof wire - 1);
        if (rc != MN_OK) {
            cmd_free(asking);
            return rc;
        }
    }
    return node_send(c, to, cmd, cmd->wire, cmd->wire_len);
}

/* Read until cmd's reply is final, following redirections. MN_OK, MN_EIO
 * (everything closed, cmd freed with the rest). */
static int resolve(RedisCluster *c, RcCmd *cmd, const char *what) {
    while (!cmd->is_final) {
        while (cmd->reply == NULL) {
            int rc = read_reply(c, cmd->node, what);
            if (rc != MN_OK) return rc;
        }
        RedisRedirect rd;
        if (cmd->wire != NULL && cmd->reply->type == REDIS_REPLY_ERROR && cmd->n_hops < RCLUSTER_MAX_HOPS &&
            rcluster_parse_redirect(cmd->reply->str, cmd->reply->len, &rd) == MN_OK) {
            int rc = redirect(c, cmd, &rd);
            if (rc != MN_OK) return rc;
            continue;
        }
        cmd_settle(c, cmd);
    }
    return MN_OK;
}

/* Too many bytes kept: read the oldest replies until half of them are
 * freed. */
static int settle_kept(RedisCluster *c) {
    for (RcCmd *cmd = c->first; cmd && c->kept_bytes > c->max_kept / 2; cmd = cmd->next) {
        int rc = resolve(c, cmd, "writing to");
        if (rc != MN_OK) return rc;
    }
    return MN_OK;
}

static int append(RedisCluster *c, int argc, const char **argv, const size_t *lens, bool is_deferred) {
    if (!c->is_open) return MN_EIO;
    RcCmd *cmd = mn_calloc(1, sizeof *cmd);
    if (cmd == NULL) {
        LOG_WARN("redis tier: out of memory appending a command");
        rcluster_close(c);
        return MN_EIO;
    }
    cmd->is_deferred = is_deferred;
    int rc = MN_OK;
    if (!c->is_cluster) {
        if (redisAppendCommandArgv(c->nodes[0].ctx, argc, argv, lens) != REDIS_OK) rc = MN_ENOMEM;
        else node_push(&c->nodes[0], cmd);
    } else {
        long len = redisFormatCommandArgv(&cmd->wire, argc, argv, lens);
        if (len < 0) {
            rc = MN_ENOMEM;
        } else {
            cmd->wire_len = (size_t)len;
            c->kept_bytes += cmd->wire_len;
            int node = argc > 1 ? c->slot_node[rcluster_key_slot(argv[1], lens[1])] : -1;
            /* a slot no node serves: any node answers, with a redirection
             * or CLUSTERDOWN */
            if ((rc = node_send(c, node >= 0 ? node : 0, cmd, cmd->wire, cmd->wire_len)) != MN_OK) {
                cmd_free(cmd); /* (closed: not on any list) */
                return rc;
            }
        }
    }
    if (rc == MN_ENOMEM) { /* part of a pipeline may be appended: out of step, closed */
        cmd_free(cmd);
        LOG_WARN("redis tier: out of memory appending a command to %s", c->shown);
        rcluster_close(c);
        return MN_EIO;
    }
    if (c->last) c->last->next = cmd;
    else c->first = cmd;
    c->last = cmd;
    c->n_owed++;
    return c->kept_bytes > c->max_kept ? settle_kept(c) : MN_OK;
}

int rcluster_append(RedisCluster *c, int argc, const char **argv, const size_t *lens) {
    return append(c, argc, argv, lens, false);
}

int rcluster_append_deferred(RedisCluster *c, int argc, const char **argv, const size_t *lens) {
    return append(c, argc, argv, lens, true);
}

int rcluster_flush(RedisCluster *c, const char *what) {
    if (!c->is_open) return MN_EIO;
    for (int i = 0; i < c->n_nodes; i++) {
        if (c->nodes[i].ctx == NULL) continue;
        int done = 0;
        while (!done)
            if (redisBufferWrite(c->nodes[i].ctx, &done) != REDIS_OK) return conn_lost(c, i, what);
    }
    return MN_OK;
}

int rcluster_take(RedisCluster *c, redisReply **out, const char *what) {
    *out = NULL;
    while (c->is_open && c->first != NULL) {
        RcCmd *cmd = c->first;
        int rc = resolve(c, cmd, what);
        if (rc != MN_OK) return rc;
        c->first = cmd->next;
        if (c->first == NULL) c->last = NULL;
        c->n_owed--;
        redisReply *rep = cmd->reply;
        cmd->reply = NULL;
        bool is_deferred = cmd->is_deferred;
        cmd_free(cmd);
        if (!is_deferred) {
            *out = rep;
            return MN_OK;
        }
        if (rep->type == REDIS_REPLY_ERROR) LOG_DEBUG("redis tier: a deferred command failed: %s", rep->str);
        freeReplyObject(rep);
    }
    return MN_EIO;
}

int rcluster_n_owed(const RedisCluster *c) { return c->n_owed; }

/* ---- the rest ---------------------------------------------------------------------------- */

const char *rcluster_shown(const RedisCluster *c) { return c->shown; }

void rcluster_stats(const RedisCluster *c, RedisClusterStats *out) { *out = c->stats; }

void rcluster_dump(const RedisCluster *c) {
    fprintf(stderr, "  redis client %s: %s, %d replies owed, %llu bytes kept, %llu MOVED, %llu ASK\n", c->shown,
            c->is_open ? "open" : "closed", c->n_owed, (unsigned long long)c->kept_bytes,
            (unsigned long long)c->stats.n_moved, (unsigned long long)c->stats.n_ask);
    for (int i = 0; i < c->n_nodes; i++) {
        int n = 0;
        for (const RcCmd *cmd = c->nodes[i].head; cmd; cmd = cmd->next_on_node) n++;
        fprintf(stderr, "    node %d %s: %s, %d replies unread\n", i, c->nodes[i].shown,
                c->nodes[i].ctx ? "connected" : "not connected", n);
    }
    for (int s = 0; c->is_cluster && s < RCLUSTER_SLOTS;) {
        int e = s;
        while (e + 1 < RCLUSTER_SLOTS && c->slot_node[e + 1] == c->slot_node[s]) e++;
        fprintf(stderr, "    slots %d-%d: node %d\n", s, e, c->slot_node[s]);
        s = e + 1;
    }
}

/* `shown`: the server's URL, or "cluster " and the seeds'. */
static int shown_build(RedisCluster *c) {
    size_t n = 16;
    for (int i = 0; i < c->n_seeds; i++) n += strlen(c->seeds[i].shown) + 2;
    if ((c->shown = mn_malloc(n)) == NULL) return MN_ENOMEM;
    char *p = c->shown;
    p += sprintf(p, "%s", c->is_cluster ? "cluster " : "");
    for (int i = 0; i < c->n_seeds; i++) p += sprintf(p, "%s%s", i ? ", " : "", c->seeds[i].shown);
    return MN_OK;
}

int rcluster_new(const RedisClusterConfig *cfg, RedisCluster **out, MnErr *err) {
    *out = NULL;
    if (cfg->n_urls < 1 || cfg->urls == NULL) return mn_err_set(err, MN_EINVAL, "redis tier: no URL");
    if (cfg->n_urls > 1 && !cfg->is_cluster)
        return mn_err_set(err, MN_EINVAL, "redis tier: several URLs are a cluster's seeds: --redis-cluster");
    if (cfg->timeout_ms <= 0) return mn_err_set(err, MN_EINVAL, "redis tier: the timeout must be > 0");
    RedisCluster *c = mn_calloc(1, sizeof *c);
    if (c == NULL || (c->seeds = mn_calloc((size_t)cfg->n_urls, sizeof *c->seeds)) == NULL) {
        mn_free(c);
        return mn_err_set(err, MN_ENOMEM, "redis tier: out of memory");
    }
    c->is_cluster = cfg->is_cluster;
    c->timeout_ms = cfg->timeout_ms;
    c->max_kept = cfg->max_kept_bytes > 0 ? cfg->max_kept_bytes : RCLUSTER_DEFAULT_KEPT;
    nodes_clear(c);
    int rc = MN_OK;
    for (int i = 0; i < cfg->n_urls && rc == MN_OK; i++) {
        if (cfg->urls[i] == NULL || cfg->urls[i][0] == '\0') rc = mn_err_set(err, MN_EINVAL, "redis tier: an empty URL");
        else if ((rc = url_parse(cfg->urls[i], &c->seeds[i], err)) == MN_OK) c->n_seeds++;
        if (rc == MN_OK && c->is_cluster && (c->seeds[i].is_unix || c->seeds[i].db != 0))
            rc = mn_err_set(err, MN_EINVAL, "redis tier: a cluster's seeds are redis://host:port URLs of database 0, not %s",
                            c->seeds[i].shown);
    }
    if (rc == MN_OK) rc = shown_build(c) == MN_OK ? MN_OK : mn_err_set(err, MN_ENOMEM, "redis tier: out of memory");
    if (rc == MN_OK && !c->is_cluster) { /* the one node: the server */
        if ((c->nodes = mn_calloc(1, sizeof *c->nodes)) == NULL) {
            rc = mn_err_set(err, MN_ENOMEM, "redis tier: out of memory");
        } else {
            c->n_nodes = c->nodes_cap = c->stats.n_nodes = 1;
            snprintf(c->nodes[0].shown, sizeof c->nodes[0].shown, "%s", c->seeds[0].shown);
            memset(c->slot_node, 0, sizeof c->slot_node);
        }
    }
    if (rc != MN_OK) {
        rcluster_free(c);
        return rc;
    }
    *out = c;
    return MN_OK;
}

void rcluster_free(RedisCluster *c) {
    if (c == NULL) return;
    rcluster_close(c);
    nodes_clear(c);
    mn_free(c->nodes);
    for (int i = 0; i < c->n_seeds; i++) url_free(&c->seeds[i]);
    mn_free(c->seeds);
    mn_free(c->shown);
    mn_free(c);
}
