/* refinery report RUN_DIR: (re)writes RUN_DIR/report.html from the files the
 * stages left in the run directory (services/report/report.h). */
#include <stdio.h>
#include <string.h>

#include "cli/command.h"
#include "common/error.h"
#include "report/report.h"

static int cmd_report(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: refinery report RUN_DIR\n"
               "Writes RUN_DIR/report.html: one self-contained page (inline SVG charts, no\n"
               "scripts, no network) with the spec and cache decisions, the documents through\n"
               "the stages, rejects by reason with examples, duplicate clusters, token lengths\n"
               "and padding, the training curves, throughput and the evaluation.\n");
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: refinery report RUN_DIR\n");
        return 2;
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/stats.json", argv[1]);
    FILE *f = fopen(p, "r");
    if (!f) {
        fprintf(stderr, "refinery report: %s is not a run directory (no stats.json)\n", argv[1]);
        return 2;
    }
    fclose(f);
    int rc = rf_report_write(argv[1]);
    if (rc) {
        fprintf(stderr, "refinery report: %s\n", rf_errmsg()[0] ? rf_errmsg() : rf_err_name(rc));
        return 1;
    }
    printf("%s/report.html\n", argv[1]);
    return 0;
}

static const rf_command report_cmd = {"report", "write a run directory's report.html", cmd_report};
RF_COMMAND(report_cmd)
