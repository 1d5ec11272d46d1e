/* utf8.h — small UTF-8 helpers: the tokenizer and the pre-tokenizer (model/)
 * decode with them, the server (JSON text, metric labels) validates and
 * replaces with them; generic, so they sit in base/.
 *
 * Two notions of "valid" live here on purpose:
 *   - the strict one (RFC 3629: no overlong forms, no surrogates, nothing
 *     above U+10FFFF) used when text goes out to users and into PCRE2;
 *   - the lenient one llama.cpp applies when it turns input bytes into code
 *     points (a lead byte followed by the right number of continuation bytes
 *     is accepted whatever it encodes), which the BPE pre-tokenizer must
 *     reproduce to split malformed input the same way.
 */
#ifndef MN_UTF8_H
#define MN_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UTF8_REPLACEMENT 0xFFFDu

/* The value of an ASCII hex digit ([0-9a-fA-F]): 0..15, or -1 for any
 * other character. */
int utf8_hex_digit(int c);

/* Length of the sequence a lead byte announces, by its high nibble only
 * (continuation bytes count as 1, 0xF8..0xFF as 4): the rule llama.cpp uses
 * to cut text into symbols. Always 1..4. */
size_t utf8_lead_len(unsigned char lead);

/* Encode cp (<= 0x10FFFF; surrogates are encoded as is) into out; returns
 * the byte count (1..4), or 0 when cp is out of range. */
size_t utf8_encode(uint32_t cp, char out[4]);

/* Strict decode of the sequence at s[0..n), n >= 1. Returns:
 *   > 0  a complete valid character of that many bytes, *cp set;
 *   0    a valid prefix that the end of the buffer cut short (more bytes
 *        could complete it);
 *   < 0  invalid: -k means the first k bytes (k >= 1, the maximal ill-formed
 *        subpart) stand for one U+FFFD. */
int utf8_decode_strict(const unsigned char *s, size_t n, uint32_t *cp);

/* True when s[0..n) is strictly valid UTF-8. */
bool utf8_is_valid(const char *s, size_t n);

/* Lenient decode in llama.cpp's manner: returns the bytes consumed (>= 1)
 * and the code point; a malformed lead consumes one byte and yields
 * U+FFFD. The code point may be a surrogate or exceed U+10FFFF. */
size_t utf8_decode_lenient(const unsigned char *s, size_t n, uint32_t *cp);

#endif
