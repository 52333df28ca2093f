/* libFuzzer target: the (run_id, seq) reader of the stage service loop, which
 * runs on every message a stage consumes. Where protobuf-c also decodes the
 * bytes as a DocumentBatch, both must agree. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/kafka/kafka.h"
#include "refinery.pb-c.h"
#include "runtime/stage_loop.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rf_kafka_msg m = {.value = data, .len = size};
    rf_stage_batch_id id;
    int rc = rf_stage_identify_batch(NULL, &m, &id);
    Refinery__V1__DocumentBatch *b = refinery__v1__document_batch__unpack(NULL, size, data);
    if (b) {
        if (rc == 0 && (strcmp(b->run_id, id.run_id) != 0 || b->seq != id.seq)) __builtin_trap();
        refinery__v1__document_batch__free_unpacked(b, NULL);
    }
    return 0;
}
