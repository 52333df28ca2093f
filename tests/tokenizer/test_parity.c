/* Bit-exact parity with Hugging Face `tokenizers`: every text of every corpus
 * is encoded and its id hash compared with the committed fixtures made by
 * scripts/parity/tokenizer_fixtures.py (whose docstring defines the corpora
 * and the hash; this file reads the corpora the same way). Prints, per
 * tokenizer x corpus, texts compared and mismatches, and the first mismatches. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/reader.h"
#include "common/utf8.h"
#include "ingest/csv.h"
#include "tokenizer/tokenizer.h"

typedef struct tcorpus {
    rf_buf text; /* all texts back to back */
    size_t *off; /* text i is text.data[off[i] .. off[i+1]) */
    size_t n, cap;
} tcorpus;

static char shared[2048], fixtures[2048];

static void add_text(tcorpus *c, const char *s, size_t len) {
    if (c->n + 2 > c->cap) {
        c->cap = c->cap ? c->cap * 2 : 1024;
        c->off = realloc(c->off, c->cap * sizeof *c->off);
        assert_non_null(c->off);
    }
    c->off[0] = 0;
    assert_int_equal(rf_buf_append(&c->text, s, len), 0);
    c->off[++c->n] = c->text.len;
}

static void corpus_free(tcorpus *c) {
    rf_buf_free(&c->text);
    free(c->off);
    memset(c, 0, sizeof *c);
}

static rf_reader *open_reader(const char *path) {
    rf_reader *r = NULL;
    if (rf_reader_open(path, 1u << 28, &r)) fail_msg("cannot read %s: %s", path, rf_errmsg());
    return r;
}

static void load_lines(tcorpus *c, const char *path, int skip_header, int first_field) {
    rf_reader *r = open_reader(path);
    rf_line l;
    while (rf_reader_next(r, &l) > 0) {
        assert_false(l.too_long);
        if (skip_header && l.lineno == 1) continue;
        size_t len = l.len;
        if (first_field) {
            const char *tab = memchr(l.data, '\t', l.len);
            if (tab) len = (size_t)(tab - l.data);
        }
        add_text(c, l.data, len);
    }
    rf_reader_close(r);
}

static void load_json_strings(tcorpus *c, const char *path, const char *key) {
    rf_reader *r = open_reader(path);
    rf_json_doc *doc = rf_json_doc_new();
    rf_line l;
    while (rf_reader_next(r, &l) > 0) {
        const rf_json *root, *v;
        if (rf_json_parse(doc, l.data, l.len, &root))
            fail_msg("%s:%llu: %s", path, (unsigned long long)l.lineno, rf_errmsg());
        v = key ? rf_json_get(root, key) : root;
        if (rf_json_is_str(v)) add_text(c, v->u.str, v->len);
    }
    rf_json_doc_free(doc);
    rf_reader_close(r);
}

static void load_csv_column(tcorpus *c, const char *path, size_t col) {
    rf_reader *r = open_reader(path);
    rf_csv p;
    rf_csv_opts o = {',', '"', 0};
    rf_csv_init(&p, &o);
    rf_line l;
    while (rf_reader_next(r, &l) > 0) {
        if (rf_csv_feed(&p, l.data, l.len) != RF_CSV_RECORD || p.nfields <= col) continue;
        size_t len;
        const char *f = rf_csv_field(&p, col, &len);
        add_text(c, f, len);
    }
    rf_csv_free(&p);
    rf_reader_close(r);
}

static void load_codepoints(tcorpus *c, const char *sep) {
    rf_buf b = RF_BUF_INIT;
    size_t k = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (k && *sep) assert_int_equal(rf_buf_puts(&b, sep), 0);
        char u[4];
        assert_int_equal(rf_buf_append(&b, u, rf_utf8_encode(cp, u)), 0);
        if (++k == 256) {
            add_text(c, b.data, b.len);
            b.len = 0;
            k = 0;
        }
    }
    if (k) add_text(c, b.data, b.len);
    rf_buf_free(&b);
}

static void load_corpus(tcorpus *c, const char *name) {
    char p[4096];
    memset(c, 0, sizeof *c);
#define SH(rel) (snprintf(p, sizeof p, "%s/%s", shared, rel), p)
    if (!strcmp(name, "sst2_train"))
        load_lines(c, SH("data/sst2/train.tsv"), 1, 1);
    else if (!strcmp(name, "sst2_dev"))
        load_lines(c, SH("data/sst2/dev.tsv"), 1, 1);
    else if (!strcmp(name, "amazon_beauty"))
        load_json_strings(c, SH("data/amazon/All_Beauty_5.json.gz"), "reviewText");
    else if (!strcmp(name, "amazon_appliances"))
        load_json_strings(c, SH("data/amazon/Appliances_5.json.gz"), "reviewText");
    else if (!strcmp(name, "amazon_musical"))
        load_csv_column(c, SH("data/amazon/Musical_instruments_reviews.PARTIAL.csv"), 4);
    else if (!strcmp(name, "wikitext_valid"))
        load_lines(c, SH("data/wikitext2/wiki.valid.raw"), 0, 0);
    else if (!strcmp(name, "wikitext_test"))
        load_lines(c, SH("data/wikitext2/wiki.test.raw"), 0, 0);
    else if (!strcmp(name, "adversarial")) {
        snprintf(p, sizeof p, "%s/adversarial.jsonl", fixtures);
        load_json_strings(c, p, NULL);
    } else if (!strcmp(name, "codepoints_spaced"))
        load_codepoints(c, " ");
    else if (!strcmp(name, "codepoints_dense"))
        load_codepoints(c, "");
    else
        fail_msg("unknown corpus %s", name);
#undef SH
}

static uint64_t corpus_digest(const tcorpus *c) {
    rf_buf b = RF_BUF_INIT;
    for (size_t i = 0; i < c->n; i++) {
        uint64_t len = c->off[i + 1] - c->off[i];
        unsigned char le[8];
        for (int k = 0; k < 8; k++)
            le[k] = (unsigned char)(len >> (8 * k));
        assert_int_equal(rf_buf_append(&b, le, 8), 0);
        assert_int_equal(rf_buf_append(&b, c->text.data + c->off[i], len), 0);
    }
    uint64_t h = rf_hash64(b.data ? b.data : "", b.len, 0);
    rf_buf_free(&b);
    return h;
}

static uint32_t ids_hash(const uint32_t *ids, size_t n) {
    /* the fixture hashes little-endian uint32; this machine is little-endian */
    return (uint32_t)rf_hash64(n ? (const void *)ids : (const void *)"", n * 4, 0);
}

static const struct {
    const char *name, *path; /* path under $SHARED */
} toks[] = {
    {"minilm", "data/tokenizers/all-MiniLM-L6-v2/tokenizer.json"},
    {"gpt2", "data/tokenizers/gpt2/vocab.json"},
    {"tinygpt2", "models/tiny-gpt2/tokenizer.json"},
    {"bertvocab", "data/tokenizers/bert-base-uncased/vocab.txt"},
};
static const char *const corpora[] = {
    "sst2_train",     "sst2_dev",      "amazon_beauty", "amazon_appliances", "amazon_musical",
    "wikitext_valid", "wikitext_test", "adversarial",   "codepoints_spaced", "codepoints_dense"};

static rf_tokenizer *load_tok(size_t t) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", shared, toks[t].path);
    rf_tokenizer *tok = NULL;
    if (rf_tokenizer_load(p, &tok)) fail_msg("load %s: %s", p, rf_errmsg());
    return tok;
}

/* Compares one tokenizer x corpus with its fixture: the ids' hash, or with
 * decode set the hash of decode(ids). Returns mismatches (-1 if no fixture). */
static long compare(rf_tokenizer *tok, rf_tok_state *st, const char *tname, const char *cname,
                    const tcorpus *c, bool decode) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s.%s.%s.gz", fixtures, tname, cname, decode ? "decode" : "hashes");
    rf_reader *r = NULL;
    if (rf_reader_open(p, 4096, &r)) return -1;
    rf_line l;
    assert_int_equal(rf_reader_next(r, &l), 1);
    unsigned long long want_n, want_digest;
    assert_int_equal(sscanf(l.data, "# texts=%llu text_digest=%llx", &want_n, &want_digest), 2);
    if (want_n != c->n || want_digest != corpus_digest(c))
        fail_msg("%s: corpus read differently than the fixture generator did (%zu texts, "
                 "fixture has %llu): check the corpus definitions",
                 cname, c->n, want_n);
    rf_tok_encoding e = {0};
    rf_buf dec = RF_BUF_INIT;
    long bad = 0;
    for (size_t i = 0; i < c->n; i++) {
        assert_int_equal(rf_reader_next(r, &l), 1);
        size_t len = c->off[i + 1] - c->off[i];
        const char *s = c->text.data + c->off[i];
        if (rf_tok_encode(st, s, len, true, &e)) fail_msg("%s #%zu: %s", cname, i, rf_errmsg());
        uint32_t h = ids_hash(e.ids, e.len);
        if (decode) {
            dec.len = 0;
            assert_int_equal(rf_tok_decode(tok, e.ids, e.len, true, &dec), 0);
            h = (uint32_t)rf_hash64(dec.data ? dec.data : "", dec.len, 0);
        }
        char got[16];
        snprintf(got, sizeof got, "%08x", h);
        if (l.len != 8 || memcmp(got, l.data, 8) != 0) {
            if (bad < 5)
                printf("  MISMATCH %s.%s%s #%zu: %.*s\n", tname, cname, decode ? " (decode)" : "",
                       i, (int)(len < 60 ? len : 60), s);
            bad++;
        }
    }
    assert_int_equal(rf_reader_next(r, &l), 0);
    rf_buf_free(&dec);
    rf_tok_encoding_free(&e);
    rf_reader_close(r);
    return bad;
}

static void test_corpora(void **state) {
    tcorpus cs[sizeof corpora / sizeof *corpora];
    for (size_t k = 0; k < sizeof corpora / sizeof *corpora; k++)
        load_corpus(&cs[k], corpora[k]);
    long total_bad = 0, total = 0, dec_total = 0;
    for (size_t t = 0; t < sizeof toks / sizeof *toks; t++) {
        rf_tokenizer *tok = load_tok(t);
        rf_tok_state *st = rf_tok_state_new(tok);
        assert_non_null(st);
        int fixtures_found = 0, decodes = 0;
        for (size_t k = 0; k < sizeof corpora / sizeof *corpora; k++) {
            long bad = compare(tok, st, toks[t].name, corpora[k], &cs[k], false);
            if (bad < 0) continue;
            fixtures_found++;
            printf("parity %-10s %-18s texts=%-6zu mismatches=%ld\n", toks[t].name, corpora[k],
                   cs[k].n, bad);
            total += (long)cs[k].n;
            total_bad += bad;
            bad = compare(tok, st, toks[t].name, corpora[k], &cs[k], true);
            if (bad < 0) continue;
            decodes++;
            printf("parity %-10s %-18s texts=%-6zu decode mismatches=%ld\n", toks[t].name,
                   corpora[k], cs[k].n, bad);
            dec_total += (long)cs[k].n;
            total_bad += bad;
        }
        assert_true(fixtures_found >= 5 && decodes >= 4);
        rf_tok_state_free(st);
        rf_tokenizer_free(tok);
    }
    printf("parity total: %ld encodings and %ld decodings compared, %ld mismatches\n", total,
           dec_total, total_bad);
    for (size_t k = 0; k < sizeof corpora / sizeof *corpora; k++)
        corpus_free(&cs[k]);
    assert_int_equal(total_bad, 0);
}

static void expect_ids(const rf_json *arr, const uint32_t *ids, size_t n, const char *what,
                       const char *tname, size_t line) {
    assert_non_null(arr);
    bool ok = arr->type == RF_JSON_ARRAY && arr->len == n;
    for (size_t i = 0; ok && i < n; i++) {
        int64_t v;
        ok = rf_json_int64(&arr->u.items[i], &v) == 0 && v == (int64_t)ids[i];
    }
    if (!ok) fail_msg("%s.samples.jsonl:%zu: %s differ", tname, line, what);
}

/* Full ids, ids without special tokens, decode() and pairs for the samples. */
static void test_samples(void **state) {
    tcorpus cs[sizeof corpora / sizeof *corpora];
    for (size_t k = 0; k < sizeof corpora / sizeof *corpora; k++)
        load_corpus(&cs[k], corpora[k]);
    for (size_t t = 0; t < sizeof toks / sizeof *toks; t++) {
        rf_tokenizer *tok = load_tok(t);
        rf_tok_state *st = rf_tok_state_new(tok);
        char p[4096];
        snprintf(p, sizeof p, "%s/%s.samples.jsonl", fixtures, toks[t].name);
        rf_reader *r = open_reader(p);
        rf_json_doc *doc = rf_json_doc_new();
        rf_tok_encoding e = {0};
        rf_buf dec = RF_BUF_INIT;
        rf_line l;
        size_t n = 0, pairs = 0;
        while (rf_reader_next(r, &l) > 0) {
            const rf_json *o;
            assert_int_equal(rf_json_parse(doc, l.data, l.len, &o), 0);
            const rf_json *cj = rf_json_get(o, "corpus");
            size_t k = 0;
            while (strcmp(corpora[k], cj->u.str))
                k++;
            const rf_json *pair = rf_json_get(o, "pair");
            int64_t i, j;
            size_t alen, blen;
            if (pair) {
                assert_int_equal(rf_json_int64(&pair->u.items[0], &i), 0);
                assert_int_equal(rf_json_int64(&pair->u.items[1], &j), 0);
                const char *a = cs[k].text.data + cs[k].off[i], *b = cs[k].text.data + cs[k].off[j];
                alen = cs[k].off[i + 1] - cs[k].off[i];
                blen = cs[k].off[j + 1] - cs[k].off[j];
                assert_int_equal(rf_tok_encode_pair(st, a, alen, b, blen, true, &e), 0);
                expect_ids(rf_json_get(o, "ids"), e.ids, e.len, "pair ids", toks[t].name,
                           (size_t)l.lineno);
                expect_ids(rf_json_get(o, "type_ids"), e.type_ids, e.len, "pair type_ids",
                           toks[t].name, (size_t)l.lineno);
                pairs++;
                continue;
            }
            assert_int_equal(rf_json_int64(rf_json_get(o, "index"), &i), 0);
            const char *s = cs[k].text.data + cs[k].off[i];
            alen = cs[k].off[i + 1] - cs[k].off[i];
            assert_int_equal(rf_tok_encode(st, s, alen, true, &e), 0);
            expect_ids(rf_json_get(o, "ids"), e.ids, e.len, "ids", toks[t].name, (size_t)l.lineno);
            dec.len = 0;
            assert_int_equal(rf_tok_decode(tok, e.ids, e.len, true, &dec), 0);
            const rf_json *want = rf_json_get(o, "decoded");
            if (want->len != dec.len || memcmp(want->u.str, dec.data, dec.len))
                fail_msg("%s.samples.jsonl:%llu: decode differs:\n  want %.*s\n  got  %.*s",
                         toks[t].name, (unsigned long long)l.lineno, (int)want->len, want->u.str,
                         (int)dec.len, dec.data);
            assert_int_equal(rf_tok_encode(st, s, alen, false, &e), 0);
            expect_ids(rf_json_get(o, "ids_no_special"), e.ids, e.len, "ids without specials",
                       toks[t].name, (size_t)l.lineno);
            n++;
        }
        printf("samples %-10s %zu texts (ids, no-special ids, decode), %zu pairs: ok\n",
               toks[t].name, n, pairs);
        assert_true(n > 10 && pairs > 5);
        rf_buf_free(&dec);
        rf_tok_encoding_free(&e);
        rf_json_doc_free(doc);
        rf_reader_close(r);
        rf_tok_state_free(st);
        rf_tokenizer_free(tok);
    }
    for (size_t k = 0; k < sizeof corpora / sizeof *corpora; k++)
        corpus_free(&cs[k]);
}

int main(void) {
    const char *sh = getenv("SHARED"), *root = getenv("REFINERY_ROOT");
    if (!sh || !*sh) {
        fprintf(stderr, "test_parity: SHARED is not set (it must point at the shared data "
                        "folder, ../shared from the repository root)\n");
        return 1;
    }
    snprintf(shared, sizeof shared, "%s", sh);
    snprintf(fixtures, sizeof fixtures, "%s/tests/fixtures/tokenizer", root ? root : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpora),
        cmocka_unit_test(test_samples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
