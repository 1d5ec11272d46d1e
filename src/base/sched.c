/* sched.c — see sched.h. glibc (2.36) has no wrapper for sched_setattr or
 * sched_getattr, so they are called through syscall(2) with the kernel's
 * struct sched_attr, laid out here as the kernel's uapi header has it. */
#include "base/sched.h"

#include <errno.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/err.h"

#define ATTR_FLAG_KEEP_POLICY 0x08 /* SCHED_FLAG_KEEP_POLICY */

typedef struct SchedAttr {
    uint32_t size;
    uint32_t policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime; /* the fair class's requested slice, in ns */
    uint64_t deadline;
    uint64_t period;
    uint32_t util_min, util_max;
} SchedAttr;

/* The calling thread's nice value (Linux keeps one per thread). */
static int own_nice(int *nice) {
    errno = 0;
    *nice = getpriority(PRIO_PROCESS, 0);
    return *nice == -1 && errno != 0 ? MN_EUNSUPPORTED : MN_OK;
}

int mn_thread_set_slice(uint64_t slice_ns) {
    if (slice_ns < MN_SLICE_MIN_NS || slice_ns > MN_SLICE_MAX_NS) return MN_EINVAL;
    int nice;
    if (own_nice(&nice) != MN_OK) return MN_EUNSUPPORTED;
    SchedAttr a = {.size = sizeof a, .flags = ATTR_FLAG_KEEP_POLICY, .nice = nice, .runtime = slice_ns};
    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0) return MN_EUNSUPPORTED;
    return MN_OK;
}

int mn_thread_nice_add(int incr) {
    if (incr < 0 || incr > 19) return MN_EINVAL;
    int nice;
    if (own_nice(&nice) != MN_OK) return MN_EUNSUPPORTED;
    int want = nice + incr > 19 ? 19 : nice + incr;
    if (setpriority(PRIO_PROCESS, 0, want) != 0) return MN_EUNSUPPORTED;
    return MN_OK;
}

uint64_t mn_thread_slice(void) {
    SchedAttr a = {0};
    if (syscall(SYS_sched_getattr, 0, &a, (unsigned)sizeof a, 0) != 0) return 0;
    return a.runtime;
}
