/* restplan.c — the restore planner's arithmetic (see restplan.h). */
#include "cache/restplan.h"

#include <stdbool.h>

#include "cache/kv_pool.h"

void restplan_layer(RestPipe *p, double read_s, double project_s) {
    p->read_end += read_s;
    if (project_s > 0) p->proj_end = (p->proj_end > p->read_end ? p->proj_end : p->read_end) + project_s;
}

double restplan_end(const RestPipe *p) { return p->read_end > p->proj_end ? p->read_end : p->proj_end; }

double restplan_time(const RestFigures *f, int n_layer, uint64_t hidden) {
    RestPipe p = {0};
    for (int l = 0; l < n_layer; l++) {
        bool is_hidden = kvpool_layer_in(hidden, l);
        restplan_layer(&p, is_hidden ? f->hidden_read_s : f->kv_read_s, is_hidden ? f->project_s : 0);
    }
    return restplan_end(&p);
}

uint64_t restplan_split(const RestFigures *f, int n_layer, uint64_t eligible) {
    eligible &= kvpool_layers_below(n_layer);
    const bool more_on_ties = f->hidden_read_s < f->kv_read_s;
    uint64_t best = 0, mask = 0, left = eligible;
    double best_s = restplan_time(f, n_layer, 0);
    while (left != 0) { /* mask: the first h eligible layers, h = 1, 2, ... */
        mask |= left & (~left + 1);
        left &= left - 1;
        double s = restplan_time(f, n_layer, mask);
        if (s < best_s || (s == best_s && more_on_ties)) {
            best = mask;
            best_s = s;
        }
    }
    return best;
}

uint64_t restplan_split_shared(const RestFigures *f, int n_layer, uint64_t eligible) {
    if (!(f->hidden_read_s + f->project_s < f->kv_read_s)) return 0;
    return restplan_split(f, n_layer, eligible);
}
