/* mem.c — see mem.h. Thin wrappers over the C library today; the single
 * choke point is what matters. */
#include "base/mem.h"

#include "base/err.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void *mn_malloc(size_t n_bytes) { return malloc(n_bytes ? n_bytes : 1); }

void *mn_calloc(size_t n_items, size_t item_bytes) {
    size_t total;
    if (mn_mul_size(n_items, item_bytes, &total) != 0) return NULL;
    return calloc(1, total ? total : 1);
}

void *mn_realloc(void *ptr, size_t n_bytes) { return realloc(ptr, n_bytes ? n_bytes : 1); }

void mn_free(void *ptr) { free(ptr); }

char *mn_strdup(const char *s) { return mn_strndup(s, strlen(s)); }

char *mn_strndup(const char *s, size_t n) {
    char *d = mn_malloc(n + 1);
    if (d == NULL) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

int mn_reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return MN_OK;
    size_t c = *cap ? *cap : 256;
    while (c < need) c = c > SIZE_MAX / 2 ? need : c * 2;
    char *b = mn_realloc(*buf, c);
    if (b == NULL) return MN_ENOMEM;
    *buf = b;
    *cap = c;
    return MN_OK;
}

void *mn_alloc_aligned(size_t n_bytes, size_t align) {
    size_t rounded = (n_bytes + align - 1) & ~(align - 1);
    if (rounded < n_bytes) return NULL;
    return aligned_alloc(align, rounded ? rounded : align);
}

void mn_free_aligned(void *ptr) { free(ptr); }

int mn_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}
