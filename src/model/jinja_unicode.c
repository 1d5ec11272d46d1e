/* jinja_unicode.c — lookups in the generated Unicode tables.
 *
 * The data (jinja_unicode_data.h) is sorted, non-overlapping ranges, so
 * each lookup is a binary search. Case mappings are runs {lo, hi, stride,
 * delta}: every stride-th code point from lo to hi maps to itself + delta;
 * mappings to several characters are listed apart as UTF-8 strings.
 */
#include "model/jinja_unicode.h"

#include <string.h>

#include "base/utf8.h"

typedef struct JuRange {
    uint32_t lo, hi;
} JuRange;

typedef struct JuCaseRun {
    uint32_t lo, hi;
    uint32_t stride;
    int32_t delta;
} JuCaseRun;

typedef struct JuCaseMulti {
    uint32_t cp;
    const char *utf8;
} JuCaseMulti;

#include "model/jinja_unicode_data.h"

#define JU_COUNT(a) (sizeof(a) / sizeof((a)[0]))

static bool in_ranges(const JuRange *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

#define JU_PRED(fn, table) \
    bool fn(uint32_t cp) { return in_ranges(table, JU_COUNT(table), cp); }

JU_PRED(ju_is_space, ju_space)
JU_PRED(ju_is_cased, ju_cased)
JU_PRED(ju_is_case_ignorable, ju_case_ignorable)
JU_PRED(ju_is_lower, ju_lower)
JU_PRED(ju_is_upper, ju_upper)
JU_PRED(ju_is_title, ju_title)
JU_PRED(ju_is_alpha, ju_alpha)
JU_PRED(ju_is_decimal, ju_decimal)
JU_PRED(ju_is_digit, ju_digit)
JU_PRED(ju_is_numeric, ju_numeric)

bool ju_is_printable(uint32_t cp) {
    if (cp >= 0x20 && cp < 0x7F) return true; /* the common case, without a search */
    return !in_ranges(ju_unprintable, JU_COUNT(ju_unprintable), cp);
}

static size_t map_with(const JuCaseRun *runs, size_t n_runs, const JuCaseMulti *multi, size_t n_multi,
                       uint32_t cp, char out[JU_MAP_MAX]) {
    size_t lo = 0, hi = n_multi;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < multi[mid].cp) hi = mid;
        else if (cp > multi[mid].cp) lo = mid + 1;
        else {
            size_t n = strlen(multi[mid].utf8);
            memcpy(out, multi[mid].utf8, n);
            return n;
        }
    }
    lo = 0, hi = n_runs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < runs[mid].lo) hi = mid;
        else if (cp > runs[mid].hi) lo = mid + 1;
        else {
            if ((cp - runs[mid].lo) % runs[mid].stride == 0) cp = (uint32_t)((int64_t)cp + runs[mid].delta);
            break;
        }
    }
    return utf8_encode(cp, out);
}

size_t ju_map(JuCase which, uint32_t cp, char out[JU_MAP_MAX]) {
    switch (which) {
    case JU_UPPER:
        return map_with(ju_upper_map_runs, JU_COUNT(ju_upper_map_runs), ju_upper_map_multi,
                        JU_COUNT(ju_upper_map_multi), cp, out);
    case JU_LOWER:
        return map_with(ju_lower_map_runs, JU_COUNT(ju_lower_map_runs), ju_lower_map_multi,
                        JU_COUNT(ju_lower_map_multi), cp, out);
    case JU_TITLE:
        break;
    }
    return map_with(ju_title_map_runs, JU_COUNT(ju_title_map_runs), ju_title_map_multi, JU_COUNT(ju_title_map_multi),
                    cp, out);
}
