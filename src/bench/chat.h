/* chat.h — the conversation loop of `mnemo chat`: an HTTP client of any
 * OpenAI-compatible server (bench/client), nothing of mnemo's own server.
 *
 * Each line the person types (bench/chat_input) is sent with the whole
 * conversation so far; the reply streams to stdout as it comes, and a line
 * of statistics (time to first token, decode rate, prompt tokens and how
 * many came from the cache) goes to term. A failed turn is reported and
 * forgotten, and the chat goes on, except after a 401 or when the server
 * does not answer at all: then it stops with a hint. An empty line or the
 * end of the input ends it. README's "mnemo chat" is the user's contract.
 */
#ifndef MN_BENCH_CHAT_H
#define MN_BENCH_CHAT_H

#include <stdbool.h>
#include <stdio.h>

typedef struct ChatOpts {
    const char *url;        /* the server, e.g. http://127.0.0.1:8080 */
    const char *api_key;    /* NULL: none */
    const char *model_name; /* sent as "model" */
    const char *system;     /* a system message first; NULL: none */
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
