/* libFuzzer target: the safetensors parser and float conversion on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    rf_st_file *f;
    if (rf_st_parse(buf, size, &f) != 0) return 0;
    for (size_t i = 0; i < f->n; i++) {
        const rf_st_tensor *t = &f->tensors[i];
        if (t->numel > (1u << 20)) continue;
        float *x = malloc(t->numel * sizeof(float) + 1);
        if (x) rf_st_to_f32(t, x);
        free(x);
    }
    rf_st_free(f);
    return 0;
}
