/* rng.c — xoshiro256** and splitmix64 (see rng.h).
 *
 * The generators are Blackman and Vigna's published algorithms, written
 * from their definitions; the constants are theirs. splitmix64's outputs
 * are never all zero for four consecutive calls, so a seeded state is
 * never the one state xoshiro cannot leave.
 */
#include "base/rng.h"

#include <math.h>

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull);
    for (int i = 0; i < 4; i++) r->s[i] = rng_splitmix64(&x);
}

uint64_t rng_next(Rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return out;
}

double rng_unit(Rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

uint64_t rng_below(Rng *r, uint64_t n) { return n ? rng_next(r) % n : 0; }

double rng_exp(Rng *r, double mean) { return mean > 0 ? -mean * log1p(-rng_unit(r)) : 0; }

double rng_normal(Rng *r) {
    double u = 1.0 - rng_unit(r), v = rng_unit(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

double rng_lognormal(Rng *r, double mean, double sigma) {
    return exp(log(mean) - 0.5 * sigma * sigma + sigma * rng_normal(r));
}

int rng_geometric(Rng *r, double mean) {
    if (mean <= 1.0) return 1;
    double k = floor(log1p(-rng_unit(r)) / log1p(-1.0 / mean));
    return k > 1e6 ? 1000001 : 1 + (int)k;
}
