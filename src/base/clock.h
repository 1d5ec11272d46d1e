/* clock.h — the clocks every subsystem times with: one monotonic clock for
 * durations, one wall clock for times that must mean the same after a
 * restart (last use of stored cache runs). */
#ifndef MN_CLOCK_H
#define MN_CLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC (arbitrary origin; only differences mean anything). */
double mn_now(void);
/* Seconds since the Unix epoch (CLOCK_REALTIME; may jump when the clock is set). */
double mn_wall_now(void);

/* t seconds (a time on either clock) as a struct timespec, for the timed
 * waits (pthread_cond_timedwait): nanoseconds normalized, a negative or
 * NaN t is 0, and a t past MN_TIME_FAR_S is that far — a wait that does
 * not end by itself — rather than a conversion past time_t's range, whose
 * result is undefined (in practice a time long past: a wait that ends at
 * once, again and again). */
#define MN_TIME_FAR_S 1e15
struct timespec mn_timespec_of(double t);

#endif
