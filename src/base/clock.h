/* clock.h — the clocks every subsystem times with: one monotonic clock for
 * durations, one wall clock for times that must mean the same after a
 * restart (last use of stored cache runs). */
#ifndef MN_CLOCK_H
#define MN_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (arbitrary origin; only differences mean anything). */
double mn_now(void);
/* Seconds since the Unix epoch (CLOCK_REALTIME; may jump when the clock is set). */
double mn_wall_now(void);

#endif
