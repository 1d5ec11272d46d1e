/* sched.h — scheduling hints for the calling thread.
 *
 * The mover thread sleeps on its I/O most of the time and, while a restore
 * streams, wakes every few hundred microseconds to place a layer and queue
 * the next reads. With compute on every core, each wake-up waits for a
 * compute thread's time slice to run out, so a serving restore spends a
 * share of its time runnable but not running. Linux's EEVDF scheduler
 * (6.12 and later) lets a thread ask for a shorter slice: it gets the same
 * share of CPU, but is picked sooner when it wakes. No privilege is
 * needed, and the thread's nice value and policy are kept.
 *
 * The slice only decides who runs first; once running, the mover still
 * shares a core with the compute threads by weight, so placing a
 * restore's layers is preempted between its short slices and takes
 * several times its CPU time. Compute threads a few nice levels down (a
 * third of the weight at 5) leave it the core. What both hints gained
 * where they were traced is in docs/OPERATIONS.md ("Figures behind the
 * tier defaults").
 */
#ifndef MN_SCHED_H
#define MN_SCHED_H

#include <stdint.h>

/* The range the kernel accepts for a fair-class slice. */
#define MN_SLICE_MIN_NS 100000ull     /* 0.1 ms */
#define MN_SLICE_MAX_NS 100000000ull  /* 100 ms */

/* Ask for time slices of slice_ns for the calling thread. MN_OK;
 * MN_EINVAL outside [MN_SLICE_MIN_NS, MN_SLICE_MAX_NS]; MN_EUNSUPPORTED
 * when the kernel refuses (a kernel without sched_setattr, a seccomp
 * filter); a kernel older than 6.12 accepts and ignores the hint. */
int mn_thread_set_slice(uint64_t slice_ns);

/* The calling thread's slice as the kernel reports it (0 when it keeps
 * none, or cannot say), for tests and logs. */
uint64_t mn_thread_slice(void);

/* Lower the calling thread's priority by incr nice levels (its nice value
 * grows by incr, to at most 19). Lowering needs no privilege. MN_OK;
 * MN_EINVAL when incr is outside [0, 19]; MN_EUNSUPPORTED when the kernel
 * refuses. Used for the compute threads (DESIGN.md, "Threads"): a weight
 * below the mover's, so a restore placing its layers is not preempted for
 * a compute thread's slice. */
int mn_thread_nice_add(int incr);

#endif
