/* libFuzzer target: the GGUF parser, metadata getters, dequantization and the
 * tokenizer built from GGUF metadata (then one encode and decode) on
 * arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "tokenizer/gguf_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1); /* exact size: overreads are caught */
    if (!buf) return 0;
    memcpy(buf, data, size);
    rf_gguf_file *f;
    if (rf_gguf_parse(buf, size, &f) != 0) {
        free(buf);
        return 0;
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const rf_gguf_kv *kv = &f->kv[i];
        uint64_t u;
        float x;
        bool b;
        const char *s;
        size_t n;
        int64_t v;
        rf_gguf_get_u64(f, kv->key, &u);
        rf_gguf_get_f32(f, kv->key, &x);
        rf_gguf_get_bool(f, kv->key, &b);
        rf_gguf_get_str(f, kv->key, &s, &n);
        for (uint64_t j = 0; j < kv->n && j < 64; j++) {
            rf_gguf_arr_str(kv, j, &s, &n);
            rf_gguf_arr_int(kv, j, &v);
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const rf_gguf_tensor *t = &f->tensors[i];
        if (t->numel > (1u << 20)) continue;
        float *x = malloc(t->numel * sizeof(float) + 1);
        if (x) rf_gguf_dequant(t, x);
        free(x);
    }
    rf_tokenizer *tok;
    if (rf_gguf_tokenizer(f, &tok, NULL) == 0) {
        rf_tok_state *st = rf_tok_state_new(tok);
        rf_tok_encoding e = {0};
        static const char text[] = "Hello <|im_start|>wörld 123 \x04--\x16--";
        if (st && rf_tok_encode(st, text, sizeof text - 1, true, &e) == 0) {
            rf_buf out = RF_BUF_INIT;
            rf_tok_decode(tok, e.ids, e.len, false, &out);
            rf_buf_free(&out);
        }
        rf_tok_encoding_free(&e);
        rf_tok_state_free(st);
        rf_tokenizer_free(tok);
    }
    rf_gguf_free(f);
    free(buf);
    return 0;
}
