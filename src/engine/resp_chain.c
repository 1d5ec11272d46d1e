/* resp_chain.c — a Responses API turn into a prompt (see resp_chain.h):
 * walk the stored chain, lay it out as a chat, submit it. */
#include "engine/resp_chain.h"

#include <jansson.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "engine/prompt.h"

/* ---- the chain ---------------------------------------------------------------- */

typedef struct Chain {
    StoreResp *resp; /* (n) newest first: resp[0] is previous_id */
    size_t n, cap;
} Chain;

static void chain_free(Chain *c) {
    for (size_t i = 0; i < c->n; i++) store_resp_deinit(&c->resp[i]);
    mn_free(c->resp);
    *c = (Chain){0};
}

/* Load the responses from id back to the chain's start. */
static int chain_load(CacheStore *st, const Hash128 *ns_id, const char *id, double cutoff, Chain *c, MnErr *err) {
    for (const char *next = id; next != NULL;) {
        if (c->n == RESPCHAIN_MAX_DEPTH)
            return mn_err_set(err, MN_ERANGE, "the conversation of '%.80s' is more than %d responses long", id,
                              RESPCHAIN_MAX_DEPTH);
        if (c->n == c->cap) {
            size_t cap = c->cap ? 2 * c->cap : 8;
            StoreResp *grown = mn_realloc(c->resp, cap * sizeof *grown);
            if (grown == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
            c->resp = grown;
            c->cap = cap;
        }
        int rc = store_resp_get(st, ns_id, next, cutoff, &c->resp[c->n]);
        if (rc == MN_ENOTFOUND && next == id)
            return mn_err_set(err, rc, "Previous response with id '%.80s' not found.", id);
        if (rc == MN_ENOTFOUND)
            return mn_err_set(err, rc, "Previous response with id '%.80s' continues '%.80s', which is not stored "
                              "any more (deleted or expired).", c->n ? c->resp[c->n - 1].id : id, next);
        if (rc != MN_OK) return mn_err_set(err, rc, "cannot read the stored response '%.80s'", next);
        next = c->resp[c->n++].previous_id;
    }
    return MN_OK;
}

/* ---- the chat ------------------------------------------------------------------- */

/* A stored or given role as the chat templates know it ("developer" is a
 * system message, as in chat completions). */
static const char *chat_role(const char *role) {
    if (strcmp(role, "assistant") == 0) return "assistant";
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) return "system";
    return "user";
}

/* Append {"role", "content"} to the messages array a; false when memory
 * runs out. */
static bool add_message(json_t *a, const char *role, const char *content) {
    return json_array_append_new(a, json_pack("{s:s,s:s}", "role", role, "content", content)) == 0;
}

/* The conversation of turn t after chain c, as the messages array of a
 * chat (*out, the caller's). The whole chain: prompt_submit drops what
 * does not fit the context. */
static int chain_messages(const RespTurn *t, const Chain *c, json_t **out) {
    json_t *m = json_array();
    bool ok = m != NULL;
    if (ok && t->instructions) ok = add_message(m, "system", t->instructions);
    for (size_t i = c->n; ok && i-- > 0;) {
        const StoreResp *r = &c->resp[i];
        for (size_t j = 0; ok && j < r->n_inputs; j++) ok = add_message(m, chat_role(r->inputs[j].role), r->inputs[j].content);
        if (ok) ok = add_message(m, "assistant", r->output);
    }
    for (size_t j = 0; ok && j < t->n_input; j++) ok = add_message(m, chat_role(t->input[j].role), t->input[j].content);
    if (!ok) {
        json_decref(m);
        return MN_ENOMEM;
    }
    *out = m;
    return MN_OK;
}

/* ---- API ------------------------------------------------------------------------- */

int respchain_submit(Engine *e, CacheStore *st, const RespTurn *t, const ReqParams *p, const char *ns,
                     Request **out, int *n_truncated, MnErr *err, ReqField *field) {
    *out = NULL;
    if (n_truncated) *n_truncated = 0;
    if (field) *field = REQ_FIELD_NONE;
    Hash128 ns_id = engine_namespace_id(ns);
    Chain c = {0};
    json_t *msgs = NULL;
    int rc = t->previous_id ? chain_load(st, &ns_id, t->previous_id, t->cutoff, &c, err) : MN_OK;
    if (rc == MN_OK && chain_messages(t, &c, &msgs) != MN_OK) rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    if (rc == MN_OK) {
        ChatInput chat = {msgs, NULL, NULL, true};
        PromptInput in = {.form = PROMPT_CHAT, .chat = &chat};
        const char *session = c.n ? c.resp[c.n - 1].id : t->id;
        rc = prompt_submit(e, &in, p, ns, session, out, n_truncated, err, field);
    }
    if (rc == MN_OK && c.n > 0) {
        const char **ids = mn_calloc(c.n, sizeof *ids);
        int trc = ids ? MN_OK : MN_ENOMEM;
        for (size_t i = 0; ids && i < c.n; i++) ids[i] = c.resp[i].id;
        if (trc == MN_OK) trc = store_resp_touch(st, &ns_id, ids, c.n, t->now);
        /* the turn goes on: a missed touch only lets the chain expire sooner */
        if (trc != MN_OK) LOG_WARN("responses: cannot mark the chain of %s used: %s", t->previous_id, mn_strerror(trc));
        mn_free(ids);
    }
    json_decref(msgs);
    chain_free(&c);
    return rc;
}
