/* Loading a causal LM for inference (see lm.h). */
#include "evaluator/lm.h"

#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"
#include "common/gguf.h"
#include "tokenizer/gguf_tokenizer.h"
#include "trainer/llama_gguf.h"
#include "trainer/lora.h"

void rf_lm_free(rf_lm *lm) {
    if (!lm) return;
    rf_gpt2_free(lm->model.gpt2);
    rf_llama_free(lm->model.llama);
    rf_tokenizer_free(lm->tok);
    free(lm->chat_template);
    free(lm->path);
    free(lm);
}

bool rf_lm_is_eos(const rf_lm *lm, int32_t id) {
    for (int i = 0; i < lm->n_eos; i++)
        if (lm->eos[i] == id) return true;
    return false;
}

static void add_eos(rf_lm *lm, int64_t id) {
    if (id < 0 || id >= lm->dims.vocab || lm->n_eos == RF_LM_MAX_EOS ||
        rf_lm_is_eos(lm, (int32_t)id))
        return;
    lm->eos[lm->n_eos++] = (int32_t)id;
}

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

/* ---- GGUF ---- */

static int load_gguf(rf_lm *lm, const char *path) {
    rf_gguf_file *f;
    int rc = rf_gguf_open(path, &f);
    if (rc) return rc;
    rf_gguf_tok_ids ids;
    rc = rf_llama_from_gguf(f, &lm->model.llama);
    if (!rc) rc = rf_gguf_tokenizer(f, &lm->tok, &ids);
    if (!rc) rc = rf_causal_dims_of(&lm->model, &lm->dims);
    if (!rc) {
        add_eos(lm, ids.eos);
        const char *s;
        size_t n;
        int t = rf_gguf_get_str(f, "tokenizer.chat_template", &s, &n);
        if (t == RF_OK) {
            if (!(lm->chat_template = malloc(n + 1)))
                rc = RF_ERR_NOMEM;
            else
                memcpy(lm->chat_template, s, n), lm->chat_template[n] = 0;
        }
    }
    rf_gguf_free(f);
    lm->arch = "llama";
    return rc;
}

/* The single *.gguf file of dir (malloc'd path). */
static int find_gguf(const char *dir, char **out) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return rf_fail(RF_ERR_NOT_FOUND, "%s: cannot open the folder", dir);
    struct dirent *e;
    int n = 0;
    char first[512] = "";
    while ((e = readdir(d)))
        if (has_suffix(e->d_name, ".gguf") && e->d_name[0] != '.') {
            if (!n++) snprintf(first, sizeof first, "%s", e->d_name);
        }
    closedir(d);
    if (n == 0)
        return rf_fail(RF_ERR_NOT_FOUND, "%s: no config.json and no .gguf file in the folder", dir);
    if (n > 1) return rf_fail(RF_ERR_INVALID, "%s: %d .gguf files in the folder; name one", dir, n);
    size_t len = strlen(dir) + strlen(first) + 2;
    if (!(*out = malloc(len))) return RF_ERR_NOMEM;
    snprintf(*out, len, "%s/%s", dir, first);
    return RF_OK;
}

/* ---- Hugging Face folder ---- */

/* Reads dir/name as JSON into *doc / *root; RF_ERR_NOT_FOUND when absent. */
static int read_json(const char *dir, const char *name, rf_json_doc **doc, const rf_json **root) {
    char path[4096], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *doc = NULL;
    int rc = rf_read_file(path, 64u << 20, &text, &len);
    if (rc) return rc;
    if (!(*doc = rf_json_doc_new())) {
        free(text);
        return RF_ERR_NOMEM;
    }
    rc = rf_json_parse(*doc, text, len, root);
    free(text);
    if (rc) {
        rf_json_doc_free(*doc);
        *doc = NULL;
        return rf_fail_ctx(rc, "%s", path);
    }
    return RF_OK;
}

/* eos_token_id of a config (an integer or a list); true when present. */
static bool eos_from(rf_lm *lm, const rf_json *cfg) {
    const rf_json *v = rf_json_get(cfg, "eos_token_id");
    int64_t id;
    if (!v || v->type == RF_JSON_NULL) return false;
    if (v->type == RF_JSON_ARRAY) {
        for (size_t i = 0; i < v->len; i++)
            if (rf_json_int64(&v->u.items[i], &id) == 0) add_eos(lm, id);
        return true;
    }
    if (rf_json_int64(v, &id) == 0) add_eos(lm, id);
    return true;
}

static int load_folder(rf_lm *lm, const char *dir, const rf_backend *be) {
    rf_json_doc *doc;
    const rf_json *cfg;
    int rc = read_json(dir, "config.json", &doc, &cfg);
    if (rc) return rc;
    const rf_json *mt = rf_json_get(cfg, "model_type");
    if (!rf_json_is_str(mt)) {
        rc = rf_fail(RF_ERR_INVALID, "%s/config.json: no model_type", dir);
    } else if (!strcmp(mt->u.str, "gpt2")) {
        rc = rf_gpt2_load_on(dir, be, &lm->model.gpt2);
        lm->arch = "gpt2";
    } else if (!strcmp(mt->u.str, "llama")) {
        rc = rf_llama_load_on(dir, be, &lm->model.llama);
        lm->arch = "llama";
    } else {
        rc = rf_fail(RF_ERR_UNSUPPORTED,
                     "%s/config.json: model_type '%s' is not a supported causal LM (gpt2, llama)",
                     dir, mt->u.str);
    }
    if (!rc) rc = rf_causal_dims_of(&lm->model, &lm->dims);
    if (!rc) rc = rf_tokenizer_load(dir, &lm->tok);
    if (!rc) {
        rf_json_doc *gdoc;
        const rf_json *gen;
        bool found = false;
        if (read_json(dir, "generation_config.json", &gdoc, &gen) == RF_OK) {
            found = eos_from(lm, gen);
            rf_json_doc_free(gdoc);
        }
        if (!found) eos_from(lm, cfg);
    }
    rf_json_doc_free(doc);
    if (rc) return rc;
    /* the chat template: tokenizer_config.json, or chat_template.jinja (transformers 5) */
    rf_json_doc *tdoc;
    const rf_json *tc;
    if (read_json(dir, "tokenizer_config.json", &tdoc, &tc) == RF_OK) {
        const rf_json *t = rf_json_get(tc, "chat_template");
        if (rf_json_is_str(t) && !(lm->chat_template = strndup(t->u.str, t->len)))
            rc = RF_ERR_NOMEM;
        rf_json_doc_free(tdoc);
    }
    if (!rc && !lm->chat_template) {
        char path[4096], *text;
        size_t len;
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        if (rf_read_file(path, 1 << 20, &text, &len) == RF_OK) lm->chat_template = text;
    }
    return rc;
}

int rf_lm_load(const char *path, rf_lm **out) {
    return rf_lm_load_on(path, rf_backend_cpu(), out);
}

int rf_lm_load_on(const char *path, const rf_backend *be, rf_lm **out) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return rf_fail(RF_ERR_NOT_FOUND, "%s: no such file or folder", path);
    rf_lm *lm = calloc(1, sizeof *lm);
    if (!lm) return RF_ERR_NOMEM;
    int rc;
    char *file = NULL;
    if (S_ISDIR(st.st_mode)) {
        char cfg[4096];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (stat(cfg, &st) == 0) {
            rc = load_folder(lm, path, be);
            if (!rc && !(lm->path = strdup(path))) rc = RF_ERR_NOMEM;
        } else if (!(rc = find_gguf(path, &file))) { /* GGUF: the CPU, whatever be */
            rc = load_gguf(lm, file);
            lm->path = file;
        }
    } else {
        rc = load_gguf(lm, path);
        if (!rc && !(lm->path = strdup(path))) rc = RF_ERR_NOMEM;
    }
    if (!rc) {
        rf_tokenizer_set_truncation(lm->tok, 0, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
        rf_tokenizer_set_padding(lm->tok, false, 0, 0, 0, 0, RF_SIDE_RIGHT);
        if (rf_tokenizer_vocab_size(lm->tok) > (uint32_t)lm->dims.vocab)
            rc = rf_fail(RF_ERR_INVALID, "%s: the tokenizer has %u ids, the model %d", path,
                         rf_tokenizer_vocab_size(lm->tok), lm->dims.vocab);
    }
    if (rc) {
        rc = rf_fail_ctx(rc, "model %s", path);
        rf_lm_free(lm);
        return rc;
    }
    *out = lm;
    return RF_OK;
}

int rf_lm_load_adapter(const char *path, const char *adapter, rf_lm **out) {
    int rc = rf_lm_load(path, out);
    if (rc || !adapter) return rc;
    rc = rf_lora_merge_peft((*out)->model.gpt2, (*out)->model.llama, adapter);
    if (rc) {
        rc = rf_fail_ctx(rc, "adapter %s over %s", adapter, path);
        rf_lm_free(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- cache ---- */

struct rf_lm_cache {
    rf_lru *lru;
};

static rf_lm *of(rf_lru_entry *e) {
    return (rf_lm *)((char *)e - offsetof(rf_lm, lru));
}

static void free_entry(rf_lru_entry *e) {
    rf_lm_free(of(e));
}

struct load_arg {
    const char *path, *adapter;
};

static int load_entry(void *arg, rf_lru_entry **out) {
    const struct load_arg *a = arg;
    rf_lm *lm;
    int rc = rf_lm_load_adapter(a->path, a->adapter, &lm);
    if (!rc) *out = &lm->lru;
    return rc;
}

int rf_lm_cache_new(int cap, rf_lm_cache **out) {
    rf_lm_cache *cc = calloc(1, sizeof *cc);
    if (!cc) return RF_ERR_NOMEM;
    int rc = rf_lru_new(cap, free_entry, &cc->lru);
    if (rc) {
        free(cc);
        return rc == RF_ERR_INVALID ? rf_fail(rc, "LM cache: capacity %d", cap) : rc;
    }
    *out = cc;
    return RF_OK;
}

void rf_lm_cache_free(rf_lm_cache *cc) {
    if (!cc) return;
    rf_lru_free(cc->lru);
    free(cc);
}

int rf_lm_cache_get(rf_lm_cache *cc, const char *path, rf_lm **out) {
    return rf_lm_cache_get_adapter(cc, path, NULL, out);
}

int rf_lm_cache_get_adapter(rf_lm_cache *cc, const char *path, const char *adapter, rf_lm **out) {
    /* the key: the path, or the path and the adapter apart by a byte no path has */
    char *key = NULL;
    *out = NULL;
    if (asprintf(&key, "%s%s%s", path, adapter ? "\n" : "", adapter ? adapter : "") < 0)
        return RF_ERR_NOMEM;
    struct load_arg a = {path, adapter};
    rf_lru_entry *e;
    int rc = rf_lru_get(cc->lru, key, load_entry, &a, &e);
    free(key);
    if (!rc) *out = of(e);
    return rc;
}

void rf_lm_cache_release(rf_lm_cache *cc, rf_lm *lm) {
    if (lm) rf_lru_release(cc->lru, &lm->lru);
}

int64_t rf_lm_cache_loads(rf_lm_cache *cc) {
    return rf_lru_loads(cc->lru);
}
