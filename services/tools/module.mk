# Client tools for benchmarks, tests and by-hand use: a librdkafka mock cluster,
# JSON Lines -> Ingest.PushLists, and a load generator for the unary methods.
BIN_MODS_kafka-mock := runtime runtime.kafka runtime.rpc
BIN_MODS_push := runtime runtime.rpc runtime.kafka
BIN_MODS_loadgen := runtime runtime.rpc runtime.kafka
