/* refinery watch RUN: follows a run with Control.Watch until it ends. */
#include <stdio.h>

#include "cli/command.h"
#include "cli/remote.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: refinery watch RUN [--json] [--stall-timeout S] [--unreachable-timeout S]\n"
            "                [server options]\n"
            "Prints a progress line (--json: the status as JSON) whenever the run changes,\n"
            "until it ends, or gives up when it makes no progress or the server gives no\n"
            "status for too long (the exit status says which).\n\n%s%s",
            rf_watch_usage, rf_remote_usage);
}

static int cmd_watch(int argc, char **argv) {
    static const struct option longopts[] = {RF_REMOTE_LONGOPTS,
                                             RF_WATCH_LONGOPTS,
                                             {"json", no_argument, NULL, 'j'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    rf_remote r;
    rf_remote_init(&r);
    rf_watch_opts w;
    if (rf_watch_opts_init(&w) < 0) return 2;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int shared = rf_remote_option(&r, c, optarg);
        if (!shared) shared = rf_watch_option(&w, c, optarg);
        if (shared < 0) return 2;
        if (shared) continue;
        switch (c) {
        case 'j':
            w.json = true;
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
    return rf_remote_watch(&r, "watch", argv[optind], &w);
}

static const rf_command watch_cmd = {"watch", "follow a run until it ends (Control)", cmd_watch};
RF_COMMAND(watch_cmd)
