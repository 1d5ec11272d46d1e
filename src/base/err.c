/* err.c — names of the error codes and the MnErr message helpers. */
#include "base/err.h"

#include <stdio.h>
#include <string.h>

static const char *const err_names[MN_ERR__COUNT] = {
    [MN_OK] = "success",
    [MN_ENOMEM] = "out of memory",
    [MN_EIO] = "I/O error",
    [MN_EFORMAT] = "malformed input",
    [MN_EINVAL] = "invalid argument",
    [MN_EUNSUPPORTED] = "unsupported",
    [MN_ERANGE] = "value out of range",
    [MN_ENOTFOUND] = "not found",
    [MN_EFULL] = "no space left",
    [MN_ECHECKSUM] = "checksum mismatch",
    [MN_EBUSY] = "busy",
    [MN_ECANCELED] = "cancelled",
};

const char *mn_strerror(int code) {
    if (code < 0 || code >= MN_ERR__COUNT) return "unknown error";
    return err_names[code];
}

int mn_err_set(MnErr *err, int code, const char *fmt, ...) {
    if (err == NULL) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int mn_err_prefix(MnErr *err, const char *fmt, ...) {
    if (err == NULL) return MN_OK;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3, n_old = strnlen(old, sizeof old);
    if (n_old > room) n_old = room;
    memcpy(err->msg + n + 2, old, n_old);
    err->msg[n + 2 + n_old] = '\0';
    return err->code;
}
