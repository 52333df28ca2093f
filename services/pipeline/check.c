/* The shape checks of a spec (pipeline.h), apart from the runner: the Control
 * service checks submitted specs with the stages' schema alone, without
 * linking the stages themselves. */
#include <stdint.h>
#include <string.h>

#include "common/config.h"
#include "common/error.h"
#include "pipeline/pipeline.h"
#include "pipeline/resources.h"
#include "pipeline/stages.h"

#define MAX_STAGES 16

static const char *const run_keys[] = {"name",  "out",       "threads",       "queue_depth",
                                       "cache", "cache_dir", "retry_backoff", NULL};

/* A stage's keys and the ones every stage takes (cache, retries, resources). */
static int check_stage_keys(const rf_cfg *section, const char *const *keys) {
    static const char *const generic[] = {"cache", "retries", "resources"};
    const char *all[256];
    size_t n = 0;
    for (; keys[n] && n < 250; n++)
        all[n] = keys[n];
    for (size_t i = 0; i < 3; i++) {
        bool have = false;
        for (size_t j = 0; j < n; j++)
            have = have || !strcmp(all[j], generic[i]);
        if (!have) all[n++] = generic[i];
    }
    all[n] = NULL;
    return rf_cfg_check_keys(section, all);
}

int rf_pipeline_check_spec(const rf_cfg *spec, const rf_stage_table *stages) {
    if (!stages) stages = rf_pipeline_schema();
    size_t n = stages->n;
    const rf_stage_ops *const *all = stages->stages;
    const char *known[MAX_STAGES + 2];
    size_t k = 0;
    known[k++] = "run";
    for (size_t i = 0; i < n && k < MAX_STAGES + 1; i++)
        known[k++] = all[i]->name;
    known[k] = NULL;
    int64_t v;
    const char *str;
    int rc = rf_cfg_check_keys(spec, known);
    if (!rc) rc = rf_cfg_check_keys(rf_cfg_get(spec, "run"), run_keys);
    if (!rc) rc = rf_cfg_str(spec, "run.name", "run", &str);
    if (!rc) rc = rf_cfg_str(spec, "run.out", NULL, &str);
    if (!rc) rc = rf_cfg_int(spec, "run.threads", 1, 1, 1024, &v);
    if (!rc) rc = rf_cfg_int(spec, "run.queue_depth", 8, 1, 4096, &v);
    bool b;
    double d;
    if (!rc) rc = rf_cfg_bool(spec, "run.cache", true, &b);
    if (!rc) rc = rf_cfg_str(spec, "run.cache_dir", NULL, &str);
    if (!rc) rc = rf_cfg_real(spec, "run.retry_backoff", 1.0, 0, 3600, &d);
    size_t sections = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const rf_cfg *section = rf_cfg_get(spec, all[i]->name);
        if (!section) continue;
        sections++;
        rf_cfg_kind kind = rf_cfg_kind_of(section); /* an empty section is a "" scalar */
        if (kind == RF_CFG_SEQ || (kind == RF_CFG_SCALAR && rf_cfg_scalar(section)[0]))
            return rf_fail(RF_ERR_INVALID, "%s:%d: %s: expected a mapping of settings",
                           rf_cfg_source(section), rf_cfg_line(section), all[i]->name);
        if (all[i]->keys && kind == RF_CFG_MAP) rc = check_stage_keys(section, all[i]->keys);
        if (!rc && kind == RF_CFG_MAP) { /* the keys every stage takes */
            rf_resources res;
            rc = rf_cfg_bool(section, "cache", true, &b);
            if (!rc) rc = rf_cfg_int(section, "retries", 0, 0, 100, &v);
            if (!rc) rc = rf_resources_parse(section, &res);
        }
    }
    if (!rc && sections == 0)
        rc = rf_fail(RF_ERR_INVALID, "%s: no stage sections (expected some of: %s%s%s%s%s)",
                     rf_cfg_source(spec), n > 0 ? all[0]->name : "", n > 1 ? ", " : "",
                     n > 1 ? all[1]->name : "", n > 2 ? ", " : "", n > 2 ? "..." : "");
    return rc;
}
