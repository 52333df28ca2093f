# services/comm: the communication layer (comm.h). The MPI backend is built
# when OpenMPI's development files are there (pkg-config ompi-c), the NCCL
# backend only in the CUDA=1 build; without MPI, a process started by mpirun
# gets RF_ERR_UNSUPPORTED and world-size-1 runs use the self backend.
COMM_MPI_LIBS := $(shell pkg-config --libs ompi-c 2>/dev/null)
COMM_MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
ifneq ($(COMM_MPI_LIBS),)
$(BUILD)/obj/services/comm/%.o: CPPFLAGS += -DREFINERY_MPI=1 $(COMM_MPI_CFLAGS)
# --as-needed: only binaries that link the MPI backend (the refinery CLI, the
# comm tests) depend on libmpi at run time, not every service.
LDLIBS += -Wl,--push-state,--as-needed $(COMM_MPI_LIBS) -Wl,--pop-state
else
EXCLUDE_SRCS += services/comm/comm_mpi.c
endif

# comm_nccl.c is C compiled by gcc against the CUDA runtime and NCCL headers
# (the Makefile's CUDA section links -lcudart -lnccl); with CUDA=emu, against
# tests/cuda_emu's (NCCL at one rank, or over MPI under mpirun).
CUDA_HOME ?= /usr/local/cuda
ifeq ($(CUDA),1)
$(BUILD)/obj/services/comm/%.o: CPPFLAGS += -I$(CUDA_HOME)/include
else ifneq ($(CUDA),emu)
EXCLUDE_SRCS += services/comm/comm_nccl.c
endif

# The program tests/comm/mpi.test.sh runs under mpirun. It lives outside
# $(BUILD)/tests because tests/run.sh runs every binary there directly, and
# links only what it uses (not every package: less for LeakSanitizer to see).
EXTRA_BINS += $(BUILD)/comm/mpi_check
$(BUILD)/comm/mpi_check: $(BUILD)/obj/tests/comm/mpi_check.o \
    $(BUILD)/lib/librefinery_comm.a $(BUILD)/lib/librefinery_common.a
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(COMM_MPI_LIBS) \
	    $(if $(filter 1,$(CUDA)),-L$(CUDA_HOME)/lib64 -lcudart -lnccl) \
	    $(if $(filter emu,$(CUDA)),$(CUEMU_LIB) -lstdc++ $(COMM_MPI_LIBS)) -lm

# A by-hand benchmark (not a test): rf_comm_allreduce against MPI_Allreduce.
$(BUILD)/obj/tests/comm/bench_allreduce.o: CPPFLAGS += $(COMM_MPI_CFLAGS)
$(BUILD)/comm/bench_allreduce: $(BUILD)/obj/tests/comm/bench_allreduce.o \
    $(BUILD)/lib/librefinery_comm.a $(BUILD)/lib/librefinery_common.a
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(COMM_MPI_LIBS) \
	    $(if $(filter 1,$(CUDA)),-L$(CUDA_HOME)/lib64 -lcudart -lnccl) \
	    $(if $(filter emu,$(CUDA)),$(CUEMU_LIB) -lstdc++ $(COMM_MPI_LIBS)) -lm
