/* ring.h — consistent hashing with virtual nodes and bounded loads: which
 * backend a conversation goes to, and which next when that one cannot.
 *
 * A Ring places n_vnodes points per node on a 64-bit circle, point j of a
 * node at the hash of its name and j. A key's preference list is the nodes
 * in the order the circle meets them going clockwise from the key's hash,
 * each node once. Adding or removing a node moves only the keys whose
 * first point belonged to it (about 1/n of them), and the many points per
 * node even out the shares.
 *
 * ring_plan turns a preference list into the order a request tries the
 * nodes in: the first node that is up and not overloaded, then the other
 * nodes that are up in list order, then the nodes that are down (a last
 * resort, when every node that is up failed). "Overloaded" is consistent
 * hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018):
 * a node may hold at most ceil(c * (m + 1) / n_up) requests in flight, m
 * being the requests in flight on all nodes, this one included by the +1.
 * With c = 1.25 no node holds more than a quarter above the mean, and a
 * conversation leaves its node only while that node is that far ahead.
 *
 * Immutable after ring_new: any thread may read a Ring; ring_plan is pure.
 */
#ifndef MN_RING_H
#define MN_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* Points per node: enough that two to a few dozen nodes get shares
 * within a few percent of equal. */
#define RING_VNODES 160

/* Nodes at most (the command line's backends). */
#define RING_MAX_NODES 64

typedef struct Ring Ring;

/* A ring of names[0..n_nodes), each with n_vnodes points (the names are
 * not kept). MN_OK and *out; MN_EINVAL when n_nodes is not in
 * 1..RING_MAX_NODES or n_vnodes < 1; MN_ENOMEM. */
int ring_new(const char *const *names, int n_nodes, int n_vnodes, Ring **out);
void ring_free(Ring *r);
int ring_n_nodes(const Ring *r);

/* The 64-bit hash keys are placed by (XXH3 of the bytes). */
uint64_t ring_hash(const void *data, size_t n);

/* order[0..ring_n_nodes(r)): every node once, clockwise from key. */
void ring_order(const Ring *r, uint64_t key, int *order);

/* The most requests in flight one of n_up nodes may hold (this request
 * included) when total are in flight on all of them: ceil(c * (total + 1)
 * / n_up), at least 1. c <= 0: no bound (INT32_MAX). */
int ring_load_cap(int total, int n_up, double c);

/* The order to try nodes in for one request, from the preference list
 * order[0..n) (each node once): plan[0] the first node of order that is
 * up and whose load[node] + 1 fits ring_load_cap (c as there; the first up
 * node when none fits), then the other up nodes in order, then the nodes
 * that are down in order. *is_load_skip tells whether an up node before
 * plan[0] was passed over for its load. is_up and load are indexed by
 * node; plan has room for n. */
void ring_plan(const int *order, int n, const bool *is_up, const int *load, double c, int *plan, bool *is_load_skip);

#endif
