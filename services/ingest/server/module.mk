# refinery-ingest: the ingest service (Push, PushLists, Load, the Kafka source)
# and the Control API, whose Submit checks a spec against every stage's keys and
# parses the ingest and trainer sections (control/spec_check.h). From the other
# stage libraries the linker takes only those keys (their keys.c) and the
# trainer's spec parser: no dedup, tokenizer, model or OpenBLAS code.
BIN_MODS_ingest := ingest.server control pipeline ingest dedup tokenizer trainer comm evaluator \
    runtime runtime.rpc runtime.kafka runtime.store
