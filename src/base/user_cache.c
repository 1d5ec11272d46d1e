/* user_cache.c — the per-user cache directory (see user_cache.h). */
#include "base/user_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "base/err.h"

int user_cache_path(const char *name, char *buf, size_t cap) {
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0') return MN_ENOTFOUND;
    int n = snprintf(buf, cap, "%s/.cache/mnemo/%s", home, name);
    if (n < 0 || (size_t)n >= cap) return MN_ERANGE;
    snprintf(buf, cap, "%s/.cache", home);
    mkdir(buf, 0755);
    snprintf(buf, cap, "%s/.cache/mnemo", home);
    mkdir(buf, 0755);
    snprintf(buf, cap, "%s/.cache/mnemo/%s", home, name);
    return MN_OK;
}
