/* seq.h — a sequence's block table: logical block i -> pool slot.
 *
 * Position p of the sequence lives in block p / block_tokens. The Seq owns
 * one reference on each slot in its table (taken by seq_reserve, dropped by
 * seq_release). Owned by the engine thread.
 */
#ifndef MN_SEQ_H
#define MN_SEQ_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/kv_pool.h"
#include "compute/attention.h"

typedef struct Seq {
    int32_t *blocks; /* (cap) */
    int n_blocks;
    int cap;
} Seq;

/* Make the table cover positions [0, n_tokens), allocating blocks from the
 * pool. MN_EFULL when the pool has too few free blocks (the table is left as
 * it was), MN_ENOMEM. */
int seq_reserve(Seq *s, KvPool *p, int n_tokens);
/* Grow the table itself to hold the blocks of positions [0, n_tokens),
 * taking no block: MN_ENOMEM. */
int seq_reserve_table(Seq *s, const KvPool *p, int n_tokens);
/* Take blocks toward covering positions [0, n_tokens), within the table's
 * size (seq_reserve_table) and as long as the pool keeps more than `keep`
 * blocks available: a prompt's table grows as its chunks are computed.
 * Returns the positions the table covers. */
int seq_extend(Seq *s, KvPool *p, int n_tokens, int keep);
/* Whether seq_reserve for n_tokens would have to grow the table itself
 * (an allocation that can fail). */
bool seq_table_grows(const Seq *s, const KvPool *p, int n_tokens);
/* Release every block and free the table; the Seq is empty afterwards. */
void seq_release(Seq *s, KvPool *p);
/* View for the attention kernel, valid until the table changes. */
AttnSeq seq_view(const Seq *s);

#endif
