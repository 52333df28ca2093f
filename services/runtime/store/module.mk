# services/runtime/store: the SQL migrations are embedded in librefinery_runtime.store.a, so a
# service binary carries its schema (no path to configure).
STORE_SQL := $(sort $(wildcard services/runtime/store/migrations/*.sql))
STORE_MIG_C := $(BUILD)/gen/store_migrations.c
STORE_MIG_O := $(BUILD)/obj/gen/store_migrations.o

$(STORE_MIG_C): $(STORE_SQL) services/runtime/store/embed-sql.sh
	@mkdir -p $(@D)
	services/runtime/store/embed-sql.sh $(STORE_SQL) > $@

$(STORE_MIG_O): $(STORE_MIG_C)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/lib/librefinery_runtime.store.a: $(STORE_MIG_O)
