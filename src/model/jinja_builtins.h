/* jinja_builtins.h — jinja2's filters, tests and globals, and Python's
 * methods on str, dict and list, as the Jinja renderer sees them.
 *
 * Everything here works on values alone (model/jinja_value.h); the
 * evaluator (model/jinja.c) resolves names to these and calls them.
 * Behaviour follows jinja2 3.1 in an ImmutableSandboxedEnvironment with
 * autoescape off, with transformers' tojson (json.dumps with
 * ensure_ascii=False by default, indent, separators and sort_keys honoured)
 * and its globals raise_exception and strftime_now. Mutating methods
 * (list.append, dict.update, ...) are refused as the immutable sandbox
 * refuses them.
 *
 * Filter and test ids: >= 0 for the ones implemented; JB_UNSUPPORTED for
 * names jinja2 has that mnemo does not implement (an error naming them when
 * used); JB_UNKNOWN for names jinja2 does not know either.
 */
#ifndef MN_JINJA_BUILTINS_H
#define MN_JINJA_BUILTINS_H

#include <stdbool.h>
#include <stddef.h>

#include "model/jinja_value.h"

#define JB_UNKNOWN (-1)
#define JB_UNSUPPORTED (-2)

int jb_filter_find(const char *name, size_t len);
int jb_test_find(const char *name, size_t len);

/* Apply filter id to value with args; *out is a new reference. Errors as
 * jinja2 raises them (TypeError, FilterArgumentError, ...) with
 * MN_EINVAL, or MN_EUNSUPPORTED for a variant not implemented. */
int jb_filter_apply(JvCtx *c, int id, Jv value, const JvArgs *args, Jv *out);
int jb_test_apply(JvCtx *c, int id, Jv value, const JvArgs *args, bool *out);

/* The sandbox's attribute lookup (obj.name) and item lookup (obj[key]):
 * dict keys, str/dict/list methods (bound, callable), namespace
 * attributes, object attributes; an undefined carrying jinja2's message
 * when there is none. */
int jb_getattr(JvCtx *c, Jv obj, const char *name, size_t len, Jv *out);
int jb_getitem(JvCtx *c, Jv obj, Jv key, Jv *out);

/* obj[start:stop:step] (each may be JV_NONE/undefined for "absent"). */
int jb_slice(JvCtx *c, Jv obj, Jv start, Jv stop, Jv step, Jv *out);

/* The global of that name (range, namespace, dict, cycler, joiner,
 * raise_exception, strftime_now): MN_OK and *out, or MN_ENOTFOUND. */
int jb_global(JvCtx *c, const char *name, size_t len, Jv *out);

/* Call a callable value. */
int jb_call(JvCtx *c, Jv callee, const JvArgs *args, Jv *out);

/* Python's binary operators on values (JnOp numbering of jinja_parse.h:
 * + - * / // % ** and ~), and unary minus/plus. */
int jb_binop(JvCtx *c, int op, Jv a, Jv b, Jv *out);
int jb_unary(JvCtx *c, bool is_neg, Jv a, Jv *out);

/* Bind call arguments to parameter names as Python does: positional
 * first, then keywords. vals[i] is set (borrowed) where given, and
 * present[i] tells which. who names the callable in errors. */
int jb_bind(JvCtx *c, const char *who, const JvArgs *args, const char *const *names, size_t n_names, Jv *vals,
            bool *present);

#endif
