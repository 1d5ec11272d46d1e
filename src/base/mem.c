/* mem.c — see mem.h. Thin wrappers over the C library, and huge-page
 * buffers mapped straight from the kernel; the single choke point is what
 * matters. */
#include "base/mem.h"

#include "base/err.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

void *mn_huge_alloc(size_t n_bytes, size_t *cap) {
    *cap = 0;
    if (n_bytes == 0 || n_bytes > SIZE_MAX / 2) return NULL;
    size_t len = (n_bytes + MN_HUGE_ALIGN - 1) & ~(size_t)(MN_HUGE_ALIGN - 1);
    /* map one alignment more, then cut the ends so the buffer starts on a
     * huge-page boundary */
    uint8_t *map = mmap(NULL, len + MN_HUGE_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return NULL;
    uint8_t *buf = (uint8_t *)(((uintptr_t)map + MN_HUGE_ALIGN - 1) & ~(uintptr_t)(MN_HUGE_ALIGN - 1));
    size_t head = (size_t)(buf - map), tail = MN_HUGE_ALIGN - head;
    if (head > 0) munmap(map, head);
    if (tail > 0) munmap(buf + len, tail);
    madvise(buf, len, MADV_HUGEPAGE); /* a hint: EINVAL where THP is compiled out */
    if (madvise(buf, len, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
        munmap(buf, len);
        return NULL;
    }
    *cap = len;
    return buf;
}

void mn_huge_free(void *buf, size_t cap) {
    if (buf != NULL) munmap(buf, cap);
}

long long mn_huge_bytes(const void *buf, size_t cap) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL) return -1;
    uintptr_t lo = (uintptr_t)buf, hi = lo + cap;
    bool inside = false, seen = false;
    long long huge = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long start, end, kb;
        if (sscanf(line, "%lx-%lx ", &start, &end) == 2) { /* a mapping's first line */
            inside = start < hi && end > lo;
            seen = seen || inside;
        } else if (inside && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) {
            huge += (long long)kb * 1024;
        }
    }
    fclose(f);
    if (!seen) return -1;
    return huge < (long long)cap ? huge : (long long)cap; /* a mapping may reach past the buffer */
}

int mn_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}
