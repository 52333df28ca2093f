/* A run's intake file: the token sequences a consumer has durably taken in
 * from a topic (the trainer from tokens.train, the evaluator from
 * tokens.eval), one append-only record per input TokenBatch.
 *
 * The stage loop appends a batch here BEFORE recording its progress row and
 * committing its offset, so a crash in between makes a replay append the
 * same (run_id, seq) again: when loading, the first record of a seq wins and
 * later ones are counted as replays. The loaded order is (seq, position in
 * the batch), whatever order the batches were consumed in.
 *
 * Record (little-endian): u32 magic "RFI1", u32 body_len, u64 xxh3-64 of
 * the body, then the body: u32 run_len, run bytes, u64 seq, u32 n, then n
 * times (i32 label, u32 len, len u32 ids).
 *
 * A crash during an append can leave an incomplete (or unsynced, garbled)
 * last record: loading ignores it and reports its size (torn_bytes), and
 * rf_intake_open cuts it off before appending, so a torn tail never has
 * whole records after it. A bad record followed by a whole one is damage:
 * RF_ERR_CORRUPT. */
#ifndef RF_SVC_INTAKE_H
#define RF_SVC_INTAKE_H

#include <stddef.h>
#include <stdint.h>

#include "refinery.pb-c.h"
#include "trainer/dataset.h"

typedef struct rf_intake rf_intake;

/* Opens path for appending, creating it and its parent directories; a torn
 * tail is truncated away (and logged). One writer per file: the service
 * that owns the state directory. */
int rf_intake_open(const char *path, rf_intake **out);
void rf_intake_close(rf_intake *in);
/* Appends one batch's record (b->run_id, b->seq, every sequence's label and
 * ids) and makes it durable (fdatasync) before returning. On a failed write
 * the file is cut back to its previous size. */
int rf_intake_append(rf_intake *in, const Refinery__V1__TokenBatch *b);
/* Bytes of whole records in the file. */
uint64_t rf_intake_size(const rf_intake *in);

typedef struct rf_intake_info {
    uint64_t records;    /* whole records read */
    uint64_t batches;    /* distinct seqs loaded */
    uint64_t replays;    /* records of a seq seen before: ignored */
    uint64_t sequences;  /* sequences added to the dataset */
    uint64_t empty;      /* sequences with no ids: skipped (also in d->skipped) */
    uint64_t torn_bytes; /* an incomplete last record: ignored */
} rf_intake_info;

/* Appends every sequence of the file at path to d, in (seq, position) order,
 * the first record of each seq winning. Sequences longer than max_len (> 0)
 * are truncated keeping their last id ([SEP]), as token shards are.
 * run_id (when not NULL) must be the run of every record, else
 * RF_ERR_CORRUPT. A missing file is RF_ERR_NOT_FOUND. info may be NULL. */
int rf_intake_load(const char *path, const char *run_id, int max_len, rf_dataset *d,
                   rf_intake_info *info);

#endif
