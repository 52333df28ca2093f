#include "dedup/jaccard.h"

#include <stdlib.h>

static int cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

size_t rf_shset_build(uint32_t *v, size_t n) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_u32);
    size_t m = 1;
    for (size_t i = 1; i < n; i++)
        if (v[i] != v[m - 1]) v[m++] = v[i];
    return m;
}

double rf_shset_jaccard(rf_shset a, rf_shset b, bool *exact) {
    bool complete = a.len == a.total && b.len == b.total;
    *exact = complete;
    /* Walk the union in ascending order; when a set is truncated, only its
     * stored prefix is known, so stop after k = min(len) union elements. */
    size_t k = complete ? (size_t)a.len + b.len : (a.len < b.len ? a.len : b.len);
    size_t i = 0, j = 0, uni = 0, both = 0;
    while (uni < k && (i < a.len || j < b.len)) {
        if (j == b.len || (i < a.len && a.v[i] < b.v[j])) {
            i++;
        } else if (i == a.len || b.v[j] < a.v[i]) {
            j++;
        } else {
            i++, j++, both++;
        }
        uni++;
    }
    return uni ? (double)both / (double)uni : 1.0;
}
