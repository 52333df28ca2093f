/* GPT-2 and Llama as rf_models (model_iface.h). */
#include "common/error.h"
#include "trainer/model_iface.h"

int rf_model_load_causal(const char *dir, const char *arch, const rf_backend *be, rf_model *m);

int rf_model_load_causal(const char *dir, const char *arch, const rf_backend *be, rf_model *m) {
    (void)be;
    (void)m;
    return rf_fail(RF_ERR_UNSUPPORTED, "%s: %s models are not trainable yet", dir, arch);
}
