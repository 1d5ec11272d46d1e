/* tokenizer.c — SentencePiece-style and byte-level BPE tokenizers, loaded
 * from GGUF metadata, reproducing llama.cpp's tokenization exactly.
 *
 * Loading copies everything out of the Gguf: the token texts (one pool, each
 * NUL-terminated), scores, types, the rendered piece of every token (the
 * bytes it stands for), a hash map text -> id, for BPE a hash map
 * (left, right) -> merge rank, the special-token list and the compiled
 * pre-tokenizer. After tok_load nothing in a Tokenizer changes, so any
 * number of threads may encode and decode with it at once; every call keeps
 * its working memory in a TokScratch of its own.
 *
 * Encoding (tok_encode), in llama.cpp's order:
 *   1. partition: the text is cut at occurrences of special tokens, longest
 *      token text first; each occurrence becomes that token's id. Control
 *      and unknown tokens take part only with parse_special; user-defined
 *      ones always do (as in HF tokenizers' added tokens). The pieces of
 *      text in between stay raw fragments;
 *   2. SPM: each raw fragment gets a leading " " if it is the first thing or
 *      follows a special token (and add_space_prefix is on), spaces become
 *      U+2581, and the fragment is cut into UTF-8 characters which are merged
 *      greedily: the adjacent pair whose concatenation is a vocabulary token
 *      with the highest score goes first (leftmost on ties). A character left
 *      that is not a token becomes its bytes' <0xNN> tokens;
 *   3. BPE: each raw fragment is split into words by the pre-tokenizer's
 *      regexes, each word's bytes are mapped to GPT-2's printable code
 *      points, and adjacent symbols merge by lowest merge rank (leftmost on
 *      ties). llama3-style vocabularies first try the whole word as a token.
 *
 * Invariants: ids handed out are in [0, n_vocab); special ids (bos, eos,
 * eot, eom, unk, pad) are -1 or valid; every token has a non-empty text
 * (llama.cpp renames empty ones "[EMPTY_<id>]"); the map holds, for
 * duplicate texts, the last id (as llama.cpp does); the merge map holds the
 * first rank of a duplicate merge.
 */
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "model/pretok.h"
#include "model/tokenizer.h"
#include "base/utf8.h"

/* ---- types --------------------------------------------------------------- */

enum { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 };

/* tokenizer.ggml.token_type values. */
enum {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Per-token flags beyond the type (llama.cpp's LSTRIP/RSTRIP attributes). */
enum { TOK_FLAG_LSTRIP = 1, TOK_FLAG_RSTRIP = 2 };

typedef struct TokSlot {
    uint32_t tag; /* high bits of the hash, to skip most string compares */
    int32_t val;  /* token id or merge rank; -1 = empty slot */
} TokSlot;

struct Tokenizer {
    int kind; /* TOK_KIND_* */
    int32_t n_vocab;

    char *texts;        /* all token texts, each NUL-terminated */
    size_t *text_off;   /* (n_vocab) offset into texts */
    uint32_t *text_len; /* (n_vocab) */
    float *scores;      /* (n_vocab) SPM merge priority */
    uint8_t *types;     /* (n_vocab) TOK_TYPE_* */
    uint8_t *flags;     /* (n_vocab) TOK_FLAG_* */

    char *pieces; /* rendered bytes of each token, special tokens included */
    size_t *piece_off;
    uint32_t *piece_len;
    size_t max_piece_len;

    TokSlot *map; /* text -> id, open addressing, linear probing */
    size_t map_mask;

    /* BPE merges: rank r is the pair (merge_text[merge_off[r]], llen bytes)
     * + (merge_text[merge_off[r] + llen + 1], rlen bytes). */
    char *merge_text;
    size_t *merge_off;
    uint32_t *merge_llen, *merge_rlen;
    int32_t n_merges;
    TokSlot *merge_map;
    size_t merge_mask;

    int32_t *specials; /* control / user-defined / unknown ids, longest text first */
    size_t n_specials;
    uint8_t *eog; /* bitmap (n_vocab bits): end-of-generation tokens */

    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix;

    int32_t byte_ids[256]; /* SPM byte fallback: id of <0xNN>, or -1 */

    /* GPT-2 byte <-> code point map. */
    char byte_enc[256][2];
    uint8_t byte_enc_len[256];
    int16_t cp_to_byte[324]; /* code points 0..323 -> byte, or -1 */

    Pretok *pre; /* BPE only */
    bool ignore_merges;
};

/* A symbol during merging: bytes [off, off + n) of the working text, linked
 * to its live neighbours. n == 0 once merged into its left neighbour. */
typedef struct TokSym {
    int32_t prev, next;
    uint32_t off, n;
} TokSym;

/* A candidate merge. key orders the heap, largest first: the priority in
 * the high 32 bits (SPM score mapped to an order-preserving integer, or the
 * complement of the BPE rank) and the complement of the left index in the
 * low 32 bits, so that ties go to the leftmost pair as in llama.cpp. */
typedef struct TokBigram {
    uint64_t key;
    int32_t right;
    uint32_t size;
} TokBigram;

static int32_t bigram_left(const TokBigram *b) { return (int32_t) ~(uint32_t)b->key; }

static uint64_t bigram_key(uint32_t prio, int32_t left) {
    return (uint64_t)prio << 32 | (uint32_t) ~(uint32_t)left;
}

/* Order-preserving map float -> uint32 (equal floats, +0 and -0 included,
 * map to equal integers). */
static uint32_t score_prio(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* A fragment of the input: raw text [off, off + len), or a special token. */
typedef struct TokFrag {
    int32_t id; /* -1 for raw text */
    size_t off, len;
} TokFrag;

/* Working memory of one tok_encode call. */
typedef struct TokScratch {
    TokFrag *frags[2];
    size_t frag_cap[2];
    char *buf;
    size_t buf_cap;
    TokSym *syms;
    size_t sym_cap;
    TokBigram *heap;
    size_t heap_cap, heap_n;
    PretokScratch pre;
} TokScratch;

/* ---- hashing and the maps ------------------------------------------------ */

static uint64_t tok_hash(const char *s, size_t n, uint64_t seed) {
    uint64_t h = seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n > 0) memcpy(&w, s, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    return h;
}

static uint64_t tok_pair_hash(const char *l, size_t ln, const char *r, size_t rn) {
    return tok_hash(r, rn, tok_hash(l, ln, 0x5bd1e995u) + 0x27d4eb2f165667c5ull);
}

static size_t tok_map_capacity(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1; /* load factor <= 1/2 */
    return cap;
}

static const char *tok_text_at(const Tokenizer *tok, int32_t id) { return tok->texts + tok->text_off[id]; }

/* Id of text s[0..n) or -1. */
static int32_t tok_lookup(const Tokenizer *tok, const char *s, size_t n) {
    uint64_t h = tok_hash(s, n, 0);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & tok->map_mask;; i = (i + 1) & tok->map_mask) {
        const TokSlot *e = &tok->map[i];
        if (e->val < 0) return -1;
        if (e->tag == tag && tok->text_len[e->val] == n && memcmp(tok_text_at(tok, e->val), s, n) == 0)
            return e->val;
    }
}

/* Insert id under its text; a later id with the same text replaces it. */
static void tok_map_insert(Tokenizer *tok, int32_t id) {
    const char *s = tok_text_at(tok, id);
    size_t n = tok->text_len[id];
    uint64_t h = tok_hash(s, n, 0);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & tok->map_mask;; i = (i + 1) & tok->map_mask) {
        TokSlot *e = &tok->map[i];
        if (e->val < 0) {
            *e = (TokSlot){tag, id};
            return;
        }
        if (e->tag == tag && tok->text_len[e->val] == n && memcmp(tok_text_at(tok, e->val), s, n) == 0) {
            e->val = id;
            return;
        }
    }
}

/* Rank of merging l and r, or -1. */
static int32_t tok_merge_rank(const Tokenizer *tok, const char *l, size_t ln, const char *r, size_t rn) {
    uint64_t h = tok_pair_hash(l, ln, r, rn);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        const TokSlot *e = &tok->merge_map[i];
        if (e->val < 0) return -1;
        if (e->tag != tag) continue;
        int32_t k = e->val;
        const char *m = tok->merge_text + tok->merge_off[k];
        if (tok->merge_llen[k] == ln && tok->merge_rlen[k] == rn && memcmp(m, l, ln) == 0 &&
            memcmp(m + ln + 1, r, rn) == 0)
            return k;
    }
}

/* Insert merge rank k unless the same pair has a lower rank already. */
static void tok_merge_insert(Tokenizer *tok, int32_t k) {
    const char *m = tok->merge_text + tok->merge_off[k];
    size_t ln = tok->merge_llen[k], rn = tok->merge_rlen[k];
    uint64_t h = tok_pair_hash(m, ln, m + ln + 1, rn);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        TokSlot *e = &tok->merge_map[i];
        if (e->val < 0) {
            *e = (TokSlot){tag, k};
            return;
        }
        if (e->tag != tag) continue;
        int32_t j = e->val;
        const char *o = tok->merge_text + tok->merge_off[j];
        if (tok->merge_llen[j] == ln && tok->merge_rlen[j] == rn && memcmp(o, m, ln + 1 + rn) == 0) return;
    }
}

/* ---- the GPT-2 byte map -------------------------------------------------- */

/* Bytes that print as themselves keep their value as code point; the other
 * 68 (controls, space, DEL, 0x80..0xA0, soft hyphen) take 256, 257, ... in
 * byte order. */
static void tok_init_byte_map(Tokenizer *tok) {
    int extra = 0;
    for (int i = 0; i < 324; i++) tok->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keeps = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = keeps ? (uint32_t)b : 256u + (uint32_t)extra++;
        char enc[4];
        size_t n = utf8_encode(cp, enc);
        memcpy(tok->byte_enc[b], enc, n);
        tok->byte_enc_len[b] = (uint8_t)n;
        tok->cp_to_byte[cp] = (int16_t)b;
    }
}

/* ---- loading ------------------------------------------------------------- */

static const char *const tok_eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>", /* DeepSeek, in octal */
    "<end_of_utterance>",
};

static const char *const tok_eog_texts[] = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>",
};

static int32_t tok_lookup_cstr(const Tokenizer *tok, const char *s) { return tok_lookup(tok, s, strlen(s)); }

static void tok_set_eog(Tokenizer *tok, int32_t id) {
    if (id < 0) return;
    tok->eog[id >> 3] |= (uint8_t)(1u << (id & 7));
}

/* Read an optional token id; an absent key or a value outside the
 * vocabulary keeps the default (llama.cpp warns and does the same). */
static int tok_read_id(const Gguf *g, const char *key, int32_t n_vocab, int32_t *id, MnErr *err) {
    int64_t v;
    int rc = gguf_get_i64(g, key, &v);
    if (rc == MN_ENOTFOUND) return MN_OK;
    if (rc != MN_OK) return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is not an integer", key);
    if (v >= 0 && v < n_vocab) *id = (int32_t)v;
    return MN_OK;
}

static int tok_read_flag(const Gguf *g, const char *key, bool *flag, MnErr *err) {
    bool v;
    int rc = gguf_get_bool(g, key, &v);
    if (rc == MN_ENOTFOUND) return MN_OK;
    if (rc != MN_OK) return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is not a bool", key);
    *flag = v;
    return MN_OK;
}

static bool tok_is_special_type(uint8_t t) {
    return t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED || t == TOK_TYPE_UNKNOWN;
}

/* qsort context-free comparator needs the lengths: sort (len, id) pairs. */
typedef struct TokLenId {
    uint32_t len;
    int32_t id;
} TokLenId;

static int tok_cmp_len_desc(const void *a, const void *b) {
    const TokLenId *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Token texts: two passes over the array (sizes, then copies). */
static int tok_load_texts(Tokenizer *tok, const Gguf *g, MnErr *err) {
    const char *key = "tokenizer.ggml.tokens";
    GgufType et;
    uint64_t n;
    int rc = gguf_get_arr(g, key, &et, &n);
    if (rc == MN_ENOTFOUND) return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is missing", key);
    if (rc != MN_OK || et != GGUF_TYPE_STRING)
        return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is not an array of strings", key);
    if (n == 0 || n > INT32_MAX)
        return mn_err_set(err, MN_EFORMAT, "tokenizer: %s has %llu entries", key, (unsigned long long)n);
    tok->n_vocab = (int32_t)n;

    tok->text_off = mn_calloc(n, sizeof *tok->text_off);
    tok->text_len = mn_calloc(n, sizeof *tok->text_len);
    if (!tok->text_off || !tok->text_len) return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");

    /* Size arithmetic in 64 bits: the GGUF is mapped, so the total is
     * bounded by the file size plus the "[EMPTY_n]" stand-ins. */
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        GgufStr s;
        if (gguf_arr_str(g, key, i, &s) != MN_OK)
            return mn_err_set(err, MN_EFORMAT, "tokenizer: cannot read token %llu", (unsigned long long)i);
        if (s.len > UINT32_MAX / 2)
            return mn_err_set(err, MN_EFORMAT, "tokenizer: token %llu is too long", (unsigned long long)i);
        uint64_t len = s.len ? s.len : 32;
        total += len + 1;
    }
    if (total > SIZE_MAX) return mn_err_set(err, MN_ENOMEM, "tokenizer: vocabulary too large");
    tok->texts = mn_malloc((size_t)total);
    if (!tok->texts) return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        GgufStr s;
        gguf_arr_str(g, key, i, &s);
        tok->text_off[i] = off;
        if (s.len == 0) {
            int w = snprintf(tok->texts + off, 32, "[EMPTY_%llu]", (unsigned long long)i);
            tok->text_len[i] = (uint32_t)w;
            off += (size_t)w + 1;
        } else {
            memcpy(tok->texts + off, s.data, s.len);
            tok->texts[off + s.len] = '\0';
            tok->text_len[i] = (uint32_t)s.len;
            off += s.len + 1;
        }
    }
    return MN_OK;
}

static int tok_load_scores_types(Tokenizer *tok, const Gguf *g, MnErr *err) {
    size_t n = (size_t)tok->n_vocab;
    tok->scores = mn_calloc(n, sizeof *tok->scores);
    tok->types = mn_malloc(n);
    tok->flags = mn_calloc(n, 1);
    if (!tok->scores || !tok->types || !tok->flags)
        return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");
    memset(tok->types, TOK_TYPE_NORMAL, n);

    GgufType et;
    uint64_t m;
    const char *key = "tokenizer.ggml.scores";
    int rc = gguf_get_arr(g, key, &et, &m);
    if (rc == MN_OK) {
        if (m != n)
            return mn_err_set(err, MN_EFORMAT, "tokenizer: %s has %llu entries for %zu tokens", key,
                              (unsigned long long)m, n);
        for (size_t i = 0; i < n; i++)
            if (gguf_arr_f32(g, key, i, &tok->scores[i]) != MN_OK)
                return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is not numeric", key);
    } else if (rc != MN_ENOTFOUND) {
        return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is not an array", key);
    }

    key = "tokenizer.ggml.token_type";
    rc = gguf_get_arr(g, key, &et, &m);
    if (rc == MN_OK) {
        if (m != n)
            return mn_err_set(err, MN_EFORMAT, "tokenizer: %s has %llu entries for %zu tokens", key,
                              (unsigned long long)m, n);
        for (size_t i = 0; i < n; i++) {
            int64_t t;
            if (gguf_arr_i64(g, key, i, &t) != MN_OK)
                return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is not an integer array", key);
            tok->types[i] = (t >= TOK_TYPE_NORMAL && t <= TOK_TYPE_BYTE) ? (uint8_t)t : TOK_TYPE_UNDEFINED;
        }
    } else if (rc != MN_ENOTFOUND) {
        return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is not an array", key);
    }
    return MN_OK;
}

static int tok_build_map(Tokenizer *tok, MnErr *err) {
    size_t cap = tok_map_capacity((size_t)tok->n_vocab);
    tok->map = mn_malloc(cap * sizeof *tok->map);
    if (!tok->map) return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < cap; i++) tok->map[i] = (TokSlot){0, -1};
    tok->map_mask = cap - 1;
    for (int32_t id = 0; id < tok->n_vocab; id++) tok_map_insert(tok, id);
    return MN_OK;
}

static int tok_load_merges(Tokenizer *tok, const Gguf *g, MnErr *err) {
    const char *key = "tokenizer.ggml.merges";
    GgufType et;
    uint64_t n;
    int rc = gguf_get_arr(g, key, &et, &n);
    if (rc == MN_ENOTFOUND) return mn_err_set(err, MN_EFORMAT, "tokenizer: gpt2 vocabulary without %s", key);
    if (rc != MN_OK || et != GGUF_TYPE_STRING)
        return mn_err_set(err, MN_EFORMAT, "tokenizer: %s is not an array of strings", key);
    if (n > INT32_MAX) return mn_err_set(err, MN_EFORMAT, "tokenizer: %s has too many entries", key);

    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        GgufStr s;
        if (gguf_arr_str(g, key, i, &s) != MN_OK)
            return mn_err_set(err, MN_EFORMAT, "tokenizer: cannot read merge %llu", (unsigned long long)i);
        if (s.len > UINT32_MAX / 2)
            return mn_err_set(err, MN_EFORMAT, "tokenizer: merge %llu is too long", (unsigned long long)i);
        total += s.len + 1;
    }
    if (total > SIZE_MAX) return mn_err_set(err, MN_ENOMEM, "tokenizer: merges too large");
    tok->merge_text = mn_malloc(total ? (size_t)total : 1);
    tok->merge_off = mn_calloc(n ? n : 1, sizeof *tok->merge_off);
    tok->merge_llen = mn_calloc(n ? n : 1, sizeof *tok->merge_llen);
    tok->merge_rlen = mn_calloc(n ? n : 1, sizeof *tok->merge_rlen);
    size_t cap = tok_map_capacity((size_t)n);
    tok->merge_map = mn_malloc(cap * sizeof *tok->merge_map);
    if (!tok->merge_text || !tok->merge_off || !tok->merge_llen || !tok->merge_rlen || !tok->merge_map)
        return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < cap; i++) tok->merge_map[i] = (TokSlot){0, -1};
    tok->merge_mask = cap - 1;
    tok->n_merges = (int32_t)n;

    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        GgufStr s;
        gguf_arr_str(g, key, i, &s);
        memcpy(tok->merge_text + off, s.data, s.len);
        tok->merge_text[off + s.len] = '\0';
        tok->merge_off[i] = off;
        /* "left right", split at the first space after the first byte
         * (a merge without one never matches, as in llama.cpp). */
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
        if (sp != NULL) {
            tok->merge_llen[i] = (uint32_t)(sp - s.data);
            tok->merge_rlen[i] = (uint32_t)(s.len - (size_t)(sp - s.data) - 1);
            tok_merge_insert(tok, (int32_t)i);
        }
        off += s.len + 1;
    }
    return MN_OK;
}

/* Render token id (special tokens as their text) into the piece pool. */
static size_t tok_render(const Tokenizer *tok, int32_t id, char *dst) {
    const char *t = tok_text_at(tok, id);
    size_t n = tok->text_len[id];
    uint8_t type = tok->types[id];
    if (type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN || type == TOK_TYPE_USER_DEFINED) {
        memcpy(dst, t, n);
        return n;
    }
    if (tok->kind == TOK_KIND_SPM) {
        if (type == TOK_TYPE_NORMAL) { /* U+2581 -> ' ' */
            size_t o = 0;
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(t + i, "\xe2\x96\x81", 3) == 0) {
                    dst[o++] = ' ';
                    i += 3;
                } else {
                    dst[o++] = t[i++];
                }
            }
            return o;
        }
        if (type == TOK_TYPE_BYTE) { /* "<0xNN>" */
            unsigned v = 0;
            for (size_t i = 3; i < 5 && i < n && isxdigit((unsigned char)t[i]); i++) {
                unsigned char c = (unsigned char)t[i];
                v = v * 16 + (unsigned)(isdigit(c) ? c - '0' : (tolower(c) - 'a' + 10));
            }
            dst[0] = (char)v;
            return 1;
        }
        return 0; /* unused / undefined render as nothing */
    }
    if (type != TOK_TYPE_NORMAL) return 0;
    /* Byte-level BPE: map each code point back to its byte; a code point
     * outside the map is passed through as is. */
    const unsigned char *u = (const unsigned char *)t;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode_lenient(u + i, n - i, &cp);
        if (cp < 324 && tok->cp_to_byte[cp] >= 0) {
            dst[o++] = (char)tok->cp_to_byte[cp];
        } else {
            memcpy(dst + o, t + i, k);
            o += k;
        }
        i += k;
    }
    return o;
}

static int tok_build_pieces(Tokenizer *tok, MnErr *err) {
    size_t n = (size_t)tok->n_vocab;
    tok->piece_off = mn_calloc(n, sizeof *tok->piece_off);
    tok->piece_len = mn_calloc(n, sizeof *tok->piece_len);
    /* A piece is never longer than its text (U+2581 shrinks, BPE code
     * points are >= 1 byte per byte), so the text pool size bounds it. */
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += tok->text_len[i] + 1;
    tok->pieces = mn_malloc(total);
    if (!tok->piece_off || !tok->piece_len || !tok->pieces)
        return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");
    size_t off = 0;
    tok->max_piece_len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = tok_render(tok, (int32_t)i, tok->pieces + off);
        tok->piece_off[i] = off;
        tok->piece_len[i] = (uint32_t)k;
        if (k > tok->max_piece_len) tok->max_piece_len = k;
        off += k;
    }
    return MN_OK;
}

/* EOT/EOM detection and the end-of-generation set, as llama.cpp does it
 * from token texts; such tokens become control tokens. */
static int tok_build_eog(Tokenizer *tok, MnErr *err) {
    tok->eog = mn_calloc(((size_t)tok->n_vocab + 7) / 8, 1);
    if (!tok->eog) return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");
    if (tok->eot < 0) {
        for (size_t i = 0; i < sizeof tok_eot_texts / sizeof *tok_eot_texts && tok->eot < 0; i++)
            tok->eot = tok_lookup_cstr(tok, tok_eot_texts[i]);
        if (tok->eot >= 0) tok->types[tok->eot] = TOK_TYPE_CONTROL;
    }
    if (tok->eom < 0) {
        tok->eom = tok_lookup_cstr(tok, "<|eom_id|>");
        if (tok->eom >= 0) tok->types[tok->eom] = TOK_TYPE_CONTROL;
    }
    for (size_t i = 0; i < sizeof tok_eog_texts / sizeof *tok_eog_texts; i++) {
        int32_t id = tok_lookup_cstr(tok, tok_eog_texts[i]);
        if (id >= 0) {
            tok_set_eog(tok, id);
            tok->types[id] = TOK_TYPE_CONTROL;
        }
    }
    tok_set_eog(tok, tok->eos);
    tok_set_eog(tok, tok->eot);
    tok_set_eog(tok, tok->eom);
    return MN_OK;
}

static int tok_build_specials(Tokenizer *tok, const Gguf *g, MnErr *err) {
    size_t n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) n += tok_is_special_type(tok->types[id]);
    if (n == 0) return MN_OK;
    TokLenId *v = mn_malloc(n * sizeof *v);
    tok->specials = mn_malloc(n * sizeof *tok->specials);
    if (!v || !tok->specials) {
        mn_free(v);
        return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");
    }
    size_t k = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if (tok_is_special_type(tok->types[id])) v[k++] = (TokLenId){tok->text_len[id], id};
    qsort(v, n, sizeof *v, tok_cmp_len_desc);
    for (size_t i = 0; i < n; i++) tok->specials[i] = v[i].id;
    tok->n_specials = n;
    mn_free(v);

    /* Phi-3 strips white space after its special tokens (llama.cpp keys
     * this on the model name). */
    GgufStr name;
    if (gguf_get_str(g, "general.name", &name) == MN_OK) {
        char low[128];
        size_t m = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
        for (size_t i = 0; i < m; i++) low[i] = (char)tolower((unsigned char)name.data[i]);
        low[m] = '\0';
        if (strstr(low, "phi-3") || strstr(low, "phi3")) {
            for (size_t i = 0; i < tok->n_specials; i++) tok->flags[tok->specials[i]] |= TOK_FLAG_RSTRIP;
            int32_t id = tok_lookup_cstr(tok, "</s>");
            if (id >= 0) tok->flags[id] |= TOK_FLAG_RSTRIP;
            static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (size_t i = 0; i < 3; i++) {
                id = tok_lookup_cstr(tok, keep[i]);
                if (id >= 0) tok->flags[id] &= (uint8_t)~TOK_FLAG_RSTRIP;
            }
        }
    }
    return MN_OK;
}

int tok_load(const Gguf *g, Tokenizer **out, MnErr *err) {
    assert(g != NULL && out != NULL);
    *out = NULL;

    GgufStr model;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc == MN_ENOTFOUND)
        return mn_err_set(err, MN_ENOTFOUND, "tokenizer: no tokenizer.ggml.model in the file");
    if (rc != MN_OK) return mn_err_set(err, MN_EFORMAT, "tokenizer: tokenizer.ggml.model is not a string");
    int kind;
    if (model.len == 5 && memcmp(model.data, "llama", 5) == 0) {
        kind = TOK_KIND_SPM;
    } else if (model.len == 4 && memcmp(model.data, "gpt2", 4) == 0) {
        kind = TOK_KIND_BPE;
    } else {
        int shown = model.len > 64 ? 64 : (int)model.len;
        return mn_err_set(err, MN_EUNSUPPORTED,
                          "tokenizer: unsupported tokenizer.ggml.model '%.*s' (want llama or gpt2)", shown,
                          model.data);
    }

    Tokenizer *tok = mn_calloc(1, sizeof *tok);
    if (!tok) return mn_err_set(err, MN_ENOMEM, "tokenizer: out of memory");
    tok->kind = kind;
    tok_init_byte_map(tok);

    if ((rc = tok_load_texts(tok, g, err)) != MN_OK) goto fail;
    if ((rc = tok_load_scores_types(tok, g, err)) != MN_OK) goto fail;
    if ((rc = tok_build_map(tok, err)) != MN_OK) goto fail;

    if (kind == TOK_KIND_BPE) {
        if ((rc = tok_load_merges(tok, g, err)) != MN_OK) goto fail;
        GgufStr pre = {0, NULL};
        rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (rc != MN_OK && rc != MN_ENOTFOUND) {
            rc = mn_err_set(err, MN_EFORMAT, "tokenizer: tokenizer.ggml.pre is not a string");
            goto fail;
        }
        if ((rc = pretok_new(pre.data, rc == MN_OK ? (size_t)pre.len : 0, &tok->pre, err)) != MN_OK)
            goto fail;
        tok->ignore_merges = pretok_ignore_merges(tok->pre);
        tok->add_bos = pretok_default_add_bos(tok->pre);
        tok->add_space_prefix = false;
        tok->bos = 11; /* llama.cpp's defaults for gpt2 vocabularies */
        tok->eos = 11;
        tok->unk = -1;
    } else {
        tok->add_bos = true;
        tok->add_space_prefix = true;
        tok->bos = 1;
        tok->eos = 2;
        tok->unk = 0;
    }
    tok->eot = tok->eom = tok->pad = -1;
    if (tok->bos >= tok->n_vocab) tok->bos = -1;
    if (tok->eos >= tok->n_vocab) tok->eos = -1;
    if (tok->unk >= tok->n_vocab) tok->unk = -1;

    if ((rc = tok_read_flag(g, "tokenizer.ggml.add_space_prefix", &tok->add_space_prefix, err)) != MN_OK)
        goto fail;
    if ((rc = tok_read_id(g, "tokenizer.ggml.bos_token_id", tok->n_vocab, &tok->bos, err)) != MN_OK)
        goto fail;
    if ((rc = tok_read_id(g, "tokenizer.ggml.eos_token_id", tok->n_vocab, &tok->eos, err)) != MN_OK)
        goto fail;
    if ((rc = tok_read_id(g, "tokenizer.ggml.eot_token_id", tok->n_vocab, &tok->eot, err)) != MN_OK)
        goto fail;
    if ((rc = tok_read_id(g, "tokenizer.ggml.eom_token_id", tok->n_vocab, &tok->eom, err)) != MN_OK)
        goto fail;
    if ((rc = tok_read_id(g, "tokenizer.ggml.unknown_token_id", tok->n_vocab, &tok->unk, err)) != MN_OK)
        goto fail;
    if ((rc = tok_read_id(g, "tokenizer.ggml.padding_token_id", tok->n_vocab, &tok->pad, err)) != MN_OK)
        goto fail;
    if ((rc = tok_read_flag(g, "tokenizer.ggml.add_bos_token", &tok->add_bos, err)) != MN_OK) goto fail;
    if ((rc = tok_read_flag(g, "tokenizer.ggml.add_eos_token", &tok->add_eos, err)) != MN_OK) goto fail;

    if ((rc = tok_build_eog(tok, err)) != MN_OK) goto fail;
    if ((rc = tok_build_specials(tok, g, err)) != MN_OK) goto fail;
    if ((rc = tok_build_pieces(tok, err)) != MN_OK) goto fail;

    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = tok_lookup_cstr(tok, hex);
        if (id < 0) {
            char c = (char)b;
            id = tok_lookup(tok, &c, 1);
        }
        tok->byte_ids[b] = id;
    }
    *out = tok;
    return MN_OK;

fail:
    tok_free(tok);
    return rc;
}

void tok_free(Tokenizer *tok) {
    if (tok == NULL) return;
    pretok_free(tok->pre);
    mn_free(tok->eog);
    mn_free(tok->specials);
    mn_free(tok->merge_map);
    mn_free(tok->merge_rlen);
    mn_free(tok->merge_llen);
    mn_free(tok->merge_off);
    mn_free(tok->merge_text);
    mn_free(tok->map);
    mn_free(tok->pieces);
    mn_free(tok->piece_len);
    mn_free(tok->piece_off);
    mn_free(tok->flags);
    mn_free(tok->types);
    mn_free(tok->scores);
    mn_free(tok->text_len);
    mn_free(tok->text_off);
    mn_free(tok->texts);
    mn_free(tok);
}

/* ---- accessors ----------------------------------------------------------- */

int32_t tok_n_vocab(const Tokenizer *tok) { return tok->n_vocab; }
int32_t tok_bos(const Tokenizer *tok) { return tok->bos; }
int32_t tok_eos(const Tokenizer *tok) { return tok->eos; }
int32_t tok_eot(const Tokenizer *tok) { return tok->eot; }
bool tok_add_bos(const Tokenizer *tok) { return tok->add_bos && tok->bos >= 0; }
bool tok_add_eos(const Tokenizer *tok) { return tok->add_eos && tok->eos >= 0; }

bool tok_is_eog(const Tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return false;
    return (tok->eog[id >> 3] >> (id & 7)) & 1;
}

bool tok_is_control(const Tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return false;
    return tok->types[id] == TOK_TYPE_CONTROL;
}

const char *tok_text(const Tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return "";
    return tok_text_at(tok, id);
}

size_t tok_max_piece_bytes(const Tokenizer *tok) {
    /* Every byte of a piece may turn into a 3-byte U+FFFD. */
    return 3 * tok->max_piece_len;
}

void tok_dump(const Tokenizer *tok, FILE *f) {
    fprintf(f, "tokenizer: %s, %d tokens", tok->kind == TOK_KIND_SPM ? "spm" : "bpe", tok->n_vocab);
    if (tok->pre)
        fprintf(f, ", pre %s%s, %d merges", pretok_kind(tok->pre),
                tok->ignore_merges ? " (ignore merges)" : "", tok->n_merges);
    fprintf(f, "\n  bos %d eos %d eot %d eom %d unk %d pad %d; add_bos %d add_eos %d add_space_prefix %d\n",
            tok->bos, tok->eos, tok->eot, tok->eom, tok->unk, tok->pad, tok->add_bos, tok->add_eos,
            tok->add_space_prefix);
    fprintf(f, "  %zu special tokens, longest piece %zu bytes\n", tok->n_specials, tok->max_piece_len);
    for (size_t i = 0; i < tok->n_specials && i < 8; i++) {
        int32_t id = tok->specials[i];
        fprintf(f, "    %d type %d%s '%s'\n", id, tok->types[id],
                (tok->flags[id] & TOK_FLAG_RSTRIP) ? " rstrip" : "", tok_text_at(tok, id));
    }
}

/* ---- scratch helpers ----------------------------------------------------- */

static int tok_reserve(void **p, size_t *cap, size_t want, size_t elem) {
    if (want <= *cap) return MN_OK;
    size_t c = *cap ? *cap : 64;
    while (c < want) c *= 2;
    size_t bytes;
    if (mn_mul_size(c, elem, &bytes) != 0) return MN_ENOMEM;
    void *q = mn_realloc(*p, bytes);
    if (q == NULL) return MN_ENOMEM;
    *p = q;
    *cap = c;
    return MN_OK;
}

static void tok_scratch_free(TokScratch *s) {
    mn_free(s->frags[0]);
    mn_free(s->frags[1]);
    mn_free(s->buf);
    mn_free(s->syms);
    mn_free(s->heap);
    pretok_scratch_free(&s->pre);
}

static int tok_heap_push(TokScratch *s, TokBigram b) {
    if (tok_reserve((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap) != MN_OK)
        return MN_ENOMEM;
    TokBigram *h = s->heap;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key >= b.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = b;
    return MN_OK;
}

/* Remove the largest entry. Bottom-up: walk the hole down to a leaf along
 * the larger children (one compare per level), then sift the last entry up
 * from there; it rarely climbs far. */
static TokBigram tok_heap_pop(TokScratch *s) {
    TokBigram *h = s->heap;
    TokBigram top = h[0];
    size_t n = --s->heap_n;
    if (n == 0) return top;
    TokBigram last = h[n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        c += (c + 1 < n && h[c + 1].key > h[c].key);
        h[i] = h[c];
        i = c;
    }
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key >= last.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = last;
    return top;
}

/* Split buf[0..n) into UTF-8 symbols by lead byte (llama.cpp's rule). */
static int tok_make_symbols(TokScratch *s, const char *buf, size_t n, size_t *n_syms) {
    if (tok_reserve((void **)&s->syms, &s->sym_cap, n, sizeof *s->syms) != MN_OK) return MN_ENOMEM;
    size_t k = 0;
    for (size_t off = 0; off < n;) {
        size_t len = utf8_lead_len((unsigned char)buf[off]);
        if (len > n - off) len = n - off;
        s->syms[k] =
            (TokSym){(int32_t)k - 1, off + len == n ? -1 : (int32_t)k + 1, (uint32_t)off, (uint32_t)len};
        off += len;
        k++;
    }
    *n_syms = k;
    return MN_OK;
}

/* ---- SPM ----------------------------------------------------------------- */

static int spm_try_bigram(const Tokenizer *tok, TokScratch *s, const char *buf, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return MN_OK;
    uint32_t size = s->syms[l].n + s->syms[r].n;
    int32_t id = tok_lookup(tok, buf + s->syms[l].off, size);
    if (id < 0) return MN_OK;
    return tok_heap_push(s, (TokBigram){bigram_key(score_prio(tok->scores[id]), l), r, size});
}

/* Tokenize buf[0..n) (already escaped) and append to out. */
static int spm_tokenize(const Tokenizer *tok, TokScratch *s, const char *buf, size_t n, TokIds *out) {
    size_t n_syms;
    if (n == 0) return MN_OK;
    if (n > INT32_MAX) return MN_ENOMEM;
    if (tok_make_symbols(s, buf, n, &n_syms) != MN_OK) return MN_ENOMEM;
    s->heap_n = 0;
    for (size_t i = 1; i < n_syms; i++)
        if (spm_try_bigram(tok, s, buf, (int32_t)i - 1, (int32_t)i) != MN_OK) return MN_ENOMEM;

    while (s->heap_n > 0) {
        TokBigram b = tok_heap_pop(s);
        int32_t left = bigram_left(&b);
        TokSym *l = &s->syms[left], *r = &s->syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = left;
        if (spm_try_bigram(tok, s, buf, l->prev, left) != MN_OK) return MN_ENOMEM;
        if (spm_try_bigram(tok, s, buf, left, l->next) != MN_OK) return MN_ENOMEM;
    }

    for (int32_t i = 0; i != -1; i = s->syms[i].next) {
        const TokSym *sym = &s->syms[i];
        int32_t id = tok_lookup(tok, buf + sym->off, sym->n);
        if (id >= 0) {
            if (tok_ids_push(out, id) != MN_OK) return MN_ENOMEM;
            continue;
        }
        /* Not a token: its bytes, as <0xNN> tokens. */
        for (uint32_t j = 0; j < sym->n; j++) {
            int32_t bid = tok->byte_ids[(unsigned char)buf[sym->off + j]];
            if (bid < 0) bid = tok->unk;
            if (bid >= 0 && tok_ids_push(out, bid) != MN_OK) return MN_ENOMEM;
        }
    }
    return MN_OK;
}

/* Escape one raw fragment (optional leading space, ' ' -> U+2581) into the
 * scratch buffer and tokenize it. */
static int spm_fragment(const Tokenizer *tok, TokScratch *s, const char *text, size_t len, bool prefix,
                        TokIds *out) {
    size_t need;
    if (mn_mul_size(len + 1, 3, &need) != 0) return MN_ENOMEM;
    if (tok_reserve((void **)&s->buf, &s->buf_cap, need, 1) != MN_OK) return MN_ENOMEM;
    size_t o = 0;
    if (prefix) {
        memcpy(s->buf, "\xe2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            s->buf[o++] = text[i];
        }
    }
    return spm_tokenize(tok, s, s->buf, o, out);
}

/* ---- BPE ----------------------------------------------------------------- */

static int bpe_try_bigram(const Tokenizer *tok, TokScratch *s, const char *buf, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return MN_OK;
    const TokSym *a = &s->syms[l], *b = &s->syms[r];
    int32_t rank = tok_merge_rank(tok, buf + a->off, a->n, buf + b->off, b->n);
    if (rank < 0) return MN_OK;
    return tok_heap_push(s, (TokBigram){bigram_key(~(uint32_t)rank, l), r, a->n + b->n});
}

/* Merge one byte-encoded word buf[0..n) and append its tokens. */
static int bpe_word(const Tokenizer *tok, TokScratch *s, const char *buf, size_t n, TokIds *out) {
    if (tok->ignore_merges) {
        int32_t id = tok_lookup(tok, buf, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    size_t n_syms;
    if (tok_make_symbols(s, buf, n, &n_syms) != MN_OK) return MN_ENOMEM;
    s->heap_n = 0;
    for (size_t i = 1; i < n_syms; i++)
        if (bpe_try_bigram(tok, s, buf, (int32_t)i - 1, (int32_t)i) != MN_OK) return MN_ENOMEM;
    while (s->heap_n > 0) {
        TokBigram b = tok_heap_pop(s);
        int32_t left = bigram_left(&b);
        TokSym *l = &s->syms[left], *r = &s->syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* outdated */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = left;
        if (bpe_try_bigram(tok, s, buf, l->prev, left) != MN_OK) return MN_ENOMEM;
        if (bpe_try_bigram(tok, s, buf, left, l->next) != MN_OK) return MN_ENOMEM;
    }
    for (size_t i = 0; i < n_syms; i++) {
        const TokSym *sym = &s->syms[i];
        if (sym->n == 0) continue;
        int32_t id = tok_lookup(tok, buf + sym->off, sym->n);
        if (id >= 0) {
            if (tok_ids_push(out, id) != MN_OK) return MN_ENOMEM;
            continue;
        }
        /* No such token: each byte on its own, where that is a token. */
        for (uint32_t j = 0; j < sym->n; j++) {
            int32_t bid = tok_lookup(tok, buf + sym->off + j, 1);
            if (bid >= 0 && tok_ids_push(out, bid) != MN_OK) return MN_ENOMEM;
        }
    }
    return MN_OK;
}

static int bpe_fragment(const Tokenizer *tok, TokScratch *s, const char *text, size_t len, TokIds *out) {
    const char *t;
    const PretokSpan *words;
    size_t n_words;
    int rc = pretok_split(tok->pre, text, len, &s->pre, &t, &words, &n_words);
    if (rc != MN_OK) return rc;
    for (size_t w = 0; w < n_words; w++) {
        const unsigned char *src = (const unsigned char *)t + words[w].off;
        size_t n = words[w].len;
        if (n == 0) continue;
        if (n > INT32_MAX / 2) return MN_ENOMEM;
        if (tok_reserve((void **)&s->buf, &s->buf_cap, 2 * n, 1) != MN_OK) return MN_ENOMEM;
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(s->buf + o, tok->byte_enc[src[i]], 2);
            o += tok->byte_enc_len[src[i]];
        }
        if ((rc = bpe_word(tok, s, s->buf, o, out)) != MN_OK) return rc;
    }
    return MN_OK;
}

/* ---- special-token partition --------------------------------------------- */

static int tok_frag_push(TokScratch *s, int which, size_t *n, TokFrag f) {
    if (tok_reserve((void **)&s->frags[which], &s->frag_cap[which], *n + 1, sizeof(TokFrag)) != MN_OK)
        return MN_ENOMEM;
    s->frags[which][(*n)++] = f;
    return MN_OK;
}

/* Cut text at special tokens; *which receives the buffer holding the
 * fragments (s->frags[*which][0..*n)). */
static int tok_partition(const Tokenizer *tok, const char *text, size_t len, bool parse_special,
                         TokScratch *s, int *which, size_t *n_frags) {
    int cur = 0;
    size_t n = 0;
    if (tok_frag_push(s, cur, &n, (TokFrag){-1, 0, len}) != MN_OK) return MN_ENOMEM;
    *which = cur;
    *n_frags = n;
    if (tok->n_specials == 0) return MN_OK;

    /* Which bytes and byte pairs occur at all: most special tokens can be
     * ruled out without a search. */
    uint64_t firsts[4] = {0, 0, 0, 0};
    uint64_t *pairs = mn_calloc(1024, sizeof *pairs); /* 65536 bits */
    if (pairs == NULL) return MN_ENOMEM;
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++) {
        firsts[u[i] >> 6] |= 1ull << (u[i] & 63);
        if (i + 1 < len) {
            unsigned p = (unsigned)u[i] << 8 | u[i + 1];
            pairs[p >> 6] |= 1ull << (p & 63);
        }
    }

    int rc = MN_OK;
    for (size_t k = 0; k < tok->n_specials; k++) {
        int32_t sid = tok->specials[k];
        uint8_t type = tok->types[sid];
        if (!parse_special && (type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN)) continue;
        const char *st = tok_text_at(tok, sid);
        size_t sl = tok->text_len[sid];
        if (sl == 0 || sl > len) continue;
        const unsigned char *su = (const unsigned char *)st;
        if (!((firsts[su[0] >> 6] >> (su[0] & 63)) & 1)) continue;
        if (sl >= 2) {
            unsigned p = (unsigned)su[0] << 8 | su[1];
            if (!((pairs[p >> 6] >> (p & 63)) & 1)) continue;
        }

        int nxt = 1 - cur;
        size_t nn = 0;
        for (size_t f = 0; f < n; f++) {
            TokFrag fr = s->frags[cur][f];
            if (fr.id >= 0) {
                if ((rc = tok_frag_push(s, nxt, &nn, fr)) != MN_OK) goto out;
                continue;
            }
            size_t base = fr.off, blen = fr.len;
            while (blen > 0) {
                const char *m = memmem(text + base, blen, st, sl);
                if (m == NULL) break;
                size_t at = (size_t)(m - text);
                size_t ll = at - base;
                if (tok->flags[sid] & TOK_FLAG_LSTRIP)
                    while (ll > 0 && isspace((unsigned char)text[base + ll - 1])) ll--;
                if (ll > 0 && (rc = tok_frag_push(s, nxt, &nn, (TokFrag){-1, base, ll})) != MN_OK) goto out;
                if ((rc = tok_frag_push(s, nxt, &nn, (TokFrag){sid, 0, 0})) != MN_OK) goto out;
                size_t roff = at + sl, rlen = base + blen - roff;
                if (tok->flags[sid] & TOK_FLAG_RSTRIP)
                    while (rlen > 0 && isspace((unsigned char)text[roff])) roff++, rlen--;
                base = roff;
                blen = rlen;
            }
            if (blen > 0 && (rc = tok_frag_push(s, nxt, &nn, (TokFrag){-1, base, blen})) != MN_OK) goto out;
        }
        cur = nxt;
        n = nn;
    }
out:
    mn_free(pairs);
    *which = cur;
    *n_frags = n;
    return rc;
}

/* ---- encode -------------------------------------------------------------- */

static int encode(const Tokenizer *tok, const char *text, size_t len, bool add_bos, bool parse_special,
                  bool is_continuation, TokIds *out);

int tok_encode(const Tokenizer *tok, const char *text, size_t len, bool add_bos, bool parse_special,
               TokIds *out) {
    return encode(tok, text, len, add_bos, parse_special, false, out);
}

int tok_encode_cont(const Tokenizer *tok, const char *text, size_t len, bool parse_special, TokIds *out) {
    return encode(tok, text, len, false, parse_special, true, out);
}

static int encode(const Tokenizer *tok, const char *text, size_t len, bool add_bos, bool parse_special,
                  bool is_continuation, TokIds *out) {
    assert(tok != NULL && out != NULL && (text != NULL || len == 0));
    size_t n0 = out->n;
    if (add_bos && tok->bos >= 0 && tok_ids_push(out, tok->bos) != MN_OK) return MN_ENOMEM;
    if (len == 0) return MN_OK;

    TokScratch s;
    memset(&s, 0, sizeof s);
    int which;
    size_t n_frags;
    int rc = tok_partition(tok, text, len, parse_special, &s, &which, &n_frags);
    bool prev_special = !is_continuation; /* SPM: the first fragment gets the space prefix */
    for (size_t f = 0; rc == MN_OK && f < n_frags; f++) {
        TokFrag fr = s.frags[which][f];
        if (fr.id >= 0) {
            rc = tok_ids_push(out, fr.id);
            prev_special = true;
        } else if (tok->kind == TOK_KIND_SPM) {
            rc = spm_fragment(tok, &s, text + fr.off, fr.len, tok->add_space_prefix && prev_special, out);
            prev_special = false;
        } else {
            rc = bpe_fragment(tok, &s, text + fr.off, fr.len, out);
        }
    }
    tok_scratch_free(&s);
    if (rc != MN_OK) out->n = n0;
    return rc;
}

/* ---- pieces and streaming ------------------------------------------------ */

const char *tok_piece(const Tokenizer *tok, int32_t id, bool render_special, char *buf, size_t *len) {
    (void)buf; /* every piece, single bytes included, lives in the Tokenizer */
    *len = 0;
    if (id < 0 || id >= tok->n_vocab) return "";
    uint8_t type = tok->types[id];
    if (!render_special && (type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN)) return "";
    *len = tok->piece_len[id];
    return tok->pieces + tok->piece_off[id];
}

void tok_stream_init(TokStream *s, const Tokenizer *tok, bool render_special) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->render_special = render_special;
    s->at_start = true;
}

/* Run pending ++ piece through the UTF-8 checker. Writes complete
 * characters (U+FFFD for ill-formed parts) to out when out != NULL, and
 * always returns the output length; the incomplete tail (<= 3 bytes) goes
 * to tail (its length to n_tail). */
static size_t stream_feed(const unsigned char *pending, size_t np, const unsigned char *piece, size_t plen,
                          char *out, unsigned char tail[8], size_t *n_tail) {
    unsigned char win[4];
    size_t total = np + plen, i = 0, o = 0;
    *n_tail = 0;
    while (i < total) {
        /* Gather up to 4 bytes starting at i from the virtual buffer. */
        size_t w = 0;
        for (; w < 4 && i + w < total; w++) win[w] = i + w < np ? pending[i + w] : piece[i + w - np];
        uint32_t cp;
        int k = utf8_decode_strict(win, w, &cp);
        if (k == 0) { /* incomplete at the very end: hold it back */
            memcpy(tail, win, w);
            *n_tail = w;
            break;
        }
        if (k > 0) {
            if (out) memcpy(out + o, win, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            if (out) memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += (size_t)(-k);
        }
    }
    return o;
}

int tok_stream_push(TokStream *s, int32_t id, char *out, size_t cap, size_t *n_out) {
    assert(s != NULL && s->tok != NULL && n_out != NULL);
    *n_out = 0;
    char small[8];
    size_t plen;
    const char *p = tok_piece(s->tok, id, s->render_special, small, &plen);
    if (plen == 0) return MN_OK;
    if (s->at_start && s->tok->kind == TOK_KIND_SPM && s->tok->add_space_prefix && p[0] == ' ') {
        p++;
        plen--;
    }
    s->at_start = false;
    unsigned char tail[8];
    size_t n_tail;
    size_t need = stream_feed(s->pending, s->n_pending, (const unsigned char *)p, plen, NULL, tail, &n_tail);
    if (need > cap) return MN_EFULL;
    *n_out = stream_feed(s->pending, s->n_pending, (const unsigned char *)p, plen, out, tail, &n_tail);
    memcpy(s->pending, tail, n_tail);
    s->n_pending = n_tail;
    return MN_OK;
}

int tok_stream_flush(TokStream *s, char *out, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (s->n_pending == 0) return MN_OK;
    if (cap < 3) return MN_EFULL;
    memcpy(out, "\xef\xbf\xbd", 3); /* an incomplete character at the end */
    *n_out = 3;
    s->n_pending = 0;
    return MN_OK;
}

int tok_decode(const Tokenizer *tok, const int32_t *ids, size_t n, bool render_special, char **out,
               size_t *out_len) {
    assert(tok != NULL && out != NULL);
    *out = NULL;
    if (out_len) *out_len = 0;
    TokStream st;
    tok_stream_init(&st, tok, render_special);
    size_t cap = 64, len = 0;
    char *buf = mn_malloc(cap);
    if (buf == NULL) return MN_ENOMEM;
    for (size_t i = 0; i <= n; i++) {
        size_t plen = 0;
        if (i < n) tok_piece(tok, ids[i], render_special, NULL, &plen);
        size_t want = len + 3 * (plen + 8) + 1; /* worst case: all U+FFFD, plus NUL */
        if (want > cap) {
            while (cap < want) cap *= 2;
            char *b = mn_realloc(buf, cap);
            if (b == NULL) {
                mn_free(buf);
                return MN_ENOMEM;
            }
            buf = b;
        }
        size_t k;
        if (i < n)
            tok_stream_push(&st, ids[i], buf + len, cap - len, &k);
        else
            tok_stream_flush(&st, buf + len, cap - len, &k);
        len += k;
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = len;
    return MN_OK;
}
