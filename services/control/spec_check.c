/* Submit-time spec check: the shape checks `refinery run` makes before
 * opening its stages (rf_pipeline_check_spec), then the values of the
 * sections whose parsers have no side effects (ingest, trainer). */
#include "control/spec_check.h"

#include <stdlib.h>

#include "common/config.h"
#include "common/error.h"
#include "ingest/ingest.h"
#include "pipeline/pipeline.h"
#include "trainer/spec.h"

/* Conversations (preset sft, `chat:`) are refused here: the services'
 * Document and TokenSequence messages carry no chat messages or loss mask
 * yet, so the run would silently train on the joined text. */
static int check_ingest(const rf_cfg *section) {
    rf_ingest_opts o;
    rf_ingest_opts_default(&o);
    int rc = rf_ingest_opts_from_cfg(section, &o);
    if (!rc && (o.conversations || o.chat_user))
        rc = rf_fail(RF_ERR_INVALID,
                     "%s: conversations (preset sft, chat:) run embedded only (refinery run): "
                     "the services' messages carry no chat messages or loss mask yet",
                     rf_cfg_path(section));
    rf_ingest_opts_free(&o);
    const char **inputs = NULL;
    size_t n;
    if (!rc && rf_cfg_get(section, "inputs")) rc = rf_cfg_strlist(section, "inputs", &inputs, &n);
    free(inputs);
    return rc;
}

/* The trainer service falls back to its --model when the spec names none, so
 * a missing trainer.model is filled in (in this private tree) before parsing. */
static int check_trainer(rf_cfg *spec, const rf_cfg *section) {
    if (!rf_cfg_get(section, "model")) {
        int rc = rf_cfg_set(spec, "trainer.model", "service-default");
        if (rc) return rc;
    }
    rf_trainer_spec s;
    return rf_trainer_spec_parse(rf_cfg_get(spec, "trainer"), &s);
}

int rf_spec_check(const char *yaml, size_t len, const char *name) {
    rf_cfg *spec;
    int rc = rf_cfg_load_string(yaml, len, name, &spec);
    if (rc) return rc;
    rc = rf_pipeline_check_spec(spec, NULL);
    const rf_cfg *ingest = rf_cfg_get(spec, "ingest"), *trainer = rf_cfg_get(spec, "trainer");
    if (!rc && ingest && rf_cfg_kind_of(ingest) == RF_CFG_MAP) rc = check_ingest(ingest);
    if (!rc && trainer && rf_cfg_kind_of(trainer) == RF_CFG_MAP) rc = check_trainer(spec, trainer);
    rf_cfg_free(spec);
    return rc;
}
