/* A Llama (SmolLM2) from a GGUF file, for LoRA on a quantized base: the
 * projection weights go straight into the adapter set's base format (Q4_1: the
 * file's blocks as they are; int8 / NF4: one tensor dequantized at a time and
 * quantized), so the model's fp32 block never holds them; everything else
 * (embedding, norms, an untied head) is dequantized into the model. The
 * config and the q/k row order are llama_gguf.h's, as for the fp32 loader. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/gguf.h"
#include "trainer/backend.h"
#include "trainer/llama.h"
#include "trainer/llama_gguf.h"
#include "trainer/lora.h"

/* The tensor `name` of shape [rows, cols] (ggml ne = {cols, rows}). */
static int tensor(const rf_gguf_file *f, const char *name, int rows, int cols,
                  const rf_gguf_tensor **out) {
    const rf_gguf_tensor *t = rf_gguf_find_tensor(f, name);
    if (!t) return rf_fail(RF_ERR_NOT_FOUND, "gguf: tensor '%s' is missing", name);
    if (t->ne[0] != cols || t->ne[1] != (rows ? rows : 1) || t->ne[2] != 1 || t->ne[3] != 1)
        return rf_fail(RF_ERR_INVALID, "gguf: tensor '%s' is [%lld, %lld], expected [%d, %d]", name,
                       (long long)t->ne[1], (long long)t->ne[0], rows, cols);
    *out = t;
    return RF_OK;
}

/* On a device, a tensor's host copy before to_device: *buf grown to n floats. */
static float *staging(float **buf, size_t *cap, size_t n) {
    if (n > *cap) {
        free(*buf);
        *cap = 0;
        if (!(*buf = malloc(n * sizeof(float)))) return NULL;
        *cap = n;
    }
    return *buf;
}

int rf_lora_load_llama_gguf(const char *path, const rf_lora_config *lcfg, uint64_t seed,
                            rf_llama **out, rf_lora **lo_out) {
    return rf_lora_load_llama_gguf_on(path, lcfg, NULL, seed, out, lo_out);
}

int rf_lora_load_llama_gguf_on(const char *path, const rf_lora_config *lcfg, const rf_backend *be,
                               uint64_t seed, rf_llama **out, rf_lora **lo_out) {
    *out = NULL;
    if (!be) be = rf_backend_cpu();
    bool dev = be != rf_backend_cpu(); /* the model's block is written with to_device */
    float *stage = NULL;
    size_t stage_n = 0;
    if (lo_out) *lo_out = NULL;
    rf_gguf_file *f;
    int rc = rf_gguf_open(path, &f);
    if (rc) return rc;
    rf_llama_config c;
    rf_llama *m = NULL;
    rf_lora *lo = NULL;
    float *tmp = NULL;
    int32_t *map = NULL;
    if ((rc = rf_llama_config_from_gguf(f, &c)) || (rc = rf_llama_new_on(&c, be, &m))) goto out;
    if (lcfg && (rc = rf_lora_new_llama(m, lcfg, seed, &lo))) goto out;
    rf_qtype base = lo ? lo->cfg.base : RF_QT_F32;
    int C = c.hidden_size, F = c.intermediate_size, hd = c.head_dim, NH = c.num_attention_heads,
        NKV = c.num_key_value_heads;
    size_t big = (size_t)(F > NH * hd ? F : NH * hd) * (C > F ? C : F);
    if (!(tmp = malloc(sizeof(float) * big)) || !(map = malloc(sizeof(int32_t) * NH * hd))) {
        rc = RF_ERR_NOMEM;
        goto out;
    }
    const rf_gguf_tensor *t;
    char name[96];
    /* everything but the projections: dequantized into the model */
    struct {
        const char *gguf, *hf;
    } plain[] = {{"token_embd.weight", "model.embed_tokens.weight"},
                 {"output_norm.weight", "model.norm.weight"},
                 {"output.weight", "lm_head.weight"}};
    for (int i = 0; i < 3 && !rc; i++) {
        const rf_tensor_info *ti = rf_llama_find(m, plain[i].hf);
        if (!ti) continue; /* tied head */
        float *dst = dev ? staging(&stage, &stage_n, ti->numel) : m->params + ti->offset;
        if (!dst) rc = RF_ERR_NOMEM;
        if (!rc && !(rc = tensor(f, plain[i].gguf, ti->ndim == 2 ? ti->shape[0] : 0,
                                 ti->ndim == 2 ? ti->shape[1] : ti->shape[0], &t)))
            rc = rf_gguf_dequant(t, dst);
        if (!rc && dev)
            rc = be->to_device(be, m->params + ti->offset, dst, ti->numel * sizeof(float));
    }
    static const struct {
        const char *gguf, *hf;
        int slot, part; /* projection slot and part; -1: a norm */
    } per[] = {
        {"attn_norm", "input_layernorm", -1, 0},
        {"ffn_norm", "post_attention_layernorm", -1, 0},
        {"attn_q", "self_attn.q_proj", RF_PROJ_QKV, 0},
        {"attn_k", "self_attn.k_proj", RF_PROJ_QKV, 1},
        {"attn_v", "self_attn.v_proj", RF_PROJ_QKV, 2},
        {"attn_output", "self_attn.o_proj", RF_PROJ_O, 0},
        {"ffn_gate", "mlp.gate_proj", RF_PROJ_UP, 0},
        {"ffn_up", "mlp.up_proj", RF_PROJ_UP, 1},
        {"ffn_down", "mlp.down_proj", RF_PROJ_DOWN, 0},
    };
    for (int l = 0; l < c.num_hidden_layers && !rc; l++)
        for (size_t i = 0; i < sizeof per / sizeof *per && !rc; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, per[i].hf);
            const rf_tensor_info *ti = rf_llama_find(m, name);
            int rows = ti->ndim == 2 ? ti->shape[0] : 0,
                cols = ti->ndim == 2 ? ti->shape[1] : ti->shape[0];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, per[i].gguf);
            if ((rc = tensor(f, name, rows, cols, &t))) break;
            const int32_t *rm = NULL;
            if (per[i].slot == RF_PROJ_QKV && per[i].part < 2) {
                rf_llama_gguf_row_map(map, per[i].part == 0 ? NH : NKV, hd);
                rm = map;
            }
            if (per[i].slot < 0 || base == RF_QT_F32) { /* into the fp32 block */
                float *dst = dev ? staging(&stage, &stage_n, ti->numel) : m->params + ti->offset;
                if (!dst) {
                    rc = RF_ERR_NOMEM;
                    break;
                }
                if ((rc = rf_gguf_dequant(t, rm ? tmp : dst))) break;
                for (int r = 0; rm && r < rows; r++)
                    memcpy(dst + (size_t)r * cols, tmp + (size_t)rm[r] * cols,
                           sizeof(float) * cols);
                if (dev)
                    rc = be->to_device(be, m->params + ti->offset, dst, ti->numel * sizeof(float));
                continue;
            }
            rf_qweight q;
            if (base == RF_QT_Q4_1) {
                if (t->type != RF_GGML_Q4_1) {
                    rc =
                        rf_fail(RF_ERR_UNSUPPORTED, "gguf: %s is %s, a q4_1 base needs Q4_1 blocks",
                                name, rf_ggml_type_name(t->type));
                    break;
                }
                rc = rf_qweight_from_q4_1(&q, t->data, t->nbytes, rows, cols, rm);
            } else {
                float *w = tmp + (size_t)rows * cols <= tmp + big ? tmp : NULL;
                if (!w || (rc = rf_gguf_dequant(t, w))) break;
                if (rm) { /* rows in Hugging Face's order, then quantized */
                    float *v = malloc(sizeof(float) * (size_t)rows * cols);
                    if (!v) {
                        rc = RF_ERR_NOMEM;
                        break;
                    }
                    for (int r = 0; r < rows; r++)
                        memcpy(v + (size_t)r * cols, w + (size_t)rm[r] * cols,
                               sizeof(float) * cols);
                    rc = rf_qweight_quantize(&q, base, v, rows, cols);
                    free(v);
                } else {
                    rc = rf_qweight_quantize(&q, base, w, rows, cols);
                }
            }
            if (!rc) rc = rf_lora_set_base(lo, l, per[i].slot, per[i].part, &q);
            rf_qweight_free(&q);
        }
    if (!rc && lo) rc = rf_lora_attach_llama(lo, m, false);
out:
    if (rc) rc = rf_fail_ctx(rc, "%s", path);
    free(tmp), free(map), free(stage);
    rf_gguf_free(f);
    if (rc) {
        rf_lora_free(lo);
        rf_llama_free(m);
        return rc;
    }
    *out = m;
    if (lo_out)
        *lo_out = lo;
    else
        rf_lora_free(lo);
    return RF_OK;
}
