/* Conversations through a chat template (tokenizer/chat.h): rendering with
 * and without the generation prompt, the SFT encoding and its loss mask,
 * parsing canonical messages, finding a model's template, and the
 * conversation path of rf_tok_split_batch (its rejects). The tokenizer is
 * tiny-gpt2's byte-level BPE (../shared) with <|im_start|> and <|im_end|>
 * added as special tokens, as ChatML models add them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "tokenizer/chat.h"
#include "tokenizer/split_batch.h"
#include "tokenizer/tokenizer.h"
#include "../support/skip.h"

static const char *smol =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

static char tmpdir[] = "/tmp/rf_chat_XXXXXX";

/* tiny-gpt2's tokenizer.json with the two ChatML tokens added (ids 50257, 50258) */
static rf_tokenizer *chatml_tokenizer(void) {
    const char *shared = getenv("SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/tiny-gpt2/tokenizer.json",
             shared ? shared : "../shared");
    char *text;
    size_t len;
    if (rf_read_file(path, 64 << 20, &text, &len) != RF_OK) return NULL;
    const char *key = "[";
    char *p = strstr(text, "\"added_tokens\""); /* its list, whatever the spacing */
    assert_non_null(p);
    p = strchr(p, '[');
    assert_non_null(p);
    const char *add =
        "{\"id\":50257,\"content\":\"<|im_start|>\",\"single_word\":false,\"lstrip\":"
        "false,\"rstrip\":false,\"normalized\":false,\"special\":true},{\"id\":50258,"
        "\"content\":\"<|im_end|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":"
        "false,\"normalized\":false,\"special\":true},";
    size_t head = (size_t)(p - text) + strlen(key), n = len + strlen(add);
    char *out = malloc(n);
    assert_non_null(out);
    memcpy(out, text, head);
    memcpy(out + head, add, strlen(add));
    memcpy(out + head + strlen(add), text + head, len - head);
    rf_tokenizer *tok = NULL;
    assert_int_equal(rf_tokenizer_from_json(out, n, &tok), 0);
    free(out);
    free(text);
    return tok;
}

static void decode_masked(const rf_tokenizer *tok, const rf_tok_encoding *e, const uint8_t *mask,
                          uint8_t want, rf_buf *out) {
    rf_buf_reset(out);
    uint32_t *ids = malloc(e->len * sizeof *ids);
    size_t k = 0;
    for (size_t i = 0; i < e->len; i++)
        if (mask[i] == want) ids[k++] = e->ids[i];
    assert_int_equal(rf_tok_decode(tok, ids, k, false, out), 0);
    assert_int_equal(rf_buf_putc(out, 0), 0);
    free(ids);
}

static void test_render(void **state) {
    (void)state;
    rf_chat_msg m[] = {{"user", "Is it good?"}, {"assistant", "positive"}};
    rf_buf b = RF_BUF_INIT;
    assert_int_equal(rf_chat_render(smol, m, 2, false, &b), 0);
    assert_int_equal(rf_buf_putc(&b, 0), 0);
    assert_string_equal(b.data, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                                "trained by Hugging Face<|im_end|>\n<|im_start|>user\nIs it "
                                "good?<|im_end|>\n<|im_start|>assistant\npositive<|im_end|>\n");
    rf_buf_free(&b);
}

static void test_encode_mask(void **state) {
    (void)state;
    rf_tokenizer *tok = chatml_tokenizer();
    if (!tok) RF_SKIP("../shared/models/tiny-gpt2/tokenizer.json is missing");
    rf_tok_state *ts = rf_tok_state_new(tok);
    rf_tok_encoding e = {0}, whole = {0};
    uint8_t *mask;
    bool merged;
    rf_buf b = RF_BUF_INIT, t = RF_BUF_INIT;
    /* two assistant turns, one starting with a space and one with a newline */
    rf_chat_msg m[] = {{"system", "Be brief."},
                       {"user", "Is it good?"},
                       {"assistant", " yes"},
                       {"user", "And now?\n"},
                       {"assistant", "\nno, it\u2019s bad"}};
    assert_int_equal(rf_chat_encode(ts, smol, m, 5, &e, &mask, &merged), 0);
    assert_false(merged);
    assert_int_equal(rf_chat_render(smol, m, 5, false, &t), 0);
    assert_int_equal(rf_tok_encode(ts, t.data, t.len, false, &whole), 0);
    assert_int_equal(whole.len, e.len); /* the ids of the whole rendering */
    assert_memory_equal(whole.ids, e.ids, e.len * sizeof *e.ids);
    decode_masked(tok, &e, mask, 1, &b);
    assert_string_equal(b.data, " yes<|im_end|>\n\nno, it\u2019s bad<|im_end|>\n");
    decode_masked(tok, &e, mask, 0, &b);
    assert_string_equal(b.data, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nIs it "
                                "good?<|im_end|>\n<|im_start|>assistant\n<|im_start|>user\nAnd "
                                "now?\n<|im_end|>\n<|im_start|>assistant\n");
    size_t runs = 0; /* the targets are two contiguous runs */
    for (size_t i = 0; i < e.len; i++)
        runs += mask[i] == 1 && (i == 0 || mask[i - 1] == 0);
    assert_int_equal(runs, 2);
    free(mask);
    /* no template, and a template this renderer does not know */
    assert_int_equal(rf_chat_encode(ts, NULL, m, 5, &e, &mask, &merged), RF_ERR_NOT_FOUND);
    assert_int_equal(rf_chat_encode(ts, "{{ messages }}", m, 5, &e, &mask, &merged),
                     RF_ERR_UNSUPPORTED);
    rf_buf_free(&b);
    rf_buf_free(&t);
    rf_tok_encoding_free(&e);
    rf_tok_encoding_free(&whole);
    rf_tok_state_free(ts);
    rf_tokenizer_free(tok);
}

static void test_msgs_parse(void **state) {
    (void)state;
    rf_chat_msg *m;
    size_t n;
    char *store;
    const char *ok = "[{\"role\":\"user\",\"content\":\"a\\nb\"},{\"role\":\"assistant\","
                     "\"content\":\"\"}]";
    assert_int_equal(rf_chat_msgs_parse(ok, strlen(ok), &m, &n, &store), 0);
    assert_int_equal(n, 2);
    assert_string_equal(m[0].role, "user");
    assert_string_equal(m[0].content, "a\nb");
    assert_string_equal(m[1].content, "");
    free(m);
    free(store);
    assert_int_equal(rf_chat_msgs_parse("{}", 2, &m, &n, &store), RF_ERR_INVALID);
    assert_null(m);
    assert_int_equal(rf_chat_msgs_parse("[{\"role\":1}]", 12, &m, &n, &store), RF_ERR_INVALID);
    assert_int_equal(rf_chat_msgs_parse("[{", 2, &m, &n, &store), RF_ERR_PARSE);
}

static void write_text(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_template_find(void **state) {
    (void)state;
    assert_non_null(mkdtemp(tmpdir));
    char *t, p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    write_text("tokenizer.json", "{}");
    assert_int_equal(rf_chat_template_find(p, &t), 0); /* none: not an error */
    assert_null(t);
    write_text("chat_template.jinja", "J");
    assert_int_equal(rf_chat_template_find(tmpdir, &t), 0);
    assert_string_equal(t, "J");
    free(t);
    write_text("tokenizer_config.json", "{\"chat_template\":\"C\\n\"}"); /* wins over the .jinja */
    assert_int_equal(rf_chat_template_find(p, &t), 0);
    assert_string_equal(t, "C\n");
    free(t);
    snprintf(p, sizeof p, "%s/missing.json", tmpdir);
    assert_int_equal(rf_chat_template_find(p, &t), RF_ERR_NOT_FOUND);
    snprintf(p, sizeof p, "rm -rf %s", tmpdir);
    assert_int_equal(system(p), 0);
}

/* rf_tok_split_batch on conversations: the mask in the result, and rejects */
static void test_split_batch(void **state) {
    (void)state;
    rf_tokenizer *tok = chatml_tokenizer();
    if (!tok) RF_SKIP("../shared/models/tiny-gpt2/tokenizer.json is missing");
    const char *msgs = "[{\"role\":\"user\",\"content\":\"Q?\"},{\"role\":\"assistant\","
                       "\"content\":\"A\"}]";
    const char *bad = "[{\"role\":\"user\"}]";
    rf_tok_doc docs[] = {
        {"a", "Q? A", 4, 0, msgs, strlen(msgs)},
        {"b", "plain text", 10, 0, NULL, 0},
        {"c", "x", 1, 0, bad, strlen(bad)},
    };
    for (int pass = 0; pass < 3; pass++) {
        rf_tok_split_opts o = {.threads = 1,
                               .chat_template = pass == 1 ? NULL : smol,
                               .max_length = pass == 2 ? 8 : 0};
        rf_tok_splitter *s;
        assert_int_equal(rf_tok_splitter_new(tok, &o, &s), 0);
        const rf_tok_result *r;
        assert_int_equal(rf_tok_split_batch(s, docs, 3, &r), 0);
        if (pass == 0) {
            assert_null(r[0].reject);
            assert_non_null(r[0].mask);
            size_t targets = 0;
            for (size_t i = 0; i < r[0].enc.len; i++)
                targets += r[0].mask[i];
            assert_int_equal(targets, 3); /* "A", "<|im_end|>", "\n" */
        } else {
            assert_string_equal(r[0].reject, pass == 1 ? RF_TOK_REJECT_CHAT : RF_TOK_REJECT_LONG);
            assert_non_null(strstr(r[0].detail, pass == 1 ? "no chat template" : "max_length 8"));
        }
        assert_null(r[1].reject); /* a plain document is encoded as before, without a mask */
        assert_null(r[1].mask);
        assert_string_equal(r[2].reject, RF_TOK_REJECT_CHAT);
        rf_tok_splitter_free(s);
    }
    rf_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),      cmocka_unit_test(test_encode_mask),
        cmocka_unit_test(test_msgs_parse),  cmocka_unit_test(test_template_find),
        cmocka_unit_test(test_split_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
