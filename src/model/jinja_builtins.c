/* jinja_builtins.c — jinja2's filters, tests and globals, Python's methods
 * and operators on Jinja values (jinja_builtins.h).
 *
 * Sections, in order: helpers (argument binding, jinja2's object_type_repr
 * for messages), bound methods of str/dict/list (with markupsafe's rules
 * when the str is Markup), attribute and item lookup as the sandbox does
 * it, slicing, operators, filters, tests, globals.
 *
 * A bound method is an object holding its receiver and a MethodDef; a
 * global is an object holding its GlobalDef (and, for cycler and joiner,
 * their state). jinja2's lazy results are generators here too (JvGen):
 * select, reject, selectattr, rejectattr, map, unique, batch and reversed
 * lists and items produce their items when asked, so their errors surface
 * where Python's would.
 */
#include "model/jinja_builtins.h"

#include <ctype.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/jinja_parse.h"
#include "model/jinja_str.h"
#include "model/jinja_unicode.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ------------------------------------------------------------------------ */

int jb_bind(JvCtx *c, const char *who, const JvArgs *args, const char *const *names, size_t n_names, Jv *vals,
            bool *present) {
    for (size_t i = 0; i < n_names; i++) {
        present[i] = false;
        vals[i] = jv_undef();
    }
    if (args->n_pos > n_names)
        return jv_fail(c, MN_EINVAL, "%s() takes at most %zu arguments (%zu given)", who, n_names, args->n_pos);
    for (size_t i = 0; i < args->n_pos; i++) {
        vals[i] = args->pos[i];
        present[i] = true;
    }
    for (size_t k = 0; k < args->n_kw; k++) {
        size_t i;
        for (i = 0; i < n_names; i++)
            if (strcmp(names[i], args->kw_names[k]) == 0) break;
        if (i == n_names)
            return jv_fail(c, MN_EINVAL, "%s() got an unexpected keyword argument '%s'", who, args->kw_names[k]);
        if (present[i]) return jv_fail(c, MN_EINVAL, "%s() got multiple values for argument '%s'", who, names[i]);
        vals[i] = args->kw_vals[k];
        present[i] = true;
    }
    return MN_OK;
}

/* Positional-only arguments: at least lo, at most hi. */
static int want_pos(JvCtx *c, const char *who, const JvArgs *a, size_t lo, size_t hi) {
    if (a->n_kw > 0) return jv_fail(c, MN_EINVAL, "%s() takes no keyword arguments", who);
    if (a->n_pos < lo || a->n_pos > hi) {
        if (lo == hi) return jv_fail(c, MN_EINVAL, "%s() takes exactly %zu argument%s (%zu given)", who, lo, lo == 1 ? "" : "s", a->n_pos);
        return jv_fail(c, MN_EINVAL, "%s() takes %zu to %zu arguments (%zu given)", who, lo, hi, a->n_pos);
    }
    return MN_OK;
}

/* jinja2's object_type_repr, for "'dict object' has no attribute 'x'". */
static void type_repr(Jv v, char *buf, size_t cap) {
    if (v.kind == JV_NONE) snprintf(buf, cap, "None");
    else if (v.kind == JV_STR && v.as.s->is_safe) snprintf(buf, cap, "markupsafe.Markup object");
    else if (v.kind == JV_NS) snprintf(buf, cap, "jinja2.utils.Namespace object");
    else if (v.kind == JV_OBJ && strcmp(v.as.o->type->name, "LoopContext") == 0) snprintf(buf, cap, "jinja2.runtime.LoopContext object");
    else if (v.kind == JV_OBJ && strcmp(v.as.o->type->name, "Macro") == 0) snprintf(buf, cap, "jinja2.runtime.Macro object");
    else snprintf(buf, cap, "%s object", jv_type_name(v));
}

static Jv no_attribute(JvCtx *c, Jv obj, const char *name, size_t len) {
    char t[64];
    type_repr(obj, t, sizeof t);
    return jv_undef_msg(c, false, "'%s' has no attribute '%.*s'", t, (int)(len < 100 ? len : 100), name);
}

/* jinja2's message for a missing item: the key's repr when it is short and
 * a scalar (anything else would only make the message long). */
static Jv no_element(JvCtx *c, Jv obj, Jv key) {
    char t[64];
    type_repr(obj, t, sizeof t);
    bool scalar = key.kind == JV_STR || key.kind == JV_INT || key.kind == JV_FLOAT || key.kind == JV_BOOL ||
                  key.kind == JV_NONE;
    JvBuf b;
    jv_buf_init(&b, c);
    if (!scalar || (key.kind == JV_STR && key.as.s->len > 100) || jv_repr(c, key, &b) != MN_OK) {
        jv_buf_deinit(&b);
        return jv_undef_msg(c, false, "%s has no element of type %s", t, jv_type_name(key));
    }
    Jv u = key.kind == JV_STR ? jv_undef_msg(c, false, "'%s' has no attribute %s", t, b.data)
                              : jv_undef_msg(c, false, "%s has no element %s", t, b.data);
    jv_buf_deinit(&b);
    return u;
}

static int fail_undefined(JvCtx *c, Jv v) { return jv_fail(c, MN_EINVAL, "%s", jv_undef_text(v)); }

/* jinja2's soft_str: a str stays itself (Markup included), others str(). */
static int soft_str(JvCtx *c, Jv v, Jv *out) { return jv_to_str(c, v, out); }

/* Mark a fresh result as Markup (a str, or the str items of a fresh list). */
static void mark_safe(Jv v) {
    if (v.kind == JV_STR && v.as.s->h.refs == 1) v.as.s->is_safe = true;
    if (v.kind == JV_LIST && v.as.l->h.refs == 1)
        for (size_t i = 0; i < v.as.l->n; i++) mark_safe(v.as.l->items[i]);
}

/* markupsafe.escape(v): Markup stays, anything else is str()'d and escaped. */
static int escape_value(JvCtx *c, Jv v, Jv *out) {
    if (v.kind == JV_STR && v.as.s->is_safe) {
        *out = jv_retain(v);
        return MN_OK;
    }
    Jv s;
    int rc = jv_to_str(c, v, &s);
    if (rc) return rc;
    JvBuf b;
    jv_buf_init(&b, c);
    rc = jv_escape_into(&b, s.as.s->data, s.as.s->len);
    jv_release(s);
    return jv_buf_finish(&b, rc, true, out);
}

static bool is_str(Jv v) { return v.kind == JV_STR; }
static bool is_int(Jv v) { return v.kind == JV_INT || v.kind == JV_BOOL; }
static int64_t as_int(Jv v) { return v.kind == JV_BOOL ? v.as.b : v.as.i; }
static bool is_seq_list(Jv v) { return v.kind == JV_LIST && v.as.l->tag != JV_LIST_GEN; }

static int want_int(JvCtx *c, Jv v, const char *what, int64_t *out) {
    if (!is_int(v))
        return jv_fail(c, MN_EINVAL, "'%s' object cannot be interpreted as an integer%s%s", jv_type_name(v),
                       what ? " for " : "", what ? what : "");
    *out = as_int(v);
    return MN_OK;
}

/* A new list of the items of iterable v (consuming a generator). */
static int to_list(JvCtx *c, Jv v, Jv *out) {
    Jv it;
    int rc = jv_iterate(c, v, &it);
    if (rc) return rc;
    if (it.kind == JV_LIST && it.as.l->tag == JV_LIST_LIST && it.as.l->h.refs == 1) {
        *out = it;
        return MN_OK;
    }
    JvList *l = it.as.l;
    rc = jv_list_new(c, JV_LIST_LIST, l->n, out);
    for (size_t i = 0; rc == MN_OK && i < l->n; i++) rc = jv_list_push(c, *out, jv_retain(l->items[i]));
    jv_release(it);
    return rc;
}

/* ---- bound methods --------------------------------------------------------------------- */

typedef int (*MethodFn)(JvCtx *c, Jv self, const JvArgs *args, Jv *out);

enum {
    M_ESCAPE_ARGS = 1, /* Markup receiver: str arguments are escaped first */
    M_SAFE_RESULT = 2, /* Markup receiver: the result is Markup */
};

typedef struct MethodDef {
    const char *name;
    MethodFn fn;
    int flags;
} MethodDef;

typedef struct BoundMethod {
    JvObj o;
    Jv self;
    const MethodDef *def;
} BoundMethod;

static void bound_free(JvObj *o) { jv_release(((BoundMethod *)o)->self); }

static int bound_call(JvCtx *c, JvObj *o, const JvArgs *args, Jv *out) {
    BoundMethod *m = (BoundMethod *)o;
    if (m->def->fn == NULL)
        return jv_fail(c, MN_EUNSUPPORTED, "the %s method %s() is not supported", jv_type_name(m->self), m->def->name);
    bool safe = m->self.kind == JV_STR && m->self.as.s->is_safe;
    if (!safe || !(m->def->flags & M_ESCAPE_ARGS)) {
        int rc = m->def->fn(c, m->self, args, out);
        if (rc == MN_OK && safe && (m->def->flags & M_SAFE_RESULT)) mark_safe(*out);
        return rc;
    }
    /* markupsafe escapes str arguments of the wrapped methods */
    size_t n = args->n_pos + args->n_kw;
    Jv *esc = jv_mem_alloc(c, (n ? n : 1) * sizeof(Jv));
    if (esc == NULL) return c->err_code;
    int rc = MN_OK;
    size_t made = 0;
    for (; rc == MN_OK && made < n; made++) {
        Jv a = made < args->n_pos ? args->pos[made] : args->kw_vals[made - args->n_pos];
        if (a.kind == JV_STR) rc = escape_value(c, a, &esc[made]);
        else esc[made] = jv_retain(a);
        if (rc) break;
    }
    if (rc == MN_OK) {
        JvArgs ea = {esc, args->n_pos, args->kw_names, esc + args->n_pos, args->n_kw};
        rc = m->def->fn(c, m->self, &ea, out);
        if (rc == MN_OK && (m->def->flags & M_SAFE_RESULT)) mark_safe(*out);
    }
    for (size_t i = 0; i < made; i++) jv_release(esc[i]);
    jv_mem_free(c, esc, (n ? n : 1) * sizeof(Jv));
    return rc;
}

static const JvObjType BOUND_TYPE = {
    .name = "builtin_function_or_method",
    .is_callable = true,
    .call_fn = bound_call,
    .free_fn = bound_free,
};

static int bind_method(JvCtx *c, Jv self, const MethodDef *def, Jv *out) {
    int rc = jv_obj_new(c, &BOUND_TYPE, sizeof(BoundMethod), out);
    if (rc) return rc;
    BoundMethod *m = (BoundMethod *)out->as.o;
    m->self = jv_retain(self);
    m->def = def;
    return MN_OK;
}

/* ---- str methods ---- */

static int opt_chars(JvCtx *c, const char *who, const JvArgs *a, const JvStr **chars) {
    int rc = want_pos(c, who, a, 0, 1);
    if (rc) return rc;
    *chars = NULL;
    if (a->n_pos == 1 && a->pos[0].kind != JV_NONE) {
        if (!is_str(a->pos[0])) return jv_fail(c, MN_EINVAL, "%s arg must be None or str", who);
        *chars = a->pos[0].as.s;
    }
    return MN_OK;
}

static int m_strip(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    const JvStr *chars;
    int rc = opt_chars(c, "strip", a, &chars);
    return rc ? rc : js_strip(c, self.as.s, chars, true, true, out);
}
static int m_lstrip(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    const JvStr *chars;
    int rc = opt_chars(c, "lstrip", a, &chars);
    return rc ? rc : js_strip(c, self.as.s, chars, true, false, out);
}
static int m_rstrip(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    const JvStr *chars;
    int rc = opt_chars(c, "rstrip", a, &chars);
    return rc ? rc : js_strip(c, self.as.s, chars, false, true, out);
}

static int split_common(JvCtx *c, Jv self, const JvArgs *a, bool from_right, Jv *out) {
    static const char *const names[] = {"sep", "maxsplit"};
    Jv v[2];
    bool has[2];
    int rc = jb_bind(c, from_right ? "rsplit" : "split", a, names, 2, v, has);
    if (rc) return rc;
    const JvStr *sep = NULL;
    if (has[0] && v[0].kind != JV_NONE) {
        if (!is_str(v[0])) return jv_fail(c, MN_EINVAL, "must be str or None, not %s", jv_type_name(v[0]));
        sep = v[0].as.s;
    }
    int64_t maxsplit = -1;
    if (has[1] && (rc = want_int(c, v[1], NULL, &maxsplit))) return rc;
    return js_split(c, self.as.s, sep, maxsplit, from_right, out);
}
static int m_split(JvCtx *c, Jv self, const JvArgs *a, Jv *out) { return split_common(c, self, a, false, out); }
static int m_rsplit(JvCtx *c, Jv self, const JvArgs *a, Jv *out) { return split_common(c, self, a, true, out); }

static int m_splitlines(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"keepends"};
    Jv v[1];
    bool has[1];
    int rc = jb_bind(c, "splitlines", a, names, 1, v, has);
    return rc ? rc : js_splitlines(c, self.as.s, has[0] && jv_truthy(v[0]), out);
}

static int case_method(JvCtx *c, Jv self, const JvArgs *a, JsCase which, const char *who, Jv *out) {
    int rc = want_pos(c, who, a, 0, 0);
    return rc ? rc : js_case(c, self.as.s, which, out);
}
static int m_upper(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return case_method(c, s, a, JS_UPPER, "upper", o); }
static int m_lower(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return case_method(c, s, a, JS_LOWER, "lower", o); }
static int m_title(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return case_method(c, s, a, JS_TITLE, "title", o); }
static int m_capitalize(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return case_method(c, s, a, JS_CAPITALIZE, "capitalize", o); }
static int m_swapcase(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return case_method(c, s, a, JS_SWAPCASE, "swapcase", o); }

/* sub, start, end arguments of find/count/index/startswith. */
static int sub_bounds(JvCtx *c, const char *who, Jv self, const JvArgs *a, Jv *sub, size_t *lo, size_t *hi) {
    int rc = want_pos(c, who, a, 1, 3);
    if (rc) return rc;
    *sub = a->pos[0];
    bool has_s = a->n_pos > 1 && a->pos[1].kind != JV_NONE, has_e = a->n_pos > 2 && a->pos[2].kind != JV_NONE;
    int64_t s = 0, e = 0;
    if (has_s && (rc = want_int(c, a->pos[1], NULL, &s))) return rc;
    if (has_e && (rc = want_int(c, a->pos[2], NULL, &e))) return rc;
    js_bounds(self.as.s, has_s, s, has_e, e, lo, hi);
    return MN_OK;
}

static int find_common(JvCtx *c, Jv self, const JvArgs *a, const char *who, bool from_right, bool raise, Jv *out) {
    Jv sub;
    size_t lo, hi;
    int rc = sub_bounds(c, who, self, a, &sub, &lo, &hi);
    if (rc) return rc;
    if (!is_str(sub)) return jv_fail(c, MN_EINVAL, "must be str, not %s", jv_type_name(sub));
    if ((rc = jv_charge(c, self.as.s->len / 16))) return rc;
    int64_t at = js_find(self.as.s, sub.as.s, lo, hi, from_right);
    if (at < 0 && raise) return jv_fail(c, MN_EINVAL, "substring not found");
    *out = jv_int(at);
    return MN_OK;
}
static int m_find(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return find_common(c, s, a, "find", false, false, o); }
static int m_rfind(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return find_common(c, s, a, "rfind", true, false, o); }
static int m_index(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return find_common(c, s, a, "index", false, true, o); }
static int m_rindex(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return find_common(c, s, a, "rindex", true, true, o); }

static int m_count(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    Jv sub;
    size_t lo, hi;
    int rc = sub_bounds(c, "count", self, a, &sub, &lo, &hi);
    if (rc) return rc;
    if (!is_str(sub)) return jv_fail(c, MN_EINVAL, "must be str, not %s", jv_type_name(sub));
    if ((rc = jv_charge(c, self.as.s->len / 16))) return rc;
    *out = jv_int(js_count(self.as.s, sub.as.s, lo, hi));
    return MN_OK;
}

static int affix_common(JvCtx *c, Jv self, const JvArgs *a, bool at_end, Jv *out) {
    const char *who = at_end ? "endswith" : "startswith";
    Jv fix;
    size_t lo, hi;
    int rc = sub_bounds(c, who, self, a, &fix, &lo, &hi);
    if (rc) return rc;
    if (is_str(fix)) {
        *out = jv_bool(js_affix(self.as.s, fix.as.s, lo, hi, at_end));
        return MN_OK;
    }
    if (fix.kind == JV_LIST && fix.as.l->tag == JV_LIST_TUPLE) {
        for (size_t i = 0; i < fix.as.l->n; i++) {
            Jv f = fix.as.l->items[i];
            if (!is_str(f))
                return jv_fail(c, MN_EINVAL, "tuple for %s must only contain str, not %s", who, jv_type_name(f));
            if (js_affix(self.as.s, f.as.s, lo, hi, at_end)) {
                *out = jv_bool(true);
                return MN_OK;
            }
        }
        *out = jv_bool(false);
        return MN_OK;
    }
    return jv_fail(c, MN_EINVAL, "%s first arg must be str or a tuple of str, not %s", who, jv_type_name(fix));
}
static int m_startswith(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return affix_common(c, s, a, false, o); }
static int m_endswith(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return affix_common(c, s, a, true, o); }

static int m_replace(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "replace", a, 2, 3);
    if (rc) return rc;
    if (!is_str(a->pos[0]) || !is_str(a->pos[1]))
        return jv_fail(c, MN_EINVAL, "replace() argument %d must be str, not %s", is_str(a->pos[0]) ? 2 : 1,
                       jv_type_name(is_str(a->pos[0]) ? a->pos[1] : a->pos[0]));
    int64_t count = -1;
    if (a->n_pos == 3 && (rc = want_int(c, a->pos[2], NULL, &count))) return rc;
    return js_replace(c, self.as.s, a->pos[0].as.s, a->pos[1].as.s, count, out);
}

static int m_join(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "join", a, 1, 1);
    if (rc) return rc;
    Jv items;
    if ((rc = jv_iterate(c, a->pos[0], &items))) return rc;
    JvBuf b;
    jv_buf_init(&b, c);
    bool safe = self.as.s->is_safe;
    for (size_t i = 0; rc == MN_OK && i < items.as.l->n; i++) {
        Jv it = items.as.l->items[i];
        if (i > 0) rc = jv_buf_put(&b, self.as.s->data, self.as.s->len);
        if (rc) break;
        if (!is_str(it)) {
            rc = jv_fail(c, MN_EINVAL, "sequence item %zu: expected str instance, %s found", i, jv_type_name(it));
            break;
        }
        if (safe && !it.as.s->is_safe) rc = jv_escape_into(&b, it.as.s->data, it.as.s->len);
        else rc = jv_buf_put(&b, it.as.s->data, it.as.s->len);
    }
    jv_release(items);
    return jv_buf_finish(&b, rc, safe, out);
}

static int pad_common(JvCtx *c, Jv self, const JvArgs *a, char mode, const char *who, Jv *out) {
    int rc = want_pos(c, who, a, 1, mode == 'z' ? 1 : 2);
    if (rc) return rc;
    int64_t width = 0;
    if ((rc = want_int(c, a->pos[0], NULL, &width))) return rc;
    uint32_t fill = ' ';
    if (a->n_pos == 2) {
        Jv f = a->pos[1];
        if (!is_str(f) || f.as.s->n_chars != 1)
            return jv_fail(c, MN_EINVAL, "The fill character must be exactly one character long");
        size_t len;
        fill = js_decode(f.as.s->data, f.as.s->len, 0, &len);
    }
    if (width > 100000000) return jv_fail(c, MN_ERANGE, "%s() width too large", who);
    return js_pad(c, self.as.s, width, fill, mode, out);
}
static int m_center(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return pad_common(c, s, a, 'c', "center", o); }
static int m_ljust(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return pad_common(c, s, a, 'l', "ljust", o); }
static int m_rjust(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return pad_common(c, s, a, 'r', "rjust", o); }
static int m_zfill(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return pad_common(c, s, a, 'z', "zfill", o); }

static int pred_method(JvCtx *c, Jv self, const JvArgs *a, JsPred p, const char *who, Jv *out) {
    int rc = want_pos(c, who, a, 0, 0);
    if (rc) return rc;
    *out = jv_bool(js_is(self.as.s, p));
    return MN_OK;
}
#define PRED(fn, pred, who) \
    static int fn(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return pred_method(c, s, a, pred, who, o); }
PRED(m_isalnum, JS_IS_ALNUM, "isalnum")
PRED(m_isalpha, JS_IS_ALPHA, "isalpha")
PRED(m_isascii, JS_IS_ASCII, "isascii")
PRED(m_isdecimal, JS_IS_DECIMAL, "isdecimal")
PRED(m_isdigit, JS_IS_DIGIT, "isdigit")
PRED(m_islower, JS_IS_LOWER, "islower")
PRED(m_isnumeric, JS_IS_NUMERIC, "isnumeric")
PRED(m_isprintable, JS_IS_PRINTABLE, "isprintable")
PRED(m_isspace, JS_IS_SPACE, "isspace")
PRED(m_istitle, JS_IS_TITLE, "istitle")
PRED(m_isupper, JS_IS_UPPER, "isupper")

static int affix_remove(JvCtx *c, Jv self, const JvArgs *a, bool at_end, Jv *out) {
    int rc = want_pos(c, at_end ? "removesuffix" : "removeprefix", a, 1, 1);
    if (rc) return rc;
    if (!is_str(a->pos[0])) return jv_fail(c, MN_EINVAL, "must be str, not %s", jv_type_name(a->pos[0]));
    const JvStr *s = self.as.s, *fix = a->pos[0].as.s;
    if (fix->len > 0 && js_affix(s, fix, 0, s->n_chars, at_end))
        return jv_str_new(c, s->data + (at_end ? 0 : fix->len), s->len - fix->len, false, out);
    return jv_str_new(c, s->data, s->len, false, out);
}
static int m_removeprefix(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return affix_remove(c, s, a, false, o); }
static int m_removesuffix(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return affix_remove(c, s, a, true, o); }

static int partition_common(JvCtx *c, Jv self, const JvArgs *a, bool from_right, Jv *out) {
    int rc = want_pos(c, from_right ? "rpartition" : "partition", a, 1, 1);
    if (rc) return rc;
    Jv sep = a->pos[0];
    if (!is_str(sep)) return jv_fail(c, MN_EINVAL, "must be str, not %s", jv_type_name(sep));
    if (sep.as.s->len == 0) return jv_fail(c, MN_EINVAL, "empty separator");
    const JvStr *s = self.as.s;
    int64_t at = js_find(s, sep.as.s, 0, s->n_chars, from_right);
    if ((rc = jv_list_new(c, JV_LIST_TUPLE, 3, out))) return rc;
    size_t off = at < 0 ? 0 : jv_str_offset(s, (size_t)at);
    const char *parts[3];
    size_t lens[3];
    if (at < 0) {
        parts[0] = from_right ? "" : s->data, lens[0] = from_right ? 0 : s->len;
        parts[1] = "", lens[1] = 0;
        parts[2] = from_right ? s->data : "", lens[2] = from_right ? s->len : 0;
    } else {
        parts[0] = s->data, lens[0] = off;
        parts[1] = sep.as.s->data, lens[1] = sep.as.s->len;
        parts[2] = s->data + off + sep.as.s->len, lens[2] = s->len - off - sep.as.s->len;
    }
    for (int i = 0; i < 3; i++) {
        Jv p;
        if ((rc = jv_str_new(c, parts[i], lens[i], false, &p)) || (rc = jv_list_push(c, *out, p))) return rc;
    }
    return MN_OK;
}
static int m_partition(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return partition_common(c, s, a, false, o); }
static int m_rpartition(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return partition_common(c, s, a, true, o); }

/* The value of a str.format field name: an index or a keyword, then
 * ".attr" and "[key]" lookups as the sandbox does them. */
static int format_field(JvCtx *c, const char *f, size_t n, const JvArgs *a, int64_t *auto_i, Jv *out) {
    /* string.Formatter's numbering (the sandbox formats with it): "" takes
     * the next index; a field that is all digits turns numbering manual */
    bool all_digits = n > 0;
    for (size_t q = 0; q < n; q++) all_digits &= isdigit((unsigned char)f[q]) != 0;
    if (n == 0 && *auto_i < 0)
        return jv_fail(c, MN_EINVAL, "cannot switch from manual field specification to automatic field numbering");
    if (all_digits) {
        if (*auto_i > 0)
            return jv_fail(c, MN_EINVAL, "cannot switch from manual field specification to automatic field numbering");
        *auto_i = -1;
    }
    size_t i = 0;
    while (i < n && f[i] != '.' && f[i] != '[') i++;
    Jv v = jv_undef();
    bool found = false;
    if (i == 0 || isdigit((unsigned char)f[0])) {
        bool digits = true;
        for (size_t q = 0; q < i; q++) digits &= isdigit((unsigned char)f[q]) != 0;
        size_t idx = i == 0 ? (size_t)(*auto_i)++ : digits ? (size_t)strtoul(f, NULL, 10) : SIZE_MAX;
        if (idx >= a->n_pos) return jv_fail(c, MN_EINVAL, "Replacement index %zu out of range for positional args tuple", idx);
        v = a->pos[idx];
        found = true;
    } else {
        for (size_t k = 0; k < a->n_kw && !found; k++)
            if (strlen(a->kw_names[k]) == i && memcmp(a->kw_names[k], f, i) == 0) v = a->kw_vals[k], found = true;
        if (!found) return jv_fail(c, MN_EINVAL, "KeyError: '%.*s'", (int)(i < 60 ? i : 60), f);
    }
    *out = jv_retain(v);
    while (i < n) {
        Jv next = jv_undef();
        int rc;
        if (f[i] == '.') {
            size_t j = ++i;
            while (j < n && f[j] != '.' && f[j] != '[') j++;
            if (j == i) rc = jv_fail(c, MN_EINVAL, "Empty attribute in format string");
            else rc = jb_getattr(c, *out, f + i, j - i, &next);
            i = j;
        } else {
            const char *close = memchr(f + i, ']', n - i);
            if (close == NULL) {
                rc = jv_fail(c, MN_EINVAL, "Missing ']' in format string");
            } else {
                const char *k = f + i + 1;
                size_t kn = (size_t)(close - k);
                bool digits = kn > 0;
                for (size_t q = 0; q < kn; q++) digits &= isdigit((unsigned char)k[q]) != 0;
                Jv key = jv_undef();
                rc = digits ? (key = jv_int((int64_t)strtoll(k, NULL, 10)), MN_OK) : jv_str_new(c, k, kn, false, &key);
                if (rc == MN_OK) rc = jb_getitem(c, *out, key, &next);
                jv_release(key);
                i = (size_t)(close - f) + 1;
            }
        }
        jv_release(*out);
        *out = jv_undef();
        if (rc) return rc;
        *out = next;
    }
    return MN_OK;
}

/* str.format: fields {name!conv:spec} with Python's format mini-language;
 * replacement fields nested inside a spec are refused. */
static int m_format(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    const JvStr *s = self.as.s;
    JvBuf b;
    jv_buf_init(&b, c);
    int rc = jv_charge(c, s->len / 8);
    int64_t auto_i = 0; /* -1 once numbering is manual */
    for (size_t i = 0; rc == MN_OK && i < s->len;) {
        char ch = s->data[i];
        if ((ch == '{' || ch == '}') && i + 1 < s->len && s->data[i + 1] == ch) {
            rc = jv_buf_put(&b, &ch, 1);
            i += 2;
            continue;
        }
        if (ch == '}') {
            rc = jv_fail(c, MN_EINVAL, "Single '}' encountered in format string");
            break;
        }
        if (ch != '{') {
            rc = jv_buf_put(&b, &ch, 1);
            i++;
            continue;
        }
        const char *f = s->data + i + 1, *end = s->data + s->len;
        const char *close = memchr(f, '}', (size_t)(end - f));
        const char *nested = memchr(f, '{', (size_t)(end - f));
        if (close == NULL) {
            rc = jv_fail(c, MN_EINVAL, "Single '{' encountered in format string");
            break;
        }
        if (nested && nested < close) {
            rc = jv_fail(c, MN_EUNSUPPORTED, "str.format() with fields nested in a format spec is not supported");
            break;
        }
        const char *colon = memchr(f, ':', (size_t)(close - f));
        const char *name_end = colon ? colon : close;
        const char *bang = memchr(f, '!', (size_t)(name_end - f));
        char conv = 0;
        if (bang) {
            if (name_end - bang != 2 || !strchr("rsa", bang[1])) {
                rc = jv_fail(c, MN_EINVAL, "Unknown conversion specifier %.*s", (int)(name_end - bang - 1), bang + 1);
                break;
            }
            conv = bang[1];
            name_end = bang;
        }
        Jv v;
        if ((rc = format_field(c, f, (size_t)(name_end - f), a, &auto_i, &v))) break;
        if (conv == 'a') {
            rc = jv_fail(c, MN_EUNSUPPORTED, "the !a conversion is not supported");
            jv_release(v);
            break;
        }
        if (conv) {
            Jv text;
            JvBuf cb;
            jv_buf_init(&cb, c);
            rc = jv_buf_finish(&cb, conv == 's' ? jv_str_of(c, v, &cb) : jv_repr(c, v, &cb), false, &text);
            jv_release(v);
            v = text;
        }
        if (rc == MN_OK) rc = js_format_value(c, v, colon ? colon + 1 : close, colon ? (size_t)(close - colon - 1) : 0, &b);
        jv_release(v);
        i = (size_t)(close - s->data) + 1;
    }
    return jv_buf_finish(&b, rc, false, out);
}

static const MethodDef STR_METHODS[] = {
    {"capitalize", m_capitalize, M_SAFE_RESULT},
    {"center", m_center, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"count", m_count, 0},
    {"endswith", m_endswith, 0},
    {"find", m_find, 0},
    {"format", m_format, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"index", m_index, 0},
    {"isalnum", m_isalnum, 0},
    {"isalpha", m_isalpha, 0},
    {"isascii", m_isascii, 0},
    {"isdecimal", m_isdecimal, 0},
    {"isdigit", m_isdigit, 0},
    {"islower", m_islower, 0},
    {"isnumeric", m_isnumeric, 0},
    {"isprintable", m_isprintable, 0},
    {"isspace", m_isspace, 0},
    {"istitle", m_istitle, 0},
    {"isupper", m_isupper, 0},
    {"join", m_join, 0},
    {"ljust", m_ljust, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"lower", m_lower, M_SAFE_RESULT},
    {"lstrip", m_lstrip, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"partition", m_partition, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"removeprefix", m_removeprefix, 0},
    {"removesuffix", m_removesuffix, 0},
    {"replace", m_replace, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"rfind", m_rfind, 0},
    {"rindex", m_rindex, 0},
    {"rjust", m_rjust, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"rpartition", m_rpartition, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"rsplit", m_rsplit, M_SAFE_RESULT},
    {"rstrip", m_rstrip, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"split", m_split, M_SAFE_RESULT},
    {"splitlines", m_splitlines, M_SAFE_RESULT},
    {"startswith", m_startswith, 0},
    {"strip", m_strip, M_ESCAPE_ARGS | M_SAFE_RESULT},
    {"swapcase", m_swapcase, M_SAFE_RESULT},
    {"title", m_title, M_SAFE_RESULT},
    {"upper", m_upper, M_SAFE_RESULT},
    {"zfill", m_zfill, M_ESCAPE_ARGS | M_SAFE_RESULT},
};

/* ---- dict and list methods ---- */

static int m_get(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "get", a, 1, 2);
    if (rc) return rc;
    const Jv *hit = jv_dict_get(self.as.d, a->pos[0]);
    if (hit == NULL && a->pos[0].kind != JV_STR && a->pos[0].kind != JV_INT && a->pos[0].kind != JV_FLOAT &&
        a->pos[0].kind != JV_BOOL && a->pos[0].kind != JV_NONE)
        return jv_fail(c, MN_EINVAL, "unhashable type: '%s'", jv_type_name(a->pos[0]));
    *out = hit ? jv_retain(*hit) : a->n_pos == 2 ? jv_retain(a->pos[1]) : jv_none();
    return MN_OK;
}

static int dict_view(JvCtx *c, Jv self, const JvArgs *a, JvListTag tag, const char *who, Jv *out) {
    int rc = want_pos(c, who, a, 0, 0);
    if (rc) return rc;
    const JvDict *d = self.as.d;
    if ((rc = jv_list_new(c, tag, d->n, out))) return rc;
    for (size_t i = 0; i < d->n; i++) {
        Jv item;
        if (tag == JV_LIST_ITEMS) {
            if ((rc = jv_list_new(c, JV_LIST_TUPLE, 2, &item))) return rc;
            if ((rc = jv_list_push(c, item, jv_retain(d->ents[i].key))) ||
                (rc = jv_list_push(c, item, jv_retain(d->ents[i].val)))) {
                jv_release(item);
                return rc;
            }
        } else {
            item = jv_retain(tag == JV_LIST_KEYS ? d->ents[i].key : d->ents[i].val);
        }
        if ((rc = jv_list_push(c, *out, item))) return rc;
    }
    return MN_OK;
}
static int m_items(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return dict_view(c, s, a, JV_LIST_ITEMS, "items", o); }
static int m_keys(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return dict_view(c, s, a, JV_LIST_KEYS, "keys", o); }
static int m_values(JvCtx *c, Jv s, const JvArgs *a, Jv *o) { return dict_view(c, s, a, JV_LIST_VALUES, "values", o); }

static int m_dict_copy(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "copy", a, 0, 0);
    if (rc || (rc = jv_dict_new(c, out))) return rc;
    for (size_t i = 0; i < self.as.d->n; i++)
        if ((rc = jv_dict_set(c, *out, self.as.d->ents[i].key, jv_retain(self.as.d->ents[i].val)))) return rc;
    return MN_OK;
}

static const MethodDef DICT_METHODS[] = {
    {"copy", m_dict_copy, 0}, {"get", m_get, 0}, {"items", m_items, 0}, {"keys", m_keys, 0}, {"values", m_values, 0},
};
static const char *const DICT_MUTATORS[] = {"clear", "pop", "popitem", "setdefault", "update"};

static int m_list_index(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "index", a, 1, 3);
    if (rc) return rc;
    const JvList *l = self.as.l;
    int64_t lo = 0, hi = (int64_t)l->n, n = (int64_t)l->n;
    if (a->n_pos > 1 && (rc = want_int(c, a->pos[1], NULL, &lo))) return rc;
    if (a->n_pos > 2 && (rc = want_int(c, a->pos[2], NULL, &hi))) return rc;
    if (lo < 0) lo = lo + n < 0 ? 0 : lo + n;
    if (hi < 0) hi = hi + n < 0 ? 0 : hi + n;
    if (hi > n) hi = n;
    for (int64_t i = lo; i < hi; i++)
        if (jv_eq(l->items[i], a->pos[0])) {
            *out = jv_int(i);
            return MN_OK;
        }
    return jv_fail(c, MN_EINVAL, "list.index(x): x not in list");
}

static int m_list_count(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "count", a, 1, 1);
    if (rc) return rc;
    int64_t k = 0;
    for (size_t i = 0; i < self.as.l->n; i++) k += jv_eq(self.as.l->items[i], a->pos[0]);
    *out = jv_int(k);
    return jv_charge(c, self.as.l->n / 8);
}

static int m_list_copy(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "copy", a, 0, 0);
    if (rc || (rc = jv_list_new(c, JV_LIST_LIST, self.as.l->n, out))) return rc;
    for (size_t i = 0; i < self.as.l->n; i++)
        if ((rc = jv_list_push(c, *out, jv_retain(self.as.l->items[i])))) return rc;
    return MN_OK;
}

/* list.pop and list.clear mutate the list in place: jinja2 3.1's immutable
 * sandbox lists only append, insert, sort, reverse, remove and extend as
 * mutating a sequence (chat templates use pop to keep queues). */
static int m_list_pop(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "pop", a, 0, 1);
    if (rc) return rc;
    JvList *l = self.as.l;
    int64_t i = -1;
    if (a->n_pos == 1 && (rc = want_int(c, a->pos[0], NULL, &i))) return rc;
    if (l->n == 0) return jv_fail(c, MN_EINVAL, "pop from empty list");
    if (i < 0) i += (int64_t)l->n;
    if (i < 0 || i >= (int64_t)l->n) return jv_fail(c, MN_EINVAL, "pop index out of range");
    *out = l->items[i]; /* the list's reference moves to the caller */
    memmove(l->items + i, l->items + i + 1, (l->n - (size_t)i - 1) * sizeof(Jv));
    l->n--;
    return jv_charge(c, l->n / 8);
}

static int m_list_clear(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "clear", a, 0, 0);
    if (rc) return rc;
    JvList *l = self.as.l;
    while (l->n > 0) jv_release(l->items[--l->n]);
    *out = jv_none();
    return MN_OK;
}

static const MethodDef LIST_METHODS[] = {{"clear", m_list_clear, 0}, {"copy", m_list_copy, 0}, {"count", m_list_count, 0},
                                         {"index", m_list_index, 0}, {"pop", m_list_pop, 0}};
static const MethodDef TUPLE_METHODS[] = {{"count", m_list_count, 0}, {"index", m_list_index, 0}};
static const char *const LIST_MUTATORS[] = {"append", "extend", "insert", "remove", "reverse", "sort"};

static const MethodDef *find_method(const MethodDef *defs, size_t n, const char *name, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(defs[i].name) == len && memcmp(defs[i].name, name, len) == 0) return &defs[i];
    return NULL;
}

static bool in_names(const char *const *names, size_t n, const char *name, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0) return true;
    return false;
}

/* ---- attribute and item lookup ---------------------------------------------------------- */

static bool is_dunder(const char *name, size_t len) {
    return len > 4 && name[0] == '_' && name[1] == '_' && name[len - 2] == '_' && name[len - 1] == '_';
}

static Jv unsafe_attr(JvCtx *c, Jv obj, const char *name, size_t len) {
    return jv_undef_msg(c, true, "access to attribute '%.*s' of '%s' object is unsafe.", (int)(len < 80 ? len : 80),
                        name, jv_type_name(obj));
}

/* Methods named mnemo knows about but does not implement bind to a def
 * with no function; calling it is refused by name. */
static const MethodDef UNSUPPORTED_METHODS[] = {
    {"casefold", NULL, 0}, {"encode", NULL, 0},       {"expandtabs", NULL, 0}, {"format_map", NULL, 0},
    {"isidentifier", NULL, 0}, {"maketrans", NULL, 0}, {"translate", NULL, 0},
};

/* The method of obj named name, if it has one: MN_OK with *out bound (or an
 * undefined refusing a mutating method), MN_ENOTFOUND otherwise. */
static int method_of(JvCtx *c, Jv obj, const char *name, size_t len, Jv *out) {
    const MethodDef *def = NULL;
    if (obj.kind == JV_STR) {
        def = find_method(STR_METHODS, COUNT(STR_METHODS), name, len);
        if (def == NULL) def = find_method(UNSUPPORTED_METHODS, COUNT(UNSUPPORTED_METHODS), name, len);
    } else if (obj.kind == JV_DICT) {
        def = find_method(DICT_METHODS, COUNT(DICT_METHODS), name, len);
        if (def == NULL && in_names(DICT_MUTATORS, COUNT(DICT_MUTATORS), name, len)) {
            *out = unsafe_attr(c, obj, name, len);
            return MN_OK;
        }
    } else if (obj.kind == JV_LIST && obj.as.l->tag == JV_LIST_LIST) {
        def = find_method(LIST_METHODS, COUNT(LIST_METHODS), name, len);
        if (def == NULL && in_names(LIST_MUTATORS, COUNT(LIST_MUTATORS), name, len)) {
            *out = unsafe_attr(c, obj, name, len);
            return MN_OK;
        }
    } else if (obj.kind == JV_LIST && obj.as.l->tag == JV_LIST_TUPLE) {
        def = find_method(TUPLE_METHODS, COUNT(TUPLE_METHODS), name, len);
    }
    if (def == NULL) return MN_ENOTFOUND;
    return bind_method(c, obj, def, out);
}

static int getattr_impl(JvCtx *c, Jv obj, const char *name, size_t len, Jv *out) {
    *out = jv_undef();
    if (obj.kind == JV_UNDEF) return fail_undefined(c, obj);
    if (is_dunder(name, len)) {
        *out = unsafe_attr(c, obj, name, len);
        return MN_OK;
    }
    int rc = method_of(c, obj, name, len, out);
    if (rc != MN_ENOTFOUND) return rc;
    const Jv *hit = NULL;
    if (obj.kind == JV_DICT || obj.kind == JV_NS) hit = jv_dict_get_str(obj.as.d, name, len);
    if (hit) {
        *out = jv_retain(*hit);
        return MN_OK;
    }
    if (obj.kind == JV_OBJ && obj.as.o->type->getattr_fn) return obj.as.o->type->getattr_fn(c, obj.as.o, name, len, out);
    *out = no_attribute(c, obj, name, len);
    return MN_OK;
}

int jb_getattr(JvCtx *c, Jv obj, const char *name, size_t len, Jv *out) {
    return jv_clean_out(getattr_impl(c, obj, name, len, out), out);
}

/* Python's index of an int into a sequence of n: -1 when out of range. */
static int64_t seq_index(int64_t i, size_t n) {
    if (i < 0) i += (int64_t)n;
    return i < 0 || i >= (int64_t)n ? -1 : i;
}

static int getitem_impl(JvCtx *c, Jv obj, Jv key, Jv *out) {
    *out = jv_undef();
    if (obj.kind == JV_UNDEF) return fail_undefined(c, obj);
    if (obj.kind == JV_DICT) {
        const Jv *hit = jv_dict_get(obj.as.d, key);
        if (hit) {
            *out = jv_retain(*hit);
            return MN_OK;
        }
    } else if (is_int(key) && (obj.kind == JV_STR || is_seq_list(obj)) &&
               (obj.kind == JV_STR || obj.as.l->tag <= JV_LIST_TUPLE || obj.as.l->tag == JV_LIST_RANGE)) {
        size_t n = obj.kind == JV_STR ? obj.as.s->n_chars : obj.as.l->n;
        int64_t i = seq_index(as_int(key), n);
        if (i >= 0) {
            if (obj.kind == JV_LIST) {
                *out = jv_retain(obj.as.l->items[i]);
                return MN_OK;
            }
            int rc = js_char_at(c, obj.as.s, (size_t)i, out);
            if (rc == MN_OK && obj.as.s->is_safe) mark_safe(*out);
            return rc;
        }
    }
    /* a str key falls back to the attribute, as the sandbox's getitem does */
    if (key.kind == JV_STR && obj.kind != JV_DICT) {
        const char *name = key.as.s->data;
        size_t len = key.as.s->len;
        if (is_dunder(name, len)) {
            *out = unsafe_attr(c, obj, name, len);
            return MN_OK;
        }
        int rc = method_of(c, obj, name, len, out);
        if (rc != MN_ENOTFOUND) return rc;
        if (obj.kind == JV_NS) {
            const Jv *hit = jv_dict_get_str(obj.as.d, name, len);
            if (hit) {
                *out = jv_retain(*hit);
                return MN_OK;
            }
        }
        if (obj.kind == JV_OBJ && obj.as.o->type->getattr_fn)
            return obj.as.o->type->getattr_fn(c, obj.as.o, name, len, out);
    } else if (key.kind == JV_STR) {
        int rc = method_of(c, obj, key.as.s->data, key.as.s->len, out);
        if (rc != MN_ENOTFOUND) return rc;
    }
    *out = no_element(c, obj, key);
    return MN_OK;
}

int jb_getitem(JvCtx *c, Jv obj, Jv key, Jv *out) {
    return jv_clean_out(getitem_impl(c, obj, key, out), out);
}

/* Python's slice.indices(n): the normalized start, stop and step. */
static int slice_indices(JvCtx *c, Jv start, Jv stop, Jv step, size_t n, int64_t *a, int64_t *b, int64_t *s,
                         bool *is_type_error) {
    *is_type_error = false;
    int64_t st = 1;
    /* absent bounds come as None; Undefined has no __index__ */
    Jv v[3] = {start, stop, step};
    for (int i = 0; i < 3; i++)
        if (v[i].kind != JV_NONE && !is_int(v[i])) {
            *is_type_error = true;
            return MN_OK;
        }
    if (step.kind != JV_NONE) st = as_int(step);
    if (st == 0) return jv_fail(c, MN_EINVAL, "slice step cannot be zero");
    int64_t len = (int64_t)n;
    int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? len : len - 1;
    int64_t x;
    if (start.kind == JV_NONE) x = st < 0 ? upper : lower;
    else {
        x = as_int(start);
        if (x < 0) x = x < -len ? lower : x + len;
        if (x < lower) x = lower;
        else if (x > upper) x = upper;
    }
    *a = x;
    if (stop.kind == JV_NONE) x = st < 0 ? lower : upper;
    else {
        x = as_int(stop);
        if (x < 0) x = x < -len ? lower : x + len;
        if (x < lower) x = lower;
        else if (x > upper) x = upper;
    }
    *b = x;
    *s = st;
    return MN_OK;
}

static int slice_impl(JvCtx *c, Jv obj, Jv start, Jv stop, Jv step, Jv *out) {
    *out = jv_undef();
    if (obj.kind == JV_UNDEF) return fail_undefined(c, obj);
    /* jinja2 compiles a slice to Python's own subscript, not the sandbox's
     * getitem: what Python refuses is an error, not an undefined */
    bool is_str_obj = obj.kind == JV_STR;
    bool is_seq = obj.kind == JV_LIST && (obj.as.l->tag <= JV_LIST_TUPLE || obj.as.l->tag == JV_LIST_RANGE);
    if (obj.kind == JV_DICT) return jv_fail(c, MN_EINVAL, "unhashable type: 'slice'");
    if (!is_str_obj && !is_seq) return jv_fail(c, MN_EINVAL, "'%s' object is not subscriptable", jv_type_name(obj));
    size_t n = is_str_obj ? obj.as.s->n_chars : obj.as.l->n;
    int64_t a = 0, b = 0, s = 1;
    bool type_error;
    int rc = slice_indices(c, start, stop, step, n, &a, &b, &s, &type_error);
    if (rc) return rc;
    if (type_error) return jv_fail(c, MN_EINVAL, "slice indices must be integers or None or have an __index__ method");
    if (is_str_obj) {
        rc = js_slice(c, obj.as.s, a, b, s, out);
        if (rc == MN_OK && obj.as.s->is_safe) mark_safe(*out);
        return rc;
    }
    const JvList *l = obj.as.l;
    size_t count = 0;
    if (s > 0 && b > a) count = (size_t)((b - a + s - 1) / s);
    else if (s < 0 && a > b) count = (size_t)((a - b - s - 1) / -s);
    if ((rc = jv_charge(c, count / 8))) return rc;
    if ((rc = jv_list_new(c, l->tag, count, out))) return rc;
    for (size_t k = 0; k < count; k++)
        if ((rc = jv_list_push(c, *out, jv_retain(l->items[a + (int64_t)k * s])))) return rc;
    if (l->tag == JV_LIST_RANGE) {
        JvList *r = out->as.l;
        r->range[0] = l->range[0] + a * l->range[2];
        r->range[1] = l->range[0] + b * l->range[2];
        r->range[2] = l->range[2] * s;
    }
    return MN_OK;
}

int jb_slice(JvCtx *c, Jv obj, Jv start, Jv stop, Jv step, Jv *out) {
    return jv_clean_out(slice_impl(c, obj, start, stop, step, out), out);
}

/* ---- operators ------------------------------------------------------------------------- */

static const char *const OP_TEXT[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

static int unsupported_operands(JvCtx *c, int op, Jv a, Jv b) {
    return jv_fail(c, MN_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", OP_TEXT[op], jv_type_name(a),
                   jv_type_name(b));
}

static int overflow(JvCtx *c) { return jv_fail(c, MN_EUNSUPPORTED, "integer overflow (mnemo's integers are 64-bit)"); }

/* CPython's float divmod. */
static void float_divmod(double vx, double wx, double *floordiv, double *mod) {
    double m = fmod(vx, wx);
    double div = (vx - m) / wx;
    if (m != 0.0) {
        if ((wx < 0) != (m < 0)) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = copysign(0.0, wx);
    }
    double fd;
    if (div != 0.0) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *mod = m;
}

static int repeat(JvCtx *c, Jv seq, int64_t times, Jv *out) {
    if (times < 0) times = 0;
    if (seq.kind == JV_STR) {
        const JvStr *s = seq.as.s;
        if (s->len > 0 && (uint64_t)times > (uint64_t)(c->mem_limit / s->len + 1))
            return jv_fail(c, MN_ERANGE, "the template needs more than %zu bytes of memory", c->mem_limit);
        int rc = jv_charge(c, (uint64_t)times * s->len / 16);
        if (rc) return rc;
        JvBuf b;
        jv_buf_init(&b, c);
        for (int64_t i = 0; rc == MN_OK && i < times; i++) rc = jv_buf_put(&b, s->data, s->len);
        return jv_buf_finish(&b, rc, s->is_safe, out);
    }
    const JvList *l = seq.as.l;
    if (l->n > 0 && (uint64_t)times > (uint64_t)(c->mem_limit / (l->n * sizeof(Jv)) + 1))
        return jv_fail(c, MN_ERANGE, "the template needs more than %zu bytes of memory", c->mem_limit);
    int rc = jv_charge(c, (uint64_t)times * l->n / 8);
    if (rc || (rc = jv_list_new(c, l->tag, (size_t)times * l->n, out))) return rc;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < l->n; k++)
            if ((rc = jv_list_push(c, *out, jv_retain(l->items[k])))) return rc;
    return MN_OK;
}

static int add_values(JvCtx *c, Jv a, Jv b, Jv *out) {
    if (a.kind == JV_STR && b.kind == JV_STR) {
        bool safe = a.as.s->is_safe || b.as.s->is_safe;
        JvBuf buf;
        jv_buf_init(&buf, c);
        int rc = MN_OK;
        for (int i = 0; rc == MN_OK && i < 2; i++) {
            const JvStr *s = i == 0 ? a.as.s : b.as.s;
            if (safe && !s->is_safe) rc = jv_escape_into(&buf, s->data, s->len);
            else rc = jv_buf_put(&buf, s->data, s->len);
        }
        return jv_buf_finish(&buf, rc, safe, out);
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && a.as.l->tag == b.as.l->tag &&
        (a.as.l->tag == JV_LIST_LIST || a.as.l->tag == JV_LIST_TUPLE)) {
        int rc = jv_list_new(c, a.as.l->tag, a.as.l->n + b.as.l->n, out);
        for (size_t i = 0; rc == MN_OK && i < a.as.l->n; i++) rc = jv_list_push(c, *out, jv_retain(a.as.l->items[i]));
        for (size_t i = 0; rc == MN_OK && i < b.as.l->n; i++) rc = jv_list_push(c, *out, jv_retain(b.as.l->items[i]));
        return rc;
    }
    if (a.kind == JV_STR && !(b.kind == JV_STR))
        return jv_fail(c, MN_EINVAL, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    if (a.kind == JV_LIST && (a.as.l->tag == JV_LIST_LIST || a.as.l->tag == JV_LIST_TUPLE))
        return jv_fail(c, MN_EINVAL, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a), jv_type_name(b),
                       jv_type_name(a));
    return unsupported_operands(c, JN_OP_ADD, a, b);
}

static int binop_impl(JvCtx *c, int op, Jv a, Jv b, Jv *out) {
    *out = jv_undef();
    if (op == JN_OP_CONCAT) {
        JvBuf buf;
        jv_buf_init(&buf, c);
        int rc = jv_str_of(c, a, &buf);
        if (rc == MN_OK) rc = jv_str_of(c, b, &buf);
        return jv_buf_finish(&buf, rc, false, out);
    }
    if (a.kind == JV_UNDEF) return fail_undefined(c, a);
    if (b.kind == JV_UNDEF) return fail_undefined(c, b);
    if (op == JN_OP_MOD && a.kind == JV_STR) {
        if (!a.as.s->is_safe) return js_percent(c, a.as.s, b, out);
        /* Markup % args escapes the arguments */
        Jv esc;
        int rc;
        if (b.kind == JV_LIST && b.as.l->tag == JV_LIST_TUPLE) {
            rc = jv_list_new(c, JV_LIST_TUPLE, b.as.l->n, &esc);
            for (size_t i = 0; rc == MN_OK && i < b.as.l->n; i++) {
                Jv e;
                rc = escape_value(c, b.as.l->items[i], &e);
                if (rc == MN_OK) rc = jv_list_push(c, esc, e);
            }
        } else if (b.kind == JV_DICT) {
            esc = jv_retain(b);
            rc = MN_OK;
        } else {
            rc = escape_value(c, b, &esc);
        }
        if (rc == MN_OK) rc = js_percent(c, a.as.s, esc, out);
        jv_release(esc);
        if (rc == MN_OK) mark_safe(*out);
        return rc;
    }
    bool numbers = jv_is_number(a) && jv_is_number(b);
    if (op == JN_OP_ADD) {
        if (!numbers) return add_values(c, a, b, out);
    } else if (op == JN_OP_MUL && !numbers) {
        if ((a.kind == JV_STR || (a.kind == JV_LIST && (a.as.l->tag == JV_LIST_LIST || a.as.l->tag == JV_LIST_TUPLE))) && is_int(b))
            return repeat(c, a, as_int(b), out);
        if ((b.kind == JV_STR || (b.kind == JV_LIST && (b.as.l->tag == JV_LIST_LIST || b.as.l->tag == JV_LIST_TUPLE))) && is_int(a))
            return repeat(c, b, as_int(a), out);
        if (a.kind == JV_STR || b.kind == JV_STR || a.kind == JV_LIST || b.kind == JV_LIST)
            return jv_fail(c, MN_EINVAL, "can't multiply sequence by non-int of type '%s'",
                           jv_type_name(a.kind == JV_STR || a.kind == JV_LIST ? b : a));
        return unsupported_operands(c, op, a, b);
    }
    if (!numbers) return unsupported_operands(c, op, a, b);
    bool ints = is_int(a) && is_int(b);
    int64_t x = ints ? as_int(a) : 0, y = ints ? as_int(b) : 0, r;
    double fx = jv_as_double(a), fy = jv_as_double(b);
    switch (op) {
    case JN_OP_ADD:
        if (!ints) break;
        if (__builtin_add_overflow(x, y, &r)) return overflow(c);
        *out = jv_int(r);
        return MN_OK;
    case JN_OP_SUB:
        if (!ints) {
            *out = jv_float(fx - fy);
            return MN_OK;
        }
        if (__builtin_sub_overflow(x, y, &r)) return overflow(c);
        *out = jv_int(r);
        return MN_OK;
    case JN_OP_MUL:
        if (!ints) {
            *out = jv_float(fx * fy);
            return MN_OK;
        }
        if (__builtin_mul_overflow(x, y, &r)) return overflow(c);
        *out = jv_int(r);
        return MN_OK;
    case JN_OP_DIV:
        if (fy == 0.0) return jv_fail(c, MN_EINVAL, ints ? "division by zero" : "float division by zero");
        *out = jv_float(fx / fy);
        return MN_OK;
    case JN_OP_FLOORDIV:
    case JN_OP_MOD:
        if (ints) {
            if (y == 0) return jv_fail(c, MN_EINVAL, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                if (op == JN_OP_MOD) {
                    *out = jv_int(0);
                    return MN_OK;
                }
                return overflow(c);
            }
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            *out = jv_int(op == JN_OP_MOD ? m : q);
            return MN_OK;
        }
        if (fy == 0.0) return jv_fail(c, MN_EINVAL, op == JN_OP_MOD ? "float modulo" : "float floor division by zero");
        {
            double fd, m;
            float_divmod(fx, fy, &fd, &m);
            *out = jv_float(op == JN_OP_MOD ? m : fd);
        }
        return MN_OK;
    case JN_OP_POW:
        if (ints && y >= 0) {
            int64_t acc = 1, base = x;
            for (int64_t e = y; e > 0; e >>= 1) {
                if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) return overflow(c);
                if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow(c);
            }
            *out = jv_int(acc);
            return MN_OK;
        }
        if (fx == 0.0 && fy < 0) return jv_fail(c, MN_EINVAL, "0.0 cannot be raised to a negative power");
        if (fx < 0 && fy != floor(fy)) return jv_fail(c, MN_EUNSUPPORTED, "complex numbers are not supported");
        {
            double p = pow(fx, fy);
            if (isinf(p) && isfinite(fx) && isfinite(fy)) return jv_fail(c, MN_EINVAL, "(34, 'Numerical result out of range')");
            *out = jv_float(p);
        }
        return MN_OK;
    default: break;
    }
    /* JN_OP_ADD of floats */
    *out = jv_float(fx + fy);
    return MN_OK;
}

int jb_binop(JvCtx *c, int op, Jv a, Jv b, Jv *out) {
    return jv_clean_out(binop_impl(c, op, a, b, out), out);
}

int jb_unary(JvCtx *c, bool is_neg, Jv a, Jv *out) {
    *out = jv_undef();
    if (a.kind == JV_UNDEF) return fail_undefined(c, a);
    if (a.kind == JV_FLOAT) {
        *out = jv_float(is_neg ? -a.as.f : a.as.f);
        return MN_OK;
    }
    if (is_int(a)) {
        int64_t x = as_int(a);
        if (is_neg && x == INT64_MIN) return overflow(c);
        *out = jv_int(is_neg ? -x : x);
        return MN_OK;
    }
    return jv_fail(c, MN_EINVAL, "bad operand type for unary %c: '%s'", is_neg ? '-' : '+', jv_type_name(a));
}

/* ---- filters ---------------------------------------------------------------------------- */

typedef int (*FilterFn)(JvCtx *c, Jv v, const JvArgs *a, Jv *out);

/* jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0 (as
 * subscripts); with a default for undefined results when def is given. */
static int attr_get_impl(JvCtx *c, Jv item, Jv attribute, const Jv *def, Jv *out);
static int attr_get(JvCtx *c, Jv item, Jv attribute, const Jv *def, Jv *out) {
    return jv_clean_out(attr_get_impl(c, item, attribute, def, out), out);
}

static int attr_get_impl(JvCtx *c, Jv item, Jv attribute, const Jv *def, Jv *out) {
    *out = jv_retain(item);
    int rc = MN_OK;
    if (attribute.kind == JV_STR) {
        const char *s = attribute.as.s->data;
        size_t n = attribute.as.s->len, start = 0;
        for (size_t i = 0; rc == MN_OK && i <= n; i++) {
            if (i < n && s[i] != '.') continue;
            Jv key, next;
            bool digits = i > start;
            for (size_t k = start; k < i; k++) digits &= s[k] >= '0' && s[k] <= '9';
            if (digits) {
                int64_t v = 0;
                for (size_t k = start; k < i && v < INT64_MAX / 10 - 10; k++) v = v * 10 + (s[k] - '0');
                key = jv_int(v);
            } else if ((rc = jv_str_new(c, s + start, i - start, false, &key))) {
                break;
            }
            rc = jb_getitem(c, *out, key, &next);
            jv_release(key);
            jv_release(*out);
            *out = next;
            start = i + 1;
        }
    } else if (attribute.kind != JV_NONE && attribute.kind != JV_UNDEF) {
        Jv next;
        rc = jb_getitem(c, *out, attribute, &next);
        jv_release(*out);
        *out = next;
    }
    if (rc == MN_OK && def != NULL && out->kind == JV_UNDEF) {
        jv_release(*out);
        *out = jv_retain(*def);
    }
    return rc;
}

/* jinja2's ignore_case: strings lowered for case-insensitive keys. */
static int ignore_case(JvCtx *c, Jv v, Jv *out) {
    if (v.kind == JV_STR) return js_case(c, v.as.s, JS_LOWER, out);
    *out = jv_retain(v);
    return MN_OK;
}

static int f_default(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"default_value", "boolean"};
    Jv p[2];
    bool has[2];
    int rc = jb_bind(c, "default", a, names, 2, p, has);
    if (rc) return rc;
    if (v.kind == JV_UNDEF || (has[1] && jv_truthy(p[1]) && !jv_truthy(v))) {
        if (has[0]) *out = jv_retain(p[0]);
        else rc = jv_str_new(c, "", 0, false, out);
        return rc;
    }
    *out = jv_retain(v);
    return MN_OK;
}

static int f_length(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    size_t n;
    int rc = want_pos(c, "length", a, 0, 0);
    if (rc || (rc = jv_len(c, v, &n))) return rc;
    *out = jv_int((int64_t)n);
    return MN_OK;
}

static int f_string(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "string", a, 0, 0);
    return rc ? rc : soft_str(c, v, out);
}

static int f_trim(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"chars"};
    Jv p[1];
    bool has[1];
    int rc = jb_bind(c, "trim", a, names, 1, p, has);
    if (rc) return rc;
    Jv s;
    if ((rc = soft_str(c, v, &s))) return rc;
    JvArgs ma = {p, has[0] ? 1 : 0, NULL, NULL, 0};
    Jv m;
    rc = method_of(c, s, "strip", 5, &m);
    if (rc == MN_OK) rc = jb_call(c, m, &ma, out);
    jv_release(m);
    jv_release(s);
    return rc;
}

/* A filter that is str(value).method() (Markup's rules included). */
static int str_method_filter(JvCtx *c, Jv v, const JvArgs *a, const char *method, const JvArgs *margs, Jv *out) {
    int rc = want_pos(c, method, a, 0, 0);
    if (rc) return rc;
    Jv s, m;
    if ((rc = soft_str(c, v, &s))) return rc;
    rc = method_of(c, s, method, strlen(method), &m);
    if (rc == MN_OK) rc = jb_call(c, m, margs, out);
    jv_release(m);
    jv_release(s);
    return rc;
}

static const JvArgs NO_ARGS = {NULL, 0, NULL, NULL, 0};
static int f_upper(JvCtx *c, Jv v, const JvArgs *a, Jv *o) { return str_method_filter(c, v, a, "upper", &NO_ARGS, o); }
static int f_lower(JvCtx *c, Jv v, const JvArgs *a, Jv *o) { return str_method_filter(c, v, a, "lower", &NO_ARGS, o); }
static int f_capitalize(JvCtx *c, Jv v, const JvArgs *a, Jv *o) {
    return str_method_filter(c, v, a, "capitalize", &NO_ARGS, o);
}

static int f_center(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"width"};
    Jv p[1];
    bool has[1];
    int rc = jb_bind(c, "center", a, names, 1, p, has);
    if (rc) return rc;
    Jv w = has[0] ? p[0] : jv_int(80);
    JvArgs ma = {&w, 1, NULL, NULL, 0};
    return str_method_filter(c, v, &NO_ARGS, "center", &ma, out);
}

/* jinja2's do_title: every run of word or separator characters (separators
 * are "-", whitespace, "(", "{", "[" and "<") gets its first character
 * upper-cased and the rest lower-cased. */
static bool title_sep(uint32_t cp) { return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_is_space(cp); }

static int f_title(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "title", a, 0, 0);
    if (rc) return rc;
    Jv s;
    if ((rc = soft_str(c, v, &s))) return rc;
    const JvStr *str = s.as.s;
    JvBuf b;
    jv_buf_init(&b, c);
    size_t i = 0;
    while (rc == MN_OK && i < str->len) {
        size_t len;
        bool sep = title_sep(js_decode(str->data, str->len, i, &len));
        size_t j = i + len;
        while (j < str->len) {
            size_t l2;
            if (title_sep(js_decode(str->data, str->len, j, &l2)) != sep) break;
            j += l2;
        }
        Jv first, rest, up = jv_undef(), low;
        rc = jv_str_new(c, str->data + i, len, false, &first);
        if (rc) break;
        rc = jv_str_new(c, str->data + i + len, j - i - len, false, &rest);
        if (rc == MN_OK) rc = js_case(c, first.as.s, JS_UPPER, &up);
        if (rc == MN_OK) {
            rc = js_case(c, rest.as.s, JS_LOWER, &low);
            if (rc == MN_OK) {
                rc = jv_buf_put(&b, up.as.s->data, up.as.s->len);
                if (rc == MN_OK) rc = jv_buf_put(&b, low.as.s->data, low.as.s->len);
                jv_release(low);
            }
            jv_release(up);
        }
        jv_release(first);
        jv_release(rest);
        i = j;
    }
    jv_release(s);
    return jv_buf_finish(&b, rc, false, out);
}

static int f_replace(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"old", "new", "count"};
    Jv p[3];
    bool has[3];
    int rc = jb_bind(c, "replace", a, names, 3, p, has);
    if (rc) return rc;
    if (!has[0] || !has[1]) return jv_fail(c, MN_EINVAL, "do_replace() missing required argument '%s'", has[0] ? "new" : "old");
    int64_t count = -1;
    if (has[2] && p[2].kind != JV_NONE && (rc = want_int(c, p[2], NULL, &count))) return rc;
    Jv s, o, n;
    if ((rc = jv_to_str(c, v, &s))) return rc;
    if ((rc = jv_to_str(c, p[0], &o))) {
        jv_release(s);
        return rc;
    }
    if ((rc = jv_to_str(c, p[1], &n)) == MN_OK) {
        rc = js_replace(c, s.as.s, o.as.s, n.as.s, count, out);
        jv_release(n);
    }
    jv_release(o);
    jv_release(s);
    return rc;
}

static int f_join(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"d", "attribute"};
    Jv p[2];
    bool has[2];
    int rc = jb_bind(c, "join", a, names, 2, p, has);
    if (rc) return rc;
    Jv items;
    if ((rc = jv_iterate(c, v, &items))) return rc;
    JvBuf b;
    jv_buf_init(&b, c);
    Jv sep = jv_undef();
    if (has[0]) rc = jv_to_str(c, p[0], &sep);
    for (size_t i = 0; rc == MN_OK && i < items.as.l->n; i++) {
        if (i > 0 && has[0]) rc = jv_buf_put(&b, sep.as.s->data, sep.as.s->len);
        if (rc) break;
        if (has[1] && p[1].kind != JV_NONE) {
            Jv item;
            if ((rc = attr_get(c, items.as.l->items[i], p[1], NULL, &item))) break;
            rc = jv_str_of(c, item, &b);
            jv_release(item);
        } else {
            rc = jv_str_of(c, items.as.l->items[i], &b);
        }
    }
    jv_release(sep);
    jv_release(items);
    return jv_buf_finish(&b, rc, false, out);
}

static int f_first(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "first", a, 0, 0);
    if (rc) return rc;
    if (v.kind == JV_LIST && v.as.l->tag == JV_LIST_GEN) { /* next(iter(g)): one item consumed */
        bool got;
        if ((rc = jv_gen_next(c, v, out, &got))) return rc;
        if (!got) *out = jv_undef_msg(c, false, "No first item, sequence was empty.");
        return MN_OK;
    }
    Jv items;
    if ((rc = jv_iterate(c, v, &items))) return rc;
    if (items.as.l->n > 0) *out = jv_retain(items.as.l->items[0]);
    else *out = jv_undef_msg(c, false, "No first item, sequence was empty.");
    jv_release(items);
    return MN_OK;
}

static int f_last(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "last", a, 0, 0);
    if (rc) return rc;
    if (v.kind == JV_LIST && v.as.l->tag == JV_LIST_GEN)
        return jv_fail(c, MN_EINVAL, "'generator' object is not reversible");
    if (v.kind != JV_LIST && v.kind != JV_DICT && v.kind != JV_STR && v.kind != JV_UNDEF)
        return jv_fail(c, MN_EINVAL, "'%s' object is not reversible", jv_type_name(v));
    Jv items;
    if ((rc = jv_iterate(c, v, &items))) return rc;
    if (items.as.l->n > 0) *out = jv_retain(items.as.l->items[items.as.l->n - 1]);
    else *out = jv_undef_msg(c, false, "No last item, sequence was empty.");
    jv_release(items);
    return MN_OK;
}

/* jinja2's do_items is a generator too: the mapping check comes when it
 * is first asked for an item. */
typedef struct ItemsGen {
    JvGen g;
    Jv dict;
    size_t pos;
    bool is_started;
} ItemsGen;

static int items_next(JvCtx *c, JvGen *g, Jv *item, bool *got) {
    ItemsGen *ig = (ItemsGen *)g;
    if (!ig->is_started) {
        ig->is_started = true;
        if (ig->dict.kind == JV_UNDEF) return MN_OK;
        if (ig->dict.kind != JV_DICT) return jv_fail(c, MN_EINVAL, "Can only get item pairs from a mapping.");
    }
    if (ig->dict.kind != JV_DICT || ig->pos >= ig->dict.as.d->n) return MN_OK;
    const JvEntry *e = &ig->dict.as.d->ents[ig->pos++];
    int rc = jv_list_new(c, JV_LIST_TUPLE, 2, item);
    if (rc == MN_OK) rc = jv_list_push(c, *item, jv_retain(e->key));
    if (rc == MN_OK) rc = jv_list_push(c, *item, jv_retain(e->val));
    *got = rc == MN_OK;
    return rc;
}

static void items_free(JvGen *g) { jv_release(((ItemsGen *)g)->dict); }

static const JvGenType ITEMS_GEN = {items_next, items_free};

static int f_items(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "items", a, 0, 0);
    JvGen *g;
    if (rc || (rc = jv_gen_new(c, &ITEMS_GEN, sizeof(ItemsGen), jv_undef(), out, &g))) return rc;
    ((ItemsGen *)g)->dict = jv_retain(v);
    return MN_OK;
}

static int f_list(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "list", a, 0, 0);
    return rc ? rc : to_list(c, v, out);
}

/* Arguments kept by a generator until it runs: positional ones from off
 * on, and the keywords (values retained; keyword names are borrowed, as
 * they come from the template's tree or from literals). */
typedef struct ArgsCopy {
    Jv *vals;
    const char **names;
    size_t n_vals, vals_cap, names_cap;
    JvArgs args;
} ArgsCopy;

static int args_copy(JvCtx *c, const JvArgs *a, size_t off, ArgsCopy *dst) {
    size_t n_pos = a->n_pos > off ? a->n_pos - off : 0, n = n_pos + a->n_kw;
    dst->n_vals = 0;
    dst->vals_cap = n ? n : 1;
    dst->names_cap = a->n_kw ? a->n_kw : 1;
    dst->vals = jv_mem_alloc(c, dst->vals_cap * sizeof(Jv));
    dst->names = jv_mem_alloc(c, dst->names_cap * sizeof(char *));
    if (dst->vals == NULL || dst->names == NULL) return c->err_code;
    for (size_t i = 0; i < n_pos; i++) dst->vals[dst->n_vals++] = jv_retain(a->pos[off + i]);
    for (size_t i = 0; i < a->n_kw; i++) {
        dst->vals[dst->n_vals++] = jv_retain(a->kw_vals[i]);
        dst->names[i] = a->kw_names[i];
    }
    dst->args = (JvArgs){dst->vals, n_pos, dst->names, dst->vals + n_pos, a->n_kw};
    return MN_OK;
}

static void args_free(JvCtx *c, ArgsCopy *a) {
    for (size_t i = 0; i < a->n_vals; i++) jv_release(a->vals[i]);
    jv_mem_free(c, a->vals, a->vals_cap * sizeof(Jv));
    jv_mem_free(c, a->names, a->names_cap * sizeof(char *));
    a->vals = NULL;
    a->names = NULL;
    a->n_vals = 0;
}

/* The test (or plain truth) select/reject apply: args from index off on
 * are the test's name and its arguments. */
static int select_test(JvCtx *c, Jv item, const JvArgs *a, size_t off, bool *keep) {
    if (a->n_pos <= off) {
        *keep = jv_truthy(item);
        return MN_OK;
    }
    Jv name = a->pos[off];
    if (!is_str(name)) return jv_fail(c, MN_EINVAL, "a test name must be a string, not %s", jv_type_name(name));
    int id = jb_test_find(name.as.s->data, name.as.s->len);
    if (id == JB_UNKNOWN) return jv_fail(c, MN_EINVAL, "No test named '%s'.", name.as.s->data);
    if (id == JB_UNSUPPORTED) return jv_fail(c, MN_EUNSUPPORTED, "the test '%s' is not supported", name.as.s->data);
    JvArgs ta = {a->pos + off + 1, a->n_pos - off - 1, a->kw_names, a->kw_vals, a->n_kw};
    return jb_test_apply(c, id, item, &ta, keep);
}

/* jinja2's select_or_reject: `if value:` then the items that pass (or
 * fail) the test, evaluated as they are asked for. */
typedef struct SelectGen {
    JvGen g;
    JvIter it;
    ArgsCopy args; /* the attribute (selectattr), the test's name and arguments */
    bool by_attr, reject, is_started;
} SelectGen;

static int select_next(JvCtx *c, JvGen *g, Jv *item, bool *got) {
    SelectGen *sg = (SelectGen *)g;
    if (!sg->is_started) {
        sg->is_started = true;
        if (!jv_truthy(sg->it.src)) return MN_OK; /* `if value:` */
        if (sg->by_attr && sg->args.args.n_pos == 0) return jv_fail(c, MN_EINVAL, "Missing parameter for attribute name");
    }
    for (;;) {
        Jv cand;
        int rc = jv_iter_next(c, &sg->it, &cand, got);
        if (rc || !*got) return rc;
        Jv probe;
        if (sg->by_attr) rc = attr_get(c, cand, sg->args.args.pos[0], NULL, &probe);
        else probe = jv_retain(cand);
        bool keep = false;
        if (rc == MN_OK) {
            rc = select_test(c, probe, &sg->args.args, sg->by_attr ? 1 : 0, &keep);
            jv_release(probe);
        }
        if (rc == MN_OK && keep != sg->reject) {
            *item = cand;
            return MN_OK;
        }
        jv_release(cand);
        *got = false;
        if (rc) return rc;
    }
}

static void select_free(JvGen *g) {
    SelectGen *sg = (SelectGen *)g;
    jv_iter_deinit(&sg->it);
    args_free(g->ctx, &sg->args);
}

static const JvGenType SELECT_GEN = {select_next, select_free};

static int select_common(JvCtx *c, Jv v, const JvArgs *a, bool by_attr, bool reject, Jv *out) {
    JvGen *g;
    int rc = jv_gen_new(c, &SELECT_GEN, sizeof(SelectGen), v, out, &g);
    if (rc) return rc;
    SelectGen *sg = (SelectGen *)g;
    jv_iter_init(&sg->it, v);
    sg->by_attr = by_attr;
    sg->reject = reject;
    return args_copy(c, a, 0, &sg->args);
}
static int f_select(JvCtx *c, Jv v, const JvArgs *a, Jv *o) { return select_common(c, v, a, false, false, o); }
static int f_reject(JvCtx *c, Jv v, const JvArgs *a, Jv *o) { return select_common(c, v, a, false, true, o); }
static int f_selectattr(JvCtx *c, Jv v, const JvArgs *a, Jv *o) { return select_common(c, v, a, true, false, o); }
static int f_rejectattr(JvCtx *c, Jv v, const JvArgs *a, Jv *o) { return select_common(c, v, a, true, true, o); }

/* jinja2's do_map: `if value:`, then each item through a filter (by name,
 * with arguments) or an attribute lookup (with a default). */
typedef struct MapGen {
    JvGen g;
    JvIter it;
    ArgsCopy args; /* all of map's arguments */
    bool is_started;
    int id;        /* the filter, or -1 for an attribute */
    Jv attribute, def;
    bool has_def;
} MapGen;

/* prepare_map: what to apply, decided when the generator starts. */
static int map_prepare(JvCtx *c, MapGen *mg) {
    const JvArgs *a = &mg->args.args;
    mg->id = -1;
    mg->attribute = mg->def = jv_none();
    if (a->n_pos == 0) {
        bool by_attr = false;
        for (size_t k = 0; k < a->n_kw; k++) {
            if (strcmp(a->kw_names[k], "attribute") == 0) mg->attribute = a->kw_vals[k], by_attr = true;
            else if (strcmp(a->kw_names[k], "default") == 0) mg->def = a->kw_vals[k], mg->has_def = true;
            else return jv_fail(c, MN_EINVAL, "Unexpected keyword argument '%s'", a->kw_names[k]);
        }
        if (!by_attr) return jv_fail(c, MN_EINVAL, "map requires a filter argument");
        return MN_OK;
    }
    Jv name = a->pos[0];
    if (!is_str(name)) return jv_fail(c, MN_EINVAL, "a filter name must be a string, not %s", jv_type_name(name));
    mg->id = jb_filter_find(name.as.s->data, name.as.s->len);
    if (mg->id == JB_UNKNOWN) return jv_fail(c, MN_EINVAL, "No filter named '%s'.", name.as.s->data);
    if (mg->id == JB_UNSUPPORTED) return jv_fail(c, MN_EUNSUPPORTED, "the filter '%s' is not supported", name.as.s->data);
    return MN_OK;
}

static int map_next(JvCtx *c, JvGen *g, Jv *item, bool *got) {
    MapGen *mg = (MapGen *)g;
    if (!mg->is_started) {
        mg->is_started = true;
        if (!jv_truthy(mg->it.src)) return MN_OK;
        int rc = map_prepare(c, mg);
        if (rc) return rc;
    }
    Jv x;
    int rc = jv_iter_next(c, &mg->it, &x, got);
    if (rc || !*got) return rc;
    if (mg->id < 0) {
        rc = attr_get(c, x, mg->attribute, mg->has_def ? &mg->def : NULL, item);
    } else {
        const JvArgs *a = &mg->args.args;
        JvArgs fa = {a->pos + 1, a->n_pos - 1, a->kw_names, a->kw_vals, a->n_kw};
        rc = jb_filter_apply(c, mg->id, x, &fa, item);
    }
    jv_release(x);
    if (rc) *got = false;
    return rc;
}

static void map_free(JvGen *g) {
    MapGen *mg = (MapGen *)g;
    jv_iter_deinit(&mg->it);
    args_free(g->ctx, &mg->args);
}

static const JvGenType MAP_GEN = {map_next, map_free};

static int f_map(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    JvGen *g;
    int rc = jv_gen_new(c, &MAP_GEN, sizeof(MapGen), v, out, &g);
    if (rc) return rc;
    MapGen *mg = (MapGen *)g;
    jv_iter_init(&mg->it, v);
    return args_copy(c, a, 0, &mg->args);
}

/* indent: s must be a str, as jinja2's `s += "\n"` needs. */
static int f_indent(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"width", "first", "blank"};
    Jv p[3];
    bool has[3];
    int rc = jb_bind(c, "indent", a, names, 3, p, has);
    if (rc) return rc;
    if (v.kind == JV_UNDEF) return fail_undefined(c, v);
    if (v.kind != JV_STR)
        return jv_fail(c, MN_EINVAL, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
    bool safe = v.as.s->is_safe;
    Jv ind;
    if (has[0] && p[0].kind == JV_STR) {
        rc = jv_str_new(c, p[0].as.s->data, p[0].as.s->len, false, &ind);
    } else {
        int64_t w = 4;
        if (has[0] && (rc = want_int(c, p[0], NULL, &w))) {
            return jv_fail(c, MN_EINVAL, "can't multiply sequence by non-int of type '%s'", jv_type_name(p[0]));
        }
        Jv sp;
        if ((rc = jv_str_new(c, " ", 1, false, &sp))) return rc;
        rc = repeat(c, sp, w, &ind);
        jv_release(sp);
    }
    if (rc) return rc;
    /* a Markup s makes the indention Markup too: nothing is escaped */
    bool first = has[1] && jv_truthy(p[1]), blank = has[2] && jv_truthy(p[2]);
    Jv lines;
    JvBuf tmp;
    jv_buf_init(&tmp, c);
    rc = jv_buf_put(&tmp, v.as.s->data, v.as.s->len);
    if (rc == MN_OK) rc = jv_buf_put(&tmp, "\n", 1);
    Jv withnl;
    if (rc == MN_OK) rc = jv_buf_take(&tmp, false, &withnl);
    else jv_buf_deinit(&tmp);
    if (rc) {
        jv_release(ind);
        return rc;
    }
    rc = js_splitlines(c, withnl.as.s, false, &lines);
    jv_release(withnl);
    JvBuf b;
    jv_buf_init(&b, c);
    if (rc == MN_OK && first) rc = jv_buf_put(&b, ind.as.s->data, ind.as.s->len);
    for (size_t i = 0; rc == MN_OK && i < lines.as.l->n; i++) {
        const JvStr *line = lines.as.l->items[i].as.s;
        if (i > 0) {
            rc = jv_buf_put(&b, "\n", 1);
            if (rc == MN_OK && (blank || line->len > 0)) rc = jv_buf_put(&b, ind.as.s->data, ind.as.s->len);
        }
        if (rc == MN_OK) rc = jv_buf_put(&b, line->data, line->len);
    }
    if (lines.kind == JV_LIST) jv_release(lines);
    jv_release(ind);
    return jv_buf_finish(&b, rc, safe, out);
}

static int f_int(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"default", "base"};
    Jv p[2];
    bool has[2];
    int rc = jb_bind(c, "int", a, names, 2, p, has);
    if (rc) return rc;
    int64_t base = 10;
    if (has[1] && (rc = want_int(c, p[1], NULL, &base))) return rc;
    if (v.kind == JV_UNDEF) return fail_undefined(c, v); /* Undefined.__int__ raises */
    int64_t i = 0;
    double f;
    if (is_int(v)) {
        *out = jv_int(as_int(v));
        return MN_OK;
    }
    if (v.kind == JV_STR) {
        rc = js_parse_int(v.as.s, (int)base, &i);
        if (rc == MN_OK) {
            *out = jv_int(i);
            return MN_OK;
        }
        if (rc == MN_ERANGE) return jv_fail(c, MN_EUNSUPPORTED, "integer too large (mnemo's integers are 64-bit)");
        if (js_parse_float(v.as.s, &f) != MN_OK) goto fallback;
    } else if (v.kind == JV_FLOAT) {
        f = v.as.f;
    } else {
        goto fallback;
    }
    if (isnan(f)) goto fallback;
    if (isinf(f)) return jv_fail(c, MN_EINVAL, "cannot convert float infinity to integer");
    if (fabs(f) >= 9.2e18) return jv_fail(c, MN_EUNSUPPORTED, "integer too large (mnemo's integers are 64-bit)");
    *out = jv_int((int64_t)f);
    return MN_OK;
fallback:
    *out = has[0] ? jv_retain(p[0]) : jv_int(0);
    return MN_OK;
}

static int f_float(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"default"};
    Jv p[1];
    bool has[1];
    int rc = jb_bind(c, "float", a, names, 1, p, has);
    if (rc) return rc;
    if (v.kind == JV_UNDEF) return fail_undefined(c, v); /* Undefined.__float__ raises */
    double f;
    if (jv_is_number(v)) {
        *out = jv_float(jv_as_double(v));
        return MN_OK;
    }
    if (v.kind == JV_STR && js_parse_float(v.as.s, &f) == MN_OK) {
        *out = jv_float(f);
        return MN_OK;
    }
    *out = has[0] ? jv_retain(p[0]) : jv_float(0.0);
    return MN_OK;
}

static int f_abs(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "abs", a, 0, 0);
    if (rc) return rc;
    if (v.kind == JV_FLOAT) *out = jv_float(fabs(v.as.f));
    else if (is_int(v)) {
        if (as_int(v) == INT64_MIN) return overflow(c);
        *out = jv_int(as_int(v) < 0 ? -as_int(v) : as_int(v));
    } else return jv_fail(c, MN_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
    return MN_OK;
}

static int f_round(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"precision", "method"};
    Jv p[2];
    bool has[2];
    int rc = jb_bind(c, "round", a, names, 2, p, has);
    if (rc) return rc;
    int64_t prec = 0;
    if (has[0] && (rc = want_int(c, p[0], NULL, &prec))) return rc;
    const char *method = "common";
    if (has[1]) {
        if (!is_str(p[1]) || (strcmp(p[1].as.s->data, "common") && strcmp(p[1].as.s->data, "ceil") &&
                              strcmp(p[1].as.s->data, "floor")))
            return jv_fail(c, MN_EINVAL, "method must be common, ceil or floor");
        method = p[1].as.s->data;
    }
    if (!jv_is_number(v)) return jv_fail(c, MN_EINVAL, "type %s doesn't define __round__ method", jv_type_name(v));
    if (prec > 400) prec = 400;
    if (prec < -400) prec = -400;
    double x = jv_as_double(v);
    if (strcmp(method, "common") == 0) {
        if (is_int(v)) {
            if (prec >= 0) {
                *out = jv_int(as_int(v));
                return MN_OK;
            }
            double p10 = pow(10.0, (double)-prec);
            *out = jv_int((int64_t)(rint((double)as_int(v) / p10) * p10));
            return MN_OK;
        }
        if (!isfinite(x)) {
            *out = jv_float(x);
            return MN_OK;
        }
        if (prec >= 0) {
            char buf[512];
            snprintf(buf, sizeof buf, "%.*f", (int)(prec > 300 ? 300 : prec), x);
            *out = jv_float(strtod(buf, NULL));
        } else {
            double p10 = pow(10.0, (double)-prec);
            *out = jv_float(rint(x / p10) * p10);
        }
        return MN_OK;
    }
    double p10 = pow(10.0, (double)prec);
    double r = strcmp(method, "ceil") == 0 ? ceil(x * p10) : floor(x * p10);
    *out = jv_float(r / p10);
    return MN_OK;
}

static int f_safe(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "safe", a, 0, 0);
    if (rc) return rc;
    if (v.kind == JV_STR && v.as.s->is_safe) {
        *out = jv_retain(v);
        return MN_OK;
    }
    JvBuf b;
    jv_buf_init(&b, c);
    return jv_buf_finish(&b, jv_str_of(c, v, &b), true, out);
}

static int f_escape(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "escape", a, 0, 0);
    return rc ? rc : escape_value(c, v, out);
}

/* Stable merge sort of items by keys (jv_cmp; descending when reverse). */
static int sort_by_keys(JvCtx *c, Jv *items, Jv *keys, size_t n, bool reverse) {
    if (n < 2) return MN_OK;
    Jv *ti = jv_mem_alloc(c, n * sizeof(Jv)), *tk = jv_mem_alloc(c, n * sizeof(Jv));
    int rc = ti && tk ? jv_charge(c, n * 8) : c->err_code;
    for (size_t width = 1; rc == MN_OK && width < n; width *= 2) {
        for (size_t lo = 0; rc == MN_OK && lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int r;
                /* take from the right only when it sorts strictly before */
                rc = reverse ? jv_cmp(c, keys[i], keys[j], "<", &r) : jv_cmp(c, keys[j], keys[i], "<", &r);
                if (rc) break;
                bool right = r == -1;
                size_t from = right ? j++ : i++;
                ti[k] = items[from];
                tk[k++] = keys[from];
            }
            if (rc) break;
            while (i < mid) ti[k] = items[i], tk[k++] = keys[i++];
            while (j < hi) ti[k] = items[j], tk[k++] = keys[j++];
            memcpy(items + lo, ti + lo, (hi - lo) * sizeof(Jv));
            memcpy(keys + lo, tk + lo, (hi - lo) * sizeof(Jv));
        }
    }
    jv_mem_free(c, ti, ti ? n * sizeof(Jv) : 0);
    jv_mem_free(c, tk, tk ? n * sizeof(Jv) : 0);
    return rc;
}

/* The sort key of item: its attribute(s) (comma-separated names make a list
 * of keys), lowered unless case_sensitive. */
static int sort_key_impl(JvCtx *c, Jv item, Jv attribute, bool case_sensitive, Jv *out);
static int sort_key(JvCtx *c, Jv item, Jv attribute, bool case_sensitive, Jv *out) {
    *out = jv_undef();
    return jv_clean_out(sort_key_impl(c, item, attribute, case_sensitive, out), out);
}

static int sort_key_impl(JvCtx *c, Jv item, Jv attribute, bool case_sensitive, Jv *out) {
    if (attribute.kind == JV_STR && memchr(attribute.as.s->data, ',', attribute.as.s->len)) {
        int rc = jv_list_new(c, JV_LIST_LIST, 0, out);
        const char *s = attribute.as.s->data;
        size_t n = attribute.as.s->len, start = 0;
        for (size_t i = 0; rc == MN_OK && i <= n; i++) {
            if (i < n && s[i] != ',') continue;
            Jv part, got, key;
            rc = jv_str_new(c, s + start, i - start, false, &part);
            if (rc) break;
            rc = attr_get(c, item, part, NULL, &got);
            jv_release(part);
            if (rc) break;
            rc = case_sensitive ? (key = jv_retain(got), MN_OK) : ignore_case(c, got, &key);
            jv_release(got);
            if (rc == MN_OK) rc = jv_list_push(c, *out, key);
            start = i + 1;
        }
        return rc;
    }
    Jv got;
    int rc = attr_get(c, item, attribute, NULL, &got);
    if (rc) return rc;
    if (case_sensitive) {
        *out = got;
        return MN_OK;
    }
    rc = ignore_case(c, got, out);
    jv_release(got);
    return rc;
}

static int sorted_list(JvCtx *c, Jv v, Jv attribute, bool case_sensitive, bool reverse, int by_pos, Jv *out) {
    int rc = to_list(c, v, out);
    if (rc) return rc;
    JvList *l = out->as.l;
    Jv *keys = jv_mem_alloc(c, (l->n ? l->n : 1) * sizeof(Jv));
    if (keys == NULL) return c->err_code;
    size_t made = 0;
    for (; rc == MN_OK && made < l->n; made++) {
        Jv item = l->items[made];
        if (by_pos >= 0) rc = case_sensitive ? (keys[made] = jv_retain(item.as.l->items[by_pos]), MN_OK)
                                             : ignore_case(c, item.as.l->items[by_pos], &keys[made]);
        else rc = sort_key(c, item, attribute, case_sensitive, &keys[made]);
        if (rc) break;
    }
    if (rc == MN_OK) rc = sort_by_keys(c, l->items, keys, l->n, reverse);
    for (size_t i = 0; i < made; i++) jv_release(keys[i]);
    jv_mem_free(c, keys, (l->n ? l->n : 1) * sizeof(Jv));
    return rc;
}

static int f_sort(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
    Jv p[3];
    bool has[3];
    int rc = jb_bind(c, "sort", a, names, 3, p, has);
    if (rc) return rc;
    return sorted_list(c, v, has[2] ? p[2] : jv_none(), has[1] && jv_truthy(p[1]), has[0] && jv_truthy(p[0]), -1, out);
}

static int f_dictsort(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"case_sensitive", "by", "reverse"};
    Jv p[3];
    bool has[3];
    int rc = jb_bind(c, "dictsort", a, names, 3, p, has);
    if (rc) return rc;
    int pos = 0;
    if (has[1]) {
        if (is_str(p[1]) && strcmp(p[1].as.s->data, "key") == 0) pos = 0;
        else if (is_str(p[1]) && strcmp(p[1].as.s->data, "value") == 0) pos = 1;
        else return jv_fail(c, MN_EINVAL, "You can only sort by either 'key' or 'value'");
    }
    if (v.kind == JV_UNDEF) return fail_undefined(c, v);
    if (v.kind != JV_DICT) return jv_fail(c, MN_EINVAL, "'%s' object has no attribute 'items'", jv_type_name(v));
    Jv items = jv_undef();
    if ((rc = jv_clean_out(dict_view(c, v, &NO_ARGS, JV_LIST_ITEMS, "items", &items), &items))) return rc;
    items.as.l->tag = JV_LIST_LIST;
    rc = sorted_list(c, items, jv_none(), has[0] && jv_truthy(p[0]), has[2] && jv_truthy(p[2]), pos, out);
    jv_release(items);
    return rc;
}

/* jinja2's do_unique: the items whose key (attribute, lowered unless
 * case_sensitive) was not seen before, as they are asked for. */
typedef struct UniqueGen {
    JvGen g;
    JvIter it;
    Jv seen; /* a dict of the keys */
    Jv attribute;
    bool case_sensitive;
} UniqueGen;

static int unique_next(JvCtx *c, JvGen *g, Jv *item, bool *got) {
    UniqueGen *ug = (UniqueGen *)g;
    for (;;) {
        Jv x, key;
        int rc = jv_iter_next(c, &ug->it, &x, got);
        if (rc || !*got) return rc;
        if ((rc = sort_key(c, x, ug->attribute, ug->case_sensitive, &key)) == MN_OK) {
            bool fresh = jv_dict_get(ug->seen.as.d, key) == NULL;
            if (fresh) rc = jv_dict_set(c, ug->seen, key, jv_none());
            jv_release(key);
            if (rc == MN_OK && fresh) {
                *item = x;
                return MN_OK;
            }
        }
        jv_release(x);
        *got = false;
        if (rc) return rc;
    }
}

static void unique_free(JvGen *g) {
    UniqueGen *ug = (UniqueGen *)g;
    jv_iter_deinit(&ug->it);
    jv_release(ug->seen);
    jv_release(ug->attribute);
}

static const JvGenType UNIQUE_GEN = {unique_next, unique_free};

static int f_unique(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    Jv p[2];
    bool has[2];
    int rc = jb_bind(c, "unique", a, names, 2, p, has);
    JvGen *g;
    if (rc || (rc = jv_gen_new(c, &UNIQUE_GEN, sizeof(UniqueGen), v, out, &g))) return rc;
    UniqueGen *ug = (UniqueGen *)g;
    jv_iter_init(&ug->it, v);
    ug->attribute = has[1] ? jv_retain(p[1]) : jv_none();
    ug->case_sensitive = has[0] && jv_truthy(p[0]);
    ug->seen = jv_undef();
    return jv_dict_new(c, &ug->seen);
}

static int min_max(JvCtx *c, Jv v, const JvArgs *a, bool want_max, Jv *out) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    Jv p[2];
    bool has[2];
    int rc = jb_bind(c, want_max ? "max" : "min", a, names, 2, p, has);
    if (rc) return rc;
    Jv items;
    if ((rc = jv_iterate(c, v, &items))) return rc;
    if (items.as.l->n == 0) {
        jv_release(items);
        *out = jv_undef_msg(c, false, "No aggregated item, sequence was empty.");
        return MN_OK;
    }
    size_t best = 0;
    Jv best_key;
    rc = sort_key(c, items.as.l->items[0], has[1] ? p[1] : jv_none(), has[0] && jv_truthy(p[0]), &best_key);
    for (size_t i = 1; rc == MN_OK && i < items.as.l->n; i++) {
        Jv key;
        if ((rc = sort_key(c, items.as.l->items[i], has[1] ? p[1] : jv_none(), has[0] && jv_truthy(p[0]), &key))) break;
        int r;
        rc = want_max ? jv_cmp(c, best_key, key, "<", &r) : jv_cmp(c, key, best_key, "<", &r);
        if (rc == MN_OK && r == -1) {
            jv_release(best_key);
            best_key = key;
            best = i;
        } else {
            jv_release(key);
        }
    }
    if (rc == MN_OK) *out = jv_retain(items.as.l->items[best]);
    jv_release(best_key);
    jv_release(items);
    return rc;
}
static int f_min(JvCtx *c, Jv v, const JvArgs *a, Jv *o) { return min_max(c, v, a, false, o); }
static int f_max(JvCtx *c, Jv v, const JvArgs *a, Jv *o) { return min_max(c, v, a, true, o); }

static int f_sum(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"attribute", "start"};
    Jv p[2];
    bool has[2];
    int rc = jb_bind(c, "sum", a, names, 2, p, has);
    if (rc) return rc;
    if (has[1] && p[1].kind == JV_STR) return jv_fail(c, MN_EINVAL, "sum() can't sum strings [use ''.join(seq) instead]");
    Jv items;
    if ((rc = jv_iterate(c, v, &items))) return rc;
    Jv acc = has[1] ? jv_retain(p[1]) : jv_int(0);
    for (size_t i = 0; rc == MN_OK && i < items.as.l->n; i++) {
        Jv item, next;
        if ((rc = attr_get(c, items.as.l->items[i], has[0] ? p[0] : jv_none(), NULL, &item))) break;
        rc = jb_binop(c, JN_OP_ADD, acc, item, &next);
        jv_release(item);
        if (rc) break;
        jv_release(acc);
        acc = next;
    }
    jv_release(items);
    if (rc) {
        jv_release(acc);
        return rc;
    }
    *out = acc;
    return MN_OK;
}

/* reversed(list): Python's list_reverseiterator, which reads the list
 * where it stands each time (an index from the end, checked against the
 * length now). */
typedef struct ReverseGen {
    JvGen g;
    Jv list;
    int64_t index;
} ReverseGen;

static int reverse_next(JvCtx *c, JvGen *g, Jv *item, bool *got) {
    ReverseGen *rg = (ReverseGen *)g;
    const JvList *l = rg->list.as.l;
    *got = rg->index >= 0 && rg->index < (int64_t)l->n;
    if (*got) *item = jv_retain(l->items[rg->index--]);
    else rg->index = -1;
    return MN_OK;
}

static void reverse_free(JvGen *g) { jv_release(((ReverseGen *)g)->list); }

static const JvGenType REVERSE_GEN = {reverse_next, reverse_free};

static int f_reverse(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "reverse", a, 0, 0);
    if (rc) return rc;
    if (v.kind == JV_STR) return jb_slice(c, v, jv_none(), jv_none(), jv_int(-1), out);
    if (v.kind == JV_LIST && v.as.l->tag != JV_LIST_GEN) {
        JvGen *g;
        if ((rc = jv_gen_new(c, &REVERSE_GEN, sizeof(ReverseGen), v, out, &g))) return rc;
        ReverseGen *rg = (ReverseGen *)g;
        rg->list = jv_retain(v);
        rg->index = (int64_t)v.as.l->n - 1;
        return MN_OK;
    }
    /* reversed() of a dict or Undefined (a snapshot: they do not change);
     * anything else is list()ed and reversed, or is not iterable at all */
    bool reversible = v.kind == JV_UNDEF || v.kind == JV_DICT;
    if (!reversible && v.kind != JV_LIST) return jv_fail(c, MN_EINVAL, "argument must be iterable");
    Jv items;
    if ((rc = jv_iterate(c, v, &items))) return rc;
    JvList *l = items.as.l;
    if ((rc = jv_list_new(c, reversible ? JV_LIST_GEN : JV_LIST_LIST, l->n, out)) == MN_OK)
        for (size_t i = l->n; rc == MN_OK && i-- > 0;) rc = jv_list_push(c, *out, jv_retain(l->items[i]));
    jv_release(items);
    return rc;
}

/* jinja2's attr: Python's getattr alone, so a dict's keys are not found
 * (its methods are). */
static int f_attr(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "attr", a, 1, 1);
    if (rc) return rc;
    Jv name;
    if ((rc = jv_to_str(c, a->pos[0], &name))) return rc;
    const char *n = name.as.s->data;
    size_t len = name.as.s->len;
    if (v.kind == JV_DICT) {
        if (is_dunder(n, len)) *out = unsafe_attr(c, v, n, len);
        else if ((rc = method_of(c, v, n, len, out)) == MN_ENOTFOUND) {
            *out = no_attribute(c, v, n, len);
            rc = MN_OK;
        }
    } else {
        rc = jb_getattr(c, v, n, len, out);
    }
    jv_release(name);
    return rc;
}

/* jinja2's do_batch: lists of linecount items, the last filled with
 * fill_with when given, as they are asked for. */
typedef struct BatchGen {
    JvGen g;
    JvIter it;
    int64_t n;
    Jv tmp, fill;
    bool has_fill;
} BatchGen;

static int batch_next(JvCtx *c, JvGen *g, Jv *item, bool *got) {
    BatchGen *bg = (BatchGen *)g;
    *got = false;
    for (;;) {
        Jv x;
        bool more;
        int rc = jv_iter_next(c, &bg->it, &x, &more);
        if (rc) return rc;
        if (!more) {
            if (bg->tmp.kind != JV_LIST || bg->tmp.as.l->n == 0) return MN_OK;
            if (bg->has_fill)
                while (rc == MN_OK && (int64_t)bg->tmp.as.l->n < bg->n) rc = jv_list_push(c, bg->tmp, jv_retain(bg->fill));
            if (rc) return rc;
            *item = bg->tmp;
            bg->tmp = jv_undef();
            *got = true;
            return MN_OK;
        }
        if (bg->tmp.kind != JV_LIST && (rc = jv_list_new(c, JV_LIST_LIST, 0, &bg->tmp))) {
            jv_release(x);
            return rc;
        }
        if ((int64_t)bg->tmp.as.l->n == bg->n) { /* full: hand it over, start the next */
            *item = bg->tmp;
            *got = true;
            bg->tmp = jv_undef();
            if ((rc = jv_list_new(c, JV_LIST_LIST, 0, &bg->tmp)) == MN_OK) rc = jv_list_push(c, bg->tmp, x);
            else jv_release(x);
            return rc;
        }
        if ((rc = jv_list_push(c, bg->tmp, x))) return rc;
    }
}

static void batch_free(JvGen *g) {
    BatchGen *bg = (BatchGen *)g;
    jv_iter_deinit(&bg->it);
    jv_release(bg->tmp);
    jv_release(bg->fill);
}

static const JvGenType BATCH_GEN = {batch_next, batch_free};

static int f_batch(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"linecount", "fill_with"};
    Jv p[2];
    bool has[2];
    int rc = jb_bind(c, "batch", a, names, 2, p, has);
    if (rc) return rc;
    int64_t n = 0;
    if (!has[0]) return jv_fail(c, MN_EINVAL, "do_batch() missing required argument 'linecount'");
    if ((rc = want_int(c, p[0], NULL, &n))) return rc;
    JvGen *g;
    if ((rc = jv_gen_new(c, &BATCH_GEN, sizeof(BatchGen), v, out, &g))) return rc;
    BatchGen *bg = (BatchGen *)g;
    jv_iter_init(&bg->it, v);
    bg->n = n;
    bg->tmp = jv_undef();
    bg->has_fill = has[1] && p[1].kind != JV_NONE;
    bg->fill = bg->has_fill ? jv_retain(p[1]) : jv_undef();
    return MN_OK;
}

static int f_format(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    if (a->n_pos > 0 && a->n_kw > 0)
        return jv_fail(c, MN_EINVAL, "can't handle positional and keyword arguments at the same time");
    Jv s, args;
    int rc = soft_str(c, v, &s);
    if (rc) return rc;
    if (a->n_kw > 0) {
        rc = jv_dict_new(c, &args);
        for (size_t k = 0; rc == MN_OK && k < a->n_kw; k++) {
            Jv key;
            if ((rc = jv_str_cstr(c, a->kw_names[k], &key))) break;
            rc = jv_dict_set(c, args, key, jv_retain(a->kw_vals[k]));
            jv_release(key);
        }
    } else {
        rc = jv_list_new(c, JV_LIST_TUPLE, a->n_pos, &args);
        for (size_t i = 0; rc == MN_OK && i < a->n_pos; i++) rc = jv_list_push(c, args, jv_retain(a->pos[i]));
    }
    if (rc == MN_OK) rc = jb_binop(c, JN_OP_MOD, s, args, out);
    jv_release(args);
    jv_release(s);
    return rc;
}

static int f_wordcount(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "wordcount", a, 0, 0);
    Jv s;
    if (rc || (rc = soft_str(c, v, &s))) return rc;
    int64_t words = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.as.s->len;) {
        size_t len;
        uint32_t cp = js_decode(s.as.s->data, s.as.s->len, i, &len);
        bool w = cp == '_' || ju_is_alpha(cp) || ju_is_decimal(cp) || ju_is_digit(cp) || ju_is_numeric(cp);
        if (w && !in_word) words++;
        in_word = w;
        i += len;
    }
    jv_release(s);
    *out = jv_int(words);
    return MN_OK;
}

/* jinja2's do_truncate works on the value itself, not its str(): a list
 * short enough comes back as it is. */
static int f_truncate(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"length", "killwords", "end", "leeway"};
    Jv p[4];
    bool has[4];
    int rc = jb_bind(c, "truncate", a, names, 4, p, has);
    if (rc) return rc;
    int64_t length = 255, leeway = 5;
    if (has[0] && (rc = want_int(c, p[0], NULL, &length))) return rc;
    if (has[3] && p[3].kind != JV_NONE && (rc = want_int(c, p[3], NULL, &leeway))) return rc;
    Jv end;
    if (has[2]) end = jv_retain(p[2]);
    else if ((rc = jv_str_new(c, "...", 3, false, &end))) return rc;
    size_t end_len = 0, n = 0;
    Jv cut = jv_undef(), rest = jv_undef();
    if ((rc = jv_len(c, end, &end_len))) goto done;
    if (length < (int64_t)end_len) {
        rc = jv_fail(c, MN_EINVAL, "expected length >= %zu, got %lld", end_len, (long long)length);
        goto done;
    }
    if (leeway < 0) {
        rc = jv_fail(c, MN_EINVAL, "expected leeway >= 0, got %lld", (long long)leeway);
        goto done;
    }
    if ((rc = jv_len(c, v, &n))) goto done;
    if ((int64_t)n <= length + leeway) {
        *out = jv_retain(v);
        goto done;
    }
    if ((rc = jb_slice(c, v, jv_none(), jv_int(length - (int64_t)end_len), jv_none(), &cut))) goto done;
    if (!(has[1] && jv_truthy(p[1]))) { /* s[:n].rsplit(" ", 1)[0] */
        if (cut.kind != JV_STR) {
            rc = jv_fail(c, MN_EINVAL, "'%s' object has no attribute 'rsplit'", jv_type_name(cut));
            goto done;
        }
        size_t sp = cut.as.s->len;
        while (sp > 0 && cut.as.s->data[sp - 1] != ' ') sp--;
        if (sp > 0) {
            if ((rc = jv_str_new(c, cut.as.s->data, sp - 1, cut.as.s->is_safe, &rest))) goto done;
            jv_release(cut);
            cut = rest;
            rest = jv_undef();
        }
    }
    rc = jb_binop(c, JN_OP_ADD, cut, end, out);
done:
    jv_release(cut);
    jv_release(end);
    return rc;
}

/* transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None,
 * separators=None, sort_keys=False). */
static int f_tojson(JvCtx *c, Jv v, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    Jv p[4];
    bool has[4];
    int rc = jb_bind(c, "tojson", a, names, 4, p, has);
    if (rc) return rc;
    JvJsonOpts o = {0};
    o.ensure_ascii = has[0] && jv_truthy(p[0]);
    o.sort_keys = has[3] && jv_truthy(p[3]);
    Jv ind = jv_undef();
    if (has[1] && p[1].kind != JV_NONE) {
        o.has_indent = true;
        if (p[1].kind == JV_STR) {
            o.indent = p[1].as.s->data;
            o.indent_len = p[1].as.s->len;
        } else if (is_int(p[1])) {
            Jv sp;
            if ((rc = jv_str_new(c, " ", 1, false, &sp))) return rc;
            rc = repeat(c, sp, as_int(p[1]), &ind);
            jv_release(sp);
            if (rc) return rc;
            o.indent = ind.as.s->data;
            o.indent_len = ind.as.s->len;
        } else {
            return jv_fail(c, MN_EINVAL, "can't multiply sequence by non-int of type '%s'", jv_type_name(p[1]));
        }
    }
    if (has[2] && p[2].kind != JV_NONE) {
        Jv sep = p[2];
        if (sep.kind != JV_LIST || sep.as.l->n != 2 || !is_str(sep.as.l->items[0]) || !is_str(sep.as.l->items[1])) {
            jv_release(ind);
            return jv_fail(c, MN_EINVAL, "separators must be a pair of strings");
        }
        o.item_sep = sep.as.l->items[0].as.s->data;
        o.key_sep = sep.as.l->items[1].as.s->data;
    }
    JvBuf b;
    jv_buf_init(&b, c);
    rc = jv_to_json(c, v, &o, &b);
    jv_release(ind);
    return jv_buf_finish(&b, rc, false, out);
}

typedef struct FilterDef {
    const char *name;
    FilterFn fn;
} FilterDef;

static const FilterDef FILTERS[] = {
    {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},       {"capitalize", f_capitalize},
    {"center", f_center},     {"count", f_length},      {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
    {"float", f_float},       {"format", f_format},     {"indent", f_indent},     {"int", f_int},
    {"items", f_items},       {"join", f_join},         {"last", f_last},         {"length", f_length},
    {"list", f_list},         {"lower", f_lower},       {"map", f_map},           {"max", f_max},
    {"min", f_min},           {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse},   {"round", f_round},       {"safe", f_safe},         {"select", f_select},
    {"selectattr", f_selectattr}, {"sort", f_sort},     {"string", f_string},     {"sum", f_sum},
    {"title", f_title},       {"tojson", f_tojson},     {"trim", f_trim},         {"truncate", f_truncate},
    {"unique", f_unique},     {"upper", f_upper},       {"wordcount", f_wordcount},
};

/* jinja2's other filters: known names, refused when used. */
static const char *const FILTERS_UNSUPPORTED[] = {
    "filesizeformat", "forceescape", "groupby", "pprint", "random", "slice",
    "striptags", "urlencode", "urlize", "wordwrap", "xmlattr",
};

int jb_filter_find(const char *name, size_t len) {
    for (size_t i = 0; i < COUNT(FILTERS); i++)
        if (strlen(FILTERS[i].name) == len && memcmp(FILTERS[i].name, name, len) == 0) return (int)i;
    return in_names(FILTERS_UNSUPPORTED, COUNT(FILTERS_UNSUPPORTED), name, len) ? JB_UNSUPPORTED : JB_UNKNOWN;
}

int jb_filter_apply(JvCtx *c, int id, Jv value, const JvArgs *args, Jv *out) {
    *out = jv_undef();
    if (id < 0 || (size_t)id >= COUNT(FILTERS)) return jv_fail(c, MN_EINVAL, "no such filter");
    int rc = jv_charge(c, 1);
    return jv_clean_out(rc ? rc : FILTERS[id].fn(c, value, args, out), out);
}

/* ---- tests ----------------------------------------------------------------------------- */

typedef int (*TestFn)(JvCtx *c, Jv v, const JvArgs *a, bool *out);

static int no_args(JvCtx *c, const char *who, const JvArgs *a) { return want_pos(c, who, a, 0, 0); }

#define SIMPLE_TEST(fn, who, expr)                          \
    static int fn(JvCtx *c, Jv v, const JvArgs *a, bool *out) { \
        int rc = no_args(c, who, a);                        \
        *out = rc == MN_OK && (expr);                       \
        return rc;                                          \
    }

SIMPLE_TEST(t_defined, "defined", v.kind != JV_UNDEF)
SIMPLE_TEST(t_undefined, "undefined", v.kind == JV_UNDEF)
SIMPLE_TEST(t_none, "none", v.kind == JV_NONE)
SIMPLE_TEST(t_boolean, "boolean", v.kind == JV_BOOL)
SIMPLE_TEST(t_false, "false", v.kind == JV_BOOL && !v.as.b)
SIMPLE_TEST(t_true, "true", v.kind == JV_BOOL && v.as.b)
SIMPLE_TEST(t_integer, "integer", v.kind == JV_INT)
SIMPLE_TEST(t_float, "float", v.kind == JV_FLOAT)
SIMPLE_TEST(t_number, "number", jv_is_number(v))
SIMPLE_TEST(t_string, "string", v.kind == JV_STR)
SIMPLE_TEST(t_mapping, "mapping", v.kind == JV_DICT)
SIMPLE_TEST(t_escaped, "escaped", v.kind == JV_STR && v.as.s->is_safe)
/* Python's iter() succeeds; Undefined is iterable (empty) */
SIMPLE_TEST(t_iterable, "iterable", v.kind == JV_UNDEF || v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT)
/* len() and __getitem__: str, list, tuple, range, dict, and Undefined */
SIMPLE_TEST(t_sequence, "sequence",
            v.kind == JV_UNDEF || v.kind == JV_STR || v.kind == JV_DICT ||
                (v.kind == JV_LIST && (v.as.l->tag <= JV_LIST_TUPLE || v.as.l->tag == JV_LIST_RANGE)))
SIMPLE_TEST(t_callable, "callable", v.kind == JV_UNDEF || (v.kind == JV_OBJ && v.as.o->type->is_callable))

static int str_pred_test(JvCtx *c, Jv v, const JvArgs *a, JsPred p, const char *who, bool *out) {
    int rc = no_args(c, who, a);
    Jv s;
    if (rc || (rc = jv_to_str(c, v, &s))) return rc;
    *out = js_is(s.as.s, p);
    jv_release(s);
    return MN_OK;
}
static int t_lower(JvCtx *c, Jv v, const JvArgs *a, bool *o) { return str_pred_test(c, v, a, JS_IS_LOWER, "lower", o); }
static int t_upper(JvCtx *c, Jv v, const JvArgs *a, bool *o) { return str_pred_test(c, v, a, JS_IS_UPPER, "upper", o); }

static int mod_test(JvCtx *c, Jv v, Jv d, bool *out) {
    Jv r;
    int rc = jb_binop(c, JN_OP_MOD, v, d, &r);
    if (rc) return rc;
    *out = jv_eq(r, jv_int(0));
    jv_release(r);
    return MN_OK;
}
static int t_even(JvCtx *c, Jv v, const JvArgs *a, bool *out) {
    int rc = no_args(c, "even", a);
    return rc ? rc : mod_test(c, v, jv_int(2), out);
}
static int t_odd(JvCtx *c, Jv v, const JvArgs *a, bool *out) {
    int rc = no_args(c, "odd", a);
    if (rc || (rc = mod_test(c, v, jv_int(2), out))) return rc;
    *out = !*out;
    return MN_OK;
}
static int t_divisibleby(JvCtx *c, Jv v, const JvArgs *a, bool *out) {
    int rc = want_pos(c, "divisibleby", a, 1, 1);
    return rc ? rc : mod_test(c, v, a->pos[0], out);
}

static int compare_test(JvCtx *c, Jv v, const JvArgs *a, int op, bool *out) {
    int rc = want_pos(c, "compare", a, 1, 1);
    if (rc) return rc;
    Jv w = a->pos[0];
    if (op == JN_OP_EQ || op == JN_OP_NE) {
        *out = jv_eq(v, w) == (op == JN_OP_EQ);
        return MN_OK;
    }
    static const char *const text[] = {[JN_OP_LT] = "<", [JN_OP_LE] = "<=", [JN_OP_GT] = ">", [JN_OP_GE] = ">="};
    int r;
    if ((rc = jv_cmp(c, v, w, text[op], &r))) return rc;
    if (r == 2) *out = false;
    else if (op == JN_OP_LT) *out = r < 0;
    else if (op == JN_OP_LE) *out = r <= 0;
    else if (op == JN_OP_GT) *out = r > 0;
    else *out = r >= 0;
    return MN_OK;
}
static int t_eq(JvCtx *c, Jv v, const JvArgs *a, bool *o) { return compare_test(c, v, a, JN_OP_EQ, o); }
static int t_ne(JvCtx *c, Jv v, const JvArgs *a, bool *o) { return compare_test(c, v, a, JN_OP_NE, o); }
static int t_lt(JvCtx *c, Jv v, const JvArgs *a, bool *o) { return compare_test(c, v, a, JN_OP_LT, o); }
static int t_le(JvCtx *c, Jv v, const JvArgs *a, bool *o) { return compare_test(c, v, a, JN_OP_LE, o); }
static int t_gt(JvCtx *c, Jv v, const JvArgs *a, bool *o) { return compare_test(c, v, a, JN_OP_GT, o); }
static int t_ge(JvCtx *c, Jv v, const JvArgs *a, bool *o) { return compare_test(c, v, a, JN_OP_GE, o); }

static int t_in(JvCtx *c, Jv v, const JvArgs *a, bool *out) {
    int rc = want_pos(c, "in", a, 1, 1);
    return rc ? rc : jv_contains(c, a->pos[0], v, out);
}

/* `is` identity: singletons and small ints compare equal, as CPython's
 * caches make them identical; other values only when they are one object. */
static int t_sameas(JvCtx *c, Jv v, const JvArgs *a, bool *out) {
    int rc = want_pos(c, "sameas", a, 1, 1);
    if (rc) return rc;
    Jv w = a->pos[0];
    if (v.kind != w.kind) *out = false;
    else if (v.kind == JV_NONE || v.kind == JV_UNDEF) *out = v.kind == JV_NONE || v.as.u == w.as.u;
    else if (v.kind == JV_BOOL) *out = v.as.b == w.as.b;
    else if (v.kind == JV_INT) *out = v.as.i == w.as.i && v.as.i >= -5 && v.as.i <= 256;
    else if (v.kind == JV_FLOAT) *out = false;
    else *out = v.as.h == w.as.h;
    return MN_OK;
}

static int t_filter(JvCtx *c, Jv v, const JvArgs *a, bool *out) {
    int rc = no_args(c, "filter", a);
    *out = rc == MN_OK && is_str(v) && jb_filter_find(v.as.s->data, v.as.s->len) != JB_UNKNOWN;
    return rc;
}

static int t_test(JvCtx *c, Jv v, const JvArgs *a, bool *out) {
    int rc = no_args(c, "test", a);
    *out = rc == MN_OK && is_str(v) && jb_test_find(v.as.s->data, v.as.s->len) != JB_UNKNOWN;
    return rc;
}

typedef struct TestDef {
    const char *name;
    TestFn fn;
} TestDef;

static const TestDef TESTS[] = {
    {"!=", t_ne},         {"<", t_lt},          {"<=", t_le},             {"==", t_eq},       {">", t_gt},
    {">=", t_ge},         {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},
    {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq},     {"escaped", t_escaped},
    {"even", t_even},     {"false", t_false},   {"filter", t_filter},     {"float", t_float}, {"ge", t_ge},
    {"greaterthan", t_gt}, {"gt", t_gt},        {"in", t_in},             {"integer", t_integer},
    {"iterable", t_iterable}, {"le", t_le},     {"lessthan", t_lt},       {"lower", t_lower}, {"lt", t_lt},
    {"mapping", t_mapping}, {"ne", t_ne},       {"none", t_none},         {"number", t_number},
    {"odd", t_odd},       {"sameas", t_sameas}, {"sequence", t_sequence}, {"string", t_string},
    {"test", t_test},     {"true", t_true},     {"undefined", t_undefined}, {"upper", t_upper},
};

int jb_test_find(const char *name, size_t len) {
    for (size_t i = 0; i < COUNT(TESTS); i++)
        if (strlen(TESTS[i].name) == len && memcmp(TESTS[i].name, name, len) == 0) return (int)i;
    return JB_UNKNOWN;
}

int jb_test_apply(JvCtx *c, int id, Jv value, const JvArgs *args, bool *out) {
    *out = false;
    if (id < 0 || (size_t)id >= COUNT(TESTS)) return jv_fail(c, MN_EINVAL, "no such test");
    int rc = jv_charge(c, 1);
    return rc ? rc : TESTS[id].fn(c, value, args, out);
}

/* ---- globals ---------------------------------------------------------------------------- */

typedef struct GlobalObj GlobalObj;
typedef int (*GlobalFn)(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out);

typedef struct GlobalDef {
    const char *name;
    GlobalFn fn;
} GlobalDef;

struct GlobalObj {
    JvObj o;
    const GlobalDef *def;
    Jv state;   /* cycler: its items; joiner: its separator */
    size_t pos; /* cycler: the current item */
    bool used;  /* joiner: called before */
};

static void global_free(JvObj *o) { jv_release(((GlobalObj *)o)->state); }

static int global_call(JvCtx *c, JvObj *o, const JvArgs *a, Jv *out) {
    GlobalObj *g = (GlobalObj *)o;
    return g->def->fn(c, g, a, out);
}

static const JvObjType FUNCTION_TYPE = {
    .name = "function",
    .is_callable = true,
    .call_fn = global_call,
    .free_fn = global_free,
};

#define MAX_RANGE 100000 /* jinja2's sandbox refuses longer ranges */

static int g_range(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "range", a, 1, 3);
    if (rc) return rc;
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a->n_pos; i++)
        if (!is_int(a->pos[i]))
            return jv_fail(c, MN_EINVAL, "'%s' object cannot be interpreted as an integer", jv_type_name(a->pos[i]));
    if (a->n_pos == 1) v[1] = as_int(a->pos[0]);
    else {
        v[0] = as_int(a->pos[0]);
        v[1] = as_int(a->pos[1]);
        if (a->n_pos == 3) v[2] = as_int(a->pos[2]);
    }
    if (v[2] == 0) return jv_fail(c, MN_EINVAL, "range() arg 3 must not be zero");
    /* the length in 128 bits: the bounds may be anywhere in int64 */
    __int128 span = v[2] > 0 ? (__int128)v[1] - v[0] : (__int128)v[0] - v[1];
    __int128 step = v[2] > 0 ? v[2] : -(__int128)v[2];
    __int128 n = span <= 0 ? 0 : (span + step - 1) / step;
    if (n > MAX_RANGE)
        return jv_fail(c, MN_ERANGE, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    if ((rc = jv_charge(c, (uint64_t)n / 8)) || (rc = jv_list_new(c, JV_LIST_RANGE, (size_t)n, out))) return rc;
    for (__int128 i = 0; i < n; i++)
        if ((rc = jv_list_push(c, *out, jv_int((int64_t)(v[0] + i * v[2]))))) return rc;
    memcpy(out->as.l->range, v, sizeof v);
    return MN_OK;
}

/* dict(*args, **kwargs) into d: a mapping or an iterable of pairs, then
 * the keywords. */
static int fill_dict(JvCtx *c, const char *who, const JvArgs *a, Jv d) {
    if (a->n_pos > 1) return jv_fail(c, MN_EINVAL, "%s expected at most 1 argument, got %zu", who, a->n_pos);
    int rc = MN_OK;
    if (a->n_pos == 1) {
        Jv src = a->pos[0];
        if (src.kind == JV_DICT || src.kind == JV_NS) {
            for (size_t i = 0; rc == MN_OK && i < src.as.d->n; i++)
                rc = jv_dict_set(c, d, src.as.d->ents[i].key, jv_retain(src.as.d->ents[i].val));
        } else {
            Jv items;
            if ((rc = jv_iterate(c, src, &items))) return rc;
            for (size_t i = 0; rc == MN_OK && i < items.as.l->n; i++) {
                Jv pair, kv;
                pair = items.as.l->items[i];
                if ((rc = jv_iterate(c, pair, &kv))) break;
                if (kv.as.l->n != 2)
                    rc = jv_fail(c, MN_EINVAL, "dictionary update sequence element #%zu has length %zu; 2 is required", i,
                                 kv.as.l->n);
                else
                    rc = jv_dict_set(c, d, kv.as.l->items[0], jv_retain(kv.as.l->items[1]));
                jv_release(kv);
            }
            jv_release(items);
        }
    }
    for (size_t k = 0; rc == MN_OK && k < a->n_kw; k++) {
        Jv key;
        if ((rc = jv_str_cstr(c, a->kw_names[k], &key))) break;
        rc = jv_dict_set(c, d, key, jv_retain(a->kw_vals[k]));
        jv_release(key);
    }
    return rc;
}

static int g_namespace(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out) {
    int rc = jv_ns_new(c, out);
    return rc ? rc : fill_dict(c, "Namespace", a, *out);
}

static int g_dict(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out) {
    int rc = jv_dict_new(c, out);
    return rc ? rc : fill_dict(c, "dict", a, *out);
}

static int g_raise_exception(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "raise_exception", a, 1, 1);
    if (rc) return rc;
    Jv s;
    if ((rc = jv_to_str(c, a->pos[0], &s))) return rc;
    rc = jv_fail(c, MN_EINVAL, "%s", s.as.s->data);
    jv_release(s);
    return rc;
}

static int g_strftime_now(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "strftime_now", a, 1, 1);
    if (rc) return rc;
    Jv f = a->pos[0];
    if (!is_str(f)) return jv_fail(c, MN_EINVAL, "strftime() argument 1 must be str, not %s", jv_type_name(f));
    if (f.as.s->len > 256) return jv_fail(c, MN_ERANGE, "strftime format longer than 256 bytes");
    if (memchr(f.as.s->data, '\0', f.as.s->len)) return jv_fail(c, MN_EINVAL, "embedded null character");
    /* Python's datetime.strftime: %f is the microseconds, %z and %Z are
     * empty for a naive datetime; the rest is the C library's ("C" locale) */
    char fmt[1024];
    size_t k = 0;
    const char *s = f.as.s->data;
    for (size_t i = 0; i < f.as.s->len && k + 8 < sizeof fmt; i++) {
        if (s[i] == '%' && i + 1 < f.as.s->len) {
            char x = s[i + 1];
            if (x == 'f') {
                memcpy(fmt + k, "000000", 6);
                k += 6;
                i++;
                continue;
            }
            if (x == 'z' || x == 'Z') {
                i++;
                continue;
            }
            fmt[k++] = s[i++];
            fmt[k++] = x;
            continue;
        }
        fmt[k++] = s[i];
    }
    fmt[k] = '\0';
    struct tm tm = {.tm_year = c->year - 1900, .tm_mon = c->month - 1, .tm_mday = c->day,
                    .tm_hour = c->hour, .tm_min = c->minute, .tm_sec = c->second};
    timegm(&tm); /* fills in tm_wday and tm_yday (UTC: no daylight saving shifts the day) */
    /* 256 format bytes expand to less than this in the "C" locale */
    char buf[4096];
    locale_t loc = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (loc == (locale_t)0) return jv_fail(c, MN_ENOMEM, "out of memory");
    size_t n = k == 0 ? 0 : strftime_l(buf, sizeof buf, fmt, &tm, loc);
    freelocale(loc);
    return jv_str_new(c, buf, n, false, out);
}

static int g_lipsum(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out) {
    return jv_fail(c, MN_EUNSUPPORTED, "lipsum() is not supported (it is random)");
}

/* ---- cycler and joiner ---- */

static int cycler_next(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    GlobalObj *g = (GlobalObj *)self.as.o;
    int rc = want_pos(c, "next", a, 0, 0);
    if (rc) return rc;
    JvList *items = g->state.as.l;
    *out = jv_retain(items->items[g->pos]);
    g->pos = (g->pos + 1) % items->n;
    return MN_OK;
}

static int cycler_reset(JvCtx *c, Jv self, const JvArgs *a, Jv *out) {
    ((GlobalObj *)self.as.o)->pos = 0;
    *out = jv_none();
    return want_pos(c, "reset", a, 0, 0);
}

static const MethodDef CYCLER_METHODS[] = {{"next", cycler_next, 0}, {"reset", cycler_reset, 0}};

static int cycler_getattr(JvCtx *c, JvObj *o, const char *name, size_t len, Jv *out) {
    GlobalObj *g = (GlobalObj *)o;
    Jv self = {.kind = JV_OBJ};
    self.as.o = o;
    if (len == 7 && memcmp(name, "current", 7) == 0) {
        *out = jv_retain(g->state.as.l->items[g->pos]);
        return MN_OK;
    }
    const MethodDef *def = find_method(CYCLER_METHODS, COUNT(CYCLER_METHODS), name, len);
    if (def) return bind_method(c, self, def, out);
    *out = jv_undef_msg(c, false, "'jinja2.utils.Cycler object' has no attribute '%.*s'", (int)(len < 80 ? len : 80), name);
    return MN_OK;
}

static const JvObjType CYCLER_TYPE = {.name = "Cycler", .getattr_fn = cycler_getattr, .free_fn = global_free};

static int g_cycler(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out) {
    if (a->n_kw > 0) return jv_fail(c, MN_EINVAL, "Cycler() got an unexpected keyword argument '%s'", a->kw_names[0]);
    if (a->n_pos == 0) return jv_fail(c, MN_EINVAL, "at least one item has to be provided");
    int rc = jv_obj_new(c, &CYCLER_TYPE, sizeof(GlobalObj), out);
    if (rc) return rc;
    GlobalObj *g = (GlobalObj *)out->as.o;
    g->state = jv_undef();
    if ((rc = jv_list_new(c, JV_LIST_TUPLE, a->n_pos, &g->state))) return rc;
    for (size_t i = 0; rc == MN_OK && i < a->n_pos; i++) rc = jv_list_push(c, g->state, jv_retain(a->pos[i]));
    return rc;
}

static int joiner_call(JvCtx *c, GlobalObj *g, const JvArgs *a, Jv *out) {
    int rc = want_pos(c, "joiner", a, 0, 0);
    if (rc) return rc;
    if (!g->used) {
        g->used = true;
        return jv_str_new(c, "", 0, false, out);
    }
    *out = jv_retain(g->state);
    return MN_OK;
}

static const GlobalDef JOINER_CALL = {"joiner", joiner_call};

static int g_joiner(JvCtx *c, GlobalObj *self, const JvArgs *a, Jv *out) {
    static const char *const names[] = {"sep"};
    Jv p[1];
    bool has[1];
    int rc = jb_bind(c, "joiner", a, names, 1, p, has);
    if (rc || (rc = jv_obj_new(c, &FUNCTION_TYPE, sizeof(GlobalObj), out))) return rc;
    GlobalObj *g = (GlobalObj *)out->as.o;
    g->def = &JOINER_CALL;
    if (has[0]) g->state = jv_retain(p[0]);
    else rc = jv_str_new(c, ", ", 2, false, &g->state);
    return rc;
}

static const GlobalDef GLOBALS[] = {
    {"cycler", g_cycler},       {"dict", g_dict},         {"joiner", g_joiner},
    {"lipsum", g_lipsum},       {"namespace", g_namespace}, {"raise_exception", g_raise_exception},
    {"range", g_range},         {"strftime_now", g_strftime_now},
};

int jb_global(JvCtx *c, const char *name, size_t len, Jv *out) {
    *out = jv_undef();
    for (size_t i = 0; i < COUNT(GLOBALS); i++) {
        if (strlen(GLOBALS[i].name) != len || memcmp(GLOBALS[i].name, name, len) != 0) continue;
        int rc = jv_obj_new(c, &FUNCTION_TYPE, sizeof(GlobalObj), out);
        if (rc) return rc;
        GlobalObj *g = (GlobalObj *)out->as.o;
        g->def = &GLOBALS[i];
        g->state = jv_undef();
        return MN_OK;
    }
    return MN_ENOTFOUND;
}

int jb_call(JvCtx *c, Jv callee, const JvArgs *args, Jv *out) {
    *out = jv_undef();
    if (callee.kind == JV_UNDEF) return fail_undefined(c, callee);
    if (callee.kind == JV_OBJ && callee.as.o->type->call_fn)
        return jv_clean_out(callee.as.o->type->call_fn(c, callee.as.o, args, out), out);
    return jv_fail(c, MN_EINVAL, "'%s' object is not callable", jv_type_name(callee));
}
