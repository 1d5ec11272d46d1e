/* log.c — see log.h. One fprintf per message so lines from threads do not
 * interleave. */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void mn_log(int level, const char *file, int line, const char *fmt, ...) {
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (level == MN_LOG_INFO)
        fprintf(stderr, "mnemo: %s\n", msg);
    else
        fprintf(stderr, "mnemo: %s: %s (%s:%d)\n", names[level], msg, base, line);
}
