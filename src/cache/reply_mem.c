/* reply_mem.c — reply memory (see reply_mem.h): a chained hash table keyed
 * by XXH3-128(prefix key, text), with entries also kept in insertion order
 * on a ring so that the oldest is dropped first when the memory is full.
 */
#include "cache/reply_mem.h"

#include <pthread.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"

typedef struct Entry {
    Hash128 id; /* hash of (prefix key, text) */
    char *text;
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
    struct Entry *next; /* bucket chain */
} Entry;

struct ReplyMemory {
    pthread_mutex_t lock;
    Entry **buckets; /* (n_buckets) */
    size_t n_buckets;
    Entry **ring;    /* (max_entries) insertion order */
    uint32_t *text_count; /* (n_buckets) entries per slot of their text's hash */
    int max_entries, head, count;
    ReplyFetchFn fetch_fn; /* a shared store's entries; NULL: none */
    void *fetch_ctx;
};

ReplyMemory *replymem_new(int max_entries) {
    if (max_entries < 1) return NULL;
    ReplyMemory *rm = mn_calloc(1, sizeof *rm);
    if (rm == NULL) return NULL;
    rm->max_entries = max_entries;
    rm->n_buckets = 64;
    while (rm->n_buckets < (size_t)max_entries) rm->n_buckets *= 2;
    rm->buckets = mn_calloc(rm->n_buckets, sizeof *rm->buckets);
    rm->ring = mn_calloc((size_t)max_entries, sizeof *rm->ring);
    rm->text_count = mn_calloc(rm->n_buckets, sizeof *rm->text_count);
    if (!rm->buckets || !rm->ring || !rm->text_count) {
        mn_free(rm->buckets);
        mn_free(rm->ring);
        mn_free(rm->text_count);
        mn_free(rm);
        return NULL;
    }
    pthread_mutex_init(&rm->lock, NULL);
    return rm;
}

static void entry_free(Entry *e) {
    if (e == NULL) return;
    mn_free(e->text);
    mn_free(e->ids);
    mn_free(e);
}

void replymem_free(ReplyMemory *rm) {
    if (rm == NULL) return;
    for (size_t b = 0; b < rm->n_buckets; b++)
        for (Entry *e = rm->buckets[b], *next; e; e = next) {
            next = e->next;
            entry_free(e);
        }
    pthread_mutex_destroy(&rm->lock);
    mn_free(rm->buckets);
    mn_free(rm->ring);
    mn_free(rm->text_count);
    mn_free(rm);
}

void replymem_prefix_start(Hasher *h, const Hash128 *ns_id) {
    hasher_init(h);
    hasher_update(h, ns_id->b, 16);
}

Hash128 replymem_prefix_end(const Hasher *h) {
    Hasher end = *h;
    return hasher_final(&end);
}

Hash128 replymem_prefix_key(const Hash128 *ns_id, const int32_t *ids, size_t n) {
    Hasher h;
    replymem_prefix_start(&h, ns_id);
    hasher_i32s(&h, ids, n);
    return hasher_final(&h);
}

static Hash128 entry_id(const Hash128 *key, const char *text, size_t len) {
    Hasher h;
    hasher_init(&h);
    hasher_update(&h, key->b, 16);
    hasher_update(&h, text, len);
    return hasher_final(&h);
}

/* The text_count slot of a text: 0 there means no entry holds it. */
static uint32_t *text_slot(ReplyMemory *rm, const char *text, size_t len) {
    Hash128 h = hash128(text, len);
    uint64_t v;
    memcpy(&v, h.b, 8);
    return &rm->text_count[v & (rm->n_buckets - 1)];
}

static Entry **bucket_of(ReplyMemory *rm, const Hash128 *id) {
    uint64_t v;
    memcpy(&v, id->b + 8, 8);
    return &rm->buckets[v & (rm->n_buckets - 1)];
}

/* Unlink the entry with this id from its bucket; returns it or NULL. */
static Entry *unlink_id(ReplyMemory *rm, const Hash128 *id) {
    for (Entry **pp = bucket_of(rm, id); *pp; pp = &(*pp)->next)
        if (hash128_eq(&(*pp)->id, id)) {
            Entry *e = *pp;
            *pp = e->next;
            return e;
        }
    return NULL;
}

Hash128 replymem_text_key(const Hash128 *ns_id) {
    static const char tag[] = "mnemo reply text\n";
    Hasher h;
    hasher_init(&h);
    hasher_update(&h, ns_id->b, 16);
    hasher_update(&h, tag, sizeof tag - 1);
    return hasher_final(&h);
}

int replymem_put(ReplyMemory *rm, const Hash128 *key, const char *text, size_t len, const int32_t *ids, size_t n) {
    Entry *e = mn_calloc(1, sizeof *e);
    if (e == NULL) return MN_ENOMEM;
    e->id = entry_id(key, text, len);
    e->text = mn_strndup(text, len);
    e->ids = mn_malloc((n ? n : 1) * sizeof *ids);
    if (e->text == NULL || e->ids == NULL) {
        entry_free(e);
        return MN_ENOMEM;
    }
    e->text_len = len;
    memcpy(e->ids, ids, n * sizeof *ids);
    e->n_ids = n;
    pthread_mutex_lock(&rm->lock);
    Entry *old = unlink_id(rm, &e->id);
    if (old != NULL) { /* same key and text: replace in place on the ring */
        for (int i = 0; i < rm->count; i++) {
            int k = (rm->head + i) % rm->max_entries;
            if (rm->ring[k] == old) rm->ring[k] = e;
        }
    } else {
        if (rm->count == rm->max_entries) { /* drop the oldest */
            Entry *gone = unlink_id(rm, &rm->ring[rm->head]->id);
            (*text_slot(rm, gone->text, gone->text_len))--;
            entry_free(gone);
            rm->head = (rm->head + 1) % rm->max_entries;
            rm->count--;
        }
        rm->ring[(rm->head + rm->count) % rm->max_entries] = e;
        rm->count++;
        (*text_slot(rm, e->text, e->text_len))++; /* a replaced entry had the same text */
    }
    Entry **b = bucket_of(rm, &e->id);
    e->next = *b;
    *b = e;
    pthread_mutex_unlock(&rm->lock);
    entry_free(old);
    return MN_OK;
}

int replymem_get(ReplyMemory *rm, const Hash128 *key, const char *text, size_t len, TokIds *out) {
    Hash128 id = entry_id(key, text, len);
    int found = 0;
    pthread_mutex_lock(&rm->lock);
    for (Entry *e = *bucket_of(rm, &id); e; e = e->next) {
        if (!hash128_eq(&e->id, &id) || e->text_len != len || memcmp(e->text, text, len) != 0) continue;
        found = 1;
        size_t n0 = out->n;
        for (size_t i = 0; i < e->n_ids; i++)
            if (tok_ids_push(out, e->ids[i]) != MN_OK) {
                out->n = n0;
                found = -MN_ENOMEM;
                break;
            }
        break;
    }
    pthread_mutex_unlock(&rm->lock);
    return found;
}

bool replymem_may_hold(ReplyMemory *rm, const char *text, size_t len) {
    pthread_mutex_lock(&rm->lock);
    bool may = *text_slot(rm, text, len) > 0;
    pthread_mutex_unlock(&rm->lock);
    return may;
}

int replymem_count(ReplyMemory *rm) {
    pthread_mutex_lock(&rm->lock);
    int n = rm->count;
    pthread_mutex_unlock(&rm->lock);
    return n;
}

void replymem_set_fetch(ReplyMemory *rm, ReplyFetchFn fn, void *ctx) {
    pthread_mutex_lock(&rm->lock);
    rm->fetch_fn = fn;
    rm->fetch_ctx = ctx;
    pthread_mutex_unlock(&rm->lock);
}

int replymem_fetch(ReplyMemory *rm, const Hash128 *ns_id, const char *const *texts, const size_t *lens, int n) {
    pthread_mutex_lock(&rm->lock);
    ReplyFetchFn fn = rm->fetch_fn;
    void *ctx = rm->fetch_ctx;
    pthread_mutex_unlock(&rm->lock);
    if (fn == NULL || n <= 0) return 0;
    const char **ask = mn_malloc((size_t)n * sizeof *ask);
    size_t *ask_lens = mn_malloc((size_t)n * sizeof *ask_lens);
    int n_ask = 0;
    for (int i = 0; ask && ask_lens && i < n; i++) {
        if (replymem_may_hold(rm, texts[i], lens[i])) continue;
        ask[n_ask] = texts[i];
        ask_lens[n_ask++] = lens[i];
    }
    if (n_ask > 0) fn(ctx, ns_id, ask, ask_lens, n_ask);
    mn_free(ask);
    mn_free(ask_lens);
    return n_ask;
}
