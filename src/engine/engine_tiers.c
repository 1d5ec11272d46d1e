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
 * (tiers_wait_layer). A failed restore (checksum, I/O, a block the tier no longer
 * has) unindexes its slots, and every sequence holding one goes back to
 * the queue to be planned again: what was lost is recomputed, never used.
 * Waiting requests in the look-ahead window get their history ahead of
 * time: into free pool slots (a Load), or from disk into the RAM tier (a
 * PROMOTE, which touches no pool slot), so their restore reads RAM. */

#include <math.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/engine_impl.h"

#define SAVE_MAX_RUN 32 /* blocks per SAVE job */

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
 * chain as one run whose first token sits at position pos (blocks of one
 * namespace: the first slot's). Blocks that cannot be saved now simply
 * stay unsaved. */
static void save_blocks(Engine *e, const Hash128 *hashes, const int32_t *slots, int n, int32_t pos) {
    if (n == 0) return;
    MoverJob *j = mover_job_new(MOVER_SAVE, n, 0);
    if (j == NULL) return;
    memcpy(j->hashes, hashes, (size_t)n * sizeof *hashes);
    memcpy(j->slots, slots, (size_t)n * sizeof *slots);
    j->pos = pos;
    j->ns_id = e->slot_ns[slots[0]];
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

/* How many of a's blocks are full and hashed: those a tier may hold. */
static int full_blocks(const Active *a) { return a->n_hashed < a->seq.n_blocks ? a->n_hashed : a->seq.n_blocks; }

/* Whether block h, in slot, is this slot's indexed copy that no tier holds
 * and nothing moves now. */
static bool is_unsaved(const Engine *e, const Hash128 *h, int32_t slot) {
    return index_lookup(e->index, h) == slot && index_tiers(e->index, h) == 0 && !e->slot_saving[slot] &&
           e->slot_load[slot] == NULL;
}

/* Save a's indexed full blocks that no tier holds yet, in runs of
 * consecutive blocks (at most SAVE_MAX_RUN each). */
void tiers_save_active(Engine *e, Active *a) {
    if (e->mover == NULL || engine_now(e, ENGINE_CLOCK_BACKOFF) < e->t_save_retry) return;
    Hash128 hs[SAVE_MAX_RUN];
    int32_t ss[SAVE_MAX_RUN];
    int n = 0, first = 0, n_full = full_blocks(a);
    for (int i = 0; i < n_full; i++) {
        int32_t slot = a->seq.blocks[i];
        bool take = is_unsaved(e, &a->hashes[i], slot);
        if (n > 0 && (!take || n == SAVE_MAX_RUN)) { /* the run ends */
            save_blocks(e, hs, ss, n, first * e->opt.block_tokens);
            n = 0;
        }
        if (!take) continue;
        if (n == 0) first = i;
        hs[n] = a->hashes[i];
        ss[n++] = slot;
    }
    save_blocks(e, hs, ss, n, first * e->opt.block_tokens);
}

/* Write-behind (the swap watermark): while free pool blocks plus cached
 * ones a tier already holds (reclaimable without I/O) are under the
 * watermark, copy the coldest unsaved cached blocks — in eviction-policy
 * order — down the chain, one batch in flight at a time, while compute
 * goes on: a run per conversation and namespace (its position the
 * smallest of its blocks'; conversation 0 is every request without a
 * session id, of any tenant). Their slots stay cached until the pool needs
 * them. */
void tiers_save_cold(Engine *e) {
    if (e->mover == NULL || e->n_save_blocks > 0 || engine_now(e, ENGINE_CLOCK_BACKOFF) < e->t_save_retry) return;
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
    bool taken[SAVE_MAX_RUN] = {false};
    for (int i = 0; i < k; i++) {
        if (taken[i]) continue;
        Hash128 hs[SAVE_MAX_RUN];
        int32_t ss[SAVE_MAX_RUN];
        int m = 0;
        int32_t pos = e->cands[idx[i]].pos;
        const Hash128 *ns = &e->slot_ns[e->cands[idx[i]].id];
        for (int j = i; j < k; j++) {
            const EvictCand *c = &e->cands[idx[j]];
            if (taken[j] || c->conv != e->cands[idx[i]].conv || !hash128_eq(&e->slot_ns[c->id], ns)) continue;
            taken[j] = true;
            ss[m] = (int32_t)c->id;
            hs[m++] = *index_slot_hash(e->index, (int32_t)c->id);
            if (c->pos < pos) pos = c->pos;
        }
        save_blocks(e, hs, ss, m, pos);
    }
    e->n_writebehind += (uint64_t)k;
}

static void save_done(Engine *e, MoverJob *j) {
    /* no tier took the run (full, failing): back off write-behind, doubling
     * up to a minute, so a full disk is not retried in a loop */
    if (j->rc != MN_OK) {
        e->save_backoff_s = e->save_backoff_s > 0 ? fmin(2 * e->save_backoff_s, 60) : 1;
        e->t_save_retry = engine_now(e, ENGINE_CLOCK_BACKOFF) + e->save_backoff_s;
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

/* Start restoring blocks at[0..n) of a, each held by a tier and in no
 * pool slot: a fresh slot for each, indexed at once (with what the
 * policies need of it) so other requests share the restore, and one LOAD
 * job. The load holds a reference on each slot until it is done. MN_EFULL
 * (nothing started) when the pool has too few slots; with free_only, only
 * FREE slots are taken (no eviction). */
int tiers_start_load(Engine *e, const Active *a, const int *at, int n, bool free_only) {
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
        const Hash128 *h = &a->hashes[at[k]];
        int tier = best_tier(e, h);
        if (tier < 0 || index_lookup(e->index, h) >= 0) rc = MN_EINVAL; /* the caller checked */
        else if ((rc = kvpool_alloc(&e->pool, &j->slots[k])) == MN_OK) {
            j->hashes[k] = *h;
            j->tier[k] = (uint8_t)tier;
            if (index_insert(e->index, h, j->slots[k]) != 1) {
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
    for (int i = 0; i < n; i++) {
        e->slot_load[j->slots[i]] = ld;
        note_block(e, j->slots[i], a, at[i]);
    }
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
            /* a block the failing tier could not give may not be in it any
             * more; a checksum failure names what it dropped (DROPPED,
             * before this DONE), and the rest of the batch is still there */
            if (j->tier[k] == j->failed_tier && j->rc != MN_ECHECKSUM)
                index_set_tiers(e->index, &j->hashes[k], 0, 1u << j->tier[k]);
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

/* Tier 0 holds a promote's blocks now (reported after the evictions its
 * put made, so later drops find the record). A failed promote changes
 * nothing: the blocks are read from where they are at admission. */
static void promote_done(Engine *e, const MoverJob *j) {
    e->n_promotes--;
    if (j->rc != MN_OK) return;
    for (int i = 0; i < j->n; i++)
        if (index_set_tiers(e->index, &j->hashes[i], 1u, 0) != MN_OK)
            LOG_WARN("out of memory recording a promoted block");
    e->n_promoted += (uint64_t)j->n;
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
        else if (j->kind == MOVER_PROMOTE) promote_done(e, j);
        mover_job_free(j);
        break;
    }
}

/* Handle the mover's events; with block, wait for at least one first. */
void tiers_take_events(Engine *e, bool block) {
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
 * every sequence in the batch have that layer in place (or failed). The
 * time waited is kept apart from the step's compute time (step_s), which
 * tiers_hold_back compares restores with. */
void tiers_wait_layer(void *ctx, int layer) {
    Engine *e = ctx;
    for (;;) {
        bool is_waiting = false;
        for (int i = 0; i < e->n_running && !is_waiting; i++)
            if (e->running[i]->is_in_batch) is_waiting = is_waiting_for(e, e->running[i], layer);
        if (!is_waiting) return;
        double t0 = engine_now(e, ENGINE_CLOCK_WAIT);
        tiers_take_events(e, true);
        e->step_wait_s += engine_now(e, ENGINE_CLOCK_WAIT) - t0;
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
void tiers_hold_back(Engine *e) {
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
void tiers_persist_reply(Engine *e, const Hash128 *key, const Active *a) {
    if (e->mover == NULL) return;
    MoverJob *j = mover_job_new(MOVER_REPLY, 0, 0);
    size_t n_ids = (size_t)(a->n_tokens - a->n_prompt);
    if (j == NULL) return;
    j->key = *key;
    j->ns_id = a->ns_id;
    j->text = mn_strndup(a->reply ? a->reply : "", a->n_reply);
    j->text_len = a->n_reply;
    j->ids = mn_malloc((n_ids ? n_ids : 1) * sizeof *j->ids);
    j->n_ids = n_ids;
    j->when = mn_wall_now();
    if (j->text && j->ids) memcpy(j->ids, a->tokens + a->n_prompt, n_ids * sizeof *j->ids);
    if (!j->text || !j->ids || mover_submit(e->mover, j) != MN_OK) mover_job_free(j);
}

/* A turn ended: the conversation's row (session id, namespace, last
 * activity, tokens), and every tier run holding one of its full blocks is
 * used now — the runs of a conversation age with the conversation, not
 * with their last read (Pensieve's time since it was last active). */
void tiers_persist_conversation(Engine *e, const Active *a) {
    if (e->mover == NULL) return;
    int n_full = full_blocks(a);
    MoverJob *j = mover_job_new(MOVER_CONV, n_full, 0);
    if (j == NULL) return;
    j->n = 0; /* the blocks a tier holds */
    for (int i = 0; i < n_full; i++)
        if (index_tiers(e->index, &a->hashes[i]) != 0) j->hashes[j->n++] = a->hashes[i];
    if (a->conv == 0 && j->n == 0) {
        mover_job_free(j);
        return;
    }
    j->conv = a->conv;
    j->ns_id = a->ns_id;
    j->n_tokens = a->n_tokens;
    j->when = mn_wall_now();
    if (mover_submit(e->mover, j) != MN_OK) mover_job_free(j);
}


/* Where block h (indexed) comes from: the pool, or the tier restoring it
 * or to restore it from. */
CacheSource tiers_block_source(const Engine *e, const Hash128 *h) {
    int32_t slot = index_lookup(e->index, h);
    if (slot < 0) return e->tier_src[best_tier(e, h)];
    const Load *ld = e->slot_load[slot];
    if (ld == NULL) return SRC_POOL;
    for (int k = 0; k < ld->job->n; k++)
        if (ld->job->slots[k] == slot) return e->tier_src[ld->job->tier[k]];
    return SRC_POOL;
}

/* Scheduler-aware prefetch: start restoring the blocks of waiting request
 * a (cached run [first, end)) that only a tier holds into free pool slots,
 * so they are in the pool, or on their way, when a is admitted. Takes only
 * FREE slots beyond the decode reserve: prefetching never evicts. */
void tiers_prefetch(Engine *e, Active *a, int first, int end) {
    if (e->mover == NULL) return;
    int at[SAVE_MAX_RUN];
    int n = 0;
    for (int b = first; b < end && n < SAVE_MAX_RUN; b++)
        if (index_lookup(e->index, &a->hashes[b]) < 0) at[n++] = b;
    if (n > 0 && kvpool_n_free(&e->pool) - n >= e->reserve_blocks && tiers_start_load(e, a, at, n, true) == MN_OK)
        e->n_prefetched += (uint64_t)n;
}

/* Submit one PROMOTE of a's blocks at[0..n) (consecutive, each held only
 * by tiers below tier 0 and in no pool slot). */
static void promote_blocks(Engine *e, const Active *a, const int *at, int n) {
    MoverJob *j = mover_job_new(MOVER_PROMOTE, n, 0);
    if (j == NULL) return; /* the blocks are read from disk at admission */
    for (int k = 0; k < n; k++) {
        j->hashes[k] = a->hashes[at[k]];
        j->tier[k] = (uint8_t)best_tier(e, &a->hashes[at[k]]);
    }
    j->pos = at[0] * e->opt.block_tokens;
    j->ns_id = a->ns_id;
    if (mover_submit(e->mover, j) != MN_OK) mover_job_free(j);
    else e->n_promotes++;
}

/* Whether block b of a is to be promoted: in no pool slot, and only
 * tiers below tier 0 hold it. */
static bool is_promotable(const Engine *e, const Active *a, int b) {
    return index_lookup(e->index, &a->hashes[b]) < 0 && best_tier(e, &a->hashes[b]) > 0;
}

/* Copy a's promotable blocks of its cached run into tier 0, a run of
 * consecutive blocks per PROMOTE. Once per request: blocks tier 0 evicts
 * again are read from disk at admission. */
static void promote_request(Engine *e, Active *a) {
    a->is_promoted = true;
    int at[SAVE_MAX_RUN], n = 0;
    for (int b = a->win_first; b <= a->win_end; b++) {
        bool take = b < a->win_end && is_promotable(e, a, b);
        if (n > 0 && (!take || n == e->promote_max)) {
            promote_blocks(e, a, at, n);
            n = 0;
        }
        if (take) at[n++] = b;
    }
}

/* Scheduler-aware prefetch into RAM (AttentionStore): the cached history
 * of the first len waiting requests that only the disk holds is copied
 * into the RAM tier, so their restores at admission read RAM. The
 * promotes go out together, once the blocks pending would fill one
 * PROMOTE (promote_max) or one belongs to a request next in line (within
 * the first --parallel of the window): fewer and larger disk reads, since
 * a disk pays a fixed delay per burst before its first byte, so larger
 * bursts come nearer its streaming rate (docs/OPERATIONS.md, "Figures
 * behind the tier defaults"). */
void tiers_promote_window(Engine *e, int len) {
    if (e->promote_max == 0) return;
    int pending = 0, idx = 0;
    bool is_due = false;
    for (Active *a = e->waiting; a && idx < len; a = a->next, idx++) {
        if (a->is_promoted) continue;
        int n = 0;
        for (int b = a->win_first; b < a->win_end; b++) n += is_promotable(e, a, b);
        pending += n;
        if (n > 0 && idx < e->opt.parallel) is_due = true;
    }
    if (pending == 0 || (pending < e->promote_max && !is_due)) return;
    idx = 0;
    for (Active *a = e->waiting; a && idx < len; a = a->next, idx++)
        if (!a->is_promoted) promote_request(e, a);
}

/* A request whose history was sent to RAM, while promotes are in flight
 * and some of its blocks are still only on disk, waits for them: a
 * promote takes milliseconds, and a restore planned now would read the
 * same bytes from disk a second time (loads go first). */
bool tiers_is_promoting(const Engine *e, const Active *a) {
    if (e->n_promotes == 0 || !a->is_promoted) return false;
    for (int b = a->win_first; b < a->win_end; b++)
        if (is_promotable(e, a, b)) return true;
    return false;
}

bool tiers_is_moving(const Engine *e) {
    return e->n_save_blocks + e->n_load_blocks > 0 || e->n_promotes > 0;
}

void tiers_send_window(Engine *e, int len) {
    if (e->mover == NULL || !policy_uses_window(e->opt.evict)) return;
    Hasher hs;
    hasher_init(&hs);
    int n = 0, idx = 0;
    for (Active *a = e->waiting; a && idx < len; a = a->next, idx++) {
        hasher_u32(&hs, (uint32_t)idx);
        hasher_u32(&hs, (uint32_t)(a->win_end - a->win_first));
        if (a->win_end > a->win_first)
            hasher_update(&hs, &a->hashes[a->win_first], (size_t)(a->win_end - a->win_first) * sizeof(Hash128));
        n += a->win_end - a->win_first;
    }
    Hash128 digest = hasher_final(&hs);
    if (hash128_eq(&digest, &e->window_sent)) return;
    MoverJob *j = mover_job_new(MOVER_WINDOW, n, 0);
    if (j == NULL) return; /* the tiers keep the previous window */
    int k = 0;
    idx = 0;
    for (Active *a = e->waiting; a && idx < len; a = a->next, idx++)
        for (int b = a->win_first; b < a->win_end; b++, k++) {
            j->hashes[k] = a->hashes[b];
            j->slots[k] = idx;
        }
    if (mover_submit(e->mover, j) != MN_OK) mover_job_free(j);
    else e->window_sent = digest;
}

/* A reopened tier holds these blocks (mover_new, before any request). */
static void on_tier_held(void *ctx, int tier, const Hash128 *hashes, int n) {
    Engine *e = ctx;
    for (int i = 0; i < n; i++)
        if (index_set_tiers(e->index, &hashes[i], 1u << tier, 0) != MN_OK) LOG_WARN("out of memory indexing tiers");
}

/* The tiers below the pool and their mover, when the options ask for any. */
int tiers_start(Engine *e, MnErr *err) {
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
                      .max_replies = ENGINE_MAX_REPLIES,
                      .evict = op->evict,
                      .cost = e->has_cost ? &e->cost : NULL,
                      .hooks = op->mover_hooks};
    op->disk_tier_dir = NULL; /* borrowed for engine_new only */
    int rc = mover_new(&mc, &e->mover, err);
    if (rc != MN_OK) return rc;
    e->n_tiers = mover_n_tiers(e->mover);
    for (int i = 0; i < e->n_tiers; i++)
        e->tier_src[i] = strcmp(mover_tier_name(e->mover, i), "ram") == 0 ? SRC_RAM : SRC_DISK;
    e->stats.n_tiers = e->n_tiers;
    /* promotes go into a RAM tier 0 with a slower tier under it */
    int max = mover_promote_max_blocks(e->mover);
    if (max > 0 && e->tier_src[0] == SRC_RAM) {
        e->promote_max = max < SAVE_MAX_RUN ? max : SAVE_MAX_RUN;
        e->promote_room = (int)(mc.ram_bytes / ((uint64_t)e->pool.n_layer * e->pool.block_bytes));
    }
    return MN_OK;
}

/* After the engine thread is gone: let the mover finish what is queued
 * (write-behind is flushed), then settle its last events. */
void tiers_stop(Engine *e) {
    if (e->mover == NULL) return;
    mover_free(e->mover);
    e->mover = NULL;
    tiers_take_events(e, false);
}

void tiers_expire(Engine *e) {
    double shift = engine_clock_shift(e, ENGINE_CLOCK_EXPIRY), now = mn_now() + shift;
    if (e->mover == NULL || now - e->t_tier_expire < 1.0) return;
    e->t_tier_expire = now;
    MoverJob *j = mover_job_new(MOVER_EXPIRE, 0, 0);
    if (j == NULL) return;
    j->cutoff = mn_wall_now() + shift - e->opt.cache_ttl_s;
    if (mover_submit(e->mover, j) != MN_OK) mover_job_free(j);
}

CacheStore *engine_store(Engine *e) { return e->mover ? mover_store(e->mover) : NULL; }
