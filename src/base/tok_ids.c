/* tok_ids.c — the growable id vector (see tok_ids.h): doubling from 64. */
#include "base/tok_ids.h"

#include <string.h>

#include "base/err.h"
#include "base/mem.h"

void tok_ids_free(TokIds *v) {
    if (v == NULL) return;
    mn_free(v->ids);
    memset(v, 0, sizeof *v);
}

/* Room for n more ids. */
static int reserve(TokIds *v, size_t n) {
    if (v->n + n <= v->cap) return MN_OK;
    size_t cap = v->cap ? v->cap * 2 : 64;
    while (cap < v->n + n) cap *= 2;
    int32_t *p = mn_realloc(v->ids, cap * sizeof *p);
    if (p == NULL) return MN_ENOMEM;
    v->ids = p;
    v->cap = cap;
    return MN_OK;
}

int tok_ids_push(TokIds *v, int32_t id) {
    if (reserve(v, 1) != MN_OK) return MN_ENOMEM;
    v->ids[v->n++] = id;
    return MN_OK;
}

int tok_ids_append(TokIds *v, const int32_t *ids, size_t n) {
    if (n == 0) return MN_OK;
    if (reserve(v, n) != MN_OK) return MN_ENOMEM;
    memcpy(v->ids + v->n, ids, n * sizeof *ids);
    v->n += n;
    return MN_OK;
}
