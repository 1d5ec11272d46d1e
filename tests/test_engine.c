/* test_engine.c — the serving engine: continuous batching, the automatic
 * prefix cache, suspension under pool pressure, stop strings, cancellation
 * and the queue limit. Every output is compared with a single-sequence run
 * (runner) of the same prompt: batching and caching must not change a bit. */
#include "test_util.h"

#include <pthread.h>
#include <unistd.h>

#include "base/err.h"
#include "base/mem.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "model/model.h"

static Model *load(const char *name) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "models/%s.gguf", name);
    test_data_path(path, sizeof path, rel);
    if (!test_require_file(path)) return NULL;
    Model *m = NULL;
    MnErr err = {0};
    if (model_load(path, &m, &err)) fail_msg("%s", err.msg);
    return m;
}

static void greedy_params(ReqParams *p, int max_tokens) {
    memset(p, 0, sizeof *p);
    sampler_params_default(&p->sp);
    p->sp.temperature = 0;
    p->max_tokens = max_tokens;
    p->ignore_eos = true;
}

/* Read a request to its end; returns the text (malloc'd). */
static char *drain(Request *r, ReqResult *res) {
    size_t cap = 1024, n = 0;
    char *all = malloc(cap);
    all[0] = '\0';
    for (;;) {
        char *t;
        size_t len;
        bool done;
        assert_int_equal(request_read(r, &t, &len, &done, res, 1000), MN_OK);
        if (n + len + 1 > cap) all = realloc(all, cap = 2 * (n + len + 1));
        memcpy(all + n, t, len);
        n += len;
        all[n] = '\0';
        mn_free(t);
        if (done) return all;
    }
}

/* Greedy reference text of n tokens after prompt, by the runner. */
typedef struct Greedy {
    int32_t id;
    int n_vocab;
} Greedy;
static int greedy_row(void *ctx, int idx, const float *logits) {
    Greedy *g = ctx;
    int32_t best = 0;
    for (int32_t i = 1; i < g->n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    g->id = best;
    return 0;
}
static char *reference_text(Model *m, const int32_t *prompt, int n_prompt, int n) {
    Runner r;
    RunnerOptions ro;
    runner_options_default(&ro);
    ro.n_ctx = n_prompt + n + 1;
    MnErr err = {0};
    assert_int_equal(runner_init(&r, m, &ro, &err), MN_OK);
    Greedy g = {0, m->cfg.n_vocab};
    assert_int_equal(runner_eval(&r, prompt, n_prompt, false, greedy_row, &g, &err), MN_OK);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) {
        ids[i] = g.id;
        if (i + 1 < n) assert_int_equal(runner_eval(&r, &ids[i], 1, false, greedy_row, &g, &err), MN_OK);
    }
    TokStream ts;
    tok_stream_init(&ts, m->tok, false);
    ts.at_start = false;
    size_t cap = 64 * (size_t)n + 64, len = 0, k;
    char *out = malloc(cap);
    for (int i = 0; i < n; i++) {
        tok_stream_push(&ts, ids[i], out + len, cap - len, &k);
        len += k;
    }
    tok_stream_flush(&ts, out + len, cap - len, &k);
    out[len + k] = '\0';
    free(ids);
    runner_deinit(&r);
    return out;
}

static void make_prompt(int32_t *t, int n, int n_vocab, uint64_t seed, int bos) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)(3 + (seed >> 33) % (uint64_t)(n_vocab - 3));
    }
    if (bos >= 0) t[0] = bos;
}

typedef struct Job {
    Engine *e;
    int32_t prompt[200];
    int n_prompt, n_gen;
    char *text;
    ReqResult res;
} Job;

static void *job_main(void *arg) {
    Job *j = arg;
    ReqParams p;
    greedy_params(&p, j->n_gen);
    Request *r = request_new(j->prompt, (size_t)j->n_prompt, &p, "", NULL);
    MnErr err = {0};
    if (engine_submit(j->e, r, &err) != MN_OK) {
        j->text = strdup("SUBMIT FAILED");
        request_unref(r);
        return NULL;
    }
    j->text = drain(r, &j->res);
    request_unref(r);
    return NULL;
}

/* 16 concurrent requests through a small pool (suspensions happen) give the
 * same text as each alone; with and without the prefix cache. */
static void check_concurrent(const char *model, bool prefix_cache, int pool_blocks, int parallel) {
    Model *m = load(model);
    if (!m) return;
    EngineOptions o;
    engine_options_default(&o);
    o.prefix_cache = prefix_cache;
    o.pool_blocks = pool_blocks;
    o.parallel = parallel;
    o.batch_tokens = 64;
    o.block_tokens = 8;
    o.n_ctx = 256;
    Engine *e;
    MnErr err = {0};
    if (engine_new(m, &o, &e, &err)) fail_msg("%s", err.msg);
    enum { N = 16 };
    Job *jobs = calloc(N, sizeof *jobs);
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        jobs[i].e = e;
        jobs[i].n_prompt = 5 + 11 * (i % 7);
        jobs[i].n_gen = 12 + i;
        make_prompt(jobs[i].prompt, jobs[i].n_prompt, m->cfg.n_vocab, (uint64_t)i / 2, tok_bos(m->tok));
        pthread_create(&th[i], NULL, job_main, &jobs[i]);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        char *ref = reference_text(m, jobs[i].prompt, jobs[i].n_prompt, jobs[i].n_gen);
        if (strcmp(ref, jobs[i].text) != 0) fail_msg("request %d: '%s' != alone '%s'", i, jobs[i].text, ref);
        assert_int_equal(jobs[i].res.finish, FINISH_LENGTH);
        assert_int_equal(jobs[i].res.n_generated, jobs[i].n_gen);
        free(ref);
        free(jobs[i].text);
    }
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.pool_used, 0);
    assert_int_equal(st.requests_finished[FINISH_LENGTH], N);
    if (pool_blocks > 0 && pool_blocks < 40) assert_true(st.suspensions > 0);
    free(jobs);
    engine_free(e);
    model_free(m);
}

static void test_concurrent_cache(void **s) { check_concurrent("tiny-llama-spm-q8_0", true, 0, 4); }
static void test_concurrent_nocache(void **s) { check_concurrent("tiny-qwen2-gpt2-f32", false, 0, 3); }
/* a pool of a few blocks forces suspensions */
static void test_concurrent_tiny_pool(void **s) { check_concurrent("stories260K", true, 24, 6); }

/* A returning conversation finds its earlier prompt + reply in the pool. */
static void test_prefix_reuse(void **s) {
    Model *m = load("stories260K");
    if (!m) return;
    EngineOptions o;
    engine_options_default(&o);
    o.block_tokens = 8;
    Engine *e;
    MnErr err = {0};
    assert_int_equal(engine_new(m, &o, &e, &err), MN_OK);
    int32_t prompt[128];
    make_prompt(prompt, 37, 512, 5, 1);
    ReqParams p;
    greedy_params(&p, 20);
    Request *r = request_new(prompt, 37, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    ReqResult res;
    char *t1 = drain(r, &res);
    assert_int_equal(res.n_cached, 0);
    request_unref(r);
    /* same prompt again: 36 of 37 tokens usable, 4 full blocks of 8 */
    r = request_new(prompt, 37, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    char *t2 = drain(r, &res);
    assert_int_equal(res.n_cached, 32);
    assert_string_equal(t1, t2);
    request_unref(r);
    /* another namespace never hits */
    r = request_new(prompt, 37, &p, "tenant-b", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    char *t3 = drain(r, &res);
    assert_int_equal(res.n_cached, 0);
    assert_string_equal(t1, t3);
    request_unref(r);
    free(t1);
    free(t2);
    free(t3);
    engine_free(e);
    model_free(m);
}

/* Leading-end eviction: the pool evicts a finished conversation's leading
 * blocks first; when it returns, those are recomputed and the cached blocks
 * after them used in place, in one two-range pass — and the answer is the
 * recomputed one, bit for bit. */
static void test_leading_blocks_recomputed(void **s) {
    Model *m = load("stories260K");
    if (!m) return;
    EngineOptions o;
    engine_options_default(&o);
    o.block_tokens = 8;
    o.pool_blocks = 12;
    o.parallel = 1;
    Engine *e;
    MnErr err = {0};
    assert_int_equal(engine_new(m, &o, &e, &err), MN_OK);
    int32_t a_prompt[80], b_prompt[80];
    make_prompt(a_prompt, 65, 512, 31, 1);
    make_prompt(b_prompt, 41, 512, 32, 1);
    ReqParams p;
    greedy_params(&p, 6);
    ReqResult res;
    char *ref = reference_text(m, a_prompt, 65, 6);
    /* A: 65 + 6 tokens, its 8 full prompt blocks stay cached */
    Request *r = request_new(a_prompt, 65, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    char *t = drain(r, &res);
    assert_string_equal(t, ref);
    free(t);
    request_unref(r);
    /* B needs 6 blocks: 3 free ones and A's 3 least recently used = its leading ones */
    r = request_new(b_prompt, 41, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    free(drain(r, &res));
    request_unref(r);
    /* A again: leading blocks recomputed, the rest used from the pool */
    r = request_new(a_prompt, 65, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    t = drain(r, &res);
    assert_string_equal(t, ref);
    assert_true(res.n_cached > 0 && res.n_cached < 64);
    free(t);
    request_unref(r);
    /* and once more: everything is back in the pool */
    r = request_new(a_prompt, 65, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    t = drain(r, &res);
    assert_string_equal(t, ref);
    assert_int_equal(res.n_cached, 64);
    free(t);
    request_unref(r);
    free(ref);
    engine_free(e);
    model_free(m);
}

/* --cache-ttl: blocks idle longer than the TTL leave the pool, even while
 * the engine has nothing else to do. */
static void test_cache_ttl(void **s) {
    Model *m = load("stories260K");
    if (!m) return;
    EngineOptions o;
    engine_options_default(&o);
    o.block_tokens = 8;
    o.cache_ttl_s = 0.3;
    Engine *e;
    MnErr err = {0};
    assert_int_equal(engine_new(m, &o, &e, &err), MN_OK);
    int32_t prompt[64];
    make_prompt(prompt, 37, 512, 21, 1);
    ReqParams p;
    greedy_params(&p, 4);
    ReqResult res;
    int expect[3] = {0, 32, 0};
    for (int round = 0; round < 3; round++) {
        if (round == 2) usleep(1800 * 1000); /* idle past the TTL (checked at least every second) */
        Request *r = request_new(prompt, 37, &p, "", NULL);
        assert_int_equal(engine_submit(e, r, &err), MN_OK);
        free(drain(r, &res));
        assert_int_equal(res.n_cached, expect[round]);
        request_unref(r);
    }
    EngineStats st;
    engine_stats(e, &st);
    assert_true(st.expired_blocks > 0);
    engine_free(e);
    model_free(m);
}

static void test_stop_and_cancel(void **s) {
    Model *m = load("stories260K");
    if (!m) return;
    EngineOptions o;
    engine_options_default(&o);
    Engine *e;
    MnErr err = {0};
    assert_int_equal(engine_new(m, &o, &e, &err), MN_OK);
    int32_t prompt[5] = {1, 403, 407, 261, 378}; /* "Once upon a time" */
    ReqParams p;
    greedy_params(&p, 60);
    p.stop[0] = "Lily";
    p.n_stop = 1;
    Request *r = request_new(prompt, 5, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    ReqResult res;
    char *t = drain(r, &res);
    assert_string_equal(t, ", there was a little girl named ");
    assert_int_equal(res.finish, FINISH_STOP);
    free(t);
    request_unref(r);
    /* cancel a long request */
    greedy_params(&p, 400);
    r = request_new(prompt, 5, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_OK);
    engine_cancel(e, r);
    t = drain(r, &res);
    assert_int_equal(res.finish, FINISH_CANCELLED);
    free(t);
    request_unref(r);
    /* too long for the context */
    greedy_params(&p, 600);
    r = request_new(prompt, 5, &p, "", NULL);
    assert_int_equal(engine_submit(e, r, &err), MN_ERANGE);
    assert_non_null(strstr(err.msg, "context"));
    request_unref(r);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.pool_used, 0);
    engine_free(e);
    model_free(m);
}

static void test_queue_full(void **s) {
    Model *m = load("stories260K");
    if (!m) return;
    EngineOptions o;
    engine_options_default(&o);
    o.max_queue = 2;
    o.parallel = 1;
    Engine *e;
    MnErr err = {0};
    assert_int_equal(engine_new(m, &o, &e, &err), MN_OK);
    int32_t prompt[5] = {1, 403, 407, 261, 378};
    ReqParams p;
    greedy_params(&p, 400);
    Request *rs[8];
    int n_busy = 0;
    for (int i = 0; i < 8; i++) {
        rs[i] = request_new(prompt, 5, &p, "", NULL);
        int rc = engine_submit(e, rs[i], &err);
        if (rc == MN_EBUSY) n_busy++;
        else assert_int_equal(rc, MN_OK);
    }
    assert_true(n_busy >= 4);
    engine_free(e); /* cancels what runs */
    for (int i = 0; i < 8; i++) request_unref(rs[i]);
    model_free(m);
}

/* With one running slot busy, the waiting requests are admitted in the
 * policy's order: FCFS by arrival, FPF most cached prefix first. */
static void check_schedule(SchedPolicy policy, bool cached_first) {
    Model *m = load("stories260K");
    if (!m) return;
    EngineOptions o;
    engine_options_default(&o);
    o.parallel = 1;
    o.block_tokens = 8;
    o.schedule = policy;
    Engine *e;
    MnErr err = {0};
    assert_int_equal(engine_new(m, &o, &e, &err), MN_OK);
    int32_t warm[64], fresh[64];
    make_prompt(warm, 41, 512, 11, 1);
    make_prompt(fresh, 41, 512, 12, 1);
    ReqParams p;
    greedy_params(&p, 4);
    ReqResult res;
    Request *d = request_new(warm, 40, &p, "", NULL); /* puts warm's prefix in the pool */
    assert_int_equal(engine_submit(e, d, &err), MN_OK);
    free(drain(d, &res));
    request_unref(d);
    greedy_params(&p, 300);
    Request *a = request_new(fresh + 1, 20, &p, "", NULL); /* occupies the only slot */
    assert_int_equal(engine_submit(e, a, &err), MN_OK);
    for (;;) { /* wait until it runs */
        char *t;
        size_t len;
        bool done;
        assert_int_equal(request_read(a, &t, &len, &done, &res, 1000), MN_OK);
        mn_free(t);
        if (len > 0 || done) break;
    }
    greedy_params(&p, 20);
    Request *b = request_new(fresh, 41, &p, "", NULL); /* arrives first, nothing cached */
    Request *c = request_new(warm, 41, &p, "", NULL);  /* arrives second, 32 tokens cached */
    assert_int_equal(engine_submit(e, b, &err), MN_OK);
    assert_int_equal(engine_submit(e, c, &err), MN_OK);
    ReqResult rb, rc;
    free(drain(a, &res));
    free(drain(b, &rb));
    free(drain(c, &rc));
    assert_int_equal(rc.n_cached, 40);
    if (cached_first) assert_true(rc.ttft_s < rb.ttft_s);
    else assert_true(rb.ttft_s < rc.ttft_s);
    request_unref(a);
    request_unref(b);
    request_unref(c);
    engine_free(e);
    model_free(m);
}

static void test_schedule_fcfs(void **s) { check_schedule(SCHED_FCFS, false); }
static void test_schedule_fpf(void **s) { check_schedule(SCHED_FPF, true); }
static void test_schedule_relaxed_fpf(void **s) { check_schedule(SCHED_RELAXED_FPF, true); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_schedule_fcfs),
        cmocka_unit_test(test_schedule_fpf),
        cmocka_unit_test(test_schedule_relaxed_fpf),
        cmocka_unit_test(test_stop_and_cancel),
        cmocka_unit_test(test_cache_ttl),
        cmocka_unit_test(test_leading_blocks_recomputed),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_concurrent_cache),
        cmocka_unit_test(test_concurrent_nocache),
        cmocka_unit_test(test_concurrent_tiny_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
