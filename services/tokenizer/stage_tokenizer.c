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
 *     append_eos: false        # true: every document ends with eos_token (one record per
 *                              # document: what trainer.task causal_lm packs, lm_data.h)
 *     block_len: 1024
 *     eos_token: "<|endoftext|>"
 *     batch_size: 32           # for the batching report
 *     partitions: 2            # data-parallel partitions for the report
 *     threads: 2               # default: run.threads
 *     chat_template: auto      # conversations (SFT): the tokenizer's own template
 *                              # (a .gguf's metadata, tokenizer_config.json or
 *                              # chat_template.jinja beside it), or a file holding one
 *
 * Writes <run_dir>/tokenizer/{train,eval}.{bin,idx} (shard.h) and report.json
 * (token counts, padding of length-bucketed batches against naive padding,
 * partition imbalance). Documents pass on downstream unchanged.
 *
 * Conversations (documents with messages: ingest's preset sft or `chat:`)
 * are rendered with the chat template and tokenized with their loss mask
 * (tokenizer/chat.h); the masks go to <split>.mask beside the shards, one
 * byte per token (trainer/lm_data.h's format: 1 for a target, and every token
 * of a document without messages is one), written only when a split holds a
 * conversation. A conversation is never packed here (pack: true fails: the
 * blocks keep no mask; append_eos lets the trainer pack it); an EOS appended
 * takes the mask of the document's last token.
 *
 * Encoding and the split are rf_tok_split_batch's (split_batch.h), the same
 * function the tokenizer service calls: a document without text or one the
 * tokenizer refuses is rejected (tokenizer.rejected.<reason>, logged) and the
 * run goes on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"
#include "common/stage.h"
#include "pipeline/stages.h"
#include "common/sys.h"
#include "tokenizer/batch.h"
#include "tokenizer/chat.h"
#include "tokenizer/shard.h"
#include "tokenizer/split_batch.h"
#include "tokenizer/tokenizer.h"

static const char *const split_name[] = {"train", "eval"};

typedef struct lenvec {
    uint32_t *v;
    size_t n, cap;
} lenvec;

typedef struct tok_stage {
    rf_run_ctx *ctx;
    rf_tokenizer *tok;
    rf_tok_splitter *splitter;
    rf_tok_doc *views; /* the current batch as rf_tok_docs */
    size_t n_views;
    int threads;
    bool add_special, pack, append_eos;
    uint32_t *doc_eos; /* a document with its EOS (append_eos) */
    size_t doc_eos_cap;
    double eval_fraction;
    uint64_t seed;
    int64_t max_length, block_len, batch_size, partitions;
    uint32_t eos_id;
    char dir[4096];
    rf_shard_writer *w[2];
    rf_packer packer[2];
    lenvec lens[2];
    uint64_t docs[2], tokens[2], dropped_tail[2];
    FILE *rejects; /* tokenizer/rejects.jsonl, opened at the first reject */
    char *chat_template;
    FILE *mask[2]; /* <split>.mask.tmp, opened at the split's first conversation */
    uint64_t targets[2], merged;
} tok_stage;

/* One line of tokenizer/rejects.jsonl (the run report's examples). */
static int write_reject(tok_stage *s, const rf_doc *d, const rf_tok_result *r) {
    char path[4200];
    snprintf(path, sizeof path, "%s/rejects.jsonl", s->dir);
    if (!s->rejects && !(s->rejects = fopen(path, "w")))
        return rf_fail(RF_ERR_IO, "tokenizer: cannot open %s", path);
    rf_buf b = RF_BUF_INIT;
    int rc = rf_buf_puts(&b, "{\"id\":");
    if (!rc) rc = rf_buf_append_json_str(&b, d->id ? d->id : "", d->id ? strlen(d->id) : 0);
    if (!rc) rc = rf_buf_puts(&b, ",\"reason\":");
    if (!rc) rc = rf_buf_append_json_str(&b, r->reject, strlen(r->reject));
    if (!rc) rc = rf_buf_puts(&b, ",\"detail\":");
    if (!rc) rc = rf_buf_append_json_str(&b, r->detail, strlen(r->detail));
    if (!rc) rc = rf_buf_puts(&b, ",\"excerpt\":");
    if (!rc) rc = rf_buf_append_json_str(&b, d->text, d->text_len < 200 ? d->text_len : 200);
    if (!rc) rc = rf_buf_puts(&b, "}\n");
    if (!rc && fwrite(b.data, 1, b.len, s->rejects) != b.len)
        rc = rf_fail(RF_ERR_IO, "tokenizer: writing %s failed", path);
    rf_buf_free(&b);
    return rc;
}

static void stage_close(void *state) {
    tok_stage *s = state;
    if (!s) return;
    for (int k = 0; k < 2; k++) {
        rf_shard_writer_abort(s->w[k]);
        rf_packer_free(&s->packer[k]);
        free(s->lens[k].v);
    }
    free(s->views);
    free(s->doc_eos);
    free(s->chat_template);
    for (int k = 0; k < 2; k++)
        if (s->mask[k]) {
            char p[4200];
            fclose(s->mask[k]);
            snprintf(p, sizeof p, "%s/%s.mask.tmp", s->dir, split_name[k]);
            unlink(p);
        }
    if (s->rejects) fclose(s->rejects);
    rf_tok_splitter_free(s->splitter);
    rf_tokenizer_free(s->tok);
    free(s);
}

static int stage_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    tok_stage *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->ctx = ctx;
    const char *path, *eos, *tmpl;
    int64_t seed, threads;
    int rc = rf_cfg_str(sec, "tokenizer", NULL, &path);
    if (!rc && !path)
        rc = rf_fail(RF_ERR_INVALID, "tokenizer.tokenizer: a tokenizer file is required");
    if (!rc) rc = rf_cfg_int(sec, "max_length", 128, 0, 1 << 20, &s->max_length);
    if (!rc) rc = rf_cfg_bool(sec, "add_special_tokens", true, &s->add_special);
    if (!rc) rc = rf_cfg_real(sec, "eval_fraction", 0.1, 0.0, 1.0, &s->eval_fraction);
    if (!rc) rc = rf_cfg_int(sec, "seed", 0, 0, INT64_MAX, &seed);
    if (!rc) rc = rf_cfg_bool(sec, "pack", false, &s->pack);
    if (!rc) rc = rf_cfg_bool(sec, "append_eos", false, &s->append_eos);
    if (!rc) rc = rf_cfg_int(sec, "block_len", 1024, 2, 1 << 20, &s->block_len);
    if (!rc) rc = rf_cfg_str(sec, "eos_token", "<|endoftext|>", &eos);
    if (!rc) rc = rf_cfg_int(sec, "batch_size", 32, 1, 1 << 20, &s->batch_size);
    if (!rc) rc = rf_cfg_int(sec, "partitions", 2, 1, 4096, &s->partitions);
    if (!rc) rc = rf_cfg_int(sec, "threads", ctx->threads > 0 ? ctx->threads : 1, 1, 256, &threads);
    if (!rc) rc = rf_cfg_str(sec, "chat_template", "auto", &tmpl);
    if (!rc && strcmp(tmpl, "auto") == 0)
        rc = rf_chat_template_find(path, &s->chat_template);
    else if (!rc) {
        size_t len;
        rc = rf_read_file(tmpl, 1 << 20, &s->chat_template, &len);
    }
    if (!rc) {
        s->seed = (uint64_t)seed;
        s->threads = (int)threads;
        rc = rf_tokenizer_load(path, &s->tok);
    }
    if (!rc && s->max_length)
        rf_tokenizer_set_truncation(s->tok, (size_t)s->max_length, RF_TRUNC_LONGEST_FIRST,
                                    RF_SIDE_RIGHT);
    if (!rc) rf_tokenizer_set_padding(s->tok, false, 0, 0, 0, 0, RF_SIDE_RIGHT);
    if (!rc && (s->pack || s->append_eos)) {
        int64_t id = rf_tokenizer_token_to_id(s->tok, eos);
        if (id < 0) rc = rf_fail(RF_ERR_INVALID, "tokenizer.eos_token: %s is not a token", eos);
        s->eos_id = (uint32_t)id;
    }
    if (!rc && s->pack) {
        for (int k = 0; k < 2 && !rc; k++)
            rc = rf_packer_init(&s->packer[k], (uint32_t)s->block_len, s->eos_id);
    }
    if (!rc) {
        rf_tok_split_opts so = {.add_special = s->add_special,
                                .eval_fraction = s->eval_fraction,
                                .seed = s->seed,
                                .threads = s->threads,
                                .chat_template = s->chat_template,
                                .max_length = (size_t)s->max_length};
        rc = rf_tok_splitter_new(s->tok, &so, &s->splitter);
    }
    snprintf(s->dir, sizeof s->dir, "%s/tokenizer", ctx->run_dir);
    if (!rc) rc = rf_mkdir_p(s->dir);
    for (int k = 0; k < 2 && !rc; k++) {
        char prefix[4200];
        snprintf(prefix, sizeof prefix, "%s/%s", s->dir, split_name[k]);
        rf_shard_info info = {.flags = s->pack ? RF_SHARD_PACKED : 0,
                              .vocab_size = rf_tokenizer_vocab_size(s->tok),
                              .eos_id = s->pack || s->append_eos ? (int32_t)s->eos_id : -1,
                              .pad_id = -1,
                              .block_len = s->pack ? (uint32_t)s->block_len : 0};
        rc = rf_shard_writer_open(prefix, &info, &s->w[k]);
        snprintf(prefix, sizeof prefix, "%s/%s.mask", s->dir, split_name[k]);
        unlink(prefix); /* a previous run's: this one writes its own or none */
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

/* The mask bytes of one written document: its own (a conversation), or all
 * ones; extra: an appended EOS, which takes the last token's byte. The file
 * is opened at the split's first conversation, with ones for every token
 * written before. */
static int write_mask(tok_stage *s, int k, const uint8_t *mask, size_t n, bool extra) {
    if (!s->mask[k] && !mask) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.mask.tmp", s->dir, split_name[k]);
    if (!s->mask[k]) {
        if (!(s->mask[k] = fopen(path, "w")))
            return rf_fail(RF_ERR_IO, "tokenizer: cannot open %s", path);
        for (uint64_t i = 0; i < s->tokens[k]; i++)
            if (putc(1, s->mask[k]) == EOF) return rf_fail(RF_ERR_IO, "writing %s failed", path);
        s->targets[k] = s->tokens[k];
    }
    uint8_t last = 1;
    for (size_t i = 0; i < n; i++) {
        last = mask ? mask[i] : 1;
        s->targets[k] += last;
        if (putc(last, s->mask[k]) == EOF) return rf_fail(RF_ERR_IO, "writing %s failed", path);
    }
    if (extra && putc(last, s->mask[k]) == EOF)
        return rf_fail(RF_ERR_IO, "writing %s failed", path);
    s->targets[k] += extra ? last : 0;
    return 0;
}

static int stage_process(void *state, rf_doc_batch *in, rf_emit_fn emit, void *emit_ctx) {
    tok_stage *s = state;
    int rc = 0;
    if (in->n > s->n_views) {
        rf_tok_doc *v = realloc(s->views, in->n * sizeof *v);
        if (!v)
            rc = RF_ERR_NOMEM;
        else {
            s->views = v;
            s->n_views = in->n;
        }
    }
    for (size_t i = 0; i < in->n && !rc; i++) {
        const rf_doc *d = &in->docs[i];
        s->views[i] =
            (rf_tok_doc){d->id, d->text, d->text_len, d->cluster, d->messages, d->messages_len};
    }
    const rf_tok_result *res = NULL;
    if (!rc) rc = rf_tok_split_batch(s->splitter, s->views, in->n, &res);
    /* written in stream order, so shards are deterministic whatever the threads */
    for (size_t i = 0; i < in->n && !rc; i++) {
        const rf_doc *d = &in->docs[i];
        const rf_tok_result *r = &res[i];
        if (r->reject) {
            rf_tok_result_count(r, s->ctx->stats);
            rf_warn("tokenizer", "document %s rejected: %s%s%s", d->id ? d->id : "?", r->reject,
                    r->detail[0] ? ": " : "", r->detail);
            rc = write_reject(s, d, r);
            continue;
        }
        int k = r->split;
        const rf_tok_encoding *e = &r->enc;
        if (r->mask && s->pack) {
            rc = rf_fail(RF_ERR_INVALID,
                         "tokenizer.pack: document %s is a conversation, whose loss mask packed "
                         "blocks do not keep; use append_eos: true (the trainer packs)",
                         d->id ? d->id : "?");
            break;
        }
        s->merged += r->chat_merged;
        bool eos_added =
            !s->pack && s->append_eos && (e->len == 0 || e->ids[e->len - 1] != s->eos_id);
        if (!s->pack) rc = write_mask(s, k, r->mask, e->len, eos_added);
        if (rc) break;
        if (s->pack) {
            block_sink b = {s, k};
            rc = rf_packer_add(&s->packer[k], e->ids, e->len, write_block, &b);
        } else if (s->append_eos && (e->len == 0 || e->ids[e->len - 1] != s->eos_id)) {
            if (e->len + 1 > s->doc_eos_cap) {
                uint32_t *b = realloc(s->doc_eos, (e->len + 1) * sizeof *b);
                if (!b)
                    rc = RF_ERR_NOMEM;
                else {
                    s->doc_eos = b;
                    s->doc_eos_cap = e->len + 1;
                }
            }
            if (!rc) {
                memcpy(s->doc_eos, e->ids, e->len * sizeof *s->doc_eos);
                s->doc_eos[e->len] = s->eos_id;
                rc = rf_shard_writer_add(s->w[k], s->doc_eos, (uint32_t)e->len + 1, d->label,
                                         r->cluster);
            }
            if (!rc) rc = lens_push(&s->lens[k], (uint32_t)e->len + 1);
        } else {
            rc = rf_shard_writer_add(s->w[k], e->ids, (uint32_t)e->len, d->label, r->cluster);
            if (!rc) rc = lens_push(&s->lens[k], (uint32_t)e->len);
        }
        s->docs[k]++;
        s->tokens[k] += e->len + eos_added;
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
    rf_stats_add(st, "tokenizer.repaired_utf8", (int64_t)rf_tok_splitter_repaired(s->splitter));
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
    for (int k = 0; k < 2 && !rc; k++) {
        if (!s->mask[k]) continue;
        char tmp[4200], path[4200];
        snprintf(tmp, sizeof tmp, "%s/%s.mask.tmp", s->dir, split_name[k]);
        snprintf(path, sizeof path, "%s/%s.mask", s->dir, split_name[k]);
        int c = fclose(s->mask[k]);
        s->mask[k] = NULL;
        if (c != 0 || rename(tmp, path) != 0)
            rc = rf_fail(RF_ERR_IO, "tokenizer: cannot write %s", path);
        char name[64];
        snprintf(name, sizeof name, "tokenizer.%s.target_tokens", split_name[k]);
        if (!rc) rf_stats_add(s->ctx->stats, name, (int64_t)s->targets[k]);
    }
    if (!rc && s->merged) {
        rf_stats_add(s->ctx->stats, "tokenizer.chat_boundary_merges", (int64_t)s->merged);
        rf_warn("tokenizer",
                "%llu conversation(s): ids across a turn boundary differ from the whole "
                "rendering's; the piecewise ids were kept",
                (unsigned long long)s->merged);
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
