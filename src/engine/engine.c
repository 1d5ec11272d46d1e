/* engine.c — the serving engine (see engine.h).
 *
 * Threads and ownership:
 *   - the engine thread owns the pool, the index, the Forward, and every
 *     Active (a request being served: its block table, sampler, token list);
 *   - other threads own their Request references; a Request's output channel
 *     (text, logprob records, done, result) is guarded by the Request's own
 *     mutex;
 *   - the inbox (submit/cancel/stop messages, and the mover's events) is
 *     guarded by the engine's inbox mutex; engine statistics by the stats
 *     mutex.
 *
 * What moves between the pool and the tiers below it (saves, restores,
 * prefetch, persistence) is decided by EngineTiers (engine_tiers.h), which
 * owns its own state; the scheduler tells it what happens to requests and
 * asks it what is loaded and who may run. What the eviction policy knows
 * of each pool slot is in SlotPolicy (slot_policy.h), which both use.
 *
 * Life of a request:
 *
 *   engine_submit --> inbox --> WAITING --admit--> RUNNING --finish--> done
 *                                 ^                  |
 *                                 +----suspend-------+  (pool full while decoding, or
 *                                                        every prompt waiting for room)
 *                                 +----preempt-------+  (its prompt far from done, every slot
 *                                                        taken, a much shorter one waiting)
 *
 * Admission looks up the longest cached prefix (full blocks, by chain hash:
 * in the pool, or in a tier to be restored), takes references on those
 * blocks and sizes the table for the rest of the prompt, whose blocks each
 * pass's chunk takes as it computes them (grow_chunk); the first of
 * those gets the rows a pool block after the same parent holds for its
 * tokens (a turn's partial last block, or a full block the prompt leaves
 * inside), copied, so only the tokens after them are computed; a chat cut
 * for context overflow in shift mode may instead move cached KV of its
 * kept turns from its sources' blocks to its own (ShiftMove, kv_shift.h;
 * done in the first pass that runs it). A request whose restore fails goes
 * back to the queue and is planned again. Each step: admission of waiting
 * requests by the scheduling policy, as long as the pool keeps its
 * reserve beside the blocks running prompts have yet to take
 * (promised_blocks); with a slot free, a waiting request with far fewer
 * tokens to compute than a running prompt may borrow that promised room
 * (borrow_room); with every slot taken, preemption of a long prompt for
 * such a request (preempt_prefills);
 * then the batch: the decode tokens of running sequences first,
 * then prefill chunks, the sequence with the fewest tokens left before its
 * first token first (a returning turn's few new tokens go ahead of a long
 * prompt's rest) — except that a prompt which got no chunk in
 * ENGINE_AGING_STEPS steps in a row goes first (aging: no admitted prompt
 * starves) — each chunk as long as the pacer predicts the pass to
 * stay within step_ms (engine/pacer.h; a few times that in a step where
 * nothing decodes; with decode_step_ratio, that many times the decodes' own
 * pass beside decodes when that is shorter), at most batch_tokens in all.
 * Whatever the decodes cost, the first chunk gets at least as long as the
 * rest of the step, so prompts always progress. The pass's measured
 * compute goes back to the pacer. After the forward pass, each sequence
 * whose last pending token was in the batch samples its next token; newly
 * completed full blocks are registered in the index. When a sequence ends
 * or is suspended, the filled part of its last block stays in the pool,
 * findable by its parent and tokens (keep_tail).
 */
#include "engine/engine.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/sched.h"
#include "base/stats.h"
#include "base/threadpool.h"
#include "cache/index.h"
#include "cache/kv_pool.h"
#include "engine/engine_tiers.h"
#include "engine/forward.h"
#include "engine/kv_shift.h"
#include "engine/pacer.h"
#include "engine/seq.h"
#include "engine/slot_policy.h"
#include "model/tokenizer.h"

/* Preemption of a running prefill (admit_waiting): a waiting request may
 * take the slot of a running one still in its prompt when the running one
 * has at least ENGINE_PREEMPT_RATIO times as many tokens left before its
 * first token, and at least ENGINE_PREEMPT_MIN_BLOCKS blocks of them (one
 * nearly done would leave its slot within a step or two anyway); a request
 * is preempted at most ENGINE_PREEMPT_MAX times, and only once it has run a
 * pass since it was last admitted. */
#define ENGINE_PREEMPT_RATIO 4
#define ENGINE_PREEMPT_MIN_BLOCKS 2
#define ENGINE_PREEMPT_MAX 2
/* Pool bytes the idle engine touches before it looks at its inbox again
 * (touch_pool): 16 MiB, 25-110 ms on the 2-core virtual machines. */
#define ENGINE_TOUCH_BYTES (16u << 20)
/* A step that holds no decode token protects no inter-token gap: its
 * prefill chunks are sized to this many times the step target instead, so
 * that they amortize a pass's fixed cost (reading the weights) over more
 * tokens, while a request arriving meanwhile still waits at most a few
 * targets for the next step (where it may preempt). */
#define ENGINE_PREFILL_ONLY_STEPS 4
/* Aging of the step's prefill order (batch_make; ENGINE_AGING_STEPS is in
 * engine.h, part of the contract): fewest-tokens-left-first alone starves a
 * long prompt for as long as shorter ones keep coming (each step's budget
 * goes to them), and one that never runs a pass is never a preemption
 * victim either, so it holds its slot to the end. A running prompt that got
 * no chunk in ENGINE_AGING_STEPS steps in a row goes first in the next
 * step, its chunk sized as a step's first (chunk_len's is_first: the
 * target, at least as long as the decodes, one token at least): each
 * prompt gets at least one step in ENGINE_AGING_STEPS + 1 while others
 * run — its minimum share — and the shorter ones keep the others. Counted
 * in steps, not seconds, so the order depends on what ran, never on how
 * fast the machine ran it. */

#define ENGINE_MAX_REPLIES 4096 /* reply memory entries, in RAM and in the database (twice as many in
                                   shift mode: each reply is also kept under its text key) */

/* ---- types ---------------------------------------------------------------------- */

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

/* A move of cached KV to the prompt's positions (kv_shift.h), planned at
 * admission and done in the first forward pass that runs its sequence,
 * layer by layer before each layer's attention (after waiting for that
 * layer of its source blocks when they are being restored). */
typedef struct ShiftMove {
    bool is_pending;
    int src;                 /* which of the request's sources */
    int32_t from, to, delta; /* prompt positions [from, to) take source positions [from - delta, to - delta) */
    Seq src_seq;             /* the source blocks, retained until the move is done */
    int src_first;           /* the source block src_seq.blocks[0] is */
    int32_t *wait_blocks;    /* (n_wait) the block table, then the source blocks: what the
                                step's hold-back and layer waits look at */
    int n_wait;
} ShiftMove;

/* The decodes' own time, which decode_step_ratio multiplies, is the
 * median of the latest ENGINE_DECODE_SAMPLES decode-only passes; before
 * ENGINE_DECODE_MIN_SAMPLES were measured, or after
 * ENGINE_DECODE_STALE_STEPS steps with decodes and none of decodes alone
 * (prompts pending all along), a step leaves the prompts out to measure
 * one. Five at least: a fresh server's first decode-only passes are slow
 * (1.1B Q8_0: 0.20 and 0.12 s, then 0.027), and the median of three took
 * the second of them, which a probe only every STALE_STEPS outvoted. */
#define ENGINE_DECODE_SAMPLES 15
#define ENGINE_DECODE_MIN_SAMPLES 5
#define ENGINE_DECODE_STALE_STEPS 32

/* Prompt chunks whose layers are under way at once: a step runs one of
 * them, and one may wait while a request with fewer tokens left runs its
 * own (one carry slot of the Forward each). */
#define ENGINE_SPLITS 2

/* A prompt chunk whose layers run over several steps (docs/DESIGN.md, "A
 * long chunk's layers spread over steps"): whose, where, and how far. Its
 * request is named by arrival and n_starts, not by pointer: one that left
 * the running set since (finished, cancelled, suspended, requeued) does
 * not match, and the chunk is dropped (its KV written so far is never
 * registered; it is computed again). */
typedef struct Split {
    bool is_on;
    uint64_t arrival;        /* its request's Active.arrival ... */
    unsigned n_starts;       /* ... and Active.n_starts when it began */
    bool is_lead;            /* of the leading range being recomputed (else of the tail) */
    int32_t pos;             /* its first position */
    int n;                   /* its tokens */
    int layer;               /* layers done in earlier steps */
    int n_layers;            /* layers this step runs (batch_make) */
} Split;

/* A request being served: owned by the engine thread. */
typedef struct Active {
    Request *req;
    uint64_t arrival;        /* order of arrival */
    double t_submit, t_first;
    double t_queued;         /* ENGINE_CLOCK_QUEUE when it last entered the queue */
    double queue_s, restore_s; /* ReqResult's, before its first token */
    Hash128 ns_id;
    uint64_t conv;           /* conversation for the eviction policy: hash of
                                (namespace, session id), or 0 */
    Seq seq;
    TierSeq *tier;           /* its state in the tiers below the pool */
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
    int n_cached_partial;    /* ... of them copied from a block that matched in part */
    bool is_admitted_once;
    unsigned n_starts;       /* times it entered the running set (start_running) */
    bool has_run;            /* it was in a pass since its last admission */
    int n_preempted;         /* times its prefill gave its slot to a shorter request */
    int preempt_left;        /* pending_tokens when it was last preempted (0: not since its
                                last admission): what it finds cached again is measured on it */
    int n_unserved;          /* steps in a row its prompt was pending, not held back, and got
                                no chunk (aging, ENGINE_AGING_STEPS) */
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
    int n_cached_by[SRC_COUNT]; /* n_cached split by source */
    int n_shifted;           /* ... of which moved from other positions */
    int n_restored_by[RESTORE_PATH_COUNT]; /* ReqResult.n_restored_by, but [RESTORE_KV] holds
                                the tier tokens of both paths and [RESTORE_HIDDEN] 0 (split at
                                the result, from n_hidden_tl) */
    int64_t n_hidden_tl;     /* token-layers of those that came as hidden states: a block whose
                                restore is not known yet counts as K/V until on_restored says */
    /* context overflow, shift (the request's ReqShift): blocks from
     * shift_block on are hashed in its shifted domain (-1: none), and each
     * source's full blocks have their chain hashes */
    int shift_block;
    Hash128 *src_hashes[ENGINE_MAX_SHIFT_SOURCES]; /* (n_src_blocks[j]) */
    int n_src_blocks[ENGINE_MAX_SHIFT_SOURCES];
    ShiftMove mv;            /* the move planned at admission, until its first pass does it */
    int win_first, win_end;  /* mark_window's scratch: its cached run */
    struct Active *next;     /* in the waiting list */
} Active;

struct Engine {
    const Model *m;
    EngineOptions opt;
    KvPool pool;
    BlockIndex *index;       /* NULL with the prefix cache off */
    Forward *fwd;
    KvShifter *shifter;      /* moves KV for context overflow in shift mode */
    ReplyMemory *replies;
    uint32_t kv_format;
    int reserve_blocks;
    SlotPolicy *slots;       /* what the eviction policy knows of each pool slot */
    EngineTiers *tiers;      /* the tiers below the pool (none: every call a no-op) */
    uint64_t n_arrivals;
    /* engine thread only */
    Active **running;        /* (parallel) */
    int n_running;
    Active *waiting;         /* list in arrival order */
    int n_waiting;
    int32_t *b_tok, *b_seq, *b_pos, *b_logit; /* (batch_tokens) */
    Active **b_owner;        /* (parallel) owner of logit row i */
    AttnSeq *b_seqs;         /* (parallel) block tables of the running sequences */
    bool *b_held;            /* (parallel) running sequence i sits out this step */
    AttnSeq *b_wait;         /* (parallel) block tables of the sequences in the batch (with a
                                pending move's source blocks) */
    int n_wait;
    AttnSeq *b_plan;         /* (parallel) b_seqs with a pending move's source blocks, for tiers_plan_step */
    Active **b_moves;        /* (parallel) sequences of the batch whose move this pass does */
    int n_moves;
    int *b_order;            /* (parallel) running sequences with a prefill pending, in the
                                order the step serves them */
    Pacer pacer;             /* the step-time model: measures each pass, sizes prefill chunks */
    double decode_only_s[ENGINE_DECODE_SAMPLES]; /* the latest decode-only passes' seconds (a ring) */
    int n_decode_only;       /* ... how many it holds */
    int decode_only_at;      /* ... where the next goes */
    int steps_since_decode_only; /* passes with decode tokens since the last decode-only one */
    Split splits[ENGINE_SPLITS]; /* prompt chunks whose layers run over several steps (slot i:
                                    the Forward's carry slot i) */
    char *piece;             /* (piece_cap) */
    size_t piece_cap;
    float *lp_row;           /* (n_vocab) the row the sampler may change while the raw
                                one stays for a request's logprobs */
    /* inbox, and the tiers' event queue (engine_tiers.h) under the same lock */
    pthread_t thread;
    bool has_thread;
    pthread_mutex_t inbox_lock;
    pthread_cond_t inbox_cond;
    Msg *inbox_head, *inbox_tail;
    int n_inbox_submits;     /* submit messages in the inbox */
    int n_waiting_pub;       /* n_waiting as last published by the engine thread */
    bool is_stopping;
    bool is_draining;        /* no new requests; the running ones finish */
    bool is_touching;        /* FREE pool slots are left to touch while idle
                                (kvpool_touch_free) */
    /* statistics */
    pthread_mutex_t stats_lock;
    EngineStats stats;
};

double engine_clock_shift(const EngineTestHooks *hk, EngineClockUse use) {
    return hk && hk->clock_shift_fn ? hk->clock_shift_fn(hk->ctx, use) : 0;
}

/* mn_now() as the engine reads it for this use. */
static double engine_now(const Engine *e, EngineClockUse use) {
    return mn_now() + engine_clock_shift(e->opt.test_hooks, use);
}

/* ---- requests and their output channel ---------------------------------------- */

struct Request {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs;
    /* input, immutable once engine_submit has queued it (it fills in the
     * defaults params leave open) */
    int32_t *prompt;
    size_t n_prompt;
    ReqParams params;
    char *stops[ENGINE_MAX_STOP];
    SamplerBias *bias; /* (params.sp.n_logit_bias) the copy params.sp.logit_bias points to */
    char *ns;
    char *session;
    ReqShift *shift;  /* request_set_shift's copy (its sources' ids too), or NULL */
    double t_created; /* request_new: TTFT counts from here, queueing included */
    /* output, guarded by lock */
    char *out;
    size_t out_len, out_cap;
    ReqLogprob *lp;      /* records not read yet */
    size_t n_lp, cap_lp;
    bool is_done;
    ReqResult result;
};

Request *request_new(const int32_t *prompt, size_t n, const ReqParams *p, const char *ns, const char *session) {
    if (n == 0 || p->max_tokens < 0 || p->n_stop < 0 || p->n_stop > ENGINE_MAX_STOP || p->n_top_logprobs < 0 ||
        p->n_top_logprobs > ENGINE_MAX_TOP_LOGPROBS || p->sp.n_logit_bias < 0)
        return NULL;
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
    size_t n_bias = (size_t)p->sp.n_logit_bias;
    r->bias = n_bias ? mn_malloc(n_bias * sizeof *r->bias) : NULL;
    if (r->bias) memcpy(r->bias, p->sp.logit_bias, n_bias * sizeof *r->bias);
    r->params.sp.logit_bias = r->bias;
    bool ok = r->prompt && r->ns && (!session || r->session) && (n_bias == 0 || r->bias);
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

const int32_t *request_prompt(const Request *r, size_t *n) {
    *n = r->n_prompt;
    return r->prompt;
}

static void request_ref(Request *r) {
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
}

static void shift_copy_free(ReqShift *s) {
    if (s == NULL) return;
    for (int i = 0; i < s->n_sources; i++) mn_free((void *)s->sources[i].ids);
    mn_free(s);
}

int request_set_shift(Request *r, const ReqShift *s) {
    if (s->n_sources < 0 || s->n_sources > ENGINE_MAX_SHIFT_SOURCES || s->shift_start < 0 ||
        (size_t)s->shift_start > r->n_prompt)
        return MN_EINVAL;
    for (int i = 0; i < s->n_sources; i++) {
        const ShiftSource *src = &s->sources[i];
        if (src->n == 0 || src->shift_start < -1 || (src->shift_start >= 0 && (size_t)src->shift_start > src->n) ||
            src->dest_start < 0 || (size_t)src->dest_start > r->n_prompt)
            return MN_EINVAL;
    }
    ReqShift *c = mn_calloc(1, sizeof *c);
    if (c == NULL) return MN_ENOMEM;
    *c = *s;
    c->n_sources = 0;
    for (int i = 0; i < s->n_sources; i++) {
        int32_t *ids = mn_malloc(s->sources[i].n * sizeof *ids);
        if (ids == NULL) {
            shift_copy_free(c);
            return MN_ENOMEM;
        }
        memcpy(ids, s->sources[i].ids, s->sources[i].n * sizeof *ids);
        c->sources[i].ids = ids;
        c->n_sources++;
    }
    shift_copy_free(r->shift);
    r->shift = c;
    return MN_OK;
}

void request_unref(Request *r) {
    if (r == NULL) return;
    pthread_mutex_lock(&r->lock);
    int left = --r->refs;
    pthread_mutex_unlock(&r->lock);
    if (left > 0) return;
    shift_copy_free(r->shift);
    for (int i = 0; i < ENGINE_MAX_STOP; i++) mn_free(r->stops[i]);
    mn_free(r->prompt);
    mn_free(r->bias);
    mn_free(r->ns);
    mn_free(r->session);
    mn_free(r->out);
    mn_free(r->lp);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    mn_free(r);
}

/* Engine side: append text and the records of the tokens it completes to
 * the channel. On allocation failure they are dropped (MN_ENOMEM). */
static int request_emit(Request *r, const char *text, size_t len, const HeldLogprob *lp, size_t n_lp) {
    if (len == 0 && n_lp == 0) return MN_OK;
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
    if (rc == MN_OK && r->n_lp + n_lp > r->cap_lp) {
        size_t cap = r->cap_lp ? r->cap_lp : 16;
        while (cap < r->n_lp + n_lp) cap *= 2;
        ReqLogprob *b = mn_realloc(r->lp, cap * sizeof *b);
        if (b == NULL) rc = MN_ENOMEM;
        else {
            r->lp = b;
            r->cap_lp = cap;
        }
    }
    if (rc == MN_OK) {
        if (len) memcpy(r->out + r->out_len, text, len);
        r->out_len += len;
        for (size_t i = 0; i < n_lp; i++) r->lp[r->n_lp++] = lp[i].rec;
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

int request_read(Request *r, ReqOutput *out, int timeout_ms) {
    memset(out, 0, sizeof *out);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->lock);
    while (r->out_len == 0 && r->n_lp == 0 && !r->is_done)
        if (pthread_cond_timedwait(&r->cond, &r->lock, &deadline) != 0) break;
    out->text = mn_strndup(r->out ? r->out : "", r->out_len);
    int rc = out->text ? MN_OK : MN_ENOMEM;
    if (rc == MN_OK) {
        out->len = r->out_len;
        r->out_len = 0;
        out->logprobs = r->lp; /* handed over whole: the engine starts a new array */
        out->n_logprobs = r->n_lp;
        r->lp = NULL;
        r->n_lp = r->cap_lp = 0;
        out->is_done = r->is_done;
        if (out->is_done) out->res = r->result;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

void request_output_deinit(ReqOutput *o) {
    if (o == NULL) return;
    mn_free(o->text);
    mn_free(o->logprobs);
    memset(o, 0, sizeof *o);
}

void engine_options_default(EngineOptions *o) {
    memset(o, 0, sizeof *o);
    o->n_threads = 2;
    o->compute_nice = 5;
    o->block_tokens = 32;
    o->batch_tokens = 512;
    o->step_ms = 500;
    o->decode_step_ratio = ENGINE_DECODE_STEP_RATIO;
    o->layer_split = true;
    o->parallel = 8;
    o->max_queue = 64;
    o->decode_reserve = 0.1f;
    o->kv_type = MN_TYPE_F16;
    o->prefix_cache = true;
    o->schedule = SCHED_FCFS;
    o->chat_format = NULL;
    o->evict = EVICT_DEFAULT;
    o->swap_watermark = 0.25f;
    o->disk_tier_mb = ENGINE_DISK_TIER_MB_DEFAULT;
    o->restore_plan = RESTORE_PLAN_AUTO;
}

const char *engine_source_name(CacheSource s) {
    static const char *const names[SRC_COUNT] = {"pool", "ram", "disk", "redis"};
    return s >= 0 && s < SRC_COUNT ? names[s] : "?";
}

const char *engine_restore_path_name(RestorePath p) {
    static const char *const names[RESTORE_PATH_COUNT] = {"kv", "hidden", "recompute"};
    return p >= 0 && p < RESTORE_PATH_COUNT ? names[p] : "?";
}

Hash128 engine_namespace_id(const char *ns) { return index_namespace_id(ns); }
ReplyMemory *engine_reply_memory(Engine *e) { return e->replies; }
CacheStore *engine_store(Engine *e) { return tiers_store(e->tiers); }
const Model *engine_model(const Engine *e) { return e->m; }
const ChatFormat *engine_chat_format(const Engine *e) { return e->opt.chat_format; }
ContextOverflow engine_context_overflow(const Engine *e) { return e->opt.context_overflow; }

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

/* ---- actives ------------------------------------------------------------------ */

/* Give up a's pending move (its source blocks go back). */
static void move_cancel(Engine *e, Active *a) {
    ShiftMove *mv = &a->mv;
    if (!mv->is_pending) return;
    seq_release(&mv->src_seq, &e->pool);
    mn_free(mv->wait_blocks);
    memset(mv, 0, sizeof *mv);
}

static void keep_tail(Engine *e, Active *a);

static void active_free(Engine *e, Active *a) {
    if (a == NULL) return;
    keep_tail(e, a); /* before move_cancel: it keeps nothing while a move is pending */
    move_cancel(e, a);
    tiers_seq_free(e->tiers, a->tier, &a->seq, a->n_hashed);
    seq_release(&a->seq, &e->pool);
    for (int j = 0; j < ENGINE_MAX_SHIFT_SOURCES; j++) mn_free(a->src_hashes[j]);
    sampler_free(a->smp);
    mn_free(a->tokens);
    mn_free(a->hashes);
    mn_free(a->pending);
    mn_free(a->reply);
    mn_free(a->lp_held);
    request_unref(a->req);
    mn_free(a);
}

/* The chain hash of block b of tokens (its ids at tokens), whose parent is
 * parent (NULL for block 0); the first block of a shifted domain,
 * domain_block, chains from index_shift_parent instead. */
static Hash128 chain_hash(const Engine *e, const Hash128 *parent, int b, int domain_block, const Hash128 *domain,
                          const int32_t *tokens, const Hash128 *ns_id) {
    Hash128 shifted;
    if (b == domain_block) {
        shifted = index_shift_parent(parent, domain);
        parent = &shifted;
    }
    return index_block_hash(parent, tokens, e->opt.block_tokens, &e->m->fingerprint, e->kv_format, ns_id);
}

/* The chain hashes of the full blocks of a's shift sources (none without
 * the prefix cache). MN_OK or MN_ENOMEM. */
static int hash_sources(Engine *e, Active *a) {
    const ReqShift *rs = a->req->shift;
    const int bt = e->opt.block_tokens;
    a->shift_block = rs->shift_start / bt;
    for (int j = 0; e->index && j < rs->n_sources; j++) {
        const ShiftSource *src = &rs->sources[j];
        int n = (int)(src->n / (size_t)bt), domain_block = src->shift_start >= 0 ? src->shift_start / bt : -1;
        if (n == 0) continue;
        Hash128 *h = mn_malloc((size_t)n * sizeof *h);
        if (h == NULL) return MN_ENOMEM;
        for (int b = 0; b < n; b++)
            h[b] = chain_hash(e, b ? &h[b - 1] : NULL, b, domain_block, &src->domain, src->ids + (size_t)b * bt,
                              &a->ns_id);
        a->src_hashes[j] = h;
        a->n_src_blocks[j] = n;
    }
    return MN_OK;
}

static Active *active_new(Engine *e, Request *r) {
    Active *a = mn_calloc(1, sizeof *a);
    if (a == NULL) return NULL;
    a->req = r;
    a->arrival = e->n_arrivals++;
    a->t_submit = r->t_created;
    a->ns_id = index_namespace_id(r->ns);
    if (r->session) { /* per tenant: two tenants' equal session ids are two conversations */
        Hasher hs;
        hasher_init(&hs);
        hasher_update(&hs, a->ns_id.b, sizeof a->ns_id.b);
        hasher_update(&hs, r->session, strlen(r->session));
        Hash128 h = hasher_final(&hs);
        memcpy(&a->conv, h.b, sizeof a->conv);
    }
    a->n_prompt = (int)r->n_prompt;
    a->shift_block = -1;
    a->cap_tokens = (int)r->n_prompt + r->params.max_tokens + 1;
    a->tokens = mn_malloc((size_t)a->cap_tokens * sizeof *a->tokens);
    a->hashes = mn_calloc((size_t)a->cap_tokens / (size_t)e->opt.block_tokens + 1, sizeof *a->hashes);
    if (a->hashes) a->tier = tiers_seq_new(e->tiers, a->hashes, a->ns_id, a->conv);
    int rc = a->tokens && a->tier ? sampler_new(&r->params.sp, e->m->cfg.n_vocab, &a->smp) : MN_ENOMEM;
    if (rc == MN_OK && r->shift) rc = hash_sources(e, a);
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

/* Compute chain hashes of full blocks of tokens[0..n) not hashed yet
 * (those from shift_block on in the request's shifted domain). */
static void active_hash_blocks(Engine *e, Active *a, int n) {
    const int bt = e->opt.block_tokens;
    const Hash128 *domain = a->req->shift ? &a->req->shift->domain : NULL;
    while ((a->n_hashed + 1) * bt <= n) {
        int b = a->n_hashed;
        a->hashes[b] = chain_hash(e, b ? &a->hashes[b - 1] : NULL, b, a->shift_block, domain,
                                  a->tokens + (size_t)b * bt, &a->ns_id);
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

/* The key of the blocks that may follow a's block b - 1 (index_child_key),
 * b >= 1; a's hashes of blocks [0, b) are computed. Rows are reused only
 * after a cached run of full blocks, never in block 0: there every prompt
 * shares its first tokens (BOS, the template's opening) with unrelated
 * conversations, and a match would be incidental. */
static Hash128 child_key(const Engine *e, const Active *a, int b) {
    Hash128 parent = a->hashes[b - 1];
    /* block b's chain hash starts a shifted domain there (chain_hash): its
     * children are keyed in that domain too, so rows of moved KV never
     * pass for exact ones */
    if (b == a->shift_block) parent = index_shift_parent(&parent, &a->req->shift->domain);
    return index_child_key(&parent, &e->m->fingerprint, e->kv_format, &a->ns_id);
}

/* The rows of block `end` (the one after the cached run [first, end))
 * that a block in the pool after the same parent holds for a's tokens
 * there: the slot holding the longest such prefix (-1: none, or no cached
 * run) and its length in *n_rows, at most what leaves one token to
 * compute. */
static int32_t cached_rows(Engine *e, Active *a, int end, int *n_rows) {
    *n_rows = 0;
    const int bt = e->opt.block_tokens;
    int at = end * bt, n = a->n_tokens - 1 - at;
    if (e->index == NULL || end == 0 || n <= 0) return -1;
    Hash128 key = child_key(e, a, end);
    return index_child_find(e->index, &key, a->tokens + at, n < bt ? n : bt, n_rows);
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
    e->stats.pool_evictions = e->pool.n_evictions;
    if (e->index) e->stats.pool_partial = index_n_partials(e->index);
    tiers_stats(e->tiers, &e->stats);
    if (e->index) e->stats.dropped_blocks = index_n_deleted(e->index);
    pthread_mutex_unlock(&e->stats_lock);
}

void engine_stats(Engine *e, EngineStats *out) {
    pthread_mutex_lock(&e->stats_lock);
    *out = e->stats;
    pthread_mutex_unlock(&e->stats_lock);
    /* the tiers' own counters as the mover last published them: it changes
     * them also while the engine sleeps (a tier reconnecting) */
    tiers_snapshot(e->tiers, out);
}

/* ---- emitting text and logprobs ------------------------------------------------- */

/* Which held records go out with a piece of text (see request_read). */
typedef enum Release {
    RELEASE_ENDED, /* those whose text is all out */
    RELEASE_CUT,   /* a stop string cut the text here: those that began before the
                      cut go, the others are dropped (they are not in the answer) */
    RELEASE_ALL,   /* the answer is complete */
} Release;

/* Emit text[0..len) (the next bytes of the answer) with the held records
 * that release lets go, and keep the text for the reply memory. */
static void active_emit(Active *a, const char *text, size_t len, Release release) {
    size_t out = a->n_reply + len; /* bytes of the answer emitted after this */
    int n = 0;
    while (n < a->n_lp_held &&
           (release == RELEASE_ALL || (release == RELEASE_CUT ? a->lp_held[n].start < out : a->lp_held[n].end <= out)))
        n++;
    request_emit(a->req, text, len, a->lp_held, (size_t)n);
    if (len) buf_append(&a->reply, &a->n_reply, &a->cap_reply, text, len);
    if (release == RELEASE_CUT) n = a->n_lp_held;
    if (n == 0) return; /* lp_held may be NULL */
    memmove(a->lp_held, a->lp_held + n, (size_t)(a->n_lp_held - n) * sizeof *a->lp_held);
    a->n_lp_held -= n;
}

/* Hold rec for the token whose text the token stream just gave (n_piece
 * bytes, not counted yet). MN_ENOMEM drops the record. */
static int active_hold_logprob(Active *a, const ReqLogprob *rec, size_t n_piece) {
    if (a->n_lp_held == a->cap_lp_held) {
        int cap = a->cap_lp_held ? 2 * a->cap_lp_held : 8;
        HeldLogprob *b = mn_realloc(a->lp_held, (size_t)cap * sizeof *b);
        if (b == NULL) return MN_ENOMEM;
        a->lp_held = b;
        a->cap_lp_held = cap;
    }
    HeldLogprob *h = &a->lp_held[a->n_lp_held++];
    h->rec = *rec;
    h->rec.text_offset = a->n_text_chars;
    h->start = a->n_text_bytes;
    h->end = a->n_text_bytes + n_piece;
    return MN_OK;
}

/* Count the token stream's output (valid UTF-8: a code point per lead byte). */
static void active_count_text(Active *a, const char *piece, size_t n) {
    a->n_text_bytes += n;
    for (size_t i = 0; i < n; i++) a->n_text_chars += ((unsigned char)piece[i] & 0xC0) != 0x80;
}

/* ---- finishing ------------------------------------------------------------------- */

/* a's tokens from the tiers, by[RESTORE_KV], split into kv and hidden by
 * its token-layers that came as hidden states (rounded to the nearest). */
static void restored_split(const Engine *e, const Active *a, int by[RESTORE_PATH_COUNT]) {
    const int tier_tokens = by[RESTORE_KV];
    uint64_t hidden = tiers_tokens_of_layers((uint64_t)a->n_hidden_tl, e->m->cfg.n_layer);
    by[RESTORE_HIDDEN] = hidden < (uint64_t)tier_tokens ? (int)hidden : tier_tokens;
    by[RESTORE_KV] = tier_tokens - by[RESTORE_HIDDEN];
}

/* Emit the text held back (it is final now) and finish the request; the
 * Active itself stays (see active_finish). */
static void active_complete(Engine *e, Active *a, FinishReason why, const char *error) {
    if (a->is_completed) return;
    a->is_completed = true;
    size_t n_out = 0;
    if (why != FINISH_ERROR) {
        tok_stream_flush(&a->ts, e->piece, e->piece_cap, &n_out);
        if (!a->is_stop_cut) buf_append(&a->pending, &a->n_pending, &a->cap_pending, e->piece, n_out);
        active_emit(a, a->pending, a->n_pending, RELEASE_ALL);
        a->n_pending = 0;
    }
    /* remember the ids of a complete reply (not one cut by a stop string or a
     * cancel: then the text is not what those ids decode to) */
    if ((why == FINISH_STOP || why == FINISH_LENGTH) && !a->is_stop_cut && a->n_generated > 0) {
        Hash128 keys[2] = {replymem_prefix_key(&a->ns_id, a->tokens, (size_t)a->n_prompt),
                           replymem_text_key(&a->ns_id)};
        /* in shift mode also under its text key, for a cut conversation
         * that puts it after another prefix (reply_mem.h) */
        for (int k = 0; k < (e->opt.context_overflow == OVERFLOW_SHIFT ? 2 : 1); k++) {
            replymem_put(e->replies, &keys[k], a->reply ? a->reply : "", a->n_reply, a->tokens + a->n_prompt,
                         (size_t)(a->n_tokens - a->n_prompt));
            tiers_persist_reply(e->tiers, a->tier, &keys[k], a->reply ? a->reply : "", a->n_reply,
                                a->tokens + a->n_prompt, (size_t)(a->n_tokens - a->n_prompt));
        }
    }
    tiers_turn_ended(e->tiers, a->tier, &a->seq, a->n_hashed, a->n_tokens);
    ReqResult res = {0};
    res.finish = why;
    res.n_prompt = a->n_prompt;
    res.n_cached = a->n_cached;
    res.n_cached_partial = a->n_cached_partial;
    memcpy(res.n_cached_by, a->n_cached_by, sizeof res.n_cached_by);
    memcpy(res.n_restored_by, a->n_restored_by, sizeof res.n_restored_by);
    restored_split(e, a, res.n_restored_by);
    res.n_shifted = a->n_shifted;
    res.n_generated = a->n_generated;
    res.n_preempted = a->n_preempted;
    res.ttft_s = a->t_first > 0 ? a->t_first - a->t_submit : 0;
    res.queue_s = a->queue_s;
    res.restore_s = a->restore_s;
    res.total_s = mn_now() - a->t_submit;
    if (error) snprintf(res.error, sizeof res.error, "%s", error);
    pthread_mutex_lock(&e->stats_lock);
    e->stats.requests_finished[why]++;
    e->stats.generated_tokens += (uint64_t)a->n_generated;
    pthread_mutex_unlock(&e->stats_lock);
    /* the gauges too, so that whoever has read this result sees the
     * engine as it was then or later, never as it was before (they are
     * otherwise taken once per loop, after the step that finished it) */
    stats_update_gauges(e);
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

/* Add a generated token's text (and, when the request wants them, its
 * logprobs rec); returns true when a stop string ended the reply. */
static bool active_push_text(Engine *e, Active *a, int32_t id, const ReqLogprob *rec) {
    size_t n_out = 0;
    tok_stream_push(&a->ts, id, e->piece, e->piece_cap, &n_out);
    if (rec) active_hold_logprob(a, rec, n_out);
    active_count_text(a, e->piece, n_out);
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
    active_emit(a, a->pending, emit, stopped ? RELEASE_CUT : RELEASE_ENDED);
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
    const ReqParams *p = &a->req->params;
    int32_t n_vocab = e->m->cfg.n_vocab;
    if (a->n_generated == 0 && p->first_logits) memcpy(p->first_logits, logits, (size_t)n_vocab * sizeof *logits);
    float *row = logits; /* the sampler changes its row: logprobs need it raw */
    if (p->is_logprobs) row = memcpy(e->lp_row, logits, (size_t)n_vocab * sizeof *logits);
    int32_t next = sampler_sample(a->smp, row);
    if (a->t_first == 0) a->t_first = mn_now();
    if (!p->ignore_eos && tok_is_eog(e->m->tok, next)) {
        active_finish(e, a, FINISH_STOP, NULL);
        return false;
    }
    ReqLogprob rec;
    if (p->is_logprobs) {
        memset(&rec, 0, sizeof rec); /* top[] past n_top too: records are compared whole */
        rec.n_top = p->n_top_logprobs < n_vocab ? p->n_top_logprobs : n_vocab;
        sampler_logprobs(logits, n_vocab, next, rec.n_top, &rec.token, rec.top);
    }
    sampler_accept(a->smp, next);
    a->tokens[a->n_tokens++] = next;
    a->n_generated++;
    if (active_push_text(e, a, next, p->is_logprobs ? &rec : NULL)) {
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

/* Take a off the queue (admitted, cancelled, refused or shut down): its
 * stay there, before its first token, is part of its queue time. */
static void waiting_remove(Engine *e, Active *a) {
    if (a->n_generated == 0) a->queue_s += engine_now(e, ENGINE_CLOCK_QUEUE) - a->t_queued;
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
    a->t_queued = engine_now(e, ENGINE_CLOCK_QUEUE);
    Active **pp = &e->waiting;
    while (*pp && (*pp)->arrival < a->arrival) pp = &(*pp)->next;
    a->next = *pp;
    *pp = a;
    e->n_waiting++;
}

/* Tokens running sequence a has yet to compute (1: a decode). */
static int pending_tokens(const Active *a) { return (a->lead_end - a->lead_done) + (a->n_tokens - a->n_done); }

/* Blocks that hold positions [0, n_tokens). */
static int blocks_for(const Engine *e, int n_tokens) { return (n_tokens + e->opt.block_tokens - 1) / e->opt.block_tokens; }

/* Blocks a must newly allocate to hold tokens[0..n_tokens) given n_hit
 * cached blocks. */
static int blocks_needed(const Engine *e, const Active *a, int n_hit) { return blocks_for(e, a->n_tokens) - n_hit; }

/* Blocks of running sequence a's tokens its table does not hold yet (a
 * prompt's table covers what it computed so far, see grow_chunk). */
static int blocks_untaken(const Engine *e, const Active *a) { return blocks_for(e, a->n_tokens) - a->seq.n_blocks; }

/* Blocks the running sequences with fewer than max_pending tokens to
 * compute will take as their prompts' chunks are computed: admission
 * counts them as taken, and a prompt's chunks leave them to the shorter
 * ones. */
static int promised_blocks(const Engine *e, int max_pending) {
    int n = 0;
    for (int i = 0; i < e->n_running; i++) {
        const Active *a = e->running[i];
        int left = blocks_untaken(e, a);
        if (left > 0 && pending_tokens(a) < max_pending) n += left;
    }
    return n;
}

/* Source block b of a's move mv: its chain hash. */
static const Hash128 *move_src_hash(const Active *a, const ShiftMove *mv, int b) { return &a->src_hashes[mv->src][b]; }

/* Source blocks [*b0, *b1) that mv reads. */
static void move_src_blocks(const Engine *e, const ShiftMove *mv, int *b0, int *b1) {
    const int bt = e->opt.block_tokens;
    *b0 = (mv->from - mv->delta) / bt;
    *b1 = (mv->to - mv->delta + bt - 1) / bt;
}

/* a is admitted with the cached run [first, end), n_rows rows of block end
 * copied from the pool, and the move mv (or NULL). */
static void count_admission(Engine *e, Active *a, int first, int end, const ShiftMove *mv, int n_rows) {
    const int bt = e->opt.block_tokens;
    a->is_admitted_once = true;
    a->n_cached = (end - first) * bt + n_rows;
    a->n_cached_partial = n_rows;
    a->n_shifted = 0;
    memset(a->n_cached_by, 0, sizeof a->n_cached_by);
    memset(a->n_restored_by, 0, sizeof a->n_restored_by);
    a->n_hidden_tl = 0;
    for (int i = first; i < end; i++) {
        CacheSource src = tiers_block_source(e->tiers, &a->hashes[i]);
        a->n_cached_by[src] += bt;
        if (src == SRC_POOL) continue;
        a->n_restored_by[RESTORE_KV] += bt;
        uint64_t hidden = 0; /* not known yet: K/V until note_restored says */
        if (tiers_block_hidden(e->tiers, &a->hashes[i], &hidden))
            a->n_hidden_tl += (int64_t)bt * __builtin_popcountll(hidden);
    }
    a->n_cached_by[SRC_POOL] += n_rows;
    /* dropped leading blocks computed again so the run after them counts */
    if (mv == NULL && end > first) a->n_restored_by[RESTORE_RECOMPUTE] = first * bt;
    if (mv) { /* the moved tokens count where their source blocks are */
        int b0, b1;
        move_src_blocks(e, mv, &b0, &b1);
        for (int b = b0; b < b1; b++) {
            int32_t lo = b * bt + mv->delta, hi = lo + bt;
            int n = (hi < mv->to ? hi : mv->to) - (lo > mv->from ? lo : mv->from);
            a->n_cached_by[tiers_block_source(e->tiers, move_src_hash(a, mv, b))] += n;
        }
        a->n_shifted = mv->to - mv->from;
        a->n_cached += a->n_shifted;
    }
    pthread_mutex_lock(&e->stats_lock);
    e->stats.prompt_tokens += (uint64_t)a->n_prompt;
    e->stats.cached_tokens += (uint64_t)a->n_cached;
    e->stats.shifted_tokens += (uint64_t)a->n_shifted;
    e->stats.cached_partial_tokens += (uint64_t)a->n_cached_partial;
    for (int i = 0; i < SRC_COUNT; i++) e->stats.cached_tokens_by[i] += (uint64_t)a->n_cached_by[i];
    e->stats.recomputed_tokens += (uint64_t)(a->n_prompt - a->n_cached);
    e->stats.restored_recompute_tokens += (uint64_t)a->n_restored_by[RESTORE_RECOMPUTE];
    pthread_mutex_unlock(&e->stats_lock);
}

/* Undo count_admission (the admission's restore failed: it is planned and
 * counted again). */
static void uncount_admission(Engine *e, Active *a) {
    a->is_admitted_once = false;
    pthread_mutex_lock(&e->stats_lock);
    e->stats.prompt_tokens -= (uint64_t)a->n_prompt;
    e->stats.cached_tokens -= (uint64_t)a->n_cached;
    e->stats.shifted_tokens -= (uint64_t)a->n_shifted;
    e->stats.cached_partial_tokens -= (uint64_t)a->n_cached_partial;
    for (int i = 0; i < SRC_COUNT; i++) e->stats.cached_tokens_by[i] -= (uint64_t)a->n_cached_by[i];
    e->stats.recomputed_tokens -= (uint64_t)(a->n_prompt - a->n_cached);
    e->stats.restored_recompute_tokens -= (uint64_t)a->n_restored_by[RESTORE_RECOMPUTE];
    pthread_mutex_unlock(&e->stats_lock);
}

/* Plan a's move at admission, its cached run being [0, end): of each
 * source, the stretch of prompt positions after the run (and in the
 * shifted domain, and before the last prompt token, whose logits are
 * needed) that its first run of cached source blocks there holds; the
 * stretch that reaches furthest wins (on a tie the later source: the more
 * recent cut), whatever its start, so a request that finds part of it
 * cached already (the same prompt again, a Responses turn after its chat
 * twin) moves the rest from the same source and gets the same KV. False
 * when there is none. */
static bool plan_move(Engine *e, const Active *a, int end, ShiftMove *mv) {
    const ReqShift *rs = a->req->shift;
    const int bt = e->opt.block_tokens;
    memset(mv, 0, sizeof *mv);
    for (int j = 0; j < rs->n_sources; j++) {
        const ShiftSource *src = &rs->sources[j];
        int32_t delta = a->n_prompt - (int32_t)src->n, last = a->n_prompt - 1;
        int32_t start = end * bt;
        if (start < src->dest_start) start = src->dest_start;
        if (start < a->shift_block * bt) start = a->shift_block * bt;
        if (start < delta) start = delta; /* a source shorter than the prompt */
        if (start >= last) continue;
        int b = (start - delta) / bt, nb = a->n_src_blocks[j];
        while (b < nb && !index_has(e->index, &a->src_hashes[j][b])) b++;
        int b1 = b;
        while (b1 < nb && index_has(e->index, &a->src_hashes[j][b1])) b1++;
        int32_t from = b * bt + delta > start ? b * bt + delta : start;
        int32_t to = b1 * bt + delta < last ? b1 * bt + delta : last;
        if (to > from && to >= mv->to) *mv = (ShiftMove){.src = j, .from = from, .to = to, .delta = delta};
    }
    return mv->to > mv->from;
}

/* What admitting a with the cached run [first, end) of its table (and the
 * move mv, when not NULL) leaves of the pool, in blocks: available ones
 * less those it allocates, restores into, and takes from the cached. */
static int room_after(Engine *e, Active *a, int first, int end, const ShiftMove *mv) {
    int avail = kvpool_n_available(&e->pool) - blocks_needed(e, a, end - first);
    /* hit blocks that sit CACHED stop being available once we take them;
     * blocks only a tier holds take a slot each to be restored into */
    for (int i = first; i < end; i++) {
        int32_t slot = index_lookup(e->index, &a->hashes[i]);
        if (slot < 0 || e->pool.state[slot] == SLOT_CACHED) avail--;
    }
    int b0 = 0, b1 = 0;
    if (mv) move_src_blocks(e, mv, &b0, &b1);
    for (int b = b0; b < b1; b++) {
        int32_t slot = index_lookup(e->index, move_src_hash(a, mv, b));
        if (slot < 0 || e->pool.state[slot] == SLOT_CACHED) avail--;
    }
    return avail;
}

/* Take the blocks hashes[at[0..n)] (each indexed): retain those in the
 * pool into slots[k] and restore those only a tier holds (ts's hashes);
 * false (nothing taken) when a restore cannot start. */
static bool take_cached(Engine *e, const TierSeq *ts, const Hash128 *hashes, const int *at, int n, int32_t *slots) {
    int *to_load = mn_malloc((size_t)(n > 0 ? n : 1) * sizeof *to_load), n_load = 0;
    if (to_load == NULL) return false;
    for (int k = 0; k < n; k++) {
        slots[k] = index_lookup(e->index, &hashes[at[k]]);
        if (slots[k] >= 0) kvpool_retain(&e->pool, slots[k]);
        else to_load[n_load++] = at[k];
    }
    bool ok = tiers_start_load(e->tiers, ts, to_load, n_load) == MN_OK;
    mn_free(to_load);
    for (int k = 0; k < n; k++) {
        if (!ok) {
            if (slots[k] >= 0) kvpool_release(&e->pool, slots[k]);
        } else if (slots[k] < 0) { /* restoring into a fresh slot */
            slots[k] = index_lookup(e->index, &hashes[at[k]]);
            kvpool_retain(&e->pool, slots[k]);
        }
    }
    return ok;
}

/* Take mv's source blocks into its src_seq: retained, restored where only
 * a tier holds them. False (nothing taken) when a restore cannot start. */
static bool take_move_sources(Engine *e, Active *a, ShiftMove *mv) {
    int b0, b1;
    move_src_blocks(e, mv, &b0, &b1);
    int n = b1 - b0, *at = mn_malloc((size_t)n * sizeof *at);
    mv->src_seq.blocks = mn_malloc((size_t)n * sizeof *mv->src_seq.blocks);
    TierSeq *ts = tiers_seq_new(e->tiers, a->src_hashes[mv->src], a->ns_id, a->conv);
    bool ok = at && mv->src_seq.blocks && ts;
    for (int k = 0; ok && k < n; k++) at[k] = b0 + k;
    ok = ok && take_cached(e, ts, a->src_hashes[mv->src], at, n, mv->src_seq.blocks);
    Seq none = {0};
    tiers_seq_free(e->tiers, ts, &none, 0);
    mn_free(at);
    if (!ok) {
        mn_free(mv->src_seq.blocks);
        mv->src_seq.blocks = NULL;
        return false;
    }
    mv->src_seq.n_blocks = mv->src_seq.cap = n;
    mv->src_first = b0;
    return true;
}

/* mv's wait table: the block table seq, then the source blocks. */
static bool move_wait_table(const Seq *seq, ShiftMove *mv) {
    mv->n_wait = seq->n_blocks + mv->src_seq.n_blocks;
    mv->wait_blocks = mn_malloc((size_t)mv->n_wait * sizeof *mv->wait_blocks);
    if (mv->wait_blocks == NULL) return false;
    memcpy(mv->wait_blocks, seq->blocks, (size_t)seq->n_blocks * sizeof *mv->wait_blocks);
    memcpy(mv->wait_blocks + seq->n_blocks, mv->src_seq.blocks, (size_t)mv->src_seq.n_blocks * sizeof *mv->wait_blocks);
    return true;
}

/* Try to start a: take the cached prefix (restoring what only a tier
 * holds) and allocate the rest of its blocks; with a shift source whose
 * blocks hold tokens of its prompt, plan their move (positions between
 * the cached run and the move are computed first, as a leading range);
 * without one, copy into the block after the cached run the rows a block
 * in the pool holds for its tokens (cached_rows). Returns false (nothing
 * taken) when the pool cannot hold it now. */
static bool try_admit(Engine *e, Active *a, int lend_left) {
    int first, end, n_rows = 0;
    int n_hit = cached_blocks(e, a, &first, &end);
    ShiftMove plan = {0};
    bool has_move = a->req->shift && e->index && first == 0 && plan_move(e, a, end, &plan);
    int reserve = (e->n_running > 0 ? e->reserve_blocks : 0) + promised_blocks(e, lend_left);
    /* copy-ups into RAM hold slots for a later turn's sake only: one short
     * of room takes back those not begun (the blocks stay where they were
     * read from); one more slot covers the rows' source taken below */
    int short_by = reserve + 1 - room_after(e, a, first, end, NULL);
    if (short_by > 0) tiers_withdraw_copy_ups(e->tiers, short_by);
    if (has_move && room_after(e, a, first, end, &plan) < reserve) has_move = false; /* without the move, perhaps */
    /* the move fills the positions after the run itself: no rows copied there */
    int32_t src = has_move ? -1 : cached_rows(e, a, end, &n_rows);
    /* the rows' source, when it sits CACHED, stops being available once taken */
    int src_taken = src >= 0 && e->pool.state[src] == SLOT_CACHED;
    if (!has_move && room_after(e, a, first, end, NULL) - src_taken < reserve) return false;
    Seq *s = &a->seq;
    if (seq_reserve(s, &e->pool, 0) != MN_OK) return false;
    /* the block table: the cached run [first, end) in place, fresh slots for
     * the leading blocks before it and for the positions after it that get
     * KV now (rows copied, a move); the rest of the prompt's blocks are
     * taken as its chunks are computed (grow_chunk), the table sized for
     * them. The pool hits are taken first, so restoring and allocating
     * cannot evict them. */
    int total = n_hit + blocks_needed(e, a, n_hit);
    int n_alloc = blocks_for(e, has_move ? plan.to : end * e->opt.block_tokens + (src >= 0 ? n_rows : 0));
    if (n_alloc < end) n_alloc = end;
    int32_t *blocks = mn_malloc((size_t)(total > 0 ? total : 1) * sizeof *blocks);
    int *at = mn_malloc((size_t)(n_hit > 0 ? n_hit : 1) * sizeof *at);
    if (blocks == NULL || at == NULL) {
        mn_free(blocks);
        mn_free(at);
        return false;
    }
    if (!a->is_admitted_once) count_admission(e, a, first, end, has_move ? &plan : NULL, n_rows);
    if (src >= 0) kvpool_retain(&e->pool, src); /* restoring and allocating must not evict it */
    for (int i = first; i < end; i++) at[i - first] = i;
    bool ok = take_cached(e, a->tier, a->hashes, at, n_hit, blocks + first);
    mn_free(at);
    if (ok && has_move && !take_move_sources(e, a, &plan)) { /* before allocating: that could evict them */
        for (int j = first; j < end; j++) kvpool_release(&e->pool, blocks[j]);
        ok = false;
    }
    for (int i = 0; ok && i < n_alloc; i++) {
        if (i >= first && i < end) continue;
        if (kvpool_alloc(&e->pool, &blocks[i]) != MN_OK) { /* cannot happen: counted above */
            for (int j = 0; j < i; j++)
                if (j < first || j >= end) kvpool_release(&e->pool, blocks[j]);
            for (int j = first; j < end; j++) kvpool_release(&e->pool, blocks[j]);
            ok = false;
        }
    }
    if (src >= 0) {
        if (ok) kvpool_copy_rows(&e->pool, blocks[end], src, n_rows); /* blocks[end]: a fresh slot */
        kvpool_release(&e->pool, src);
    }
    if (ok) {
        mn_free(s->blocks);
        s->blocks = blocks;
        s->n_blocks = n_alloc;
        s->cap = total > 0 ? total : 1;
        blocks = NULL;
        if (has_move && !move_wait_table(s, &plan)) {
            seq_release(s, &e->pool);
            ok = false;
        }
    }
    if (!ok) {
        if (has_move) seq_release(&plan.src_seq, &e->pool);
        uncount_admission(e, a);
        mn_free(blocks);
        return false;
    }
    if (has_move) {
        plan.is_pending = true;
        a->mv = plan;
    }
    const int bt = e->opt.block_tokens;
    a->lead_end = first * bt;
    a->lead_done = 0;
    a->n_done = (n_hit > 0 ? end * bt : 0) + n_rows;
    a->n_registered = n_hit > 0 ? end : 0;
    if (has_move) { /* the leading range is what lies between the run and the move */
        a->lead_done = end * bt;
        a->lead_end = a->mv.from;
        a->n_done = a->mv.to;
        a->n_registered = end;
    }
    return true;
}

/* Put running sequence i back in the queue at its place: its blocks go
 * back (full ones stay cached, and the filled part of its last block as a
 * partial child), and it waits to be admitted again with all its tokens,
 * finding what it computed in the cache unless it was evicted meanwhile. */
static void unadmit(Engine *e, int i) {
    Active *a = e->running[i];
    e->running[i] = e->running[--e->n_running];
    if (a->is_completed) { /* only its cache-completing step was left */
        active_free(e, a);
        return;
    }
    keep_tail(e, a); /* before move_cancel: it keeps nothing while a move is pending */
    move_cancel(e, a);
    seq_release(&a->seq, &e->pool);
    a->n_done = a->lead_end = a->lead_done = 0;
    waiting_insert(e, a);
}

/* Suspend the running sequence that arrived last (the pool is full). */
static void suspend_latest(Engine *e) {
    int victim = 0;
    for (int k = 1; k < e->n_running; k++)
        if (e->running[k]->arrival > e->running[victim]->arrival) victim = k;
    unadmit(e, victim);
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
    if (a->is_completed) { /* still flagged: keep_tail keeps nothing of it */
        active_free(e, a);
        return;
    }
    a->is_restore_failed = false;
    move_cancel(e, a);
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

/* Whether waiting request a may be admitted now (its tiers' work done). */
static bool is_admissible(Engine *e, Active *a) {
    return !tiers_is_probing(e->tiers, a->tier) && !tiers_is_promoting(e->tiers, a->tier);
}

/* a, preempted, was admitted again: the tokens it has to compute beyond
 * what it had left when preempted are ones it computed (or found cached)
 * before and lost while it waited (evicted from the pool and every tier),
 * computed again. They are not in recomputed_tokens, which counts a
 * prompt's uncached tokens once, at its first admission. Finding more
 * cached than it left (another request computed it meanwhile) counts as
 * none. */
static void count_preempt_recompute(Engine *e, Active *a) {
    if (a->preempt_left == 0) return;
    int again = pending_tokens(a) - a->preempt_left;
    a->preempt_left = 0;
    if (again <= 0) return;
    pthread_mutex_lock(&e->stats_lock);
    e->stats.preempt_recomputed_tokens += (uint64_t)again;
    pthread_mutex_unlock(&e->stats_lock);
}

/* Take a off the queue into the running set (it was admitted). */
static void start_running(Engine *e, Active *a) {
    tiers_seq_admitted(e->tiers, a->tier);
    waiting_remove(e, a);
    a->has_run = false;
    a->n_starts++;
    a->n_unserved = 0;
    count_preempt_recompute(e, a);
    e->running[e->n_running++] = a;
}

/* Tokens waiting request a computes before its first token, were it
 * admitted now: those of its prompt outside its cached run of full blocks
 * (the rows of a partial block it may copy are left out: an estimate). */
static int prefill_left(Engine *e, Active *a) {
    int first, end;
    return a->n_tokens - cached_blocks(e, a, &first, &end) * e->opt.block_tokens;
}

/* Running prompts with at least this many tokens to compute lend their
 * promised blocks to a waiting request with `left` (borrow_room). */
static int lend_left(int left) { return (int)((int64_t)left * ENGINE_PREEMPT_RATIO > INT_MAX ? INT_MAX : left * ENGINE_PREEMPT_RATIO); }

/* The admissible waiting request with the fewest tokens before its first
 * token (*left of them), or NULL. */
static Active *shortest_waiting(Engine *e, int *left) {
    Active *best = NULL;
    *left = 0;
    for (Active *a = e->waiting; a; a = a->next) {
        if (!is_admissible(e, a)) continue;
        int n = prefill_left(e, a);
        if (best == NULL || n < *left) {
            best = a;
            *left = n;
        }
    }
    return best;
}

/* Every slot is taken: let the admissible waiting request with the fewest
 * tokens before its first token take the slot of the running prefill with
 * the most left, when that one has many times more (ENGINE_PREEMPT_*).
 * Repeats while a pair qualifies: each round preempts a request that ran
 * and admits one that has not. */
static void preempt_prefills(Engine *e) {
    const int min_left = ENGINE_PREEMPT_MIN_BLOCKS * e->opt.block_tokens;
    while (e->n_running == e->opt.parallel && e->waiting) {
        int victim = -1, v_left = 0;
        for (int i = 0; i < e->n_running; i++) {
            const Active *a = e->running[i];
            int left = pending_tokens(a);
            if (a->n_generated > 0 || a->is_completed || !a->has_run || a->n_preempted >= ENGINE_PREEMPT_MAX ||
                a->is_restore_failed || left < min_left)
                continue;
            if (victim < 0 || left > v_left) {
                victim = i;
                v_left = left;
            }
        }
        if (victim < 0) return;
        int b_left;
        Active *best = shortest_waiting(e, &b_left);
        if (best == NULL || lend_left(b_left) > v_left) return;
        Active *v = e->running[victim];
        unadmit(e, victim);
        v->n_preempted++;
        v->preempt_left = v_left;
        pthread_mutex_lock(&e->stats_lock);
        e->stats.preemptions++;
        pthread_mutex_unlock(&e->stats_lock);
        /* its slot goes to best, not to whoever admission ranks first (under
         * FCFS, the preempted request itself) */
        if (!try_admit(e, best, lend_left(b_left))) return; /* the pool cannot hold it: the next step admits by rank */
        start_running(e, best);
    }
}

/* A slot is free but the pool's room is promised to running prompts
 * (promised_blocks): let the admissible waiting request with the fewest
 * tokens before its first token borrow it when a running prompt has many
 * times more left (ENGINE_PREEMPT_RATIO). It is done long before that
 * prompt needs the room; until then the prompt's chunks wait for room
 * (grow_chunk). Repeats while one qualifies. */
static void borrow_room(Engine *e) {
    while (e->n_running < e->opt.parallel && e->waiting) {
        int v_left = 0, b_left;
        for (int i = 0; i < e->n_running; i++) {
            const Active *a = e->running[i];
            int left = pending_tokens(a);
            if (blocks_untaken(e, a) > 0 && left > v_left) v_left = left;
        }
        Active *best = shortest_waiting(e, &b_left);
        if (best == NULL || v_left == 0 || lend_left(b_left) > v_left) return;
        if (!try_admit(e, best, lend_left(b_left))) return;
        start_running(e, best);
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
        if (!is_admissible(e, best) || !try_admit(e, best, INT_MAX)) break;
        start_running(e, best);
    }
    borrow_room(e);
    preempt_prefills(e);
}

/* Make sure running sequence i's block table covers its tokens: a
 * decode's, and a prompt's table is big enough for all of its blocks
 * (they are taken as its chunks are computed, grow_chunk). When the pool
 * cannot hold a decode, take back copy-ups into RAM not begun
 * (tiers_withdraw_copy_ups) or, with none, suspend the most recent arrival
 * (perhaps i itself), and return false: the caller starts over, since the
 * pool changed, or the suspended slot now holds a sequence it may not have
 * checked yet. */
static bool ensure_blocks(Engine *e, int i) {
    Active *a = e->running[i];
    int rc = MN_ENOMEM;
    if (e->opt.test_table_faults > 0 && seq_table_grows(&a->seq, &e->pool, a->n_tokens)) e->opt.test_table_faults--;
    else if (pending_tokens(a) > 1) rc = seq_reserve_table(&a->seq, &e->pool, a->n_tokens);
    else rc = seq_reserve(&a->seq, &e->pool, a->n_tokens);
    if (rc == MN_OK) return true;
    if (rc != MN_EFULL) { /* out of memory growing its table: it alone fails */
        e->running[i] = e->running[--e->n_running];
        active_finish(e, a, FINISH_ERROR, "out of memory growing a block table");
        return false;
    }
    if (tiers_withdraw_copy_ups(e->tiers, 1) > 0) return false; /* slots the copies held: check again */
    suspend_latest(e);
    return false;
}

/* Index block i of a (its KV is complete, computed here) and note what
 * the policy needs; it is also a child of its parent, so a prompt that
 * shares only its first tokens reuses their rows. */
static void record_block(Engine *e, Active *a, int i) {
    const int bt = e->opt.block_tokens;
    int32_t slot = a->seq.blocks[i];
    if (index_insert(e->index, &a->hashes[i], slot) != 1) return;
    slotpol_note_block(e->slots, slot, i * bt, a->conv, &a->ns_id);
    if (i == 0) return;
    Hash128 key = child_key(e, a, i);
    index_child_add(e->index, &key, slot, a->tokens + (size_t)i * bt, bt); /* without room: no reuse, no harm */
}

/* Keep the filled part of a's last block findable (a partial child, see
 * index_child_add) before a's blocks go back to the pool: a returning turn
 * that extends it copies its rows instead of computing them again. Rows
 * [lead_end, n_done) have KV even while a leading range is recomputed
 * when the partial block comes after it (evicted leading blocks); a
 * leading range that reaches into the block (the stretch before a shift
 * move), a move not done yet or a failed restore leave rows without KV
 * there, and nothing is kept. */
static void keep_tail(Engine *e, Active *a) {
    const int bt = e->opt.block_tokens;
    int b = a->n_done / bt, n_rows = a->n_done % bt;
    if (e->index == NULL || a->is_restore_failed || n_rows == 0 || b == 0 || b >= a->seq.n_blocks) return;
    if (a->mv.is_pending || (a->lead_done < a->lead_end && a->lead_end > b * bt)) return;
    active_hash_blocks(e, a, b * bt);
    Hash128 key = child_key(e, a, b);
    int32_t slot = a->seq.blocks[b];
    if (index_child_add(e->index, &key, slot, a->tokens + (size_t)b * bt, n_rows) == 1)
        slotpol_note_block(e->slots, slot, b * bt, a->conv, &a->ns_id);
}

/* The look-ahead window: the first waiting requests, as many as the free
 * capacity holds at their mean cached size. With a window policy, mark
 * their cached blocks so the policy keeps them (tail of the window first
 * when it must), in the pool and in the tiers below; with tiers, prefetch
 * what they will restore into free pool slots. What does not go there is
 * promoted from disk into the RAM tier after admission
 * (tiers_promote_window), for those of them that still wait. The pool's
 * window counts the pool's capacity; the tiers' window also the RAM
 * tier's, which a promote may fill (evicting what is outside the
 * window). */
static void mark_window(Engine *e) {
    bool is_marking = policy_uses_window(e->opt.evict);
    if (e->index == NULL || (!is_marking && !tiers_is_on(e->tiers))) return;
    if (e->n_waiting == 0 && !slotpol_has_window(e->slots)) return; /* the common decode step */
    slotpol_reset_window(e->slots, is_marking && e->n_waiting > 0);
    /* AttentionStore's window: as many requests as the capacity left for
     * cached KV (free slots and reclaimable cached ones) holds, at the mean
     * cached size of a waiting request */
    double mean = 0;
    for (Active *a = e->waiting; a; a = a->next) mean += cached_blocks(e, a, &a->win_first, &a->win_end);
    int len = 0, len_tiers = 0;
    if (e->n_waiting > 0) {
        double avail = (double)kvpool_n_available(&e->pool);
        len = policy_window_len(avail, mean / e->n_waiting, e->n_waiting);
        len_tiers = policy_window_len(avail + tiers_promote_room(e->tiers), mean / e->n_waiting, e->n_waiting);
    }
    tiers_window_begin(e->tiers);
    int idx = 0;
    for (Active *a = e->waiting; a && idx < len_tiers; a = a->next, idx++)
        tiers_window_add(e->tiers, a->tier, a->win_first, a->win_end);
    tiers_send_window(e->tiers); /* before the promotes: they evict by it */
    idx = 0;
    for (Active *a = e->waiting; a && idx < len; a = a->next, idx++) {
        tiers_prefetch(e->tiers, a->tier, a->win_first, a->win_end);
        for (int b = a->win_first; is_marking && b < a->win_end; b++) {
            int32_t slot = index_lookup(e->index, &a->hashes[b]);
            if (slot >= 0) slotpol_mark_window(e->slots, slot, idx);
        }
    }
}

/* Offer a's newly completed full blocks to the index. */
static void register_blocks(Engine *e, Active *a) {
    if (e->index == NULL) return;
    const int bt = e->opt.block_tokens;
    if (a->lead_end > 0 && a->lead_done == a->lead_end) {
        if (a->n_registered * bt >= a->lead_end) /* the recomputed leading blocks, before the cached run */
            for (int i = 0; i < a->lead_end / bt; i++) record_block(e, a, i);
        a->lead_end = a->lead_done = 0;
    }
    /* blocks whose every row has its KV: not past a leading range still
     * being computed (a move's: after the cached run), nor past a move
     * not done yet */
    int full = a->n_done / bt;
    if (a->lead_done < a->lead_end && a->lead_done / bt < full) full = a->lead_done / bt;
    if (a->mv.is_pending && a->mv.from / bt < full) full = a->mv.from / bt;
    if (full > a->n_registered) active_hash_blocks(e, a, full * bt);
    for (; a->n_registered < full; a->n_registered++) record_block(e, a, a->n_registered);
}

/* ---- one step ------------------------------------------------------------------- */

static void fail_all_running(Engine *e, const char *msg) {
    while (e->n_running > 0) active_finish(e, e->running[--e->n_running], FINISH_ERROR, msg);
}

/* Layers of m that may have hidden states (and a hidden arena in the
 * pool, kvpool_init_hidden): the first 64 (a deeper model's later layers
 * are always K/V: KVPOOL_HIDDEN_MAX_LAYERS). */
static int hidden_layer_count(const Model *m) {
    return m->cfg.n_layer < KVPOOL_HIDDEN_MAX_LAYERS ? m->cfg.n_layer : KVPOOL_HIDDEN_MAX_LAYERS;
}

/* Whether a tier below RAM is set (disk or Redis): one whose reads may be
 * slow enough (a spinning or network disk, a remote Redis) that a hidden
 * layer's fewer bytes pay for its projection. */
static bool has_tier_below_ram(const EngineOptions *op) {
    return op->prefix_cache && (op->disk_tier_dir != NULL || op->n_redis_urls > 0);
}

/* Whether any tier is set (tiers need the prefix cache). */
static bool has_tier(const EngineOptions *op) {
    return has_tier_below_ram(op) || (op->prefix_cache && op->ram_tier_mb > 0);
}

/* Whether m's hidden rows take fewer bytes than its K/V (one size for
 * every layer: all or none). */
static bool is_hidden_smaller(const Model *m, const EngineOptions *op) {
    uint64_t kv = kvpool_bytes_for(1, m->cfg.kv_dim, op->block_tokens, 1, op->kv_type);
    return (uint64_t)fwd_hidden_row_bytes(m) * (uint64_t)op->block_tokens < kv;
}

/* The layers saves may store as hidden states: with the hidden plan and a
 * tier, and with the auto plan over a tier below RAM, those of
 * hidden_layer_count when is_hidden_smaller; a test's own choice instead.
 * Without a tier nothing is saved, and the pool keeps no hidden arenas.
 * The auto plan over RAM alone stores K/V: at RAM's bandwidth a
 * projection never costs less than the read it saves (docs/DESIGN.md,
 * "Hidden-state restore"), so it keeps none either, and its pool is kv's. */
static uint64_t hidden_layers_of(const Model *m, const EngineOptions *op) {
    if (op->restore_plan == RESTORE_PLAN_KV || !has_tier(op)) return 0;
    if (op->restore_plan == RESTORE_PLAN_AUTO && !has_tier_below_ram(op)) return 0;
    const int n = hidden_layer_count(m);
    const uint64_t all = n == 64 ? UINT64_MAX : (1ull << n) - 1;
    if (op->test_hidden_layers != 0) return op->test_hidden_layers & all;
    return is_hidden_smaller(m, op) ? all : 0;
}

/* Say at start-up when --restore-plan hidden or auto will store nothing
 * as hidden states, and why: the only other sign is a metric that stays
 * at zero. Hidden, which the user asked for, warns; auto, the default,
 * says it once. Not a refusal: one command line may serve models of
 * both kinds. */
static void log_plan_fallback(const Model *m, const EngineOptions *op, uint64_t hidden_layers, bool has_tiers) {
    if (op->restore_plan == RESTORE_PLAN_KV) return;
    const bool is_auto = op->restore_plan == RESTORE_PLAN_AUTO;
    if (!has_tiers) {
        if (!is_auto) /* auto without tiers has nothing to store */
            LOG_WARN("--restore-plan hidden does nothing: no cache tier is set (--ram-tier-mb, --disk-tier, "
                     "--redis-tier)");
    } else if (hidden_layers == 0 && !is_hidden_smaller(m, op)) {
        uint64_t kv = kvpool_bytes_for(1, m->cfg.kv_dim, op->block_tokens, 1, op->kv_type) / (uint64_t)op->block_tokens;
        mn_log(is_auto ? MN_LOG_INFO : MN_LOG_WARN, __FILE__, __LINE__,
               "--restore-plan %s: the tiers store KV: this model's hidden state takes %zu bytes a token per layer, "
               "not fewer than its KV's %llu (--kv-type %s)",
               is_auto ? "auto" : "hidden", fwd_hidden_row_bytes(m), (unsigned long long)kv,
               op->kv_type == MN_TYPE_F32 ? "f32" : "f16");
    } else if (hidden_layers == 0 && is_auto) {
        LOG_INFO("--restore-plan auto: the RAM tier stores KV (hidden states pay only over a disk or Redis tier)");
    }
}

/* The projection time's first figure, before any restore: how long projecting
 * a few blocks of layer 0 takes (into free slots, whose contents nothing
 * reads; their hidden rows zeroed first). */
static void measure_projection(Engine *e) {
    KvPool *p = &e->pool;
    int32_t slots[4], pos0[4];
    int n = 0;
    for (int i = 0; i < p->n_free && n < 4; i++) {
        slots[n] = p->free_list[i];
        pos0[n] = n * p->block_tokens;
        if (pos0[n] + p->block_tokens > e->opt.n_ctx) break;
        memset(kvpool_h(p, 0, slots[n]), 0, p->hidden_bytes);
        n++;
    }
    if (n == 0) return;
    MnErr err = {0};
    double t0 = mn_now() + engine_clock_shift(e->opt.test_hooks, ENGINE_CLOCK_PROJECT);
    if (fwd_project(e->fwd, 0, slots, pos0, n, &err) != MN_OK) return;
    double t1 = mn_now() + engine_clock_shift(e->opt.test_hooks, ENGINE_CLOCK_PROJECT);
    tiers_note_projection(e->tiers, t1 - t0, (int64_t)n * p->block_tokens);
}

/* TiersConfig.project_fn: restored hidden states into K/V (fwd_project). */
static int project_restored(void *ctx, int layer, const int32_t *slots, const int32_t *pos0, int n) {
    Engine *e = ctx;
    MnErr err = {0};
    int rc = fwd_project(e->fwd, layer, slots, pos0, n, &err);
    if (rc != MN_OK) LOG_ERROR("%s", err.msg);
    return rc;
}

/* TiersConfig.on_lost_fn: every running sequence holding slot must be
 * planned again (a waiting one holds no slots). */
static void mark_holders_failed(void *ctx, int32_t slot) {
    Engine *e = ctx;
    for (int i = 0; i < e->n_running; i++) {
        Active *a = e->running[i];
        for (int b = 0; b < a->seq.n_blocks; b++)
            if (a->seq.blocks[b] == slot) a->is_restore_failed = true;
        for (int b = 0; a->mv.is_pending && b < a->mv.src_seq.n_blocks; b++)
            if (a->mv.src_seq.blocks[b] == slot) a->is_restore_failed = true;
    }
}

/* TiersConfig.on_restored_fn: a running sequence holding slot counted its
 * block as restored as K/V (count_admission) until this said how. */
static void note_restored(void *ctx, int32_t slot, uint64_t hidden_layers) {
    Engine *e = ctx;
    if (hidden_layers == 0) return;
    const int64_t tl = (int64_t)e->opt.block_tokens * __builtin_popcountll(hidden_layers);
    for (int i = 0; i < e->n_running; i++) {
        Active *a = e->running[i];
        for (int b = 0; b < a->seq.n_blocks; b++)
            if (a->seq.blocks[b] == slot) a->n_hidden_tl += tl;
    }
}

/* FwdBatch.wait_layer: the batch's sequences wait for their restored
 * layers (and their moves' source blocks'), then the moves of the pass
 * write that layer of their tokens' KV before its attention reads it. */
static void wait_restored_layer(void *ctx, int layer) {
    Engine *e = ctx;
    if (tiers_is_restoring(e->tiers)) tiers_wait_layer(e->tiers, e->b_wait, e->n_wait, layer);
    for (int i = 0; i < e->n_moves; i++) { /* the moves of this pass, now that their sources are in */
        Active *a = e->b_moves[i];
        const ShiftMove *mv = &a->mv;
        if (a->is_restore_failed) continue; /* its work is discarded */
        KvMove m = {a->seq.blocks, mv->src_seq.blocks, mv->src_first, mv->from, mv->to, mv->delta};
        kvshift_layer(e->shifter, &e->pool, layer, &m);
    }
}

/* The moves of this pass are done: their sources go back. */
static void finish_moves(Engine *e) {
    for (int i = 0; i < e->n_moves; i++)
        if (!e->b_moves[i]->is_restore_failed) move_cancel(e, e->b_moves[i]);
    e->n_moves = 0;
}

/* ---- the batch ------------------------------------------------------------------ */

/* The batch being made for one step: its tokens are in e->b_tok etc. */
typedef struct Batch {
    int n, n_logits;   /* tokens and logit rows so far */
    Split *split;      /* the split chunk whose layers this step runs (in e->splits), or NULL ... */
    int split_i;       /* ... and its running sequence */
    PacerShape shape;  /* what its pass costs by: decode and prompt tokens, keys */
    bool has_decoder;  /* some running sequence decodes (in the batch, or held back) */
    double target_s;   /* the time its prompt chunks fill the pass to (step_target) */
} Batch;

/* EngineTestHooks.step_fn, once the step's batch b is made (its split
 * chunk in fb): what it holds, and which requests have a prompt chunk in
 * it (a sequence's tokens are contiguous in the batch; a decode is its
 * one pending token). */
static void test_step(const Engine *e, const Batch *b, const FwdBatch *fb) {
    const EngineTestHooks *hk = e->opt.test_hooks;
    if (hk == NULL || hk->step_fn == NULL) return;
    EngineStepInfo info = {.n_running = e->n_running,
                           .n_decode = b->shape.n_decode,
                           .n_prefill = b->n - b->shape.n_decode - fb->n_split,
                           .n_split = fb->n_split,
                           .split_first = fb->split_first,
                           .split_layers = fb->split_end - fb->split_first,
                           .n_layer = e->m->cfg.n_layer,
                           .n_keys = b->shape.n_keys,
                           .predicted_s = pacer_predict(&e->pacer, b->shape)};
    for (int i = 0; i < e->n_running; i++) info.n_held_back += e->b_held[i];
    for (int t = 0; t < b->n; t++) {
        const Active *a = e->running[e->b_seq[t]];
        if (pending_tokens(a) == 1) continue;
        if (t > 0 && e->b_seq[t - 1] == e->b_seq[t]) {
            if (info.n_chunks <= ENGINE_STEP_MAX_CHUNKS) info.chunks[info.n_chunks - 1].n++;
            continue;
        }
        if (info.n_chunks < ENGINE_STEP_MAX_CHUNKS) info.chunks[info.n_chunks] = (EngineStepChunk){a->req, 1};
        info.n_chunks++;
    }
    hk->step_fn(hk->ctx, &info);
}

/* Append running sequence i's tokens at positions [pos, pos + n) (tokens
 * sit at their positions in a->tokens). */
static void batch_put_tokens(Engine *e, Batch *b, int i, int32_t pos, int n) {
    const Active *a = e->running[i];
    for (int k = 0; k < n; k++, b->n++) {
        e->b_tok[b->n] = a->tokens[pos + k];
        e->b_seq[b->n] = i;
        e->b_pos[b->n] = pos + k;
    }
}

/* ... and what they cost: a decode's one token, or a prompt chunk. */
static void batch_put(Engine *e, Batch *b, int i, int32_t pos, int n, bool is_decode) {
    batch_put_tokens(e, b, i, pos, n);
    if (n > 0) b->shape = pacer_add(b->shape, is_decode ? pacer_decode(pos) : pacer_range(pos, n));
}

/* A chunk of n tokens of prefill (at most max_n) moved to a boundary of
 * the matmuls' tiles of tokens (fwd_token_lanes): a tile computes all
 * its lanes, so a pass costs about what its tokens rounded up to whole
 * tiles do, the tokens within a tile only their attention and vector
 * work (1.1B Q8_0: 165 ms a pass of 32 tokens, 224 ms of 33, 232 ms of
 * 48). Up to the next boundary when the pacer predicts that within
 * limit_s (its fit learns from passes of whole tiles, so that is what
 * the n tokens would cost anyway); else down to the last one, if the
 * chunk keeps a token (or need not: !must_run); else, and for the last
 * chunk of a prompt (n = max_n), as it is. */
static int chunk_to_lanes(const Engine *e, const Batch *b, int32_t pos, int n, int max_n, double limit_s,
                          bool must_run) {
    const int total = b->n + n, lanes = fwd_token_lanes(e->m, total), over = total % lanes;
    if (over == 0 || n == max_n) return n;
    int up = n + lanes - over;
    if (up <= max_n && pacer_predict(&e->pacer, pacer_add(b->shape, pacer_range(pos, up))) <= limit_s) return up;
    int down = n - over;
    return down > 0 || (down == 0 && !must_run) ? down : n;
}

/* How many tokens at positions [pos, pos + max_n) of a prefill join the
 * batch: with a step-time target, those the pacer lets in (is_first: the
 * step has no prompt token yet, and this chunk gets at least its share),
 * moved to a boundary of the matmuls' tiles (chunk_to_lanes). */
static int chunk_len(const Engine *e, const Batch *b, int32_t pos, int max_n, bool is_first) {
    if (e->opt.step_ms <= 0) return max_n;
    int n = pacer_fit_target(&e->pacer, b->shape, pos, max_n, is_first, b->target_s);
    if (n == 0 || e->pacer.n_obs == 0) return n;
    double share_s = is_first ? 2 * pacer_predict(&e->pacer, b->shape) : 0;
    return chunk_to_lanes(e, b, pos, n, max_n, b->target_s > share_s ? b->target_s : share_s, is_first);
}

/* Seconds a step's decodes alone (of shape s) take: the median of the
 * latest decode-only passes — not the step-time model's figure, which
 * passes with prompt chunks bend (up to twice a decode-only pass here),
 * nor their mean, which the few passes slowed by other work on the cores
 * (a tenth of them, at three to five times the rest) would pull up — or
 * the model's before one was measured. */
static double decodes_time(const Engine *e, PacerShape s) {
    if (e->n_decode_only == 0) return pacer_predict(&e->pacer, s);
    double v[ENGINE_DECODE_SAMPLES];
    memcpy(v, e->decode_only_s, (size_t)e->n_decode_only * sizeof *v);
    return mn_median_sort(v, e->n_decode_only);
}

/* A pass of a step with decodes took compute_s: a decode-only one joins
 * the samples decodes_time takes the median of. */
static void note_decode_pass(Engine *e, PacerShape s, double compute_s) {
    if (s.n_decode == 0) return;
    if (s.n_prefill > 0) {
        e->steps_since_decode_only++;
        return;
    }
    e->decode_only_s[e->decode_only_at] = compute_s;
    e->decode_only_at = (e->decode_only_at + 1) % ENGINE_DECODE_SAMPLES;
    if (e->n_decode_only < ENGINE_DECODE_SAMPLES) e->n_decode_only++;
    e->steps_since_decode_only = 0;
}

/* Whether a step with decodes and prompts pending leaves the prompts out
 * to measure the decodes alone (ENGINE_DECODE_STALE_STEPS). */
static bool is_decode_probe(const Engine *e, const Batch *b) {
    return e->opt.decode_step_ratio > 0 && e->opt.step_ms > 0 && b->shape.n_decode > 0 &&
           (e->n_decode_only < ENGINE_DECODE_MIN_SAMPLES || e->steps_since_decode_only >= ENGINE_DECODE_STALE_STEPS);
}

/* The time batch b's prompt chunks fill its pass to, once its decodes are
 * in: ENGINE_PREFILL_ONLY_STEPS targets when nothing decodes; beside
 * decodes the target, or with opt.decode_step_ratio that many times the
 * decodes' own predicted pass when that is shorter (none predicted yet, or
 * every decoder held back: the target). Every decoding conversation waits
 * for the whole step, so the ratio bounds a gap beside a prompt by a
 * multiple of a decode-only step's; the prompts' share moves into the
 * steps with nothing decoding, and their smaller chunks beside decodes
 * compute fewer tokens a second. */
static double step_target(const Engine *e, const Batch *b) {
    if (!b->has_decoder) return e->pacer.target_s * ENGINE_PREFILL_ONLY_STEPS;
    double decodes_s = b->shape.n_decode > 0 ? decodes_time(e, b->shape) : 0;
    double cap_s = e->opt.decode_step_ratio * decodes_s;
    return cap_s > 0 && cap_s < e->pacer.target_s ? cap_s : e->pacer.target_s;
}

/* Take the blocks running prompt i's next chunk of n tokens (from n_done)
 * writes, as far as the pool has room beside what it leaves to others:
 * the blocks promised to running sequences with fewer tokens to compute
 * (those that borrowed its room among them), and while something decodes
 * the decode reserve. Returns the chunk's length the table covers (0: the
 * prompt waits for room this step). */
static int grow_chunk(Engine *e, const Batch *b, int i, int n) {
    Active *a = e->running[i];
    int keep = (b->has_decoder ? e->reserve_blocks : 0) + promised_blocks(e, pending_tokens(a));
    int covered = seq_extend(&a->seq, &e->pool, a->n_done + n, keep) - a->n_done;
    e->b_seqs[i] = seq_view(&a->seq); /* the table may have grown */
    if (!a->mv.is_pending) e->b_plan[i] = e->b_seqs[i];
    return covered < n ? (covered > 0 ? covered : 0) : n;
}

/* ---- a chunk's layers over several steps ---------------------------------------- */

/* Drop the split chunks whose request left the running set since they
 * began (finished, cancelled, suspended, requeued: it computes the chunk
 * again) or failed a restore during the last pass. */
static void split_drop_stale(Engine *e) {
    for (int s = 0; s < ENGINE_SPLITS; s++) {
        Split *sp = &e->splits[s];
        bool is_live = false;
        for (int i = 0; sp->is_on && i < e->n_running && !is_live; i++) {
            const Active *a = e->running[i];
            is_live = a->arrival == sp->arrival && a->n_starts == sp->n_starts && !a->is_restore_failed;
        }
        sp->is_on = is_live;
    }
}

/* The split chunk of running sequence i under way, or NULL. */
static Split *split_of(Engine *e, int i) {
    const Active *a = e->running[i];
    for (int s = 0; s < ENGINE_SPLITS; s++)
        if (e->splits[s].is_on && e->splits[s].arrival == a->arrival) return &e->splits[s];
    return NULL;
}

/* Let split chunk sp of running sequence i into the step, if it has none
 * yet and room for its tokens: as many of its remaining layers as the
 * pacer predicts within the step's target — as the step's first chunk
 * (is_first) at least one, and as many as make it as long as the rest of
 * the step, as a first chunk gets. Returns its tokens (0: it waits). */
static int split_fit(Engine *e, Batch *b, int i, Split *sp, bool is_first, int room) {
    const int L = e->m->cfg.n_layer;
    if (b->split != NULL || sp->n > room) return 0;
    double share_s = is_first ? 2 * decodes_time(e, b->shape) : 0;
    double limit_s = b->target_s > share_s ? b->target_s : share_s;
    PacerShape whole = pacer_range(sp->pos, sp->n);
    sp->n_layers = pacer_fit_layers(&e->pacer, b->shape, whole, L, L - sp->layer, limit_s);
    PacerShape with = pacer_add(b->shape, pacer_part(whole, (double)sp->n_layers / L));
    if (!is_first && pacer_predict(&e->pacer, with) > limit_s) return 0;
    b->shape = with;
    b->split = sp;
    b->split_i = i;
    return sp->n;
}

/* Whether running prompt i, the step's first chunk, begins a split chunk
 * at pos (max_n tokens of it may join; n_whole would fit the step
 * whole): when the step has decodes to keep pace with, a carry slot is
 * free, and the chunk that a step of the target would hold without them
 * (moved down to a tile boundary) is more than twice n_whole — a chunk
 * about as long computes about as many tokens a second, and runs whole.
 * It leaves room in the batch for a decode token of every running slot
 * (parallel): its length is fixed until its last layer, and a step lets
 * it in only with room for all of it after the decodes. A tail chunk
 * takes its blocks (grow_chunk). */
static bool split_begin(Engine *e, Batch *b, int i, bool is_lead, int32_t pos, int max_n, int n_whole) {
    Active *a = e->running[i];
    Split *sp = NULL;
    for (int s = 0; s < ENGINE_SPLITS && sp == NULL; s++)
        if (!e->splits[s].is_on) sp = &e->splits[s];
    if (sp == NULL || !e->opt.layer_split || e->opt.step_ms <= 0 || e->pacer.n_obs == 0 || !b->has_decoder ||
        b->split != NULL || a->mv.is_pending || n_whole >= max_n)
        return false;
    int room = e->opt.batch_tokens - e->opt.parallel;
    int n = pacer_fit_target(&e->pacer, (PacerShape){0}, pos, max_n < room ? max_n : room, true, e->pacer.target_s);
    int lanes = fwd_token_lanes(e->m, n);
    if (n < max_n && n > lanes) n -= n % lanes;
    if (n <= 2 * n_whole) return false; /* the chunk that fits is about as efficient */
    if (!is_lead && (n = grow_chunk(e, b, i, n)) <= 2 * n_whole) return false;
    *sp = (Split){.is_on = true, .arrival = a->arrival, .n_starts = a->n_starts, .is_lead = is_lead, .pos = pos, .n = n};
    split_fit(e, b, i, sp, true, max_n);
    return true;
}

/* Put the step's split chunk's tokens at the batch's tail (forward.h,
 * n_split) and, in its last layers' step, its logit row when it ends the
 * prompt. */
static void split_put(Engine *e, Batch *b, FwdBatch *fb) {
    const Split *sp = b->split;
    int i = b->split_i;
    Active *a = e->running[i];
    batch_put_tokens(e, b, i, sp->pos, sp->n);
    fb->n_split = sp->n;
    fb->split_first = sp->layer;
    fb->split_end = sp->layer + sp->n_layers;
    fb->split_slot = (int)(sp - e->splits);
    e->b_wait[e->n_wait++] = e->b_plan[i]; /* its layers wait for its restores as a whole chunk's do */
    if (fb->split_end == e->m->cfg.n_layer && !sp->is_lead && sp->pos + sp->n == a->n_tokens && !a->is_completed) {
        e->b_logit[b->n_logits] = b->n - 1;
        e->b_owner[b->n_logits++] = a;
    }
}

/* After the pass: the step's split chunk has its layers done; when that
 * is all of them, its tokens count as computed (*n_advance: the batch's
 * tokens that do). */
static void split_done(Engine *e, const Batch *b, int *n_advance) {
    Split *sp = b->split;
    if (sp == NULL) return;
    e->running[b->split_i]->has_run = true;
    sp->layer += sp->n_layers;
    if (sp->layer < e->m->cfg.n_layer) *n_advance -= sp->n;
    else sp->is_on = false;
}

/* Add running sequence i's pending tokens to the batch, within room tokens:
 * all of a decode's; of a prefill, what chunk_len lets in. The two-range
 * form: the leading range first, and the tail only in a batch that
 * completes the leading range (it attends to it). A sequence whose last
 * pending token goes in gets a logit row (unless its answer is complete).
 * Returns the tokens added. */
static int batch_add(Engine *e, Batch *b, int i, int room) {
    Active *a = e->running[i];
    int lead = a->lead_end - a->lead_done, tail = a->n_tokens - a->n_done, pending = lead + tail;
    bool is_decode = pending == 1, is_first = !is_decode && b->shape.n_prefill == 0;
    int max_lead = lead < room ? lead : room;
    int take_lead = is_decode ? max_lead : chunk_len(e, b, a->lead_done, max_lead, is_first);
    if (lead > 0 && is_first && split_begin(e, b, i, true, a->lead_done, max_lead, take_lead)) return b->split->n;
    batch_put(e, b, i, a->lead_done, take_lead, is_decode);
    room -= take_lead;
    int take = 0;
    if (take_lead == lead) {
        int max_tail = tail < room ? tail : room;
        bool is_first_tail = is_first && take_lead == 0;
        take = is_decode ? max_tail : chunk_len(e, b, a->n_done, max_tail, is_first_tail);
        if (is_first_tail && split_begin(e, b, i, false, a->n_done, max_tail, take)) return b->split->n;
        if (!is_decode) take = grow_chunk(e, b, i, take);
        batch_put(e, b, i, a->n_done, take, is_decode);
    }
    if (take_lead + take == 0) return 0;
    e->b_wait[e->n_wait++] = e->b_plan[i]; /* the pass waits for its restored layers (and move sources') */
    if (a->mv.is_pending) e->b_moves[e->n_moves++] = a; /* a pass that runs it does its move */
    if (take_lead + take == pending && !a->is_completed) {
        e->b_logit[b->n_logits] = b->n - 1;
        e->b_owner[b->n_logits++] = a;
    }
    return take_lead + take;
}

/* Whether running prompt a's chunk goes before o's: one that waited
 * ENGINE_AGING_STEPS steps for a chunk first (the one waiting longest
 * first), then the fewest pending tokens (the request nearest to its
 * first token), then the earliest arrival. */
static bool is_served_before(const Active *a, const Active *o) {
    bool a_aged = a->n_unserved >= ENGINE_AGING_STEPS, o_aged = o->n_unserved >= ENGINE_AGING_STEPS;
    if (a_aged != o_aged) return a_aged;
    if (a_aged && a->n_unserved != o->n_unserved) return a->n_unserved > o->n_unserved;
    int pa = pending_tokens(a), po = pending_tokens(o);
    if (pa != po) return pa < po;
    return a->arrival < o->arrival;
}

/* The step's batch: decodes first (each running sequence's one pending
 * token), then prefills in is_served_before's order, each prompt's count
 * of steps without a chunk updated (a prompt held back for its restores
 * waits for them, not for the budget, and a step in which no chunk ends —
 * one that runs only middle layers of a split chunk — is not counted
 * against the others: their count stays). A prompt with a
 * split chunk under way runs layers of it, if no other split chunk runs
 * in the step; the step's first prompt chunk may begin one. The split
 * chunk's tokens go last (forward.h), into fb. A step that measures the
 * decodes alone (is_decode_probe) holds no prompt. */
static void batch_make(Engine *e, Batch *b, FwdBatch *fb) {
    memset(b, 0, sizeof *b);
    e->n_wait = e->n_moves = 0;
    split_drop_stale(e);
    int n_order = 0;
    for (int i = 0; i < e->n_running; i++) {
        const Active *a = e->running[i];
        int pending = pending_tokens(a);
        if (pending == 1) b->has_decoder = true;
        if (pending <= 0 || e->b_held[i]) continue;
        if (pending == 1) {
            if (b->n < e->opt.batch_tokens) batch_add(e, b, i, e->opt.batch_tokens - b->n);
            continue;
        }
        int k = n_order++; /* insertion sort: a handful of sequences */
        while (k > 0 && is_served_before(a, e->running[e->b_order[k - 1]])) {
            e->b_order[k] = e->b_order[k - 1];
            k--;
        }
        e->b_order[k] = i;
    }
    b->target_s = step_target(e, b);
    if (is_decode_probe(e, b)) n_order = 0; /* the prompts wait a (short) step: their counts stay */
    for (int k = 0; k < n_order; k++) {
        int i = e->b_order[k];
        Active *a = e->running[i];
        Split *sp = split_of(e, i);
        int room = e->opt.batch_tokens - b->n - (b->split != NULL ? b->split->n : 0), n = 0;
        if (sp != NULL) n = split_fit(e, b, i, sp, b->shape.n_prefill == 0, room);
        else if (room > 0) n = batch_add(e, b, i, room);
        a->n_unserved = n > 0 ? 0 : a->n_unserved + 1;
    }
    bool ends_chunk = b->n > b->shape.n_decode || (b->split && b->split->layer + b->split->n_layers == e->m->cfg.n_layer);
    for (int k = 0; k < n_order && !ends_chunk; k++) /* it runs middle layers of a split chunk only */
        if (e->running[e->b_order[k]]->n_unserved > 0) e->running[e->b_order[k]]->n_unserved--;
    if (b->split != NULL) split_put(e, b, fb);
}

/* Charge a pass of pass_s seconds, wait_s of them waiting for restored
 * layers, to the restore time of the running prompts before their first
 * token: all of it to those that sat it out for their restores, its waits
 * to those in it (they waited for their own layers or for another's). */
static void count_restore_waits(Engine *e, double pass_s, double wait_s) {
    for (int i = 0; i < e->n_running; i++) {
        Active *a = e->running[i];
        if (a->n_generated == 0 && !a->is_completed) a->restore_s += e->b_held[i] ? pass_s : wait_s;
    }
}

static void engine_step(Engine *e) {
    bool has_tiers = tiers_is_on(e->tiers);
    if (has_tiers) {
        tiers_take_events(e->tiers, false);
        requeue_all_failed(e);
        tiers_save_cold(e->tiers);
    }
    mark_window(e);
    admit_waiting(e);
    /* after admission: a request admitted now restores its history from
     * where it is, at once (a promote would only put a copy into RAM on its
     * way); the window's requests that still wait get theirs into RAM */
    tiers_promote_window(e->tiers);
    /* every running sequence needs blocks for its pending tokens */
    for (int i = 0; i < e->n_running; i++)
        if (!ensure_blocks(e, i)) i = -1; /* the list changed: start over */
    if (e->n_running == 0) return;
    for (int i = 0; i < e->n_running; i++) {
        const Active *a = e->running[i];
        e->b_seqs[i] = seq_view(&a->seq);
        e->b_plan[i] = a->mv.is_pending ? (AttnSeq){a->mv.wait_blocks, a->mv.n_wait} : e->b_seqs[i];
    }
    tiers_plan_step(e->tiers, e->b_plan, e->n_running, e->b_held);
    Batch bt;
    FwdBatch b = {.n_split = 0};
    batch_make(e, &bt, &b);
    if (bt.n == 0) { /* every prompt waits for room that only they hold (grow_chunk's rule should
                          leave the shortest its room: a guard) */
        LOG_WARN("every running prompt waits for pool room; suspending the latest arrival");
        suspend_latest(e);
        return;
    }
    test_step(e, &bt, &b);
    int n = bt.n, n_logits = bt.n_logits;
    b.n_tok = n;
    b.tokens = e->b_tok;
    b.seq = e->b_seq;
    b.pos = e->b_pos;
    b.seqs = e->b_seqs;
    b.n_seqs = e->n_running;
    b.logit_idx = e->b_logit;
    b.n_logits = n_logits;
    if (tiers_is_restoring(e->tiers) || e->n_moves > 0) {
        b.wait_layer = wait_restored_layer;
        b.wait_ctx = e;
    }
    const float *logits;
    MnErr err = {0};
    double t0 = engine_now(e, ENGINE_CLOCK_STEP);
    if (fwd_run(e->fwd, &b, &logits, &err) != MN_OK) {
        LOG_ERROR("forward pass failed: %s", err.msg);
        e->n_moves = 0;
        fail_all_running(e, err.msg);
        return;
    }
    finish_moves(e);
    double pass_s = engine_now(e, ENGINE_CLOCK_STEP) - t0;
    double compute_s = tiers_step_done(e->tiers, pass_s);
    pacer_observe(&e->pacer, bt.shape, compute_s);
    note_decode_pass(e, bt.shape, compute_s);
    count_restore_waits(e, pass_s, pass_s - compute_s);
    /* advance, register full blocks (not for a sequence whose restore
     * failed during the pass: its work is discarded below; not for a
     * split chunk's tokens before their last layer) */
    int n_advance = n;
    split_done(e, &bt, &n_advance);
    for (int t = 0; t < n_advance; t++) {
        Active *a = e->running[e->b_seq[t]];
        if (a->is_restore_failed) continue;
        a->has_run = true;
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
    }
    if (has_tiers) requeue_all_failed(e);
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

/* A new request's prompt blocks that nothing here holds may be in the
 * shared tier, stored by another instance: ask (the answer is a mover
 * event; admission waits for it). */
static void probe_shared(Engine *e, Active *a) {
    if (e->index == NULL) return;
    int max_blocks = (a->n_tokens - 1) / e->opt.block_tokens;
    active_hash_blocks(e, a, max_blocks * e->opt.block_tokens);
    tiers_probe(e->tiers, a->tier, max_blocks);
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
                probe_shared(e, a);
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
    tiers_expire(e->tiers);
    int n = kvpool_expire(&e->pool, engine_now(e, ENGINE_CLOCK_EXPIRY) - e->opt.cache_ttl_s);
    if (n == 0) return;
    pthread_mutex_lock(&e->stats_lock);
    e->stats.expired_blocks += (uint64_t)n;
    pthread_mutex_unlock(&e->stats_lock);
    stats_update_gauges(e);
}

/* Each compute thread lowers its own priority: ctx holds the increment
 * on the way in and each thread's result (ith) on the way out. */
static void nice_job(void *ctx, int ith, int nth) {
    (void)nth;
    int *rc = ctx;
    rc[ith] = mn_thread_nice_add(rc[ith]);
}

/* The compute threads (this one, which runs ith 0 of every job, and the
 * pool's workers) run opt.compute_nice levels below the mover and the
 * HTTP threads (base/sched.h). Refused, they keep their priority. */
static void lower_compute_priority(Engine *e) {
    ThreadPool *tp = fwd_tpool(e->fwd);
    int n = tpool_size(tp), *rc = mn_calloc((size_t)n, sizeof *rc);
    if (rc == NULL) {
        LOG_WARN("out of memory lowering the compute threads' priority; they keep it");
        return;
    }
    for (int i = 0; i < n; i++) rc[i] = e->opt.compute_nice;
    tpool_run(tp, nice_job, rc);
    for (int i = 0; i < n; i++)
        if (rc[i] != MN_OK) {
            LOG_WARN("compute thread %d keeps its priority: %s", i, mn_strerror(rc[i]));
            break;
        }
    mn_free(rc);
}

/* Touch the next ENGINE_TOUCH_BYTES of FREE pool slots (kvpool_touch_free),
 * between requests: a restore into a pool whose pages were never written
 * spent more on mapping them than on its bytes on the virtual machines
 * this runs on (a Redis restore of 341 MB: 1.85-2.05 s untouched,
 * 1.27-1.48 s touched; docs/DESIGN.md), and touching the whole pool at start-up held
 * the server back 20 s for 2.8 GiB there. A request arriving meanwhile
 * waits for one piece at most. */
static void touch_pool(Engine *e) {
    e->is_touching = kvpool_touch_free(&e->pool, ENGINE_TOUCH_BYTES);
    pthread_mutex_lock(&e->stats_lock);
    e->stats.pool_untouched_blocks = e->pool.n_blocks - e->pool.touch_next;
    pthread_mutex_unlock(&e->stats_lock);
}

static void *engine_main(void *arg) {
    Engine *e = arg;
    if (e->opt.compute_nice > 0) lower_compute_priority(e);
    for (;;) {
        expire_cached(e);
        pthread_mutex_lock(&e->inbox_lock);
        while (!e->inbox_head && !tiers_has_events(e->tiers) && !e->is_stopping && e->n_running == 0 &&
               e->n_waiting == 0) {
            if (e->is_touching) { /* idle: map the pool's pages, a piece at a time */
                pthread_mutex_unlock(&e->inbox_lock);
                touch_pool(e);
                pthread_mutex_lock(&e->inbox_lock);
                continue;
            }
            if (e->opt.cache_ttl_s <= 0 || (kvpool_n_cached(&e->pool) == 0 && !tiers_is_on(e->tiers))) {
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
        if (e->n_running == 0 && e->n_waiting > 0 && tiers_is_moving(e->tiers)) {
            tiers_take_events(e->tiers, true); /* a move in flight may let it in: wait for one to end */
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

/* A seed for a request that names none: unpredictable, and different for
 * requests submitted in the same instant. */
static uint64_t random_seed(const Request *r) {
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed) return seed;
    /* no entropy yet (early boot): the clock and the request's address */
    return (uint64_t)(mn_now() * 1e9) ^ (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)r;
}

/* A sequence holds at most the pool's blocks (and the context). */
static int64_t pool_room(const Engine *e) { return (int64_t)e->pool.n_blocks * e->opt.block_tokens; }

/* submit_check's length rule, without its messages. */
bool engine_prompt_fits(const Engine *e, size_t n_prompt, int max_tokens) {
    int64_t pool_tokens = pool_room(e), room = pool_tokens < e->opt.n_ctx ? pool_tokens : e->opt.n_ctx;
    return n_prompt < (uint64_t)room && (int64_t)n_prompt + max_tokens <= room;
}

/* engine_submit's checks, in its contract's order, and the defaults: the
 * submitting thread still owns r alone, so its params may be completed. */
static int submit_check(const Engine *e, Request *r, MnErr *err, ReqField *field) {
    int32_t n_vocab = e->m->cfg.n_vocab;
    int64_t n = (int64_t)r->n_prompt, n_ctx = e->opt.n_ctx, pool_tokens = pool_room(e);
    *field = REQ_FIELD_PROMPT;
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= n_vocab)
            return mn_err_set(err, MN_EINVAL, "prompt: token id %d is out of range [0, %d)", r->prompt[i], n_vocab);
    if (n >= n_ctx)
        return mn_err_set(err, MN_ERANGE, "the prompt has %lld tokens; the context holds %lld", (long long)n,
                          (long long)n_ctx);
    if (n >= pool_tokens)
        return mn_err_set(err, MN_ERANGE, "the prompt has %lld tokens; the KV pool holds %lld", (long long)n,
                          (long long)pool_tokens);
    ReqParams *p = &r->params;
    *field = REQ_FIELD_LOGIT_BIAS;
    for (int i = 0; i < p->sp.n_logit_bias; i++)
        if (p->sp.logit_bias[i].id < 0 || p->sp.logit_bias[i].id >= n_vocab)
            return mn_err_set(err, MN_EINVAL, "logit_bias: token id %d is out of range [0, %d)",
                              p->sp.logit_bias[i].id, n_vocab);
    *field = REQ_FIELD_NONE;
    if (!sampler_params_valid(&p->sp, n_vocab))
        return mn_err_set(err, MN_EINVAL, "a sampling parameter is out of range");
    *field = REQ_FIELD_MAX_TOKENS;
    bool is_pool = pool_tokens < n_ctx;
    int64_t room = is_pool ? pool_tokens : n_ctx, left = room - n; /* left >= 1: checked above */
    if (p->max_tokens == 0) {
        int dflt = e->opt.default_max_tokens;
        p->max_tokens = dflt > 0 && dflt < left ? dflt : (int)left;
    }
    if (p->max_tokens > left)
        return mn_err_set(err, MN_ERANGE,
                          "max_tokens must be between 1 and %lld for this prompt of %lld tokens (the %s holds %lld)",
                          (long long)left, (long long)n, is_pool ? "KV pool" : "context", (long long)room);
    *field = REQ_FIELD_NONE;
    if (p->is_seed_random) {
        p->sp.seed = random_seed(r);
        p->is_seed_random = false;
    }
    return MN_OK;
}

int engine_submit(Engine *e, Request *r, MnErr *err, ReqField *field) {
    ReqField ignored;
    if (field == NULL) field = &ignored;
    int rc = submit_check(e, r, err, field);
    if (rc != MN_OK) return rc;
    rc = post(e, MSG_SUBMIT, r, true);
    if (rc == MN_EBUSY) mn_err_set(err, rc, "the queue is full (%d requests)", e->opt.max_queue);
    else if (rc) mn_err_set(err, rc, "the engine is %s", rc == MN_ECANCELED ? "shutting down" : "out of memory");
    return rc;
}

void engine_cancel(Engine *e, Request *r) {
    if (post(e, MSG_CANCEL, r, false) != MN_OK) LOG_WARN("could not post a cancel");
}

/* ---- construction ------------------------------------------------------------- */

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
    op->cost = NULL; /* SlotPolicy keeps its own copy (below) */
    if (op->n_ctx <= 0 || op->n_ctx > m->cfg.n_ctx) op->n_ctx = m->cfg.n_ctx;
    int rc = MN_OK;
    if (op->block_tokens < 1 || op->block_tokens > 1024 || op->batch_tokens < 1 || !(op->step_ms >= 0) ||
        !(op->decode_step_ratio == 0 || (op->decode_step_ratio >= 1 && op->decode_step_ratio <= 100)) ||
        op->parallel < 1 ||
        op->max_queue < 1 || op->n_threads < 1 || op->compute_nice < 0 || op->compute_nice > 19 ||
        !(op->decode_reserve >= 0 && op->decode_reserve < 1) ||
        !(op->cache_ttl_s >= 0))
        rc = mn_err_set(err, MN_EINVAL, "engine options out of range");
    if (op->restore_plan != RESTORE_PLAN_KV && op->restore_plan != RESTORE_PLAN_HIDDEN &&
        op->restore_plan != RESTORE_PLAN_AUTO)
        rc = mn_err_set(err, MN_EINVAL, "engine options out of range");
    /* hidden states are captured into arenas of their own, counted in the
     * pool's size, when a plan may store them */
    const uint64_t hidden_layers = rc == MN_OK ? hidden_layers_of(m, op) : 0;
    const bool has_hidden = hidden_layers != 0;
    const size_t hid_row = has_hidden ? fwd_hidden_row_bytes(m) : 0;
    uint64_t per_block = kvpool_bytes_for(m->cfg.n_layer, m->cfg.kv_dim, op->block_tokens, 1, op->kv_type) +
                         (uint64_t)hidden_layer_count(m) * (uint64_t)op->block_tokens * hid_row;
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
    uint64_t n_blocks = 0; /* with options out of range, per_block may be 0: no pool (rc says why) */
    if (rc == MN_OK) n_blocks = op->pool_blocks > 0 ? (uint64_t)op->pool_blocks : pool_bytes / per_block;
    if (rc == MN_OK && n_blocks < 2) rc = mn_err_set(err, MN_EINVAL, "a KV pool of %llu MB holds no blocks", (unsigned long long)op->pool_mb);
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    if (rc == MN_OK && (rc = kvpool_init(&e->pool, m->cfg.n_layer, m->cfg.kv_dim, op->block_tokens, (int)n_blocks,
                                         op->kv_type)))
        mn_err_set(err, rc, "cannot allocate a KV pool of %llu blocks", (unsigned long long)n_blocks);
    if (rc == MN_OK && has_hidden && (rc = kvpool_init_hidden(&e->pool, hid_row)) != MN_OK)
        mn_err_set(err, rc, "cannot allocate the hidden states of %llu blocks", (unsigned long long)n_blocks);
    int max_replies = ENGINE_MAX_REPLIES * (op->context_overflow == OVERFLOW_SHIFT ? 2 : 1);
    if (rc == MN_OK) {
        e->reserve_blocks = (int)(op->decode_reserve * (float)n_blocks);
        pacer_init(&e->pacer, op->step_ms / 1000, op->block_tokens);
        e->kv_format = index_kv_format(op->kv_type, op->block_tokens);
        if (op->prefix_cache && (e->index = index_new(&e->pool)) == NULL) rc = MN_ENOMEM;
        e->replies = replymem_new(max_replies);
        int np = op->parallel, bt = op->batch_tokens;
        e->running = mn_calloc((size_t)np, sizeof *e->running);
        e->b_owner = mn_calloc((size_t)np, sizeof *e->b_owner);
        e->b_seqs = mn_calloc((size_t)np, sizeof *e->b_seqs);
        e->b_held = mn_calloc((size_t)np, sizeof *e->b_held);
        e->b_wait = mn_calloc((size_t)np, sizeof *e->b_wait);
        e->b_plan = mn_calloc((size_t)np, sizeof *e->b_plan);
        e->b_moves = mn_calloc((size_t)np, sizeof *e->b_moves);
        e->b_order = mn_calloc((size_t)np, sizeof *e->b_order);
        e->b_tok = mn_calloc((size_t)bt, sizeof(int32_t));
        e->b_seq = mn_calloc((size_t)bt, sizeof(int32_t));
        e->b_pos = mn_calloc((size_t)bt, sizeof(int32_t));
        e->b_logit = mn_calloc((size_t)np, sizeof(int32_t));
        if (rc == MN_OK && (rc = slotpol_new(&e->pool, op->evict, o->cost, &e->slots)) == MN_OK && e->index)
            kvpool_set_choose_fn(&e->pool, slotpol_choose_victim, e->slots);
        e->piece_cap = tok_max_piece_bytes(m->tok) + 16;
        e->piece = mn_malloc(e->piece_cap);
        e->lp_row = mn_malloc((size_t)m->cfg.n_vocab * sizeof *e->lp_row);
        if (rc || !e->replies || !e->running || !e->b_owner || !e->b_seqs || !e->b_held || !e->b_wait || !e->b_plan ||
            !e->b_moves || !e->b_order || !e->b_tok ||
            !e->b_seq || !e->b_pos || !e->b_logit || !e->piece || !e->lp_row)
            rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    if (rc == MN_OK) {
        FwdOptions fo = {op->batch_tokens, op->parallel, op->n_ctx, op->n_threads, op->layer_split ? ENGINE_SPLITS : 0};
        rc = fwd_new(m, &e->pool, &fo, &e->fwd, err);
    }
    if (rc == MN_OK && (rc = kvshift_new(m, op->n_ctx, &e->pool, &e->shifter)) != MN_OK)
        mn_err_set(err, rc, "out of memory");
    if (rc == MN_OK) {
        TiersConfig tc = {.pool = &e->pool,
                          .index = e->index,
                          .slots = e->slots,
                          .replies = e->replies,
                          .max_replies = max_replies,
                          .model_fingerprint = m->fingerprint,
                          .kv_format = e->kv_format,
                          .opt = op,
                          .reserve_blocks = e->reserve_blocks,
                          .lock = &e->inbox_lock,
                          .cond = &e->inbox_cond,
                          .on_lost_fn = mark_holders_failed,
                          .on_restored_fn = note_restored,
                          .ctx = e,
                          .hidden_layers = hidden_layers,
                          .is_auto = op->restore_plan == RESTORE_PLAN_AUTO,
                          .project_fn = project_restored};
        rc = tiers_new(&tc, &e->tiers, err);
        op->disk_tier_dir = NULL; /* borrowed for engine_new only */
        /* the projection time's first figure: the auto plan splits by it, and any plan's restores
         * of hidden states are estimated with it (tiers_plan_step) before one is measured */
        if (rc == MN_OK && tc.hidden_layers != 0 && tiers_is_on(e->tiers)) measure_projection(e);
        if (rc == MN_OK) log_plan_fallback(m, op, hidden_layers, tiers_is_on(e->tiers));
    }
    if (rc == MN_OK) {
        e->stats.pool_blocks = e->stats.pool_untouched_blocks = e->pool.n_blocks;
        e->is_touching = true;
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
    tiers_free(e->tiers);
    fwd_free(e->fwd);
    kvshift_free(e->shifter);
    index_free(e->index);
    kvpool_deinit(&e->pool);
    replymem_free(e->replies);
    mn_free(e->running);
    mn_free(e->b_owner);
    mn_free(e->b_seqs);
    mn_free(e->b_held);
    mn_free(e->b_wait);
    mn_free(e->b_plan);
    mn_free(e->b_moves);
    mn_free(e->b_order);
    mn_free(e->b_tok);
    mn_free(e->b_seq);
    mn_free(e->b_pos);
    mn_free(e->b_logit);
    mn_free(e->piece);
    mn_free(e->lp_row);
    slotpol_free(e->slots);
    pthread_mutex_destroy(&e->inbox_lock);
    pthread_cond_destroy(&e->inbox_cond);
    pthread_mutex_destroy(&e->stats_lock);
    mn_free(e);
}
