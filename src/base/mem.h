/* mem.h — the one allocation wrapper every module uses.
 *
 * All heap memory goes through these functions so that allocation can be
 * accounted and, in tests, made to fail. They return NULL on failure (never
 * abort); mn_free(NULL) and mn_free_aligned(NULL) are no-ops. Memory from
 * mn_alloc_aligned must be released with mn_free_aligned.
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

/* Multiply with overflow check: returns 0 and sets *out, or -1 on overflow. */
int mn_mul_size(size_t a, size_t b, size_t *out);

#endif
