/* jinja_parse.c — the lexer and parser of Jinja templates (jinja_parse.h).
 *
 * Two passes over the source. The lexer turns it into an array of tokens
 * (data, tag delimiters, names, literals, operators), applying jinja2's
 * whitespace control as it cuts the data between tags. The parser is a
 * recursive descent over that array with one function per rule of jinja2's
 * grammar, building nodes in the template's arena; a last walk reports
 * unknown filters and tests outside conditional code, where jinja2 reports
 * them at compile time (inside an if or a conditional expression they fail
 * only when evaluated, as jinja2 defers them).
 *
 * Everything lives in one arena owned by the JnTemplate, so failures at any
 * depth just free the arena. Line and column numbers (1-based; columns
 * count characters) are kept on every token and node for error messages.
 */
#include "model/jinja_parse.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "model/jinja_builtins.h"
#include "model/jinja_unicode.h"
#include "base/utf8.h"

/* ---- arena ----------------------------------------------------------------------- */

typedef struct ArenaChunk {
    struct ArenaChunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} ArenaChunk;

typedef struct Arena {
    ArenaChunk *head;
} Arena;

#define ARENA_CHUNK 65536

static void *arena_alloc(Arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->head == NULL || a->head->cap - a->head->used < n) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        ArenaChunk *c = mn_malloc(sizeof(ArenaChunk) + cap);
        if (c == NULL) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(Arena *a) {
    while (a->head) {
        ArenaChunk *c = a->head;
        a->head = c->next;
        mn_free(c);
    }
}

struct JnTemplate {
    Arena arena;
    JnBlock body;
};

/* ---- tokens ------------------------------------------------------------------------ */

typedef enum TokType {
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF,
} TokType;

typedef enum TokOp {
    O_ADD, O_SUB, O_DIV, O_FLOORDIV, O_MUL, O_MOD, O_POW, O_TILDE,
    O_LBRACKET, O_RBRACKET, O_LPAREN, O_RPAREN, O_LBRACE, O_RBRACE,
    O_EQ, O_NE, O_GT, O_GTEQ, O_LT, O_LTEQ, O_ASSIGN, O_DOT, O_COLON, O_PIPE, O_COMMA, O_SEMICOLON,
} TokOp;

static const struct {
    const char *text;
    TokOp op;
} OPERATORS[] = {
    /* two-character operators first: the longest match wins */
    {"//", O_FLOORDIV}, {"**", O_POW}, {"==", O_EQ}, {"!=", O_NE}, {">=", O_GTEQ}, {"<=", O_LTEQ},
    {"+", O_ADD}, {"-", O_SUB}, {"/", O_DIV}, {"*", O_MUL}, {"%", O_MOD}, {"~", O_TILDE},
    {"[", O_LBRACKET}, {"]", O_RBRACKET}, {"(", O_LPAREN}, {")", O_RPAREN}, {"{", O_LBRACE}, {"}", O_RBRACE},
    {">", O_GT}, {"<", O_LT}, {"=", O_ASSIGN}, {".", O_DOT}, {":", O_COLON}, {"|", O_PIPE}, {",", O_COMMA},
    {";", O_SEMICOLON},
};

typedef struct Tok {
    TokType type;
    TokOp op;
    uint32_t line, col;
    const char *text; /* DATA, NAME, STRING (unescaped), operator text */
    size_t len;
    int64_t ival;
    double fval;
} Tok;

typedef struct Lexer {
    Arena *arena;
    const char *src; /* normalized */
    size_t n;
    Tok *toks;
    size_t n_toks, cap;
    /* line/column of byte offset pos_off, advanced monotonically */
    size_t pos_off;
    uint32_t pos_line, pos_col;
    MnErr *err;
} Lexer;

static void lx_where(Lexer *lx, size_t off, uint32_t *line, uint32_t *col) {
    if (off < lx->pos_off) { /* not expected: restart from the top */
        lx->pos_off = 0;
        lx->pos_line = 1;
        lx->pos_col = 1;
    }
    for (size_t i = lx->pos_off; i < off && i < lx->n; i++) {
        unsigned char ch = (unsigned char)lx->src[i];
        if (ch == '\n') {
            lx->pos_line++;
            lx->pos_col = 1;
        } else if ((ch & 0xC0) != 0x80) {
            lx->pos_col++;
        }
    }
    lx->pos_off = off;
    *line = lx->pos_line;
    *col = lx->pos_col;
}

static int lx_fail(Lexer *lx, size_t off, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int lx_fail(Lexer *lx, size_t off, int code, const char *fmt, ...) {
    uint32_t line, col;
    lx_where(lx, off, &line, &col);
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mn_err_set(lx->err, code, "line %u, column %u: %s", line, col, msg);
}

static Tok *lx_push(Lexer *lx, TokType type, size_t off) {
    if (lx->n_toks == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        Tok *t = arena_alloc(lx->arena, cap * sizeof(Tok));
        if (t == NULL) return NULL;
        if (lx->n_toks) memcpy(t, lx->toks, lx->n_toks * sizeof(Tok));
        lx->toks = t;
        lx->cap = cap;
    }
    Tok *t = &lx->toks[lx->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    lx_where(lx, off, &t->line, &t->col);
    return t;
}

/* Python whitespace (str.isspace, and re's \s) at src[i]: its byte length, or 0. */
static size_t space_at(const char *s, size_t i, size_t n) {
    unsigned char ch = (unsigned char)s[i];
    if (ch < 0x80) return (ch == ' ' || (ch >= 0x09 && ch <= 0x0D) || (ch >= 0x1C && ch <= 0x1F)) ? 1 : 0;
    uint32_t cp;
    int k = utf8_decode_strict((const unsigned char *)s + i, n - i, &cp);
    return k > 0 && ju_is_space(cp) ? (size_t)k : 0;
}

static size_t skip_space(const char *s, size_t i, size_t n) {
    size_t k;
    while (i < n && (k = space_at(s, i, n)) > 0) i += k;
    return i;
}

/* The end of s[from..end) without its trailing whitespace (str.rstrip()). */
static size_t rstrip_end(const char *s, size_t from, size_t end) {
    while (end > from) {
        size_t start = end - 1;
        while (start > from && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
        if (space_at(s, start, end) != end - start) break;
        end = start;
    }
    return end;
}

/* jinja2's whitespace control on the data before a tag: "-" strips all
 * trailing whitespace; lstrip_blocks (block and comment tags, not "+")
 * drops the spaces between the last newline (or the start of a line) and
 * the tag. Returns the data's new end. */
static size_t lx_control(Lexer *lx, size_t from, size_t end, char sign, bool is_var, bool line_starting) {
    if (sign == '-') return rstrip_end(lx->src, from, end);
    if (sign == '+' || is_var) return end;
    size_t l_pos = end;
    while (l_pos > from && lx->src[l_pos - 1] != '\n') l_pos--;
    bool has_nl = l_pos > from;
    if (!has_nl && !line_starting) return end;
    if (l_pos == end) return end; /* \s+ needs one character */
    if (skip_space(lx->src, l_pos, end) == end) return l_pos;
    return end;
}

static int lx_data(Lexer *lx, size_t from, size_t end) {
    if (end <= from) return MN_OK;
    Tok *t = lx_push(lx, T_DATA, from);
    if (t == NULL) return MN_ENOMEM;
    t->text = lx->src + from;
    t->len = end - from;
    return MN_OK;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static bool is_oct(char c) { return c >= '0' && c <= '7'; }
static bool is_bin(char c) { return c == '0' || c == '1'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* (\d+_)*\d+ at i: its end, or i when there is none. */
static size_t scan_digits(const char *s, size_t i, size_t n) {
    if (i >= n || !is_digit(s[i])) return i;
    size_t p = i;
    for (;;) {
        while (p < n && is_digit(s[p])) p++;
        if (p + 1 < n && s[p] == '_' && is_digit(s[p + 1])) p++;
        else return p;
    }
}

/* jinja2's float_re at i (not right after a dot): its end, or i. */
static size_t scan_float(const char *s, size_t i, size_t n) {
    if (i > 0 && s[i - 1] == '.') return i;
    size_t p = scan_digits(s, i, n);
    if (p == i) return i;
    /* (\.digits)? e[+-]?digits, else \.digits */
    size_t frac = p;
    if (frac < n && s[frac] == '.') {
        size_t q = scan_digits(s, frac + 1, n);
        if (q > frac + 1) frac = q;
    }
    for (int pass = 0; pass < 2; pass++) {
        size_t q = pass == 0 ? frac : p;
        if (q < n && (s[q] == 'e' || s[q] == 'E')) {
            size_t r = q + 1;
            if (r < n && (s[r] == '+' || s[r] == '-')) r++;
            size_t e = scan_digits(s, r, n);
            if (e > r) return e;
        }
        if (frac == p) break;
    }
    if (frac > p) return frac;
    return i;
}

/* (_?[x])+ at i: its end, or i. */
static size_t scan_prefixed(const char *s, size_t i, size_t n, bool (*ok)(char)) {
    size_t p = i;
    for (;;) {
        if (p + 1 < n && s[p] == '_' && ok(s[p + 1])) p += 2;
        else if (p < n && ok(s[p])) p++;
        else return p;
    }
}

/* jinja2's integer_re at i: its end and base, or i. */
static size_t scan_int(const char *s, size_t i, size_t n, int *base) {
    if (i + 1 < n && s[i] == '0') {
        char x = s[i + 1];
        bool (*ok)(char) = NULL;
        if (x == 'b' || x == 'B') ok = is_bin, *base = 2;
        else if (x == 'o' || x == 'O') ok = is_oct, *base = 8;
        else if (x == 'x' || x == 'X') ok = is_hex, *base = 16;
        if (ok) {
            size_t e = scan_prefixed(s, i + 2, n, ok);
            if (e > i + 2) return e;
        }
    }
    *base = 10;
    if (i < n && s[i] >= '1' && s[i] <= '9') return scan_prefixed(s, i + 1, n, is_digit);
    if (i < n && s[i] == '0') {
        size_t p = i + 1;
        for (;;) {
            if (p + 1 < n && s[p] == '_' && s[p + 1] == '0') p += 2;
            else if (p < n && s[p] == '0') p++;
            else return p;
        }
    }
    return i;
}

static int lx_number(Lexer *lx, size_t *pos) {
    const char *s = lx->src;
    size_t i = *pos, n = lx->n;
    char digits[128];
    size_t e = scan_float(s, i, n);
    if (e > i) {
        size_t k = 0;
        for (size_t j = i; j < e && k + 1 < sizeof digits; j++)
            if (s[j] != '_') digits[k++] = s[j];
        digits[k] = '\0';
        Tok *t = lx_push(lx, T_FLOAT, i);
        if (t == NULL) return MN_ENOMEM;
        t->fval = strtod(digits, NULL);
        t->text = s + i;
        t->len = e - i;
        *pos = e;
        return MN_OK;
    }
    int base;
    e = scan_int(s, i, n, &base);
    if (e == i) return MN_ENOTFOUND;
    size_t k = 0;
    for (size_t j = base == 10 ? i : i + 2; j < e; j++) {
        if (s[j] == '_') continue;
        if (k + 1 >= sizeof digits) return lx_fail(lx, i, MN_EUNSUPPORTED, "integer literal too large (mnemo's integers are 64-bit)");
        digits[k++] = s[j];
    }
    digits[k] = '\0';
    errno = 0;
    char *endp;
    unsigned long long v = strtoull(digits, &endp, base);
    if (errno == ERANGE || v > INT64_MAX)
        return lx_fail(lx, i, MN_EUNSUPPORTED, "integer literal too large (mnemo's integers are 64-bit)");
    Tok *t = lx_push(lx, T_INT, i);
    if (t == NULL) return MN_ENOMEM;
    t->ival = (int64_t)v;
    t->text = s + i;
    t->len = e - i;
    *pos = e;
    return MN_OK;
}

/* Python's decoding of a string literal's body (jinja2 unescapes with
 * backslashreplace + unicode-escape) into out (3 * n + 1 bytes). */
static int lx_unescape(Lexer *lx, size_t at, const char *s, size_t n, char *out, size_t *out_len) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        if (ch != '\\') {
            out[o++] = (char)ch;
            i++;
            continue;
        }
        if (i + 1 >= n) { /* cannot happen: the closing quote would be escaped */
            out[o++] = '\\';
            break;
        }
        unsigned char e = (unsigned char)s[i + 1];
        if (e >= 0x80) {
            /* "\é": backslashreplace makes it "\\xe9", which decodes to "\xe9" */
            uint32_t cp;
            int k = utf8_decode_strict((const unsigned char *)s + i + 1, n - i - 1, &cp);
            if (k <= 0) return lx_fail(lx, at, MN_EFORMAT, "invalid UTF-8 in a string literal");
            o += (size_t)sprintf(out + o, cp <= 0xFF ? "\\x%02x" : cp <= 0xFFFF ? "\\u%04x" : "\\U%08x", cp);
            i += 1 + (size_t)k;
            continue;
        }
        i += 2;
        uint32_t cp;
        switch (e) {
        case '\n': continue;
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'v': out[o++] = '\v'; continue;
        case 'x':
        case 'u':
        case 'U': {
            size_t want = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            cp = 0;
            for (size_t k = 0; k < want; k++) {
                if (i + k >= n || !is_hex(s[i + k]))
                    return lx_fail(lx, at, MN_EFORMAT, "truncated \\%c%s escape in a string literal", e,
                                   e == 'x' ? "XX" : e == 'u' ? "XXXX" : "XXXXXXXX");
                cp = cp * 16 + (uint32_t)utf8_hex_digit(s[i + k]);
            }
            i += want;
            if (cp > 0x10FFFF) return lx_fail(lx, at, MN_EFORMAT, "illegal Unicode character in a string literal");
            break;
        }
        case 'N':
            return lx_fail(lx, at, MN_EUNSUPPORTED, "\\N{...} escapes in string literals are not supported");
        default:
            if (is_oct((char)e)) {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < n && is_oct(s[i]); k++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                break;
            }
            out[o++] = '\\'; /* unknown escapes stay as written */
            out[o++] = (char)e;
            continue;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF)
            return lx_fail(lx, at, MN_EUNSUPPORTED, "a string literal holds a lone surrogate (\\u%04x)", cp);
        o += utf8_encode(cp, out + o);
    }
    out[o] = '\0';
    *out_len = o;
    return MN_OK;
}

static int lx_string(Lexer *lx, size_t *pos) {
    const char *s = lx->src;
    size_t i = *pos, n = lx->n;
    char q = s[i];
    size_t p = i + 1;
    while (p < n && s[p] != q) p += s[p] == '\\' ? 2 : 1;
    if (p >= n) return lx_fail(lx, i, MN_EFORMAT, "unexpected char '%c' at %zu (an unterminated string)", q, i);
    size_t body = p - i - 1;
    if (body > SIZE_MAX / 4) return MN_ENOMEM;
    char *out = arena_alloc(lx->arena, 3 * body + 1);
    if (out == NULL) return MN_ENOMEM;
    size_t len = 0;
    int rc = lx_unescape(lx, i, s + i + 1, body, out, &len);
    if (rc) return rc;
    Tok *t = lx_push(lx, T_STRING, i);
    if (t == NULL) return MN_ENOMEM;
    t->text = out;
    t->len = len;
    *pos = p + 1;
    return MN_OK;
}

/* Tokens inside {{ }} or {% %} from *pos up to and including the end tag.
 * Sets *line_starting as jinja2 does (the end tag's match ends in "\n"). */
static int lx_tag(Lexer *lx, bool is_var, size_t *pos, bool *line_starting) {
    const char *s = lx->src;
    size_t n = lx->n, p = *pos;
    char stack[JN_MAX_NESTING];
    size_t depth = 0;
    int rc;
    for (;;) {
        if (p >= n)
            return lx_fail(lx, p, MN_EFORMAT, "unexpected end of template, expected '%s'.",
                           is_var ? "end of print statement" : "end of statement block");
        if (depth == 0) {
            size_t end = 0;
            char close = is_var ? '}' : '%';
            if (s[p] == '-' && p + 2 < n && s[p + 1] == close && s[p + 2] == '}') {
                end = skip_space(s, p + 3, n);
            } else if (!is_var && s[p] == '+' && p + 2 < n && s[p + 1] == '%' && s[p + 2] == '}') {
                end = p + 3;
            } else if (p + 1 < n && s[p] == close && s[p + 1] == '}') {
                end = p + 2;
                if (!is_var && end < n && s[end] == '\n') end++; /* trim_blocks */
            }
            if (end) {
                if (lx_push(lx, is_var ? T_VAR_END : T_BLOCK_END, p) == NULL) return MN_ENOMEM;
                *line_starting = s[end - 1] == '\n';
                *pos = end;
                return MN_OK;
            }
        }
        size_t k = space_at(s, p, n);
        if (k > 0) {
            p = skip_space(s, p, n);
            continue;
        }
        char ch = s[p];
        if (is_digit(ch)) {
            if ((rc = lx_number(lx, &p)) != MN_ENOTFOUND) {
                if (rc) return rc;
                continue;
            }
        }
        if (is_name_start(ch)) {
            size_t e = p + 1;
            while (e < n && is_name_char(s[e])) e++;
            if (e < n && (unsigned char)s[e] >= 0x80 && space_at(s, e, n) == 0)
                return lx_fail(lx, p, MN_EUNSUPPORTED, "names with non-ASCII characters are not supported");
            Tok *t = lx_push(lx, T_NAME, p);
            if (t == NULL) return MN_ENOMEM;
            t->text = s + p;
            t->len = e - p;
            p = e;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            if ((rc = lx_string(lx, &p))) return rc;
            continue;
        }
        size_t op_i;
        for (op_i = 0; op_i < sizeof OPERATORS / sizeof OPERATORS[0]; op_i++) {
            size_t len = strlen(OPERATORS[op_i].text);
            if (p + len <= n && memcmp(s + p, OPERATORS[op_i].text, len) == 0) break;
        }
        if (op_i == sizeof OPERATORS / sizeof OPERATORS[0]) {
            if ((unsigned char)ch >= 0x80)
                return lx_fail(lx, p, MN_EUNSUPPORTED, "names with non-ASCII characters are not supported");
            return lx_fail(lx, p, MN_EFORMAT, "unexpected char '%c' at %zu", ch, p);
        }
        TokOp op = OPERATORS[op_i].op;
        if (op == O_LBRACE || op == O_LPAREN || op == O_LBRACKET) {
            if (depth == sizeof stack)
                return lx_fail(lx, p, MN_ERANGE, "brackets nested more than %d deep", JN_MAX_NESTING);
            stack[depth++] = op == O_LBRACE ? '}' : op == O_LPAREN ? ')' : ']';
        } else if (op == O_RBRACE || op == O_RPAREN || op == O_RBRACKET) {
            if (depth == 0) return lx_fail(lx, p, MN_EFORMAT, "unexpected '%c'", ch);
            if (stack[depth - 1] != ch)
                return lx_fail(lx, p, MN_EFORMAT, "unexpected '%c', expected '%c'", ch, stack[depth - 1]);
            depth--;
        }
        Tok *t = lx_push(lx, T_OP, p);
        if (t == NULL) return MN_ENOMEM;
        t->op = op;
        t->text = OPERATORS[op_i].text;
        t->len = strlen(t->text);
        p += t->len;
    }
}

/* {% raw %} at p (after "{%" and its sign): the end of the opening tag, or 0. */
static size_t lx_raw_open(Lexer *lx, size_t p) {
    const char *s = lx->src;
    size_t n = lx->n;
    p = skip_space(s, p, n);
    if (p + 3 > n || memcmp(s + p, "raw", 3) != 0) return 0;
    p = skip_space(s, p + 3, n);
    if (p + 3 <= n && s[p] == '-' && s[p + 1] == '%' && s[p + 2] == '}') return skip_space(s, p + 3, n);
    if (p + 2 <= n && s[p] == '%' && s[p + 1] == '}') return p + 2;
    return 0;
}

/* The body of a raw block from p: finds {% endraw %}, emits the data with
 * its whitespace control, and moves *pos past the closing tag. */
static int lx_raw(Lexer *lx, size_t p, size_t *pos, bool *line_starting) {
    const char *s = lx->src;
    size_t n = lx->n;
    for (size_t i = p; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t q = i + 2;
        char sign = 0;
        if (q < n && (s[q] == '-' || s[q] == '+')) sign = s[q++];
        q = skip_space(s, q, n);
        if (q + 6 > n || memcmp(s + q, "endraw", 6) != 0) continue;
        q = skip_space(s, q + 6, n);
        size_t end = 0;
        if (q + 3 <= n && s[q] == '+' && s[q + 1] == '%' && s[q + 2] == '}') end = q + 3;
        else if (q + 3 <= n && s[q] == '-' && s[q + 1] == '%' && s[q + 2] == '}') end = skip_space(s, q + 3, n);
        else if (q + 2 <= n && s[q] == '%' && s[q + 1] == '}') {
            end = q + 2;
            if (end < n && s[end] == '\n') end++;
        }
        if (!end) continue;
        int rc = lx_data(lx, p, lx_control(lx, p, i, sign, false, *line_starting));
        if (rc) return rc;
        *line_starting = s[end - 1] == '\n';
        *pos = end;
        return MN_OK;
    }
    return lx_fail(lx, p, MN_EFORMAT, "Missing end of raw directive");
}

/* A comment from p (after "{#" and its sign) to its end tag. */
static int lx_comment(Lexer *lx, size_t p, size_t *pos, bool *line_starting) {
    const char *s = lx->src;
    size_t n = lx->n;
    for (size_t i = p; i + 1 < n; i++) {
        size_t end = 0;
        if ((s[i] == '+' || s[i] == '-') && i + 2 < n && s[i + 1] == '#' && s[i + 2] == '}')
            end = s[i] == '+' ? i + 3 : skip_space(s, i + 3, n);
        else if (s[i] == '#' && s[i + 1] == '}') {
            end = i + 2;
            if (end < n && s[end] == '\n') end++;
        }
        if (end) {
            *line_starting = s[end - 1] == '\n';
            *pos = end;
            return MN_OK;
        }
    }
    return lx_fail(lx, p, MN_EFORMAT, "Missing end of comment tag");
}

static int lx_run(Lexer *lx) {
    const char *s = lx->src;
    size_t n = lx->n, pos = 0;
    bool line_starting = true;
    int rc;
    while (pos < n) {
        size_t t = pos;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= n) {
            if ((rc = lx_data(lx, pos, n))) return rc;
            break;
        }
        char kind = s[t + 1];
        char sign = t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+') ? s[t + 2] : 0;
        size_t after = t + 2 + (sign ? 1 : 0);
        size_t raw_end = kind == '%' ? lx_raw_open(lx, after) : 0;
        if ((rc = lx_data(lx, pos, lx_control(lx, pos, t, sign, kind == '{', line_starting)))) return rc;
        if (raw_end) {
            line_starting = s[raw_end - 1] == '\n';
            if ((rc = lx_raw(lx, raw_end, &pos, &line_starting))) return rc;
        } else if (kind == '#') {
            if ((rc = lx_comment(lx, after, &pos, &line_starting))) return rc;
        } else {
            if (lx_push(lx, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, t) == NULL) return MN_ENOMEM;
            pos = after;
            if ((rc = lx_tag(lx, kind == '{', &pos, &line_starting))) return rc;
        }
    }
    return lx_push(lx, T_EOF, n) == NULL ? MN_ENOMEM : MN_OK;
}

/* ---- parser ------------------------------------------------------------------------------ */

typedef struct Parser {
    Arena *arena;
    const Tok *toks;
    size_t n_toks, pos;
    MnErr *err;
    int depth;      /* nesting of rules being parsed */
    int loop_depth; /* for loops around the current statement, in this macro */
    const char *open_tag; /* the innermost block being parsed, for messages */
} Parser;

typedef struct NVec {
    JnNode **v;
    size_t n, cap;
} NVec;

static const Tok *cur(const Parser *p) { return &p->toks[p->pos]; }
static const Tok *peek(const Parser *p, size_t k) {
    size_t i = p->pos + k;
    return &p->toks[i < p->n_toks ? i : p->n_toks - 1];
}
static void advance(Parser *p) {
    if (p->pos + 1 < p->n_toks) p->pos++;
}

static bool is_name(const Tok *t, const char *name) {
    return t->type == T_NAME && t->len == strlen(name) && memcmp(t->text, name, t->len) == 0;
}
static bool is_op(const Tok *t, TokOp op) { return t->type == T_OP && t->op == op; }

static int p_fail(Parser *p, const Tok *t, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int p_fail(Parser *p, const Tok *t, int code, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mn_err_set(p->err, code, "line %u, column %u: %s", t->line, t->col, msg);
}

/* jinja2's describe_token, for "expected X, got Y" messages. */
static void describe(const Tok *t, char *buf, size_t cap) {
    switch (t->type) {
    case T_DATA: snprintf(buf, cap, "template data"); break;
    case T_VAR_BEGIN: snprintf(buf, cap, "begin of print statement"); break;
    case T_VAR_END: snprintf(buf, cap, "end of print statement"); break;
    case T_BLOCK_BEGIN: snprintf(buf, cap, "begin of statement block"); break;
    case T_BLOCK_END: snprintf(buf, cap, "end of statement block"); break;
    case T_EOF: snprintf(buf, cap, "end of template"); break;
    case T_STRING: snprintf(buf, cap, "string"); break;
    case T_INT: snprintf(buf, cap, "integer"); break;
    case T_FLOAT: snprintf(buf, cap, "float"); break;
    default: snprintf(buf, cap, "%.*s", (int)(t->len < 60 ? t->len : 60), t->text); break;
    }
}

/* jinja2's messages: "expected token 'X', got 'Y'" (what is the wanted
 * token), "unexpected 'Y'" (what NULL), and at the end of the template
 * "unexpected end of template, expected 'X'.". */
static int unexpected(Parser *p, const char *what) {
    char got[80];
    describe(cur(p), got, sizeof got);
    if (what && cur(p)->type == T_EOF)
        return p_fail(p, cur(p), MN_EFORMAT, "unexpected end of template, expected '%s'.", what);
    if (what) return p_fail(p, cur(p), MN_EFORMAT, "expected token '%s', got '%s'", what, got);
    return p_fail(p, cur(p), MN_EFORMAT, "unexpected '%s'", got);
}

static int expect_op(Parser *p, TokOp op, const char *text) {
    if (!is_op(cur(p), op)) return unexpected(p, text);
    advance(p);
    return MN_OK;
}

static int expect_type(Parser *p, TokType type, const char *what) {
    if (cur(p)->type != type) return unexpected(p, what);
    advance(p);
    return MN_OK;
}

static int enter(Parser *p) {
    if (p->depth >= JN_MAX_NESTING)
        return p_fail(p, cur(p), MN_ERANGE, "the template nests expressions or blocks more than %d deep",
                      JN_MAX_NESTING);
    p->depth++;
    return MN_OK;
}

static JnNode *new_node(Parser *p, JnKind kind, const Tok *at) {
    JnNode *nd = arena_alloc(p->arena, sizeof(JnNode));
    if (nd == NULL) {
        mn_err_set(p->err, MN_ENOMEM, "out of memory");
        return NULL;
    }
    nd->kind = kind;
    nd->line = at->line;
    nd->col = at->col;
    nd->builtin = JB_UNKNOWN;
    nd->value = jv_undef();
    return nd;
}

static int nvec_push(Parser *p, NVec *v, JnNode *nd) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        JnNode **a = arena_alloc(p->arena, cap * sizeof(JnNode *));
        if (a == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
        if (v->n) memcpy(a, v->v, v->n * sizeof(JnNode *));
        v->v = a;
        v->cap = cap;
    }
    v->v[v->n++] = nd;
    return MN_OK;
}

static char *arena_strndup(Parser *p, const char *s, size_t n) {
    char *d = arena_alloc(p->arena, n + 1);
    if (d == NULL) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* A static str value in the arena. */
static int const_str(Parser *p, const char *s, size_t n, Jv *out) {
    JvStr *str = arena_alloc(p->arena, sizeof(JvStr) + n + 1);
    if (str == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    str->h.refs = -1;
    str->h.kind = JV_STR;
    if (n) memcpy(str->data, s, n);
    str->data[n] = '\0';
    str->len = n;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    str->n_chars = k;
    out->kind = JV_STR;
    out->as.s = str;
    return MN_OK;
}

static int set_name(Parser *p, JnNode *nd, const Tok *t) {
    char *s = arena_strndup(p, t->text, t->len);
    if (s == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    nd->name = s;
    nd->name_len = t->len;
    return MN_OK;
}

static void set_kids(JnNode *nd, NVec *v) {
    nd->kids = v->v;
    nd->n_kids = v->n;
}

static int parse_expression(Parser *p, bool with_condexpr, JnNode **out);
static int parse_tuple(Parser *p, bool simplified, bool with_condexpr, const char *extra_end,
                       bool explicit_parentheses, bool with_namespace, JnNode **out);
static int parse_primary(Parser *p, bool with_namespace, JnNode **out);
static int parse_postfix(Parser *p, JnNode **node);
static int parse_filter(Parser *p, JnNode **node, bool start_inline);
static int parse_statements(Parser *p, const char *const *end_names, size_t n_end, JnBlock *out);

/* ---- expressions ---- */

static int parse_call_args(Parser *p, JnArgs *args) {
    const Tok *open = cur(p);
    int rc = expect_op(p, O_LPAREN, "(");
    if (rc) return rc;
    NVec pos = {0}, kw_vals = {0};
    const char **kw_names = NULL;
    size_t kw_cap = 0;
    bool require_comma = false;
    while (!is_op(cur(p), O_RPAREN)) {
        if (require_comma) {
            if ((rc = expect_op(p, O_COMMA, ","))) return rc;
            if (is_op(cur(p), O_RPAREN)) break;
        }
        if (is_op(cur(p), O_MUL) || is_op(cur(p), O_POW))
            return p_fail(p, cur(p), MN_EUNSUPPORTED, "*args and **kwargs in calls are not supported");
        JnNode *e = NULL;
        if (cur(p)->type == T_NAME && is_op(peek(p, 1), O_ASSIGN)) {
            const Tok *key = cur(p);
            advance(p);
            advance(p);
            if ((rc = parse_expression(p, true, &e))) return rc;
            if (kw_vals.n == kw_cap) {
                size_t cap = kw_cap ? kw_cap * 2 : 4;
                const char **a = arena_alloc(p->arena, cap * sizeof(char *));
                if (a == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
                if (kw_vals.n) memcpy(a, kw_names, kw_vals.n * sizeof(char *));
                kw_names = a;
                kw_cap = cap;
            }
            if ((kw_names[kw_vals.n] = arena_strndup(p, key->text, key->len)) == NULL)
                return mn_err_set(p->err, MN_ENOMEM, "out of memory");
            if ((rc = nvec_push(p, &kw_vals, e))) return rc;
        } else {
            if (kw_vals.n > 0) return p_fail(p, open, MN_EFORMAT, "invalid syntax for function call expression");
            if ((rc = parse_expression(p, true, &e))) return rc;
            if ((rc = nvec_push(p, &pos, e))) return rc;
        }
        require_comma = true;
    }
    if ((rc = expect_op(p, O_RPAREN, ")"))) return rc;
    args->pos = pos.v;
    args->n_pos = pos.n;
    args->kw_names = kw_names;
    args->kw_vals = kw_vals.v;
    args->n_kw = kw_vals.n;
    return MN_OK;
}

/* A dotted name after | or is. */
static int parse_dotted_name(Parser *p, JnNode *nd) {
    if (cur(p)->type != T_NAME) return unexpected(p, "name");
    const char *start = cur(p)->text;
    const char *end = start + cur(p)->len;
    advance(p);
    while (is_op(cur(p), O_DOT)) {
        advance(p);
        if (cur(p)->type != T_NAME) return unexpected(p, "name");
        end = cur(p)->text + cur(p)->len;
        advance(p);
    }
    /* the tokens came from one contiguous span of the source: keep that text,
     * with any spaces, which makes the name unknown as it is to jinja2 */
    char *s = arena_strndup(p, start, (size_t)(end - start));
    if (s == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    nd->name = s;
    nd->name_len = (size_t)(end - start);
    return MN_OK;
}

static int parse_filter(Parser *p, JnNode **node, bool start_inline) {
    int rc;
    while (is_op(cur(p), O_PIPE) || start_inline) {
        if (!start_inline) advance(p);
        start_inline = false;
        JnNode *f = new_node(p, JN_FILTER, cur(p));
        if (f == NULL) return MN_ENOMEM;
        if ((rc = parse_dotted_name(p, f))) return rc;
        f->builtin = jb_filter_find(f->name, f->name_len);
        if (is_op(cur(p), O_LPAREN) && (rc = parse_call_args(p, &f->args))) return rc;
        JnNode **kids = arena_alloc(p->arena, sizeof(JnNode *));
        if (kids == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
        kids[0] = *node;
        f->kids = kids;
        f->n_kids = 1;
        *node = f;
    }
    return MN_OK;
}

static int parse_test(Parser *p, JnNode **node) {
    const Tok *is_tok = cur(p);
    advance(p);
    JnNode *t = new_node(p, JN_TEST, is_tok);
    if (t == NULL) return MN_ENOMEM;
    if (is_name(cur(p), "not")) {
        advance(p);
        t->is_negated = true;
    }
    int rc = parse_dotted_name(p, t);
    if (rc) return rc;
    t->builtin = jb_test_find(t->name, t->name_len);
    const Tok *c = cur(p);
    if (is_op(c, O_LPAREN)) {
        if ((rc = parse_call_args(p, &t->args))) return rc;
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                is_op(c, O_LPAREN) || is_op(c, O_LBRACKET) || is_op(c, O_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) return p_fail(p, c, MN_EFORMAT, "You cannot chain multiple tests with is");
        JnNode *arg = NULL;
        if ((rc = parse_primary(p, false, &arg))) return rc;
        if ((rc = parse_postfix(p, &arg))) return rc;
        JnNode **a = arena_alloc(p->arena, sizeof(JnNode *));
        if (a == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
        a[0] = arg;
        t->args.pos = a;
        t->args.n_pos = 1;
    }
    JnNode **kids = arena_alloc(p->arena, sizeof(JnNode *));
    if (kids == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    kids[0] = *node;
    t->kids = kids;
    t->n_kids = 1;
    *node = t;
    return MN_OK;
}

static int make_unary(Parser *p, JnKind kind, const Tok *at, JnNode *operand, JnNode **out) {
    JnNode *nd = new_node(p, kind, at);
    if (nd == NULL) return MN_ENOMEM;
    JnNode **kids = arena_alloc(p->arena, sizeof(JnNode *));
    if (kids == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    kids[0] = operand;
    nd->kids = kids;
    nd->n_kids = 1;
    *out = nd;
    return MN_OK;
}

static int make_binary(Parser *p, JnKind kind, JnOp op, const Tok *at, JnNode *a, JnNode *b, JnNode **out) {
    JnNode *nd = new_node(p, kind, at);
    if (nd == NULL) return MN_ENOMEM;
    JnNode **kids = arena_alloc(p->arena, 2 * sizeof(JnNode *));
    if (kids == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    kids[0] = a;
    kids[1] = b;
    nd->kids = kids;
    nd->n_kids = 2;
    nd->op = op;
    *out = nd;
    return MN_OK;
}

static int parse_subscribed(Parser *p, JnNode **out) {
    const Tok *at = cur(p);
    JnNode *bounds[3] = {NULL, NULL, NULL};
    int rc;
    if (is_op(cur(p), O_COLON)) {
        advance(p);
    } else {
        JnNode *e = NULL;
        if ((rc = parse_expression(p, true, &e))) return rc;
        if (!is_op(cur(p), O_COLON)) {
            *out = e;
            return MN_OK;
        }
        advance(p);
        bounds[0] = e;
    }
    if (!is_op(cur(p), O_COLON) && !is_op(cur(p), O_RBRACKET) && !is_op(cur(p), O_COMMA))
        if ((rc = parse_expression(p, true, &bounds[1]))) return rc;
    if (is_op(cur(p), O_COLON)) {
        advance(p);
        if (!is_op(cur(p), O_RBRACKET) && !is_op(cur(p), O_COMMA))
            if ((rc = parse_expression(p, true, &bounds[2]))) return rc;
    }
    JnNode *s = new_node(p, JN_SLICE, at);
    if (s == NULL) return MN_ENOMEM;
    JnNode **kids = arena_alloc(p->arena, 4 * sizeof(JnNode *));
    if (kids == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    kids[1] = bounds[0];
    kids[2] = bounds[1];
    kids[3] = bounds[2];
    s->kids = kids;
    s->n_kids = 4;
    *out = s;
    return MN_OK;
}

static int parse_subscript(Parser *p, JnNode **node) {
    const Tok *t = cur(p);
    advance(p);
    int rc;
    if (is_op(t, O_DOT)) {
        const Tok *a = cur(p);
        if (a->type == T_NAME) {
            advance(p);
            JnNode *g = NULL;
            if ((rc = make_unary(p, JN_GETATTR, t, *node, &g))) return rc;
            if ((rc = set_name(p, g, a))) return rc;
            *node = g;
            return MN_OK;
        }
        if (a->type != T_INT) return p_fail(p, a, MN_EFORMAT, "expected name or number");
        advance(p);
        JnNode *k = new_node(p, JN_CONST, a);
        if (k == NULL) return MN_ENOMEM;
        k->value = jv_int(a->ival);
        return make_binary(p, JN_GETITEM, 0, t, *node, k, node);
    }
    /* [ ... ] */
    NVec args = {0};
    while (!is_op(cur(p), O_RBRACKET)) {
        if (args.n && (rc = expect_op(p, O_COMMA, ","))) return rc;
        JnNode *e = NULL;
        if ((rc = parse_subscribed(p, &e))) return rc;
        if ((rc = nvec_push(p, &args, e))) return rc;
    }
    if ((rc = expect_op(p, O_RBRACKET, "]"))) return rc;
    if (args.n == 0) return p_fail(p, t, MN_EFORMAT, "expected subscript expression");
    JnNode *key = NULL;
    if (args.n == 1) {
        key = args.v[0];
    } else {
        key = new_node(p, JN_TUPLE, t);
        if (key == NULL) return MN_ENOMEM;
        set_kids(key, &args);
        for (size_t i = 0; i < args.n; i++)
            if (args.v[i]->kind == JN_SLICE)
                return p_fail(p, t, MN_EUNSUPPORTED, "slices inside a tuple subscript are not supported");
    }
    if (key->kind == JN_SLICE) {
        key->kids[0] = *node;
        key->line = t->line;
        key->col = t->col;
        *node = key;
        return MN_OK;
    }
    return make_binary(p, JN_GETITEM, 0, t, *node, key, node);
}

static int parse_call(Parser *p, JnNode **node) {
    JnNode *c = NULL;
    int rc = make_unary(p, JN_CALL, cur(p), *node, &c);
    if (rc) return rc;
    if ((rc = parse_call_args(p, &c->args))) return rc;
    *node = c;
    return MN_OK;
}

static int parse_postfix(Parser *p, JnNode **node) {
    int rc = MN_OK;
    for (;;) {
        if (is_op(cur(p), O_DOT) || is_op(cur(p), O_LBRACKET)) rc = parse_subscript(p, node);
        else if (is_op(cur(p), O_LPAREN)) rc = parse_call(p, node);
        else return MN_OK;
        if (rc) return rc;
    }
}

static int parse_filter_expr(Parser *p, JnNode **node) {
    int rc = MN_OK;
    for (;;) {
        if (is_op(cur(p), O_PIPE)) rc = parse_filter(p, node, false);
        else if (is_name(cur(p), "is")) rc = parse_test(p, node);
        else if (is_op(cur(p), O_LPAREN)) rc = parse_call(p, node);
        else return MN_OK;
        if (rc) return rc;
    }
}

static int parse_list(Parser *p, JnNode **out) {
    const Tok *at = cur(p);
    advance(p);
    NVec items = {0};
    int rc;
    while (!is_op(cur(p), O_RBRACKET)) {
        if (items.n && (rc = expect_op(p, O_COMMA, ","))) return rc;
        if (is_op(cur(p), O_RBRACKET)) break;
        JnNode *e = NULL;
        if ((rc = parse_expression(p, true, &e))) return rc;
        if ((rc = nvec_push(p, &items, e))) return rc;
    }
    if ((rc = expect_op(p, O_RBRACKET, "]"))) return rc;
    JnNode *nd = new_node(p, JN_LIST, at);
    if (nd == NULL) return MN_ENOMEM;
    set_kids(nd, &items);
    *out = nd;
    return MN_OK;
}

static int parse_dict(Parser *p, JnNode **out) {
    const Tok *at = cur(p);
    advance(p);
    NVec items = {0};
    int rc;
    while (!is_op(cur(p), O_RBRACE)) {
        if (items.n && (rc = expect_op(p, O_COMMA, ","))) return rc;
        if (is_op(cur(p), O_RBRACE)) break;
        JnNode *k = NULL, *v = NULL;
        if ((rc = parse_expression(p, true, &k))) return rc;
        if ((rc = expect_op(p, O_COLON, ":"))) return rc;
        if ((rc = parse_expression(p, true, &v))) return rc;
        if ((rc = nvec_push(p, &items, k)) || (rc = nvec_push(p, &items, v))) return rc;
    }
    if ((rc = expect_op(p, O_RBRACE, "}"))) return rc;
    JnNode *nd = new_node(p, JN_DICT, at);
    if (nd == NULL) return MN_ENOMEM;
    set_kids(nd, &items);
    *out = nd;
    return MN_OK;
}

static int parse_primary(Parser *p, bool with_namespace, JnNode **out) {
    const Tok *t = cur(p);
    int rc;
    JnNode *nd = NULL;
    if (t->type == T_NAME) {
        advance(p);
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            if ((nd = new_node(p, JN_CONST, t)) == NULL) return MN_ENOMEM;
            nd->value = jv_bool(t->text[0] == 't' || t->text[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            if ((nd = new_node(p, JN_CONST, t)) == NULL) return MN_ENOMEM;
            nd->value = jv_none();
        } else if (with_namespace && is_op(cur(p), O_DOT)) {
            advance(p);
            if (cur(p)->type != T_NAME) return unexpected(p, "name");
            if ((nd = new_node(p, JN_NSREF, t)) == NULL) return MN_ENOMEM;
            if ((rc = set_name(p, nd, t))) return rc;
            if ((nd->attr = arena_strndup(p, cur(p)->text, cur(p)->len)) == NULL)
                return mn_err_set(p->err, MN_ENOMEM, "out of memory");
            advance(p);
        } else {
            if ((nd = new_node(p, JN_NAME, t)) == NULL) return MN_ENOMEM;
            if ((rc = set_name(p, nd, t))) return rc;
        }
    } else if (t->type == T_STRING) {
        /* adjacent literals concatenate */
        size_t total = 0, i = p->pos;
        while (p->toks[i].type == T_STRING) total += p->toks[i++].len;
        char *buf = arena_alloc(p->arena, total + 1);
        if (buf == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
        size_t o = 0;
        while (cur(p)->type == T_STRING) {
            memcpy(buf + o, cur(p)->text, cur(p)->len);
            o += cur(p)->len;
            advance(p);
        }
        if ((nd = new_node(p, JN_CONST, t)) == NULL) return MN_ENOMEM;
        if ((rc = const_str(p, buf, o, &nd->value))) return rc;
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        advance(p);
        if ((nd = new_node(p, JN_CONST, t)) == NULL) return MN_ENOMEM;
        nd->value = t->type == T_INT ? jv_int(t->ival) : jv_float(t->fval);
    } else if (is_op(t, O_LPAREN)) {
        advance(p);
        if ((rc = parse_tuple(p, false, true, NULL, true, false, &nd))) return rc;
        if ((rc = expect_op(p, O_RPAREN, ")"))) return rc;
    } else if (is_op(t, O_LBRACKET)) {
        if ((rc = parse_list(p, &nd))) return rc;
    } else if (is_op(t, O_LBRACE)) {
        if ((rc = parse_dict(p, &nd))) return rc;
    } else {
        return unexpected(p, NULL);
    }
    *out = nd;
    return MN_OK;
}

static int parse_unary(Parser *p, bool with_filter, JnNode **out) {
    const Tok *t = cur(p);
    int rc;
    JnNode *nd = NULL;
    if (is_op(t, O_SUB) || is_op(t, O_ADD)) {
        advance(p);
        JnNode *operand = NULL;
        if ((rc = enter(p))) return rc; /* - - - x nests without an expression between */
        if ((rc = parse_unary(p, false, &operand))) return rc;
        p->depth--;
        if ((rc = make_unary(p, is_op(t, O_SUB) ? JN_NEG : JN_POS, t, operand, &nd))) return rc;
    } else {
        if ((rc = parse_primary(p, false, &nd))) return rc;
    }
    if ((rc = parse_postfix(p, &nd))) return rc;
    if (with_filter && (rc = parse_filter_expr(p, &nd))) return rc;
    *out = nd;
    return MN_OK;
}

/* One left-associative level of binary operators. */
typedef int (*ParseFn)(Parser *p, JnNode **out);

static int parse_unary_f(Parser *p, JnNode **out) { return parse_unary(p, true, out); }

static int parse_binary_level(Parser *p, ParseFn next, const TokOp *ops, const JnOp *jops, size_t n_ops,
                              JnNode **out) {
    JnNode *left = NULL;
    int rc = next(p, &left);
    if (rc) return rc;
    for (;;) {
        size_t i;
        for (i = 0; i < n_ops; i++)
            if (is_op(cur(p), ops[i])) break;
        if (i == n_ops) break;
        const Tok *at = cur(p);
        advance(p);
        JnNode *right = NULL;
        if ((rc = next(p, &right))) return rc;
        if ((rc = make_binary(p, JN_BINOP, jops[i], at, left, right, &left))) return rc;
    }
    *out = left;
    return MN_OK;
}

static int parse_pow(Parser *p, JnNode **out) {
    static const TokOp ops[] = {O_POW};
    static const JnOp jops[] = {JN_OP_POW};
    return parse_binary_level(p, parse_unary_f, ops, jops, 1, out);
}

static int parse_math2(Parser *p, JnNode **out) {
    static const TokOp ops[] = {O_MUL, O_DIV, O_FLOORDIV, O_MOD};
    static const JnOp jops[] = {JN_OP_MUL, JN_OP_DIV, JN_OP_FLOORDIV, JN_OP_MOD};
    return parse_binary_level(p, parse_pow, ops, jops, 4, out);
}

static int parse_concat(Parser *p, JnNode **out) {
    static const TokOp ops[] = {O_TILDE};
    static const JnOp jops[] = {JN_OP_CONCAT};
    return parse_binary_level(p, parse_math2, ops, jops, 1, out);
}

static int parse_math1(Parser *p, JnNode **out) {
    static const TokOp ops[] = {O_ADD, O_SUB};
    static const JnOp jops[] = {JN_OP_ADD, JN_OP_SUB};
    return parse_binary_level(p, parse_concat, ops, jops, 2, out);
}

static int parse_compare(Parser *p, JnNode **out) {
    const Tok *at = cur(p);
    JnNode *first = NULL;
    int rc = parse_math1(p, &first);
    if (rc) return rc;
    NVec kids = {0};
    JnOp *ops = NULL;
    size_t n_ops = 0, cap = 0;
    for (;;) {
        const Tok *t = cur(p);
        JnOp op;
        if (is_op(t, O_EQ)) op = JN_OP_EQ;
        else if (is_op(t, O_NE)) op = JN_OP_NE;
        else if (is_op(t, O_LT)) op = JN_OP_LT;
        else if (is_op(t, O_LTEQ)) op = JN_OP_LE;
        else if (is_op(t, O_GT)) op = JN_OP_GT;
        else if (is_op(t, O_GTEQ)) op = JN_OP_GE;
        else if (is_name(t, "in")) op = JN_OP_IN;
        else if (is_name(t, "not") && is_name(peek(p, 1), "in")) op = JN_OP_NOTIN;
        else break;
        advance(p);
        if (op == JN_OP_NOTIN) advance(p);
        if (kids.n == 0 && (rc = nvec_push(p, &kids, first))) return rc;
        JnNode *e = NULL;
        if ((rc = parse_math1(p, &e))) return rc;
        if ((rc = nvec_push(p, &kids, e))) return rc;
        if (n_ops == cap) {
            size_t c = cap ? cap * 2 : 4;
            JnOp *a = arena_alloc(p->arena, c * sizeof(JnOp));
            if (a == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
            if (n_ops) memcpy(a, ops, n_ops * sizeof(JnOp));
            ops = a;
            cap = c;
        }
        ops[n_ops++] = op;
    }
    if (n_ops == 0) {
        *out = first;
        return MN_OK;
    }
    JnNode *nd = new_node(p, JN_COMPARE, at);
    if (nd == NULL) return MN_ENOMEM;
    set_kids(nd, &kids);
    nd->ops = ops;
    *out = nd;
    return MN_OK;
}

static int parse_not(Parser *p, JnNode **out) {
    if (is_name(cur(p), "not")) {
        const Tok *at = cur(p);
        advance(p);
        int rc = enter(p);
        if (rc) return rc;
        JnNode *e = NULL;
        if ((rc = parse_not(p, &e))) return rc;
        p->depth--;
        return make_unary(p, JN_NOT, at, e, out);
    }
    return parse_compare(p, out);
}

static int parse_and(Parser *p, JnNode **out) {
    JnNode *left = NULL;
    int rc = parse_not(p, &left);
    if (rc) return rc;
    while (is_name(cur(p), "and")) {
        const Tok *at = cur(p);
        advance(p);
        JnNode *right = NULL;
        if ((rc = parse_not(p, &right))) return rc;
        if ((rc = make_binary(p, JN_AND, 0, at, left, right, &left))) return rc;
    }
    *out = left;
    return MN_OK;
}

static int parse_or(Parser *p, JnNode **out) {
    JnNode *left = NULL;
    int rc = parse_and(p, &left);
    if (rc) return rc;
    while (is_name(cur(p), "or")) {
        const Tok *at = cur(p);
        advance(p);
        JnNode *right = NULL;
        if ((rc = parse_and(p, &right))) return rc;
        if ((rc = make_binary(p, JN_OR, 0, at, left, right, &left))) return rc;
    }
    *out = left;
    return MN_OK;
}

static int parse_condexpr(Parser *p, JnNode **out) {
    const Tok *at = cur(p);
    JnNode *expr1 = NULL;
    int rc = parse_or(p, &expr1);
    if (rc) return rc;
    while (is_name(cur(p), "if")) {
        advance(p);
        if ((rc = enter(p))) return rc;
        JnNode *expr2, *expr3 = NULL;
        if ((rc = parse_or(p, &expr2))) return rc;
        if (is_name(cur(p), "else")) {
            advance(p);
            if ((rc = parse_condexpr(p, &expr3))) return rc;
        }
        p->depth--;
        JnNode *nd = new_node(p, JN_CONDEXPR, at);
        if (nd == NULL) return MN_ENOMEM;
        JnNode **kids = arena_alloc(p->arena, 3 * sizeof(JnNode *));
        if (kids == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
        kids[0] = expr2;
        kids[1] = expr1;
        kids[2] = expr3;
        nd->kids = kids;
        nd->n_kids = 3;
        expr1 = nd;
        at = cur(p);
    }
    *out = expr1;
    return MN_OK;
}

static int parse_expression(Parser *p, bool with_condexpr, JnNode **out) {
    int rc = enter(p);
    if (rc) return rc;
    rc = with_condexpr ? parse_condexpr(p, out) : parse_or(p, out);
    p->depth--;
    return rc;
}

static bool is_tuple_end(Parser *p, const char *extra_end) {
    const Tok *t = cur(p);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || is_op(t, O_RPAREN)) return true;
    return extra_end != NULL && is_name(t, extra_end);
}

static int parse_tuple(Parser *p, bool simplified, bool with_condexpr, const char *extra_end,
                       bool explicit_parentheses, bool with_namespace, JnNode **out) {
    const Tok *at = cur(p);
    NVec args = {0};
    bool is_tuple = false;
    int rc;
    for (;;) {
        if (args.n && (rc = expect_op(p, O_COMMA, ","))) return rc;
        if (is_tuple_end(p, extra_end)) break;
        JnNode *e = NULL;
        rc = simplified ? parse_primary(p, with_namespace, &e) : parse_expression(p, with_condexpr, &e);
        if (rc) return rc;
        if ((rc = nvec_push(p, &args, e))) return rc;
        if (is_op(cur(p), O_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (args.n) {
            *out = args.v[0];
            return MN_OK;
        }
        if (!explicit_parentheses) {
            char got[80];
            describe(cur(p), got, sizeof got);
            return p_fail(p, cur(p), MN_EFORMAT, "Expected an expression, got '%s'", got);
        }
    }
    JnNode *nd = new_node(p, JN_TUPLE, at);
    if (nd == NULL) return MN_ENOMEM;
    set_kids(nd, &args);
    *out = nd;
    return MN_OK;
}

/* ---- statements ---- */

static int check_target(Parser *p, JnNode *t, bool allow_nsref) {
    if (t->kind == JN_NAME) {
        static const char *const reserved[] = {"true", "false", "none", "True", "False", "None"};
        for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
            if (strcmp(t->name, reserved[i]) == 0)
                return mn_err_set(p->err, MN_EFORMAT, "line %u, column %u: can't assign to '%s'", t->line, t->col,
                                  t->name);
        return MN_OK;
    }
    if (t->kind == JN_NSREF && allow_nsref) return MN_OK;
    if (t->kind == JN_TUPLE) {
        for (size_t i = 0; i < t->n_kids; i++) {
            if (t->kids[i]->kind == JN_TUPLE)
                return mn_err_set(p->err, MN_EUNSUPPORTED, "line %u, column %u: nested tuple targets are not supported",
                                  t->line, t->col);
            int rc = check_target(p, t->kids[i], allow_nsref);
            if (rc) return rc;
        }
        return MN_OK;
    }
    return mn_err_set(p->err, MN_EFORMAT, "line %u, column %u: can't assign to '%s'", t->line, t->col,
                      t->kind == JN_CONST ? "const" : "expression");
}

static int block_end(Parser *p) { return expect_type(p, T_BLOCK_END, "end of statement block"); }

static JnBlock *new_blocks(Parser *p, size_t n) {
    JnBlock *b = arena_alloc(p->arena, n * sizeof(JnBlock));
    if (b == NULL) mn_err_set(p->err, MN_ENOMEM, "out of memory");
    return b;
}

static int parse_for(Parser *p, JnNode *nd) {
    JnNode *target, *iter, *test = NULL;
    int rc = parse_tuple(p, true, true, "in", false, false, &target);
    if (rc) return rc;
    if ((rc = check_target(p, target, false))) return rc;
    if (!is_name(cur(p), "in")) return unexpected(p, "in");
    advance(p);
    if ((rc = parse_tuple(p, false, false, "recursive", false, false, &iter))) return rc;
    if (is_name(cur(p), "if")) {
        advance(p);
        if ((rc = parse_expression(p, true, &test))) return rc;
    }
    if (is_name(cur(p), "recursive")) {
        advance(p);
        nd->is_recursive = true;
    }
    JnNode **kids = arena_alloc(p->arena, 3 * sizeof(JnNode *));
    if (kids == NULL || (nd->blocks = new_blocks(p, 2)) == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    kids[0] = target;
    kids[1] = iter;
    kids[2] = test;
    nd->kids = kids;
    nd->n_kids = 3;
    nd->n_blocks = 2;
    static const char *const ends[] = {"endfor", "else"};
    p->loop_depth++;
    rc = parse_statements(p, ends, 2, &nd->blocks[0]);
    p->loop_depth--;
    if (rc) return rc;
    if (is_name(cur(p), "else")) {
        advance(p);
        static const char *const end[] = {"endfor"};
        if ((rc = parse_statements(p, end, 1, &nd->blocks[1]))) return rc;
    }
    advance(p); /* endfor */
    return MN_OK;
}

static int parse_if(Parser *p, JnNode *nd) {
    NVec tests = {0};
    JnBlock *blocks = NULL;
    size_t n_blocks = 0, cap = 0;
    int rc;
    static const char *const ends[] = {"elif", "else", "endif"};
    static const char *const end[] = {"endif"};
    for (;;) {
        JnNode *test = NULL;
        if ((rc = parse_tuple(p, false, false, NULL, false, false, &test))) return rc;
        if ((rc = nvec_push(p, &tests, test))) return rc;
        if (n_blocks + 2 > cap) { /* this branch and a possible else */
            size_t c = cap ? cap * 2 : 4;
            JnBlock *b = new_blocks(p, c);
            if (b == NULL) return MN_ENOMEM;
            if (n_blocks) memcpy(b, blocks, n_blocks * sizeof(JnBlock));
            blocks = b;
            cap = c;
        }
        if ((rc = parse_statements(p, ends, 3, &blocks[n_blocks++]))) return rc;
        if (is_name(cur(p), "elif")) {
            advance(p);
            continue;
        }
        if (is_name(cur(p), "else")) {
            advance(p);
            if ((rc = parse_statements(p, end, 1, &blocks[n_blocks]))) return rc;
        }
        n_blocks++; /* the else branch, empty when there is none */
        advance(p); /* endif */
        break;
    }
    set_kids(nd, &tests);
    nd->blocks = blocks;
    nd->n_blocks = n_blocks;
    return MN_OK;
}

static int parse_set(Parser *p, JnNode *nd) {
    JnNode *target = NULL;
    int rc = parse_tuple(p, true, true, NULL, false, true, &target);
    if (rc) return rc;
    if ((rc = check_target(p, target, true))) return rc;
    JnNode **kids = arena_alloc(p->arena, 2 * sizeof(JnNode *));
    if (kids == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    kids[0] = target;
    nd->kids = kids;
    nd->n_kids = 2;
    if (is_op(cur(p), O_ASSIGN)) {
        advance(p);
        return parse_tuple(p, false, true, NULL, false, false, &kids[1]);
    }
    nd->kind = JN_SETBLOCK;
    JnNode *filter = NULL;
    if ((rc = parse_filter(p, &filter, false))) return rc;
    kids[1] = filter;
    if ((nd->blocks = new_blocks(p, 1)) == NULL) return MN_ENOMEM;
    nd->n_blocks = 1;
    static const char *const end[] = {"endset"};
    if ((rc = parse_statements(p, end, 1, &nd->blocks[0]))) return rc;
    advance(p);
    return MN_OK;
}

static int parse_signature(Parser *p, JnArgs *params) {
    int rc = expect_op(p, O_LPAREN, "(");
    if (rc) return rc;
    NVec defaults = {0};
    const char **names = NULL;
    size_t cap = 0;
    bool any_default = false;
    while (!is_op(cur(p), O_RPAREN)) {
        if (defaults.n && (rc = expect_op(p, O_COMMA, ","))) return rc;
        if (cur(p)->type != T_NAME) return unexpected(p, "name");
        const Tok *name = cur(p);
        advance(p);
        JnNode *def = NULL;
        if (is_op(cur(p), O_ASSIGN)) {
            advance(p);
            if ((rc = parse_expression(p, true, &def))) return rc;
            any_default = true;
        } else if (any_default) {
            return p_fail(p, name, MN_EFORMAT, "non-default argument follows default argument");
        }
        if (defaults.n == cap) {
            size_t c = cap ? cap * 2 : 4;
            const char **a = arena_alloc(p->arena, c * sizeof(char *));
            if (a == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
            if (defaults.n) memcpy(a, names, defaults.n * sizeof(char *));
            names = a;
            cap = c;
        }
        if ((names[defaults.n] = arena_strndup(p, name->text, name->len)) == NULL)
            return mn_err_set(p->err, MN_ENOMEM, "out of memory");
        if ((rc = nvec_push(p, &defaults, def))) return rc;
    }
    advance(p);
    params->kw_names = names;
    params->kw_vals = defaults.v;
    params->n_kw = defaults.n;
    return MN_OK;
}

/* Does the tree under nd load name? (jinja2 decides from this whether a
 * macro takes caller, varargs or kwargs.) */
static bool block_uses(const JnBlock *b, const char *name);
static bool node_uses(const JnNode *nd, const char *name) {
    if (nd == NULL) return false;
    if (nd->kind == JN_NAME && strcmp(nd->name, name) == 0) return true;
    for (size_t i = 0; i < nd->n_kids; i++)
        if (node_uses(nd->kids[i], name)) return true;
    for (size_t i = 0; i < nd->args.n_pos; i++)
        if (node_uses(nd->args.pos[i], name)) return true;
    for (size_t i = 0; i < nd->args.n_kw; i++)
        if (node_uses(nd->args.kw_vals[i], name)) return true;
    for (size_t i = 0; i < nd->n_blocks; i++)
        if (block_uses(&nd->blocks[i], name)) return true;
    return false;
}
static bool block_uses(const JnBlock *b, const char *name) {
    for (size_t i = 0; i < b->n; i++)
        if (node_uses(b->nodes[i], name)) return true;
    return false;
}

static void note_specials(JnNode *nd) {
    nd->uses_caller = block_uses(&nd->blocks[0], "caller");
    nd->uses_varargs = block_uses(&nd->blocks[0], "varargs");
    nd->uses_kwargs = block_uses(&nd->blocks[0], "kwargs");
    for (size_t i = 0; i < nd->args.n_kw; i++) {
        if (nd->args.kw_vals[i] == NULL) continue;
        nd->uses_caller |= node_uses(nd->args.kw_vals[i], "caller");
        nd->uses_varargs |= node_uses(nd->args.kw_vals[i], "varargs");
        nd->uses_kwargs |= node_uses(nd->args.kw_vals[i], "kwargs");
    }
}

/* A body with its own frame, where loop controls do not reach out. */
static int parse_frame_body(Parser *p, const char *end, JnBlock *out) {
    const char *const ends[] = {end};
    int saved = p->loop_depth;
    p->loop_depth = 0;
    int rc = parse_statements(p, ends, 1, out);
    p->loop_depth = saved;
    if (rc == MN_OK) advance(p);
    return rc;
}

static int parse_macro(Parser *p, JnNode *nd) {
    if (cur(p)->type != T_NAME) return unexpected(p, "name");
    int rc = set_name(p, nd, cur(p));
    if (rc) return rc;
    advance(p);
    if ((rc = parse_signature(p, &nd->args))) return rc;
    if ((nd->blocks = new_blocks(p, 1)) == NULL) return MN_ENOMEM;
    nd->n_blocks = 1;
    if ((rc = parse_frame_body(p, "endmacro", &nd->blocks[0]))) return rc;
    note_specials(nd);
    return MN_OK;
}

static int parse_call_block(Parser *p, JnNode *nd) {
    int rc;
    if (is_op(cur(p), O_LPAREN) && (rc = parse_signature(p, &nd->args))) return rc;
    const Tok *at = cur(p);
    JnNode *call = NULL;
    if ((rc = parse_expression(p, true, &call))) return rc;
    if (call->kind != JN_CALL) return p_fail(p, at, MN_EFORMAT, "expected call");
    JnNode **kids = arena_alloc(p->arena, sizeof(JnNode *));
    if (kids == NULL || (nd->blocks = new_blocks(p, 1)) == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    kids[0] = call;
    nd->kids = kids;
    nd->n_kids = 1;
    nd->n_blocks = 1;
    if ((rc = parse_frame_body(p, "endcall", &nd->blocks[0]))) return rc;
    note_specials(nd);
    return MN_OK;
}

static int parse_filter_block(Parser *p, JnNode *nd) {
    JnNode *filter = NULL;
    int rc = parse_filter(p, &filter, true);
    if (rc) return rc;
    JnNode **kids = arena_alloc(p->arena, sizeof(JnNode *));
    if (kids == NULL || (nd->blocks = new_blocks(p, 1)) == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
    kids[0] = filter;
    nd->kids = kids;
    nd->n_kids = 1;
    nd->n_blocks = 1;
    static const char *const end[] = {"endfilter"};
    if ((rc = parse_statements(p, end, 1, &nd->blocks[0]))) return rc;
    advance(p);
    return MN_OK;
}

static int parse_with(Parser *p, JnNode *nd) {
    NVec vals = {0};
    const char **names = NULL;
    size_t cap = 0;
    int rc;
    while (cur(p)->type != T_BLOCK_END) {
        if (vals.n && (rc = expect_op(p, O_COMMA, ","))) return rc;
        if (cur(p)->type != T_NAME || !is_op(peek(p, 1), O_ASSIGN))
            return p_fail(p, cur(p), MN_EUNSUPPORTED, "with supports only 'name = value' targets");
        const Tok *name = cur(p);
        advance(p);
        advance(p);
        JnNode *v = NULL;
        if ((rc = parse_expression(p, true, &v))) return rc;
        if (vals.n == cap) {
            size_t c = cap ? cap * 2 : 4;
            const char **a = arena_alloc(p->arena, c * sizeof(char *));
            if (a == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
            if (vals.n) memcpy(a, names, vals.n * sizeof(char *));
            names = a;
            cap = c;
        }
        if ((names[vals.n] = arena_strndup(p, name->text, name->len)) == NULL)
            return mn_err_set(p->err, MN_ENOMEM, "out of memory");
        if ((rc = nvec_push(p, &vals, v))) return rc;
    }
    nd->args.kw_names = names;
    nd->args.kw_vals = vals.v;
    nd->args.n_kw = vals.n;
    if ((nd->blocks = new_blocks(p, 1)) == NULL) return MN_ENOMEM;
    nd->n_blocks = 1;
    static const char *const end[] = {"endwith"};
    if ((rc = parse_statements(p, end, 1, &nd->blocks[0]))) return rc;
    advance(p);
    return MN_OK;
}

static int parse_print(Parser *p, JnNode *nd) {
    NVec items = {0};
    int rc;
    while (cur(p)->type != T_BLOCK_END) {
        if (items.n && (rc = expect_op(p, O_COMMA, ","))) return rc;
        JnNode *e = NULL;
        if ((rc = parse_expression(p, true, &e))) return rc;
        if ((rc = nvec_push(p, &items, e))) return rc;
    }
    set_kids(nd, &items);
    return MN_OK;
}

static int parse_statement(Parser *p, JnNode **out) {
    const Tok *t = cur(p);
    if (t->type != T_NAME) return p_fail(p, t, MN_EFORMAT, "tag name expected");
    int rc = enter(p);
    if (rc) return rc;
    JnNode *nd = new_node(p, JN_OUTPUT, t);
    if (nd == NULL) return MN_ENOMEM;
    char tag[32];
    snprintf(tag, sizeof tag, "%.*s", (int)(t->len < 31 ? t->len : 31), t->text);
    const char *outer_tag = p->open_tag;
    p->open_tag = tag;
    advance(p);
    if (strcmp(tag, "for") == 0) nd->kind = JN_FOR, rc = parse_for(p, nd);
    else if (strcmp(tag, "if") == 0) nd->kind = JN_IF, rc = parse_if(p, nd);
    else if (strcmp(tag, "set") == 0) nd->kind = JN_SET, rc = parse_set(p, nd);
    else if (strcmp(tag, "macro") == 0) nd->kind = JN_MACRO, rc = parse_macro(p, nd);
    else if (strcmp(tag, "call") == 0) nd->kind = JN_CALLBLOCK, rc = parse_call_block(p, nd);
    else if (strcmp(tag, "filter") == 0) nd->kind = JN_FILTERBLOCK, rc = parse_filter_block(p, nd);
    else if (strcmp(tag, "with") == 0) nd->kind = JN_WITH, rc = parse_with(p, nd);
    else if (strcmp(tag, "print") == 0) nd->kind = JN_OUTPUT, rc = parse_print(p, nd);
    else if (strcmp(tag, "break") == 0 || strcmp(tag, "continue") == 0) {
        if (p->loop_depth == 0) return p_fail(p, t, MN_EFORMAT, "'%s' outside of a for loop", tag);
        nd->kind = tag[0] == 'b' ? JN_BREAK : JN_CONTINUE;
    } else if (strcmp(tag, "generation") == 0) {
        nd->kind = JN_SCOPE;
        if ((nd->blocks = new_blocks(p, 1)) == NULL) return MN_ENOMEM;
        nd->n_blocks = 1;
        rc = parse_frame_body(p, "endgeneration", &nd->blocks[0]);
    } else if (strcmp(tag, "block") == 0 || strcmp(tag, "extends") == 0 || strcmp(tag, "include") == 0 ||
               strcmp(tag, "import") == 0 || strcmp(tag, "from") == 0 || strcmp(tag, "autoescape") == 0) {
        return p_fail(p, t, MN_EUNSUPPORTED, "the '%s' tag is not supported (a chat template is one file)", tag);
    } else {
        return p_fail(p, t, MN_EFORMAT, "Encountered unknown tag '%s'.", tag);
    }
    if (rc) return rc;
    p->open_tag = outer_tag;
    p->depth--;
    *out = nd;
    return MN_OK;
}

static bool is_end_name(const Tok *t, const char *const *end_names, size_t n_end) {
    for (size_t i = 0; i < n_end; i++)
        if (is_name(t, end_names[i])) return true;
    return false;
}

/* Statements until a block tag named in end_names; the current token is then
 * that name (the caller consumes it). With n_end 0, until the end. */
static int parse_statements(Parser *p, const char *const *end_names, size_t n_end, JnBlock *out) {
    int rc;
    if (n_end > 0) {
        if (is_op(cur(p), O_COLON)) advance(p);
        if ((rc = block_end(p))) return rc;
    }
    NVec body = {0};
    for (;;) {
        const Tok *t = cur(p);
        JnNode *nd = NULL;
        if (t->type == T_EOF) break;
        if (t->type == T_DATA) {
            if ((nd = new_node(p, JN_DATA, t)) == NULL) return MN_ENOMEM;
            if ((rc = const_str(p, t->text, t->len, &nd->value))) return rc;
            advance(p);
        } else if (t->type == T_VAR_BEGIN) {
            advance(p);
            JnNode *e = NULL;
            if ((rc = parse_tuple(p, false, true, NULL, false, false, &e))) return rc;
            if ((rc = expect_type(p, T_VAR_END, "end of print statement"))) return rc;
            if ((nd = new_node(p, JN_OUTPUT, t)) == NULL) return MN_ENOMEM;
            JnNode **kids = arena_alloc(p->arena, sizeof(JnNode *));
            if (kids == NULL) return mn_err_set(p->err, MN_ENOMEM, "out of memory");
            kids[0] = e;
            nd->kids = kids;
            nd->n_kids = 1;
        } else if (t->type == T_BLOCK_BEGIN) {
            advance(p);
            if (n_end > 0 && is_end_name(cur(p), end_names, n_end)) {
                out->nodes = body.v;
                out->n = body.n;
                return MN_OK;
            }
            if ((rc = parse_statement(p, &nd))) return rc;
            if ((rc = block_end(p))) return rc;
        } else {
            return unexpected(p, NULL);
        }
        if ((rc = nvec_push(p, &body, nd))) return rc;
    }
    if (n_end > 0) {
        char want[128] = "";
        size_t o = 0;
        for (size_t i = 0; i < n_end && o < sizeof want; i++)
            o += (size_t)snprintf(want + o, sizeof want - o, "%s'%s'", i == 0 ? "" : " or ", end_names[i]);
        return p_fail(p, cur(p), MN_EFORMAT,
                      "Unexpected end of template. Jinja was looking for the following tags: %s. The innermost block "
                      "that needs to be closed is '%s'.", want, p->open_tag ? p->open_tag : "?");
    }
    out->nodes = body.v;
    out->n = body.n;
    return MN_OK;
}

/* ---- unknown filters and tests ---- */

/* jinja2 names an unknown filter or test at compile time unless it sits in
 * an if statement or a conditional expression (a "soft" frame); for loops,
 * macros, call/filter/set blocks and with start a new, hard frame. */
static int check_block(Parser *p, const JnBlock *b, bool soft);
static int check_node(Parser *p, const JnNode *nd, bool soft) {
    if (nd == NULL) return MN_OK;
    int rc;
    if ((nd->kind == JN_FILTER || nd->kind == JN_TEST) && nd->builtin == JB_UNKNOWN && !soft)
        return mn_err_set(p->err, MN_EFORMAT, "line %u, column %u: No %s named '%s'.", nd->line, nd->col,
                          nd->kind == JN_FILTER ? "filter" : "test", nd->name);
    bool kids_soft = soft, blocks_soft = false, args_soft = soft;
    switch (nd->kind) {
    case JN_IF: kids_soft = blocks_soft = true; break;
    case JN_CONDEXPR: kids_soft = true; break;
    case JN_FOR:
        if ((rc = check_node(p, nd->kids[1], soft))) return rc;
        if ((rc = check_node(p, nd->kids[2], false))) return rc;
        if ((rc = check_block(p, &nd->blocks[0], false))) return rc;
        return check_block(p, &nd->blocks[1], false);
    case JN_MACRO:
    case JN_SETBLOCK:
    case JN_FILTERBLOCK:
    case JN_SCOPE: kids_soft = args_soft = false; break;
    case JN_CALLBLOCK: args_soft = false; break;
    case JN_WITH: break;
    default: blocks_soft = soft; break;
    }
    for (size_t i = 0; i < nd->n_kids; i++)
        if ((rc = check_node(p, nd->kids[i], kids_soft))) return rc;
    for (size_t i = 0; i < nd->args.n_pos; i++)
        if ((rc = check_node(p, nd->args.pos[i], args_soft))) return rc;
    for (size_t i = 0; i < nd->args.n_kw; i++)
        if ((rc = check_node(p, nd->args.kw_vals[i], args_soft))) return rc;
    for (size_t i = 0; i < nd->n_blocks; i++)
        if ((rc = check_block(p, &nd->blocks[i], blocks_soft))) return rc;
    return MN_OK;
}

static int check_block(Parser *p, const JnBlock *b, bool soft) {
    for (size_t i = 0; i < b->n; i++) {
        int rc = check_node(p, b->nodes[i], soft);
        if (rc) return rc;
    }
    return MN_OK;
}

/* ---- API ---- */

/* The source as jinja2's lexer sees it: "\r\n" and "\r" become "\n" and one
 * trailing newline is dropped. */
static char *normalize(Arena *a, const char *src, size_t len, size_t *out_len) {
    char *d = arena_alloc(a, len + 1);
    if (d == NULL) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            d[o++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            d[o++] = src[i];
        }
    }
    if (o > 0 && d[o - 1] == '\n') o--;
    d[o] = '\0';
    *out_len = o;
    return d;
}

int jn_parse(const char *src, size_t len, size_t max_source_bytes, JnTemplate **out, MnErr *err) {
    *out = NULL;
    if (len > max_source_bytes)
        return mn_err_set(err, MN_ERANGE, "the template is %zu bytes, more than the limit of %zu", len,
                          max_source_bytes);
    if (!utf8_is_valid(src, len)) return mn_err_set(err, MN_EFORMAT, "the template is not valid UTF-8");
    MnErr local;
    if (err == NULL) err = &local;
    JnTemplate *t = mn_malloc(sizeof *t);
    if (t == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    memset(t, 0, sizeof *t);
    Lexer lx = {.arena = &t->arena, .err = err, .pos_line = 1, .pos_col = 1};
    int rc = MN_ENOMEM;
    lx.src = normalize(&t->arena, src, len, &lx.n);
    if (lx.src == NULL) goto fail;
    if ((rc = lx_run(&lx))) goto fail;
    Parser p = {.arena = &t->arena, .toks = lx.toks, .n_toks = lx.n_toks, .err = err};
    if ((rc = parse_statements(&p, NULL, 0, &t->body))) goto fail;
    if ((rc = check_block(&p, &t->body, false))) goto fail;
    *out = t;
    return MN_OK;
fail:
    if (rc == MN_ENOMEM && err->code != MN_ENOMEM) mn_err_set(err, MN_ENOMEM, "out of memory");
    arena_free(&t->arena);
    mn_free(t);
    return rc;
}

void jn_template_free(JnTemplate *t) {
    if (t == NULL) return;
    arena_free(&t->arena);
    mn_free(t);
}

const JnBlock *jn_template_body(const JnTemplate *t) { return &t->body; }
