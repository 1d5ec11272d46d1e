/* model.h — a transformer of the llama family loaded from a GGUF file.
 *
 * model_load reads the GGUF into huge pages (or maps it: GgufHold), reads
 * every hyper-parameter from its metadata (ARCH.embedding_length,
 * .block_count, .attention.head_count[_kv],
 * .attention.key_length/.value_length, .feed_forward_length,
 * .context_length, .rope.freq_base, .rope.dimension_count,
 * .rope.scaling.type/.factor, .attention.layer_norm_rms_epsilon), checks
 * every tensor's presence, type and shape against them, and loads the
 * tokenizer. Supported architectures: "llama" (MHA or GQA, RoPE on adjacent
 * pairs, output tied to token_embd when output.weight is absent, per-pair
 * RoPE frequency factors from a rope_freqs tensor as Llama 3.1+ files carry
 * them), "qwen2" (Q/K/V biases, RoPE on halves) and "qwen3" (RMSNorm of each
 * Q and K head before RoPE on halves, no biases), "gemma2" and "gemma3"
 * (embeddings scaled by sqrt(n_embd), RMS norms after attention and after
 * the FFN too, GELU-gated FFN, sliding-window layers interleaved with global
 * ones (gemma3: with their own RoPE base), soft-capped attention scores
 * (gemma2) and logits; gemma3 also normalizes Q and K heads) and "phi3"
 * (RoPE on halves with LongRoPE's short and long per-pair factors, chosen
 * by the serving context against rope.scaling.original_context_length, and
 * its attention factor). Any architecture may store Q, K and V fused
 * (attn_qkv) and phi3 stores the FFN's gate and up fused (ffn_up of 2*n_ff
 * rows, gate first): they are bound as row ranges of one matrix. RoPE scaling "linear" is
 * supported, and so is a sliding attention window where the file declares
 * one (attention.sliding_window: Mistral-style llama files, every layer);
 * any other scaling type, and anything else the file asks for
 * that mnemo cannot run, is refused with a message that names it.
 *
 * Weight matrices point into the mapping (no copy); 1-D tensors (norms,
 * biases) are converted to f32 copies the Model owns. Everything stays valid
 * until model_free. A Model is immutable after loading and may be shared by
 * threads.
 */
#ifndef MN_MODEL_H
#define MN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hash.h"
#include "base/ttype.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

typedef enum ModelArch { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_GEMMA2, ARCH_GEMMA3, ARCH_PHI3 } ModelArch;

/* The gate's activation of the gated FFN: silu(gate) * up or gelu(gate) * up. */
typedef enum FfnAct { FFN_SILU, FFN_GELU } FfnAct;

/* How RoPE pairs the dimensions of a head: (2i, 2i+1) or (i, i + n_rot/2). */
typedef enum RopeStyle { ROPE_ADJACENT, ROPE_HALVES } RopeStyle;

typedef struct ModelConfig {
    ModelArch arch;
    int n_embd;    /* model dimension */
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;  /* attention.key_length (= value_length), default n_embd / n_head */
    int q_dim;     /* n_head * head_dim (not always n_embd) */
    int kv_dim;    /* n_head_kv * head_dim */
    int n_ff;
    int n_vocab;
    int n_ctx;     /* training context length */
    int n_rot;     /* dimensions rotated by RoPE (<= head_dim) */
    float rope_base;
    float rope_freq_scale; /* 1 / rope.scaling.factor for "linear" scaling, else 1 */
    float rope_attn_factor; /* rope.scaling.attn_factor: rotated dims times this (LongRoPE), else 1 */
    int n_ctx_orig;        /* rope.scaling.original_context_length (LongRoPE), else n_ctx */
    float rms_eps;
    RopeStyle rope_style;
    bool has_qkv_bias;
    bool has_qk_norm;      /* qwen3, gemma3: RMSNorm per Q and K head before RoPE */
    bool has_post_norms;   /* gemma: RMSNorm of the attention and FFN outputs before each residual add */
    FfnAct ffn_act;
    float embd_scale;      /* the embeddings are multiplied by this (gemma: sqrt(n_embd)), else 1 */
    float attn_scale;      /* scores are q.k times this: 1/sqrt(head_dim) but for gemma's 27B shapes */
    float attn_softcap;    /* gemma2: scores become c*tanh(s/c); 0: none */
    float final_softcap;   /* gemma: logits become c*tanh(l/c); 0: none */
    int n_swa;             /* attention.sliding_window: the window of the sliding layers; 0: none */
    int swa_period;        /* of every swa_period layers all but the last slide; 0: all (gemma2 2, gemma3 6) */
    float rope_base_swa;   /* the sliding layers' RoPE base (rope.freq_base_swa; gemma3: 10000, unscaled) */
} ModelConfig;

typedef struct LayerWeights {
    const float *attn_norm; /* (n_embd) */
    MatW wq;                /* (n_embd -> q_dim) */
    MatW wk, wv;            /* (n_embd -> kv_dim) */
    const float *bq;        /* (q_dim) or NULL */
    const float *bk, *bv;   /* (kv_dim) or NULL */
    const float *q_norm;    /* (head_dim) or NULL: has_qk_norm */
    const float *k_norm;    /* (head_dim) or NULL */
    int window;             /* sliding-window attention over this many positions; 0: all */
    const float *attn_post_norm; /* (n_embd) or NULL: has_post_norms */
    const float *ffn_post_norm;  /* (n_embd) or NULL */
    MatW wo;                /* (q_dim -> n_embd) */
    const float *ffn_norm;  /* (n_embd) */
    MatW w_gate, w_up;      /* (n_embd -> n_ff) */
    MatW w_down;            /* (n_ff -> n_embd) */
} LayerWeights;

typedef struct Model {
    ModelConfig cfg;
    Gguf *gguf;              /* owned: the file's image all weights point into */
    Tokenizer *tok;          /* owned */
    MatW tok_embd;           /* (n_vocab rows of n_embd) */
    const float *out_norm;   /* (n_embd) */
    MatW output;             /* (n_embd -> n_vocab); == tok_embd when tied */
    bool is_output_tied;
    LayerWeights *layers;    /* (n_layer) */
    const float *rope_factors; /* (n_rot / 2) divisors of RoPE's frequencies, or NULL */
    const float *rope_long, *rope_short; /* (n_rot / 2) LongRoPE's factors, or NULL */
    float *vectors;          /* owned f32 copies of all 1-D tensors */
    uint64_t weight_bytes;   /* bytes of all tensor data */
    Hash128 fingerprint;     /* XXH3-128 of the whole GGUF image: metadata,
                                tensor descriptors and tensor data */
} Model;

/* Load path, its bytes held as hold says (GGUF_READ: in huge pages; the
 * serving commands' --mmap gives GGUF_MAP). On failure *out is NULL and
 * err says why, naming the file once. */
int model_load_with(const char *path, GgufHold hold, Model **out, MnErr *err);
/* model_load_with(path, GGUF_READ, ...) */
int model_load(const char *path, Model **out, MnErr *err);
void model_free(Model *m);

/* Names of the supported architectures, e.g. "llama, qwen2, qwen3". */
const char *model_supported_archs(void);

/* Copy the embedding row of token id (0 <= id < n_vocab) into out (n_embd). */
void model_embed(const Model *m, int32_t id, float *out);

/* RoPE's inverse frequencies for m (n_rot / 2 of them) when serving
 * contexts of n_ctx positions: base^(-2i/n_rot), divided by the per-pair
 * factors where the file has them (rope_freqs; LongRoPE's long factors when
 * n_ctx > n_ctx_orig, else its short ones), times rope_freq_scale.
 * is_swa: for a sliding layer (rope_base_swa; gemma3's are not scaled). */
void model_rope_inv_freq(const Model *m, bool is_swa, int n_ctx, double *inv_freq);

#endif
