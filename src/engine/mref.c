/* mref.c — reading and writing MREF reference-logits files (see mref.h). */
#include "engine/mref.h"

#include <string.h>

#include "base/mem.h"

void mref_top_k(const float *logits, int n_vocab, int k, int32_t *ids, float *vals) {
    int n = 0;
    for (int i = 0; i < n_vocab; i++) {
        float v = logits[i];
        if (n == k && !(v > vals[k - 1])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && v > vals[j - 1]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = v;
        ids[j] = i;
    }
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? MN_OK : MN_EIO; }

int mref_begin(MrefWriter *w, const char *path, const int32_t *tokens, int n_tokens, int n_vocab, MnErr *err) {
    memset(w, 0, sizeof *w);
    w->f = fopen(path, "wb");
    if (w->f == NULL) return mn_err_set(err, MN_EIO, "cannot create %s", path);
    w->n_tokens = n_tokens;
    w->n_vocab = n_vocab;
    int32_t hdr[3] = {n_tokens, n_vocab, MREF_K};
    if (write_all(w->f, "MREF", 4) || write_all(w->f, hdr, sizeof hdr) ||
        write_all(w->f, tokens, (size_t)n_tokens * sizeof *tokens)) {
        fclose(w->f);
        w->f = NULL;
        return mn_err_set(err, MN_EIO, "cannot write %s", path);
    }
    return MN_OK;
}

int mref_add_row(MrefWriter *w, const float *logits, MnErr *err) {
    int32_t ids[MREF_K];
    float vals[MREF_K];
    mref_top_k(logits, w->n_vocab, MREF_K, ids, vals);
    if (write_all(w->f, ids, sizeof ids) || write_all(w->f, vals, sizeof vals))
        return mn_err_set(err, MN_EIO, "cannot write logits");
    w->n_rows++;
    return MN_OK;
}

int mref_finish(MrefWriter *w, const float *last, MnErr *err) {
    int rc = MN_OK;
    if (w->n_rows != w->n_tokens) rc = mn_err_set(err, MN_EINVAL, "%d of %d rows written", w->n_rows, w->n_tokens);
    if (rc == MN_OK && write_all(w->f, last, (size_t)w->n_vocab * sizeof *last))
        rc = mn_err_set(err, MN_EIO, "cannot write logits");
    if (fclose(w->f) != 0 && rc == MN_OK) rc = mn_err_set(err, MN_EIO, "cannot close logits file");
    w->f = NULL;
    return rc;
}

int mref_read(const char *path, Mref *r, MnErr *err) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (f == NULL) return mn_err_set(err, MN_EIO, "cannot open %s", path);
    char magic[4];
    int32_t hdr[3];
    int rc = MN_OK;
    if (fread(magic, 1, 4, f) != 4 || memcmp(magic, "MREF", 4) != 0 || fread(hdr, 4, 3, f) != 3 || hdr[0] <= 0 ||
        hdr[1] <= 0 || hdr[2] <= 0 || hdr[0] > 1 << 20 || hdr[1] > 1 << 24 || hdr[2] > 1024) {
        rc = mn_err_set(err, MN_EFORMAT, "%s is not an MREF file", path);
        goto done;
    }
    r->n_tokens = hdr[0];
    r->n_vocab = hdr[1];
    r->k = hdr[2];
    size_t nk = (size_t)r->n_tokens * (size_t)r->k;
    r->tokens = mn_calloc((size_t)r->n_tokens, 4);
    r->ids = mn_calloc(nk, 4);
    r->vals = mn_calloc(nk, 4);
    r->last = mn_calloc((size_t)r->n_vocab, 4);
    if (!r->tokens || !r->ids || !r->vals || !r->last) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory");
        goto done;
    }
    if (fread(r->tokens, 4, (size_t)r->n_tokens, f) != (size_t)r->n_tokens) rc = MN_EFORMAT;
    for (int i = 0; rc == MN_OK && i < r->n_tokens; i++)
        if (fread(r->ids + (size_t)i * r->k, 4, (size_t)r->k, f) != (size_t)r->k ||
            fread(r->vals + (size_t)i * r->k, 4, (size_t)r->k, f) != (size_t)r->k)
            rc = MN_EFORMAT;
    if (rc == MN_OK && fread(r->last, 4, (size_t)r->n_vocab, f) != (size_t)r->n_vocab) rc = MN_EFORMAT;
    if (rc) mn_err_set(err, rc, "%s is truncated", path);
done:
    fclose(f);
    if (rc) mref_free(r);
    return rc;
}

void mref_free(Mref *r) {
    mn_free(r->tokens);
    mn_free(r->ids);
    mn_free(r->vals);
    mn_free(r->last);
    memset(r, 0, sizeof *r);
}
