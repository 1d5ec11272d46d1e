/* prompt.c — a client's prompt into the engine (see prompt.h): chat ->
 * prompt ids with the reply memory; any form -> a submitted Request.
 * Stateless: runs on the calling (HTTP) thread, reading the engine only
 * through engine.h (the model, the chat template and the reply memory,
 * which has its own lock). */
#include "engine/prompt.h"

#include <stdio.h>
#include <string.h>

#include "base/mem.h"

/* The marker put in place of assistant content i: control characters no
 * client sends, and no whitespace for a template to trim. */
static void marker(char *buf, size_t cap, size_t i) { snprintf(buf, cap, "\x01mnemo-reply-%zu\x02", i); }

static const char *token_text(const Tokenizer *tok, int32_t id) { return id >= 0 ? tok_text(tok, id) : ""; }

/* Tokenize text[0..len) as piece number `piece` of the prompt. */
static int encode_piece(const Tokenizer *tok, const char *text, size_t len, int piece, bool parse_special,
                        TokIds *out) {
    if (piece == 0) return tok_encode(tok, text, len, tok_add_bos(tok), parse_special, out);
    return tok_encode_cont(tok, text, len, parse_special, out);
}

int prompt_build_chat(const Tokenizer *tok, ChatTemplate tmpl, const ChatMsg *msgs, size_t n_msgs,
                      ReplyMemory *rm, const Hash128 *ns_id, TokIds *out, PromptStats *stats, MnErr *err) {
    const char *bos = token_text(tok, tok_bos(tok)), *eos = token_text(tok, tok_eos(tok));
    PromptStats st = {0, 0};
    char *real = NULL, *marked = NULL;
    ChatMsg *copy = NULL;
    char (*markers)[48] = NULL;
    size_t real_len = 0, marked_len = 0;
    int rc = chat_template_apply(tmpl, msgs, n_msgs, true, bos, eos, &real, &real_len, err);
    if (rc) return rc;
    copy = mn_calloc(n_msgs ? n_msgs : 1, sizeof *copy);
    markers = mn_calloc(n_msgs ? n_msgs : 1, sizeof *markers);
    if (copy == NULL || markers == NULL) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_msgs; i++) {
        copy[i] = msgs[i];
        if (strcmp(msgs[i].role, "assistant") == 0 && msgs[i].content[0] != '\0') {
            marker(markers[i], sizeof markers[i], i);
            copy[i].content = markers[i];
            st.n_replies++;
        }
    }
    /* Split the marked rendering at the markers; the pieces between them must
     * reproduce the real rendering exactly, else tokenize it whole. */
    bool ok = st.n_replies > 0 && chat_template_apply(tmpl, copy, n_msgs, true, bos, eos, &marked, &marked_len, NULL) == MN_OK;
    if (ok) {
        size_t pos_m = 0, pos_r = 0;
        for (size_t i = 0; ok && i < n_msgs; i++) {
            if (markers[i][0] == '\0') continue;
            const char *hit = strstr(marked + pos_m, markers[i]);
            if (hit == NULL) {
                ok = false;
                break;
            }
            size_t gap = (size_t)(hit - (marked + pos_m)), clen = strlen(msgs[i].content);
            ok = pos_r + gap + clen <= real_len && memcmp(real + pos_r, marked + pos_m, gap) == 0 &&
                 memcmp(real + pos_r + gap, msgs[i].content, clen) == 0;
            pos_m += gap + strlen(markers[i]);
            pos_r += gap + clen;
        }
        ok = ok && marked_len - pos_m == real_len - pos_r && memcmp(real + pos_r, marked + pos_m, real_len - pos_r) == 0;
    }
    size_t n0 = out->n;
    if (!ok) {
        rc = encode_piece(tok, real, real_len, 0, true, out);
        goto done;
    }
    size_t pos_m = 0;
    int piece = 0;
    for (size_t i = 0; rc == MN_OK && i < n_msgs; i++) {
        if (markers[i][0] == '\0') continue;
        const char *hit = strstr(marked + pos_m, markers[i]);
        size_t gap = (size_t)(hit - (marked + pos_m));
        rc = encode_piece(tok, marked + pos_m, gap, piece++, true, out);
        if (rc) break;
        const char *content = msgs[i].content;
        size_t clen = strlen(content);
        int found = 0;
        if (rm != NULL) {
            Hash128 key = replymem_prefix_key(ns_id, out->ids, out->n);
            found = replymem_get(rm, &key, content, clen, out);
            if (found < 0) rc = MN_ENOMEM;
        }
        if (found > 0) st.n_remembered++;
        else if (rc == MN_OK) rc = encode_piece(tok, content, clen, piece, false, out);
        piece++;
        pos_m += gap + strlen(markers[i]);
    }
    if (rc == MN_OK) rc = encode_piece(tok, marked + pos_m, marked_len - pos_m, piece, true, out);
    if (rc) out->n = n0;
done:
    if (rc == MN_ENOMEM) mn_err_set(err, rc, "out of memory");
    else if (rc != MN_OK) mn_err_set(err, rc, "cannot tokenize the prompt"); /* the template's own are returned above */
    if (stats) *stats = st;
    mn_free(real);
    mn_free(marked);
    mn_free(copy);
    mn_free(markers);
    return rc;
}

/* ---- context overflow ------------------------------------------------------------ */

/* The messages kept when the oldest n_drop turns of msgs go, into kept
 * (room for n_msgs); returns how many. A turn begins at a user message
 * (turn_start[i]: the index of the i-th) and runs to the next one, so an
 * assistant reply and the tool results that follow it go with the user
 * message they answer; system messages stay wherever they are. What
 * precedes the first user message, system messages aside, goes with the
 * first turn. */
static size_t keep_turns(const ChatMsg *msgs, size_t n_msgs, const size_t *turn_start, size_t n_drop,
                         ChatMsg *kept) {
    size_t k = 0, from = turn_start[n_drop];
    for (size_t i = 0; i < from; i++)
        if (strcmp(msgs[i].role, "system") == 0) kept[k++] = msgs[i];
    for (size_t i = from; i < n_msgs; i++) kept[k++] = msgs[i];
    return k;
}

/* The prompt of msgs without its oldest n_drop turns, into out (emptied
 * first); *fits says whether the engine takes it with max_tokens. */
static int build_dropped(Engine *e, const ChatMsg *msgs, size_t n_msgs, const size_t *turn_start, size_t n_drop,
                         const Hash128 *ns_id, int max_tokens, ChatMsg *kept, TokIds *out, bool *fits, MnErr *err) {
    size_t n_kept = keep_turns(msgs, n_msgs, turn_start, n_drop, kept);
    out->n = 0;
    int rc = prompt_build_chat(engine_model(e)->tok, engine_chat_template(e), kept, n_kept, engine_reply_memory(e),
                               ns_id, out, NULL, err);
    *fits = rc == MN_OK && engine_prompt_fits(e, out->n, max_tokens);
    return rc;
}

/* Context overflow, recompute: ids, the prompt of the chat msgs, does not
 * fit the engine with max_tokens. Replace it with the prompt of the
 * system messages and the most recent whole turns that fit (see
 * keep_turns), and set *n_truncated to the tokens that saves. The kept
 * messages are rendered and tokenized as a chat of just them would be
 * (the reply memory is asked under the new prefix), so the answer is the
 * one a client sending only those messages gets. When even the last turn
 * does not fit, ids stay as they are (and engine_submit refuses them).
 * Dropping a turn shortens the prompt by about that turn's tokens (a kept
 * reply may tokenize a little differently under its new prefix), so the
 * fewest turns to drop are found by bisection; what it returns always
 * fits, since every candidate is measured. */
static int fit_context(Engine *e, const ChatMsg *msgs, size_t n_msgs, const Hash128 *ns_id, int max_tokens,
                       TokIds *ids, int *n_truncated, MnErr *err) {
    size_t *turn_start = mn_calloc(n_msgs, sizeof *turn_start), n_turns = 0;
    ChatMsg *kept = mn_calloc(n_msgs, sizeof *kept);
    TokIds best = {0}, probe = {0};
    int rc = turn_start && kept ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
    for (size_t i = 0; rc == MN_OK && i < n_msgs; i++)
        if (strcmp(msgs[i].role, "user") == 0) turn_start[n_turns++] = i;
    /* the drop counts tried: lo - 1 does not fit, hi does (once found) */
    size_t lo = 1, hi = n_turns > 0 ? n_turns - 1 : 0;
    bool fits = false;
    if (rc == MN_OK && hi >= lo) rc = build_dropped(e, msgs, n_msgs, turn_start, hi, ns_id, max_tokens, kept, &best, &fits, err);
    if (rc != MN_OK || !fits) goto done;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        rc = build_dropped(e, msgs, n_msgs, turn_start, mid, ns_id, max_tokens, kept, &probe, &fits, err);
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
    mn_free(kept);
    return rc;
}

/* The prompt ids of a chat or a text (in PROMPT_IDS form: none to make). */
static int prompt_ids(Engine *e, const PromptInput *in, const char *ns, int max_tokens, TokIds *ids,
                      int *n_truncated, MnErr *err) {
    const Tokenizer *tok = engine_model(e)->tok;
    if (in->form == PROMPT_CHAT) {
        Hash128 ns_id = engine_namespace_id(ns);
        int rc = prompt_build_chat(tok, engine_chat_template(e), in->msgs, in->n_msgs, engine_reply_memory(e), &ns_id,
                                   ids, NULL, err);
        if (rc == MN_OK && engine_context_overflow(e) == OVERFLOW_RECOMPUTE && !engine_prompt_fits(e, ids->n, max_tokens))
            rc = fit_context(e, in->msgs, in->n_msgs, &ns_id, max_tokens, ids, n_truncated, err);
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
