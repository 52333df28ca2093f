/* `refinery tokenize`: one output line per input line, the ids that HF's
 * Tokenizer.from_file(T).encode(line) gives.
 *
 * A line is the bytes before each '\n' (a last line without '\n' counts too);
 * only the '\n' is removed, so a '\r' of a CRLF file stays in the line and is
 * tokenized (BERT's normalizer turns it into whitespace, GPT-2 gets a "\r"
 * token), exactly as scripts/parity/tokenizer_fixtures.py feeds HF. Lines that
 * are not valid UTF-8 are repaired (U+FFFD) and counted on stderr. */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/command.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/reader.h"
#include "tokenizer/tokenizer.h"

#define CHUNK_BYTES (4u << 20) /* input bytes encoded per parallel round */
#define PARTS       64         /* pieces of a round, taken by threads as they free up */
#define MAX_LINE    (256u << 20)

typedef struct chunk {
    rf_buf text;
    size_t *off; /* line i is text[off[i] .. off[i+1]) */
    size_t n, cap;
    uint64_t first_lineno;
} chunk;

static int chunk_add(chunk *c, const char *s, size_t len) {
    if (c->n + 2 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 4096;
        size_t *off = realloc(c->off, cap * sizeof *off);
        if (!off) return RF_ERR_NOMEM;
        c->off = off;
        c->cap = cap;
    }
    if (c->n == 0) c->off[0] = 0;
    if (rf_buf_append(&c->text, s, len)) return RF_ERR_NOMEM;
    c->off[++c->n] = c->text.len;
    return 0;
}

static char *put_u32(char *p, uint32_t v) {
    char tmp[10];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static int put_list(rf_buf *out, const char *key, const uint32_t *v, const uint8_t *m, size_t n) {
    if (rf_buf_reserve(out, 16 + n * 11)) return RF_ERR_NOMEM;
    char *p = out->data + out->len;
    if (key) {
        size_t kl = strlen(key);
        memcpy(p, key, kl);
        p += kl;
    }
    for (size_t i = 0; i < n; i++) {
        if (i) *p++ = key ? ',' : ' ';
        p = put_u32(p, v ? v[i] : m[i]);
    }
    if (key) *p++ = ']';
    out->len = (size_t)(p - out->data);
    out->data[out->len] = 0;
    return 0;
}

typedef struct job {
    const rf_tokenizer *tok;
    bool add_special, jsonl;
    rf_tok_state **states;
    rf_tok_encoding *encs;
    rf_buf outs[PARTS]; /* output of each piece, written in order */
    int threads;
    int rc;
    char err[256];
} job;

/* Encodes lines [lo, hi) of c into out, one output line each, with the state
 * of thread tid. */
static int encode_range(job *j, int tid, const chunk *c, size_t lo, size_t hi, rf_buf *out) {
    rf_tok_encoding *e = &j->encs[tid];
    for (size_t i = lo; i < hi; i++) {
        int rc = rf_tok_encode(j->states[tid], c->text.data + c->off[i], c->off[i + 1] - c->off[i],
                               j->add_special, e);
        if (rc) {
#pragma omp critical(tokenize_err)
            if (!j->err[0])
                snprintf(j->err, sizeof j->err, "line %llu: %s",
                         (unsigned long long)(c->first_lineno + i), rf_errmsg());
            return rc;
        }
        if (j->jsonl) {
            rc = put_list(out, "{\"ids\":[", e->ids, NULL, e->len);
            if (!rc) rc = put_list(out, ",\"type_ids\":[", e->type_ids, NULL, e->len);
            if (!rc) rc = put_list(out, ",\"attention_mask\":[", NULL, e->attention_mask, e->len);
            if (!rc) rc = rf_buf_putc(out, '}');
        } else {
            rc = put_list(out, NULL, e->ids, NULL, e->len);
        }
        if (rc || rf_buf_putc(out, '\n')) return RF_ERR_NOMEM;
    }
    return 0;
}

/* Splits the chunk into PARTS contiguous pieces of about equal bytes, encodes
 * them on the threads (a thread takes the next piece when it is done, so an
 * expensive piece does not hold the others up) and writes them in order. */
static int run_chunk(job *j, const chunk *c, FILE *out) {
    size_t bounds[PARTS + 1];
    bounds[0] = 0;
    for (int p = 1; p < PARTS; p++) {
        size_t target = c->text.len / PARTS * (size_t)p, i = bounds[p - 1];
        while (i < c->n && c->off[i] < target)
            i++;
        bounds[p] = i;
    }
    bounds[PARTS] = c->n;
    int rc = 0;
#pragma omp parallel for num_threads(j->threads) schedule(dynamic, 1) reduction(| : rc)
    for (int p = 0; p < PARTS; p++) {
        j->outs[p].len = 0;
        if (encode_range(j, omp_get_thread_num(), c, bounds[p], bounds[p + 1], &j->outs[p]))
            rc |= 1;
    }
    if (rc) return RF_ERR_INVALID;
    for (int p = 0; p < PARTS; p++)
        if (j->outs[p].len && fwrite(j->outs[p].data, 1, j->outs[p].len, out) != j->outs[p].len)
            return rf_fail(RF_ERR_IO, "write failed");
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: refinery tokenize --tokenizer TOKENIZER.json [--input FILE]\n"
               "                         [--no-special-tokens] [--format ids|jsonl] [--threads N]\n"
               "Prints one line per input line (stdin when no --input): the space-separated ids\n"
               "that Hugging Face Tokenizer.from_file(T).encode(line) gives (ids), or a JSON\n"
               "object with ids, type_ids and attention_mask (jsonl). Only the '\\n' ends a\n"
               "line: a '\\r' before it is part of the line. T may also be a vocab.txt, a\n"
               "vocab.json (merges.txt beside it) or a directory holding them.\n");
}

static int cmd_tokenize(int argc, char **argv) {
    const char *tok_path = NULL, *input = "-", *format = "ids";
    bool add_special = true;
    long threads = 1;
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"input", required_argument, 0, 'i'},
                                         {"no-special-tokens", no_argument, 0, 'n'},
                                         {"format", required_argument, 0, 'f'},
                                         {"threads", required_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "t:i:nf:j:h", opts, NULL)) != -1) {
        switch (o) {
        case 't':
            tok_path = optarg;
            break;
        case 'i':
            input = optarg;
            break;
        case 'n':
            add_special = false;
            break;
        case 'f':
            format = optarg;
            break;
        case 'j': {
            char *end;
            threads = strtol(optarg, &end, 10);
            if (*end || threads < 1 || threads > 64) {
                fprintf(stderr, "tokenize: --threads must be an integer in [1, 64]\n");
                return 2;
            }
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!tok_path || optind != argc || (strcmp(format, "ids") && strcmp(format, "jsonl"))) {
        usage(stderr);
        return 2;
    }
    rf_tokenizer *tok;
    if (rf_tokenizer_load(tok_path, &tok)) {
        fprintf(stderr, "tokenize: %s\n", rf_errmsg());
        return 1;
    }
    rf_reader *r;
    if (rf_reader_open(input, MAX_LINE, &r)) {
        fprintf(stderr, "tokenize: %s\n", rf_errmsg());
        rf_tokenizer_free(tok);
        return 1;
    }
    job j = {.tok = tok,
             .add_special = add_special,
             .jsonl = !strcmp(format, "jsonl"),
             .threads = (int)threads};
    j.states = calloc((size_t)threads, sizeof *j.states);
    j.encs = calloc((size_t)threads, sizeof *j.encs);
    int rc = !j.states || !j.encs ? RF_ERR_NOMEM : 0;
    for (int t = 0; t < threads && !rc; t++)
        if (!(j.states[t] = rf_tok_state_new(tok))) rc = RF_ERR_NOMEM;
    static char obuf[1 << 16];
    setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
    chunk c = {0};
    rf_line line;
    int got = 0;
    while (!rc && (got = rf_reader_next(r, &line)) > 0) {
        if (line.too_long) {
            rc = rf_fail(RF_ERR_RANGE, "line %llu is longer than %u bytes",
                         (unsigned long long)line.lineno, MAX_LINE);
            break;
        }
        if (c.n == 0) c.first_lineno = line.lineno;
        rc = chunk_add(&c, line.data, line.len);
        if (!rc && c.text.len >= CHUNK_BYTES) {
            rc = run_chunk(&j, &c, stdout);
            c.n = 0;
            c.text.len = 0;
        }
    }
    if (got < 0 && !rc) rc = got;
    if (!rc && c.n) rc = run_chunk(&j, &c, stdout);
    if (fflush(stdout) && !rc) rc = rf_fail(RF_ERR_IO, "write failed");
    uint64_t repaired = 0;
    for (int t = 0; t < threads && j.states; t++) {
        if (j.states[t]) repaired += rf_tok_state_repaired(j.states[t]);
        rf_tok_state_free(j.states[t]);
        rf_tok_encoding_free(&j.encs[t]);
    }
    if (repaired)
        fprintf(stderr, "tokenize: %llu lines had invalid UTF-8 (replaced by U+FFFD)\n",
                (unsigned long long)repaired);
    if (rc) fprintf(stderr, "tokenize: %s\n", j.err[0] ? j.err : rf_errmsg());
    free(j.states);
    free(j.encs);
    for (int p = 0; p < PARTS; p++)
        rf_buf_free(&j.outs[p]);
    free(c.off);
    rf_buf_free(&c.text);
    rf_reader_close(r);
    rf_tokenizer_free(tok);
    return rc ? 1 : 0;
}

static const rf_command tokenize_cmd = {"tokenize", "encode lines with a Hugging Face tokenizer",
                                        cmd_tokenize};
RF_COMMAND(tokenize_cmd)
