# The evaluator runs the trainer's model on the trainer's datasets.
DEPS_evaluator := trainer comm tokenizer
