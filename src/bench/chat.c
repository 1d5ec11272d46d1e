/* chat.c — the conversation loop of `mnemo chat` (see chat.h).
 *
 * The conversation is an array of ClientMsg the loop owns (every content
 * mn_strdup'ed, the replies' taken from ClientResult): the system message
 * first when there is one, then user and assistant messages, grown by two
 * per turn; a failed turn's user message is popped again, so the next
 * request holds only the turns that were answered. Through the Responses
 * API the array is what the chat falls back on when the server lost the
 * chain; prev_id is the last answered turn's response id ("" before the
 * first, after a reply without an id, and after the server lost the
 * chain: the next turn then starts a new chain with the whole history).
 * Single-threaded.
 */
#include "bench/chat.h"

#include <string.h>

#include "base/err.h"
#include "base/mem.h"
#include "bench/chat_input.h"

typedef struct Chat {
    const ChatOpts *o;
    ChatClient *c;
    FILE *term;
    ClientMsg *msgs;      /* (n_msgs) contents owned */
    size_t n_msgs;
    char prev_id[CLIENT_ID_MAX];
} Chat;

static void chat_print(void *ctx, const char *text, size_t len) {
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* After a failed turn: whether the chat can go on, else the hint to stop with. */
static bool chat_can_go_on(const Chat *ch, const ClientResult *res) {
    const char *url = ch->o->url;
    if (res->http_status == 401) {
        if (ch->o->api_key)
            fprintf(ch->term, "mnemo chat: %s refused the API key (HTTP 401): check --api-key\n", url);
        else
            fprintf(ch->term, "mnemo chat: %s wants an API key (HTTP 401): give it with --api-key KEY\n", url);
        return false;
    }
    if (res->http_status == 0) { /* no HTTP answer at all */
        fprintf(ch->term, "mnemo chat: no answer from %s (%s): is the server running?\n", url,
                res->error[0] ? res->error : "no connection");
        return false;
    }
    if (res->http_status == 404 && ch->o->api == CLIENT_API_RESPONSES) {
        fprintf(ch->term, "mnemo chat: %s has no Responses API (HTTP 404): try --api chat\n", url);
        return false;
    }
    fprintf(ch->term, "mnemo chat: %s\n", res->error[0] ? res->error : "request failed");
    return true;
}

/* A Responses API turn for the conversation's last message: only that
 * message after prev_id, or the whole history as a new chain. */
static int chat_respond(Chat *ch, const ClientParams *p, ClientResult *res) {
    size_t first = ch->o->system ? 1 : 0; /* the system prompt goes as instructions */
    bool is_continued = ch->prev_id[0] != '\0';
    ClientTurn t = {
        .msgs = is_continued ? &ch->msgs[ch->n_msgs - 1] : &ch->msgs[first],
        .n_msgs = is_continued ? 1 : ch->n_msgs - first,
        .instructions = ch->o->system,
        .previous_id = is_continued ? ch->prev_id : NULL,
    };
    int rc = client_respond(ch->c, &t, p, chat_print, NULL, res);
    if (rc == MN_OK && res->http_status == 200) { /* a failed turn leaves the chain where it was */
        snprintf(ch->prev_id, sizeof ch->prev_id, "%s", res->response_id);
    } else if (is_continued && res->http_status == 400 && strcmp(res->error_code, "previous_response_not_found") == 0) {
        ch->prev_id[0] = '\0';
        fprintf(ch->term, "mnemo chat: the server no longer holds this conversation; sending its %zu messages again "
                          "as a new one\n", ch->n_msgs - first);
        mn_free(res->content);
        return chat_respond(ch, p, res); /* prev_id is "" now: one retry at most */
    }
    return rc;
}

/* ---- API --------------------------------------------------------------------- */

int chat_run(const ChatOpts *o, FILE *in_file, FILE *term) {
    Chat ch = {.o = o, .term = term};
    ChatInput *in = NULL;
    int status = 1;
    if (client_new(o->url, o->api_key, &ch.c) != MN_OK || chat_input_new(in_file, term, &in) != MN_OK) goto done;
    if (o->system) {
        ch.msgs = mn_realloc(ch.msgs, sizeof *ch.msgs);
        if (ch.msgs == NULL) goto done;
        ch.msgs[ch.n_msgs++] = (ClientMsg){"system", mn_strdup(o->system)};
    }
    fprintf(term, "chatting with %s (empty line or end of input to quit)\n", o->url);
    bool ok = true;
    const char *line;
    while (chat_input_read(in, "> ", &line) == MN_OK && line[0] != '\0') {
        ClientMsg *grown = mn_realloc(ch.msgs, (ch.n_msgs + 2) * sizeof *ch.msgs);
        if (grown == NULL) break;
        ch.msgs = grown;
        ch.msgs[ch.n_msgs++] = (ClientMsg){"user", mn_strdup(line)};
        ClientParams p = {o->model_name, o->max_tokens, o->temperature, o->ignore_eos, -1};
        ClientResult res;
        int rc = o->api == CLIENT_API_CHAT ? client_chat(ch.c, ch.msgs, ch.n_msgs, &p, chat_print, NULL, &res)
                                           : chat_respond(&ch, &p, &res);
        printf("\n");
        fflush(stdout);
        if (rc != MN_OK || res.http_status != 200) {
            mn_free(res.content);
            mn_free((char *)ch.msgs[--ch.n_msgs].content);
            ok = false;
            if (!chat_can_go_on(&ch, &res)) break;
            continue;
        }
        fprintf(term, "[ttft %.3f s, %.1f tokens/s; sent %ld bytes; prompt %ld tokens, %ld from cache]\n", res.ttft_s,
                res.completion_tokens > 1 && res.total_s > res.ttft_s
                    ? (double)(res.completion_tokens - 1) / (res.total_s - res.ttft_s) : 0.0,
                res.request_bytes, res.prompt_tokens, res.cached_tokens);
        ch.msgs[ch.n_msgs++] = (ClientMsg){"assistant", res.content};
    }
    status = ok ? 0 : 1;
done:
    for (size_t i = 0; i < ch.n_msgs; i++) mn_free((char *)ch.msgs[i].content);
    mn_free(ch.msgs);
    chat_input_free(in);
    client_free(ch.c);
    return status;
}
