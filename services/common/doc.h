/* The document record that flows between stages, and its JSON Lines form
 * (the ingest output format, read by dedup and tokenizer):
 *   {"id":"...","text":"...","label":1,"source":"file","line":12,"offset":3456,
 *    "cluster":"9f...","aug_of":"...","messages":[...]}
 * label is omitted when unknown; cluster once dedup has assigned one; aug_of
 * only on augmented copies; messages only on conversations (SFT data).
 *
 * A CONVERSATION is a document with messages: a JSON array of
 * {"role": "system" | "user" | "assistant", "content": "..."} objects, with at
 * least one assistant message, kept in the canonical form rf_messages_canon
 * writes (those two keys, in that order, nothing else). Its text is the
 * contents joined by "\n" (what dedup and the filters look at); the tokenizer
 * stage renders the messages with the model's chat template instead, and the
 * loss covers the assistant turns only (tokenizer/chat.h). */
#ifndef RF_DOC_H
#define RF_DOC_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/json.h"

#define RF_LABEL_NONE (-1)

typedef struct rf_doc {
    char *id;
    char *text;
    size_t text_len;
    int32_t label;    /* RF_LABEL_NONE when unknown */
    char *source;     /* input file name */
    uint64_t line;    /* 1-based line of the record's first byte */
    uint64_t offset;  /* byte offset of the record in the (decompressed) input */
    uint64_t cluster; /* dedup cluster id; 0 until dedup assigns one */
    char *aug_of;     /* id of the source document for augmented copies, else NULL */
    char *messages;   /* a conversation's canonical messages JSON, else NULL */
    size_t messages_len;
} rf_doc;

/* A batch of documents in stream order. seq numbers batches from 0 so that a
 * consumer can restore order after parallel work. The batch owns its docs. */
typedef struct rf_doc_batch {
    rf_doc *docs;
    size_t n;
    size_t cap;
    uint64_t seq;
} rf_doc_batch;

void rf_doc_clear(rf_doc *d);                     /* frees the fields, zeroes d */
int rf_doc_to_json(const rf_doc *d, rf_buf *out); /* appends one line, no '\n' */
/* Fills d from a parsed JSON object in the form above (copies strings). */
int rf_doc_from_json(const rf_json *obj, rf_doc *d);

/* Checks a parsed messages array (the form above) and appends its canonical
 * JSON to out; the contents joined by "\n" go to text when it is not NULL.
 * Returns NULL, or the reason it is refused: "messages_not_array",
 * "bad_message" (not an object, or role/content not strings), "bad_role",
 * "no_assistant", "out_of_memory". */
const char *rf_messages_canon(const rf_json *arr, rf_buf *out, rf_buf *text);

rf_doc_batch *rf_doc_batch_new(size_t cap);
rf_doc *rf_doc_batch_push(rf_doc_batch *b); /* zeroed slot, NULL on OOM */
void rf_doc_batch_free(rf_doc_batch *b);

#endif
