/* mover.h — the mover thread: all I/O of the tiers below the pool.
 *
 * The mover owns the chain of tiers (tier.h: ram, then disk) and runs every
 * operation on them on its own thread, so the engine thread never waits on
 * I/O except for a layer it is about to compute. The engine talks to it
 * through two queues:
 *
 *   engine --mover_submit--> [reads] [writes] --> mover thread
 *   engine <--on_event------------------------- mover thread
 *
 * With a disk tier the mover also owns the directory's database (store.h):
 * the disk tier's run records, the reply memory and the conversations are
 * written there on this thread, and read back when the mover starts, so a
 * restarted server finds what the last one acknowledged.
 *
 * The chain is ram, disk, redis, each when configured. The redis tier is
 * shared with other instances (cache/tier_redis.c): besides what this
 * instance put there, a PROBE finds what others put.
 *
 * Jobs: SAVE copies a run of pool slots into every tier of the chain (the
 * chain is inclusive: RAM holds the most recently used runs, disk holds
 * everything that fits, so a RAM eviction loses nothing), or into the
 * tiers it names (a restored run copied up into RAM); LOAD restores
 * blocks into pool slots layer by layer, reporting each layer as soon as it
 * is in place; PROMOTE copies blocks that only slower tiers hold into the
 * fastest one (tier 0, RAM) — the scheduler's prefetch of a waiting
 * request's history, so its restore comes from RAM; EXPIRE drops runs (and
 * database rows) idle since a wall-clock cutoff; REPLY and CONV persist a
 * reply-memory entry and a conversation's row; WINDOW hands the
 * scheduler's look-ahead window to every tier's eviction policy
 * (tier_set_window); PROBE looks a new request's blocks up in the shared
 * tier (tier_redis_probe), which adopts the runs other instances stored;
 * REPLY_FETCH brings reply-memory entries other instances shared into
 * MoverConfig.replies (REPLY shares this instance's, besides persisting
 * them); FLUSH reports once every job submitted before it is done; STOP
 * ends the thread.
 *
 * A tier whose medium may come back (tier_is_retried: redis) and that
 * failed is reset by the thread with a back-off, from MOVER_RETRY_MIN_S
 * doubling to MOVER_RETRY_MAX_S, between jobs and while idle; the reset
 * drops what the tier held (reported as DROPPED events).
 *
 * Three queues, served in this order: loads, probes and reply fetches (a
 * restore waits to be computed, a new request for its probe, a prompt being
 * built for its fetch), then WINDOW and PROMOTE jobs (prefetch, under the
 * window it was planned with) and SAVEs into tier 0 alone (a restored run
 * copied up into RAM: prefetch too), then everything else (writes). Jobs
 * of one queue run in submission order; the loads queued at one moment
 * are read together, and so are the promotes. A job still queued may be
 * withdrawn (mover_withdraw).
 *
 * Events go to the on_event callback, on the mover thread, in the order
 * they happen: LAYER (a load's layers [0, layer] are in the pool), DONE
 * (the job is finished; it comes back to the receiver with its results)
 * and DROPPED (a tier dropped blocks: eviction, a checksum failure,
 * expiry). The events of a job are embedded in it — posting them never
 * allocates — and a job's LAYER events always precede its DONE event. A
 * job that stores into a tier (SAVE, PROMOTE) is DONE before any later
 * job's put runs, so a DROPPED event naming its blocks comes after it.
 *
 * Ownership: a submitted job belongs to the mover until its DONE event
 * hands it back; the pool slots it names must stay referenced by the
 * submitter and untouched by compute (a SAVE's slots are read, a LOAD's
 * written) until then. The mover reads only the pool's geometry and
 * arenas. Counters of each tier are published as snapshots (mover_stats).
 */
#ifndef MN_MOVER_H
#define MN_MOVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hash.h"
#include "cache/kv_pool.h"
#include "cache/reply_mem.h"
#include "cache/store.h"
#include "cache/tier.h"

#define MOVER_MAX_TIERS 4

typedef enum MoverJobKind {
    MOVER_SAVE = 1, /* copy pool slots down the chain */
    MOVER_LOAD,     /* restore blocks into pool slots, layer by layer */
    MOVER_PROMOTE,  /* copy blocks held by slower tiers into tier 0 */
    MOVER_EXPIRE,   /* drop what was not used since cutoff, everywhere */
    MOVER_REPLY,    /* persist one reply-memory entry */
    MOVER_CONV,     /* a turn ended: the conversation's row (conv != 0),
                       and the tier runs holding hashes[0..n) are used now */
    MOVER_WINDOW,   /* the look-ahead window, for the tiers' eviction */
    MOVER_PROBE,    /* look blocks up in the shared tier (redis) */
    MOVER_REPLY_FETCH, /* fetch reply-memory entries from the shared tier;
                          its submitter waits (MoverWaiter), no events */
    MOVER_FLUSH,    /* nothing: DONE says everything before it is done */
    MOVER_STOP,
} MoverJobKind;
typedef enum MoverEventKind { MOVER_EV_LAYER = 1, MOVER_EV_DONE, MOVER_EV_DROPPED } MoverEventKind;

typedef struct MoverJob MoverJob;

/* Where the submitter of a job that has one (REPLY_FETCH) waits for it:
 * the mover sets is_done under lock and signals cond instead of posting
 * events; the job stays the submitter's. */
typedef struct MoverWaiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool is_done;
} MoverWaiter;

typedef struct MoverEvent {
    MoverEventKind kind;
    MoverJob *job;       /* LAYER, DONE: the job (after DONE, the receiver's) */
    int layer;           /* LAYER */
    int tier;            /* DROPPED: which tier */
    TierDropReason why;  /* DROPPED */
    int n;               /* DROPPED: blocks */
    Hash128 *hashes;     /* DROPPED: (n), owned by the event */
    bool is_embedded;    /* part of its job: freed with it */
    struct MoverEvent *next; /* free for the receiver's queue */
} MoverEvent;

struct MoverJob {
    MoverJobKind kind;
    uint64_t id;         /* the submitter's */
    void *owner;         /* the submitter's; the mover never touches it */
    int n;               /* SAVE, LOAD, PROMOTE, WINDOW, CONV: blocks */
    Hash128 *hashes;     /* (n) */
    int32_t *slots;      /* (n) pool slots; WINDOW: the window index of
                            each block's request; PROMOTE: the mover's */
    int32_t pos;         /* SAVE, PROMOTE: TierRunInfo.pos of the run
                            (PROMOTE: blocks of one sequence, in order) */
    uint8_t *tier;       /* LOAD, PROMOTE: (n) the tier each block is read
                            from (PROMOTE: not tier 0). PROBE: (n) in, 1 =
                            look block k up; out, 1 = the shared tier holds
                            block k (hashes: one sequence's blocks in order) */
    uint64_t hidden;     /* SAVE: TierRunInfo.hidden, the layers to store as
                            the slots' hidden states (a tier without them
                            stores K/V) */
    uint32_t into_tiers; /* SAVE: the tiers to copy into (bit mask of the
                            chain); 0: every tier */
    double cutoff;       /* EXPIRE: wall-clock seconds (mn_wall_now) */
    /* REPLY: key -> (text, ids); CONV: conv, n_tokens; both at `when`.
       SAVE, PROMOTE, REPLY, CONV, PROBE: ns_id, the namespace of the
       blocks, reply or conversation (index_namespace_id) */
    Hash128 key, ns_id;
    char *text;          /* (text_len), owned */
    size_t text_len;
    int32_t *ids;        /* (n_ids), owned */
    size_t n_ids;
    uint64_t conv;
    int64_t n_tokens;
    double when;         /* wall-clock seconds */
    /* REPLY_FETCH: texts[0..n) of namespace ns_id (borrowed: the submitter
       waits), and where it waits */
    const char *const *texts;
    const size_t *lens;
    MoverWaiter *waiter;
    /* results */
    int rc;              /* MN_OK, or the failure that ended the job */
    uint32_t saved_tiers;/* SAVE, PROMOTE: tiers now holding the run (bit mask) */
    int failed_tier;     /* LOAD, PROMOTE: the tier whose read failed, or -1 */
    int n_layers_done;   /* LOAD */
    uint64_t *block_hidden; /* LOAD, PROMOTE: (n) the layers of block k that
                            arrive as hidden states (kvpool_h, to be
                            projected), set before the first LAYER event */
    /* embedded events: LOAD has n_layer LAYER events, then DONE */
    MoverEvent *events;  /* (n_events) */
    int n_events;
    MoverJob *next;      /* in the mover's queue */
    bool is_taken;       /* the thread took it off its queue (under the
                            mover's lock: mover_is_taken) */
};

/* A job with room for n blocks (and n_layer layer events for a LOAD).
 * NULL on allocation failure. */
MoverJob *mover_job_new(MoverJobKind kind, int n, int n_layer);
void mover_job_free(MoverJob *j);
/* Free a DROPPED event, or nothing for an embedded one. */
void mover_event_free(MoverEvent *ev);

typedef void (*MoverEventFn)(void *ctx, MoverEvent *ev);

/* Durations of one kind of tier operation (a run's put, a layer's read),
 * counted into fixed buckets: counts[i] holds those <= mover_io_bounds[i]
 * (and above the bound before), counts[MOVER_IO_BUCKETS] the rest. */
#define MOVER_IO_BUCKETS 12
extern const double mover_io_bounds[MOVER_IO_BUCKETS];
typedef struct MoverIoHist {
    uint64_t counts[MOVER_IO_BUCKETS + 1];
    uint64_t n;
    double sum;
} MoverIoHist;

typedef struct MoverTierStats {
    TierStats tier;
    MoverIoHist reads, writes; /* tier_read_layers (one load), tier_put_run */
    double measured_read_bps;  /* the tier's read rate as last measured (bytes/s:
                                  MoverConfig.measure_reads); 0: not measured */
} MoverTierStats;

/* Blocks hashes[0..n) are held by tier `tier` when the mover starts (a
 * persistent tier reopened): called from mover_new, before the thread. */
typedef void (*MoverHeldFn)(void *ctx, int tier, const Hash128 *hashes, int n);
/* The scheduler slice the mover thread asks for (base/sched.h): short, so
 * that a streamed restore's wake-ups find a core soon with compute on
 * every core — it cuts the time the mover waits runnable behind compute
 * (docs/OPERATIONS.md, "Figures behind the tier defaults"). */
#define MOVER_SLICE_NS 300000ull

/* Hooks for tests; a production config has none. */
typedef struct MoverTestHooks {
    /* Called on the mover thread as each layer of a streamed load is in
     * place, before its LAYER events, inside the tier's timed read. One
     * that blocks holds the load at that layer. May be NULL. */
    void (*layer_gate)(void *ctx, int layer);
    /* Seconds added to tier i's measured read time wherever mover_stats
     * reports it (and to the start-up measurement's, measure_reads), so
     * the engine's bandwidth estimate (bytes read over read seconds) sees
     * a slow tier whatever the machine's load; a sleep in
     * layer_gate would make the reads slow only by as much as it slept,
     * against steps that a loaded machine also slows. May be NULL. */
    double (*read_delay_fn)(void *ctx, int tier);
    /* Called once with the disk tier as soon as it is open, before the
     * mover thread starts (to inject a failure: aio_fault_set on
     * tier_disk_aio, tier_disk_fault_alloc). May be NULL. */
    void (*disk_tier)(void *ctx, Tier *t);
    /* Called on the mover thread before each run is put into tier `tier`
     * (a SAVE's, a PROMOTE's), outside any tier call. One that blocks
     * holds the mover there, with every job behind it. May be NULL. */
    void (*put_gate)(void *ctx, int tier);
    void *ctx;
    /* TierRedisConfig.read_window_bytes (1: one layer at a time, so a
     * restore held by layer_gate has asked for nothing after that layer);
     * 0: the default. */
    uint64_t redis_window_bytes;
    /* TierRedisConfig.value_bytes (small: a save cut into several runs);
     * 0: the default. */
    uint64_t redis_value_bytes;
    /* TierRedisConfig.capacity_bytes (small: what the tier remembers
     * evicts); 0: the default. */
    uint64_t redis_catalog_bytes;
    /* The staging pool's size in place of MOVER_PROMOTE_BYTES (a batch of
     * promotes of a few small blocks); 0: the default. */
    uint64_t promote_bytes;
} MoverTestHooks;

/* The back-off between resets of a failed tier that is retried. */
#define MOVER_RETRY_MIN_S 0.25
#define MOVER_RETRY_MAX_S 30.0

typedef struct MoverConfig {
    KvPool *pool;             /* geometry and arenas (borrowed) */
    uint64_t ram_bytes;       /* RAM tier budget; 0 = no RAM tier */
    const char *disk_dir;     /* disk tier directory; NULL = no disk tier */
    uint64_t disk_bytes;      /* disk tier budget */
    Hash128 model_fingerprint;
    uint32_t kv_format;
    bool is_durable;          /* fdatasync each disk run before it counts */
    const char *const *redis_urls; /* (n_redis_urls) the shared tier's store:
                                 TierRedisConfig.urls; none = no shared tier
                                 (used during mover_new only) */
    int n_redis_urls;
    bool redis_cluster;       /* TierRedisConfig.is_cluster */
    int redis_ttl_s;          /* TierRedisConfig.ttl_s */
    int redis_timeout_ms;     /* TierRedisConfig.timeout_ms; 0 = default */
    MoverEventFn on_event;    /* required */
    void *event_ctx;
    MoverHeldFn on_held;      /* may be NULL */
    void *held_ctx;
    ReplyMemory *replies;     /* filled from the database at start, and by
                                 REPLY_FETCH from the shared tier; may be NULL */
    int max_replies;          /* reply rows kept in the database */
    EvictPolicy evict;        /* every tier's (tier_set_policy); 0 = lru */
    const CostModel *cost;    /* copied; may be NULL */
    bool measure_reads;       /* the thread measures each tier's read rate
                                 before its first job (MoverTierStats.
                                 measured_read_bps), and a failed tier's
                                 again once it is back */
    const MoverTestHooks *hooks; /* borrowed, outlives the mover; NULL normally */
} MoverConfig;

typedef struct Mover Mover;

/* Build the tiers the config names (none is fine) and start the thread.
 * MN_EINVAL / MN_EIO / MN_ENOMEM / MN_EUNSUPPORTED with a message in err.
 * A redis server that does not answer is no error: its tier starts failed
 * and is retried. */
int mover_new(const MoverConfig *cfg, Mover **out, MnErr *err);
/* Post STOP after everything queued, wait for the thread, free the tiers.
 * NULL is fine. */
void mover_free(Mover *m);

/* Queue a job (the mover owns it until its DONE event). MN_ECANCELED
 * after STOP; MN_EINVAL for a PROMOTE of no blocks or more than
 * mover_promote_max_blocks. */
int mover_submit(Mover *m, MoverJob *j);
/* Whether the thread has taken submitted job j off its queue (it runs, or
 * has run): from then on it cannot be withdrawn. j must not have had its
 * DONE event handled yet (the submitter still knows it). */
bool mover_is_taken(Mover *m, const MoverJob *j);
/* Take back submitted job j while it still waits in its queue: MN_OK, and
 * j is the caller's again, untouched, with no event to come; MN_EBUSY
 * when the thread has taken it (its events come as usual); MN_EINVAL
 * when it was never submitted. */
int mover_withdraw(Mover *m, MoverJob *j);

/* Promotes are read through a staging pool of the mover's own, made (and
 * its pages touched) with the mover when there are two tiers or more:
 * MOVER_PROMOTE_BYTES of whole blocks (all layers), or tier 0's budget
 * when that is smaller. The promotes queued at one moment are read
 * together, as many as it holds. */
#define MOVER_PROMOTE_BYTES (32ull << 20)
/* What MoverConfig.measure_reads writes and reads back through each tier
 * as the mover starts (whole blocks of every layer, at least one): a
 * restore's worth on the 1.1B shape, long enough that the medium's set-up
 * time does not rule the figure. The first jobs wait that long. */
#define MOVER_MEASURE_BYTES (32ull << 20)
/* The most blocks one PROMOTE may name; 0 when the chain has no tier to
 * promote into (fewer than two tiers, or not one block fits tier 0). */
int mover_promote_max_blocks(const Mover *m);

/* The disk tier's database (store.h; thread-safe), for the server's
 * stored responses; NULL without a disk tier. Valid until mover_free. */
CacheStore *mover_store(Mover *m);

int mover_n_tiers(const Mover *m);
const char *mover_tier_name(const Mover *m, int i); /* "ram", "disk", "redis" */
/* The shared tier's index in the chain (PROBE goes there), or -1. */
int mover_shared_tier(const Mover *m);

/* The latest snapshot of tier i's counters (thread-safe). */
void mover_stats(Mover *m, int i, MoverTierStats *out);

#endif
