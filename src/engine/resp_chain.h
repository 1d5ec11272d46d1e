/* resp_chain.h — a turn of the Responses API into a prompt: the stored
 * chain of earlier responses, rebuilt into a chat, then submitted.
 *
 * A client that continues a response (previous_response_id) sends only
 * its new input; the server keeps the rest (cache/store.h's responses).
 * respchain_submit walks the chain from that response back to its start
 * and makes the conversation the client would otherwise have sent:
 *
 *   [system: this turn's instructions]
 *   for each stored response, oldest first: its input items, then its
 *       reply as an assistant message (the text as generated)
 *   this turn's input items
 *
 * and hands it to prompt_submit (prompt.h) as a chat. So a continued turn
 * renders and tokenizes exactly as the equivalent chat completion with
 * the whole history does: the reply memory gives each earlier reply its
 * generated ids, the prompt's blocks have the same chain hashes, and the
 * history's KV is found in whichever tier holds it.
 *
 * Instructions are this turn's only, as OpenAI has it: those of earlier
 * responses are not carried over (a client that sends the same
 * instructions every turn keeps its prefix cached).
 *
 * Context overflow: the chain goes to prompt_submit whole, which cuts it
 * to the instructions and the most recent whole turns that fit (or
 * refuses it) as it does any chat; the store keeps the whole chain.
 *
 * Stateless: runs on the calling (HTTP) thread; the store has its own lock.
 */
#ifndef MN_RESP_CHAIN_H
#define MN_RESP_CHAIN_H

#include <stddef.h>

#include "base/err.h"
#include "cache/store.h"
#include "engine/engine.h"
#include "model/chat_template.h"

/* Responses more than this far back are refused (a guard on the walk; a
 * chain that long passes any context anyway). */
#define RESPCHAIN_MAX_DEPTH 100000

/* One turn; everything borrowed for the call. */
typedef struct RespTurn {
    const char *id;           /* the response this turn makes */
    const char *instructions; /* NULL: none */
    const char *previous_id;  /* NULL: a new conversation */
    const ChatMsg *input;     /* (n_input) this turn's messages, n_input >= 1 */
    size_t n_input;
    double cutoff;            /* responses last used before this (unix s) have expired */
    double now;               /* unix s: when the chain is used (store_resp_touch) */
} RespTurn;

/* Rebuild the prompt of turn t in namespace ns from store st and submit it
 * with p (prompt_submit; the session is the chain's first response id —
 * t->id when there is no chain — so the cache's conversation policies see
 * one conversation). On MN_OK *out
 * is the caller's running request, *n_truncated the prompt tokens dropped
 * to fit the context (prompt_submit's; may be NULL), and the chain's
 * responses are marked used at t->now. Otherwise *out is NULL, err says
 * why and *field is the refused field as prompt_submit gives it:
 *   MN_ENOTFOUND  t->previous_id, or a response it continues, is not
 *                 stored in ns (deleted, expired, never stored or another
 *                 namespace's); err names it; field REQ_FIELD_NONE;
 *   MN_ERANGE     the chain is deeper than RESPCHAIN_MAX_DEPTH, or a
 *                 refusal of prompt_submit (the context);
 *   MN_EIO, MN_ENOMEM, and prompt_submit's other refusals. */
int respchain_submit(Engine *e, CacheStore *st, const RespTurn *t, const ReqParams *p, const char *ns,
                     Request **out, int *n_truncated, MnErr *err, ReqField *field);

#endif
