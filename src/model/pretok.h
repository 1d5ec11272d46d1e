/* pretok.h — the regex pre-tokenizers of byte-level BPE vocabularies.
 *
 * A GGUF names its pre-tokenizer in tokenizer.ggml.pre ("gpt-2", "llama3",
 * "qwen2", "deepseek-llm", ...). Each name stands for a list of regexes that
 * are applied in sequence: the first splits the text into pieces (matches
 * and the gaps between them both become pieces), every later one splits each
 * piece produced by the one before. The pieces left at the end are the words
 * BPE merges within. Patterns are compiled once by pretok_new and shared
 * read-only; pretok_split uses only caller-owned scratch, so one Pretok may
 * serve many threads at once.
 */
#ifndef MN_PRETOK_H
#define MN_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct Pretok Pretok;

/* One word: bytes [off, off + len) of the text pretok_split returned. */
typedef struct PretokSpan {
    size_t off, len;
} PretokSpan;

/* Per-caller working memory for pretok_split. Zero-initialize before first
 * use, release with pretok_scratch_free. Not shareable between threads. */
typedef struct PretokScratch {
    PretokSpan *spans[2]; /* ping-pong: pieces before / after one regex */
    size_t cap[2];
    char *text; /* the input with malformed UTF-8 replaced, when needed */
    size_t text_cap;
    void *match_data; /* pcre2_match_data_8 */
} PretokScratch;

/* Compile the patterns of pre-tokenizer name (name_len bytes). Returns
 * MN_EUNSUPPORTED for a name we do not know, MN_ENOMEM, or MN_EFORMAT if a
 * pattern fails to compile (a bug, reported with the PCRE2 message). */
int pretok_new(const char *name, size_t name_len, Pretok **out, MnErr *err);
void pretok_free(Pretok *p);

/* Canonical name of the pattern set ("gpt2", "llama3", ...). */
const char *pretok_kind(const Pretok *p);
/* llama3-style vocabularies look a whole word up before merging. */
bool pretok_ignore_merges(const Pretok *p);
/* Default for tokenizer.ggml.add_bos_token when the key is absent. */
bool pretok_default_add_bos(const Pretok *p);

/* Split text[0..len) into words. Malformed UTF-8 is first replaced the way
 * llama.cpp does (each bad byte -> U+FFFD); *out_text then points into the
 * scratch, else it is text itself. *words points into the scratch; both stay
 * valid until the next call with the same scratch. Returns MN_OK, MN_ENOMEM,
 * or MN_ERANGE if PCRE2 gives up on pathological input (a resource limit). */
int pretok_split(const Pretok *p, const char *text, size_t len, PretokScratch *s, const char **out_text,
                 const PretokSpan **words, size_t *n_words);

void pretok_scratch_free(PretokScratch *s);

#endif
