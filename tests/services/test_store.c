/* services/runtime/store against a real PostgreSQL: started here with
 * scripts/test-env/pg.sh in a temporary directory (a watchdog removes it if
 * this process dies), or the server of $REFINERY_PG when set (then the
 * restart tests are skipped). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "runtime/store/migrations.h"
#include "runtime/store/store.h"

#include "../support/pg.h"
#include "../support/skip.h"

static test_pg pg_server;

static int group_setup(void **state) {
    return test_pg_start(&pg_server, "store");
}

static int group_teardown(void **state) {
    test_pg_stop(&pg_server);
    return 0;
}

static rf_store *open_store(const char *info) {
    rf_store_opts o = {.conninfo = info, .attempts = 20, .backoff_s = 0.05, .backoff_max_s = 1};
    rf_store *s = NULL;
    if (rf_store_open(&o, &s) < 0) fail_msg("open: %s", rf_errmsg());
    return s;
}

/* A unique run id per test, so tests do not see each other's rows. */
static const char *run_id(const char *name) {
    static char id[128];
    snprintf(id, sizeof id, "%s-%d-%.0f", name, (int)getpid(), rf_now() * 1e6);
    return id;
}

static void test_migrations(void **state) {
    rf_store *s = open_store(pg_server.conninfo);
    int v;
    assert_int_equal(rf_store_schema_version(s, &v), 0);
    assert_int_equal(v, rf_store_migrations[rf_store_nmigrations - 1].version);
    rf_store_close(s);
    /* Opening again applies nothing twice. */
    s = open_store(pg_server.conninfo);
    PGresult *r;
    assert_int_equal(rf_store_exec(s, "SELECT count(*) FROM schema_migrations", 0, NULL, &r), 0);
    assert_int_equal(atoi(PQgetvalue(r, 0, 0)), rf_store_nmigrations);
    PQclear(r);
    rf_store_close(s);
}

/* Several services starting at once on an empty database: the advisory lock
 * lets exactly one migrate, the others find the schema in place. */
static char fresh_info[600];
static void *open_concurrently(void *arg) {
    rf_store_opts o = {.conninfo = fresh_info, .attempts = 5, .backoff_s = 0.05};
    rf_store *s;
    intptr_t rc = rf_store_open(&o, &s);
    if (rc == 0) rf_store_close(s);
    return (void *)rc;
}

static void test_concurrent_migrations(void **state) {
    rf_store *s = open_store(pg_server.conninfo);
    char db[64], sql[128];
    snprintf(db, sizeof db, "rf_conc_%d_%ld", (int)getpid(), (long)(rf_now() * 1000) % 100000);
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", db); /* an identifier: not a parameter */
    assert_int_equal(rf_store_exec(s, sql, 0, NULL, NULL), 0);
    /* In a libpq connection string the last dbname wins. */
    snprintf(fresh_info, sizeof fresh_info, "%s dbname=%s", pg_server.conninfo, db);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, open_concurrently, NULL);
    for (int i = 0; i < 4; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        assert_int_equal((intptr_t)rc, 0);
    }
    rf_store *fresh = open_store(fresh_info);
    PGresult *r;
    assert_int_equal(rf_store_exec(fresh, "SELECT count(*) FROM schema_migrations", 0, NULL, &r),
                     0);
    assert_int_equal(atoi(PQgetvalue(r, 0, 0)), rf_store_nmigrations);
    PQclear(r);
    rf_store_close(fresh);
    snprintf(sql, sizeof sql, "DROP DATABASE %s", db);
    assert_int_equal(rf_store_exec(s, sql, 0, NULL, NULL), 0);
    rf_store_close(s);
}

static void test_runs(void **state) {
    rf_store *s = open_store(pg_server.conninfo);
    const char *id = run_id("runs");
    bool created;
    assert_int_equal(rf_store_run_create(s, id, "ingest: {}", &created), 0);
    assert_true(created);
    assert_int_equal(rf_store_run_create(s, id, "other spec", &created), 0);
    assert_false(created);
    rf_store_run run;
    assert_int_equal(rf_store_run_get(s, id, &run), 0);
    assert_string_equal(run.id, id);
    assert_int_equal(run.state, RF_RUN_PENDING);
    assert_true(run.created_at > 1.7e9);
    assert_int_equal(rf_store_run_set_state(s, id, RF_RUN_FAILED, "trainer: out of memory"), 0);
    assert_int_equal(rf_store_run_get(s, id, &run), 0);
    assert_int_equal(run.state, RF_RUN_FAILED);
    assert_string_equal(run.error, "trainer: out of memory");
    assert_int_equal(rf_store_run_get(s, "no-such-run", &run), RF_ERR_NOT_FOUND);
    assert_int_equal(rf_store_run_set_state(s, "no-such-run", RF_RUN_RUNNING, NULL),
                     RF_ERR_NOT_FOUND);
    /* Values are parameters, never SQL. */
    const char *evil = "x'); DROP TABLE runs; --";
    assert_int_equal(rf_store_run_create(s, evil, "spec", &created), 0);
    assert_int_equal(rf_store_run_get(s, evil, &run), 0);
    assert_string_equal(run.id, evil);
    rf_store_close(s);
}

static void progress(rf_store *s, const char *id, const char *stage, uint64_t seq, int64_t out) {
    rf_store_counts c = {.in = out, .out = out};
    if (rf_store_progress_add(s, id, stage, seq, &c, NULL) < 0)
        fail_msg("progress %s %llu: %s", stage, (unsigned long long)seq, rf_errmsg());
}

/* A stage is complete once the run is sealed and it has every upstream batch
 * that had documents; the spec, sealing and listing round-trip. */
static void test_flow(void **state) {
    rf_store *s = open_store(pg_server.conninfo);
    const char *id = run_id("flow");
    assert_int_equal(rf_store_run_create(s, id, "trainer:\n  epochs: 1\n", NULL), 0);
    char *spec = NULL;
    assert_int_equal(rf_store_run_spec(s, id, &spec), 0);
    assert_string_equal(spec, "trainer:\n  epochs: 1\n");
    free(spec);
    assert_int_equal(rf_store_run_spec(s, "no-such-run", &spec), RF_ERR_NOT_FOUND);

    const char *chain[] = {"ingest", "dedup", "tokenizer"};
    bool done = true;
    assert_int_equal(rf_store_stage_complete(s, id, chain, 3, &done), 0);
    assert_false(done); /* not sealed */
    progress(s, id, "ingest", 10, 5);
    progress(s, id, "ingest", 11, 0); /* trailing rejects only: no batch travels */
    progress(s, id, "ingest", 12, 3);
    progress(s, id, "dedup", 10, 0); /* all duplicates */
    progress(s, id, "dedup", 12, 2);
    progress(s, id, "tokenizer", 12, 2);
    assert_int_equal(rf_store_run_seal(s, id), 0);
    assert_int_equal(rf_store_run_seal(s, id), 0); /* idempotent */
    rf_store_run run;
    assert_int_equal(rf_store_run_get(s, id, &run), 0);
    assert_true(run.sealed);
    assert_true(run.updated_at >= run.created_at);
    assert_int_equal(rf_store_stage_complete(s, id, chain, 2, &done), 0);
    assert_true(done);
    assert_int_equal(rf_store_stage_complete(s, id, chain, 3, &done), 0);
    assert_true(done);
    progress(s, id, "ingest", 13, 1); /* a late batch dedup has not seen */
    assert_int_equal(rf_store_stage_complete(s, id, chain, 3, &done), 0);
    assert_false(done);
    progress(s, id, "dedup", 13, 1);
    assert_int_equal(rf_store_stage_complete(s, id, chain, 3, &done), 0);
    assert_false(done);
    progress(s, id, "tokenizer", 13, 1);
    assert_int_equal(rf_store_stage_complete(s, id, chain, 3, &done), 0);
    assert_true(done);
    assert_int_equal(rf_store_run_seal(s, "no-such-run"), RF_ERR_NOT_FOUND);
    assert_int_equal(rf_store_stage_complete(s, "no-such-run", chain, 3, &done), RF_ERR_NOT_FOUND);

    rf_store_run runs[4];
    size_t n = 0;
    assert_int_equal(rf_store_run_list(s, 4, runs, &n), 0);
    assert_true(n >= 1 && n <= 4);
    for (size_t i = 1; i < n; i++)
        assert_true(runs[i - 1].created_at >= runs[i].created_at);
    rf_store_close(s);
}

static void add_batches(rf_store *s, const char *id, uint64_t from, uint64_t to, int *fresh) {
    for (uint64_t seq = from; seq < to; seq++) {
        rf_store_counts c = {.in = 100, .out = 90, .rejected = 7, .duplicate = 3};
        bool recorded;
        if (rf_store_progress_add(s, id, "dedup", seq, &c, &recorded) < 0)
            fail_msg("progress %llu: %s", (unsigned long long)seq, rf_errmsg());
        *fresh += recorded;
    }
}

static void test_progress_replay(void **state) {
    rf_store *s = open_store(pg_server.conninfo);
    const char *id = run_id("progress");
    assert_int_equal(rf_store_run_create(s, id, "{}", NULL), 0);
    int fresh = 0;
    add_batches(s, id, 0, 20, &fresh);
    add_batches(s, id, 5, 25, &fresh); /* 15 replays, 5 new */
    assert_int_equal(fresh, 25);
    bool has;
    assert_int_equal(rf_store_progress_has(s, id, "dedup", 24, &has), 0);
    assert_true(has);
    assert_int_equal(rf_store_progress_has(s, id, "dedup", 25, &has), 0);
    assert_false(has);
    assert_int_equal(rf_store_progress_has(s, id, "tokenizer", 0, &has), 0);
    assert_false(has);
    rf_store_counts t;
    assert_int_equal(rf_store_progress_total(s, id, "dedup", &t), 0);
    assert_int_equal(t.batches, 25);
    assert_int_equal(t.in, 2500);
    assert_int_equal(t.out, 2250);
    assert_int_equal(t.rejected, 175);
    assert_int_equal(t.duplicate, 75);
    assert_int_equal(rf_store_progress_total(s, id, "tokenizer", &t), 0);
    assert_int_equal(t.batches, 0);
    /* Progress for an unknown run is refused by the foreign key. */
    rf_store_counts c = {1, 1, 0, 0, 0};
    assert_int_equal(rf_store_progress_add(s, "no-such-run", "dedup", 0, &c, NULL), RF_ERR_IO);
    assert_non_null(strstr(rf_errmsg(), "foreign key"));
    c.in = -1;
    assert_int_equal(rf_store_progress_add(s, id, "dedup", 99, &c, NULL), RF_ERR_RANGE);
    rf_store_close(s);
}

static void test_checkpoints_and_results(void **state) {
    rf_store *s = open_store(pg_server.conninfo);
    const char *id = run_id("ckpt");
    assert_int_equal(rf_store_run_create(s, id, "{}", NULL), 0);
    int64_t step;
    char path[256];
    assert_int_equal(rf_store_checkpoint_latest(s, id, &step, path, sizeof path), RF_ERR_NOT_FOUND);
    for (int64_t st = 100; st <= 300; st += 100) {
        char p[64];
        snprintf(p, sizeof p, "/ckpt/step-%lld.bin", (long long)st);
        assert_int_equal(rf_store_checkpoint_add(s, id, st, p, 3.0 - st / 100.0), 0);
        assert_int_equal(rf_store_metric_add(s, id, st, "loss", 3.0 - st / 100.0), 0);
        assert_int_equal(rf_store_metric_add(s, id, st, "loss", 99), 0); /* replay: ignored */
    }
    assert_int_equal(rf_store_checkpoint_latest(s, id, &step, path, sizeof path), 0);
    assert_int_equal(step, 300);
    assert_string_equal(path, "/ckpt/step-300.bin");
    assert_int_equal(rf_store_eval_add(s, id, 200, "accuracy", 0.8125), 0);
    double v;
    assert_int_equal(rf_store_eval_get(s, id, 200, "accuracy", &v), 0);
    assert_true(v == 0.8125);
    assert_int_equal(rf_store_eval_get(s, id, 300, "accuracy", &v), RF_ERR_NOT_FOUND);
    /* Results need their checkpoint. */
    assert_int_equal(rf_store_eval_add(s, id, 250, "accuracy", 0.5), RF_ERR_IO);
    PGresult *r;
    const char *p[] = {id};
    assert_int_equal(rf_store_exec(s,
                                   "SELECT value FROM training_metrics"
                                   " WHERE run_id = $1 AND name = 'loss' ORDER BY step",
                                   1, p, &r),
                     0);
    assert_int_equal(PQntuples(r), 3);
    assert_true(strtod(PQgetvalue(r, 2, 0), NULL) == 0.0);
    PQclear(r);
    rf_store_close(s);
}

/* The server restarts between two statements: the next one reconnects. */
static void test_server_restart(void **state) {
    if (!pg_server.owned) RF_SKIP("the server of $REFINERY_PG is not ours to stop or restart");
    rf_store *s = open_store(pg_server.conninfo);
    const char *id = run_id("restart");
    assert_int_equal(rf_store_run_create(s, id, "{}", NULL), 0);
    int fresh = 0;
    add_batches(s, id, 0, 10, &fresh);
    assert_int_equal(test_pg_cmd(&pg_server, "restart"), 0);
    add_batches(s, id, 10, 20, &fresh);
    assert_int_equal(fresh, 20);
    assert_int_equal(rf_store_reconnects(s), 1);
    rf_store_counts t;
    assert_int_equal(rf_store_progress_total(s, id, "dedup", &t), 0);
    assert_int_equal(t.batches, 20);
    assert_int_equal(t.in, 2000);
    rf_store_close(s);
}

/* The server comes up while the service is already trying to connect. */
static void test_connect_backoff(void **state) {
    if (!pg_server.owned) RF_SKIP("the server of $REFINERY_PG is not ours to stop or restart");
    assert_int_equal(test_pg_cmd(&pg_server, "stop"), 0);
    double t0 = rf_now();
    rf_store_opts quick = {.conninfo = pg_server.conninfo, .attempts = 3, .backoff_s = 0.05};
    rf_store *s;
    assert_int_equal(rf_store_open(&quick, &s), RF_ERR_IO);
    assert_non_null(strstr(rf_errmsg(), "after 3 attempts"));
    assert_true(rf_now() - t0 >= 0.15); /* waited 0.05 + 0.1 between attempts */

    char cmd[1024];
    const char *root = getenv("REFINERY_ROOT");
    snprintf(cmd, sizeof cmd, "(sleep 1; '%s/scripts/test-env/pg.sh' restart '%s') >&2 &",
             root ? root : ".", pg_server.dir);
    assert_int_equal(system(cmd), 0);
    s = open_store(pg_server.conninfo); /* 20 attempts, backoff up to 1 s */
    int v;
    assert_int_equal(rf_store_schema_version(s, &v), 0);
    assert_true(v >= 1);
    rf_store_close(s);
}

/* What no retry can fix fails at once (well under the 20 attempts with up
 * to 1 s between them that open_store's options would allow), naming the
 * reason; the server is up throughout. */
static void test_permanent_errors(void **state) {
    char info[1024];
    const char *bad[][2] = {
        {"host=localhost port", "invalid PostgreSQL connection string"},
        {"postgresql://u:secret@[::1", "invalid PostgreSQL connection string"},
        {"dbname=rf_no_such_db", "3D000"},
        {"user=rf_no_such_role", "28000"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (strncmp(bad[i][0], "postgresql:", 11) == 0 || strncmp(bad[i][0], "host=", 5) == 0)
            snprintf(info, sizeof info, "%s", bad[i][0]);
        else
            snprintf(info, sizeof info, "%s %s", pg_server.conninfo, bad[i][0]);
        rf_store_opts o = {.conninfo = info, .attempts = 20, .backoff_s = 0.2, .backoff_max_s = 1};
        rf_store *s = NULL;
        double t0 = rf_now();
        int rc = rf_store_open(&o, &s);
        double took = rf_now() - t0;
        print_message("%s -> %s (%.3f s)\n", bad[i][0], rf_errmsg(), took);
        assert_int_equal(rc, RF_ERR_INVALID);
        assert_null(s);
        assert_non_null(strstr(rf_errmsg(), bad[i][1]));
        assert_null(strstr(rf_errmsg(), "secret"));
        assert_true(took < 2);
    }
    /* With connect_timeout set (each attempt polled with its own bound). */
    if (strncmp(pg_server.conninfo, "host=", 5) == 0) {
        rf_store *s = NULL;
        snprintf(info, sizeof info, "%s dbname=rf_no_such_db connect_timeout=5",
                 pg_server.conninfo);
        rf_store_opts o = {.conninfo = info, .attempts = 20, .backoff_s = 0.2};
        assert_int_equal(rf_store_open(&o, &s), RF_ERR_INVALID);
        assert_non_null(strstr(rf_errmsg(), "rf_no_such_db"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_migrations),
        cmocka_unit_test(test_concurrent_migrations),
        cmocka_unit_test(test_runs),
        cmocka_unit_test(test_progress_replay),
        cmocka_unit_test(test_flow),
        cmocka_unit_test(test_checkpoints_and_results),
        cmocka_unit_test(test_server_restart),
        cmocka_unit_test(test_connect_backoff),
        cmocka_unit_test(test_permanent_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
