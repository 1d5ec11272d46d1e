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

int tok_ids_push(TokIds *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = mn_realloc(v->ids, cap * sizeof *p);
        if (p == NULL) return MN_ENOMEM;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return MN_OK;
}
