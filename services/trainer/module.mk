# The trainer reads token shards and tokenizes JSONL input (tokenizer), and
# evaluates after training (evaluator).
DEPS_trainer := tokenizer evaluator
