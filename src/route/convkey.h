/* convkey.h — what the router routes a request by: the conversation it
 * belongs to, read from the request alone.
 *
 * The servers behind the router key their caches by chain hashes of
 * tokens, which the router cannot compute (it has no tokenizer). What it
 * can see is that every turn of a conversation starts the same way, so it
 * hashes the conversation's beginning: for a chat, its leading system
 * messages and its first user message; for a completion, the first
 * CONVKEY_PROMPT_BYTES bytes of the prompt (or its first
 * CONVKEY_PROMPT_IDS token ids); for a new Responses API chain, its
 * instructions and first input items as for a chat. An explicit session
 * id (the X-Session-Id header, or a chat's or completion's "session_id")
 * names the conversation outright and wins. The namespace is part of
 * every key: the Authorization header's value and the X-Cache-Namespace
 * header, as the servers derive their cache namespaces from them. Other
 * routes (/v1/models, /tokenize, ...) and bodies that are not JSON hash the
 * namespace alone: any server answers them alike.
 *
 * A request that needs a stored response — POST /v1/responses with
 * previous_response_id, and GET or DELETE /v1/responses/{id}[/...] — is
 * keyed by that id instead: the router asks its memory of which server
 * made the response (route/idmap) before the ring.
 *
 * Canonical bytes: a message is its role, a zero byte, and its content —
 * a string's bytes, or any other JSON value serialized compactly with
 * sorted keys — and a zero byte; fields other than role and content do
 * not count, so a client that adds a name or a cache hint to an old
 * message does not move its conversation. Pure functions; any thread.
 */
#ifndef MN_CONVKEY_H
#define MN_CONVKEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The prompt bytes (and ids) a completion's key covers: long enough to
 * tell conversations apart, short enough that the first turn has them. */
#define CONVKEY_PROMPT_BYTES 256
#define CONVKEY_PROMPT_IDS 64
/* A stored response's id and its NUL; longer ids are not remembered. */
#define CONVKEY_ID_MAX 128

typedef struct ConvKeyInput {
    const char *method;        /* "POST", "GET", ... */
    const char *path;          /* without the query */
    const char *body;          /* may be NULL */
    size_t body_len;
    const char *authorization; /* the headers' values; NULL when absent */
    const char *cache_namespace;
    const char *session;
} ConvKeyInput;

typedef struct ConvKey {
    uint64_t hash;         /* where on the ring (for a stored response: the hash of its id) */
    bool is_stored;        /* the request needs the stored response id[] */
    bool is_new_response;  /* POST /v1/responses: the answer's id is worth remembering */
    char id[CONVKEY_ID_MAX]; /* is_stored: the response id ("" when too long to keep) */
} ConvKey;

/* The key of a request. Never fails: a body it cannot read (not JSON, out
 * of memory while parsing) keys the request by its namespace alone. */
void convkey_of(const ConvKeyInput *in, ConvKey *out);

#endif
