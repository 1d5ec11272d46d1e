/* api_base.c — valid text, compact JSON and the error object (see api_base.h).
 *
 * jansson refuses strings that are not valid UTF-8, so api_json_text
 * checks each string and, when it is invalid, substitutes the
 * api_utf8_sanitize form (one U+FFFD per maximal ill-formed subpart, the
 * rule base/utf8.h's decoder and the streaming detokenizer use): a broken
 * byte degrades the text, never the answer. Serialization goes through a
 * callback into an mn_malloc'd buffer, so callers free every result with
 * mn_free whatever allocator jansson was given.
 */
#include "server/api_base.h"

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "base/mem.h"
#include "base/utf8.h"

/* ---- text ------------------------------------------------------------------------- */

/* Write the sanitized form of s[0..len) to out (NULL: only measure) and
 * return its length. Both passes of api_utf8_sanitize use it, so the size
 * measured is the size written. */
static size_t utf8_sanitize_into(const unsigned char *s, size_t len, char *out) {
    static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */
    size_t i = 0, n = 0;
    while (i < len) {
        uint32_t cp;
        int k = s[i] < 0x80 ? 1 : utf8_decode_strict(s + i, len - i, &cp);
        if (k > 0) {
            if (out) memcpy(out + n, s + i, (size_t)k);
            n += (size_t)k;
            i += (size_t)k;
            continue;
        }
        /* An ill-formed sequence of -k bytes, or (k == 0) a valid prefix cut
         * short by the end of the buffer: either way one U+FFFD. */
        i += k == 0 ? len - i : (size_t)-k;
        if (out) memcpy(out + n, REPL, sizeof REPL);
        n += sizeof REPL;
    }
    return n;
}

char *api_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    assert(s != NULL || len == 0);
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = utf8_sanitize_into(p, len, NULL); /* <= 3 * len: no overflow for any real buffer */
    char *out = mn_malloc(n + 1);
    if (out == NULL) return NULL;
    utf8_sanitize_into(p, len, out);
    out[n] = '\0';
    if (out_len) *out_len = n;
    return out;
}

json_t *api_json_text(const char *s, size_t len) {
    if (s == NULL) s = "";
    if (utf8_is_valid(s, len)) return json_stringn_nocheck(s, len);
    size_t n;
    char *clean = api_utf8_sanitize(s, len, &n);
    if (clean == NULL) return NULL;
    json_t *j = json_stringn_nocheck(clean, n);
    mn_free(clean);
    return j;
}

/* ---- serialization ---------------------------------------------------------------- */

/* A growable output buffer for json_dump_callback. */
typedef struct DumpBuf {
    char *data;
    size_t len; /* bytes written */
    size_t cap; /* bytes allocated, > len once data != NULL */
} DumpBuf;

static int dump_cb(const char *buf, size_t size, void *ctx) {
    DumpBuf *b = ctx;
    if (b->len + size + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + size + 1) cap *= 2; /* sizes of in-memory text: no overflow */
        char *data = mn_realloc(b->data, cap);
        if (data == NULL) return -1;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, buf, size);
    b->len += size;
    b->data[b->len] = '\0';
    return 0;
}

char *api_json_finish(json_t *j, bool is_ok) {
    if (j == NULL) return NULL;
    DumpBuf b = {0};
    int rc = is_ok ? json_dump_callback(j, dump_cb, &b, JSON_COMPACT) : -1;
    json_decref(j);
    if (rc != 0 || b.data == NULL) {
        mn_free(b.data);
        return NULL;
    }
    return b.data;
}

/* ---- the error object -------------------------------------------------------------- */

/* Set obj[key] = v, stealing v; false when v is NULL or the set fails. */
static bool object_set(json_t *obj, const char *key, json_t *v) { return json_object_set_new(obj, key, v) == 0; }

const char *api_error_type(int http_status) {
    switch (http_status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    case 501: return "not_supported_error";
    case 503: return "unavailable_error";
    default: return http_status >= 400 && http_status < 500 ? "invalid_request_error" : "server_error";
    }
}

char *api_error_json(int http_status, const char *message, const char *param, const char *code) {
    json_t *o = json_object(), *e = json_object();
    bool is_ok = o && e;
    is_ok = is_ok && object_set(e, "message", api_json_text(message, message ? strlen(message) : 0));
    is_ok = is_ok && object_set(e, "type", json_string_nocheck(api_error_type(http_status)));
    is_ok = is_ok && object_set(e, "param", param ? api_json_text(param, strlen(param)) : json_null());
    is_ok = is_ok && object_set(e, "code", code ? api_json_text(code, strlen(code)) : json_null());
    is_ok = is_ok && object_set(o, "error", json_incref(e));
    json_decref(e);
    return api_json_finish(o, is_ok);
}
