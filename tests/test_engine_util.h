/* test_engine_util.h — helpers for the tests that drive an Engine in
 * process (header-only; each test is one .c). */
#ifndef MN_TEST_ENGINE_UTIL_H
#define MN_TEST_ENGINE_UTIL_H

#include "test_util.h"

#include "engine/engine.h"

/* Read r to its end and drop the caller's reference: its text (malloc'd)
 * and result into *res. */
static inline char *test_request_finish(Request *r, ReqResult *res) {
    char *all = strdup("");
    for (;;) {
        ReqOutput o;
        assert_int_equal(request_read(r, &o, 1000), MN_OK);
        size_t n = strlen(all);
        all = realloc(all, n + o.len + 1);
        memcpy(all + n, o.text, o.len);
        all[n + o.len] = '\0';
        bool is_done = o.is_done;
        if (is_done) *res = o.res;
        request_output_deinit(&o);
        if (is_done) break;
    }
    request_unref(r);
    return all;
}

#endif
