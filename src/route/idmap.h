/* idmap.h — the router's memory of which backend made a stored response.
 *
 * The Responses API keeps a conversation on the server that answered it;
 * a later turn names its previous_response_id, and only that server knows
 * the id. Ids are the servers' own (the router never rewrites them), so
 * the router remembers id -> backend for the responses it passed on, in a
 * map of bounded size: when it is full the oldest entry makes room. A
 * forgotten id (an old one, or one from before a restart of the router) is
 * found by asking the backends in turn (route/router.c).
 *
 * Thread-safe: one mutex guards the map; connection threads put, get and
 * drop under it.
 */
#ifndef MN_IDMAP_H
#define MN_IDMAP_H

#include <stddef.h>

#include "base/err.h"
#include "route/convkey.h"

typedef struct IdMap IdMap;

/* A map of at most cap entries (cap >= 1). MN_OK and *out, MN_EINVAL, MN_ENOMEM. */
int idmap_new(size_t cap, IdMap **out);
void idmap_free(IdMap *m);

/* Remember id -> backend (replacing an older entry of id; the oldest
 * entry goes when the map is full). An id of CONVKEY_ID_MAX bytes or more
 * is not kept. */
void idmap_put(IdMap *m, const char *id, int backend);
/* The backend of id, or -1 when the map does not hold it. */
int idmap_get(IdMap *m, const char *id);
/* Forget id (nothing when absent). */
void idmap_drop(IdMap *m, const char *id);
/* Entries held now. */
size_t idmap_count(IdMap *m);

#endif
