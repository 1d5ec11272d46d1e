/* bench_redis_layout.c — which key layout restores a run from Redis faster:
 * one key per layer extent (what cache/tier_redis.c stores) or one key per
 * run, read whole (GET) or layer by layer (GETRANGE). Not part of the test
 * suite (the Makefile only builds tests/test_*.c). Build and run, against
 * a redis-server on a unix socket:
 *
 *   gcc -std=c17 -D_GNU_SOURCE -O2 -I/usr/include/hiredis tests/bench_redis_layout.c \
 *       -lhiredis -o /tmp/bench_redis_layout
 *   redis-server --port 0 --unixsocket /tmp/bl.sock --save '' --appendonly no &
 *   /tmp/bench_redis_layout /tmp/bl.sock [n_layer block_kib run_blocks runs_per_restore reps]
 *
 * Defaults: the 1.1B llama `make bench` serves (22 layers, 32 KiB blocks:
 * 32 tokens of a 256-wide f16 K and V), runs of 8 blocks, 2 runs a restore
 * (a conversation's turns), 40 restores of each layout, over 32 runs
 * stored. Each restore is timed through hiredis as the tier reads (a
 * pipeline of GETs, replies taken one by one), with the time its first
 * layer is complete (what a layer-wise restore lets compute start on) and
 * its last. Prints the median of each, and MB/s of the whole restore.
 *
 *   /tmp/bench_redis_layout SOCKET --existing [reps]
 *
 * reads instead the runs a mnemo server stored there (its mnemo:kv1:*
 * keys, found by SCAN; runs missing a layer are left out), each run read
 * whole as the tier reads it (GETs of its layer keys, 512 KiB of them
 * ahead), every run once per rep (default 3) in a shuffled order, and
 * prints their total MB/s as "raw_get_mbps=R runs=N bytes=B": the raw GET
 * loop that `make bench`'s route part sets the tier's restore bandwidth
 * against, on the same values in the same run.
 */
#include <hiredis.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static void check(redisContext *c, redisReply *r, const char *what) {
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "%s failed: %s\n", what, r ? r->str : c->errstr);
        exit(1);
    }
}

static redisReply *take(redisContext *c) {
    void *r = NULL;
    if (redisGetReply(c, &r) != REDIS_OK) {
        fprintf(stderr, "read failed: %s\n", c->errstr);
        exit(1);
    }
    return r;
}

typedef enum { PER_LAYER, PER_RUN_GET, PER_RUN_RANGE } Layout;

/* Runs a mnemo server stored (--existing): keys[run][layer] and the
 * length of each run's layer 0 (read before the timing); NULL for the
 * synthetic runs this program stores. */
static char ***existing;
static size_t *existing_len;

typedef struct Variant {
    Layout layout;
    int window; /* layers asked for ahead; 0: all at once; < 0: -window KiB of values (at least a layer) */
    const char *name;
    double *first, *last; /* (reps) */
} Variant;

/* Append the request(s) for layer l of runs[0..n): a GET of its key, or a
 * GETRANGE of its extent in the run's value. */
static void ask_layer(redisContext *c, Layout lay, const int *runs, int n, int l, size_t extent) {
    for (int i = 0; i < n; i++) {
        if (existing) redisAppendCommand(c, "GET %s", existing[runs[i]][l]);
        else if (lay == PER_LAYER) redisAppendCommand(c, "GET bl:{%d}:%d", runs[i], l);
        else
            redisAppendCommand(c, "GETRANGE bl:run:%d %lld %lld", runs[i], (long long)l * (long long)extent,
                               (long long)(l + 1) * (long long)extent - 1);
    }
}

/* One restore of runs[0..n) when layer 0 of all is in, *last when
 * all is; returns the bytes read. extent 0 (existing runs): the values'
 * lengths vary, the window is sized by the first run's layer 0. */
static size_t restore(redisContext *c, const Variant *v, const int *runs, int n, int n_layer, size_t extent,
                      double *first, double *last) {
    double t0 = now();
    if (v->layout == PER_RUN_GET) {
        for (int i = 0; i < n; i++) redisAppendCommand(c, "GET bl:run:%d", runs[i]);
        for (int i = 0; i < n; i++) {
            redisReply *rep = take(c);
            if (rep->len != extent * (size_t)n_layer) exit(1);
            freeReplyObject(rep);
        }
        *first = *last = now() - t0; /* the whole value arrives before any of it is usable */
        return extent * (size_t)n_layer * (size_t)n;
    }
    int window = v->window;
    size_t bytes = 0;
    if (window < 0) { /* as the tier sizes it: bytes of whole layers, at least one */
        size_t layer_bytes = (extent ? extent : existing_len[runs[0]]) * (size_t)n;
        window = (int)((size_t)-window * 1024 / layer_bytes);
        if (window < 1) window = 1;
    }
    int ahead = window > 0 && window < n_layer ? window : n_layer, sent = 0;
    for (; sent < ahead; sent++) ask_layer(c, v->layout, runs, n, sent, extent);
    for (int l = 0; l < n_layer; l++) {
        for (int i = 0; i < n; i++) {
            redisReply *rep = take(c);
            if (rep->type != REDIS_REPLY_STRING || (extent && rep->len != extent)) {
                fprintf(stderr, "a value is %s\n", rep->type == REDIS_REPLY_STRING ? "of another length" : "gone");
                exit(1);
            }
            bytes += rep->len;
            freeReplyObject(rep);
        }
        if (l == 0) *first = now() - t0;
        if (sent < n_layer) ask_layer(c, v->layout, runs, n, sent++, extent);
    }
    *last = now() - t0;
    return bytes;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* --existing: the runs under mnemo:kv1:*, every one read whole once per
 * rep, shuffled; their MB/s. */
static int run_existing(redisContext *c, int reps) {
    char **names = NULL;
    size_t n_names = 0, cap = 0;
    char cursor[32] = "0";
    do { /* SCAN: every key present throughout is returned */
        redisReply *rep = redisCommand(c, "SCAN %s MATCH mnemo:kv1:* COUNT 1000", cursor);
        check(c, rep, "SCAN");
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        for (size_t i = 0; i < rep->element[1]->elements; i++) {
            if (n_names == cap) names = realloc(names, (cap = cap ? 2 * cap : 1024) * sizeof *names);
            names[n_names++] = strdup(rep->element[1]->element[i]->str);
        }
        freeReplyObject(rep);
    } while (strcmp(cursor, "0") != 0);
    qsort(names, n_names, sizeof *names, cmp_str); /* a run's keys next to each other ("...}:L") */
    int n_layer = 0;
    for (size_t i = 0; i < n_names; i++) {
        int l = atoi(strrchr(names[i], ':') + 1);
        if (l + 1 > n_layer) n_layer = l + 1;
    }
    int n_runs = 0;
    existing = calloc(n_names + 1, sizeof *existing);
    for (size_t i = 0; i < n_names;) { /* one run: the keys sharing "...}:" */
        size_t j = i, stem = (size_t)(strrchr(names[i], ':') - names[i]);
        while (j < n_names && strncmp(names[j], names[i], stem + 1) == 0 && strchr(names[j] + stem + 1, ':') == NULL) j++;
        if ((int)(j - i) == n_layer) {
            existing[n_runs] = calloc((size_t)n_layer, sizeof(char *));
            for (size_t k = i; k < j; k++) existing[n_runs][atoi(strrchr(names[k], ':') + 1)] = names[k];
            n_runs++;
        }
        i = j;
    }
    if (n_runs == 0) {
        printf("raw_get_mbps=0 runs=0 bytes=0 (no whole run under mnemo:kv1:*)\n");
        return 1;
    }
    existing_len = calloc((size_t)n_runs, sizeof *existing_len);
    for (int r = 0; r < n_runs; r++) {
        redisReply *rep = redisCommand(c, "STRLEN %s", existing[r][0]);
        check(c, rep, "STRLEN");
        existing_len[r] = (size_t)rep->integer;
        freeReplyObject(rep);
    }
    Variant v = {PER_LAYER, -512, "existing", 0, 0};
    int *order = malloc(sizeof(int) * (size_t)n_runs);
    for (int r = 0; r < n_runs; r++) order[r] = r;
    unsigned seed = 12345;
    double total_s = 0;
    size_t total_bytes = 0;
    for (int k = 0; k < reps; k++) {
        for (int r = n_runs - 1; r > 0; r--) { /* shuffled, so no run's values sit warm in a cache */
            int j = (int)((seed = seed * 1103515245u + 12345u) >> 16) % (r + 1), t = order[r];
            order[r] = order[j];
            order[j] = t;
        }
        for (int r = 0; r < n_runs; r++) {
            double first, last;
            total_bytes += restore(c, &v, &order[r], 1, n_layer, 0, &first, &last);
            total_s += last;
        }
    }
    printf("raw_get_mbps=%.1f runs=%d bytes=%zu\n", (double)total_bytes / total_s / 1e6, n_runs, total_bytes);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SOCKET [n_layer block_kib run_blocks runs_per_restore reps]\n"
                        "       %s SOCKET --existing [reps]\n", argv[0], argv[0]);
        return 2;
    }
    if (argc > 2 && strcmp(argv[2], "--existing") == 0) {
        redisContext *c = redisConnectUnix(argv[1]);
        if (c == NULL || c->err) {
            fprintf(stderr, "cannot connect to %s\n", argv[1]);
            return 1;
        }
        return run_existing(c, argc > 3 ? atoi(argv[3]) : 3);
    }
    int n_layer = argc > 2 ? atoi(argv[2]) : 22, block_kib = argc > 3 ? atoi(argv[3]) : 32;
    int run_blocks = argc > 4 ? atoi(argv[4]) : 8, per_restore = argc > 5 ? atoi(argv[5]) : 2;
    int reps = argc > 6 ? atoi(argv[6]) : 60, n_runs = 32;
    size_t extent = (size_t)block_kib * 1024 * (size_t)run_blocks, run = extent * (size_t)n_layer;
    redisContext *c = redisConnectUnix(argv[1]);
    if (c == NULL || c->err) {
        fprintf(stderr, "cannot connect to %s\n", argv[1]);
        return 1;
    }
    char *buf = malloc(run);
    for (size_t i = 0; i < run; i++) buf[i] = (char)(i * 2654435761u >> 13);
    check(c, redisCommand(c, "FLUSHALL"), "FLUSHALL");
    for (int r = 0; r < n_runs; r++) {
        for (int l = 0; l < n_layer; l++) {
            redisReply *rep = redisCommand(c, "SET bl:{%d}:%d %b", r, l, buf + (size_t)l * extent, extent);
            check(c, rep, "SET");
            freeReplyObject(rep);
        }
        redisReply *rep = redisCommand(c, "SET bl:run:%d %b", r, buf, run);
        check(c, rep, "SET");
        freeReplyObject(rep);
    }
    Variant vs[] = {
        {PER_LAYER, 1, "key per layer, GET, 1 layer ahead", 0, 0},
        {PER_LAYER, 4, "key per layer, GET, 4 layers ahead", 0, 0},
        {PER_LAYER, 0, "key per layer, GET, all at once", 0, 0},
        {PER_LAYER, -256, "key per layer, GET, 256 KiB ahead", 0, 0},
        {PER_LAYER, -512, "key per layer, GET, 512 KiB ahead", 0, 0},
        {PER_LAYER, -1024, "key per layer, GET, 1 MiB ahead", 0, 0},
        {PER_RUN_GET, 0, "key per run, GET whole", 0, 0},
        {PER_RUN_RANGE, 1, "key per run, GETRANGE, 1 layer ahead", 0, 0},
        {PER_RUN_RANGE, 4, "key per run, GETRANGE, 4 layers ahead", 0, 0},
        {PER_RUN_RANGE, 0, "key per run, GETRANGE, all at once", 0, 0},
    };
    int n_v = (int)(sizeof vs / sizeof vs[0]);
    for (int v = 0; v < n_v; v++) {
        vs[v].first = malloc(sizeof(double) * (size_t)reps);
        vs[v].last = malloc(sizeof(double) * (size_t)reps);
    }
    printf("%d layers, runs of %d blocks of %d KiB per layer (%.2f MiB a run), %d runs a restore, %d restores "
           "of each variant, interleaved\n",
           n_layer, run_blocks, block_kib, (double)run / 1048576.0, per_restore, reps);
    unsigned seed = 12345;
    for (int k = 0; k < reps; k++) { /* the variants take turns: a loaded machine slows them alike */
        int runs[16];
        for (int i = 0; i < per_restore; i++) runs[i] = (int)((seed = seed * 1103515245u + 12345u) >> 16) % n_runs;
        for (int v = 0; v < n_v; v++) restore(c, &vs[v], runs, per_restore, n_layer, extent, &vs[v].first[k], &vs[v].last[k]);
    }
    for (int v = 0; v < n_v; v++) {
        double f = median(vs[v].first, reps), t = median(vs[v].last, reps);
        printf("  %-40s first layer %7.3f ms, whole restore %7.3f ms, %7.1f MB/s\n", vs[v].name, f * 1e3, t * 1e3,
               (double)run * per_restore / t / 1e6);
        free(vs[v].first);
        free(vs[v].last);
    }
    free(buf);
    redisFree(c);
    return 0;
}
