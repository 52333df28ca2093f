/* Checks a submitted pipeline spec the way `refinery run` does before it
 * starts anything: the YAML parses into a mapping; its top-level keys are
 * `run` and the pipeline's stages (pipeline/stages.h); `run` has only its keys
 * (name, out, threads, queue_depth) with valid values; each stage section is
 * a mapping of that stage's keys; there is at least one stage section
 * (rf_pipeline_check_spec); and the sections whose parsers have no side
 * effects are parsed with them: `ingest:` (rf_ingest_opts_from_cfg, presets
 * included) and `trainer:` (rf_trainer_spec_parse). The dedup, tokenizer and
 * evaluator stages parse their values while opening files, so only their key
 * names are checked here. SFT conversations (ingest preset sft or `chat:`)
 * are refused: the services' messages do not carry them yet.
 *
 * Errors are RF_ERR_INVALID or RF_ERR_PARSE with rf_errmsg() naming the
 * source, line and dotted key, e.g. "spec:4: ingest.threads: expected an
 * integer in [1, 256], got 'many'". Environment overrides are not applied:
 * a service checks the spec as it was sent. */
#ifndef RF_SVC_SPEC_CHECK_H
#define RF_SVC_SPEC_CHECK_H

#include <stddef.h>

/* name labels the spec in messages ("spec"). */
int rf_spec_check(const char *yaml, size_t len, const char *name);

#endif
