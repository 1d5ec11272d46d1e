/* reply_mem.h — reply memory: the generated token ids of earlier replies.
 *
 * Re-tokenizing a generated reply's text does not always give back the ids
 * the model generated, and the cached KV was computed from the generated
 * ids. So when a reply finishes, the engine records
 *     (key of everything before the reply, reply text) -> generated ids
 * and when a later prompt has that text at that place, prompt building uses
 * the remembered ids. The key is replymem_prefix_key(namespace id, the token
 * ids before the reply). The same rule applies with the prefix cache on or
 * off, so outputs never depend on the cache.
 *
 * Thread-safe: HTTP threads read while the engine thread writes (one mutex).
 * Bounded: the oldest entries go first beyond max_entries.
 */
#ifndef MN_REPLY_MEM_H
#define MN_REPLY_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "base/tok_ids.h"

typedef struct ReplyMemory ReplyMemory;

ReplyMemory *replymem_new(int max_entries); /* NULL on allocation failure */
void replymem_free(ReplyMemory *rm);

Hash128 replymem_prefix_key(const Hash128 *ns_id, const int32_t *ids, size_t n);

/* The key under which a reply is remembered whatever came before it, in
 * namespace ns_id: context overflow in shift mode (engine/prompt.h) looks
 * a reply up under it when its own prefix key misses, since a cut
 * conversation puts each kept reply after another prefix than the one it
 * was generated after, and the KV to reuse was computed from its
 * generated ids. XXH3-128 over the namespace id and "mnemo reply text\n". */
Hash128 replymem_text_key(const Hash128 *ns_id);

/* Remember ids for (key, text). MN_OK or MN_ENOMEM. An existing entry for
 * the same key and text is replaced. */
int replymem_put(ReplyMemory *rm, const Hash128 *key, const char *text, size_t len, const int32_t *ids, size_t n);
/* Append the remembered ids to out: 1 when found, 0 when not, MN_ENOMEM
 * negated (-MN_ENOMEM) when out could not grow. */
int replymem_get(ReplyMemory *rm, const Hash128 *key, const char *text, size_t len, TokIds *out);
/* False when no entry, under any key, holds this text — then no prefix
 * needs tokenizing to look it up; true when one may (a cheap filter: texts
 * share its counters by hash). */
bool replymem_may_hold(ReplyMemory *rm, const char *text, size_t len);
int replymem_count(ReplyMemory *rm);

#endif
