/* Builds the per-code-point flag table from the generated range tables. */
#include <pthread.h>

#include "tokenizer/unicode_tables.h"

const uint16_t *rf_tok_cp_flags;
/* Static storage (zero pages until written), so no allocation can fail and
 * nothing needs freeing at exit. */
static uint16_t flags_table[0x110000];
static pthread_once_t flags_once = PTHREAD_ONCE_INIT;

static void build_flags(void) {
    for (size_t t = 0; t < rf_tok_class_table_count; t++) {
        const rf_cp_class_table *ct = &rf_tok_class_tables[t];
        for (size_t i = 0; i < ct->n; i++)
            for (uint32_t c = ct->ranges[i].lo; c <= ct->ranges[i].hi; c++)
                flags_table[c] |= ct->flag;
    }
    for (size_t i = 0; i < rf_tok_lower_single_count; i++)
        flags_table[rf_tok_lower_single[i].cp] |= RF_CP_HAS_LOWER;
    for (size_t i = 0; i < rf_tok_lower_multi_count; i++)
        flags_table[rf_tok_lower_multi[i].cp] |= RF_CP_HAS_LOWER;
    rf_tok_cp_flags = flags_table;
}

void rf_tok_unicode_init(void) {
    pthread_once(&flags_once, build_flags);
}

int rf_tok_lower(uint32_t cp, uint32_t out[3]) {
    if (!(rf_tok_cp_class(cp) & RF_CP_HAS_LOWER)) {
        out[0] = cp;
        return 1;
    }
    size_t lo = 0, hi = rf_tok_lower_single_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (rf_tok_lower_single[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < rf_tok_lower_single_count && rf_tok_lower_single[lo].cp == cp) {
        out[0] = rf_tok_lower_single[lo].to;
        return 1;
    }
    for (size_t i = 0; i < rf_tok_lower_multi_count; i++) {
        if (rf_tok_lower_multi[i].cp == cp) {
            for (uint32_t k = 0; k < rf_tok_lower_multi[i].n; k++)
                out[k] = rf_tok_lower_multi[i].to[k];
            return (int)rf_tok_lower_multi[i].n;
        }
    }
    out[0] = cp;
    return 1;
}
