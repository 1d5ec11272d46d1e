/* chat_format.h — how a conversation becomes the text of a prompt: the
 * model's own Jinja chat template, a template from a file, or one of the
 * built-in families of model/chat_template.h.
 *
 * chat_format_new makes the choice once, at start-up, in this order:
 *   1. a template file (serve --chat-template-file FILE), rendered with
 *      model/jinja;
 *   2. a built-in family by name (serve --chat-template NAME);
 *   3. the GGUF's tokenizer.chat_template, rendered with model/jinja;
 *   4. a model without a template: the built-in default family.
 * A Jinja template is parsed there, so one that does not parse stops the
 * server at start-up with the parser's message, never at a request.
 *
 * A Jinja template sees the variables transformers' apply_chat_template
 * passes (as model/apply_template.h lists them): messages and tools as the
 * client sent them (tools None when absent), documents None,
 * add_generation_prompt, bos_token and eos_token (the texts of the model's
 * BOS and EOS tokens, "" when it has none), and then the request's extra
 * variables (llama-server's chat_template_kwargs), which may override any
 * of them. strftime_now gives the date fixed at start-up, or the local time
 * of each render.
 *
 * A built-in family sees (role, content) pairs: a content given as text
 * parts is joined with "\n". It cannot show tools or take variables, and
 * says so.
 *
 * Threads: a ChatFormat is immutable once made; any number of threads may
 * render with it at once.
 */
#ifndef MN_CHAT_FORMAT_H
#define MN_CHAT_FORMAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/jinja.h"
#include "model/tokenizer.h"

typedef struct ChatFormat ChatFormat;

typedef struct ChatFormatOptions {
    const char *template_file; /* a Jinja template to render instead of the model's; NULL: none */
    const char *builtin_name;  /* a built-in family by name (chat_template_from_name); NULL: none */
    const JinjaDate *date;     /* what strftime_now formats; NULL: the local time of each render */
} ChatFormatOptions;

/* One conversation to render. Everything is borrowed for the call. */
typedef struct ChatInput {
    const json_t *messages;     /* an array of message objects ({"role", "content", ...}) */
    const json_t *tools;        /* an array of tool definitions, or NULL: none */
    const json_t *vars;         /* an object of extra variables, or NULL: none */
    bool add_generation_prompt; /* end with the opening of the assistant's turn */
} ChatInput;

/* Choose and prepare the format for the model whose metadata is g and
 * tokenizer tok (both borrowed for the call), as the order above says.
 * On MN_OK *out is the caller's (chat_format_free). Otherwise *out is NULL
 * and err says why: MN_EINVAL both options given, or an unknown family
 * name; MN_EIO the file cannot be read; MN_EFORMAT / MN_EUNSUPPORTED /
 * MN_ERANGE the template does not parse (the message names the template,
 * the parser's complaint with its line and column, and the options that
 * choose another); MN_ENOMEM. */
int chat_format_new(const Gguf *g, const Tokenizer *tok, const ChatFormatOptions *o, ChatFormat **out, MnErr *err);

/* A built-in family with the given BOS and EOS texts (copied; NULL means
 * ""). MN_OK or MN_ENOMEM, MN_EINVAL for t out of range. */
int chat_format_new_builtin(ChatTemplate t, const char *bos, const char *eos, ChatFormat **out, MnErr *err);

/* A Jinja template src[0..len) rendered with the given BOS and EOS texts
 * (copied; NULL means "") and date (NULL: the time of each render). MN_OK,
 * or jinja_parse's refusal with its message (MN_EFORMAT, MN_EUNSUPPORTED,
 * MN_ERANGE, MN_ENOMEM). */
int chat_format_new_jinja(const char *src, size_t len, const char *bos, const char *eos, const JinjaDate *date,
                          ChatFormat **out, MnErr *err);

void chat_format_free(ChatFormat *f);

/* The built-in default family (CHAT_TMPL_DEFAULT) with the family's usual
 * BOS and EOS texts: a static format, never freed, for callers given none. */
const ChatFormat *chat_format_default(void);

/* Which format is used, for the start-up line: "gguf (tokenizer.chat_template)",
 * "file PATH", "built-in NAME" or "built-in NAME (the model has no chat
 * template)" as chat_format_new chose; "jinja" for chat_format_new_jinja.
 * Valid as long as f. */
const char *chat_format_describe(const ChatFormat *f);

/* Render in with f. On MN_OK *out is the text (NUL-terminated, mn_free;
 * it may hold NUL bytes) and *out_len its length. Otherwise *out is NULL
 * and err says why:
 *   MN_EINVAL        the messages are not an array of objects with a string
 *                    role and a string / text-parts / null content (a
 *                    built-in family also refuses roles it cannot express,
 *                    tools and variables); for a Jinja template, an error
 *                    the template raises or causes (raise_exception's
 *                    message as given);
 *   MN_EUNSUPPORTED  a construct the renderer does not implement;
 *   MN_ERANGE        the render crossed one of the renderer's bounds;
 *   MN_ENOMEM. */
int chat_format_render(const ChatFormat *f, const ChatInput *in, char **out, size_t *out_len, MnErr *err);

/* The variables a Jinja chat template sees (the list above) as one JSON
 * object, for model/jinja's jinja_render; vars' members go last and win.
 * MN_OK (*out the caller's reference) or MN_ENOMEM. */
int chat_format_vars(const ChatInput *in, const char *bos, const char *eos, json_t **out, MnErr *err);

/* The chat template of g (NULL when it has none) and the texts of its BOS
 * and EOS tokens by tokenizer.ggml.bos_token_id / eos_token_id ("" when it
 * declares none), each mn_malloc'd for the caller. MN_OK, MN_EFORMAT (an
 * id outside the vocabulary), MN_ENOMEM. */
int chat_format_gguf_texts(const Gguf *g, char **tmpl, char **bos, char **eos, MnErr *err);

#endif
