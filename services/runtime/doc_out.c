/* rf_doc views as protobuf Documents, and their DocumentBatch. */
#include "runtime/doc_out.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/utf8.h"

const char *rf_doc_out_refusal(const rf_doc *d) {
    if (strlen(d->text) != d->text_len) return "nul_in_text";
    if (!rf_utf8_valid(d->id, strlen(d->id))) return "invalid_utf8_id";
    return NULL;
}

int rf_doc_out_add(rf_doc_out *o, const rf_doc *d) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        Refinery__V1__Document *docs = realloc(o->docs, cap * sizeof *docs);
        if (!docs) return RF_ERR_NOMEM;
        o->docs = docs;
        Refinery__V1__Document **ptrs = realloc(o->ptrs, cap * sizeof *ptrs);
        if (!ptrs) return RF_ERR_NOMEM;
        o->ptrs = ptrs;
        o->cap = cap;
        for (size_t i = 0; i < o->n; i++) /* docs may have moved */
            o->ptrs[i] = &o->docs[i];
    }
    Refinery__V1__Document *m = &o->docs[o->n];
    refinery__v1__document__init(m);
    m->id = d->id;
    m->text = d->text;
    m->source = d->source;
    m->label = d->label;
    m->line = d->line;
    m->offset = d->offset;
    o->ptrs[o->n++] = m;
    return RF_OK;
}

int rf_doc_out_produce(rf_doc_out *o, rf_kafka_producer *p, rf_kafka_tracker *t, const char *topic,
                       const char *run_id, uint64_t seq) {
    if (o->n == 0) return RF_OK;
    Refinery__V1__DocumentBatch b = REFINERY__V1__DOCUMENT_BATCH__INIT;
    b.run_id = (char *)run_id;
    b.seq = seq;
    b.docs = o->ptrs;
    b.n_docs = o->n;
    o->n = 0;
    size_t len = refinery__v1__document_batch__get_packed_size(&b);
    rf_buf_reset(&o->pack);
    if (rf_buf_reserve(&o->pack, len)) return RF_ERR_NOMEM;
    refinery__v1__document_batch__pack(&b, (uint8_t *)o->pack.data);
    return rf_kafka_produce_tracked(p, t, topic, run_id, strlen(run_id), o->pack.data, len);
}

void rf_doc_out_free(rf_doc_out *o) {
    free(o->docs);
    free(o->ptrs);
    rf_buf_free(&o->pack);
    memset(o, 0, sizeof *o);
}
