/* engine.h — the serving engine: requests in, tokens out, continuous
 * batching over a shared KV pool with an automatic prefix cache.
 *
 * One engine thread runs the scheduler, the forward pass and the samplers,
 * one step at a time. Other threads (HTTP) talk to it only through queues:
 * engine_submit and engine_cancel post messages to its inbox, and each
 * Request carries its own output channel that the engine fills with text and
 * a final result, which the submitting thread drains with request_read.
 *
 * Each step packs the decode tokens of running sequences and chunks of
 * prefills into one batch, the prefills nearest to their first token
 * first, sized so that the step's forward pass is predicted to take
 * step_ms (from the passes measured so far), at most batch_tokens tokens:
 * running decodes keep their pace while a long prompt is computed, and a
 * returning turn's few new tokens go ahead of a long prompt's — but a
 * running prompt that got no chunk in ENGINE_AGING_STEPS steps in a row
 * goes first in the next (aging), so none starves. Finished
 * requests leave their full blocks in the pool, indexed by chain hash
 * (cache/index.h), and the filled part of their last block; a new request
 * reuses the longest cached prefix of its namespace, down to the token: full
 * blocks by chain hash, then the rows of one more block that a pool block
 * after the same parent holds for its next tokens. When the pool runs out
 * during decoding, the most recently arrived running sequence is suspended
 * (its full blocks stay cached) and resumed later. When every slot
 * (parallel) is taken and a waiting request has far fewer tokens to compute
 * before its first token than a running prompt has left, that prompt is
 * preempted the same way (at most twice) and the waiting one takes its
 * slot; a step with no decoding sequence sizes its prompt chunks to a few
 * step targets. Beside decodes a step is held to a few decode-only steps'
 * time (decode_step_ratio), and a prompt chunk that would not fit it runs
 * its layers over several steps (layer_split), so the chunk keeps the size
 * that computes prompt tokens fast. Outputs are identical
 * with the prefix cache on or off (the kernels are batch-invariant), except
 * where a chat cut for context overflow in shift mode reuses KV moved from
 * other positions (ReqShift, below): an approximation that depends on what
 * is cached.
 */
#ifndef MN_ENGINE_H
#define MN_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hash.h"
#include "base/ttype.h"
#include "cache/cost.h"
#include "cache/mover.h"
#include "cache/policy.h"
#include "cache/reply_mem.h"
#include "engine/sampler.h"
#include "model/chat_format.h"
#include "model/model.h"

typedef enum SchedPolicy { SCHED_FCFS, SCHED_FPF, SCHED_RELAXED_FPF } SchedPolicy;

/* What a chat prompt (plus its max_tokens) longer than the context gets
 * (engine/prompt.h). */
typedef enum ContextOverflow {
    OVERFLOW_SHIFT = 0,     /* its oldest whole turns are dropped; the kept ones reuse their cached KV,
                               moved to their new positions (an approximation) */
    OVERFLOW_RECOMPUTE,     /* its oldest whole turns are dropped and the kept ones computed anew (exact) */
    OVERFLOW_ERROR,         /* refused, as any prompt too long (MN_ERANGE) */
} ContextOverflow;

/* How the tiers store a run's layers (docs/DESIGN.md, "Hidden-state
 * restore"). */
typedef enum RestorePlan {
    RESTORE_PLAN_KV = 0,  /* every layer as K/V */
    RESTORE_PLAN_HIDDEN,  /* as the hidden states its K/V are projected from, where those are smaller
                             than K/V; restored by projecting them */
    RESTORE_PLAN_AUTO,    /* per saved run, its first layers as hidden states and the rest as K/V, as
                             many as make the projections and the reads of a restore end together
                             (measured projection time, the slowest tier's read bandwidth); with no
                             tier below RAM (disk, Redis), every layer as K/V (default) */
} RestorePlan;

/* What a reading of the engine's clock decides (EngineTestHooks). */
typedef enum EngineClockUse {
    ENGINE_CLOCK_STEP,   /* the start and end of a forward pass: its compute time */
    ENGINE_CLOCK_WAIT,   /* the start and end of a wait for restored layers in a pass */
    ENGINE_CLOCK_EXPIRY, /* what the cache TTL expires, and when the tiers are asked next */
    ENGINE_CLOCK_BACKOFF, /* when saving resumes after saves no tier took */
    ENGINE_CLOCK_PROJECT, /* the start and end of a projection of restored hidden states */
    ENGINE_CLOCK_QUEUE,   /* a request entering and leaving the waiting queue (ReqResult.queue_s) */
} EngineClockUse;

/* A running prompt waits at most this many steps in a row for a chunk of
 * its prompt (unless held back for its restores; steps that end no chunk,
 * running only middle layers of a split one, are not counted); then it
 * goes first in the next step's prefill order. */
#define ENGINE_AGING_STEPS 4

/* The default EngineOptions.decode_step_ratio: a step beside decodes
 * takes at most this many decode-only steps' time, so an inter-token gap
 * beside a prompt stays within about that many typical gaps (3, not 4:
 * issue 22's load kept its p99 gap within 3x the p50 in six runs of six
 * at 3, three of six at 4, for about 4% of its throughput; docs/PERFORMANCE.md). */
#define ENGINE_DECODE_STEP_RATIO 3

/* A prompt chunk of a step (EngineStepInfo). */
typedef struct EngineStepChunk {
    const struct Request *req; /* whose prompt (valid during the step_fn call; compare, do not use) */
    int n;                     /* its tokens in the step */
} EngineStepChunk;
#define ENGINE_STEP_MAX_CHUNKS 8

/* What a step is about to compute (EngineTestHooks.step_fn). */
typedef struct EngineStepInfo {
    int n_running;      /* requests running */
    int n_held_back;    /* ... of them sitting out this step: their restores are
                           not expected to finish within its compute */
    int n_decode;       /* tokens of the sequences with one token pending */
    int n_prefill;      /* tokens of prompt chunks that run every layer */
    int n_split;        /* tokens of the chunk whose layers run over several steps (0: none) ... */
    int split_first;    /* ... the first of its n_layer layers this step runs ... */
    int split_layers;   /* ... and how many */
    int n_layer;
    double n_keys;      /* keys the batch's tokens attend to (the sum of position + 1; a split
                           chunk's by its share of the layers) */
    double predicted_s; /* the step-time model's estimate of its pass (0 before it measured one) */
    int n_chunks;       /* prompt chunks (requests with prompt tokens in the step) */
    EngineStepChunk chunks[ENGINE_STEP_MAX_CHUNKS]; /* the first of them, in batch order */
} EngineStepInfo;

/* Hooks for tests, so that a test drives the engine's time and order of
 * events instead of sleeping and hoping that a loaded machine keeps up; a
 * production engine has none. Both are called on the engine thread and
 * may be NULL. */
typedef struct EngineTestHooks {
    /* Seconds added to a reading of the engine's clocks (monotonic and
     * wall) of this use: time moves as the test says, not as the machine
     * runs. */
    double (*clock_shift_fn)(void *ctx, EngineClockUse use);
    /* Before each forward pass, its batch made: what it holds. It may
     * block: a test holds the engine there while it lines up what arrives
     * during a request's run. */
    void (*step_fn)(void *ctx, const EngineStepInfo *step);
    /* Before a restored layer's hidden states are projected: true makes
     * that projection fail (a fault to test the path with). May be NULL. */
    bool (*project_fails_fn)(void *ctx, int layer);
    void *ctx;
} EngineTestHooks;

/* What hk (NULL: none, as in production) adds to a reading of the
 * engine's clock of this use: the scheduler's and the tiers' clocks both
 * go through it. */
double engine_clock_shift(const EngineTestHooks *hk, EngineClockUse use);

/* The disk tier budget engine_options_default gives, in MiB. */
#define ENGINE_DISK_TIER_MB_DEFAULT 4096

typedef struct EngineOptions {
    int n_threads;        /* compute workers (default 2) */
    int compute_nice;     /* they run this many nice levels lower than the rest, 0-19 (default 5) */
    int block_tokens;     /* default 32 */
    int batch_tokens;     /* tokens per step at most (default 512) */
    double step_ms;       /* a step's time target: prefill chunks are sized so that each
                             forward pass is predicted to take this long (engine/pacer.h);
                             0: every step takes up to batch_tokens (default 500) */
    double decode_step_ratio; /* a step that holds decode tokens is held to this many times
                             what its decodes alone are predicted to take, when that is
                             shorter than step_ms (0: off; else 1 to 100; default
                             ENGINE_DECODE_STEP_RATIO) */
    bool layer_split;     /* a prompt chunk of a step's target that does not fit a step beside
                             decodes runs its layers over several steps (default true) */
    int parallel;         /* running sequences at most (default 8) */
    int max_queue;        /* waiting requests at most (default 64) */
    int n_ctx;            /* positions per sequence (default: the model's) */
    uint64_t pool_mb;     /* KV pool size; 0 = a share of free RAM */
    int pool_blocks;      /* KV pool size in blocks; overrides pool_mb when > 0 */
    float decode_reserve; /* fraction of the pool kept for running sequences (0.1) */
    MnType kv_type;       /* default f16 */
    bool prefix_cache;    /* default true */
    SchedPolicy schedule; /* default FCFS */
    const ChatFormat *chat_format; /* renders chat prompts (engine/prompt.h; borrowed, outlives the
                                      engine); NULL (default): chat_format_default() */
    ContextOverflow context_overflow; /* what prompt_submit does with a chat too long (default shift) */
    int default_max_tokens; /* max_tokens of a request that leaves it to the engine (ReqParams.max_tokens
                               0), capped by the room its prompt leaves; <= 0 (default): that room */
    double cache_ttl_s;   /* cached blocks idle longer than this are dropped; 0 = never */
    EvictPolicy evict;    /* which cached pool block goes first (default pensieve+lookahead) */
    const CostModel *cost; /* recompute cost by position for pensieve (copied); NULL: grows with position */
    /* tiers below the pool (cache/mover.h); need the prefix cache */
    uint64_t ram_tier_mb;      /* host RAM tier; 0 = none */
    const char *disk_tier_dir; /* disk tier directory; NULL = none (borrowed during engine_new) */
    uint64_t disk_tier_mb;     /* disk tier budget in MiB (ENGINE_DISK_TIER_MB_DEFAULT; 0 taken as it) */
    float swap_watermark;      /* write-behind of cold blocks when free pool blocks fall under this fraction (0.25) */
    const char *const *redis_urls; /* (n_redis_urls) the shared tier's store (cache/tier_redis.c): one
                                  server's URL, or a cluster's seeds; none = no shared tier (borrowed
                                  during engine_new) */
    int n_redis_urls;
    bool redis_cluster;        /* the URLs are seeds of a Redis Cluster */
    int redis_ttl_s;           /* its keys expire this long after their last use; 0 = never (default) */
    int redis_timeout_ms;      /* its connection's timeout; 0 = the tier's default */
    RestorePlan restore_plan;  /* how saves store layers (default auto) */
    bool measure_tiers;        /* measure each tier's read rate as the engine starts, so that the
                                  restore planner has a figure of this machine before the first
                                  restore (cache/mover.h: MOVER_MEASURE_BYTES through each tier).
                                  Off here (tests start without that I/O); `mnemo serve` turns it on */
    uint64_t test_hidden_layers; /* tests only: with restore_plan hidden (auto), exactly these layers (bit l:
                                    layer l) are (may be) stored as hidden states, whatever their size;
                                    0: the plan's */
    const MoverTestHooks *mover_hooks; /* tests only: MoverConfig.hooks; NULL normally */
    const EngineTestHooks *test_hooks; /* tests only (borrowed, outlives the engine); NULL normally */
    int test_table_faults;             /* tests only: the next N block-table growths fail
                                          as out of memory; 0 normally */
} EngineOptions;

/* Where the cached prompt tokens of a request came from. */
typedef enum CacheSource { SRC_POOL = 0, SRC_RAM, SRC_DISK, SRC_REDIS, SRC_COUNT } CacheSource;
const char *engine_source_name(CacheSource s); /* "pool", "ram", "disk", "redis" */

/* How the prompt tokens of a request's cached run that were not in the
 * pool came back (ReqResult.n_restored_by; docs/API.md, restored_by):
 * read from a tier as K/V; read as hidden states and projected; or
 * recomputed — the leading blocks of a cached run that every tier had
 * dropped, computed again so that the cached blocks after them could be
 * used. A token whose layers came both ways counts in kv and hidden in
 * proportion to its layers (the request's sum rounded to whole tokens). */
typedef enum RestorePath { RESTORE_KV = 0, RESTORE_HIDDEN, RESTORE_RECOMPUTE, RESTORE_PATH_COUNT } RestorePath;
const char *engine_restore_path_name(RestorePath p); /* "kv", "hidden", "recompute" */

#define ENGINE_MAX_STOP 4

typedef struct ReqParams {
    SamplerParams sp;     /* sp.logit_bias is copied by request_new */
    bool is_seed_random;  /* ignore sp.seed: engine_submit draws one (a client that gave none) */
    int max_tokens;       /* > 0, or 0: engine_submit applies EngineOptions.default_max_tokens */
    bool ignore_eos;
    const char *stop[ENGINE_MAX_STOP]; /* copied by request_new */
    int n_stop;
    bool is_logprobs;     /* report each generated token's logprob (ReqOutput.logprobs) */
    int n_top_logprobs;   /* ... with this many alternatives, 0..ENGINE_MAX_TOP_LOGPROBS */
    float *first_logits;  /* optional (n_vocab) floats: the logits the first token was
                             sampled from are copied here before the request finishes
                             (tests compare restore paths with a recompute) */
} ReqParams;

#define ENGINE_MAX_TOP_LOGPROBS SAMPLER_MAX_TOP_LOGPROBS

/* The log-probabilities at one generated token: the model's distribution
 * (sampler_logprobs: log-softmax of the raw logits, whatever the sampling
 * settings), the token drawn from it and the most likely alternatives. */
typedef struct ReqLogprob {
    TokenProb token;                        /* the generated token */
    TokenProb top[ENGINE_MAX_TOP_LOGPROBS]; /* top[0..n_top): the most likely tokens, best first */
    int32_t n_top;                          /* ReqParams.n_top_logprobs (fewer for a tiny vocabulary) */
    int32_t text_offset;                    /* code points of the answer's text before the character
                                               where this token's text begins */
} ReqLogprob;

typedef enum FinishReason {
    FINISH_NONE = 0,  /* still running */
    FINISH_STOP,      /* end-of-generation token or a stop string */
    FINISH_LENGTH,    /* max_tokens reached */
    FINISH_CANCELLED, /* cancelled by the client or shutdown */
    FINISH_ERROR,
} FinishReason;

typedef struct ReqResult {
    FinishReason finish;
    int n_prompt;
    int n_cached;      /* prompt tokens found cached at admission (all sources) */
    int n_cached_by[SRC_COUNT]; /* ... split by where they were */
    int n_shifted;     /* ... of which KV moved from other positions (context overflow, shift) */
    int n_restored_by[RESTORE_PATH_COUNT]; /* tokens of the cached run restored by each path: kv +
                          hidden are its tokens found in a tier (not the shifted ones), split by
                          their layers, recompute the dropped leading blocks computed again (not
                          in n_cached) */
    int n_cached_partial; /* ... of them rows copied from a pool block that matched in part
                             (the filled part of a turn's last block; counted in SRC_POOL) */
    int n_generated;
    int n_preempted;   /* times its prompt's computation gave its slot to a request with far
                          fewer tokens to compute (it resumed from what it had cached) */
    double ttft_s;     /* submit -> first token */
    double queue_s;    /* ... of it in the waiting queue (from the engine taking the request to
                          its admission, or to its end if it ends waiting, and again after each
                          preemption) */
    double restore_s;  /* ... of it admitted but waiting for its restores: the steps it sat out
                          for them, and the waits for restored layers of the passes it was in */
    double total_s;    /* submit -> finish */
    char error[256];
} ReqResult;

typedef struct Request Request;
typedef struct Engine Engine;

/* The field of a request that a refusal is about, for the caller to name
 * it in its error (the server's OpenAI "param"). */
typedef enum ReqField {
    REQ_FIELD_NONE = 0,   /* the request as a whole, or no refusal */
    REQ_FIELD_PROMPT,     /* the prompt: its ids, or its length against the context or the pool */
    REQ_FIELD_MAX_TOKENS,
    REQ_FIELD_LOGIT_BIAS,
} ReqField;

/* A request for n prompt tokens (copied). ns: cache namespace ("" or NULL
 * for none); session: optional conversation id. One reference, owned by the
 * caller. NULL on allocation failure or bad params (n == 0, a negative
 * max_tokens, too many stops, an empty stop string). Ids and lengths are
 * checked by engine_submit. */
Request *request_new(const int32_t *prompt, size_t n, const ReqParams *p, const char *ns, const char *session);
void request_unref(Request *r);
/* The prompt ids r was made of, (*n); valid while the caller holds r. */
const int32_t *request_prompt(const Request *r, size_t *n);

/* Context overflow in shift mode (engine/prompt.h): where a cut chat's
 * prompt may find KV computed at other positions. A source is a longer
 * rendering of the same conversation (the whole chat, or a cut that
 * dropped fewer turns): the prompt's ids from dest_start on equal the
 * source's last ones, so prompt position p holds the source's token at
 * p - (prompt length - source length), and the source's full blocks may
 * be cached under its chain hashes. Blocks of a cut prompt (or source)
 * from the one holding its shift start onwards are hashed in the shifted
 * domain (cache/index.h) of what it dropped; the others exactly. */
#define ENGINE_MAX_SHIFT_SOURCES 2

typedef struct ShiftSource {
    const int32_t *ids;   /* (n) borrowed until request_set_shift returns */
    size_t n;
    int32_t shift_start;  /* its own shift start (the domain begins at its block), or -1: all exact */
    Hash128 domain;       /* its shifted domain (index_shift_domain) */
    int32_t dest_start;   /* the prompt agrees with it, suffix-aligned, from this position on */
} ShiftSource;

typedef struct ReqShift {
    int32_t shift_start;  /* the prompt's own shift start: its blocks from the one holding it on are
                             hashed in domain */
    Hash128 domain;
    int n_sources;
    ShiftSource sources[ENGINE_MAX_SHIFT_SOURCES];
} ReqShift;

/* Attach s (copied) to r before engine_submit. MN_OK; MN_EINVAL for a
 * start outside the prompt or a source, or too many sources; MN_ENOMEM. */
int request_set_shift(Request *r, const ReqShift *s);

/* What one request_read takes from the request's output channel. */
typedef struct ReqOutput {
    char *text;             /* the text produced since the last read, NUL-terminated, may be
                               empty; owned by the caller (request_output_deinit) */
    size_t len;
    ReqLogprob *logprobs;   /* with is_logprobs: records of the tokens this read's text
                               completes (see request_read), in order; owned by the
                               caller; NULL when none */
    size_t n_logprobs;
    bool is_done;           /* the request has finished: nothing more will come */
    ReqResult res;          /* its result, when is_done */
} ReqOutput;

/* Wait up to timeout_ms for output and take it into *out (overwritten).
 * Across all reads, the logprobs are one per generated token that belongs
 * to the answer: not the end-of-generation token, not a token whose text
 * lies wholly in or after a stop string. Each comes in the read whose text
 * holds its last byte (a token cut by a stop string: the last byte kept; a
 * token that only begins a character: with the text before it), so a
 * stream and a whole answer carry the same records. Returns MN_OK, or
 * MN_ENOMEM (then *out holds nothing to free). */
int request_read(Request *r, ReqOutput *out, int timeout_ms);
/* Free what a read left in o (fine on a zeroed ReqOutput) and zero it. */
void request_output_deinit(ReqOutput *o);

void engine_options_default(EngineOptions *o);
int engine_new(const Model *m, const EngineOptions *o, Engine **out, MnErr *err);
/* Stop taking requests (engine_submit fails with MN_ECANCELED) and wait up
 * to timeout_s for the queued and running ones to finish. True when they
 * all did. The engine keeps running; engine_shutdown ends it. */
bool engine_drain(Engine *e, double timeout_s);
/* Stop the engine thread: every request still waiting or running finishes
 * as cancelled, later submits fail with MN_ECANCELED. Idempotent. */
void engine_shutdown(Engine *e);
/* engine_shutdown, then free. No other thread may use e afterwards. */
void engine_free(Engine *e);

/* Check a request against the model and the engine, fill in the defaults
 * it left open (max_tokens 0, is_seed_random) and queue it (the engine
 * takes its own reference). This is the one place a request is validated.
 * Refusals, in the order checked, with the field at fault in *field
 * (REQ_FIELD_NONE on success and where NONE is said; field may be NULL)
 * and err saying why:
 *   MN_EINVAL    a prompt token id outside the vocabulary (PROMPT);
 *   MN_ERANGE    the prompt fills the context, or the pool (PROMPT);
 *   MN_EINVAL    a logit_bias id outside the vocabulary (LOGIT_BIAS);
 *   MN_EINVAL    another sampler field sampler_new would refuse (NONE);
 *   MN_ERANGE    prompt + max_tokens do not fit the context or the pool
 *                (MAX_TOKENS; err gives max_tokens' allowed range);
 *   MN_EBUSY     the queue is full (NONE);
 *   MN_ECANCELED the engine is draining or shutting down (NONE);
 *   MN_ENOMEM (NONE). */
int engine_submit(Engine *e, Request *r, MnErr *err, ReqField *field);
/* Ask the engine to stop a request; its blocks stay cached. */
void engine_cancel(Engine *e, Request *r);

typedef struct EngineStats {
    uint64_t requests_finished[FINISH_ERROR + 1];
    uint64_t prompt_tokens, generated_tokens, cached_tokens, recomputed_tokens;
    uint64_t shifted_tokens;   /* cached tokens whose KV was moved from other positions */
    uint64_t cached_tokens_by[SRC_COUNT];
    uint64_t cached_partial_tokens; /* of cached_tokens, rows of blocks that matched in part */
    uint64_t dropped_blocks;   /* blocks gone from every tier (recomputed if needed again) */
    uint64_t restore_failures; /* restores that failed (checksum, I/O) and were recomputed */
    /* tokens of cached blocks restored: loaded from a tier as K/V; loaded as hidden states and
     * projected (a block with some layers of each counts in both, in proportion to its layers,
     * rounded to whole tokens); recomputed as a dropped leading run before a cached one */
    uint64_t restored_kv_tokens, restored_hidden_tokens, restored_recompute_tokens;
    uint64_t writebehind_blocks; /* cold cached blocks copied down under the swap watermark */
    uint64_t prefetched_blocks;  /* blocks of waiting requests restored before admission */
    uint64_t promoted_blocks;    /* blocks of waiting requests copied from disk into RAM */
    uint64_t copy_up_withdrawn_blocks; /* blocks restored from below RAM whose copy up into it
                                          was taken back: an admission needed their slots */
    uint64_t shared_lookup_blocks; /* new requests' blocks looked up in the shared tier */
    uint64_t shared_found_blocks;  /* ... and found there (stored by any instance) */
    int n_tiers;               /* tiers below the pool */
    MoverTierStats tiers[MOVER_MAX_TIERS]; /* the mover's latest snapshots */
    double tier_read_bps[MOVER_MAX_TIERS]; /* the read rate the restore planner takes for each
                                              (bytes/s): its restores', else measured at start
                                              (EngineOptions.measure_tiers), else a guess */
    uint64_t suspensions;    /* running sequences sent back to the queue: the pool was full */
    uint64_t preemptions;    /* ... the slot went to a much shorter prompt (a returning turn) */
    uint64_t preempt_recomputed_tokens; /* tokens preempted prompts computed again when admitted again
                                           (what they had was evicted while they waited) */
    uint64_t expired_blocks; /* dropped by cache_ttl_s */
    int queue_depth, running;
    int pool_free, pool_used, pool_cached, pool_blocks;
    int pool_partial;        /* blocks kept for their filled part only (of pool_cached and pool_used) */
    int pool_untouched_blocks; /* slots the idle engine has not touched yet (kvpool_touch_free) */
    uint64_t pool_bytes;
    uint64_t pool_evictions; /* cached blocks whose slot was reused */
    int block_tokens, n_ctx;
} EngineStats;

void engine_stats(Engine *e, EngineStats *out);
ReplyMemory *engine_reply_memory(Engine *e);
const Model *engine_model(const Engine *e);
const ChatFormat *engine_chat_format(const Engine *e); /* EngineOptions.chat_format */
ContextOverflow engine_context_overflow(const Engine *e); /* EngineOptions.context_overflow */
/* Whether engine_submit takes a prompt of n_prompt tokens with max_tokens
 * (0: the default, which is capped by the room the prompt leaves) on
 * length: the prompt leaves a position free in the context and the pool,
 * and max_tokens fits in what is left. */
bool engine_prompt_fits(const Engine *e, size_t n_prompt, int max_tokens);
Hash128 engine_namespace_id(const char *ns);
/* The disk tier's database (cache/store.h), where the server keeps its
 * stored responses; NULL without a disk tier. Valid until engine_free. */
CacheStore *engine_store(Engine *e);

#endif
