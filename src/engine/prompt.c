/* prompt.c — a client's prompt into the engine (see prompt.h): chat ->
 * prompt ids with the reply memory; any form -> a submitted Request.
 * Stateless: runs on the calling (HTTP) thread, reading the engine only
 * through engine.h (the model, the chat format and the reply memory,
 * which has its own lock). */
#include "engine/prompt.h"

#include <stdio.h>
#include <string.h>

#include "base/mem.h"

/* The marker put in place of assistant content i: control characters no
 * client sends, and no whitespace for a template to trim. */
static void marker(char *buf, size_t cap, size_t i) { snprintf(buf, cap, "\x01mnemo-reply-%zu\x02", i); }

/* Tokenize text[0..len) as piece number `piece` of the prompt: special
 * tokens parsed, BOS (as the vocabulary asks) before the first. */
static int encode_piece(const Tokenizer *tok, const char *text, size_t len, int piece, TokIds *out) {
    if (piece == 0) return tok_encode(tok, text, len, tok_add_bos(tok), true, out);
    return tok_encode_cont(tok, text, len, true, out);
}

/* Where one assistant content lies in the rendering. */
typedef struct Reply {
    const char *text; /* the message's content (borrowed from the chat) */
    size_t len;
    size_t off;       /* its offset in the rendering */
} Reply;

static bool is_reply(const json_t *msg) {
    const json_t *role = json_object_get(msg, "role"), *content = json_object_get(msg, "content");
    return json_is_string(role) && strcmp(json_string_value(role), "assistant") == 0 && json_is_string(content) &&
           json_string_length(content) > 0;
}

/* Find each assistant content of chat in its rendering real[0..real_len):
 * render again with markers in their place and map the pieces between
 * markers onto real. replies (one per message) gets them in order and
 * *n_found their number; 0 when the marker rendering cannot be mapped back
 * (the template rewrites contents) or fails. MN_OK or MN_ENOMEM. */
static int find_replies(const ChatFormat *fmt, const ChatInput *chat, const char *real, size_t real_len,
                        Reply *replies, size_t *n_found) {
    *n_found = 0;
    size_t n_msgs = json_array_size(chat->messages), n = 0;
    json_t *copy = json_deep_copy(chat->messages);
    char (*markers)[48] = mn_calloc(n_msgs ? n_msgs : 1, sizeof *markers);
    char *marked = NULL;
    size_t marked_len = 0;
    int rc = copy && markers ? MN_OK : MN_ENOMEM;
    for (size_t i = 0; rc == MN_OK && i < n_msgs; i++) {
        const json_t *msg = json_array_get(chat->messages, i);
        if (!is_reply(msg)) continue;
        marker(markers[i], sizeof markers[i], i);
        if (json_object_set_new(json_array_get(copy, i), "content", json_string(markers[i]))) rc = MN_ENOMEM;
        replies[n++] = (Reply){json_string_value(json_object_get(msg, "content")),
                               json_string_length(json_object_get(msg, "content")), 0};
    }
    ChatInput mc = *chat;
    mc.messages = copy;
    bool ok = rc == MN_OK && n > 0 && chat_format_render(fmt, &mc, &marked, &marked_len, NULL) == MN_OK;
    size_t pos_m = 0, pos_r = 0, k = 0;
    for (size_t i = 0; ok && i < n_msgs; i++) {
        if (markers[i][0] == '\0') continue;
        const char *hit = memmem(marked + pos_m, marked_len - pos_m, markers[i], strlen(markers[i]));
        if (hit == NULL) {
            ok = false;
            break;
        }
        size_t gap = (size_t)(hit - (marked + pos_m)), clen = replies[k].len;
        ok = pos_r + gap + clen <= real_len && memcmp(real + pos_r, marked + pos_m, gap) == 0 &&
             memcmp(real + pos_r + gap, replies[k].text, clen) == 0;
        replies[k++].off = pos_r + gap;
        pos_m += gap + strlen(markers[i]);
        pos_r += gap + clen;
    }
    ok = ok && marked_len - pos_m == real_len - pos_r && memcmp(real + pos_r, marked + pos_m, real_len - pos_r) == 0;
    if (ok) *n_found = n;
    json_decref(copy);
    mn_free(markers);
    mn_free(marked);
    return rc;
}

/* Bytes at the ends of text[0..len) that the tokenizer adds itself as
 * tokens: a leading BOS text when the vocabulary adds BOS, a trailing EOS
 * text when it adds EOS (what llama-server drops from a rendered chat). */
static void special_ends(const Tokenizer *tok, const char *text, size_t len, size_t *start, size_t *end) {
    const char *bos = tok_bos(tok) >= 0 ? tok_text(tok, tok_bos(tok)) : "";
    const char *eos = tok_eos(tok) >= 0 ? tok_text(tok, tok_eos(tok)) : "";
    size_t nb = strlen(bos), ne = strlen(eos);
    *start = 0;
    *end = len;
    if (tok_add_bos(tok) && nb > 0 && nb <= len && memcmp(text, bos, nb) == 0) *start = nb;
    if (tok_add_eos(tok) && ne > 0 && ne <= len - *start && memcmp(text + len - ne, eos, ne) == 0) *end = len - ne;
}

/* The replies of the conversation that the reply memory lacks may be in
 * a store shared with other instances: fetched into it first (nothing
 * without one; out of memory, the prompt is built without them). */
static void fetch_shared(ReplyMemory *rm, const Hash128 *ns_id, const Reply *replies, size_t n) {
    const char **texts = mn_malloc(n * sizeof *texts);
    size_t *lens = mn_malloc(n * sizeof *lens);
    for (size_t k = 0; texts && lens && k < n; k++) {
        texts[k] = replies[k].text;
        lens[k] = replies[k].len;
    }
    if (texts && lens) replymem_fetch(rm, ns_id, texts, lens, (int)n);
    mn_free(texts);
    mn_free(lens);
}

int prompt_build_chat(const Tokenizer *tok, const ChatFormat *fmt, const ChatInput *chat, ReplyMemory *rm,
                      const Hash128 *ns_id, TokIds *out, PromptStats *stats, MnErr *err) {
    PromptStats st = {0, 0};
    char *real = NULL;
    size_t real_len = 0, n_found = 0;
    int rc = chat_format_render(fmt, chat, &real, &real_len, err);
    if (rc) return rc;
    size_t n_msgs = json_array_size(chat->messages);
    for (size_t i = 0; i < n_msgs; i++) st.n_replies += is_reply(json_array_get(chat->messages, i));
    Reply *replies = mn_calloc(n_msgs ? n_msgs : 1, sizeof *replies);
    if (replies == NULL) rc = MN_ENOMEM;
    if (rc == MN_OK && rm != NULL && st.n_replies > 0) rc = find_replies(fmt, chat, real, real_len, replies, &n_found);
    if (rc == MN_OK && n_found > 0) fetch_shared(rm, ns_id, replies, n_found);
    size_t start, end;
    special_ends(tok, real, real_len, &start, &end);
    /* pieces cut at remembered contents only: a content is tried with the
     * piece before it tokenized, and when it is not remembered that piece
     * is undone and goes on past the content */
    size_t n0 = out->n, at = start, n_at = out->n;
    int piece = 0;
    for (size_t k = 0; rc == MN_OK && k < n_found; k++) {
        const Reply *r = &replies[k];
        if (r->off < at || r->off + r->len > end) continue;
        if (!replymem_may_hold(rm, r->text, r->len)) continue; /* no tokenizing for a sure miss */
        rc = encode_piece(tok, real + at, r->off - at, piece, out);
        if (rc) break;
        Hash128 key = replymem_prefix_key(ns_id, out->ids, out->n);
        int found = replymem_get(rm, &key, r->text, r->len, out);
        if (found < 0) rc = MN_ENOMEM;
        if (found > 0) {
            st.n_remembered++;
            at = r->off + r->len;
            piece++;
        } else {
            out->n = n_at;
        }
        n_at = out->n;
    }
    if (rc == MN_OK) rc = encode_piece(tok, real + at, end - at, piece, out);
    if (rc) out->n = n0;
    if (rc == MN_ENOMEM) mn_err_set(err, rc, "out of memory");
    else if (rc != MN_OK) mn_err_set(err, rc, "cannot tokenize the prompt");
    if (stats) *stats = st;
    mn_free(real);
    mn_free(replies);
    return rc;
}

/* The engine's chat format, or the default one when it was given none. */
static const ChatFormat *format_of(const Engine *e) {
    const ChatFormat *f = engine_chat_format(e);
    return f ? f : chat_format_default();
}

int prompt_render(const Engine *e, const ChatInput *chat, char **out, size_t *out_len, MnErr *err) {
    *out = NULL;
    *out_len = 0;
    return chat_format_render(format_of(e), chat, out, out_len, err);
}

/* ---- context overflow ------------------------------------------------------------ */

static bool has_role(const json_t *msg, const char *role) {
    const json_t *r = json_object_get(msg, "role");
    return json_is_string(r) && strcmp(json_string_value(r), role) == 0;
}

/* The messages kept when the oldest n_drop turns of msgs go, as a new
 * array (*out, the caller's). A turn begins at a user message
 * (turn_start[i]: the index of the i-th) and runs to the next one, so an
 * assistant reply and the tool results that follow it go with the user
 * message they answer; system messages stay wherever they are. What
 * precedes the first user message, system messages aside, goes with the
 * first turn. MN_OK or MN_ENOMEM. */
static int keep_turns(const json_t *msgs, const size_t *turn_start, size_t n_drop, json_t **out) {
    json_t *kept = json_array();
    size_t from = turn_start[n_drop];
    bool is_oom = kept == NULL;
    for (size_t i = 0; !is_oom && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (i >= from || has_role(m, "system")) is_oom = json_array_append(kept, m) != 0;
    }
    if (is_oom) {
        json_decref(kept);
        return MN_ENOMEM;
    }
    *out = kept;
    return MN_OK;
}

/* The prompt of chat without its oldest n_drop turns, into out (emptied
 * first); *fits says whether the engine takes it with max_tokens. */
static int build_dropped(Engine *e, const ChatFormat *fmt, const ChatInput *chat, const size_t *turn_start,
                         size_t n_drop, const Hash128 *ns_id, int max_tokens, TokIds *out, bool *fits, MnErr *err) {
    *fits = false;
    json_t *kept;
    if (keep_turns(chat->messages, turn_start, n_drop, &kept) != MN_OK) return mn_err_set(err, MN_ENOMEM, "out of memory");
    ChatInput k = *chat;
    k.messages = kept;
    out->n = 0;
    int rc = prompt_build_chat(engine_model(e)->tok, fmt, &k, engine_reply_memory(e), ns_id, out, NULL, err);
    *fits = rc == MN_OK && engine_prompt_fits(e, out->n, max_tokens);
    json_decref(kept);
    return rc;
}

/* Context overflow, recompute: ids, the prompt of chat, does not fit the
 * engine with max_tokens. Replace it with the prompt of the system
 * messages and the most recent whole turns that fit (see keep_turns), and
 * set *n_truncated to the tokens that saves. The kept messages are
 * rendered and tokenized as a chat of just them would be (the reply
 * memory is asked under the new prefix), so the answer is the one a
 * client sending only those messages gets. When even the last turn does
 * not fit, ids stay as they are (and engine_submit refuses them).
 * Dropping a turn shortens the prompt by about that turn's tokens (a kept
 * reply may tokenize a little differently under its new prefix), so the
 * fewest turns to drop are found by bisection; what it returns always
 * fits, since every candidate is measured. */
static int fit_context(Engine *e, const ChatFormat *fmt, const ChatInput *chat, const Hash128 *ns_id, int max_tokens,
                       TokIds *ids, int *n_truncated, MnErr *err) {
    size_t n_msgs = json_array_size(chat->messages);
    size_t *turn_start = mn_calloc(n_msgs ? n_msgs : 1, sizeof *turn_start), n_turns = 0;
    TokIds best = {0}, probe = {0};
    int rc = turn_start ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
    for (size_t i = 0; rc == MN_OK && i < n_msgs; i++)
        if (has_role(json_array_get(chat->messages, i), "user")) turn_start[n_turns++] = i;
    /* the drop counts tried: lo - 1 does not fit, hi does (once found) */
    size_t lo = 1, hi = n_turns > 0 ? n_turns - 1 : 0;
    bool fits = false;
    if (rc == MN_OK && hi >= lo) rc = build_dropped(e, fmt, chat, turn_start, hi, ns_id, max_tokens, &best, &fits, err);
    if (rc != MN_OK || !fits) goto done;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        rc = build_dropped(e, fmt, chat, turn_start, mid, ns_id, max_tokens, &probe, &fits, err);
        if (rc != MN_OK) goto done;
        if (fits) {
            TokIds t = best;
            best = probe;
            probe = t;
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    *n_truncated = ids->n > best.n ? (int)(ids->n - best.n) : 0;
    TokIds t = *ids;
    *ids = best;
    best = t;
done:
    tok_ids_free(&best);
    tok_ids_free(&probe);
    mn_free(turn_start);
    return rc;
}

/* The prompt ids of a chat or a text (in PROMPT_IDS form: none to make). */
static int prompt_ids(Engine *e, const PromptInput *in, const char *ns, int max_tokens, TokIds *ids,
                      int *n_truncated, MnErr *err) {
    const Tokenizer *tok = engine_model(e)->tok;
    if (in->form == PROMPT_CHAT) {
        Hash128 ns_id = engine_namespace_id(ns);
        const ChatFormat *fmt = format_of(e);
        int rc = prompt_build_chat(tok, fmt, in->chat, engine_reply_memory(e), &ns_id, ids, NULL, err);
        if (rc == MN_OK && engine_context_overflow(e) == OVERFLOW_RECOMPUTE && !engine_prompt_fits(e, ids->n, max_tokens))
            rc = fit_context(e, fmt, in->chat, &ns_id, max_tokens, ids, n_truncated, err);
        return rc;
    }
    int rc = tok_encode(tok, in->text, in->text_len, tok_add_bos(tok), true, ids);
    if (rc != MN_OK) mn_err_set(err, rc, "cannot tokenize the prompt");
    return rc;
}

int prompt_submit(Engine *e, const PromptInput *in, const ReqParams *p, const char *ns, const char *session,
                  Request **out, int *n_truncated, MnErr *err, ReqField *field) {
    ReqField ignored;
    int truncated_ignored;
    if (field == NULL) field = &ignored;
    if (n_truncated == NULL) n_truncated = &truncated_ignored;
    *out = NULL;
    *n_truncated = 0;
    *field = REQ_FIELD_NONE;
    TokIds built = {0};
    const int32_t *ids = in->ids;
    size_t n = in->n_ids;
    Request *r = NULL;
    int rc = MN_OK;
    if (in->form != PROMPT_IDS) {
        rc = prompt_ids(e, in, ns, p->max_tokens, &built, n_truncated, err);
        ids = built.ids;
        n = built.n;
    }
    if (rc == MN_OK && n == 0) rc = mn_err_set(err, MN_EINVAL, "the prompt is empty");
    if (rc != MN_OK) {
        if (rc != MN_ENOMEM) *field = REQ_FIELD_PROMPT;
        goto done;
    }
    if ((r = request_new(ids, n, p, ns, session)) == NULL) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory");
        goto done;
    }
    rc = engine_submit(e, r, err, field);
    if (rc == MN_OK) *out = r;
    else request_unref(r);
done:
    if (*out == NULL) *n_truncated = 0;
    tok_ids_free(&built);
    return rc;
}
