#include "tokenizer/server/tokenizer_service.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/utf8.h"
#include "refinery.pb-c.h"
#include "runtime/batch_decode.h"
#include "tokenizer/split_batch.h"

struct rf_tokenizer_service {
    rf_tokenizer_service_opts o;
    rf_tokenizer *tok;
    rf_tokenizer *full;        /* the same tokenizer without truncation or padding: lengths */
    size_t limit;              /* tok's truncation max_length (0: none) */
    rf_tok_side side;          /* and the side it cuts */
    rf_tok_splitter *splitter; /* the stage loop's; RPC calls make their own state */
    rf_tok_doc *views;         /* the current batch as rf_tok_docs */
    size_t n_views;
    rf_tok_state *full_state; /* the stage loop's, on full: lengths of cut sequences */
    rf_tok_encoding full_enc;
};

int rf_tokenizer_service_new(const rf_tokenizer_service_opts *o, rf_tokenizer_service **out) {
    rf_tokenizer_service *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->o = *o;
    int rc = rf_tokenizer_load(o->tokenizer, &s->tok);
    if (!rc) rc = rf_tokenizer_load(o->tokenizer, &s->full);
    if (!rc) {
        s->limit = rf_tokenizer_truncation(s->tok, &s->side);
        rf_tokenizer_set_truncation(s->full, 0, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
        rf_tokenizer_set_padding(s->full, false, 0, 0, 0, 0, RF_SIDE_RIGHT);
    }
    rf_tok_split_opts so = {.add_special = o->add_special,
                            .eval_fraction = o->eval_fraction,
                            .seed = o->seed,
                            .threads = 1};
    if (!rc) rc = rf_tok_splitter_new(s->tok, &so, &s->splitter);
    if (rc) {
        rf_tokenizer_service_free(s);
        return rc;
    }
    *out = s;
    return RF_OK;
}

void rf_tokenizer_service_free(rf_tokenizer_service *s) {
    if (!s) return;
    free(s->views);
    rf_tok_state_free(s->full_state);
    rf_tok_encoding_free(&s->full_enc);
    rf_tok_splitter_free(s->splitter);
    rf_tokenizer_free(s->tok);
    rf_tokenizer_free(s->full);
    free(s);
}

/* ---- stage ---- */

/* One output TokenBatch under construction; sequences own their ids. */
typedef struct split_out {
    Refinery__V1__TokenSequence *seqs;
    Refinery__V1__TokenSequence **ptrs;
    size_t n;
} split_out;

static void split_free(split_out *o) {
    for (size_t i = 0; i < o->n; i++)
        free(o->seqs[i].ids);
    free(o->seqs);
    free(o->ptrs);
}

static int produce_split(rf_tokenizer_service *s, rf_kafka_tracker *t, const char *topic,
                         const Refinery__V1__DocumentBatch *in, split_out *o, bool eval) {
    Refinery__V1__TokenBatch b = REFINERY__V1__TOKEN_BATCH__INIT;
    b.run_id = in->run_id;
    b.seq = in->seq;
    b.eval = eval;
    b.seqs = o->ptrs;
    b.n_seqs = o->n;
    size_t len = refinery__v1__token_batch__get_packed_size(&b);
    uint8_t *buf = malloc(len + 1);
    if (!buf) return RF_ERR_NOMEM;
    refinery__v1__token_batch__pack(&b, buf);
    int rc =
        rf_kafka_produce_tracked(s->o.producer, t, topic, in->run_id, strlen(in->run_id), buf, len);
    free(buf);
    return rc;
}

static size_t unpadded(const rf_tok_encoding *e) {
    size_t n = 0;
    for (size_t i = 0; i < e->len; i++)
        n += e->attention_mask[i];
    return n;
}

/* Marks q as the Tokenize RPC does: its length before truncation, and
 * whether it was cut to the tokenizer's max_length. Only a sequence that
 * reached the limit may have been cut, and only it is encoded again. */
static int mark_truncation(rf_tokenizer_service *s, const Refinery__V1__Document *d,
                           const rf_tok_encoding *enc, Refinery__V1__TokenSequence *q) {
    size_t original = unpadded(enc);
    if (s->limit && original >= s->limit) {
        if (!s->full_state && !(s->full_state = rf_tok_state_new(s->full))) return RF_ERR_NOMEM;
        int rc =
            rf_tok_encode(s->full_state, d->text, strlen(d->text), s->o.add_special, &s->full_enc);
        if (rc) return rc;
        original = s->full_enc.len;
    }
    q->truncated = s->limit && original > s->limit;
    q->original_length = original > UINT32_MAX ? UINT32_MAX : (uint32_t)original;
    return RF_OK;
}

static int reserve_views(rf_tokenizer_service *s, size_t n) {
    if (n <= s->n_views) return RF_OK;
    rf_tok_doc *v = realloc(s->views, n * sizeof *v);
    if (!v) return RF_ERR_NOMEM;
    s->views = v;
    s->n_views = n;
    return RF_OK;
}

/* The batch through rf_tok_split_batch (split_batch.h, as the embedded stage
 * does); kept sequences to their split's TokenBatch, rejects counted. */
int rf_tokenizer_service_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                                 rf_kafka_tracker *t, rf_store_counts *counts) {
    rf_tokenizer_service *s = user;
    Refinery__V1__DocumentBatch *in;
    if (rf_svc_unpack_documents(m, &in) < 0) return RF_ERR_PARSE;
    split_out out[2] = {{0}, {0}};
    int64_t rejected = 0, truncated = 0;
    uint32_t longest = 0;
    int rc = reserve_views(s, in->n_docs);
    for (int k = 0; k < 2 && !rc; k++)
        if (!(out[k].seqs = calloc(in->n_docs + 1, sizeof *out[k].seqs)) ||
            !(out[k].ptrs = calloc(in->n_docs + 1, sizeof *out[k].ptrs)))
            rc = RF_ERR_NOMEM;
    for (size_t i = 0; i < in->n_docs && !rc; i++) {
        const Refinery__V1__Document *d = in->docs[i];
        /* the Document message carries no conversation yet: SFT data runs embedded */
        s->views[i] = (rf_tok_doc){d->id, d->text, strlen(d->text), d->cluster, NULL, 0};
    }
    const rf_tok_result *res = NULL;
    if (!rc) rc = rf_tok_split_batch(s->splitter, s->views, in->n_docs, &res);
    for (size_t i = 0; i < in->n_docs && !rc; i++) {
        const Refinery__V1__Document *d = in->docs[i];
        const rf_tok_result *r = &res[i];
        if (r->reject) {
            rf_tok_result_count(r, s->o.stats);
            rf_warn("tokenizer", "batch %s/%llu: document %s rejected: %s%s%s", in->run_id,
                    (unsigned long long)in->seq, d->id, r->reject, r->detail[0] ? ": " : "",
                    r->detail);
            rejected++;
            continue;
        }
        int k = r->split;
        Refinery__V1__TokenSequence *q = &out[k].seqs[out[k].n];
        refinery__v1__token_sequence__init(q);
        q->doc_id = d->id; /* borrowed from in */
        q->label = d->label;
        q->cluster = r->cluster;
        q->n_ids = r->enc.len;
        if (!(q->ids = malloc(r->enc.len * sizeof *q->ids + 1))) {
            rc = RF_ERR_NOMEM;
            break;
        }
        memcpy(q->ids, r->enc.ids, r->enc.len * sizeof *q->ids);
        out[k].ptrs[out[k].n++] = q;
        if ((rc = mark_truncation(s, d, &r->enc, q))) break;
        if (q->truncated) {
            truncated++;
            if (q->original_length > longest) longest = q->original_length;
        }
    }
    /* Cut sequences are marked in the TokenBatch, counted and said here. */
    if (!rc && truncated) {
        if (s->o.stats) rf_stats_add(s->o.stats, "tokenizer.truncated", truncated);
        rf_info("tokenizer",
                "batch %s/%llu: %lld sequence(s) truncated to %zu ids (longest %u before)",
                in->run_id, (unsigned long long)in->seq, (long long)truncated, s->limit, longest);
    }
    if (!rc) rc = produce_split(s, t, s->o.topic_train, in, &out[RF_SPLIT_TRAIN], false);
    if (!rc) rc = produce_split(s, t, s->o.topic_eval, in, &out[RF_SPLIT_EVAL], true);
    if (!rc)
        *counts = (rf_store_counts){
            .in = (int64_t)in->n_docs, .out = (int64_t)(out[0].n + out[1].n), .rejected = rejected};
    split_free(&out[0]);
    split_free(&out[1]);
    refinery__v1__document_batch__free_unpacked(in, NULL);
    return rc;
}

/* ---- gRPC ---- */

/* Cuts a full (untruncated, unpadded) encoding to max ids as the tokenizer's
 * truncation would: the special tokens the template added (the runs of
 * special_mask at both ends; a single sequence has them nowhere else) stay,
 * the text's ids are cut on `side`. Fails when max is below those. */
static int cut_encoding(rf_tok_encoding *e, size_t max, rf_tok_side side) {
    size_t pre = 0, post = 0;
    while (pre < e->len && e->special_mask[pre])
        pre++;
    while (post < e->len - pre && e->special_mask[e->len - 1 - post])
        post++;
    if (e->len <= max) return RF_OK;
    if (max < pre + post)
        return rf_fail(RF_ERR_INVALID, "max_length %zu is below the %zu special tokens", max,
                       pre + post);
    size_t body = e->len - pre - post, keep = max - pre - post;
    if (side == RF_SIDE_LEFT)
        memmove(e->ids + pre, e->ids + pre + (body - keep), keep * sizeof *e->ids);
    memmove(e->ids + pre + keep, e->ids + pre + body, post * sizeof *e->ids);
    e->len = max;
    return RF_OK;
}

/* Encodes one text for Tokenize into seq: the server's tokenizer as loaded
 * (max 0), or cut to max; truncated and original_length say what was cut. */
static int encode_one(rf_tokenizer_service *s, rf_tok_state *st, rf_tok_state *full,
                      const char *text, bool special, size_t max, rf_tok_encoding *enc,
                      Refinery__V1__TokenSequence *seq) {
    size_t original;
    int rc;
    if (max == 0) {
        if ((rc = rf_tok_encode(st, text, strlen(text), special, enc))) return rc;
        original = unpadded(enc);
        /* Only a sequence that reached the limit may have been cut. */
        if (s->limit && original >= s->limit) {
            rf_tok_encoding f = {0};
            rc = rf_tok_encode(full, text, strlen(text), special, &f);
            original = f.len;
            rf_tok_encoding_free(&f);
            if (rc) return rc;
        }
        seq->truncated = s->limit && original > s->limit;
    } else {
        if ((rc = rf_tok_encode(full, text, strlen(text), special, enc))) return rc;
        original = enc->len;
        if ((rc = cut_encoding(enc, max, s->side))) return rc;
        seq->truncated = original > enc->len;
    }
    if (!(seq->ids = malloc(enc->len * sizeof *seq->ids + 1))) return RF_ERR_NOMEM;
    memcpy(seq->ids, enc->ids, enc->len * sizeof *seq->ids);
    seq->n_ids = enc->len;
    seq->original_length = original > UINT32_MAX ? UINT32_MAX : (uint32_t)original;
    return RF_OK;
}

static grpc_status_code tokenize(rf_rpc_call *call, const ProtobufCMessage *msg, void *user) {
    rf_tokenizer_service *s = user;
    const Refinery__V1__TokenizeRequest *req = (const Refinery__V1__TokenizeRequest *)msg;
    if (s->limit && req->max_length > s->limit)
        return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "max_length %u is above the server's limit %zu", req->max_length,
                           s->limit);
    for (size_t i = 0; i < req->n_texts; i++) {
        size_t len = strlen(req->texts[i]);
        if (!rf_utf8_valid(req->texts[i], len))
            return rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                               "texts[%zu] is not valid UTF-8 (first bad byte at %zu)", i,
                               rf_utf8_first_invalid(req->texts[i], len));
    }
    rf_tok_state *st = rf_tok_state_new(s->tok);
    rf_tok_state *full = rf_tok_state_new(s->full);
    Refinery__V1__TokenSequence *seqs = calloc(req->n_texts + 1, sizeof *seqs);
    Refinery__V1__TokenSequence **ptrs = calloc(req->n_texts + 1, sizeof *ptrs);
    rf_tok_encoding enc = {0};
    grpc_status_code code = GRPC_STATUS_OK;
    size_t n = 0;
    if (!st || !full || !seqs || !ptrs)
        code = rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "no memory");
    for (; n < req->n_texts && code == GRPC_STATUS_OK; n++) {
        refinery__v1__token_sequence__init(&seqs[n]);
        seqs[n].label = -1;
        ptrs[n] = &seqs[n];
        int rc = encode_one(s, st, full, req->texts[n], req->add_special_tokens, req->max_length,
                            &enc, &seqs[n]);
        if (rc == RF_ERR_NOMEM) {
            code = rf_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "no memory");
            break;
        } else if (rc == RF_ERR_INVALID) {
            code =
                rf_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "texts[%zu]: %s", n, rf_errmsg());
            break;
        } else if (rc) {
            code = rf_rpc_fail(call, GRPC_STATUS_INTERNAL, "texts[%zu]: %s", n, rf_errmsg());
            break;
        }
    }
    if (code == GRPC_STATUS_OK) {
        Refinery__V1__TokenizeResponse resp = REFINERY__V1__TOKENIZE_RESPONSE__INIT;
        resp.seqs = ptrs;
        resp.n_seqs = n;
        if (rf_rpc_send(call, &resp.base) < 0) code = rf_rpc_call_status(call);
    }
    for (size_t i = 0; seqs && i <= n && i < req->n_texts; i++)
        free(seqs[i].ids);
    free(seqs);
    free(ptrs);
    rf_tok_encoding_free(&enc);
    rf_tok_state_free(full);
    rf_tok_state_free(st);
    return code;
}

int rf_tokenizer_service_register(rf_tokenizer_service *s, rf_rpc_server *server) {
    rf_rpc_method m = {.path = "/refinery.v1.Tokenizer/Tokenize",
                       .kind = RF_RPC_UNARY,
                       .request = &refinery__v1__tokenize_request__descriptor,
                       .handler = tokenize,
                       .user = s};
    return rf_rpc_server_add(server, &m);
}
