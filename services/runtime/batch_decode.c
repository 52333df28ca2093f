#include "runtime/batch_decode.h"

#include <string.h>

#include "common/error.h"
#include "common/utf8.h"

static bool utf8(const char *s) {
    return !s || rf_utf8_valid(s, strlen(s));
}

int rf_svc_unpack_documents(const rf_kafka_msg *m, Refinery__V1__DocumentBatch **out) {
    Refinery__V1__DocumentBatch *b =
        refinery__v1__document_batch__unpack(NULL, m->len, (const uint8_t *)m->value);
    if (!b) return rf_fail(RF_ERR_PARSE, "not a DocumentBatch");
    for (size_t i = 0; i < b->n_docs; i++) {
        const Refinery__V1__Document *d = b->docs[i];
        if (!utf8(d->id) || !utf8(d->text) || !utf8(d->source) || !utf8(d->aug_of)) {
            refinery__v1__document_batch__free_unpacked(b, NULL);
            return rf_fail(RF_ERR_PARSE, "docs[%zu] has a string that is not UTF-8", i);
        }
    }
    *out = b;
    return RF_OK;
}
