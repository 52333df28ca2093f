/* refinery watch RUN: follows a run with Control.Watch until it ends. */
#include <stdio.h>

#include "cli/command.h"
#include "cli/remote.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: refinery watch RUN [--json] [server options]\n"
            "Prints a progress line (--json: the status as JSON) whenever the run changes,\n"
            "until it ends. Exit status 0 when it succeeded, 1 when it failed or was\n"
            "cancelled (or the watch could not continue).\n\n%s",
            rf_remote_usage);
}

static int cmd_watch(int argc, char **argv) {
    static const struct option longopts[] = {RF_REMOTE_LONGOPTS,
                                             {"json", no_argument, NULL, 'j'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    rf_remote r;
    rf_remote_init(&r);
    bool json = false;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int shared = rf_remote_option(&r, c, optarg);
        if (shared < 0) return 2;
        if (shared) continue;
        switch (c) {
        case 'j':
            json = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (argc - optind != 1) {
        usage(stderr);
        return 2;
    }
    rf_rpc_client *client;
    if (rf_remote_connect(&r, r.server, "watch", &client) < 0) return 1;
    int rc = rf_remote_watch(client, "watch", argv[optind], json);
    rf_rpc_client_free(client);
    return rc;
}

static const rf_command watch_cmd = {"watch", "follow a run until it ends (Control)", cmd_watch};
RF_COMMAND(watch_cmd)
