/* test_redis_util.h — a real redis-server for the shared tier's tests
 * (test_tier_redis, test_engine, test_redis_server): started on a unix
 * socket in a fresh directory of its own (no TCP port, no files left
 * behind: no RDB, no AOF), stopped or killed when the test says, started
 * again on the same socket, and talked to with hiredis. Header-only. A
 * machine without redis-server skips the tests that need one
 * (scripts/setup installs it).
 *
 * The server is a child of the test process; redis_srv_free kills it and
 * removes its directory, also after a failed assertion when the test's
 * teardown calls it.
 */
#ifndef MN_TEST_REDIS_UTIL_H
#define MN_TEST_REDIS_UTIL_H

#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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
 * be NULL). Returns once it answers a PING. */
static inline void redis_srv_start(RedisSrv *r, const char *const *extra) {
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
    const char *argv[48] = {REDIS_SRV_BIN, "--port", "0", "--unixsocket", r->sock, "--unixsocketperm", "700",
                            "--save", "", "--appendonly", "no", "--dir", r->dir, "--logfile", r->log};
    int n = 15;
    for (int i = 0; extra && extra[i] && n < 47; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    r->pid = fork();
    if (r->pid == 0) { /* its output goes to its log: none may hold the test's pipes open */
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++) dup2(null, fd);
        execv(REDIS_SRV_BIN, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    TEST_WAIT_UNTIL(redis_srv_answers(r) || waitpid(r->pid, &status, WNOHANG) == r->pid,
                    "redis-server does not answer on %s after %d s (log: %s)", r->sock, TEST_HANG_GUARD_S, r->log);
    if (!redis_srv_answers(r)) {
        r->pid = 0;
        fail_msg("redis-server exited (status 0x%x) before answering; see %s", status, r->log);
    }
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

#endif
