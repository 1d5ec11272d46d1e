/* client.h — a streaming client for OpenAI-compatible chat servers (libcurl).
 *
 * client_chat sends one chat completion with stream=true and
 * stream_options.include_usage to any server; client_respond sends one
 * turn of the Responses API (POST /v1/responses, stream=true), which may
 * continue a stored conversation with previous_response_id and then needs
 * only the new input. Both hand each text delta to a callback as it
 * arrives, and report what the usage said (prompt, cached and generated
 * tokens, and mnemo's split of the cached tokens by tier and its
 * recomputed tokens, when the server reports them), the time to the first
 * text delta and the size of the request body sent. Used by `mnemo chat`
 * and `mnemo bench`. Blocking; one ChatClient per thread.
 */
#ifndef MN_CLIENT_H
#define MN_CLIENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

typedef struct ChatClient ChatClient;

/* Which API a conversation goes through: chat completions (each turn
 * sends the whole history; any OpenAI-compatible server) or the Responses
 * API (the server keeps the history; each turn sends only its new
 * message). Zero is chat. */
typedef enum ClientApi { CLIENT_API_CHAT, CLIENT_API_RESPONSES, CLIENT_API__COUNT } ClientApi;

/* "chat" or "responses"; NULL for an out-of-range value. */
const char *client_api_name(ClientApi api);
/* MN_OK and *api, or MN_EINVAL for another name. */
int client_api_parse(const char *name, ClientApi *api);

typedef struct ClientMsg {
    const char *role;
    const char *content;
} ClientMsg;

typedef struct ClientParams {
    const char *model;   /* sent as "model" (default "mnemo") */
    int max_tokens;      /* <= 0: not sent */
    float temperature;   /* < 0: not sent */
    bool ignore_eos;
    long seed;           /* < 0: not sent */
} ClientParams;

#define CLIENT_MAX_TIERS 8

/* Cached prompt tokens per cache tier, as usage's
 * prompt_tokens_details.cached_tokens_by_tier gave them (mnemo: "pool",
 * "ram", "disk"), in the server's order. Names longer than 15 bytes, values
 * that are not integers and tiers past CLIENT_MAX_TIERS are left out. */
typedef struct ClientTierTokens {
    int n;                              /* 0: not reported */
    char name[CLIENT_MAX_TIERS][16];
    long tokens[CLIENT_MAX_TIERS];
} ClientTierTokens;

#define CLIENT_ID_MAX 128 /* a response id and its NUL; longer ones are not kept */

typedef struct ClientResult {
    int http_status;     /* 0 when the connection failed */
    long prompt_tokens, cached_tokens, completion_tokens; /* -1 when not reported */
    long recomputed_tokens;          /* prompt_tokens_details.recomputed_tokens (or usage's); -1: not reported */
    long truncated_tokens;           /* ... truncated_tokens (mnemo: dropped for context overflow); -1: not reported */
    long shifted_tokens;             /* ... shifted_tokens (mnemo: KV moved to new positions); -1: not reported */
    ClientTierTokens cached_by_tier; /* n == 0: not reported */
    double ttft_s;       /* request sent -> first content delta (-1 if none) */
    double total_s;
    int n_deltas;
    bool is_timeout;     /* the connection or the stream timed out (client_set_timeouts) */
    bool is_canceled;    /* the cancel flag (client_set_cancel) stopped it */
    bool is_server_error;/* a 200 stream carried the server's error event; error holds its message */
    long request_bytes;  /* the request body sent (the JSON, headers not counted) */
    char response_id[CLIENT_ID_MAX]; /* client_respond: the response's id ("" when none came, or too long) */
    char error_code[64]; /* an error answer's error.code (e.g. "previous_response_not_found"), else "" */
    char *content;       /* the whole reply, caller frees with mn_free */
    char error[256];
} ClientResult;

/* One turn of the Responses API. msgs are the input items: the new user
 * message when continuing previous_id, or a whole history (user and
 * assistant messages) to start a new chain with. instructions is sent as
 * given (the system prompt: the API does not carry it over from earlier
 * responses). Borrowed for the call. */
typedef struct ClientTurn {
    const ClientMsg *msgs;
    size_t n_msgs;         /* >= 1 */
    const char *instructions; /* NULL: none */
    const char *previous_id;  /* NULL: a new chain */
} ClientTurn;

typedef void (*ClientDeltaFn)(void *ctx, const char *text, size_t len);

/* Process-wide set-up of the HTTP library: call once from main, before any
 * thread creates a client (libcurl's global init is not thread-safe).
 * MN_OK or MN_EIO. client_global_deinit undoes it at exit. */
int client_global_init(void);
void client_global_deinit(void);

/* base_url like "http://127.0.0.1:8080"; api_key may be NULL. */
int client_new(const char *base_url, const char *api_key, ChatClient **out);
void client_free(ChatClient *c);

/* Give up on connecting after connect_s seconds and on a transfer that
 * received nothing for idle_s seconds (<= 0: no limit, the default). A
 * streaming server that sends keep-alive comments never goes idle. */
void client_set_timeouts(ChatClient *c, double connect_s, double idle_s);

/* Abort any transfer (within about a second) while *flag is non-zero; the
 * flag must outlive the client's use. NULL: never. */
void client_set_cancel(ChatClient *c, const atomic_int *flag);

/* MN_OK when an answer came back: a complete stream (200, ended by
 * [DONE]) or an error answer of another status (res->http_status, with its
 * message in res->error). MN_EIO when the connection failed, the stream
 * broke off, or it carried an error event (res->is_server_error, the
 * server's own message in res->error); res says what is known either way.
 * MN_ENOMEM when the reply could not be kept. */
int client_chat(ChatClient *c, const ClientMsg *msgs, size_t n, const ClientParams *p, ClientDeltaFn fn, void *ctx,
                ClientResult *res);

/* A Responses API turn (POST /v1/responses with stream=true and store
 * true), answered as client_chat's are: MN_OK for a complete stream
 * (ended by response.completed or response.incomplete, res->response_id
 * set) or an error answer of another status (res->error_code says which,
 * e.g. a 400 "previous_response_not_found"); MN_EIO, MN_ENOMEM as there.
 * max_tokens is sent as max_output_tokens; ignore_eos and seed as mnemo's
 * extensions. */
int client_respond(ChatClient *c, const ClientTurn *t, const ClientParams *p, ClientDeltaFn fn, void *ctx,
                   ClientResult *res);

/* GET path; *body (mn_free) and the status. */
int client_get(ChatClient *c, const char *path, char **body, int *status);

/* POST a JSON body to path; *body (mn_free, never NULL) and the status.
 * MN_OK when an answer of any status came back, MN_EIO otherwise. */
int client_post(ChatClient *c, const char *path, const char *json, char **body, int *status);

#endif
