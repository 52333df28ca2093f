/* Causal-LM data: sources, the EOS rule and packing (see lm_data.h). */
#include "trainer/lm_data.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/json.h"
#include "common/reader.h"
#include "common/sys.h"
#include "tokenizer/shard.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/gguf_tokenizer.h"
#include "trainer/llama_gguf.h"

/* ---- the packer ---- */

struct rf_lm_packer {
    rf_dataset *d;
    int max_len, eos;
    uint32_t *ids;
    uint8_t *flags;
    int fill;
};

int rf_lm_packer_new(rf_dataset *d, int max_len, int eos_id, rf_lm_packer **out) {
    *out = NULL;
    if (max_len < 2)
        return rf_fail(RF_ERR_INVALID, "causal data: max_len %d is too small", max_len);
    rf_lm_packer *p = calloc(1, sizeof *p);
    if (!p) return RF_ERR_NOMEM;
    p->d = d;
    p->max_len = max_len;
    p->eos = eos_id;
    p->ids = malloc((size_t)max_len * sizeof *p->ids);
    p->flags = malloc((size_t)max_len);
    if (!p->ids || !p->flags) {
        rf_lm_packer_free(p);
        return RF_ERR_NOMEM;
    }
    *out = p;
    return RF_OK;
}

void rf_lm_packer_free(rf_lm_packer *p) {
    if (!p) return;
    free(p->ids);
    free(p->flags);
    free(p);
}

static int emit(rf_lm_packer *p) {
    int rc = p->fill ? rf_dataset_add_row(p->d, p->ids, p->flags, (size_t)p->fill) : RF_OK;
    p->fill = 0;
    return rc;
}

static int put(rf_lm_packer *p, uint32_t id, uint8_t f) {
    if (p->fill == p->max_len) {
        int rc = emit(p);
        if (rc) return rc;
    }
    if (p->fill == 0) f &= (uint8_t)~RF_LM_DOC_START; /* position 0 of a row */
    p->ids[p->fill] = id;
    p->flags[p->fill++] = f;
    return RF_OK;
}

int rf_lm_packer_add(rf_lm_packer *p, const uint32_t *ids, const uint8_t *mask, size_t n) {
    if (n == 0) return RF_OK;
    if (p->eos < 0) return rf_fail(RF_ERR_INVALID, "causal data: no EOS id to end documents with");
    int rc = RF_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        uint8_t f =
            (uint8_t)((!mask || mask[i] ? RF_LM_TARGET : 0) | (i == 0 ? RF_LM_DOC_START : 0));
        rc = put(p, ids[i], f);
    }
    if (!rc && ids[n - 1] != (uint32_t)p->eos) /* the EOS is a target when the last token is */
        rc = put(p, (uint32_t)p->eos, !mask || mask[n - 1] ? RF_LM_TARGET : 0);
    return rc;
}

int rf_lm_packer_finish(rf_lm_packer *p) {
    int rc = emit(p);
    rf_lm_packer_free(p);
    return rc;
}

uint32_t rf_lm_row_targets(const rf_dataset *d, size_t i) {
    uint32_t c = 0;
    const uint8_t *f = d->tflags + d->start[i];
    for (uint32_t t = 1; t < d->len[i]; t++)
        c += (f[t] & RF_LM_TARGET) && !(f[t] & RF_LM_DOC_START);
    return c;
}

/* ---- sources ---- */

static void skip(rf_dataset *d, rf_stats *stats, const char *prefix, const char *why) {
    d->skipped++;
    if (stats) {
        char name[128];
        snprintf(name, sizeof name, "%s.skipped.%s", prefix ? prefix : "data", why);
        rf_stats_add(stats, name, 1);
    }
}

/* PREFIX.mask, when present: n bytes of 0/1 (*mask NULL without the file). */
static int load_mask(const char *prefix, uint64_t n, uint8_t **mask) {
    char path[4096];
    struct stat sb;
    *mask = NULL;
    snprintf(path, sizeof path, "%s.mask", prefix);
    if (stat(path, &sb) != 0) return RF_OK;
    char *data;
    size_t len;
    int rc = rf_read_file(path, (size_t)n + 1, &data, &len);
    if (rc) return rf_fail_ctx(rc, "causal data: cannot read %s", path);
    if (len != n) {
        free(data);
        return rf_fail(RF_ERR_CORRUPT, "%s: %zu bytes, the shard has %llu tokens", path, len,
                       (unsigned long long)n);
    }
    for (size_t i = 0; i < len; i++)
        if ((uint8_t)data[i] > 1) {
            unsigned v = (uint8_t)data[i];
            free(data);
            return rf_fail(RF_ERR_CORRUPT, "%s: byte %zu is %u (0 or 1 expected)", path, i, v);
        }
    *mask = (uint8_t *)data;
    return RF_OK;
}

/* A packed row as stored: documents start after each EOS. */
static int add_packed_row(rf_dataset *d, const uint32_t *ids, const uint8_t *mask, uint32_t len,
                          int eos) {
    uint8_t *f = malloc(len ? len : 1);
    if (!f) return RF_ERR_NOMEM;
    for (uint32_t t = 0; t < len; t++)
        f[t] = (uint8_t)((!mask || mask[t] ? RF_LM_TARGET : 0) |
                         (t > 0 && ids[t - 1] == (uint32_t)eos ? RF_LM_DOC_START : 0));
    int rc = rf_dataset_add_row(d, ids, f, len);
    free(f);
    return rc;
}

static int load_shard(rf_dataset *d, const char *prefix, int max_len, int eos_id, rf_stats *stats,
                      const char *sp) {
    rf_shard *s;
    int rc = rf_shard_open(prefix, &s);
    if (rc) return rc;
    const rf_shard_info *in = rf_shard_get_info(s);
    int eos = in->eos_id >= 0 ? in->eos_id : eos_id;
    bool packed = in->flags & RF_SHARD_PACKED;
    uint8_t *mask = NULL;
    rf_lm_packer *p = NULL;
    if (packed && in->block_len > (uint32_t)max_len)
        rc =
            rf_fail(RF_ERR_INVALID,
                    "%s: packed rows of %u tokens do not fit max_len %d (repack, or raise max_len)",
                    prefix, in->block_len, max_len);
    if (!rc && eos < 0)
        rc = rf_fail(RF_ERR_INVALID,
                     "%s: no EOS id (neither the shard header nor the model's eos_token_id)",
                     prefix);
    if (!rc) rc = load_mask(prefix, in->n_tokens, &mask);
    if (!rc && !packed) rc = rf_lm_packer_new(d, max_len, eos, &p);
    uint64_t at = 0; /* token offset of record i (records are contiguous) */
    for (uint64_t i = 0; i < in->n_seqs && !rc; i++) {
        rf_shard_seq q;
        if ((rc = rf_shard_get(s, i, &q))) break;
        const uint8_t *m = mask ? mask + at : NULL;
        at += q.len;
        if (q.len == 0) {
            skip(d, stats, sp, "empty");
            continue;
        }
        rc =
            packed ? add_packed_row(d, q.ids, m, q.len, eos) : rf_lm_packer_add(p, q.ids, m, q.len);
    }
    if (p) {
        int r = rc ? (rf_lm_packer_free(p), rc) : rf_lm_packer_finish(p);
        if (!rc) rc = r;
    }
    free(mask);
    rf_shard_close(s);
    return rc ? rf_fail_ctx(rc, "causal data %s", prefix) : RF_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int load_shard_dir(rf_dataset *d, const char *dir, int max_len, int eos_id, rf_stats *stats,
                          const char *sp) {
    DIR *dh = opendir(dir);
    if (!dh) return rf_fail(RF_ERR_IO, "cannot open directory %s", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = RF_OK;
    struct dirent *e;
    while ((e = readdir(dh)) && !rc) {
        size_t L = strlen(e->d_name);
        if (L < 5 || strcmp(e->d_name + L - 4, ".idx") != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = RF_ERR_NOMEM;
                break;
            }
            names = nn;
        }
        if (asprintf(&names[n], "%s/%.*s", dir, (int)(L - 4), e->d_name) < 0) {
            rc = RF_ERR_NOMEM;
            break;
        }
        n++;
    }
    closedir(dh);
    if (!rc && n == 0) rc = rf_fail(RF_ERR_NOT_FOUND, "no *.idx token shards in %s", dir);
    if (!rc) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && !rc; i++)
        rc = load_shard(d, names[i], max_len, eos_id, stats, sp);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* Text sources: JSON Lines or plain text, tokenized without special tokens. */
typedef struct text_src {
    rf_tok_state *st;
    rf_tok_encoding enc;
    uint32_t *ids;
    uint8_t *mask;
    size_t cap;
} text_src;

static int grow(text_src *t, size_t n) {
    if (n <= t->cap) return RF_OK;
    size_t c = t->cap ? t->cap : 1024;
    while (c < n)
        c *= 2;
    uint32_t *i = realloc(t->ids, c * sizeof *i);
    if (i) t->ids = i;
    uint8_t *m = realloc(t->mask, c);
    if (m) t->mask = m;
    if (!i || !m) return RF_ERR_NOMEM;
    t->cap = c;
    return RF_OK;
}

/* Appends text's ids to t->ids[*n..] with mask value `target`. */
static int encode_into(text_src *t, const char *text, size_t len, uint8_t target, size_t *n) {
    int rc = rf_tok_encode(t->st, text, len, false, &t->enc);
    if (!rc) rc = grow(t, *n + t->enc.len);
    if (rc) return rc;
    memcpy(t->ids + *n, t->enc.ids, t->enc.len * sizeof *t->ids);
    memset(t->mask + *n, target, t->enc.len);
    *n += t->enc.len;
    return RF_OK;
}

/* The model's tokenizer: the Hugging Face folder's files, or the one a GGUF
 * carries in its metadata (gguf_tokenizer.h: transformers' ids). */
static int model_tokenizer(const char *model, rf_tokenizer **tok) {
    char *gguf;
    int rc = rf_llama_gguf_path(model, &gguf);
    if (rc) return rc;
    if (!gguf) return rf_tokenizer_load(model, tok);
    rf_gguf_file *f;
    if (!(rc = rf_gguf_open(gguf, &f))) {
        rc = rf_gguf_tokenizer(f, tok, NULL);
        rf_gguf_free(f);
    }
    free(gguf);
    return rc;
}

static int load_text(rf_dataset *d, const char *path, const char *model_dir, int max_len,
                     int eos_id, bool jsonl, rf_stats *stats, const char *sp) {
    rf_tokenizer *tok = NULL;
    rf_reader *r = NULL;
    rf_json_doc *jd = NULL;
    rf_lm_packer *p = NULL;
    text_src t = {0};
    if (eos_id < 0)
        return rf_fail(RF_ERR_INVALID, "%s: the model has no eos_token_id to end documents with",
                       path);
    int rc = model_tokenizer(model_dir, &tok);
    if (rc) return rf_fail_ctx(rc, "tokenizer of %s", model_dir);
    rf_tokenizer_set_truncation(tok, 0, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    rf_tokenizer_set_padding(tok, false, 0, 0, 0, 0, RF_SIDE_RIGHT);
    if (!(t.st = rf_tok_state_new(tok)) || !(jd = rf_json_doc_new())) rc = RF_ERR_NOMEM;
    if (!rc) rc = rf_lm_packer_new(d, max_len, eos_id, &p);
    if (!rc && (rc = rf_reader_open(path, 1 << 24, &r)))
        rc = rf_fail_ctx(rc, "cannot read %s", path);
    rf_line line;
    while (!rc && (rc = rf_reader_next(r, &line)) == 1) {
        rc = RF_OK;
        size_t len = line.len, n = 0;
        if (len && line.data[len - 1] == '\r') len--;
        if (len == 0 || line.too_long) {
            if (line.too_long) skip(d, stats, sp, "too_long");
            continue;
        }
        if (!jsonl) {
            rc = encode_into(&t, line.data, len, 1, &n);
        } else {
            const rf_json *root, *x, *pr, *co;
            if (rf_json_parse(jd, line.data, len, &root) != 0 || root->type != RF_JSON_OBJECT) {
                skip(d, stats, sp, "bad_record");
                continue;
            }
            if ((x = rf_json_get(root, "text")) && rf_json_is_str(x)) {
                rc = encode_into(&t, x->u.str, x->len, 1, &n);
            } else if ((pr = rf_json_get(root, "prompt")) && rf_json_is_str(pr) &&
                       (co = rf_json_get(root, "completion")) && rf_json_is_str(co)) {
                rc = encode_into(&t, pr->u.str, pr->len, 0, &n);
                if (!rc) rc = encode_into(&t, co->u.str, co->len, 1, &n);
            } else {
                skip(d, stats, sp, "no_text");
                continue;
            }
        }
        if (rc) {
            rc = rf_fail_ctx(rc, "%s:%llu: tokenizer", path, (unsigned long long)line.lineno);
            break;
        }
        if (n == 0)
            skip(d, stats, sp, "empty");
        else
            rc = rf_lm_packer_add(p, t.ids, t.mask, n);
    }
    if (rc < 0 && rc != RF_OK) {
        rf_lm_packer_free(p);
    } else {
        rc = rf_lm_packer_finish(p);
    }
    rf_reader_close(r);
    rf_json_doc_free(jd);
    rf_tok_encoding_free(&t.enc);
    rf_tok_state_free(t.st);
    rf_tokenizer_free(tok);
    free(t.ids);
    free(t.mask);
    return rc;
}

int rf_lm_data_load(rf_dataset *d, const char *path, const char *model_dir, int max_len, int eos_id,
                    rf_stats *stats, const char *prefix) {
    struct stat st;
    char idx[4096];
    if (max_len < 2) return rf_fail(RF_ERR_INVALID, "max_len %d is too small", max_len);
    if (d->n && !d->tflags)
        return rf_fail(RF_ERR_INVALID, "causal data: the dataset holds classifier sequences");
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(idx, sizeof idx, "%s.idx", path);
    if (dir) return load_shard_dir(d, path, max_len, eos_id, stats, prefix);
    if (stat(idx, &st) == 0) return load_shard(d, path, max_len, eos_id, stats, prefix);
    size_t L = strlen(path);
    bool text = (L > 4 && (!strcmp(path + L - 4, ".txt") || !strcmp(path + L - 4, ".raw")));
    return load_text(d, path, model_dir, max_len, eos_id, !text, stats, prefix);
}
