/* seq.c — block tables of sequences (see seq.h). */
#include "engine/seq.h"

#include <string.h>

#include "base/err.h"
#include "base/mem.h"

static int blocks_for(const KvPool *p, int n_tokens) { return (n_tokens + p->block_tokens - 1) / p->block_tokens; }

bool seq_table_grows(const Seq *s, const KvPool *p, int n_tokens) { return blocks_for(p, n_tokens) > s->cap; }

int seq_reserve_table(Seq *s, const KvPool *p, int n_tokens) {
    int need = blocks_for(p, n_tokens);
    if (need <= s->cap) return MN_OK;
    int cap = s->cap ? s->cap : 8;
    while (cap < need) cap *= 2;
    int32_t *b = mn_realloc(s->blocks, (size_t)cap * sizeof *b);
    if (b == NULL) return MN_ENOMEM;
    s->blocks = b;
    s->cap = cap;
    return MN_OK;
}

int seq_reserve(Seq *s, KvPool *p, int n_tokens) {
    int need = blocks_for(p, n_tokens);
    if (need <= s->n_blocks) return MN_OK;
    if (need - s->n_blocks > kvpool_n_available(p)) return MN_EFULL;
    int rc = seq_reserve_table(s, p, n_tokens);
    if (rc) return rc;
    while (s->n_blocks < need) {
        rc = kvpool_alloc(p, &s->blocks[s->n_blocks]);
        if (rc) return rc; /* cannot happen: free count checked above */
        s->n_blocks++;
    }
    return MN_OK;
}

int seq_extend(Seq *s, KvPool *p, int n_tokens, int keep) {
    int need = blocks_for(p, n_tokens);
    if (need > s->cap) need = s->cap;
    while (s->n_blocks < need && kvpool_n_available(p) > keep && kvpool_alloc(p, &s->blocks[s->n_blocks]) == MN_OK)
        s->n_blocks++;
    return s->n_blocks * p->block_tokens;
}

void seq_release(Seq *s, KvPool *p) {
    for (int i = 0; i < s->n_blocks; i++) kvpool_release(p, s->blocks[i]);
    mn_free(s->blocks);
    memset(s, 0, sizeof *s);
}

AttnSeq seq_view(const Seq *s) { return (AttnSeq){s->blocks, s->n_blocks}; }
