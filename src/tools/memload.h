/* memload.h — memory traffic on demand: threads that copy buffers back and
 * forth, to measure something else while the memory bus is busy.
 *
 * The disk's DMA shares the memory bus with the cores. While a server
 * computes, its matmuls stream the model's weights on every core, and raw
 * reads of a directory may slow with them, so a probe taken under such a
 * load says what the disk gives while the server computes (`mnemo
 * disk-probe --memory-load N`; what it did on one machine is in
 * docs/OPERATIONS.md). Threads that spin without touching memory do not
 * stand in for compute here: it is the copying that counts.
 *
 * memload_start starts n_threads threads, each copying MEMLOAD_BYTES back
 * and forth between two buffers of its own (touched first, so it copies
 * rather than faults), at least once, until memload_stop, which tells them
 * through a pipe and joins them. The MemLoad belongs to the caller's thread; each copying
 * thread writes only its own counter, read after the join.
 */
#ifndef MN_TOOLS_MEMLOAD_H
#define MN_TOOLS_MEMLOAD_H

#include "base/err.h"

#define MEMLOAD_MAX_THREADS 64
#define MEMLOAD_BYTES (64u << 20) /* per buffer, two a thread */

typedef struct MemLoad MemLoad;

/* Start n_threads (1..MEMLOAD_MAX_THREADS) copying threads. MN_OK and
 * *out; MN_EINVAL (n_threads out of range), MN_ENOMEM (buffers, threads):
 * *out is NULL, err says why, and nothing is left running. */
int memload_start(int n_threads, MemLoad **out, MnErr *err);

/* Stop the threads, join and free them; returns the bytes copied per
 * second over the load's life (0 for NULL). */
double memload_stop(MemLoad *l);

#endif
