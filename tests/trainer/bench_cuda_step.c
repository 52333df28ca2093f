/* A by-hand benchmark (not a test; scripts/bench/bench_gpu.sh runs it): full
 * training steps (zero grad, forward with dropout, backward, clipping, AdamW)
 * of a BERT classifier on one backend, timed after warm-up. Prints one JSON
 * line: tokens/s (every position of the padded batch counts), the model
 * FLOPs per token and MFU against a peak given in TFLOP/s, and the device
 * memory in use after the steps (the backend allocates everything up front
 * and has no caching allocator, so this is the peak).
 *
 * FLOPs per token (the llm.c / PaLM convention): 6 N + 12 L T C, where N is
 * the parameters that multiply activations (all but the three embedding
 * tables), L the layers, T the sequence length, C the hidden size (the QK^T
 * and PV products: 2 x 2 T C per token and layer forward, x3 with backward).
 *
 * usage: bench_cuda_step --model DIR|bert-base --device cpu|cuda|cuda-bf16 --batch B
 *        --seq T --steps N [--peak-tflops 989] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/rng.h"
#include "trainer/model.h"
#include "trainer/optim.h"

#ifdef REFINERY_CUDA
#include <cuda_runtime.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* bert-base-uncased's shape, randomly initialised (matrices uniform with std 0.02, LayerNorm
 * weights 1, biases 0). */
static int random_bert_base(const rf_backend *be, rf_bert **out) {
    rf_bert_config c = {.vocab_size = 30522,
                        .hidden_size = 768,
                        .num_layers = 12,
                        .num_heads = 12,
                        .intermediate_size = 3072,
                        .max_position = 512,
                        .type_vocab_size = 2,
                        .num_labels = 2,
                        .layer_norm_eps = 1e-12f,
                        .initializer_range = 0.02f,
                        .hidden_dropout = 0.1f,
                        .attention_dropout = 0.1f,
                        .classifier_dropout = 0.1f};
    int rc = rf_bert_new(&c, be, out);
    if (rc) return rc;
    rf_bert *m = *out;
    float *h = malloc(m->nparams * sizeof(float));
    if (!h) return RF_ERR_NOMEM;
    rf_rng r;
    rf_rng_seed(&r, 1);
    for (size_t t = 0; t < m->ntensors; t++) {
        const rf_tensor_info *ti = &m->tensors[t];
        bool ln_w = strstr(ti->name, "LayerNorm.weight") != NULL;
        for (size_t i = 0; i < ti->numel; i++)
            h[ti->offset + i] = ln_w ? 1.0f
                                : ti->ndim == 2
                                    ? (float)(0.02 * (rf_rng_double(&r) * 2 - 1) * 1.732)
                                    : 0.0f;
    }
    rc = be->to_device(be, m->params, h, m->nparams * sizeof(float));
    free(h);
    return rc;
}

int main(int argc, char **argv) {
    const char *model = "bert-base", *device = "cuda";
    int B = 32, T = 128, steps = 20;
    double peak = 989.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else if (!strcmp(argv[i], "--batch"))
            B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq"))
            T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--peak-tflops"))
            peak = atof(argv[i + 1]);
        else {
            fprintf(stderr, "bench_cuda_step: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    const rf_backend *be;
    rf_bert *m = NULL;
    int rc = rf_backend_for(device, &be);
    if (!rc)
        rc = strcmp(model, "bert-base") ? rf_bert_load(model, 2, 1, be, &m)
                                        : random_bert_base(be, &m);
    if (!rc) rc = rf_bert_enable_training(m);
    if (rc) {
        fprintf(stderr, "bench_cuda_step: %s\n", rf_errmsg());
        return 1;
    }
    const rf_bert_config *c = &m->cfg;
    size_t N = (size_t)B * T;
    int32_t *ids = malloc(N * 4), *types = calloc(N, 4), *labels = malloc((size_t)B * 4);
    uint8_t *valid = malloc(N);
    rf_rng r;
    rf_rng_seed(&r, 2);
    for (size_t i = 0; i < N; i++) {
        ids[i] = (int32_t)(1000 + rf_rng_below(&r, (uint64_t)c->vocab_size - 1000));
        valid[i] = 1;
    }
    for (int b = 0; b < B; b++)
        labels[b] = b % 2;
    rf_batch batch = {B, T, ids, types, labels, valid};
    rf_adamw o = rf_adamw_defaults();
    double t0 = 0;
    float norm = 0;
    for (int s = 0; s < steps + 3 && !rc; s++) {
        if (s == 3) t0 = now(); /* 3 warm-up steps */
        if (!(rc = rf_bert_zero_grad(m)) && !(rc = rf_bert_forward(m, &batch, true, (uint64_t)s)) &&
            !(rc = rf_bert_backward(m, 1.0f)) && !(rc = rf_clip_grads_ex(m, o.clip_norm, &norm)))
            rc = rf_adamw_update(m, &o, s, o.lr, 0, m->nparams, m->m, m->v);
    }
    /* the last step's norm came back to the host: the device is idle */
    double secs = now() - t0;
    if (rc) {
        fprintf(stderr, "bench_cuda_step: %s\n", rf_errmsg());
        return 1;
    }
    size_t emb = m->tensors[0].numel + m->tensors[1].numel + m->tensors[2].numel;
    double n_mm = (double)(m->nparams - emb);
    double flops_tok = 6.0 * n_mm + 12.0 * c->num_layers * (double)T * c->hidden_size;
    double tps = (double)N * steps / secs;
    double mfu = tps * flops_tok / (peak * 1e12);
    double mem_gib = -1;
#ifdef REFINERY_CUDA
    size_t fr = 0, tot = 0;
    if (be->device_memory && cudaMemGetInfo(&fr, &tot) == cudaSuccess)
        mem_gib = (double)(tot - fr) / (1024.0 * 1024 * 1024);
#endif
    printf("{\"impl\":\"refinery\",\"device\":\"%s\",\"precision\":\"%s\",\"model\":\"%s\","
           "\"params\":%zu,\"batch\":%d,\"seq\":%d,\"steps\":%d,\"seconds\":%.3f,"
           "\"tokens_per_s\":%.1f,\"flops_per_token\":%.4g,\"mfu\":%.4f,\"peak_tflops\":%.1f,"
           "\"device_mem_gib\":%.3f,\"loss\":%.5f}\n",
           be->name, strcmp(be->name, "cuda-bf16") ? "fp32" : "bf16-mm", model, m->nparams, B, T,
           steps, secs, tps, flops_tok, mfu, peak, mem_gib, m->loss);
    rf_bert_free(m);
    free(ids), free(types), free(labels), free(valid);
    return 0;
}
