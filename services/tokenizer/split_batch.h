/* The tokenizer stage's job on a batch of documents, shared by its two
 * drivers so that they cannot disagree: the embedded stage
 * (stage_tokenizer.c, which writes shards) and the service
 * (server/tokenizer_service.c, which produces TokenBatch messages). Per
 * document: its token ids and its split (train or eval), or a reject reason.
 * Each driver only adapts its documents to rf_tok_doc views and writes the
 * results its own way.
 *
 * Rules, the same for every caller; bad input never stops a batch and never
 * vanishes, it is rejected with a reason for the caller to count:
 *  - "no_text": a document whose text is NULL or empty. Ingest rejects empty
 *    texts, so one reaching the tokenizer is bad input, not a sequence of
 *    special tokens only (and a protobuf string cannot tell NULL from "").
 *  - "encode_failed": the tokenizer refused the text (say a WordPiece
 *    vocabulary without [UNK] met an unknown word); detail holds its message.
 *  - A conversation (a document with messages, common/doc.h) is encoded with
 *    the chat template in the options (tokenizer/chat.h rf_chat_encode), its
 *    loss mask in the result. "chat_failed": no template, a template this
 *    renderer does not know, or malformed messages (detail says which);
 *    "chat_too_long": longer than max_length tokens (a conversation is never
 *    truncated: that would cut the answer the loss is for). A conversation
 *    whose piecewise ids differ from the whole rendering's is kept and
 *    counted (chat_merged; tokenizer.chat_boundary_merges).
 *  - Out of memory is not about the document: the call fails with
 *    RF_ERR_NOMEM and the caller stops (or retries) the batch.
 * Kept documents go to the eval split when rf_split_is_eval() says so on
 * their dedup cluster, or on their id when the cluster is 0 (a NULL id hashes
 * as ""); `cluster` is that key as the shards store it (shard.h): the
 * cluster, or the id's hash when there is none.
 *
 * Encoding runs on `threads` threads (OpenMP); results are in document order
 * and do not depend on the thread count. */
#ifndef RF_TOKENIZER_SPLIT_BATCH_H
#define RF_TOKENIZER_SPLIT_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/stats.h"
#include "tokenizer/tokenizer.h"

#define RF_TOK_REJECT_NO_TEXT "no_text"
#define RF_TOK_REJECT_ENCODE  "encode_failed"
#define RF_TOK_REJECT_CHAT    "chat_failed"
#define RF_TOK_REJECT_LONG    "chat_too_long"

enum { RF_SPLIT_TRAIN = 0, RF_SPLIT_EVAL = 1 };

/* A document as the tokenizer needs it; the strings are borrowed. */
typedef struct rf_tok_doc {
    const char *id; /* NULL counts as "" */
    const char *text;
    size_t text_len;
    uint64_t cluster;     /* dedup cluster id, 0 when dedup did not run */
    const char *messages; /* a conversation's canonical messages JSON, else NULL */
    size_t messages_len;
} rf_tok_doc;

typedef struct rf_tok_result {
    const char *reject;  /* NULL (kept), RF_TOK_REJECT_NO_TEXT or RF_TOK_REJECT_ENCODE */
    char detail[192];    /* encode_failed: the tokenizer's message; else "" */
    int split;           /* kept: RF_SPLIT_TRAIN or RF_SPLIT_EVAL */
    uint64_t cluster;    /* kept: the split key (see above) */
    rf_tok_encoding enc; /* kept: the ids, enc.ids[0..enc.len) */
    uint8_t *mask;       /* kept conversation: the loss mask, enc.len bytes; else NULL */
    bool chat_merged;    /* kept conversation: see above */
} rf_tok_result;

typedef struct rf_tok_split_opts {
    bool add_special; /* add the post-processor's special tokens */
    double eval_fraction;
    uint64_t seed;
    int threads;               /* >= 1 */
    const char *chat_template; /* for conversations (borrowed); NULL: none */
    size_t max_length;         /* conversations longer are rejected; 0: no limit */
} rf_tok_split_opts;

typedef struct rf_tok_splitter rf_tok_splitter;

/* tok (borrowed) must outlive the splitter; its truncation and padding
 * settings apply. Returns 0 or RF_ERR_NOMEM / RF_ERR_INVALID (threads < 1). */
int rf_tok_splitter_new(const rf_tokenizer *tok, const rf_tok_split_opts *o, rf_tok_splitter **out);
void rf_tok_splitter_free(rf_tok_splitter *s);

/* Encodes and splits docs[0..n). *out receives n results, owned by s and
 * valid until its next call. Returns 0, or RF_ERR_NOMEM. */
int rf_tok_split_batch(rf_tok_splitter *s, const rf_tok_doc *docs, size_t n,
                       const rf_tok_result **out);

/* Counts a rejected result in stats as tokenizer.rejected.<reason>, the
 * name both drivers use; nothing for a kept one. */
void rf_tok_result_count(const rf_tok_result *r, rf_stats *stats);

/* Invalid UTF-8 sequences the tokenizer repaired so far (rf_tok_state_repaired). */
uint64_t rf_tok_splitter_repaired(const rf_tok_splitter *s);

#endif
