# services/runtime/rpc: gRPC C core server/client over protobuf-c messages.
# proto/health.proto (package grpc.health.v1) is compiled here, because the
# top-level Makefile only compiles proto/refinery.proto; its object goes into
# librefinery_runtime.rpc.a.
RPC_HEALTH_C := $(BUILD)/gen/health.pb-c.c
RPC_HEALTH_H := $(BUILD)/gen/health.pb-c.h
RPC_HEALTH_O := $(BUILD)/obj/gen/health.pb-c.o

$(RPC_HEALTH_C) $(RPC_HEALTH_H) &: proto/health.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=proto --c_out=$(BUILD)/gen proto/health.proto

$(RPC_HEALTH_O): $(RPC_HEALTH_C)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -std=c17 $(OPT) -g -fPIC -MMD -MP $(SANITIZE) -c $< -o $@

$(BUILD)/lib/librefinery_runtime.rpc.a: $(RPC_HEALTH_O)

# Objects that include health.pb-c.h need it generated first.
$(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard services/runtime/rpc/*.c services/runtime/*.c tests/services/*.c)): $(RPC_HEALTH_H) $(BUILD)/gen/refinery.pb-c.h
