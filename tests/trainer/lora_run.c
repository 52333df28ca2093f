/* lora_run: a by-hand program (not a test) around lora.h, for the checks that
 * need a reference outside make test or a real model:
 *
 *   lora_run --model DIR|FILE.gguf [--mode lora|full] [--base fp32|int8|nf4|q4_1]
 *            [--rank R] [--alpha A] [--targets q,k,v,o,up,down,gate] [--dropout P]
 *            [--seq T] [--batch B] [--steps N] [--lr LR] [--text FILE] [--threads N]
 *            [--adapter-out DIR] [--logits-out FILE.safetensors]
 *
 * trains N AdamW steps (mode lora: the adapter alone over the frozen base;
 * full: every parameter, fp32) on one batch of B x T tokens (from --text
 * tokenized with the GGUF file's tokenizer, else ids (37 n + 11) mod vocab),
 * prints the loss of each step, optionally writes the adapter as PEFT files
 * and the logits of the batch after training (eval mode: no dropout) with its
 * ids, and ends with one JSON line of measurements: peak RSS and the bytes of
 * the fp32 base actually held, quantized base, adapter parameters, gradients,
 * AdamW moments and activations. scripts/parity/peft_export_check.py and
 * scripts/bench/lora_memory.sh run it. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"
#include "trainer/backend.h"
#include "common/gguf.h"
#include "tokenizer/gguf_tokenizer.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/lora.h"
#include "trainer/ops.h"
#include "trainer/safetensors.h"

static void die(const char *what) {
    fprintf(stderr, "lora_run: %s: %s\n", what, rf_errmsg());
    exit(1);
}

static bool ends_with(const char *s, const char *t) {
    size_t a = strlen(s), b = strlen(t);
    return a >= b && strcmp(s + a - b, t) == 0;
}

/* Tokens of a text file with the GGUF's tokenizer, the first n. */
static int32_t *text_ids(const char *gguf, const char *text, size_t n) {
    rf_gguf_file *f;
    rf_tokenizer *tok;
    if (rf_gguf_open(gguf, &f) || rf_gguf_tokenizer(f, &tok, NULL)) die("tokenizer");
    rf_gguf_free(f);
    char *buf;
    size_t len;
    if (rf_read_file(text, 1 << 30, &buf, &len)) die(text);
    rf_tok_state *st = rf_tok_state_new(tok);
    rf_tok_encoding e = {0};
    size_t take = len < 200000 ? len : 200000; /* plenty of tokens */
    if (!st || rf_tok_encode(st, buf, take, false, &e)) die("encode");
    if (e.len < n) {
        fprintf(stderr, "lora_run: %s gives %zu tokens, %zu needed\n", text, e.len, n);
        exit(1);
    }
    int32_t *ids = malloc(sizeof(int32_t) * n);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)e.ids[i];
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    rf_tokenizer_free(tok);
    free(buf);
    return ids;
}

int main(int argc, char **argv) {
    const char *model = NULL, *mode = "lora", *text = NULL, *adapter_out = NULL, *logits_out = NULL,
               *targets = "q,k,v,o,up,down,gate";
    rf_lora_config lc = rf_lora_defaults();
    int T = 64, B = 1, steps = 2, threads = 0;
    float lr = 1e-3f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "lora_run: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--mode"))
            mode = v;
        else if (!strcmp(a, "--base")) {
            int b = rf_lora_base_parse(v);
            if (b < 0) {
                fprintf(stderr, "lora_run: unknown base '%s'\n", v);
                return 2;
            }
            lc.base = (rf_qtype)b;
        } else if (!strcmp(a, "--rank"))
            lc.rank = atoi(v);
        else if (!strcmp(a, "--alpha"))
            lc.alpha = (float)atof(v);
        else if (!strcmp(a, "--dropout"))
            lc.dropout = (float)atof(v);
        else if (!strcmp(a, "--targets"))
            targets = v;
        else if (!strcmp(a, "--seq"))
            T = atoi(v);
        else if (!strcmp(a, "--batch"))
            B = atoi(v);
        else if (!strcmp(a, "--steps"))
            steps = atoi(v);
        else if (!strcmp(a, "--lr"))
            lr = (float)atof(v);
        else if (!strcmp(a, "--text"))
            text = v;
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else if (!strcmp(a, "--adapter-out"))
            adapter_out = v;
        else if (!strcmp(a, "--logits-out"))
            logits_out = v;
        else {
            fprintf(stderr, "lora_run: unknown option %s\n", a);
            return 2;
        }
    }
    if (!model || T < 2 || B < 1 || steps < 0 || (strcmp(mode, "lora") && strcmp(mode, "full"))) {
        fprintf(stderr, "usage: lora_run --model DIR|FILE.gguf [options] (see the source)\n");
        return 2;
    }
    if (threads > 0) rf_backend_cpu_set_threads(threads);
    lc.targets = 0;
    char tl[256];
    snprintf(tl, sizeof tl, "%s", targets);
    for (char *s = strtok(tl, ","); s; s = strtok(NULL, ",")) {
        unsigned b = rf_lora_target_bit(s);
        if (!b) {
            fprintf(stderr, "lora_run: unknown target '%s'\n", s);
            return 2;
        }
        lc.targets |= b;
    }
    bool full = !strcmp(mode, "full"), gguf = ends_with(model, ".gguf");
    rf_gpt2 *g = NULL;
    rf_llama *l = NULL;
    rf_lora *lo = NULL;
    double t0 = rf_now();
    if (gguf) {
        if (rf_lora_load_llama_gguf(model, full ? NULL : &lc, 1, &l, &lo)) die(model);
    } else {
        char path[4096], *cfg;
        size_t len;
        snprintf(path, sizeof path, "%s/config.json", model);
        if (rf_read_file(path, 1 << 20, &cfg, &len)) die(path);
        bool is_llama = strstr(cfg, "\"llama\"") != NULL;
        free(cfg);
        if (is_llama ? rf_llama_load(model, &l) : rf_gpt2_load(model, &g)) die(model);
        if (!full) {
            if ((l ? rf_lora_new_llama(l, &lc, 1, &lo) : rf_lora_new_gpt2(g, &lc, 1, &lo)) ||
                (l ? rf_lora_attach_llama(lo, l, true) : rf_lora_attach_gpt2(lo, g)))
                die("lora");
        }
    }
    double t_load = rf_now() - t0;
    if ((l ? rf_llama_enable_training(l) : rf_gpt2_enable_training(g)) ||
        (lo && rf_lora_enable_training(lo)))
        die("enable training");
    int V = l ? l->cfg.vocab_size : g->cfg.vocab_size;
    size_t N = (size_t)B * T;
    int32_t *ids = text ? text_ids(model, text, N) : malloc(sizeof(int32_t) * N);
    for (size_t n = 0; !text && n < N; n++)
        ids[n] = (int32_t)((n * 37 + 11) % (size_t)V);
    rf_causal_batch batch = {.B = B, .T = T, .ids = ids, .labels = ids};

    /* full fine-tuning: the model's own AdamW state */
    size_t np = l ? l->nparams : g->nparams;
    float *m1 = NULL, *m2 = NULL;
    rf_param_span *spans = NULL;
    const rf_tensor_info *tab = l ? l->tensors : g->tensors;
    size_t nt = l ? l->ntensors : g->ntensors;
    if (full) {
        m1 = calloc(np, sizeof(float)), m2 = calloc(np, sizeof(float));
        spans = malloc(sizeof *spans * nt);
        if (!m1 || !m2 || !spans) die("moments");
        for (size_t i = 0; i < nt; i++)
            spans[i] = (rf_param_span){tab[i].offset, tab[i].numel, tab[i].decay};
    }
    rf_adamw o = rf_adamw_defaults();
    o.lr = lr, o.weight_decay = 0.01f;
    double t_steps = 0;
    for (int s = 0; s < steps; s++) {
        double ts = rf_now();
        if (lo) {
            rf_lora_zero_grad(lo);
            lo->train = true, lo->seed = (uint64_t)s + 1;
        } else if (l ? rf_llama_zero_grad(l) : rf_gpt2_zero_grad(g)) {
            die("zero grad");
        }
        if (l ? rf_llama_forward(l, &batch) : rf_gpt2_forward(g, &batch)) die("forward");
        float loss = l ? l->loss : g->loss;
        if (l ? rf_llama_backward(l, 1.0f) : rf_gpt2_backward(g, 1.0f)) die("backward");
        float norm;
        if (lo) {
            norm = rf_lora_adamw_step(lo, &o, s);
        } else {
            float *gr = l ? l->grads : g->grads, *p = l ? l->params : g->params;
            norm = (float)sqrt(rf_op_sumsq(gr, np));
            float coef = o.clip_norm / (norm + 1e-6f);
            if (coef < 1.0f) rf_op_scale(gr, np, coef);
            rf_adamw_hp hp = {rf_adamw_lr(&o, s), o.beta1, o.beta2, o.eps,
                              o.weight_decay,     s,       NULL,    0};
            rf_op_adamw(p, gr, m1, m2, 0, np, spans, nt, &hp);
        }
        double dt = rf_now() - ts;
        t_steps += dt;
        fprintf(stderr, "step %d: loss %.5f, gradient norm %.4g, %.2f s\n", s, loss, norm, dt);
    }
    if (lo) lo->train = false;
    if (l ? rf_llama_forward(l, &batch) : rf_gpt2_forward(g, &batch)) die("forward");
    float final_loss = l ? l->loss : g->loss;
    if (adapter_out && (!lo || rf_lora_save_peft(lo, adapter_out, model))) die("adapter");
    if (logits_out) {
        float *fids = malloc(sizeof(float) * N);
        for (size_t n = 0; n < N; n++)
            fids[n] = (float)ids[n];
        rf_st_out t[2] = {{"ids", 2, {B, T}, fids},
                          {"logits", 3, {B, T, V}, l ? l->logits : g->logits}};
        if (rf_st_write(logits_out, t, 2)) die(logits_out);
        free(fids);
    }
    /* what is held: the fp32 block less the released projections, and the rest */
    size_t proj = 0;
    if (lo && lo->cfg.base != RF_QT_F32)
        for (int i = 0; i < lo->nlayers * RF_NPROJ; i++)
            proj += (size_t)lo->proj[i].in * lo->proj[i].out;
    size_t acts = (l ? l->nacts : g->nacts) * sizeof(float) * 2;
    if (lo)
        acts += sizeof(float) * (size_t)lo->capN *
                (lo->nu + lo->cfg.rank + (lo->cfg.dropout > 0 ? lo->maxin : 0));
    printf("{\"model\": \"%s\", \"mode\": \"%s\", \"base\": \"%s\", \"rank\": %d, "
           "\"batch\": %d, \"seq\": %d, \"steps\": %d, \"threads\": %d, \"loss_after\": %.5f, "
           "\"peak_rss_mb\": %.1f, \"base_fp32_mb\": %.1f, \"base_quantized_mb\": %.1f, "
           "\"trainable_params\": %zu, \"trainable_mb\": %.2f, \"grads_mb\": %.2f, "
           "\"moments_mb\": %.2f, \"activations_mb\": %.1f, \"load_s\": %.2f, "
           "\"step_s\": %.2f}\n",
           model, mode, lo ? rf_lora_base_name(lo->cfg.base) : "fp32", lo ? lo->cfg.rank : 0, B, T,
           steps, omp_get_max_threads(), final_loss, rf_peak_rss_kb() / 1024.0,
           (np - proj) * 4 / 1048576.0, lo ? lo->qbytes / 1048576.0 : 0.0, lo ? lo->nparams : np,
           (lo ? lo->nparams : np) * 4 / 1048576.0, (lo ? lo->nparams : np) * 4 / 1048576.0,
           (lo ? lo->nparams : np) * 8 / 1048576.0, acts / 1048576.0, t_load,
           steps ? t_steps / steps : 0.0);
    free(ids), free(m1), free(m2), free(spans);
    rf_lora_free(lo);
    rf_gpt2_free(g), rf_llama_free(l);
    return 0;
}
