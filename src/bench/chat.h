/* chat.h — the conversation loop of `mnemo chat`: an HTTP client of any
 * OpenAI-compatible server (bench/client), nothing of mnemo's own server.
 *
 * Each line the person types (bench/chat_input) is one turn. Through the
 * Responses API (the default) the turn sends only that line, continuing
 * the previous reply's response id, with the system prompt as
 * `instructions` every turn (the API does not carry it over, and the same
 * text keeps its cached prefix); through chat completions it sends the
 * whole conversation so far. Either way the reply streams to stdout as it
 * comes, and a line of statistics (time to first token, decode rate,
 * prompt tokens and how many came from the cache, request bytes) goes to
 * term. The chat keeps the whole conversation in both modes: when the
 * server no longer holds the chain (400 previous_response_not_found: it
 * expired, was deleted or purged, or a server without a disk tier
 * restarted) the chat says so in one line and sends the turn again with
 * the whole history as the input of a new chain, so the conversation goes
 * on. A failed turn is reported and forgotten, and the chat goes on,
 * except after a 401 or when the server does not answer at all: then it
 * stops with a hint. An empty line or the end of the input ends it.
 * README's "mnemo chat" is the user's contract.
 */
#ifndef MN_BENCH_CHAT_H
#define MN_BENCH_CHAT_H

#include <stdbool.h>
#include <stdio.h>

#include "bench/client.h"

typedef struct ChatOpts {
    const char *url;        /* the server, e.g. http://127.0.0.1:8080 */
    const char *api_key;    /* NULL: none */
    const char *model_name; /* sent as "model" */
    const char *system;     /* a system message first (responses: instructions); NULL: none */
    ClientApi api;          /* responses (the server keeps the conversation) or chat */
    int max_tokens;
    float temperature;
    bool ignore_eos;
} ChatOpts;

/* Chat until the input ends, reading lines from in; prompts, statistics
 * and errors go to term, replies to stdout. Returns the exit status: 0
 * when every turn succeeded, 1 when one failed (or the client could not
 * be set up). */
int chat_run(const ChatOpts *o, FILE *in, FILE *term);

#endif
