/* mrefcmp.c — how far two MREF logit files (same tokens) are apart.
 *
 *   mrefcmp A.ref B.ref
 *
 * Prints the largest |difference| over the last position's full vector and
 * over the ids both files list among a position's top 16, and at how many
 * positions the two agree on the top token. Exits 1 when the tokens differ,
 * 2 when a file cannot be read. Built by scripts/peer-check with mnemo's
 * engine/mref.c; not part of mnemo's build.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "engine/mref.h"

int main(int argc, char **argv) {
    Mref a, b;
    MnErr err = {0};
    if (argc != 3 || mref_read(argv[1], &a, &err) != MN_OK || mref_read(argv[2], &b, &err) != MN_OK) {
        fprintf(stderr, "mrefcmp A.ref B.ref: %s\n", err.msg);
        return 2;
    }
    if (a.n_tokens != b.n_tokens || a.n_vocab != b.n_vocab ||
        memcmp(a.tokens, b.tokens, sizeof(int32_t) * (size_t)a.n_tokens) != 0) {
        fprintf(stderr, "mrefcmp: the files are of different tokens\n");
        return 1;
    }
    double max_last = 0, max_top = 0;
    for (int v = 0; v < a.n_vocab; v++) max_last = fmax(max_last, fabs((double)a.last[v] - b.last[v]));
    int agree = 0;
    for (int i = 0; i < a.n_tokens; i++) {
        const int32_t *ia = a.ids + (size_t)i * a.k, *ib = b.ids + (size_t)i * b.k;
        const float *va = a.vals + (size_t)i * a.k, *vb = b.vals + (size_t)i * b.k;
        agree += ia[0] == ib[0];
        for (int j = 0; j < a.k; j++)
            for (int l = 0; l < b.k; l++)
                if (ia[j] == ib[l]) max_top = fmax(max_top, fabs((double)va[j] - vb[l]));
    }
    printf("%d tokens: max |diff| %.3g (last position, all logits), %.3g (top 16); top token agrees at %d/%d\n",
           a.n_tokens, max_last, max_top, agree, a.n_tokens);
    mref_free(&a);
    mref_free(&b);
    return 0;
}
