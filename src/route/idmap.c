/* idmap.c — response id -> backend, bounded (see idmap.h).
 *
 * Entries live in one array used as a ring in insertion order: `next` is
 * the slot the next put takes, so when the map is full the slot it takes
 * holds the oldest entry, which is unlinked first. Lookups go through a
 * chained hash table over the slots (bucket heads and a `link` per slot,
 * -1 ending a chain), with twice as many buckets as slots. A dropped entry
 * leaves its slot empty until the ring comes round to it.
 */
#include "route/idmap.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "base/mem.h"
#include "route/ring.h"

typedef struct Entry {
    char id[CONVKEY_ID_MAX];
    int backend;
    long link;    /* the next slot of its bucket's chain, -1: none */
    bool is_used;
} Entry;

struct IdMap {
    pthread_mutex_t lock;
    Entry *slots;   /* (cap) */
    long *buckets;  /* (n_buckets) first slot of each chain, -1: empty */
    size_t cap, n_buckets, next, n_used;
};

int idmap_new(size_t cap, IdMap **out) {
    *out = NULL;
    if (cap < 1) return MN_EINVAL;
    IdMap *m = mn_calloc(1, sizeof *m);
    if (m == NULL) return MN_ENOMEM;
    m->cap = cap;
    m->n_buckets = 2 * cap;
    m->slots = mn_calloc(cap, sizeof *m->slots);
    m->buckets = mn_calloc(m->n_buckets, sizeof *m->buckets);
    if (m->slots == NULL || m->buckets == NULL) {
        mn_free(m->slots);
        mn_free(m->buckets);
        mn_free(m);
        return MN_ENOMEM;
    }
    for (size_t i = 0; i < m->n_buckets; i++) m->buckets[i] = -1;
    pthread_mutex_init(&m->lock, NULL);
    *out = m;
    return MN_OK;
}

void idmap_free(IdMap *m) {
    if (m == NULL) return;
    pthread_mutex_destroy(&m->lock);
    mn_free(m->slots);
    mn_free(m->buckets);
    mn_free(m);
}

/* ---- under the lock ------------------------------------------------------------------ */

static size_t bucket_of(const IdMap *m, const char *id) { return (size_t)(ring_hash(id, strlen(id)) % m->n_buckets); }

/* The address of the link that points at id's slot (a bucket head or a
 * slot's link), or NULL when id is absent. */
static long *find_link(IdMap *m, const char *id) {
    long *at = &m->buckets[bucket_of(m, id)];
    while (*at >= 0 && strcmp(m->slots[*at].id, id) != 0) at = &m->slots[*at].link;
    return *at >= 0 ? at : NULL;
}

static void unlink_slot(IdMap *m, long slot) {
    long *at = find_link(m, m->slots[slot].id);
    if (at) *at = m->slots[slot].link; /* a used slot is always on its chain */
    m->slots[slot].is_used = false;
    m->n_used--;
}

/* ---- API ----------------------------------------------------------------------------- */

void idmap_put(IdMap *m, const char *id, int backend) {
    if (strlen(id) >= CONVKEY_ID_MAX) return;
    pthread_mutex_lock(&m->lock);
    long *at = find_link(m, id);
    if (at) {
        m->slots[*at].backend = backend;
    } else {
        long slot = (long)m->next;
        m->next = (m->next + 1) % m->cap;
        if (m->slots[slot].is_used) unlink_slot(m, slot); /* the oldest */
        Entry *e = &m->slots[slot];
        strcpy(e->id, id);
        e->backend = backend;
        e->is_used = true;
        size_t b = bucket_of(m, id);
        e->link = m->buckets[b];
        m->buckets[b] = slot;
        m->n_used++;
    }
    pthread_mutex_unlock(&m->lock);
}

int idmap_get(IdMap *m, const char *id) {
    pthread_mutex_lock(&m->lock);
    long *at = find_link(m, id);
    int backend = at ? m->slots[*at].backend : -1;
    pthread_mutex_unlock(&m->lock);
    return backend;
}

void idmap_drop(IdMap *m, const char *id) {
    pthread_mutex_lock(&m->lock);
    long *at = find_link(m, id);
    if (at) unlink_slot(m, *at);
    pthread_mutex_unlock(&m->lock);
}

size_t idmap_count(IdMap *m) {
    pthread_mutex_lock(&m->lock);
    size_t n = m->n_used;
    pthread_mutex_unlock(&m->lock);
    return n;
}
