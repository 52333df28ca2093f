/* refinery cancel RUN: Control.Cancel; prints the run's status. */
#include <stdio.h>

#include "cli/command.h"
#include "cli/remote.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: refinery cancel RUN [server options]\n"
            "Cancels a pending or running run and prints its status as JSON. A run that\n"
            "has already ended is FAILED_PRECONDITION (exit status 1).\n\n%s",
            rf_remote_usage);
}

static int cmd_cancel(int argc, char **argv) {
    static const struct option longopts[] = {
        RF_REMOTE_LONGOPTS, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    rf_remote r;
    rf_remote_init(&r);
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int shared = rf_remote_option(&r, c, optarg);
        if (shared < 0) return 2;
        if (shared) continue;
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        usage(stderr);
        return 2;
    }
    if (argc - optind != 1) {
        usage(stderr);
        return 2;
    }
    rf_rpc_client *client;
    if (rf_remote_connect(&r, r.server, "cancel", &client) < 0) return 1;
    Refinery__V1__RunStatus *s;
    rf_rpc_status st;
    int rc = rf_remote_run_call(client, &r, "Cancel", argv[optind], &s, &st) < 0
                 ? rf_remote_report("cancel", &st)
                 : 0;
    if (s) {
        rf_remote_print_json(stdout, s);
        protobuf_c_message_free_unpacked(&s->base, NULL);
    }
    rf_rpc_client_free(client);
    return rc;
}

static const rf_command cancel_cmd = {"cancel", "cancel a run (Control)", cmd_cancel};
RF_COMMAND(cancel_cmd)
