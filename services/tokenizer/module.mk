# tests/tokenizer/ reads the Amazon CSV corpus with the ingest CSV parser.
DEPS_tokenizer := ingest
