/* index.h — the content-addressed block index: block hash -> block record.
 *
 * A block hash names the contents of one full block of a sequence together
 * with everything before it (DESIGN.md): XXH3-128 over, in this byte order,
 *   parent hash    16 bytes (the previous block's hash; zeros for block 0)
 *   token ids      block_tokens x uint32, little-endian
 *   model fingerprint  16 bytes (Model.fingerprint)
 *   KV format id   uint32 little-endian (index_kv_format: the KV element
 *                  type's GGML id | block_tokens << 8)
 *   namespace id   16 bytes: XXH3-128 of the namespace string ("" = none)
 * Hashes are written in XXH3's canonical (big-endian) byte form, so equal
 * prefixes give equal hashes across requests, restarts and machines.
 *
 * Shifted KV (context overflow, --context-overflow shift) has a hash domain
 * of its own. A cut prompt's blocks from the first one holding a token
 * whose KV may have been moved to another position onwards are hashed with
 * that block's parent replaced by index_shift_parent(parent, domain):
 *   parent hash    16 bytes (16 zero bytes for block 0)
 *   domain         16 bytes: index_shift_domain of the tokens the cut
 *                  dropped, XXH3-128 over the 20 bytes "mnemo shifted KV v1\n"
 *                  then the dropped token ids as little-endian uint32
 * and the chain goes on from there as usual. An exact block's hash always
 * chains from an exact parent (or zeros), so no exact lookup can reach a
 * shifted block, and a shifted block is found only by a prompt cut the
 * same way from the same conversation (its next turns). Records are alike
 * in both domains: the hash alone tells them apart.
 *
 * A record says where the block is: the pool slot holding it (or none)
 * and the set of lower tiers holding a copy (a bit mask, bit i = tier i of
 * the chain below the pool, in the mover's order). A record lives while
 * either says something: when the pool reuses a slot (evict callback) the
 * record loses its slot but stays if a tier still holds the block, so a
 * returning request finds it and restores it instead of recomputing. The
 * pool keeps the slot's CACHED/IN USE state; the index only names slots.
 *
 * The children of a parent: rows of KV reused from a block that matches a
 * prompt only in part. Attention is causal, so row i of a block depends
 * only on its parent chain and the block's tokens 0..i: the first k rows
 * of any block after the same parent whose first k tokens are the
 * prompt's are exactly what a recompute would give. The index keeps, per
 * child key (index_child_key: the parent's chain hash with the model, KV
 * format and namespace, the hash of an empty block after it), the pool
 * slots holding such rows with their tokens: full blocks the engine
 * computed, and partial ones — the filled part of a sequence's last block
 * when it ends, which no block hash names. Children live in the pool
 * only: a slot leaves its list when it is evicted or removed, like its
 * record, so a list never names a slot whose rows were overwritten.
 * Owned by the engine thread; the tables grow as records are added.
 */
#ifndef MN_INDEX_H
#define MN_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "cache/kv_pool.h"

typedef struct BlockIndex BlockIndex;

/* An index over pool's slots; installs itself as the pool's evict callback.
 * NULL on allocation failure. */
BlockIndex *index_new(KvPool *pool);
void index_free(BlockIndex *ix);

/* Slot of the block with this hash, or -1 (not in the pool). */
int32_t index_lookup(const BlockIndex *ix, const Hash128 *h);
/* Lower tiers holding the block (bit mask), 0 when none or unknown. */
uint32_t index_tiers(const BlockIndex *ix, const Hash128 *h);
/* Whether the block is anywhere: in the pool or in a lower tier. */
int index_has(const BlockIndex *ix, const Hash128 *h);
/* Record that slot holds the block h and make the slot cacheable. Returns
 * 1 if recorded, 0 if h already has a slot (the caller's copy stays
 * private and is freed on release) or slot already holds a block (or a
 * partial child),
 * MN_ENOMEM negated (-MN_ENOMEM) when the table could not grow. */
int index_insert(BlockIndex *ix, const Hash128 *h, int32_t slot);
/* Forget whatever slot holds (no-op when it holds nothing indexed and is
 * no child); the block's record stays if a tier holds it. The slot stops
 * being cacheable: its contents are no longer what the record names. */
void index_remove_slot(BlockIndex *ix, int32_t slot);
/* Add and remove tier bits of h's record (creating or deleting it as
 * needed). MN_OK or MN_ENOMEM. */
int index_set_tiers(BlockIndex *ix, const Hash128 *h, uint32_t add, uint32_t remove);
/* The hash of the block slot holds, or NULL when it holds none indexed. */
const Hash128 *index_slot_hash(const BlockIndex *ix, int32_t slot);
/* ---- the children of a parent (row reuse) ------------------------------------ */

/* The key of the blocks after parent (NULL: the first block) for the
 * model, KV format and namespace: index_block_hash of an empty block. */
Hash128 index_child_key(const Hash128 *parent, const Hash128 *fingerprint, uint32_t kv_format, const Hash128 *ns_id);
/* Slot's first n_rows rows (1..block_tokens) hold the KV of tokens[0..n_rows)
 * (copied) as the block after key's parent. A full block (n_rows ==
 * block_tokens) must be indexed already (index_insert): it leaves the list
 * with its record. A partial one must be IN USE and not indexed: it is
 * made cacheable and stays CACHED when released, until evicted. Partial
 * children under key whose rows the new one extends are dropped (their
 * slots freed, kvpool_drop). Returns 1 when added; 0 when not (a child
 * under key already holds these rows, or slot is on a list already, or
 * is indexed while n_rows is partial, or is not while it is full): the
 * slot is left as it was; -MN_ENOMEM when the table could not grow. */
int index_child_add(BlockIndex *ix, const Hash128 *key, int32_t slot, const int32_t *tokens, int n_rows);
/* Of the children under key, the one whose rows begin with the longest
 * prefix of tokens[0..n): its slot, valid until the pool next allocates
 * or the index changes, and that prefix's length in *n_rows. -1 and
 * *n_rows 0 when none shares the first token. */
int32_t index_child_find(const BlockIndex *ix, const Hash128 *key, const int32_t *tokens, int n, int *n_rows);
/* Partial children in the pool. */
int index_n_partials(const BlockIndex *ix);

/* Records with a pool slot. */
int index_count(const BlockIndex *ix);
/* Records in all (pool or tiers). */
int index_records(const BlockIndex *ix);
/* Records deleted so far: blocks that left the pool and every tier. */
uint64_t index_n_deleted(const BlockIndex *ix);

uint32_t index_kv_format(MnType kv_type, int block_tokens);
Hash128 index_namespace_id(const char *ns);
/* The shifted domain of a cut that dropped dropped[0..n) (above). */
Hash128 index_shift_domain(const int32_t *dropped, size_t n);
/* The parent hash the first block of a shifted domain chains from. */
Hash128 index_shift_parent(const Hash128 *parent, const Hash128 *domain);
Hash128 index_block_hash(const Hash128 *parent, const int32_t *tokens, int block_tokens, const Hash128 *fingerprint,
                         uint32_t kv_format, const Hash128 *ns_id);

#endif
