/* refinery values SPEC.yaml: each stage's resources: as Helm values for the
 * chart (charts/refinery/values.yaml: <service>.resources). */
#include <stdio.h>
#include <string.h>

#include "cli/command.h"
#include "common/config.h"
#include "common/error.h"
#include "pipeline/pipeline.h"
#include "pipeline/resources.h"
#include "pipeline/stages.h"

static int cmd_values(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: refinery values SPEC.yaml\n"
                "Prints Helm values for charts/refinery with the resources: of each stage of\n"
                "SPEC.yaml as its service's requests and limits (cpu, memory, nvidia.com/gpu).\n");
        return argc == 2 ? 0 : 2;
    }
    rf_cfg *spec = NULL;
    int rc = rf_cfg_load_file(argv[1], &spec);
    if (!rc) rc = rf_cfg_apply_env(spec);
    if (!rc) rc = rf_pipeline_check_spec(spec, NULL);
    if (!rc) {
        const rf_stage_table *t = rf_pipeline_schema();
        const char *names[16];
        size_t n = 0;
        for (size_t i = 0; i < t->n && n < 16; i++)
            names[n++] = t->stages[i]->name;
        rc = rf_resources_values(spec, names, n, stdout);
    }
    rf_cfg_free(spec);
    if (rc) {
        fprintf(stderr, "refinery values: %s\n", rf_errmsg()[0] ? rf_errmsg() : rf_err_name(rc));
        return 2;
    }
    return 0;
}

static const rf_command values_cmd = {"values", "print a spec's resources as Helm values",
                                      cmd_values};
RF_COMMAND(values_cmd)
