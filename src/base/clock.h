/* clock.h — the one monotonic clock every subsystem times with. */
#ifndef MN_CLOCK_H
#define MN_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (arbitrary origin; only differences mean anything). */
double mn_now(void);

#endif
