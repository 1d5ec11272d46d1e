/* dqcheck.c — mnemo's dequantization against ggml's, bit for bit.
 *
 *   dqcheck FILE.gguf...
 *
 * For every quantized tensor of each file, dequantizes every row with
 * ggml's own to_float (libggml-base of the peer build) and with mnemo's
 * ttype_dequantize_row (src/base/ttype.c, compiled in), and counts the
 * values whose bits differ. Prints one line per file; exits 1 when any
 * tensor differs, 2 when a file cannot be read. Built and run by
 * scripts/peer-check; not part of mnemo's build.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ttype.h"
#include "ggml.h"
#include "gguf.h"

/* Mismatching values of one tensor (data: its bytes), the first reported. */
static long check_tensor(const char *file, const char *name, enum ggml_type type, const unsigned char *data,
                         int64_t ne0, int64_t n_rows) {
    size_t row_bytes = ggml_row_size(type, ne0);
    float *want = malloc((size_t)ne0 * sizeof(float)), *got = malloc((size_t)ne0 * sizeof(float));
    long bad = 0;
    for (int64_t r = 0; r < n_rows; r++) {
        ggml_get_type_traits(type)->to_float(data + (size_t)r * row_bytes, want, ne0);
        ttype_dequantize_row((MnType)type, data + (size_t)r * row_bytes, got, ne0);
        for (int64_t k = 0; k < ne0; k++) {
            if (memcmp(&want[k], &got[k], sizeof(float)) == 0) continue;
            if (bad++ == 0)
                fprintf(stderr, "%s: %s row %lld element %lld: ggml %.9g, mnemo %.9g\n", file, name, (long long)r,
                        (long long)k, want[k], got[k]);
        }
    }
    free(got);
    free(want);
    return bad;
}

static int check_file(const char *path) {
    struct ggml_context *ctx = NULL;
    struct gguf_init_params params = {.no_alloc = true, .ctx = &ctx};
    struct gguf_context *g = gguf_init_from_file(path, params);
    FILE *f = fopen(path, "rb");
    if (g == NULL || f == NULL) {
        fprintf(stderr, "dqcheck: cannot read %s\n", path);
        return 2;
    }
    long n_values = 0;
    int n_bad = 0, rc = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(g) && rc == 0; i++) {
        const char *name = gguf_get_tensor_name(g, i);
        enum ggml_type type = gguf_get_tensor_type(g, i);
        if (!ggml_is_quantized(type)) continue;
        if (ttype_traits((uint32_t)type) == NULL) {
            fprintf(stderr, "%s: %s is %s, which mnemo does not load\n", path, name, ggml_type_name(type));
            n_bad++;
            continue;
        }
        const struct ggml_tensor *t = ggml_get_tensor(ctx, name);
        size_t n_bytes = gguf_get_tensor_size(g, i);
        unsigned char *data = malloc(n_bytes);
        if (data == NULL || fseek(f, (long)(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i)), SEEK_SET) != 0 ||
            fread(data, 1, n_bytes, f) != n_bytes) {
            fprintf(stderr, "dqcheck: %s: cannot read tensor %s\n", path, name);
            rc = 2;
        } else {
            long bad = check_tensor(path, name, type, data, t->ne[0], ggml_nrows(t));
            if (bad) {
                fprintf(stderr, "%s: %s (%s): %ld of %lld values differ\n", path, name, ggml_type_name(type), bad,
                        (long long)ggml_nelements(t));
                n_bad++;
            }
            n_values += (long)ggml_nelements(t);
        }
        free(data);
    }
    printf("%s: %ld quantized values compared, %d tensors differ\n", path, n_values, n_bad);
    fclose(f);
    gguf_free(g);
    ggml_free(ctx);
    return rc ? rc : n_bad ? 1 : 0;
}

int main(int argc, char **argv) {
    int rc = 0;
    for (int a = 1; a < argc; a++) {
        int r = check_file(argv[a]);
        if (r > rc) rc = r;
    }
    return rc;
}
