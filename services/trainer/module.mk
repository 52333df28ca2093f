# Token shard input needs the tokenizer's shard reader (rf_shard_open). Until
# that implementation is in the tree, the trainer builds without shard input
# and says so clearly when given a shard.
ifeq ($(shell grep -ls '^int rf_shard_open' services/tokenizer/*.c 2>/dev/null),)
EXCLUDE_SRCS += services/trainer/dataset_shard.c
CPPFLAGS += -DRF_TRAINER_NO_SHARDS
endif

# The trainer tokenizes JSONL input and evaluates after training.
DEPS_trainer := tokenizer evaluator
