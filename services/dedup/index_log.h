/* The persistent dedup index: one append-only file, index.rfdd, in the index
 * directory. It starts with a 64-byte header holding the parameters that shape
 * decisions (a restart with other parameters is refused), then one record per
 * committed batch:
 *
 *   u32 magic "RFDB" | u32 payload_len | payload | u64 XXH3-64(payload, seed = payload_len)
 *
 * All integers are little-endian. The payload layout is the engine's business
 * (dedup.c); this file only frames, checksums, appends and replays records.
 * A record cut short at the end of the file (a crash while appending) is
 * dropped with a warning; a bad checksum anywhere else, a bad magic or a bad
 * header is RF_ERR_CORRUPT. Records are fsync'd before commit returns. */
#ifndef RF_DEDUP_INDEX_LOG_H
#define RF_DEDUP_INDEX_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the dedup index format is written in native little-endian order"
#endif

#define RF_DDLOG_FILE        "index.rfdd"
#define RF_DDLOG_HEADER_SIZE 64
#define RF_DDLOG_MAX_PAYLOAD (1u << 30)

typedef struct rf_ddlog_params {
    uint32_t ngram, char_mode, bands, rows, norm, verify, set_cap;
    double threshold;
    uint64_t seed;
} rf_ddlog_params;

typedef struct rf_ddlog rf_ddlog;

/* Called for each valid record in file order; voff is the file offset of the
 * payload's first byte. A non-zero return stops replay and is returned. */
typedef int (*rf_ddlog_apply_fn)(void *ctx, const unsigned char *payload, size_t len,
                                 uint64_t voff);

/* Opens (creating if needed) dir/index.rfdd, checks the header against want,
 * replays every record into apply, and truncates a torn tail. */
int rf_ddlog_open(const char *dir, const rf_ddlog_params *want, rf_ddlog_apply_fn apply, void *ctx,
                  rf_ddlog **out);
void rf_ddlog_close(rf_ddlog *log);

/* The payload being built for the next record; its file offset will be
 * rf_ddlog_pending_voff(). */
rf_buf *rf_ddlog_pending(rf_ddlog *log);
uint64_t rf_ddlog_pending_voff(const rf_ddlog *log);
/* Appends the pending payload as a record, fsyncs, and empties it. */
int rf_ddlog_commit(rf_ddlog *log);
/* Copies len bytes at file offset voff (committed or pending) into dst. */
int rf_ddlog_read(const rf_ddlog *log, uint64_t voff, void *dst, size_t len);
uint64_t rf_ddlog_size(const rf_ddlog *log); /* committed bytes on disk */

#endif
