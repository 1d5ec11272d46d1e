/* prompt.h — a client's prompt into the engine: a chat, a text or token
 * ids become prompt ids, a Request, and a submission.
 *
 * prompt_submit is what the HTTP layer calls with a parsed request: it
 * prepares the prompt here (below) and leaves every check against the
 * model and the engine, and the defaults, to engine_submit, so each rule
 * lives in one place. A refusal comes back as a code, a message and the
 * request field at fault (ReqField), from whichever step refused.
 *
 * A chat: the conversation is rendered with its chat template, and the
 * rendering is cut at the contents of assistant messages (found by
 * rendering a second time with a unique marker in place of each assistant
 * content). The pieces
 * are tokenized in order — the first with BOS as the vocabulary asks, every
 * later one as a continuation — and each assistant content is looked up in
 * the reply memory under (namespace, ids so far): when this exact text was
 * generated here after exactly these ids, the generated ids are used, so
 * the returning conversation's prompt matches the KV cached for it. The
 * rule does not depend on whether the prefix cache is on.
 *
 * When the template rewrites contents (trims them, say) so that the marker
 * rendering cannot be mapped back, the whole text is tokenized in one piece.
 *
 * Context overflow (EngineOptions.context_overflow): a chat whose prompt
 * plus max_tokens does not fit the context (or the pool) is, in recompute
 * mode, cut to its system messages and its most recent whole turns that
 * fit — a turn is a user message and every message after it up to the
 * next user message (the assistant reply, tool results), so no message is
 * ever cut in half and no reply loses the question it answers. The kept
 * messages are rendered and tokenized as a chat of only them would be, so
 * the answer is exactly the one a client sending only them gets; their
 * KV is computed again, since it now sits at other positions. A chat
 * whose last turn (with the system messages) does not fit, a text and ids
 * are refused as before (engine_submit's MN_ERANGE), as is every chat in
 * error mode.
 */
#ifndef MN_PROMPT_H
#define MN_PROMPT_H

#include <stddef.h>

#include "base/err.h"
#include "base/hash.h"
#include "cache/reply_mem.h"
#include "engine/engine.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

typedef struct PromptStats {
    int n_remembered;     /* assistant contents taken from the reply memory */
    int n_replies;        /* assistant contents in the conversation */
} PromptStats;

/* Append the prompt ids of msgs (with the generation prompt) to out.
 * rm may be NULL (no reply memory). MN_EINVAL (err) when the template
 * cannot express the conversation, MN_ERANGE (err) when the tokenizer hits
 * a resource limit, MN_ENOMEM; on failure out is as it was. */
int prompt_build_chat(const Tokenizer *tok, ChatTemplate tmpl, const ChatMsg *msgs, size_t n_msgs,
                      ReplyMemory *rm, const Hash128 *ns_id, TokIds *out, PromptStats *stats, MnErr *err);

/* The forms a client's prompt comes in. */
typedef enum PromptForm {
    PROMPT_CHAT, /* messages, rendered with the engine's chat template */
    PROMPT_TEXT, /* a completion's text, tokenized with BOS as the vocabulary asks */
    PROMPT_IDS,  /* a completion's token ids, as given */
} PromptForm;

/* A prompt in one of its forms; everything borrowed for the call. */
typedef struct PromptInput {
    PromptForm form;
    const ChatMsg *msgs; /* PROMPT_CHAT: (n_msgs), n_msgs >= 1 */
    size_t n_msgs;
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
 *   MN_EINVAL   the template cannot express the chat, or the prompt is
 *               empty (REQ_FIELD_PROMPT);
 *   MN_ERANGE   the tokenizer hit a resource limit (REQ_FIELD_PROMPT);
 *   MN_ENOMEM   (REQ_FIELD_NONE);
 *   any refusal of engine_submit, with its field. */
int prompt_submit(Engine *e, const PromptInput *in, const ReqParams *p, const char *ns, const char *session,
                  Request **out, int *n_truncated, MnErr *err, ReqField *field);

#endif
