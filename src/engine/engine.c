/* engine.c — the serving engine (see engine.h).
 *
 * Threads and ownership:
 *   - the engine thread owns the pool, the index, the Forward, and every
 *     Active (a request being served: its block table, sampler, token list);
 *   - other threads own their Request references; a Request's output channel
 *     (text, done, result) is guarded by the Request's own mutex;
 *   - the inbox (submit/cancel/stop messages) is guarded by the engine's
 *     inbox mutex; engine statistics by the stats mutex.
 *
 * Life of a request:
 *
 *   engine_submit --> inbox --> WAITING --admit--> RUNNING --finish--> done
 *                                 ^                  |
 *                                 +----suspend-------+  (pool full while decoding)
 *
 * Admission looks up the longest cached prefix (full blocks, by chain hash),
 * takes references on those blocks and allocates blocks for the rest of the
 * prompt. Each step: decode tokens of running sequences first, then prefill
 * chunks, under batch_tokens; then admission of waiting requests by the
 * scheduling policy, as long as the pool keeps its reserve. After the forward
 * pass, each sequence whose last pending token was in the batch samples its
 * next token; newly completed full blocks are registered in the index.
 */
#include "engine/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/index.h"
#include "cache/kv_pool.h"
#include "engine/forward.h"
#include "engine/seq.h"

/* ---- requests and their output channel ---------------------------------------- */

struct Request {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs;
    /* input, immutable after request_new */
    int32_t *prompt;
    size_t n_prompt;
    ReqParams params;
    char *stops[ENGINE_MAX_STOP];
    char *ns;
    char *session;
    double t_created; /* request_new: TTFT counts from here, queueing included */
    /* output, guarded by lock */
    char *out;
    size_t out_len, out_cap;
    bool is_done;
    ReqResult result;
};

Request *request_new(const int32_t *prompt, size_t n, const ReqParams *p, const char *ns, const char *session) {
    if (n == 0 || p->max_tokens <= 0 || p->n_stop < 0 || p->n_stop > ENGINE_MAX_STOP) return NULL;
    Request *r = mn_calloc(1, sizeof *r);
    if (r == NULL) return NULL;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond, NULL);
    r->refs = 1;
    r->t_created = mn_now();
    r->params = *p;
    r->n_prompt = n;
    r->prompt = mn_malloc(n * sizeof *prompt);
    r->ns = mn_strdup(ns ? ns : "");
    r->session = session ? mn_strdup(session) : NULL;
    bool ok = r->prompt && r->ns && (!session || r->session);
    for (int i = 0; ok && i < p->n_stop; i++) {
        r->stops[i] = mn_strdup(p->stop[i]);
        r->params.stop[i] = r->stops[i];
        ok = r->stops[i] != NULL && r->stops[i][0] != '\0';
    }
    if (!ok) {
        request_unref(r);
        return NULL;
    }
    memcpy(r->prompt, prompt, n * sizeof *prompt);
    return r;
}

static void request_ref(Request *r) {
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
}

void request_unref(Request *r) {
    if (r == NULL) return;
    pthread_mutex_lock(&r->lock);
    int left = --r->refs;
    pthread_mutex_unlock(&r->lock);
    if (left > 0) return;
    for (int i = 0; i < ENGINE_MAX_STOP; i++) mn_free(r->stops[i]);
    mn_free(r->prompt);
    mn_free(r->ns);
    mn_free(r->session);
    mn_free(r->out);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    mn_free(r);
}

/* Engine side: append text to the channel. On allocation failure the text
 * is dropped and the request will finish with an error. */
static int request_emit(Request *r, const char *text, size_t len) {
    if (len == 0) return MN_OK;
    int rc = MN_OK;
    pthread_mutex_lock(&r->lock);
    if (r->out_len + len + 1 > r->out_cap) {
        size_t cap = r->out_cap ? r->out_cap : 256;
        while (cap < r->out_len + len + 1) cap *= 2;
        char *b = mn_realloc(r->out, cap);
        if (b == NULL) rc = MN_ENOMEM;
        else {
            r->out = b;
            r->out_cap = cap;
        }
    }
    if (rc == MN_OK) {
        memcpy(r->out + r->out_len, text, len);
        r->out_len += len;
        pthread_cond_broadcast(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

static void request_finish(Request *r, const ReqResult *res) {
    pthread_mutex_lock(&r->lock);
    r->result = *res;
    r->is_done = true;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

int request_read(Request *r, char **text, size_t *len, bool *done, ReqResult *res, int timeout_ms) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->lock);
    while (r->out_len == 0 && !r->is_done)
        if (pthread_cond_timedwait(&r->cond, &r->lock, &deadline) != 0) break;
    *text = mn_strndup(r->out ? r->out : "", r->out_len);
    int rc = *text ? MN_OK : MN_ENOMEM;
    if (rc == MN_OK) {
        *len = r->out_len;
        r->out_len = 0;
    }
    *done = r->is_done && r->out_len == 0;
    if (*done && res) *res = r->result;
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* ---- engine state ------------------------------------------------------------ */

typedef enum MsgKind { MSG_SUBMIT, MSG_CANCEL } MsgKind;

typedef struct Msg {
    MsgKind kind;
    Request *req; /* one reference travels with the message */
    struct Msg *next;
} Msg;

/* A request being served: owned by the engine thread. */
typedef struct Active {
    Request *req;
    uint64_t arrival;        /* order of arrival */
    double t_submit, t_first;
    Hash128 ns_id;
    uint64_t conv;           /* conversation for the eviction policy: session id hash, or 0 */
    Seq seq;
    Sampler *smp;
    TokStream ts;
    int32_t *tokens;         /* prompt, then generated */
    int n_tokens, cap_tokens;
    int n_done;              /* tail: tokens [0, n_done) have KV, except the
                                leading range below while it is recomputed */
    int lead_end;            /* leading range [0, lead_end) being recomputed
                                (its blocks were evicted, later ones were not) */
    int lead_done;           /* [0, lead_done) of the leading range has KV */
    int n_prompt;
    int n_generated;
    int n_cached;            /* prompt tokens found cached at first admission */
    bool is_admitted_once;
    Hash128 *hashes;         /* chain hashes of full blocks, (cap_tokens / bt) */
    int n_hashed;            /* full blocks whose hash is computed */
    int n_registered;        /* full blocks offered to the index */
    char *pending;           /* generated text not yet emitted (stop-string hold-back) */
    size_t n_pending, cap_pending;
    char *reply;             /* all emitted text (for the reply memory) */
    size_t n_reply, cap_reply;
    bool is_stop_cut;        /* a stop string cut the text */
    bool is_completed;       /* the request has its answer; the Active only
                                finishes computing KV for the next turn */
    bool is_restore_failed;  /* a block it holds failed to restore: requeue it */
    bool is_held_back;       /* restoring, and not expected in time for this step */
    bool is_in_batch;        /* has tokens in this step's batch */
    int n_cached_by[SRC_COUNT]; /* n_cached split by source */
    struct Active *next;     /* in the waiting list */
} Active;

/* A restore in flight: one LOAD job of the mover, writing fresh pool slots
 * (each indexed under its block's hash, so other requests share it). The
 * load holds one reference on each slot until its DONE event. */
typedef struct Load {
    MoverJob *job;           /* the mover's until DONE: only its immutable
                                request fields (n, hashes, slots, tier) are read */
    int layers_done;         /* from LAYER events */
    struct Load *next;       /* in submission order */
} Load;

struct Engine {
    const Model *m;
    EngineOptions opt;
    KvPool pool;
    BlockIndex *index;       /* NULL with the prefix cache off */
    Forward *fwd;
    ReplyMemory *replies;
    uint32_t kv_format;
    int reserve_blocks;
    /* eviction policy state, per pool slot (engine thread) */
    int32_t *slot_pos;       /* position of the block's first token in its sequence */
    uint64_t *slot_conv;     /* its conversation (0: none) */
    int32_t *slot_window;    /* index of its request in the look-ahead window, -1 */
    bool has_window_marks;   /* some slot_window entry may be set */
    EvictCand *cands;        /* (n_blocks) scratch for choose_victim */
    CostModel cost;          /* valid when has_cost */
    bool has_cost;
    EvictKey *keys;          /* (n_blocks) */
    uint64_t n_arrivals;
    /* the tiers below the pool (engine thread; NULL mover: none) */
    Mover *mover;
    int n_tiers;
    CacheSource tier_src[MOVER_MAX_TIERS]; /* the usage bucket of each tier */
    Load **slot_load;        /* (n_blocks) the restore writing the slot, or NULL */
    uint8_t *slot_saving;    /* (n_blocks) a SAVE job holds the slot */
    Load *loads, *loads_tail;/* restores in flight, in submission order */
    int n_load_blocks;       /* blocks being restored */
    int n_save_blocks;       /* blocks being saved */
    int watermark_blocks;    /* write-behind below this many free blocks */
    double step_s;           /* recent seconds per forward pass */
    uint64_t restore_failures;
    double t_tier_expire;    /* when the tiers were last asked to expire */
    uint64_t n_writebehind;  /* blocks copied down by the watermark */
    double save_backoff_s;   /* after saves no tier took: wait this long ... */
    double t_save_retry;     /* ... until then (mn_now) before saving again */
    /* engine thread only */
    Active **running;        /* (parallel) */
    int n_running;
    Active *waiting;         /* list in arrival order */
    int n_waiting;
    int32_t *b_tok, *b_seq, *b_pos, *b_logit; /* (batch_tokens) */
    Active **b_owner;        /* (parallel) owner of logit row i */
    AttnSeq *b_seqs;         /* (parallel) */
    char *piece;             /* (piece_cap) */
    size_t piece_cap;
    /* inbox */
    pthread_t thread;
    bool has_thread;
    pthread_mutex_t inbox_lock;
    pthread_cond_t inbox_cond;
    Msg *inbox_head, *inbox_tail;
    MoverEvent *ev_head, *ev_tail; /* events from the mover */
    int n_inbox_submits;     /* submit messages in the inbox */
    int n_waiting_pub;       /* n_waiting as last published by the engine thread */
    bool is_stopping;
    bool is_draining;        /* no new requests; the running ones finish */
    /* statistics */
    pthread_mutex_t stats_lock;
    EngineStats stats;
};

void engine_options_default(EngineOptions *o) {
    memset(o, 0, sizeof *o);
    o->n_threads = 2;
    o->block_tokens = 32;
    o->batch_tokens = 512;
    o->parallel = 4;
    o->max_queue = 64;
    o->decode_reserve = 0.1f;
    o->kv_type = MN_TYPE_F16;
    o->prefix_cache = true;
    o->schedule = SCHED_FCFS;
    o->evict = EVICT_DEFAULT;
    o->swap_watermark = 0.25f;
}

const char *engine_source_name(CacheSource s) {
    static const char *const names[SRC_COUNT] = {"pool", "ram", "disk"};
    return s >= 0 && s < SRC_COUNT ? names[s] : "?";
}

Hash128 engine_namespace_id(const char *ns) { return index_namespace_id(ns); }
ReplyMemory *engine_reply_memory(Engine *e) { return e->replies; }
const Model *engine_model(const Engine *e) { return e->m; }

/* Bytes of RAM available, from /proc/meminfo (0 when unknown). */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f == NULL) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* ---- the tiers below the pool: saves, restores, mover events -------------------
 *
 * The engine thread decides what moves; the mover thread (cache/mover.h)
 * moves it. A SAVE copies cached pool blocks down the chain: the blocks a
 * finished request leaves behind (so a turn's KV is in a lower tier soon
 * after it ends), and the coldest unsaved cached blocks whenever free pool
 * blocks fall under the watermark. The save holds a reference on its slots
 * until it is done; afterwards the slots stay cached and are reclaimed
 * lazily, when the pool needs them, while their index records keep naming
 * the tiers. A restore (Load) brings blocks that only a tier holds back
 * into fresh pool slots, layer by layer; the forward pass waits per layer
 * (wait_layer). A failed restore (checksum, I/O, a block the tier no longer
 * has) unindexes its slots, and every sequence holding one goes back to
 * the queue to be planned again: what was lost is recomputed, never used. */

#define SAVE_MAX_RUN 32        /* blocks per SAVE job */
#define ENGINE_MAX_REPLIES 4096 /* reply memory entries, in RAM and in the database */

static void on_mover_event(void *ctx, MoverEvent *ev) {
    Engine *e = ctx;
    pthread_mutex_lock(&e->inbox_lock);
    ev->next = NULL;
    if (e->ev_tail) e->ev_tail->next = ev;
    else e->ev_head = ev;
    e->ev_tail = ev;
    pthread_cond_signal(&e->inbox_cond);
    pthread_mutex_unlock(&e->inbox_lock);
}

/* Copy cached blocks (hashes[i] in slots[i], indexed, in no tier) down the
 * chain. Blocks that cannot be saved now simply stay unsaved. */
static void save_blocks(Engine *e, const Hash128 *hashes, const int32_t *slots, int n) {
    if (n == 0) return;
    MoverJob *j = mover_job_new(MOVER_SAVE, n, 0);
    if (j == NULL) return;
    memcpy(j->hashes, hashes, (size_t)n * sizeof *hashes);
    memcpy(j->slots, slots, (size_t)n * sizeof *slots);
    for (int i = 0; i < n; i++) {
        kvpool_retain(&e->pool, slots[i]);
        e->slot_saving[slots[i]] = 1;
    }
    if (mover_submit(e->mover, j) != MN_OK) {
        for (int i = 0; i < n; i++) {
            e->slot_saving[slots[i]] = 0;
            kvpool_release(&e->pool, slots[i]);
        }
        mover_job_free(j);
        return;
    }
    e->n_save_blocks += n;
}

/* Whether block h, in slot, is this slot's indexed copy that no tier holds
 * and nothing moves now. */
static bool is_unsaved(const Engine *e, const Hash128 *h, int32_t slot) {
    return index_lookup(e->index, h) == slot && index_tiers(e->index, h) == 0 && !e->slot_saving[slot] &&
           e->slot_load[slot] == NULL;
}

/* Save a's indexed full blocks that no tier holds yet, in runs. */
static void save_active_blocks(Engine *e, Active *a) {
    if (e->mover == NULL || mn_now() < e->t_save_retry) return;
    Hash128 hs[SAVE_MAX_RUN];
    int32_t ss[SAVE_MAX_RUN];
    int n = 0, n_full = a->n_hashed < a->seq.n_blocks ? a->n_hashed : a->seq.n_blocks;
    for (int i = 0; i < n_full; i++) {
        int32_t slot = a->seq.blocks[i];
        if (!is_unsaved(e, &a->hashes[i], slot)) continue;
        hs[n] = a->hashes[i];
        ss[n++] = slot;
        if (n == SAVE_MAX_RUN) {
            save_blocks(e, hs, ss, n);
            n = 0;
        }
    }
    save_blocks(e, hs, ss, n);
}

static EvictCand slot_cand(const Engine *e, int32_t s) {
    return (EvictCand){(uint64_t)s, e->slot_conv[s], e->slot_pos[s], e->slot_window[s], e->pool.cached_at[s],
                       e->pool.cached_at[s]};
}

/* Write-behind (the swap watermark): while free pool blocks plus cached
 * ones a tier already holds (reclaimable without I/O) are under the
 * watermark, copy the coldest unsaved cached blocks — in eviction-policy
 * order — down the chain, one run in flight at a time, while compute goes
 * on. Their slots stay cached until the pool needs them. */
static void save_cold_blocks(Engine *e) {
    if (e->mover == NULL || e->n_save_blocks > 0 || mn_now() < e->t_save_retry) return;
    int n_free = kvpool_n_free(&e->pool);
    if (n_free >= e->watermark_blocks) return;
    int n_clean = 0, n = 0;
    for (int32_t s = e->pool.lru_head; s >= 0; s = e->pool.lru_next[s]) {
        const Hash128 *h = index_slot_hash(e->index, s);
        if (h == NULL) continue;
        if (index_tiers(e->index, h) != 0) n_clean++;
        else if (is_unsaved(e, h, s)) e->cands[n++] = slot_cand(e, s);
    }
    int want = policy_writebehind_want(n_free, n_clean, e->pool.n_blocks, e->opt.swap_watermark);
    if (want == 0 || n == 0) return;
    PolicyCtx pc = {e->opt.evict, e->has_cost ? &e->cost : NULL, mn_now()};
    policy_keys(&pc, e->cands, n, e->keys);
    int32_t idx[SAVE_MAX_RUN];
    int k = policy_select(e->keys, n, want < SAVE_MAX_RUN ? want : SAVE_MAX_RUN, idx);
    Hash128 hs[SAVE_MAX_RUN];
    int32_t ss[SAVE_MAX_RUN];
    for (int i = 0; i < k; i++) {
        ss[i] = (int32_t)e->cands[idx[i]].id;
        hs[i] = *index_slot_hash(e->index, ss[i]);
    }
    save_blocks(e, hs, ss, k);
    e->n_writebehind += (uint64_t)k;
}

static void save_done(Engine *e, MoverJob *j) {
    /* no tier took the run (full, failing): back off write-behind, doubling
     * up to a minute, so a full disk is not retried in a loop */
    if (j->rc != MN_OK) {
        e->save_backoff_s = e->save_backoff_s > 0 ? fmin(2 * e->save_backoff_s, 60) : 1;
        e->t_save_retry = mn_now() + e->save_backoff_s;
    } else {
        e->save_backoff_s = 0;
    }
    for (int i = 0; i < j->n; i++) {
        if (j->rc == MN_OK && index_set_tiers(e->index, &j->hashes[i], j->saved_tiers, 0) != MN_OK)
            LOG_WARN("out of memory recording a saved block");
        e->slot_saving[j->slots[i]] = 0;
        kvpool_release(&e->pool, j->slots[i]);
    }
    e->n_save_blocks -= j->n;
}

/* The fastest tier holding h (tiers are in chain order), or -1. */
static int best_tier(const Engine *e, const Hash128 *h) {
    uint32_t t = index_tiers(e->index, h);
    for (int i = 0; i < e->n_tiers; i++)
        if (t & (1u << i)) return i;
    return -1;
}

/* Start restoring blocks hs[0..n), each held by a tier and in no pool
 * slot: a fresh slot for each, indexed at once so other requests share the
 * restore, and one LOAD job. The load holds a reference on each slot
 * until it is done. MN_EFULL (nothing started) when the pool has too few
 * slots; with free_only, only FREE slots are taken (no eviction). */
static int start_load(Engine *e, const Hash128 *hs, int n, bool free_only) {
    if (n == 0) return MN_OK;
    if ((free_only ? kvpool_n_free(&e->pool) : kvpool_n_available(&e->pool)) < n) return MN_EFULL;
    Load *ld = mn_calloc(1, sizeof *ld);
    MoverJob *j = mover_job_new(MOVER_LOAD, n, e->pool.n_layer);
    if (ld == NULL || j == NULL) {
        mn_free(ld);
        mover_job_free(j);
        return MN_ENOMEM;
    }
    int k = 0, rc = MN_OK;
    for (; k < n && rc == MN_OK; k++) {
        int tier = best_tier(e, &hs[k]);
        if (tier < 0 || index_lookup(e->index, &hs[k]) >= 0) rc = MN_EINVAL; /* the caller checked */
        else if ((rc = kvpool_alloc(&e->pool, &j->slots[k])) == MN_OK) {
            j->hashes[k] = hs[k];
            j->tier[k] = (uint8_t)tier;
            if (index_insert(e->index, &hs[k], j->slots[k]) != 1) {
                kvpool_release(&e->pool, j->slots[k]);
                rc = MN_ENOMEM;
            }
        }
    }
    if (rc == MN_OK) {
        j->owner = ld;
        ld->job = j;
        rc = mover_submit(e->mover, j);
    }
    if (rc != MN_OK) { /* undo: k-1 slots were taken and indexed */
        for (int i = 0; i < k - 1; i++) {
            index_remove_slot(e->index, j->slots[i]);
            kvpool_release(&e->pool, j->slots[i]);
        }
        mn_free(ld);
        mover_job_free(j);
        return rc;
    }
    for (int i = 0; i < n; i++) e->slot_load[j->slots[i]] = ld;
    if (e->loads_tail) e->loads_tail->next = ld;
    else e->loads = ld;
    e->loads_tail = ld;
    e->n_load_blocks += n;
    return MN_OK;
}

/* Every running sequence holding slot must be planned again. */
static void mark_holders_failed(Engine *e, int32_t slot) {
    for (int i = 0; i < e->n_running; i++) {
        Active *a = e->running[i];
        for (int b = 0; b < a->seq.n_blocks; b++)
            if (a->seq.blocks[b] == slot) a->is_restore_failed = true;
    }
}

static void load_done(Engine *e, Load *ld, MoverJob *j) {
    bool is_failed = j->rc != MN_OK;
    for (int k = 0; k < j->n; k++) {
        int32_t slot = j->slots[k];
        e->slot_load[slot] = NULL;
        if (is_failed) {
            mark_holders_failed(e, slot);
            index_remove_slot(e->index, slot);
            /* a block the failing tier could not give is not in it any more
             * (a checksum failure also reports the drop) */
            if (j->tier[k] == j->failed_tier) index_set_tiers(e->index, &j->hashes[k], 0, 1u << j->tier[k]);
        }
        kvpool_release(&e->pool, slot);
    }
    if (is_failed) e->restore_failures++;
    Load **pp = &e->loads;
    while (*pp != ld) pp = &(*pp)->next;
    *pp = ld->next;
    if (e->loads_tail == ld) {
        e->loads_tail = NULL;
        for (Load *l = e->loads; l; l = l->next) e->loads_tail = l;
    }
    e->n_load_blocks -= j->n;
    mn_free(ld);
}

static void handle_event(Engine *e, MoverEvent *ev) {
    MoverJob *j = ev->job;
    switch (ev->kind) {
    case MOVER_EV_LAYER: ((Load *)j->owner)->layers_done = ev->layer + 1; break;
    case MOVER_EV_DROPPED:
        for (int i = 0; i < ev->n; i++) index_set_tiers(e->index, &ev->hashes[i], 0, 1u << ev->tier);
        mover_event_free(ev);
        break;
    case MOVER_EV_DONE:
        if (j->kind == MOVER_SAVE) save_done(e, j);
        else if (j->kind == MOVER_LOAD) load_done(e, j->owner, j);
        mover_job_free(j);
        break;
    }
}

/* Handle the mover's events; with block, wait for at least one first. */
static void take_events(Engine *e, bool block) {
    pthread_mutex_lock(&e->inbox_lock);
    while (block && e->ev_head == NULL) pthread_cond_wait(&e->inbox_cond, &e->inbox_lock);
    MoverEvent *ev = e->ev_head;
    e->ev_head = e->ev_tail = NULL;
    pthread_mutex_unlock(&e->inbox_lock);
    while (ev) {
        MoverEvent *next = ev->next;
        handle_event(e, ev);
        ev = next;
    }
}

/* Whether a block of a's table is still being restored up to layer. */
static bool is_waiting_for(const Engine *e, const Active *a, int layer) {
    for (int b = 0; b < a->seq.n_blocks; b++) {
        const Load *ld = e->slot_load[a->seq.blocks[b]];
        if (ld && ld->layers_done <= layer) return true;
    }
    return false;
}

/* FwdBatch.wait_layer: before layer's attention, wait until the blocks of
 * every sequence in the batch have that layer in place (or failed). */
static void wait_layer(void *ctx, int layer) {
    Engine *e = ctx;
    for (;;) {
        bool is_waiting = false;
        for (int i = 0; i < e->n_running && !is_waiting; i++)
            if (e->running[i]->is_in_batch) is_waiting = is_waiting_for(e, e->running[i], layer);
        if (!is_waiting) return;
        take_events(e, true);
    }
}

/* Read bandwidth of tier i so far, with a guess before any read. */
static double tier_read_bw(Engine *e, int i) {
    MoverTierStats ms;
    mover_stats(e->mover, i, &ms);
    const TierStats *st = &ms.tier;
    if (st->read_seconds > 0.01 && st->bytes_read > 0) return (double)st->bytes_read / st->read_seconds;
    return e->tier_src[i] == SRC_RAM ? 4e9 : 1e9;
}

/* Seconds until a's restores are expected to be done: the loads ahead of
 * them in the mover's queue count too (it serves them in order). */
static double restore_eta(Engine *e, const Active *a) {
    double eta = 0, last = 0;
    for (const Load *ld = e->loads; ld; ld = ld->next) {
        double bytes = (double)(e->pool.n_layer - ld->layers_done) * (double)ld->job->n * (double)e->pool.block_bytes;
        eta += bytes / tier_read_bw(e, ld->job->tier[0]);
        for (int b = 0; b < a->seq.n_blocks; b++)
            if (e->slot_load[a->seq.blocks[b]] == ld) last = eta;
    }
    return last;
}

/* Which running sequences sit out this step: those still restoring whose
 * loads are not expected to finish within the step's compute, unless no
 * other sequence has work (then waiting per layer costs no one). */
static void hold_back_restoring(Engine *e) {
    bool any_ready = false;
    for (int i = 0; i < e->n_running; i++) {
        Active *a = e->running[i];
        a->is_held_back = e->n_load_blocks > 0 && is_waiting_for(e, a, e->pool.n_layer - 1) &&
                          restore_eta(e, a) > e->step_s;
        if (!a->is_held_back) any_ready = true;
    }
    if (!any_ready)
        for (int i = 0; i < e->n_running; i++) e->running[i]->is_held_back = false;
}

/* The reply memory entry of a's finished reply, into the database (with a
 * disk tier), so a restarted server still recognises its replies. */
static void persist_reply(Engine *e, const Hash128 *key, const Active *a) {
    if (e->mover == NULL) return;
    MoverJob *j = mover_job_new(MOVER_REPLY, 0, 0);
    size_t n_ids = (size_t)(a->n_tokens - a->n_prompt);
    if (j == NULL) return;
    j->key = *key;
    j->text = mn_strndup(a->reply ? a->reply : "", a->n_reply);
    j->text_len = a->n_reply;
    j->ids = mn_malloc((n_ids ? n_ids : 1) * sizeof *j->ids);
    j->n_ids = n_ids;
    j->when = mn_wall_now();
    if (j->text && j->ids) memcpy(j->ids, a->tokens + a->n_prompt, n_ids * sizeof *j->ids);
    if (!j->text || !j->ids || mover_submit(e->mover, j) != MN_OK) mover_job_free(j);
}

/* A conversation's row (session id, namespace, last activity, tokens). */
static void persist_conversation(Engine *e, const Active *a) {
    if (e->mover == NULL || a->conv == 0) return;
    MoverJob *j = mover_job_new(MOVER_CONV, 0, 0);
    if (j == NULL) return;
    j->conv = a->conv;
    j->ns_id = a->ns_id;
    j->n_tokens = a->n_tokens;
    j->when = mn_wall_now();
    if (mover_submit(e->mover, j) != MN_OK) mover_job_free(j);
}

/* ---- actives ------------------------------------------------------------------ */

static void active_free(Engine *e, Active *a) {
    if (a == NULL) return;
    save_active_blocks(e, a);
    seq_release(&a->seq, &e->pool);
    sampler_free(a->smp);
    mn_free(a->tokens);
    mn_free(a->hashes);
    mn_free(a->pending);
    mn_free(a->reply);
    request_unref(a->req);
    mn_free(a);
}

static Active *active_new(Engine *e, Request *r) {
    Active *a = mn_calloc(1, sizeof *a);
    if (a == NULL) return NULL;
    a->req = r;
    a->arrival = e->n_arrivals++;
    a->t_submit = r->t_created;
    a->ns_id = index_namespace_id(r->ns);
    if (r->session) {
        Hash128 h = hash128(r->session, strlen(r->session));
        memcpy(&a->conv, h.b, sizeof a->conv);
    }
    a->n_prompt = (int)r->n_prompt;
    a->cap_tokens = (int)r->n_prompt + r->params.max_tokens + 1;
    a->tokens = mn_malloc((size_t)a->cap_tokens * sizeof *a->tokens);
    a->hashes = mn_calloc((size_t)a->cap_tokens / (size_t)e->opt.block_tokens + 1, sizeof *a->hashes);
    int rc = a->tokens && a->hashes ? sampler_new(&r->params.sp, e->m->cfg.n_vocab, &a->smp) : MN_ENOMEM;
    if (rc != MN_OK) {
        a->req = NULL; /* the caller keeps its reference */
        active_free(e, a);
        return NULL;
    }
    memcpy(a->tokens, r->prompt, r->n_prompt * sizeof *a->tokens);
    a->n_tokens = a->n_prompt;
    for (int i = 0; i < a->n_prompt; i++) sampler_accept(a->smp, a->tokens[i]);
    tok_stream_init(&a->ts, e->m->tok, false);
    a->ts.at_start = false; /* the reply continues the prompt */
    return a;
}

static int buf_append(char **buf, size_t *n, size_t *cap, const char *s, size_t len) {
    if (*n + len + 1 > *cap) {
        size_t c = *cap ? *cap : 128;
        while (c < *n + len + 1) c *= 2;
        char *b = mn_realloc(*buf, c);
        if (b == NULL) return MN_ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *n, s, len);
    *n += len;
    (*buf)[*n] = '\0';
    return MN_OK;
}

/* Compute chain hashes of full blocks of tokens[0..n) not hashed yet. */
static void active_hash_blocks(Engine *e, Active *a, int n) {
    const int bt = e->opt.block_tokens;
    while ((a->n_hashed + 1) * bt <= n) {
        int b = a->n_hashed;
        a->hashes[b] = index_block_hash(b ? &a->hashes[b - 1] : NULL, a->tokens + (size_t)b * bt, bt,
                                        &e->m->fingerprint, e->kv_format, &a->ns_id);
        a->n_hashed++;
    }
}

/* The run of prompt blocks [*first, *end) found cached — in the pool, or
 * in a tier below it to be restored: it starts at
 * the first cached block, so leading blocks that were evicted (the pool
 * evicts a finished sequence's leading blocks first) are recomputed while
 * the cached ones after them are used (Pensieve's leading-end eviction).
 * At most the blocks that leave one token to compute (its logits are
 * needed). Returns the number of cached blocks, *end - *first. */
static int cached_blocks(Engine *e, Active *a, int *first, int *end) {
    *first = *end = 0;
    if (e->index == NULL) return 0;
    int max_blocks = (a->n_tokens - 1) / e->opt.block_tokens;
    active_hash_blocks(e, a, max_blocks * e->opt.block_tokens);
    int j = 0;
    while (j < max_blocks && !index_has(e->index, &a->hashes[j])) j++;
    int k = j;
    while (k < max_blocks && index_has(e->index, &a->hashes[k])) k++;
    if (k == j) j = k = 0;
    *first = j;
    *end = k;
    return k - j;
}

static int cached_prefix_blocks(Engine *e, Active *a) {
    int first, end;
    return cached_blocks(e, a, &first, &end);
}

/* ---- statistics ---------------------------------------------------------------- */

static void stats_update_gauges(Engine *e) {
    pthread_mutex_lock(&e->stats_lock);
    e->stats.queue_depth = e->n_waiting;
    e->stats.running = e->n_running;
    e->stats.pool_free = kvpool_n_free(&e->pool);
    e->stats.pool_cached = kvpool_n_cached(&e->pool);
    e->stats.pool_used = kvpool_n_used(&e->pool);
    for (int i = 0; i < e->n_tiers; i++) mover_stats(e->mover, i, &e->stats.tiers[i]);
    if (e->index) e->stats.dropped_blocks = index_n_deleted(e->index);
    e->stats.restore_failures = e->restore_failures;
    e->stats.writebehind_blocks = e->n_writebehind;
    pthread_mutex_unlock(&e->stats_lock);
}

void engine_stats(Engine *e, EngineStats *out) {
    pthread_mutex_lock(&e->stats_lock);
    *out = e->stats;
    pthread_mutex_unlock(&e->stats_lock);
}

/* ---- finishing ------------------------------------------------------------------- */

/* Emit the text held back (it is final now) and finish the request; the
 * Active itself stays (see active_finish). */
static void active_complete(Engine *e, Active *a, FinishReason why, const char *error) {
    if (a->is_completed) return;
    a->is_completed = true;
    size_t n_out = 0;
    if (why != FINISH_ERROR) {
        tok_stream_flush(&a->ts, e->piece, e->piece_cap, &n_out);
        if (!a->is_stop_cut) buf_append(&a->pending, &a->n_pending, &a->cap_pending, e->piece, n_out);
        if (a->n_pending) {
            request_emit(a->req, a->pending, a->n_pending);
            buf_append(&a->reply, &a->n_reply, &a->cap_reply, a->pending, a->n_pending);
        }
    }
    /* remember the ids of a complete reply (not one cut by a stop string or a
     * cancel: then the text is not what those ids decode to) */
    if ((why == FINISH_STOP || why == FINISH_LENGTH) && !a->is_stop_cut && a->n_generated > 0) {
        Hash128 key = replymem_prefix_key(&a->ns_id, a->tokens, (size_t)a->n_prompt);
        replymem_put(e->replies, &key, a->reply ? a->reply : "", a->n_reply, a->tokens + a->n_prompt,
                     (size_t)(a->n_tokens - a->n_prompt));
        persist_reply(e, &key, a);
    }
    persist_conversation(e, a);
    ReqResult res = {0};
    res.finish = why;
    res.n_prompt = a->n_prompt;
    res.n_cached = a->n_cached;
    memcpy(res.n_cached_by, a->n_cached_by, sizeof res.n_cached_by);
    res.n_generated = a->n_generated;
    res.ttft_s = a->t_first > 0 ? a->t_first - a->t_submit : 0;
    res.total_s = mn_now() - a->t_submit;
    if (error) snprintf(res.error, sizeof res.error, "%s", error);
    pthread_mutex_lock(&e->stats_lock);
    e->stats.requests_finished[why]++;
    e->stats.generated_tokens += (uint64_t)a->n_generated;
    pthread_mutex_unlock(&e->stats_lock);
    request_finish(a->req, &res);
}

/* Finish the request (if not done yet) and free the Active. */
static void active_finish(Engine *e, Active *a, FinishReason why, const char *error) {
    active_complete(e, a, why, error);
    active_free(e, a);
}

/* ---- generated text and stop strings ------------------------------------------ */

/* Longest suffix of s[0..n) that is a proper prefix of a stop string. */
static size_t stop_holdback(const ReqParams *p, const char *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < p->n_stop; i++) {
        size_t ls = strlen(p->stop[i]);
        for (size_t k = ls - 1 < n ? ls - 1 : n; k > best; k--)
            if (memcmp(s + n - k, p->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* Add a generated token's text; returns true when a stop string ended the reply. */
static bool active_push_text(Engine *e, Active *a, int32_t id) {
    size_t n_out = 0;
    tok_stream_push(&a->ts, id, e->piece, e->piece_cap, &n_out);
    if (buf_append(&a->pending, &a->n_pending, &a->cap_pending, e->piece, n_out) != MN_OK) return false;
    const ReqParams *p = &a->req->params;
    size_t cut = a->n_pending;
    bool stopped = false;
    for (int i = 0; i < p->n_stop; i++) {
        const char *hit = a->n_pending ? strstr(a->pending, p->stop[i]) : NULL;
        if (hit && (size_t)(hit - a->pending) < cut) {
            cut = (size_t)(hit - a->pending);
            stopped = true;
        }
    }
    size_t emit = stopped ? cut : a->n_pending - stop_holdback(p, a->pending, a->n_pending);
    if (emit > 0) {
        request_emit(a->req, a->pending, emit);
        buf_append(&a->reply, &a->n_reply, &a->cap_reply, a->pending, emit);
    }
    if (stopped) {
        a->n_pending = 0;
        a->is_stop_cut = true;
    } else {
        memmove(a->pending, a->pending + emit, a->n_pending - emit);
        a->n_pending -= emit;
    }
    return stopped;
}

/* Sample the next token of a; returns false when a has finished (and is freed). */
static bool active_sample(Engine *e, Active *a, float *logits) {
    if (a->n_generated == 0 && a->req->params.first_logits)
        memcpy(a->req->params.first_logits, logits, (size_t)e->m->cfg.n_vocab * sizeof *logits);
    int32_t next = sampler_sample(a->smp, logits);
    if (a->t_first == 0) a->t_first = mn_now();
    const ReqParams *p = &a->req->params;
    if (!p->ignore_eos && tok_is_eog(e->m->tok, next)) {
        active_finish(e, a, FINISH_STOP, NULL);
        return false;
    }
    sampler_accept(a->smp, next);
    a->tokens[a->n_tokens++] = next;
    a->n_generated++;
    if (active_push_text(e, a, next)) {
        active_finish(e, a, FINISH_STOP, NULL);
        return false;
    }
    if (a->n_generated >= p->max_tokens) {
        /* The answer is complete, but the last token's KV is not computed
         * yet: with the prefix cache on, compute it in the next step so the
         * conversation's next turn finds its whole reply cached. */
        if (e->index == NULL) {
            active_finish(e, a, FINISH_LENGTH, NULL);
            return false;
        }
        active_complete(e, a, FINISH_LENGTH, NULL);
    }
    return true;
}

/* ---- admission, suspension ------------------------------------------------------ */

static void waiting_remove(Engine *e, Active *a) {
    for (Active **pp = &e->waiting; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            a->next = NULL;
            e->n_waiting--;
            return;
        }
}

/* Put a back in arrival order. */
static void waiting_insert(Engine *e, Active *a) {
    Active **pp = &e->waiting;
    while (*pp && (*pp)->arrival < a->arrival) pp = &(*pp)->next;
    a->next = *pp;
    *pp = a;
    e->n_waiting++;
}

/* Blocks a must newly allocate to hold tokens[0..n_tokens) given n_hit
 * cached blocks. */
static int blocks_needed(const Engine *e, const Active *a, int n_hit) {
    int need = (a->n_tokens + e->opt.block_tokens - 1) / e->opt.block_tokens;
    return need - n_hit;
}

/* Where block h (indexed) comes from: the pool, or the tier restoring it
 * or to restore it from. */
static CacheSource block_source(const Engine *e, const Hash128 *h) {
    int32_t slot = index_lookup(e->index, h);
    if (slot < 0) return e->tier_src[best_tier(e, h)];
    const Load *ld = e->slot_load[slot];
    if (ld == NULL) return SRC_POOL;
    for (int k = 0; k < ld->job->n; k++)
        if (ld->job->slots[k] == slot) return e->tier_src[ld->job->tier[k]];
    return SRC_POOL;
}

static void count_admission(Engine *e, Active *a, int first, int end) {
    const int bt = e->opt.block_tokens;
    a->is_admitted_once = true;
    a->n_cached = (end - first) * bt;
    memset(a->n_cached_by, 0, sizeof a->n_cached_by);
    for (int i = first; i < end; i++) a->n_cached_by[block_source(e, &a->hashes[i])] += bt;
    pthread_mutex_lock(&e->stats_lock);
    e->stats.prompt_tokens += (uint64_t)a->n_prompt;
    e->stats.cached_tokens += (uint64_t)a->n_cached;
    for (int i = 0; i < SRC_COUNT; i++) e->stats.cached_tokens_by[i] += (uint64_t)a->n_cached_by[i];
    e->stats.recomputed_tokens += (uint64_t)(a->n_prompt - a->n_cached);
    pthread_mutex_unlock(&e->stats_lock);
}

/* Undo count_admission (the admission's restore failed: it is planned and
 * counted again). */
static void uncount_admission(Engine *e, Active *a) {
    a->is_admitted_once = false;
    pthread_mutex_lock(&e->stats_lock);
    e->stats.prompt_tokens -= (uint64_t)a->n_prompt;
    e->stats.cached_tokens -= (uint64_t)a->n_cached;
    for (int i = 0; i < SRC_COUNT; i++) e->stats.cached_tokens_by[i] -= (uint64_t)a->n_cached_by[i];
    e->stats.recomputed_tokens -= (uint64_t)(a->n_prompt - a->n_cached);
    pthread_mutex_unlock(&e->stats_lock);
}

/* Try to start a: take the cached prefix (restoring what only a tier
 * holds) and allocate the rest of its blocks. Returns false (nothing
 * taken) when the pool cannot hold it now. */
static bool try_admit(Engine *e, Active *a) {
    int first, end;
    int n_hit = cached_blocks(e, a, &first, &end);
    int need = blocks_needed(e, a, n_hit);
    int avail = kvpool_n_available(&e->pool), n_load = 0;
    /* hit blocks that sit CACHED stop being available once we take them;
     * blocks only a tier holds take a slot each to be restored into */
    for (int i = first; i < end; i++) {
        int32_t slot = index_lookup(e->index, &a->hashes[i]);
        if (slot < 0) n_load++;
        else if (e->pool.state[slot] == SLOT_CACHED) avail--;
    }
    int reserve = e->n_running > 0 ? e->reserve_blocks : 0;
    if (avail - need - n_load < reserve) return false;
    Seq *s = &a->seq;
    if (seq_reserve(s, &e->pool, 0) != MN_OK) return false;
    /* the block table: the cached run [first, end) in place, fresh slots for
     * the leading blocks before it and for everything after it. The pool
     * hits are taken first, so restoring and allocating cannot evict them. */
    int total = n_hit + need;
    int32_t *blocks = mn_malloc((size_t)(total > 0 ? total : 1) * sizeof *blocks);
    Hash128 *to_load = mn_malloc((size_t)(n_load > 0 ? n_load : 1) * sizeof *to_load);
    if (blocks == NULL || to_load == NULL) {
        mn_free(blocks);
        mn_free(to_load);
        return false;
    }
    if (!a->is_admitted_once) count_admission(e, a, first, end);
    n_load = 0;
    for (int i = first; i < end; i++) {
        blocks[i] = index_lookup(e->index, &a->hashes[i]);
        if (blocks[i] >= 0) kvpool_retain(&e->pool, blocks[i]);
        else to_load[n_load++] = a->hashes[i];
    }
    bool ok = start_load(e, to_load, n_load, false) == MN_OK;
    mn_free(to_load);
    for (int i = first; i < end; i++) {
        if (!ok) {
            if (blocks[i] >= 0) kvpool_release(&e->pool, blocks[i]);
        } else if (blocks[i] < 0) {
            blocks[i] = index_lookup(e->index, &a->hashes[i]);
            kvpool_retain(&e->pool, blocks[i]);
        }
    }
    for (int i = 0; ok && i < total; i++) {
        if (i >= first && i < end) continue;
        if (kvpool_alloc(&e->pool, &blocks[i]) != MN_OK) { /* cannot happen: counted above */
            for (int j = 0; j < i; j++)
                if (j < first || j >= end) kvpool_release(&e->pool, blocks[j]);
            for (int j = first; j < end; j++) kvpool_release(&e->pool, blocks[j]);
            ok = false;
        }
    }
    if (!ok) {
        uncount_admission(e, a);
        mn_free(blocks);
        return false;
    }
    mn_free(s->blocks);
    s->blocks = blocks;
    s->n_blocks = s->cap = total;
    const int bt = e->opt.block_tokens;
    a->lead_end = first * bt;
    a->lead_done = 0;
    a->n_done = n_hit > 0 ? end * bt : 0;
    a->n_registered = n_hit > 0 ? end : 0;
    return true;
}

/* Suspend running sequence i: its blocks go back (full ones stay cached),
 * and it waits to be admitted again with all its tokens. */
static void suspend(Engine *e, int i) {
    Active *a = e->running[i];
    e->running[i] = e->running[--e->n_running];
    if (a->is_completed) { /* only its cache-completing step was left */
        active_free(e, a);
        return;
    }
    seq_release(&a->seq, &e->pool);
    a->n_done = a->lead_end = a->lead_done = 0;
    waiting_insert(e, a);
    pthread_mutex_lock(&e->stats_lock);
    e->stats.suspensions++;
    pthread_mutex_unlock(&e->stats_lock);
}

/* Send running sequence i back to the queue after a failed restore: its
 * blocks go back and it is planned (and counted) again, finding fewer
 * cached blocks now; the step's work for it is discarded. */
static void requeue_failed(Engine *e, int i) {
    Active *a = e->running[i];
    e->running[i] = e->running[--e->n_running];
    a->is_restore_failed = false;
    if (a->is_completed) {
        active_free(e, a);
        return;
    }
    seq_release(&a->seq, &e->pool);
    a->n_done = a->lead_end = a->lead_done = 0;
    if (a->n_generated == 0) uncount_admission(e, a);
    waiting_insert(e, a);
}

static void requeue_all_failed(Engine *e) {
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->is_restore_failed) requeue_failed(e, i--);
}

/* Priority of a waiting request under the policy (higher goes first). */
static double priority(Engine *e, Active *a, double now) {
    switch (e->opt.schedule) {
    case SCHED_FPF: return (double)cached_prefix_blocks(e, a) - 1e-12 * (double)a->arrival;
    case SCHED_RELAXED_FPF: {
        int distance = cached_prefix_blocks(e, a) > 0 ? 0 : 3; /* 0 pool ... 3 not cached */
        return (now - a->t_submit + 1e-3) * (4 - distance) - 1e-12 * (double)a->arrival;
    }
    case SCHED_FCFS:
    default: return -(double)a->arrival;
    }
}

static void admit_waiting(Engine *e) {
    /* A sequence that finished by length computes its last token's KV in
     * one more step; admit after that, so a returning conversation that
     * arrives at once finds its whole reply cached. */
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->is_completed) return;
    double now = mn_now();
    while (e->n_running < e->opt.parallel && e->waiting) {
        Active *best = NULL;
        double best_p = -INFINITY;
        for (Active *a = e->waiting; a; a = a->next) {
            double p = priority(e, a, now);
            if (best == NULL || p > best_p) {
                best = a;
                best_p = p;
            }
        }
        /* suspended sequences (already admitted once) come back first */
        for (Active *a = e->waiting; a; a = a->next)
            if (a->is_admitted_once && a->n_generated > 0) {
                best = a;
                break;
            }
        if (!try_admit(e, best)) break;
        waiting_remove(e, best);
        e->running[e->n_running++] = best;
    }
}

/* Make sure a's block table covers a->n_tokens tokens; may suspend others
 * (most recent arrival first). Returns false if a itself was suspended. */
static bool ensure_blocks(Engine *e, Active *a) {
    while (seq_reserve(&a->seq, &e->pool, a->n_tokens) == MN_EFULL) {
        int victim = 0;
        for (int i = 1; i < e->n_running; i++)
            if (e->running[i]->arrival > e->running[victim]->arrival) victim = i;
        bool is_self = e->running[victim] == a;
        suspend(e, victim);
        if (is_self) return false;
    }
    return true;
}

/* Index block i of a (its KV is complete) and note what the policy needs. */
static void record_block(Engine *e, Active *a, int i) {
    int32_t slot = a->seq.blocks[i];
    if (index_insert(e->index, &a->hashes[i], slot) != 1) return;
    e->slot_pos[slot] = i * e->opt.block_tokens;
    e->slot_conv[slot] = a->conv;
}

/* The eviction policy (KvChooseFn): score every CACHED slot and take the
 * lowest. Cached blocks' last access is when they became CACHED: the blocks
 * of a finished request all do so together. */
static int32_t choose_victim(void *ctx, const KvPool *p) {
    Engine *e = ctx;
    PolicyCtx pc = {e->opt.evict, e->has_cost ? &e->cost : NULL, mn_now()};
    int n = 0;
    for (int32_t s = p->lru_head; s >= 0; s = p->lru_next[s], n++) e->cands[n] = slot_cand(e, s);
    policy_keys(&pc, e->cands, n, e->keys);
    return (int32_t)e->cands[policy_victim(e->keys, n)].id;
}

/* Scheduler-aware prefetch: start restoring the blocks of waiting request
 * a (cached run [first, end)) that only a tier holds into free pool slots,
 * so they are in the pool, or on their way, when a is admitted. Takes only
 * FREE slots beyond the decode reserve: prefetching never evicts. */
static void prefetch(Engine *e, Active *a, int first, int end) {
    if (e->mover == NULL) return;
    Hash128 hs[SAVE_MAX_RUN];
    int n = 0;
    for (int b = first; b < end && n < SAVE_MAX_RUN; b++)
        if (index_lookup(e->index, &a->hashes[b]) < 0) hs[n++] = a->hashes[b];
    if (n > 0 && kvpool_n_free(&e->pool) - n >= e->reserve_blocks) start_load(e, hs, n, true);
}

/* The look-ahead window: the first waiting requests, as many as the free
 * capacity holds on average. With a window policy, mark their cached
 * blocks so the policy keeps them (tail of the window first when it must);
 * with tiers, prefetch what they will restore. */
static void mark_window(Engine *e) {
    bool is_marking = policy_uses_window(e->opt.evict);
    if (e->index == NULL || (!is_marking && e->mover == NULL)) return;
    if (e->n_waiting == 0 && !e->has_window_marks) return; /* the common decode step */
    if (e->has_window_marks)
        for (int i = 0; i < e->pool.n_blocks; i++) e->slot_window[i] = -1;
    e->has_window_marks = is_marking && e->n_waiting > 0;
    if (e->n_waiting == 0) return;
    double mean = 0;
    for (Active *a = e->waiting; a; a = a->next) mean += (double)blocks_needed(e, a, 0);
    mean /= e->n_waiting;
    int len = policy_window_len((double)kvpool_n_available(&e->pool), mean, e->n_waiting);
    int idx = 0;
    for (Active *a = e->waiting; a && idx < len; a = a->next, idx++) {
        int first, end;
        cached_blocks(e, a, &first, &end);
        prefetch(e, a, first, end);
        for (int b = first; is_marking && b < end; b++) {
            int32_t slot = index_lookup(e->index, &a->hashes[b]);
            if (slot >= 0 && e->slot_window[slot] < 0) e->slot_window[slot] = idx;
        }
    }
}

/* Offer a's newly completed full blocks to the index. */
static void register_blocks(Engine *e, Active *a) {
    if (e->index == NULL) return;
    if (a->lead_end > 0 && a->lead_done == a->lead_end) { /* the recomputed leading blocks */
        for (int i = 0; i < a->lead_end / e->opt.block_tokens; i++) record_block(e, a, i);
        a->lead_end = a->lead_done = 0;
    }
    int full = a->n_done / e->opt.block_tokens;
    if (full > a->n_registered) active_hash_blocks(e, a, full * e->opt.block_tokens);
    for (; a->n_registered < full; a->n_registered++) record_block(e, a, a->n_registered);
}

/* ---- one step ------------------------------------------------------------------- */

static void fail_all_running(Engine *e, const char *msg) {
    while (e->n_running > 0) active_finish(e, e->running[--e->n_running], FINISH_ERROR, msg);
}

static void engine_step(Engine *e) {
    if (e->mover) {
        take_events(e, false);
        requeue_all_failed(e);
        save_cold_blocks(e);
    }
    mark_window(e);
    admit_waiting(e);
    /* every running sequence needs blocks for its pending tokens */
    for (int i = 0; i < e->n_running; i++)
        if (!ensure_blocks(e, e->running[i])) i = -1; /* the list changed: start over */
    if (e->n_running == 0) return;
    hold_back_restoring(e);
    int budget = e->opt.batch_tokens, n = 0, n_logits = 0;
    for (int i = 0; i < e->n_running; i++) e->running[i]->is_in_batch = false;
    /* decodes first (one pending token), then prefill chunks */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < e->n_running && budget > 0; i++) {
            Active *a = e->running[i];
            int lead = a->lead_end - a->lead_done, tail = a->n_tokens - a->n_done, pending = lead + tail;
            if ((pass == 0) != (pending == 1) || pending <= 0 || a->is_held_back) continue;
            a->is_in_batch = true;
            /* the two-range form: the leading range first, and the tail only
             * in a batch that completes the leading range (it attends to it) */
            int take_lead = lead < budget ? lead : budget;
            for (int k = 0; k < take_lead; k++, n++) {
                e->b_tok[n] = a->tokens[a->lead_done + k];
                e->b_seq[n] = i;
                e->b_pos[n] = a->lead_done + k;
            }
            budget -= take_lead;
            int take = take_lead == lead ? (tail < budget ? tail : budget) : 0;
            for (int k = 0; k < take; k++, n++) {
                e->b_tok[n] = a->tokens[a->n_done + k];
                e->b_seq[n] = i;
                e->b_pos[n] = a->n_done + k;
            }
            if (take_lead + take == pending && !a->is_completed) {
                e->b_logit[n_logits] = n - 1;
                e->b_owner[n_logits++] = a;
            }
            budget -= take;
        }
    }
    for (int i = 0; i < e->n_running; i++) e->b_seqs[i] = seq_view(&e->running[i]->seq);
    FwdBatch b = {.n_tok = n, .tokens = e->b_tok, .seq = e->b_seq, .pos = e->b_pos, .seqs = e->b_seqs,
                  .n_seqs = e->n_running, .logit_idx = e->b_logit, .n_logits = n_logits};
    if (e->n_load_blocks > 0) {
        b.wait_layer = wait_layer;
        b.wait_ctx = e;
    }
    const float *logits;
    MnErr err = {0};
    double t0 = mn_now();
    if (fwd_run(e->fwd, &b, &logits, &err) != MN_OK) {
        LOG_ERROR("forward pass failed: %s", err.msg);
        fail_all_running(e, err.msg);
        return;
    }
    e->step_s = 0.7 * e->step_s + 0.3 * (mn_now() - t0);
    /* advance, register full blocks (not for a sequence whose restore
     * failed during the pass: its work is discarded below) */
    for (int t = 0; t < n; t++) {
        Active *a = e->running[e->b_seq[t]];
        if (a->is_restore_failed) continue;
        int32_t p = e->b_pos[t];
        if (p < a->lead_end) a->lead_done = p + 1 > a->lead_done ? p + 1 : a->lead_done;
        else if (p + 1 > a->n_done) a->n_done = p + 1;
    }
    for (int i = 0; i < e->n_running; i++)
        if (!e->running[i]->is_restore_failed) register_blocks(e, e->running[i]);
    for (int i = 0; i < e->n_running; i++) /* completed ones have computed their last KV */
        if (e->running[i]->is_completed && e->running[i]->n_done == e->running[i]->n_tokens) {
            active_free(e, e->running[i]);
            e->running[i--] = e->running[--e->n_running];
        }
    /* sample; finished sequences leave the running set */
    for (int l = 0; l < n_logits; l++) {
        Active *a = e->b_owner[l];
        if (a->is_restore_failed) continue;
        if (!active_sample(e, a, (float *)logits + (size_t)l * (size_t)e->m->cfg.n_vocab)) {
            for (int i = 0; i < e->n_running; i++)
                if (e->running[i] == a) {
                    e->running[i] = e->running[--e->n_running];
                    break;
                }
        }
    }    if (e->mover) requeue_all_failed(e);
}

/* ---- the engine thread --------------------------------------------------------- */

static void handle_cancel(Engine *e, Request *r) {
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->req == r) {
            Active *a = e->running[i];
            e->running[i] = e->running[--e->n_running];
            active_finish(e, a, FINISH_CANCELLED, NULL);
            return;
        }
    for (Active *a = e->waiting; a; a = a->next)
        if (a->req == r) {
            waiting_remove(e, a);
            active_finish(e, a, FINISH_CANCELLED, NULL);
            return;
        }
}

static void handle_msgs(Engine *e, Msg *m) {
    while (m) {
        Msg *next = m->next;
        if (m->kind == MSG_SUBMIT) {
            Active *a = active_new(e, m->req);
            if (a == NULL) {
                ReqResult res = {.finish = FINISH_ERROR};
                snprintf(res.error, sizeof res.error, "out of memory");
                request_finish(m->req, &res);
                request_unref(m->req);
            } else {
                waiting_insert(e, a);
            }
        } else {
            handle_cancel(e, m->req);
            request_unref(m->req);
        }
        mn_free(m);
        m = next;
    }
}

/* Drop cached blocks idle longer than cache_ttl_s: from the pool here, and
 * (at most once a second) from every tier through the mover, whose runs
 * carry their last use in wall-clock time (it survives restarts). */
static void expire_cached(Engine *e) {
    if (e->opt.cache_ttl_s <= 0) return;
    double now = mn_now();
    if (e->mover && now - e->t_tier_expire >= 1.0) {
        e->t_tier_expire = now;
        MoverJob *j = mover_job_new(MOVER_EXPIRE, 0, 0);
        if (j) {
            j->cutoff = mn_wall_now() - e->opt.cache_ttl_s;
            if (mover_submit(e->mover, j) != MN_OK) mover_job_free(j);
        }
    }
    int n = kvpool_expire(&e->pool, mn_now() - e->opt.cache_ttl_s);
    if (n == 0) return;
    pthread_mutex_lock(&e->stats_lock);
    e->stats.expired_blocks += (uint64_t)n;
    pthread_mutex_unlock(&e->stats_lock);
    stats_update_gauges(e);
}

static void *engine_main(void *arg) {
    Engine *e = arg;
    for (;;) {
        expire_cached(e);
        pthread_mutex_lock(&e->inbox_lock);
        while (!e->inbox_head && !e->ev_head && !e->is_stopping && e->n_running == 0 && e->n_waiting == 0) {
            if (e->opt.cache_ttl_s <= 0 || (kvpool_n_cached(&e->pool) == 0 && e->mover == NULL)) {
                pthread_cond_wait(&e->inbox_cond, &e->inbox_lock);
                continue;
            }
            /* idle with cached blocks: wake up to expire them */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            if (pthread_cond_timedwait(&e->inbox_cond, &e->inbox_lock, &until) != 0) break;
        }
        Msg *m = e->inbox_head;
        e->inbox_head = e->inbox_tail = NULL;
        e->n_waiting_pub += e->n_inbox_submits;
        e->n_inbox_submits = 0;
        bool stopping = e->is_stopping;
        pthread_mutex_unlock(&e->inbox_lock);
        handle_msgs(e, m);
        if (stopping) break;
        engine_step(e);
        if (e->n_running == 0 && e->n_waiting > 0) admit_waiting(e); /* finished ones made room */
        if (e->n_running == 0 && e->n_waiting > 0 && e->n_save_blocks + e->n_load_blocks > 0) {
            take_events(e, true); /* moves in flight hold pool slots: wait for one to end */
        } else if (e->n_running == 0 && e->n_waiting > 0) {
            /* nothing fits and nothing runs: the head request can never be served */
            Active *a = e->waiting;
            waiting_remove(e, a);
            active_finish(e, a, FINISH_ERROR, "the KV pool is too small for this request");
        }
        pthread_mutex_lock(&e->inbox_lock);
        e->n_waiting_pub = e->n_waiting;
        pthread_mutex_unlock(&e->inbox_lock);
        stats_update_gauges(e);
    }
    while (e->n_running > 0) active_finish(e, e->running[--e->n_running], FINISH_CANCELLED, NULL);
    while (e->waiting) {
        Active *a = e->waiting;
        waiting_remove(e, a);
        active_finish(e, a, FINISH_CANCELLED, NULL);
    }
    stats_update_gauges(e);
    return NULL;
}

static int post(Engine *e, MsgKind kind, Request *r, bool count_queue) {
    Msg *m = mn_calloc(1, sizeof *m);
    if (m == NULL) return MN_ENOMEM;
    m->kind = kind;
    m->req = r;
    request_ref(r);
    pthread_mutex_lock(&e->inbox_lock);
    int rc = MN_OK;
    if (e->is_stopping || (kind == MSG_SUBMIT && e->is_draining)) rc = MN_ECANCELED;
    else if (count_queue && e->n_inbox_submits + e->n_waiting_pub >= e->opt.max_queue) rc = MN_EBUSY;
    if (rc == MN_OK) {
        if (e->inbox_tail) e->inbox_tail->next = m;
        else e->inbox_head = m;
        e->inbox_tail = m;
        if (count_queue) e->n_inbox_submits++;
        pthread_cond_signal(&e->inbox_cond);
    }
    pthread_mutex_unlock(&e->inbox_lock);
    if (rc != MN_OK) {
        request_unref(r);
        mn_free(m);
    }
    return rc;
}

int engine_submit(Engine *e, Request *r, MnErr *err) {
    int n = (int)r->n_prompt;
    for (int i = 0; i < n; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->m->cfg.n_vocab)
            return mn_err_set(err, MN_EINVAL, "token id %d is out of range [0, %d)", r->prompt[i], e->m->cfg.n_vocab);
    if ((int64_t)n + r->params.max_tokens > e->opt.n_ctx)
        return mn_err_set(err, MN_ERANGE, "the prompt (%d tokens) plus max_tokens (%d) exceed the context of %d tokens", n,
                          r->params.max_tokens, e->opt.n_ctx);
    int need = (n + r->params.max_tokens + e->opt.block_tokens - 1) / e->opt.block_tokens;
    if (need > e->pool.n_blocks)
        return mn_err_set(err, MN_ERANGE, "the request needs %d KV blocks but the pool has %d", need, e->pool.n_blocks);
    int rc = post(e, MSG_SUBMIT, r, true);
    if (rc == MN_EBUSY) mn_err_set(err, rc, "the queue is full (%d requests)", e->opt.max_queue);
    else if (rc) mn_err_set(err, rc, "the engine is %s", rc == MN_ECANCELED ? "shutting down" : "out of memory");
    return rc;
}

void engine_cancel(Engine *e, Request *r) {
    if (post(e, MSG_CANCEL, r, false) != MN_OK) LOG_WARN("could not post a cancel");
}

/* ---- construction ------------------------------------------------------------- */

/* A reopened tier holds these blocks (mover_new, before any request). */
static void on_tier_held(void *ctx, int tier, const Hash128 *hashes, int n) {
    Engine *e = ctx;
    for (int i = 0; i < n; i++)
        if (index_set_tiers(e->index, &hashes[i], 1u << tier, 0) != MN_OK) LOG_WARN("out of memory indexing tiers");
}

/* The tiers below the pool and their mover, when the options ask for any. */
static int start_tiers(Engine *e, MnErr *err) {
    EngineOptions *op = &e->opt;
    e->step_s = 0.05;
    e->watermark_blocks = (int)(op->swap_watermark * (float)e->pool.n_blocks);
    bool has_disk = op->disk_tier_dir && op->disk_tier_dir[0];
    if (op->ram_tier_mb == 0 && !has_disk) return MN_OK;
    if (e->index == NULL) return mn_err_set(err, MN_EINVAL, "cache tiers need the prefix cache");
    MoverConfig mc = {.pool = &e->pool,
                      .ram_bytes = op->ram_tier_mb << 20,
                      .disk_dir = has_disk ? op->disk_tier_dir : NULL,
                      .disk_bytes = (op->disk_tier_mb ? op->disk_tier_mb : 4096) << 20,
                      .model_fingerprint = e->m->fingerprint,
                      .kv_format = e->kv_format,
                      .is_durable = true,
                      .on_event = on_mover_event,
                      .event_ctx = e,
                      .on_held = on_tier_held,
                      .held_ctx = e,
                      .replies = e->replies,
                      .max_replies = ENGINE_MAX_REPLIES};
    op->disk_tier_dir = NULL; /* borrowed for engine_new only */
    int rc = mover_new(&mc, &e->mover, err);
    if (rc != MN_OK) return rc;
    e->n_tiers = mover_n_tiers(e->mover);
    for (int i = 0; i < e->n_tiers; i++)
        e->tier_src[i] = strcmp(mover_tier_name(e->mover, i), "ram") == 0 ? SRC_RAM : SRC_DISK;
    e->stats.n_tiers = e->n_tiers;
    return MN_OK;
}

/* After the engine thread is gone: let the mover finish what is queued
 * (write-behind is flushed), then settle its last events. */
static void stop_tiers(Engine *e) {
    if (e->mover == NULL) return;
    mover_free(e->mover);
    e->mover = NULL;
    take_events(e, false);
}

int engine_new(const Model *m, const EngineOptions *o, Engine **out, MnErr *err) {
    *out = NULL;
    Engine *e = mn_calloc(1, sizeof *e);
    if (e == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    e->m = m;
    e->opt = *o;
    pthread_mutex_init(&e->inbox_lock, NULL);
    pthread_cond_init(&e->inbox_cond, NULL);
    pthread_mutex_init(&e->stats_lock, NULL);
    EngineOptions *op = &e->opt;
    if (o->cost) {
        e->cost = *o->cost;
        e->has_cost = true;
    }
    op->cost = NULL; /* the copy above is the engine's */
    if (op->n_ctx <= 0 || op->n_ctx > m->cfg.n_ctx) op->n_ctx = m->cfg.n_ctx;
    int rc = MN_OK;
    if (op->block_tokens < 1 || op->block_tokens > 1024 || op->batch_tokens < 1 || op->parallel < 1 ||
        op->max_queue < 1 || op->n_threads < 1 || !(op->decode_reserve >= 0 && op->decode_reserve < 1) ||
        !(op->cache_ttl_s >= 0))
        rc = mn_err_set(err, MN_EINVAL, "engine options out of range");
    uint64_t per_block = kvpool_bytes_for(m->cfg.n_layer, m->cfg.kv_dim, op->block_tokens, 1, op->kv_type);
    uint64_t pool_bytes = op->pool_mb * 1024 * 1024;
    if (rc == MN_OK && pool_bytes == 0) {
        uint64_t avail = mem_available();
        pool_bytes = avail ? avail / 4 : (uint64_t)1 << 30;
        uint64_t cap = (uint64_t)4 << 30;
        uint64_t want = per_block * (uint64_t)((op->n_ctx + op->block_tokens - 1) / op->block_tokens) *
                        (uint64_t)op->parallel * 4;
        if (pool_bytes > cap) pool_bytes = cap;
        if (pool_bytes > want) pool_bytes = want;
    }
    uint64_t n_blocks = op->pool_blocks > 0 ? (uint64_t)op->pool_blocks : pool_bytes / per_block;
    if (rc == MN_OK && n_blocks < 2) rc = mn_err_set(err, MN_EINVAL, "a KV pool of %llu MB holds no blocks", (unsigned long long)op->pool_mb);
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    if (rc == MN_OK && (rc = kvpool_init(&e->pool, m->cfg.n_layer, m->cfg.kv_dim, op->block_tokens, (int)n_blocks,
                                         op->kv_type)))
        mn_err_set(err, rc, "cannot allocate a KV pool of %llu blocks", (unsigned long long)n_blocks);
    if (rc == MN_OK) {
        e->reserve_blocks = (int)(op->decode_reserve * (float)n_blocks);
        e->kv_format = index_kv_format(op->kv_type, op->block_tokens);
        if (op->prefix_cache && (e->index = index_new(&e->pool)) == NULL) rc = MN_ENOMEM;
        e->replies = replymem_new(ENGINE_MAX_REPLIES);
        int np = op->parallel, bt = op->batch_tokens;
        e->running = mn_calloc((size_t)np, sizeof *e->running);
        e->b_owner = mn_calloc((size_t)np, sizeof *e->b_owner);
        e->b_seqs = mn_calloc((size_t)np, sizeof *e->b_seqs);
        e->b_tok = mn_calloc((size_t)bt, sizeof(int32_t));
        e->b_seq = mn_calloc((size_t)bt, sizeof(int32_t));
        e->b_pos = mn_calloc((size_t)bt, sizeof(int32_t));
        e->b_logit = mn_calloc((size_t)np, sizeof(int32_t));
        size_t nb = (size_t)e->pool.n_blocks;
        e->slot_pos = mn_calloc(nb, sizeof *e->slot_pos);
        e->slot_conv = mn_calloc(nb, sizeof *e->slot_conv);
        e->slot_window = mn_malloc(nb * sizeof *e->slot_window);
        e->cands = mn_malloc(nb * sizeof *e->cands);
        e->keys = mn_malloc(nb * sizeof *e->keys);
        e->slot_load = mn_calloc(nb, sizeof *e->slot_load);
        e->slot_saving = mn_calloc(nb, 1);
        if (!e->slot_pos || !e->slot_conv || !e->slot_window || !e->cands || !e->keys || !e->slot_load ||
            !e->slot_saving)
            rc = MN_ENOMEM;
        else {
            for (size_t i = 0; i < nb; i++) e->slot_window[i] = -1;
            if (e->index) kvpool_set_choose_fn(&e->pool, choose_victim, e);
        }
        e->piece_cap = tok_max_piece_bytes(m->tok) + 16;
        e->piece = mn_malloc(e->piece_cap);
        if (rc || !e->replies || !e->running || !e->b_owner || !e->b_seqs || !e->b_tok || !e->b_seq || !e->b_pos ||
            !e->b_logit || !e->piece)
            rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    if (rc == MN_OK) {
        FwdOptions fo = {op->batch_tokens, op->parallel, op->n_ctx, op->n_threads};
        rc = fwd_new(m, &e->pool, &fo, &e->fwd, err);
    }
    if (rc == MN_OK) rc = start_tiers(e, err);
    if (rc == MN_OK) {
        e->stats.pool_blocks = e->pool.n_blocks;
        e->stats.pool_bytes = per_block * n_blocks;
        e->stats.block_tokens = op->block_tokens;
        e->stats.n_ctx = op->n_ctx;
        stats_update_gauges(e);
        if (pthread_create(&e->thread, NULL, engine_main, e) != 0) rc = mn_err_set(err, MN_ENOMEM, "cannot start the engine thread");
        else e->has_thread = true;
    }
    if (rc != MN_OK) {
        engine_free(e);
        return rc;
    }
    *out = e;
    return MN_OK;
}

bool engine_drain(Engine *e, double timeout_s) {
    pthread_mutex_lock(&e->inbox_lock);
    e->is_draining = true;
    pthread_mutex_unlock(&e->inbox_lock);
    double deadline = mn_now() + timeout_s;
    for (;;) {
        pthread_mutex_lock(&e->inbox_lock);
        bool idle = e->inbox_head == NULL && e->n_waiting_pub == 0;
        pthread_mutex_unlock(&e->inbox_lock);
        EngineStats st;
        engine_stats(e, &st);
        if (idle && st.running == 0 && st.queue_depth == 0) return true;
        if (mn_now() >= deadline) return false;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void engine_shutdown(Engine *e) {
    if (!e->has_thread) return;
    pthread_mutex_lock(&e->inbox_lock);
    e->is_stopping = true;
    pthread_cond_signal(&e->inbox_cond);
    pthread_mutex_unlock(&e->inbox_lock);
    pthread_join(e->thread, NULL);
    e->has_thread = false;
}

void engine_free(Engine *e) {
    if (e == NULL) return;
    engine_shutdown(e);
    for (Msg *m = e->inbox_head, *next; m; m = next) {
        next = m->next;
        request_unref(m->req);
        mn_free(m);
    }
    stop_tiers(e);
    fwd_free(e->fwd);
    index_free(e->index);
    kvpool_deinit(&e->pool);
    replymem_free(e->replies);
    mn_free(e->running);
    mn_free(e->b_owner);
    mn_free(e->b_seqs);
    mn_free(e->b_tok);
    mn_free(e->b_seq);
    mn_free(e->b_pos);
    mn_free(e->b_logit);
    mn_free(e->piece);
    mn_free(e->slot_pos);
    mn_free(e->slot_conv);
    mn_free(e->slot_window);
    mn_free(e->cands);
    mn_free(e->keys);
    mn_free(e->slot_load);
    mn_free(e->slot_saving);
    pthread_mutex_destroy(&e->inbox_lock);
    pthread_cond_destroy(&e->inbox_cond);
    pthread_mutex_destroy(&e->stats_lock);
    mn_free(e);
}
