/* runner.c — a single sequence over the forward pass (see runner.h). */
#include "engine/runner.h"

#include <string.h>

#include "base/mem.h"

void runner_options_default(RunnerOptions *o) {
    memset(o, 0, sizeof *o);
    o->max_batch = 512;
    o->block_tokens = 32;
    o->n_threads = 2;
    o->kv_type = MN_TYPE_F16;
}

int runner_init(Runner *r, const Model *m, const RunnerOptions *o, MnErr *err) {
    memset(r, 0, sizeof *r);
    r->m = m;
    r->opt = *o;
    if (r->opt.n_ctx <= 0 || r->opt.n_ctx > m->cfg.n_ctx) r->opt.n_ctx = m->cfg.n_ctx;
    if (r->opt.max_batch <= 0) r->opt.max_batch = 512;
    if (r->opt.max_batch > r->opt.n_ctx) r->opt.max_batch = r->opt.n_ctx;
    if (r->opt.block_tokens <= 0 || r->opt.block_tokens > 4096)
        return mn_err_set(err, MN_EINVAL, "block size %d out of range [1, 4096]", r->opt.block_tokens);
    int n_blocks = (r->opt.n_ctx + r->opt.block_tokens - 1) / r->opt.block_tokens;
    int rc = kvpool_init(&r->pool, m->cfg.n_layer, m->cfg.kv_dim, r->opt.block_tokens, n_blocks, r->opt.kv_type);
    if (rc) return mn_err_set(err, rc, "cannot allocate a KV pool of %d blocks", n_blocks);
    FwdOptions fo = {r->opt.max_batch, r->opt.all_logits ? r->opt.max_batch : 1, r->opt.n_ctx, r->opt.n_threads, 0};
    rc = fwd_new(m, &r->pool, &fo, &r->fwd, err);
    r->pos = mn_calloc((size_t)r->opt.max_batch, sizeof(int32_t));
    r->seqidx = mn_calloc((size_t)r->opt.max_batch, sizeof(int32_t));
    r->logit_idx = mn_calloc((size_t)r->opt.max_batch, sizeof(int32_t));
    if (rc == MN_OK && (!r->pos || !r->seqidx || !r->logit_idx)) rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    if (rc) runner_deinit(r);
    return rc;
}

void runner_deinit(Runner *r) {
    fwd_free(r->fwd);
    seq_release(&r->seq, &r->pool);
    kvpool_deinit(&r->pool);
    mn_free(r->pos);
    mn_free(r->seqidx);
    mn_free(r->logit_idx);
    memset(r, 0, sizeof *r);
}

int runner_eval(Runner *r, const int32_t *tokens, int n, bool all_logits, RunnerRowFn fn, void *ctx, MnErr *err) {
    if (all_logits && !r->opt.all_logits) return mn_err_set(err, MN_EINVAL, "runner built without all_logits");
    if (n <= 0) return MN_OK;
    if (r->n_past + n > r->opt.n_ctx)
        return mn_err_set(err, MN_ERANGE, "%d tokens do not fit the context of %d (%d used)", n, r->opt.n_ctx,
                          r->n_past);
    int rc = seq_reserve(&r->seq, &r->pool, r->n_past + n);
    if (rc) return mn_err_set(err, rc, "KV pool: %s", mn_strerror(rc));
    AttnSeq view = seq_view(&r->seq);
    for (int done = 0; done < n;) {
        int chunk = n - done < r->opt.max_batch ? n - done : r->opt.max_batch;
        bool last_chunk = done + chunk == n;
        int n_logits = 0;
        for (int i = 0; i < chunk; i++) {
            r->pos[i] = r->n_past + i;
            r->seqidx[i] = 0;
            if (all_logits) r->logit_idx[n_logits++] = i;
        }
        if (!all_logits && last_chunk) r->logit_idx[n_logits++] = chunk - 1;
        FwdBatch b = {.n_tok = chunk, .tokens = tokens + done, .seq = r->seqidx, .pos = r->pos, .seqs = &view,
                      .n_seqs = 1, .logit_idx = r->logit_idx, .n_logits = n_logits};
        const float *logits;
        rc = fwd_run(r->fwd, &b, &logits, err);
        if (rc) return rc;
        r->n_past += chunk;
        for (int i = 0; i < n_logits && fn; i++) {
            int idx = done + r->logit_idx[i];
            rc = fn(ctx, idx, logits + (size_t)i * (size_t)r->m->cfg.n_vocab);
            if (rc) return rc;
        }
        done += chunk;
    }
    return MN_OK;
}

void runner_reset(Runner *r) { r->n_past = 0; }
