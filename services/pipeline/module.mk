# The runner's default table (stages.c) names the five stage libraries.
DEPS_pipeline := ingest dedup tokenizer trainer comm evaluator
