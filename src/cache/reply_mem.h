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
 *
 * Instances that share a store (the redis tier) share their entries: each
 * complete reply is written there too, and before a prompt is built the
 * replies of its conversation that this memory does not hold are fetched
 * (replymem_fetch), so a conversation that moves to another instance keeps
 * the ids it was generated with, and finds its KV by the same hashes.
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
/* The same key in steps, for prompts that look keys up as they grow: h
 * takes the namespace id (replymem_prefix_start), then ids in order
 * (hasher_i32s), and replymem_prefix_end gives the key of the ids so far,
 * leaving h as it was. */
void replymem_prefix_start(Hasher *h, const Hash128 *ns_id);
Hash128 replymem_prefix_end(const Hasher *h);

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

/* Where entries this memory lacks may be: fn(ctx, ns_id, texts, lens, n)
 * looks the reply texts texts[0..n) of namespace ns_id up in a shared
 * store and puts what it finds here (replymem_put, each under its own
 * prefix key). It may block on I/O; it runs on the thread that builds a
 * prompt. Set it before prompts are built; NULL unsets it (before ctx
 * goes). */
typedef void (*ReplyFetchFn)(void *ctx, const Hash128 *ns_id, const char *const *texts, const size_t *lens, int n);
void replymem_set_fetch(ReplyMemory *rm, ReplyFetchFn fn, void *ctx);
/* Ask the fetch function (when one is set) for those of texts[0..n) that
 * no entry here holds under any key. Returns how many were asked for (0
 * also when out of memory: the prompt is then built without them). */
int replymem_fetch(ReplyMemory *rm, const Hash128 *ns_id, const char *const *texts, const size_t *lens, int n);

#endif
