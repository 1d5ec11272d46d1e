/* clock.c — see clock.h. */
#include "base/clock.h"

#include <time.h>

double mn_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct timespec mn_timespec_of(double t) {
    if (!(t > 0)) return (struct timespec){0, 0};
    if (t > MN_TIME_FAR_S) t = MN_TIME_FAR_S;
    struct timespec ts = {.tv_sec = (time_t)t};
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) { /* t's fraction rounded up to a whole second */
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

double mn_wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
