/* fuzz_tokenizer.c — libFuzzer target for the tokenizers (model/tokenizer.h,
 * model/pretok.h): encoding arbitrary bytes and decoding arbitrary ids with
 * every kind of vocabulary mnemo supports.
 *
 * The tokenizers are loaded once, in LLVMFuzzerInitialize, from real
 * vocabularies: ../shared/data/vocab (or $MNEMO_DATA/vocab: SentencePiece's
 * llama-spm and phi-3, and byte-level BPE with the pre-tokenizers of
 * gpt-2, starcoder, falcon, mpt, refact, deepseek-llm and deepseek-coder),
 * the bundled models/stories260K.gguf (a small SentencePiece vocabulary, the
 * one the gemma and phi3 fixtures use), and the gpt-2 vocabulary once more
 * under each pre-tokenizer pattern set no shared file uses (llama3, qwen2,
 * tekken, gpt-4o, ...; written with a new tokenizer.ggml.pre to a temporary
 * file), and llama-spm and stories260K without the space prefix, as
 * gemma's SentencePiece files have it. Without the shared data only
 * stories260K is fuzzed.
 *
 * An input is: byte 0 picks the tokenizer (modulo their number), byte 1
 * holds flags (FUZZ_TOK_*), the rest is the text to encode or, with
 * FUZZ_TOK_DECODE, the ids to decode (two bytes each, little-endian, minus
 * 16, so that negative and out-of-range ids occur too). What must hold,
 * beyond no crash, leak or out-of-bounds access (ASan, UBSan):
 *   - encoding succeeds (or gives up with MN_ERANGE on a PCRE2 limit,
 *     leaving the ids as they were), every id is in [0, n_vocab), BOS comes
 *     first when asked for and the vocabulary has one;
 *   - decoding always succeeds and gives valid UTF-8, the same text whether
 *     whole (tok_decode) or streamed id by id into buffers of the size
 *     tok_max_piece_bytes promises is enough;
 *   - valid UTF-8 round-trips exactly through encode and decode (no BOS,
 *     special tokens not parsed nor rendered) — what tests/test_tokenizer.c
 *     checks on a few hundred random strings, here on whatever the fuzzer
 *     makes — when the vocabulary has a token for each of the text's bytes
 *     (falcon's lacks some control bytes, starcoder's and refact's the
 *     lead byte of planes 4 to 7: llama.cpp's tokenizer, which mnemo
 *     reproduces, drops those bytes too). Not with phi-3's vocabulary: its
 *     user-defined tokens ("</s>", "<|user|>", ...) are cut out of any text,
 *     parsed or not, and the SentencePiece space prefix then goes before
 *     the text that follows (and "</s>" takes the white space after it), as
 *     in llama.cpp. With SentencePiece vocabularies a U+2581 in the text
 *     comes back as a space: it is how they write one (llama.cpp's too).
 * Seeds: fuzz/corpus/tokenizer; `make fuzz` adds the vocabularies' test
 * strings (fuzz/seeds-tokenizer).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/mem.h"
#include "base/tok_ids.h"
#include "base/utf8.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

enum {
    FUZZ_TOK_ADD_BOS = 1,        /* encode with BOS */
    FUZZ_TOK_PARSE_SPECIAL = 2,  /* encode with special tokens parsed */
    FUZZ_TOK_CONT = 4,           /* tok_encode_cont instead of tok_encode */
    FUZZ_TOK_RENDER_SPECIAL = 8, /* decode with special tokens rendered */
    FUZZ_TOK_DECODE = 16,        /* the payload is ids to decode, not text */
};

typedef struct FuzzVocab {
    const char *file; /* under the data root, or the repository's when is_repo */
    const char *pre;  /* NULL: the file's own pre-tokenizer; else this one instead */
    bool is_repo;
    bool is_round_trip; /* valid UTF-8 of bytes it has tokens for round-trips (see the top) */
    bool is_unprefixed; /* tokenizer.ggml.add_space_prefix set false, as gemma's files have it */
    bool is_spm;        /* SentencePiece: a "\u2581" in the text decodes as a space (see spm_expected) */
} FuzzVocab;

/* The order is the meaning of an input's first byte: append, do not reorder
 * (the seeds are written for it). */
static const FuzzVocab vocabs[] = {
    {"vocab/ggml-vocab-llama-spm.gguf", NULL, false, true, false, true},
    {"vocab/ggml-vocab-phi-3.gguf", NULL, false, false, false, true}, /* user-defined tokens: see the top */
    {"models/stories260K.gguf", NULL, true, true, false, true},
    {"vocab/ggml-vocab-gpt-2.gguf", NULL, false, true, false, false},
    {"vocab/ggml-vocab-starcoder.gguf", NULL, false, true, false, false},
    {"vocab/ggml-vocab-falcon.gguf", NULL, false, true, false, false},
    {"vocab/ggml-vocab-mpt.gguf", NULL, false, true, false, false},
    {"vocab/ggml-vocab-refact.gguf", NULL, false, true, false, false},
    {"vocab/ggml-vocab-deepseek-llm.gguf", NULL, false, true, false, false},
    {"vocab/ggml-vocab-deepseek-coder.gguf", NULL, false, true, false, false},
    /* one name for each of pretok.c's pattern sets no file above uses */
    {"vocab/ggml-vocab-gpt-2.gguf", "llama3", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "dbrx", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "qwen2", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "poro-chat", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "viking", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "tekken", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "gpt-4o", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "seed-coder", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "bailingmoe", false, true, false, false},
    {"vocab/ggml-vocab-gpt-2.gguf", "default", false, true, false, false},
    /* SentencePiece without the space prefix: gemma's tokenizer */
    {"vocab/ggml-vocab-llama-spm.gguf", NULL, false, true, true, true},
    {"models/stories260K.gguf", NULL, true, true, true, true},
};
#define N_VOCABS (sizeof vocabs / sizeof vocabs[0])

/* Loaded once by LLVMFuzzerInitialize (the harness's main) and read-only
 * afterwards; NULL where a file is missing. */
static Tokenizer *toks[N_VOCABS];
static uint8_t has_byte[N_VOCABS][256]; /* a token stands for this byte alone */
static int n_loaded;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- loading ------------------------------------------------------------- */

/* g's key/values with v's changes (its pre-tokenizer, no space prefix),
 * written to a temporary file and opened again. */
static int with_changes(const Gguf *g, const FuzzVocab *v, Gguf **out, MnErr *err) {
    char path[] = "/tmp/mnemo-fuzz-tok-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return mn_err_set(err, MN_EIO, "mkstemp failed");
    close(fd);
    GgufWriter *w = gguf_writer_new();
    if (w == NULL) abort();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (!(v->pre && strcmp(key, "tokenizer.ggml.pre") == 0) &&
            !(v->is_unprefixed && strcmp(key, "tokenizer.ggml.add_space_prefix") == 0))
            gguf_writer_copy_kv(w, g, i);
    }
    if (v->pre) gguf_writer_add_str(w, "tokenizer.ggml.pre", v->pre);
    if (v->is_unprefixed) gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", false);
    int rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    if (rc == MN_OK) rc = gguf_open(path, out, err);
    unlink(path);
    return rc;
}

static void load_vocab(size_t i, const char *root) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", vocabs[i].is_repo ? "." : root, vocabs[i].file);
    if (access(path, R_OK) != 0) return;
    MnErr err = {0};
    Gguf *g = NULL, *g2 = NULL;
    int rc = gguf_open(path, &g, &err);
    if (rc == MN_OK && (vocabs[i].pre != NULL || vocabs[i].is_unprefixed)) {
        rc = with_changes(g, &vocabs[i], &g2, &err);
        gguf_close(g);
        g = g2;
    }
    if (rc == MN_OK) rc = tok_load(g, &toks[i], &err);
    gguf_close(g);
    if (rc != MN_OK) { /* a file that is there must load: that is a bug */
        fprintf(stderr, "fuzz_tokenizer: vocabulary %zu (%s): %s\n", i, path, err.msg);
        abort();
    }
    for (int32_t id = 0; id < tok_n_vocab(toks[i]); id++) {
        char small[8];
        size_t len;
        const char *p = tok_piece(toks[i], id, false, small, &len);
        if (len == 1) has_byte[i][(uint8_t)p[0]] = 1;
    }
    n_loaded++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *root = getenv("MNEMO_DATA");
    if (root == NULL || root[0] == '\0') root = "../shared/data";
    for (size_t i = 0; i < N_VOCABS; i++) load_vocab(i, root);
    if (n_loaded == 0) {
        fprintf(stderr, "fuzz_tokenizer: no vocabulary found (run from the repository's root)\n");
        abort();
    }
    fprintf(stderr, "fuzz_tokenizer: %d of %zu tokenizers loaded (data: %s)\n", n_loaded, N_VOCABS, root);
    return 0;
}

/* ---- checks -------------------------------------------------------------- */

/* Decode ids both ways, check they agree and are valid UTF-8. The text
 * (mn_malloc'd) goes to *out. */
static void decode_checked(const Tokenizer *tok, const int32_t *ids, size_t n, bool render_special, char **out,
                           size_t *out_len) {
    if (tok_decode(tok, ids, n, render_special, out, out_len) != MN_OK) abort();
    if ((*out)[*out_len] != '\0' || !utf8_is_valid(*out, *out_len)) abort();

    size_t cap = tok_max_piece_bytes(tok) + 16, len = 0, k;
    char *piece = mn_malloc(cap);
    if (piece == NULL) abort();
    TokStream st;
    tok_stream_init(&st, tok, render_special);
    for (size_t i = 0; i <= n; i++) {
        int rc = i < n ? tok_stream_push(&st, ids[i], piece, cap, &k) : tok_stream_flush(&st, piece, cap, &k);
        if (rc != MN_OK || k > cap || len + k > *out_len || memcmp(*out + len, piece, k) != 0) abort();
        len += k;
    }
    if (len != *out_len) abort();
    mn_free(piece);
}

/* What a round trip gives back for a text: the text itself, except that a
 * SentencePiece vocabulary stands for a space by U+2581 ("\xe2\x96\x81"),
 * so a literal one in the text decodes as a space (llama.cpp's too). The
 * result is mn_malloc'd, no longer than the text. */
static char *round_trip_expected(size_t v, const char *text, size_t len, size_t *out_len) {
    char *exp = mn_malloc(len ? len : 1);
    if (exp == NULL) abort();
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (vocabs[v].is_spm && len - i >= 3 && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
            exp[n++] = ' ';
            i += 2;
        } else {
            exp[n++] = text[i];
        }
    }
    *out_len = n;
    return exp;
}

static void fuzz_encode(size_t v, const Tokenizer *tok, uint8_t flags, const char *text, size_t len) {
    bool add_bos = flags & FUZZ_TOK_ADD_BOS, parse_special = flags & FUZZ_TOK_PARSE_SPECIAL;
    TokIds ids = {0};
    int rc = flags & FUZZ_TOK_CONT ? tok_encode_cont(tok, text, len, parse_special, &ids)
                                   : tok_encode(tok, text, len, add_bos, parse_special, &ids);
    if (rc != MN_OK) {
        if (rc != MN_ERANGE || ids.n != 0) abort();
        tok_ids_free(&ids);
        return;
    }
    int32_t n_vocab = tok_n_vocab(tok);
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= n_vocab) abort();
    bool has_bos = add_bos && !(flags & FUZZ_TOK_CONT) && tok_bos(tok) >= 0;
    if (has_bos && (ids.n == 0 || ids.ids[0] != tok_bos(tok))) abort();

    char *back;
    size_t back_len;
    bool render_special = flags & FUZZ_TOK_RENDER_SPECIAL;
    decode_checked(tok, ids.ids, ids.n, render_special, &back, &back_len);
    bool is_plain = !add_bos && !parse_special && !render_special && !(flags & FUZZ_TOK_CONT);
    bool is_covered = vocabs[v].is_round_trip && utf8_is_valid(text, len);
    for (size_t i = 0; is_covered && i < len; i++) is_covered = has_byte[v][(uint8_t)text[i]];
    if (is_plain && is_covered) {
        size_t exp_len;
        char *exp = round_trip_expected(v, text, len, &exp_len);
        if (back_len != exp_len || memcmp(back, exp, exp_len) != 0) {
            fprintf(stderr, "round trip of %zu bytes gave %zu bytes (%zu ids) with vocabulary %zu (%s)\n", len,
                    back_len, ids.n, v, vocabs[v].file);
            abort();
        }
        mn_free(exp);
    }
    mn_free(back);
    tok_ids_free(&ids);
}

static void fuzz_decode(const Tokenizer *tok, uint8_t flags, const uint8_t *data, size_t size) {
    size_t n = size / 2;
    int32_t *ids = mn_malloc((n ? n : 1) * sizeof *ids);
    if (ids == NULL) abort();
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(data[2 * i] | (uint32_t)data[2 * i + 1] << 8) - 16;
    for (size_t i = 0; i < n; i++) {
        char small[8];
        size_t plen;
        const char *p = tok_piece(tok, ids[i], flags & FUZZ_TOK_RENDER_SPECIAL, small, &plen);
        if (p == NULL || plen > tok_max_piece_bytes(tok)) abort();
        if ((ids[i] < 0 || ids[i] >= tok_n_vocab(tok)) && plen != 0) abort();
    }
    char *text;
    size_t len;
    decode_checked(tok, ids, n, flags & FUZZ_TOK_RENDER_SPECIAL, &text, &len);
    mn_free(text);
    mn_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t v = data[0] % N_VOCABS;
    const Tokenizer *tok = toks[v];
    if (tok == NULL) return 0;
    uint8_t flags = data[1];
    if (flags & FUZZ_TOK_DECODE)
        fuzz_decode(tok, flags, data + 2, size - 2);
    else
        fuzz_encode(v, tok, flags, (const char *)data + 2, size - 2);
    return 0;
}
