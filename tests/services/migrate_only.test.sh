#!/usr/bin/env bash
# refinery-ingest --migrate-only (what the chart's pre-install/pre-upgrade hook Job runs):
# on an empty database it applies every embedded migration, logs the schema version and
# exits 0 without Kafka; a second run changes nothing; it refuses to run without
# --pg, and fails with the reason on a database that does not exist.
. "$REFINERY_ROOT/tests/services/lib.sh"
env_start pg
ingest=$REFINERY_BUILD/refinery-ingest
# The migrations embedded in the binary: services/runtime/store/migrations/NNN_*.sql.
want=$(ls services/runtime/store/migrations/*.sql | sed 's|.*/0*\([0-9]*\)_.*|\1|' | sort -n | tail -n 1)
n_sql=$(ls services/runtime/store/migrations/*.sql | wc -l)

tables() { psql "$REFINERY_PG" -Atc "select count(*) from pg_tables where schemaname = 'public'"; }
[ "$(tables)" = 0 ] || { echo "the throwaway database is not empty"; exit 1; }

env -u KAFKA_BOOTSTRAP "$ingest" --migrate-only --pg "$REFINERY_PG" 2>"$TEST_DIR/m1.log" ||
    { cat "$TEST_DIR/m1.log"; exit 1; }
cat "$TEST_DIR/m1.log"
grep -q "schema version $want\"" "$TEST_DIR/m1.log"
[ "$(psql "$REFINERY_PG" -Atc 'select count(*), max(version) from schema_migrations')" = "$n_sql|$want" ]
[ "$(psql "$REFINERY_PG" -Atc "select to_regclass('runs') is not null")" = t ]
t1=$(tables)
applied=$(psql "$REFINERY_PG" -Atc 'select version, name, applied_at from schema_migrations order by 1')

# Idempotent: the same version, no migration applied again, the same tables.
REFINERY_PG=$REFINERY_PG "$ingest" --migrate-only 2>"$TEST_DIR/m2.log" || { cat "$TEST_DIR/m2.log"; exit 1; }
grep -q "schema version $want\"" "$TEST_DIR/m2.log"
[ "$(tables)" = "$t1" ]
applied2=$(psql "$REFINERY_PG" -Atc 'select version, name, applied_at from schema_migrations order by 1')
[ "$applied" = "$applied2" ] || { echo "schema_migrations changed on the second run"; exit 1; }

# Without a database it is a usage error (exit 2), not a silent success.
rc=0
env -u REFINERY_PG "$ingest" --migrate-only 2>"$TEST_DIR/m3.log" || rc=$?
[ $rc = 2 ] && grep -q -- "--migrate-only needs --pg" "$TEST_DIR/m3.log" ||
    { echo "without --pg: exit $rc"; cat "$TEST_DIR/m3.log"; exit 1; }
# A database that does not exist: non-zero with the server's reason.
rc=0
"$ingest" --migrate-only --pg "${REFINERY_PG/dbname=postgres/dbname=no_such_db}" 2>"$TEST_DIR/m4.log" || rc=$?
[ $rc = 1 ] && grep -q "migration failed" "$TEST_DIR/m4.log" && grep -q "no_such_db" "$TEST_DIR/m4.log" ||
    { echo "missing database: exit $rc"; cat "$TEST_DIR/m4.log"; exit 1; }
echo "migrate-only: ok (schema version $want, idempotent)"
