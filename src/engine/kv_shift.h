/* kv_shift.h — moving cached KV to other positions (position-decoupled
 * truncation, --context-overflow shift; restore path 5 of DESIGN.md).
 *
 * RoPE rotates each pair of a head's dimensions by an angle proportional
 * to the position, and rotations compose: R(p + d) = R(d)·R(p). So K
 * computed at position p becomes K at p + d by rotating it by d, with the
 * model's own pairing (adjacent or halves) and frequencies (rope_freqs
 * factors, linear scaling, LongRoPE's chosen factors; a sliding layer's
 * own base); V does not depend on the position and is copied. An
 * attention factor (LongRoPE's) that scaled K when it was computed is
 * already in it and is not applied again: the delta rotation is pure.
 * Q/K normalizations come before RoPE, so they commute with it.
 *
 * The result is an approximation by design: besides the rounding of K
 * through the pool's type once more, the moved tokens' KV was computed
 * attending to what came before them then, not to what comes before them
 * now.
 *
 * A KvShifter holds the model's RoPE tables and a row buffer; it is used
 * by one thread at a time (the engine thread, or a tool). */
#ifndef MN_KV_SHIFT_H
#define MN_KV_SHIFT_H

#include <stdint.h>

#include "base/err.h"
#include "cache/kv_pool.h"
#include "model/model.h"

typedef struct KvShifter KvShifter;

/* One move within a layer: destination positions [from, to) of the block
 * table dst take the KV of source positions [from - delta, to - delta),
 * whose blocks are src[b - src_first] for source block b. Both tables name
 * slots of the same pool. */
typedef struct KvMove {
    const int32_t *dst;
    const int32_t *src;
    int src_first;
    int32_t from, to;
    int32_t delta;
} KvMove;

/* A shifter for model m served with contexts of n_ctx positions (the
 * frequencies the forward pass uses) over pools like pool. MN_OK,
 * MN_ENOMEM (*out NULL). */
int kvshift_new(const Model *m, int n_ctx, const KvPool *pool, KvShifter **out);
void kvshift_free(KvShifter *s);

/* Do mv in layer il of pool: the destination rows are overwritten (V
 * copied, K rotated by delta through f32). The source rows are only read;
 * the two tables must not share a slot. */
void kvshift_layer(KvShifter *s, KvPool *pool, int il, const KvMove *mv);

#endif
