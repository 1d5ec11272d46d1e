/* purge.c — erase a namespace's cached data from a disk tier's directory
 * (see purge.h).
 *
 * The purge opens the directory the way a server does — its database, then
 * the disk tier over it, which validates and adopts every stored run — and
 * uses their own operations: the tier drops the namespace's runs (deleting
 * their rows), overwrites the free space of its slabs, and the database
 * deletes the namespace's other rows and rewrites itself. Opening the
 * database first takes the directory's lock (purge.h). One thread; no
 * state outside the call.
 */
#include "cache/purge.h"

#include "cache/index.h"
#include "cache/store.h"
#include "cache/tier.h"

/* The tier's budget while purging: large enough that every stored run is
 * adopted, so that nothing is evicted for a budget (only purged). */
#define PURGE_NO_BUDGET (1ull << 60)

int purge_disk_tier(const char *dir, const char *ns, PurgeReport *out, MnErr *err) {
    *out = (PurgeReport){0};
    CacheStore *store = NULL;
    int rc = store_open_existing(dir, &store, err);
    if (rc == MN_EBUSY)
        return mn_err_set(err, MN_EBUSY,
                          "%s is in use by a running mnemo server (it holds the lock on %s/mnemo.db): stop the "
                          "server (SIGTERM lets it finish its writes), then purge again; nothing was changed",
                          dir, dir);
    if (rc != MN_OK) return rc;
    Hash128 ns_id = {{0}};
    if (ns != NULL) ns_id = index_namespace_id(ns);
    const Hash128 *which = ns != NULL ? &ns_id : NULL;

    const StoreIdentity *id = store_identity(store);
    TierDiskConfig dc = {.dir = dir,
                         .store = store,
                         .capacity_bytes = PURGE_NO_BUDGET,
                         .n_layer = id->n_layer,
                         .block_bytes = (size_t)id->block_bytes,
                         .model_fingerprint = id->model_fingerprint,
                         .kv_format = id->kv_format,
                         .aio_backend = AIO_BACKEND_AUTO,
                         .is_durable = true};
    Tier *t = NULL;
    MnErr terr = {0};
    rc = tier_disk_new(&dc, &t, &terr);
    if (rc != MN_OK) {
        mn_err_set(err, rc, "cannot open the disk tier in %s: %s", dir, terr.msg);
    } else {
        out->n_runs = tier_drop_namespace(t, which, &out->n_blocks);
        rc = tier_disk_scrub(t, &out->n_zeroed_bytes);
        if (rc != MN_OK)
            mn_err_set(err, rc, "overwriting the free space of the slab files in %s: %s", dir, mn_strerror(rc));
        tier_free(t); /* keeps the other namespaces' runs */
    }
    if (rc == MN_OK) {
        StorePurged n = {0};
        rc = store_purge(store, which, &n);
        if (rc != MN_OK)
            mn_err_set(err, rc, "purging the reply memory, conversations and responses in %s: %s (logged above)",
                       store_path(store), mn_strerror(rc));
        out->n_replies = n.n_replies;
        out->n_convs = n.n_convs;
        out->n_responses = n.n_responses;
    }
    store_close(store);
    return rc;
}
