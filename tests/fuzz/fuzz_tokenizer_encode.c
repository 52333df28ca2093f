/* libFuzzer target: both encoders on arbitrary bytes, with the real MiniLM
 * (WordPiece) and GPT-2 (byte-level BPE) vocabularies from $SHARED (or
 * ../shared). Byte 0 picks the tokenizer and mode; the rest is the text.
 * Invariants: ids below the vocabulary size, MiniLM within its truncation
 * (256), identical results from a second state, and for byte-level BPE
 * decode(encode(x)) == x after UTF-8 repair. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/utf8.h"
#include "tokenizer/tokenizer.h"

static rf_tokenizer *toks[2];
static rf_tok_state *states[2][2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *sh = getenv("SHARED");
    char p[4096];
    static const char *const rel[] = {"data/tokenizers/all-MiniLM-L6-v2/tokenizer.json",
                                      "data/tokenizers/gpt2/vocab.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", sh && *sh ? sh : "../shared", rel[i]);
        if (rf_tokenizer_load(p, &toks[i])) {
            fprintf(stderr, "fuzz_tokenizer_encode: cannot load %s (set SHARED)\n", p);
            abort();
        }
        states[i][0] = rf_tok_state_new(toks[i]);
        states[i][1] = rf_tok_state_new(toks[i]);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 1, pair = (data[0] >> 1) & 1, special = (data[0] >> 2) & 1;
    const char *s = (const char *)data + 1;
    size_t n = size - 1, half = n / 2;
    rf_tokenizer *t = toks[which];
    rf_tok_encoding a = {0}, b = {0};
    int ra = pair ? rf_tok_encode_pair(states[which][0], s, half, s + half, n - half, special, &a)
                  : rf_tok_encode(states[which][0], s, n, special, &a);
    int rb = pair ? rf_tok_encode_pair(states[which][1], s, half, s + half, n - half, special, &b)
                  : rf_tok_encode(states[which][1], s, n, special, &b);
    if (ra != rb || (ra == 0 && (a.len != b.len || (a.len && memcmp(a.ids, b.ids, a.len * 4)))))
        __builtin_trap();
    if (ra == 0) {
        for (size_t i = 0; i < a.len; i++)
            if (a.ids[i] >= rf_tokenizer_vocab_size(t)) __builtin_trap();
        if (which == 0 && a.len > 256) __builtin_trap();
        if (which == 1 && !pair) {
            rf_buf dec = RF_BUF_INIT, want = RF_BUF_INIT;
            if (rf_tok_decode(t, a.ids, a.len, false, &dec) || rf_utf8_repair(s, n, &want) < 0)
                __builtin_trap();
            if (dec.len != want.len || (dec.len && memcmp(dec.data, want.data, dec.len)))
                __builtin_trap();
            rf_buf_free(&dec);
            rf_buf_free(&want);
        }
    }
    rf_tok_encoding_free(&a);
    rf_tok_encoding_free(&b);
    return 0;
}
