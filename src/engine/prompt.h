/* prompt.h — a client's prompt into the engine: a chat, a text or token
 * ids become prompt ids, a Request, and a submission.
 *
 * prompt_submit is what the HTTP layer calls with a parsed request: it
 * prepares the prompt here (below) and leaves every check against the
 * model and the engine, and the defaults, to engine_submit, so each rule
 * lives in one place. A refusal comes back as a code, a message and the
 * request field at fault (ReqField), from whichever step refused.
 *
 * A chat: the conversation is rendered with the engine's chat format
 * (model/chat_format.h) — prompt_render gives that text alone, for
 * POST /apply-template, through the same call. The text is tokenized as
 * llama-server tokenizes a rendered chat: special tokens in it are parsed
 * as special tokens, and BOS is added as the vocabulary asks, so a leading
 * BOS text the template wrote is dropped first (likewise a trailing EOS
 * text when the vocabulary appends EOS) and the prompt holds one BOS.
 *
 * The reply memory: each assistant content is looked up under (namespace,
 * ids so far): when this exact text was generated here after exactly these
 * ids, the generated ids are used, so the returning conversation's prompt
 * matches the KV cached for it. The contents are found by rendering a
 * second time with a unique marker in place of each; the text is then
 * tokenized in pieces cut only at the remembered contents — the first
 * piece with BOS, every later one as a continuation — and a content that
 * is not remembered stays inside its piece, so without the reply memory
 * the prompt is exactly the tokens of the whole text. When the template
 * rewrites contents (trims them, say) so that the marker rendering cannot
 * be mapped back, nothing is looked up. The rule does not depend on
 * whether the prefix cache is on.
 *
 * Context overflow (EngineOptions.context_overflow): a chat whose prompt
 * plus max_tokens does not fit the context (or the pool) is, in shift and
 * recompute mode, cut to its system messages and its most recent whole
 * turns that fit — a turn is a user message and every message after it up
 * to the next user message (the assistant reply, tool results), so no
 * message is ever cut in half and no reply loses the question it answers.
 * The kept messages are rendered and tokenized as a chat of only them
 * would be. In recompute mode the answer is exactly the one a client
 * sending only them gets: their KV is computed again, since it now sits
 * at other positions. In shift mode each kept reply is also looked up in
 * the reply memory under its text key (so it keeps the ids its cached KV
 * was computed from), and the request carries its sources (ReqShift,
 * engine.h): the whole chat and the cut of one turn fewer, whose cached KV
 * the engine moves to the kept turns' new positions (DESIGN.md, restore
 * path 5). A chat whose last turn (with the system messages) does not
 * fit, a text and ids are refused as before (engine_submit's MN_ERANGE),
 * as is every chat in error mode.
 */
#ifndef MN_PROMPT_H
#define MN_PROMPT_H

#include <stddef.h>

#include "base/err.h"
#include "base/hash.h"
#include "cache/reply_mem.h"
#include "engine/engine.h"
#include "model/chat_format.h"
#include "model/tokenizer.h"

typedef struct PromptStats {
    int n_remembered;     /* assistant contents taken from the reply memory */
    int n_replies;        /* assistant contents in the conversation */
    size_t bytes_undone;  /* bytes tokenized in pieces that were undone: at most
                             PROMPT_UNDONE_BYTES(rendering's length) */
} PromptStats;

/* The bytes a chat's prompt building may tokenize and undo. A content the
 * reply memory may hold is looked up with the piece before it tokenized;
 * when it is not held, that piece is undone and the next such content
 * tokenizes it again, longer, so a chat of many contents that look held
 * and are not would cost the square of its length. Past this budget no
 * further content is looked up: the prompt is the same text, the later
 * contents are tokenized as text instead of taking remembered ids. */
#define PROMPT_UNDONE_BYTES(render_len) (2 * (size_t)(render_len) + (size_t)64 * 1024)

/* Append the prompt ids of chat, rendered with fmt, to out (the rule
 * above). rm may be NULL (no reply memory). On failure out is as it was
 * and err says why: chat_format_render's refusals (MN_EINVAL,
 * MN_EUNSUPPORTED, MN_ERANGE: the template's own message), MN_ERANGE when
 * the tokenizer hits a resource limit, MN_ENOMEM. */
int prompt_build_chat(const Tokenizer *tok, const ChatFormat *fmt, const ChatInput *chat, ReplyMemory *rm,
                      const Hash128 *ns_id, TokIds *out, PromptStats *stats, MnErr *err);

/* The text a chat request's prompt is made of: chat rendered with the
 * engine's chat format (chat_format_default() when it was given none),
 * before the BOS/EOS texts are dropped. *out (mn_free) and *out_len as
 * chat_format_render gives them, and its errors. */
int prompt_render(const Engine *e, const ChatInput *chat, char **out, size_t *out_len, MnErr *err);

/* The forms a client's prompt comes in. */
typedef enum PromptForm {
    PROMPT_CHAT, /* a conversation, rendered with the engine's chat format */
    PROMPT_TEXT, /* a completion's text, tokenized with BOS as the vocabulary asks */
    PROMPT_IDS,  /* a completion's token ids, as given */
} PromptForm;

/* A prompt in one of its forms; everything borrowed for the call. */
typedef struct PromptInput {
    PromptForm form;
    const ChatInput *chat; /* PROMPT_CHAT */
    const char *text;    /* PROMPT_TEXT: text[0..text_len) */
    size_t text_len;
    const int32_t *ids;  /* PROMPT_IDS: (n_ids) */
    size_t n_ids;
} PromptInput;

/* Turn in into prompt ids (a chat with the reply memory of namespace ns,
 * cut to fit the context as the engine's context_overflow says), make a
 * Request of them with p, ns and session (request_new) and submit it
 * (engine_submit). On MN_OK *out is the caller's reference to the running
 * request and *n_truncated the prompt tokens the cut saved (0 when none;
 * n_truncated may be NULL). Otherwise *out is NULL, *n_truncated 0, err
 * says why and *field names the field at fault (field may be NULL):
 *   MN_EINVAL, MN_EUNSUPPORTED
 *               the chat format cannot render the chat (the template's
 *               message), or the prompt is empty (REQ_FIELD_PROMPT);
 *   MN_ERANGE   the template crossed a bound of the renderer (REQ_FIELD_PROMPT);
 *   MN_ERANGE   the tokenizer hit a resource limit (REQ_FIELD_PROMPT);
 *   MN_ENOMEM   (REQ_FIELD_NONE);
 *   any refusal of engine_submit, with its field. */
int prompt_submit(Engine *e, const PromptInput *in, const ReqParams *p, const char *ns, const char *session,
                  Request **out, int *n_truncated, MnErr *err, ReqField *field);

#endif
