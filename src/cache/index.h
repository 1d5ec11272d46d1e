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
 * For now a record says which pool slot holds the block; the pool (KvPool)
 * keeps the slot's CACHED/IN USE state and tells the index, through its
 * evict callback, when a slot is reused. Owned by the engine thread.
 */
#ifndef MN_INDEX_H
#define MN_INDEX_H

#include <stdint.h>

#include "base/hash.h"
#include "cache/kv_pool.h"

typedef struct BlockIndex BlockIndex;

/* An index over pool's slots; installs itself as the pool's evict callback.
 * NULL on allocation failure. */
BlockIndex *index_new(KvPool *pool);
void index_free(BlockIndex *ix);

/* Slot of the block with this hash, or -1. */
int32_t index_lookup(const BlockIndex *ix, const Hash128 *h);
/* Record that slot holds the block h and make the slot cacheable. Returns
 * 1 if recorded, 0 if h was already indexed (to another slot: the caller's
 * copy stays private and is freed on release). MN_ENOMEM is not possible:
 * the table is sized for every slot at creation. */
int index_insert(BlockIndex *ix, const Hash128 *h, int32_t slot);
/* Forget whatever slot holds (no-op when it holds nothing indexed). */
void index_remove_slot(BlockIndex *ix, int32_t slot);
int index_count(const BlockIndex *ix);

uint32_t index_kv_format(MnType kv_type, int block_tokens);
Hash128 index_namespace_id(const char *ns);
Hash128 index_block_hash(const Hash128 *parent, const int32_t *tokens, int block_tokens, const Hash128 *fingerprint,
                         uint32_t kv_format, const Hash128 *ns_id);

#endif
