# The evaluator runs the trainer's model on the trainer's datasets.
DEPS_evaluator := trainer comm tokenizer

# The log-sum-exp loop of perplexity.c vectorizes only when its float
# compares may be if-converted (see the trainer's ops.o); it reads no
# floating-point exception flags.
$(BUILD)/obj/services/evaluator/perplexity.o: CFLAGS += -fno-trapping-math
