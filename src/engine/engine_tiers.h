/* engine_tiers.h — the tiers below the pool, as the scheduler sees them:
 * what moves between the pool and the RAM, disk and shared (redis) tiers
 * (saves, restores, prefetch, promotes into RAM, persistence, looking a
 * new request's blocks up in the shared tier), decided on the engine
 * thread and carried out by the mover (cache/mover.h).
 *
 * The scheduler (engine.c) owns the requests, their block tables and the
 * running set; EngineTiers owns everything about moves: the mover, the
 * restores in flight and which slots they write, the saves in flight,
 * write-behind's back-off, the window last sent to the tiers, the mover's
 * events and the per-sequence TierSeq (whether its history was promoted,
 * its cached run in the window). Neither reads the other's structs: the
 * scheduler passes block tables (Seq, AttnSeq) and hashes into these
 * calls, and the tiers report a lost slot through TiersConfig.on_lost_fn.
 *
 * Every call is made on the engine thread, except that the mover thread
 * queues its events under TiersConfig.lock (see tiers_has_events), and
 * tiers_snapshot, which any thread may call. With no
 * tier configured an EngineTiers still exists and every call is cheap and
 * does nothing (tiers_is_on says which).
 */
#ifndef MN_ENGINE_TIERS_H
#define MN_ENGINE_TIERS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hash.h"
#include "cache/index.h"
#include "cache/kv_pool.h"
#include "cache/reply_mem.h"
#include "compute/attention.h"
#include "engine/engine.h"
#include "engine/seq.h"
#include "engine/slot_policy.h"

typedef struct EngineTiers EngineTiers;
/* A request's tier state (tiers_seq_new), opaque to the scheduler. */
typedef struct TierSeq TierSeq;

typedef struct TiersConfig {
    KvPool *pool;            /* the engine's pool (borrowed; restores take slots of it) */
    BlockIndex *index;       /* the prefix cache (borrowed); NULL: tiers are refused */
    SlotPolicy *slots;       /* the eviction policy's facts (borrowed): restored blocks
                                are noted in it, write-behind ranks by it */
    ReplyMemory *replies;    /* borrowed: a disk tier reloads its entries into it; with
                                a shared tier it fetches other instances' from there */
    int max_replies;         /* reply memory entries a disk tier keeps */
    Hash128 model_fingerprint;
    uint32_t kv_format;      /* index_kv_format of the pool */
    const EngineOptions *opt; /* tier sizes, policy, watermark, TTL, parallel, hooks
                                 (read during tiers_new; test_hooks borrowed for good) */
    int reserve_blocks;      /* free slots prefetching leaves to running sequences */
    /* The engine's inbox lock and condition (borrowed): the mover's events
     * are queued under the lock and signal the condition, so the engine
     * thread sleeps on one condition for its messages and these events. */
    pthread_mutex_t *lock;
    pthread_cond_t *cond;
    /* A restore into slot failed (checksum, I/O, a block the tier no longer
     * has): the slot is unindexed and every sequence holding it must be
     * planned again, its KV there never used. Called on the engine thread
     * from tiers_take_events (so also from within tiers_wait_layer). */
    void (*on_lost_fn)(void *ctx, int32_t slot);
    /* A restore into slot is known to bring the layers hidden_layers as
     * hidden states and the others as K/V (hidden_layers 0: K/V only):
     * once per restored slot, as its load's first layer is taken (before
     * any pass reads it), for the scheduler's per-request count
     * (ReqResult.n_restored_by). May be NULL. */
    void (*on_restored_fn)(void *ctx, int32_t slot, uint64_t hidden_layers);
    void *ctx;               /* of on_lost_fn, on_restored_fn and project_fn */
    /* Hidden-state restore (docs/DESIGN.md, "Hidden-state restore"): the
     * layers a save stores as the pool's hidden states (the pool has
     * hidden arenas; 0: every layer as KV), and how a restored layer that
     * arrives as hidden states is projected into its blocks' K/V (block i
     * in slots[i], its first token at pos0[i]; fwd_project), on the engine
     * thread as the layer's LAYER event is taken, before any pass may read
     * it. A save stores a layer as hidden only when every block of the run
     * holds that layer's hidden rows (kvpool_hidden_layers). */
    uint64_t hidden_layers;
    /* With is_auto, a save stores only the first of hidden_layers as
     * hidden states, as many as make a restore's projections (at the
     * measured time per token and layer, tiers_note_projection) and its
     * reads (at the slowest tier's read bandwidth) end together: HCache's
     * bubble-free split, never slower than reading K/V alone by this
     * estimate. */
    bool is_auto;
    int (*project_fn)(void *ctx, int layer, const int32_t *slots, const int32_t *pos0, int n);
} TiersConfig;

/* ---- life cycle ---------------------------------------------------------------- */

/* Build the tiers the options ask for and their mover (the index learns
 * what a reopened disk tier holds), or an EngineTiers with none. MN_OK;
 * MN_EINVAL when tiers are asked for without an index; the mover's
 * errors; MN_ENOMEM. *out is NULL on failure. */
int tiers_new(const TiersConfig *cfg, EngineTiers **out, MnErr *err);
/* After the engine thread is gone: the mover finishes what is queued
 * (write-behind is flushed), its last events are settled (on_lost_fn may
 * run), and everything is freed. NULL is fine. */
void tiers_free(EngineTiers *t);
/* Whether any tier is below the pool. */
bool tiers_is_on(const EngineTiers *t);
/* The disk tier's database (cache/store.h); NULL without a disk tier.
 * Valid until tiers_free. */
CacheStore *tiers_store(const EngineTiers *t);

/* ---- the mover's events ---------------------------------------------------------- */

/* Whether events wait to be taken; the caller holds TiersConfig.lock (the
 * engine thread's sleep checks it with its inbox). */
bool tiers_has_events(const EngineTiers *t);
/* Handle the mover's events (restores progress or end, saves and promotes
 * end, tiers drop blocks); with block, wait for at least one first. */
void tiers_take_events(EngineTiers *t, bool block);
/* Whether moves are in flight whose end can let a waiting request in:
 * saves and restores hold pool slots, a promote holds back the requests
 * whose history it copies (tiers_is_promoting), and a probe the request it
 * looks up. An engine with nothing running waits for one of them before
 * it calls a request unservable. */
bool tiers_is_moving(const EngineTiers *t);
/* The tiers' counters and the mover's latest snapshots into st (n_tiers,
 * tiers, restore_failures, writebehind, prefetched and promoted blocks,
 * the shared tier's lookups). */
void tiers_stats(const EngineTiers *t, EngineStats *st);
/* The read rates the restore planner takes for a tier before it has a
 * figure of its own (neither restores so far nor the mover's start-up
 * measurement): RAM, and disk or Redis. */
#define TIERS_GUESS_RAM_BPS 4e9
#define TIERS_GUESS_BPS 1e9
/* Only the mover's latest snapshots (st->tiers) and the read rates the
 * planner takes from them (st->tier_read_bps): unlike the rest, callable
 * from any thread. */
void tiers_snapshot(const EngineTiers *t, EngineStats *st);

/* ---- a request's tier state ------------------------------------------------------- */

/* Tier state for a request whose chain hashes are hashes[] (borrowed: the
 * array must stay in place until tiers_seq_free), in namespace ns_id and
 * conversation conv (0: none). NULL when out of memory. */
TierSeq *tiers_seq_new(EngineTiers *t, const Hash128 *hashes, Hash128 ns_id, uint64_t conv);
/* The request gives its blocks back (finished, cancelled, failed): of the
 * first n_hashed blocks of its table seq (those whose hash is known), the
 * indexed ones no tier holds yet are saved down the chain, in runs; then
 * ts is freed. Call it before seq's references go. ts NULL is fine. */
void tiers_seq_free(EngineTiers *t, TierSeq *ts, const Seq *seq, int n_hashed);
/* A turn ended: the conversation's row (session, namespace, last
 * activity, n_tokens) goes to the database, and every tier run holding one
 * of its first n_hashed blocks (of seq) counts as used now — the runs of a
 * conversation age with the conversation, not with their last read. */
void tiers_turn_ended(EngineTiers *t, const TierSeq *ts, const Seq *seq, int n_hashed, int n_tokens);
/* A complete reply's reply memory entry (key -> text, ids), copied into
 * the database, so a restarted server still recognises its replies, and
 * to the shared tier, so other instances do. */
void tiers_persist_reply(EngineTiers *t, const TierSeq *ts, const Hash128 *key, const char *text, size_t len,
                         const int32_t *ids, size_t n_ids);

/* ---- the shared tier ----------------------------------------------------------------- */

/* Look ts's blocks [0, n) that the index does not know up in the shared
 * tier (redis), where other instances may have stored them: a PROBE job
 * whose answer marks the blocks found as held there. Once per request;
 * nothing without a shared tier. The hashes of those blocks must be set. */
void tiers_probe(EngineTiers *t, TierSeq *ts, int n);
/* Whether ts's probe is in flight: its admission waits for the answer
 * (which tiers_is_moving counts), so a history another instance stored is
 * restored rather than computed again. */
bool tiers_is_probing(const EngineTiers *t, const TierSeq *ts);

/* ---- admission --------------------------------------------------------------------- */

/* Start restoring blocks at[0..n) of ts (each held by a tier and in no pool
 * slot) into fresh slots, indexed at once so other requests share them;
 * the restore holds a reference on each slot until it is done, and the
 * caller retains them through the index. MN_OK (n == 0 too); MN_EFULL
 * when the pool lacks slots; MN_EINVAL when a block is not restorable;
 * MN_ENOMEM; on failure nothing was started. */
int tiers_start_load(EngineTiers *t, const TierSeq *ts, const int *at, int n);
/* Where indexed block h comes from: the pool, or the tier restoring it or
 * to restore it from. */
CacheSource tiers_block_source(const EngineTiers *t, const Hash128 *h);
/* Whether indexed block h, being restored, is known to come back with the
 * layers *hidden_layers as hidden states (0: every layer as K/V): once its
 * load's first layer came; false before (on_restored_fn says it later) or
 * when no restore writes it. */
bool tiers_block_hidden(const EngineTiers *t, const Hash128 *h, uint64_t *hidden_layers);
/* Tokens that token_layers (token times layer, summed) of an n_layer model
 * make: the share of restored tokens counted as hidden (restored_by),
 * rounded to the nearest. */
uint64_t tiers_tokens_of_layers(uint64_t token_layers, int n_layer);
/* Whether waiting request ts is to wait before admission for a promote of
 * its history that the mover is running now (rather than read the same
 * blocks from disk twice): for the first batch of its promotes, not the
 * ones after; a promote still queued does not hold it back. */
bool tiers_is_promoting(const EngineTiers *t, const TierSeq *ts);
/* ts was admitted (its restore planned): its promotes still queued are
 * withdrawn, since that restore reads their blocks from where they are
 * and copies them up into RAM after. ts NULL is fine. */
void tiers_seq_admitted(EngineTiers *t, TierSeq *ts);
/* An admission is short of want pool slots: take back copy-ups into RAM
 * (the blocks a restore read from below it) that the mover has not begun,
 * newest first, until want slots that only they held are reclaimable;
 * their blocks stay in the tiers they came from. The request then waits
 * for the copies under way at most. When all copy-ups together, begun or
 * not, would not make want (other requests hold the room), none is taken
 * back. Returns the slots made reclaimable. */
int tiers_withdraw_copy_ups(EngineTiers *t, int want);

/* ---- the look-ahead window ---------------------------------------------------------- */

/* Blocks tier 0 holds when it takes promotes (0: no promotes): the tiers'
 * window may count them as room. */
int tiers_promote_room(const EngineTiers *t);
/* Forget the last window and start a new one. */
void tiers_window_begin(EngineTiers *t);
/* The next waiting request of the window, in queue order, with the run of
 * its blocks found cached [first, end). ts stays in the window until the
 * next tiers_window_begin or tiers_promote_window; it must not be freed
 * before either. */
void tiers_window_add(EngineTiers *t, TierSeq *ts, int first, int end);
/* Hand the window to the tiers' eviction policy when it changed since the
 * last time (a window policy only), so what it will restore stays. */
void tiers_send_window(EngineTiers *t);
/* Prefetch: start restoring the blocks of waiting request ts's cached run
 * [first, end) that only a tier holds into FREE pool slots beyond the
 * decode reserve (never evicting), so they are in the pool, or on their
 * way, when it is admitted. */
void tiers_prefetch(EngineTiers *t, const TierSeq *ts, int first, int end);
/* Copy the window's cached history that is in no pool slot and only
 * slower tiers hold into tier 0 (RAM), in batches, once per request; then
 * the window is over (tiers_window_begin starts the next). Called after
 * admission, so only requests that still wait are promoted. */
void tiers_promote_window(EngineTiers *t);

/* ---- a step ---------------------------------------------------------------------- */

/* Write-behind: while free pool blocks (and cached ones a tier already
 * holds) are under the swap watermark, copy the coldest unsaved cached
 * blocks down the chain. */
void tiers_save_cold(EngineTiers *t);
/* Plan the step's forward pass over the running sequences' block tables
 * seqs[0..n): is_held_back[i] says whether sequence i sits out (it is
 * still restoring and not expected to finish within a pass's compute,
 * unless no sequence could run otherwise). Starts timing the pass's waits. */
void tiers_plan_step(EngineTiers *t, const AttnSeq *seqs, int n, bool *is_held_back);
/* Whether restores are in flight: a pass then waits per layer. */
bool tiers_is_restoring(const EngineTiers *t);
/* Before layer's attention: wait until every block of the batch's block
 * tables seqs[0..n) has that layer in place (or failed). */
void tiers_wait_layer(EngineTiers *t, const AttnSeq *seqs, int n, int layer);
/* The pass planned by tiers_plan_step took pass_s seconds, its waits for
 * restored layers included: restores are compared with its compute.
 * Returns that compute: pass_s without the waits. */
double tiers_step_done(EngineTiers *t, double pass_s);
/* --cache-ttl in the tiers: at most once a second, ask the mover to drop
 * what is older. */
void tiers_expire(EngineTiers *t);
/* A projection of hidden states took `seconds` for n_token_layers tokens
 * times layers (the engine's measurement at start-up; the tiers time the
 * projections of restores themselves): the auto plan's figure. */
void tiers_note_projection(EngineTiers *t, double seconds, int64_t n_token_layers);

#endif
