/* The Hugging Face export: transformers loaded a folder written by `refinery
 * train` (scripts/parity/trainer_export_check.py) and its logits are the
 * fixture; C must give the same logits from the same folder, tokenize text as
 * AutoTokenizer did, and re-exporting must reproduce model.safetensors byte
 * for byte (so what transformers loaded is what the exporter writes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "parity_util.h"
#include "tokenizer/tokenizer.h"
#include "trainer/model.h"
#include "trainer/train.h"

static void test_export_matches_transformers(void **state) {
    char *dir = fixture_path("exported"), *ref_path = fixture_path("exported_logits.safetensors"),
         *in_path = fixture_path("tiny_ref.safetensors");
    rf_bert *m;
    if (rf_bert_load(dir, 0, 0, rf_backend_cpu(), &m)) fail_msg("%s", rf_errmsg());
    rf_st_file *ref, *in;
    assert_int_equal(rf_st_open(ref_path, &ref), 0);
    assert_int_equal(rf_st_open(in_path, &in), 0);
    size_t n, nl, k;
    int32_t *ids = fx_ints(in, "in.ids", &n), *types = fx_ints(in, "in.types", NULL),
            *mask = fx_ints(in, "in.mask", NULL), *labels = fx_ints(in, "in.labels", &nl);
    uint8_t *valid = malloc(n);
    for (size_t i = 0; i < n; i++)
        valid[i] = (uint8_t)mask[i];
    rf_batch b = {(int)nl, (int)(n / nl), ids, types, NULL, valid};
    assert_int_equal(rf_bert_forward(m, &b, false, 0), 0);
    float *want = fx_get(ref, "logits", &k);
    double e = rel_err(m->logits, want, k);
    printf("logits of the exported folder vs transformers: rel err %.3g\n", e);
    assert_true(e <= 1e-4);

    /* text through the exported tokenizer */
    rf_tokenizer *tok;
    assert_int_equal(rf_tokenizer_load(dir, &tok), 0);
    rf_tok_state *st = rf_tok_state_new(tok);
    rf_tok_encoding enc = {0};
    assert_int_equal(rf_tok_encode(st, "a good movie", 12, true, &enc), 0);
    size_t nt;
    int32_t *tids = fx_ints(ref, "text.ids", &nt);
    assert_int_equal(enc.len, nt);
    int32_t ids2[16], types2[16] = {0};
    uint8_t valid2[16];
    for (size_t i = 0; i < nt; i++) {
        assert_int_equal(enc.ids[i], tids[i]);
        ids2[i] = (int32_t)enc.ids[i];
        valid2[i] = 1;
    }
    rf_batch tb = {1, (int)nt, ids2, types2, NULL, valid2};
    assert_int_equal(rf_bert_forward(m, &tb, false, 0), 0);
    float *tw = fx_get(ref, "text.logits", &k);
    assert_true(rel_err(m->logits, tw, k) <= 1e-4);

    /* re-export: byte-identical weights */
    char tmp[] = "/tmp/rf_export_XXXXXX", path[300], *a, *c;
    size_t alen, clen;
    assert_non_null(mkdtemp(tmp));
    assert_int_equal(rf_export_hf(m, dir, tmp), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    assert_int_equal(rf_read_file(path, 1 << 30, &a, &alen), 0);
    char *orig = fixture_path("exported/model.safetensors");
    assert_int_equal(rf_read_file(orig, 1 << 30, &c, &clen), 0);
    assert_int_equal(alen, clen);
    assert_memory_equal(a, c, alen);
    snprintf(path, sizeof path, "rm -rf %s", tmp);
    assert_int_equal(system(path), 0);

    free(a), free(c), free(orig), free(tw), free(tids), free(want);
    free(ids), free(types), free(mask), free(labels), free(valid);
    rf_tok_encoding_free(&enc);
    rf_tok_state_free(st);
    rf_tokenizer_free(tok);
    rf_st_free(ref), rf_st_free(in);
    rf_bert_free(m);
    free(dir), free(ref_path), free(in_path);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_export_matches_transformers)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
