/* store.h — the cache's one SQLite database: DIR/mnemo.db.
 *
 * Everything the cache keeps across restarts apart from the KV bytes
 * themselves: the disk tier's run records (the bytes live in its slab
 * files, tier_disk.c), the reply memory (reply_mem.h), the conversations
 * and the stored responses of the Responses API (the server keeps a
 * conversation for a client that sends only its new input). The schema
 * is documented at the top of store.c. Without a disk tier, the server
 * keeps its responses in an in-memory database of the same schema
 * (store_open_memory).
 *
 * Durability: the database runs in WAL mode with synchronous=FULL, and
 * every put or delete below is a transaction of its own, committed (and
 * synced) before the call returns: a row is visible only once it is
 * durable, and a killed process leaves the last committed state.
 * store_run_touch is the one exception: it commits without a sync of its
 * own (a power cut may lose recent touches, never a row).
 *
 * Threads: any thread may call any function but store_close; a mutex of
 * the store's serializes the calls (the mover writes runs, replies and
 * conversations while HTTP threads read and write responses). A foreach
 * callback runs with it held. The database is opened in exclusive locking mode:
 * a second process (another mnemo on the same directory) is refused with
 * MN_EBUSY instead of sharing the slab files.
 *
 * Errors: SQLite's codes are converted here — SQLITE_FULL -> MN_EFULL,
 * SQLITE_NOMEM -> MN_ENOMEM, anything else -> MN_EIO — and logged
 * (LOG_WARN, naming the file and the statement). Nothing aborts.
 */
#ifndef MN_STORE_H
#define MN_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hash.h"
#include "cache/reply_mem.h"

/* The schema this build reads and writes (PRAGMA user_version); versions
 * 1 and 2 are upgraded in place when opened. */
#define STORE_SCHEMA_VERSION 3

typedef struct CacheStore CacheStore;

/* What the cached bytes are only valid for; a database is bound to one. */
typedef struct StoreIdentity {
    Hash128 model_fingerprint;
    uint32_t kv_format;   /* index_kv_format() */
    int n_layer;
    uint64_t block_bytes; /* bytes of one block in one layer */
} StoreIdentity;

/* ---- open, close ------------------------------------------------------------ */

/* Open or create DIR/mnemo.db, creating DIR (one level) when missing;
 * DIR is checked and made private first (tier_dir.h), and the file is
 * created with mode 0600. A new database is stamped with
 * STORE_SCHEMA_VERSION and *id. *out NULL on failure, with a message in
 * err naming the file:
 *   MN_EUNSUPPORTED  another schema version (or a SQLite file that is not
 *                    a cache database): move it away or use another
 *                    directory;
 *   MN_EINVAL        made for another identity (model, KV format, layers,
 *                    block size), a directory refused by tierdir_prepare,
 *                    or a bad argument;
 *   MN_EFORMAT       not a SQLite database, or corrupt;
 *   MN_EBUSY         open in another process;
 *   MN_ENOTFOUND     DIR's parent does not exist;
 *   MN_EIO, MN_EFULL, MN_ENOMEM. */
int store_open(const char *dir, const StoreIdentity *id, CacheStore **out, MnErr *err);
/* Open the database that DIR/mnemo.db holds already, bound to whatever
 * identity it records (store_identity), for tools that have no model
 * (mnemo cache purge). As store_open, except: MN_ENOTFOUND when DIR or
 * the file is missing, or the file holds no cache yet; nothing is
 * created. */
int store_open_existing(const char *dir, CacheStore **out, MnErr *err);
/* A private in-memory database with the same schema (no identity, no
 * file, nothing survives store_close): a server's stored responses when
 * it has no disk tier. MN_ENOMEM (err) or MN_OK. */
int store_open_memory(CacheStore **out, MnErr *err);
/* Checkpoint (TRUNCATE: the WAL file ends empty) and close. NULL is fine. */
void store_close(CacheStore *s);
/* Copy the WAL into the database and truncate the WAL. MN_OK or a code. */
int store_checkpoint(CacheStore *s);

/* The identity the database is bound to, and its path; valid until
 * store_close. */
const StoreIdentity *store_identity(const CacheStore *s);
const char *store_path(const CacheStore *s);

/* ---- disk-tier run records ---------------------------------------------------- */

/* Store (or replace) the run record `record` (len bytes, tier_disk.c's
 * format, kept verbatim) under run_id, last used at last_used (unix
 * seconds), its blocks of namespace ns_id (NULL: not known; purged with
 * any namespace). MN_OK once durable. */
int store_run_put(CacheStore *s, uint64_t run_id, const void *record, size_t len, double last_used,
                  const Hash128 *ns_id);
/* Set a run's last-used time (no-op when the row does not exist). */
int store_run_touch(CacheStore *s, uint64_t run_id, double last_used);
/* Delete a run's row (no-op when it does not exist). */
int store_run_delete(CacheStore *s, uint64_t run_id);
/* Call fn for every run row in run id order. record and ns_id (NULL when
 * the row has none) are valid during the call only; fn must not call into
 * the store (collect, then act). A non-zero fn return stops the walk and
 * is returned. */
typedef int (*StoreRunFn)(void *ctx, uint64_t run_id, const void *record, size_t len, double last_used,
                          const Hash128 *ns_id);
int store_run_foreach(CacheStore *s, StoreRunFn fn, void *ctx);
/* Rows in the runs table. */
int store_run_count(CacheStore *s, int64_t *out);

/* ---- reply memory ---------------------------------------------------------------- */

/* Remember (key, text) -> ids (reply_mem.h), a reply in namespace ns_id
 * (NULL: not known), written at `when` (unix seconds). An existing row for
 * the same key and text is replaced and becomes the newest. The caller
 * bounds the table with store_reply_trim. */
int store_reply_put(CacheStore *s, const Hash128 *ns_id, const Hash128 *key, const char *text, size_t len,
                    const int32_t *ids, size_t n, double when);
/* replymem_put the newest max_entries rows into rm, oldest first (so rm
 * drops the oldest first, as if they had been put in this process). A
 * malformed row is skipped (LOG_WARN). MN_OK, MN_ENOMEM, MN_EIO. */
int store_reply_load(CacheStore *s, ReplyMemory *rm, int max_entries);
/* Delete all but the newest max_entries rows (max_entries >= 0). */
int store_reply_trim(CacheStore *s, int max_entries);
int store_reply_count(CacheStore *s, int64_t *out);

/* ---- conversations ------------------------------------------------------------- */

/* Record conversation conv: its namespace id, when it was last active
 * (unix seconds) and the tokens cached at its last turn; replaces the
 * previous row. conv 0 means "no conversation" and is not stored (MN_OK). */
int store_conv_put(CacheStore *s, uint64_t conv, const Hash128 *ns_id, double last_active, int64_t n_tokens);
int store_conv_count(CacheStore *s, int64_t *out);
/* Call fn for every conversation, least recently active first; same rules
 * as store_run_foreach. */
typedef int (*StoreConvFn)(void *ctx, uint64_t conv, const Hash128 *ns_id, double last_active, int64_t n_tokens);
int store_conv_foreach(CacheStore *s, StoreConvFn fn, void *ctx);
/* Delete the conversations last active before cutoff (unix seconds). */
int store_conv_expire(CacheStore *s, double cutoff);

/* ---- responses ----------------------------------------------------------------------- */

/* One input item of a stored response: a message. */
typedef struct StoreRespItem {
    const char *item_id;  /* "msg_..." */
    const char *role;     /* "user", "assistant", "system", "developer" */
    const char *content;  /* (content_len) bytes, NUL after them on a get */
    size_t content_len;
} StoreRespItem;

/* A stored response. For store_resp_put every pointer is borrowed for the
 * call; after store_resp_get they are owned (store_resp_deinit). */
typedef struct StoreResp {
    const char *id;          /* unique across namespaces and restarts */
    const char *previous_id; /* the response it continues; NULL: none */
    double created;          /* unix seconds; a put sets used to it too */
    double used;             /* created, or last continued (store_resp_touch) */
    const char *body;        /* (body_len) the response object as answered (opaque) */
    size_t body_len;
    const char *output;      /* (output_len) the reply's text as generated */
    size_t output_len;
    StoreRespItem *inputs;   /* (n_inputs) its input items, in order */
    size_t n_inputs;
} StoreResp;

/* Store r in namespace ns_id, its inputs with it, in one transaction.
 * MN_OK once durable; an id that exists already fails (MN_EIO, logged). */
int store_resp_put(CacheStore *s, const Hash128 *ns_id, const StoreResp *r);
/* The response id of namespace ns_id, unless it was last used before
 * cutoff (expired, not yet deleted). MN_OK and *out (owned), MN_ENOTFOUND
 * (another namespace's id is not found either), MN_EIO, MN_ENOMEM; *out is
 * zeroed on failure. */
int store_resp_get(CacheStore *s, const Hash128 *ns_id, const char *id, double cutoff, StoreResp *out);
/* Free what a get left in r and zero it (fine on a zeroed one). */
void store_resp_deinit(StoreResp *r);
/* Delete the response id of namespace ns_id with its inputs. MN_OK,
 * MN_ENOTFOUND, MN_EIO. Responses continuing it keep their rows. */
int store_resp_delete(CacheStore *s, const Hash128 *ns_id, const char *id);
/* Mark responses ids[0..n) of namespace ns_id used at `when` (never back
 * in time), in one transaction: a chain being continued does not expire. */
int store_resp_touch(CacheStore *s, const Hash128 *ns_id, const char *const *ids, size_t n, double when);
/* Delete the responses last used before cutoff; *n_expired: how many. */
int store_resp_expire(CacheStore *s, double cutoff, int64_t *n_expired);
int store_resp_count(CacheStore *s, int64_t *out);

/* ---- purge ------------------------------------------------------------------------- */

/* Rows a purge deleted. */
typedef struct StorePurged {
    int64_t n_replies, n_convs, n_responses;
} StorePurged;

/* Delete the reply memory, the conversations and the stored responses
 * (with their inputs) of namespace ns_id (replies of no known namespace
 * too; ns_id NULL: every row), in one transaction, then rewrite the file
 * (VACUUM) and truncate the WAL, so none of their bytes is left in the
 * database or its WAL (deleted content is zeroed, free pages are gone).
 * *out: rows deleted. The run rows are the disk tier's to delete
 * (tier_drop_namespace). MN_OK, MN_EIO, MN_EFULL (no room to rewrite),
 * MN_ENOMEM. */
int store_purge(CacheStore *s, const Hash128 *ns_id, StorePurged *out);

/* ---- tests ------------------------------------------------------------------------ */

/* Test hook: after n_skip more writes (puts, touches, deletes, trims,
 * expiries), the next n_fail fail as if SQLite had returned sqlite_code
 * (SQLITE_FULL, SQLITE_IOERR, ...), without running. n_fail 0 clears. */
void store_fault_set(CacheStore *s, int n_skip, int n_fail, int sqlite_code);

#endif
