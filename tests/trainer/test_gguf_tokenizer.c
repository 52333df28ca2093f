/* The tokenizer a GGUF file carries: a small hand-made vocabulary built from
 * arrays (added tokens, respelling, merges, the template), and SmolLM2's
 * tokenizer giving the ids transformers gives (AutoTokenizer gguf_file=) on
 * 1000 WikiText-2 test lines, 1000 Amazon reviews and the adversarial texts
 * (fixtures by scripts/parity/gguf_tokenizer_fixtures.py). The SmolLM2 cases
 * need scripts/fetch-smollm2.sh and ../shared; without them they skip and say so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <xxhash.h>
#include <zlib.h>

#include "../support/skip.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/sys.h"
#include "tokenizer/tokenizer.h"
#include "common/gguf.h"
#include "tokenizer/gguf_tokenizer.h"

static void expect_ids(rf_tok_state *st, const char *text, const uint32_t *want, size_t n) {
    rf_tok_encoding e = {0};
    assert_int_equal(rf_tok_encode(st, text, strlen(text), true, &e), 0);
    if (e.len != n || memcmp(e.ids, want, n * sizeof *want) != 0) {
        fprintf(stderr, "'%s': got", text);
        for (size_t i = 0; i < e.len; i++)
            fprintf(stderr, " %u", e.ids[i]);
        fail_msg("ids differ (%zu vs %zu)", e.len, n);
    }
    rf_tok_encoding_free(&e);
}

/* 256 byte tokens (id = byte), then "ab", "<|c|>" (control), "日本" (not in the
 * byte alphabet: respelled), "<u>" (user-defined), " x" spelled "Ġx". */
static void test_from_arrays(void **state) {
    static char bytes[256][3];
    const char *toks[261];
    size_t lens[261];
    int32_t types[261];
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t c = keep ? (uint32_t)b : next++;
        size_t k = c < 0x80 ? (bytes[b][0] = (char)c, 1)
                            : (bytes[b][0] = (char)(0xC0 | c >> 6),
                               bytes[b][1] = (char)(0x80 | (c & 0x3F)), 2);
        toks[b] = bytes[b], lens[b] = k, types[b] = 1;
    }
    const char *extra[] = {"ab", "<|c|>", "日本", "<u>", "Ġx"};
    int32_t extra_type[] = {1, 3, 1, 4, 1};
    for (int i = 0; i < 5; i++)
        toks[256 + i] = extra[i], lens[256 + i] = strlen(extra[i]), types[256 + i] = extra_type[i];
    const char *merges[] = {"a b", "Ġ x"};
    size_t mlens[] = {3, 4};
    rf_tok_bpe_arrays a = {261, toks, lens, types, 2, merges, mlens};
    rf_tokenizer *t;
    assert_int_equal(rf_tokenizer_from_bpe_arrays(&a, &t), 0);
    assert_int_equal(rf_tokenizer_vocab_size(t), 261);
    assert_true(rf_tokenizer_is_special(t, 257));
    assert_false(rf_tokenizer_is_special(t, 259));
    /* "日本" is stored respelled in the byte alphabet: æĹ¥æľ¬ */
    assert_int_equal(
        rf_tokenizer_token_to_id(t, "\xc3\xa6\xc4\xb9\xc2\xa5\xc3\xa6\xc4\xbe\xc2\xac"), 258);
    rf_tok_state *st = rf_tok_state_new(t);
    expect_ids(st, "ab<|c|>ab x", (uint32_t[]){256, 257, 256, 260}, 4);
    expect_ids(st, "<u>a<|c|", (uint32_t[]){259, 'a', '<', '|', 'c', '|'}, 6);
    /* no merge joins the bytes of 日本, so it stays six byte tokens, as in HF */
    expect_ids(st, "日本", (uint32_t[]){0xe6, 0x97, 0xa5, 0xe6, 0x9c, 0xac}, 6);
    rf_buf out = RF_BUF_INIT;
    assert_int_equal(rf_tok_decode(t, (uint32_t[]){256, 257, 260}, 3, true, &out), 0);
    assert_int_equal(out.len, 4), assert_memory_equal(out.data, "ab x", 4);
    rf_buf_free(&out);
    rf_tok_state_free(st);
    rf_tokenizer_free(t);

    const char *bad[] = {"a  b"};
    size_t badl[] = {4};
    rf_tok_bpe_arrays b = {261, toks, lens, types, 1, bad, badl};
    assert_int_equal(rf_tokenizer_from_bpe_arrays(&b, &t), RF_ERR_INVALID);
    const char *missing[] = {"a c"}; /* "ac" is not in the vocabulary */
    rf_tok_bpe_arrays c = {261, toks, lens, types, 1, missing, (size_t[]){3}};
    assert_int_equal(rf_tokenizer_from_bpe_arrays(&c, &t), RF_ERR_INVALID);
    /* bytes 200..255 have no token: dropped from words, as HF's BPE (no unk, no
     * byte fallback) drops them; U+0240 is C9 80 and U+027F C9 BF: only 0x80 and 0xBF stay */
    rf_tok_bpe_arrays d = {200, toks, lens, NULL, 0, NULL, NULL};
    assert_int_equal(rf_tokenizer_from_bpe_arrays(&d, &t), 0);
    st = rf_tok_state_new(t);
    expect_ids(st,
               "a\xc9\x80"
               "b \xc9\xbf",
               (uint32_t[]){'a', 0x80, 'b', ' ', 0xbf}, 5);
    rf_tok_state_free(st);
    rf_tokenizer_free(t);
}

/* The fixture's GGUF has no tokenizer: a clear NOT_FOUND. */
static void test_no_tokenizer(void **state) {
    char p[4200];
    const char *root = getenv("REFINERY_ROOT");
    snprintf(p, sizeof p, "%s/tests/fixtures/gguf/types.gguf", root ? root : ".");
    rf_gguf_file *f;
    assert_int_equal(rf_gguf_open(p, &f), 0);
    rf_tokenizer *t;
    assert_int_equal(rf_gguf_tokenizer(f, &t, NULL), RF_ERR_NOT_FOUND);
    rf_gguf_free(f);
}

typedef struct texts {
    rf_buf *v;
    size_t n;
} texts;

static void push_text(texts *t, const char *s, size_t n) {
    t->v = realloc(t->v, (t->n + 1) * sizeof *t->v);
    t->v[t->n] = (rf_buf)RF_BUF_INIT;
    assert_int_equal(rf_buf_append(&t->v[t->n], s, n), 0);
    t->n++;
}

static void free_texts(texts *t) {
    for (size_t i = 0; i < t->n; i++)
        rf_buf_free(&t->v[i]);
    free(t->v);
}

/* The first n non-empty lines (bytes before each '\n'). */
static int wikitext(const char *shared, size_t n, texts *out) {
    char p[4200], *d;
    size_t len;
    snprintf(p, sizeof p, "%s/data/wikitext2/wiki.test.raw", shared);
    if (rf_read_file(p, 64u << 20, &d, &len)) return -1;
    for (size_t i = 0; i < len && out->n < n;) {
        char *e = memchr(d + i, '\n', len - i);
        size_t end = e ? (size_t)(e - d) : len;
        if (end > i) push_text(out, d + i, end - i);
        i = end + 1;
    }
    free(d);
    return 0;
}

/* The first n string reviewText values of an Amazon .json.gz. */
static int amazon(const char *shared, size_t n, texts *out) {
    char p[4200];
    snprintf(p, sizeof p, "%s/data/amazon/All_Beauty_5.json.gz", shared);
    gzFile g = gzopen(p, "rb");
    if (!g) return -1;
    rf_buf line = RF_BUF_INIT;
    char chunk[1 << 16];
    while (out->n < n) {
        line.len = 0;
        bool got = false;
        while (gzgets(g, chunk, sizeof chunk)) {
            size_t k = strlen(chunk);
            got = true;
            assert_int_equal(rf_buf_append(&line, chunk, k), 0);
            if (k && chunk[k - 1] == '\n') break;
        }
        if (!got) break;
        rf_json_doc *doc = rf_json_doc_new();
        const rf_json *root, *rt;
        if (rf_json_parse(doc, line.data, line.len, &root) == 0 &&
            rf_json_is_str(rt = rf_json_get(root, "reviewText")))
            push_text(out, rt->u.str, rt->len);
        rf_json_doc_free(doc);
    }
    rf_buf_free(&line);
    gzclose(g);
    return 0;
}

static uint64_t text_digest(const texts *t) {
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    for (size_t i = 0; i < t->n; i++) {
        uint8_t l[8];
        for (int k = 0; k < 8; k++)
            l[k] = (uint8_t)((uint64_t)t->v[i].len >> (8 * k));
        XXH3_64bits_update(s, l, 8);
        XXH3_64bits_update(s, t->v[i].data, t->v[i].len);
    }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

static rf_tokenizer *smollm2_tok;
static const char *shared_dir;

/* NULL (and the reason in why) when the model or the data are missing. */
static int load_smollm2(char *why, size_t n) {
    char p[4200];
    const char *root = getenv("REFINERY_ROOT"), *d = getenv("REFINERY_SMOLLM2_DIR");
    if (d && *d)
        snprintf(p, sizeof p, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else
        snprintf(p, sizeof p, "%s/build/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
                 root ? root : ".");
    struct stat st;
    if (stat(p, &st) != 0) {
        snprintf(why, n, "SmolLM2 not found at %s (run scripts/fetch-smollm2.sh)", p);
        return 1;
    }
    shared_dir = getenv("SHARED");
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/data/wikitext2/wiki.test.raw", shared_dir ? shared_dir : "");
    if (!shared_dir || stat(probe, &st) != 0) {
        snprintf(why, n, "shared data not found (SHARED=%s)", shared_dir ? shared_dir : "unset");
        return 1;
    }
    if (smollm2_tok) return 0;
    rf_gguf_file *f;
    if (rf_gguf_open(p, &f)) fail_msg("%s", rf_errmsg());
    rf_gguf_tok_ids ids;
    double t0 = rf_now();
    if (rf_gguf_tokenizer(f, &smollm2_tok, &ids)) fail_msg("%s", rf_errmsg());
    printf("  built SmolLM2's tokenizer from the GGUF metadata in %.3f s\n", rf_now() - t0);
    rf_gguf_free(f);
    assert_int_equal(rf_tokenizer_vocab_size(smollm2_tok), 49152);
    assert_true(ids.bos == 1 && ids.eos == 2 && ids.pad == 2 && ids.unk == 0);
    assert_int_equal(rf_tokenizer_token_to_id(smollm2_tok, "<|im_start|>"), 1);
    assert_true(rf_tokenizer_is_special(smollm2_tok, 2));
    return 0;
}

static int teardown(void **state) {
    rf_tokenizer_free(smollm2_tok);
    return 0;
}

static char *fixture(const char *name) {
    const char *root = getenv("REFINERY_ROOT");
    char p[4200], *d;
    size_t len;
    snprintf(p, sizeof p, "%s/tests/fixtures/gguf/%s", root ? root : ".", name);
    if (rf_read_file(p, 16u << 20, &d, &len)) fail_msg("%s", rf_errmsg());
    return d;
}

static void test_smollm2_corpora(void **state) {
    char why[4400];
    if (load_smollm2(why, sizeof why)) RF_SKIP("%s", why);
    /* REFINERY_GGUF_TOK_FIXTURE: a larger one made with N=... (see the script) */
    const char *big = getenv("REFINERY_GGUF_TOK_FIXTURE");
    char *fx;
    size_t fxlen;
    if (big && *big) {
        if (rf_read_file(big, 64u << 20, &fx, &fxlen)) fail_msg("%s", rf_errmsg());
    } else {
        fx = fixture("smollm2_tokens.txt");
    }
    char *line = strtok(fx, "\n");
    assert_non_null(line); /* the header */
    rf_tok_state *st = rf_tok_state_new(smollm2_tok);
    rf_tok_encoding e = {0};
    size_t total = 0, bad = 0, ntexts = 0, nids = 0;
    double secs = 0;
    while ((line = strtok(NULL, "\n"))) {
        char corpus[64];
        unsigned long long n, digest;
        assert_int_equal(
            sscanf(line, "# corpus %63s texts=%llu text_digest=%llx", corpus, &n, &digest), 3);
        texts tx = {0};
        int rc = strcmp(corpus, "wikitext_test") == 0 ? wikitext(shared_dir, n, &tx)
                                                      : amazon(shared_dir, n, &tx);
        assert_int_equal(rc, 0);
        assert_int_equal(tx.n, n);
        if (text_digest(&tx) != digest)
            fail_msg("%s: the texts read here differ from the fixture's", corpus);
        for (size_t i = 0; i < n; i++) {
            line = strtok(NULL, "\n");
            assert_non_null(line);
            unsigned long long want_n;
            unsigned want_h;
            assert_int_equal(sscanf(line, "%llu %x", &want_n, &want_h), 2);
            double t0 = rf_now();
            assert_int_equal(rf_tok_encode(st, tx.v[i].data, tx.v[i].len, true, &e), 0);
            secs += rf_now() - t0;
            unsigned h = (unsigned)(rf_hash64(e.ids, e.len * sizeof *e.ids, 0) & 0xffffffffu);
            total++;
            nids += e.len;
            if (e.len != want_n || h != want_h) {
                if (bad++ < 5)
                    printf("  MISMATCH %s[%zu]: %zu ids (HF %llu)\n", corpus, i, e.len, want_n);
            }
        }
        ntexts += n;
        free_texts(&tx);
    }
    printf("  %zu texts, %zu ids, %zu differ from transformers; encode %.3f s (%.2f M ids/s)\n",
           total, nids, bad, secs, (double)nids / secs / 1e6);
    assert_true(ntexts >= 2000);
    assert_int_equal(bad, 0);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    free(fx);
}

static void test_smollm2_samples(void **state) {
    char why[4400];
    if (load_smollm2(why, sizeof why)) RF_SKIP("%s", why);
    char *fx = fixture("smollm2_samples.jsonl");
    rf_tok_state *st = rf_tok_state_new(smollm2_tok);
    rf_tok_encoding e = {0};
    texts wt = {0}, am = {0};
    assert_int_equal(wikitext(shared_dir, 1000, &wt), 0);
    assert_int_equal(amazon(shared_dir, 1000, &am), 0);
    size_t n = 0, with_text = 0, npairs = 0;
    rf_buf dec = RF_BUF_INIT;
    for (char *line = strtok(fx, "\n"); line; line = strtok(NULL, "\n")) {
        rf_json_doc *doc = rf_json_doc_new();
        const rf_json *root, *ids, *text, *corpus, *index;
        assert_int_equal(rf_json_parse(doc, line, strlen(line), &root), 0);
        ids = rf_json_get(root, "ids");
        text = rf_json_get(root, "text");
        const char *s;
        size_t len;
        if (text) {
            s = text->u.str, len = text->len;
            with_text++;
        } else {
            corpus = rf_json_get(root, "corpus"), index = rf_json_get(root, "index");
            int64_t i;
            assert_int_equal(rf_json_int64(index, &i), 0);
            const texts *src = strcmp(corpus->u.str, "wikitext_test") == 0 ? &wt : &am;
            assert_true(i >= 0 && (size_t)i < src->n);
            s = src->v[i].data, len = src->v[i].len;
        }
        const rf_json *pair = rf_json_get(root, "pair"), *types = rf_json_get(root, "type_ids");
        if (pair)
            assert_int_equal(rf_tok_encode_pair(st, s, len, pair->u.str, pair->len, true, &e), 0);
        else
            assert_int_equal(rf_tok_encode(st, s, len, true, &e), 0);
        bool same = e.len == ids->len && (!types || types->len == e.len);
        for (size_t k = 0; same && types && k < e.len; k++) {
            int64_t v;
            assert_int_equal(rf_json_int64(&types->u.items[k], &v), 0);
            same = v == (int64_t)e.type_ids[k];
        }
        for (size_t k = 0; same && k < e.len; k++) {
            int64_t v;
            assert_int_equal(rf_json_int64(&ids->u.items[k], &v), 0);
            same = v == (int64_t)e.ids[k];
        }
        if (!same) fail_msg("sample %zu (%.60s...): ids differ from transformers", n, s);
        dec.len = 0;
        assert_int_equal(rf_tok_decode(smollm2_tok, e.ids, e.len, false, &dec), 0);
        n++;
        if (pair) {
            npairs++;
            rf_json_doc_free(doc);
            continue;
        }
        /* decoding: HF's decode of the hand-written texts (bytes without a
         * token are lost); a corpus text comes back whole */
        const rf_json *want = rf_json_get(root, "decoded");
        const char *ws = want ? want->u.str : s;
        size_t wl = want ? want->len : len;
        if (dec.len != wl || memcmp(dec.data, ws, wl) != 0)
            fail_msg("sample %zu: decoded text differs from %s", n,
                     want ? "transformers' decode" : "the text");
        rf_json_doc_free(doc);
    }
    printf("  %zu samples (%zu hand-written, %zu pairs) equal transformers id for id\n", n,
           with_text, npairs);
    assert_int_equal(npairs, 4);
    assert_true(n > 100);
    rf_buf_free(&dec);
    free_texts(&wt);
    free_texts(&am);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    free(fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_arrays),
        cmocka_unit_test(test_no_tokenizer),
        cmocka_unit_test(test_smollm2_corpora),
        cmocka_unit_test(test_smollm2_samples),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
