/* profile.c — measuring the recompute cost model (see profile.h).
 *
 * What is timed: a batch of block_tokens tokens of one sequence through
 * fwd_run without logits (what recomputing one block costs), first at
 * positions [0, bt) — T(0), the per-token constant tok_sec = T(0) / bt —
 * then at positions [L, L + bt) for L = 64, 128, ... and the largest L the
 * cap allows. The extra attention per query token for L earlier positions
 * is (T(L) - T(0)) / bt. The KV the block attends to is zeros (the arenas
 * are cleared): attention does the same work whatever the values, and
 * zeros keep the arithmetic free of NaNs and denormals.
 *
 * Noise: each point is the fastest of up to `reps` runs; a point that is
 * slow to run gets fewer. Negative increments are clamped to 0 and the
 * knots are made non-decreasing (a running maximum), because attention
 * over more positions never does less work. Contexts are measured in
 * increasing order while the time budget lasts (at least the first), so a
 * big model gets fewer, shorter points; above the largest one measured the
 * cost model extrapolates along the measured slope.
 *
 * Everything (pool, forward pass, thread pool) is built for the call and
 * freed before it returns; the caller's thread drives it.
 */
#include "engine/profile.h"

#include <math.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/user_cache.h"
#include "engine/forward.h"
#include "engine/seq.h"

/* The profile's pool never takes more than this; the context cap is halved
 * until it fits (extrapolation covers the rest). */
#define PROFILE_MAX_POOL_BYTES (256ull << 20)
#define PROFILE_FIRST_KNOT 64

/* ---- types ---------------------------------------------------------------- */

typedef struct Bench {
    Forward *fwd;
    AttnSeq view;
    int bt;
    int32_t *tokens, *pos, *seqidx; /* (bt) */
} Bench;

/* ---- helpers -------------------------------------------------------------- */

/* Time one block whose first token is at position first. */
static int run_block(Bench *b, int32_t first, double *sec, MnErr *err) {
    for (int i = 0; i < b->bt; i++) b->pos[i] = first + i;
    FwdBatch batch = {.n_tok = b->bt, .tokens = b->tokens, .seq = b->seqidx, .pos = b->pos, .seqs = &b->view,
                      .n_seqs = 1, .logit_idx = NULL, .n_logits = 0};
    const float *logits;
    double t0 = mn_now();
    int rc = fwd_run(b->fwd, &batch, &logits, err);
    *sec = mn_now() - t0;
    return rc;
}

/* Fastest of up to reps runs; stops repeating once the point has used
 * point_sec. */
static int time_point(Bench *b, int32_t first, int reps, double point_sec, double *best, MnErr *err) {
    double spent = 0;
    *best = INFINITY;
    for (int r = 0; r < reps && (r == 0 || spent < point_sec); r++) {
        double t;
        int rc = run_block(b, first, &t, err);
        if (rc) return rc;
        spent += t;
        if (t < *best) *best = t;
    }
    return MN_OK;
}

static int check_options(const Model *m, const ProfileOptions *o, MnErr *err) {
    if (o->n_threads < 1 || o->n_threads > 4096)
        return mn_err_set(err, MN_EINVAL, "profile: thread count %d out of range", o->n_threads);
    if (o->block_tokens < 1 || o->block_tokens > 4096)
        return mn_err_set(err, MN_EINVAL, "profile: block size %d out of range [1, 4096]", o->block_tokens);
    if (o->kv_type != MN_TYPE_F16 && o->kv_type != MN_TYPE_F32)
        return mn_err_set(err, MN_EINVAL, "profile: KV type must be f16 or f32");
    if (o->reps < 1) return mn_err_set(err, MN_EINVAL, "profile: repetitions must be positive");
    if (!(o->budget_sec >= 0) || !isfinite(o->budget_sec))
        return mn_err_set(err, MN_EINVAL, "profile: time budget must be a number >= 0");
    int cap = o->max_ctx < m->cfg.n_ctx ? o->max_ctx : m->cfg.n_ctx;
    if (cap < o->block_tokens)
        return mn_err_set(err, MN_EINVAL, "profile: context cap %d is shorter than one block of %d tokens", cap,
                          o->block_tokens);
    return MN_OK;
}

/* Largest context that the cap, the model and the pool budget allow. */
static int context_cap(const Model *m, const ProfileOptions *o) {
    int cap = o->max_ctx < m->cfg.n_ctx ? o->max_ctx : m->cfg.n_ctx;
    while (cap / 2 >= o->block_tokens + PROFILE_FIRST_KNOT) {
        int nb = (cap + o->block_tokens - 1) / o->block_tokens;
        if (kvpool_bytes_for(m->cfg.n_layer, m->cfg.kv_dim, o->block_tokens, nb, o->kv_type) <= PROFILE_MAX_POOL_BYTES)
            break;
        cap /= 2;
    }
    return cap;
}

/* First positions of the measured blocks: powers of two from 64, and the
 * last block that fits the cap unless a power of two lies close below it.
 * Ascending; returns the count. */
static int knot_positions(int cap, int bt, int32_t *out) {
    int n = 0, top = cap - bt;
    for (int64_t p = PROFILE_FIRST_KNOT; p <= top && n < COST_MAX_KNOTS - 1; p *= 2) out[n++] = (int32_t)p;
    if (top > 0 && (n == 0 || top > out[n - 1] + out[n - 1] / 2)) out[n++] = top;
    return n;
}

/* ---- API ------------------------------------------------------------------ */

void profile_options_default(ProfileOptions *o) {
    memset(o, 0, sizeof *o);
    o->n_threads = 2;
    o->block_tokens = 32;
    o->kv_type = MN_TYPE_F16;
    o->max_ctx = 4096;
    o->budget_sec = 1.0;
    o->reps = 3;
}

int profile_measure(const Model *m, const ProfileOptions *o, CostModel *out, MnErr *err) {
    int rc = check_options(m, o, err);
    if (rc) return rc;
    const int bt = o->block_tokens;
    const int cap = context_cap(m, o);
    int32_t knot_pos[COST_MAX_KNOTS];
    const int n_knots = knot_positions(cap, bt, knot_pos);

    KvPool pool;
    Seq seq = {0};
    Bench b = {0};
    b.bt = bt;
    int n_blocks = (cap + bt - 1) / bt;
    rc = kvpool_init(&pool, m->cfg.n_layer, m->cfg.kv_dim, bt, n_blocks, o->kv_type);
    if (rc) return mn_err_set(err, rc, "profile: cannot allocate a KV pool of %d blocks", n_blocks);
    for (int l = 0; l < pool.n_layer; l++) memset(pool.arenas[l], 0, (size_t)pool.n_blocks * pool.block_bytes);
    rc = seq_reserve(&seq, &pool, cap);
    if (rc) {
        rc = mn_err_set(err, rc, "profile: cannot reserve %d tokens", cap);
        goto done;
    }
    b.view = seq_view(&seq);
    FwdOptions fo = {bt, 1, cap, o->n_threads, 0};
    rc = fwd_new(m, &pool, &fo, &b.fwd, err);
    if (rc) goto done;
    b.tokens = mn_calloc((size_t)bt, sizeof(int32_t));
    b.pos = mn_calloc((size_t)bt, sizeof(int32_t));
    b.seqidx = mn_calloc((size_t)bt, sizeof(int32_t));
    if (!b.tokens || !b.pos || !b.seqidx) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < bt; i++) b.tokens[i] = (int32_t)(((int64_t)i * 7919 + 1) % m->cfg.n_vocab);

    /* Warm-up: pages in the weights and brings the thread pool up. */
    double t_warm;
    if ((rc = run_block(&b, 0, &t_warm, err))) goto done;

    const double t_start = mn_now();
    const double point_sec = o->budget_sec / (2.0 * (n_knots + 1));
    double base;
    if ((rc = time_point(&b, 0, o->reps, point_sec, &base, err))) goto done;
    if (!(base > 0)) base = 1e-9; /* a clock too coarse to see the run */

    /* Ascending contexts while the budget lasts; the next point's time is
     * predicted from the line through (0, base) and the last point, so the
     * profile stops before a point that would overrun. */
    int32_t ctx[COST_MAX_KNOTS];
    double attn[COST_MAX_KNOTS];
    int n = 0;
    double last_t = base;
    for (int k = 0; k < n_knots; k++) {
        double predicted = k == 0 ? base : base + (last_t - base) * ((double)knot_pos[k] / knot_pos[k - 1]);
        if (k > 0 && mn_now() - t_start + predicted > o->budget_sec) break;
        double t;
        if ((rc = time_point(&b, knot_pos[k], o->reps, point_sec, &t, err))) goto done;
        last_t = t;
        double a = (t - base) / bt;
        if (!(a > 0)) a = 0;
        if (n > 0 && a < attn[n - 1]) a = attn[n - 1];
        ctx[n] = knot_pos[k];
        attn[n] = a;
        n++;
    }
    CostKey key;
    cost_key_init(&key, &m->fingerprint, o->n_threads, bt, o->kv_type);
    rc = cost_init(out, &key, base / bt, ctx, attn, n, err);
    if (rc == MN_OK)
        LOG_INFO("cost profile: %d of %d contexts up to %d in %.3f s (warm-up %.3f s); "
                 "block at 0: %.3g s, at %d: %.3g s",
                 n, n_knots, cap, mn_now() - t_start, t_warm, cost_block(out, 0), cap - bt,
                 cost_block(out, cap - bt));
done:
    fwd_free(b.fwd);
    mn_free(b.tokens);
    mn_free(b.pos);
    mn_free(b.seqidx);
    seq_release(&seq, &pool);
    kvpool_deinit(&pool);
    return rc;
}

void profile_file_name(const Model *m, const ProfileOptions *o, char *buf, size_t cap) {
    CostKey key;
    cost_key_init(&key, &m->fingerprint, o->n_threads, o->block_tokens, o->kv_type);
    cost_key_file_name(&key, buf, cap);
}

int profile_default_path(const Model *m, const ProfileOptions *o, char *buf, size_t cap) {
    char name[COST_FILE_NAME_LEN];
    profile_file_name(m, o, name, sizeof name);
    return user_cache_path(name, buf, cap);
}

int profile_load_or_measure(const Model *m, const ProfileOptions *o, const char *path, CostModel *out,
                            bool *was_loaded, MnErr *err) {
    if (was_loaded) *was_loaded = false;
    if (path) {
        CostKey key;
        cost_key_init(&key, &m->fingerprint, o->n_threads, o->block_tokens, o->kv_type);
        MnErr lerr = {0};
        int rc = cost_load(path, &key, out, &lerr);
        if (rc == MN_OK) {
            if (was_loaded) *was_loaded = true;
            return MN_OK;
        }
        LOG_INFO("cost profile not used (%s); measuring", lerr.msg);
    }
    int rc = profile_measure(m, o, out, err);
    if (rc == MN_OK && path) {
        MnErr serr = {0};
        if (cost_save(out, path, &serr) != MN_OK) LOG_WARN("cost profile not saved: %s", serr.msg);
    }
    return rc;
}
