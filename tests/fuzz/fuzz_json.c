/* libFuzzer target: the JSON parser and the document reader on top of it. */
#include <stddef.h>
#include <stdint.h>

#include "common/doc.h"
#include "common/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static rf_json_doc *doc;
    if (!doc) doc = rf_json_doc_new();
    const rf_json *root;
    if (rf_json_parse(doc, (const char *)data, size, &root) == 0) {
        rf_doc d;
        if (rf_doc_from_json(root, &d) == 0) {
            rf_buf b = RF_BUF_INIT;
            rf_doc_to_json(&d, &b);
            rf_buf_free(&b);
            rf_doc_clear(&d);
        }
    }
    return 0;
}
