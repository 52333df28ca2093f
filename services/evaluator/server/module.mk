# refinery-evaluator: checkpoints -> the evaluator library -> metrics; Classify.
BIN_MODS_evaluator := evaluator.server evaluator trainer comm tokenizer runtime runtime.rpc \
    runtime.kafka runtime.store
