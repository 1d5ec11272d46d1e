/* hash.c — XXH3-128 behind the Hash128 type (see hash.h). */
#include "base/hash.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((Hasher *)0)->state), "Hasher too small for XXH3_state_t");

static XXH3_state_t *state_of(Hasher *h) { return (XXH3_state_t *)(void *)h->state; }

void hasher_init(Hasher *h) { XXH3_128bits_reset(state_of(h)); }

void hasher_update(Hasher *h, const void *data, size_t n) { XXH3_128bits_update(state_of(h), data, n); }

void hasher_u32(Hasher *h, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    hasher_update(h, b, 4);
}

void hasher_i32s(Hasher *h, const int32_t *v, size_t n) {
    uint8_t buf[1024];
    while (n > 0) {
        size_t k = n < sizeof buf / 4 ? n : sizeof buf / 4;
        for (size_t i = 0; i < k; i++) {
            uint32_t x = (uint32_t)v[i];
            buf[4 * i] = (uint8_t)x;
            buf[4 * i + 1] = (uint8_t)(x >> 8);
            buf[4 * i + 2] = (uint8_t)(x >> 16);
            buf[4 * i + 3] = (uint8_t)(x >> 24);
        }
        hasher_update(h, buf, 4 * k);
        v += k;
        n -= k;
    }
}

static Hash128 from_xxh(XXH128_hash_t x) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, x);
    Hash128 out;
    memcpy(out.b, c.digest, 16);
    return out;
}

Hash128 hasher_final(Hasher *h) { return from_xxh(XXH3_128bits_digest(state_of(h))); }

Hash128 hash128(const void *data, size_t n) { return from_xxh(XXH3_128bits(data, n)); }

bool hash128_eq(const Hash128 *a, const Hash128 *b) { return memcmp(a->b, b->b, 16) == 0; }

void hash128_hex(const Hash128 *h, char out[33]) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[h->b[i] >> 4];
        out[2 * i + 1] = hex[h->b[i] & 15];
    }
    out[32] = '\0';
}

int hash128_file(const char *path, Hash128 *out) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return MN_EIO;
    Hasher h;
    hasher_init(&h);
    unsigned char buf[1 << 16];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) hasher_update(&h, buf, (size_t)n);
    close(fd);
    if (n < 0) return MN_EIO;
    *out = hasher_final(&h);
    return MN_OK;
}
