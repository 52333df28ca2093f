/* The `trainer:` section of a pipeline spec, shared by `refinery train` and the
 * embedded stage. Keys (all optional except model):
 *   task             classify (default: BertForSequenceClassification, one label
 *                    per sequence) | causal_lm (GPT-2 or Llama: next-token
 *                    prediction, continued pretraining or SFT; data as in
 *                    lm_data.h, packed into rows of max_len with one segment per
 *                    document; num_labels, class_weights and sampler do not apply)
 *   model            pretrained Hugging Face folder (config.json + model.safetensors);
 *                    its model_type must fit the task (bert; gpt2 or llama); with
 *                    lora also a llama.cpp GGUF of a Llama (a .gguf file or a
 *                    folder holding one and no config.json; without lora refused)
 *   train, eval      data: token shard prefix/directory or JSONL documents
 *                    (causal_lm: also {"prompt","completion"} lines and .txt/.raw
 *                    text, lm_data.h)
 *   output           working dir: checkpoint.bin, train.json (CLI default: trainer-out)
 *   export           HF folder written at the end (CLI default: <output>/model)
 *   num_labels       0 = largest label in the training data + 1
 *   epochs max_steps batch_size grad_accum max_len lr weight_decay warmup_ratio
 *   warmup_steps clip_norm beta1 beta2 eps seed dropout checkpoint_every
 *   log_every resume threads eval_batch_size shuffle
 *   stop_after       > 0: stop (checkpointed) after this many steps of this run;
 *                    rerun to resume (tests, time limits)
 *   class_weights    none (default) | balanced | [w0, w1, ...] (one per label)
 *   sampler          shuffle (default) | balanced (classes drawn equally often)
 *   parallel         {dp: N, tp: N, pp: N, zero: 0|1|2|3, microbatches: N,
 *                    stages: [layers, ...]}: the mesh (mesh.h; dp x tp x pp must
 *                    be the world size of the group the caller starts, e.g.
 *                    mpirun -np N), the ZeRO stage on the dp axis (train.c,
 *                    zero3.h; 3 only without tp/pp), micro-batches per batch for
 *                    the pipeline's 1F1B schedule and each stage's layers
 *                    (absent: balanced by measured cost; parallel.h)
 *   lora             causal_lm only: train a LoRA adapter over the frozen model
 *                    instead of the model itself (lora.h): {rank: 8, alpha: 2 x rank,
 *                    dropout: 0, targets: [q, v] (of q, k, v, o, up, down, gate),
 *                    base: fp32 | int8 | nf4 | q4_1 (a GGUF model with Q4_1
 *                    projections only: its blocks as they are)}; the export is
 *                    the PEFT adapter (adapter_config.json +
 *                    adapter_model.safetensors) and the tokenizer files (none
 *                    for a GGUF: its tokenizer is in the file); dp with zero 0
 *                    or 1, device cpu
 *   device           cpu (default) | cuda | cuda-bf16: the backend the model runs
 *                    on (backend.h; cuda-bf16: matrix products on bf16 tensor cores);
 *                    cuda is refused at parsing when the build has no CUDA
 *                    (make CUDA=1) or the machine no usable GPU */
#ifndef RF_TR_SPEC_H
#define RF_TR_SPEC_H

#include "common/config.h"
#include "trainer/lora.h"
#include "trainer/train.h"

typedef struct rf_trainer_spec {
    const char *model, *train, *eval, *output, *export_dir; /* strings live in the rf_cfg tree */
    const char *device; /* "cpu" (default), "cuda", "cuda-bf16"; the evaluator follows it */
    int num_labels, max_len, threads, eval_batch_size;
    int dp; /* parallel.dp (1 when absent); zero, tp, pp, microbatches, stages are in opts */
    rf_model_task task; /* trainer.task */
    bool lora;          /* trainer.lora given: lora_cfg holds it */
    rf_lora_config lora_cfg;
    rf_train_opts opts;
} rf_trainer_spec;

extern const char *const rf_trainer_spec_keys[];

int rf_trainer_spec_parse(const rf_cfg *section, rf_trainer_spec *s);

/* Running a parsed spec: trainer/driver.h. */

#endif
