/* sse.h — a parser for server-sent event streams (text/event-stream).
 *
 * Bytes go in as they arrive, cut anywhere; whole events come out through a
 * callback. It follows the WHATWG event-stream rules: lines end with CRLF,
 * LF or CR (a CRLF may be split between two feeds); "field: value" or
 * "field:value" (one space after the colon is dropped); `data` lines of one
 * event are joined with "\n"; `event` names the event's type ("message" when
 * none); a blank line dispatches the event; lines starting with ':' are
 * comments (keep-alive pings); `id`, `retry` and unknown fields are
 * ignored, as are events without a `data` line. Two departures, both for
 * servers seen in the field: an `error: VALUE` line (llama-server's older
 * streams) reads as `event: error` plus `data: VALUE`, and sse_end
 * dispatches an event the stream left unterminated, where the standard
 * drops it. Used by bench/client.c; no threads, no global state.
 */
#ifndef MN_BENCH_SSE_H
#define MN_BENCH_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

/* One event: type ("message" unless an `event` or `error` field named
 * another) and its data, NUL-terminated, len bytes. Both are valid only
 * during the call. */
typedef void (*SseEventFn)(void *ctx, const char *type, const char *data, size_t len);

typedef struct SseParser {
    SseEventFn fn;
    void *ctx;
    char *line;          /* the line being read (no terminator) */
    size_t n_line, cap_line;
    char *data;          /* the event's data lines, each followed by '\n' */
    size_t n_data, cap_data;
    bool has_data;       /* a data field was seen since the last dispatch */
    char type[32];       /* "" : "message"; longer names are cut */
    bool is_after_cr;    /* the last byte ended a line with CR: a LF next is its pair */
    bool is_started;     /* past a leading byte-order mark */
} SseParser;

/* Start parsing a new stream; fn gets every event. */
void sse_init(SseParser *p, SseEventFn fn, void *ctx);

/* Release the buffers; p may be fed again only after sse_init. */
void sse_deinit(SseParser *p);

/* Parse len more bytes of the stream, calling fn for each event they
 * complete. MN_OK, or MN_ENOMEM (the bytes are then partly parsed and the
 * stream should be given up). */
int sse_feed(SseParser *p, const char *buf, size_t len);

/* The stream ended: a last line without its terminator is parsed and an
 * event without its blank line is dispatched. MN_OK or MN_ENOMEM. */
int sse_end(SseParser *p);

#endif
