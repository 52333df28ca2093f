/* A PostgreSQL server for a cmocka test binary: the one of $REFINERY_PG when
 * set, otherwise a private one started with scripts/test-env/pg.sh in a fresh
 * temporary directory (its watchdog stops the server and removes the directory
 * if the test process dies). Uses only libc and services/common, so this file
 * links into every test binary. */
#ifndef REFINERY_TESTS_SUPPORT_PG_H
#define REFINERY_TESTS_SUPPORT_PG_H

typedef struct test_pg {
    char dir[64];       /* the private server's directory ("" when external) */
    char conninfo[512]; /* libpq connection string */
    int owned;          /* 1: started here, so it may be stopped and restarted */
} test_pg;

/* Fills pg from $REFINERY_PG, or starts a private server in
 * /tmp/rf-<tag>-pg-XXXXXX. 0, or -1 after a message on stderr. */
int test_pg_start(test_pg *pg, const char *tag);

/* Runs `pg.sh CMD DIR` (stop, restart) on a private server: 0 on success. */
int test_pg_cmd(const test_pg *pg, const char *cmd);

/* Stops a private server and removes its directory; nothing for $REFINERY_PG. */
void test_pg_stop(test_pg *pg);

#endif
