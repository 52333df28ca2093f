/* The dedup service's batch journal: which input batches (run_id, seq) the
 * dedup index has decided, in order, with their document ids.
 *
 * The dedup engine decides "the next n documents of the stream" and, after a
 * restart, expects the stream again from its start to replay committed
 * decisions. A Kafka consumer cannot re-read its input from the start, so the
 * service journals each batch before committing the engine, and records the
 * journal's size in that commit (rf_dedup_commit's first size): reopening
 * truncates the journal to that size, so journal and index always describe
 * the same batches, and replaying the journal's ids through the engine brings
 * it back to where it was, with every earlier batch's decisions.
 *
 * Record (little-endian): u32 magic, u32 run_len, run bytes, u64 seq, u32 n,
 * then n times (u32 id_len, id bytes). */
#ifndef RF_SVC_DEDUP_JOURNAL_H
#define RF_SVC_DEDUP_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/doc.h"

typedef struct rf_dedup_journal rf_dedup_journal;

/* Opens (creating) path and truncates it to size bytes; RF_ERR_INVALID when
 * the file is shorter than that (it does not belong to the index). */
int rf_dedup_journal_open(const char *path, uint64_t size, rf_dedup_journal **out);
void rf_dedup_journal_close(rf_dedup_journal *j);

/* Appends one batch's record and makes it durable (fsync); *size is the
 * journal's new size. */
int rf_dedup_journal_append(rf_dedup_journal *j, const char *run_id, uint64_t seq,
                            const rf_doc *docs, size_t n, uint64_t *size);
/* The same in two steps, so that several records share one fsync: write
 * hands the record to the OS, sync makes everything written durable. */
int rf_dedup_journal_write(rf_dedup_journal *j, const char *run_id, uint64_t seq,
                           const rf_doc *docs, size_t n, uint64_t *size);
int rf_dedup_journal_sync(rf_dedup_journal *j);

/* Calls fn for every record in order; docs hold only ids (pointing into a
 * buffer valid during the call). A malformed record is RF_ERR_CORRUPT; fn's
 * error stops the walk and is returned. */
typedef int (*rf_dedup_journal_fn)(void *user, const char *run_id, uint64_t seq, const rf_doc *docs,
                                   size_t n);
int rf_dedup_journal_replay(rf_dedup_journal *j, rf_dedup_journal_fn fn, void *user);

#endif
