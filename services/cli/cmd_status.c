/* refinery status [RUN]: a run's status from Control.Get, or the newest runs
 * from Control.List; one JSON line per run (--lines: a progress line).
 * refinery status RUN_DIR: an embedded run's (`refinery run`) status from its
 * run directory (pipeline/run_status.h); no server is asked. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cli/command.h"
#include "cli/remote.h"
#include "common/error.h"
#include "pipeline/run_status.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: refinery status [RUN | RUN_DIR] [--limit N] [--lines] [server options]\n"
            "Prints the run's status (state, per-stage counts, latest checkpoint and\n"
            "evaluation) as one JSON line, or, without RUN, the newest runs (default 50).\n"
            "--lines prints the progress line `refinery watch` prints instead.\n"
            "RUN_DIR, a directory `refinery run` wrote, prints that run's state\n"
            "(succeeded, failed with its error, or unfinished) and each stage's cache\n"
            "decision, attempts (retries) and seconds, from its stats.json and run.log.\n\n%s",
            rf_remote_usage);
}

static void print(const Refinery__V1__RunStatus *s, bool lines) {
    if (lines)
        rf_remote_print_line(stdout, s);
    else
        rf_remote_print_json(stdout, s);
}

static int list_runs(rf_rpc_client *c, const rf_remote *r, unsigned limit, bool lines) {
    Refinery__V1__ListRunsRequest req = REFINERY__V1__LIST_RUNS_REQUEST__INIT;
    req.limit = limit;
    ProtobufCMessage *m = NULL;
    rf_rpc_status st;
    if (rf_rpc_unary(c, "/refinery.v1.Control/List", &req.base, &refinery__v1__run_list__descriptor,
                     &m, r->timeout_s, &st) < 0)
        return rf_remote_report("status", &st);
    const Refinery__V1__RunList *l = (const Refinery__V1__RunList *)m;
    for (size_t i = 0; i < l->n_runs; i++)
        print(l->runs[i], lines);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

static int cmd_status(int argc, char **argv) {
    static const struct option longopts[] = {RF_REMOTE_LONGOPTS,
                                             {"limit", required_argument, NULL, 'n'},
                                             {"lines", no_argument, NULL, 'l'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    rf_remote r;
    rf_remote_init(&r);
    bool lines = false;
    long limit = 0;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int shared = rf_remote_option(&r, c, optarg);
        if (shared < 0) return 2;
        if (shared) continue;
        char *end;
        switch (c) {
        case 'n':
            limit = strtol(optarg, &end, 10);
            if (*end || limit < 1 || limit > 1000) {
                fprintf(stderr, "refinery status: --limit expects 1..1000, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'l':
            lines = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (argc - optind > 1) {
        usage(stderr);
        return 2;
    }
    struct stat sb;
    if (optind < argc && stat(argv[optind], &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* a directory without the runner's files falls through: a run id */
        int src = rf_run_dir_status(argv[optind], lines, stdout);
        if (src == RF_OK) return 0;
        if (src != RF_ERR_NOT_FOUND) {
            fprintf(stderr, "refinery status: %s\n", rf_errmsg());
            return 1;
        }
    }
    rf_rpc_client *client;
    if (rf_remote_connect(&r, r.server, "status", &client) < 0) return 1;
    int rc;
    if (optind == argc) {
        rc = list_runs(client, &r, (unsigned)limit, lines);
    } else {
        Refinery__V1__RunStatus *s;
        rf_rpc_status st;
        rc = rf_remote_run_call(client, &r, "Get", argv[optind], &s, &st) < 0
                 ? rf_remote_report("status", &st)
                 : 0;
        if (s) {
            print(s, lines);
            protobuf_c_message_free_unpacked(&s->base, NULL);
        }
    }
    rf_rpc_client_free(client);
    return rc;
}

static const rf_command status_cmd = {"status", "a run's status, or the newest runs (Control)",
                                      cmd_status};
RF_COMMAND(status_cmd)
