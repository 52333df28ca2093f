/* Subcommands of the `refinery` binary. Each lives in services/cli/cmd_<name>.c
 * and adds itself with RF_COMMAND, so no central table needs editing. A command
 * returns the process exit status: 0 success, 1 runtime failure, 2 usage error. */
#ifndef RF_COMMAND_H
#define RF_COMMAND_H

typedef struct rf_command {
    const char *name;
    const char *summary;                /* one line for `refinery help` */
    int (*main)(int argc, char **argv); /* argv[0] is the command name */
} rf_command;

void rf_command_register(const rf_command *cmd);

#define RF_COMMAND(var)                                                                            \
    __attribute__((constructor)) static void rf_command_register_##var(void) {                     \
        rf_command_register(&(var));                                                               \
    }

#endif
