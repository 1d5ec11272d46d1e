/* jinja_str.h — Python's str methods on Jinja strings.
 *
 * Chat templates call str methods (strip, split, startswith, upper, ...)
 * and jinja2 filters built on them; this module reproduces CPython 3.11's
 * results on UTF-8 strings, counting in code points as Python does:
 * whitespace and case come from model/jinja_unicode.h (full case mappings,
 * the final-sigma rule of lower()), splitlines() breaks where Python does.
 * Results are new plain strings (is_safe false); the caller applies
 * Markup's rules. Every function charges work to the ctx in proportion to
 * the bytes it walks.
 */
#ifndef MN_JINJA_STR_H
#define MN_JINJA_STR_H

#include <stdbool.h>
#include <stdint.h>

#include "model/jinja_value.h"

typedef enum JsCase {
    JS_UPPER,      /* str.upper() */
    JS_LOWER,      /* str.lower() */
    JS_TITLE,      /* str.title() */
    JS_CAPITALIZE, /* str.capitalize() */
    JS_SWAPCASE,   /* str.swapcase() */
} JsCase;

int js_case(JvCtx *c, const JvStr *s, JsCase which, Jv *out);

/* strip/lstrip/rstrip: left and/or right; chars NULL for whitespace. */
int js_strip(JvCtx *c, const JvStr *s, const JvStr *chars, bool left, bool right, Jv *out);

/* split/rsplit(sep, maxsplit): sep NULL splits on whitespace runs;
 * maxsplit < 0 for all. A list of str. MN_EINVAL for an empty sep. */
int js_split(JvCtx *c, const JvStr *s, const JvStr *sep, int64_t maxsplit, bool from_right, Jv *out);
int js_splitlines(JvCtx *c, const JvStr *s, bool keepends, Jv *out);

/* replace(old, new, count): count < 0 for all. */
int js_replace(JvCtx *c, const JvStr *s, const JvStr *old, const JvStr *new_s, int64_t count, Jv *out);

/* Clamp Python slice-like bounds [start, end) (absent: has_* false) to the
 * string, in code points. */
void js_bounds(const JvStr *s, bool has_start, int64_t start, bool has_end, int64_t end, size_t *lo, size_t *hi);

/* find/rfind within code points [lo, hi): the code point index, or -1. */
int64_t js_find(const JvStr *s, const JvStr *sub, size_t lo, size_t hi, bool from_right);
/* count of non-overlapping sub within [lo, hi). */
int64_t js_count(const JvStr *s, const JvStr *sub, size_t lo, size_t hi);
/* Does s[lo:hi] start (or end) with prefix? */
bool js_affix(const JvStr *s, const JvStr *fix, size_t lo, size_t hi, bool at_end);

typedef enum JsPred {
    JS_IS_ALNUM, JS_IS_ALPHA, JS_IS_ASCII, JS_IS_DECIMAL, JS_IS_DIGIT, JS_IS_LOWER, JS_IS_NUMERIC,
    JS_IS_PRINTABLE, JS_IS_SPACE, JS_IS_TITLE, JS_IS_UPPER,
} JsPred;

bool js_is(const JvStr *s, JsPred which);

/* center/ljust/rjust(width, fill) and zfill(width). mode: 'c', 'l', 'r', 'z'. */
int js_pad(JvCtx *c, const JvStr *s, int64_t width, uint32_t fill, char mode, Jv *out);

/* s[start:stop:step] by code points, with bounds already normalized as
 * Python's slice.indices() gives them (step != 0). */
int js_slice(JvCtx *c, const JvStr *s, int64_t start, int64_t stop, int64_t step, Jv *out);

/* The code point at character index i (0 <= i < n_chars) as a string. */
int js_char_at(JvCtx *c, const JvStr *s, size_t i, Jv *out);

/* Python's printf-style formatting: fmt % args, where args is a tuple (its
 * items), a dict (for %(name)s) or any single value. */
int js_percent(JvCtx *c, const JvStr *fmt, Jv args, Jv *out);

/* format(v, spec) with Python's format mini-language, appended to out:
 * str (fill, align, width, precision), int and bool (sign, #, 0, width,
 * "," and "_" grouping, types b c d o x X n and the float types), float
 * (e E f F g G %, and no type); other values take an empty spec only. */
int js_format_value(JvCtx *c, Jv v, const char *spec, size_t n, JvBuf *out);

/* Python's int(s, base) and float(s) of a str: MN_OK and the value, or
 * MN_EINVAL (no error recorded) when Python raises ValueError. */
int js_parse_int(const JvStr *s, int base, int64_t *out);
int js_parse_float(const JvStr *s, double *out);

/* The first code point of s[i..] and its byte length (1 for bad bytes). */
uint32_t js_decode(const char *s, size_t n, size_t i, size_t *len);

#endif
