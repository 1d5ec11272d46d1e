/* kv_shift.c — moving cached KV to other positions (see kv_shift.h).
 * A move is done row by row: one token's V row is copied as it is, its K
 * row is converted to f32, rotated head by head with the angles of the
 * delta (computed once per move and layer kind), and stored back in the
 * pool's type. */
#include "engine/kv_shift.h"

#include <string.h>

#include "base/mem.h"
#include "compute/ops.h"

struct KvShifter {
    const Model *m;
    double *inv_freq;     /* (n_rot / 2) the global layers' RoPE frequencies */
    double *inv_freq_swa; /* (n_rot / 2) the sliding layers' */
    float *cs;            /* (n_rot) the angles of one move */
    float *row;           /* (kv_dim) one K row in f32 */
};

int kvshift_new(const Model *m, int n_ctx, const KvPool *pool, KvShifter **out) {
    const ModelConfig *c = &m->cfg;
    *out = NULL;
    KvShifter *s = mn_calloc(1, sizeof *s);
    if (s == NULL) return MN_ENOMEM;
    s->m = m;
    s->inv_freq = mn_calloc((size_t)c->n_rot / 2, sizeof *s->inv_freq);
    s->inv_freq_swa = mn_calloc((size_t)c->n_rot / 2, sizeof *s->inv_freq_swa);
    s->cs = mn_calloc((size_t)c->n_rot, sizeof *s->cs);
    s->row = mn_calloc((size_t)pool->kv_dim, sizeof *s->row);
    if (!s->inv_freq || !s->inv_freq_swa || !s->cs || !s->row) {
        kvshift_free(s);
        return MN_ENOMEM;
    }
    /* the tables fwd_new makes for the same context */
    model_rope_inv_freq(m, false, n_ctx, s->inv_freq);
    model_rope_inv_freq(m, true, n_ctx, s->inv_freq_swa);
    *out = s;
    return MN_OK;
}

void kvshift_free(KvShifter *s) {
    if (s == NULL) return;
    mn_free(s->inv_freq);
    mn_free(s->inv_freq_swa);
    mn_free(s->cs);
    mn_free(s->row);
    mn_free(s);
}

/* The address of position pos's row (kv_dim elements) in K or V of table. */
static uint8_t *row_at(const KvPool *p, int il, const int32_t *table, int first, int32_t pos, bool is_v) {
    int32_t slot = table[pos / p->block_tokens - first];
    uint8_t *base = is_v ? kvpool_v(p, il, slot) : kvpool_k(p, il, slot);
    size_t elem = p->kv_type == MN_TYPE_F16 ? sizeof(uint16_t) : sizeof(float);
    return base + (size_t)(pos % p->block_tokens) * (size_t)p->kv_dim * elem;
}

void kvshift_layer(KvShifter *s, KvPool *pool, int il, const KvMove *mv) {
    const ModelConfig *c = &s->m->cfg;
    const bool is_f16 = pool->kv_type == MN_TYPE_F16;
    const size_t row_bytes = (size_t)pool->kv_dim * (is_f16 ? sizeof(uint16_t) : sizeof(float));
    const double *inv_freq = s->m->layers[il].window > 0 ? s->inv_freq_swa : s->inv_freq;
    ops_rope_angles(s->cs, c->n_rot, inv_freq, mv->delta);
    const int adjacent = c->rope_style == ROPE_ADJACENT;
    for (int32_t pos = mv->from; pos < mv->to; pos++) {
        int32_t from = pos - mv->delta;
        memcpy(row_at(pool, il, mv->dst, 0, pos, true), row_at(pool, il, mv->src, mv->src_first, from, true),
               row_bytes);
        const uint8_t *k_src = row_at(pool, il, mv->src, mv->src_first, from, false);
        uint8_t *k_dst = row_at(pool, il, mv->dst, 0, pos, false);
        if (is_f16) ops_f16_to_f32(s->row, (const uint16_t *)k_src, pool->kv_dim);
        else memcpy(s->row, k_src, row_bytes);
        ops_rope_apply(s->row, c->n_head_kv, c->head_dim, c->n_rot, s->cs, adjacent);
        if (is_f16) ops_f32_to_f16((uint16_t *)k_dst, s->row, pool->kv_dim);
        else memcpy(k_dst, s->row, row_bytes);
    }
}
