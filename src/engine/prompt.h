/* prompt.h — turning a chat into prompt token ids, with the reply memory.
 *
 * The conversation is rendered with its chat template, and the rendering is
 * cut at the contents of assistant messages (found by rendering a second
 * time with a unique marker in place of each assistant content). The pieces
 * are tokenized in order — the first with BOS as the vocabulary asks, every
 * later one as a continuation — and each assistant content is looked up in
 * the reply memory under (namespace, ids so far): when this exact text was
 * generated here after exactly these ids, the generated ids are used, so
 * the returning conversation's prompt matches the KV cached for it. The
 * rule does not depend on whether the prefix cache is on.
 *
 * When the template rewrites contents (trims them, say) so that the marker
 * rendering cannot be mapped back, the whole text is tokenized in one piece.
 */
#ifndef MN_PROMPT_H
#define MN_PROMPT_H

#include <stddef.h>

#include "base/err.h"
#include "base/hash.h"
#include "cache/reply_mem.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

typedef struct PromptStats {
    int n_remembered;     /* assistant contents taken from the reply memory */
    int n_replies;        /* assistant contents in the conversation */
} PromptStats;

/* Append the prompt ids of msgs (with the generation prompt) to out.
 * rm may be NULL (no reply memory). MN_EINVAL (err) when the template
 * cannot express the conversation, MN_ENOMEM. */
int prompt_build_chat(const Tokenizer *tok, ChatTemplate tmpl, const ChatMsg *msgs, size_t n_msgs,
                      ReplyMemory *rm, const Hash128 *ns_id, TokIds *out, PromptStats *stats, MnErr *err);

#endif
