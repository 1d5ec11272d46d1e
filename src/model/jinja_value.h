/* jinja_value.h — the values a Jinja template computes with, with Python's
 * semantics.
 *
 * Chat templates are Python programs in Jinja syntax: they compare, print
 * and serialize Python objects. A Jv is mnemo's model of those objects:
 * undefined (jinja2's Undefined), None, bool, int (64-bit; overflow is an
 * error, where Python would grow), float, str (UTF-8, with Markup's "safe"
 * flag), list (also tuple, generator, dict view and range), dict (insertion
 * ordered), namespace, and opaque objects (macros, loop contexts, bound
 * methods, ...) whose behaviour a JvObjType supplies.
 *
 * Ownership: a Jv holding a heap object owns one reference. Functions
 * returning a Jv through an out-parameter hand over a new reference; Jv
 * arguments are borrowed unless the comment says "steals". jv_release drops
 * a reference. Static objects (template constants, refs < 0) are never
 * counted or freed, so one parsed template can be rendered by several
 * threads at once.
 *
 * Every render has one JvCtx: the allocator that counts bytes against the
 * memory limit, the work budget ("fuel"), and the first error. A JvCtx and
 * the values made with it belong to one thread.
 *
 * Bounds: containers record their nesting depth and refuse to nest deeper
 * than JV_MAX_DEPTH, so every recursive walk over a value (printing,
 * comparing, freeing) is bounded. Namespaces are the one mutable container
 * and may form cycles; they are owned by the JvCtx's registry and freed by
 * jv_ctx_deinit, and printing one is bounded by a depth counter.
 */
#ifndef MN_JINJA_VALUE_H
#define MN_JINJA_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define JV_MAX_DEPTH 256 /* nesting of lists/dicts; also printing through namespaces */

typedef enum JvKind {
    JV_UNDEF, /* jinja2's Undefined; may carry the message an error would give */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* JvList: list, tuple, generator, dict view or range (JvListTag) */
    JV_DICT,
    JV_NS,  /* namespace(): a JvDict of attributes, mutable */
    JV_OBJ, /* anything else: a JvObj with its type's behaviour */
} JvKind;

typedef struct JvHead {
    int32_t refs;      /* < 0: static, never counted */
    uint8_t kind;      /* the JvKind of values pointing here */
    size_t bytes;      /* charged to the ctx; 0 for static objects */
    struct JvCtx *ctx;
    struct JvHead *next_free; /* the ctx's list of objects being freed */
} JvHead;

typedef struct JvStr {
    JvHead h;
    size_t len;      /* bytes, excluding the NUL */
    size_t n_chars;  /* code points */
    bool is_safe;    /* markupsafe.Markup */
    char data[];     /* UTF-8, NUL-terminated */
} JvStr;

typedef struct JvUndef {
    JvHead h;
    bool is_unsafe; /* the sandbox's refusal of a mutating method (SecurityError) */
    char msg[];     /* the UndefinedError message, e.g. "'x' is undefined" */
} JvUndef;

typedef struct Jv {
    JvKind kind;
    union {
        bool b;
        int64_t i;
        double f;
        JvStr *s;
        struct JvList *l;
        struct JvDict *d;
        struct JvObj *o;
        JvUndef *u; /* may be NULL */
        JvHead *h;
    } as;
} Jv;

typedef enum JvListTag {
    JV_LIST_LIST,
    JV_LIST_TUPLE,
    JV_LIST_GEN,        /* a generator: items buffered before cursor, then its JvGen's */
    JV_LIST_ITEMS,      /* dict.items() */
    JV_LIST_KEYS,       /* dict.keys() */
    JV_LIST_VALUES,     /* dict.values() */
    JV_LIST_RANGE,      /* range(start, stop, step), materialized */
} JvListTag;

typedef struct JvList {
    JvHead h;
    JvListTag tag;
    uint32_t depth;  /* 1 + deepest child container */
    size_t n, cap;
    size_t cursor;   /* JV_LIST_GEN: items before it were consumed */
    int64_t range[3]; /* JV_LIST_RANGE: start, stop, step (for repr) */
    Jv *items;
    struct JvGen *gen; /* JV_LIST_GEN: the producer of the items after the buffered ones, or NULL */
} JvList;

typedef struct JvEntry {
    Jv key, val;
} JvEntry;

typedef struct JvDict {
    JvHead h;
    uint32_t depth;
    size_t n, cap;
    JvEntry *ents;         /* insertion order */
    uint32_t *index;       /* open addressing over entry numbers + 1, or NULL */
    size_t index_cap;      /* power of two, or 0 */
    struct JvDict *ns_prev, *ns_next; /* JV_NS: the ctx's registry */
} JvDict;

/* ---- opaque objects ---------------------------------------------------- */

typedef struct JvObj JvObj;
typedef struct JvCtx JvCtx;
typedef struct JvBuf JvBuf;

/* Arguments of a call: positional values, then keyword names and values
 * (all borrowed for the call). */
typedef struct JvArgs {
    const Jv *pos;
    size_t n_pos;
    const char *const *kw_names;
    const Jv *kw_vals;
    size_t n_kw;
} JvArgs;

typedef struct JvObjType {
    const char *name;   /* Python's type name, in error messages */
    bool is_callable;
    /* str() of the object into *out (jv_str_*), or NULL: the type cannot be
     * printed (an error naming it). */
    int (*str_fn)(JvCtx *c, JvObj *o, JvBuf *out);
    /* Attribute lookup: MN_OK with *out (undefined when absent). NULL: none. */
    int (*getattr_fn)(JvCtx *c, JvObj *o, const char *name, size_t len, Jv *out);
    int (*call_fn)(JvCtx *c, JvObj *o, const JvArgs *args, Jv *out);
    /* Release what the object holds (jv_release), not the object itself. */
    void (*free_fn)(JvObj *o);
} JvObjType;

struct JvObj {
    JvHead h;
    const JvObjType *type;
};

/* ---- generators ----------------------------------------------------------------
 *
 * Python's generators are lazy: jinja2's select, map, unique, batch and
 * reversed() yield items only when the consumer asks, so a test or filter
 * that would fail on a later item fails only if that item is reached, and
 * a generator nobody consumes does nothing. A JV_LIST_GEN list may carry a
 * JvGen that produces its items one at a time (jv_gen_next); once it ends
 * or fails it is gone, and the generator is exhausted, as in Python. A
 * generator pulling from another counts its depth, bounded by
 * JV_MAX_DEPTH, so pulling through a chain cannot exhaust the stack. */

typedef struct JvGen JvGen;

typedef struct JvGenType {
    /* The next item (a new reference) with *got true, or *got false at the
     * end; an error also ends the generator. */
    int (*next_fn)(JvCtx *c, JvGen *g, Jv *item, bool *got);
    void (*free_fn)(JvGen *g); /* release what it holds (not g) */
} JvGenType;

struct JvGen {
    const JvGenType *type;
    JvCtx *ctx;
    size_t bytes;
    uint32_t depth; /* 1 + the depth of the generator it pulls from */
    /* the type's state follows */
};

/* A new generator list whose items come from a JvGen of size bytes
 * (zeroed, type set; the list owns it), pulling from source (its depth
 * counts). *g points at it for the caller to fill. */
int jv_gen_new(JvCtx *c, const JvGenType *t, size_t size, Jv source, Jv *out, JvGen **g);
/* The next item of generator list gen: MN_OK with *got and *item. */
int jv_gen_next(JvCtx *c, Jv gen, Jv *item, bool *got);

/* Python's iter(v), one item at a time: a list is read where it stands
 * (its length now), a generator is pulled, a dict or str walks a snapshot
 * (they do not change), undefined is empty. Like a Python generator's
 * "for item in value", a value that is not iterable fails at the first
 * next, not before. */
typedef struct JvIter {
    Jv src;    /* retained */
    Jv list;   /* the snapshot walked, when src is a dict or str */
    size_t pos;
    bool is_started;
} JvIter;

void jv_iter_init(JvIter *it, Jv v);
int jv_iter_next(JvCtx *c, JvIter *it, Jv *item, bool *got);
void jv_iter_deinit(JvIter *it);

/* ---- the per-render context ---------------------------------------------- */

typedef struct JvCtx {
    size_t mem_used, mem_limit;   /* bytes charged by live objects and buffers */
    uint64_t fuel;                /* work units left (jv_charge) */
    int err_code;                 /* first error, or MN_OK */
    char err_msg[480];
    JvDict *namespaces;           /* registry of live namespaces (cycles) */
    JvHead *pending_free;         /* objects whose count reached 0, being freed */
    bool is_freeing;              /* jv_release is draining pending_free */
    int repr_depth;               /* printing through namespaces */
    /* date strftime_now formats (broken-down local time) */
    int year, month, day, hour, minute, second;
} JvCtx;

void jv_ctx_init(JvCtx *c, size_t mem_limit, uint64_t fuel);
/* Free the namespaces still registered (and whatever they hold). */
void jv_ctx_deinit(JvCtx *c);

/* Record the first error (later ones are ignored) and return code. */
int jv_fail(JvCtx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Spend work units; MN_ERANGE when the budget is gone. */
int jv_charge(JvCtx *c, uint64_t units);

/* Counted allocation (NULL when the limit or malloc refuses: the error is
 * recorded). jv_mem_free takes back the bytes. */
void *jv_mem_alloc(JvCtx *c, size_t n);
void *jv_mem_realloc(JvCtx *c, void *p, size_t old_n, size_t new_n);
void jv_mem_free(JvCtx *c, void *p, size_t n);

/* ---- making values ----------------------------------------------------------- */

static inline Jv jv_undef(void) { Jv v = {.kind = JV_UNDEF}; v.as.u = NULL; return v; }
static inline Jv jv_none(void) { Jv v = {.kind = JV_NONE}; v.as.i = 0; return v; }
static inline Jv jv_bool(bool b) { Jv v = {.kind = JV_BOOL}; v.as.b = b; return v; }
static inline Jv jv_int(int64_t i) { Jv v = {.kind = JV_INT}; v.as.i = i; return v; }
static inline Jv jv_float(double f) { Jv v = {.kind = JV_FLOAT}; v.as.f = f; return v; }

/* Undefined carrying an error message (printf). On allocation failure a
 * plain undefined (the message is only for errors). */
Jv jv_undef_msg(JvCtx *c, bool is_unsafe, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The message an operation on v gives ("'x' is undefined" by default). */
const char *jv_undef_text(Jv v);

/* A new string of data[0..len) (valid UTF-8, not checked). */
int jv_str_new(JvCtx *c, const char *data, size_t len, bool is_safe, Jv *out);
static inline int jv_str_cstr(JvCtx *c, const char *s, Jv *out);
/* A static string for the life of the program or its template (refs -1). */
JvStr *jv_str_static_new(const char *data, size_t len);
void jv_str_static_free(JvStr *s);

int jv_list_new(JvCtx *c, JvListTag tag, size_t cap, Jv *out);
/* Append, stealing v. The list must be new (refs 1). MN_ERANGE when v would
 * nest too deeply (v is released). */
int jv_list_push(JvCtx *c, Jv list, Jv v);

int jv_dict_new(JvCtx *c, Jv *out);
/* Set key (borrowed; str, int, float, bool or None) to val (stolen). The
 * dict must be new, or a namespace's. A TypeError for unhashable keys. */
int jv_dict_set(JvCtx *c, Jv dict, Jv key, Jv val);
/* Borrowed value of key, or NULL. */
const Jv *jv_dict_get(const JvDict *d, Jv key);
const Jv *jv_dict_get_str(const JvDict *d, const char *key, size_t len);

/* A namespace (registered in c). */
int jv_ns_new(JvCtx *c, Jv *out);

/* A new object of type t with extra bytes after the JvObj header. */
int jv_obj_new(JvCtx *c, const JvObjType *t, size_t size, Jv *out);

static inline Jv jv_retain(Jv v) {
    if (v.kind >= JV_STR || (v.kind == JV_UNDEF && v.as.u != NULL))
        if (v.as.h->refs >= 0) v.as.h->refs++;
    return v;
}
void jv_release(Jv v);

/* ---- string buffers -------------------------------------------------------------- */

struct JvBuf {
    JvCtx *ctx;
    char *data;
    size_t len, cap;
    size_t max_len; /* SIZE_MAX, or the output limit */
};

void jv_buf_init(JvBuf *b, JvCtx *c);
void jv_buf_deinit(JvBuf *b);
int jv_buf_put(JvBuf *b, const char *s, size_t n);
static inline int jv_buf_puts(JvBuf *b, const char *s);
int jv_buf_printf(JvBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A string of the contents; the buffer is emptied. */
int jv_buf_take(JvBuf *b, bool is_safe, Jv *out);
/* The end of building a string: when rc is an error the buffer is dropped
 * and rc returned (*out undefined), else jv_buf_take. */
int jv_buf_finish(JvBuf *b, int rc, bool is_safe, Jv *out);

/* ---- Python semantics ------------------------------------------------------------- */

/* Python's type name ("str", "int", "NoneType", "Undefined", ...). */
const char *jv_type_name(Jv v);
bool jv_truthy(Jv v);
/* str(v) appended to out (undefined: nothing). */
int jv_str_of(JvCtx *c, Jv v, JvBuf *out);
/* repr(v) appended to out. */
int jv_repr(JvCtx *c, Jv v, JvBuf *out);
/* str(v) as a value (v itself when it is a str). */
int jv_to_str(JvCtx *c, Jv v, Jv *out);

/* Python's ==. */
bool jv_eq(Jv a, Jv b);
/* Python's <, as -1/0/1 in *out; a TypeError for unorderable types
 * (op names the operator in the message). */
int jv_cmp(JvCtx *c, Jv a, Jv b, const char *op, int *out);
/* len(v); a TypeError when v has no length. */
int jv_len(JvCtx *c, Jv v, size_t *out);
/* The items iteration yields, as a new list (a dict's keys, a str's
 * characters, a generator's remaining items — consuming it, nothing for
 * undefined); a TypeError when v is not iterable. */
int jv_iterate(JvCtx *c, Jv v, Jv *out);
/* x in container (str: substring; dict: key; others: ==). */
int jv_contains(JvCtx *c, Jv container, Jv x, bool *out);
bool jv_is_number(Jv v); /* int, float or bool */
double jv_as_double(Jv v);

/* Characters of a str (cached for non-ASCII). */
size_t jv_str_chars(const JvStr *s);
/* Byte offset of character index i (0..chars) in s. */
size_t jv_str_offset(const JvStr *s, size_t i);

/* markupsafe.escape of s appended to out. */
int jv_escape_into(JvBuf *out, const char *s, size_t n);

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys). indent is
 * NULL for none, else the string each level adds. */
typedef struct JvJsonOpts {
    const char *indent;
    size_t indent_len;
    bool has_indent;
    const char *item_sep, *key_sep; /* NULL: Python's defaults */
    bool sort_keys;
    bool ensure_ascii;
} JvJsonOpts;
int jv_to_json(JvCtx *c, Jv v, const JvJsonOpts *o, JvBuf *out);

/* Python's repr of a float ("1.0", "1e+16", "inf"). */
void jv_float_repr(double f, char buf[32]);

/* ---- inline helpers ------------------------------------------------------------------ */

/* The rule of every function with a Jv out-parameter: on failure *out
 * holds nothing. jv_clean_out(rc, out) releases a partial result and
 * returns rc, for functions that build into *out step by step. */
static inline int jv_clean_out(int rc, Jv *out) {
    if (rc != 0) {
        jv_release(*out);
        out->kind = JV_UNDEF;
        out->as.u = NULL;
    }
    return rc;
}

static inline int jv_str_cstr(JvCtx *c, const char *s, Jv *out) {
    size_t n = 0;
    while (s[n]) n++;
    return jv_str_new(c, s, n, false, out);
}

static inline int jv_buf_puts(JvBuf *b, const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return jv_buf_put(b, s, n);
}

#endif
