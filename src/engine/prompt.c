/* prompt.c — a client's prompt into the engine (see prompt.h): chat ->
 * prompt ids with the reply memory; any form -> a submitted Request.
 * Stateless: runs on the calling (HTTP) thread, reading the engine only
 * through engine.h (the model, the chat format and the reply memory,
 * which has its own lock). */
#include "engine/prompt.h"

#include <stdio.h>
#include <string.h>

#include "base/mem.h"
#include "cache/index.h"

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

/* prompt_build_chat; with is_text_key, a reply its prefix key misses is
 * looked up under its text key too (reply_mem.h: shift mode's cuts). */
static int build_chat(const Tokenizer *tok, const ChatFormat *fmt, const ChatInput *chat, ReplyMemory *rm,
                      const Hash128 *ns_id, bool is_text_key, TokIds *out, PromptStats *stats, MnErr *err) {
    PromptStats st = {0};
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
     * is undone and goes on past the content (within the budget prompt.h
     * gives for undone pieces) */
    size_t n0 = out->n, at = start, n_at = out->n, undo_left = PROMPT_UNDONE_BYTES(real_len);
    int piece = 0;
    Hasher kept; /* the prefix key's hasher over out->ids[0..n_at), when a content is looked up */
    if (n_found > 0) {
        replymem_prefix_start(&kept, ns_id);
        hasher_i32s(&kept, out->ids, out->n);
    }
    for (size_t k = 0; rc == MN_OK && k < n_found; k++) {
        const Reply *r = &replies[k];
        if (r->off < at || r->off + r->len > end) continue;
        if (!replymem_may_hold(rm, r->text, r->len)) continue; /* no tokenizing for a sure miss */
        if (r->off - at > undo_left) break; /* every later content's piece is longer still */
        rc = encode_piece(tok, real + at, r->off - at, piece, out);
        if (rc) break;
        Hasher with = kept;
        hasher_i32s(&with, out->ids + n_at, out->n - n_at);
        size_t n_piece = out->n;
        Hash128 key = replymem_prefix_end(&with);
        int found = replymem_get(rm, &key, r->text, r->len, out);
        if (found == 0 && is_text_key) {
            key = replymem_text_key(ns_id);
            found = replymem_get(rm, &key, r->text, r->len, out);
        }
        if (found < 0) rc = MN_ENOMEM;
        if (found > 0) {
            st.n_remembered++;
            at = r->off + r->len;
            piece++;
            hasher_i32s(&with, out->ids + n_piece, out->n - n_piece);
            kept = with;
        } else {
            out->n = n_at;
            undo_left -= r->off - at;
            st.bytes_undone += r->off - at;
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

int prompt_build_chat(const Tokenizer *tok, const ChatFormat *fmt, const ChatInput *chat, ReplyMemory *rm,
                      const Hash128 *ns_id, TokIds *out, PromptStats *stats, MnErr *err) {
    return build_chat(tok, fmt, chat, rm, ns_id, false, out, stats, err);
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

/* What fit_context is asked to do and gives back. */
typedef struct Fit {
    const ChatFormat *fmt;
    const ChatInput *chat;
    Hash128 ns_id;
    int max_tokens;
    bool is_shift;      /* shift mode: reply ids by text key too, and the sources below */
    ReqShift shift;     /* shift mode, when the chat was cut: where its KV may be */
    TokIds full, below; /* ... the sources' ids: the whole chat and the cut of one turn fewer */
} Fit;

/* The prompt of chat without its oldest n_drop turns, into out (emptied
 * first); *fits says whether the engine takes it with max_tokens. */
static int build_dropped(Engine *e, const Fit *f, const size_t *turn_start, size_t n_drop, TokIds *out, bool *fits,
                         MnErr *err) {
    *fits = false;
    json_t *kept;
    if (keep_turns(f->chat->messages, turn_start, n_drop, &kept) != MN_OK)
        return mn_err_set(err, MN_ENOMEM, "out of memory");
    ChatInput k = *f->chat;
    k.messages = kept;
    out->n = 0;
    int rc = build_chat(engine_model(e)->tok, f->fmt, &k, engine_reply_memory(e), &f->ns_id, f->is_shift, out, NULL,
                        err);
    *fits = rc == MN_OK && engine_prompt_fits(e, out->n, f->max_tokens);
    json_decref(kept);
    return rc;
}

/* Where cut (a rendering of the conversation src without some of its
 * turns) begins to agree with src for good: the first position from which
 * on cut's ids are src's last ones (the kept turns, suffix-aligned; how
 * the renderer joins the system messages to them may differ), and not
 * inside their common prefix (positions that hold the same ids at the same
 * places need no move). */
static size_t shift_start(const TokIds *cut, const TokIds *src) {
    size_t n = cut->n < src->n ? cut->n : src->n, c = 0, l = 0;
    while (c < n && cut->ids[c] == src->ids[c]) c++;
    while (l < n && cut->ids[cut->n - 1 - l] == src->ids[src->n - 1 - l]) l++;
    return c > cut->n - l ? c : cut->n - l;
}

/* The shifted domain of cut, a cut of the whole chat full starting to
 * agree with it at start: the hash of the tokens it dropped. */
static Hash128 cut_domain(const TokIds *full, const TokIds *cut, size_t start) {
    return index_shift_domain(full->ids, start + full->n - cut->n);
}

/* Shift mode: the sources of cut, the chosen prompt, into f->shift: the
 * whole chat (exact), and below, the cut of one turn fewer (the previous
 * turn's prompt when the cut moved by one turn since: its KV is in its own
 * shifted domain), unless below is the whole chat. */
static void plan_sources(Fit *f, const TokIds *cut, bool has_below) {
    size_t start = shift_start(cut, &f->full);
    ReqShift *rs = &f->shift;
    memset(rs, 0, sizeof *rs);
    rs->shift_start = (int32_t)start;
    rs->domain = cut_domain(&f->full, cut, start);
    rs->sources[rs->n_sources++] = (ShiftSource){f->full.ids, f->full.n, -1, {{0}}, (int32_t)start};
    if (!has_below) return;
    size_t below_start = shift_start(&f->below, &f->full);
    rs->sources[rs->n_sources++] = (ShiftSource){f->below.ids, f->below.n, (int32_t)below_start,
                                                 cut_domain(&f->full, &f->below, below_start),
                                                 (int32_t)shift_start(cut, &f->below)};
}

/* Context overflow, shift or recompute: ids, the prompt of the chat, does
 * not fit the engine with max_tokens. Replace it with the prompt of the
 * system messages and the most recent whole turns that fit (see
 * keep_turns), and set *n_truncated to the tokens that saves. The kept
 * messages are rendered and tokenized as a chat of just them would be (the
 * reply memory is asked under the new prefix; in shift mode under each
 * reply's text key too), so in recompute mode the answer is the one a
 * client sending only those messages gets. When even the last turn does
 * not fit, ids stay as they are (and engine_submit refuses them).
 * Dropping a turn shortens the prompt by about that turn's tokens (a kept
 * reply may tokenize a little differently under its new prefix), so the
 * fewest turns to drop are found by bisection; what it returns always
 * fits, since every candidate is measured. In shift mode the cut of one
 * turn fewer, which the bisection measured (or the whole chat), is kept as
 * a source with the whole chat (plan_sources). */
static int fit_context(Engine *e, Fit *f, TokIds *ids, int *n_truncated, MnErr *err) {
    size_t n_msgs = json_array_size(f->chat->messages);
    size_t *turn_start = mn_calloc(n_msgs ? n_msgs : 1, sizeof *turn_start), n_turns = 0;
    TokIds best = {0}, probe = {0};
    int rc = turn_start ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
    for (size_t i = 0; rc == MN_OK && i < n_msgs; i++)
        if (has_role(json_array_get(f->chat->messages, i), "user")) turn_start[n_turns++] = i;
    /* the drop counts tried: lo - 1 does not fit, hi does (once found);
     * in shift mode f->below holds the prompt of lo - 1 */
    size_t lo = 1, hi = n_turns > 0 ? n_turns - 1 : 0;
    bool fits = false;
    if (rc == MN_OK && f->is_shift)
        rc = build_chat(engine_model(e)->tok, f->fmt, f->chat, engine_reply_memory(e), &f->ns_id, true, &f->full, NULL,
                        err);
    if (rc == MN_OK && f->is_shift && tok_ids_append(&f->below, f->full.ids, f->full.n) != MN_OK)
        rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    if (rc == MN_OK && hi >= lo) rc = build_dropped(e, f, turn_start, hi, &best, &fits, err);
    if (rc != MN_OK || !fits) goto done;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        rc = build_dropped(e, f, turn_start, mid, &probe, &fits, err);
        if (rc != MN_OK) goto done;
        TokIds t = probe;
        if (fits) {
            probe = best;
            best = t;
            hi = mid;
        } else {
            lo = mid + 1;
            if (f->is_shift) {
                probe = f->below;
                f->below = t;
            }
        }
    }
    *n_truncated = ids->n > best.n ? (int)(ids->n - best.n) : 0;
    if (f->is_shift) plan_sources(f, &best, lo > 1);
    TokIds t = *ids;
    *ids = best;
    best = t;
done:
    tok_ids_free(&best);
    tok_ids_free(&probe);
    mn_free(turn_start);
    return rc;
}

/* The prompt ids of a chat or a text (in PROMPT_IDS form: none to make);
 * a chat too long is cut as the engine's context_overflow says, into f. */
static int prompt_ids(Engine *e, const PromptInput *in, const char *ns, Fit *f, TokIds *ids, int *n_truncated,
                      MnErr *err) {
    const Tokenizer *tok = engine_model(e)->tok;
    if (in->form == PROMPT_CHAT) {
        ContextOverflow mode = engine_context_overflow(e);
        f->fmt = format_of(e);
        f->chat = in->chat;
        f->ns_id = engine_namespace_id(ns);
        f->is_shift = mode == OVERFLOW_SHIFT;
        int rc = prompt_build_chat(tok, f->fmt, in->chat, engine_reply_memory(e), &f->ns_id, ids, NULL, err);
        if (rc == MN_OK && mode != OVERFLOW_ERROR && !engine_prompt_fits(e, ids->n, f->max_tokens))
            rc = fit_context(e, f, ids, n_truncated, err);
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
    Fit fit = {.max_tokens = p->max_tokens};
    const int32_t *ids = in->ids;
    size_t n = in->n_ids;
    Request *r = NULL;
    int rc = MN_OK;
    if (in->form != PROMPT_IDS) {
        rc = prompt_ids(e, in, ns, &fit, &built, n_truncated, err);
        ids = built.ids;
        n = built.n;
    }
    if (rc == MN_OK && n == 0) rc = mn_err_set(err, MN_EINVAL, "the prompt is empty");
    if (rc != MN_OK) {
        if (rc != MN_ENOMEM) *field = REQ_FIELD_PROMPT;
        goto done;
    }
    if ((r = request_new(ids, n, p, ns, session)) == NULL ||
        (fit.shift.n_sources > 0 && request_set_shift(r, &fit.shift) != MN_OK)) {
        request_unref(r);
        rc = mn_err_set(err, MN_ENOMEM, "out of memory");
        goto done;
    }
    rc = engine_submit(e, r, err, field);
    if (rc == MN_OK) *out = r;
    else request_unref(r);
done:
    if (*out == NULL) *n_truncated = 0;
    tok_ids_free(&built);
    tok_ids_free(&fit.full);
    tok_ids_free(&fit.below);
    return rc;
}
