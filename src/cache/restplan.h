/* restplan.h — the restore planner's arithmetic: how long a restore takes
 * whose layers arrive one after another, some as hidden states that are
 * projected into K/V as they come, and which layers a saved run keeps as
 * hidden states so that its restore ends soonest (HCache's bubble-free
 * split of L_H projected and L_O loaded layers; docs/DESIGN.md,
 * "Hidden-state restore").
 *
 * The model of a restore: the mover reads layer 0, then 1, ... of every
 * block of the load; a layer that came as hidden states is projected by
 * one thread once it has arrived and the projection before it is done;
 * the restore is over when the last read and the last projection are.
 * So projections overlap the reads of later layers, but the first one
 * waits for its layer's read (the bubble at the start). Hidden layers go
 * first, then, and how many is where reads and projections end together.
 *
 * Pure functions of their arguments (no state, any thread): the engine
 * passes in the live figures — each tier's measured read bandwidth and the
 * measured projection time.
 */
#ifndef MN_RESTPLAN_H
#define MN_RESTPLAN_H

#include <stdint.h>

/* A restore's progress through its layers (zero it to start). */
typedef struct RestPipe {
    double read_end; /* when the layers so far have been read */
    double proj_end; /* when their projections are done (0: none) */
} RestPipe;

/* The next layer takes read_s to read and project_s to project (0: it
 * comes as K/V). */
void restplan_layer(RestPipe *p, double read_s, double project_s);
/* Seconds from the start until the layers given so far are in place. */
double restplan_end(const RestPipe *p);

/* Per-layer figures of a run, for one token (they scale with its length,
 * which therefore does not change the split). */
typedef struct RestFigures {
    double kv_read_s;     /* to read a layer's K/V */
    double hidden_read_s; /* to read its hidden states */
    double project_s;     /* to project them into K/V */
} RestFigures;

/* Seconds a restore of n_layer layers takes when the layers in hidden
 * (bit l: layer l; the first 64 only) come as hidden states. */
double restplan_time(const RestFigures *f, int n_layer, uint64_t hidden);

/* Of the layers in eligible (bit l: layer l may be stored as hidden
 * states), the ones to store so: the first h of them, the h whose restore
 * (restplan_time) ends soonest; of equal times, the most when hidden
 * states are smaller than K/V (the smaller run), else the fewest. h = 0,
 * every layer K/V, is a candidate: the split is never slower than K/V
 * alone by this model. */
uint64_t restplan_split(const RestFigures *f, int n_layer, uint64_t eligible);

/* restplan_split when the projections run on the cores the restoring
 * pass computes on (a CPU engine): the model's overlap of projections
 * with later reads is then not free — a projection takes the threads the
 * pass needs, and a K/V read overlaps the pass's own compute — so no layer
 * is stored as hidden states unless reading and projecting it takes less
 * than reading its K/V (hidden_read_s + project_s < kv_read_s: it pays
 * with no overlap at all); when it does, restplan_split's. */
uint64_t restplan_split_shared(const RestFigures *f, int n_layer, uint64_t eligible);

#endif
