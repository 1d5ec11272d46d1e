/* chat_input.c — reading the chat's lines: libedit on a terminal, plain
 * reads otherwise (see chat_input.h).
 *
 * libedit owns the line it returns until its next el_gets; the line is
 * copied into the ChatInput's buffer (without the newline) so that both
 * paths hand out the same kind of string. The history lives in libedit's
 * History object for the life of the ChatInput; nothing is written to disk
 * (a chat's lines may be private).
 */
#include "bench/chat_input.h"

#include <histedit.h>
#include <string.h>
#include <unistd.h>

#include "base/mem.h"

#define CHAT_HISTORY_SIZE 1000

struct ChatInput {
    FILE *in, *out;
    EditLine *el;     /* NULL when the input is not a terminal */
    History *hist;
    const char *prompt;
    char *line;       /* the last line read, NUL-terminated */
    size_t cap;
};

/* ---- helpers --------------------------------------------------------------- */

static char *prompt_of(EditLine *el) {
    ChatInput *ci = NULL;
    el_get(el, EL_CLIENTDATA, &ci);
    return (char *)(ci && ci->prompt ? ci->prompt : "");
}

/* Room for n bytes and a NUL in ci->line. */
static bool reserve(ChatInput *ci, size_t n) {
    if (n + 1 <= ci->cap) return true;
    size_t cap = ci->cap ? ci->cap : 256;
    while (cap < n + 1) cap *= 2;
    char *b = mn_realloc(ci->line, cap);
    if (b == NULL) return false;
    ci->line = b;
    ci->cap = cap;
    return true;
}

static int read_plain(ChatInput *ci) {
    size_t n = 0;
    int ch;
    while ((ch = getc(ci->in)) != EOF && ch != '\n') {
        if (!reserve(ci, n + 1)) return MN_ENOMEM;
        ci->line[n++] = (char)ch;
    }
    if (ch == EOF && n == 0) return MN_ENOTFOUND;
    if (!reserve(ci, n)) return MN_ENOMEM;
    ci->line[n] = '\0';
    return MN_OK;
}

static int read_edited(ChatInput *ci) {
    int count = 0;
    const char *s = el_gets(ci->el, &count);
    if (s == NULL || count <= 0) return MN_ENOTFOUND;
    size_t n = (size_t)count;
    if (s[n - 1] == '\n') n--;
    if (!reserve(ci, n)) return MN_ENOMEM;
    memcpy(ci->line, s, n);
    ci->line[n] = '\0';
    if (n > 0) {
        HistEvent ev;
        history(ci->hist, &ev, H_ENTER, ci->line);
    }
    return MN_OK;
}

/* ---- API ------------------------------------------------------------------- */

int chat_input_new(FILE *in, FILE *out, ChatInput **out_ci) {
    *out_ci = NULL;
    ChatInput *ci = mn_calloc(1, sizeof *ci);
    if (ci == NULL) return MN_ENOMEM;
    ci->in = in;
    ci->out = out;
    if (isatty(fileno(in)) && isatty(fileno(out))) { /* libedit echoes what it edits to out */
        HistEvent ev;
        ci->hist = history_init();
        ci->el = el_init("mnemo", in, out, out);
        if (ci->hist == NULL || ci->el == NULL) {
            chat_input_free(ci);
            return MN_ENOMEM;
        }
        history(ci->hist, &ev, H_SETSIZE, CHAT_HISTORY_SIZE);
        history(ci->hist, &ev, H_SETUNIQUE, 1); /* a line sent twice in a row is kept once */
        el_set(ci->el, EL_CLIENTDATA, ci);
        el_set(ci->el, EL_PROMPT, prompt_of);
        el_set(ci->el, EL_EDITOR, "emacs");
        el_set(ci->el, EL_HIST, history, ci->hist);
        el_set(ci->el, EL_SIGNAL, 1); /* Ctrl-C and Ctrl-Z leave the terminal as it was */
        el_source(ci->el, NULL);       /* the user's ~/.editrc, when there is one */
    }
    *out_ci = ci;
    return MN_OK;
}

void chat_input_free(ChatInput *ci) {
    if (ci == NULL) return;
    if (ci->el) el_end(ci->el);
    if (ci->hist) history_end(ci->hist);
    mn_free(ci->line);
    mn_free(ci);
}

int chat_input_read(ChatInput *ci, const char *prompt, const char **line) {
    *line = NULL;
    ci->prompt = prompt;
    int rc;
    if (ci->el) {
        rc = read_edited(ci);
    } else {
        fputs(prompt, ci->out);
        fflush(ci->out);
        rc = read_plain(ci);
    }
    if (rc == MN_OK) *line = ci->line;
    return rc;
}

bool chat_input_is_editing(const ChatInput *ci) { return ci->el != NULL; }

int chat_input_history_len(const ChatInput *ci) {
    if (ci->hist == NULL) return 0;
    HistEvent ev;
    return history(ci->hist, &ev, H_GETSIZE) == 0 ? ev.num : 0;
}
