# refinery-trainer: tokens.train -> the trainer library -> checkpoints.
BIN_MODS_trainer := trainer.server trainer comm tokenizer runtime runtime.rpc runtime.kafka \
    runtime.store
