/* policy.c — eviction order of cached KV blocks (see policy.h).
 *
 * Every policy is a map from a candidate to a key (is_exempt, value, pos,
 * id) compared lexicographically; choosing victims is a partial sort of the
 * keys. The module holds no state: the tiers and the mover (which own the
 * candidate lists) call it on their own thread with their own arrays.
 *
 * Invariants: a key's value is never NaN, so policy_key_cmp is a total
 * order (equal only for equal ids at equal scores), and the victims of
 * policy_select are exactly the first k of the full sorted order, whatever
 * the candidates' input order.
 */
#include "cache/policy.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"

/* ---- names ---------------------------------------------------------------- */

static const char *const policy_names[EVICT__COUNT] = {
    [EVICT_LRU] = "lru",
    [EVICT_FIFO] = "fifo",
    [EVICT_PENSIEVE] = "pensieve",
    [EVICT_LOOKAHEAD] = "lookahead",
    [EVICT_PENSIEVE_LOOKAHEAD] = "pensieve+lookahead",
};

int policy_parse(const char *name, EvictPolicy *out, MnErr *err) {
    for (int i = 0; name && i < EVICT__COUNT; i++)
        if (strcmp(name, policy_names[i]) == 0) {
            *out = (EvictPolicy)i;
            return MN_OK;
        }
    return mn_err_set(err, MN_EINVAL, "unknown eviction policy '%s' (choose %s)", name ? name : "(null)",
                      policy_choices());
}

const char *policy_name(EvictPolicy p) { return (unsigned)p < EVICT__COUNT ? policy_names[p] : "?"; }

const char *policy_choices(void) { return "lru|fifo|pensieve|lookahead|pensieve+lookahead"; }

bool policy_uses_window(EvictPolicy p) { return p == EVICT_LOOKAHEAD || p == EVICT_PENSIEVE_LOOKAHEAD; }

bool policy_uses_cost(EvictPolicy p) { return p == EVICT_PENSIEVE || p == EVICT_PENSIEVE_LOOKAHEAD; }

/* ---- keys ----------------------------------------------------------------- */

/* Pensieve's retention value: what keeping the block saves (its recompute
 * cost) per second it has been idle. */
static double retention_value(const PolicyCtx *ctx, const EvictCand *c) {
    int32_t pos = c->pos > 0 ? c->pos : 0;
    double cost = ctx->cost ? cost_block(ctx->cost, pos) : (double)pos + 1.0;
    double idle = ctx->now - c->last_access;
    if (!(idle >= POLICY_MIN_IDLE_SEC)) idle = POLICY_MIN_IDLE_SEC; /* also NaN */
    return cost / idle;
}

void policy_key(const PolicyCtx *ctx, const EvictCand *c, EvictKey *out) {
    bool in_window = policy_uses_window(ctx->policy) && c->window_idx >= 0;
    double v;
    if (in_window) {
        v = -(double)c->window_idx; /* tail of the window first */
    } else {
        switch (ctx->policy) {
        case EVICT_FIFO: v = c->inserted; break;
        case EVICT_PENSIEVE:
        case EVICT_PENSIEVE_LOOKAHEAD: v = retention_value(ctx, c); break;
        case EVICT_LRU:
        case EVICT_LOOKAHEAD:
        default: v = c->last_access; break;
        }
    }
    if (isnan(v)) v = INFINITY; /* unknown: keep as long as possible */
    out->is_exempt = in_window;
    out->value = v;
    out->pos = c->pos;
    out->id = c->id;
}

void policy_keys(const PolicyCtx *ctx, const EvictCand *c, int n, EvictKey *keys) {
    for (int i = 0; i < n; i++) policy_key(ctx, &c[i], &keys[i]);
}

int policy_key_cmp(const EvictKey *a, const EvictKey *b) {
    if (a->is_exempt != b->is_exempt) return a->is_exempt ? 1 : -1;
    if (a->value != b->value) return a->value < b->value ? -1 : 1;
    if (a->pos != b->pos) return a->pos < b->pos ? -1 : 1;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return 0;
}

/* ---- selection ------------------------------------------------------------ */

int policy_victim(const EvictKey *keys, int n) {
    int best = n > 0 ? 0 : -1;
    for (int i = 1; i < n; i++)
        if (policy_key_cmp(&keys[i], &keys[best]) < 0) best = i;
    return best;
}

/* heap[0..n) is a max-heap of indices into keys (the latest victim on top);
 * move heap[i] down to its place. */
static void sift_down(const EvictKey *keys, int32_t *heap, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && policy_key_cmp(&keys[heap[l]], &keys[heap[top]]) > 0) top = l;
        if (r < n && policy_key_cmp(&keys[heap[r]], &keys[heap[top]]) > 0) top = r;
        if (top == i) return;
        int32_t t = heap[i];
        heap[i] = heap[top];
        heap[top] = t;
        i = top;
    }
}

int policy_select(const EvictKey *keys, int n, int k, int32_t *out) {
    if (n <= 0 || k <= 0) return 0;
    if (k > n) k = n;
    if (k == 1) {
        out[0] = policy_victim(keys, n);
        return 1;
    }
    /* Keep the k first victims seen so far in a max-heap: a candidate that
     * goes before the heap's latest replaces it. */
    for (int i = 0; i < k; i++) out[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(keys, out, k, i);
    for (int i = k; i < n; i++) {
        if (policy_key_cmp(&keys[i], &keys[out[0]]) < 0) {
            out[0] = i;
            sift_down(keys, out, k, 0);
        }
    }
    /* Heap sort in place: the latest victim moves to the end each round. */
    for (int end = k - 1; end > 0; end--) {
        int32_t t = out[0];
        out[0] = out[end];
        out[end] = t;
        sift_down(keys, out, end, 0);
    }
    return k;
}

/* ---- sizing --------------------------------------------------------------- */

int policy_window_len(double free_capacity, double mean_request_size, int n_waiting) {
    if (n_waiting <= 0) return 0;
    if (!(mean_request_size > 0)) return n_waiting; /* also NaN */
    if (!(free_capacity > 0)) return 0;
    double w = floor(free_capacity / mean_request_size);
    return w >= (double)n_waiting ? n_waiting : (int)w;
}

int policy_writebehind_want(int n_free, int n_clean, int n_total, double watermark) {
    if (n_total <= 0 || !(watermark > 0)) return 0;
    if (watermark > 1) watermark = 1;
    int64_t target = (int64_t)ceil(watermark * (double)n_total);
    int64_t have = (int64_t)(n_free > 0 ? n_free : 0) + (n_clean > 0 ? n_clean : 0);
    return have >= target ? 0 : (int)(target - have);
}

/* ---- debugging ------------------------------------------------------------ */

void policy_dump(const PolicyCtx *ctx, const EvictCand *c, const EvictKey *keys, int n) {
    fprintf(stderr, "policy %s, now %.6f, %d candidates (eviction order):\n", policy_name(ctx->policy), ctx->now, n);
    if (n <= 0) return;
    EvictKey *own = NULL;
    int32_t *order = mn_calloc((size_t)n, sizeof *order);
    if (keys == NULL) {
        own = mn_calloc((size_t)n, sizeof *own);
        if (own) policy_keys(ctx, c, n, own);
        keys = own;
    }
    if (order == NULL || keys == NULL) {
        fprintf(stderr, "  (out of memory)\n");
    } else {
        policy_select(keys, n, n, order);
        for (int i = 0; i < n; i++) {
            const EvictCand *e = &c[order[i]];
            const EvictKey *k = &keys[order[i]];
            fprintf(stderr, "  %4d: id=%llu conv=%016llx pos=%d win=%d access=%.6f ins=%.6f -> %s%.6g\n", i,
                    (unsigned long long)e->id, (unsigned long long)e->conv, (int)e->pos, (int)e->window_idx,
                    e->last_access, e->inserted, k->is_exempt ? "exempt " : "", k->value);
        }
    }
    mn_free(order);
    mn_free(own);
}
