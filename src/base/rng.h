/* rng.h — the project's pseudo-random numbers: xoshiro256** seeded through
 * splitmix64 (Vigna's generators), and the few distributions drawn from it.
 *
 * One algorithm for everything seeded: the sampler's draws, the bench's
 * workloads and the generated models' weights. A seed names a stream for
 * good — the same (seed, stream) gives the same numbers on every machine
 * and every build — so changing anything here changes sampled replies,
 * bench plans and generated models: the tests pin it. Not for secrets.
 *
 * An Rng is a plain value owned by its user (a sampler, a conversation's
 * plan); nothing here is shared or locked.
 */
#ifndef MN_RNG_H
#define MN_RNG_H

#include <stdint.h>

typedef struct Rng {
    uint64_t s[4]; /* xoshiro256** state, never all zero once seeded */
} Rng;

/* One step of splitmix64: advances *x and returns the mixed value. Seeds
 * an Rng, and is a small generator of its own where one word of state is
 * enough (generated weights, tests). */
uint64_t rng_splitmix64(uint64_t *x);

/* Seed r for stream `stream` of seed: its state is four splitmix64 steps
 * from seed ^ stream * 0xd1b54a32d192ed03, so stream 0 starts at the seed
 * itself and different streams of one seed are independent. */
void rng_seed(Rng *r, uint64_t seed, uint64_t stream);

/* The next 64 random bits. */
uint64_t rng_next(Rng *r);

/* Uniform in [0, 1), 53 random bits (one rng_next). */
double rng_unit(Rng *r);

/* Uniform in [0, n) (0 for n == 0), by one rng_next modulo n: a bias
 * below n / 2^64, negligible for the small n it is used with. */
uint64_t rng_below(Rng *r, uint64_t n);

/* Exponential with the given mean (0 when mean <= 0). */
double rng_exp(Rng *r, double mean);

/* Standard normal (Box-Muller, one of the pair: two draws). */
double rng_normal(Rng *r);

/* Lognormal with the given mean: exp(mu + sigma z), mu = ln(mean) - sigma^2/2. */
double rng_lognormal(Rng *r, double mean, double sigma);

/* Geometric on {1, 2, ...} with the given mean (1 when mean <= 1, at most
 * 1000001). */
int rng_geometric(Rng *r, double mean);

#endif
