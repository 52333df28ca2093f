# The trainer reads token shards and tokenizes JSONL input (tokenizer). It does
# not evaluate: `refinery train` calls the evaluator after the trainer driver.
DEPS_trainer := tokenizer comm
# Its tests score the trained model with the evaluator.
TEST_DEPS_trainer := evaluator

# OpenBLAS's OpenMP build, where Debian installs it beside the default pthread
# build (libopenblas-openmp-dev): sgemm then runs on the same libgomp threads as
# the trainer's loops (the pthread build keeps a second pool that spins against
# them on few cores), and a call made inside a parallel loop stays on its thread.
OPENBLAS_OMP_DIR := $(dir $(firstword $(wildcard /usr/lib/*/openblas-openmp/libopenblas.so)))
ifneq ($(OPENBLAS_OMP_DIR),)
LDFLAGS += -L$(OPENBLAS_OMP_DIR) -Wl,-rpath,$(OPENBLAS_OMP_DIR)
endif

# The branch-free exp/erf loops of ops.c vectorize only when float compares may
# be if-converted, and AdamW's only when sqrtf need not set errno (its
# argument is never negative); nothing in the trainer reads floating-point
# exception flags or errno after math calls. Results are unchanged.
$(BUILD)/obj/services/trainer/ops.o: CFLAGS += -fno-trapping-math
$(BUILD)/obj/services/trainer/ops_optim.o: CFLAGS += -fno-math-errno

# A by-hand benchmark (not a test): training steps on one backend, for
# scripts/bench/bench_gpu.sh (BENCH=gpu make bench). Built with everything so
# that it cannot rot; tests/trainer/bench_step.test.sh checks its report.
EXTRA_BINS += $(BUILD)/trainer/bench_cuda_step
$(BUILD)/trainer/bench_cuda_step: $(BUILD)/obj/tests/trainer/bench_cuda_step.o \
    $(BUILD)/lib/librefinery_trainer.a $(BUILD)/lib/librefinery_tokenizer.a \
    $(BUILD)/lib/librefinery_comm.a $(BUILD)/lib/librefinery_common.a
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(call group,$(filter %.a,$^)) $(LDLIBS)

# The program tests/trainer/tp.test.sh runs under mpirun: the tensor-parallel
# ops (tp.h) against their unsplit versions. Outside $(BUILD)/tests, like
# comm's mpi_check, because tests/run.sh runs every binary there directly.
EXTRA_BINS += $(BUILD)/trainer/tp_check
$(BUILD)/trainer/tp_check: $(BUILD)/obj/tests/trainer/tp_check.o \
    $(BUILD)/lib/librefinery_trainer.a $(BUILD)/lib/librefinery_comm.a \
    $(BUILD)/lib/librefinery_common.a
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(call group,$(filter %.a,$^)) $(LDLIBS)

# The program tests/trainer/pp.test.sh runs under mpirun: the 1F1B executor
# (pipeline.h) on a toy chain of layers against one process, and its bubble.
EXTRA_BINS += $(BUILD)/trainer/pp_check
$(BUILD)/trainer/pp_check: $(BUILD)/obj/tests/trainer/pp_check.o \
    $(BUILD)/lib/librefinery_trainer.a $(BUILD)/lib/librefinery_comm.a \
    $(BUILD)/lib/librefinery_common.a
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(call group,$(filter %.a,$^)) $(LDLIBS)

# The program tests/trainer/tp_bert.test.sh runs under mpirun: the BERT
# classifier split for tensor parallelism (rf_bert_tp_split) against the whole one.
EXTRA_BINS += $(BUILD)/trainer/tp_bert_check
$(BUILD)/trainer/tp_bert_check: $(BUILD)/obj/tests/trainer/tp_bert_check.o \
    $(BUILD)/lib/librefinery_trainer.a $(BUILD)/lib/librefinery_tokenizer.a \
    $(BUILD)/lib/librefinery_comm.a $(BUILD)/lib/librefinery_common.a
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(call group,$(filter %.a,$^)) $(LDLIBS)

# Dequantization must round each product as bitsandbytes does (no contraction
# into fused multiply-adds), so the dequantized weights are its bits.
$(BUILD)/obj/services/trainer/quant.o: CFLAGS += -ffp-contract=off

# A by-hand program (not a test): LoRA training steps on a model folder or a
# GGUF file, PEFT export, logits and memory measurements, for
# scripts/parity/peft_export_check.py and scripts/bench/lora_memory.sh.
EXTRA_BINS += $(BUILD)/trainer/lora_run
$(BUILD)/trainer/lora_run: $(BUILD)/obj/tests/trainer/lora_run.o \
    $(BUILD)/lib/librefinery_trainer.a $(BUILD)/lib/librefinery_tokenizer.a \
    $(BUILD)/lib/librefinery_comm.a $(BUILD)/lib/librefinery_common.a
	@mkdir -p $(@D)
	@echo '  LD     $@'
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(call group,$(filter %.a,$^)) $(LDLIBS)
