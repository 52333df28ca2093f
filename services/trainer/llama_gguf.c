/* GGUF "llama" -> rf_llama (see llama_gguf.h). */
#include "trainer/llama_gguf.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"

static bool str_is(const char *s, size_t n, const char *lit) {
    return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* An integer key in [min, max]; def < 0: required. */
static int get_int(const rf_gguf_file *f, const char *key, int64_t def, int64_t min, int64_t max,
                   int *out) {
    uint64_t v;
    int rc = rf_gguf_get_u64(f, key, &v);
    if (rc == RF_ERR_NOT_FOUND && def >= 0) {
        *out = (int)def;
        return RF_OK;
    }
    if (rc == RF_ERR_NOT_FOUND) return rf_fail(RF_ERR_INVALID, "gguf: missing key '%s'", key);
    if (rc) return rc;
    if (v < (uint64_t)min || v > (uint64_t)max)
        return rf_fail(RF_ERR_INVALID, "gguf: '%s' = %llu is outside [%lld, %lld]", key,
                       (unsigned long long)v, (long long)min, (long long)max);
    *out = (int)v;
    return RF_OK;
}

static int get_real(const rf_gguf_file *f, const char *key, float def, float *out) {
    int rc = rf_gguf_get_f32(f, key, out);
    if (rc == RF_ERR_NOT_FOUND) {
        *out = def;
        return RF_OK;
    }
    if (rc) return rc;
    if (!(*out > 0 && *out < 1e12f))
        return rf_fail(RF_ERR_INVALID, "gguf: '%s' = %g is not a positive number", key, *out);
    return RF_OK;
}

int rf_llama_config_from_gguf(const rf_gguf_file *f, rf_llama_config *c) {
    memset(c, 0, sizeof *c);
    const char *s;
    size_t n;
    int rc = rf_gguf_get_str(f, "general.architecture", &s, &n);
    if (rc) return rf_fail_ctx(rc == RF_ERR_NOT_FOUND ? RF_ERR_INVALID : rc, "gguf");
    if (!str_is(s, n, "llama"))
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "gguf: architecture '%.*s' is not supported (only 'llama')",
                       (int)(n > 64 ? 64 : n), s);
    if ((rc = get_int(f, "llama.block_count", -1, 1, 1024, &c->num_hidden_layers)) ||
        (rc = get_int(f, "llama.embedding_length", -1, 1, 1 << 16, &c->hidden_size)) ||
        (rc = get_int(f, "llama.feed_forward_length", -1, 1, 1 << 20, &c->intermediate_size)) ||
        (rc = get_int(f, "llama.attention.head_count", -1, 1, 1024, &c->num_attention_heads)) ||
        (rc = get_int(f, "llama.attention.head_count_kv", c->num_attention_heads, 1, 1024,
                      &c->num_key_value_heads)) ||
        (rc = get_int(f, "llama.context_length", 2048, 1, 1 << 24, &c->max_position_embeddings)))
        return rc;
    const rf_gguf_tensor *emb = rf_gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return rf_fail(RF_ERR_INVALID, "gguf: no 2-d tensor token_embd.weight");
    if ((rc = get_int(f, "llama.vocab_size", emb->ne[1], 1, 1 << 24, &c->vocab_size))) return rc;
    if (c->hidden_size % c->num_attention_heads)
        return rf_fail(RF_ERR_INVALID, "gguf: embedding_length %d is not a multiple of %d heads",
                       c->hidden_size, c->num_attention_heads);
    c->head_dim = c->hidden_size / c->num_attention_heads;
    int rot;
    if ((rc = get_int(f, "llama.rope.dimension_count", c->head_dim, 1, 1 << 12, &rot))) return rc;
    if (rot != c->head_dim)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "gguf: rope.dimension_count %d differs from the head size %d (partial "
                       "rotary is not supported)",
                       rot, c->head_dim);
    if (c->head_dim % 2 || c->num_attention_heads % c->num_key_value_heads)
        return rf_fail(RF_ERR_INVALID,
                       "gguf: head size %d must be even and head_count_kv %d must divide "
                       "head_count %d",
                       c->head_dim, c->num_key_value_heads, c->num_attention_heads);
    if ((rc = get_real(f, "llama.attention.layer_norm_rms_epsilon", 1e-6f, &c->rms_norm_eps)) ||
        (rc = get_real(f, "llama.rope.freq_base", 10000.0f, &c->rope_theta)))
        return rc;
    if (c->rms_norm_eps >= 1)
        return rf_fail(RF_ERR_INVALID, "gguf: layer_norm_rms_epsilon %g", c->rms_norm_eps);
    rc = rf_gguf_get_str(f, "llama.rope.scaling.type", &s, &n);
    if (rc == RF_OK && !str_is(s, n, "none"))
        return rf_fail(RF_ERR_UNSUPPORTED, "gguf: rope scaling '%.*s' is not supported",
                       (int)(n > 64 ? 64 : n), s);
    if (rc && rc != RF_ERR_NOT_FOUND) return rc;
    c->tie_word_embeddings = rf_gguf_find_tensor(f, "output.weight") == NULL;
    return RF_OK;
}

/* GGUF name of HF tensor `hf` (layer index and suffix), or NULL. perm gets
 * the head count whose rows are permuted (0: none). */
static const char *gguf_name(const char *hf, const rf_llama_config *c, char *buf, size_t size,
                             int *perm) {
    static const struct {
        const char *hf, *gg;
    } map[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    *perm = 0;
    if (!strcmp(hf, "model.embed_tokens.weight")) return "token_embd.weight";
    if (!strcmp(hf, "model.norm.weight")) return "output_norm.weight";
    if (!strcmp(hf, "lm_head.weight")) return "output.weight";
    int l, off;
    if (sscanf(hf, "model.layers.%d.%n", &l, &off) != 1) return NULL;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(hf + off, map[i].hf)) {
            if (i == 1) *perm = c->num_attention_heads;
            if (i == 2) *perm = c->num_key_value_heads;
            snprintf(buf, size, "blk.%d.%s", l, map[i].gg);
            return buf;
        }
    return NULL;
}

void rf_llama_gguf_row_map(int32_t *map, int heads, int hd) {
    int half = hd / 2;
    for (int h = 0; h < heads; h++)
        for (int a = 0; a < 2; a++)
            for (int i = 0; i < half; i++)
                map[h * hd + a * half + i] = h * hd + 2 * i + a;
}

/* Undoes convert_hf_to_gguf.py's permute() on rows [heads * hd, C]. */
static int unpermute(float *dst, const float *src, int heads, int hd, int C) {
    int32_t *map = malloc(sizeof(int32_t) * (size_t)heads * hd);
    if (!map) return RF_ERR_NOMEM;
    rf_llama_gguf_row_map(map, heads, hd);
    for (int r = 0; r < heads * hd; r++)
        memcpy(dst + (size_t)r * C, src + (size_t)map[r] * C, sizeof(float) * C);
    free(map);
    return RF_OK;
}

int rf_llama_from_gguf(const rf_gguf_file *f, rf_llama **out) {
    *out = NULL;
    rf_llama_config cfg;
    int rc = rf_llama_config_from_gguf(f, &cfg);
    if (rc) return rc;
    rf_llama *m;
    if ((rc = rf_llama_new(&cfg, &m))) return rc;
    bool *used = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *used);
    float *tmp = NULL;
    if (!used) rc = RF_ERR_NOMEM;
    for (size_t i = 0; i < m->ntensors && !rc; i++) {
        const rf_tensor_info *t = &m->tensors[i];
        char buf[96];
        int perm;
        const char *gn = gguf_name(t->name, &cfg, buf, sizeof buf, &perm);
        const rf_gguf_tensor *g = gn ? rf_gguf_find_tensor(f, gn) : NULL;
        if (!g) {
            rc = rf_fail(RF_ERR_NOT_FOUND, "gguf: tensor '%s' (%s) is missing", gn ? gn : "?",
                         t->name);
            break;
        }
        used[g - f->tensors] = true;
        /* GGUF ne is {in, out}: the reverse of the HF shape */
        bool ok = t->ndim == 2
                      ? g->n_dims == 2 && g->ne[0] == t->shape[1] && g->ne[1] == t->shape[0]
                      : g->n_dims == 1 && g->ne[0] == t->shape[0];
        if (!ok) {
            rc = rf_fail(RF_ERR_INVALID,
                         "gguf: tensor '%s' has shape [%lld, %lld], the config needs %s [%d, %d]",
                         gn, (long long)g->ne[0], (long long)g->ne[1], t->name,
                         t->ndim == 2 ? t->shape[1] : t->shape[0], t->ndim == 2 ? t->shape[0] : 1);
            break;
        }
        float *dst = m->params + t->offset;
        if (!perm) {
            rc = rf_gguf_dequant(g, dst);
        } else {
            free(tmp);
            if (!(tmp = malloc(t->numel * sizeof(float)))) {
                rc = RF_ERR_NOMEM;
                break;
            }
            if (!(rc = rf_gguf_dequant(g, tmp)))
                rc = unpermute(dst, tmp, perm, cfg.head_dim, cfg.hidden_size);
        }
        if (rc) rc = rf_fail_ctx(rc, "gguf: tensor '%s'", gn);
    }
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++)
        if (!used[i])
            rc = rf_fail(RF_ERR_UNSUPPORTED, "gguf: tensor '%s' has no place in a Llama model",
                         f->tensors[i].name);
    free(used);
    free(tmp);
    if (rc) {
        rf_llama_free(m);
        return rc;
    }
    *out = m;
    return RF_OK;
}

int rf_llama_load_gguf(const char *path, rf_llama **out) {
    *out = NULL;
    rf_gguf_file *f;
    int rc = rf_gguf_open(path, &f);
    if (rc) return rf_fail_ctx(rc, "%s", path);
    rc = rf_llama_from_gguf(f, out);
    rf_gguf_free(f);
    return rc ? rf_fail_ctx(rc, "%s", path) : RF_OK;
}

static bool is_gguf_file(const char *s) {
    size_t n = strlen(s);
    return n > 5 && s[0] != '.' && strcmp(s + n - 5, ".gguf") == 0;
}

int rf_llama_gguf_path(const char *path, char **out) {
    *out = NULL;
    struct stat st;
    char p[4096];
    if (stat(path, &st) != 0) return RF_OK;
    if (S_ISREG(st.st_mode)) {
        const char *base = strrchr(path, '/');
        if (!is_gguf_file(base ? base + 1 : path)) return RF_OK;
        return (*out = strdup(path)) ? RF_OK : RF_ERR_NOMEM;
    }
    if (!S_ISDIR(st.st_mode)) return RF_OK;
    snprintf(p, sizeof p, "%s/config.json", path);
    if (stat(p, &st) == 0) return RF_OK;
    DIR *d = opendir(path);
    if (!d) return RF_OK;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (is_gguf_file(e->d_name) && !n++) snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    closedir(d);
    if (n > 1)
        return rf_fail(RF_ERR_INVALID,
                       "%s: %d .gguf files and no config.json in the folder; name "
                       "the file",
                       path, n);
    if (n == 1 && !(*out = strdup(p))) return RF_ERR_NOMEM;
    return RF_OK;
}

int rf_llama_gguf_describe(const char *path, rf_llama_config *c, int *eos, rf_ggml_type *proj) {
    rf_gguf_file *f;
    int rc = rf_gguf_open(path, &f);
    if (rc) return rc;
    uint64_t v;
    *eos = rf_gguf_get_u64(f, "tokenizer.ggml.eos_token_id", &v) == RF_OK && v <= INT32_MAX ? (int)v
                                                                                            : -1;
    const rf_gguf_tensor *t = rf_gguf_find_tensor(f, "blk.0.attn_q.weight");
    *proj = t ? t->type : RF_GGML_F32;
    rc = rf_llama_config_from_gguf(f, c);
    rf_gguf_free(f);
    return rc ? rf_fail_ctx(rc, "%s", path) : RF_OK;
}
