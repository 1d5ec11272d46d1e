/* convkey.c — a request's conversation key (see convkey.h).
 *
 * The key's bytes are gathered in one buffer and hashed once: a tag naming
 * the kind of key ("chat", "completion", "responses", "session" or
 * "namespace"), the namespace (Authorization and X-Cache-Namespace, each
 * followed by a zero byte), then the kind's canonical bytes. The tag keeps
 * keys of different kinds apart even when their other bytes agree. A JSON
 * value other than a string is serialized straight into the buffer with
 * jansson's callback, so nothing jansson allocates outlives a call.
 */
#include "route/convkey.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"
#include "route/ring.h"

/* ---- the key's bytes ------------------------------------------------------------------ */

typedef struct KeyBuf {
    char *p;
    size_t n, cap;
    bool is_oom;
} KeyBuf;

static void add(KeyBuf *b, const void *data, size_t n) {
    if (b->is_oom) return;
    if (mn_reserve(&b->p, &b->cap, b->n + n + 1) != MN_OK) {
        b->is_oom = true;
        return;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

/* s and a zero byte (NULL counts as ""). */
static void add_str0(KeyBuf *b, const char *s) { add(b, s ? s : "", s ? strlen(s) + 1 : 1); }

static int dump_cb(const char *buf, size_t size, void *ctx) {
    KeyBuf *b = ctx;
    add(b, buf, size);
    return b->is_oom ? -1 : 0;
}

/* A value's canonical bytes and a zero byte: a string's own bytes, any
 * other value compact with sorted keys (an absent one: nothing). */
static void add_value(KeyBuf *b, const json_t *v) {
    if (json_is_string(v)) add(b, json_string_value(v), json_string_length(v));
    else if (v && json_dump_callback(v, dump_cb, b, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) != 0)
        b->is_oom = true;
    add(b, "", 1);
}

/* The start every key has: its kind and the namespace. */
static void add_head(KeyBuf *b, const char *kind, const ConvKeyInput *in) {
    add_str0(b, kind);
    add_str0(b, in->authorization);
    add_str0(b, in->cache_namespace);
}

/* A conversation's beginning: items[0..] up to and including the first
 * with role "user" (all of them when none has). */
static void add_beginning(KeyBuf *b, const json_t *items) {
    size_t i;
    const json_t *item;
    json_array_foreach(items, i, item) {
        const char *role = json_string_value(json_object_get(item, "role"));
        add_str0(b, role);
        add_value(b, json_object_get(item, "content"));
        if (role && strcmp(role, "user") == 0) break;
    }
}

/* A completion's prompt: its first CONVKEY_PROMPT_BYTES bytes as text, or
 * its first CONVKEY_PROMPT_IDS ids (a list of texts: the first one's). */
static void add_prompt(KeyBuf *b, const json_t *prompt) {
    if (json_is_array(prompt) && json_is_string(json_array_get(prompt, 0))) prompt = json_array_get(prompt, 0);
    if (json_is_string(prompt)) {
        size_t n = json_string_length(prompt);
        add(b, json_string_value(prompt), n < CONVKEY_PROMPT_BYTES ? n : CONVKEY_PROMPT_BYTES);
        return;
    }
    size_t i;
    const json_t *id;
    json_array_foreach(prompt, i, id) {
        if (i == CONVKEY_PROMPT_IDS) break;
        char num[24];
        int n = snprintf(num, sizeof num, "%lld,", (long long)json_integer_value(id));
        add(b, num, (size_t)n);
    }
}

/* ---- the routes ------------------------------------------------------------------------- */

/* The id in /v1/responses/{id}[/...], or NULL with *len 0 for other paths. */
static const char *stored_id_in_path(const char *path, size_t *len) {
    static const char prefix[] = "/v1/responses/";
    *len = 0;
    if (strncmp(path, prefix, sizeof prefix - 1) != 0) return NULL;
    const char *id = path + sizeof prefix - 1;
    *len = strcspn(id, "/");
    return *len > 0 ? id : NULL;
}

static void set_stored(ConvKey *out, const char *id, size_t len) {
    out->is_stored = true;
    out->hash = ring_hash(id, len);
    if (len < sizeof out->id) snprintf(out->id, sizeof out->id, "%.*s", (int)len, id);
}

/* The body's key into b for the three generation routes; false when the
 * body says nothing about a conversation (the namespace then keys it). */
static bool add_body_key(KeyBuf *b, const ConvKeyInput *in, const json_t *root, ConvKey *out) {
    bool is_chat = strcmp(in->path, "/v1/chat/completions") == 0;
    bool is_completion = strcmp(in->path, "/v1/completions") == 0;
    bool is_responses = strcmp(in->path, "/v1/responses") == 0;
    if (!json_is_object(root) || !(is_chat || is_completion || is_responses)) return false;
    const char *session = in->session;
    if (session == NULL && !is_responses) session = json_string_value(json_object_get(root, "session_id"));
    if (session) {
        add_head(b, "session", in);
        add_str0(b, session);
        return true;
    }
    if (is_chat) {
        add_head(b, "chat", in);
        add_beginning(b, json_object_get(root, "messages"));
    } else if (is_completion) {
        add_head(b, "completion", in);
        add_prompt(b, json_object_get(root, "prompt"));
    } else {
        out->is_new_response = true;
        const json_t *prev = json_object_get(root, "previous_response_id");
        if (json_is_string(prev)) {
            set_stored(out, json_string_value(prev), json_string_length(prev));
            return false;
        }
        add_head(b, "responses", in);
        add_value(b, json_object_get(root, "instructions"));
        const json_t *input = json_object_get(root, "input");
        if (json_is_string(input)) {
            add_str0(b, "user");
            add_value(b, input);
        } else {
            add_beginning(b, input);
        }
    }
    return true;
}

void convkey_of(const ConvKeyInput *in, ConvKey *out) {
    memset(out, 0, sizeof *out);
    size_t id_len;
    const char *id = stored_id_in_path(in->path, &id_len);
    if (id) {
        set_stored(out, id, id_len);
        return;
    }
    KeyBuf b = {0};
    json_t *root = NULL;
    if (strcmp(in->method, "POST") == 0 && in->body && in->body_len > 0)
        root = json_loadb(in->body, in->body_len, 0, NULL);
    bool has_key = add_body_key(&b, in, root, out);
    json_decref(root);
    if (out->is_stored) {
        mn_free(b.p);
        return;
    }
    if (!has_key || b.is_oom) { /* the namespace alone */
        b.n = 0;
        b.is_oom = false;
        add_head(&b, "namespace", in);
    }
    out->hash = b.is_oom ? 0 : ring_hash(b.p, b.n);
    mn_free(b.p);
}
