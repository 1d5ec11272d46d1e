/* api_base.h — the part of the OpenAI wire format that needs no engine:
 * text made valid UTF-8, JSON serialized into the project's allocator, and
 * the error object every answer of an error carries.
 *
 * server/openai builds every other answer on these; server/gate and the
 * router (route/) answer with the error object and include only this
 * header of the wire format. Pure functions, no I/O, no state: any thread.
 */
#ifndef MN_API_BASE_H
#define MN_API_BASE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* A copy of s[0..len) in which every ill-formed sequence (per the strict
 * RFC 3629 rules of base/utf8.h: no overlongs, surrogates or code points
 * above U+10FFFF; one U+FFFD per maximal ill-formed subpart, a truncated
 * sequence at the end included) is replaced by U+FFFD. Valid input comes
 * back byte for byte. NUL-terminated, mn_malloc'd (at most 3 * len + 1
 * bytes); *out_len (if not NULL) gets its length. NULL on OOM. */
char *api_utf8_sanitize(const char *s, size_t len, size_t *out_len);

/* A jansson string of s[0..len) (NULL is ""), sanitized as above when it
 * is not valid UTF-8; NULL on OOM. */
json_t *api_json_text(const char *s, size_t len);

/* j serialized compactly into an mn_malloc'd NUL-terminated text; j is
 * released either way. NULL when j is NULL, is_ok is false (a build step
 * failed) or memory runs out. */
char *api_json_finish(json_t *j, bool is_ok);

/* The OpenAI error object:
 * {"error":{"message","type":api_error_type(http_status),"param","code"}};
 * param and code NULL give JSON null. message NULL gives "". mn_malloc'd,
 * NULL on OOM. */
char *api_error_json(int http_status, const char *message, const char *param, const char *code);

/* The OpenAI error type for an HTTP status: 400, 404, 413, 422 and other
 * 4xx "invalid_request_error", 401 "authentication_error", 403
 * "permission_error", 429 "rate_limit_error", 501
 * "not_supported_error", 503 "unavailable_error", other 5xx (and anything
 * else) "server_error". Static string, never NULL. */
const char *api_error_type(int http_status);

#endif
