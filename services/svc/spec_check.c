/* Submit-time spec check: the key and value checks `refinery run` makes
 * before opening its stages (pipeline/pipeline.c: select_stages and the run
 * settings), without creating anything. */
#include "svc/spec_check.h"

#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/error.h"
#include "common/stage.h"
#include "ingest/ingest.h"
#include "trainer/spec.h"

#define MAX_SECTIONS 32

static const char *const run_keys[] = {"name", "out", "threads", "queue_depth", NULL};

static int check_run(const rf_cfg *spec) {
    const char *s;
    int64_t v;
    int rc = rf_cfg_check_keys(rf_cfg_get(spec, "run"), run_keys);
    if (!rc) rc = rf_cfg_str(spec, "run.name", "run", &s);
    if (!rc) rc = rf_cfg_str(spec, "run.out", NULL, &s);
    if (!rc) rc = rf_cfg_int(spec, "run.threads", 1, 1, 1024, &v);
    if (!rc) rc = rf_cfg_int(spec, "run.queue_depth", 8, 1, 4096, &v);
    return rc;
}

static int check_ingest(const rf_cfg *section) {
    rf_ingest_opts o;
    rf_ingest_opts_default(&o);
    int rc = rf_ingest_opts_from_cfg(section, &o);
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

/* A stage section is a mapping of its keys (an empty section is a ""
 * scalar, as in the runner); known parsers check the values. */
static int check_section(rf_cfg *spec, const rf_stage_ops *ops, const rf_cfg *section) {
    rf_cfg_kind kind = rf_cfg_kind_of(section);
    if (kind == RF_CFG_SEQ || (kind == RF_CFG_SCALAR && rf_cfg_scalar(section)[0]))
        return rf_fail(RF_ERR_INVALID, "%s:%d: %s: expected a mapping of settings",
                       rf_cfg_source(section), rf_cfg_line(section), ops->name);
    if (kind != RF_CFG_MAP) return RF_OK;
    int rc = ops->keys ? rf_cfg_check_keys(section, ops->keys) : RF_OK;
    if (rc) return rc;
    if (!strcmp(ops->name, "ingest")) return check_ingest(section);
    if (!strcmp(ops->name, "trainer")) return check_trainer(spec, section);
    return RF_OK;
}

int rf_spec_check(const char *yaml, size_t len, const char *name) {
    rf_cfg *spec;
    int rc = rf_cfg_load_string(yaml, len, name, &spec);
    if (rc) return rc;
    size_t n;
    const rf_stage_ops *const *stages = rf_stage_list(&n);
    const char *known[MAX_SECTIONS + 2];
    size_t k = 0;
    known[k++] = "run";
    for (size_t i = 0; i < n && k <= MAX_SECTIONS; i++)
        known[k++] = stages[i]->name;
    known[k] = NULL;
    rc = rf_cfg_check_keys(spec, known);
    if (!rc) rc = check_run(spec);
    for (size_t i = 0; i < n && !rc; i++) {
        const rf_cfg *section = rf_cfg_get(spec, stages[i]->name);
        if (section) rc = check_section(spec, stages[i], section);
    }
    rf_cfg_free(spec);
    return rc;
}
