/* peer_logits.c — llama.cpp's logits for the tokens of an MREF file.
 *
 *   peer_logits MODEL.gguf IN.ref OUT.ref
 *
 * Reads the token ids of IN.ref (mnemo generate --dump-logits writes it),
 * evaluates them with llama.cpp (libllama of the peer build) in one batch,
 * f32 KV cache, flash attention off, 2 threads, logits at every position, and writes OUT.ref in
 * the same MREF format (engine/mref.h: "MREF", n_tokens, n_vocab, k = 16,
 * the tokens, per position the 16 largest logits' ids and values, then
 * the last position's full vector). Built and run by scripts/peer-check;
 * not part of mnemo's build.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

enum { TOP_K = 16 };

static int read_tokens(const char *path, int32_t **tokens, int32_t *n) {
    FILE *f = fopen(path, "rb");
    char magic[4];
    int32_t hdr[3];
    if (f == NULL || fread(magic, 1, 4, f) != 4 || memcmp(magic, "MREF", 4) != 0 || fread(hdr, 4, 3, f) != 3 ||
        hdr[0] <= 0) {
        if (f) fclose(f);
        return -1;
    }
    *n = hdr[0];
    *tokens = malloc(sizeof(int32_t) * (size_t)*n);
    int ok = *tokens != NULL && fread(*tokens, 4, (size_t)*n, f) == (size_t)*n;
    fclose(f);
    return ok ? 0 : -1;
}

/* The TOP_K largest of l[0..n_vocab), descending. */
static void top_k(const float *l, int n_vocab, int32_t *ids, float *vals) {
    for (int j = 0; j < TOP_K; j++) {
        int best = -1;
        for (int v = 0; v < n_vocab; v++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= ids[i] == v;
            if (!taken && (best < 0 || l[v] > l[best])) best = v;
        }
        ids[j] = best;
        vals[j] = l[best];
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: peer_logits MODEL.gguf IN.ref OUT.ref\n");
        return 2;
    }
    int32_t *tokens = NULL, n = 0;
    if (read_tokens(argv[2], &tokens, &n) != 0) {
        fprintf(stderr, "peer_logits: cannot read the tokens of %s\n", argv[2]);
        return 2;
    }
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (model == NULL) return 3;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = (uint32_t)(n < 64 ? 64 : n);
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    /* "auto" turns flash attention on for the CPU, which rounds Q to f16
     * (~5e-2 on these models); mnemo and the references compute in f32 */
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = tokens[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (ctx == NULL || llama_decode(ctx, b) != 0) return 4;
    FILE *out = fopen(argv[3], "wb");
    int32_t hdr[3] = {n, n_vocab, TOP_K};
    if (out == NULL) return 5;
    fwrite("MREF", 1, 4, out);
    fwrite(hdr, 4, 3, out);
    fwrite(tokens, 4, (size_t)n, out);
    for (int i = 0; i < n; i++) {
        const float *l = llama_get_logits_ith(ctx, i);
        int32_t ids[TOP_K];
        float vals[TOP_K];
        top_k(l, n_vocab, ids, vals);
        fwrite(ids, 4, TOP_K, out);
        fwrite(vals, 4, TOP_K, out);
        if (i == n - 1) fwrite(l, 4, (size_t)n_vocab, out);
    }
    int rc = fclose(out) == 0 ? 0 : 5;
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(tokens);
    return rc;
}
