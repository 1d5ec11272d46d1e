/* hash.h — 128-bit content hashes (XXH3-128, libxxhash).
 *
 * A Hash128 is kept as its 16 canonical bytes (XXH128_canonical_t: the high
 * 64 bits first, each big-endian), so hashes compare with memcmp and are fed
 * into other hashes in a byte order that is the same on every machine.
 */
#ifndef MN_HASH_H
#define MN_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Hash128 {
    uint8_t b[16];
} Hash128;

/* Incremental hashing; a Hasher lives on the caller's stack. */
typedef struct Hasher {
    _Alignas(64) unsigned char state[640]; /* an XXH3_state_t (576 bytes in xxhash 0.8) */
} Hasher;

void hasher_init(Hasher *h);
void hasher_update(Hasher *h, const void *data, size_t n);
void hasher_u32(Hasher *h, uint32_t v); /* little-endian */
/* v[0..n) as n calls of hasher_u32 would hash them (the same hash),
 * a kilobyte at a time. */
void hasher_i32s(Hasher *h, const int32_t *v, size_t n);
Hash128 hasher_final(Hasher *h);

Hash128 hash128(const void *data, size_t n);
bool hash128_eq(const Hash128 *a, const Hash128 *b);
/* Lower-case hex, 32 characters + NUL. */
void hash128_hex(const Hash128 *h, char out[33]);

/* The hash of a whole file's contents (read in pieces, nothing allocated).
 * MN_OK, or MN_EIO when it cannot be opened or read (*out zeroed). */
int hash128_file(const char *path, Hash128 *out);

#endif
