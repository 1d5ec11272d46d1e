/* jinja_parse.h — Jinja template source to a syntax tree, as jinja2 3.1
 * reads it with trim_blocks and lstrip_blocks on.
 *
 * The lexer follows jinja2's rules byte for byte where they decide the
 * output: newlines normalized to "\n" and one trailing newline dropped,
 * "{%-"/"-%}" strip all (Unicode) whitespace beside the tag, trim_blocks
 * drops the newline after a block or comment tag, lstrip_blocks drops the
 * spaces before one at the start of a line, "+" turns either off, and
 * {% raw %} is data. String literals unescape as Python's do.
 *
 * The parser is jinja2's grammar (parser.py): conditional expressions,
 * or/and/not, chained comparisons with in/not in, + - ~ * / // % **,
 * unary -/+, literals (str, int, float, true/false/none, list, tuple,
 * dict), attribute and item access, slices, calls with keyword arguments,
 * filters and tests with arguments; the statements if/elif/else, for (with
 * tuple targets, an "if" filter, else and recursive), set (also to a namespace
 * attribute, tuples, and the block form with filters), macro, call, filter,
 * with, print, break/continue (loopcontrols), generation (its body), raw.
 * extends/include/import/block and the rest are refused with an error that
 * names them; so are *args and **kwargs in calls.
 *
 * A JnTemplate owns its whole tree (an arena) and never changes after
 * jn_parse returns, so several threads may render it at once.
 *
 * Bounds: the source must be at most max_source_bytes; nesting is limited
 * to JN_MAX_NESTING levels, a level being a statement inside another, an
 * expression inside another (parenthesized, an argument, an item, a
 * subscript), a unary operator or "not" applied to another, or a chained
 * conditional; brackets inside one tag nest at most as deep. So neither
 * the parser nor the evaluator's walk of the tree can exhaust the stack.
 */
#ifndef MN_JINJA_PARSE_H
#define MN_JINJA_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/jinja_value.h"

#define JN_MAX_NESTING 100 /* expression and block nesting the parser accepts */

typedef enum JnKind {
    /* expressions */
    JN_CONST,     /* value */
    JN_NAME,      /* name */
    JN_NSREF,     /* set target ns.attr: name, attr */
    JN_GETATTR,   /* kids[0].attr */
    JN_GETITEM,   /* kids[0][kids[1]] */
    JN_SLICE,     /* kids[0][kids[1]:kids[2]:kids[3]], each bound may be NULL */
    JN_CALL,      /* kids[0](args) */
    JN_FILTER,    /* kids[0] | name(args); kids[0] NULL in filter blocks */
    JN_TEST,      /* kids[0] is name(args) */
    JN_NOT,       /* not kids[0] */
    JN_NEG,       /* -kids[0] */
    JN_POS,       /* +kids[0] */
    JN_BINOP,     /* kids[0] op kids[1] (JnOp) */
    JN_AND,
    JN_OR,
    JN_COMPARE,   /* kids[0] ops[0] kids[1] ops[1] kids[2] ... (n_kids - 1 ops) */
    JN_CONDEXPR,  /* kids[1] if kids[0] else kids[2] (kids[2] may be NULL) */
    JN_LIST,      /* [kids...] */
    JN_TUPLE,     /* (kids...) */
    JN_DICT,      /* {kids[0]: kids[1], kids[2]: kids[3], ...} */
    /* statements */
    JN_DATA,      /* text: value (a str) */
    JN_OUTPUT,    /* print kids... */
    JN_IF,        /* if kids[i]: blocks[i]; blocks[n_kids] is the else */
    JN_FOR,       /* for kids[0] in kids[1] if kids[2]: blocks[0] else blocks[1] */
    JN_SET,       /* kids[0] = kids[1] */
    JN_SETBLOCK,  /* kids[0] = (blocks[0] | filter chain kids[1], may be NULL) */
    JN_MACRO,     /* macro name(params) blocks[0] */
    JN_CALLBLOCK, /* call(params) kids[0]: blocks[0] is the caller's body */
    JN_FILTERBLOCK, /* filter kids[0] (chain, innermost operand NULL): blocks[0] */
    JN_WITH,      /* with params (names = values): blocks[0] */
    JN_BREAK,
    JN_CONTINUE,
    JN_SCOPE,     /* blocks[0] in place (generation) */
} JnKind;

typedef enum JnOp {
    JN_OP_ADD,
    JN_OP_SUB,
    JN_OP_MUL,
    JN_OP_DIV,
    JN_OP_FLOORDIV,
    JN_OP_MOD,
    JN_OP_POW,
    JN_OP_CONCAT, /* ~ */
    JN_OP_EQ,
    JN_OP_NE,
    JN_OP_LT,
    JN_OP_LE,
    JN_OP_GT,
    JN_OP_GE,
    JN_OP_IN,
    JN_OP_NOTIN,
} JnOp;

typedef struct JnNode JnNode;

typedef struct JnBlock {
    JnNode **nodes;
    size_t n;
} JnBlock;

/* Call arguments; also a macro's or caller's parameters (kw_names are the
 * names, kw_vals their defaults, NULL where there is none). */
typedef struct JnArgs {
    JnNode **pos;
    size_t n_pos;
    const char **kw_names;
    JnNode **kw_vals;
    size_t n_kw;
} JnArgs;

struct JnNode {
    JnKind kind;
    uint32_t line, col;
    JnNode **kids;
    size_t n_kids;
    JnOp *ops;          /* JN_COMPARE */
    JnOp op;            /* JN_BINOP */
    const char *name;   /* NUL-terminated: NAME, NSREF, GETATTR, FILTER, TEST, MACRO */
    size_t name_len;
    const char *attr;   /* JN_NSREF */
    Jv value;           /* JN_CONST, JN_DATA (static) */
    JnArgs args;        /* CALL, FILTER, TEST; MACRO/CALLBLOCK parameters; WITH targets */
    JnBlock *blocks;
    size_t n_blocks;
    int builtin;        /* FILTER/TEST: the builtin's id, or < 0 (jinja_builtins.h) */
    bool is_negated;    /* JN_TEST under "is not" */
    bool is_recursive;  /* JN_FOR marked recursive: loop(items) renders the body again */
    bool uses_caller, uses_varargs, uses_kwargs; /* JN_MACRO, JN_CALLBLOCK */
};

typedef struct JnTemplate JnTemplate;

/* Parse src[0..len) (UTF-8). On MN_OK *out owns the tree (jn_template_free).
 * Otherwise *out is NULL and err says what and where ("line L, column C:
 * ..."): MN_EFORMAT for a syntax error or invalid UTF-8, MN_EUNSUPPORTED
 * for a construct mnemo does not implement, MN_ERANGE when the source or
 * its nesting is over the bounds, MN_ENOMEM. */
int jn_parse(const char *src, size_t len, size_t max_source_bytes, JnTemplate **out, MnErr *err);
void jn_template_free(JnTemplate *t);

/* The template's statements. */
const JnBlock *jn_template_body(const JnTemplate *t);

#endif
