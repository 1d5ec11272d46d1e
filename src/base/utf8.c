/* utf8.c — UTF-8 length, encoding and the strict and lenient decoders.
 *
 * Pure functions over caller buffers, no state. The strict decoder follows
 * the Unicode "maximal subpart" practice for replacement: an ill-formed
 * sequence becomes one U+FFFD per maximal prefix of a well-formed sequence
 * (or per lone byte), so the streaming detokenizer and tok_decode replace
 * garbage the same way browsers and Python do. The lenient decoder mirrors
 * llama.cpp's input conversion so that malformed prompts tokenize alike.
 */
#include "base/utf8.h"

int utf8_hex_digit(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ---- lengths and encoding ------------------------------------------------ */

size_t utf8_lead_len(unsigned char lead) {
    static const unsigned char len_by_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len_by_nibble[lead >> 4];
}

size_t utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

/* ---- strict decoding ----------------------------------------------------- */

int utf8_decode_strict(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    /* Number of continuation bytes and the allowed range of the first one
     * (Unicode Table 3-7); the others are always 0x80..0xBF. */
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        v = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        v = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        v = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return -1; /* 0x80..0xC1 or 0xF5..0xFF never start a character */
    }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n) return 0; /* cut short by the end of the buffer */
        unsigned char b = s[k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) return -(int)k;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return (int)need + 1;
}

bool utf8_is_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = utf8_decode_strict(p + i, n - i, &cp);
        if (k <= 0) return false;
        i += (size_t)k;
    }
    return true;
}

/* ---- lenient decoding (llama.cpp's rules) -------------------------------- */

size_t utf8_decode_lenient(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b0 = s[0];
    size_t len;
    uint32_t v;
    if (!(b0 & 0x80)) {
        *cp = b0;
        return 1;
    }
    if (!(b0 & 0x40)) {
        len = 0;
        v = 0;
    } else if (!(b0 & 0x20)) {
        len = 2;
        v = b0 & 0x1F;
    } else if (!(b0 & 0x10)) {
        len = 3;
        v = b0 & 0x0F;
    } else if (!(b0 & 0x08)) {
        len = 4;
        v = b0 & 0x07;
    } else {
        len = 0;
        v = 0;
    }
    if (len == 0 || len > n) {
        *cp = UTF8_REPLACEMENT;
        return 1;
    }
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *cp = UTF8_REPLACEMENT;
            return 1;
        }
        v = (v << 6) | (s[k] & 0x3F);
    }
    *cp = v;
    return len;
}
