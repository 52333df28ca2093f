#include "pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sys.h"

int test_pg_cmd(const test_pg *pg, const char *cmd) {
    const char *root = getenv("REFINERY_ROOT");
    char line[1024];
    snprintf(line, sizeof line, "PG_OWNER_PID=%d '%s/scripts/test-env/pg.sh' %s '%s' >&2",
             (int)getpid(), root ? root : ".", cmd, pg->dir);
    return system(line) == 0 ? 0 : -1;
}

int test_pg_start(test_pg *pg, const char *tag) {
    memset(pg, 0, sizeof *pg);
    const char *env = getenv("REFINERY_PG");
    if (env && *env) {
        snprintf(pg->conninfo, sizeof pg->conninfo, "%s", env);
        return 0;
    }
    snprintf(pg->dir, sizeof pg->dir, "/tmp/rf-%.20s-pg-XXXXXX", tag);
    if (!mkdtemp(pg->dir)) {
        fprintf(stderr, "could not create %s\n", pg->dir);
        return -1;
    }
    pg->owned = 1; /* from here on, test_pg_stop removes the directory */
    if (test_pg_cmd(pg, "start") < 0) {
        fprintf(stderr, "could not start PostgreSQL with scripts/test-env/pg.sh "
                        "(is REFINERY_ROOT set and postgresql installed?)\n");
        test_pg_stop(pg);
        return -1;
    }
    char path[128], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/pg.conninfo", pg->dir);
    if (rf_read_file(path, 4096, &text, &len) < 0) {
        fprintf(stderr, "could not read %s\n", path);
        test_pg_stop(pg);
        return -1;
    }
    text[strcspn(text, "\n")] = 0;
    snprintf(pg->conninfo, sizeof pg->conninfo, "%s", text);
    free(text);
    return 0;
}

void test_pg_stop(test_pg *pg) {
    if (!pg->owned) return;
    test_pg_cmd(pg, "stop");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pg->dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", pg->dir);
    pg->owned = 0;
}
