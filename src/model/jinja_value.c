/* jinja_value.c — Jinja values: memory, reference counts, and Python's
 * semantics for printing, comparing and serializing them.
 *
 * Memory: every object is charged to its JvCtx (mem_used against
 * mem_limit) when made and credited when freed, so a template cannot take
 * more than its limit however it builds values. Freeing is iterative: an
 * object whose count reaches zero joins ctx->pending_free and jv_release
 * drains that list, releasing each object's children in turn, so freeing
 * a long chain of objects uses no stack.
 *
 * Namespaces are mutable and can hold themselves; they stay on the ctx's
 * registry while alive, and jv_ctx_deinit empties every one of them (so
 * cycles fall apart) before freeing what is left.
 *
 * Invariants: a container's depth is 1 + its deepest child container's
 * (namespaces and objects count 1), at most JV_MAX_DEPTH; a JvStr's data
 * is NUL-terminated UTF-8 and n_chars counts its code points; a dict's
 * index, when present, maps every key's hash to its entry.
 */
#include "model/jinja_value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "model/jinja_unicode.h"
#include "base/utf8.h"

/* ---- context ------------------------------------------------------------------ */

void jv_ctx_init(JvCtx *c, size_t mem_limit, uint64_t fuel) {
    memset(c, 0, sizeof *c);
    c->mem_limit = mem_limit;
    c->fuel = fuel;
    c->year = 1970;
    c->month = 1;
    c->day = 1;
}

static void free_object(JvHead *h);

void jv_ctx_deinit(JvCtx *c) {
    /* Empty every namespace first: their contents may hold other
     * namespaces (even themselves), which must not be freed meanwhile. */
    c->is_freeing = true; /* releases below only queue */
    for (JvDict *d = c->namespaces; d != NULL; d = d->ns_next) {
        d->h.refs++; /* keeps d off the pending list while it is emptied */
        for (size_t i = 0; i < d->n; i++) {
            jv_release(d->ents[i].key);
            jv_release(d->ents[i].val);
        }
        d->n = 0;
    }
    /* Free what the namespaces held; a namespace queued before its turn
     * above is freed here too (and leaves the registry). */
    while (c->pending_free != NULL) {
        JvHead *h = c->pending_free;
        c->pending_free = h->next_free;
        free_object(h);
    }
    c->is_freeing = false;
    while (c->namespaces != NULL) {
        JvDict *d = c->namespaces;
        c->namespaces = d->ns_next;
        jv_mem_free(c, d->ents, d->cap * sizeof(JvEntry));
        jv_mem_free(c, d->index, d->index_cap * sizeof(uint32_t));
        jv_mem_free(c, d, d->h.bytes);
    }
}

int jv_fail(JvCtx *c, int code, const char *fmt, ...) {
    if (c->err_code == MN_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
        va_end(ap);
        c->err_code = code;
    }
    return code;
}

int jv_charge(JvCtx *c, uint64_t units) {
    if (units > c->fuel) {
        c->fuel = 0;
        return jv_fail(c, MN_ERANGE, "the template did more work than its budget allows");
    }
    c->fuel -= units;
    return MN_OK;
}

void *jv_mem_alloc(JvCtx *c, size_t n) {
    if (n > c->mem_limit - c->mem_used) {
        jv_fail(c, MN_ERANGE, "the template needs more than %zu bytes of memory", c->mem_limit);
        return NULL;
    }
    void *p = mn_malloc(n ? n : 1);
    if (p == NULL) {
        jv_fail(c, MN_ENOMEM, "out of memory");
        return NULL;
    }
    c->mem_used += n;
    return p;
}

void *jv_mem_realloc(JvCtx *c, void *p, size_t old_n, size_t new_n) {
    if (new_n > old_n && new_n - old_n > c->mem_limit - c->mem_used) {
        jv_fail(c, MN_ERANGE, "the template needs more than %zu bytes of memory", c->mem_limit);
        return NULL;
    }
    void *q = mn_realloc(p, new_n ? new_n : 1);
    if (q == NULL) {
        jv_fail(c, MN_ENOMEM, "out of memory");
        return NULL;
    }
    c->mem_used = c->mem_used - old_n + new_n;
    return q;
}

void jv_mem_free(JvCtx *c, void *p, size_t n) {
    if (p == NULL) return;
    c->mem_used -= n;
    mn_free(p);
}

/* ---- objects and references ------------------------------------------------------ */

static void *obj_alloc(JvCtx *c, JvKind kind, size_t n) {
    JvHead *h = jv_mem_alloc(c, n);
    if (h == NULL) return NULL;
    memset(h, 0, n);
    h->refs = 1;
    h->kind = (uint8_t)kind;
    h->bytes = n;
    h->ctx = c;
    return h;
}

static inline bool is_heap(Jv v) {
    return v.kind >= JV_STR || (v.kind == JV_UNDEF && v.as.u != NULL);
}

/* Release the children of h (queueing those that reach zero) and free h. */
static void free_object(JvHead *h) {
    JvCtx *c = h->ctx;
    switch ((JvKind)h->kind) {
    case JV_LIST: {
        JvList *l = (JvList *)h;
        for (size_t i = 0; i < l->n; i++) jv_release(l->items[i]);
        jv_mem_free(c, l->items, l->cap * sizeof(Jv));
        if (l->gen) {
            l->gen->type->free_fn(l->gen);
            jv_mem_free(c, l->gen, l->gen->bytes);
        }
        break;
    }
    case JV_NS: {
        JvDict *d = (JvDict *)h;
        if (d->ns_prev) d->ns_prev->ns_next = d->ns_next;
        else c->namespaces = d->ns_next;
        if (d->ns_next) d->ns_next->ns_prev = d->ns_prev;
    }
        __attribute__((fallthrough)); /* then freed as a dict */
    case JV_DICT: {
        JvDict *d = (JvDict *)h;
        for (size_t i = 0; i < d->n; i++) {
            jv_release(d->ents[i].key);
            jv_release(d->ents[i].val);
        }
        jv_mem_free(c, d->ents, d->cap * sizeof(JvEntry));
        jv_mem_free(c, d->index, d->index_cap * sizeof(uint32_t));
        break;
    }
    case JV_OBJ: {
        JvObj *o = (JvObj *)h;
        if (o->type->free_fn) o->type->free_fn(o);
        break;
    }
    default:
        break;
    }
    jv_mem_free(c, h, h->bytes);
}

void jv_release(Jv v) {
    if (!is_heap(v)) return;
    JvHead *h = v.as.h;
    if (h->refs < 0 || --h->refs > 0) return;
    JvCtx *c = h->ctx;
    h->next_free = c->pending_free;
    c->pending_free = h;
    if (c->is_freeing) return;
    c->is_freeing = true;
    while (c->pending_free != NULL) {
        JvHead *x = c->pending_free;
        c->pending_free = x->next_free;
        free_object(x);
    }
    c->is_freeing = false;
}

/* ---- undefined ------------------------------------------------------------------------ */

Jv jv_undef_msg(JvCtx *c, bool is_unsafe, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) return jv_undef();
    size_t len = strlen(msg);
    JvUndef *u = obj_alloc(c, JV_UNDEF, sizeof(JvUndef) + len + 1);
    if (u == NULL) {
        /* the message is only for a later error; the memory error stands */
        return jv_undef();
    }
    u->is_unsafe = is_unsafe;
    memcpy(u->msg, msg, len + 1);
    Jv v = {.kind = JV_UNDEF};
    v.as.u = u;
    return v;
}

const char *jv_undef_text(Jv v) {
    if (v.kind == JV_UNDEF && v.as.u != NULL) return v.as.u->msg;
    return "value is undefined";
}

/* ---- strings ------------------------------------------------------------------------------ */

static size_t count_chars(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

int jv_str_new(JvCtx *c, const char *data, size_t len, bool is_safe, Jv *out) {
    *out = jv_undef();
    if (len > SIZE_MAX / 2) return jv_fail(c, MN_ERANGE, "string too long");
    JvStr *s = obj_alloc(c, JV_STR, sizeof(JvStr) + len + 1);
    if (s == NULL) return c->err_code;
    if (len) memcpy(s->data, data, len);
    s->data[len] = '\0';
    s->len = len;
    s->n_chars = count_chars(data, len);
    s->is_safe = is_safe;
    out->kind = JV_STR;
    out->as.s = s;
    return MN_OK;
}

JvStr *jv_str_static_new(const char *data, size_t len) {
    JvStr *s = mn_malloc(sizeof(JvStr) + len + 1);
    if (s == NULL) return NULL;
    memset(s, 0, sizeof *s);
    s->h.refs = -1;
    s->h.kind = JV_STR;
    if (len) memcpy(s->data, data, len);
    s->data[len] = '\0';
    s->len = len;
    s->n_chars = count_chars(data, len);
    return s;
}

void jv_str_static_free(JvStr *s) { mn_free(s); }

size_t jv_str_chars(const JvStr *s) { return s->n_chars; }

size_t jv_str_offset(const JvStr *s, size_t i) {
    if (s->n_chars == s->len) return i < s->len ? i : s->len;
    size_t off = 0;
    while (i > 0 && off < s->len) {
        off++;
        while (off < s->len && ((unsigned char)s->data[off] & 0xC0) == 0x80) off++;
        i--;
    }
    return off;
}

/* ---- lists ------------------------------------------------------------------------------------ */

int jv_list_new(JvCtx *c, JvListTag tag, size_t cap, Jv *out) {
    *out = jv_undef();
    JvList *l = obj_alloc(c, JV_LIST, sizeof(JvList));
    if (l == NULL) return c->err_code;
    l->tag = tag;
    l->depth = 1;
    if (cap > 0) {
        if (cap > SIZE_MAX / sizeof(Jv)) cap = SIZE_MAX / sizeof(Jv);
        l->items = jv_mem_alloc(c, cap * sizeof(Jv));
        if (l->items == NULL) {
            jv_mem_free(c, l, l->h.bytes);
            return c->err_code;
        }
        l->cap = cap;
    }
    out->kind = JV_LIST;
    out->as.l = l;
    return MN_OK;
}

static uint32_t child_depth(Jv v) {
    if (v.kind == JV_LIST) return v.as.l->depth;
    if (v.kind == JV_DICT) return v.as.d->depth;
    return 0;
}

int jv_list_push(JvCtx *c, Jv list, Jv v) {
    JvList *l = list.as.l;
    uint32_t d = child_depth(v) + 1;
    if (d > JV_MAX_DEPTH) {
        jv_release(v);
        return jv_fail(c, MN_ERANGE, "a value is nested more than %d levels deep", JV_MAX_DEPTH);
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        Jv *items = jv_mem_realloc(c, l->items, l->cap * sizeof(Jv), cap * sizeof(Jv));
        if (items == NULL) {
            jv_release(v);
            return c->err_code;
        }
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = v;
    if (d > l->depth) l->depth = d;
    return MN_OK;
}

/* ---- generators and iterators ------------------------------------------------------------------ */

static uint32_t gen_depth(Jv v) {
    return v.kind == JV_LIST && v.as.l->tag == JV_LIST_GEN && v.as.l->gen ? v.as.l->gen->depth : 0;
}

int jv_gen_new(JvCtx *c, const JvGenType *t, size_t size, Jv source, Jv *out, JvGen **g) {
    *g = NULL;
    uint32_t depth = gen_depth(source) + 1;
    if (depth > JV_MAX_DEPTH) {
        *out = jv_undef();
        return jv_fail(c, MN_ERANGE, "generators are chained more than %d deep", JV_MAX_DEPTH);
    }
    int rc = jv_list_new(c, JV_LIST_GEN, 0, out);
    if (rc) return rc;
    JvGen *gen = jv_mem_alloc(c, size);
    if (gen == NULL) {
        jv_release(*out);
        *out = jv_undef();
        return c->err_code;
    }
    memset(gen, 0, size);
    gen->type = t;
    gen->ctx = c;
    gen->bytes = size;
    gen->depth = depth;
    out->as.l->gen = gen;
    *g = gen;
    return MN_OK;
}

int jv_gen_next(JvCtx *c, Jv gen, Jv *item, bool *got) {
    JvList *l = gen.as.l;
    *got = false;
    *item = jv_undef();
    if (l->cursor < l->n) {
        *item = jv_retain(l->items[l->cursor++]);
        *got = true;
        return MN_OK;
    }
    if (l->gen == NULL) return MN_OK;
    int rc = jv_charge(c, 1);
    if (rc == MN_OK) rc = l->gen->type->next_fn(c, l->gen, item, got);
    if (rc || !*got) { /* ended or failed: exhausted for good */
        JvGen *g = l->gen;
        l->gen = NULL;
        g->type->free_fn(g);
        jv_mem_free(c, g, g->bytes);
        if (rc) {
            jv_release(*item);
            *item = jv_undef();
            *got = false;
        }
    }
    return rc;
}

void jv_iter_init(JvIter *it, Jv v) {
    it->src = jv_retain(v);
    it->list = jv_undef();
    it->pos = 0;
    it->is_started = false;
}

void jv_iter_deinit(JvIter *it) {
    jv_release(it->src);
    jv_release(it->list);
    it->src = it->list = jv_undef();
}

int jv_iter_next(JvCtx *c, JvIter *it, Jv *item, bool *got) {
    *got = false;
    *item = jv_undef();
    Jv src = it->src;
    if (!it->is_started) {
        it->is_started = true;
        if (src.kind == JV_DICT || src.kind == JV_STR) {
            int rc = jv_iterate(c, src, &it->list);
            if (rc) return rc;
        } else if (src.kind != JV_LIST && src.kind != JV_UNDEF) {
            return jv_fail(c, MN_EINVAL, "'%s' object is not iterable", jv_type_name(src));
        }
    }
    if (src.kind == JV_LIST && src.as.l->tag == JV_LIST_GEN) return jv_gen_next(c, src, item, got);
    const JvList *l = it->list.kind == JV_LIST ? it->list.as.l : src.kind == JV_LIST ? src.as.l : NULL;
    if (l == NULL || it->pos >= l->n) return MN_OK;
    *item = jv_retain(l->items[it->pos++]);
    *got = true;
    return MN_OK;
}

/* ---- dicts ------------------------------------------------------------------------------------- */

#define DICT_INDEX_MIN 8 /* entries before a dict builds its hash index */

int jv_dict_new(JvCtx *c, Jv *out) {
    *out = jv_undef();
    JvDict *d = obj_alloc(c, JV_DICT, sizeof(JvDict));
    if (d == NULL) return c->err_code;
    d->depth = 1;
    out->kind = JV_DICT;
    out->as.d = d;
    return MN_OK;
}

int jv_ns_new(JvCtx *c, Jv *out) {
    *out = jv_undef();
    JvDict *d = obj_alloc(c, JV_NS, sizeof(JvDict));
    if (d == NULL) return c->err_code;
    d->depth = 1;
    d->ns_next = c->namespaces;
    if (c->namespaces) c->namespaces->ns_prev = d;
    c->namespaces = d;
    out->kind = JV_NS;
    out->as.d = d;
    return MN_OK;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_int(int64_t i) {
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

/* A hash consistent with jv_eq for hashable keys (1, 1.0 and True are equal). */
static uint64_t key_hash(Jv k) {
    switch (k.kind) {
    case JV_STR: return hash_bytes(k.as.s->data, k.as.s->len);
    case JV_BOOL: return hash_int(k.as.b);
    case JV_INT: return hash_int(k.as.i);
    case JV_FLOAT:
        if (k.as.f == floor(k.as.f) && fabs(k.as.f) < 9.2e18) return hash_int((int64_t)k.as.f);
        {
            uint64_t bits;
            memcpy(&bits, &k.as.f, sizeof bits);
            return hash_int((int64_t)bits);
        }
    default: return 7;
    }
}

static bool key_hashable(Jv k) {
    return k.kind == JV_STR || k.kind == JV_INT || k.kind == JV_FLOAT || k.kind == JV_BOOL || k.kind == JV_NONE;
}

static int dict_reindex(JvCtx *c, JvDict *d) {
    size_t cap = 16;
    while (cap < d->n * 2 + 2) cap *= 2;
    uint32_t *idx = jv_mem_alloc(c, cap * sizeof(uint32_t));
    if (idx == NULL) return c->err_code;
    memset(idx, 0, cap * sizeof(uint32_t));
    for (size_t i = 0; i < d->n; i++) {
        size_t p = key_hash(d->ents[i].key) & (cap - 1);
        while (idx[p] != 0) p = (p + 1) & (cap - 1);
        idx[p] = (uint32_t)(i + 1);
    }
    jv_mem_free(c, d->index, d->index_cap * sizeof(uint32_t));
    d->index = idx;
    d->index_cap = cap;
    return MN_OK;
}

/* Entry number of key, or -1. */
static long dict_find(const JvDict *d, Jv key) {
    if (d->index != NULL) {
        size_t p = key_hash(key) & (d->index_cap - 1);
        while (d->index[p] != 0) {
            size_t i = d->index[p] - 1;
            if (jv_eq(d->ents[i].key, key)) return (long)i;
            p = (p + 1) & (d->index_cap - 1);
        }
        return -1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->ents[i].key, key)) return (long)i;
    return -1;
}

const Jv *jv_dict_get(const JvDict *d, Jv key) {
    if (!key_hashable(key)) return NULL;
    long i = dict_find(d, key);
    return i < 0 ? NULL : &d->ents[i].val;
}

const Jv *jv_dict_get_str(const JvDict *d, const char *key, size_t len) {
    if (d->index == NULL) {
        for (size_t i = 0; i < d->n; i++) {
            const Jv *k = &d->ents[i].key;
            if (k->kind == JV_STR && k->as.s->len == len && memcmp(k->as.s->data, key, len) == 0) return &d->ents[i].val;
        }
        return NULL;
    }
    size_t p = hash_bytes(key, len) & (d->index_cap - 1);
    while (d->index[p] != 0) {
        size_t i = d->index[p] - 1;
        const Jv *k = &d->ents[i].key;
        if (k->kind == JV_STR && k->as.s->len == len && memcmp(k->as.s->data, key, len) == 0) return &d->ents[i].val;
        p = (p + 1) & (d->index_cap - 1);
    }
    return NULL;
}

int jv_dict_set(JvCtx *c, Jv dict, Jv key, Jv val) {
    JvDict *d = dict.as.d;
    if (!key_hashable(key)) {
        jv_release(val);
        return jv_fail(c, MN_EINVAL, "unhashable type: '%s'", jv_type_name(key));
    }
    uint32_t depth = child_depth(val) + 1;
    if (dict.kind == JV_DICT && depth > JV_MAX_DEPTH) {
        jv_release(val);
        return jv_fail(c, MN_ERANGE, "a value is nested more than %d levels deep", JV_MAX_DEPTH);
    }
    long i = dict_find(d, key);
    if (i >= 0) {
        jv_release(d->ents[i].val);
        d->ents[i].val = val;
    } else {
        if (d->n == d->cap) {
            size_t cap = d->cap ? d->cap * 2 : 4;
            if (cap > UINT32_MAX - 1) {
                jv_release(val);
                return jv_fail(c, MN_ERANGE, "dict too large");
            }
            JvEntry *ents = jv_mem_realloc(c, d->ents, d->cap * sizeof(JvEntry), cap * sizeof(JvEntry));
            if (ents == NULL) {
                jv_release(val);
                return c->err_code;
            }
            d->ents = ents;
            d->cap = cap;
        }
        d->ents[d->n].key = jv_retain(key);
        d->ents[d->n].val = val;
        d->n++;
        if (d->n >= DICT_INDEX_MIN && d->n * 2 + 2 > d->index_cap) {
            int rc = dict_reindex(c, d);
            if (rc) return rc;
        } else if (d->index != NULL) {
            size_t p = key_hash(key) & (d->index_cap - 1);
            while (d->index[p] != 0) p = (p + 1) & (d->index_cap - 1);
            d->index[p] = (uint32_t)d->n;
        }
    }
    if (dict.kind == JV_DICT && depth > d->depth) d->depth = depth;
    return MN_OK;
}

int jv_obj_new(JvCtx *c, const JvObjType *t, size_t size, Jv *out) {
    *out = jv_undef();
    JvObj *o = obj_alloc(c, JV_OBJ, size < sizeof(JvObj) ? sizeof(JvObj) : size);
    if (o == NULL) return c->err_code;
    o->type = t;
    out->kind = JV_OBJ;
    out->as.o = o;
    return MN_OK;
}

/* ---- buffers ---------------------------------------------------------------------------------- */

void jv_buf_init(JvBuf *b, JvCtx *c) {
    b->ctx = c;
    b->data = NULL;
    b->len = b->cap = 0;
    b->max_len = SIZE_MAX;
}

void jv_buf_deinit(JvBuf *b) {
    jv_mem_free(b->ctx, b->data, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
}

int jv_buf_put(JvBuf *b, const char *s, size_t n) {
    if (n == 0) return MN_OK;
    if (n > b->max_len - b->len)
        return jv_fail(b->ctx, MN_ERANGE, "the template's output is longer than %zu bytes", b->max_len);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) return jv_fail(b->ctx, MN_ERANGE, "string too long");
            cap *= 2;
        }
        char *d = jv_mem_realloc(b->ctx, b->data, b->cap, cap);
        if (d == NULL) return b->ctx->err_code;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return MN_OK;
}

int jv_buf_printf(JvBuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) return jv_fail(b->ctx, MN_EINVAL, "formatting failed");
    return jv_buf_put(b, tmp, (size_t)n);
}

int jv_buf_take(JvBuf *b, bool is_safe, Jv *out) {
    int rc = jv_str_new(b->ctx, b->data ? b->data : "", b->len, is_safe, out);
    jv_buf_deinit(b);
    return rc;
}

int jv_buf_finish(JvBuf *b, int rc, bool is_safe, Jv *out) {
    if (rc == MN_OK) return jv_buf_take(b, is_safe, out);
    jv_buf_deinit(b);
    *out = jv_undef();
    return rc;
}

/* ---- type names and truth --------------------------------------------------------------------- */

const char *jv_type_name(Jv v) {
    switch (v.kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return v.as.s->is_safe ? "Markup" : "str";
    case JV_LIST:
        switch (v.as.l->tag) {
        case JV_LIST_LIST: return "list";
        case JV_LIST_TUPLE: return "tuple";
        case JV_LIST_GEN: return "generator";
        case JV_LIST_ITEMS: return "dict_items";
        case JV_LIST_KEYS: return "dict_keys";
        case JV_LIST_VALUES: return "dict_values";
        case JV_LIST_RANGE: return "range";
        }
        return "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_OBJ: return v.as.o->type->name;
    }
    return "object";
}

bool jv_truthy(Jv v) {
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.as.b;
    case JV_INT: return v.as.i != 0;
    case JV_FLOAT: return v.as.f != 0.0;
    case JV_STR: return v.as.s->len > 0;
    case JV_LIST: return v.as.l->tag == JV_LIST_GEN || v.as.l->n > 0;
    case JV_DICT: return v.as.d->n > 0;
    case JV_NS:
    case JV_OBJ: return true;
    }
    return false;
}

bool jv_is_number(Jv v) { return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL; }

double jv_as_double(Jv v) {
    if (v.kind == JV_FLOAT) return v.as.f;
    if (v.kind == JV_INT) return (double)v.as.i;
    if (v.kind == JV_BOOL) return v.as.b ? 1.0 : 0.0;
    return 0.0;
}

/* ---- floats ------------------------------------------------------------------------------------- */

void jv_float_repr(double f, char buf[32]) {
    if (isnan(f)) {
        strcpy(buf, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(buf, f < 0 ? "-inf" : "inf");
        return;
    }
    /* the shortest digit string that reads back as f, as Python's repr */
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *q = e;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int decpt = exp10 + 1; /* digits d1..dn mean 0.d1..dn x 10^decpt */
    char *o = buf;
    if (neg) *o++ = '-';
    if (decpt <= -4 || decpt > 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, nd - 1);
            o += nd - 1;
        }
        int ax = exp10 < 0 ? -exp10 : exp10; /* at most 324 */
        *o++ = 'e';
        *o++ = exp10 < 0 ? '-' : '+';
        if (ax >= 100) *o++ = (char)('0' + ax / 100);
        *o++ = (char)('0' + ax / 10 % 10);
        *o++ = (char)('0' + ax % 10);
        *o = '\0';
        return;
    }
    if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, digits, nd);
        o += nd;
    } else if ((size_t)decpt >= nd) {
        memcpy(o, digits, nd);
        o += nd;
        for (size_t i = nd; i < (size_t)decpt; i++) *o++ = '0';
        *o++ = '.';
        *o++ = '0';
    } else {
        memcpy(o, digits, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, digits + decpt, nd - (size_t)decpt);
        o += nd - (size_t)decpt;
    }
    *o = '\0';
}

/* ---- str() and repr() ----------------------------------------------------------------------------- */

static int repr_str(JvBuf *out, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char quote = has_sq && !has_dq ? '"' : '\'';
    int rc = jv_buf_put(out, &quote, 1);
    size_t i = 0;
    while (rc == MN_OK && i < n) {
        size_t run = i;
        while (run < n && (unsigned char)s[run] >= 0x20 && (unsigned char)s[run] < 0x7F && s[run] != quote &&
               s[run] != '\\')
            run++;
        if (run > i) {
            rc = jv_buf_put(out, s + i, run - i);
            i = run;
            continue;
        }
        uint32_t cp;
        int k = utf8_decode_strict((const unsigned char *)s + i, n - i, &cp);
        if (k <= 0) {
            cp = (unsigned char)s[i];
            k = 1;
        }
        char esc[16];
        if (cp == (uint32_t)quote || cp == '\\') snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp == '\t') strcpy(esc, "\\t");
        else if (cp == '\n') strcpy(esc, "\\n");
        else if (cp == '\r') strcpy(esc, "\\r");
        else if (cp < 0x20 || cp == 0x7F) snprintf(esc, sizeof esc, "\\x%02x", cp);
        else if (ju_is_printable(cp)) {
            rc = jv_buf_put(out, s + i, (size_t)k);
            i += (size_t)k;
            continue;
        } else if (cp <= 0xFF) snprintf(esc, sizeof esc, "\\x%02x", cp);
        else if (cp <= 0xFFFF) snprintf(esc, sizeof esc, "\\u%04x", cp);
        else snprintf(esc, sizeof esc, "\\U%08x", cp);
        rc = jv_buf_puts(out, esc);
        i += (size_t)k;
    }
    if (rc == MN_OK) rc = jv_buf_put(out, &quote, 1);
    return rc;
}

static int repr_depth_enter(JvCtx *c) {
    if (c->repr_depth >= JV_MAX_DEPTH)
        return jv_fail(c, MN_ERANGE, "a value printed is nested more than %d levels deep", JV_MAX_DEPTH);
    c->repr_depth++;
    return MN_OK;
}

static int repr_items(JvCtx *c, const Jv *items, size_t n, JvBuf *out) {
    int rc = MN_OK;
    for (size_t i = 0; rc == MN_OK && i < n; i++) {
        if (i > 0) rc = jv_buf_put(out, ", ", 2);
        if (rc == MN_OK) rc = jv_repr(c, items[i], out);
    }
    return rc;
}

static int repr_dict(JvCtx *c, const JvDict *d, JvBuf *out) {
    int rc = jv_buf_put(out, "{", 1);
    for (size_t i = 0; rc == MN_OK && i < d->n; i++) {
        if (i > 0) rc = jv_buf_put(out, ", ", 2);
        if (rc == MN_OK) rc = jv_repr(c, d->ents[i].key, out);
        if (rc == MN_OK) rc = jv_buf_put(out, ": ", 2);
        if (rc == MN_OK) rc = jv_repr(c, d->ents[i].val, out);
    }
    if (rc == MN_OK) rc = jv_buf_put(out, "}", 1);
    return rc;
}

static int repr_list(JvCtx *c, const JvList *l, JvBuf *out) {
    int rc = MN_OK;
    switch (l->tag) {
    case JV_LIST_LIST:
        rc = jv_buf_put(out, "[", 1);
        if (rc == MN_OK) rc = repr_items(c, l->items, l->n, out);
        return rc ? rc : jv_buf_put(out, "]", 1);
    case JV_LIST_TUPLE:
        rc = jv_buf_put(out, "(", 1);
        if (rc == MN_OK) rc = repr_items(c, l->items, l->n, out);
        if (rc == MN_OK && l->n == 1) rc = jv_buf_put(out, ",", 1);
        return rc ? rc : jv_buf_put(out, ")", 1);
    case JV_LIST_ITEMS:
    case JV_LIST_KEYS:
    case JV_LIST_VALUES:
        rc = jv_buf_puts(out, l->tag == JV_LIST_ITEMS ? "dict_items([" : l->tag == JV_LIST_KEYS ? "dict_keys([" : "dict_values([");
        if (rc == MN_OK) rc = repr_items(c, l->items, l->n, out);
        return rc ? rc : jv_buf_put(out, "])", 2);
    case JV_LIST_RANGE:
        if (l->range[2] == 1) return jv_buf_printf(out, "range(%lld, %lld)", (long long)l->range[0], (long long)l->range[1]);
        return jv_buf_printf(out, "range(%lld, %lld, %lld)", (long long)l->range[0], (long long)l->range[1],
                             (long long)l->range[2]);
    case JV_LIST_GEN:
        break;
    }
    return jv_fail(c, MN_EUNSUPPORTED,
                   "printing a generator is not supported (Python prints its memory address); apply |list first");
}

static int str_or_repr(JvCtx *c, Jv v, JvBuf *out, bool is_repr) {
    char num[32];
    switch (v.kind) {
    case JV_UNDEF: return is_repr ? jv_buf_puts(out, "Undefined") : MN_OK;
    case JV_NONE: return jv_buf_puts(out, "None");
    case JV_BOOL: return jv_buf_puts(out, v.as.b ? "True" : "False");
    case JV_INT: return jv_buf_printf(out, "%lld", (long long)v.as.i);
    case JV_FLOAT:
        jv_float_repr(v.as.f, num);
        return jv_buf_puts(out, num);
    case JV_STR:
        if (!is_repr) return jv_buf_put(out, v.as.s->data, v.as.s->len);
        if (v.as.s->is_safe) {
            int rc = jv_buf_puts(out, "Markup(");
            if (rc == MN_OK) rc = repr_str(out, v.as.s->data, v.as.s->len);
            return rc ? rc : jv_buf_puts(out, ")");
        }
        return repr_str(out, v.as.s->data, v.as.s->len);
    case JV_LIST:
    case JV_DICT:
    case JV_NS: {
        int rc = repr_depth_enter(c);
        if (rc) return rc;
        if (v.kind == JV_LIST) rc = repr_list(c, v.as.l, out);
        else if (v.kind == JV_DICT) rc = repr_dict(c, v.as.d, out);
        else {
            rc = jv_buf_puts(out, "<Namespace ");
            if (rc == MN_OK) rc = repr_dict(c, v.as.d, out);
            if (rc == MN_OK) rc = jv_buf_puts(out, ">");
        }
        c->repr_depth--;
        return rc;
    }
    case JV_OBJ:
        if (v.as.o->type->str_fn) return v.as.o->type->str_fn(c, v.as.o, out);
        return jv_fail(c, MN_EUNSUPPORTED, "printing a '%s' object is not supported (Python prints its memory address)",
                       v.as.o->type->name);
    }
    return MN_OK;
}

int jv_str_of(JvCtx *c, Jv v, JvBuf *out) { return str_or_repr(c, v, out, false); }
int jv_repr(JvCtx *c, Jv v, JvBuf *out) { return str_or_repr(c, v, out, true); }

int jv_to_str(JvCtx *c, Jv v, Jv *out) {
    if (v.kind == JV_STR) {
        *out = jv_retain(v);
        return MN_OK;
    }
    JvBuf b;
    jv_buf_init(&b, c);
    return jv_buf_finish(&b, jv_str_of(c, v, &b), false, out);
}

int jv_escape_into(JvBuf *out, const char *s, size_t n) {
    int rc = MN_OK;
    size_t i = 0;
    while (rc == MN_OK && i < n) {
        size_t run = i;
        while (run < n && strchr("&<>'\"", s[run]) == NULL) run++;
        if (run > i) rc = jv_buf_put(out, s + i, run - i);
        if (rc || run >= n) break;
        switch (s[run]) {
        case '&': rc = jv_buf_puts(out, "&amp;"); break;
        case '<': rc = jv_buf_puts(out, "&lt;"); break;
        case '>': rc = jv_buf_puts(out, "&gt;"); break;
        case '\'': rc = jv_buf_puts(out, "&#39;"); break;
        default: rc = jv_buf_puts(out, "&#34;"); break;
        }
        i = run + 1;
    }
    return rc;
}

/* ---- equality and order ------------------------------------------------------------------------- */

/* Exact comparison of an int and a double, as Python does (-1, 0, 1; 2 for NaN). */
static int cmp_int_double(int64_t i, double f) {
    if (isnan(f)) return 2;
    if (f >= 9223372036854775808.0) return -1;
    if (f < -9223372036854775808.0) return 1;
    double fl = floor(f);
    int64_t fi = (int64_t)fl;
    if (i < fi) return -1;
    if (i > fi) return 1;
    return f > fl ? -1 : 0;
}

/* Numeric comparison of two numbers (bool, int, float): -1/0/1, 2 if unordered. */
static int cmp_numbers(Jv a, Jv b) {
    if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) {
        int64_t x = a.kind == JV_BOOL ? a.as.b : a.as.i, y = b.kind == JV_BOOL ? b.as.b : b.as.i;
        return x < y ? -1 : x > y;
    }
    if (a.kind == JV_FLOAT && b.kind == JV_FLOAT) {
        if (isnan(a.as.f) || isnan(b.as.f)) return 2;
        return a.as.f < b.as.f ? -1 : a.as.f > b.as.f;
    }
    if (a.kind == JV_FLOAT) {
        int r = cmp_int_double(b.kind == JV_BOOL ? b.as.b : b.as.i, a.as.f);
        return r == 2 ? 2 : -r;
    }
    return cmp_int_double(a.kind == JV_BOOL ? a.as.b : a.as.i, b.as.f);
}

static bool list_tag_sequence(JvListTag t) { return t == JV_LIST_LIST || t == JV_LIST_TUPLE || t == JV_LIST_RANGE; }

bool jv_eq(Jv a, Jv b) {
    if (jv_is_number(a) && jv_is_number(b)) return cmp_numbers(a, b) == 0;
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.as.s->len == b.as.s->len && memcmp(a.as.s->data, b.as.s->data, a.as.s->len) == 0;
    case JV_LIST: {
        const JvList *x = a.as.l, *y = b.as.l;
        if (x == y) return true;
        if (x->tag != y->tag || !list_tag_sequence(x->tag)) return false;
        if (x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++)
            if (!jv_eq(x->items[i], y->items[i])) return false;
        return true;
    }
    case JV_DICT: {
        const JvDict *x = a.as.d, *y = b.as.d;
        if (x == y) return true;
        if (x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++) {
            const Jv *v = jv_dict_get(y, x->ents[i].key);
            if (v == NULL || !jv_eq(x->ents[i].val, *v)) return false;
        }
        return true;
    }
    default: return a.as.h == b.as.h;
    }
}

int jv_cmp(JvCtx *c, Jv a, Jv b, const char *op, int *out) {
    *out = 0;
    if (a.kind == JV_UNDEF) return jv_fail(c, MN_EINVAL, "%s", jv_undef_text(a));
    if (b.kind == JV_UNDEF) return jv_fail(c, MN_EINVAL, "%s", jv_undef_text(b));
    if (jv_is_number(a) && jv_is_number(b)) {
        int r = cmp_numbers(a, b);
        *out = r == 2 ? 2 : r;
        return MN_OK;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        size_t n = a.as.s->len < b.as.s->len ? a.as.s->len : b.as.s->len;
        int r = memcmp(a.as.s->data, b.as.s->data, n);
        *out = r < 0 ? -1 : r > 0 ? 1 : a.as.s->len < b.as.s->len ? -1 : a.as.s->len > b.as.s->len;
        return MN_OK;
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && a.as.l->tag == b.as.l->tag && list_tag_sequence(a.as.l->tag) &&
        a.as.l->tag != JV_LIST_RANGE) {
        const JvList *x = a.as.l, *y = b.as.l;
        for (size_t i = 0; i < x->n && i < y->n; i++) {
            if (jv_eq(x->items[i], y->items[i])) continue;
            return jv_cmp(c, x->items[i], y->items[i], op, out);
        }
        *out = x->n < y->n ? -1 : x->n > y->n;
        return MN_OK;
    }
    return jv_fail(c, MN_EINVAL, "'%s' not supported between instances of '%s' and '%s'", op, jv_type_name(a),
                   jv_type_name(b));
}

/* ---- length, iteration, membership ------------------------------------------------------------- */

int jv_len(JvCtx *c, Jv v, size_t *out) {
    *out = 0;
    switch (v.kind) {
    case JV_UNDEF: return MN_OK;
    case JV_STR: *out = v.as.s->n_chars; return MN_OK;
    case JV_LIST:
        if (v.as.l->tag == JV_LIST_GEN) break;
        *out = v.as.l->n;
        return MN_OK;
    case JV_DICT: *out = v.as.d->n; return MN_OK;
    default: break;
    }
    return jv_fail(c, MN_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
}

static int iterate_impl(JvCtx *c, Jv v, Jv *out);
int jv_iterate(JvCtx *c, Jv v, Jv *out) {
    *out = jv_undef();
    return jv_clean_out(iterate_impl(c, v, out), out);
}

static int iterate_impl(JvCtx *c, Jv v, Jv *out) {
    int rc;
    switch (v.kind) {
    case JV_UNDEF: return jv_list_new(c, JV_LIST_LIST, 0, out);
    case JV_LIST: {
        JvList *l = v.as.l;
        if (l->tag != JV_LIST_GEN) {
            *out = jv_retain(v);
            return MN_OK;
        }
        if ((rc = jv_list_new(c, JV_LIST_LIST, l->n - l->cursor, out))) return rc;
        for (;;) {
            Jv item;
            bool got;
            if ((rc = jv_gen_next(c, v, &item, &got)) || !got) return rc;
            if ((rc = jv_list_push(c, *out, item))) return rc;
        }
    }
    case JV_DICT: {
        const JvDict *d = v.as.d;
        if ((rc = jv_list_new(c, JV_LIST_LIST, d->n, out))) return rc;
        for (size_t i = 0; i < d->n; i++)
            if ((rc = jv_list_push(c, *out, jv_retain(d->ents[i].key)))) return rc;
        return MN_OK;
    }
    case JV_STR: {
        const JvStr *s = v.as.s;
        if ((rc = jv_charge(c, s->len / 8))) return rc;
        if ((rc = jv_list_new(c, JV_LIST_LIST, s->n_chars, out))) return rc;
        for (size_t i = 0; i < s->len;) {
            size_t k = utf8_lead_len((unsigned char)s->data[i]);
            if (k > s->len - i) k = s->len - i;
            Jv ch;
            if ((rc = jv_str_new(c, s->data + i, k, false, &ch))) return rc;
            if ((rc = jv_list_push(c, *out, ch))) return rc;
            i += k;
        }
        return MN_OK;
    }
    default: break;
    }
    return jv_fail(c, MN_EINVAL, "'%s' object is not iterable", jv_type_name(v));
}

int jv_contains(JvCtx *c, Jv container, Jv x, bool *out) {
    *out = false;
    switch (container.kind) {
    case JV_UNDEF: return MN_OK;
    case JV_STR:
        if (x.kind != JV_STR)
            return jv_fail(c, MN_EINVAL, "'in <string>' requires string as left operand, not %s", jv_type_name(x));
        *out = x.as.s->len == 0 || memmem(container.as.s->data, container.as.s->len, x.as.s->data, x.as.s->len) != NULL;
        return jv_charge(c, container.as.s->len / 16);
    case JV_LIST: {
        JvList *l = container.as.l;
        if (l->tag == JV_LIST_GEN) { /* consumed up to the match, as Python does */
            for (;;) {
                Jv item;
                bool got;
                int rc = jv_gen_next(c, container, &item, &got);
                if (rc || !got) return rc;
                *out = jv_eq(item, x);
                jv_release(item);
                if (*out) return MN_OK;
            }
        }
        for (size_t i = 0; i < l->n; i++) {
            if (jv_eq(l->items[i], x)) {
                *out = true;
                return jv_charge(c, i / 8);
            }
        }
        return jv_charge(c, l->n / 8);
    }
    case JV_DICT:
        if (!key_hashable(x)) return jv_fail(c, MN_EINVAL, "unhashable type: '%s'", jv_type_name(x));
        *out = jv_dict_get(container.as.d, x) != NULL;
        return MN_OK;
    default: break;
    }
    return jv_fail(c, MN_EINVAL, "argument of type '%s' is not iterable", jv_type_name(container));
}

/* ---- JSON --------------------------------------------------------------------------------------------- */

static int json_str(JvBuf *out, const char *s, size_t n, bool ensure_ascii) {
    int rc = jv_buf_put(out, "\"", 1);
    size_t i = 0;
    while (rc == MN_OK && i < n) {
        size_t run = i;
        while (run < n && (unsigned char)s[run] >= 0x20 && s[run] != '"' && s[run] != '\\' &&
               (!ensure_ascii || (unsigned char)s[run] < 0x80))
            run++;
        if (run > i) {
            rc = jv_buf_put(out, s + i, run - i);
            i = run;
            continue;
        }
        unsigned char ch = (unsigned char)s[i];
        char esc[16];
        if (ch == '"') strcpy(esc, "\\\"");
        else if (ch == '\\') strcpy(esc, "\\\\");
        else if (ch == '\n') strcpy(esc, "\\n");
        else if (ch == '\r') strcpy(esc, "\\r");
        else if (ch == '\t') strcpy(esc, "\\t");
        else if (ch == '\b') strcpy(esc, "\\b");
        else if (ch == '\f') strcpy(esc, "\\f");
        else if (ch < 0x20) snprintf(esc, sizeof esc, "\\u%04x", ch);
        else {
            uint32_t cp;
            int k = utf8_decode_strict((const unsigned char *)s + i, n - i, &cp);
            if (k <= 0) {
                cp = 0xFFFD;
                k = 1;
            }
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            rc = jv_buf_puts(out, esc);
            i += (size_t)k;
            continue;
        }
        rc = jv_buf_puts(out, esc);
        i++;
    }
    return rc ? rc : jv_buf_put(out, "\"", 1);
}

static int json_newline(JvBuf *out, const JvJsonOpts *o, int level) {
    int rc = jv_buf_put(out, "\n", 1);
    for (int i = 0; rc == MN_OK && i < level; i++) rc = jv_buf_put(out, o->indent, o->indent_len);
    return rc;
}

static int json_value(JvCtx *c, Jv v, const JvJsonOpts *o, int level, JvBuf *out);

/* A dict key as json.dumps converts it. */
static int json_key(JvCtx *c, Jv k, const JvJsonOpts *o, JvBuf *out) {
    char num[32];
    switch (k.kind) {
    case JV_STR: return json_str(out, k.as.s->data, k.as.s->len, o->ensure_ascii);
    case JV_BOOL: return json_str(out, k.as.b ? "true" : "false", k.as.b ? 4 : 5, false);
    case JV_NONE: return json_str(out, "null", 4, false);
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)k.as.i); break;
    case JV_FLOAT:
        if (isnan(k.as.f)) strcpy(num, "NaN");
        else if (isinf(k.as.f)) strcpy(num, k.as.f < 0 ? "-Infinity" : "Infinity");
        else jv_float_repr(k.as.f, num);
        break;
    default:
        return jv_fail(c, MN_EINVAL, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
    return json_str(out, num, strlen(num), false);
}

/* Stable insertion sort of entry numbers by key (sort_keys; dicts are small). */
static int json_sorted_order(JvCtx *c, const JvDict *d, size_t *order) {
    for (size_t i = 0; i < d->n; i++) order[i] = i;
    int rc = jv_charge(c, d->n * d->n / 4);
    for (size_t i = 1; rc == MN_OK && i < d->n; i++) {
        size_t cur = order[i], j = i;
        while (j > 0) {
            int r;
            if ((rc = jv_cmp(c, d->ents[cur].key, d->ents[order[j - 1]].key, "<", &r))) return rc;
            if (r >= 0) break;
            order[j] = order[j - 1];
            j--;
        }
        order[j] = cur;
    }
    return rc;
}

static int json_dict(JvCtx *c, const JvDict *d, const JvJsonOpts *o, int level, JvBuf *out) {
    if (d->n == 0) return jv_buf_put(out, "{}", 2);
    const char *item_sep = o->item_sep ? o->item_sep : o->has_indent ? "," : ", ";
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    size_t *order = NULL;
    int rc = MN_OK;
    if (o->sort_keys) {
        order = jv_mem_alloc(c, d->n * sizeof(size_t));
        if (order == NULL) return c->err_code;
        rc = json_sorted_order(c, d, order);
    }
    if (rc == MN_OK) rc = jv_buf_put(out, "{", 1);
    for (size_t j = 0; rc == MN_OK && j < d->n; j++) {
        size_t i = order ? order[j] : j;
        if (j > 0) rc = jv_buf_puts(out, item_sep);
        if (rc == MN_OK && o->has_indent) rc = json_newline(out, o, level + 1);
        if (rc == MN_OK) rc = json_key(c, d->ents[i].key, o, out);
        if (rc == MN_OK) rc = jv_buf_puts(out, key_sep);
        if (rc == MN_OK) rc = json_value(c, d->ents[i].val, o, level + 1, out);
    }
    if (rc == MN_OK && o->has_indent) rc = json_newline(out, o, level);
    if (rc == MN_OK) rc = jv_buf_put(out, "}", 1);
    jv_mem_free(c, order, order ? d->n * sizeof(size_t) : 0);
    return rc;
}

static int json_list(JvCtx *c, const JvList *l, const JvJsonOpts *o, int level, JvBuf *out) {
    if (l->n == 0) return jv_buf_put(out, "[]", 2);
    const char *item_sep = o->item_sep ? o->item_sep : o->has_indent ? "," : ", ";
    int rc = jv_buf_put(out, "[", 1);
    for (size_t i = 0; rc == MN_OK && i < l->n; i++) {
        if (i > 0) rc = jv_buf_puts(out, item_sep);
        if (rc == MN_OK && o->has_indent) rc = json_newline(out, o, level + 1);
        if (rc == MN_OK) rc = json_value(c, l->items[i], o, level + 1, out);
    }
    if (rc == MN_OK && o->has_indent) rc = json_newline(out, o, level);
    return rc ? rc : jv_buf_put(out, "]", 1);
}

static int json_value(JvCtx *c, Jv v, const JvJsonOpts *o, int level, JvBuf *out) {
    char num[32];
    switch (v.kind) {
    case JV_NONE: return jv_buf_puts(out, "null");
    case JV_BOOL: return jv_buf_puts(out, v.as.b ? "true" : "false");
    case JV_INT: return jv_buf_printf(out, "%lld", (long long)v.as.i);
    case JV_FLOAT:
        if (isnan(v.as.f)) return jv_buf_puts(out, "NaN");
        if (isinf(v.as.f)) return jv_buf_puts(out, v.as.f < 0 ? "-Infinity" : "Infinity");
        jv_float_repr(v.as.f, num);
        return jv_buf_puts(out, num);
    case JV_STR: return json_str(out, v.as.s->data, v.as.s->len, o->ensure_ascii);
    case JV_LIST:
        if (v.as.l->tag == JV_LIST_LIST || v.as.l->tag == JV_LIST_TUPLE) return json_list(c, v.as.l, o, level, out);
        break;
    case JV_DICT: return json_dict(c, v.as.d, o, level, out);
    default: break;
    }
    return jv_fail(c, MN_EINVAL, "Object of type %s is not JSON serializable", jv_type_name(v));
}

int jv_to_json(JvCtx *c, Jv v, const JvJsonOpts *o, JvBuf *out) { return json_value(c, v, o, 0, out); }
