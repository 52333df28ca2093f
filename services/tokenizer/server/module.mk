# refinery-tokenizer: docs.dedup -> the tokenizer library -> tokens.*, and Tokenize.
BIN_MODS_tokenizer := tokenizer.server tokenizer runtime runtime.rpc runtime.kafka runtime.store
