/* jinja_str.c — Python's str methods on UTF-8 (jinja_str.h).
 *
 * Strings are valid UTF-8 (the renderer's inputs are checked), so a byte
 * search finds exactly the code point matches Python would; indices given
 * to and returned from these functions count code points. Operations that
 * need random access by code point (case mapping with its look-around,
 * slicing with a step) decode into a temporary array charged to the ctx.
 */
#include "model/jinja_str.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "model/jinja_unicode.h"
#include "base/utf8.h"

uint32_t js_decode(const char *s, size_t n, size_t i, size_t *len) {
    unsigned char ch = (unsigned char)s[i];
    if (ch < 0x80) {
        *len = 1;
        return ch;
    }
    uint32_t cp;
    int k = utf8_decode_strict((const unsigned char *)s + i, n - i, &cp);
    if (k <= 0) {
        *len = 1;
        return ch;
    }
    *len = (size_t)k;
    return cp;
}

/* Code points of s in a counted array (*n of them; the work charged);
 * NULL on failure. */
static uint32_t *decode_all(JvCtx *c, const JvStr *s, size_t *n) {
    if (jv_charge(c, s->len / 4) != MN_OK) return NULL;
    uint32_t *cps = jv_mem_alloc(c, (s->n_chars + 1) * sizeof(uint32_t));
    if (cps == NULL) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < s->len;) {
        size_t len;
        cps[k++] = js_decode(s->data, s->len, i, &len);
        i += len;
    }
    *n = k;
    return cps;
}

static int put_cp(JvBuf *b, uint32_t cp) {
    char u[4];
    size_t k = utf8_encode(cp, u);
    return jv_buf_put(b, u, k);
}

/* ---- case -------------------------------------------------------------------- */

/* CPython's final-sigma rule for the capital sigma at cps[i]. */
static uint32_t lower_sigma(const uint32_t *cps, size_t n, size_t i) {
    size_t j = i;
    uint32_t ch = 0;
    bool found = false;
    while (j > 0) {
        ch = cps[--j];
        if (!ju_is_case_ignorable(ch)) {
            found = true;
            break;
        }
    }
    bool final = found && ju_is_cased(ch);
    if (final && i + 1 < n) {
        size_t k;
        for (k = i + 1; k < n; k++) {
            ch = cps[k];
            if (!ju_is_case_ignorable(ch)) break;
        }
        final = k == n || !ju_is_cased(ch);
    }
    return final ? 0x3C2 : 0x3C3;
}

static int put_mapped(JvBuf *b, JuCase which, const uint32_t *cps, size_t n, size_t i) {
    if (which == JU_LOWER && cps[i] == 0x3A3) return put_cp(b, lower_sigma(cps, n, i));
    char m[JU_MAP_MAX];
    size_t k = ju_map(which, cps[i], m);
    return jv_buf_put(b, m, k);
}

int js_case(JvCtx *c, const JvStr *s, JsCase which, Jv *out) {
    *out = jv_undef();
    size_t n;
    uint32_t *cps = decode_all(c, s, &n);
    if (cps == NULL) return c->err_code;
    int rc = MN_OK;
    JvBuf b;
    jv_buf_init(&b, c);
    bool prev_cased = false;
    for (size_t i = 0; rc == MN_OK && i < n; i++) {
        uint32_t cp = cps[i];
        switch (which) {
        case JS_UPPER: rc = put_mapped(&b, JU_UPPER, cps, n, i); break;
        case JS_LOWER: rc = put_mapped(&b, JU_LOWER, cps, n, i); break;
        case JS_TITLE:
            rc = put_mapped(&b, prev_cased ? JU_LOWER : JU_TITLE, cps, n, i);
            prev_cased = ju_is_cased(cp);
            break;
        case JS_CAPITALIZE: rc = put_mapped(&b, i == 0 ? JU_TITLE : JU_LOWER, cps, n, i); break;
        case JS_SWAPCASE:
            if (ju_is_upper(cp)) rc = put_mapped(&b, JU_LOWER, cps, n, i);
            else if (ju_is_lower(cp)) rc = put_mapped(&b, JU_UPPER, cps, n, i);
            else rc = put_cp(&b, cp);
            break;
        }
    }
    jv_mem_free(c, cps, (s->n_chars + 1) * sizeof(uint32_t));
    return jv_buf_finish(&b, rc, false, out);
}

/* ---- strip ------------------------------------------------------------------- */

static bool in_chars(const JvStr *chars, uint32_t cp) {
    if (chars == NULL) return ju_is_space(cp);
    for (size_t i = 0; i < chars->len;) {
        size_t len;
        if (js_decode(chars->data, chars->len, i, &len) == cp) return true;
        i += len;
    }
    return false;
}

int js_strip(JvCtx *c, const JvStr *s, const JvStr *chars, bool left, bool right, Jv *out) {
    size_t lo = 0, hi = s->len;
    if (left) {
        while (lo < hi) {
            size_t len;
            if (!in_chars(chars, js_decode(s->data, s->len, lo, &len))) break;
            lo += len;
        }
    }
    if (right) {
        while (hi > lo) {
            size_t start = hi - 1;
            while (start > lo && ((unsigned char)s->data[start] & 0xC0) == 0x80) start--;
            size_t len;
            if (!in_chars(chars, js_decode(s->data, s->len, start, &len))) break;
            hi = start;
        }
    }
    int rc = jv_charge(c, (s->len + (chars ? chars->len * 4 : 0)) / 16);
    if (rc) return rc;
    return jv_str_new(c, s->data + lo, hi - lo, false, out);
}

/* ---- split ------------------------------------------------------------------- */

static int push_piece(JvCtx *c, Jv list, const char *s, size_t n) {
    Jv v;
    int rc = jv_str_new(c, s, n, false, &v);
    return rc ? rc : jv_list_push(c, list, v);
}

/* Reverse a new list in place (rsplit collects from the right). */
static void list_reverse(Jv list) {
    JvList *l = list.as.l;
    for (size_t i = 0, j = l->n ? l->n - 1 : 0; i < j; i++, j--) {
        Jv t = l->items[i];
        l->items[i] = l->items[j];
        l->items[j] = t;
    }
}

/* Byte offset of the code point before byte i. */
static size_t prev_char(const char *s, size_t i) {
    do i--;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

/* str.split()/rsplit() with no separator: runs of whitespace separate,
 * none at either end; once maxsplit pieces are cut, the rest is one piece
 * whose whitespace is dropped only on the side the cutting came from. */
static int split_space(JvCtx *c, const JvStr *s, int64_t maxsplit, bool from_right, Jv list) {
    const char *d = s->data;
    size_t n = s->len, len;
    int rc = MN_OK;
    if (!from_right) {
        size_t i = 0;
        while (rc == MN_OK) {
            while (i < n && ju_is_space(js_decode(d, n, i, &len))) i += len;
            if (i >= n) break;
            if (maxsplit == 0) return push_piece(c, list, d + i, n - i);
            size_t j = i;
            while (j < n && !ju_is_space(js_decode(d, n, j, &len))) j += len;
            rc = push_piece(c, list, d + i, j - i);
            if (maxsplit > 0) maxsplit--;
            i = j;
        }
        return rc;
    }
    size_t i = n;
    while (rc == MN_OK) {
        while (i > 0) {
            size_t st = prev_char(d, i);
            if (!ju_is_space(js_decode(d, n, st, &len))) break;
            i = st;
        }
        if (i == 0) break;
        if (maxsplit == 0) {
            rc = push_piece(c, list, d, i);
            break;
        }
        size_t j = i;
        while (j > 0) {
            size_t st = prev_char(d, j);
            if (ju_is_space(js_decode(d, n, st, &len))) break;
            j = st;
        }
        rc = push_piece(c, list, d + j, i - j);
        if (maxsplit > 0) maxsplit--;
        i = j;
    }
    if (rc == MN_OK) list_reverse(list);
    return rc;
}

static int split_impl(JvCtx *c, const JvStr *s, const JvStr *sep, int64_t maxsplit, bool from_right, Jv *out);
int js_split(JvCtx *c, const JvStr *s, const JvStr *sep, int64_t maxsplit, bool from_right, Jv *out) {
    *out = jv_undef();
    return jv_clean_out(split_impl(c, s, sep, maxsplit, from_right, out), out);
}

static int split_impl(JvCtx *c, const JvStr *s, const JvStr *sep, int64_t maxsplit, bool from_right, Jv *out) {
    int rc = jv_charge(c, s->len / 8);
    if (rc) return rc;
    if ((rc = jv_list_new(c, JV_LIST_LIST, 0, out))) return rc;
    if (sep == NULL) return split_space(c, s, maxsplit, from_right, *out);
    if (sep->len == 0) return jv_fail(c, MN_EINVAL, "empty separator");
    const char *d = s->data;
    size_t n = s->len, k = sep->len;
    if (!from_right) {
        size_t i = 0;
        while (maxsplit != 0) {
            const char *hit = memmem(d + i, n - i, sep->data, k);
            if (hit == NULL) break;
            size_t at = (size_t)(hit - d);
            if ((rc = push_piece(c, *out, d + i, at - i))) return rc;
            i = at + k;
            if (maxsplit > 0) maxsplit--;
        }
        return push_piece(c, *out, d + i, n - i);
    }
    size_t end = n;
    while (maxsplit != 0 && end >= k) {
        size_t at = end - k + 1;
        bool found = false;
        while (at-- > 0) {
            if (memcmp(d + at, sep->data, k) == 0) {
                found = true;
                break;
            }
        }
        if (!found) break;
        if ((rc = push_piece(c, *out, d + at + k, end - at - k))) return rc;
        end = at;
        if (maxsplit > 0) maxsplit--;
    }
    if ((rc = push_piece(c, *out, d, end))) return rc;
    list_reverse(*out);
    return MN_OK;
}

/* A line break of str.splitlines() at s[i]: its byte length, or 0. */
static size_t line_break_at(const char *s, size_t n, size_t i) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '\r') return i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
    if (ch == '\n' || ch == 0x0B || ch == 0x0C || (ch >= 0x1C && ch <= 0x1E)) return 1;
    if (ch < 0x80) return 0;
    size_t len;
    uint32_t cp = js_decode(s, n, i, &len);
    return cp == 0x85 || cp == 0x2028 || cp == 0x2029 ? len : 0;
}

static int splitlines_impl(JvCtx *c, const JvStr *s, bool keepends, Jv *out);
int js_splitlines(JvCtx *c, const JvStr *s, bool keepends, Jv *out) {
    *out = jv_undef();
    return jv_clean_out(splitlines_impl(c, s, keepends, out), out);
}

static int splitlines_impl(JvCtx *c, const JvStr *s, bool keepends, Jv *out) {
    int rc = jv_charge(c, s->len / 8);
    if (rc) return rc;
    if ((rc = jv_list_new(c, JV_LIST_LIST, 0, out))) return rc;
    size_t start = 0, i = 0;
    while (i < s->len) {
        size_t k = line_break_at(s->data, s->len, i);
        if (k == 0) {
            i++;
            continue;
        }
        if ((rc = push_piece(c, *out, s->data + start, (keepends ? i + k : i) - start))) return rc;
        i += k;
        start = i;
    }
    if (start < s->len) rc = push_piece(c, *out, s->data + start, s->len - start);
    return rc;
}

/* ---- replace, find, count ------------------------------------------------------ */

int js_replace(JvCtx *c, const JvStr *s, const JvStr *old, const JvStr *new_s, int64_t count, Jv *out) {
    int rc = jv_charge(c, s->len / 8);
    if (rc) return rc;
    JvBuf b;
    jv_buf_init(&b, c);
    const char *d = s->data;
    size_t n = s->len;
    if (old->len == 0) {
        /* Python inserts new before every character and at the end */
        size_t i = 0;
        while (rc == MN_OK && i <= n) {
            if (count != 0) {
                rc = jv_buf_put(&b, new_s->data, new_s->len);
                if (count > 0) count--;
            }
            if (i == n || rc) break;
            size_t len;
            js_decode(d, n, i, &len);
            rc = jv_buf_put(&b, d + i, len);
            i += len;
        }
    } else {
        size_t i = 0;
        while (rc == MN_OK && count != 0) {
            const char *hit = memmem(d + i, n - i, old->data, old->len);
            if (hit == NULL) break;
            size_t at = (size_t)(hit - d);
            rc = jv_buf_put(&b, d + i, at - i);
            if (rc == MN_OK) rc = jv_buf_put(&b, new_s->data, new_s->len);
            i = at + old->len;
            if (count > 0) count--;
        }
        if (rc == MN_OK) rc = jv_buf_put(&b, d + i, n - i);
    }
    return jv_buf_finish(&b, rc, false, out);
}

void js_bounds(const JvStr *s, bool has_start, int64_t start, bool has_end, int64_t end, size_t *lo, size_t *hi) {
    /* CPython's ADJUST_INDICES: the start may stay beyond the end, which
     * callers read as "nothing there" (lo > hi) */
    int64_t n = (int64_t)s->n_chars;
    int64_t a = has_start ? start : 0, b = has_end ? end : n;
    if (a < 0) a = a + n < 0 ? 0 : a + n;
    if (b > n) b = n;
    else if (b < 0) b = b + n < 0 ? 0 : b + n;
    *lo = (size_t)a;
    *hi = (size_t)b;
}

static size_t char_to_byte(const JvStr *s, size_t i) { return jv_str_offset(s, i); }

static size_t byte_to_char(const JvStr *s, size_t off) {
    if (s->n_chars == s->len) return off;
    size_t k = 0;
    for (size_t i = 0; i < off; i++) k += ((unsigned char)s->data[i] & 0xC0) != 0x80;
    return k;
}

int64_t js_find(const JvStr *s, const JvStr *sub, size_t lo, size_t hi, bool from_right) {
    if (lo > hi) return -1;
    size_t blo = char_to_byte(s, lo), bhi = char_to_byte(s, hi);
    if (sub->len > bhi - blo) return -1;
    if (!from_right) {
        const char *hit = sub->len ? memmem(s->data + blo, bhi - blo, sub->data, sub->len) : s->data + blo;
        return hit ? (int64_t)byte_to_char(s, (size_t)(hit - s->data)) : -1;
    }
    for (size_t at = bhi - sub->len + 1; at-- > blo;)
        if (memcmp(s->data + at, sub->data, sub->len) == 0) return (int64_t)byte_to_char(s, at);
    return -1;
}

int64_t js_count(const JvStr *s, const JvStr *sub, size_t lo, size_t hi) {
    if (lo > hi) return 0;
    if (sub->len == 0) return (int64_t)(hi - lo) + 1;
    size_t blo = char_to_byte(s, lo), bhi = char_to_byte(s, hi);
    int64_t k = 0;
    while (bhi - blo >= sub->len) {
        const char *hit = memmem(s->data + blo, bhi - blo, sub->data, sub->len);
        if (hit == NULL) break;
        k++;
        blo = (size_t)(hit - s->data) + sub->len;
    }
    return k;
}

bool js_affix(const JvStr *s, const JvStr *fix, size_t lo, size_t hi, bool at_end) {
    if (lo > hi) return false;
    size_t blo = char_to_byte(s, lo), bhi = char_to_byte(s, hi);
    if (fix->len > bhi - blo) return false;
    return memcmp(s->data + (at_end ? bhi - fix->len : blo), fix->data, fix->len) == 0;
}

/* ---- predicates -------------------------------------------------------------------- */

bool js_is(const JvStr *s, JsPred which) {
    if (which == JS_IS_ASCII) {
        for (size_t i = 0; i < s->len; i++)
            if ((unsigned char)s->data[i] >= 0x80) return false;
        return true;
    }
    if (which == JS_IS_PRINTABLE) {
        for (size_t i = 0; i < s->len;) {
            size_t len;
            if (!ju_is_printable(js_decode(s->data, s->len, i, &len))) return false;
            i += len;
        }
        return true;
    }
    if (s->len == 0) return false;
    bool cased = false, prev_cased = false;
    for (size_t i = 0; i < s->len;) {
        size_t len;
        uint32_t cp = js_decode(s->data, s->len, i, &len);
        i += len;
        switch (which) {
        case JS_IS_ALNUM:
            if (!(ju_is_alpha(cp) || ju_is_decimal(cp) || ju_is_digit(cp) || ju_is_numeric(cp))) return false;
            break;
        case JS_IS_ALPHA: if (!ju_is_alpha(cp)) return false; break;
        case JS_IS_DECIMAL: if (!ju_is_decimal(cp)) return false; break;
        case JS_IS_DIGIT: if (!ju_is_digit(cp)) return false; break;
        case JS_IS_NUMERIC: if (!ju_is_numeric(cp)) return false; break;
        case JS_IS_SPACE: if (!ju_is_space(cp)) return false; break;
        case JS_IS_LOWER:
            if (ju_is_upper(cp) || ju_is_title(cp)) return false;
            if (ju_is_lower(cp)) cased = true;
            break;
        case JS_IS_UPPER:
            if (ju_is_lower(cp) || ju_is_title(cp)) return false;
            if (ju_is_upper(cp)) cased = true;
            break;
        case JS_IS_TITLE:
            if (ju_is_upper(cp) || ju_is_title(cp)) {
                if (prev_cased) return false;
                prev_cased = cased = true;
            } else if (ju_is_lower(cp)) {
                if (!prev_cased) return false;
                prev_cased = cased = true;
            } else {
                prev_cased = false;
            }
            break;
        default: break;
        }
    }
    if (which == JS_IS_LOWER || which == JS_IS_UPPER || which == JS_IS_TITLE) return cased;
    return true;
}

/* ---- padding and slicing ------------------------------------------------------------ */

int js_pad(JvCtx *c, const JvStr *s, int64_t width, uint32_t fill, char mode, Jv *out) {
    if (width <= (int64_t)s->n_chars) return jv_str_new(c, s->data, s->len, false, out);
    size_t pad = (size_t)width - s->n_chars;
    int rc = jv_charge(c, pad / 8);
    if (rc) return rc;
    size_t left = 0;
    if (mode == 'r' || mode == 'z') left = pad;
    else if (mode == 'c') left = pad / 2 + (pad & (size_t)width & 1); /* CPython's centering */
    JvBuf b;
    jv_buf_init(&b, c);
    size_t body = 0;
    if (mode == 'z' && s->len > 0 && (s->data[0] == '+' || s->data[0] == '-')) {
        rc = jv_buf_put(&b, s->data, 1);
        body = 1;
    }
    for (size_t i = 0; rc == MN_OK && i < left; i++) rc = mode == 'z' ? jv_buf_put(&b, "0", 1) : put_cp(&b, fill);
    if (rc == MN_OK) rc = jv_buf_put(&b, s->data + body, s->len - body);
    for (size_t i = left; rc == MN_OK && i < pad; i++) rc = put_cp(&b, fill);
    return jv_buf_finish(&b, rc, false, out);
}

int js_slice(JvCtx *c, const JvStr *s, int64_t start, int64_t stop, int64_t step, Jv *out) {
    if (step == 1) {
        if (stop <= start) return jv_str_new(c, "", 0, false, out);
        size_t a = jv_str_offset(s, (size_t)start), b = jv_str_offset(s, (size_t)stop);
        return jv_str_new(c, s->data + a, b - a, false, out);
    }
    size_t n;
    uint32_t *cps = decode_all(c, s, &n);
    if (cps == NULL) return c->err_code;
    int rc = MN_OK;
    JvBuf b;
    jv_buf_init(&b, c);
    for (int64_t i = start; rc == MN_OK && (step > 0 ? i < stop : i > stop); i += step) rc = put_cp(&b, cps[i]);
    jv_mem_free(c, cps, (s->n_chars + 1) * sizeof(uint32_t));
    return jv_buf_finish(&b, rc, false, out);
}

int js_char_at(JvCtx *c, const JvStr *s, size_t i, Jv *out) {
    size_t a = jv_str_offset(s, i), len;
    js_decode(s->data, s->len, a, &len);
    return jv_str_new(c, s->data + a, len, false, out);
}

/* ---- number parsing ---------------------------------------------------------------- */

/* Python's int()/float() accept surrounding whitespace and "_" between
 * digits; copy the core without underscores into buf. false if malformed. */
static bool numeric_core(const JvStr *s, char *buf, size_t cap, bool allow_underscore_after_prefix) {
    size_t lo = 0, hi = s->len, len;
    while (lo < hi && ju_is_space(js_decode(s->data, s->len, lo, &len))) lo += len;
    while (hi > lo) {
        size_t st = prev_char(s->data, hi);
        if (!ju_is_space(js_decode(s->data, s->len, st, &len))) break;
        hi = st;
    }
    size_t k = 0;
    for (size_t i = lo; i < hi; i++) {
        char ch = s->data[i];
        if ((unsigned char)ch >= 0x80) return false;
        if (ch == '_') {
            /* only between two digits (or after a base prefix for int) */
            bool prev_ok = i > lo && (isalnum((unsigned char)s->data[i - 1]));
            bool next_ok = i + 1 < hi && isalnum((unsigned char)s->data[i + 1]);
            if (!prev_ok || !next_ok) return false;
            if (!allow_underscore_after_prefix && !isdigit((unsigned char)s->data[i - 1])) return false;
            continue;
        }
        if (k + 1 >= cap) return false;
        buf[k++] = ch;
    }
    buf[k] = '\0';
    return k > 0;
}

int js_parse_int(const JvStr *s, int base, int64_t *out) {
    char buf[96];
    if (!numeric_core(s, buf, sizeof buf, true)) return MN_EINVAL;
    const char *p = buf;
    bool neg = false;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    if (base == 0) {
        if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) base = 16, p += 2;
        else if (p[0] == '0' && (p[1] == 'o' || p[1] == 'O')) base = 8, p += 2;
        else if (p[0] == '0' && (p[1] == 'b' || p[1] == 'B')) base = 2, p += 2;
        else {
            base = 10;
            if (p[0] == '0') { /* "0", "00" only */
                for (const char *q = p; *q; q++)
                    if (*q != '0') return MN_EINVAL;
            }
        }
    } else if (base == 16 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) p += 2;
    else if (base == 8 && p[0] == '0' && (p[1] == 'o' || p[1] == 'O')) p += 2;
    else if (base == 2 && p[0] == '0' && (p[1] == 'b' || p[1] == 'B')) p += 2;
    if (*p == '\0' || base < 2 || base > 36) return MN_EINVAL;
    uint64_t v = 0;
    for (; *p; p++) {
        int d = isdigit((unsigned char)*p) ? *p - '0' : isalpha((unsigned char)*p) ? tolower((unsigned char)*p) - 'a' + 10 : 99;
        if (d >= base) return MN_EINVAL;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return MN_ERANGE;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (v > (uint64_t)INT64_MAX + (neg ? 1 : 0)) return MN_ERANGE;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return MN_OK;
}

int js_parse_float(const JvStr *s, double *out) {
    char buf[400];
    if (!numeric_core(s, buf, sizeof buf, false)) return MN_EINVAL;
    const char *p = buf;
    const char *q = p + (*p == '+' || *p == '-');
    /* Python accepts inf, infinity, nan (any case); strtod also takes hex
     * floats and "nan(...)", which Python refuses */
    bool special = strcasecmp(q, "inf") == 0 || strcasecmp(q, "infinity") == 0 || strcasecmp(q, "nan") == 0;
    if (!special) {
        bool digit = false;
        for (const char *r = q; *r; r++) {
            if (isdigit((unsigned char)*r)) digit = true;
            else if (*r != '.' && *r != 'e' && *r != 'E' && *r != '+' && *r != '-') return MN_EINVAL;
        }
        if (!digit) return MN_EINVAL;
    }
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (*end != '\0') return MN_EINVAL;
    *out = v;
    return MN_OK;
}

/* ---- printf-style formatting ----------------------------------------------------------- */

typedef struct FmtArgs {
    Jv all;
    const Jv *items;
    size_t n, next;
    const JvDict *map;
    bool is_lenient; /* a mapping (or list) argument: unused arguments are fine */
} FmtArgs;

static int next_arg(JvCtx *c, FmtArgs *a, Jv *out) {
    if (a->next >= a->n) return jv_fail(c, MN_EINVAL, "not enough arguments for format string");
    *out = a->items[a->next++];
    return MN_OK;
}

static int int_of(JvCtx *c, Jv v, char conv, int64_t *out) {
    if (v.kind == JV_INT) *out = v.as.i;
    else if (v.kind == JV_BOOL) *out = v.as.b;
    else if (v.kind == JV_FLOAT && strchr("diu", conv)) {
        if (!isfinite(v.as.f)) return jv_fail(c, MN_EINVAL, "cannot convert float %s to integer", isnan(v.as.f) ? "NaN" : "infinity");
        if (fabs(v.as.f) >= 9.2e18) return jv_fail(c, MN_EUNSUPPORTED, "integer too large (mnemo's integers are 64-bit)");
        *out = (int64_t)v.as.f;
    } else if (strchr("diu", conv)) {
        return jv_fail(c, MN_EINVAL, "%%%c format: a real number is required, not %s", conv, jv_type_name(v));
    } else {
        return jv_fail(c, MN_EINVAL, "%%%c format: an integer is required, not %s", conv, jv_type_name(v));
    }
    return MN_OK;
}

/* One conversion with its flags, width and precision (-1: none). */
static int format_one(JvCtx *c, JvBuf *b, Jv v, const char *flags, int64_t width, int64_t prec, char conv) {
    int rc;
    bool left = strchr(flags, '-') != NULL;
    JvBuf body;
    jv_buf_init(&body, c);
    if (conv == 's' || conv == 'r' || conv == 'a') {
        rc = conv == 's' ? jv_str_of(c, v, &body) : jv_repr(c, v, &body);
        if (conv == 'a' && rc == MN_OK) {
            for (size_t i = 0; i < body.len; i++)
                if ((unsigned char)body.data[i] >= 0x80) {
                    jv_buf_deinit(&body);
                    return jv_fail(c, MN_EUNSUPPORTED, "%%a of non-ASCII text is not supported");
                }
        }
        if (rc == MN_OK && prec >= 0) {
            size_t k = 0, i = 0;
            while (i < body.len && (int64_t)k < prec) {
                i++;
                while (i < body.len && ((unsigned char)body.data[i] & 0xC0) == 0x80) i++;
                k++;
            }
            body.len = i;
        }
    } else if (conv == 'c') {
        if (v.kind == JV_STR) {
            if (v.as.s->n_chars != 1) {
                jv_buf_deinit(&body);
                return jv_fail(c, MN_EINVAL, "%%c requires int or char");
            }
            rc = jv_buf_put(&body, v.as.s->data, v.as.s->len);
        } else {
            int64_t i;
            if ((rc = int_of(c, v, 'c', &i)) == MN_OK) {
                if (i < 0 || i > 0x10FFFF) rc = jv_fail(c, MN_EINVAL, "%%c arg not in range(0x110000)");
                else rc = put_cp(&body, (uint32_t)i);
            }
        }
    } else {
        char spec[32], num[512];
        size_t k = 0;
        spec[k++] = '%';
        for (const char *f = flags; *f && k < 8; f++)
            if (*f != '-') spec[k++] = *f;
        if (strchr("diuoxX", conv)) {
            int64_t i;
            if ((rc = int_of(c, v, conv, &i)) == MN_OK) {
                char cc = conv == 'i' || conv == 'u' ? 'd' : conv;
                if (prec >= 0) snprintf(spec + k, sizeof spec - k, ".%dll%c", (int)(prec > 200 ? 200 : prec), cc);
                else snprintf(spec + k, sizeof spec - k, "ll%c", cc);
                if (cc == 'o' && strchr(flags, '#')) {
                    /* Python writes 0o17 where C writes 017 */
                    char *hash = strchr(spec, '#');
                    memmove(hash, hash + 1, strlen(hash));
                    snprintf(num, sizeof num, spec, (long long)(i < 0 ? -i : i));
                    char tmp[520];
                    snprintf(tmp, sizeof tmp, "%s0o%s", i < 0 ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "", num);
                    rc = jv_buf_puts(&body, tmp);
                } else {
                    snprintf(num, sizeof num, spec, (long long)i);
                    rc = jv_buf_puts(&body, num);
                }
            }
        } else if (strchr("eEfFgG", conv)) {
            if (!jv_is_number(v)) {
                rc = jv_fail(c, MN_EINVAL, "must be real number, not %s", jv_type_name(v));
            } else {
                snprintf(spec + k, sizeof spec - k, ".%d%c", (int)(prec < 0 ? 6 : prec > 200 ? 200 : prec), conv);
                snprintf(num, sizeof num, spec, jv_as_double(v));
                rc = jv_buf_puts(&body, num);
            }
        } else {
            rc = jv_fail(c, MN_EINVAL, "unsupported format character '%c' (0x%x)", conv, (unsigned)(unsigned char)conv);
        }
    }
    if (rc) {
        jv_buf_deinit(&body);
        return rc;
    }
    size_t chars = 0;
    for (size_t i = 0; i < body.len; i++) chars += ((unsigned char)body.data[i] & 0xC0) != 0x80;
    size_t pad = width > (int64_t)chars ? (size_t)width - chars : 0;
    if ((rc = jv_charge(c, pad / 8))) {
        jv_buf_deinit(&body);
        return rc;
    }
    bool zero = strchr(flags, '0') && !left && conv != 's' && conv != 'r' && conv != 'a' && conv != 'c';
    size_t sign = zero && body.len > 0 && strchr("+- ", body.data[0]) ? 1 : 0;
    if (sign) rc = jv_buf_put(b, body.data, 1);
    for (size_t i = 0; rc == MN_OK && !left && i < pad; i++) rc = jv_buf_put(b, zero ? "0" : " ", 1);
    if (rc == MN_OK) rc = jv_buf_put(b, body.data + sign, body.len - sign);
    for (size_t i = 0; rc == MN_OK && left && i < pad; i++) rc = jv_buf_put(b, " ", 1);
    jv_buf_deinit(&body);
    return rc;
}

/* A width or precision: digits or '*' (taken from the arguments). */
static int fmt_number(JvCtx *c, const char *f, size_t n, size_t *i, FmtArgs *a, int64_t *out) {
    if (*i < n && f[*i] == '*') {
        (*i)++;
        Jv v = jv_undef();
        int rc = next_arg(c, a, &v);
        if (rc) return rc;
        if (v.kind != JV_INT) return jv_fail(c, MN_EINVAL, "* wants int");
        *out = v.as.i;
        return MN_OK;
    }
    int64_t x = 0;
    while (*i < n && isdigit((unsigned char)f[*i])) {
        if (x > 100000000) return jv_fail(c, MN_ERANGE, "width too big");
        x = x * 10 + (f[(*i)++] - '0');
    }
    *out = x;
    return MN_OK;
}

int js_percent(JvCtx *c, const JvStr *fmt, Jv args, Jv *out) {
    *out = jv_undef();
    FmtArgs a = {.all = args};
    if (args.kind == JV_LIST && args.as.l->tag == JV_LIST_TUPLE) {
        a.items = args.as.l->items;
        a.n = args.as.l->n;
    } else {
        a.items = &a.all;
        a.n = 1;
        if (args.kind == JV_DICT) a.map = args.as.d;
        a.is_lenient = args.kind == JV_DICT || args.kind == JV_LIST;
    }
    const char *f = fmt->data;
    size_t n = fmt->len, i = 0;
    JvBuf b;
    jv_buf_init(&b, c);
    int rc = jv_charge(c, n / 8);
    bool used_map = false;
    while (rc == MN_OK && i < n) {
        const char *pct = memchr(f + i, '%', n - i);
        size_t stop = pct ? (size_t)(pct - f) : n;
        if ((rc = jv_buf_put(&b, f + i, stop - i)) || pct == NULL) {
            i = n;
            break;
        }
        i = stop + 1;
        Jv v = jv_undef();
        bool have_v = false;
        if (i < n && f[i] == '(') {
            if (a.map == NULL) {
                rc = jv_fail(c, MN_EINVAL, "format requires a mapping");
                break;
            }
            size_t depth = 1, k = i + 1;
            while (k < n && depth > 0) {
                if (f[k] == '(') depth++;
                else if (f[k] == ')') depth--;
                k++;
            }
            if (depth > 0) {
                rc = jv_fail(c, MN_EINVAL, "incomplete format key");
                break;
            }
            const Jv *hit = jv_dict_get_str(a.map, f + i + 1, k - i - 2);
            if (hit == NULL) {
                rc = jv_fail(c, MN_EINVAL, "KeyError: '%.*s'", (int)(k - i - 2), f + i + 1);
                break;
            }
            v = *hit;
            have_v = true;
            used_map = true;
            i = k;
        }
        char flags[8];
        size_t nf = 0;
        while (i < n && strchr("-+ #0", f[i])) {
            if (nf + 1 < sizeof flags) flags[nf++] = f[i];
            i++;
        }
        flags[nf] = '\0';
        int64_t width = 0, prec = -1;
        if ((rc = fmt_number(c, f, n, &i, &a, &width))) break;
        if (i < n && f[i] == '.') {
            i++;
            if ((rc = fmt_number(c, f, n, &i, &a, &prec))) break;
        }
        while (i < n && strchr("hlL", f[i])) i++;
        if (i >= n) {
            rc = jv_fail(c, MN_EINVAL, "incomplete format");
            break;
        }
        char conv = f[i++];
        if (conv == '%') {
            rc = jv_buf_put(&b, "%", 1);
            continue;
        }
        if (!have_v) {
            if (a.map != NULL) {
                v = a.all; /* %s with a dict argument formats the dict */
                a.next = a.n;
            } else if ((rc = next_arg(c, &a, &v))) {
                break;
            }
        }
        if (width < 0) {
            flags[nf++] = '-';
            flags[nf] = '\0';
            width = -width;
        }
        rc = format_one(c, &b, v, flags, width, prec, conv);
    }
    if (rc == MN_OK && !used_map && !a.is_lenient && a.next < a.n)
        rc = jv_fail(c, MN_EINVAL, "not all arguments converted during string formatting");
    return jv_buf_finish(&b, rc, false, out);
}

/* ---- format mini-language ---------------------------------------------------------------- */

typedef struct Spec {
    uint32_t fill;
    char align; /* '<', '>', '=', '^' or 0 for the type's default */
    char sign;  /* '+', '-', ' ' or 0 */
    bool alt, zero;
    int64_t width, prec; /* -1: none */
    char group; /* ',', '_' or 0 */
    char type;  /* 0 for none */
} Spec;

static int parse_spec(JvCtx *c, const char *s, size_t n, Spec *sp) {
    *sp = (Spec){.fill = ' ', .width = -1, .prec = -1};
    size_t i = 0, len = 0;
    uint32_t first = n ? js_decode(s, n, 0, &len) : 0;
    if (n > len && strchr("<>=^", s[len])) {
        sp->fill = first;
        sp->align = s[len];
        i = len + 1;
    } else if (n > 0 && strchr("<>=^", s[0])) {
        sp->align = s[0];
        i = 1;
    }
    if (i < n && strchr("+- ", s[i])) sp->sign = s[i++];
    if (i < n && s[i] == '#') sp->alt = true, i++;
    if (i < n && s[i] == '0') {
        sp->zero = true;
        i++;
    }
    if (i < n && isdigit((unsigned char)s[i])) {
        sp->width = 0;
        while (i < n && isdigit((unsigned char)s[i]))
            if ((sp->width = sp->width * 10 + (s[i++] - '0')) > 100000000)
                return jv_fail(c, MN_ERANGE, "Too many decimal digits in format string");
    }
    if (i < n && (s[i] == ',' || s[i] == '_')) sp->group = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || !isdigit((unsigned char)s[i])) return jv_fail(c, MN_EINVAL, "Format specifier missing precision");
        sp->prec = 0;
        while (i < n && isdigit((unsigned char)s[i]))
            if ((sp->prec = sp->prec * 10 + (s[i++] - '0')) > 1000)
                return jv_fail(c, MN_ERANGE, "Too many decimal digits in format string");
    }
    if (i < n) sp->type = s[i++];
    if (i < n) return jv_fail(c, MN_EINVAL, "Invalid format specifier");
    if (sp->zero && sp->align == 0) {
        sp->fill = '0';
        sp->align = '=';
    }
    return MN_OK;
}

/* Put body (sign and prefix first, counted apart for '=') padded per sp. */
static int pad_put(JvBuf *out, const Spec *sp, char def_align, const char *pre, size_t pre_n, const char *body,
                   size_t body_n) {
    size_t chars = pre_n;
    for (size_t i = 0; i < body_n; i++) chars += ((unsigned char)body[i] & 0xC0) != 0x80;
    size_t pad = sp->width > (int64_t)chars ? (size_t)sp->width - chars : 0;
    char align = sp->align ? sp->align : def_align;
    size_t left = align == '>' || align == '=' ? pad : align == '^' ? pad / 2 : 0;
    int rc = jv_charge(out->ctx, pad / 8);
    if (rc == MN_OK && align == '=') rc = jv_buf_put(out, pre, pre_n);
    for (size_t i = 0; rc == MN_OK && i < left; i++) rc = put_cp(out, sp->fill);
    if (rc == MN_OK && align != '=') rc = jv_buf_put(out, pre, pre_n);
    if (rc == MN_OK) rc = jv_buf_put(out, body, body_n);
    for (size_t i = left; rc == MN_OK && i < pad; i++) rc = put_cp(out, sp->fill);
    return rc;
}

/* Insert grouping characters into the integer digits of buf (in place;
 * buf must have room), every `every` digits from the right. */
static void group_digits(char *buf, char sep, int every) {
    char *dot = buf;
    while (*dot && isalnum((unsigned char)*dot) && *dot != 'e' && *dot != 'E') dot++;
    size_t ndig = (size_t)(dot - buf);
    if (ndig <= (size_t)every) return;
    size_t extra = (ndig - 1) / (size_t)every, tail = strlen(dot);
    memmove(dot + extra, dot, tail + 1);
    char *src = buf + ndig, *dst = buf + ndig + extra;
    int k = 0;
    while (src > buf) {
        *--dst = *--src;
        if (++k == every && src > buf) {
            *--dst = sep;
            k = 0;
        }
    }
}

static int format_number(JvCtx *c, Jv v, const Spec *sp, JvBuf *out) {
    char type = sp->type;
    bool is_float_type = type && strchr("eEfFgG%", type);
    char body[700], pre[4] = "";
    size_t pre_n = 0;
    bool neg;
    if (!is_float_type && (v.kind == JV_INT || v.kind == JV_BOOL)) {
        if (type && !strchr("bcdoxXn", type))
            return jv_fail(c, MN_EINVAL, "Unknown format code '%c' for object of type 'int'", type);
        if (sp->prec >= 0) return jv_fail(c, MN_EINVAL, "Precision not allowed in integer format specifier");
        int64_t x = v.kind == JV_BOOL ? v.as.b : v.as.i;
        if (type == 'c') {
            if (x < 0 || x > 0x10FFFF) return jv_fail(c, MN_EINVAL, "%%c arg not in range(0x110000)");
            char u[4];
            size_t k = utf8_encode((uint32_t)x, u);
            return pad_put(out, sp, '>', "", 0, u, k);
        }
        neg = x < 0;
        uint64_t ax = neg ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        int base = type == 'b' ? 2 : type == 'o' ? 8 : (type == 'x' || type == 'X') ? 16 : 10;
        char tmp[80];
        size_t k = 0;
        do {
            unsigned d = (unsigned)(ax % (uint64_t)base);
            tmp[k++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
            ax /= (uint64_t)base;
        } while (ax);
        for (size_t i = 0; i < k; i++) body[i] = tmp[k - 1 - i];
        body[k] = '\0';
        if (sp->group) group_digits(body, sp->group, base == 10 ? 3 : 4);
        if (neg) pre[pre_n++] = '-';
        else if (sp->sign == '+' || sp->sign == ' ') pre[pre_n++] = sp->sign;
        if (sp->alt && base != 10) {
            pre[pre_n++] = '0';
            pre[pre_n++] = type;
        }
        return pad_put(out, sp, '>', pre, pre_n, body, strlen(body));
    }
    if (type && !is_float_type)
        return jv_fail(c, MN_EINVAL, "Unknown format code '%c' for object of type 'float'", type);
    double f = jv_as_double(v);
    neg = signbit(f);
    double af = fabs(f);
    int prec = sp->prec < 0 ? 6 : (int)sp->prec;
    if (!isfinite(af)) {
        snprintf(body, sizeof body, "%s", isnan(af) ? "nan" : "inf");
        if (type && strchr("EFG", type)) for (char *q = body; *q; q++) *q = (char)toupper((unsigned char)*q);
        if (type == '%') strcat(body, "%");
    } else if (type == 0 && sp->prec < 0) {
        jv_float_repr(af, body);
    } else if (type == 0) {
        /* like 'g', but scientific from exp >= p - 1 and a fixed result
         * keeps one digit after the point */
        int p = prec == 0 ? 1 : prec;
        char e[40];
        snprintf(e, sizeof e, "%.*e", p - 1, af);
        int exp10 = atoi(strchr(e, 'e') + 1);
        if (exp10 < -4 || exp10 >= p - 1) {
            snprintf(body, sizeof body, "%.*e", p - 1, af);
            char *ep = strchr(body, 'e'), *z = ep;
            while (z > body && z[-1] == '0') z--;
            if (z > body && z[-1] == '.') z--;
            memmove(z, ep, strlen(ep) + 1);
        } else {
            snprintf(body, sizeof body, "%.*f", p - 1 - exp10, af);
            char *z = body + strlen(body);
            if (strchr(body, '.')) {
                while (z[-1] == '0') z--;
                if (z[-1] == '.') z++;
                *z = '\0';
            } else {
                strcat(body, ".0");
            }
        }
    } else {
        char fmt[16];
        snprintf(fmt, sizeof fmt, "%%%s.%d%c", sp->alt ? "#" : "", prec, type == '%' ? 'f' : type);
        snprintf(body, sizeof body - 2, fmt, type == '%' ? af * 100 : af);
        if (type == '%') strcat(body, "%");
    }
    if (sp->group) group_digits(body, sp->group, 3);
    if (neg && !(isnan(f))) pre[pre_n++] = '-';
    else if (sp->sign == '+' || sp->sign == ' ') pre[pre_n++] = sp->sign;
    return pad_put(out, sp, '>', pre, pre_n, body, strlen(body));
}

int js_format_value(JvCtx *c, Jv v, const char *spec, size_t n, JvBuf *out) {
    if (n == 0) return jv_str_of(c, v, out);
    Spec sp;
    int rc = parse_spec(c, spec, n, &sp);
    if (rc) return rc;
    if (v.kind == JV_STR) {
        if (sp.type && sp.type != 's') return jv_fail(c, MN_EINVAL, "Unknown format code '%c' for object of type 'str'", sp.type);
        if (sp.sign) return jv_fail(c, MN_EINVAL, "Sign not allowed in string format specifier");
        if (sp.alt) return jv_fail(c, MN_EINVAL, "Alternate form (#) not allowed in string format specifier");
        if (sp.align == '=') return jv_fail(c, MN_EINVAL, "'=' alignment not allowed in string format specifier");
        if (sp.group) return jv_fail(c, MN_EINVAL, "Cannot specify '%c' with 's'.", sp.group);
        size_t len = v.as.s->len;
        if (sp.prec >= 0 && (size_t)sp.prec < v.as.s->n_chars) len = jv_str_offset(v.as.s, (size_t)sp.prec);
        return pad_put(out, &sp, '<', "", 0, v.as.s->data, len);
    }
    if (jv_is_number(v)) return format_number(c, v, &sp, out);
    return jv_fail(c, MN_EINVAL, "unsupported format string passed to %s.__format__", jv_type_name(v));
}
