/* mem.h — the one allocation wrapper every module uses.
 *
 * All heap memory goes through these functions so that allocation can be
 * accounted and, in tests, made to fail. They return NULL on failure (never
 * abort); mn_free(NULL) and mn_free_aligned(NULL) are no-ops. Memory from
 * mn_alloc_aligned must be released with mn_free_aligned, memory from
 * mn_huge_alloc with mn_huge_free.
 */
#ifndef MN_MEM_H
#define MN_MEM_H

#include <stddef.h>

void *mn_malloc(size_t n_bytes);
void *mn_calloc(size_t n_items, size_t item_bytes); /* overflow-checked */
void *mn_realloc(void *ptr, size_t n_bytes);
void mn_free(void *ptr);
char *mn_strdup(const char *s);
char *mn_strndup(const char *s, size_t n);

/* Make the growing byte buffer *buf (*cap bytes, NULL when 0) hold at least
 * need bytes, doubling its capacity so that appends cost amortized O(1).
 * MN_OK, or MN_ENOMEM with *buf and *cap unchanged; the contents stay. */
int mn_reserve(char **buf, size_t *cap, size_t need);

/* n_bytes rounded up to a multiple of align (a power of two >= 8). */
void *mn_alloc_aligned(size_t n_bytes, size_t align);
void mn_free_aligned(void *ptr);

/* Anonymous memory for big long-lived buffers (the disk tier's transfers,
 * the model's weights): n_bytes rounded up to MN_HUGE_ALIGN (2 MiB),
 * aligned to it, zero-filled and already faulted in (so that a lack of
 * memory is this call's NULL and not a kill later; kernels before 5.14
 * fault on first use instead), and advised for transparent huge pages,
 * so that where the kernel grants them the buffer is a few physically
 * contiguous pieces, each one TLB entry, rather than one 4 KiB page after
 * another. NULL on failure (no memory, or n_bytes 0 or too large). *cap is
 * the rounded size, to be passed to mn_huge_free. */
#define MN_HUGE_ALIGN (2u << 20)
void *mn_huge_alloc(size_t n_bytes, size_t *cap);
void mn_huge_free(void *buf, size_t cap);
/* How many bytes of [buf, buf+cap) the kernel backs with huge pages now
 * (from /proc/self/smaps), or -1 when it cannot tell. For reports and
 * tests. */
long long mn_huge_bytes(const void *buf, size_t cap);

/* Multiply with overflow check: returns 0 and sets *out, or -1 on overflow. */
int mn_mul_size(size_t a, size_t b, size_t *out);

#endif
