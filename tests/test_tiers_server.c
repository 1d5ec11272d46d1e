/* test_tiers_server.c — `mnemo serve` with KV cache tiers below the pool
 * (--ram-tier-mb, --disk-tier, --redis-tier), end to end over HTTP.
 *
 * Every case starts real servers (srv_start: stories260K, blocks of 8
 * tokens) with a pool too small for its conversations, so cached blocks
 * move down to RAM and disk and come back, and compares every greedy answer
 * (temperature 0, ignore_eos) with the answer of a `--no-prefix-cache`
 * server for the same messages: a tier may change how fast an answer
 * comes, never what it says. The cases: many concurrent conversations
 * through RAM and disk; a restart after SIGKILL with writes in flight; a
 * restart on slab files whose data was overwritten (checksums catch it, the
 * blocks are recomputed); a disk that really runs out of space (a 192 KiB
 * tmpfs); a restart after SIGTERM, which must flush what the pool held;
 * conversations returning one at a time to an otherwise idle server, their
 * history restored from disk and copied up into RAM after; two tenants (API keys)
 * on one disk tier, one of them erased by `mnemo cache purge` (refused
 * while the server runs; afterwards its KV extents are zero, its reply
 * texts gone from the database files, its conversations recomputed, while
 * the other tenant's still come from disk). With the shared tier (a real
 * redis-server on a unix socket, test_redis_util.h): conversations that
 * hop between two instances find their history in Redis (also in a real
 * three-node Redis Cluster, mnemo serve --redis-cluster); Redis killed
 * while an instance restores from it, then back (the instances reconnect);
 * damaged values (SETRANGE) and FLUSHALL.
 * Every answer's usage must add up (cached_tokens_by_tier sums to
 * cached_tokens, recomputed_tokens = prompt - cached), and the per-tier
 * /metrics families are checked along the way.
 *
 * Each case owns a fixture (servers, conversations, a temporary directory,
 * a mount) that its teardown releases even after a failed assertion;
 * servers still running then belong to a failed case, and the tail of their
 * logs is printed. Helper threads never assert (cmocka's asserts work only
 * on the test's thread): they record failures as text, checked after the
 * join. MNEMO_SANITIZED=1 (the ASan build) runs fewer conversations.
 * For debugging: MNEMO_TEST_VERBOSE=1 prints each answer's usage,
 * MNEMO_TEST_FILTER="*flush*" runs matching cases, MNEMO_TEST_NO_MOUNT=1
 * takes the disk-full case's fallback as if the mount had failed. */
#include "test_util.h"
#include "test_redis_util.h"
#include "test_serve_util.h"

#include "base/err.h"
#include "base/hash.h"
#include "cache/index.h"
#include "cache/store.h"

#include <stdbool.h>

#include <curl/curl.h>
#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* One compute thread per server: the tests run two or three servers at
 * once, often on a loaded machine, and spinning compute workers there made
 * a 12-token answer take seconds instead of milliseconds. */
#define MODEL "stories260K"
#define POOL2_FLAGS "--threads 1 --pool-blocks 24" /* two turns (19 blocks) fit, not two conversations */
#define POOL3_FLAGS "--threads 1 --pool-blocks 32" /* three turns (27 blocks) fit */
#define REF_FLAGS "--threads 1 --no-prefix-cache"
#define REPLY_TOKENS 12 /* max_tokens of every turn (ignore_eos: exactly this many) */
#define MAX_TURNS 3
#define MAX_CONVS 32
#define MAX_SRV 3

enum { T_POOL, T_RAM, T_DISK, T_REDIS, T_COUNT };
static const char *const tier_names[T_COUNT] = {"pool", "ram", "disk", "redis"};

static bool env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- HTTP (thread-safe, never asserts) ---------------------------------------- */

/* GET when body is NULL, else POST, with API key `key` (NULL: none).
 * Returns the status (-1: no answer); *out the body (malloc'd, never
 * NULL). */
static long http_as(const Srv *s, const char *path, const char *body, const char *key, char **out) {
    char auth[128];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key ? key : "");
    const char *headers[] = {key ? auth : NULL, NULL};
    return srv_http(s, NULL, path, body, headers, out, NULL, 0);
}

static long http(const Srv *s, const char *path, const char *body, char **out) {
    return http_as(s, path, body, NULL, out);
}

/* ---- answers ------------------------------------------------------------------- */

typedef struct Answer {
    long status;
    char *text;  /* the response body (malloc'd) */
    char *reply; /* choices[0].message.content (malloc'd); NULL unless it parsed */
    long prompt_tokens, completion_tokens, cached_tokens, recomputed_tokens;
    long by_tier[T_COUNT]; /* cached_tokens_by_tier; -1 when missing */
    long shifted_tokens;
    long restored_by[3];   /* restored_by's kv, hidden, recompute; -1 when missing */
} Answer;

static void answer_free(Answer *a) {
    free(a->text);
    free(a->reply);
    memset(a, 0, sizeof *a);
}

static long jint(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

/* The usage part of an answer's body, for messages. */
static const char *usage_of(const Answer *a) {
    const char *u = a->text ? strstr(a->text, "\"usage\"") : NULL;
    return u ? u : "(no usage)";
}

/* POST a chat request (with API key `key`, NULL: none). 0 when it
 * answered 200 with a well-formed completion whose usage adds up;
 * otherwise -1 and why in err. *a is filled either way (answer_free it). */
static int ask(const Srv *s, const char *req, const char *key, Answer *a, char *err, size_t cap) {
    memset(a, 0, sizeof *a);
    a->status = http_as(s, "/v1/chat/completions", req, key, &a->text);
    if (a->status != 200) {
        snprintf(err, cap, "status %ld: %.300s", a->status, a->text);
        return -1;
    }
    json_t *j = json_loads(a->text, 0, NULL);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    const char *content = json_string_value(json_object_get(msg, "content"));
    json_t *u = json_object_get(j, "usage");
    json_t *d = json_object_get(u, "prompt_tokens_details");
    json_t *bt = json_object_get(d, "cached_tokens_by_tier"), *rb = json_object_get(d, "restored_by");
    if (content == NULL || !json_is_object(bt) || !json_is_object(rb)) {
        snprintf(err, cap, "malformed completion: %.300s", a->text);
        json_decref(j);
        return -1;
    }
    a->reply = strdup(content);
    a->prompt_tokens = jint(u, "prompt_tokens");
    a->completion_tokens = jint(u, "completion_tokens");
    a->cached_tokens = jint(d, "cached_tokens");
    a->recomputed_tokens = jint(d, "recomputed_tokens");
    a->shifted_tokens = jint(d, "shifted_tokens");
    static const char *const paths[3] = {"kv", "hidden", "recompute"};
    for (int k = 0; k < 3; k++) a->restored_by[k] = jint(rb, paths[k]);
    long sum = 0;
    bool has_all = true;
    for (int t = 0; t < T_COUNT; t++) {
        a->by_tier[t] = jint(bt, tier_names[t]);
        has_all = has_all && a->by_tier[t] >= 0;
        sum += a->by_tier[t];
    }
    json_decref(j);
    if (!has_all || sum != a->cached_tokens || a->recomputed_tokens != a->prompt_tokens - a->cached_tokens ||
        a->completion_tokens != REPLY_TOKENS) {
        snprintf(err, cap,
                 "usage does not add up (pool + ram + disk + redis = cached_tokens, recomputed = prompt - cached, "
                 "%d completion tokens): %s", REPLY_TOKENS, usage_of(a));
        return -1;
    }
    /* what came from a tier came back as K/V or by projection (tokens
     * moved for context overflow are shifted_tokens, not restored_by) */
    long from_tiers = a->by_tier[T_RAM] + a->by_tier[T_DISK] + a->by_tier[T_REDIS];
    if (a->restored_by[0] < 0 || a->restored_by[1] < 0 || a->restored_by[2] < 0 ||
        (a->shifted_tokens == 0 && a->restored_by[0] + a->restored_by[1] != from_tiers)) {
        snprintf(err, cap, "restored_by does not add up (kv + hidden = ram + disk + redis): %s", usage_of(a));
        return -1;
    }
    return 0;
}

/* ---- conversations ---------------------------------------------------------------- */

static const char *const follow_ups[MAX_TURNS - 1] = {"Tell me more.", "And then?"};

typedef struct Conv {
    const Srv *s;          /* the server under test (threads) */
    int n_turns;           /* turns to run (threads) */
    const char *key;       /* its API key (NULL: none) */
    char first[96];        /* the first user message */
    char *req[MAX_TURNS];  /* request body of each turn (malloc'd) */
    Answer ans[MAX_TURNS]; /* the server's answer of each turn */
    int n_done;            /* turns answered */
    char failure[640];     /* why the last turn failed, "" if none did */
} Conv;

/* Distinct first messages: conversations share only the template's head. */
static void conv_init(Conv *c, const char *tag, int i) {
    static const char *const who[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Anna", "Tim", "Mia", "Sam", "Zoe", "Jack", "Emma"};
    static const char *const what[] = {"red ball", "small dog", "big tree", "blue boat", "funny hat", "shiny key", "old map"};
    static const char *const where[] = {"park", "garden", "forest", "house", "sea", "school", "sky", "town", "shop"};
    memset(c, 0, sizeof *c);
    snprintf(c->first, sizeof c->first, "%s and the %s in the %s (%s %d).", who[i % 12], what[i % 7], where[i % 9], tag,
             i);
}

static void conv_free(Conv *c) {
    for (int t = 0; t < MAX_TURNS; t++) {
        free(c->req[t]);
        answer_free(&c->ans[t]);
    }
    memset(c, 0, sizeof *c);
}

/* The request of turn `turn` (0-based): the first message, then for each
 * earlier turn its reply and the next follow-up. */
static char *conv_request(const Conv *c, int turn) {
    json_t *msgs = json_array();
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", c->first));
    for (int t = 0; t < turn; t++) {
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", c->ans[t].reply));
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", follow_ups[t]));
    }
    json_t *req = json_pack("{s:s,s:o,s:i,s:f,s:b,s:i}", "model", "test", "messages", msgs, "max_tokens",
                            REPLY_TOKENS, "temperature", 0.0, "ignore_eos", 1, "seed", 1);
    char *text = json_dumps(req, 0);
    json_decref(req);
    return text;
}

/* Run the next turn on s. 0, or -1 with c->failure set (thread-safe). */
static int conv_next(Conv *c, const Srv *s) {
    int turn = c->n_done;
    if (turn >= MAX_TURNS) {
        snprintf(c->failure, sizeof c->failure, "'%s': no turn %d", c->first, turn + 1);
        return -1;
    }
    char err[512];
    free(c->req[turn]); /* an earlier try of this turn failed */
    answer_free(&c->ans[turn]);
    c->req[turn] = conv_request(c, turn);
    if (ask(s, c->req[turn], c->key, &c->ans[turn], err, sizeof err) != 0) {
        snprintf(c->failure, sizeof c->failure, "'%s' turn %d: %s", c->first, turn + 1, err);
        return -1;
    }
    c->n_done++;
    if (getenv("MNEMO_TEST_VERBOSE"))
        fprintf(stderr, "  '%s' turn %d: prompt %ld, cached pool %ld ram %ld disk %ld redis %ld, recomputed %ld\n",
                c->first, turn + 1, c->ans[turn].prompt_tokens, c->ans[turn].by_tier[T_POOL],
                c->ans[turn].by_tier[T_RAM], c->ans[turn].by_tier[T_DISK], c->ans[turn].by_tier[T_REDIS],
                c->ans[turn].recomputed_tokens);
    return 0;
}

/* On the test's thread: the next turn must succeed. */
static void conv_step(Conv *c, const Srv *s) {
    if (conv_next(c, s) != 0) fail_msg("%s", c->failure);
}

static void *conv_thread(void *arg) {
    Conv *c = arg;
    for (int t = 0; t < c->n_turns; t++)
        if (conv_next(c, c->s) != 0) break;
    return NULL;
}

/* Every turn answered must equal the no-cache server's answer to the same
 * request. */
static void expect_reference(const Srv *ref, const Conv *c) {
    for (int t = 0; t < c->n_done; t++) {
        Answer want;
        char err[512], msg[1024] = "";
        if (ask(ref, c->req[t], NULL, &want, err, sizeof err) != 0)
            snprintf(msg, sizeof msg, "reference server: %s", err);
        else if (strcmp(want.reply, c->ans[t].reply) != 0)
            snprintf(msg, sizeof msg,
                     "'%s' turn %d differs from the no-cache answer:\n  tiered:   \"%s\" (%s)\n  no cache: \"%s\"",
                     c->first, t + 1, c->ans[t].reply, usage_of(&c->ans[t]), want.reply);
        answer_free(&want);
        if (msg[0]) fail_msg("%s", msg);
    }
}

/* ---- metrics ------------------------------------------------------------------- */

static double tier_metric(const Srv *s, const char *name, const char *tier) {
    char series[128];
    snprintf(series, sizeof series, "%s{tier=\"%s\"}", name, tier);
    return srv_metric(s, series);
}

/* Every per-tier family is exported with tier="<tier>". */
static void expect_tier_families(const Srv *s, const char *tier) {
    static const char *const plain[] = {"mnemo_tier_bytes_read_total", "mnemo_tier_bytes_written_total",
                                        "mnemo_tier_occupancy_bytes", "mnemo_tier_evictions_total",
                                        "mnemo_tier_checksum_failures_total", "mnemo_cached_tokens_total"};
    static const char *const hist[] = {"mnemo_tier_read_seconds", "mnemo_tier_write_seconds"};
    static const char *const hist_parts[] = {"_bucket{tier=\"%s\",le=\"+Inf\"}", "_sum{tier=\"%s\"}", "_count{tier=\"%s\"}"};
    char *text = srv_metrics_text(s), series[160], missing[160] = "";
    for (size_t i = 0; i < sizeof plain / sizeof plain[0] && !missing[0]; i++) {
        snprintf(series, sizeof series, "%s{tier=\"%s\"}", plain[i], tier);
        if (srv_metric_in(text, series) < 0) snprintf(missing, sizeof missing, "%s", series);
    }
    for (size_t i = 0; i < sizeof hist / sizeof hist[0] && !missing[0]; i++)
        for (size_t k = 0; k < sizeof hist_parts / sizeof hist_parts[0] && !missing[0]; k++) {
            char part[64];
            snprintf(part, sizeof part, hist_parts[k], tier);
            snprintf(series, sizeof series, "%s%s", hist[i], part);
            if (srv_metric_in(text, series) < 0) snprintf(missing, sizeof missing, "%s", series);
        }
    for (int t = 0; t < T_COUNT && !missing[0]; t++) {
        snprintf(series, sizeof series, "mnemo_cached_tokens_total{tier=\"%s\"}", tier_names[t]);
        if (srv_metric_in(text, series) < 0) snprintf(missing, sizeof missing, "%s", series);
    }
    static const char *const global[] = {"mnemo_dropped_blocks_total", "mnemo_prefetched_blocks_total{into=\"pool\"}",
                                         "mnemo_prefetched_blocks_total{into=\"ram\"}"};
    for (size_t i = 0; i < sizeof global / sizeof global[0] && !missing[0]; i++)
        if (srv_metric_in(text, global[i]) < 0) snprintf(missing, sizeof missing, "%s", global[i]);
    free(text);
    if (missing[0]) fail_msg("/metrics lacks %s", missing);
}

/* ---- fixture: servers, conversations, a directory, a mount ------------------------------ */

typedef struct Fix {
    Srv srv[MAX_SRV];       /* [0] under test, [1] the no-cache reference, [2] a second
                               instance under test; pid 0: not running */
    RedisSrv redis;         /* the shared tier's store, when the case has one */
    RedisClusterSrv cluster; /* or a Redis Cluster: its nodes' pids > 0 */
    Conv cs[MAX_CONVS + 1]; /* the case's conversations (+1 spare) */
    char dir[64];           /* temporary directory, "" before it is made */
    bool is_mounted;        /* a tmpfs is mounted on dir */
    double t0;              /* when the case started */
} Fix;

static int fix_setup(void **state) {
    Fix *f = calloc(1, sizeof *f);
    if (f == NULL) return -1;
    f->t0 = now_s();
    *state = f;
    return 0;
}

static void print_log_tail(const Srv *s, int n_lines) {
    char *log = test_read_file(s->log, NULL);
    if (log == NULL) return;
    const char *p = log + strlen(log);
    for (int n = 0; p > log && n <= n_lines; p--)
        if (p[-1] == '\n') n++;
    fprintf(stderr, "---- last lines of server %d's log (%s):\n%s\n", (int)s->pid, s->log, p);
    free(log);
}

static int fix_teardown(void **state) {
    Fix *f = *state;
    for (int i = 0; i < MAX_SRV; i++) {
        Srv *s = &f->srv[i];
        if (s->pid <= 0) continue;
        print_log_tail(s, 25); /* still running: the case failed */
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        unlink(s->log);
    }
    for (int i = 0; i <= MAX_CONVS; i++) conv_free(&f->cs[i]);
    redis_srv_free(&f->redis);
    redis_cluster_free(&f->cluster);
    /* a killed server's io_uring may hold its files a moment longer */
    for (int i = 0; f->is_mounted && i < 100; i++) {
        if (umount(f->dir) == 0) f->is_mounted = false;
        else usleep(20000);
    }
    if (f->is_mounted && umount2(f->dir, MNT_DETACH) != 0)
        fprintf(stderr, "umount %s failed: %s\n", f->dir, strerror(errno));
    if (f->dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", f->dir);
    }
    fprintf(stderr, "(case took %.1f s)\n", now_s() - f->t0);
    free(f);
    return 0;
}

static void fix_mkdir(Fix *f) {
    snprintf(f->dir, sizeof f->dir, "/tmp/mnemo-tiers-%d-XXXXXX", (int)getpid());
    if (mkdtemp(f->dir) == NULL) {
        f->dir[0] = '\0';
        fail_msg("mkdtemp failed: %s", strerror(errno));
    }
}

static Srv *fix_start(Fix *f, int i, const char *flags) {
    Srv *s = &f->srv[i];
    memset(s, 0, sizeof *s);
    srv_start(s, MODEL, flags); /* skips the case when the model is missing */
    return s;
}

/* Start srv[0], the server under test: pool_flags, the disk tier in
 * f->dir, and extra flags. */
static Srv *fix_start_tiered(Fix *f, const char *pool_flags, const char *extra) {
    char flags[512];
    snprintf(flags, sizeof flags, "%s --disk-tier %s %s", pool_flags, f->dir, extra);
    return fix_start(f, 0, flags);
}

static bool log_has(const Srv *s, const char *needle) {
    char *log = test_read_file(s->log, NULL);
    bool has = log && strstr(log, needle);
    free(log);
    return has;
}

/* Fail when a sanitizer reported, or (unless allowed) the server logged an
 * error. print_tail: print the log first (for a server already reaped,
 * which the teardown no longer prints). */
static void expect_clean_log(const Srv *s, bool allow_errors, bool print_tail) {
    static const char *const bad[] = {"AddressSanitizer", "LeakSanitizer", "runtime error", "mnemo: error:"};
    int n_bad = allow_errors ? 3 : 4;
    for (int i = 0; i < n_bad; i++) {
        if (!log_has(s, bad[i])) continue;
        if (print_tail) print_log_tail(s, 40);
        fail_msg("server %d logged '%s'", (int)s->pid, bad[i]);
    }
}

/* SIGTERM: the server must exit 0 without a sanitizer report. */
static void fix_term(Fix *f, int i) {
    Srv *s = &f->srv[i];
    kill(s->pid, SIGTERM);
    int st = 0;
    waitpid(s->pid, &st, 0);
    Srv gone = *s;
    s->pid = 0; /* reaped: the teardown must not signal this pid again */
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        print_log_tail(&gone, 40);
        fail_msg("server %d did not exit 0 on SIGTERM (status 0x%x)", (int)gone.pid, st);
    }
    expect_clean_log(&gone, true, true);
    unlink(gone.log);
}

static void fix_kill(Fix *f, int i) {
    Srv *s = &f->srv[i];
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    unlink(s->log);
}

static void expect_health(const Srv *s) {
    char *out;
    long st = http(s, "/health", NULL, &out);
    free(out);
    if (st != 200) fail_msg("/health answered %ld: the server stopped serving", st);
}

/* Wait until the tier's written bytes stop growing (two equal samples
 * 100 ms apart, once something was written) or timeout_s passed. A best
 * effort for a loaded machine, where a write may pause longer: nothing
 * checked after it may depend on it. */
static void wait_writes_settle(const Srv *s, const char *tier, double timeout_s) {
    double prev = -1, t0 = now_s();
    while (now_s() - t0 < timeout_s) {
        double v = tier_metric(s, "mnemo_tier_bytes_written_total", tier);
        if (v > 0 && v == prev) return;
        prev = v;
        usleep(100000);
    }
}

/* ---- 1. many conversations through RAM and disk --------------------------------------- */

/* 12 conversations x 3 turns from threads against a pool of 32 blocks, a
 * 1 MiB RAM tier (about 100 blocks) and a disk tier: later turns find
 * their earlier turns in RAM or on disk, and the answers do not change.
 * The turns go in rounds, every conversation's turn at once: a round's
 * turns do not fit the pool together, whatever order a loaded machine
 * runs the threads in. */
/* n conversations (f->cs, tagged tag) on s, three turns each, every turn
 * of all of them at once from threads. */
static void run_concurrent(Fix *f, Srv *s, const char *tag, int n) {
    Conv *cs = f->cs;
    pthread_t th[MAX_CONVS];
    for (int i = 0; i < n; i++) {
        conv_init(&cs[i], tag, i);
        cs[i].s = s;
        cs[i].n_turns = 1;
    }
    for (int turn = 0; turn < 3; turn++) {
        for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, conv_thread, &cs[i]);
        for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < n; i++)
            if (cs[i].failure[0]) fail_msg("%s", cs[i].failure);
    }
}

static void test_tiers_many_conversations(void **state) {
    Fix *f = *state;
    fix_mkdir(f);
    Srv *s = fix_start_tiered(f, POOL3_FLAGS, "--disk-tier-mb 8 --ram-tier-mb 1");
    Srv *ref = fix_start(f, 1, REF_FLAGS);
    int n = env_is("MNEMO_SANITIZED", "1") ? 8 : 12;
    Conv *cs = f->cs;
    run_concurrent(f, s, "many", n);
    long by_tier[T_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        expect_reference(ref, &cs[i]);
        for (int t = 0; t < cs[i].n_done; t++)
            for (int k = 0; k < T_COUNT; k++) by_tier[k] += cs[i].ans[t].by_tier[k];
    }
    if (by_tier[T_RAM] + by_tier[T_DISK] <= 0)
        fail_msg("no later turn found tokens in RAM or on disk (pool %ld, ram %ld, disk %ld)", by_tier[T_POOL],
                 by_tier[T_RAM], by_tier[T_DISK]);
    /* the counters agree with what the answers reported */
    for (int k = 0; k < T_COUNT; k++) {
        double v = tier_metric(s, "mnemo_cached_tokens_total", tier_names[k]);
        if (v != (double)by_tier[k])
            fail_msg("mnemo_cached_tokens_total{tier=\"%s\"} is %.0f, the answers reported %ld", tier_names[k], v,
                     by_tier[k]);
    }
    double ram_w = tier_metric(s, "mnemo_tier_bytes_written_total", "ram");
    double disk_w = tier_metric(s, "mnemo_tier_bytes_written_total", "disk");
    if (!(ram_w > 0 && disk_w > 0)) fail_msg("bytes written: ram %.0f, disk %.0f; both must be > 0", ram_w, disk_w);
    expect_tier_families(s, "ram");
    expect_tier_families(s, "disk");
    /* the pool is a tier too: what it holds, and the cached blocks whose
     * slots it reused (its 32 blocks cannot hold 12 conversations) */
    double pool_occ = tier_metric(s, "mnemo_tier_occupancy_bytes", "pool");
    double pool_ev = tier_metric(s, "mnemo_tier_evictions_total", "pool");
    if (!(pool_occ > 0 && pool_ev > 0))
        fail_msg("pool: occupancy %.0f bytes, %.0f evictions; both must be > 0", pool_occ, pool_ev);
    expect_health(s);
    fix_term(f, 0);
    fix_term(f, 1);
}

/* --restore-plan hidden on qwen3 Q4_K_M (its hidden states, int8-packed,
 * take half the bytes of its f16 KV, so every layer is stored so): many
 * conversations through RAM and disk come back by projection, every
 * answer the no-cache server's, and /metrics counts the restored tokens
 * as hidden, none as KV. */
static void test_tiers_hidden_plan(void **state) {
    Fix *f = *state;
    fix_mkdir(f);
    char flags[512];
    snprintf(flags, sizeof flags, "%s --disk-tier %s --disk-tier-mb 8 --ram-tier-mb 1 --restore-plan hidden",
             POOL3_FLAGS, f->dir);
    Srv *s = &f->srv[0], *ref = &f->srv[1];
    memset(s, 0, sizeof *s);
    memset(ref, 0, sizeof *ref);
    srv_start(s, "qwen3-q4_k_m", flags);
    srv_start(ref, "qwen3-q4_k_m", REF_FLAGS);
    const int n = 8;
    run_concurrent(f, s, "hidden", n);
    for (int i = 0; i < n; i++) expect_reference(ref, &f->cs[i]);
    double hidden = srv_metric(s, "mnemo_restored_tokens_total{path=\"hidden\"}");
    double kv = srv_metric(s, "mnemo_restored_tokens_total{path=\"kv\"}");
    double recompute = srv_metric(s, "mnemo_restored_tokens_total{path=\"recompute\"}");
    if (!(hidden > 0 && kv == 0 && recompute >= 0))
        fail_msg("restored tokens: hidden %.0f, kv %.0f, recompute %.0f; want hidden > 0, kv 0", hidden, kv, recompute);
    long by[3] = {0};
    for (int i = 0; i < n; i++)
        for (int t = 0; t < f->cs[i].n_done; t++)
            for (int k = 0; k < 3; k++) by[k] += f->cs[i].ans[t].restored_by[k];
    if (!(by[1] > 0 && by[0] == 0))
        fail_msg("usage's restored_by over the answers: kv %ld, hidden %ld; want hidden > 0, kv 0", by[0], by[1]);
    /* the disk holds the runs as hidden states (every block of a run was computed here, so every
     * layer of it has its hidden rows) */
    double d_hidden = srv_metric(s, "mnemo_tier_stored_bytes{tier=\"disk\",repr=\"hidden\"}");
    double d_kv = srv_metric(s, "mnemo_tier_stored_bytes{tier=\"disk\",repr=\"kv\"}");
    if (!(d_hidden > 0 && d_kv == 0))
        fail_msg("disk tier stored bytes: hidden %.0f, kv %.0f; want hidden > 0, kv 0", d_hidden, d_kv);
    /* the planner's read rates: measured at start, then the restores' */
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "mnemo_tier_read_rate_bytes{tier=\"disk\"}" : "mnemo_tier_read_rate_bytes{tier=\"ram\"}";
        if (!(srv_metric(s, name) > 0)) fail_msg("%s: %.0f, want more than 0", name, srv_metric(s, name));
    }
    expect_health(s);
    fix_term(f, 0);
    fix_term(f, 1);
}

/* ---- 2. restart after SIGKILL ---------------------------------------------------- */

/* Turn 1 of 6 conversations, written down. Then turn 1 of 3 more
 * conversations from threads, and the server gets SIGKILL as soon as the
 * first of their writes is seen to land (the metric moves), with the
 * others queued or in flight. A server restarted on the same directory
 * starts cleanly, finds the settled conversations on disk, and answers
 * every conversation's next turn right (a turn the kill cut off is asked
 * again). */
static void test_tiers_restart_after_sigkill(void **state) {
    Fix *f = *state;
    fix_mkdir(f);
    Srv *s = fix_start_tiered(f, POOL2_FLAGS, "--disk-tier-mb 4");
    Srv *ref = fix_start(f, 1, REF_FLAGS);
    enum { N_SETTLED = 6, N_LATE = 3, N = N_SETTLED + N_LATE };
    Conv *cs = f->cs;
    for (int i = 0; i < N; i++) conv_init(&cs[i], "kill", i);
    for (int i = 0; i < N_SETTLED; i++) conv_step(&cs[i], s);
    wait_writes_settle(s, "disk", env_is("MNEMO_SANITIZED", "1") ? 2.0 : 1.0);
    double written = tier_metric(s, "mnemo_tier_bytes_written_total", "disk");
    pthread_t th[N_LATE];
    for (int i = N_SETTLED; i < N; i++) {
        cs[i].s = s;
        cs[i].n_turns = 1; /* two turns fit the pool, three do not */
        pthread_create(&th[i - N_SETTLED], NULL, conv_thread, &cs[i]);
    }
    double t0 = now_s();
    while (tier_metric(s, "mnemo_tier_bytes_written_total", "disk") <= written && now_s() - t0 < 60) usleep(2000);
    fix_kill(f, 0);
    for (int i = 0; i < N_LATE; i++) pthread_join(th[i], NULL);

    s = fix_start_tiered(f, POOL2_FLAGS, "--disk-tier-mb 4");
    if (log_has(s, "mnemo: error:")) fail_msg("the server restarted after SIGKILL logged an error");
    int n_disk = 0;
    for (int i = 0; i < N; i++) {
        cs[i].failure[0] = '\0';
        conv_step(&cs[i], s);
        if (i < N_SETTLED) n_disk += cs[i].ans[1].by_tier[T_DISK] > 0;
    }
    if (cs[0].ans[1].by_tier[T_POOL] != 0)
        fail_msg("the first request after the restart found %ld tokens in the empty pool", cs[0].ans[1].by_tier[T_POOL]);
    for (int i = 0; i < N; i++) expect_reference(ref, &cs[i]);
    if (n_disk == 0)
        fail_msg("none of the %d settled conversations found its first turn on disk after the restart", N_SETTLED);
    expect_health(s);
    expect_clean_log(s, false, false);
    fix_term(f, 0);
    fix_term(f, 1);
}

/* ---- 3. corrupted data files --------------------------------------------------- */

/* Turn 1 of 6 conversations, a clean stop, then random bytes over every
 * slab's data area (headers and the database intact). The restarted server
 * adopts the runs, finds every extent's checksum wrong when it reads them,
 * recomputes, and answers turns 2 and 3 right; it keeps serving. */
static void test_tiers_corrupt_data_file(void **state) {
    Fix *f = *state;
    fix_mkdir(f);
    Srv *s = fix_start_tiered(f, POOL3_FLAGS, "--disk-tier-mb 4");
    Srv *ref = fix_start(f, 1, REF_FLAGS);
    enum { N = 6 };
    Conv *cs = f->cs;
    for (int i = 0; i < N; i++) conv_init(&cs[i], "corrupt", i);
    for (int i = 0; i < N; i++) conv_step(&cs[i], s);
    double written = tier_metric(s, "mnemo_tier_bytes_written_total", "disk");
    fix_term(f, 0);
    if (written <= 0) fail_msg("nothing was written to disk before the corruption");
    if (test_corrupt_slabs(f->dir, 0) == 0) fail_msg("no slab file with a data area in %s", f->dir);

    s = fix_start_tiered(f, POOL3_FLAGS, "--disk-tier-mb 4");
    for (int turn = 1; turn < 3; turn++)
        for (int i = 0; i < N; i++) conv_step(&cs[i], s);
    for (int i = 0; i < N; i++) expect_reference(ref, &cs[i]);
    double failures = tier_metric(s, "mnemo_tier_checksum_failures_total", "disk");
    if (failures <= 0)
        fail_msg("mnemo_tier_checksum_failures_total{tier=\"disk\"} is %.0f after the data was overwritten", failures);
    /* still serving, and right */
    Conv *extra = &cs[N];
    conv_init(extra, "corrupt-after", 0);
    conv_step(extra, s);
    conv_step(extra, s);
    expect_reference(ref, extra);
    expect_health(s);
    fix_term(f, 0);
    fix_term(f, 1);
}

/* ---- 4. a disk that runs out of space ---------------------------------------------- */

/* The disk tier on a 192 KiB tmpfs with a 64 MiB budget: the slab cannot
 * be reserved (ENOSPC) and the database's WAL fills the filesystem (it does
 * with 10 conversations; the ASan build's 6 leave some room). Every answer is still
 * right, the server keeps serving, stops cleanly and restarts on the full
 * filesystem, and an idle server does not keep retrying. (The tmpfs is
 * mounted 0700: the root of a tmpfs is 1777 by default, a directory other
 * users can write, which the disk tier refuses.) */
static void test_tiers_disk_full(void **state) {
    Fix *f = *state;
    fix_mkdir(f);
    bool is_fallback = false;
    int mount_errno = 0;
    if (!env_is("MNEMO_TEST_NO_MOUNT", "1") && mount("tmpfs", f->dir, "tmpfs", 0, "size=192k,mode=0700") == 0)
        f->is_mounted = true;
    else
        mount_errno = env_is("MNEMO_TEST_NO_MOUNT", "1") ? EPERM : errno;
    if (!f->is_mounted && !env_is("CI", "true")) {
        fprintf(stderr, "skipping: cannot mount a 192 KiB tmpfs on %s (%s); needs root (with CI=true the case "
                        "fills a 1 MiB disk budget instead)\n", f->dir, strerror(mount_errno));
        skip();
        return;
    }
    if (!f->is_mounted) {
        /* No mount: fill a budget instead of a disk. 1 MiB holds about 100
         * blocks of stories260K (5 layers x 2 KiB per block, runs in 4 KiB
         * pages); 16 conversations of two turns cache about 270, so the
         * tier evicts (10 fell just short). */
        fprintf(stderr, "cannot mount a tmpfs (%s): filling a 1 MiB disk budget instead\n", strerror(mount_errno));
        is_fallback = true;
    }
    const char *budget = is_fallback ? "--disk-tier-mb 1" : "--disk-tier-mb 64";
    Srv *s = fix_start_tiered(f, POOL2_FLAGS, budget);
    Srv *ref = fix_start(f, 1, REF_FLAGS);
    int n = is_fallback ? MAX_CONVS : 10; /* 10 fill the 192 KiB (6 left 60 KiB free) */
    Conv *cs = f->cs;
    for (int i = 0; i < n; i++) conv_init(&cs[i], "full", i);
    for (int turn = 0; turn < 2; turn++)
        for (int i = 0; i < n; i++) conv_step(&cs[i], s);
    for (int i = 0; i < n; i++) expect_reference(ref, &cs[i]);
    expect_health(s);
    if (is_fallback) /* the saves still queued fill the budget */
        TEST_WAIT_UNTIL(tier_metric(s, "mnemo_tier_evictions_total", "disk") > 0,
                        "the 1 MiB disk budget never filled: no evictions; %.0f bytes written, %.0f held",
                        tier_metric(s, "mnemo_tier_bytes_written_total", "disk"),
                        tier_metric(s, "mnemo_tier_occupancy_bytes", "disk"));
    struct statvfs vfs;
    if (f->is_mounted) {
        assert_int_equal(statvfs(f->dir, &vfs), 0);
        unsigned long long left = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
        fprintf(stderr, "(the tmpfs has %llu of %llu KiB free)\n", left / 1024,
                (unsigned long long)vfs.f_blocks * vfs.f_frsize / 1024);
        /* the device really ran out: less room is left than one run takes
         * (5 layers of at least a 4 KiB page) */
        if (left >= 20 * 1024) fail_msg("the tmpfs never filled up: %llu bytes free", left);
    }
    /* idle now: a full disk must not be retried in a loop (checked last) */
    size_t len0 = 0, len1 = 0;
    usleep(300000);
    free(test_read_file(s->log, &len0));
    usleep(500000);
    free(test_read_file(s->log, &len1));
    /* a clean stop, and a restart on the full filesystem */
    fix_term(f, 0);
    s = fix_start_tiered(f, POOL2_FLAGS, budget);
    Conv *extra = &cs[n];
    conv_init(extra, "full-after", 0);
    conv_step(extra, s);
    conv_step(extra, s);
    expect_reference(ref, extra);
    expect_health(s);
    fix_term(f, 0);
    fix_term(f, 1);
    if (len1 > len0 + 2048)
        fail_msg("with the disk full, the idle server logged %zu bytes in 0.5 s (it retries in a loop)", len1 - len0);
}

/* ---- 5. SIGTERM flushes the pool to disk --------------------------------------------- */

/* Turn 1 of 6 conversations, SIGTERM at once: what only the pool held is
 * written down before the exit, so the restarted server finds every
 * conversation's first turn on disk. */
static void test_tiers_sigterm_flush(void **state) {
    Fix *f = *state;
    fix_mkdir(f);
    Srv *s = fix_start_tiered(f, POOL2_FLAGS, "--disk-tier-mb 4");
    Srv *ref = fix_start(f, 1, REF_FLAGS);
    enum { N = 6 };
    Conv *cs = f->cs;
    for (int i = 0; i < N; i++) conv_init(&cs[i], "flush", i);
    for (int i = 0; i < N; i++) conv_step(&cs[i], s);
    expect_tier_families(s, "disk");
    fix_term(f, 0);

    s = fix_start_tiered(f, POOL2_FLAGS, "--disk-tier-mb 4");
    int n_disk = 0;
    for (int i = 0; i < N; i++) {
        conv_step(&cs[i], s);
        n_disk += cs[i].ans[1].by_tier[T_DISK] > 0;
    }
    for (int i = 0; i < N; i++) expect_reference(ref, &cs[i]);
    if (cs[N - 1].ans[1].by_tier[T_DISK] <= 0)
        fail_msg("the last conversation before SIGTERM found nothing on disk after the restart (%d of %d did): %s",
                 n_disk, N, usage_of(&cs[N - 1].ans[1]));
    if (n_disk < N) fail_msg("only %d of %d conversations found their first turn on disk after SIGTERM", n_disk, N);
    expect_health(s);
    fix_term(f, 0);
    fix_term(f, 1);
}

/* ---- 6. returning one at a time on an idle server --------------------------------- */

/* Turn 1 of many conversations, one at a time, then each one's turn 2, one
 * at a time: with a 1 MiB RAM tier over the disk tier, most histories are
 * only on disk by then. A returning request on an idle server is restored
 * straight from disk (it used to wait for its history's promote into RAM
 * first), and what it read is copied up into RAM after; with a pool this
 * small the next one may wait for those copies, which hold its slots. An
 * engine with nothing running must wait for moves in flight, not call the
 * request too big for the pool (it answered 500 for most of them when it
 * waited for promotes). */
static void test_tiers_sequential_returns(void **state) {
    Fix *f = *state;
    fix_mkdir(f);
    Srv *s = fix_start_tiered(f, POOL3_FLAGS, "--ram-tier-mb 1");
    Srv *ref = fix_start(f, 1, REF_FLAGS);
    int n = env_is("MNEMO_SANITIZED", "1") ? 20 : MAX_CONVS;
    Conv *cs = f->cs;
    for (int i = 0; i < n; i++) conv_init(&cs[i], "one-by-one", i);
    for (int turn = 0; turn < 2; turn++)
        for (int i = 0; i < n; i++) conv_step(&cs[i], s);
    long by_tier[T_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        expect_reference(ref, &cs[i]);
        for (int k = 0; k < T_COUNT; k++) by_tier[k] += cs[i].ans[1].by_tier[k];
    }
    if (by_tier[T_DISK] <= 0)
        fail_msg("no returning turn was restored from disk (turn 2s found pool %ld, ram %ld, disk %ld)",
                 by_tier[T_POOL], by_tier[T_RAM], by_tier[T_DISK]);
    if (by_tier[T_RAM] <= 0) fail_msg("no returning turn found its history in RAM");
    expect_health(s);
    expect_clean_log(s, false, false);
    fix_term(f, 0);
    fix_term(f, 1);
}

/* ---- 7. purging a namespace ------------------------------------------------------ */

#define KEY_A "tenant-a-key"
#define KEY_B "tenant-b-key"

/* Where one run's KV lies: [off, off + len) of a slab file. */
typedef struct Extent {
    char path[128];
    uint64_t off, len;
    uint8_t *bytes; /* (len) what it held when listed */
} Extent;

typedef struct Extents {
    const char *dir;
    Hash128 ns;
    Extent v[64];
    int n;
} Extents;

static uint64_t le_get(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* A run row of namespace x->ns: its extent, from the run record (format
 * at the top of tier_disk.c: slab id at 24, layers at 28, offset at 32,
 * layer stride at 40). */
static int on_ns_run(void *ctx, uint64_t run_id, const void *record, size_t len, double last_used,
                     const Hash128 *ns_id) {
    Extents *x = ctx;
    if (ns_id == NULL || !hash128_eq(ns_id, &x->ns) || x->n == 64 || len < 48) return 0;
    const uint8_t *r = record;
    Extent *e = &x->v[x->n++];
    snprintf(e->path, sizeof e->path, "%s/slab-%05u.dat", x->dir, (unsigned)le_get(r + 24, 4));
    e->off = le_get(r + 32, 8);
    e->len = le_get(r + 28, 4) * le_get(r + 40, 8);
    return 0;
}

static uint8_t *read_extent(const Extent *e) {
    uint8_t *b = malloc(e->len);
    FILE *fp = fopen(e->path, "rb");
    bool ok = b && fp && fseek(fp, (long)e->off, SEEK_SET) == 0 && fread(b, 1, e->len, fp) == e->len;
    if (fp) fclose(fp);
    if (!ok) fail_msg("cannot read %llu bytes at %llu of %s", (unsigned long long)e->len,
                      (unsigned long long)e->off, e->path);
    return b;
}

/* The extents of namespace `key`'s runs in dir, with their bytes (read
 * through the store, as nobody else holds the directory). */
static void list_extents(Extents *x, const char *dir, const char *key) {
    memset(x, 0, sizeof *x);
    x->dir = dir;
    x->ns = index_namespace_id(key);
    CacheStore *st = NULL;
    MnErr err = {0};
    if (store_open_existing(dir, &st, &err) != MN_OK) fail_msg("%s", err.msg);
    assert_int_equal(store_run_foreach(st, on_ns_run, x), MN_OK);
    store_close(st);
    for (int i = 0; i < x->n; i++) x->v[i].bytes = read_extent(&x->v[i]);
}

static void extents_free(Extents *x) {
    for (int i = 0; i < x->n; i++) free(x->v[i].bytes);
    x->n = 0;
}

static bool is_zero(const uint8_t *b, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (b[i]) return false;
    return true;
}

/* Run `mnemo ARGS` with env in front; its exit status, its output (stdout
 * and stderr) in out. */
static int run_mnemo(const Fix *f, const char *env, const char *args, char *out, size_t cap) {
    char log[128], cmd[1024];
    snprintf(log, sizeof log, "%s.out", f->dir);
    const char *bin = getenv("MNEMO_BIN") ? getenv("MNEMO_BIN") : "./build/release/mnemo";
    snprintf(cmd, sizeof cmd, "%s %s %s >%s 2>&1", env, bin, args, log);
    int st = system(cmd);
    char *text = test_read_file(log, NULL);
    snprintf(out, cap, "%s", text ? text : "");
    free(text);
    unlink(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Two tenants (API keys) share a disk tier. `mnemo cache purge` is
 * refused while the server runs (it keeps serving); once stopped, purging
 * tenant A zeroes the KV bytes of A's runs in the slab files and leaves
 * none of A's reply texts in mnemo.db or its WAL, while B's extents keep
 * their bytes. After a restart, A's returning conversations find nothing
 * on disk (the first one nothing at all: recomputed), B's find their
 * history on disk and answer as a no-cache server does. Every file is
 * 0600 in a 0700 directory throughout. */
static void test_tiers_purge_namespace(void **state) {
    Fix *f = *state;
    mode_t old_mask = umask(022); /* the usual one: made mnemo.db 0644 */
    fix_mkdir(f);
    char flags[256], args[512], out[2048];
    snprintf(flags, sizeof flags, "--api-key %s --api-key %s --disk-tier-mb 4", KEY_A, KEY_B);
    Srv *s = fix_start_tiered(f, POOL2_FLAGS, flags);
    Srv *ref = fix_start(f, 1, REF_FLAGS);
    enum { N = 3 };
    Conv *cs = f->cs; /* A: 0..N-1, B: N..2N-1 */
    for (int i = 0; i < 2 * N; i++) {
        conv_init(&cs[i], i < N ? "tenant A" : "tenant B", i);
        cs[i].key = i < N ? KEY_A : KEY_B;
        conv_step(&cs[i], s);
    }
    snprintf(args, sizeof args, "cache purge --disk-tier %s --namespace %s", f->dir, KEY_A);
    if (run_mnemo(f, "", args, out, sizeof out) != 1 || strstr(out, "in use by a running mnemo server") == NULL)
        fail_msg("a purge under a running server was not refused: %s", out);
    expect_health(s);
    fix_term(f, 0);
    static const char *const files[] = {"mnemo.db", "slab-00000.dat"};
    test_expect_private(f->dir, files, 2);

    Extents xa, xb;
    list_extents(&xa, f->dir, KEY_A);
    list_extents(&xb, f->dir, KEY_B);
    if (xa.n == 0 || xb.n == 0) fail_msg("runs on disk: %d of A, %d of B; want both", xa.n, xb.n);
    for (int i = 0; i < xa.n; i++)
        if (is_zero(xa.v[i].bytes, xa.v[i].len)) fail_msg("an extent of A holds only zeros before the purge");
    for (int i = 0; i < N; i++)
        if (!test_dir_contains(f->dir, "mnemo.db", cs[i].ans[0].reply, strlen(cs[i].ans[0].reply)))
            fail_msg("A's reply \"%s\" is not in the database before the purge", cs[i].ans[0].reply);

    /* the key from the environment: it stays off the command line */
    snprintf(args, sizeof args, "cache purge --disk-tier %s", f->dir);
    if (run_mnemo(f, "MNEMO_NAMESPACE=" KEY_A, args, out, sizeof out) != 0 ||
        strstr(out, "purged the namespace") == NULL)
        fail_msg("purge failed: %s", out);
    fprintf(stderr, "(mnemo cache purge said: %s)\n", out);
    test_expect_private(f->dir, files, 2);
    for (int i = 0; i < xa.n; i++) {
        uint8_t *now = read_extent(&xa.v[i]);
        if (!is_zero(now, xa.v[i].len)) fail_msg("%s at %llu still holds A's KV after the purge", xa.v[i].path,
                                                 (unsigned long long)xa.v[i].off);
        free(now);
    }
    for (int i = 0; i < xb.n; i++) {
        uint8_t *now = read_extent(&xb.v[i]);
        if (memcmp(now, xb.v[i].bytes, xb.v[i].len) != 0) fail_msg("the purge of A changed an extent of B");
        free(now);
    }
    for (int i = 0; i < N; i++) {
        const char *text = cs[i].ans[0].reply;
        bool is_b_too = false; /* a text B's replies contain too stays, rightly */
        for (int k = N; k < 2 * N; k++) is_b_too = is_b_too || strstr(cs[k].ans[0].reply, text) != NULL;
        if (!is_b_too && test_dir_contains(f->dir, "mnemo.db", text, strlen(text)))
            fail_msg("A's reply \"%s\" is still in the database files after the purge", text);
    }
    for (int k = N; k < 2 * N; k++)
        if (!test_dir_contains(f->dir, "mnemo.db", cs[k].ans[0].reply, strlen(cs[k].ans[0].reply)))
            fail_msg("B's reply \"%s\" went with A's purge", cs[k].ans[0].reply);
    extents_free(&xa);
    extents_free(&xb);

    s = fix_start_tiered(f, POOL2_FLAGS, flags);
    for (int i = 0; i < 2 * N; i++) conv_step(&cs[i], s);
    if (cs[0].ans[1].cached_tokens != 0)
        fail_msg("A's first returning turn after the purge found cached tokens: %s", usage_of(&cs[0].ans[1]));
    for (int i = 0; i < N; i++)
        if (cs[i].ans[1].by_tier[T_DISK] != 0) fail_msg("A's turn 2 came from disk after the purge: %s",
                                                         usage_of(&cs[i].ans[1]));
    for (int i = N; i < 2 * N; i++) {
        if (cs[i].ans[1].by_tier[T_DISK] <= 0)
            fail_msg("B's turn 2 found nothing on disk: %s", usage_of(&cs[i].ans[1]));
        expect_reference(ref, &cs[i]);
    }
    expect_health(s);
    expect_clean_log(s, false, false);
    fix_term(f, 0);
    fix_term(f, 1);
    test_expect_private(f->dir, files, 2);
    umask(old_mask);
}

/* ---- 8. the shared tier: instances on one Redis ------------------------------------ */

/* Start srv[i] as an instance of the shared tier on the case's Redis (or
 * its Redis Cluster, the three nodes its seeds), with a pool that holds
 * three turns of one conversation. */
static Srv *fix_start_redis(Fix *f, int i, const char *extra) {
    char flags[512], store[300];
    if (f->cluster.node[0].pid > 0)
        snprintf(store, sizeof store, "--redis-cluster --redis-tier %s --redis-tier %s --redis-tier %s",
                 f->cluster.urls[0], f->cluster.urls[1], f->cluster.urls[2]);
    else snprintf(store, sizeof store, "--redis-tier %s", f->redis.url);
    snprintf(flags, sizeof flags, "%s %s %s", POOL3_FLAGS, store, extra ? extra : "");
    return fix_start(f, i, flags);
}

/* The saves of what s's finished turns left behind are done: a SAVE
 * holds its pool blocks until it is, so nothing held and nothing running
 * means nothing is on its way to Redis. */
static void wait_saved(const Srv *s) {
    TEST_WAIT_UNTIL(srv_metric(s, "mnemo_pool_blocks{state=\"used\"}") == 0 &&
                        srv_metric(s, "mnemo_running_sequences") == 0,
                    "server %d still holds %.0f pool blocks", (int)s->pid,
                    srv_metric(s, "mnemo_pool_blocks{state=\"used\"}"));
}

/* Redis (a three-node cluster when is_cluster), then A (srv[0]) and B
 * (srv[2]) on it and the no-cache reference (srv[1]); the first turn of n
 * conversations tagged tag on A, saved in Redis. False (the case is
 * skipped) without redis-server. */
static bool redis_case_start(Fix *f, bool is_cluster, const char *tag, int n, Srv **a, Srv **ref, Srv **b) {
    if (!redis_srv_available()) {
        skip();
        return false;
    }
    if (is_cluster) redis_cluster_start(&f->cluster);
    else redis_srv_start(&f->redis, NULL);
    *a = fix_start_redis(f, 0, NULL);
    *ref = fix_start(f, 1, REF_FLAGS);
    *b = fix_start_redis(f, 2, NULL);
    for (int i = 0; i < n; i++) {
        conv_init(&f->cs[i], tag, i);
        conv_step(&f->cs[i], *a);
    }
    wait_saved(*a);
    return true;
}

static void redis_case_stop(Fix *f) {
    fix_term(f, 0);
    fix_term(f, 2);
    fix_term(f, 1);
}

/* Blocks of 8 tokens wholly inside the first n tokens. */
static long full_tokens(long n) { return n / 8 * 8; }

/* Turn 1 of four conversations on A, turn 2 on B, turn 3 on A again: each
 * instance finds the history the other computed in Redis (B's first
 * answer all of it, the history's whole blocks at least), and every
 * answer equals the no-cache server's. B's counters say the same. */
static void redis_hop(Fix *f, bool is_cluster) {
    enum { N = 4 };
    Srv *a, *ref, *b;
    if (!redis_case_start(f, is_cluster, "hop", N, &a, &ref, &b)) return;
    Conv *cs = f->cs;
    long b_redis = 0;
    for (int i = 0; i < N; i++) {
        conv_step(&cs[i], b);
        const Answer *t1 = &cs[i].ans[0], *t2 = &cs[i].ans[1];
        long history = full_tokens(t1->prompt_tokens);
        if (t2->cached_tokens < history || (i == 0 && t2->by_tier[T_REDIS] != t2->cached_tokens))
            fail_msg("'%s' turn 2 on the other instance: %ld of its history's %ld tokens cached (%s)", cs[i].first,
                     t2->cached_tokens, history, usage_of(t2));
        b_redis += t2->by_tier[T_REDIS];
    }
    wait_saved(b);
    long a_redis = 0;
    for (int i = 0; i < N; i++) {
        conv_step(&cs[i], a);
        const Answer *t3 = &cs[i].ans[2];
        if (t3->cached_tokens < full_tokens(cs[i].ans[1].prompt_tokens))
            fail_msg("'%s' turn 3 back on the first instance: %ld tokens cached (%s)", cs[i].first, t3->cached_tokens,
                     usage_of(t3));
        a_redis += t3->by_tier[T_REDIS];
    }
    if (a_redis <= 0) fail_msg("no third turn found turn 2's blocks in Redis");
    for (int i = 0; i < N; i++) expect_reference(ref, &cs[i]);
    expect_tier_families(b, "redis");
    if (tier_metric(b, "mnemo_cached_tokens_total", "redis") != (double)b_redis)
        fail_msg("mnemo_cached_tokens_total{tier=\"redis\"} is %.0f on B, its answers reported %ld",
                 tier_metric(b, "mnemo_cached_tokens_total", "redis"), b_redis);
    if (!(srv_metric(b, "mnemo_shared_tier_lookups_total{result=\"found\"}") > 0))
        fail_msg("B counted no block found in the shared tier");
    if (tier_metric(b, "mnemo_tier_up", "redis") != 1) fail_msg("B's redis tier is not up");
    if (!(tier_metric(a, "mnemo_tier_bytes_written_total", "redis") > 0 &&
          tier_metric(b, "mnemo_tier_bytes_read_total", "redis") > 0))
        fail_msg("nothing was written to Redis by A, or read from it by B");
    expect_clean_log(a, false, false);
    expect_clean_log(b, false, false);
    redis_case_stop(f);
}

static void test_tiers_redis_hop(void **state) { redis_hop(*state, false); }
/* The same on a three-node Redis Cluster (--redis-cluster, the nodes the
 * seeds). */
static void test_tiers_redis_cluster_hop(void **state) { redis_hop(*state, true); }

/* Redis killed while B restores eight conversations from it at once (the
 * kill comes as soon as B's first bytes are read from it, with the other
 * restores queued or in flight): no request fails and every answer is
 * right; B's tier is off (counted). Redis back (empty): B reconnects by
 * itself, and a conversation A puts there afterwards comes back on B. */
static void test_tiers_redis_killed(void **state) {
    Fix *f = *state;
    enum { N = 8 };
    Srv *a, *ref, *b;
    if (!redis_case_start(f, false, "down", N, &a, &ref, &b)) return;
    Conv *cs = f->cs;
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        cs[i].s = b;
        cs[i].n_turns = 1;
        pthread_create(&th[i], NULL, conv_thread, &cs[i]);
    }
    TEST_WAIT_UNTIL(tier_metric(b, "mnemo_tier_bytes_read_total", "redis") > 0 ||
                        srv_metric(b, "mnemo_requests_total{status=\"200\"}") >= N,
                    "B read nothing from Redis");
    redis_srv_kill(&f->redis);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++)
        if (cs[i].failure[0]) fail_msg("a request failed while Redis died: %s", cs[i].failure);
    for (int i = 0; i < N; i++) expect_reference(ref, &cs[i]);
    /* B noticed (its probes and restores fail after the kill; one more
     * conversation makes sure it tried) */
    Conv *extra = &cs[N];
    conv_init(extra, "down-after", 0);
    conv_step(extra, b);
    if (tier_metric(b, "mnemo_tier_io_errors_total", "redis") < 1)
        fail_msg("B's redis tier counted no failure after Redis was killed");
    redis_srv_start(&f->redis, NULL);
    TEST_WAIT_UNTIL(tier_metric(b, "mnemo_tier_up", "redis") == 1, "B's redis tier did not come back");
    if (tier_metric(b, "mnemo_tier_reconnects_total", "redis") < 1) fail_msg("B counted no reconnect");
    /* A's connection died too: it fails over its next turn and comes back */
    Conv *late = &cs[N - 1];
    conv_free(late);
    conv_init(late, "back", 0);
    conv_step(late, a); /* (recomputed, and A's tier goes off until it reconnects) */
    TEST_WAIT_UNTIL(tier_metric(a, "mnemo_tier_up", "redis") == 1, "A's redis tier did not come back");
    Conv *again = extra;
    conv_free(again);
    conv_init(again, "back-again", 1);
    conv_step(again, a);
    wait_saved(a);
    conv_step(again, b);
    if (again->ans[1].by_tier[T_REDIS] <= 0)
        fail_msg("after Redis came back, B found nothing of A's conversation in it (%s)", usage_of(&again->ans[1]));
    expect_reference(ref, again);
    expect_health(b);
    redis_case_stop(f);
}

/* A damaged value (SETRANGE over every stored layer): B's restores fail
 * their checks, the blocks are recomputed and the failures counted; then
 * FLUSHALL: every later turn is recomputed, and every answer is still
 * the no-cache server's. */
static void test_tiers_redis_damage_and_flush(void **state) {
    Fix *f = *state;
    enum { N = 3 };
    Srv *a, *ref, *b;
    if (!redis_case_start(f, false, "damage", N, &a, &ref, &b)) return;
    Conv *cs = f->cs;
    if (redis_srv_damage(&f->redis, "mnemo:kv1:*", 100) == 0) fail_msg("A stored no value in Redis");
    for (int i = 0; i < N; i++) {
        conv_step(&cs[i], b);
        if (cs[i].ans[1].by_tier[T_REDIS] != 0)
            fail_msg("'%s' used %ld damaged tokens from Redis", cs[i].first, cs[i].ans[1].by_tier[T_REDIS]);
    }
    if (tier_metric(b, "mnemo_tier_checksum_failures_total", "redis") < 1)
        fail_msg("B counted no checksum failure in Redis");
    wait_saved(b);
    freeReplyObject(redis_srv_cmd(&f->redis, "FLUSHALL"));
    for (int i = 0; i < N; i++) conv_step(&cs[i], a);
    for (int i = 0; i < N; i++) expect_reference(ref, &cs[i]);
    expect_health(a);
    expect_health(b);
    redis_case_stop(f);
}

int main(void) {
    test_apply_filter();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tiers_many_conversations, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_hidden_plan, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_restart_after_sigkill, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_corrupt_data_file, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_disk_full, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_sigterm_flush, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_sequential_returns, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_purge_namespace, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_redis_hop, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_redis_cluster_hop, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_redis_killed, fix_setup, fix_teardown),
        cmocka_unit_test_setup_teardown(test_tiers_redis_damage_and_flush, fix_setup, fix_teardown),
    };
    if (getenv("MNEMO_TEST_FILTER")) cmocka_set_test_filter(getenv("MNEMO_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
