/* libFuzzer target: the spec check Control.Submit runs on YAML from the
 * network (control/spec_check.h): any bytes give 0 or an error with a message,
 * never a crash or a leak. */
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "control/spec_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int rc = rf_spec_check((const char *)data, size, "spec");
    if (rc < 0 && !rf_errmsg()[0]) __builtin_trap(); /* every refusal says why */
    return 0;
}
