/* err.h — the project-wide error codes and a message carrier.
 *
 * Every function that can fail returns an int from this set (MN_OK = 0) and
 * hands results back through out-parameters. Functions that parse outside
 * input also take an optional MnErr* that receives a human-readable message
 * naming the problem and where it was found; pass NULL when the message is
 * not wanted. Foreign error codes (errno, SQLite, jansson, ...) are converted
 * to these at the edge of the module that calls the foreign library.
 */
#ifndef MN_ERR_H
#define MN_ERR_H

#include <stdarg.h>

enum {
    MN_OK = 0,
    MN_ENOMEM,        /* an allocation failed */
    MN_EIO,           /* a read, write, mmap or open failed */
    MN_EFORMAT,       /* input is malformed, truncated or inconsistent */
    MN_EINVAL,        /* a caller passed an invalid argument */
    MN_EUNSUPPORTED,  /* well-formed, but a feature we do not implement */
    MN_ERANGE,        /* a value lies outside its allowed range */
    MN_ENOTFOUND,     /* a key, file or entry does not exist */
    MN_EFULL,         /* no space left (pool, tier, disk) */
    MN_ECHECKSUM,     /* stored data failed its checksum */
    MN_EBUSY,         /* resource temporarily unavailable */
    MN_ECANCELED,     /* the operation was cancelled */
    MN_ERR__COUNT
};

/* A message for humans that explains a failure. Filled by mn_err_set. */
typedef struct MnErr {
    int code;
    char msg[512];
} MnErr;

/* Short fixed name of a code ("out of memory", ...). Never NULL. */
const char *mn_strerror(int code);

/* Record code and a printf-style message in err (if err is not NULL) and
 * return code, so callers can write `return mn_err_set(err, MN_EFORMAT, ...)`. */
int mn_err_set(MnErr *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix an existing message with context ("loading model x: ..."). */
int mn_err_prefix(MnErr *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
