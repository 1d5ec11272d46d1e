/* engine_tiers.c — the engine's side of the tiers below the pool.
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
 * (tiers_wait_layer). A failed restore (checksum, I/O, a block the tier
 * no longer has) unindexes its slots and names each to the scheduler
 * (on_lost_fn), which sends every sequence holding one back to the queue
 * to be planned again: what was lost is recomputed, never used.
 * Waiting requests in the look-ahead window get their history ahead of
 * time: into free pool slots (a Load), or from disk into the RAM tier (a
 * PROMOTE, which touches no pool slot), so their restore reads RAM. A
 * request admitted at once is not promoted, and one admitted before its
 * promotes ran withdraws them: its restore reads the disk directly, and
 * what it read is copied up into RAM from the pool once the pass that
 * waited for it is over (a SAVE into tier 0 alone), so nothing is read
 * twice and no restore waits for a copy into RAM.
 * With a shared tier (redis), a new request's blocks that nothing here
 * holds are looked up there first (a PROBE): what another instance stored
 * is then restored like any tier's blocks, and the request waits for that
 * answer before its admission.
 *
 * Everything here is the engine thread's (engine_tiers.h says how the
 * scheduler reaches it), except the event queue, which the mover thread
 * fills under the engine's inbox lock (TiersConfig.lock). The scheduler's
 * structs (requests, the running set) are not visible here: it passes
 * block tables and hashes in, and hears of a lost slot through on_lost_fn.
 * Invariants: slot_load[s] is the Load writing slot s (each Load holds a
 * reference on its slots until its DONE event); slot_saving[s] is set
 * while a SAVE holds s; n_load_blocks and n_save_blocks count them. */

#include <math.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/restplan.h"
#include "engine/engine_tiers.h"

#define SAVE_MAX_RUN 32 /* blocks per SAVE job */

/* ---- types ---------------------------------------------------------------------- */

/* A restore in flight: one LOAD job of the mover, writing fresh pool slots
 * (each indexed under its block's hash, so other requests share it). The
 * load holds one reference on each slot until its DONE event. */
typedef struct Load {
    MoverJob *job;           /* the mover's until DONE: only its immutable
                                request fields (n, hashes, slots, tier) are
                                read, and block_hidden once a LAYER came */
    int32_t *pos;            /* (job->n) position of each block's first token */
    int32_t *proj;           /* (job->n) scratch: the slots a layer projects */
    int32_t *proj_pos;       /* (job->n) and their positions */
    bool is_bad;             /* a projection failed: the load counts as failed */
    int layers_done;         /* from LAYER events */
    double eta_s;            /* tiers_plan_step's: seconds until it and the
                                loads before it are expected to be done */
    struct Load *next;       /* in submission order */
} Load;

/* A promote in flight: one PROMOTE job of the mover, copying blocks of a
 * waiting request's history into tier 0 (RAM); no pool slot is involved. */
typedef struct Promote {
    MoverJob *job;           /* the mover's until DONE or withdrawn */
    TierSeq *ts;             /* the request it was made for; NULL once that
                                is freed */
    uint64_t id;             /* in submission order, from 1 */
    struct Promote *next;
} Promote;

struct TierSeq {
    const Hash128 *hashes;   /* borrowed: the request's chain hashes */
    Hash128 ns_id;
    uint64_t conv;           /* its conversation for the policies, 0: none */
    int win_first, win_end;  /* its cached run, as the window last gave it */
    bool is_promoted;        /* its cached run was offered to tier 0 (RAM)
                                while it waited: once per request */
    int n_promotes;          /* its Promotes in flight */
    uint64_t first_promote;  /* Promote.id of its first promote, 0: none */
    bool is_probed;          /* its blocks were looked up in the shared tier */
    MoverJob *probe;         /* that PROBE while in flight (its owner is this
                                TierSeq until freed, then NULL) */
    TierSeq *win_next;       /* in the window being built */
};

struct EngineTiers {
    KvPool *pool;            /* borrowed from the engine */
    BlockIndex *index;       /* borrowed; NULL with the prefix cache off */
    SlotPolicy *slots;       /* borrowed */
    const EngineTestHooks *hooks; /* borrowed; NULL normally */
    EvictPolicy evict;
    int parallel;            /* running sequences at most (the window's head) */
    int reserve_blocks;      /* free slots prefetching leaves alone */
    double cache_ttl_s;
    Mover *mover;            /* NULL: no tiers */
    int n_tiers;
    CacheSource tier_src[MOVER_MAX_TIERS]; /* the usage bucket of each tier */
    Load **slot_load;        /* (n_blocks) the restore writing the slot, or NULL */
    uint8_t *slot_saving;    /* (n_blocks) a SAVE job holds the slot */
    int32_t *cold;           /* (n_blocks) write-behind's candidate slots */
    Load *loads, *loads_tail;/* restores in flight, in submission order */
    int n_load_blocks;       /* blocks being restored */
    int n_save_blocks;       /* blocks being saved */
    float swap_watermark;    /* write-behind's goal: this fraction of the pool
                                free or reclaimable without I/O */
    int watermark_blocks;    /* write-behind below this many free blocks */
    double step_s;           /* recent compute seconds per forward pass
                                (the time it waited for restores left out) */
    double step_wait_s;      /* this pass's wait for restored layers */
    uint64_t restore_failures;
    double t_tier_expire;    /* when the tiers were last asked to expire */
    uint64_t n_writebehind;  /* blocks copied down by the watermark */
    uint64_t n_prefetched;   /* blocks restored for the look-ahead window */
    uint64_t n_promoted;     /* blocks of the window copied into tier 0 (RAM) */
    uint64_t n_copy_up_withdrawn; /* blocks whose copy up was taken back */
    int promote_max;         /* blocks per PROMOTE job; 0: no promotes */
    int promote_room;        /* blocks tier 0 holds, when it can take promotes */
    Promote *promotes;       /* PROMOTE jobs in flight, in submission order */
    int n_promotes;          /* ... and how many */
    uint64_t promote_ids;    /* the last Promote.id given */
    MoverJob **copy_ups;     /* (copy_ups_cap) copy-ups into tier 0 not
                                done, in submission order: [0, n_ups_sent)
                                the mover's, the rest kept until the pass
                                is over (copy_up) */
    int n_copy_ups, n_ups_sent, copy_ups_cap;
    bool is_in_pass;         /* events are taken inside a pass (tiers_wait_layer) */
    int shared;              /* the shared tier's index (redis), or -1 */
    ReplyMemory *replies;    /* borrowed: with a shared tier, it fetches from there */
    int n_probes;            /* PROBE jobs in flight */
    uint64_t n_probed;       /* blocks looked up in the shared tier */
    uint64_t n_probe_found;  /* ... and found there */
    double save_backoff_s;   /* after saves no tier took: wait this long ... */
    double t_save_retry;     /* ... until then (tiers_now) before saving again */
    TierSeq *window;         /* the window being built, in queue order ... */
    TierSeq *window_last;    /* ... and its last request */
    Hash128 window_sent;     /* digest of the window last sent to the tiers */
    pthread_mutex_t *lock;   /* the engine's inbox lock: guards ev_head, ev_tail */
    pthread_cond_t *cond;
    MoverEvent *ev_head, *ev_tail; /* events from the mover */
    void (*on_lost_fn)(void *ctx, int32_t slot);
    void (*on_restored_fn)(void *ctx, int32_t slot, uint64_t hidden_layers);
    void *ctx;               /* TiersConfig.ctx, of the three callbacks */
    uint64_t hidden_layers;  /* TiersConfig.hidden_layers */
    bool is_auto;            /* TiersConfig.is_auto */
    double proj_s;           /* seconds per token and layer a projection takes
                                (a moving average); 0: not measured */
    int (*project_fn)(void *ctx, int layer, const int32_t *slots, const int32_t *pos0, int n);
    uint64_t n_restored;               /* blocks restored into the pool */
    uint64_t n_restored_hidden_layers; /* ... their layers that came as hidden states, summed */
};

/* mn_now() as the tiers read it for this use (the tests' hooks shift it). */
static double tiers_now(const EngineTiers *t, EngineClockUse use) {
    return mn_now() + engine_clock_shift(t->hooks, use);
}

/* ---- the mover's events ---------------------------------------------------------- */


/* MoverConfig.on_event, on the mover thread. */
static void on_mover_event(void *ctx, MoverEvent *ev) {
    EngineTiers *t = ctx;
    pthread_mutex_lock(t->lock);
    ev->next = NULL;
    if (t->ev_tail) t->ev_tail->next = ev;
    else t->ev_head = ev;
    t->ev_tail = ev;
    pthread_cond_signal(t->cond);
    pthread_mutex_unlock(t->lock);
}

static void save_done(EngineTiers *t, MoverJob *j);
static uint64_t hidden_plan(const EngineTiers *t);
static double tier_read_bw(const EngineTiers *t, int i);
static void load_free(Load *ld);
static void load_done(EngineTiers *t, Load *ld, MoverJob *j);
static void promote_done(EngineTiers *t, const MoverJob *j);
static void copy_up_flush(EngineTiers *t);
static void copy_up_untrack(EngineTiers *t, int i);
static void probe_done(EngineTiers *t, MoverJob *j);

/* Layer `layer` of load ld is in the pool: project the blocks whose layer
 * came as hidden states into their K/V, before the layer counts as done
 * (a pass waits for layers_done), so nothing reads those slots before. */
static void project_layer(EngineTiers *t, Load *ld, int layer) {
    const MoverJob *j = ld->job;
    int n = 0;
    for (int k = 0; k < j->n && layer < KVPOOL_HIDDEN_MAX_LAYERS; k++)
        if (j->block_hidden[k] >> layer & 1) {
            ld->proj[n] = j->slots[k];
            ld->proj_pos[n++] = ld->pos[k];
        }
    if (n == 0 || ld->is_bad || t->project_fn == NULL) return;
    double t0 = tiers_now(t, ENGINE_CLOCK_PROJECT);
    bool is_fault = t->hooks && t->hooks->project_fails_fn && t->hooks->project_fails_fn(t->hooks->ctx, layer);
    if (is_fault || t->project_fn(t->ctx, layer, ld->proj, ld->proj_pos, n) != MN_OK) {
        LOG_ERROR("projecting layer %d of %d restored blocks failed: they are recomputed", layer, n);
        ld->is_bad = true;
        return;
    }
    tiers_note_projection(t, tiers_now(t, ENGINE_CLOCK_PROJECT) - t0, (int64_t)n * t->pool->block_tokens);
}

static void handle_event(EngineTiers *t, MoverEvent *ev) {
    MoverJob *j = ev->job;
    switch (ev->kind) {
    case MOVER_EV_LAYER: {
        Load *ld = j->owner;
        if (ev->layer == 0 && t->on_restored_fn) /* block_hidden is known now */
            for (int k = 0; k < j->n; k++) t->on_restored_fn(t->ctx, j->slots[k], j->block_hidden[k]);
        project_layer(t, ld, ev->layer);
        /* a failed projection leaves the layer not done: a pass waiting for
         * it waits for the load's DONE, which fails it (its work dropped),
         * instead of reading K/V that were never projected */
        if (!ld->is_bad) ld->layers_done = ev->layer + 1;
        break;
    }
    case MOVER_EV_DROPPED:
        for (int i = 0; i < ev->n; i++) index_set_tiers(t->index, &ev->hashes[i], 0, 1u << ev->tier);
        mover_event_free(ev);
        break;
    case MOVER_EV_DONE:
        if (j->kind == MOVER_SAVE) save_done(t, j);
        else if (j->kind == MOVER_LOAD) load_done(t, j->owner, j);
        else if (j->kind == MOVER_PROMOTE) promote_done(t, j);
        else if (j->kind == MOVER_PROBE) probe_done(t, j);
        mover_job_free(j);
        break;
    }
}

bool tiers_has_events(const EngineTiers *t) { return t->ev_head != NULL; }

void tiers_take_events(EngineTiers *t, bool block) {
    if (!t->is_in_pass) copy_up_flush(t); /* (kept ones go before it sleeps) */
    pthread_mutex_lock(t->lock);
    while (block && t->ev_head == NULL) pthread_cond_wait(t->cond, t->lock);
    MoverEvent *ev = t->ev_head;
    t->ev_head = t->ev_tail = NULL;
    pthread_mutex_unlock(t->lock);
    while (ev) {
        MoverEvent *next = ev->next;
        handle_event(t, ev);
        ev = next;
    }
    if (!t->is_in_pass) copy_up_flush(t);
}

bool tiers_is_moving(const EngineTiers *t) {
    return t->n_save_blocks + t->n_load_blocks > 0 || t->n_promotes > 0 || t->n_probes > 0;
}

/* The read rate (bytes/s) the planner takes for tier i, from the mover's
 * snapshot ms: what its restores read so far over their time, else what
 * the mover measured as it started (MoverConfig.measure_reads), else a
 * guess. */
static double read_bw_of(const EngineTiers *t, int i, const MoverTierStats *ms) {
    const TierStats *st = &ms->tier;
    if (st->read_seconds > 0.01 && st->bytes_read > 0) return (double)st->bytes_read / st->read_seconds;
    if (ms->measured_read_bps > 0) return ms->measured_read_bps;
    return t->tier_src[i] == SRC_RAM ? TIERS_GUESS_RAM_BPS : TIERS_GUESS_BPS;
}

void tiers_snapshot(const EngineTiers *t, EngineStats *st) {
    /* (n_tiers, mover and tier_src are set before the engine thread starts) */
    for (int i = 0; i < t->n_tiers; i++) {
        mover_stats(t->mover, i, &st->tiers[i]);
        st->tier_read_bps[i] = read_bw_of(t, i, &st->tiers[i]);
    }
}

void tiers_stats(const EngineTiers *t, EngineStats *st) {
    st->n_tiers = t->n_tiers;
    tiers_snapshot(t, st);
    st->restore_failures = t->restore_failures;
    const uint64_t bt = (uint64_t)t->pool->block_tokens;
    st->restored_hidden_tokens = tiers_tokens_of_layers(t->n_restored_hidden_layers * bt, t->pool->n_layer);
    st->restored_kv_tokens = t->n_restored * bt - st->restored_hidden_tokens;
    st->writebehind_blocks = t->n_writebehind;
    st->prefetched_blocks = t->n_prefetched;
    st->promoted_blocks = t->n_promoted;
    st->copy_up_withdrawn_blocks = t->n_copy_up_withdrawn;
    st->shared_lookup_blocks = t->n_probed;
    st->shared_found_blocks = t->n_probe_found;
}

/* ---- saves ------------------------------------------------------------------------ */

/* A SAVE of cached blocks (hashes[i] in slots[i], indexed) as one run
 * whose first token sits at position pos (blocks of one namespace: the
 * first slot's) into the tiers `into` names (MoverJob.into_tiers; 0: down
 * the whole chain, for blocks in no tier), holding its slots from now on
 * (counted in n_save_blocks); NULL when out of memory. */
static MoverJob *save_job_new(EngineTiers *t, const Hash128 *hashes, const int32_t *slots, int n, int32_t pos,
                              uint32_t into) {
    MoverJob *j = mover_job_new(MOVER_SAVE, n, 0);
    if (j == NULL) return NULL;
    memcpy(j->hashes, hashes, (size_t)n * sizeof *hashes);
    memcpy(j->slots, slots, (size_t)n * sizeof *slots);
    j->pos = pos;
    j->into_tiers = into;
    j->ns_id = *slotpol_ns(t->slots, slots[0]);
    j->hidden = hidden_plan(t); /* of those, the layers every block holds hidden rows of */
    for (int i = 0; i < n; i++) j->hidden &= kvpool_hidden_layers(t->pool, slots[i]);
    for (int i = 0; i < n; i++) {
        kvpool_retain(t->pool, slots[i]);
        t->slot_saving[slots[i]] = 1;
    }
    t->n_save_blocks += n;
    return j;
}

/* Let SAVE j's slots go and free it, unsent or withdrawn: its blocks stay
 * where they are. */
static void save_drop(EngineTiers *t, MoverJob *j) {
    for (int i = 0; i < j->n; i++) {
        t->slot_saving[j->slots[i]] = 0;
        kvpool_release(t->pool, j->slots[i]);
    }
    t->n_save_blocks -= j->n;
    mover_job_free(j);
}

/* Hand SAVE j (save_job_new's) to the mover; when it cannot go (or the
 * mover is gone), its slots are let go and it is freed: the blocks stay
 * where they are. */
static void save_submit(EngineTiers *t, MoverJob *j) {
    if (t->mover != NULL && mover_submit(t->mover, j) == MN_OK) return;
    save_drop(t, j);
}

/* Copy cached blocks in no tier down the chain (save_job_new). Blocks
 * that cannot be saved now simply stay unsaved. */
static void save_blocks(EngineTiers *t, const Hash128 *hashes, const int32_t *slots, int n, int32_t pos) {
    MoverJob *j = n > 0 ? save_job_new(t, hashes, slots, n, pos, 0) : NULL;
    if (j) save_submit(t, j);
}

/* How many of a table's first n_hashed blocks are in it: those a tier may
 * hold (full and hashed). */
static int full_blocks(const Seq *seq, int n_hashed) { return n_hashed < seq->n_blocks ? n_hashed : seq->n_blocks; }

/* Whether block h, in slot, is this slot's indexed copy that no tier holds
 * and nothing moves now. */
static bool is_unsaved(const EngineTiers *t, const Hash128 *h, int32_t slot) {
    return index_lookup(t->index, h) == slot && index_tiers(t->index, h) == 0 && !t->slot_saving[slot] &&
           t->slot_load[slot] == NULL;
}

/* Save the indexed full blocks of a request's table that no tier holds
 * yet, in runs of consecutive blocks (at most SAVE_MAX_RUN each). */
static void save_seq(EngineTiers *t, const TierSeq *ts, const Seq *seq, int n_hashed) {
    if (t->mover == NULL || tiers_now(t, ENGINE_CLOCK_BACKOFF) < t->t_save_retry) return;
    const int bt = t->pool->block_tokens;
    Hash128 hs[SAVE_MAX_RUN];
    int32_t ss[SAVE_MAX_RUN];
    int n = 0, first = 0, n_full = full_blocks(seq, n_hashed);
    for (int i = 0; i < n_full; i++) {
        int32_t slot = seq->blocks[i];
        bool take = is_unsaved(t, &ts->hashes[i], slot);
        if (n > 0 && (!take || n == SAVE_MAX_RUN)) { /* the run ends */
            save_blocks(t, hs, ss, n, first * bt);
            n = 0;
        }
        if (!take) continue;
        if (n == 0) first = i;
        hs[n] = ts->hashes[i];
        ss[n++] = slot;
    }
    save_blocks(t, hs, ss, n, first * bt);
}

/* Write-behind (the swap watermark): while free pool blocks plus cached
 * ones a tier already holds (reclaimable without I/O) are under the
 * watermark, copy the coldest unsaved cached blocks — in eviction-policy
 * order — down the chain, one batch in flight at a time, while compute
 * goes on: a run per conversation and namespace (its position the
 * smallest of its blocks'; conversation 0 is every request without a
 * session id, of any tenant). Their slots stay cached until the pool needs
 * them. */
void tiers_save_cold(EngineTiers *t) {
    if (t->mover == NULL || t->n_save_blocks > 0 || tiers_now(t, ENGINE_CLOCK_BACKOFF) < t->t_save_retry) return;
    const KvPool *p = t->pool;
    int n_free = kvpool_n_free(p);
    if (n_free >= t->watermark_blocks) return;
    int n_clean = 0, n = 0;
    for (int32_t s = p->lru_head; s >= 0; s = p->lru_next[s]) {
        const Hash128 *h = index_slot_hash(t->index, s);
        if (h == NULL) continue;
        if (index_tiers(t->index, h) != 0) n_clean++;
        else if (is_unsaved(t, h, s)) t->cold[n++] = s;
    }
    int want = policy_writebehind_want(n_free, n_clean, p->n_blocks, t->swap_watermark);
    if (want == 0 || n == 0) return;
    int32_t idx[SAVE_MAX_RUN];
    int k = slotpol_select(t->slots, t->cold, n, want < SAVE_MAX_RUN ? want : SAVE_MAX_RUN, idx);
    bool taken[SAVE_MAX_RUN] = {false};
    for (int i = 0; i < k; i++) {
        if (taken[i]) continue;
        Hash128 hs[SAVE_MAX_RUN];
        int32_t ss[SAVE_MAX_RUN];
        int m = 0;
        EvictCand head = slotpol_cand(t->slots, t->cold[idx[i]]);
        int32_t pos = head.pos;
        const Hash128 *ns = slotpol_ns(t->slots, (int32_t)head.id);
        for (int j = i; j < k; j++) {
            EvictCand c = slotpol_cand(t->slots, t->cold[idx[j]]);
            if (taken[j] || c.conv != head.conv || !hash128_eq(slotpol_ns(t->slots, (int32_t)c.id), ns)) continue;
            taken[j] = true;
            ss[m] = (int32_t)c.id;
            hs[m++] = *index_slot_hash(t->index, (int32_t)c.id);
            if (c.pos < pos) pos = c.pos;
        }
        save_blocks(t, hs, ss, m, pos);
    }
    t->n_writebehind += (uint64_t)k;
}

static void save_done(EngineTiers *t, MoverJob *j) {
    /* no tier had room for the run: back off write-behind, doubling up to
     * a minute, so a full disk is not retried in a loop. (A failed tier
     * refuses at once, which costs nothing: the next turn's blocks are
     * offered to it again, so they reach a store that came back.) A copy
     * up into RAM (into_tiers) says nothing of the chain's room. */
    bool is_chain = j->into_tiers == 0;
    for (int i = 0; !is_chain && i < t->n_ups_sent; i++)
        if (t->copy_ups[i] == j) copy_up_untrack(t, i--);
    if (is_chain && j->rc == MN_EFULL) {
        t->save_backoff_s = t->save_backoff_s > 0 ? fmin(2 * t->save_backoff_s, 60) : 1;
        t->t_save_retry = tiers_now(t, ENGINE_CLOCK_BACKOFF) + t->save_backoff_s;
    } else if (is_chain && j->rc == MN_OK) {
        t->save_backoff_s = 0;
    }
    for (int i = 0; i < j->n; i++) {
        if (j->rc == MN_OK && index_set_tiers(t->index, &j->hashes[i], j->saved_tiers, 0) != MN_OK)
            LOG_WARN("out of memory recording a saved block");
        t->slot_saving[j->slots[i]] = 0;
        kvpool_release(t->pool, j->slots[i]);
    }
    t->n_save_blocks -= j->n;
}

/* ---- restores ---------------------------------------------------------------------- */

/* The fastest tier holding h (tiers are in chain order), or -1. */
static int best_tier(const EngineTiers *t, const Hash128 *h) {
    uint32_t held = index_tiers(t->index, h);
    for (int i = 0; i < t->n_tiers; i++)
        if (held & (1u << i)) return i;
    return -1;
}

/* Start restoring blocks at[0..n) of ts, each held by a tier and in no
 * pool slot: a fresh slot for each, indexed at once (with what the
 * policies need of it) so other requests share the restore, and one LOAD
 * job. The load holds a reference on each slot until it is done. MN_EFULL
 * (nothing started) when the pool has too few slots; with free_only, only
 * FREE slots are taken (no eviction). */
static int start_load(EngineTiers *t, const TierSeq *ts, const int *at, int n, bool free_only) {
    if (n == 0) return MN_OK;
    if ((free_only ? kvpool_n_free(t->pool) : kvpool_n_available(t->pool)) < n) return MN_EFULL;
    Load *ld = mn_calloc(1, sizeof *ld);
    MoverJob *j = mover_job_new(MOVER_LOAD, n, t->pool->n_layer);
    if (ld) {
        ld->pos = mn_malloc((size_t)n * sizeof *ld->pos);
        ld->proj = mn_malloc((size_t)n * sizeof *ld->proj);
        ld->proj_pos = mn_malloc((size_t)n * sizeof *ld->proj_pos);
    }
    if (ld == NULL || j == NULL || !ld->pos || !ld->proj || !ld->proj_pos) {
        load_free(ld);
        mover_job_free(j);
        return MN_ENOMEM;
    }
    for (int i = 0; i < n; i++) ld->pos[i] = at[i] * t->pool->block_tokens;
    int k = 0, rc = MN_OK;
    for (; k < n && rc == MN_OK; k++) {
        const Hash128 *h = &ts->hashes[at[k]];
        int tier = best_tier(t, h);
        if (tier < 0 || index_lookup(t->index, h) >= 0) rc = MN_EINVAL; /* the caller checked */
        else if ((rc = kvpool_alloc(t->pool, &j->slots[k])) == MN_OK) {
            j->hashes[k] = *h;
            j->tier[k] = (uint8_t)tier;
            if (index_insert(t->index, h, j->slots[k]) != 1) {
                kvpool_release(t->pool, j->slots[k]);
                rc = MN_ENOMEM;
            }
        }
    }
    if (rc == MN_OK) {
        j->owner = ld;
        ld->job = j;
        rc = mover_submit(t->mover, j);
    }
    if (rc != MN_OK) { /* undo: k-1 slots were taken and indexed */
        for (int i = 0; i < k - 1; i++) {
            index_remove_slot(t->index, j->slots[i]);
            kvpool_release(t->pool, j->slots[i]);
        }
        load_free(ld);
        mover_job_free(j);
        return rc;
    }
    for (int i = 0; i < n; i++) {
        t->slot_load[j->slots[i]] = ld;
        slotpol_note_block(t->slots, j->slots[i], at[i] * t->pool->block_tokens, ts->conv, &ts->ns_id);
    }
    if (t->loads_tail) t->loads_tail->next = ld;
    else t->loads = ld;
    t->loads_tail = ld;
    t->n_load_blocks += n;
    return MN_OK;
}

int tiers_start_load(EngineTiers *t, const TierSeq *ts, const int *at, int n) {
    return start_load(t, ts, at, n, false);
}

static void load_free(Load *ld) {
    if (ld == NULL) return;
    mn_free(ld->pos);
    mn_free(ld->proj);
    mn_free(ld->proj_pos);
    mn_free(ld);
}

/* Whether block k of load j, just restored, is to be copied up into tier
 * 0: read from a slower tier, tier 0 does not hold it, and its slot is
 * still its indexed copy. */
static bool is_copied_up(const EngineTiers *t, const MoverJob *j, int k) {
    const Hash128 *h = &j->hashes[k];
    return j->tier[k] > 0 && !(index_tiers(t->index, h) & 1u) && index_lookup(t->index, h) == j->slots[k];
}

/* Track copy-up j, kept until copy_up_flush sends it; false when there is
 * no room to track it (out of memory). */
static bool copy_up_keep(EngineTiers *t, MoverJob *j) {
    if (t->n_copy_ups == t->copy_ups_cap) {
        int cap = t->copy_ups_cap > 0 ? 2 * t->copy_ups_cap : 8;
        MoverJob **a = mn_realloc(t->copy_ups, (size_t)cap * sizeof *a);
        if (a == NULL) return false;
        t->copy_ups = a;
        t->copy_ups_cap = cap;
    }
    t->copy_ups[t->n_copy_ups++] = j;
    return true;
}

/* Stop tracking copy-up i (it is done, or taken back). */
static void copy_up_untrack(EngineTiers *t, int i) {
    memmove(&t->copy_ups[i], &t->copy_ups[i + 1], (size_t)(t->n_copy_ups - i - 1) * sizeof *t->copy_ups);
    t->n_copy_ups--;
    if (i < t->n_ups_sent) t->n_ups_sent--;
}

/* The blocks a restore read from below tier 0 (RAM) are copied up into it
 * from their pool slots once it is done: SAVEs into tier 0 alone, in runs
 * of consecutive positions of at most promote_max blocks (a promote's
 * size, so a load arriving meanwhile waits for one such put at most),
 * served with the promotes, after the loads, and holding their slots
 * until done. So the next restore of this history reads RAM, as after a
 * promote, while this one read each byte from disk once and waited for no
 * copy. A restore that ends inside a pass (tiers_wait_layer) has its
 * copies kept until that pass is over (copy_up_flush): the pass is still
 * computing the restoring request's first token, and the copy would take
 * a core from it. An admission that needs the slots they hold takes back
 * those the mover has not begun (tiers_withdraw_copy_ups). */
static void copy_up(EngineTiers *t, const Load *ld, const MoverJob *j) {
    if (t->promote_max == 0) return; /* no RAM tier 0 above a slower one */
    const int bt = t->pool->block_tokens, max = t->promote_max;
    Hash128 hs[SAVE_MAX_RUN];
    int32_t ss[SAVE_MAX_RUN], pos = 0;
    int n = 0;
    for (int k = 0; k <= j->n; k++) {
        bool take = k < j->n && is_copied_up(t, j, k);
        if (n > 0 && (!take || n == max || ld->pos[k] != pos + n * bt)) { /* the run ends */
            MoverJob *cj = save_job_new(t, hs, ss, n, pos, 1u);
            if (cj && !copy_up_keep(t, cj)) save_submit(t, cj); /* untracked: never taken back */
            n = 0;
        }
        if (!take) continue;
        if (n == 0) pos = ld->pos[k];
        hs[n] = j->hashes[k];
        ss[n++] = j->slots[k];
    }
    if (!t->is_in_pass) copy_up_flush(t);
}

/* Hand the copy-ups kept during a pass to the mover. */
static void copy_up_flush(EngineTiers *t) {
    int k = t->n_ups_sent;
    for (int i = t->n_ups_sent; i < t->n_copy_ups; i++) {
        MoverJob *j = t->copy_ups[i];
        if (t->mover != NULL && mover_submit(t->mover, j) == MN_OK) t->copy_ups[k++] = j;
        else save_drop(t, j);
    }
    t->n_copy_ups = t->n_ups_sent = k;
}

/* Slots of copy-up j that nothing else holds: taken back, they become
 * reclaimable. */
static int copy_up_gain(const EngineTiers *t, const MoverJob *j) {
    int n = 0;
    for (int k = 0; k < j->n; k++) n += t->pool->refcount[j->slots[k]] == 1;
    return n;
}

int tiers_withdraw_copy_ups(EngineTiers *t, int want) {
    int gain = 0; /* what every copy-up holds, begun or not */
    for (int i = 0; i < t->n_copy_ups; i++) gain += copy_up_gain(t, t->copy_ups[i]);
    if (gain < want) return 0; /* others hold the room: the copies stay, and the request waits */
    int n = 0;
    for (int i = t->n_copy_ups - 1; i >= 0 && n < want; i--) {
        MoverJob *j = t->copy_ups[i];
        if (i < t->n_ups_sent && mover_withdraw(t->mover, j) != MN_OK) continue; /* begun */
        n += copy_up_gain(t, j);
        copy_up_untrack(t, i);
        t->n_copy_up_withdrawn += (uint64_t)j->n;
        save_drop(t, j);
    }
    return n;
}

static void load_done(EngineTiers *t, Load *ld, MoverJob *j) {
    bool is_failed = j->rc != MN_OK || ld->is_bad;
    if (!is_failed) {
        /* its hidden rows of those layers may be saved again (the copy up
         * stores them so), while the load still holds the slots */
        for (int k = 0; k < j->n; k++) kvpool_note_hidden(t->pool, j->slots[k], j->block_hidden[k]);
        copy_up(t, ld, j);
    }
    for (int k = 0; k < j->n; k++) {
        int32_t slot = j->slots[k];
        t->slot_load[slot] = NULL;
        if (!is_failed) {
            t->n_restored++;
            t->n_restored_hidden_layers += (uint64_t)__builtin_popcountll(j->block_hidden[k]);
        } else {
            t->on_lost_fn(t->ctx, slot);
            index_remove_slot(t->index, slot);
            /* a block the failing tier could not give may not be in it any
             * more; a checksum failure names what it dropped (DROPPED,
             * before this DONE), and the rest of the batch is still there */
            if (j->tier[k] == j->failed_tier && j->rc != MN_ECHECKSUM)
                index_set_tiers(t->index, &j->hashes[k], 0, 1u << j->tier[k]);
        }
        kvpool_release(t->pool, slot);
    }
    if (is_failed) t->restore_failures++;
    Load **pp = &t->loads;
    while (*pp != ld) pp = &(*pp)->next;
    *pp = ld->next;
    if (t->loads_tail == ld) {
        t->loads_tail = NULL;
        for (Load *l = t->loads; l; l = l->next) t->loads_tail = l;
    }
    t->n_load_blocks -= j->n;
    load_free(ld);
}

CacheSource tiers_block_source(const EngineTiers *t, const Hash128 *h) {
    int32_t slot = index_lookup(t->index, h);
    if (slot < 0) return t->tier_src[best_tier(t, h)];
    const Load *ld = t->slot_load[slot];
    if (ld == NULL) return SRC_POOL;
    for (int k = 0; k < ld->job->n; k++)
        if (ld->job->slots[k] == slot) return t->tier_src[ld->job->tier[k]];
    return SRC_POOL;
}

uint64_t tiers_tokens_of_layers(uint64_t token_layers, int n_layer) {
    return (token_layers + (uint64_t)n_layer / 2) / (uint64_t)n_layer;
}

bool tiers_block_hidden(const EngineTiers *t, const Hash128 *h, uint64_t *hidden_layers) {
    int32_t slot = index_lookup(t->index, h);
    const Load *ld = slot >= 0 ? t->slot_load[slot] : NULL;
    if (ld == NULL || ld->layers_done == 0) return false;
    for (int k = 0; k < ld->job->n; k++)
        if (ld->job->slots[k] == slot) {
            *hidden_layers = ld->job->block_hidden[k];
            return true;
        }
    return false;
}

/* ---- the restore plan ---------------------------------------------------------------- */

void tiers_note_projection(EngineTiers *t, double seconds, int64_t n_token_layers) {
    if (n_token_layers <= 0 || !(seconds >= 0)) return;
    double s = seconds / (double)n_token_layers;
    t->proj_s = t->proj_s > 0 ? 0.8 * t->proj_s + 0.2 * s : s;
}

/* The layers a save stores as hidden states now (blocks that hold their
 * rows permitting): all eligible ones, or with the auto plan HCache's
 * split at the live figures — the slowest tier's read bandwidth (the chain
 * is inclusive: it holds every run) and the measured projection time —
 * as it holds when projections share the CPU with the pass
 * (restplan_split_shared: only layers that pay without overlap). Per
 * token: a run's size cancels out. */
static uint64_t hidden_plan(const EngineTiers *t) {
    if (!t->is_auto || t->hidden_layers == 0) return t->hidden_layers;
    const KvPool *p = t->pool;
    if (t->proj_s <= 0 || p->hidden_bytes >= p->block_bytes) return 0;
    double bw = tier_read_bw(t, t->n_tiers - 1);
    RestFigures f = {.kv_read_s = (double)p->block_bytes / p->block_tokens / bw,
                     .hidden_read_s = (double)p->hidden_bytes / p->block_tokens / bw,
                     .project_s = t->proj_s};
    return restplan_split_shared(&f, p->n_layer, t->hidden_layers);
}

/* ---- a step ---------------------------------------------------------------------- */

/* Whether a block of table s is still being restored up to layer. */
static bool is_waiting_for(const EngineTiers *t, const AttnSeq *s, int layer) {
    for (int b = 0; b < s->n_blocks; b++) {
        const Load *ld = t->slot_load[s->blocks[b]];
        if (ld && ld->layers_done <= layer) return true;
    }
    return false;
}

/* The read rate the planner takes for tier i now (read_bw_of). */
static double tier_read_bw(const EngineTiers *t, int i) {
    MoverTierStats ms;
    mover_stats(t->mover, i, &ms);
    return read_bw_of(t, i, &ms);
}

/* Seconds a load has left: its remaining layers read at its tier's
 * measured bandwidth, each at its size (K/V or hidden), and the layers
 * that arrive as hidden states projected at the measured time per token
 * and layer as they come, overlapping the later reads (restplan.h). Which
 * layers those are is known once its first layer came
 * (MoverJob.block_hidden); until then guess is: the layers the plan
 * stores as hidden now (hidden_plan). */
static double load_left_s(const EngineTiers *t, const Load *ld, uint64_t guess) {
    const KvPool *p = t->pool;
    const MoverJob *j = ld->job;
    const double bw = tier_read_bw(t, j->tier[0]);
    RestPipe pipe = {0};
    for (int l = ld->layers_done; l < p->n_layer; l++) {
        int n_hidden = 0;
        for (int k = 0; k < j->n && l < KVPOOL_HIDDEN_MAX_LAYERS; k++)
            n_hidden += (int)((ld->layers_done > 0 ? j->block_hidden[k] : guess) >> l & 1);
        double bytes = (double)n_hidden * p->hidden_bytes + (double)(j->n - n_hidden) * p->block_bytes;
        restplan_layer(&pipe, bytes / bw, (double)n_hidden * p->block_tokens * t->proj_s);
    }
    return restplan_end(&pipe);
}

/* Each load's eta_s: the loads ahead of it in the mover's queue count
 * too (it serves them in order). Once a step, for all its sequences. */
static void loads_eta(EngineTiers *t) {
    const uint64_t guess = hidden_plan(t);
    double eta = 0;
    for (Load *ld = t->loads; ld; ld = ld->next) ld->eta_s = eta += load_left_s(t, ld, guess);
}

/* Seconds until the restores of table s are expected to be done (after
 * loads_eta): its last load's. */
static double restore_eta(const EngineTiers *t, const AttnSeq *s) {
    double last = 0;
    for (int b = 0; b < s->n_blocks; b++) {
        const Load *ld = t->slot_load[s->blocks[b]];
        if (ld && ld->eta_s > last) last = ld->eta_s;
    }
    return last;
}

/* Which running sequences sit out this step: those still restoring whose
 * loads are not expected to finish within the step's compute, unless no
 * other sequence has work (then waiting per layer costs no one). */
void tiers_plan_step(EngineTiers *t, const AttnSeq *seqs, int n, bool *is_held_back) {
    bool any_ready = false, has_etas = false;
    for (int i = 0; i < n; i++) {
        bool is_restoring = t->n_load_blocks > 0 && is_waiting_for(t, &seqs[i], t->pool->n_layer - 1);
        if (is_restoring && !has_etas) {
            loads_eta(t);
            has_etas = true;
        }
        is_held_back[i] = is_restoring && restore_eta(t, &seqs[i]) > t->step_s;
        if (!is_held_back[i]) any_ready = true;
    }
    if (!any_ready)
        for (int i = 0; i < n; i++) is_held_back[i] = false;
    t->step_wait_s = 0;
}

bool tiers_is_restoring(const EngineTiers *t) { return t->n_load_blocks > 0; }

/* The time waited is kept apart from the pass's compute time (step_s),
 * which tiers_plan_step compares restores with. */
void tiers_wait_layer(EngineTiers *t, const AttnSeq *seqs, int n, int layer) {
    for (;;) {
        bool is_waiting = false;
        for (int i = 0; i < n && !is_waiting; i++) is_waiting = is_waiting_for(t, &seqs[i], layer);
        if (!is_waiting) return;
        double t0 = tiers_now(t, ENGINE_CLOCK_WAIT);
        t->is_in_pass = true;
        tiers_take_events(t, true);
        t->is_in_pass = false;
        t->step_wait_s += tiers_now(t, ENGINE_CLOCK_WAIT) - t0;
    }
}

double tiers_step_done(EngineTiers *t, double pass_s) {
    copy_up_flush(t);
    double compute_s = pass_s - t->step_wait_s;
    t->step_s = 0.7 * t->step_s + 0.3 * compute_s;
    return compute_s;
}

void tiers_expire(EngineTiers *t) {
    double shift = engine_clock_shift(t->hooks, ENGINE_CLOCK_EXPIRY), now = mn_now() + shift;
    if (t->mover == NULL || now - t->t_tier_expire < 1.0) return;
    t->t_tier_expire = now;
    MoverJob *j = mover_job_new(MOVER_EXPIRE, 0, 0);
    if (j == NULL) return;
    j->cutoff = mn_wall_now() + shift - t->cache_ttl_s;
    if (mover_submit(t->mover, j) != MN_OK) mover_job_free(j);
}

/* ---- a request's tier state ------------------------------------------------------- */

TierSeq *tiers_seq_new(EngineTiers *t, const Hash128 *hashes, Hash128 ns_id, uint64_t conv) {
    (void)t;
    TierSeq *ts = mn_calloc(1, sizeof *ts);
    if (ts == NULL) return NULL;
    ts->hashes = hashes;
    ts->ns_id = ns_id;
    ts->conv = conv;
    return ts;
}

void tiers_seq_free(EngineTiers *t, TierSeq *ts, const Seq *seq, int n_hashed) {
    if (ts == NULL) return;
    if (ts->probe) ts->probe->owner = NULL; /* (the mover never reads owner) */
    for (Promote *pr = t->promotes; pr && ts->n_promotes > 0; pr = pr->next)
        if (pr->ts == ts) {
            pr->ts = NULL;
            ts->n_promotes--;
        }
    save_seq(t, ts, seq, n_hashed);
    mn_free(ts);
}

void tiers_persist_reply(EngineTiers *t, const TierSeq *ts, const Hash128 *key, const char *text, size_t len,
                         const int32_t *ids, size_t n_ids) {
    if (t->mover == NULL) return;
    MoverJob *j = mover_job_new(MOVER_REPLY, 0, 0);
    if (j == NULL) return;
    j->key = *key;
    j->ns_id = ts->ns_id;
    j->text = mn_strndup(text, len);
    j->text_len = len;
    j->ids = mn_malloc((n_ids ? n_ids : 1) * sizeof *j->ids);
    j->n_ids = n_ids;
    j->when = mn_wall_now();
    if (j->text && j->ids) memcpy(j->ids, ids, n_ids * sizeof *j->ids);
    if (!j->text || !j->ids || mover_submit(t->mover, j) != MN_OK) mover_job_free(j);
}

void tiers_turn_ended(EngineTiers *t, const TierSeq *ts, const Seq *seq, int n_hashed, int n_tokens) {
    if (t->mover == NULL) return;
    int n_full = full_blocks(seq, n_hashed);
    MoverJob *j = mover_job_new(MOVER_CONV, n_full, 0);
    if (j == NULL) return;
    j->n = 0; /* the blocks a tier holds */
    for (int i = 0; i < n_full; i++)
        if (index_tiers(t->index, &ts->hashes[i]) != 0) j->hashes[j->n++] = ts->hashes[i];
    if (ts->conv == 0 && j->n == 0) {
        mover_job_free(j);
        return;
    }
    j->conv = ts->conv;
    j->ns_id = ts->ns_id;
    j->n_tokens = n_tokens;
    j->when = mn_wall_now();
    if (mover_submit(t->mover, j) != MN_OK) mover_job_free(j);
}

/* ---- the look-ahead window: prefetch and promotes ------------------------------------ */

int tiers_promote_room(const EngineTiers *t) { return t->promote_room; }

void tiers_window_begin(EngineTiers *t) { t->window = t->window_last = NULL; }

void tiers_window_add(EngineTiers *t, TierSeq *ts, int first, int end) {
    ts->win_first = first;
    ts->win_end = end;
    ts->win_next = NULL;
    if (t->window_last) t->window_last->win_next = ts;
    else t->window = ts;
    t->window_last = ts;
}

void tiers_send_window(EngineTiers *t) {
    if (t->mover == NULL || !policy_uses_window(t->evict)) return;
    Hasher hs;
    hasher_init(&hs);
    int n = 0, idx = 0;
    for (const TierSeq *ts = t->window; ts; ts = ts->win_next, idx++) {
        hasher_u32(&hs, (uint32_t)idx);
        hasher_u32(&hs, (uint32_t)(ts->win_end - ts->win_first));
        if (ts->win_end > ts->win_first)
            hasher_update(&hs, &ts->hashes[ts->win_first], (size_t)(ts->win_end - ts->win_first) * sizeof(Hash128));
        n += ts->win_end - ts->win_first;
    }
    Hash128 digest = hasher_final(&hs);
    if (hash128_eq(&digest, &t->window_sent)) return;
    MoverJob *j = mover_job_new(MOVER_WINDOW, n, 0);
    if (j == NULL) return; /* the tiers keep the previous window */
    int k = 0;
    idx = 0;
    for (const TierSeq *ts = t->window; ts; ts = ts->win_next, idx++)
        for (int b = ts->win_first; b < ts->win_end; b++, k++) {
            j->hashes[k] = ts->hashes[b];
            j->slots[k] = idx;
        }
    if (mover_submit(t->mover, j) != MN_OK) mover_job_free(j);
    else t->window_sent = digest;
}

void tiers_prefetch(EngineTiers *t, const TierSeq *ts, int first, int end) {
    if (t->mover == NULL) return;
    int at[SAVE_MAX_RUN];
    int n = 0;
    for (int b = first; b < end && n < SAVE_MAX_RUN; b++)
        if (index_lookup(t->index, &ts->hashes[b]) < 0) at[n++] = b;
    if (n > 0 && kvpool_n_free(t->pool) - n >= t->reserve_blocks && start_load(t, ts, at, n, true) == MN_OK)
        t->n_prefetched += (uint64_t)n;
}

/* Submit one PROMOTE of ts's blocks at[0..n) (consecutive, each held only
 * by tiers below tier 0 and in no pool slot). */
static void promote_blocks(EngineTiers *t, TierSeq *ts, const int *at, int n) {
    Promote *pr = mn_calloc(1, sizeof *pr);
    MoverJob *j = mover_job_new(MOVER_PROMOTE, n, 0);
    if (pr == NULL || j == NULL) { /* the blocks are read from disk at admission */
        mn_free(pr);
        mover_job_free(j);
        return;
    }
    for (int k = 0; k < n; k++) {
        j->hashes[k] = ts->hashes[at[k]];
        j->tier[k] = (uint8_t)best_tier(t, &ts->hashes[at[k]]);
    }
    j->pos = at[0] * t->pool->block_tokens;
    j->ns_id = ts->ns_id;
    j->owner = pr;
    if (mover_submit(t->mover, j) != MN_OK) {
        mn_free(pr);
        mover_job_free(j);
        return;
    }
    *pr = (Promote){.job = j, .ts = ts, .id = ++t->promote_ids, .next = t->promotes};
    if (ts->first_promote == 0) ts->first_promote = pr->id;
    t->promotes = pr;
    t->n_promotes++;
    ts->n_promotes++;
}

/* Take pr off the list of promotes in flight and free it (not its job). */
static void promote_unlink(EngineTiers *t, Promote *pr) {
    Promote **pp = &t->promotes;
    while (*pp != pr) pp = &(*pp)->next;
    *pp = pr->next;
    if (pr->ts) pr->ts->n_promotes--;
    t->n_promotes--;
    mn_free(pr);
}

/* Whether block b of ts is to be promoted: in no pool slot, and only
 * tiers below tier 0 hold it. */
static bool is_promotable(const EngineTiers *t, const TierSeq *ts, int b) {
    return index_lookup(t->index, &ts->hashes[b]) < 0 && best_tier(t, &ts->hashes[b]) > 0;
}

/* Copy ts's promotable blocks of its cached run into tier 0, a run of
 * consecutive blocks per PROMOTE. Once per request: blocks tier 0 evicts
 * again are read from disk at admission. */
static void promote_request(EngineTiers *t, TierSeq *ts) {
    ts->is_promoted = true;
    int at[SAVE_MAX_RUN], n = 0;
    for (int b = ts->win_first; b <= ts->win_end; b++) {
        bool take = b < ts->win_end && is_promotable(t, ts, b);
        if (n > 0 && (!take || n == t->promote_max)) {
            promote_blocks(t, ts, at, n);
            n = 0;
        }
        if (take) at[n++] = b;
    }
}

/* Scheduler-aware prefetch into RAM (AttentionStore): the cached history
 * of the window's requests that only the disk holds is copied into the
 * RAM tier, so their restores at admission read RAM. The promotes go out
 * together, once the blocks pending would fill one PROMOTE (promote_max)
 * or one belongs to a request next in line (within the first --parallel
 * of the window): fewer and larger disk reads, since a disk pays a fixed
 * delay per burst before its first byte, so larger bursts come nearer its
 * streaming rate (docs/OPERATIONS.md, "Figures behind the tier
 * defaults"). */
void tiers_promote_window(EngineTiers *t) {
    TierSeq *window = t->window;
    tiers_window_begin(t); /* the window is over */
    if (t->promote_max == 0) return;
    int pending = 0, idx = 0;
    bool is_due = false;
    for (const TierSeq *ts = window; ts; ts = ts->win_next, idx++) {
        if (ts->is_promoted) continue;
        int n = 0;
        for (int b = ts->win_first; b < ts->win_end; b++) n += is_promotable(t, ts, b);
        pending += n;
        if (n > 0 && idx < t->parallel) is_due = true;
    }
    if (pending == 0 || (pending < t->promote_max && !is_due)) return;
    for (TierSeq *ts = window; ts; ts = ts->win_next)
        if (!ts->is_promoted) promote_request(t, ts);
}

/* A request waits for a promote of its history only while the mover is
 * running it (reading, or putting into RAM), and only for the first batch
 * of its promotes (the one holding its first): one staging pool's worth
 * at most, which its load would queue behind anyway, and a restore
 * planned now would read those bytes from disk a second time. The mover
 * takes the next batch as soon as one ends, before the engine can admit
 * the request; waiting for that one too waited for the whole history to
 * be copied into RAM before reading it from there (five seconds for 1.4
 * GB on this machine kind, where reading it from disk takes 1.4 s). The
 * promotes the mover has not taken yet hold no one back: admission
 * withdraws them (tiers_seq_admitted). */
bool tiers_is_promoting(const EngineTiers *t, const TierSeq *ts) {
    if (t->n_promotes == 0 || ts->n_promotes == 0) return false;
    for (const Promote *pr = t->promotes; pr; pr = pr->next)
        if (pr->id == ts->first_promote) return mover_is_taken(t->mover, pr->job);
    return false; /* the first batch is done */
}

/* ts is admitted and its restore planned: the blocks of its promotes still
 * queued are read from where they are by that restore (and copied up into
 * RAM from the pool after it: copy_up), so the promotes are withdrawn —
 * run, they would read the same bytes from disk a second time. One the
 * mover took meanwhile ends as usual. */
void tiers_seq_admitted(EngineTiers *t, TierSeq *ts) {
    if (ts == NULL || ts->n_promotes == 0) return;
    for (Promote *pr = t->promotes, *next; pr; pr = next) {
        next = pr->next;
        if (pr->ts != ts || mover_withdraw(t->mover, pr->job) != MN_OK) continue;
        mover_job_free(pr->job);
        promote_unlink(t, pr);
    }
}

/* Tier 0 holds a promote's blocks now (reported after the evictions its
 * put made, so later drops find the record). A failed promote changes
 * nothing: the blocks are read from where they are at admission. */
static void promote_done(EngineTiers *t, const MoverJob *j) {
    promote_unlink(t, j->owner);
    if (j->rc != MN_OK) return;
    for (int i = 0; i < j->n; i++)
        if (index_set_tiers(t->index, &j->hashes[i], 1u, 0) != MN_OK)
            LOG_WARN("out of memory recording a promoted block");
    t->n_promoted += (uint64_t)j->n;
}

/* ---- the shared tier: probes ---------------------------------------------------------- */

void tiers_probe(EngineTiers *t, TierSeq *ts, int n) {
    if (t->shared < 0 || ts->is_probed) return;
    ts->is_probed = true;
    int n_want = 0;
    for (int i = 0; i < n; i++) n_want += !index_has(t->index, &ts->hashes[i]);
    if (n_want == 0) return;
    MoverJob *j = mover_job_new(MOVER_PROBE, n, 0);
    if (j == NULL) return; /* served without looking: its blocks are computed */
    memcpy(j->hashes, ts->hashes, (size_t)n * sizeof *j->hashes);
    for (int i = 0; i < n; i++) /* slots (which the mover leaves alone) keep what was asked */
        j->tier[i] = (uint8_t)(j->slots[i] = !index_has(t->index, &ts->hashes[i]));
    j->ns_id = ts->ns_id;
    j->owner = ts;
    if (mover_submit(t->mover, j) != MN_OK) {
        mover_job_free(j);
        return;
    }
    ts->probe = j;
    t->n_probes++;
    t->n_probed += (uint64_t)n_want;
}

bool tiers_is_probing(const EngineTiers *t, const TierSeq *ts) { return ts->probe != NULL; }

/* The shared tier holds the blocks the probe marks (reported after the
 * evictions its adoptions made, so later drops find the record). */
static void probe_done(EngineTiers *t, MoverJob *j) {
    t->n_probes--;
    TierSeq *ts = j->owner;
    if (ts) ts->probe = NULL;
    for (int k = 0; k < j->n; k++) {
        if (!j->tier[k]) continue;
        t->n_probe_found += j->slots[k] != 0;
        if (index_set_tiers(t->index, &j->hashes[k], 1u << t->shared, 0) != MN_OK)
            LOG_WARN("out of memory recording a block found in the shared tier");
    }
}

/* ReplyFetchFn of the reply memory (on a thread building a prompt): a
 * REPLY_FETCH job, waited for; the mover puts what it finds into the
 * reply memory. Nothing found, or no answer, leaves the prompt to be
 * tokenized as usual. */
static void fetch_replies(void *ctx, const Hash128 *ns_id, const char *const *texts, const size_t *lens, int n) {
    EngineTiers *t = ctx;
    MoverJob *j = mover_job_new(MOVER_REPLY_FETCH, 0, 0);
    if (j == NULL) return;
    MoverWaiter w = {.is_done = false};
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.cond, NULL);
    j->n = n;
    j->texts = texts;
    j->lens = lens;
    j->ns_id = *ns_id;
    j->waiter = &w;
    if (mover_submit(t->mover, j) == MN_OK) {
        pthread_mutex_lock(&w.lock);
        while (!w.is_done) pthread_cond_wait(&w.cond, &w.lock);
        pthread_mutex_unlock(&w.lock);
    }
    mover_job_free(j);
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.lock);
}

/* ---- life cycle -------------------------------------------------------------------- */

/* A reopened tier holds these blocks (mover_new, before any request). */
static void on_tier_held(void *ctx, int tier, const Hash128 *hashes, int n) {
    EngineTiers *t = ctx;
    for (int i = 0; i < n; i++)
        if (index_set_tiers(t->index, &hashes[i], 1u << tier, 0) != MN_OK) LOG_WARN("out of memory indexing tiers");
}

/* The mover and the tiers below the pool the options ask for. */
static int start_mover(EngineTiers *t, const TiersConfig *cfg, MnErr *err) {
    const EngineOptions *op = cfg->opt;
    bool has_disk = op->disk_tier_dir && op->disk_tier_dir[0], has_redis = op->n_redis_urls > 0;
    if (op->ram_tier_mb == 0 && !has_disk && !has_redis) return MN_OK;
    if (t->index == NULL) return mn_err_set(err, MN_EINVAL, "cache tiers need the prefix cache");
    MoverConfig mc = {.pool = t->pool,
                      .ram_bytes = op->ram_tier_mb << 20,
                      .disk_dir = has_disk ? op->disk_tier_dir : NULL,
                      .disk_bytes = (op->disk_tier_mb ? op->disk_tier_mb : ENGINE_DISK_TIER_MB_DEFAULT) << 20,
                      .model_fingerprint = cfg->model_fingerprint,
                      .kv_format = cfg->kv_format,
                      .is_durable = true,
                      .redis_urls = op->redis_urls,
                      .n_redis_urls = op->n_redis_urls,
                      .redis_cluster = op->redis_cluster,
                      .redis_ttl_s = op->redis_ttl_s,
                      .redis_timeout_ms = op->redis_timeout_ms,
                      .on_event = on_mover_event,
                      .event_ctx = t,
                      .on_held = on_tier_held,
                      .held_ctx = t,
                      .replies = cfg->replies,
                      .max_replies = cfg->max_replies,
                      .evict = op->evict,
                      .cost = slotpol_cost(t->slots),
                      .measure_reads = op->measure_tiers,
                      .hooks = op->mover_hooks};
    int rc = mover_new(&mc, &t->mover, err);
    if (rc != MN_OK) return rc;
    t->n_tiers = mover_n_tiers(t->mover);
    t->shared = mover_shared_tier(t->mover);
    if (t->shared >= 0 && cfg->replies) { /* conversations keep their ids on every instance */
        t->replies = cfg->replies;
        replymem_set_fetch(t->replies, fetch_replies, t);
    }
    for (int i = 0; i < t->n_tiers; i++) {
        const char *name = mover_tier_name(t->mover, i);
        t->tier_src[i] = strcmp(name, "ram") == 0 ? SRC_RAM : strcmp(name, "redis") == 0 ? SRC_REDIS : SRC_DISK;
    }
    /* promotes go into a RAM tier 0 with a slower tier under it */
    int max = mover_promote_max_blocks(t->mover);
    if (max > 0 && t->tier_src[0] == SRC_RAM) {
        t->promote_max = max < SAVE_MAX_RUN ? max : SAVE_MAX_RUN;
        t->promote_room = (int)(mc.ram_bytes / ((uint64_t)t->pool->n_layer * t->pool->block_bytes));
    }
    return MN_OK;
}

int tiers_new(const TiersConfig *cfg, EngineTiers **out, MnErr *err) {
    *out = NULL;
    EngineTiers *t = mn_calloc(1, sizeof *t);
    if (t == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    const EngineOptions *op = cfg->opt;
    t->pool = cfg->pool;
    t->index = cfg->index;
    t->slots = cfg->slots;
    t->hooks = op->test_hooks;
    t->evict = op->evict;
    t->parallel = op->parallel;
    t->reserve_blocks = cfg->reserve_blocks;
    t->cache_ttl_s = op->cache_ttl_s;
    t->lock = cfg->lock;
    t->cond = cfg->cond;
    t->on_lost_fn = cfg->on_lost_fn;
    t->on_restored_fn = cfg->on_restored_fn;
    t->ctx = cfg->ctx;
    t->hidden_layers = cfg->hidden_layers;
    t->is_auto = cfg->is_auto;
    t->project_fn = cfg->project_fn;
    t->step_s = 0.05;
    t->shared = -1;
    t->swap_watermark = op->swap_watermark;
    t->watermark_blocks = (int)(op->swap_watermark * (float)t->pool->n_blocks);
    size_t nb = (size_t)t->pool->n_blocks;
    t->slot_load = mn_calloc(nb, sizeof *t->slot_load);
    t->slot_saving = mn_calloc(nb, 1);
    t->cold = mn_malloc(nb * sizeof *t->cold);
    bool ok = t->slot_load && t->slot_saving && t->cold;
    int rc = ok ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
    if (rc == MN_OK) rc = start_mover(t, cfg, err);
    if (rc != MN_OK) {
        tiers_free(t);
        return rc;
    }
    *out = t;
    return MN_OK;
}

bool tiers_is_on(const EngineTiers *t) { return t->mover != NULL; }

CacheStore *tiers_store(const EngineTiers *t) { return t->mover ? mover_store(t->mover) : NULL; }

void tiers_free(EngineTiers *t) {
    if (t == NULL) return;
    if (t->replies) replymem_set_fetch(t->replies, NULL, NULL);
    if (t->mover) {
        mover_free(t->mover);
        t->mover = NULL;
        t->project_fn = NULL; /* the restores left are dropped with the engine */
        tiers_take_events(t, false); /* (copy-ups kept now only let their slots go) */
    }
    mn_free(t->copy_ups);
    mn_free(t->slot_load);
    mn_free(t->slot_saving);
    mn_free(t->cold);
    mn_free(t);
}
