/* libFuzzer target: the tokenizer.json loader. Any input must load or fail
 * cleanly; a tokenizer that loads must encode and decode without faults and
 * produce ids below its vocabulary size. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rf_tokenizer *t = NULL;
    if (rf_tokenizer_from_json((const char *)data, size, &t)) return 0;
    static const char *const texts[] = {"Hello, world! [SEP] caf\xc3\xa9 \xe4\xb8\xad",
                                        "  's <|endoftext|> 123 \xf0\x9f\x98\x80", ""};
    rf_tok_state *st = rf_tok_state_new(t);
    rf_tok_encoding e = {0};
    rf_buf out = RF_BUF_INIT;
    for (size_t i = 0; st && i < sizeof texts / sizeof *texts; i++) {
        if (rf_tok_encode(st, texts[i], strlen(texts[i]), true, &e) == 0) {
            for (size_t k = 0; k < e.len; k++)
                if (e.ids[k] >= rf_tokenizer_vocab_size(t) && !(e.attention_mask[k] == 0))
                    __builtin_trap();
            rf_tok_decode(t, e.ids, e.len, i & 1, &out);
        }
        rf_tok_encode_pair(st, texts[i], strlen(texts[i]), texts[0], 5, true, &e);
    }
    rf_buf_free(&out);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    rf_tokenizer_free(t);
    return 0;
}
