/* A by-hand benchmark (not a test; scripts/bench/bench_gpu.sh runs it): full
 * training steps (zero grad, forward with dropout, backward, clipping, AdamW)
 * of a model on one backend, timed after warm-up: a BERT classifier (a
 * folder, or bert-base's shape randomly initialised), a causal LM (a GPT-2 or
 * Llama folder, or GPT-2 124M's shape randomly initialised: "gpt2"; every
 * position's next token is a label). Prints one JSON line: tokens/s (every
 * position of the batch counts), the model FLOPs per token and MFU against a
 * peak given in TFLOP/s, and the device memory in use after the steps (the
 * backend allocates everything up front and has no caching allocator, so
 * this is the peak).
 *
 * FLOPs per token (the llm.c / PaLM convention): 6 N + 12 L T C, where N is
 * the parameters that multiply activations (all but the tables only looked
 * up: BERT's three embedding tables, GPT-2's positions, an untied Llama's
 * token embedding; a tied head's embedding counts once, as the head), L the
 * layers, T the sequence length, C the hidden size (the QK^T and PV products:
 * 2 x 2 T C per token and layer forward, x3 with backward; the full T x T
 * for causal models too, as llm.c counts).
 *
 * With --profile K, the model runs on the backend profiler
 * (backend_profile.h), off for the timed steps; then K more steps are
 * profiled and a line {"profile": ...} comes before the result line: per
 * slot its calls and milliseconds per step and its share of the profiled
 * time, most time first (each slot waits for the device, so the profiled
 * steps are slower than the timed ones; the shares are the point).
 *
 * usage: bench_cuda_step --model DIR|bert-base|gpt2 --device cpu|cuda|cuda-bf16 --batch B
 *        --seq T --steps N [--peak-tflops 989] [--profile K] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sys.h"
#include "common/rng.h"
#include "trainer/backend_profile.h"
#include "trainer/gpt2.h"
#include "trainer/model.h"
#include "trainer/model_iface.h"
#include "trainer/optim.h"

#ifdef REFINERY_CUDA
#include <cuda_runtime.h>
#endif

/* Hugging Face's initialisation, roughly: matrices uniform with std 0.02,
 * norm weights (the one-dimensional ".weight"s) 1, biases 0. */
static int random_init(rf_model *m) {
    rf_model_blocks b;
    int rc = rf_model_blocks_of(m, &b);
    if (rc) return rc;
    float *h = malloc(b.nparams * sizeof(float));
    if (!h) return RF_ERR_NOMEM;
    rf_rng r;
    rf_rng_seed(&r, 1);
    for (size_t t = 0; t < b.ntensors; t++) {
        const rf_tensor_info *ti = &b.tensors[t];
        size_t n = strlen(ti->name);
        bool norm_w = ti->ndim == 1 && n > 7 && !strcmp(ti->name + n - 7, ".weight");
        for (size_t i = 0; i < ti->numel; i++)
            h[ti->offset + i] = norm_w ? 1.0f
                                : ti->ndim == 2
                                    ? (float)(0.02 * (rf_rng_double(&r) * 2 - 1) * 1.732)
                                    : 0.0f;
    }
    rc = b.be->to_device(b.be, b.params, h, b.nparams * sizeof(float));
    free(h);
    return rc;
}

/* bert-base-uncased's shape (dropout 0.1 as its config) or GPT-2 124M's,
 * randomly initialised, into *m (which then owns the implementation). */
static int random_model(const char *name, const rf_backend *be, rf_model *m) {
    int rc;
    if (!strcmp(name, "bert-base")) {
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
        rf_bert *b;
        if ((rc = rf_bert_new(&c, be, &b))) return rc;
        rf_model_init_bert(m, b);
    } else {
        rf_gpt2_config c = {.vocab_size = 50257,
                            .n_positions = 1024,
                            .n_embd = 768,
                            .n_layer = 12,
                            .n_head = 12,
                            .n_inner = 3072,
                            .layer_norm_epsilon = 1e-5f};
        rf_gpt2 *g;
        if ((rc = rf_gpt2_new_on(&c, be, &g))) return rc;
        rf_model_init_gpt2(m, g);
    }
    m->owns = true; /* rf_model_free closes the implementation */
    return random_init(m);
}

/* Parameters that multiply activations (see the FLOPs above). */
static double matmul_params(const rf_model_blocks *b, const rf_model_info *in) {
    double n = 0;
    for (size_t t = 0; t < b->ntensors; t++) {
        const char *nm = b->tensors[t].name;
        bool lookup = !strcmp(in->arch, "bert")   ? strstr(nm, "_embeddings.weight") != NULL
                      : !strcmp(in->arch, "gpt2") ? strstr(nm, "wpe.weight") != NULL
                                                  : !in->tied && strstr(nm, "embed_tokens") != NULL;
        if (!lookup) n += (double)b->tensors[t].numel;
    }
    return n;
}

/* One training step: zero grad, forward with dropout, backward, clipping,
 * AdamW. */
static int train_step(rf_model *m, const rf_model_batch *b, const rf_model_blocks *bl,
                      const rf_adamw *o, int s) {
    float norm = 0;
    int rc;
    if (!(rc = rf_model_zero_grad(m)) && !(rc = rf_model_forward(m, b, true, (uint64_t)s)) &&
        !(rc = rf_model_backward(m, 1.0f)) && !(rc = rf_optim_clip(bl, o->clip_norm, &norm)))
        rc = rf_optim_adamw(bl, o, s, o->lr, 0, bl->nparams, bl->m, bl->v);
    return rc;
}

/* K profiled steps after the first `from`: the {"profile": ...} line. */
static int profile_steps(rf_backend_profile *p, rf_model *m, const rf_model_batch *b,
                         const rf_model_blocks *bl, const rf_adamw *o, int from, int K) {
    rf_backend_profile_reset(p);
    rf_backend_profile_enable(p, true);
    double t0 = rf_now();
    int rc = RF_OK;
    for (int s = from; s < from + K && !rc; s++)
        rc = train_step(m, b, bl, o, s);
    double wall = rf_now() - t0;
    rf_backend_profile_enable(p, false);
    if (rc) return rc;
    rf_slot_time rows[128];
    size_t n = rf_backend_profile_rows(p, rows, 128);
    if (n > 128) n = 128;
    double total = 0;
    for (size_t i = 0; i < n; i++)
        total += rows[i].seconds;
    printf("{\"profile\":{\"steps\":%d,\"step_ms\":%.3f,\"slots_ms\":%.3f,\"slots\":[", K,
           1e3 * wall / K, 1e3 * total / K);
    for (size_t i = 0; i < n; i++)
        printf("%s{\"slot\":\"%s\",\"calls\":%.2f,\"ms\":%.4f,\"share\":%.4f}", i ? "," : "",
               rows[i].slot, (double)rows[i].calls / K, 1e3 * rows[i].seconds / K,
               total > 0 ? rows[i].seconds / total : 0.0);
    printf("]}}\n");
    return RF_OK;
}

int main(int argc, char **argv) {
    const char *model = "bert-base", *device = "cuda";
    int B = 32, T = 128, steps = 20, K = 0;
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
        else if (!strcmp(argv[i], "--profile"))
            K = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_cuda_step: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (B < 1 || T < 1 || steps < 1 || K < 0) {
        fprintf(stderr, "bench_cuda_step: --batch, --seq and --steps must be positive, --profile "
                        "not negative\n");
        return 2;
    }
    const rf_backend *dev, *be;
    rf_backend_profile *prof = NULL;
    rf_model local = {0}, *m = &local;
    rf_model_blocks bl;
    rf_model_info in = {0};
    int rc = rf_backend_for(device, &dev);
    be = dev;
    if (!rc && K > 0 && !(rc = rf_backend_profile_new(dev, &prof)))
        be = rf_backend_profile_backend(prof);
    if (!rc) {
        rf_model_load_opts lo = {.num_labels = 2, .seed = 1};
        rc = strcmp(model, "bert-base") && strcmp(model, "gpt2") ? rf_model_load(model, &lo, be, &m)
                                                                 : random_model(model, be, m);
    }
    if (!rc) rc = rf_model_blocks_of(m, &bl);
    if (!rc) rc = rf_model_enable_training(m, bl.nparams, bl.nparams);
    if (!rc) rc = rf_model_blocks_of(m, &bl); /* now with the gradients and moments */
    if (!rc) in = rf_model_info_of(m);
    int32_t *ids = NULL, *types = NULL, *labels = NULL;
    uint8_t *valid = NULL;
    size_t N = (size_t)B * T;
    if (!rc && (!(ids = malloc(N * 4)) || !(types = calloc(N, 4)) || !(labels = malloc(N * 4)) ||
                !(valid = malloc(N))))
        rc = rf_fail(RF_ERR_NOMEM, "batch of %zu tokens", N);
    bool causal = in.task == RF_TASK_CAUSAL_LM;
    double secs = 0;
    float loss = 0;
    if (!rc) {
        rf_rng r;
        rf_rng_seed(&r, 2);
        int lo_id = in.vocab > 2000 ? 1000 : 0;
        for (size_t i = 0; i < N; i++) {
            ids[i] = (int32_t)(lo_id + rf_rng_below(&r, (uint64_t)(in.vocab - lo_id)));
            valid[i] = 1;
            labels[i] = causal ? ids[i] : (int32_t)(i % 2); /* classify: the first B */
        }
        rf_model_batch batch = {.B = B, .T = T, .ids = ids, .labels = labels};
        if (!causal) batch.types = types, batch.valid = valid;
        rf_adamw o = rf_adamw_defaults();
        double t0 = 0;
        for (int s = 0; s < steps + 3 && !rc; s++) {
            if (s == 3) t0 = rf_now(); /* 3 warm-up steps */
            rc = train_step(m, &batch, &bl, &o, s);
        }
        /* the last step's norm came back to the host: the device is idle */
        secs = rf_now() - t0;
        long counted = 0;
        if (!rc) rc = rf_model_loss(m, &loss, &counted);
        if (!rc && prof) rc = profile_steps(prof, m, &batch, &bl, &o, steps + 3, K);
    }
    if (!rc) {
        double flops_tok = 6.0 * matmul_params(&bl, &in) + 12.0 * in.layers * (double)T * in.hidden;
        double tps = (double)N * steps / secs;
        double mfu = tps * flops_tok / (peak * 1e12);
        double mem_gib = -1;
#ifdef REFINERY_CUDA
        size_t fr = 0, tot = 0;
        if (be->device_memory && cudaMemGetInfo(&fr, &tot) == cudaSuccess)
            mem_gib = (double)(tot - fr) / (1024.0 * 1024 * 1024);
#endif
        printf("{\"impl\":\"refinery\",\"device\":\"%s\",\"precision\":\"%s\",\"model\":\"%s\","
               "\"arch\":\"%s\",\"params\":%zu,\"batch\":%d,\"seq\":%d,\"steps\":%d,"
               "\"seconds\":%.3f,\"tokens_per_s\":%.1f,\"flops_per_token\":%.10g,\"mfu\":%.4f,"
               "\"peak_tflops\":%.1f,\"device_mem_gib\":%.3f,\"loss\":%.5f}\n",
               dev->name, strcmp(dev->name, "cuda-bf16") ? "fp32" : "bf16-mm", model, in.arch,
               bl.nparams, B, T, steps, secs, tps, flops_tok, mfu, peak, mem_gib, loss);
    } else {
        fprintf(stderr, "bench_cuda_step: %s\n", rf_errmsg());
    }
    rf_model_free(m);
    rf_backend_profile_free(prof);
    free(ids), free(types), free(labels), free(valid);
    return rc ? 1 : 0;
}
