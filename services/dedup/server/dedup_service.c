#include "dedup/server/dedup_service.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/sys.h"
#include "refinery.pb-c.h"
#include "runtime/batch_decode.h"
#include "dedup/server/dedup_journal.h"

/* The decisions of one batch, kept for the life of the process so that a
 * redelivered batch gets them back: per document, kept or not, and its
 * cluster. About 9 bytes per document decided by this index. */
typedef struct decided {
    char *run_id; /* NULL: empty slot */
    uint64_t seq;
    size_t n;
    uint64_t *cluster;
    unsigned char *kept;
} decided;

/* The dedup state of one run: its own engine and journal in
 * INDEX/<run dir>/, so that runs never remove each other's documents. */
typedef struct run_index {
    char *run_id;
    rf_dedup *engine;
    rf_dedup_journal *journal;
} run_index;

struct rf_dedup_service {
    rf_dedup_service_opts o;
    run_index *runs; /* opened on a run's first batch */
    size_t nruns, runs_cap;
    decided *slots; /* open addressing on hash(run_id, seq) */
    size_t nslots, nused;
    rf_dd_result *res;
    size_t res_cap;
};

static uint64_t batch_hash(const char *run_id, uint64_t seq) {
    return rf_hash64(run_id, strlen(run_id), seq);
}

static decided *find_slot(decided *slots, size_t nslots, const char *run_id, uint64_t seq) {
    size_t i = (size_t)(batch_hash(run_id, seq) & (nslots - 1));
    while (slots[i].run_id && (slots[i].seq != seq || strcmp(slots[i].run_id, run_id)))
        i = (i + 1) & (nslots - 1);
    return &slots[i];
}

static int grow(rf_dedup_service *s) {
    size_t n = s->nslots ? s->nslots * 2 : 1024;
    decided *slots = calloc(n, sizeof *slots);
    if (!slots) return RF_ERR_NOMEM;
    for (size_t i = 0; i < s->nslots; i++)
        if (s->slots[i].run_id)
            *find_slot(slots, n, s->slots[i].run_id, s->slots[i].seq) = s->slots[i];
    free(s->slots);
    s->slots = slots;
    s->nslots = n;
    return RF_OK;
}

static const decided *lookup(const rf_dedup_service *s, const char *run_id, uint64_t seq) {
    if (!s->nslots) return NULL;
    const decided *d = find_slot(s->slots, s->nslots, run_id, seq);
    return d->run_id ? d : NULL;
}

/* Remembers res[0..n) as the decisions of (run_id, seq). */
static int remember(rf_dedup_service *s, const char *run_id, uint64_t seq, const rf_dd_result *res,
                    size_t n) {
    if ((s->nused + 1) * 2 > s->nslots && grow(s)) return RF_ERR_NOMEM;
    decided *d = find_slot(s->slots, s->nslots, run_id, seq);
    if (d->run_id)
        return rf_fail(RF_ERR_INTERNAL, "dedup: batch %s/%llu decided twice", run_id,
                       (unsigned long long)seq);
    decided nd = {strdup(run_id), seq, n, malloc(n * sizeof(uint64_t) + 1), malloc(n + 1)};
    if (!nd.run_id || !nd.cluster || !nd.kept) {
        free(nd.run_id);
        free(nd.cluster);
        free(nd.kept);
        return RF_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        nd.cluster[i] = res[i].cluster;
        nd.kept[i] = res[i].kind == RF_DD_KEPT;
    }
    *d = nd;
    s->nused++;
    return RF_OK;
}

static int reserve_results(rf_dedup_service *s, size_t n) {
    if (n <= s->res_cap) return RF_OK;
    rf_dd_result *r = realloc(s->res, n * sizeof *r);
    if (!r) return RF_ERR_NOMEM;
    memset(r + s->res_cap, 0, (n - s->res_cap) * sizeof *r);
    s->res = r;
    s->res_cap = n;
    return RF_OK;
}

/* Decides docs through the run's engine (replayed or new) and remembers them. */
static int decide(rf_dedup_service *s, run_index *ri, uint64_t seq, const rf_doc *docs, size_t n) {
    int rc = reserve_results(s, n);
    if (!rc) rc = rf_dedup_process(ri->engine, docs, n, s->res);
    if (!rc) rc = remember(s, ri->run_id, seq, s->res, n);
    rf_dd_results_clear(s->res, n);
    return rc;
}

typedef struct replay_ctx {
    rf_dedup_service *s;
    run_index *ri;
} replay_ctx;

static int replay_one(void *user, const char *run_id, uint64_t seq, const rf_doc *docs, size_t n) {
    replay_ctx *c = user;
    if (strcmp(run_id, c->ri->run_id))
        return rf_fail(RF_ERR_CORRUPT, "dedup: run %s's journal holds a batch of run %s",
                       c->ri->run_id, run_id);
    return decide(c->s, c->ri, seq, docs, n);
}

/* The run's directory under the index: the run id itself when it is made of
 * [A-Za-z0-9._-] (and does not start with '.'), else "run-" and a hash. */
static void run_dir(const char *index_dir, const char *run_id, char *out, size_t size) {
    size_t len = strlen(run_id), i = 0;
    while (i < len && (isalnum((unsigned char)run_id[i]) || strchr("._-", run_id[i])))
        i++;
    if (len && i == len && len <= 128 && run_id[0] != '.')
        snprintf(out, size, "%s/%s", index_dir, run_id);
    else
        snprintf(out, size, "%s/run-%016llx", index_dir,
                 (unsigned long long)rf_hash64(run_id, len, 0));
}

static void run_close(run_index *ri) {
    rf_dedup_journal_close(ri->journal);
    rf_dedup_close(ri->engine);
    free(ri->run_id);
}

/* Opens (creating) the run's index and replays its journal. */
static int run_open(rf_dedup_service *s, const char *run_id, run_index *ri) {
    char dir[4096], path[4200];
    uint64_t journal_size, unused;
    size_t before = s->nused;
    *ri = (run_index){strdup(run_id), NULL, NULL};
    run_dir(s->o.index_dir, run_id, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/batches.log", dir);
    int rc = ri->run_id ? rf_mkdir_p(dir) : RF_ERR_NOMEM;
    if (!rc) rc = rf_dedup_open(&s->o.engine, dir, &ri->engine);
    if (!rc) {
        rf_dedup_out_sizes(ri->engine, &journal_size, &unused);
        rc = rf_dedup_journal_open(path, journal_size, &ri->journal);
    }
    replay_ctx ctx = {s, ri};
    if (!rc) rc = rf_dedup_journal_replay(ri->journal, replay_one, &ctx);
    if (!rc && rf_dedup_pending(ri->engine) != 0)
        rc = rf_fail(RF_ERR_CORRUPT, "dedup: %s: the journal holds more documents than the index",
                     dir);
    if (!rc && rf_dedup_committed(ri->engine))
        rf_info("dedup", "%s: continuing after %zu batches, %llu documents", dir, s->nused - before,
                (unsigned long long)rf_dedup_committed(ri->engine));
    if (rc) run_close(ri);
    return rc;
}

static int run_get(rf_dedup_service *s, const char *run_id, run_index **out) {
    for (size_t i = 0; i < s->nruns; i++)
        if (!strcmp(s->runs[i].run_id, run_id)) {
            *out = &s->runs[i];
            return RF_OK;
        }
    if (s->nruns == s->runs_cap) {
        size_t cap = s->runs_cap ? 2 * s->runs_cap : 8;
        run_index *r = realloc(s->runs, cap * sizeof *r);
        if (!r) return RF_ERR_NOMEM;
        s->runs = r;
        s->runs_cap = cap;
    }
    int rc = run_open(s, run_id, &s->runs[s->nruns]);
    if (!rc) *out = &s->runs[s->nruns++];
    return rc;
}

int rf_dedup_service_open(const rf_dedup_service_opts *o, rf_dedup_service **out) {
    int rc = rf_dedup_opts_check(&o->engine);
    if (rc) return rc;
    rf_dedup_service *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->o = *o;
    if ((rc = rf_mkdir_p(o->index_dir))) {
        free(s);
        return rc;
    }
    *out = s;
    return RF_OK;
}

void rf_dedup_service_close(rf_dedup_service *s) {
    if (!s) return;
    for (size_t i = 0; i < s->nslots; i++) {
        free(s->slots[i].run_id);
        free(s->slots[i].cluster);
        free(s->slots[i].kept);
    }
    for (size_t i = 0; i < s->nruns; i++)
        run_close(&s->runs[i]);
    free(s->runs);
    free(s->slots);
    free(s->res);
    free(s);
}

/* A new batch: decide, journal, commit, in that order (see dedup_journal.h). */
static int decide_new(rf_dedup_service *s, run_index *ri, uint64_t seq, const rf_doc *docs,
                      size_t n) {
    uint64_t size;
    int rc = decide(s, ri, seq, docs, n);
    if (!rc && n) rc = rf_dedup_journal_append(ri->journal, ri->run_id, seq, docs, n, &size);
    if (!rc && n) rc = rf_dedup_commit(ri->engine, size, 0);
    return rc;
}

/* Packs docs whose kept flag equals want as a DocumentBatch and produces it. */
static int produce_part(rf_dedup_service *s, rf_kafka_tracker *t, const char *topic,
                        const Refinery__V1__DocumentBatch *in, const decided *d, int want,
                        int64_t *count) {
    Refinery__V1__Document **ptrs = malloc((in->n_docs + 1) * sizeof *ptrs);
    if (!ptrs) return RF_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < in->n_docs; i++)
        if (d->kept[i] == want) {
            in->docs[i]->cluster = d->cluster[i];
            ptrs[k++] = in->docs[i];
        }
    *count = (int64_t)k;
    int rc = RF_OK;
    if (k || want) {
        Refinery__V1__DocumentBatch b = REFINERY__V1__DOCUMENT_BATCH__INIT;
        b.run_id = in->run_id;
        b.seq = in->seq;
        b.docs = ptrs;
        b.n_docs = k;
        size_t len = refinery__v1__document_batch__get_packed_size(&b);
        uint8_t *buf = malloc(len + 1);
        if (!buf) rc = RF_ERR_NOMEM;
        if (!rc) {
            refinery__v1__document_batch__pack(&b, buf);
            rc = rf_kafka_produce_tracked(s->o.producer, t, topic, in->run_id, strlen(in->run_id),
                                          buf, len);
        }
        free(buf);
    }
    free(ptrs);
    return rc;
}

/* The batch's documents as rf_docs borrowing its strings; NULL when out of memory. */
static rf_doc *batch_docs(const Refinery__V1__DocumentBatch *in) {
    rf_doc *docs = calloc(in->n_docs + 1, sizeof *docs);
    for (size_t i = 0; docs && i < in->n_docs; i++)
        docs[i] = (rf_doc){.id = in->docs[i]->id,
                           .text = in->docs[i]->text,
                           .text_len = strlen(in->docs[i]->text),
                           .label = in->docs[i]->label,
                           .source = in->docs[i]->source};
    return docs;
}

/* A run whose journal got records in this poll, and the journal's size. */
typedef struct touched {
    run_index *ri;
    uint64_t journal_size;
} touched;

int rf_dedup_service_prepare(void *user, const rf_kafka_msg *const *msgs, size_t n) {
    rf_dedup_service *s = user;
    touched *runs = calloc(n + 1, sizeof *runs);
    size_t nruns = 0;
    int rc = runs ? RF_OK : RF_ERR_NOMEM;
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        Refinery__V1__DocumentBatch *in;
        if (rf_svc_unpack_documents(msgs[i], &in) < 0) continue; /* process() reports it */
        run_index *ri = NULL;
        rc = run_get(s, in->run_id, &ri);
        if (rc == RF_OK && !lookup(s, in->run_id, in->seq)) {
            rf_doc *docs = batch_docs(in);
            uint64_t size = 0;
            rc = docs ? decide(s, ri, in->seq, docs, in->n_docs) : RF_ERR_NOMEM;
            if (rc == RF_OK && in->n_docs) {
                rc = rf_dedup_journal_write(ri->journal, ri->run_id, in->seq, docs, in->n_docs,
                                            &size);
                size_t k = 0;
                while (k < nruns && runs[k].ri != ri)
                    k++;
                runs[k] = (touched){ri, size};
                if (k == nruns) nruns++;
            }
            free(docs);
        }
        refinery__v1__document_batch__free_unpacked(in, NULL);
    }
    for (size_t k = 0; rc == RF_OK && k < nruns; k++) {
        rc = rf_dedup_journal_sync(runs[k].ri->journal);
        if (rc == RF_OK) rc = rf_dedup_commit(runs[k].ri->engine, runs[k].journal_size, 0);
    }
    free(runs);
    return rc;
}

int rf_dedup_service_process(void *user, const rf_kafka_msg *m, const rf_stage_batch_id *id,
                             rf_kafka_tracker *t, rf_store_counts *counts) {
    rf_dedup_service *s = user;
    Refinery__V1__DocumentBatch *in;
    int rc = rf_svc_unpack_documents(m, &in);
    if (rc < 0) return rc;
    run_index *ri = NULL;
    rc = run_get(s, in->run_id, &ri); /* first: replays the run's journal */
    const decided *d = rc ? NULL : lookup(s, in->run_id, in->seq);
    if (!rc && !d) {
        rf_doc *docs = batch_docs(in);
        rc = docs ? decide_new(s, ri, in->seq, docs, in->n_docs) : RF_ERR_NOMEM;
        free(docs);
        if (!rc) d = lookup(s, in->run_id, in->seq);
    } else if (!rc && d->n != in->n_docs) {
        rc = rf_fail(RF_ERR_INVALID,
                     "dedup: batch %s/%llu came with %zu documents, decided before with %zu",
                     in->run_id, (unsigned long long)in->seq, in->n_docs, d->n);
    }
    int64_t kept = 0, dups = 0;
    if (!rc) rc = produce_part(s, t, s->o.topic_unique, in, d, 1, &kept);
    if (!rc) rc = produce_part(s, t, s->o.topic_dups, in, d, 0, &dups);
    if (!rc) *counts = (rf_store_counts){.in = (int64_t)in->n_docs, .out = kept, .duplicate = dups};
    refinery__v1__document_batch__free_unpacked(in, NULL);
    return rc;
}

int rf_dedup_service_report(rf_dedup_service *s, rf_stats *stats) {
    rf_buf prefix = RF_BUF_INIT;
    int rc = RF_OK;
    for (size_t i = 0; i < s->nruns && !rc; i++) {
        rf_buf_reset(&prefix);
        rc = rf_buf_printf(&prefix, "dedup.%s.", s->runs[i].run_id);
        if (!rc) rc = rf_dedup_report(s->runs[i].engine, stats, prefix.data);
    }
    rf_buf_free(&prefix);
    return rc;
}
