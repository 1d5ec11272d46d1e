/* jinja.c — the Jinja evaluator: walks a template's tree (jinja_parse.h)
 * over values (jinja_value.h) with builtins (jinja_builtins.h).
 *
 * Scopes follow jinja2's frames: the template's top level (which also
 * holds the render's variables), a fresh scope for every iteration of a
 * for loop and for its else, and one per macro call, caller() call, set
 * block, filter block, with block and generation block; "if" opens none.
 * `set` writes the innermost scope; a name is looked up from the innermost
 * scope outwards, then among the globals. A macro (or a call block's
 * caller) remembers the scope it was defined in and runs in a child of it,
 * so it sees that scope's variables as they are when it is called, as
 * jinja2's closures do; such a scope is "pinned" — kept until the render
 * ends — since the macro may outlive the block that made it.
 *
 * Control: statements return MN_OK, an error code, or SIG_BREAK /
 * SIG_CONTINUE, which the innermost for loop consumes (the parser refuses
 * them outside loops). The first error records the line and column of the
 * innermost node it passed through.
 *
 * Bounds, checked as the walk goes: depth (every node evaluated or
 * executed counts while it runs), macro calls in progress, loop iterations
 * in all, work (fuel, charged per node and by the builtins per byte),
 * memory (every value and buffer) and the output's length. One Render is
 * used by one thread.
 */
#include "model/jinja.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/mem.h"
#include "model/jinja_builtins.h"
#include "model/jinja_parse.h"
#include "model/jinja_value.h"

#define SIG_BREAK (-1)
#define SIG_CONTINUE (-2)

struct JinjaTemplate {
    JnTemplate *tree;
};

void jinja_limits_default(JinjaLimits *l) {
    l->max_source_bytes = 1u << 20;
    l->max_output_bytes = 16u << 20;
    l->max_memory_bytes = 256u << 20;
    l->max_steps = 100000000;
    l->max_loop_iterations = 10000000;
    l->max_depth = 400;
    l->max_call_depth = 64;
}

int jinja_parse(const char *src, size_t len, const JinjaLimits *lim, JinjaTemplate **out, MnErr *err) {
    JinjaLimits def;
    if (lim == NULL) {
        jinja_limits_default(&def);
        lim = &def;
    }
    *out = NULL;
    JinjaTemplate *t = mn_malloc(sizeof *t);
    if (t == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    int rc = jn_parse(src, len, lim->max_source_bytes, &t->tree, err);
    if (rc) {
        mn_free(t);
        return rc;
    }
    *out = t;
    return MN_OK;
}

void jinja_free(JinjaTemplate *t) {
    if (t == NULL) return;
    jn_template_free(t->tree);
    mn_free(t);
}

int jinja_date_parse(const char *s, JinjaDate *out, MnErr *err) {
    int y, m, d, n = 0;
    if (s == NULL || sscanf(s, "%4d-%2d-%2d%n", &y, &m, &d, &n) != 3 || n != 10 || s[10] != '\0')
        return mn_err_set(err, MN_EINVAL, "'%s' is not a date of the form YYYY-MM-DD", s ? s : "");
    static const int days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (y < 1 || m < 1 || m > 12 || d < 1 || d > days[m - 1] || (m == 2 && d == 29 && !leap))
        return mn_err_set(err, MN_EINVAL, "'%s' is not a calendar date", s);
    *out = (JinjaDate){.year = y, .month = m, .day = d};
    return MN_OK;
}

void jinja_date_now(JinjaDate *out) {
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    *out = (JinjaDate){tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec};
}

/* ---- render state and scopes -------------------------------------------------------------- */

typedef struct Scope Scope;
struct Scope {
    Scope *parent;
    Scope *next_pinned; /* the render's list of pinned scopes */
    const char **names; /* borrowed: the tree's names, literals, the vars' keys */
    Jv *vals;
    size_t n, cap;
    bool is_pinned;
};

typedef struct Render {
    JvCtx c; /* first: builtins call back with the JvCtx */
    const JinjaLimits *lim;
    Scope *root;
    Scope *pinned;
    JvBuf *out;
    uint64_t iterations;
    int depth, call_depth;
    bool has_pos;
    uint32_t err_line, err_col;
} Render;

static Render *render_of(JvCtx *c) { return (Render *)((char *)c - offsetof(Render, c)); }

static Scope *scope_new(Render *r, Scope *parent) {
    Scope *s = jv_mem_alloc(&r->c, sizeof *s);
    if (s == NULL) return NULL;
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_clear(Render *r, Scope *s) {
    for (size_t i = 0; i < s->n; i++) jv_release(s->vals[i]);
    jv_mem_free(&r->c, s->names, s->cap * sizeof(char *));
    jv_mem_free(&r->c, s->vals, s->cap * sizeof(Jv));
    s->n = s->cap = 0;
    s->names = NULL;
    s->vals = NULL;
}

/* Free a scope whose block is done, unless a closure keeps it. */
static void scope_free(Render *r, Scope *s) {
    if (s == NULL || s->is_pinned) return;
    scope_clear(r, s);
    jv_mem_free(&r->c, s, sizeof *s);
}

/* Keep s and its ancestors until the render ends: a closure refers to them. */
static void scope_pin(Render *r, Scope *s) {
    for (; s != NULL && !s->is_pinned; s = s->parent) {
        s->is_pinned = true;
        s->next_pinned = r->pinned;
        r->pinned = s;
    }
}

static Jv *scope_find(Scope *s, const char *name) {
    for (; s != NULL; s = s->parent)
        for (size_t i = 0; i < s->n; i++)
            if (strcmp(s->names[i], name) == 0) return &s->vals[i];
    return NULL;
}

/* Set name in s (not its parents), stealing v. */
static int scope_set(Render *r, Scope *s, const char *name, Jv v) {
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->names[i], name) == 0) {
            jv_release(s->vals[i]);
            s->vals[i] = v;
            return MN_OK;
        }
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **names = jv_mem_realloc(&r->c, s->names, s->cap * sizeof(char *), cap * sizeof(char *));
        if (names == NULL) {
            jv_release(v);
            return r->c.err_code;
        }
        s->names = names;
        Jv *vals = jv_mem_realloc(&r->c, s->vals, s->cap * sizeof(Jv), cap * sizeof(Jv));
        if (vals == NULL) {
            /* names grew alone: shrink its accounting back by keeping cap */
            s->names = jv_mem_realloc(&r->c, names, cap * sizeof(char *), s->cap * sizeof(char *));
            jv_release(v);
            return r->c.err_code;
        }
        s->vals = vals;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
    return MN_OK;
}

/* ---- errors and bounds ---------------------------------------------------------------------- */

/* Note where an error passed (the innermost node wins) and return rc. */
static int at(Render *r, const JnNode *nd, int rc) {
    if (rc > 0 && !r->has_pos && nd != NULL) {
        r->has_pos = true;
        r->err_line = nd->line;
        r->err_col = nd->col;
    }
    return rc;
}

/* Record an error (printf arguments) at node nd. */
#define fail(r, nd, code, ...) at((r), (nd), jv_fail(&(r)->c, (code), __VA_ARGS__))

static int enter(Render *r, const JnNode *nd) {
    if (r->depth >= r->lim->max_depth)
        return fail(r, nd, MN_ERANGE, "the template nests deeper than %d (evaluation depth)", r->lim->max_depth);
    r->depth++;
    int rc = jv_charge(&r->c, 1);
    if (rc) r->depth--;
    return at(r, nd, rc);
}

static int emit(Render *r, const char *s, size_t n) { return jv_buf_put(r->out, s, n); }

/* ---- objects: macros and loops ------------------------------------------------------------------ */

typedef struct MacroObj {
    JvObj o;
    const JnNode *node; /* JN_MACRO, or JN_CALLBLOCK for a caller */
    Scope *closure;
} MacroObj;

static int macro_call(JvCtx *c, JvObj *o, const JvArgs *a, Jv *out);

static const char *macro_name(const MacroObj *m) { return m->node->kind == JN_MACRO ? m->node->name : "caller"; }

static int macro_str(JvCtx *c, JvObj *o, JvBuf *out) {
    return jv_buf_printf(out, "<Macro '%.60s'>", macro_name((MacroObj *)o));
}

static int macro_getattr(JvCtx *c, JvObj *o, const char *name, size_t len, Jv *out) {
    MacroObj *m = (MacroObj *)o;
    if (len == 4 && memcmp(name, "name", 4) == 0) return jv_str_cstr(c, macro_name(m), out);
    if (len == 9 && memcmp(name, "arguments", 9) == 0) {
        int rc = jv_list_new(c, JV_LIST_TUPLE, m->node->args.n_kw, out);
        for (size_t i = 0; rc == MN_OK && i < m->node->args.n_kw; i++) {
            Jv s;
            if ((rc = jv_str_cstr(c, m->node->args.kw_names[i], &s)) == MN_OK) rc = jv_list_push(c, *out, s);
        }
        return rc;
    }
    *out = jv_undef_msg(c, false, "'jinja2.runtime.Macro object' has no attribute '%.*s'", (int)(len < 80 ? len : 80), name);
    return MN_OK;
}

static const JvObjType MACRO_TYPE = {
    .name = "Macro",
    .is_callable = true,
    .str_fn = macro_str,
    .getattr_fn = macro_getattr,
    .call_fn = macro_call,
};

static int macro_new(Render *r, const JnNode *nd, Scope *closure, Jv *out) {
    int rc = jv_obj_new(&r->c, &MACRO_TYPE, sizeof(MacroObj), out);
    if (rc) return rc;
    MacroObj *m = (MacroObj *)out->as.o;
    m->node = nd;
    m->closure = closure;
    scope_pin(r, closure);
    return MN_OK;
}

/* A for loop's iterator and its `loop` variable: jinja2's LoopContext.
 *
 * Items are drawn from src one at a time, as Python's list iterator does:
 * a list the body changes (list.pop, list.clear) is read where it stands
 * (index pos against its length now), and a generator is pulled. The loop's "if" filter runs on each item as it is drawn. The
 * item after the current one is drawn early ("peeked") only when loop.last
 * or loop.nextitem asks for it, and loop.length is len(src) at the first
 * question, except for a filtered loop or a generator, whose remaining
 * items are then drawn all at once — all as in jinja2.
 */
typedef struct LoopObj {
    JvObj o;
    Jv src;             /* the list walked */
    size_t pos;         /* next index in src (unused for a generator: it is pulled) */
    bool is_gen;        /* src is a generator */
    bool is_filtered;   /* items still pass the loop's filter when drawn */
    const JnNode *node; /* the for statement */
    Scope *scope;       /* where it runs; NULL once it is done (a kept loop draws no more) */
    int depth0;         /* 0, and one more for each loop() of a recursive loop */
    size_t index0;      /* of the current item */
    Jv before, current, after; /* previous item, current item, the peeked one */
    bool has_before, has_after, is_done; /* is_done: nothing more to draw */
    int64_t length;     /* -1 until asked */
    Jv last_changed;    /* loop.changed(): the last arguments, as a tuple */
    bool has_changed;
} LoopObj;

typedef struct LoopMethod {
    JvObj o;
    Jv loop;
    bool is_changed; /* loop.changed, else loop.cycle */
} LoopMethod;

static int eval(Render *r, const JnNode *nd, Scope *s, Jv *out);
static int assign(Render *r, const JnNode *target, Scope *s, Jv v);

static void loop_free(JvObj *o) {
    LoopObj *l = (LoopObj *)o;
    jv_release(l->src);
    jv_release(l->before);
    jv_release(l->current);
    jv_release(l->after);
    jv_release(l->last_changed);
}

/* One more loop iteration (the loop filter's tests count too). */
static int count_iteration(Render *r, const JnNode *nd) {
    if (++r->iterations <= r->lim->max_loop_iterations) return MN_OK;
    return fail(r, nd, MN_ERANGE, "the template ran more than %llu loop iterations",
                (unsigned long long)r->lim->max_loop_iterations);
}

/* Does item pass the loop's filter? (the target bound in a scope of its own) */
static int loop_filter(Render *r, LoopObj *l, Jv item, bool *keep) {
    *keep = false;
    int rc = count_iteration(r, l->node);
    if (rc) return rc;
    Scope *ts = scope_new(r, l->scope);
    if (ts == NULL) return at(r, l->node, r->c.err_code);
    Jv v = jv_undef();
    rc = assign(r, l->node->kids[0], ts, jv_retain(item));
    if (rc == MN_OK) rc = eval(r, l->node->kids[2], ts, &v);
    *keep = rc == MN_OK && jv_truthy(v);
    jv_release(v);
    scope_free(r, ts);
    return rc;
}

/* Draw the next item from src (through the filter): *got false at the end. */
static int loop_draw(Render *r, LoopObj *l, Jv *item, bool *got) {
    *got = false;
    while (!l->is_done) {
        Jv it;
        if (l->is_gen) {
            bool more;
            int rc = jv_gen_next(&r->c, l->src, &it, &more);
            if (rc) return at(r, l->node, rc);
            if (!more) break;
        } else {
            JvList *src = l->src.as.l;
            if (l->pos >= src->n) break;
            it = jv_retain(src->items[l->pos++]);
        }
        bool keep = true;
        if (l->is_filtered) {
            if (l->scope == NULL) { /* the statement is over: its filter cannot run */
                jv_release(it);
                break;
            }
            int rc = loop_filter(r, l, it, &keep);
            if (rc) {
                jv_release(it);
                return rc;
            }
        }
        if (keep) {
            *item = it;
            *got = true;
            return MN_OK;
        }
        jv_release(it);
    }
    l->is_done = true;
    return MN_OK;
}

static int loop_peek(Render *r, LoopObj *l) {
    if (l->has_after || l->is_done) return MN_OK;
    int rc = loop_draw(r, l, &l->after, &l->has_after);
    if (!l->has_after) l->after = jv_undef();
    return rc;
}

/* The next item of the loop (the peeked one first). */
static int loop_next(Render *r, LoopObj *l, Jv *item, bool *got) {
    int rc = MN_OK;
    if (l->has_after) {
        *item = l->after;
        l->after = jv_undef();
        l->has_after = false;
        *got = true;
    } else {
        rc = loop_draw(r, l, item, got);
    }
    if (rc || !*got) return rc;
    if (l->index0 != SIZE_MAX) { /* not the first: the current item becomes the previous */
        jv_release(l->before);
        l->before = l->current;
        l->has_before = true;
    }
    l->current = jv_retain(*item);
    l->index0++;
    return MN_OK;
}

/* loop.length: len(src) when it can, else the rest drawn into a list. */
static int loop_length(Render *r, LoopObj *l, int64_t *out) {
    if (l->length < 0 && !l->is_filtered && !l->is_gen) l->length = (int64_t)l->src.as.l->n;
    if (l->length < 0) {
        Jv rest;
        int rc = jv_list_new(&r->c, JV_LIST_LIST, 0, &rest);
        for (bool got = true; rc == MN_OK && got;) {
            Jv it;
            if ((rc = loop_draw(r, l, &it, &got)) == MN_OK && got) rc = jv_list_push(&r->c, rest, it);
        }
        if (rc) {
            jv_release(rest);
            return rc;
        }
        l->length = (int64_t)rest.as.l->n + (int64_t)l->index0 + 1 + (l->has_after ? 1 : 0);
        jv_release(l->src);
        l->src = rest;
        l->pos = 0;
        l->is_gen = l->is_filtered = l->is_done = false;
    }
    *out = l->length;
    return MN_OK;
}

static int loop_str(JvCtx *c, JvObj *o, JvBuf *out) {
    LoopObj *l = (LoopObj *)o;
    int64_t n;
    int rc = loop_length(render_of(c), l, &n);
    return rc ? rc : jv_buf_printf(out, "<LoopContext %zu/%lld>", l->index0 + 1, (long long)n);
}

static void loop_method_free(JvObj *o) { jv_release(((LoopMethod *)o)->loop); }

static int loop_method_call(JvCtx *c, JvObj *o, const JvArgs *a, Jv *out) {
    LoopMethod *m = (LoopMethod *)o;
    LoopObj *l = (LoopObj *)m->loop.as.o;
    if (a->n_kw > 0) return jv_fail(c, MN_EINVAL, "%s() got an unexpected keyword argument '%s'", m->is_changed ? "changed" : "cycle", a->kw_names[0]);
    if (!m->is_changed) {
        if (a->n_pos == 0) return jv_fail(c, MN_EINVAL, "no items for cycling given");
        *out = jv_retain(a->pos[l->index0 % a->n_pos]);
        return MN_OK;
    }
    Jv now;
    int rc = jv_list_new(c, JV_LIST_TUPLE, a->n_pos, &now);
    for (size_t i = 0; rc == MN_OK && i < a->n_pos; i++) rc = jv_list_push(c, now, jv_retain(a->pos[i]));
    if (rc) {
        jv_release(now);
        return rc;
    }
    if (l->has_changed && jv_eq(l->last_changed, now)) {
        jv_release(now);
        *out = jv_bool(false);
        return MN_OK;
    }
    jv_release(l->last_changed);
    l->last_changed = now;
    l->has_changed = true;
    *out = jv_bool(true);
    return MN_OK;
}

static const JvObjType LOOP_METHOD_TYPE = {
    .name = "method",
    .is_callable = true,
    .call_fn = loop_method_call,
    .free_fn = loop_method_free,
};

static int loop_getattr(JvCtx *c, JvObj *o, const char *name, size_t len, Jv *out) {
    Render *r = render_of(c);
    LoopObj *l = (LoopObj *)o;
    int64_t n;
    int rc = MN_OK;
#define IS(s) (len == sizeof(s) - 1 && memcmp(name, s, len) == 0)
    if (IS("index")) *out = jv_int((int64_t)l->index0 + 1);
    else if (IS("index0")) *out = jv_int((int64_t)l->index0);
    else if (IS("revindex") || IS("revindex0") || IS("length")) {
        if ((rc = loop_length(r, l, &n)) == MN_OK)
            *out = jv_int(IS("length") ? n : n - (int64_t)l->index0 - (IS("revindex0") ? 1 : 0));
    } else if (IS("first")) *out = jv_bool(l->index0 == 0);
    else if (IS("last")) {
        if ((rc = loop_peek(r, l)) == MN_OK) *out = jv_bool(!l->has_after);
    } else if (IS("depth")) *out = jv_int(l->depth0 + 1);
    else if (IS("depth0")) *out = jv_int(l->depth0);
    else if (IS("previtem"))
        *out = l->has_before ? jv_retain(l->before) : jv_undef_msg(c, false, "there is no previous item");
    else if (IS("nextitem")) {
        if ((rc = loop_peek(r, l)) == MN_OK)
            *out = l->has_after ? jv_retain(l->after) : jv_undef_msg(c, false, "there is no next item");
    } else if (IS("cycle") || IS("changed")) {
        if ((rc = jv_obj_new(c, &LOOP_METHOD_TYPE, sizeof(LoopMethod), out))) return rc;
        LoopMethod *m = (LoopMethod *)out->as.o;
        Jv self = {.kind = JV_OBJ};
        self.as.o = o;
        m->loop = jv_retain(self);
        m->is_changed = IS("changed");
    } else
        *out = jv_undef_msg(c, false, "'jinja2.runtime.LoopContext object' has no attribute '%.*s'", (int)(len < 80 ? len : 80), name);
#undef IS
    return rc;
}

static int for_over(Render *r, const JnNode *nd, Scope *s, Jv iterable, int depth0);

/* loop(items) in a recursive loop: the loop's body over items, one level
 * deeper, as a str. */
static int loop_call(JvCtx *c, JvObj *o, const JvArgs *a, Jv *out) {
    Render *r = render_of(c);
    LoopObj *l = (LoopObj *)o;
    *out = jv_undef();
    if (!l->node->is_recursive)
        return jv_fail(c, MN_EINVAL, "The loop must have the 'recursive' marker to be called recursively.");
    if (a->n_pos != 1 || a->n_kw != 0) return jv_fail(c, MN_EINVAL, "loop() takes exactly one argument");
    if (r->call_depth >= r->lim->max_call_depth)
        return jv_fail(c, MN_ERANGE, "macro calls nest deeper than %d", r->lim->max_call_depth);
    JvBuf buf;
    jv_buf_init(&buf, c);
    JvBuf *saved = r->out;
    r->out = &buf;
    r->call_depth++;
    int rc = for_over(r, l->node, l->scope, a->pos[0], l->depth0 + 1);
    r->call_depth--;
    r->out = saved;
    return jv_buf_finish(&buf, rc, false, out);
}

static const JvObjType LOOP_TYPE = {
    .name = "LoopContext",
    .is_callable = true,
    .str_fn = loop_str,
    .getattr_fn = loop_getattr,
    .call_fn = loop_call,
    .free_fn = loop_free,
};

/* ---- expressions ------------------------------------------------------------------------------------ */

static int exec_block(Render *r, const JnBlock *b, Scope *s);

/* Keyword names of one call: a small array in place, or counted memory. */
#define KW_INLINE 8

/* Evaluated call arguments: values owned here, keyword names borrowed. */
typedef struct EvArgs {
    Jv *vals;
    size_t n_vals;
    const char *inline_names[KW_INLINE];
    const char **names;
    size_t names_cap;
    JvArgs args;
} EvArgs;

static void evargs_free(Render *r, EvArgs *e) {
    for (size_t i = 0; i < e->n_vals; i++) jv_release(e->vals[i]);
    jv_mem_free(&r->c, e->vals, (e->n_vals ? e->n_vals : 1) * sizeof(Jv));
    if (e->names != e->inline_names) jv_mem_free(&r->c, e->names, e->names_cap * sizeof(char *));
    e->vals = NULL;
    e->n_vals = 0;
}

/* Evaluate a's arguments (plus one extra keyword when extra_name is set);
 * evargs_free afterwards, whatever this returns. */
static int eval_args(Render *r, const JnArgs *a, Scope *s, const char *extra_name, Jv extra, EvArgs *e) {
    size_t n = a->n_pos + a->n_kw + (extra_name ? 1 : 0);
    e->n_vals = 0;
    e->names = e->inline_names;
    e->names_cap = a->n_kw + 1;
    e->vals = jv_mem_alloc(&r->c, (n ? n : 1) * sizeof(Jv));
    if (e->names_cap > KW_INLINE) e->names = jv_mem_alloc(&r->c, e->names_cap * sizeof(char *));
    if (e->vals == NULL || e->names == NULL) {
        if (e->names == NULL) e->names = e->inline_names;
        return r->c.err_code;
    }
    int rc = MN_OK;
    for (size_t i = 0; rc == MN_OK && i < a->n_pos; i++) {
        rc = eval(r, a->pos[i], s, &e->vals[e->n_vals]);
        if (rc == MN_OK) e->n_vals++;
    }
    for (size_t i = 0; rc == MN_OK && i < a->n_kw; i++) {
        rc = eval(r, a->kw_vals[i], s, &e->vals[e->n_vals]);
        if (rc == MN_OK) {
            e->names[i] = a->kw_names[i];
            e->n_vals++;
        }
    }
    if (rc == MN_OK && extra_name) {
        e->names[a->n_kw] = extra_name;
        e->vals[e->n_vals++] = jv_retain(extra);
    }
    e->args.pos = e->vals;
    e->args.n_pos = a->n_pos;
    e->args.kw_names = e->names;
    e->args.kw_vals = e->vals + a->n_pos;
    e->args.n_kw = a->n_kw + (extra_name ? 1 : 0);
    return rc;
}

static int eval_call(Render *r, const JnNode *nd, Scope *s, const char *extra_name, Jv extra, Jv *out) {
    Jv callee;
    int rc = eval(r, nd->kids[0], s, &callee);
    if (rc) return rc;
    EvArgs e;
    rc = eval_args(r, &nd->args, s, extra_name, extra, &e);
    if (rc == MN_OK) rc = jb_call(&r->c, callee, &e.args, out);
    evargs_free(r, &e);
    jv_release(callee);
    return at(r, nd, rc);
}

/* A filter (or a chain of them); the innermost operand is `inner` where
 * the chain has none (filter and set blocks). */
static int eval_filter(Render *r, const JnNode *nd, Scope *s, Jv inner, Jv *out) {
    *out = jv_undef();
    Jv operand;
    int rc;
    const JnNode *k = nd->kids[0];
    if (k == NULL) operand = jv_retain(inner), rc = MN_OK;
    else if (k->kind == JN_FILTER) rc = eval_filter(r, k, s, inner, &operand);
    else rc = eval(r, k, s, &operand);
    if (rc) return rc;
    if (nd->builtin == JB_UNKNOWN) rc = fail(r, nd, MN_EINVAL, "No filter named '%s' found.", nd->name);
    else if (nd->builtin == JB_UNSUPPORTED)
        rc = fail(r, nd, MN_EUNSUPPORTED, "the filter '%s' is not supported by mnemo's Jinja renderer", nd->name);
    if (rc == MN_OK) {
        EvArgs e;
        rc = eval_args(r, &nd->args, s, NULL, jv_undef(), &e);
        if (rc == MN_OK) rc = jb_filter_apply(&r->c, nd->builtin, operand, &e.args, out);
        evargs_free(r, &e);
    }
    jv_release(operand);
    return at(r, nd, rc);
}

static int eval_test(Render *r, const JnNode *nd, Scope *s, Jv *out) {
    Jv operand;
    int rc = eval(r, nd->kids[0], s, &operand);
    if (rc) return rc;
    bool result = false;
    if (nd->builtin == JB_UNKNOWN) {
        rc = fail(r, nd, MN_EINVAL, "No test named '%s' found.", nd->name);
    } else {
        EvArgs e;
        rc = eval_args(r, &nd->args, s, NULL, jv_undef(), &e);
        if (rc == MN_OK) rc = jb_test_apply(&r->c, nd->builtin, operand, &e.args, &result);
        evargs_free(r, &e);
    }
    jv_release(operand);
    *out = jv_bool(result != nd->is_negated);
    return at(r, nd, rc);
}

static int eval_name(Render *r, const JnNode *nd, Scope *s, Jv *out) {
    Jv *v = scope_find(s, nd->name);
    if (v != NULL) {
        *out = jv_retain(*v);
        return MN_OK;
    }
    int rc = jb_global(&r->c, nd->name, nd->name_len, out);
    if (rc == MN_ENOTFOUND) {
        *out = jv_undef_msg(&r->c, false, "'%.100s' is undefined", nd->name);
        return MN_OK;
    }
    return at(r, nd, rc);
}

static int compare_one(Render *r, const JnNode *nd, JnOp op, Jv a, Jv b, bool *out) {
    static const char *const text[] = {[JN_OP_LT] = "<", [JN_OP_LE] = "<=", [JN_OP_GT] = ">", [JN_OP_GE] = ">="};
    int rc = MN_OK, cmp;
    switch (op) {
    case JN_OP_EQ: *out = jv_eq(a, b); break;
    case JN_OP_NE: *out = !jv_eq(a, b); break;
    case JN_OP_IN: rc = jv_contains(&r->c, b, a, out); break;
    case JN_OP_NOTIN:
        rc = jv_contains(&r->c, b, a, out);
        *out = !*out;
        break;
    default:
        rc = jv_cmp(&r->c, a, b, text[op], &cmp);
        if (rc == MN_OK) {
            if (cmp == 2) *out = false;
            else if (op == JN_OP_LT) *out = cmp < 0;
            else if (op == JN_OP_LE) *out = cmp <= 0;
            else if (op == JN_OP_GT) *out = cmp > 0;
            else *out = cmp >= 0;
        }
        break;
    }
    return at(r, nd, rc);
}

static int eval_compare(Render *r, const JnNode *nd, Scope *s, Jv *out) {
    Jv left;
    int rc = eval(r, nd->kids[0], s, &left);
    if (rc) return rc;
    bool result = true;
    for (size_t i = 1; i < nd->n_kids && result; i++) {
        Jv right;
        if ((rc = eval(r, nd->kids[i], s, &right))) break;
        rc = compare_one(r, nd, nd->ops[i - 1], left, right, &result);
        jv_release(left);
        left = right;
        if (rc) break;
    }
    jv_release(left);
    *out = jv_bool(result);
    return rc;
}

static int eval_collection(Render *r, const JnNode *nd, Scope *s, Jv *out) {
    int rc;
    if (nd->kind == JN_DICT) {
        if ((rc = jv_dict_new(&r->c, out))) return at(r, nd, rc);
        for (size_t i = 0; i + 1 < nd->n_kids; i += 2) {
            Jv k, v;
            if ((rc = eval(r, nd->kids[i], s, &k))) return rc;
            if ((rc = eval(r, nd->kids[i + 1], s, &v))) {
                jv_release(k);
                return rc;
            }
            rc = jv_dict_set(&r->c, *out, k, v);
            jv_release(k);
            if (rc) return at(r, nd, rc);
        }
        return MN_OK;
    }
    if ((rc = jv_list_new(&r->c, nd->kind == JN_TUPLE ? JV_LIST_TUPLE : JV_LIST_LIST, nd->n_kids, out))) return at(r, nd, rc);
    for (size_t i = 0; i < nd->n_kids; i++) {
        Jv v;
        if ((rc = eval(r, nd->kids[i], s, &v))) return rc;
        if ((rc = jv_list_push(&r->c, *out, v))) return at(r, nd, rc);
    }
    return MN_OK;
}

static int eval_node(Render *r, const JnNode *nd, Scope *s, Jv *out) {
    Jv a, b;
    int rc;
    switch (nd->kind) {
    case JN_CONST:
        *out = jv_retain(nd->value);
        return MN_OK;
    case JN_NAME: return eval_name(r, nd, s, out);
    case JN_GETATTR:
        if ((rc = eval(r, nd->kids[0], s, &a))) return rc;
        rc = jb_getattr(&r->c, a, nd->name, nd->name_len, out);
        jv_release(a);
        return at(r, nd, rc);
    case JN_GETITEM:
        if ((rc = eval(r, nd->kids[0], s, &a))) return rc;
        if ((rc = eval(r, nd->kids[1], s, &b))) {
            jv_release(a);
            return rc;
        }
        rc = jb_getitem(&r->c, a, b, out);
        jv_release(a);
        jv_release(b);
        return at(r, nd, rc);
    case JN_SLICE: {
        Jv v[4] = {jv_none(), jv_none(), jv_none(), jv_none()};
        rc = MN_OK;
        for (int i = 0; rc == MN_OK && i < 4; i++)
            if (nd->kids[i]) rc = eval(r, nd->kids[i], s, &v[i]);
        if (rc == MN_OK) rc = at(r, nd, jb_slice(&r->c, v[0], v[1], v[2], v[3], out));
        for (int i = 0; i < 4; i++) jv_release(v[i]);
        return rc;
    }
    case JN_CALL: return eval_call(r, nd, s, NULL, jv_undef(), out);
    case JN_FILTER: return eval_filter(r, nd, s, jv_undef(), out);
    case JN_TEST: return eval_test(r, nd, s, out);
    case JN_NOT:
        if ((rc = eval(r, nd->kids[0], s, &a))) return rc;
        *out = jv_bool(!jv_truthy(a));
        jv_release(a);
        return MN_OK;
    case JN_NEG:
    case JN_POS:
        if ((rc = eval(r, nd->kids[0], s, &a))) return rc;
        rc = jb_unary(&r->c, nd->kind == JN_NEG, a, out);
        jv_release(a);
        return at(r, nd, rc);
    case JN_BINOP:
        if ((rc = eval(r, nd->kids[0], s, &a))) return rc;
        if ((rc = eval(r, nd->kids[1], s, &b))) {
            jv_release(a);
            return rc;
        }
        rc = jb_binop(&r->c, nd->op, a, b, out);
        jv_release(a);
        jv_release(b);
        return at(r, nd, rc);
    case JN_AND:
    case JN_OR:
        /* Python's and/or give one of their operands */
        if ((rc = eval(r, nd->kids[0], s, &a))) return rc;
        if (jv_truthy(a) == (nd->kind == JN_OR)) {
            *out = a;
            return MN_OK;
        }
        jv_release(a);
        return eval(r, nd->kids[1], s, out);
    case JN_COMPARE: return eval_compare(r, nd, s, out);
    case JN_CONDEXPR:
        if ((rc = eval(r, nd->kids[0], s, &a))) return rc;
        bool truth = jv_truthy(a);
        jv_release(a);
        if (truth) return eval(r, nd->kids[1], s, out);
        if (nd->kids[2]) return eval(r, nd->kids[2], s, out);
        *out = jv_undef_msg(&r->c, false,
                            "the inline if-expression on line %u evaluated to false and no else section was defined.",
                            nd->line);
        return MN_OK;
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT: return eval_collection(r, nd, s, out);
    default: break;
    }
    return fail(r, nd, MN_EUNSUPPORTED, "internal: not an expression");
}

static int eval(Render *r, const JnNode *nd, Scope *s, Jv *out) {
    *out = jv_undef();
    int rc = enter(r, nd);
    if (rc) return rc;
    rc = eval_node(r, nd, s, out);
    r->depth--;
    if (rc) {
        jv_release(*out);
        *out = jv_undef();
    }
    return rc;
}

/* ---- macros ------------------------------------------------------------------------------------------ */

static int run_captured(Render *r, const JnBlock *b, Scope *s, Jv *out);

/* A macro call's arguments being bound: which keywords were taken and
 * which parameters were given. */
typedef struct Binding {
    bool *kw_used; /* one per keyword argument */
    bool *given;   /* one per parameter */
} Binding;

/* Positional arguments, then keywords for the parameters left (jinja2's
 * Macro.__call__); *found_caller when a parameter is named caller. */
static int bind_params(Render *r, const JnNode *nd, const JvArgs *a, Scope *ms, Binding *b, bool *found_caller) {
    size_t n = nd->args.n_kw, n_given = a->n_pos < n ? a->n_pos : n;
    int rc = MN_OK;
    *found_caller = false;
    for (size_t i = 0; rc == MN_OK && i < n_given; i++) {
        b->given[i] = true;
        rc = scope_set(r, ms, nd->args.kw_names[i], jv_retain(a->pos[i]));
    }
    if (n_given == n) { /* all taken by position: the keywords are extra */
        for (size_t i = 0; i < n; i++) *found_caller |= strcmp(nd->args.kw_names[i], "caller") == 0;
        return rc;
    }
    for (size_t i = n_given; rc == MN_OK && i < n; i++) {
        if (strcmp(nd->args.kw_names[i], "caller") == 0) *found_caller = true;
        for (size_t k = 0; k < a->n_kw; k++) {
            if (b->kw_used[k] || strcmp(a->kw_names[k], nd->args.kw_names[i]) != 0) continue;
            b->kw_used[k] = b->given[i] = true;
            rc = scope_set(r, ms, nd->args.kw_names[i], jv_retain(a->kw_vals[k]));
            break;
        }
    }
    return rc;
}

/* caller, kwargs and varargs for a macro whose body uses them; extra
 * arguments anywhere else are errors, with jinja2's messages. */
static int bind_specials(Render *r, const JnNode *nd, const char *name, const JvArgs *a, Scope *ms, Binding *b,
                         bool found_caller) {
    JvCtx *c = &r->c;
    size_t n = nd->args.n_kw;
    int rc = MN_OK;
    if (nd->uses_caller && !found_caller) {
        Jv caller = jv_undef();
        bool have = false;
        for (size_t k = 0; k < a->n_kw && !have; k++)
            if (!b->kw_used[k] && strcmp(a->kw_names[k], "caller") == 0) {
                b->kw_used[k] = have = true;
                caller = jv_retain(a->kw_vals[k]);
            }
        if (!have) caller = jv_undef_msg(c, false, "No caller defined");
        if ((rc = scope_set(r, ms, "caller", caller))) return rc;
    }
    if (nd->uses_kwargs) {
        Jv kw;
        rc = jv_dict_new(c, &kw);
        for (size_t k = 0; rc == MN_OK && k < a->n_kw; k++) {
            if (b->kw_used[k]) continue;
            Jv key;
            if ((rc = jv_str_cstr(c, a->kw_names[k], &key))) break;
            rc = jv_dict_set(c, kw, key, jv_retain(a->kw_vals[k]));
            jv_release(key);
        }
        if (rc) {
            jv_release(kw);
            return rc;
        }
        if ((rc = scope_set(r, ms, "kwargs", kw))) return rc; /* kw is released by it */
    } else {
        for (size_t k = 0; k < a->n_kw; k++) {
            if (b->kw_used[k]) continue;
            if (strcmp(a->kw_names[k], "caller") == 0)
                return jv_fail(c, MN_EINVAL, "macro '%s' was invoked with two values for the special caller "
                               "argument. This is most likely a bug.", name);
            return jv_fail(c, MN_EINVAL, "macro '%s' takes no keyword argument '%s'", name, a->kw_names[k]);
        }
    }
    if (!nd->uses_varargs) {
        if (a->n_pos > n) return jv_fail(c, MN_EINVAL, "macro '%s' takes not more than %zu argument(s)", name, n);
        return MN_OK;
    }
    Jv va;
    rc = jv_list_new(c, JV_LIST_TUPLE, 0, &va);
    for (size_t i = n; rc == MN_OK && i < a->n_pos; i++) rc = jv_list_push(c, va, jv_retain(a->pos[i]));
    if (rc) {
        jv_release(va);
        return rc;
    }
    return scope_set(r, ms, "varargs", va);
}

/* Parameters not given: their default, evaluated in the macro's scope
 * (where the ones before are bound), or an undefined. */
static int bind_defaults(Render *r, const JnNode *nd, Scope *ms, const Binding *b) {
    int rc = MN_OK;
    for (size_t i = 0; rc == MN_OK && i < nd->args.n_kw; i++) {
        if (b->given[i]) continue;
        Jv v;
        if (nd->args.kw_vals[i]) rc = eval(r, nd->args.kw_vals[i], ms, &v);
        else v = jv_undef_msg(&r->c, false, "parameter '%s' was not provided", nd->args.kw_names[i]);
        if (rc == MN_OK) rc = scope_set(r, ms, nd->args.kw_names[i], v);
    }
    return rc;
}

/* A macro or caller() call: bind the arguments in a child of the macro's
 * scope, run the body, return its output as a str. */
static int macro_call(JvCtx *c, JvObj *o, const JvArgs *a, Jv *out) {
    Render *r = render_of(c);
    MacroObj *m = (MacroObj *)o;
    const JnNode *nd = m->node;
    size_t n = nd->args.n_kw;
    *out = jv_undef();
    if (r->call_depth >= r->lim->max_call_depth)
        return jv_fail(c, MN_ERANGE, "macro calls nest deeper than %d", r->lim->max_call_depth);
    Binding b = {jv_mem_alloc(c, a->n_kw + 1), jv_mem_alloc(c, n + 1)};
    Scope *ms = scope_new(r, m->closure);
    int rc = b.kw_used && b.given && ms ? MN_OK : c->err_code;
    bool found_caller = false;
    if (rc == MN_OK) {
        memset(b.kw_used, 0, a->n_kw + 1);
        memset(b.given, 0, n + 1);
        rc = bind_params(r, nd, a, ms, &b, &found_caller);
    }
    if (rc == MN_OK) rc = bind_specials(r, nd, macro_name(m), a, ms, &b, found_caller);
    if (rc == MN_OK) rc = bind_defaults(r, nd, ms, &b);
    jv_mem_free(c, b.kw_used, a->n_kw + 1);
    jv_mem_free(c, b.given, n + 1);
    if (rc == MN_OK) {
        r->call_depth++;
        rc = run_captured(r, &nd->blocks[0], ms, out);
        r->call_depth--;
    }
    scope_free(r, ms);
    return rc;
}

/* ---- statements ------------------------------------------------------------------------------------------ */

/* Bind target (a name, ns.attr or a tuple of them) in s, stealing v. */
static int assign(Render *r, const JnNode *target, Scope *s, Jv v) {
    if (target->kind == JN_NAME) return at(r, target, scope_set(r, s, target->name, v));
    if (target->kind == JN_NSREF) {
        Jv *ns = scope_find(s, target->name);
        if (ns == NULL || ns->kind != JV_NS) {
            jv_release(v);
            return fail(r, target, MN_EINVAL, "cannot assign attribute on non-namespace object");
        }
        Jv key;
        int rc = jv_str_cstr(&r->c, target->attr, &key);
        if (rc) {
            jv_release(v);
            return at(r, target, rc);
        }
        rc = jv_dict_set(&r->c, *ns, key, v);
        jv_release(key);
        return at(r, target, rc);
    }
    /* a tuple: unpack as Python does */
    if (v.kind != JV_STR && v.kind != JV_LIST && v.kind != JV_DICT && v.kind != JV_UNDEF) {
        int rc = fail(r, target, MN_EINVAL, "cannot unpack non-iterable %s object", jv_type_name(v));
        jv_release(v);
        return rc;
    }
    Jv items;
    int rc = jv_iterate(&r->c, v, &items);
    jv_release(v);
    if (rc) return at(r, target, rc);
    size_t n = items.as.l->n;
    if (n != target->n_kids) {
        rc = n > target->n_kids ? fail(r, target, MN_EINVAL, "too many values to unpack (expected %zu)", target->n_kids)
                                : fail(r, target, MN_EINVAL, "not enough values to unpack (expected %zu, got %zu)",
                                       target->n_kids, n);
    }
    for (size_t i = 0; rc == MN_OK && i < n; i++) rc = assign(r, target->kids[i], s, jv_retain(items.as.l->items[i]));
    jv_release(items);
    return rc;
}

/* Run b in s with the output captured into a new str. */
static int run_captured(Render *r, const JnBlock *b, Scope *s, Jv *out) {
    JvBuf buf;
    jv_buf_init(&buf, &r->c);
    JvBuf *saved = r->out;
    r->out = &buf;
    int rc = exec_block(r, b, s);
    r->out = saved;
    return jv_buf_finish(&buf, rc, false, out);
}

/* Run b in a fresh child scope of s, captured. */
static int run_child_captured(Render *r, const JnBlock *b, Scope *s, Jv *out) {
    Scope *cs = scope_new(r, s);
    if (cs == NULL) return r->c.err_code;
    int rc = run_captured(r, b, cs, out);
    scope_free(r, cs);
    return rc;
}

static int exec_block_in_child(Render *r, const JnBlock *b, Scope *s) {
    if (b->n == 0) return MN_OK;
    Scope *cs = scope_new(r, s);
    if (cs == NULL) return r->c.err_code;
    int rc = exec_block(r, b, cs);
    scope_free(r, cs);
    return rc;
}

static int exec_output(Render *r, const JnNode *nd, Scope *s) {
    for (size_t i = 0; i < nd->n_kids; i++) {
        Jv v;
        int rc = eval(r, nd->kids[i], s, &v);
        if (rc) return rc;
        if (v.kind == JV_STR) rc = emit(r, v.as.s->data, v.as.s->len);
        else rc = jv_str_of(&r->c, v, r->out);
        jv_release(v);
        if (rc) return at(r, nd->kids[i], rc);
    }
    return MN_OK;
}

static int exec_if(Render *r, const JnNode *nd, Scope *s) {
    for (size_t i = 0; i < nd->n_kids; i++) {
        Jv t;
        int rc = eval(r, nd->kids[i], s, &t);
        if (rc) return rc;
        bool truth = jv_truthy(t);
        jv_release(t);
        if (truth) return exec_block(r, &nd->blocks[i], s);
    }
    return exec_block(r, &nd->blocks[nd->n_kids], s);
}

/* The for statement nd over iterable, in scope s (depth0 > 0 for the
 * levels of a recursive loop). */
static int for_over(Render *r, const JnNode *nd, Scope *s, Jv iterable, int depth0) {
    Jv src;
    int rc;
    if (iterable.kind == JV_LIST) {
        src = jv_retain(iterable); /* walked where it stands */
    } else if ((rc = jv_iterate(&r->c, iterable, &src))) {
        return at(r, nd->kids[1], rc);
    }
    Jv loop;
    if ((rc = jv_obj_new(&r->c, &LOOP_TYPE, sizeof(LoopObj), &loop))) {
        jv_release(src);
        return at(r, nd, rc);
    }
    LoopObj *l = (LoopObj *)loop.as.o;
    l->src = src;
    l->is_gen = src.as.l->tag == JV_LIST_GEN;
    l->is_filtered = nd->kids[2] != NULL;
    l->node = nd;
    l->scope = s;
    l->depth0 = depth0;
    l->index0 = SIZE_MAX; /* before the first: the first loop_next makes it 0 */
    l->before = l->current = l->after = l->last_changed = jv_undef();
    l->length = -1;
    if (nd->is_recursive) scope_pin(r, s); /* loop() may be called later */
    bool any = false;
    for (;;) {
        Jv item;
        bool got;
        if ((rc = loop_next(r, l, &item, &got)) || !got) break;
        any = true;
        if ((rc = count_iteration(r, nd))) {
            jv_release(item);
            break;
        }
        Scope *is = scope_new(r, s);
        if (is == NULL) {
            jv_release(item);
            rc = at(r, nd, r->c.err_code);
            break;
        }
        rc = assign(r, nd->kids[0], is, item);
        if (rc == MN_OK) rc = at(r, nd, scope_set(r, is, "loop", jv_retain(loop)));
        if (rc == MN_OK) rc = exec_block(r, &nd->blocks[0], is);
        scope_free(r, is);
        if (rc == SIG_CONTINUE) rc = MN_OK;
        if (rc == SIG_BREAK) {
            rc = MN_OK;
            break;
        }
        if (rc) break;
    }
    if (!nd->is_recursive) l->scope = NULL; /* s may go; a kept loop object must not use it */
    jv_release(loop);
    if (rc == MN_OK && !any) rc = exec_block_in_child(r, &nd->blocks[1], s);
    return rc;
}

static int exec_for(Render *r, const JnNode *nd, Scope *s) {
    Jv iterable;
    int rc = eval(r, nd->kids[1], s, &iterable);
    if (rc) return rc;
    rc = for_over(r, nd, s, iterable, 0);
    jv_release(iterable);
    return rc;
}

static int exec_set(Render *r, const JnNode *nd, Scope *s) {
    Jv v;
    int rc = eval(r, nd->kids[1], s, &v);
    return rc ? rc : assign(r, nd->kids[0], s, v);
}

static int exec_setblock(Render *r, const JnNode *nd, Scope *s) {
    Jv text, v;
    int rc = run_child_captured(r, &nd->blocks[0], s, &text);
    if (rc) return rc;
    if (nd->kids[1] == NULL) return assign(r, nd->kids[0], s, text);
    rc = eval_filter(r, nd->kids[1], s, text, &v);
    jv_release(text);
    return rc ? rc : assign(r, nd->kids[0], s, v);
}

static int exec_filterblock(Render *r, const JnNode *nd, Scope *s) {
    Jv text, v;
    int rc = run_child_captured(r, &nd->blocks[0], s, &text);
    if (rc) return rc;
    rc = eval_filter(r, nd->kids[0], s, text, &v);
    jv_release(text);
    if (rc) return rc;
    rc = jv_str_of(&r->c, v, r->out);
    jv_release(v);
    return at(r, nd, rc);
}

static int exec_callblock(Render *r, const JnNode *nd, Scope *s) {
    Jv caller, v;
    int rc = macro_new(r, nd, s, &caller);
    if (rc) return at(r, nd, rc);
    rc = eval_call(r, nd->kids[0], s, "caller", caller, &v);
    jv_release(caller);
    if (rc) return rc;
    rc = jv_str_of(&r->c, v, r->out);
    jv_release(v);
    return at(r, nd, rc);
}

static int exec_with(Render *r, const JnNode *nd, Scope *s) {
    Scope *ws = scope_new(r, s);
    if (ws == NULL) return at(r, nd, r->c.err_code);
    int rc = MN_OK;
    for (size_t i = 0; rc == MN_OK && i < nd->args.n_kw; i++) {
        Jv v;
        if ((rc = eval(r, nd->args.kw_vals[i], s, &v))) break;
        rc = at(r, nd, scope_set(r, ws, nd->args.kw_names[i], v));
    }
    if (rc == MN_OK) rc = exec_block(r, &nd->blocks[0], ws);
    scope_free(r, ws);
    return rc;
}

static int exec_node(Render *r, const JnNode *nd, Scope *s) {
    switch (nd->kind) {
    case JN_DATA: return at(r, nd, emit(r, nd->value.as.s->data, nd->value.as.s->len));
    case JN_OUTPUT: return exec_output(r, nd, s);
    case JN_IF: return exec_if(r, nd, s);
    case JN_FOR: return exec_for(r, nd, s);
    case JN_SET: return exec_set(r, nd, s);
    case JN_SETBLOCK: return exec_setblock(r, nd, s);
    case JN_MACRO: {
        Jv m;
        int rc = macro_new(r, nd, s, &m);
        return at(r, nd, rc ? rc : scope_set(r, s, nd->name, m));
    }
    case JN_CALLBLOCK: return exec_callblock(r, nd, s);
    case JN_FILTERBLOCK: return exec_filterblock(r, nd, s);
    case JN_WITH: return exec_with(r, nd, s);
    case JN_BREAK: return SIG_BREAK;
    case JN_CONTINUE: return SIG_CONTINUE;
    case JN_SCOPE: return exec_block_in_child(r, &nd->blocks[0], s);
    default: break;
    }
    return fail(r, nd, MN_EUNSUPPORTED, "internal: not a statement");
}

static int exec_block(Render *r, const JnBlock *b, Scope *s) {
    for (size_t i = 0; i < b->n; i++) {
        int rc = enter(r, b->nodes[i]);
        if (rc) return rc;
        rc = exec_node(r, b->nodes[i], s);
        r->depth--;
        if (rc) return rc;
    }
    return MN_OK;
}

/* ---- JSON input -------------------------------------------------------------------------------------------- */

static int from_json_impl(JvCtx *c, const json_t *j, int depth, Jv *out);
static int from_json(JvCtx *c, const json_t *j, int depth, Jv *out) {
    *out = jv_undef();
    return jv_clean_out(from_json_impl(c, j, depth, out), out);
}

static int from_json_impl(JvCtx *c, const json_t *j, int depth, Jv *out) {
    if (depth >= JV_MAX_DEPTH) return jv_fail(c, MN_ERANGE, "the variables are nested more than %d levels deep", JV_MAX_DEPTH);
    int rc;
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_none(); return MN_OK;
    case JSON_TRUE: *out = jv_bool(true); return MN_OK;
    case JSON_FALSE: *out = jv_bool(false); return MN_OK;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return MN_OK;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return MN_OK;
    case JSON_STRING: return jv_str_new(c, json_string_value(j), json_string_length(j), false, out);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if ((rc = jv_list_new(c, JV_LIST_LIST, n, out))) return rc;
        for (size_t i = 0; i < n; i++) {
            Jv v;
            if ((rc = from_json(c, json_array_get(j, i), depth + 1, &v))) return rc;
            if ((rc = jv_list_push(c, *out, v))) return rc;
        }
        return MN_OK;
    }
    case JSON_OBJECT: {
        if ((rc = jv_dict_new(c, out))) return rc;
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            Jv k, v;
            if ((rc = jv_str_new(c, key, strlen(key), false, &k))) return rc;
            if ((rc = from_json(c, val, depth + 1, &v)) == MN_OK) rc = jv_dict_set(c, *out, k, v);
            jv_release(k);
            if (rc) return rc;
        }
        return MN_OK;
    }
    }
    return jv_fail(c, MN_EINVAL, "unknown JSON type");
}

/* ---- render ------------------------------------------------------------------------------------------------ */

int jinja_render(const JinjaTemplate *t, const json_t *vars, const JinjaDate *date, const JinjaLimits *lim,
                 char **out, size_t *out_len, MnErr *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    JinjaLimits def;
    if (lim == NULL) {
        jinja_limits_default(&def);
        lim = &def;
    }
    if (vars != NULL && !json_is_object(vars)) return mn_err_set(err, MN_EINVAL, "the variables must be a JSON object");
    Render r;
    memset(&r, 0, sizeof r);
    jv_ctx_init(&r.c, lim->max_memory_bytes, lim->max_steps);
    if (date) {
        r.c.year = date->year;
        r.c.month = date->month;
        r.c.day = date->day;
        r.c.hour = date->hour;
        r.c.minute = date->minute;
        r.c.second = date->second;
    }
    r.lim = lim;
    JvBuf text;
    jv_buf_init(&text, &r.c);
    text.max_len = lim->max_output_bytes;
    r.out = &text;
    int rc = MN_OK;
    r.root = scope_new(&r, NULL);
    if (r.root == NULL) rc = r.c.err_code;
    else scope_pin(&r, r.root);
    if (rc == MN_OK && vars != NULL) {
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)vars, key, val) {
            Jv v;
            if ((rc = from_json(&r.c, val, 0, &v))) break;
            if ((rc = scope_set(&r, r.root, key, v))) break;
        }
    }
    if (rc == MN_OK) rc = exec_block(&r, jn_template_body(t->tree), r.root);
    if (rc == MN_OK) {
        /* hand the buffer over: it leaves the render's accounting */
        if (text.data == NULL) {
            *out = mn_strdup("");
            if (*out == NULL) rc = mn_err_set(err, MN_ENOMEM, "out of memory");
        } else {
            *out = text.data;
            if (out_len) *out_len = text.len;
            r.c.mem_used -= text.cap;
            text.data = NULL;
            text.len = text.cap = 0;
        }
    } else {
        if (r.c.err_code == MN_OK) jv_fail(&r.c, rc, "%s", mn_strerror(rc));
        if (r.has_pos) mn_err_set(err, r.c.err_code, "line %u, column %u: %s", r.err_line, r.err_col, r.c.err_msg);
        else mn_err_set(err, r.c.err_code, "%s", r.c.err_msg);
        rc = r.c.err_code;
    }
    jv_buf_deinit(&text);
    /* the pinned scopes (the root among them) hold the last values; empty
     * them all before freeing any, as their macros point at each other */
    for (Scope *p = r.pinned; p != NULL; p = p->next_pinned) scope_clear(&r, p);
    while (r.pinned != NULL) {
        Scope *p = r.pinned;
        r.pinned = p->next_pinned;
        jv_mem_free(&r.c, p, sizeof *p);
    }
    jv_ctx_deinit(&r.c);
    return rc;
}
