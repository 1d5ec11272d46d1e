/* jinja.h — render Jinja chat templates as Hugging Face transformers does.
 *
 * A model's GGUF carries its chat template (tokenizer.chat_template), a
 * Jinja program written for Python's jinja2. This renderer reproduces what
 * transformers' apply_chat_template produces with jinja2 3.1: an
 * ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
 * loopcontrols extension and {% generation %}, default (not strict)
 * Undefined, autoescape off, tojson as json.dumps(ensure_ascii=False,
 * keys unsorted, indent honoured), and the globals raise_exception and
 * strftime_now. The subset of jinja2 it implements, and its bounds, are in
 * docs/DESIGN.md ("The Jinja renderer"); anything else is refused with an
 * error that names the construct and where it is.
 *
 * The template is untrusted input (a GGUF from anywhere): parsing and
 * rendering are bounded in source size, nesting, recursion, macro calls,
 * loop iterations, work, memory and output (JinjaLimits), and a template
 * that crosses a bound fails with an error; nothing a template does makes
 * the renderer crash or run unbounded.
 *
 * Variables come as one JSON object (jansson): each member is a variable
 * ("messages", "tools", "add_generation_prompt", "bos_token", ...). A
 * member set to JSON null is Python's None; a variable that is not a
 * member is undefined, as in transformers.
 *
 * Threads: a parsed JinjaTemplate is immutable; any number of threads may
 * render it at once. Each render uses only its own memory.
 */
#ifndef MN_JINJA_H
#define MN_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct JinjaLimits {
    size_t max_source_bytes;      /* template size */
    size_t max_output_bytes;      /* rendered text */
    size_t max_memory_bytes;      /* all values and buffers of one render */
    uint64_t max_steps;           /* work units (a node evaluated, bytes moved / 8...) */
    uint64_t max_loop_iterations; /* for-loop iterations of one render, all loops */
    int max_depth;                /* evaluator recursion (nesting across macro calls) */
    int max_call_depth;           /* macro and caller() calls in progress */
} JinjaLimits;

/* The defaults: 1 MiB source, 16 MiB output, 256 MiB memory, 100M steps,
 * 10M loop iterations, depth 400, 64 nested macro calls. */
void jinja_limits_default(JinjaLimits *l);

/* The moment strftime_now formats (local, broken down). */
typedef struct JinjaDate {
    int year, month, day;    /* e.g. 2026, 1, 15 */
    int hour, minute, second;
} JinjaDate;

/* "YYYY-MM-DD" (a real calendar day) as that day at 00:00:00: MN_OK, or
 * MN_EINVAL with err saying why. */
int jinja_date_parse(const char *s, JinjaDate *out, MnErr *err);
/* The local time now. */
void jinja_date_now(JinjaDate *out);

typedef struct JinjaTemplate JinjaTemplate;

/* Parse src[0..len) (UTF-8). lim NULL means the defaults. On MN_OK *out
 * owns the template (jinja_free); otherwise *out is NULL and err says what
 * and where ("line L, column C: ..."): MN_EFORMAT (syntax, invalid UTF-8),
 * MN_EUNSUPPORTED (a construct mnemo does not implement), MN_ERANGE (over a
 * bound), MN_ENOMEM. */
int jinja_parse(const char *src, size_t len, const JinjaLimits *lim, JinjaTemplate **out, MnErr *err);
void jinja_free(JinjaTemplate *t);

/* Render t with the members of vars (a JSON object, or NULL for none) as
 * its variables. date fixes strftime_now (NULL: 1970-01-01 00:00:00). On
 * MN_OK *out is the text (NUL-terminated, mn_free) and *out_len its length
 * (it may contain NUL bytes). Otherwise *out is NULL and err says what and
 * where: MN_EINVAL for an error the template raises or causes
 * (raise_exception's message as given; jinja2's TypeError, UndefinedError,
 * ... messages), MN_EUNSUPPORTED, MN_ERANGE (a bound), MN_ENOMEM. */
int jinja_render(const JinjaTemplate *t, const json_t *vars, const JinjaDate *date, const JinjaLimits *lim,
                 char **out, size_t *out_len, MnErr *err);

#endif
