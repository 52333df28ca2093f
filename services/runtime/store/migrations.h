/* SQL migrations embedded at build time from services/runtime/store/migrations/NNN_name.sql
 * (see embed-sql.sh and module.mk), in version order. */
#ifndef RF_STORE_MIGRATIONS_H
#define RF_STORE_MIGRATIONS_H

typedef struct rf_store_migration {
    int version;
    const char *name;
    const char *sql;
} rf_store_migration;

extern const rf_store_migration rf_store_migrations[];
extern const int rf_store_nmigrations;

#endif
