# services/svc: service plumbing (options, signals, stage loop) in
# librefinery_svc.a, and the service executables, one main_<name>.c each,
# linked as build/refinery-<name> (underscores become dashes) against only the
# libraries they use.
SVC_MAINS := $(wildcard services/svc/main_*.c)
EXCLUDE_SRCS += $(SVC_MAINS)
SVC_MAIN_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(SVC_MAINS))
$(SVC_MAIN_OBJS): $(BUILD)/gen/refinery.pb-c.h $(BUILD)/gen/health.pb-c.h

# $(call SVC_BIN,name,modules): build/refinery-<name> from main_<name>.c, the
# svc library and the given modules (dependents before what they depend on),
# then common and the generated protobuf code.
define SVC_BIN
EXTRA_BINS += $(BUILD)/refinery-$(1)
$(BUILD)/refinery-$(1): $(BUILD)/obj/services/svc/main_$(subst -,_,$(1)).o \
    $(BUILD)/lib/librefinery_svc.a $(foreach m,$(2),$(BUILD)/lib/librefinery_$(m).a) \
    $(BUILD)/lib/librefinery_common.a $(BUILD)/lib/librefinery_proto.a
	@echo '  LD     $$@'
	$$(Q)$$(CC) $$(LDFLAGS) -o $$@ $$^ $$(LDLIBS)
endef

$(eval $(call SVC_BIN,kafka-mock,kafka))
$(eval $(call SVC_BIN,dedup,dedup kafka store))
$(eval $(call SVC_BIN,tokenizer,tokenizer rpc kafka store))
$(eval $(call SVC_BIN,evaluator,evaluator trainer tokenizer rpc kafka store))
$(eval $(call SVC_BIN,trainer,trainer evaluator tokenizer rpc kafka store))

# refinery-ingest also serves Control, whose Submit checks a spec against
# every registered stage as `refinery run` does (svc/spec_check.h): the
# stages register themselves from constructors, so every library is linked
# whole, like the CLI.
EXTRA_BINS += $(BUILD)/refinery-ingest
$(BUILD)/refinery-ingest: $(BUILD)/obj/services/svc/main_ingest.o \
    $(foreach m,$(MODULES),$(BUILD)/lib/librefinery_$(m).a) $(BUILD)/lib/librefinery_proto.a
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $< -Wl,--whole-archive $(filter %.a,$^) -Wl,--no-whole-archive $(LDLIBS)

# Clients for benchmarks and by-hand use: JSON Lines -> Ingest.Push, and a
# load generator for the unary methods (latency percentiles).
$(eval $(call SVC_BIN,push,rpc))
$(eval $(call SVC_BIN,loadgen,rpc))
