/* libFuzzer target: YAML spec loading and the typed getters. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rf_cfg *c = NULL;
    if (rf_cfg_load_string((const char *)data, size, "fuzz.yaml", &c) == 0) {
        static const char *const keys[] = {"run", "ingest", NULL};
        rf_cfg_check_keys(c, keys);
        int64_t i;
        double r;
        bool b;
        const char **list;
        size_t n;
        rf_cfg_int(c, "run.threads", 1, 1, 64, &i);
        rf_cfg_real(c, "ingest.ratio", 0, 0, 1, &r);
        rf_cfg_bool(c, "ingest.lowercase", false, &b);
        if (rf_cfg_strlist(c, "ingest.inputs", &list, &n) == 0) free(list);
        rf_cfg_set(c, "ingest.threads", "4");
        rf_cfg_free(c);
    }
    return 0;
}
