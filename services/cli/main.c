/* The `refinery` command: dispatches to the subcommands that registered
 * themselves (services/cli/cmd_*.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/command.h"
#include "common/log.h"

#define MAX_COMMANDS 32
static const rf_command *commands[MAX_COMMANDS];
static int ncommands;

void rf_command_register(const rf_command *cmd) {
    if (ncommands == MAX_COMMANDS) abort(); /* more commands than slots is a build bug */
    int i = ncommands++;
    while (i > 0 && strcmp(commands[i - 1]->name, cmd->name) > 0) {
        commands[i] = commands[i - 1];
        i--;
    }
    commands[i] = cmd;
}

static void usage(FILE *out) {
    fprintf(out, "usage: refinery <command> [options]\n\ncommands:\n");
    for (int i = 0; i < ncommands; i++)
        fprintf(out, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(out, "\n`refinery <command> --help` describes a command.\n");
}

int main(int argc, char **argv) {
    rf_log_init_from_env();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h")) {
        if (argc < 3) {
            usage(stdout);
            return 0;
        }
        /* `refinery help CMD` is `refinery CMD --help`. */
        for (int i = 0; i < ncommands; i++)
            if (!strcmp(commands[i]->name, argv[2])) {
                char *args[] = {argv[2], "--help", NULL};
                return commands[i]->main(2, args);
            }
        fprintf(stderr, "refinery: unknown command '%s'\n\n", argv[2]);
        usage(stderr);
        return 2;
    }
    for (int i = 0; i < ncommands; i++)
        if (!strcmp(commands[i]->name, name)) return commands[i]->main(argc - 1, argv + 1);
    fprintf(stderr, "refinery: unknown command '%s'\n\n", name);
    usage(stderr);
    return 2;
}
