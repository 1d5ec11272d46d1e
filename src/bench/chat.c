/* chat.c — the conversation loop of `mnemo chat` (see chat.h).
 *
 * The conversation is an array of ClientMsg the loop owns (every content
 * mn_strdup'ed, the replies' taken from ClientResult), grown by two per
 * turn; a failed turn's user message is popped again, so the next request
 * holds only the turns that were answered. Single-threaded.
 */
#include "bench/chat.h"

#include "base/err.h"
#include "base/mem.h"
#include "bench/chat_input.h"
#include "bench/client.h"

static void chat_print(void *ctx, const char *text, size_t len) {
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* After a failed turn: whether the chat can go on, else the hint to stop with. */
static bool chat_can_go_on(const ClientResult *res, const char *url, const char *api_key, FILE *term) {
    if (res->http_status == 401) {
        if (api_key)
            fprintf(term, "mnemo chat: %s refused the API key (HTTP 401): check --api-key\n", url);
        else
            fprintf(term, "mnemo chat: %s wants an API key (HTTP 401): give it with --api-key KEY\n", url);
        return false;
    }
    if (res->http_status == 0) { /* no HTTP answer at all */
        fprintf(term, "mnemo chat: no answer from %s (%s): is the server running?\n", url,
                res->error[0] ? res->error : "no connection");
        return false;
    }
    fprintf(term, "mnemo chat: %s\n", res->error[0] ? res->error : "request failed");
    return true;
}

int chat_run(const ChatOpts *o, FILE *in_file, FILE *term) {
    ChatClient *c = NULL;
    ChatInput *in = NULL;
    ClientMsg *msgs = NULL;
    size_t n_msgs = 0;
    int status = 1;
    if (client_new(o->url, o->api_key, &c) != MN_OK || chat_input_new(in_file, term, &in) != MN_OK) goto done;
    if (o->system) {
        msgs = mn_realloc(msgs, sizeof *msgs);
        msgs[n_msgs++] = (ClientMsg){"system", mn_strdup(o->system)};
    }
    fprintf(term, "chatting with %s (empty line or end of input to quit)\n", o->url);
    bool ok = true;
    const char *line;
    while (chat_input_read(in, "> ", &line) == MN_OK && line[0] != '\0') {
        ClientMsg *grown = mn_realloc(msgs, (n_msgs + 2) * sizeof *msgs);
        if (grown == NULL) break;
        msgs = grown;
        msgs[n_msgs++] = (ClientMsg){"user", mn_strdup(line)};
        ClientParams p = {o->model_name, o->max_tokens, o->temperature, o->ignore_eos, -1};
        ClientResult res;
        int rc = client_chat(c, msgs, n_msgs, &p, chat_print, NULL, &res);
        printf("\n");
        fflush(stdout);
        if (rc != MN_OK || res.http_status != 200) {
            mn_free(res.content);
            mn_free((char *)msgs[--n_msgs].content);
            ok = false;
            if (!chat_can_go_on(&res, o->url, o->api_key, term)) break;
            continue;
        }
        fprintf(term, "[ttft %.3f s, %.1f tokens/s; prompt %ld tokens, %ld from cache]\n", res.ttft_s,
                res.completion_tokens > 1 && res.total_s > res.ttft_s
                    ? (double)(res.completion_tokens - 1) / (res.total_s - res.ttft_s) : 0.0,
                res.prompt_tokens, res.cached_tokens);
        msgs[n_msgs++] = (ClientMsg){"assistant", res.content};
    }
    status = ok ? 0 : 1;
done:
    for (size_t i = 0; i < n_msgs; i++) mn_free((char *)msgs[i].content);
    mn_free(msgs);
    chat_input_free(in);
    client_free(c);
    return status;
}
