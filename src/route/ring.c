/* ring.c — the hash ring (see ring.h).
 *
 * The points are one sorted array of (position, node); a key's preference
 * list is a binary search for the first position at or after the key and
 * a walk clockwise, wrapping at the end, until every node was met. Two
 * points at one position (a 64-bit collision) are ordered by node, so the
 * order never depends on the names' order in memory. A point's position
 * is XXH3 of "NAME#j", j in decimal.
 */
#include "route/ring.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/mem.h"

typedef struct Point {
    uint64_t pos;
    int node;
} Point;

struct Ring {
    int n_nodes;
    Point *points; /* (n_nodes * n_vnodes) sorted by pos, then node */
    size_t n_points;
};

/* ---- building ---------------------------------------------------------------------- */

uint64_t ring_hash(const void *data, size_t n) {
    Hash128 h = hash128(data, n);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | h.b[i];
    return v;
}

static int point_cmp(const void *a, const void *b) {
    const Point *p = a, *q = b;
    if (p->pos != q->pos) return p->pos < q->pos ? -1 : 1;
    return (p->node > q->node) - (p->node < q->node);
}

int ring_new(const char *const *names, int n_nodes, int n_vnodes, Ring **out) {
    *out = NULL;
    if (n_nodes < 1 || n_nodes > RING_MAX_NODES || n_vnodes < 1) return MN_EINVAL;
    Ring *r = mn_calloc(1, sizeof *r);
    if (r == NULL) return MN_ENOMEM;
    r->n_nodes = n_nodes;
    r->n_points = (size_t)n_nodes * (size_t)n_vnodes; /* both ints: fits size_t */
    r->points = mn_calloc(r->n_points, sizeof *r->points);
    if (r->points == NULL) {
        ring_free(r);
        return MN_ENOMEM;
    }
    size_t k = 0;
    for (int i = 0; i < n_nodes; i++) {
        size_t len = strlen(names[i]);
        char *buf = mn_malloc(len + 16);
        if (buf == NULL) {
            ring_free(r);
            return MN_ENOMEM;
        }
        for (int j = 0; j < n_vnodes; j++) {
            int n = snprintf(buf, len + 16, "%s#%d", names[i], j);
            r->points[k++] = (Point){ring_hash(buf, (size_t)n), i};
        }
        mn_free(buf);
    }
    qsort(r->points, r->n_points, sizeof *r->points, point_cmp);
    *out = r;
    return MN_OK;
}

void ring_free(Ring *r) {
    if (r == NULL) return;
    mn_free(r->points);
    mn_free(r);
}

int ring_n_nodes(const Ring *r) { return r->n_nodes; }

/* ---- lookups ----------------------------------------------------------------------- */

/* The index of the first point at or after key (n_points: wrap to 0). */
static size_t first_at_or_after(const Ring *r, uint64_t key) {
    size_t lo = 0, hi = r->n_points;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->points[mid].pos < key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

void ring_order(const Ring *r, uint64_t key, int *order) {
    bool seen[RING_MAX_NODES] = {false};
    int n = 0;
    size_t i = first_at_or_after(r, key);
    for (size_t step = 0; step < r->n_points && n < r->n_nodes; step++, i++) {
        const Point *p = &r->points[i % r->n_points];
        if (seen[p->node]) continue;
        seen[p->node] = true;
        order[n++] = p->node;
    }
    assert(n == r->n_nodes); /* every node has points */
}

int ring_load_cap(int total, int n_up, double c) {
    if (c <= 0 || n_up <= 0) return INT32_MAX;
    double cap = ceil(c * ((double)total + 1) / n_up);
    /* compared before the conversion: a double past long's range converts to garbage */
    return cap >= INT32_MAX ? INT32_MAX : cap < 1 ? 1 : (int)cap;
}

void ring_plan(const int *order, int n, const bool *is_up, const int *load, double c, int *plan, bool *is_load_skip) {
    int n_up = 0, total = 0;
    for (int i = 0; i < n; i++)
        if (is_up[order[i]]) {
            n_up++;
            total += load[order[i]];
        }
    int cap = ring_load_cap(total, n_up, c), first = -1;
    *is_load_skip = false;
    for (int i = 0; i < n && first < 0; i++) {
        if (!is_up[order[i]]) continue;
        if (load[order[i]] + 1 <= cap) first = i;
        else *is_load_skip = true;
    }
    if (first < 0) { /* nothing fits (only when every up node is at the cap): the ring's own choice */
        *is_load_skip = false;
        for (int i = 0; i < n && first < 0; i++)
            if (is_up[order[i]]) first = i;
    }
    int k = 0;
    if (first >= 0) plan[k++] = order[first];
    for (int i = 0; i < n; i++)
        if (i != first && is_up[order[i]]) plan[k++] = order[i];
    for (int i = 0; i < n; i++)
        if (!is_up[order[i]]) plan[k++] = order[i];
}
