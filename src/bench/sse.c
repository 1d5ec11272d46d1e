/* sse.c — server-sent event stream parser (see sse.h).
 *
 * Bytes accumulate into the current line until a terminator; each line is
 * then read as a field and either added to the pending event (data, event
 * type) or, when blank, dispatches it. The parser is owned by one caller
 * and holds no state beyond the struct: two buffers (line and data) that
 * grow to the longest line and event seen.
 */
#include "bench/sse.h"

#include <string.h>

#include "base/mem.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static void set_type(SseParser *p, const char *s, size_t n) {
    if (n >= sizeof p->type) n = sizeof p->type - 1;
    memcpy(p->type, s, n);
    p->type[n] = '\0';
}

static int add_data(SseParser *p, const char *s, size_t n) {
    if (mn_reserve(&p->data, &p->cap_data, p->n_data + n + 2) != MN_OK) return MN_ENOMEM;
    memcpy(p->data + p->n_data, s, n);
    p->n_data += n;
    p->data[p->n_data++] = '\n';
    p->data[p->n_data] = '\0';
    p->has_data = true;
    return MN_OK;
}

/* A blank line: hand the pending event over (without the data's last
 * '\n') and start the next one. */
static void dispatch(SseParser *p) {
    if (p->has_data) {
        p->data[--p->n_data] = '\0';
        p->fn(p->ctx, p->type[0] ? p->type : "message", p->data, p->n_data);
    }
    p->n_data = 0;
    p->has_data = false;
    p->type[0] = '\0';
}

/* One line, its terminator removed. */
static int on_line(SseParser *p, const char *s, size_t n) {
    if (!p->is_started) { /* a byte-order mark may open the stream */
        p->is_started = true;
        if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
            s += 3;
            n -= 3;
        }
    }
    if (n == 0) {
        dispatch(p);
        return MN_OK;
    }
    if (s[0] == ':') return MN_OK; /* a comment */
    const char *colon = memchr(s, ':', n);
    size_t n_field = colon ? (size_t)(colon - s) : n;
    const char *value = colon ? colon + 1 : s + n;
    size_t n_value = (size_t)(s + n - value);
    if (n_value > 0 && value[0] == ' ') {
        value++;
        n_value--;
    }
    if (n_field == 4 && memcmp(s, "data", 4) == 0) return add_data(p, value, n_value);
    if (n_field == 5 && memcmp(s, "event", 5) == 0) set_type(p, value, n_value);
    if (n_field == 5 && memcmp(s, "error", 5) == 0) { /* llama-server's older error line */
        set_type(p, "error", 5);
        return add_data(p, value, n_value);
    }
    return MN_OK;
}

/* ---- API ------------------------------------------------------------------------------------ */

void sse_init(SseParser *p, SseEventFn fn, void *ctx) {
    memset(p, 0, sizeof *p);
    p->fn = fn;
    p->ctx = ctx;
}

void sse_deinit(SseParser *p) {
    mn_free(p->line);
    mn_free(p->data);
    p->line = p->data = NULL;
    p->n_line = p->cap_line = p->n_data = p->cap_data = 0;
}

int sse_feed(SseParser *p, const char *buf, size_t len) {
    for (size_t i = 0; i < len; i++) {
        char ch = buf[i];
        bool was_after_cr = p->is_after_cr;
        p->is_after_cr = false;
        if (ch == '\n' && was_after_cr) continue; /* the LF of a CRLF */
        if (ch == '\n' || ch == '\r') {
            p->is_after_cr = ch == '\r';
            int rc = on_line(p, p->line ? p->line : "", p->n_line);
            p->n_line = 0;
            if (rc != MN_OK) return rc;
            continue;
        }
        if (mn_reserve(&p->line, &p->cap_line, p->n_line + 2) != MN_OK) return MN_ENOMEM;
        p->line[p->n_line++] = ch;
        p->line[p->n_line] = '\0';
    }
    return MN_OK;
}

int sse_end(SseParser *p) {
    if (p->n_line > 0) {
        int rc = on_line(p, p->line, p->n_line);
        p->n_line = 0;
        if (rc != MN_OK) return rc;
    }
    dispatch(p);
    return MN_OK;
}
