/* `refinery generate --model DIR_OR_GGUF --prompt TEXT [...]`: continues a
 * prompt with a causal LM (evaluator/generate.h), printing the text as it
 * comes; --json prints one JSON object with the ids instead. --adapter merges
 * a PEFT LoRA folder into the model first (lm.h: rf_lm_load_adapter). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/command.h"
#include "common/buf.h"
#include "common/error.h"
#include "evaluator/generate.h"
#include "trainer/train.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: refinery generate --model DIR_OR_GGUF --prompt TEXT [options]\n"
            "  --model PATH        GPT-2 or Llama Hugging Face folder, a GGUF file, or a folder\n"
            "                      holding one GGUF file\n"
            "  --adapter DIR       a PEFT LoRA folder (adapter_config.json and\n"
            "                      adapter_model.safetensors, from peft or `refinery train`)\n"
            "                      over the model: merged into its weights before generating\n"
            "  --prompt TEXT       the text to continue\n"
            "  --chat              send the prompt as a user message through the model's chat\n"
            "                      template (ChatML, e.g. SmolLM2-Instruct)\n"
            "  --max-new-tokens N  at most N new tokens (default 64); stops earlier at the\n"
            "                      model's end-of-sequence token\n"
            "  --temperature T     0 (default): greedy; > 0: sample from softmax(logits / T)\n"
            "  --top-k K           sampling: keep the K most likely tokens\n"
            "  --top-p P           sampling: keep the most likely tokens up to probability P\n"
            "  --seed S            sampling: PRNG seed (default 0); the same seed, the same text\n"
            "  --json              print {\"prompt_ids\", \"ids\", \"text\", \"finish\"} instead\n"
            "  --threads N         CPU threads (default: all)\n");
}

static int parse_int(const char *opt, const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > max) {
        fprintf(stderr, "refinery generate: %s '%s': expected an integer in [%ld, %ld]\n", opt, s,
                min, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_real(const char *opt, const char *s, double min, double max, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= min && v <= max)) {
        fprintf(stderr, "refinery generate: %s '%s': expected a number in [%g, %g]\n", opt, s, min,
                max);
        return -1;
    }
    *out = (float)v;
    return 0;
}

typedef struct printer {
    bool json;
    rf_buf text;
} printer;

static int on_token(void *user, int32_t id, const char *piece, size_t len, const char *finish) {
    printer *p = user;
    if (p->json) return rf_buf_append(&p->text, piece, len);
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static void put_ids(rf_buf *b, const int32_t *ids, int n) {
    rf_buf_putc(b, '[');
    for (int i = 0; i < n; i++) {
        if (i) rf_buf_puts(b, ", ");
        rf_buf_put_i64(b, ids[i]);
    }
    rf_buf_putc(b, ']');
}

static int cmd_generate(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"adapter", required_argument, 0, 'a'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"chat", no_argument, 0, 'c'},
                                         {"max-new-tokens", required_argument, 0, 'n'},
                                         {"temperature", required_argument, 0, 'T'},
                                         {"top-k", required_argument, 0, 'k'},
                                         {"top-p", required_argument, 0, 'P'},
                                         {"seed", required_argument, 0, 's'},
                                         {"json", no_argument, 0, 'j'},
                                         {"threads", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *adapter = NULL, *prompt = NULL;
    rf_gen_opts go = {.max_new_tokens = 64};
    bool json = false, sampling_flags = false;
    long v;
    int c, threads = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'a':
            adapter = optarg;
            break;
        case 'p':
            prompt = optarg;
            break;
        case 'c':
            go.chat = true;
            break;
        case 'n':
            if (parse_int("--max-new-tokens", optarg, 1, 1 << 20, &v)) return 2;
            go.max_new_tokens = (int)v;
            break;
        case 'T':
            if (parse_real("--temperature", optarg, 0, 1e6, &go.sampling.temperature)) return 2;
            break;
        case 'k':
            if (parse_int("--top-k", optarg, 1, 1 << 30, &v)) return 2;
            go.sampling.top_k = (int)v;
            sampling_flags = true;
            break;
        case 'P':
            if (parse_real("--top-p", optarg, 0, 1, &go.sampling.top_p)) return 2;
            if (!(go.sampling.top_p > 0)) {
                fprintf(stderr, "refinery generate: --top-p must be above 0\n");
                return 2;
            }
            sampling_flags = true;
            break;
        case 's': {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || *end || end == optarg || optarg[0] == '-') {
                fprintf(stderr, "refinery generate: --seed '%s': expected an unsigned integer\n",
                        optarg);
                return 2;
            }
            go.sampling.seed = s;
            break;
        }
        case 'j':
            json = true;
            break;
        case 't':
            if (parse_int("--threads", optarg, 1, 1024, &v)) return 2;
            threads = (int)v;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!model || !prompt || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (sampling_flags && !(go.sampling.temperature > 0)) {
        fprintf(stderr, "refinery generate: --top-k and --top-p sample: give --temperature > 0 "
                        "(temperature 0 is greedy)\n");
        return 2;
    }
    if (threads) rf_set_threads(threads);
    rf_lm *lm;
    if (rf_lm_load_adapter(model, adapter, &lm)) {
        fprintf(stderr, "refinery generate: %s\n", rf_errmsg());
        return 1;
    }
    printer pr = {.json = json, .text = RF_BUF_INIT};
    rf_gen_result res;
    int rc = rf_generate(lm, prompt, &go, on_token, &pr, &res);
    if (rc) {
        fprintf(stderr, "%srefinery generate: %s\n", json ? "" : "\n", rf_errmsg());
    } else if (json) {
        rf_buf b = RF_BUF_INIT;
        rf_buf_puts(&b, "{\"prompt_ids\": ");
        put_ids(&b, res.prompt_ids, res.n_prompt);
        rf_buf_puts(&b, ", \"ids\": ");
        put_ids(&b, res.ids, res.n);
        rf_buf_puts(&b, ", \"text\": ");
        rf_buf_append_json_str(&b, pr.text.data ? pr.text.data : "", pr.text.len);
        rf_buf_printf(&b, ", \"finish\": \"%s\"}\n", res.finish);
        fwrite(b.data, 1, b.len, stdout);
        rf_buf_free(&b);
    } else {
        putchar('\n');
    }
    rf_gen_result_free(&res);
    rf_buf_free(&pr.text);
    rf_lm_free(lm);
    return rc ? 1 : 0;
}

static const rf_command generate_cmd = {"generate", "continue a prompt with a causal LM",
                                        cmd_generate};
RF_COMMAND(generate_cmd)
