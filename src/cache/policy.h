/* policy.h — eviction policies of the KV cache tiers (`--evict`).
 *
 * Pure and deterministic: the caller describes the candidate blocks of one
 * tier (EvictCand), the policy turns each into a sort key (EvictKey), and
 * the lowest keys go first. Keys are computed once per candidate, so
 * choosing k victims among n blocks costs n key computations and
 * O(n log k) comparisons (policy_select), with no allocation.
 *
 *   lru                 least recent access (of the block's conversation) first
 *   fifo                oldest insertion into the tier first
 *   pensieve            lowest retention value first: cost_block(pos) divided
 *                       by the idle time of the conversation, so the leading
 *                       blocks (cheap to recompute) of idle conversations go
 *                       before trailing ones and before active conversations
 *   lookahead           blocks of requests in the scheduler's look-ahead
 *                       window are exempt while any other block can go; among
 *                       them, requests near the tail of the window (larger
 *                       index) go before those near its head; the others by lru
 *   pensieve+lookahead  the window rule, and pensieve order for the others
 *                       (the default)
 *
 * Ties — always the same whatever the policy — go to the lower position
 * first, then to the lower id. Blocks of one conversation share its access
 * time and window index, so a conversation loses its blocks from the front:
 * evicting from the last tier leaves a dropped leading run, which the
 * restore planner recomputes (DESIGN.md, restore path 4).
 *
 * Times are seconds on any clock the caller likes, as long as `now`,
 * last_access and inserted come from the same one.
 */
#ifndef MN_POLICY_H
#define MN_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "cache/cost.h"

typedef enum EvictPolicy {
    EVICT_LRU = 0,
    EVICT_FIFO,
    EVICT_PENSIEVE,
    EVICT_LOOKAHEAD,
    EVICT_PENSIEVE_LOOKAHEAD,
    EVICT__COUNT
} EvictPolicy;

#define EVICT_DEFAULT EVICT_PENSIEVE_LOOKAHEAD

/* Idle times below this count as this (seconds): a conversation active
 * right now keeps a large but finite retention value. */
#define POLICY_MIN_IDLE_SEC 1e-3

/* One block that may be evicted. */
typedef struct EvictCand {
    uint64_t id;        /* the caller's name for the block (slot, record index, hash bits) */
    uint64_t conv;      /* conversation (session id hash), 0 = none */
    int32_t pos;        /* position of the block's first token in its sequence */
    int32_t window_idx; /* index of its request in the look-ahead window, -1 = not in it */
    double last_access; /* last access of its conversation (of the block when conv == 0) */
    double inserted;    /* when the block entered this tier */
} EvictCand;

/* The order of one candidate: lower evicts first (policy_key_cmp). */
typedef struct EvictKey {
    bool is_exempt; /* in the look-ahead window: only after every non-exempt key */
    double value;   /* policy's score, lower first; never NaN */
    int32_t pos;    /* tie-break: leading blocks first */
    uint64_t id;    /* last tie-break, makes the order total */
} EvictKey;

/* What a key depends on besides the candidate. */
typedef struct PolicyCtx {
    EvictPolicy policy;
    const CostModel *cost; /* for the pensieve policies; NULL: cost grows as pos + 1 */
    double now;
} PolicyCtx;

/* ---- names ---------------------------------------------------------------- */

/* "lru", "fifo", "pensieve", "lookahead", "pensieve+lookahead" -> *out.
 * MN_EINVAL (err names the value and lists the choices) for anything else. */
int policy_parse(const char *name, EvictPolicy *out, MnErr *err);
/* The name policy_parse accepts; "?" for an out-of-range value. */
const char *policy_name(EvictPolicy p);
/* "lru|fifo|pensieve|lookahead|pensieve+lookahead", for --help. */
const char *policy_choices(void);
bool policy_uses_window(EvictPolicy p);
bool policy_uses_cost(EvictPolicy p);

/* ---- ordering ------------------------------------------------------------- */

void policy_key(const PolicyCtx *ctx, const EvictCand *c, EvictKey *out);
/* keys[i] = policy_key(c[i]) for i < n. */
void policy_keys(const PolicyCtx *ctx, const EvictCand *c, int n, EvictKey *keys);
/* < 0 when a goes before b, > 0 after, 0 only for equal keys. */
int policy_key_cmp(const EvictKey *a, const EvictKey *b);

/* Index of the first victim among keys[0..n), or -1 when n <= 0. O(n). */
int policy_victim(const EvictKey *keys, int n);
/* The indices of the min(k, n) first victims, in eviction order, into
 * out (room for k). Returns how many were written. O(n log k), no
 * allocation. A caller that must not touch the window stops at the first
 * index whose key is_exempt. */
int policy_select(const EvictKey *keys, int n, int k, int32_t *out);

/* ---- sizing --------------------------------------------------------------- */

/* Look-ahead window length: free capacity / mean cached size of a request
 * (same unit, e.g. blocks), rounded down and clamped to [0, n_waiting].
 * A mean of zero or less means requests need no room: all n_waiting. */
int policy_window_len(double free_capacity, double mean_request_size, int n_waiting);

/* Write-behind: how many more cold pool blocks to copy down the chain so
 * that free + already-copied (reclaimable without I/O) blocks reach
 * watermark * n_total (ceil). 0 when there are enough; watermark in [0, 1]. */
int policy_writebehind_want(int n_free, int n_clean, int n_total, double watermark);

/* Print candidates with their keys in eviction order to stderr (for gdb and
 * failing tests); keys may be NULL (computed with ctx). Allocates. */
void policy_dump(const PolicyCtx *ctx, const EvictCand *c, const EvictKey *keys, int n);

#endif
