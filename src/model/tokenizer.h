/* tokenizer.h — text <-> token ids for the vocabularies GGUF files carry.
 *
 * Two families, chosen by tokenizer.ggml.model:
 *   "llama": SentencePiece-style — a space prefix ("▁"), spaces as "▁",
 *            greedy merge of the highest-scoring adjacent pair, and byte
 *            fallback (<0xNN> tokens) for anything not in the vocabulary;
 *   "gpt2":  byte-level BPE — the text is split by the pre-tokenizer that
 *            tokenizer.ggml.pre names (regexes with Unicode classes, run with
 *            PCRE2), bytes are mapped to printable code points, and pieces are
 *            merged by merge rank (tokenizer.ggml.merges).
 * Special and control tokens (token_type CONTROL / USER_DEFINED) are matched
 * as whole strings only when parse_special is set. BOS/EOS/EOT ids and
 * add_bos_token come from metadata. The behaviour matches llama.cpp's
 * tokenizer: the vectors in ../shared/data/vocab are the oracle.
 *
 * A Tokenizer copies what it needs out of the GGUF: the Gguf may be closed
 * afterwards. It is immutable after tok_load and safe to share across threads
 * (encode/decode use only caller-owned state).
 */
#ifndef MN_TOKENIZER_H
#define MN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "base/tok_ids.h" /* TokIds, the id vector encode appends to */
#include "model/gguf.h"

typedef struct Tokenizer Tokenizer;

/* Load from any GGUF that has tokenizer.* metadata, whatever its architecture
 * (vocabulary-only files included). MN_ENOTFOUND when the file has no
 * tokenizer.ggml.model, MN_EUNSUPPORTED for an unknown tokenizer model or
 * pre-tokenizer, MN_EFORMAT for inconsistent metadata. */
int tok_load(const Gguf *g, Tokenizer **out, MnErr *err);
void tok_free(Tokenizer *tok);

int32_t tok_n_vocab(const Tokenizer *tok);
int32_t tok_bos(const Tokenizer *tok);   /* -1 if none */
int32_t tok_eos(const Tokenizer *tok);   /* -1 if none */
int32_t tok_eot(const Tokenizer *tok);   /* -1 if none */
bool tok_add_bos(const Tokenizer *tok);  /* tokenizer.ggml.add_bos_token, or the family default */
bool tok_add_eos(const Tokenizer *tok);  /* tokenizer.ggml.add_eos_token (tok_encode never appends EOS) */
bool tok_is_eog(const Tokenizer *tok, int32_t id); /* end of generation: EOS, EOT, ... */
bool tok_is_control(const Tokenizer *tok, int32_t id);

/* Append the tokens of text[0..len) to out. add_bos prepends BOS (when the
 * vocabulary has one). Returns MN_OK or MN_ENOMEM (or MN_ERANGE if PCRE2
 * hits a resource limit on pathological input); on failure out->n is left
 * as it was. */
int tok_encode(const Tokenizer *tok, const char *text, size_t len, bool add_bos, bool parse_special,
               TokIds *out);

/* Like tok_encode, for text that continues a sequence already tokenized:
 * no BOS, and no SPM space prefix on its first fragment (a fragment after a
 * special token still gets one, as inside tok_encode). */
int tok_encode_cont(const Tokenizer *tok, const char *text, size_t len, bool parse_special, TokIds *out);

/* The bytes token id stands for (SPM "▁" -> ' ', <0xNN> -> that byte,
 * byte-level BPE unmapped). Control tokens give their text only when
 * render_special is set, else empty. *len receives the byte count; the
 * pointer is into the Tokenizer, or into buf (>= 8 bytes) for single bytes. */
const char *tok_piece(const Tokenizer *tok, int32_t id, bool render_special, char *buf, size_t *len);

/* Raw vocabulary string of id (as stored in the GGUF; "" for an invalid
 * id), for dumps. */
const char *tok_text(const Tokenizer *tok, int32_t id);

/* Summary (family, pre-tokenizer, special ids, flags) for debugging. */
void tok_dump(const Tokenizer *tok, FILE *f);

/* ---- streaming detokenization --------------------------------------------
 * Feed ids one at a time; complete UTF-8 characters come out as soon as they
 * are complete, a token that ends inside a multi-byte character is held back
 * until the rest arrives. For SPM vocabularies the space that the space
 * prefix put at the start of the text is removed (as llama.cpp does), so
 * decoding the tokens of "Hello" gives "Hello". Invalid byte sequences come
 * out as U+FFFD once it is clear they cannot complete. */
typedef struct TokStream {
    const Tokenizer *tok;
    bool render_special;
    bool at_start;     /* nothing emitted yet: strip the SPM space prefix */
    unsigned char pending[8];
    size_t n_pending;
} TokStream;

void tok_stream_init(TokStream *s, const Tokenizer *tok, bool render_special);
/* Append the text that is complete after id to out (cap bytes, always enough
 * when cap >= tok_max_piece_bytes(tok) + 16); *n_out gets its length.
 * MN_EFULL (nothing consumed) if cap is too small for this token. */
int tok_stream_push(TokStream *s, int32_t id, char *out, size_t cap, size_t *n_out);
/* Emit whatever is held back (as U+FFFD for an incomplete character). */
int tok_stream_flush(TokStream *s, char *out, size_t cap, size_t *n_out);
/* Bytes one token can produce, counting each byte as a possible U+FFFD. */
size_t tok_max_piece_bytes(const Tokenizer *tok);

/* Decode a whole id sequence into a NUL-terminated string the caller frees
 * with mn_free (same rules as the stream). */
int tok_decode(const Tokenizer *tok, const int32_t *ids, size_t n, bool render_special, char **out,
               size_t *out_len);

#endif
