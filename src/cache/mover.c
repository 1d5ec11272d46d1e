/* mover.c — the mover thread (see mover.h).
 *
 * One thread, three FIFO queues under one mutex: loads (reads), prefetch
 * (WINDOW and PROMOTE jobs, and SAVEs into tier 0 alone) and everything
 * else (writes). The thread takes the first non-empty queue in that
 * order, so a restore waiting to be computed never queues behind
 * prefetch or write-behind. The loads queued
 * at that moment (up to MOVER_MAX_BATCH) are read together, one streamed
 * read per tier; so are the promotes at the head of the prefetch queue, as
 * many as the staging pool holds, and then each one is put into tier 0 as
 * its own run. A job runs to completion without the lock; its events go
 * out through the on_event callback as they happen. A job still queued
 * may be withdrawn by its submitter (mover_withdraw); taking it off its
 * queue marks it taken (MoverJob.is_taken, under the lock), after which
 * it runs.
 *
 * The thread asks the scheduler for short time slices (MOVER_SLICE_NS,
 * base/sched.h): a streamed restore wakes it every few hundred
 * microseconds, and with compute on every core each wake-up would
 * otherwise wait for a compute thread's slice to end.
 *
 * A failed tier that is retried (redis) is reset between jobs once its
 * back-off has passed; an idle thread sleeps until the next reset is due.
 *
 * Invariants: only this thread calls into the tiers once mover_new has
 * returned; the stats snapshots are the only state another thread reads,
 * under stats_lock; retry_at[i] > 0 exactly while tier i is retried and
 * failed (from the first time the thread saw it failed).
 */
#include "cache/mover.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "base/sched.h"
#include "cache/store.h"

typedef struct DropCtx {
    struct Mover *m;
    int tier;
} DropCtx;

typedef enum MoverQueue { Q_READS, Q_PREFETCH, Q_WRITES, Q__COUNT } MoverQueue;

struct Mover {
    MoverConfig cfg;
    CacheStore *store;     /* with a disk tier: its directory's database */
    int n_reply_puts;      /* since the last trim */
    Tier *tiers[MOVER_MAX_TIERS];
    DropCtx drop_ctx[MOVER_MAX_TIERS];
    int n_tiers;
    int shared;            /* the redis tier's index, or -1 */
    double retry_at[MOVER_MAX_TIERS]; /* mn_now() of the next reset; 0: none due */
    double backoff[MOVER_MAX_TIERS];  /* the wait before that reset */
    /* queues */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    MoverJob *head[Q__COUNT], *tail[Q__COUNT];
    bool is_stopped;       /* STOP queued: submits refused */
    pthread_t thread;
    bool has_thread;
    MoverJob *stop_job;    /* made up front, so stopping cannot fail */
    /* mover thread scratch: one tier's share of a load */
    Hash128 *sub_hashes;
    int32_t *sub_slots;
    int sub_cap;
    KvPool staging;        /* promotes' reads (when promote_max > 0) */
    int promote_max;       /* blocks the staging pool holds; 0: no promotes */
    MoverIoHist reads[MOVER_MAX_TIERS], writes[MOVER_MAX_TIERS]; /* mover thread */
    double measured_bps[MOVER_MAX_TIERS]; /* measure_tier's figures (mover thread) */
    /* published counters */
    pthread_mutex_t stats_lock;
    MoverTierStats stats[MOVER_MAX_TIERS];
};

const double mover_io_bounds[MOVER_IO_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                  0.01,   0.025,   0.05,   0.1,   0.25,   1};

/* ---- jobs and events -------------------------------------------------------- */

MoverJob *mover_job_new(MoverJobKind kind, int n, int n_layer) {
    MoverJob *j = mn_calloc(1, sizeof *j);
    if (j == NULL) return NULL;
    j->kind = kind;
    j->n = n;
    j->failed_tier = -1;
    j->n_events = kind == MOVER_LOAD ? n_layer + 1 : 1;
    j->events = mn_calloc((size_t)j->n_events, sizeof *j->events);
    bool ok = j->events != NULL;
    if (n > 0) {
        j->hashes = mn_calloc((size_t)n, sizeof *j->hashes);
        j->slots = mn_calloc((size_t)n, sizeof *j->slots);
        j->tier = mn_calloc((size_t)n, 1);
        j->block_hidden = mn_calloc((size_t)n, sizeof *j->block_hidden);
        ok = ok && j->hashes && j->slots && j->tier && j->block_hidden;
    }
    if (!ok) {
        mover_job_free(j);
        return NULL;
    }
    for (int i = 0; i < j->n_events; i++) {
        j->events[i].job = j;
        j->events[i].is_embedded = true;
        j->events[i].kind = i + 1 < j->n_events ? MOVER_EV_LAYER : MOVER_EV_DONE;
        j->events[i].layer = i;
    }
    return j;
}

void mover_job_free(MoverJob *j) {
    if (j == NULL) return;
    mn_free(j->hashes);
    mn_free(j->block_hidden);
    mn_free(j->slots);
    mn_free(j->tier);
    mn_free(j->events);
    mn_free(j->text);
    mn_free(j->ids);
    mn_free(j);
}

void mover_event_free(MoverEvent *ev) {
    if (ev == NULL || ev->is_embedded) return;
    mn_free(ev->hashes);
    mn_free(ev);
}

static void post_layer(Mover *m, MoverJob *j, int layer) {
    j->n_layers_done = layer + 1;
    m->cfg.on_event(m->cfg.event_ctx, &j->events[layer]);
}

static void post_done(Mover *m, MoverJob *j) {
    if (j->waiter != NULL) { /* the submitter waits for it: no event */
        pthread_mutex_lock(&j->waiter->lock);
        j->waiter->is_done = true;
        pthread_cond_signal(&j->waiter->cond);
        pthread_mutex_unlock(&j->waiter->lock);
        return;
    }
    m->cfg.on_event(m->cfg.event_ctx, &j->events[j->n_events - 1]);
}

/* A tier dropped blocks (TierDropFn, inside a tier call on this thread). */
static void on_drop(void *ctx, const Hash128 *hashes, int n, TierDropReason why) {
    DropCtx *dc = ctx;
    MoverEvent *ev = mn_calloc(1, sizeof *ev);
    Hash128 *copy = n > 0 ? mn_malloc((size_t)n * sizeof *copy) : NULL;
    if (ev == NULL || (n > 0 && copy == NULL)) {
        /* the engine keeps believing the tier holds them; a load then
         * fails with MN_ENOTFOUND and the blocks are recomputed */
        LOG_WARN("mover: out of memory reporting %d dropped blocks", n);
        mn_free(ev);
        mn_free(copy);
        return;
    }
    memcpy(copy, hashes, (size_t)n * sizeof *copy);
    *ev = (MoverEvent){.kind = MOVER_EV_DROPPED, .tier = dc->tier, .why = why, .n = n, .hashes = copy};
    dc->m->cfg.on_event(dc->m->cfg.event_ctx, ev);
}

/* ---- running jobs ------------------------------------------------------------- */

static void publish_stats(Mover *m, int i) {
    MoverTierStats st;
    tier_stats(m->tiers[i], &st.tier);
    const MoverTestHooks *hk = m->cfg.hooks;
    if (hk && hk->read_delay_fn) st.tier.read_seconds += hk->read_delay_fn(hk->ctx, i);
    st.reads = m->reads[i];
    st.writes = m->writes[i];
    st.measured_read_bps = m->measured_bps[i];
    pthread_mutex_lock(&m->stats_lock);
    m->stats[i] = st;
    pthread_mutex_unlock(&m->stats_lock);
}

static void observe(MoverIoHist *h, double seconds) {
    int b = 0;
    while (b < MOVER_IO_BUCKETS && seconds > mover_io_bounds[b]) b++;
    h->counts[b]++;
    h->n++;
    h->sum += seconds;
}

/* MoverTestHooks.put_gate, before a run goes into tier i. */
static void put_gate(const Mover *m, int i) {
    const MoverTestHooks *hk = m->cfg.hooks;
    if (hk && hk->put_gate) hk->put_gate(hk->ctx, i);
}

/* Drop again the runs put_parts made of blocks [from, end) of job j in
 * tier t (one a later put evicted already is not found). */
static void drop_parts(Tier *t, const MoverJob *j, int from, int end) {
    int max = tier_max_run_blocks(t);
    for (int a = from; a < end; a += max > 0 ? max : end - from) tier_drop_run(t, &j->hashes[a]);
}

/* Put blocks [from, end) of job j (in pool's slots j->slots, blocks of
 * one sequence from position j->pos, layers `hidden` as hidden states)
 * into tier i as runs of at most the tier's tier_max_run_blocks. All or
 * nothing: when a put fails, the parts put before it are dropped again
 * (reported, as any drop), since the receiver records the job's blocks in
 * the tier only when all of them are there. */
static int put_parts(Mover *m, int i, const MoverJob *j, const KvPool *pool, int from, int end, uint64_t hidden) {
    Tier *t = m->tiers[i];
    int max = tier_max_run_blocks(t), at = from, rc = MN_OK;
    if (max <= 0) max = end - from;
    while (at < end && rc == MN_OK) {
        int k = end - at < max ? end - at : max;
        TierRunInfo info = {.pos = j->pos + at * pool->block_tokens, .ns_id = &j->ns_id, .hidden = hidden};
        rc = tier_put_run(t, j->hashes + at, k, pool, j->slots + at, &info);
        if (rc == MN_OK) at += k;
    }
    /* a later part's room may have come from evicting an earlier one */
    for (int b = from; rc == MN_OK && b < end; b++)
        if (!tier_has(t, &j->hashes[b])) rc = MN_EFULL;
    if (rc != MN_OK) drop_parts(t, j, from, at);
    return rc;
}

/* Copy the run into every tier it names; a tier that refuses it (full,
 * failed) is skipped. rc is the last failure when no tier took it. */
static void run_save(Mover *m, MoverJob *j) {
    j->rc = m->n_tiers > 0 ? MN_EFULL : MN_OK;
    for (int i = 0; i < m->n_tiers; i++) {
        if (j->into_tiers != 0 && !(j->into_tiers >> i & 1)) continue;
        put_gate(m, i);
        double t0 = mn_now();
        int rc = put_parts(m, i, j, m->cfg.pool, 0, j->n, j->hidden);
        if (rc == MN_OK) {
            j->saved_tiers |= 1u << i;
            j->rc = MN_OK;
            observe(&m->writes[i], mn_now() - t0);
        } else if (j->saved_tiers == 0) {
            j->rc = rc;
        }
        /* (a failed tier said so once, when it failed) */
        if (rc != MN_OK && rc != MN_EFULL && rc != MN_EIO)
            LOG_WARN("mover: saving %d blocks to the %s tier failed: %s", j->n, tier_name(m->tiers[i]), mn_strerror(rc));
        publish_stats(m, i);
    }
}

static int sub_reserve(Mover *m, int n) {
    if (n <= m->sub_cap) return MN_OK;
    Hash128 *h = mn_realloc(m->sub_hashes, (size_t)n * sizeof *h);
    if (h == NULL) return MN_ENOMEM;
    m->sub_hashes = h;
    int32_t *s = mn_realloc(m->sub_slots, (size_t)n * sizeof *s);
    if (s == NULL) return MN_ENOMEM;
    m->sub_slots = s;
    m->sub_cap = n;
    return MN_OK;
}

/* Jobs taken from a queue together: loads, or promotes, read in one
 * streamed read per tier, so small restores queued at once move as one
 * larger transfer. */
#define MOVER_MAX_BATCH 8

typedef struct JobBatch {
    Mover *m;
    MoverJob *jobs[MOVER_MAX_BATCH];
    int n_jobs;
    int n_done;  /* jobs[0..n_done) have had their DONE event */
} JobBatch;

static void on_layer(void *ctx, int layer) {
    JobBatch *b = ctx;
    const MoverTestHooks *hk = b->m->cfg.hooks;
    if (hk && hk->layer_gate) hk->layer_gate(hk->ctx, layer);
    for (int i = 0; i < b->n_jobs; i++)
        if (b->jobs[i]->rc == MN_OK) post_layer(b->m, b->jobs[i], layer);
}

/* A job that names a tier the chain lacks (or, promoting, tier 0 itself),
 * or a block its tier no longer holds (dropped since the engine planned
 * it), fails alone, before anything is read: MN_EINVAL / MN_ENOTFOUND. */
static void check_read(Mover *m, MoverJob *j) {
    j->rc = MN_OK;
    j->failed_tier = -1;
    for (int k = 0; k < j->n && j->rc == MN_OK; k++) {
        int t = j->tier[k];
        if (t >= m->n_tiers || (j->kind == MOVER_PROMOTE && t == 0)) j->rc = MN_EINVAL;
        else if (!tier_has(m->tiers[t], &j->hashes[k])) j->rc = MN_ENOTFOUND;
        else j->block_hidden[k] = tier_block_hidden(m->tiers[t], &j->hashes[k]);
        if (j->rc != MN_OK) j->failed_tier = t < m->n_tiers ? t : -1;
    }
}

/* Read the sound jobs' blocks into pool (block k of job j into slot
 * j->slots[k]): each tier's share in chain order, every layer of it. The
 * share of the last (slowest) tier involved is streamed and, with
 * layer_fn, posts a LAYER event of every job as each layer is in place,
 * the faster tiers' shares being in the pool by then. A read that fails
 * fails every job in it. */
static void read_batch(Mover *m, JobBatch *b, KvPool *pool, TierLayerFn layer_fn) {
    int n_total = 0, last = -1, rc = MN_OK, failed_tier = -1;
    for (int i = 0; i < b->n_jobs; i++) {
        MoverJob *j = b->jobs[i];
        check_read(m, j);
        if (j->rc != MN_OK) continue;
        n_total += j->n;
        for (int k = 0; k < j->n; k++)
            if (j->tier[k] > last) last = j->tier[k];
    }
    rc = sub_reserve(m, n_total);
    for (int t = 0; t <= last && rc == MN_OK; t++) {
        int n = 0;
        for (int i = 0; i < b->n_jobs; i++)
            for (int k = 0; b->jobs[i]->rc == MN_OK && k < b->jobs[i]->n; k++)
                if (b->jobs[i]->tier[k] == t) {
                    m->sub_hashes[n] = b->jobs[i]->hashes[k];
                    m->sub_slots[n++] = b->jobs[i]->slots[k];
                }
        if (n == 0) continue;
        double t0 = mn_now();
        rc = tier_read_layers(m->tiers[t], m->sub_hashes, n, pool, m->sub_slots, t == last ? layer_fn : NULL, b);
        if (rc != MN_OK) {
            failed_tier = t;
            LOG_WARN("mover: reading %d blocks from the %s tier failed: %s", n, tier_name(m->tiers[t]),
                     mn_strerror(rc));
        } else {
            observe(&m->reads[t], mn_now() - t0);
        }
        publish_stats(m, t);
    }
    for (int i = 0; i < b->n_jobs; i++)
        if (b->jobs[i]->rc == MN_OK && rc != MN_OK) {
            b->jobs[i]->rc = rc;
            b->jobs[i]->failed_tier = failed_tier;
        }
}

/* The end of the stretch of promote j's blocks from a on whose layers
 * arrived alike (as KV or as hidden states: the blocks may come from runs
 * stored differently). */
static int alike_end(const MoverJob *j, int a) {
    int b = a + 1;
    while (b < j->n && j->block_hidden[b] == j->block_hidden[a]) b++;
    return b;
}

/* Put a promote's blocks, in the staging pool, into tier 0: runs of each
 * stretch (alike_end, put_parts). All or nothing: when a put fails, the runs put
 * before it are dropped again (reported, as any drop), since the engine
 * records none of a failed promote's blocks in tier 0 — kept, they would
 * take its room unused. */
static int put_promote(Mover *m, MoverJob *j) {
    int rc = MN_OK, n_put = 0; /* blocks [0, n_put) are in tier 0 */
    put_gate(m, 0);
    while (n_put < j->n && rc == MN_OK) {
        int end = alike_end(j, n_put);
        rc = put_parts(m, 0, j, &m->staging, n_put, end, j->block_hidden[n_put]);
        if (rc == MN_OK) n_put = end;
    }
    for (int a = 0; rc != MN_OK && a < n_put;) {
        int end = alike_end(j, a);
        drop_parts(m->tiers[0], j, a, end);
        a = end;
    }
    return rc;
}

/* Read the promotes' blocks into the staging pool together, then put
 * each job's blocks into tier 0 (put_promote). Each job is DONE as soon as
 * its put returns: a later job's put may evict its run, and the receiver
 * must hear that the run was held before it hears that it was dropped. */
static void run_promotes(Mover *m, JobBatch *b) {
    int next = 0;
    for (int i = 0; i < b->n_jobs; i++)
        for (int k = 0; k < b->jobs[i]->n; k++) b->jobs[i]->slots[k] = next++;
    read_batch(m, b, &m->staging, NULL);
    for (; b->n_done < b->n_jobs; b->n_done++) {
        MoverJob *j = b->jobs[b->n_done];
        if (j->rc == MN_OK) {
            double t0 = mn_now();
            j->rc = put_promote(m, j);
            if (j->rc == MN_OK) {
                j->saved_tiers = 1u;
                observe(&m->writes[0], mn_now() - t0);
            } else if (j->rc != MN_EFULL) {
                LOG_WARN("mover: promoting %d blocks to the %s tier failed: %s", j->n, tier_name(m->tiers[0]),
                         mn_strerror(j->rc));
            }
            publish_stats(m, 0);
        }
        post_done(m, j);
    }
}

static void run_expire(Mover *m, MoverJob *j) {
    for (int i = 0; i < m->n_tiers; i++) {
        if (tier_expire(m->tiers[i], j->cutoff) > 0) publish_stats(m, i);
    }
    j->rc = m->store ? store_conv_expire(m->store, j->cutoff) : MN_OK;
}

/* The entry goes to the database and to the shared tier. The database
 * keeps the newest max_replies entries: trimmed every so often, not on
 * every put. */
static void run_reply(Mover *m, MoverJob *j) {
    const char *text = j->text ? j->text : "";
    j->rc = MN_OK;
    if (m->shared >= 0) /* (a failure puts the tier in its error state, and it is retried) */
        tier_redis_put_reply(m->tiers[m->shared], &j->ns_id, &j->key, text, j->text_len, j->ids, j->n_ids);
    if (m->store == NULL) return;
    j->rc = store_reply_put(m->store, &j->ns_id, &j->key, text, j->text_len, j->ids, j->n_ids, j->when);
    if (++m->n_reply_puts >= 256 && m->cfg.max_replies > 0) {
        m->n_reply_puts = 0;
        store_reply_trim(m->store, m->cfg.max_replies);
    }
}

/* Other instances' entries for the job's texts, into the reply memory. */
static void run_reply_fetch(Mover *m, MoverJob *j) {
    j->rc = MN_OK;
    if (m->shared < 0 || m->cfg.replies == NULL) return;
    int rc = tier_redis_get_replies(m->tiers[m->shared], &j->ns_id, j->texts, j->lens, j->n, m->cfg.replies);
    if (rc < 0) j->rc = -rc;
    publish_stats(m, m->shared);
}

/* Every tier takes the window; one that cannot (no memory) keeps its
 * previous one, which costs only eviction quality. */
static void run_window(Mover *m, MoverJob *j) {
    j->rc = MN_OK;
    for (int i = 0; i < m->n_tiers; i++) {
        int rc = tier_set_window(m->tiers[i], j->hashes, j->slots, j->n);
        if (rc != MN_OK) j->rc = rc;
    }
}

/* A sequence's turn ended: its conversation's row (when it has a session
 * id and there is a database), and the tier runs holding its blocks are
 * used now. */
static void run_conv(Mover *m, MoverJob *j) {
    for (int i = 0; i < m->n_tiers; i++) tier_touch(m->tiers[i], j->hashes, j->n, j->when);
    j->rc = m->store && j->conv != 0 ? store_conv_put(m->store, j->conv, &j->ns_id, j->when, j->n_tokens) : MN_OK;
}

/* Look the job's blocks up in the shared tier, which adopts the runs
 * others stored; tier[k] then says whether it holds block k (a failed or
 * missing shared tier holds none). */
static void run_probe(Mover *m, MoverJob *j) {
    j->rc = MN_OK;
    if (m->shared < 0) {
        memset(j->tier, 0, (size_t)j->n);
        return;
    }
    Tier *t = m->tiers[m->shared];
    int rc = tier_redis_probe(t, j->hashes, j->tier, j->n, m->cfg.pool->block_tokens, &j->ns_id);
    if (rc < 0) j->rc = -rc;
    for (int k = 0; k < j->n; k++) j->tier[k] = tier_has(t, &j->hashes[k]);
    publish_stats(m, m->shared);
}

/* Tier i's read rate, so that the engine's planner has a figure of this
 * machine before the tier's first restore (MoverConfig.measure_reads): as
 * the mover starts, and when a failed tier comes back. About
 * MOVER_MEASURE_BYTES are written and read back through the tier
 * (tier_measure_read) out of a scratch pool of the engine's geometry,
 * freed afterwards; a run the tier has no room for is halved until one
 * block. A tier that cannot be measured keeps 0 (the engine guesses). */
static void measure_tier(Mover *m, int i) {
    const KvPool *p = m->cfg.pool;
    Tier *t = m->tiers[i];
    int n = (int)(MOVER_MEASURE_BYTES / ((uint64_t)p->n_layer * p->block_bytes)), max = tier_max_run_blocks(t);
    if (max > 0 && max < n) n = max;
    if (n < 1) n = 1;
    KvPool scratch;
    int32_t *slots = mn_malloc((size_t)n * sizeof *slots);
    int rc = slots != NULL ? kvpool_init(&scratch, p->n_layer, p->kv_dim, p->block_tokens, n, p->kv_type) : MN_ENOMEM;
    TierReadRate rate = {0};
    if (rc == MN_OK) {
        uint64_t x = (uint64_t)getpid() << 32 ^ (uint64_t)(mn_wall_now() * 1e6), salt = rng_splitmix64(&x);
        for (int l = 0; l < p->n_layer; l++) { /* bytes that no medium can compress */
            uint64_t *w = (uint64_t *)scratch.arenas[l];
            for (size_t k = 0; k < (size_t)n * p->block_bytes / sizeof *w; k++) w[k] = rng_splitmix64(&x);
        }
        for (int k = 0; k < n; k++) slots[k] = k;
        rc = MN_EFULL;
        for (int k = n; k >= 1 && rc == MN_EFULL; k /= 2) rc = tier_measure_read(t, &scratch, slots, k, salt, &rate);
        kvpool_deinit(&scratch);
    }
    mn_free(slots);
    const MoverTestHooks *hk = m->cfg.hooks;
    if (rc == MN_OK && hk && hk->read_delay_fn) rate.seconds += hk->read_delay_fn(hk->ctx, i);
    double bps = rc == MN_OK && rate.seconds > 0 ? (double)rate.bytes / rate.seconds : 0;
    if (bps > 0)
        LOG_INFO("mover: the %s tier reads at %.0f MB/s (measured)", tier_name(t), bps / 1e6);
    else
        LOG_INFO("mover: the %s tier's read rate could not be measured (%s); the planner guesses until its first "
                 "restore", tier_name(t), mn_strerror(rc));
    m->measured_bps[i] = bps;
}

/* Reset the failed tiers that are retried and whose back-off has passed;
 * a tier seen failed for the first time waits MOVER_RETRY_MIN_S first. */
static void retry_tiers(Mover *m) {
    double now = mn_now();
    for (int i = 0; i < m->n_tiers; i++) {
        Tier *t = m->tiers[i];
        if (!tier_is_retried(t) || !tier_is_failed(t)) {
            m->retry_at[i] = m->backoff[i] = 0;
            continue;
        }
        if (m->retry_at[i] == 0) {
            m->backoff[i] = MOVER_RETRY_MIN_S;
            m->retry_at[i] = now + m->backoff[i];
            LOG_INFO("mover: the %s tier is off; trying it again in %.2f s", tier_name(t), m->backoff[i]);
            continue;
        }
        if (now < m->retry_at[i]) continue;
        if (tier_reset(t) == MN_OK) {
            LOG_INFO("mover: the %s tier is back", tier_name(t));
            m->retry_at[i] = m->backoff[i] = 0;
            if (m->cfg.measure_reads) measure_tier(m, i);
        } else {
            m->backoff[i] = fmin(2 * m->backoff[i], MOVER_RETRY_MAX_S);
            m->retry_at[i] = mn_now() + m->backoff[i];
        }
        publish_stats(m, i);
    }
}

/* The earliest reset due (mn_now() seconds), 0 when none. */
static double next_retry(const Mover *m) {
    double at = 0;
    for (int i = 0; i < m->n_tiers; i++)
        if (m->retry_at[i] > 0 && (at == 0 || m->retry_at[i] < at)) at = m->retry_at[i];
    return at;
}

/* Sleep (lock held) until a job is queued or the next reset is due. */
static void wait_for_work(Mover *m) {
    while (!m->head[Q_READS] && !m->head[Q_PREFETCH] && !m->head[Q_WRITES]) {
        double at = next_retry(m);
        if (at == 0) {
            pthread_cond_wait(&m->cond, &m->lock);
            continue;
        }
        double wait = at - mn_now();
        if (wait <= 0) return;
        double until = mn_wall_now() + wait; /* the condition's clock is CLOCK_REALTIME */
        struct timespec ts = mn_timespec_of(until);
        pthread_cond_timedwait(&m->cond, &m->lock, &ts);
    }
}

/* Which queue a job goes to. */
static MoverQueue queue_of(const MoverJob *j) {
    if (j->kind == MOVER_LOAD || j->kind == MOVER_PROBE || j->kind == MOVER_REPLY_FETCH) return Q_READS;
    if (j->kind == MOVER_PROMOTE || j->kind == MOVER_WINDOW) return Q_PREFETCH;
    /* a SAVE into tier 0 alone copies a restored run up into RAM: prefetch
     * too, and it holds pool slots, so it goes before the promotes planned
     * after it (a request waiting for those slots is not held up by them) */
    if (j->kind == MOVER_SAVE && j->into_tiers == 1u) return Q_PREFETCH;
    return Q_WRITES;
}

/* Take the next job(s) off the first non-empty queue (lock held): every
 * queued load up to a batch; the promotes at the head of their queue, as
 * many as the staging pool holds (the first one always); otherwise one
 * job. */
static void take_batch(Mover *m, JobBatch *b) {
    int q = 0;
    while (m->head[q] == NULL) q++;
    MoverJobKind kind = m->head[q]->kind;
    bool is_batched = kind == MOVER_LOAD || kind == MOVER_PROMOTE;
    int n_blocks = 0;
    for (MoverJob *j; (j = m->head[q]) != NULL && b->n_jobs < MOVER_MAX_BATCH;) {
        if (b->n_jobs > 0 && (!is_batched || j->kind != kind)) break;
        if (b->n_jobs > 0 && kind == MOVER_PROMOTE && n_blocks + j->n > m->promote_max) break;
        n_blocks += j->n;
        b->jobs[b->n_jobs++] = j;
        if ((m->head[q] = j->next) == NULL) m->tail[q] = NULL;
        j->next = NULL;
        j->is_taken = true;
    }
}

static void *mover_main(void *arg) {
    Mover *m = arg;
    if (mn_thread_set_slice(MOVER_SLICE_NS) != MN_OK)
        LOG_INFO("mover: the kernel takes no scheduling hint; restores may wait longer for a core");
    /* the tiers' read rates first: the server answers meanwhile, and the
     * jobs submitted meanwhile wait for them */
    for (int i = 0; m->cfg.measure_reads && i < m->n_tiers; i++) {
        measure_tier(m, i);
        publish_stats(m, i);
    }
    for (;;) {
        retry_tiers(m);
        pthread_mutex_lock(&m->lock);
        wait_for_work(m);
        JobBatch b = {.m = m};
        if (m->head[Q_READS] || m->head[Q_PREFETCH] || m->head[Q_WRITES]) take_batch(m, &b);
        pthread_mutex_unlock(&m->lock);
        if (b.n_jobs == 0) continue; /* a reset is due */
        MoverJob *j = b.jobs[0];
        switch (j->kind) {
        case MOVER_SAVE: run_save(m, j); break;
        case MOVER_LOAD: read_batch(m, &b, m->cfg.pool, on_layer); break;
        case MOVER_PROMOTE: run_promotes(m, &b); break;
        case MOVER_EXPIRE: run_expire(m, j); break;
        case MOVER_REPLY: run_reply(m, j); break;
        case MOVER_CONV: run_conv(m, j); break;
        case MOVER_WINDOW: run_window(m, j); break;
        case MOVER_PROBE: run_probe(m, j); break;
        case MOVER_REPLY_FETCH: run_reply_fetch(m, j); break;
        case MOVER_FLUSH: j->rc = MN_OK; break;
        case MOVER_STOP: mover_job_free(j); return NULL;
        }
        for (int i = b.n_done; i < b.n_jobs; i++) post_done(m, b.jobs[i]);
    }
}

/* ---- API ------------------------------------------------------------------------ */

int mover_submit(Mover *m, MoverJob *j) {
    if (j->kind == MOVER_PROMOTE && (j->n < 1 || j->n > m->promote_max)) return MN_EINVAL;
    pthread_mutex_lock(&m->lock);
    int rc = m->is_stopped ? MN_ECANCELED : MN_OK;
    if (rc == MN_OK) {
        MoverQueue q = queue_of(j);
        j->next = NULL;
        if (m->tail[q]) m->tail[q]->next = j;
        else m->head[q] = j;
        m->tail[q] = j;
        if (j->kind == MOVER_STOP) m->is_stopped = true;
        pthread_cond_signal(&m->cond);
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

bool mover_is_taken(Mover *m, const MoverJob *j) {
    pthread_mutex_lock(&m->lock);
    bool is_taken = j->is_taken;
    pthread_mutex_unlock(&m->lock);
    return is_taken;
}

int mover_withdraw(Mover *m, MoverJob *j) {
    pthread_mutex_lock(&m->lock);
    int rc = MN_EBUSY;
    if (!j->is_taken) { /* still queued: unlink it */
        MoverQueue q = queue_of(j);
        MoverJob *prev = NULL, *x = m->head[q];
        for (; x != NULL && x != j; x = x->next) prev = x;
        rc = x == j ? MN_OK : MN_EINVAL; /* (not submitted: the caller's bug) */
        if (rc == MN_OK) {
            if (prev) prev->next = j->next;
            else m->head[q] = j->next;
            if (m->tail[q] == j) m->tail[q] = prev;
            j->next = NULL;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int mover_promote_max_blocks(const Mover *m) { return m->promote_max; }

static int add_tier(Mover *m, Tier *t) {
    int i = m->n_tiers++;
    m->tiers[i] = t;
    tier_set_policy(t, m->cfg.evict, m->cfg.cost);
    m->drop_ctx[i] = (DropCtx){m, i};
    tier_set_drop_fn(t, on_drop, &m->drop_ctx[i]);
    tier_stats(t, &m->stats[i].tier);
    return MN_OK;
}

/* The directory's database, created with it (private: tier_dir.h); the
 * reply memory is filled from it. */
static int open_store(Mover *m, const MoverConfig *cfg, MnErr *err) {
    const KvPool *p = cfg->pool;
    StoreIdentity id = {cfg->model_fingerprint, cfg->kv_format, p->n_layer, p->block_bytes};
    int rc = store_open(cfg->disk_dir, &id, &m->store, err);
    if (rc != MN_OK) return rc;
    if (cfg->replies && (rc = store_reply_load(m->store, cfg->replies, cfg->max_replies)) != MN_OK)
        LOG_WARN("the reply memory in %s could not be read (%s): starting without it", cfg->disk_dir,
                 mn_strerror(rc));
    return MN_OK;
}

/* The promotes' staging pool: MOVER_PROMOTE_BYTES, or tier 0's budget
 * when smaller (a bigger run cannot go there), in whole blocks; its pages
 * are touched now, so no promote's timed read faults them in. */
static int make_staging(Mover *m, MnErr *err) {
    const KvPool *p = m->cfg.pool;
    TierStats st;
    tier_stats(m->tiers[0], &st);
    uint64_t most = m->cfg.hooks && m->cfg.hooks->promote_bytes ? m->cfg.hooks->promote_bytes : MOVER_PROMOTE_BYTES;
    uint64_t bytes = st.capacity_bytes < most ? st.capacity_bytes : most;
    int n = (int)(bytes / ((uint64_t)p->n_layer * p->block_bytes));
    if (n == 0) return MN_OK; /* not one block fits tier 0: no promotes */
    int rc = kvpool_init(&m->staging, p->n_layer, p->kv_dim, p->block_tokens, n, p->kv_type);
    if (rc == MN_OK && p->hid_arenas != NULL && (rc = kvpool_init_hidden(&m->staging, p->hidden_row_bytes)) != MN_OK)
        kvpool_deinit(&m->staging);
    if (rc != MN_OK) return mn_err_set(err, rc, "cannot allocate the mover's staging pool (%d blocks)", n);
    for (int l = 0; l < p->n_layer; l++) memset(m->staging.arenas[l], 0, (size_t)n * p->block_bytes);
    for (int l = 0; l < m->staging.n_hidden_layers; l++)
        memset(m->staging.hid_arenas[l], 0, (size_t)n * p->hidden_bytes);
    m->promote_max = n;
    return MN_OK;
}

/* The shared tier, last in the chain. */
static int open_redis(Mover *m, const MoverConfig *cfg, MnErr *err) {
    const KvPool *p = cfg->pool;
    TierRedisConfig rc = {.urls = cfg->redis_urls,
                          .n_urls = cfg->n_redis_urls,
                          .is_cluster = cfg->redis_cluster,
                          .n_layer = p->n_layer,
                          .block_bytes = p->block_bytes,
                          .hidden_bytes = p->hidden_bytes,
                          .model_fingerprint = cfg->model_fingerprint,
                          .kv_format = cfg->kv_format,
                          .ttl_s = cfg->redis_ttl_s,
                          .timeout_ms = cfg->redis_timeout_ms,
                          .read_window_bytes = cfg->hooks ? cfg->hooks->redis_window_bytes : 0,
                          .value_bytes = cfg->hooks ? cfg->hooks->redis_value_bytes : 0,
                          .capacity_bytes = cfg->hooks ? cfg->hooks->redis_catalog_bytes : 0};
    Tier *t;
    int code = tier_redis_new(&rc, &t, err); /* its message leaves the credentials out */
    if (code != MN_OK) return code;
    m->shared = m->n_tiers;
    return add_tier(m, t);
}

typedef struct HeldCtx {
    const MoverConfig *cfg;
    int tier;
} HeldCtx;

static void report_held(void *ctx, const Hash128 *hashes, int n) {
    HeldCtx *hc = ctx;
    hc->cfg->on_held(hc->cfg->held_ctx, hc->tier, hashes, n);
}

int mover_new(const MoverConfig *cfg, Mover **out, MnErr *err) {
    *out = NULL;
    if (cfg->pool == NULL || cfg->on_event == NULL) return mn_err_set(err, MN_EINVAL, "mover: no pool or event sink");
    Mover *m = mn_calloc(1, sizeof *m);
    if (m == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    m->cfg = *cfg;
    m->cfg.disk_dir = NULL; /* not kept: only used here */
    m->cfg.redis_urls = NULL;
    m->cfg.n_redis_urls = 0;
    m->shared = -1;
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->cond, NULL);
    pthread_mutex_init(&m->stats_lock, NULL);
    const KvPool *p = cfg->pool;
    int rc = (m->stop_job = mover_job_new(MOVER_STOP, 0, 0)) ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
    if (rc == MN_OK && cfg->ram_bytes > 0) {
        Tier *t;
        if ((rc = tier_ram_new_hidden(p->n_layer, p->block_bytes, p->hidden_bytes, cfg->ram_bytes, &t)) != MN_OK)
            mn_err_set(err, rc, "cannot create the RAM tier (%llu bytes)", (unsigned long long)cfg->ram_bytes);
        else add_tier(m, t);
    }
    if (rc == MN_OK && cfg->disk_dir) rc = open_store(m, cfg, err);
    if (rc == MN_OK && cfg->disk_dir) {
        TierDiskConfig dc = {.dir = cfg->disk_dir,
                             .store = m->store,
                             .capacity_bytes = cfg->disk_bytes,
                             .is_clamped_to_room = true,
                             .n_layer = p->n_layer,
                             .block_bytes = p->block_bytes,
                             .hidden_bytes = p->hidden_bytes,
                             .model_fingerprint = cfg->model_fingerprint,
                             .kv_format = cfg->kv_format,
                             .aio_backend = AIO_BACKEND_AUTO,
                             .is_durable = cfg->is_durable};
        Tier *t;
        MnErr derr = {0};
        if ((rc = tier_disk_new(&dc, &t, &derr)) != MN_OK) {
            mn_err_set(err, rc, "cannot open the disk tier in %s: %s", cfg->disk_dir, derr.msg);
        } else {
            if (cfg->hooks && cfg->hooks->disk_tier) cfg->hooks->disk_tier(cfg->hooks->ctx, t);
            add_tier(m, t);
        }
    }
    if (rc == MN_OK && cfg->n_redis_urls > 0) rc = open_redis(m, cfg, err);
    for (int i = 0; rc == MN_OK && cfg->on_held && i < m->n_tiers; i++) {
        HeldCtx hc = {cfg, i};
        tier_foreach_run(m->tiers[i], report_held, &hc);
    }
    /* promotes go into a RAM tier 0 with a slower tier under it */
    if (rc == MN_OK && m->n_tiers >= 2 && strcmp(tier_name(m->tiers[0]), "ram") == 0) rc = make_staging(m, err);
    m->cfg.cost = NULL; /* copied into the tiers (add_tier): not kept */
    if (rc == MN_OK) {
        if (pthread_create(&m->thread, NULL, mover_main, m) != 0)
            rc = mn_err_set(err, MN_ENOMEM, "cannot start the mover thread");
        else m->has_thread = true;
    }
    if (rc != MN_OK) {
        mover_free(m);
        return rc;
    }
    *out = m;
    return MN_OK;
}

void mover_free(Mover *m) {
    if (m == NULL) return;
    if (m->has_thread) {
        if (mover_submit(m, m->stop_job) == MN_OK) m->stop_job = NULL; /* the thread frees it */
        pthread_join(m->thread, NULL);
    }
    mover_job_free(m->stop_job);
    for (int i = 0; i < m->n_tiers; i++) tier_free(m->tiers[i]);
    store_close(m->store); /* checkpoints the WAL into the database */
    mn_free(m->sub_hashes);
    mn_free(m->sub_slots);
    if (m->promote_max > 0) kvpool_deinit(&m->staging);
    pthread_mutex_destroy(&m->lock);
    pthread_cond_destroy(&m->cond);
    pthread_mutex_destroy(&m->stats_lock);
    mn_free(m);
}

CacheStore *mover_store(Mover *m) { return m->store; }

int mover_n_tiers(const Mover *m) { return m->n_tiers; }
int mover_shared_tier(const Mover *m) { return m->shared; }
const char *mover_tier_name(const Mover *m, int i) { return tier_name(m->tiers[i]); }

void mover_stats(Mover *m, int i, MoverTierStats *out) {
    pthread_mutex_lock(&m->stats_lock);
    *out = m->stats[i];
    pthread_mutex_unlock(&m->stats_lock);
}
