/* slot_policy.h — what the eviction policy knows of each pool slot, and
 * the ranking of cached slots by it.
 *
 * The pool reuses a CACHED slot when it needs one (slotpol_choose_victim,
 * the scheduler's), and write-behind copies the coldest unsaved cached
 * blocks down the tiers (slotpol_select, the tiers'): both rank slots by
 * the same policy (cache/policy.h) from the same facts, which live here.
 * A slot's facts are those of the block last noted in it; a slot never
 * noted reads as position 0 of conversation 0. Owned by the engine thread;
 * nothing here locks.
 */
#ifndef MN_SLOT_POLICY_H
#define MN_SLOT_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/hash.h"
#include "cache/cost.h"
#include "cache/kv_pool.h"
#include "cache/policy.h"

typedef struct SlotPolicy SlotPolicy;

/* Facts and scratch for the n_blocks slots of pool, ranked by evict with
 * cost (copied; NULL: cost grows with position). The pool is borrowed
 * and must outlive the SlotPolicy. MN_OK, or MN_ENOMEM (*out NULL). */
int slotpol_new(const KvPool *pool, EvictPolicy evict, const CostModel *cost, SlotPolicy **out);
void slotpol_free(SlotPolicy *sp); /* NULL is fine */

/* The copy of the cost model slotpol_new was given, valid as long as sp;
 * NULL when it was given none. */
const CostModel *slotpol_cost(const SlotPolicy *sp);

/* Slot now holds, indexed, the block whose first token is at pos of
 * conversation conv (0: none) in namespace ns: what the policies need of
 * it, and its insertion time (now) for fifo. */
void slotpol_note_block(SlotPolicy *sp, int32_t slot, int32_t pos, uint64_t conv, const Hash128 *ns);

/* The facts of slot as a policy candidate (id: the slot). */
EvictCand slotpol_cand(const SlotPolicy *sp, int32_t slot);
/* The namespace of the block last noted in slot (a tier records it with
 * the run, and a purge erases by it); valid until the next note. */
const Hash128 *slotpol_ns(const SlotPolicy *sp, int32_t slot);

/* ---- the look-ahead window's marks ---------------------------------------------- */

/* Whether some slot may carry a window mark. */
bool slotpol_has_window(const SlotPolicy *sp);
/* Forget every mark; is_marking says whether a new window is about to be
 * marked (slotpol_has_window reports it from now on). */
void slotpol_reset_window(SlotPolicy *sp, bool is_marking);
/* Slot holds a block of request idx of the window: the policy keeps it
 * (tail of the window first when it must). A slot keeps its first mark. */
void slotpol_mark_window(SlotPolicy *sp, int32_t slot, int idx);

/* ---- ranking -------------------------------------------------------------------- */

/* KvChooseFn (ctx: the SlotPolicy): rank every CACHED slot of p and return
 * the one to reuse first. Cached blocks' last access is when they became
 * CACHED: the blocks of a finished request all do so together. */
int32_t slotpol_choose_victim(void *ctx, const KvPool *p);
/* Rank slots[0..n) (n <= the pool's n_blocks) as for eviction and put
 * into out[0..) the indexes into slots of the k that go first, first
 * first. Returns how many it gave: min(k, n). */
int slotpol_select(SlotPolicy *sp, const int32_t *slots, int n, int k, int32_t *out);

#endif
