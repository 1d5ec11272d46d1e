/* purge.h — erase a namespace's cached data from a disk tier's directory.
 *
 * What a tenant leaves in --disk-tier DIR: the KV bytes of its runs (slab
 * files, tier_disk.c) with their records, its reply memory (texts and the
 * token ids generated for them), its conversations' rows and its stored
 * responses (mnemo.db, store.c). purge_disk_tier erases all of it, so that nothing of it is
 * served again or readable in the directory's files afterwards;
 * `mnemo cache purge` (main.c) is a thin command over it.
 *
 * A namespace is named by the string the server derives its id from
 * (index_namespace_id): the API key a request authenticated with, or —
 * on a server without keys — its X-Cache-Namespace header, "" when it has
 * none (the default namespace).
 *
 * A running server: the database's exclusive lock, which a serving mnemo
 * holds from start to exit (store.h), is the directory's lock. The purge
 * takes it before it reads or changes anything, so a directory in use is
 * refused (MN_EBUSY, nothing changed: stop the server first), and a server
 * started during a purge is refused in turn.
 */
#ifndef MN_PURGE_H
#define MN_PURGE_H

#include <stdint.h>

#include "base/err.h"

typedef struct PurgeReport {
    int n_runs, n_blocks;         /* disk tier runs dropped, their blocks */
    int64_t n_replies, n_convs;   /* reply-memory and conversation rows deleted */
    int64_t n_responses;          /* stored responses deleted (with their inputs) */
    uint64_t n_zeroed_bytes;      /* slab bytes overwritten with zeros */
} PurgeReport;

/* Erase namespace ns (NULL: every namespace) from DIR, in this order:
 *   1. its runs' rows (and the rows of runs whose namespace is not known:
 *      written before namespaces were recorded), so they are never served;
 *   2. every byte of the slab files that no remaining run holds is
 *      overwritten with zeros — the purged runs' KV, and whatever evicted
 *      runs of any namespace left — and synced;
 *   3. its reply-memory, conversation and response rows (replies of no
 *      known namespace too), then the database is rewritten (VACUUM) and its WAL
 *      truncated, so no byte of a deleted row remains in either file.
 * Each step is durable before the next starts, and step 2 covers all free
 * space, so after a crash (or a failure) running the purge again finishes
 * the job. Other namespaces' runs, replies and conversations are kept and
 * still serve. Zeros are written through the filesystem: on copy-on-write
 * filesystems and on flash, older copies of the blocks may survive below
 * it (docs/OPERATIONS.md).
 * MN_OK and *out; MN_EBUSY (a server holds DIR); MN_ENOTFOUND (no DIR, or
 * no cache in it); MN_EINVAL (DIR refused as unsafe, tier_dir.h);
 * MN_EUNSUPPORTED / MN_EFORMAT (a database this build cannot read);
 * MN_EIO, MN_EFULL, MN_ENOMEM; err says what and where. */
int purge_disk_tier(const char *dir, const char *ns, PurgeReport *out, MnErr *err);

#endif
