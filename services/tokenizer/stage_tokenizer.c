/* The tokenizer stage of `refinery run` (order 30): encodes every document
 * and writes token shards for the trainer. Section:
 *
 *   tokenizer:
 *     tokenizer: ../shared/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json
 *     max_length: 128          # truncation incl. special tokens (0: as the file says)
 *     add_special_tokens: true
 *     eval_fraction: 0.1       # split by hash of the dedup cluster (doc id if none)
 *     seed: 0
 *     pack: false              # true: causal-LM blocks of block_len with EOS between docs
 *     block_len: 1024
 *     eos_token: "<|endoftext|>"
 *     batch_size: 32           # for the batching report
 *     partitions: 2            # data-parallel partitions for the report
 *     threads: 2               # default: run.threads
 *
 * Writes <run_dir>/tokenizer/{train,eval}.{bin,idx} (shard.h) and report.json
 * (token counts, padding of length-bucketed batches against naive padding,
 * partition imbalance). Documents pass on downstream unchanged. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/stage.h"
#include "pipeline/stages.h"
#include "common/sys.h"
#include "tokenizer/batch.h"
#include "tokenizer/shard.h"
#include "tokenizer/tokenizer.h"

enum { TRAIN, EVAL };
static const char *const split_name[] = {"train", "eval"};

typedef struct lenvec {
    uint32_t *v;
    size_t n, cap;
} lenvec;

typedef struct tok_stage {
    rf_run_ctx *ctx;
    rf_tokenizer *tok;
    rf_tok_state **states;
    int threads;
    rf_tok_encoding *encs; /* one per document of the current batch */
    size_t n_encs;
    bool add_special, pack;
    double eval_fraction;
    uint64_t seed;
    int64_t max_length, block_len, batch_size, partitions;
    uint32_t eos_id;
    char dir[4096];
    rf_shard_writer *w[2];
    rf_packer packer[2];
    lenvec lens[2];
    uint64_t docs[2], tokens[2], dropped_tail[2];
} tok_stage;

static void stage_close(void *state) {
    tok_stage *s = state;
    if (!s) return;
    for (int k = 0; k < 2; k++) {
        rf_shard_writer_abort(s->w[k]);
        rf_packer_free(&s->packer[k]);
        free(s->lens[k].v);
    }
    for (size_t i = 0; i < s->n_encs; i++)
        rf_tok_encoding_free(&s->encs[i]);
    free(s->encs);
    for (int t = 0; s->states && t < s->threads; t++)
        rf_tok_state_free(s->states[t]);
    free(s->states);
    rf_tokenizer_free(s->tok);
    free(s);
}

static int stage_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    tok_stage *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->ctx = ctx;
    const char *path, *eos;
    int64_t seed, threads;
    int rc = rf_cfg_str(sec, "tokenizer", NULL, &path);
    if (!rc && !path)
        rc = rf_fail(RF_ERR_INVALID, "tokenizer.tokenizer: a tokenizer file is required");
    if (!rc) rc = rf_cfg_int(sec, "max_length", 128, 0, 1 << 20, &s->max_length);
    if (!rc) rc = rf_cfg_bool(sec, "add_special_tokens", true, &s->add_special);
    if (!rc) rc = rf_cfg_real(sec, "eval_fraction", 0.1, 0.0, 1.0, &s->eval_fraction);
    if (!rc) rc = rf_cfg_int(sec, "seed", 0, 0, INT64_MAX, &seed);
    if (!rc) rc = rf_cfg_bool(sec, "pack", false, &s->pack);
    if (!rc) rc = rf_cfg_int(sec, "block_len", 1024, 2, 1 << 20, &s->block_len);
    if (!rc) rc = rf_cfg_str(sec, "eos_token", "<|endoftext|>", &eos);
    if (!rc) rc = rf_cfg_int(sec, "batch_size", 32, 1, 1 << 20, &s->batch_size);
    if (!rc) rc = rf_cfg_int(sec, "partitions", 2, 1, 4096, &s->partitions);
    if (!rc) rc = rf_cfg_int(sec, "threads", ctx->threads > 0 ? ctx->threads : 1, 1, 256, &threads);
    if (!rc) {
        s->seed = (uint64_t)seed;
        s->threads = (int)threads;
        rc = rf_tokenizer_load(path, &s->tok);
    }
    if (!rc && s->max_length)
        rf_tokenizer_set_truncation(s->tok, (size_t)s->max_length, RF_TRUNC_LONGEST_FIRST,
                                    RF_SIDE_RIGHT);
    if (!rc) rf_tokenizer_set_padding(s->tok, false, 0, 0, 0, 0, RF_SIDE_RIGHT);
    if (!rc && s->pack) {
        int64_t id = rf_tokenizer_token_to_id(s->tok, eos);
        if (id < 0) rc = rf_fail(RF_ERR_INVALID, "tokenizer.eos_token: %s is not a token", eos);
        s->eos_id = (uint32_t)id;
        for (int k = 0; k < 2 && !rc; k++)
            rc = rf_packer_init(&s->packer[k], (uint32_t)s->block_len, s->eos_id);
    }
    if (!rc && !(s->states = calloc((size_t)s->threads, sizeof *s->states))) rc = RF_ERR_NOMEM;
    for (int t = 0; !rc && t < s->threads; t++)
        if (!(s->states[t] = rf_tok_state_new(s->tok))) rc = RF_ERR_NOMEM;
    snprintf(s->dir, sizeof s->dir, "%s/tokenizer", ctx->run_dir);
    if (!rc) rc = rf_mkdir_p(s->dir);
    for (int k = 0; k < 2 && !rc; k++) {
        char prefix[4200];
        snprintf(prefix, sizeof prefix, "%s/%s", s->dir, split_name[k]);
        rf_shard_info info = {.flags = s->pack ? RF_SHARD_PACKED : 0,
                              .vocab_size = rf_tokenizer_vocab_size(s->tok),
                              .eos_id = s->pack ? (int32_t)s->eos_id : -1,
                              .pad_id = -1,
                              .block_len = s->pack ? (uint32_t)s->block_len : 0};
        rc = rf_shard_writer_open(prefix, &info, &s->w[k]);
    }
    if (rc) {
        stage_close(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int lens_push(lenvec *l, uint32_t x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4096;
        uint32_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) return RF_ERR_NOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return 0;
}

typedef struct block_sink {
    tok_stage *s;
    int split;
} block_sink;

static int write_block(void *ctx, const uint32_t *block, uint32_t len) {
    block_sink *b = ctx;
    int rc = rf_shard_writer_add(b->s->w[b->split], block, len, -1, 0);
    return rc ? rc : lens_push(&b->s->lens[b->split], len);
}

static int stage_process(void *state, rf_doc_batch *in, rf_emit_fn emit, void *emit_ctx) {
    tok_stage *s = state;
    int rc = 0;
    if (in->n > s->n_encs) {
        rf_tok_encoding *e = realloc(s->encs, in->n * sizeof *e);
        if (!e)
            rc = RF_ERR_NOMEM;
        else {
            memset(e + s->n_encs, 0, (in->n - s->n_encs) * sizeof *e);
            s->encs = e;
            s->n_encs = in->n;
        }
    }
    char err[256] = "";
    if (!rc) {
#pragma omp parallel for num_threads(s->threads) schedule(dynamic, 16)
        for (size_t i = 0; i < in->n; i++) {
            const rf_doc *d = &in->docs[i];
            rf_tok_state *st = s->states[omp_get_thread_num()];
            s->encs[i].len = 0;
            if (d->text && rf_tok_encode(st, d->text, d->text_len, s->add_special, &s->encs[i])) {
#pragma omp critical(tokenizer_stage_err)
                if (!err[0])
                    snprintf(err, sizeof err, "document %s: %s", d->id ? d->id : "?", rf_errmsg());
            }
        }
        if (err[0]) rc = rf_fail(RF_ERR_INVALID, "tokenizer: %s", err);
    }
    /* written in stream order, so shards are deterministic whatever the threads */
    for (size_t i = 0; i < in->n && !rc; i++) {
        const rf_doc *d = &in->docs[i];
        if (!d->text) {
            rf_stats_add(s->ctx->stats, "tokenizer.skipped_no_text", 1);
            continue;
        }
        uint64_t cluster =
            d->cluster ? d->cluster : rf_hash64(d->id ? d->id : "", d->id ? strlen(d->id) : 0, 0);
        int k = rf_split_is_eval(d->cluster, d->id, d->id ? strlen(d->id) : 0, s->eval_fraction,
                                 s->seed)
                    ? EVAL
                    : TRAIN;
        const rf_tok_encoding *e = &s->encs[i];
        if (s->pack) {
            block_sink b = {s, k};
            rc = rf_packer_add(&s->packer[k], e->ids, e->len, write_block, &b);
        } else {
            rc = rf_shard_writer_add(s->w[k], e->ids, (uint32_t)e->len, d->label, cluster);
            if (!rc) rc = lens_push(&s->lens[k], (uint32_t)e->len);
        }
        s->docs[k]++;
        s->tokens[k] += e->len;
    }
    if (rc) {
        rf_doc_batch_free(in);
        return rc;
    }
    return emit(emit_ctx, in);
}

/* report.json: what was written and how well it batches. */
static int write_report(tok_stage *s) {
    rf_buf b = RF_BUF_INIT;
    rf_stats *st = s->ctx->stats;
    uint64_t repaired = 0;
    for (int t = 0; t < s->threads; t++)
        repaired += rf_tok_state_repaired(s->states[t]);
    rf_stats_add(st, "tokenizer.repaired_utf8", (int64_t)repaired);
    rf_buf_printf(&b, "{\"pack\":%s,\"max_length\":%lld,\"batch_size\":%lld,\"splits\":{",
                  s->pack ? "true" : "false", (long long)s->max_length, (long long)s->batch_size);
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        const lenvec *l = &s->lens[k];
        char name[64];
        snprintf(name, sizeof name, "tokenizer.%s.docs", split_name[k]);
        rf_stats_add(st, name, (int64_t)s->docs[k]);
        snprintf(name, sizeof name, "tokenizer.%s.tokens", split_name[k]);
        rf_stats_add(st, name, (int64_t)s->tokens[k]);
        snprintf(name, sizeof name, "tokenizer.%s.sequences", split_name[k]);
        rf_stats_add(st, name, (int64_t)l->n);
        rf_batch_plan plan;
        rf_partition_report part;
        uint32_t *assign = malloc((l->n ? l->n : 1) * sizeof *assign);
        if (!assign) rc = RF_ERR_NOMEM;
        if (!rc) rc = rf_batch_by_length(l->v, NULL, l->n, (size_t)s->batch_size, s->seed, &plan);
        if (!rc) rc = rf_partition_balanced(l->v, l->n, (int)s->partitions, assign, &part);
        free(assign);
        if (rc) break;
        uint64_t fixed = rf_padded_fixed(l->v, l->n, s->pack ? 0 : (uint32_t)s->max_length);
        uint64_t stream = rf_padded_stream_batches(l->v, l->n, (size_t)s->batch_size);
        double pb = rf_padding_fraction(plan.real_tokens, plan.padded_tokens);
        rf_buf_printf(&b,
                      "%s\"%s\":{\"docs\":%llu,\"sequences\":%zu,\"tokens\":%llu,"
                      "\"padding_fraction\":{\"length_bucketed\":%.5f,\"stream_batches\":%.5f,"
                      "\"fixed_length\":%.5f},\"partitions\":{\"n\":%lld,\"max_tokens\":%llu,"
                      "\"mean_tokens\":%.1f,\"imbalance\":%.5f},\"tail_tokens\":%llu}",
                      k ? "," : "", split_name[k], (unsigned long long)s->docs[k], l->n,
                      (unsigned long long)plan.real_tokens, pb,
                      rf_padding_fraction(plan.real_tokens, stream),
                      rf_padding_fraction(plan.real_tokens, fixed), (long long)s->partitions,
                      (unsigned long long)part.max_tokens, part.mean_tokens, part.imbalance,
                      (unsigned long long)s->dropped_tail[k]);
        snprintf(name, sizeof name, "tokenizer.%s.padding_fraction_bucketed", split_name[k]);
        rf_stats_set_real(st, name, pb);
        snprintf(name, sizeof name, "tokenizer.%s.partition_imbalance", split_name[k]);
        rf_stats_set_real(st, name, part.imbalance);
        rf_batch_plan_free(&plan);
    }
    if (!rc && rf_buf_puts(&b, "}}\n")) rc = RF_ERR_NOMEM;
    char path[4200];
    snprintf(path, sizeof path, "%s/report.json", s->dir);
    if (!rc) rc = rf_write_file_atomic(path, b.data, b.len);
    rf_buf_free(&b);
    return rc;
}

static int stage_finish(void *state, rf_emit_fn emit, void *emit_ctx) {
    tok_stage *s = state;
    int rc = 0;
    for (int k = 0; k < 2 && !rc && s->pack; k++) {
        uint32_t left;
        block_sink b = {s, k};
        rc = rf_packer_finish(&s->packer[k], false, 0, write_block, &b, &left);
        s->dropped_tail[k] = left;
    }
    for (int k = 0; k < 2; k++) {
        int r = rf_shard_writer_close(s->w[k]);
        s->w[k] = NULL;
        if (!rc) rc = r;
    }
    return rc ? rc : write_report(s);
}

const rf_stage_ops rf_tokenizer_stage = {
    .name = "tokenizer",
    .order = 30,
    .keys = rf_tokenizer_keys,
    .open = stage_open,
    .process = stage_process,
    .finish = stage_finish,
    .close = stage_close,
};
