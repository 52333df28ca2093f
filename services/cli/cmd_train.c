/* `refinery train SPEC.yaml`: fine-tunes a BERT classifier (trainer.task:
 * classify) or trains a GPT-2/Llama causal LM (task: causal_lm) from the spec's
 * `trainer:` section (see services/trainer/spec.h), checkpointing into
 * `output` and exporting a Hugging Face folder. Rerunning after a kill resumes
 * from the last checkpoint. SIGINT/SIGTERM checkpoint and stop. When `eval` is
 * set, the export is then scored by the evaluator library into
 * <output>/eval.json (the trainer itself does not evaluate).
 *
 * Data parallel: `scripts/mpirun.sh -np N build/refinery train SPEC.yaml` with
 * trainer.parallel.dp = N. The CLI owns the group (rf_comm_init_from_env: the
 * self backend when not under mpirun; in pods, NCCL for a GPU run); every rank
 * loads the data and trains, rank 0 alone writes the checkpoint, the export
 * and the evaluation. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/command.h"
#include "common/config.h"
#include "common/buf.h"
#include "common/error.h"
#include "comm/comm.h"
#include "common/log.h"
#include "evaluator/evaluate.h"
#include "trainer/driver.h"

static volatile int train_cancel;

static void on_signal(int sig) {
    (void)sig;
    train_cancel = 1;
}

static int cmd_train(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: refinery train SPEC.yaml\n"
                "  trains from the spec's trainer: section; keys: task (classify | causal_lm),\n"
                "  model (required), train,\n"
                "  eval, output (default trainer-out), export (default <output>/model),\n"
                "  num_labels, epochs, max_steps, batch_size, grad_accum, max_len, lr,\n"
                "  weight_decay, warmup_ratio, warmup_steps, clip_norm, beta1, beta2, eps,\n"
                "  seed, dropout, checkpoint_every, log_every, resume, threads,\n"
                "  eval_batch_size, parallel: {dp: N, zero: 0|1|2}, task: classify|causal_lm,\n"
                "  lora: {rank, alpha, dropout, targets: [q, k, v, o, up, down, gate],\n"
                "  base: fp32|int8|nf4} (causal_lm: trains a PEFT adapter, the model frozen).\n"
                "  REFINERY__TRAINER__LR=1e-5 style overrides apply.\n"
                "  Data parallel: scripts/mpirun.sh -np N refinery train SPEC.yaml (dp: N).\n");
        return argc == 2 ? 0 : 2;
    }
    rf_cfg *root = NULL;
    rf_trainer_spec s;
    int rc = rf_cfg_load_file(argv[1], &root);
    if (!rc) rc = rf_cfg_apply_env(root);
    if (!rc) rc = rf_trainer_spec_parse(rf_cfg_get(root, "trainer"), &s);
    if (rc) {
        fprintf(stderr, "refinery train: %s\n", rf_errmsg());
        rf_cfg_free(root);
        return 2;
    }
    char export_dir[4096], report[4096];
    if (!s.output) s.output = "trainer-out";
    if (!s.export_dir) {
        snprintf(export_dir, sizeof export_dir, "%s/model", s.output);
        s.export_dir = export_dir;
    }
    snprintf(report, sizeof report, "%s/eval.json", s.output);
    s.opts.out_dir = s.output;
    rf_comm *comm = NULL;
    /* Pods (RANK/WORLD_SIZE) start only NCCL groups of more than one rank
     * (comm.h), so a GPU run's group is made for device memory there; under
     * mpirun the trainer makes the NCCL twin of the MPI group itself. */
    rf_comm_opts co = rf_comm_opts_default();
    rf_comm_env env;
    if (rf_comm_env_read(&env) == RF_OK && env.launch == RF_COMM_LAUNCH_ENV && env.world > 1 &&
        s.device && strncmp(s.device, "cuda", 4) == 0)
        co.mem = RF_COMM_DEVICE;
    if ((rc = rf_comm_init_from_env(&co, &comm)) || (rc = rf_trainer_check_group(&s, comm))) {
        fprintf(stderr, "refinery train: %s\n", rf_errmsg());
        rf_comm_destroy(comm);
        rf_cfg_free(root);
        return 2;
    }
    int rank = rf_comm_rank(comm);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    rf_trainer_hooks hooks = {.cancel = &train_cancel, .comm = comm};
    rf_train_result res = {0};
    rc = rf_trainer_run(&s, &hooks, &res);
    if (!rc && res.finished && s.eval && rank == 0) {
        rf_buf json = RF_BUF_INIT;
        rf_eval_opts eo = {.model_dir = s.export_dir,
                           .data = s.eval,
                           .max_len = s.max_len,
                           .batch_size = s.eval_batch_size,
                           .report_path = report,
                           .device = s.device}; /* the evaluator follows trainer.device */
        rc = rf_evaluate_run(&eo, &json);
        if (!rc) rf_info("trainer", "eval %s: %.*s", s.eval, (int)json.len - 1, json.data);
        rf_buf_free(&json);
    }
    if (rc) fprintf(stderr, "refinery train: rank %d: %s\n", rank, rf_errmsg());
    /* a broken group is not finalized (see comm.h): exiting non-zero ends the others */
    rf_comm_destroy(comm);
    rf_cfg_free(root);
    return rc ? 1 : 0;
}

static const rf_command train_cmd = {
    "train", "train a BERT classifier or a causal LM (trainer: section)", cmd_train};
RF_COMMAND(train_cmd)
