/* refinery classify --run RUN [--step N] [TEXT...|-]: Evaluator.Classify with
 * a run's latest (or a named) checkpoint; one JSON line per text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/command.h"
#include "cli/remote.h"
#include "common/buf.h"

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: refinery classify --run RUN [--step N] [--batch N] [server options]\n"
        "                         (TEXT... | -)\n"
        "Classifies each TEXT (or each line of standard input with -) with the run's\n"
        "latest checkpoint, or checkpoint step N, on refinery-evaluator (--evaluator).\n"
        "Prints one JSON line per text: {\"step\":N,\"label\":L,\"probs\":[...],\"text\":...}.\n"
        "Texts go in requests of --batch (default 32).\n\n%s",
        rf_remote_usage);
}

typedef struct texts {
    char **v;
    size_t n, cap;
} texts;

static int texts_push(texts *t, char *s) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        char **grown = realloc(t->v, cap * sizeof *grown);
        if (!grown) return -1;
        t->v = grown;
        t->cap = cap;
    }
    t->v[t->n++] = s;
    return 0;
}

/* Reads standard input, a text per line (line ends removed); owned by t. */
static int read_lines(texts *t) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        char *copy = strdup(line);
        if (!copy || texts_push(t, copy) < 0) {
            free(copy);
            free(line);
            return -1;
        }
    }
    free(line);
    return 0;
}

static void print_prediction(rf_buf *b, int64_t step, const Refinery__V1__Prediction *p,
                             const char *text) {
    rf_buf_reset(b);
    rf_buf_printf(b, "{\"step\":%lld,\"label\":%d,\"probs\":[", (long long)step, (int)p->label);
    for (size_t i = 0; i < p->n_probs; i++)
        rf_buf_printf(b, "%s%.6g", i ? "," : "", (double)p->probs[i]);
    rf_buf_puts(b, "],\"text\":");
    rf_buf_append_json_str(b, text, strlen(text));
    rf_buf_puts(b, "}\n");
    fputs(b->data, stdout);
}

static int classify(rf_rpc_client *c, const rf_remote *r, const char *run, long step,
                    const texts *t, size_t batch) {
    rf_buf line = RF_BUF_INIT;
    int rc = 0;
    for (size_t at = 0; at < t->n && rc == 0; at += batch) {
        size_t n = t->n - at < batch ? t->n - at : batch;
        Refinery__V1__ClassifyRequest req = REFINERY__V1__CLASSIFY_REQUEST__INIT;
        req.run_id = (char *)run;
        req.checkpoint_step = step;
        req.texts = t->v + at;
        req.n_texts = n;
        ProtobufCMessage *m = NULL;
        rf_rpc_status st;
        if (rf_rpc_unary(c, "/refinery.v1.Evaluator/Classify", &req.base,
                         &refinery__v1__classify_response__descriptor, &m, r->timeout_s, &st) < 0) {
            rc = rf_remote_report("classify", &st);
            break;
        }
        const Refinery__V1__ClassifyResponse *resp = (const Refinery__V1__ClassifyResponse *)m;
        if (resp->n_predictions != n) {
            fprintf(stderr, "refinery classify: %zu predictions for %zu texts\n",
                    resp->n_predictions, n);
            rc = 1;
        }
        for (size_t i = 0; i < resp->n_predictions && i < n; i++)
            print_prediction(&line, resp->checkpoint_step, resp->predictions[i], t->v[at + i]);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    fflush(stdout);
    rf_buf_free(&line);
    return rc;
}

static int cmd_classify(int argc, char **argv) {
    static const struct option longopts[] = {RF_REMOTE_LONGOPTS,
                                             {"run", required_argument, NULL, 'r'},
                                             {"step", required_argument, NULL, 's'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    rf_remote r;
    rf_remote_init(&r);
    const char *run = NULL;
    long step = 0, batch = 32;
    char *end;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int shared = rf_remote_option(&r, c, optarg);
        if (shared < 0) return 2;
        if (shared) continue;
        switch (c) {
        case 'r':
            run = optarg;
            break;
        case 's':
            step = strtol(optarg, &end, 10);
            if (*end || step < 1) {
                fprintf(stderr, "refinery classify: --step expects a positive step, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'b':
            batch = strtol(optarg, &end, 10);
            if (*end || batch < 1 || batch > 4096) {
                fprintf(stderr, "refinery classify: --batch expects 1..4096, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    bool from_stdin = argc - optind == 1 && !strcmp(argv[optind], "-");
    if (!run || optind == argc) {
        usage(stderr);
        return 2;
    }
    texts t = {0};
    int rc = 0;
    if (from_stdin) {
        rc = read_lines(&t) < 0 ? 1 : 0;
    } else {
        for (int i = optind; i < argc && rc == 0; i++)
            rc = texts_push(&t, argv[i]) < 0 ? 1 : 0;
    }
    if (rc) fprintf(stderr, "refinery classify: out of memory\n");
    rf_rpc_client *client = NULL;
    if (rc == 0 && t.n > 0 && rf_remote_connect(&r, r.evaluator, "classify", &client) < 0) rc = 1;
    if (rc == 0 && t.n > 0) rc = classify(client, &r, run, step, &t, (size_t)batch);
    rf_rpc_client_free(client);
    if (from_stdin)
        for (size_t i = 0; i < t.n; i++)
            free(t.v[i]);
    free(t.v);
    return rc;
}

static const rf_command classify_cmd = {"classify", "classify texts with a run's checkpoint",
                                        cmd_classify};
RF_COMMAND(classify_cmd)
