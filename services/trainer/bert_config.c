#include "trainer/bert_config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"

static int get_int(const rf_json *root, const char *key, int def, int min, int max, int *out) {
    const rf_json *v = rf_json_get(root, key);
    int64_t x;
    if (!v) {
        if (def < 0) return rf_fail(RF_ERR_INVALID, "config.json: missing '%s'", key);
        *out = def;
        return RF_OK;
    }
    if (rf_json_int64(v, &x) != 0 || x < min || x > max)
        return rf_fail(RF_ERR_INVALID, "config.json: '%s' must be an integer in [%d, %d]", key, min,
                       max);
    *out = (int)x;
    return RF_OK;
}

static int get_real(const rf_json *root, const char *key, double def, double min, double max,
                    float *out) {
    const rf_json *v = rf_json_get(root, key);
    if (!v || v->type == RF_JSON_NULL) {
        *out = (float)def;
        return RF_OK;
    }
    if (v->type != RF_JSON_NUMBER || !(v->num >= min && v->num <= max))
        return rf_fail(RF_ERR_INVALID, "config.json: '%s' must be a number in [%g, %g]", key, min,
                       max);
    *out = (float)v->num;
    return RF_OK;
}

static int check_str(const rf_json *root, const char *key, const char *want) {
    const rf_json *v = rf_json_get(root, key);
    if (!v) return RF_OK;
    if (!rf_json_is_str(v) || strcmp(v->u.str, want) != 0)
        return rf_fail(RF_ERR_UNSUPPORTED, "config.json: '%s' is '%s'; only '%s' is supported", key,
                       rf_json_is_str(v) ? v->u.str : "(not a string)", want);
    return RF_OK;
}

int rf_bert_config_parse(const char *text, size_t len, int default_labels, rf_bert_config *c) {
    memset(c, 0, sizeof *c);
    rf_json_doc *doc = rf_json_doc_new();
    if (!doc) return RF_ERR_NOMEM;
    const rf_json *r;
    int rc = rf_json_parse(doc, text, len, &r);
    if (rc) {
        rc = rf_fail_ctx(RF_ERR_PARSE, "config.json");
        goto out;
    }
    if (r->type != RF_JSON_OBJECT) {
        rc = rf_fail(RF_ERR_PARSE, "config.json: not a JSON object");
        goto out;
    }
    const int big = 1 << 24;
    if ((rc = check_str(r, "model_type", "bert")) || (rc = check_str(r, "hidden_act", "gelu")) ||
        (rc = check_str(r, "position_embedding_type", "absolute")) ||
        (rc = get_int(r, "vocab_size", -1, 1, big, &c->vocab_size)) ||
        (rc = get_int(r, "hidden_size", -1, 1, 65536, &c->hidden_size)) ||
        (rc = get_int(r, "num_hidden_layers", -1, 1, 1024, &c->num_layers)) ||
        (rc = get_int(r, "num_attention_heads", -1, 1, 1024, &c->num_heads)) ||
        (rc = get_int(r, "intermediate_size", -1, 1, 1 << 20, &c->intermediate_size)) ||
        (rc = get_int(r, "max_position_embeddings", 512, 1, 1 << 20, &c->max_position)) ||
        (rc = get_int(r, "type_vocab_size", 2, 1, 1024, &c->type_vocab_size)) ||
        (rc = get_int(r, "pad_token_id", 0, 0, big, &c->pad_token_id)) ||
        (rc = get_real(r, "layer_norm_eps", 1e-12, 0, 1, &c->layer_norm_eps)) ||
        (rc = get_real(r, "initializer_range", 0.02, 0, 10, &c->initializer_range)) ||
        (rc = get_real(r, "hidden_dropout_prob", 0.1, 0, 0.999, &c->hidden_dropout)) ||
        (rc = get_real(r, "attention_probs_dropout_prob", 0.1, 0, 0.999, &c->attention_dropout)) ||
        (rc = get_real(r, "classifier_dropout", c->hidden_dropout, 0, 0.999,
                       &c->classifier_dropout)))
        goto out;
    if (c->hidden_size % c->num_heads) {
        rc = rf_fail(RF_ERR_INVALID, "config.json: hidden_size %d is not a multiple of %d heads",
                     c->hidden_size, c->num_heads);
        goto out;
    }
    const rf_json *id2label = rf_json_get(r, "id2label");
    int labels = id2label && id2label->type == RF_JSON_OBJECT ? (int)id2label->len : 2;
    if ((rc = get_int(r, "num_labels", labels, 1, RF_BERT_MAX_LABELS, &c->num_labels))) goto out;
    if (default_labels > 0) c->num_labels = default_labels;
    if (c->num_labels < 2) {
        rc = rf_fail(RF_ERR_UNSUPPORTED,
                     "config.json: num_labels %d: regression heads are not supported (need >= 2)",
                     c->num_labels);
        goto out;
    }
out:
    rf_json_doc_free(doc);
    return rc;
}

int rf_bert_config_load(const char *path, int default_labels, rf_bert_config *cfg) {
    char *text;
    size_t len;
    int rc = rf_read_file(path, 1 << 20, &text, &len);
    if (rc) return rf_fail_ctx(rc, "cannot read %s", path);
    rc = rf_bert_config_parse(text, len, default_labels, cfg);
    free(text);
    if (rc) return rf_fail_ctx(rc, "%s", path);
    return RF_OK;
}

int rf_bert_config_to_json(const rf_bert_config *c, rf_buf *o) {
    int rc = rf_buf_printf(
        o,
        "{\n  \"architectures\": [\"BertForSequenceClassification\"],\n"
        "  \"model_type\": \"bert\",\n  \"hidden_act\": \"gelu\",\n"
        "  \"position_embedding_type\": \"absolute\",\n"
        "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n"
        "  \"num_attention_heads\": %d,\n  \"intermediate_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n  \"type_vocab_size\": %d,\n"
        "  \"pad_token_id\": %d,\n  \"layer_norm_eps\": %.9g,\n  \"initializer_range\": %.9g,\n"
        "  \"hidden_dropout_prob\": %.9g,\n  \"attention_probs_dropout_prob\": %.9g,\n"
        "  \"classifier_dropout\": %.9g,\n  \"torch_dtype\": \"float32\",\n",
        c->vocab_size, c->hidden_size, c->num_layers, c->num_heads, c->intermediate_size,
        c->max_position, c->type_vocab_size, c->pad_token_id, c->layer_norm_eps,
        c->initializer_range, c->hidden_dropout, c->attention_dropout, c->classifier_dropout);
    rc = rc ? rc : rf_buf_puts(o, "  \"id2label\": {");
    for (int i = 0; i < c->num_labels && !rc; i++)
        rc = rf_buf_printf(o, "%s\"%d\": \"LABEL_%d\"", i ? ", " : "", i, i);
    rc = rc ? rc : rf_buf_puts(o, "},\n  \"label2id\": {");
    for (int i = 0; i < c->num_labels && !rc; i++)
        rc = rf_buf_printf(o, "%s\"LABEL_%d\": %d", i ? ", " : "", i, i);
    return rc ? rc : rf_buf_puts(o, "}\n}\n");
}
