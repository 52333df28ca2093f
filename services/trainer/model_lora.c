/* LoRA as an rf_model (model_iface.h): a frozen causal LM (GPT-2 or Llama,
 * itself an rf_model with the adapter set attached, lora.h) seen through the
 * adapter's blocks. The training loop, the optimizer, clipping, the
 * checkpoints and the data-parallel all-reduce work on flat blocks and units;
 * here those are the adapter's: one unit, [0, nparams) of its block. Forward
 * and backward run the whole base model (whose projections add the adapters)
 * and raise the one unit's events around it. The export (save) is the PEFT
 * adapter (adapter_config.json + adapter_model.safetensors). */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/llama_gguf.h"
#include "trainer/lora.h"
#include "trainer/model_iface.h"

typedef struct lora_model {
    rf_model *base; /* owned; its impl holds lo as m->lora */
    rf_lora *lo;    /* owned */
    char *src;      /* the base model's folder or GGUF file, for base_model_name_or_path */
} lora_model;

#define LM(m) ((lora_model *)(m)->impl)

static int event(rf_model *m, rf_unit_event ev) {
    return m->hook ? m->hook(m->hook_user, 0, ev, -1) : RF_OK;
}

static int lm_close(rf_model *m) {
    lora_model *x = LM(m);
    rf_model_free(x->base); /* before the adapter set it points to */
    rf_lora_free(x->lo);
    free(x->src);
    free(x);
    m->impl = NULL;
    return RF_OK;
}

static int lm_info(const rf_model *m, rf_model_info *o) {
    *o = rf_model_info_of(LM(m)->base);
    if (!o->arch) return rf_fail(RF_ERR_INTERNAL, "lora: the base model gave no info");
    o->units = 1;
    o->tied = false; /* the adapter block holds no head */
    return RF_OK;
}

static int lm_blocks(const rf_model *m, rf_model_blocks *o) {
    const rf_lora *lo = LM(m)->lo;
    *o = (rf_model_blocks){lo->be,       lo->tensors, lo->ntensors, lo->nparams, lo->npadded,
                           lo->nmoments, lo->params,  lo->grads,    lo->m,       lo->v};
    return RF_OK;
}

static int lm_unit_range(const rf_model *m, int u, size_t *lo, size_t *hi) {
    (void)u;
    *lo = 0;
    *hi = LM(m)->lo->nparams;
    return RF_OK;
}

static int lm_bind_unit(rf_model *m, int u, float *p, float *g) {
    (void)m, (void)p, (void)g;
    return u < 0 ? RF_OK
                 : rf_fail(RF_ERR_UNSUPPORTED,
                           "lora: the adapter block cannot be sharded per unit (ZeRO-2/3)");
}

static int lm_release(rf_model *m, bool params) {
    rf_lora *lo = LM(m)->lo;
    if (params) return rf_fail(RF_ERR_UNSUPPORTED, "lora: the adapter's parameters stay in place");
    const rf_backend *be = lo->be;
    if (lo->grads) be->free(be, lo->grads);
    if (lo->m) be->free(be, lo->m);
    if (lo->v) be->free(be, lo->v);
    if (lo->ss) be->free(be, lo->ss);
    lo->grads = lo->m = lo->v = NULL;
    lo->ss = NULL;
    lo->nmoments = 0;
    return RF_OK;
}

static int lm_adopt(rf_model *m, const float *host) {
    rf_lora *lo = LM(m)->lo;
    return lo->be->to_device(lo->be, lo->params, host, lo->nparams * sizeof(float));
}

static int lm_enable(rf_model *m, size_t padded, size_t moments) {
    lora_model *x = LM(m);
    int rc = rf_lora_enable_training_sharded(x->lo, padded, moments);
    /* the base: frozen, activations' gradients only (its m->lora is set) */
    return rc ? rc : rf_model_enable_training(x->base, 0, 0);
}

static int lm_zero_grad(rf_model *m) {
    return rf_lora_zero_grad(LM(m)->lo);
}

static int lm_class_weights(rf_model *m, const float *w) {
    (void)m;
    return w ? rf_fail(RF_ERR_UNSUPPORTED, "lora: class weights apply to classifiers only") : RF_OK;
}

static int lm_set_hook(rf_model *m) {
    (void)m; /* events are raised here, around the base's passes */
    return RF_OK;
}

static int lm_replay(rf_model *m, int u0, int u1, bool backward) {
    (void)u0, (void)u1;
    int rc = event(m, RF_UNIT_FWD);
    if (!rc && backward) rc = event(m, RF_UNIT_BWD);
    if (!rc && backward) rc = event(m, RF_UNIT_BWD_DONE);
    return rc;
}

static int lm_forward(rf_model *m, const rf_model_batch *b, int u0, int u1, const float *in,
                      float *out, bool train, uint64_t seed) {
    (void)u0, (void)u1, (void)in, (void)out; /* one unit: always the whole model */
    lora_model *x = LM(m);
    int rc = event(m, RF_UNIT_FWD);
    if (rc) return rc;
    x->lo->train = train, x->lo->seed = seed;
    rc = rf_model_forward(x->base, b, train, seed);
    m->counted = rc ? 0 : x->base->counted;
    return rc;
}

static int lm_backward(rf_model *m, int u0, int u1, const float *dout, float *din, float scale) {
    (void)u0, (void)u1, (void)dout, (void)din;
    int rc = event(m, RF_UNIT_BWD);
    if (!rc) rc = rf_model_backward(LM(m)->base, scale);
    if (!rc) rc = event(m, RF_UNIT_BWD_DONE);
    return rc;
}

static int lm_loss(const rf_model *m, float *loss, long *counted) {
    return rf_model_loss(LM(m)->base, loss, counted);
}

static int lm_logits(const rf_model *m, const float **logits, size_t *row) {
    return rf_model_logits(LM(m)->base, logits, row);
}

static int lm_save(const rf_model *m, const char *dir) {
    return rf_lora_save_peft(LM(m)->lo, dir, LM(m)->src);
}

static const rf_model_ops lora_ops = {
    .name = "lora",
    .close = lm_close,
    .info = lm_info,
    .blocks = lm_blocks,
    .unit_range = lm_unit_range,
    .bind_unit = lm_bind_unit,
    .release_blocks = lm_release,
    .adopt_params = lm_adopt,
    .enable_training = lm_enable,
    .zero_grad = lm_zero_grad,
    .set_class_weights = lm_class_weights,
    .set_hook = lm_set_hook,
    .replay = lm_replay,
    .boundary = NULL, /* no pipeline split */
    .forward = lm_forward,
    .backward = lm_backward,
    .loss = lm_loss,
    .logits = lm_logits,
    .save = lm_save,
};

/* The base from a GGUF file (lora_gguf.c: quantized projections straight
 * from its blocks) as an rf_model around the rf_llama, with its eos. */
static int load_gguf(const char *path, const rf_lora_config *cfg, const rf_backend *be,
                     uint64_t init_seed, rf_model **base, rf_lora **lo) {
    rf_llama_config c;
    rf_ggml_type proj;
    int eos;
    rf_llama *l = NULL;
    int rc = rf_llama_gguf_describe(path, &c, &eos, &proj);
    if (!rc && cfg->base == RF_QT_Q4_1 && proj != RF_GGML_Q4_1)
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "trainer.lora.base: q4_1 keeps the GGUF's Q4_1 blocks, but the projections "
                       "of %s are %s: use base nf4, int8 or fp32",
                       path, rf_ggml_type_name(proj));
    if (!rc) rc = rf_lora_load_llama_gguf_on(path, cfg, be, init_seed, &l, lo);
    if (!rc && !(*base = calloc(1, sizeof **base))) rc = RF_ERR_NOMEM;
    if (rc) {
        rf_lora_free(*lo);
        rf_llama_free(l);
        *lo = NULL;
        return rc;
    }
    rf_model_init_llama(*base, l);
    (*base)->eos = eos;
    (*base)->owns = (*base)->heap = true;
    return RF_OK;
}

int rf_model_load_lora(const char *dir, const rf_lora_config *cfg, const rf_backend *be,
                       uint64_t init_seed, rf_model **out) {
    *out = NULL;
    if (!be) be = rf_backend_cpu();
    rf_model *base = NULL;
    rf_lora *lo = NULL;
    char *gguf;
    int rc = rf_llama_gguf_path(dir, &gguf);
    if (rc) return rc;
    if (gguf) {
        rc = load_gguf(gguf, cfg, be, init_seed, &base, &lo);
        free(gguf);
    } else if (cfg->base == RF_QT_Q4_1) {
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "trainer.lora.base: q4_1 keeps a GGUF file's blocks, and %s is a Hugging "
                       "Face folder (use fp32, int8 or nf4)",
                       dir);
    } else {
        rc = rf_model_load(dir, NULL, be, &base);
        if (rc) return rc;
        rf_model_info info = rf_model_info_of(base);
        bool llama = info.arch && strcmp(info.arch, "llama") == 0;
        if (!info.arch || (strcmp(info.arch, "gpt2") && !llama))
            rc = rf_fail(RF_ERR_UNSUPPORTED, "lora: %s is a '%s' model (gpt2 or llama expected)",
                         dir, info.arch ? info.arch : "?");
        else if (llama)
            rc = rf_lora_new_llama(base->impl, cfg, init_seed, &lo);
        else
            rc = rf_lora_new_gpt2(base->impl, cfg, init_seed, &lo);
        if (!rc)
            rc = llama ? rf_lora_attach_llama(lo, base->impl, false)
                       : rf_lora_attach_gpt2(lo, base->impl);
    }
    lora_model *x = NULL;
    rf_model *m = NULL;
    if (!rc &&
        (!(x = calloc(1, sizeof *x)) || !(m = calloc(1, sizeof *m)) || !(x->src = strdup(dir))))
        rc = RF_ERR_NOMEM;
    if (rc) {
        if (x) free(x->src);
        free(x), free(m);
        rf_model_free(base);
        rf_lora_free(lo);
        return rc;
    }
    x->base = base, x->lo = lo;
    m->ops = &lora_ops, m->impl = x, m->owns = true, m->heap = true;
    *out = m;
    return RF_OK;
}
