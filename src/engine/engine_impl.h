/* engine_impl.h — the serving engine's private state, shared by its two
 * files: engine.c (requests, scheduling, the step loop) and engine_tiers.c
 * (the tiers below the pool: saves, restores, prefetch, persistence). Only
 * those two include it; everything here belongs to the engine thread
 * unless a comment names a lock. See engine.h for the public contract.
 */
#ifndef MN_ENGINE_IMPL_H
#define MN_ENGINE_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/clock.h"
#include "cache/index.h"
#include "cache/kv_pool.h"
#include "cache/mover.h"
#include "cache/policy.h"
#include "engine/engine.h"
#include "engine/forward.h"
#include "engine/seq.h"
#include "model/tokenizer.h"

#define ENGINE_MAX_REPLIES 4096 /* reply memory entries, in RAM and in the database */

typedef enum MsgKind { MSG_SUBMIT, MSG_CANCEL } MsgKind;

typedef struct Msg {
    MsgKind kind;
    Request *req; /* one reference travels with the message */
    struct Msg *next;
} Msg;

/* A generated token's logprobs waiting for the end of its text to be
 * emitted: bytes [start, end) of the token stream's output for this reply. */
typedef struct HeldLogprob {
    ReqLogprob rec;
    size_t start, end;
} HeldLogprob;

/* A request being served: owned by the engine thread. */
typedef struct Active {
    Request *req;
    uint64_t arrival;        /* order of arrival */
    double t_submit, t_first;
    Hash128 ns_id;
    uint64_t conv;           /* conversation for the eviction policy: hash of
                                (namespace, session id), or 0 */
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
    HeldLogprob *lp_held;    /* with is_logprobs: records not handed out yet, in order */
    int n_lp_held, cap_lp_held;
    size_t n_text_bytes;     /* bytes of text the token stream gave so far */
    int32_t n_text_chars;    /* ... and their code points */
    bool is_stop_cut;        /* a stop string cut the text */
    bool is_completed;       /* the request has its answer; the Active only
                                finishes computing KV for the next turn */
    bool is_restore_failed;  /* a block it holds failed to restore: requeue it */
    bool is_held_back;       /* restoring, and not expected in time for this step */
    bool is_in_batch;        /* has tokens in this step's batch */
    int n_cached_by[SRC_COUNT]; /* n_cached split by source */
    int win_first, win_end;  /* mark_window's scratch: its cached run */
    bool is_promoted;        /* its cached run was offered to tier 0 (RAM)
                                while it waited: once per request */
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
    Hash128 *slot_ns;        /* its namespace: a tier records it with the
                                run (what a purge erases) */
    double *slot_inserted;   /* when it was indexed (computed or restored) */
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
    double step_s;           /* recent compute seconds per forward pass
                                (the time it waited for restores left out) */
    double step_wait_s;      /* this pass's wait for restored layers */
    uint64_t restore_failures;
    double t_tier_expire;    /* when the tiers were last asked to expire */
    uint64_t n_writebehind;  /* blocks copied down by the watermark */
    uint64_t n_prefetched;   /* blocks restored for the look-ahead window */
    uint64_t n_promoted;     /* blocks of the window copied into tier 0 (RAM) */
    int promote_max;         /* blocks per PROMOTE job; 0: no promotes */
    int promote_room;        /* blocks tier 0 holds, when it can take promotes */
    int n_promotes;          /* PROMOTE jobs in flight */
    double save_backoff_s;   /* after saves no tier took: wait this long ... */
    double t_save_retry;     /* ... until then (engine_now) before saving again */
    Hash128 window_sent;     /* digest of the window last sent to the tiers */
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
    float *lp_row;           /* (n_vocab) the row the sampler may change while the raw
                                one stays for a request's logprobs */
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

static inline EvictCand slot_cand(const Engine *e, int32_t s) {
    return (EvictCand){.id = (uint64_t)s,
                       .conv = e->slot_conv[s],
                       .pos = e->slot_pos[s],
                       .window_idx = e->slot_window[s],
                       .last_access = e->pool.cached_at[s],
                       .inserted = e->slot_inserted[s]};
}

/* Slot holds block i of a's sequence, just indexed: what the policies
 * need of it (position, conversation, insertion time for fifo), and its
 * namespace. */
static inline void note_block(Engine *e, int32_t slot, const Active *a, int i) {
    e->slot_pos[slot] = i * e->opt.block_tokens;
    e->slot_conv[slot] = a->conv;
    e->slot_ns[slot] = a->ns_id;
    e->slot_inserted[slot] = mn_now();
}

/* ---- engine_tiers.c ------------------------------------------------------------- */

/* Build the tiers and their mover when the options ask for any (the index
 * learns what a reopened disk tier holds); MN_OK with no tiers too. */
int tiers_start(Engine *e, MnErr *err);
/* After the engine thread is gone: the mover finishes what is queued, then
 * its last events are settled. */
void tiers_stop(Engine *e);
/* Handle the mover's events; with block, wait for at least one first. */
void tiers_take_events(Engine *e, bool block);
/* Save a's indexed full blocks that no tier holds yet (a turn ended). */
void tiers_save_active(Engine *e, Active *a);
/* Write-behind under the swap watermark. */
void tiers_save_cold(Engine *e);
/* Start restoring blocks at[0..n) of a (each held by a tier, in no pool
 * slot) into fresh slots, indexed at once; MN_EFULL when the pool lacks
 * slots (with free_only: FREE ones), MN_ENOMEM. */
int tiers_start_load(Engine *e, const Active *a, const int *at, int n, bool free_only);
/* Prefetch the blocks of waiting request a's cached run [first, end) that
 * only a tier holds into free slots. */
void tiers_prefetch(Engine *e, Active *a, int first, int end);
/* Copy the cached history (runs [win_first, win_end)) of the first len
 * waiting requests that is in no pool slot and only slower tiers hold into
 * tier 0 (RAM), in batches, once per request. */
void tiers_promote_window(Engine *e, int len);
/* Whether waiting request a is to wait for promotes in flight before
 * admission (rather than read the same blocks from disk twice). */
bool tiers_is_promoting(const Engine *e, const Active *a);
/* Whether moves are in flight whose end can let a waiting request in:
 * saves and loads hold pool slots, and a promote holds back the requests
 * whose history it copies (tiers_is_promoting). An engine with nothing
 * running waits for one of them before it calls a request unservable. */
bool tiers_is_moving(const Engine *e);
/* Where indexed block h comes from: the pool, or the tier restoring it. */
CacheSource tiers_block_source(const Engine *e, const Hash128 *h);
/* Hand the look-ahead window — the first len waiting requests, with their
 * cached runs [win_first, win_end) — to the tiers' eviction policy, when
 * it changed since the last time (a window policy only). */
void tiers_send_window(Engine *e, int len);
/* Mark which running sequences sit out this step (still restoring). */
void tiers_hold_back(Engine *e);
/* FwdBatch.wait_layer for a batch with restores in flight. */
void tiers_wait_layer(void *ctx, int layer);
/* Persist a finished reply's memory entry and its conversation's row. */
void tiers_persist_reply(Engine *e, const Hash128 *key, const Active *a);
void tiers_persist_conversation(Engine *e, const Active *a);
/* --cache-ttl in the tiers: at most once a second, ask the mover to drop
 * what is older. */
void tiers_expire(Engine *e);

/* What the test hooks add to a clock reading of this use (0 normally). */
static inline double engine_clock_shift(const Engine *e, EngineClockUse use) {
    const EngineTestHooks *hk = e->opt.test_hooks;
    return hk && hk->clock_shift_fn ? hk->clock_shift_fn(hk->ctx, use) : 0;
}

/* mn_now() as the engine reads it for this use. */
static inline double engine_now(const Engine *e, EngineClockUse use) { return mn_now() + engine_clock_shift(e, use); }

/* EngineTestHooks.step_fn, once the step's hold-backs are decided. */
static inline void engine_test_step(const Engine *e) {
    const EngineTestHooks *hk = e->opt.test_hooks;
    if (hk == NULL || hk->step_fn == NULL) return;
    int n_held_back = 0;
    for (int i = 0; i < e->n_running; i++) n_held_back += e->running[i]->is_held_back;
    hk->step_fn(hk->ctx, e->n_running, n_held_back);
}

#endif
