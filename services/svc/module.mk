# services/svc: service plumbing (options, signals) in librefinery_svc.a, and
# the service executables, one main_<name>.c each, linked as build/refinery-<name>
# (underscores become dashes) against only the libraries they use.
SVC_MAINS := $(wildcard services/svc/main_*.c)
EXCLUDE_SRCS += $(SVC_MAINS)
SVC_MAIN_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(SVC_MAINS))
$(SVC_MAIN_OBJS): $(BUILD)/gen/refinery.pb-c.h $(BUILD)/gen/health.pb-c.h

EXTRA_BINS += $(BUILD)/refinery-kafka-mock
$(BUILD)/refinery-kafka-mock: $(BUILD)/obj/services/svc/main_kafka_mock.o \
    $(BUILD)/lib/librefinery_svc.a $(BUILD)/lib/librefinery_kafka.a \
    $(BUILD)/lib/librefinery_common.a $(BUILD)/lib/librefinery_proto.a
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

EXTRA_BINS += $(BUILD)/refinery-ingest
$(BUILD)/refinery-ingest: $(BUILD)/obj/services/svc/main_ingest.o \
    $(BUILD)/lib/librefinery_svc.a $(BUILD)/lib/librefinery_ingest.a \
    $(BUILD)/lib/librefinery_rpc.a $(BUILD)/lib/librefinery_kafka.a \
    $(BUILD)/lib/librefinery_store.a \
    $(BUILD)/lib/librefinery_common.a $(BUILD)/lib/librefinery_proto.a
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

EXTRA_BINS += $(BUILD)/refinery-dedup
$(BUILD)/refinery-dedup: $(BUILD)/obj/services/svc/main_dedup.o \
    $(BUILD)/lib/librefinery_svc.a $(BUILD)/lib/librefinery_dedup.a \
    $(BUILD)/lib/librefinery_kafka.a $(BUILD)/lib/librefinery_store.a \
    $(BUILD)/lib/librefinery_common.a $(BUILD)/lib/librefinery_proto.a
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

EXTRA_BINS += $(BUILD)/refinery-tokenizer
$(BUILD)/refinery-tokenizer: $(BUILD)/obj/services/svc/main_tokenizer.o \
    $(BUILD)/lib/librefinery_svc.a $(BUILD)/lib/librefinery_tokenizer.a \
    $(BUILD)/lib/librefinery_rpc.a $(BUILD)/lib/librefinery_kafka.a \
    $(BUILD)/lib/librefinery_store.a \
    $(BUILD)/lib/librefinery_common.a $(BUILD)/lib/librefinery_proto.a
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
