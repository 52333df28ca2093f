/* `refinery eval --model DIR --data SHARDS_OR_JSONL [--out REPORT.json]
 * [--predictions FILE]`: accuracy, per-class and macro P/R/F1, confusion
 * matrix and loss of a sequence classifier, as JSON on stdout (and in --out),
 * and one JSON line per example in --predictions (evaluator/predictions.h). A
 * causal LM's folder (model_type gpt2 or llama) with token shards gets its eval
 * loss and perplexity instead (evaluator/lm_loss.h: rows of --max-len, packed
 * as the trainer packs them). `--task lm` scores a causal LM's perplexity on a
 * text file with a strided sliding window (evaluator/perplexity.h), with
 * --adapter a PEFT LoRA folder merged into the model first. `--task answers`
 * scores a chat model's generated answers on SFT token shards (the tokenizer
 * stage's conversations with their .mask; evaluator/answers.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/command.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/sys.h"
#include "evaluator/answers.h"
#include "evaluator/evaluate.h"
#include "evaluator/perplexity.h"
#include "trainer/train.h"

static void eval_usage(FILE *out) {
    fprintf(out,
            "usage: refinery eval --model DIR --data SHARDS_OR_JSONL [options]\n"
            "       refinery eval --task lm --model DIR_OR_GGUF [--adapter DIR] --data FILE.txt\n"
            "                     [--max-len N] [--stride S] [--out FILE]\n"
            "       refinery eval --task answers --model DIR_OR_GGUF [--adapter DIR]\n"
            "                     --data SFT_SHARDS [--answers N] [--out FILE]\n"
            "  --model DIR     Hugging Face folder (config.json, model.safetensors, tokenizer)\n"
            "  --data PATH     token shard prefix or directory, or JSONL documents with labels\n"
            "  --out FILE      also write the JSON report there\n"
            "  --predictions FILE\n"
            "                  one JSON line per example: index, id (JSONL records' id;\n"
            "                  token shards keep none), text (JSONL's; shards and TSV: the\n"
            "                  ids decoded with the model's tokenizer), label (gold), pred,\n"
            "                  probs (softmax, pred = their arg-max)\n"
            "  --max-len N     truncate sequences to N tokens (default 128); a causal LM\n"
            "                  (gpt2, llama): eval loss and perplexity over rows of N\n"
            "  --batch N       sequences per forward pass (default 64)\n"
            "  --samples N     (a causal LM's folder with token shards) N greedy sample\n"
            "                  generations in the report: prompts from the data's rows,\n"
            "                  each with the text's own continuation (default 0)\n"
            "  --threads N     CPU threads (default: all)\n"
            "  --device D      (classify, a causal LM's folder) the backend the model runs on:\n"
            "                  cpu (default), cuda, cuda-bf16 (trainer.device's names);\n"
            "                  a causal LM's sample generations run there too\n"
            "  --task T        classify (default) or lm: perplexity of a causal LM (GPT-2 or\n"
            "                  Llama folder, GGUF file or a folder holding one) on a UTF-8\n"
            "                  text file, with the sliding window of Hugging Face's perplexity\n"
            "                  guide; the report has perplexity, nll (mean per token) and\n"
            "                  tokens (the guide's count)\n"
            "  --max-len N     (lm) window length (default: the model's positions)\n"
            "  --stride S      (lm) window step (default: max-len / 2)\n"
            "  --adapter DIR   (lm, answers) a PEFT LoRA folder (adapter_config.json and\n"
            "                  adapter_model.safetensors) merged into the model's weights\n"
            "  --task answers  generated-answer accuracy of a chat model on SFT token shards\n"
            "                  (PREFIX.bin/.idx with PREFIX.mask, as the tokenizer stage\n"
            "                  writes conversations): greedy answers to each prompt against\n"
            "                  the reference answer, compared trimmed and lower-cased\n"
            "  --answers N     (answers) the first N conversations (default: all); also for\n"
            "                  --model a run's PEFT adapter folder on SFT shards, scored over\n"
            "                  its base before and after\n");
}

static void lm_progress(void *user, int w, int n) {
    if (*(int *)user) fprintf(stderr, "\rrefinery eval: window %d/%d", w, n);
    if (*(int *)user && w == n) fputc('\n', stderr);
}

static int parse_pos(const char *opt, const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 1 || v > 1 << 20) {
        fprintf(stderr, "refinery eval: %s '%s': expected a positive integer\n", opt, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The end of every task: the JSON report on stdout, or the error; frees json. */
static int eval_finish(int rc, rf_buf *json) {
    if (rc)
        fprintf(stderr, "refinery eval: %s\n", rf_errmsg());
    else
        fwrite(json->data, 1, json->len, stdout);
    rf_buf_free(json);
    return rc ? 1 : 0;
}

/* --task answers (evaluator/answers.h) */
static int eval_answers(const char *model, const char *adapter, const char *data, int n,
                        const char *out) {
    rf_lm *lm = NULL;
    rf_answers a;
    rf_buf json = RF_BUF_INIT;
    int rc = rf_lm_load_adapter(model, adapter, &lm);
    if (!rc) rc = rf_buf_puts(&json, "{\"task\":\"answers\",\"model\":");
    if (!rc) rc = rf_buf_append_json_str(&json, model, strlen(model));
    if (!rc && adapter) rc = rf_buf_puts(&json, ",\"adapter\":");
    if (!rc && adapter) rc = rf_buf_append_json_str(&json, adapter, strlen(adapter));
    if (!rc) rc = rf_buf_puts(&json, ",\"data\":");
    if (!rc) rc = rf_buf_append_json_str(&json, data, strlen(data));
    if (!rc) rc = rf_buf_puts(&json, ",\"answers\":");
    if (!rc) rc = rf_lm_answers(lm, data, n, &json, &a);
    if (!rc) rc = rf_buf_puts(&json, "}\n");
    if (!rc && out) rc = rf_write_file_atomic(out, json.data, json.len);
    rf_lm_free(lm);
    return eval_finish(rc, &json);
}

static int cmd_eval(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"data", required_argument, 0, 'd'},
                                         {"out", required_argument, 0, 'o'},
                                         {"max-len", required_argument, 0, 'l'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"threads", required_argument, 0, 't'},
                                         {"predictions", required_argument, 0, 'p'},
                                         {"task", required_argument, 0, 'k'},
                                         {"stride", required_argument, 0, 's'},
                                         {"adapter", required_argument, 0, 'a'},
                                         {"samples", required_argument, 0, 'n'},
                                         {"answers", required_argument, 0, 'A'},
                                         {"device", required_argument, 0, 'D'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *data = NULL, *out = NULL, *preds = NULL, *task = "classify",
               *adapter = NULL, *device = NULL;
    int max_len = 0, batch = 64, threads = 0, stride = 0, samples = 0, answers = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'd':
            data = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'p':
            preds = optarg;
            break;
        case 'l':
            if (parse_pos("--max-len", optarg, &max_len)) return 2;
            break;
        case 'b':
            if (parse_pos("--batch", optarg, &batch)) return 2;
            break;
        case 't':
            if (parse_pos("--threads", optarg, &threads)) return 2;
            break;
        case 'a':
            adapter = optarg;
            break;
        case 'k':
            task = optarg;
            break;
        case 's':
            if (parse_pos("--stride", optarg, &stride)) return 2;
            break;
        case 'n':
            if (parse_pos("--samples", optarg, &samples)) return 2;
            break;
        case 'A':
            if (parse_pos("--answers", optarg, &answers)) return 2;
            break;
        case 'D':
            device = optarg;
            break;
        case 'h':
            eval_usage(stdout);
            return 0;
        default:
            eval_usage(stderr);
            return 2;
        }
    }
    if (!model || !data || optind != argc) {
        eval_usage(stderr);
        return 2;
    }
    if (threads) rf_set_threads(threads);
    if (device && (strcmp(task, "classify") || adapter)) {
        fprintf(stderr, "refinery eval: --device is for --task classify (a classifier's or a "
                        "causal LM's folder, no adapter)\n");
        return 2;
    }
    if (device && rf_device_check(device)) {
        fprintf(stderr, "refinery eval: --device: %s\n", rf_errmsg());
        return 2;
    }
    rf_buf json = RF_BUF_INIT;
    if (!strcmp(task, "lm")) {
        if (preds) {
            fprintf(stderr, "refinery eval: --predictions is for --task classify\n");
            return 2;
        }
        int tty = isatty(2);
        rf_ppl_opts po = {.max_len = max_len,
                          .stride = stride,
                          .adapter = adapter,
                          .progress = lm_progress,
                          .user = &tty};
        return eval_finish(rf_perplexity_run(model, data, &po, out, &json), &json);
    }
    if (!strcmp(task, "answers")) return eval_answers(model, adapter, data, answers, out);
    if (strcmp(task, "classify")) {
        fprintf(stderr, "refinery eval: --task '%s': expected classify, lm or answers\n", task);
        return 2;
    }
    if (stride) {
        fprintf(stderr, "refinery eval: --stride is for --task lm\n");
        return 2;
    }
    if (adapter) {
        fprintf(stderr,
                "refinery eval: --adapter is for --task lm or answers (a classifier's LoRA adapter "
                "is not supported)\n");
        return 2;
    }
    if (!max_len) max_len = 128;
    rf_eval_opts eo = {.model_dir = model,
                       .data = data,
                       .max_len = max_len,
                       .batch_size = batch,
                       .report_path = out,
                       .predictions_path = preds,
                       .samples = samples,
                       .answers = answers,
                       .device = device};
    return eval_finish(rf_evaluate_run(&eo, &json), &json);
}

static const rf_command eval_cmd = {
    "eval", "score a classifier (accuracy, P/R/F1), an LM (perplexity) or its answers", cmd_eval};
RF_COMMAND(eval_cmd)
