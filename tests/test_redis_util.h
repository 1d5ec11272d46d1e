/* test_redis_util.h — a real redis-server for the shared tier's tests
 * (test_tier_redis, test_redis_cluster, test_engine, test_tiers_server):
 * started on a unix socket in a fresh directory of its own (no TCP port
 * unless a cluster node, no files left behind: no RDB, no AOF; a node's
 * nodes.conf goes with its directory), stopped or killed when the test says, started
 * again on the same socket, and talked to with hiredis. Header-only. A
 * machine without redis-server skips the tests that need one
 * (scripts/setup installs it).
 *
 * The server is a child of the test process; redis_srv_free kills it and
 * removes its directory, also after a failed assertion when the test's
 * teardown calls it.
 *
 * A three-node Redis Cluster (RedisClusterSrv, for the cluster mode's
 * tests): three servers with --cluster-enabled on free loopback ports
 * (each also on its own unix socket, which the test's own commands use),
 * the slots split in three (CLUSTER ADDSLOTSRANGE) and the nodes joined
 * (CLUSTER MEET); it is ready once every node says cluster_state:ok.
 * Slots are moved between nodes as redis-cli --cluster reshard moves them
 * (SETSLOT IMPORTING and MIGRATING, MIGRATE of the keys, SETSLOT NODE),
 * or left half-way, mid-migration.
 */
#ifndef MN_TEST_REDIS_UTIL_H
#define MN_TEST_REDIS_UTIL_H

#include "test_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis.h>

#define REDIS_SRV_BIN "/usr/bin/redis-server"

typedef struct RedisSrv {
    pid_t pid;       /* 0: not running */
    int port;        /* > 0: also on 127.0.0.1:port, a cluster node (its bus on port + 10000) */
    char dir[64];    /* its directory ("" before redis_srv_start) */
    char sock[128];  /* its unix socket */
    char url[160];   /* unix://SOCK, for --redis-tier */
    char log[128];   /* its log file */
} RedisSrv;

/* Whether redis-server is installed; when not, the caller skips. */
static inline bool redis_srv_available(void) {
    if (access(REDIS_SRV_BIN, X_OK) == 0) return true;
    fprintf(stderr, "skipping: %s is missing (scripts/setup installs redis-server)\n", REDIS_SRV_BIN);
    return false;
}

/* A connection to the server, or NULL when it does not answer. */
static inline redisContext *redis_srv_connect(const RedisSrv *r) {
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectUnixWithTimeout(r->sock, tv);
    if (c != NULL && c->err) {
        redisFree(c);
        return NULL;
    }
    if (c != NULL) redisSetTimeout(c, tv);
    return c;
}

static inline bool redis_srv_answers(const RedisSrv *r) {
    redisContext *c = redis_srv_connect(r);
    if (c == NULL) return false;
    redisReply *rep = redisCommand(c, "PING");
    bool ok = rep != NULL; /* (an error too: NOAUTH from a server with a password) */
    if (rep) freeReplyObject(rep);
    redisFree(c);
    return ok;
}

/* Start the server (again, on the same socket, when it ran before), with
 * extra settings as "--name value" pairs in argv order (NULL-ended; may
 * be NULL). Returns once it answers a PING: true; false when it exited
 * first (*status its wait status). */
static inline bool redis_srv_try_start(RedisSrv *r, const char *const *extra, int *status) {
    if (r->dir[0] == '\0') {
        snprintf(r->dir, sizeof r->dir, "/tmp/mnemo-redis-%d-XXXXXX", (int)getpid());
        if (mkdtemp(r->dir) == NULL) {
            r->dir[0] = '\0';
            fail_msg("mkdtemp: %s", strerror(errno));
        }
        snprintf(r->sock, sizeof r->sock, "%s/redis.sock", r->dir);
        snprintf(r->url, sizeof r->url, "unix://%s", r->sock);
        snprintf(r->log, sizeof r->log, "%s/redis.log", r->dir);
    }
    char port[16], conf[160];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(conf, sizeof conf, "%s/nodes.conf", r->dir);
    const char *argv[48] = {REDIS_SRV_BIN, "--port", port, "--unixsocket", r->sock, "--unixsocketperm", "700",
                            "--save", "", "--appendonly", "no", "--dir", r->dir, "--logfile", r->log};
    int n = 15;
    if (r->port > 0) {
        unlink(conf); /* a node started again starts as a new node */
        const char *cl[] = {"--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file", conf};
        for (int i = 0; i < 6; i++) argv[n++] = cl[i];
    }
    for (int i = 0; extra && extra[i] && n < 47; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    r->pid = fork();
    if (r->pid == 0) { /* its output goes to its log: none may hold the test's pipes open */
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* nor outlive a test that failed before stopping it */
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++) dup2(null, fd);
        execv(REDIS_SRV_BIN, (char *const *)argv);
        _exit(127);
    }
    *status = 0;
    TEST_WAIT_UNTIL(redis_srv_answers(r) || waitpid(r->pid, status, WNOHANG) == r->pid,
                    "redis-server does not answer on %s after %d s (log: %s)", r->sock, TEST_HANG_GUARD_S, r->log);
    if (!redis_srv_answers(r)) {
        r->pid = 0;
        return false;
    }
    return true;
}

static inline void redis_srv_start(RedisSrv *r, const char *const *extra) {
    int status;
    if (!redis_srv_try_start(r, extra, &status))
        fail_msg("redis-server exited (status 0x%x) before answering; see %s", status, r->log);
}

/* SIGKILL: gone at once, as a crash (what it held is lost). */
static inline void redis_srv_kill(RedisSrv *r) {
    if (r->pid <= 0) return;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
}

/* Kill the server if it runs and remove its directory. */
static inline void redis_srv_free(RedisSrv *r) {
    redis_srv_kill(r);
    if (r->dir[0]) test_rm_dir(r->dir);
    memset(r, 0, sizeof *r);
}

static inline redisReply *redis_srv_vcmd(const RedisSrv *r, const char *fmt, va_list ap) {
    redisContext *c = redis_srv_connect(r);
    if (c == NULL) fail_msg("no connection to redis-server on %s", r->sock);
    redisReply *rep = redisvCommand(c, fmt, ap);
    redisFree(c);
    if (rep == NULL) fail_msg("redis-server on %s gave no reply to '%s'", r->sock, fmt);
    return rep;
}

/* One command (hiredis format) on a fresh connection; its reply (the
 * caller frees it), failing the test when there is none. */
static inline redisReply *redis_srv_cmd(const RedisSrv *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redis_srv_vcmd(r, fmt, ap);
    va_end(ap);
    return rep;
}

/* A reply that must not be an error (freed). */
static inline void redis_expect_ok(redisReply *rep, const char *what) {
    if (rep->type == REDIS_REPLY_ERROR) fail_msg("%s: %s", what, rep->str);
    freeReplyObject(rep);
}

/* A command whose reply is an integer (DBSIZE, EXISTS, TTL, ...). */
static inline long long redis_srv_int(const RedisSrv *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redis_srv_vcmd(r, fmt, ap);
    va_end(ap);
    if (rep->type != REDIS_REPLY_INTEGER) fail_msg("'%s' did not answer an integer", fmt);
    long long v = rep->integer;
    freeReplyObject(rep);
    return v;
}

/* The keys matching pattern (KEYS: the test's server is small), as a
 * reply whose elements the caller reads and then frees. */
static inline redisReply *redis_srv_keys(const RedisSrv *r, const char *pattern) {
    redisReply *rep = redis_srv_cmd(r, "KEYS %s", pattern);
    if (rep->type != REDIS_REPLY_ARRAY) fail_msg("KEYS %s did not answer an array", pattern);
    return rep;
}

/* Flip a byte of every value whose key matches pattern, at `offset` from
 * the value's end (SETRANGE); returns how many values were damaged. */
static inline int redis_srv_damage(const RedisSrv *r, const char *pattern, long offset_from_end) {
    redisReply *keys = redis_srv_keys(r, pattern);
    int n = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        const char *k = keys->element[i]->str;
        long long len = redis_srv_int(r, "STRLEN %s", k);
        if (len <= offset_from_end) continue;
        redisReply *v = redis_srv_cmd(r, "GETRANGE %s %lld %lld", k, len - offset_from_end, len - offset_from_end);
        char b = v->type == REDIS_REPLY_STRING && v->len == 1 ? (char)(v->str[0] ^ 0x5a) : 0x5a;
        freeReplyObject(v);
        freeReplyObject(redis_srv_cmd(r, "SETRANGE %s %lld %b", k, len - offset_from_end, &b, (size_t)1));
        n++;
    }
    freeReplyObject(keys);
    return n;
}

/* Stderr into a file while fn runs; returns the file's contents (the
 * caller frees them): what a tier logged, to look for credentials. */
static inline char *redis_capture_stderr(void (*fn)(void *), void *ctx) {
    char path[] = "/tmp/mnemo-redis-log-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) fail_msg("mkstemp: %s", strerror(errno));
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn(ctx);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    char *text = test_read_file(path, NULL);
    unlink(path);
    return text;
}

/* ---- a three-node Redis Cluster ------------------------------------------------ */

#define REDIS_CLUSTER_NODES 3

typedef struct RedisClusterSrv {
    RedisSrv node[REDIS_CLUSTER_NODES];
    char id[REDIS_CLUSTER_NODES][48]; /* CLUSTER MYID */
    char url[REDIS_CLUSTER_NODES][64]; /* redis://127.0.0.1:PORT, seeds for --redis-tier */
    const char *urls[REDIS_CLUSTER_NODES];
} RedisClusterSrv;

/* Whether 127.0.0.1:port is free to listen on now. */
static inline bool redis_port_free(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A port for a cluster node: it and its bus port (+10000) free now. Another
 * process may take it before the server does: the caller tries again. */
static inline int redis_pick_port(unsigned *seed) {
    for (int tries = 0; tries < 1000; tries++) {
        *seed = *seed * 1103515245u + 12345u;
        int port = 20000 + (int)((*seed >> 8) % 10000u);
        if (redis_port_free(port) && redis_port_free(port + 10000)) return port;
    }
    fail_msg("no free pair of loopback ports (P, P + 10000) for a cluster node");
    return 0;
}

/* The text of an INFO-like command's reply (caller frees), or NULL. */
static inline char *redis_srv_text(const RedisSrv *r, const char *cmd) {
    redisReply *rep = redis_srv_cmd(r, cmd);
    char *text = rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS ? strdup(rep->str) : NULL;
    freeReplyObject(rep);
    return text;
}

static inline bool redis_cluster_node_ok(const RedisSrv *r) {
    char *info = redis_srv_text(r, "CLUSTER INFO");
    bool ok = info && strstr(info, "cluster_state:ok") && strstr(info, "cluster_known_nodes:3");
    free(info);
    return ok;
}

static inline bool redis_cluster_ok(const RedisClusterSrv *cl) {
    for (int i = 0; i < REDIS_CLUSTER_NODES; i++)
        if (cl->node[i].pid > 0 && !redis_cluster_node_ok(&cl->node[i])) return false;
    return true;
}

/* Node i serves slots [i * 16384 / 3, (i + 1) * 16384 / 3). */
static inline int redis_cluster_first_slot(int i) { return i * 16384 / REDIS_CLUSTER_NODES; }

static inline int redis_cluster_owner0(int slot) {
    for (int i = REDIS_CLUSTER_NODES - 1; i >= 0; i--)
        if (slot >= redis_cluster_first_slot(i)) return i;
    return 0;
}

/* Start the three nodes, give each its third of the slots, join them, and
 * wait for cluster_state:ok everywhere. */
static inline void redis_cluster_start(RedisClusterSrv *cl) {
    unsigned seed = (unsigned)getpid() * 2654435761u;
    for (int i = 0; i < REDIS_CLUSTER_NODES; i++) {
        RedisSrv *r = &cl->node[i];
        int status = 0, tries = 0;
        do {
            if (++tries > 20) fail_msg("no cluster node would start (status 0x%x); see %s", status, r->log);
            r->port = redis_pick_port(&seed);
        } while (!redis_srv_try_start(r, NULL, &status));
        snprintf(cl->url[i], sizeof cl->url[i], "redis://127.0.0.1:%d", r->port);
        cl->urls[i] = cl->url[i];
        char *id = redis_srv_text(r, "CLUSTER MYID");
        if (id == NULL) fail_msg("CLUSTER MYID: no answer");
        snprintf(cl->id[i], sizeof cl->id[i], "%s", id);
        free(id);
        /* Distinct config epochs before the nodes meet, as redis-cli's
         * cluster create gives them. Left at 0, the nodes resolve the
         * collision by bumping epochs through gossip, for a while after
         * cluster_state:ok: a source whose epoch rose past the one a
         * target took at SETSLOT NODE then still claimed the moved slot,
         * and the target dropped the keys it had imported (2 in 40 runs,
         * 4 at once on 2 cores). */
        redis_expect_ok(redis_srv_cmd(r, "CLUSTER SET-CONFIG-EPOCH %d", i + 1), "CLUSTER SET-CONFIG-EPOCH");
        int last = i + 1 < REDIS_CLUSTER_NODES ? redis_cluster_first_slot(i + 1) - 1 : 16383;
        redisReply *rep = redis_srv_cmd(r, "CLUSTER ADDSLOTSRANGE %d %d", redis_cluster_first_slot(i), last);
        if (rep->type == REDIS_REPLY_ERROR) fail_msg("CLUSTER ADDSLOTSRANGE: %s", rep->str);
        freeReplyObject(rep);
    }
    for (int i = 1; i < REDIS_CLUSTER_NODES; i++)
        freeReplyObject(redis_srv_cmd(&cl->node[0], "CLUSTER MEET 127.0.0.1 %d", cl->node[i].port));
    TEST_WAIT_UNTIL(redis_cluster_ok(cl), "the cluster is not ok after %d s (logs: %s, ...)", TEST_HANG_GUARD_S,
                    cl->node[0].log);
}

static inline void redis_cluster_free(RedisClusterSrv *cl) {
    for (int i = 0; i < REDIS_CLUSTER_NODES; i++) redis_srv_free(&cl->node[i]);
}

/* Which node holds key now (KEYS on each running node: a node lists only
 * the keys it holds); -1: none. */
static inline int redis_cluster_holder(const RedisClusterSrv *cl, const char *key) {
    for (int i = 0; i < REDIS_CLUSTER_NODES; i++) {
        if (cl->node[i].pid <= 0) continue;
        redisReply *rep = redis_srv_cmd(&cl->node[i], "KEYS %s", key);
        bool has = rep->type == REDIS_REPLY_ARRAY && rep->elements == 1;
        freeReplyObject(rep);
        if (has) return i;
    }
    return -1;
}

/* Move slot from node src to node dst as a reshard does: IMPORTING on
 * dst, MIGRATING on src, the slot's keys MIGRATEd (at most max_keys; < 0:
 * all); then, when `finish`, SETSLOT NODE on every node (from then on src
 * answers MOVED); else the slot stays mid-migration (src answers ASK for
 * the keys it no longer has). Returns the keys moved. */
static inline int redis_cluster_move_slot(RedisClusterSrv *cl, int slot, int src, int dst, int max_keys, bool finish) {
    RedisSrv *s = &cl->node[src], *d = &cl->node[dst];
    redis_expect_ok(redis_srv_cmd(d, "CLUSTER SETSLOT %d IMPORTING %s", slot, cl->id[src]), "SETSLOT IMPORTING");
    redis_expect_ok(redis_srv_cmd(s, "CLUSTER SETSLOT %d MIGRATING %s", slot, cl->id[dst]), "SETSLOT MIGRATING");
    int n = 0;
    for (;;) {
        int want = max_keys < 0 || max_keys - n > 100 ? 100 : max_keys - n;
        redisReply *keys = redis_srv_cmd(s, "CLUSTER GETKEYSINSLOT %d %d", slot, want);
        if (keys->type != REDIS_REPLY_ARRAY) fail_msg("CLUSTER GETKEYSINSLOT: no array");
        size_t m = want > 0 ? keys->elements : 0;
        for (size_t k = 0; k < m; k++)
            redis_expect_ok(redis_srv_cmd(s, "MIGRATE 127.0.0.1 %d %s 0 5000", d->port, keys->element[k]->str), "MIGRATE");
        n += (int)m;
        freeReplyObject(keys);
        if (m == 0) break;
    }
    /* SETSLOT NODE in the order CLUSTER SETSLOT's documentation gives:
     * the target, then the source, then the others. Told in node order,
     * the source could gossip the new owner to the target before the
     * target was told, and on a loaded machine the target once dropped
     * the slot's keys it had just imported (a KEYS there found none). */
    if (finish) {
        const int order[REDIS_CLUSTER_NODES] = {dst, src, 3 - src - dst};
        _Static_assert(REDIS_CLUSTER_NODES == 3, "order lists every node");
        for (int j = 0; j < REDIS_CLUSTER_NODES; j++)
            if (cl->node[order[j]].pid > 0)
                redis_expect_ok(redis_srv_cmd(&cl->node[order[j]], "CLUSTER SETSLOT %d NODE %s", slot, cl->id[dst]),
                                "SETSLOT NODE");
    }
    return n;
}

#endif
