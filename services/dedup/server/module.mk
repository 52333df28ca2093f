# refinery-dedup: docs.clean -> the dedup library -> docs.dedup.
BIN_MODS_dedup := dedup.server dedup runtime runtime.rpc runtime.kafka runtime.store
