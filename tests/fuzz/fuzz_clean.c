/* libFuzzer target: text cleaning with every option on (HTML included), then
 * the quality filters and language identification on the result; the quality
 * filters also on the raw bytes (they must tolerate invalid UTF-8). Checks the
 * output invariants: valid UTF-8, no controls, no runs of spaces, trimmed, and
 * (without HTML, which is not idempotent: "&amp;lt;") cleaning is idempotent. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/buf.h"
#include "common/utf8.h"
#include "ingest/clean.h"
#include "ingest/filter.h"
#include "ingest/langid.h"

static void check_invariants(const rf_buf *out) {
    if (!rf_utf8_valid(out->data, out->len)) __builtin_trap();
    if (out->len && (out->data[0] == ' ' || out->data[out->len - 1] == ' ')) __builtin_trap();
    for (size_t i = 0; i < out->len; i++) {
        unsigned char c = (unsigned char)out->data[i];
        if (c < 0x20 || c == 0x7F) __builtin_trap();
        if (c == ' ' && i + 1 < out->len && out->data[i + 1] == ' ') __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rf_clean_opts o;
    rf_clean_opts_default(&o);
    o.html_unescape = o.strip_tags = o.lowercase = true;
    rf_buf out = RF_BUF_INIT, again = RF_BUF_INIT;
    rf_clean_result res;
    if (rf_clean_text(&o, (const char *)data, size, &out, &res) == 0 && !res.reject) {
        check_invariants(&out);
        rf_quality_opts q;
        rf_quality_opts_gopher(&q);
        const char *reason;
        rf_quality_check(&q, out.data, out.len, &reason);
        rf_langid_result lr;
        if (rf_langid_detect(out.data, out.len, &lr) != 0) __builtin_trap();
    }
    rf_quality_opts raw;
    rf_quality_opts_gopher(&raw);
    raw.ngram_min_words = 0;
    const char *why;
    if (rf_quality_check(&raw, (const char *)data, size, &why) != 0) __builtin_trap();
    o.html_unescape = o.strip_tags = false;
    if (rf_clean_text(&o, (const char *)data, size, &out, &res) == 0 && !res.reject) {
        check_invariants(&out);
        if (rf_clean_text(&o, out.data, out.len, &again, &res) != 0 || res.reject ||
            again.len != out.len || memcmp(again.data, out.data, out.len) != 0)
            __builtin_trap();
    }
    rf_buf_free(&out);
    rf_buf_free(&again);
    return 0;
}
