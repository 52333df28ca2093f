/* refinery run SPEC.yaml [--out DIR]: the whole pipeline in one process. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/command.h"
#include "comm/comm.h"
#include "common/error.h"
#include "common/log.h"
#include "common/obs.h"
#include "pipeline/pipeline.h"
#include "report/report.h"
#include "runtime/metrics_http.h"

static volatile int run_cancel;

static void on_signal(int sig) {
    (void)sig;
    run_cancel = 1;
}

static void run_usage(FILE *out) {
    fprintf(out, "usage: refinery run SPEC.yaml [--out DIR] [--no-cache] [--no-progress]\n"
                 "                    [--progress-every SECONDS] [--metrics-port N\n"
                 "                    [--metrics-linger S]]\n"
                 "Runs every stage named in SPEC.yaml in one process and writes the stage\n"
                 "outputs, stats.json and run.log into the run directory (default\n"
                 "runs/<run.name>-<time>), with spec.yaml and report.html (refinery report).\n"
                 "REFINERY__SECTION__KEY=value overrides a spec key.\n"
                 "A stage whose inputs, settings and code are unchanged is reused from the cache\n"
                 "(run.cache_dir, default $XDG_CACHE_HOME/refinery or ~/.cache/refinery) and\n"
                 "reported as cached; --no-cache (or run.cache: false, or a stage's cache: false)\n"
                 "runs without it. Progress: bars on a terminal, else a log line a running stage\n"
                 "every --progress-every seconds (default 10; 0: none).\n"
                 "--metrics-port N serves Prometheus metrics at http://0.0.0.0:N/metrics\n"
                 "while the run lasts (the services' metric names; 0: a free port, logged),\n"
                 "and --metrics-linger S seconds after it (so that a scraper sees the final\n"
                 "values; SIGINT/SIGTERM ends the wait).\n");
}

static int cmd_run(int argc, char **argv) {
    static const struct option longopts[] = {{"out", required_argument, NULL, 'o'},
                                             {"no-progress", no_argument, NULL, 'P'},
                                             {"no-cache", no_argument, NULL, 'C'},
                                             {"progress-every", required_argument, NULL, 'E'},
                                             {"metrics-port", required_argument, NULL, 'm'},
                                             {"metrics-linger", required_argument, NULL, 'L'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    const char *out_dir = NULL, *metrics_port = NULL;
    double linger = 0;
    int progress = isatty(STDERR_FILENO), no_cache = 0;
    double every = 10;
    char *end;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out_dir = optarg;
            break;
        case 'P':
            progress = 0;
            every = 0;
            break;
        case 'C':
            no_cache = 1;
            break;
        case 'E':
            every = strtod(optarg, &end);
            if (*end || !(every >= 0)) {
                fprintf(stderr, "refinery run: --progress-every: expected seconds, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'm':
            metrics_port = optarg;
            break;
        case 'L':
            linger = strtod(optarg, NULL);
            break;
        case 'h':
            run_usage(stdout);
            return 0;
        default:
            run_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        run_usage(stderr);
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    /* under mpirun: a group; the data stages run on rank 0, every rank trains */
    rf_comm *comm = NULL;
    int rc = rf_comm_init_from_env(NULL, &comm);
    if (rc) {
        fprintf(stderr, "refinery run: %s\n", rf_errmsg());
        return 2;
    }
    int rank = rf_comm_rank(comm);
    rf_metrics_http *mh = NULL;
    if (metrics_port && rank == 0) {
        char addr[64];
        long port = strtol(metrics_port, &end, 10);
        snprintf(addr, sizeof addr, "0.0.0.0:%ld", port);
        rf_obs_init("run");
        if (*end || port < 0 || port > 65535 ||
            rf_metrics_http_start(addr, rf_prom_default(), &mh) < 0) {
            fprintf(stderr, "refinery run: --metrics-port %s: %s\n", metrics_port,
                    *end || port < 0 || port > 65535 ? "not a port" : rf_errmsg());
            rf_comm_destroy(comm);
            return 2;
        }
        rf_info("metrics", "serving /metrics on 0.0.0.0:%d", rf_metrics_http_port(mh));
    }
    rf_pipeline_opts opts = {argv[optind],         out_dir, progress && rank == 0 ? stderr : NULL,
                             &run_cancel,          NULL,    no_cache,
                             rank == 0 ? every : 0};
    char *run_dir = NULL;
    rc = rf_pipeline_run_group(&opts, comm, &run_dir);
    if (rc) {
        const char *msg = rf_errmsg()[0] ? rf_errmsg() : rf_err_name(rc);
        if (rf_comm_world(comm) > 1)
            fprintf(stderr, "refinery run: rank %d: %s\n", rank, msg);
        else
            fprintf(stderr, "refinery run: %s\n", msg);
        if (run_dir && rank == 0) fprintf(stderr, "refinery run: partial results in %s\n", run_dir);
    } else if (rank == 0) {
        printf("run complete: %s (stats in %s/stats.json)\n", run_dir, run_dir);
    }
    /* The report, also of a failed run: what the stages got to write. */
    if (run_dir && rank == 0 &&
        (rf_report_save_spec(run_dir, argv[optind]) || rf_report_write(run_dir)))
        fprintf(stderr, "refinery run: report.html: %s\n", rf_errmsg());
    free(run_dir);
    if (mh && linger > 0) fflush(stdout);
    for (double waited = 0; mh && waited < linger && !run_cancel; waited += 0.1)
        usleep(100000);
    rf_metrics_http_stop(mh);
    rf_comm_destroy(comm);
    if (rc == RF_ERR_INVALID || rc == RF_ERR_PARSE || rc == RF_ERR_NOT_FOUND) return 2;
    return rc ? 1 : 0;
}

static const rf_command run_cmd = {"run", "run a pipeline spec in one process", cmd_run};
RF_COMMAND(run_cmd)
