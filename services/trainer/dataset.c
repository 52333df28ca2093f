#include "trainer/dataset.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/doc.h"
#include "common/error.h"
#include "common/json.h"
#include "common/reader.h"
#include "tokenizer/tokenizer.h"
#include "trainer/lm_data.h"

void rf_dataset_free(rf_dataset *d) {
    free(d->tflags);
    free(d->tokens);
    free(d->start);
    free(d->len);
    free(d->label);
    memset(d, 0, sizeof *d);
}

int rf_dataset_add(rf_dataset *d, const uint32_t *ids, size_t len, int32_t label) {
    if (d->n == d->cap) {
        size_t nc = d->cap ? 2 * d->cap : 1024;
        size_t *s = realloc(d->start, nc * sizeof *s);
        if (s) d->start = s;
        uint32_t *l = realloc(d->len, nc * sizeof *l);
        if (l) d->len = l;
        int32_t *y = realloc(d->label, nc * sizeof *y);
        if (y) d->label = y;
        if (!s || !l || !y) return RF_ERR_NOMEM;
        d->cap = nc;
    }
    if (d->ntokens + len > d->cap_tokens) {
        size_t nc = d->cap_tokens ? 2 * d->cap_tokens : 65536;
        while (nc < d->ntokens + len)
            nc *= 2;
        uint32_t *t = realloc(d->tokens, nc * sizeof *t);
        if (!t) return RF_ERR_NOMEM;
        d->tokens = t;
        if (d->tflags) {
            uint8_t *f = realloc(d->tflags, nc);
            if (!f) return RF_ERR_NOMEM;
            d->tflags = f;
        }
        d->cap_tokens = nc;
    }
    memcpy(d->tokens + d->ntokens, ids, len * sizeof *ids);
    d->start[d->n] = d->ntokens;
    d->len[d->n] = (uint32_t)len;
    d->label[d->n] = label;
    d->ntokens += len;
    d->n++;
    return RF_OK;
}

int rf_dataset_add_row(rf_dataset *d, const uint32_t *ids, const uint8_t *flags, size_t len) {
    if (!d->tflags) {
        if (d->n) return rf_fail(RF_ERR_INVALID, "dataset: causal-LM rows after other sequences");
        if (!(d->tflags = malloc(d->cap_tokens ? d->cap_tokens : 1))) return RF_ERR_NOMEM;
    }
    int rc = rf_dataset_add(d, ids, len, -1);
    if (!rc) memcpy(d->tflags + d->start[d->n - 1], flags, len);
    return rc;
}

static void skip(rf_dataset *d, rf_stats *stats, const char *prefix, const char *why) {
    d->skipped++;
    if (stats) {
        char name[128];
        snprintf(name, sizeof name, "%s.skipped.%s", prefix ? prefix : "data", why);
        rf_stats_add(stats, name, 1);
    }
}

/* Splits a TSV line in place into at most max fields; returns the count. */
static int split_tabs(char *line, char **f, int max) {
    int n = 0;
    f[n++] = line;
    for (char *p = line; *p && n < max; p++)
        if (*p == '\t') {
            *p = 0;
            f[n++] = p + 1;
        }
    return n;
}

int rf_dataset_load_tsv(rf_dataset *d, const char *path, const char *model_dir, int max_len,
                        rf_stats *stats, const char *prefix) {
    rf_tokenizer *tok = NULL;
    rf_tok_state *st = NULL;
    rf_reader *r = NULL;
    rf_tok_encoding enc = {0};
    char *buf = NULL;
    int rc = rf_tokenizer_load(model_dir, &tok), text_col = -1, label_col = -1;
    if (rc) return rf_fail_ctx(rc, "tokenizer of %s", model_dir);
    rf_tokenizer_set_truncation(tok, (size_t)max_len, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    rf_tokenizer_set_padding(tok, false, 0, 0, 0, 0, RF_SIDE_RIGHT);
    if (!(st = rf_tok_state_new(tok))) {
        rc = RF_ERR_NOMEM;
        goto out;
    }
    if ((rc = rf_reader_open(path, 1 << 24, &r))) {
        rc = rf_fail_ctx(rc, "cannot read %s", path);
        goto out;
    }
    rf_line line;
    while ((rc = rf_reader_next(r, &line)) == 1) {
        free(buf);
        if (!(buf = malloc(line.len + 1))) {
            rc = RF_ERR_NOMEM;
            goto out;
        }
        memcpy(buf, line.data, line.len);
        buf[line.len] = 0;
        if (line.len && buf[line.len - 1] == '\r') buf[line.len - 1] = 0;
        char *f[16];
        int nf = split_tabs(buf, f, 16);
        if (text_col < 0) { /* the header names the columns */
            for (int i = 0; i < nf; i++) {
                if (!strcmp(f[i], "sentence") || !strcmp(f[i], "text")) text_col = i;
                if (!strcmp(f[i], "label")) label_col = i;
            }
            if (text_col < 0 || label_col < 0) {
                rc = rf_fail(RF_ERR_PARSE, "%s: header needs 'sentence' (or 'text') and 'label'",
                             path);
                goto out;
            }
            continue;
        }
        char *end;
        long label = nf > label_col ? strtol(f[label_col], &end, 10) : -1;
        if (nf <= text_col || nf <= label_col || *f[label_col] == 0 || *end || label < 0 ||
            label > 1 << 20) {
            skip(d, stats, prefix, "bad_record");
            continue;
        }
        if ((rc = rf_tok_encode(st, f[text_col], strlen(f[text_col]), true, &enc)) != 0) {
            rc = rf_fail_ctx(rc, "%s:%llu: tokenizer", path, (unsigned long long)line.lineno);
            goto out;
        }
        if ((rc = rf_dataset_add(d, enc.ids, enc.len, (int32_t)label))) goto out;
    }
    if (rc < 0)
        rc = rf_fail_ctx(rc, "%s", path);
    else if (text_col < 0)
        rc = rf_fail(RF_ERR_PARSE, "%s: empty TSV file", path);
    else
        rc = RF_OK;
out:
    free(buf);
    rf_tok_encoding_free(&enc);
    rf_reader_close(r);
    rf_tok_state_free(st);
    rf_tokenizer_free(tok);
    return rc;
}

int rf_dataset_load_jsonl(rf_dataset *d, const char *path, const char *model_dir, int max_len,
                          rf_stats *stats, const char *prefix) {
    rf_tokenizer *tok = NULL;
    rf_tok_state *st = NULL;
    rf_reader *r = NULL;
    rf_json_doc *jd = NULL;
    rf_tok_encoding enc = {0};
    rf_doc doc = {0};
    int rc = rf_tokenizer_load(model_dir, &tok);
    if (rc) return rf_fail_ctx(rc, "tokenizer of %s", model_dir);
    rf_tokenizer_set_truncation(tok, (size_t)max_len, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    rf_tokenizer_set_padding(tok, false, 0, 0, 0, 0, RF_SIDE_RIGHT);
    if (!(st = rf_tok_state_new(tok)) || !(jd = rf_json_doc_new())) {
        rc = RF_ERR_NOMEM;
        goto out;
    }
    if ((rc = rf_reader_open(path, 1 << 24, &r))) {
        rc = rf_fail_ctx(rc, "cannot read %s", path);
        goto out;
    }
    rf_line line;
    while ((rc = rf_reader_next(r, &line)) == 1) {
        const rf_json *root;
        if (line.len == 0) continue;
        if (line.too_long || rf_json_parse(jd, line.data, line.len, &root) != 0 ||
            root->type != RF_JSON_OBJECT || rf_doc_from_json(root, &doc) != 0 || !doc.text) {
            skip(d, stats, prefix, "bad_record");
            rf_doc_clear(&doc);
            continue;
        }
        if (doc.label < 0) {
            skip(d, stats, prefix, "no_label");
        } else if ((rc = rf_tok_encode(st, doc.text, doc.text_len, true, &enc)) != 0) {
            rf_doc_clear(&doc);
            rc = rf_fail_ctx(rc, "%s:%llu: tokenizer", path, (unsigned long long)line.lineno);
            goto out;
        } else if ((rc = rf_dataset_add(d, enc.ids, enc.len, doc.label)) != 0) {
            rf_doc_clear(&doc);
            goto out;
        }
        rf_doc_clear(&doc);
    }
    if (rc < 0)
        rc = rf_fail_ctx(rc, "%s", path);
    else
        rc = RF_OK;
out:
    rf_tok_encoding_free(&enc);
    rf_json_doc_free(jd);
    rf_reader_close(r);
    rf_tok_state_free(st);
    rf_tokenizer_free(tok);
    return rc;
}

int rf_dataset_load(rf_dataset *d, const char *path, const char *model_dir, int max_len,
                    rf_stats *stats, const char *prefix) {
    struct stat st;
    char idx[4096];
    if (max_len < 2) return rf_fail(RF_ERR_INVALID, "max_len %d is too small", max_len);
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(idx, sizeof idx, "%s.idx", path);
    if (dir || stat(idx, &st) == 0) {
        return dir ? rf_dataset_load_shard_dir(d, path, max_len)
                   : rf_dataset_load_shard(d, path, max_len);
    }
    size_t L = strlen(path);
    if (L > 4 && !strcmp(path + L - 4, ".tsv"))
        return rf_dataset_load_tsv(d, path, model_dir, max_len, stats, prefix);
    return rf_dataset_load_jsonl(d, path, model_dir, max_len, stats, prefix);
}

/* Causal-LM rows: labels, positions and segments from the token flags. */
static int collate_rows(rf_batch_buf *bb, const rf_dataset *d, const size_t *idx, int B, int T) {
    size_t need = (size_t)B * T;
    if (need > bb->cap || !bb->labels || !bb->pos) {
        rf_batch_buf_free(bb);
        bb->ids = malloc(need * sizeof(int32_t));
        bb->types = calloc(need, sizeof(int32_t));
        bb->valid = malloc(need);
        bb->labels = malloc(need * sizeof(int32_t));
        bb->pos = malloc(need * sizeof(int32_t));
        bb->seg = malloc(need * sizeof(int32_t));
        bb->cap = need;
        if (!bb->ids || !bb->types || !bb->valid || !bb->labels || !bb->pos || !bb->seg) {
            rf_batch_buf_free(bb);
            return RF_ERR_NOMEM;
        }
    }
    bb->B = B;
    bb->T = T;
    for (int b = 0; b < B; b++) {
        size_t i = idx[b], L = d->len[i];
        int32_t seg = 0, start = 0;
        for (int t = 0; t < T; t++) {
            size_t o = (size_t)b * T + t;
            uint8_t f = t < (int)L ? d->tflags[d->start[i] + t] : 0;
            if (t > 0 && (f & RF_LM_DOC_START)) {
                seg++;
                start = t;
            }
            bb->ids[o] = t < (int)L ? (int32_t)d->tokens[d->start[i] + t] : 0;
            bb->types[o] = 0;
            bb->valid[o] = t < (int)L;
            bb->labels[o] = (f & RF_LM_TARGET) && !(f & RF_LM_DOC_START) ? bb->ids[o] : -100;
            bb->pos[o] = t < (int)L ? t - start : 0;
            bb->seg[o] = seg;
        }
    }
    return RF_OK;
}

int rf_batch_collate(rf_batch_buf *bb, const rf_dataset *d, const size_t *idx, int B) {
    int T = 1;
    for (int b = 0; b < B; b++)
        if ((int)d->len[idx[b]] > T) T = (int)d->len[idx[b]];
    if (d->tflags) return collate_rows(bb, d, idx, B, T);
    size_t need = (size_t)B * T;
    if (need > bb->cap || !bb->labels) {
        free(bb->ids), free(bb->types), free(bb->valid), free(bb->labels);
        bb->ids = malloc(need * sizeof(int32_t));
        bb->types = malloc(need * sizeof(int32_t));
        bb->valid = malloc(need);
        bb->labels = malloc(((size_t)B > need ? (size_t)B : need) * sizeof(int32_t));
        bb->cap = need;
        if (!bb->ids || !bb->types || !bb->valid || !bb->labels) {
            rf_batch_buf_free(bb);
            return RF_ERR_NOMEM;
        }
    }
    bb->B = B;
    bb->T = T;
    for (int b = 0; b < B; b++) {
        size_t i = idx[b], L = d->len[i];
        for (int t = 0; t < T; t++) {
            size_t o = (size_t)b * T + t;
            bb->ids[o] = t < (int)L ? (int32_t)d->tokens[d->start[i] + t] : 0;
            bb->types[o] = 0;
            bb->valid[o] = t < (int)L;
        }
        bb->labels[b] = d->label[i];
    }
    return RF_OK;
}

void rf_batch_buf_free(rf_batch_buf *bb) {
    free(bb->ids), free(bb->types), free(bb->valid), free(bb->labels);
    free(bb->pos), free(bb->seg);
    memset(bb, 0, sizeof *bb);
}

int rf_dataset_num_labels(const rf_dataset *d) {
    int k = 0;
    for (size_t i = 0; i < d->n; i++)
        if (d->label[i] + 1 > k) k = d->label[i] + 1;
    return k;
}
