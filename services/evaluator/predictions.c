/* Prediction lines of an evaluation: see predictions.h. */
#include "evaluator/predictions.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/buf.h"
#include "common/doc.h"
#include "common/error.h"
#include "common/json.h"
#include "common/reader.h"
#include "common/sys.h"
#include "tokenizer/tokenizer.h"

struct rf_pred_writer {
    char *path;
    rf_tokenizer *tok; /* decodes the ids when there is no text (shards, TSV) */
    bool jsonl;
    char **ids; /* JSONL: [n] record id (NULL: none) and text, in data order */
    char **texts;
    size_t n, cap;
    size_t lines; /* written so far */
    rf_buf out;
};

/* Whether rf_dataset_load reads data as JSONL (not shards, not TSV). */
static bool is_jsonl(const char *data) {
    struct stat st;
    char idx[4096];
    snprintf(idx, sizeof idx, "%s.idx", data);
    if (stat(data, &st) == 0 && S_ISDIR(st.st_mode)) return false;
    if (stat(idx, &st) == 0) return false;
    size_t L = strlen(data);
    return !(L > 4 && !strcmp(data + L - 4, ".tsv"));
}

/* The id and text of every record rf_dataset_load_jsonl keeps (the same
 * rules: a JSON object with a text and a label >= 0), in order. */
static int load_jsonl(rf_pred_writer *w, const char *path) {
    rf_reader *r = NULL;
    rf_json_doc *jd = rf_json_doc_new();
    rf_doc doc = {0};
    int rc = jd ? RF_OK : RF_ERR_NOMEM;
    if (!rc && (rc = rf_reader_open(path, 1 << 24, &r)))
        rc = rf_fail_ctx(rc, "cannot read %s", path);
    rf_line line;
    while (!rc && (rc = rf_reader_next(r, &line)) == 1) {
        const rf_json *root;
        rc = RF_OK;
        if (line.len == 0 || line.too_long || rf_json_parse(jd, line.data, line.len, &root) != 0 ||
            root->type != RF_JSON_OBJECT || rf_doc_from_json(root, &doc) != 0 || !doc.text ||
            doc.label < 0) {
            rf_doc_clear(&doc);
            continue;
        }
        if (w->n == w->cap) {
            size_t cap = w->cap ? 2 * w->cap : 256;
            char **ids = realloc(w->ids, cap * sizeof *ids);
            if (ids) w->ids = ids;
            char **texts = ids ? realloc(w->texts, cap * sizeof *texts) : NULL;
            if (texts) w->texts = texts;
            if (!ids || !texts)
                rc = RF_ERR_NOMEM;
            else
                w->cap = cap;
        }
        if (!rc) {
            w->ids[w->n] = doc.id ? strdup(doc.id) : NULL;
            w->texts[w->n] = strndup(doc.text, doc.text_len);
            w->n++;
            if ((doc.id && !w->ids[w->n - 1]) || !w->texts[w->n - 1]) rc = RF_ERR_NOMEM;
        }
        rf_doc_clear(&doc);
    }
    rc = rc < 0 ? rf_fail_ctx(rc, "%s", path) : RF_OK;
    rf_reader_close(r);
    rf_json_doc_free(jd);
    return rc;
}

int rf_pred_writer_open(const char *path, const char *data, const char *model_dir,
                        rf_pred_writer **out) {
    rf_pred_writer *w = calloc(1, sizeof *w);
    if (!w) return RF_ERR_NOMEM;
    int rc = (w->path = strdup(path)) ? RF_OK : RF_ERR_NOMEM;
    w->jsonl = is_jsonl(data);
    if (!rc && w->jsonl)
        rc = load_jsonl(w, data);
    else if (!rc && rf_tokenizer_load(model_dir, &w->tok) != RF_OK)
        w->tok = NULL; /* no tokenizer in the folder: lines without text */
    if (rc) {
        rf_pred_writer_free(w);
        return rc;
    }
    *out = w;
    return RF_OK;
}

int rf_pred_writer_example(void *user, const rf_dataset *d, size_t i, int gold, int pred,
                           const float *probs, int K) {
    rf_pred_writer *w = user;
    rf_buf *b = &w->out;
    if (w->jsonl && i >= w->n)
        return rf_fail(RF_ERR_CORRUPT,
                       "predictions: sequence %zu, but the data has %zu labelled records "
                       "(changed meanwhile?)",
                       i, w->n);
    int rc = rf_buf_printf(b, "{\"index\":%zu", i);
    w->lines++;
    if (!rc && w->jsonl && w->ids[i]) {
        rc = rf_buf_puts(b, ",\"id\":");
        if (!rc) rc = rf_buf_append_json_str(b, w->ids[i], strlen(w->ids[i]));
    }
    if (!rc && w->jsonl) {
        rc = rf_buf_puts(b, ",\"text\":");
        if (!rc) rc = rf_buf_append_json_str(b, w->texts[i], strlen(w->texts[i]));
    } else if (!rc && w->tok) {
        rf_buf t = RF_BUF_INIT;
        rc = rf_tok_decode(w->tok, d->tokens + d->start[i], d->len[i], true, &t);
        if (!rc) rc = rf_buf_puts(b, ",\"text\":");
        if (!rc) rc = rf_buf_append_json_str(b, t.data ? t.data : "", t.len);
        rf_buf_free(&t);
    }
    if (!rc) rc = rf_buf_printf(b, ",\"label\":%d,\"pred\":%d,\"probs\":[", gold, pred);
    for (int k = 0; k < K && !rc; k++)
        rc = rf_buf_printf(b, k ? ",%.9g" : "%.9g", (double)probs[k]);
    if (!rc) rc = rf_buf_puts(b, "]}\n");
    return rc;
}

int rf_pred_writer_commit(rf_pred_writer *w) {
    if (w->jsonl && w->lines != w->n)
        return rf_fail(RF_ERR_CORRUPT,
                       "predictions: %zu labelled records in the data, %zu evaluated "
                       "(changed meanwhile?)",
                       w->n, w->lines);
    int rc = rf_write_file_atomic(w->path, w->out.data ? w->out.data : "", w->out.len);
    return rc ? rf_fail_ctx(rc, "eval: cannot write %s", w->path) : RF_OK;
}

void rf_pred_writer_free(rf_pred_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->ids[i]);
        free(w->texts[i]);
    }
    free(w->ids);
    free(w->texts);
    rf_tokenizer_free(w->tok);
    rf_buf_free(&w->out);
    free(w->path);
    free(w);
}
