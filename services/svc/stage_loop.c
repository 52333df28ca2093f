/* Consume -> process -> deliver -> record -> commit. */
#include "svc/stage_loop.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "svc/svc.h"

typedef struct done {
    rf_stage_batch_id id;
    rf_store_counts counts;
} done;

static void count(rf_stage_loop *l, const char *what, int64_t n) {
    if (!l->stats || !n) return;
    char name[128];
    snprintf(name, sizeof name, "%s.%s", l->stage, what);
    rf_stats_add(l->stats, name, n);
}

/* Processes the poll's messages; fills finished[] with the batches to record. */
static int process_all(rf_stage_loop *l, const rf_kafka_batch *b, rf_kafka_tracker *t,
                       done *finished, size_t *nfinished) {
    for (size_t i = 0; i < b->n; i++) {
        const rf_kafka_msg *m = &b->msgs[i];
        done d = {0};
        if (l->identify(l->user, m, &d.id) < 0) {
            rf_warn(l->stage, "%s [%d] offset %" PRId64 ": not a batch (%s); skipped", m->topic,
                    (int)m->partition, m->offset, rf_errmsg());
            count(l, "bad_messages", 1);
            continue;
        }
        bool again = false; /* the same batch twice in one poll (an upstream replay) */
        for (size_t k = 0; k < *nfinished && !again; k++)
            again = finished[k].id.seq == d.id.seq && !strcmp(finished[k].id.run_id, d.id.run_id);
        if (again) {
            count(l, "replayed", 1);
            continue;
        }
        if (l->store) {
            bool has;
            int rc = rf_store_progress_has(l->store, d.id.run_id, l->stage, d.id.seq, &has);
            if (rc < 0) return rc;
            if (has) {
                rf_info(l->stage, "run %s batch %" PRIu64 " already done: skipped", d.id.run_id,
                        d.id.seq);
                count(l, "replayed", 1);
                continue;
            }
        }
        int rc = l->process(l->user, m, &d.id, t, &d.counts);
        if (rc < 0) return rc;
        finished[(*nfinished)++] = d;
    }
    return RF_OK;
}

int rf_stage_loop_step(rf_stage_loop *l) {
    rf_kafka_batch b;
    size_t max = l->max_messages ? l->max_messages : 16;
    int rc =
        rf_kafka_poll_batch(l->consumer, max, l->poll_timeout_s > 0 ? l->poll_timeout_s : 0.5, &b);
    if (rc < 0) return rc;
    if (b.n == 0) {
        rf_kafka_batch_release(&b);
        return 0;
    }
    done *finished = calloc(b.n, sizeof *finished);
    rf_kafka_tracker t = {0};
    size_t nfinished = 0;
    rc = finished ? process_all(l, &b, &t, finished, &nfinished) : RF_ERR_NOMEM;
    /* Wait for whatever was produced, even after a failure: t lives here. */
    double timeout = l->delivery_timeout_s > 0 ? l->delivery_timeout_s : 30;
    int delivered = rf_kafka_wait(l->producer, &t, timeout);
    if (rc == RF_OK) rc = delivered;
    for (size_t i = 0; rc == RF_OK && l->store && i < nfinished; i++)
        rc = rf_store_progress_add(l->store, finished[i].id.run_id, l->stage, finished[i].id.seq,
                                   &finished[i].counts, NULL);
    if (rc == RF_OK) rc = rf_kafka_commit_batch(l->consumer, &b);
    if (rc == RF_OK) {
        count(l, "batches", (int64_t)nfinished);
        for (size_t i = 0; i < nfinished; i++) {
            count(l, "in", finished[i].counts.in);
            count(l, "out", finished[i].counts.out);
            count(l, "rejected", finished[i].counts.rejected);
            count(l, "duplicate", finished[i].counts.duplicate);
        }
        rc = (int)b.n;
    }
    free(finished);
    rf_kafka_batch_release(&b);
    return rc;
}

int rf_stage_loop_run(rf_stage_loop *l) {
    while (!rf_svc_stopping()) {
        int rc = rf_stage_loop_step(l);
        if (rc < 0) {
            rf_error(l->stage, "stopping: %s", rf_errmsg());
            return rc;
        }
    }
    return RF_OK;
}

/* Protobuf wire format: varints and length-delimited fields. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end) return -1;
        uint8_t byte = *(*p)++;
        *v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) return 0;
    }
    return -1;
}

int rf_stage_identify_batch(void *user, const rf_kafka_msg *m, rf_stage_batch_id *id) {
    const uint8_t *p = m->value, *end = p + m->len;
    int have_run = 0;
    memset(id, 0, sizeof *id);
    while (p < end) {
        uint64_t key, v;
        if (read_varint(&p, end, &key) < 0) return rf_fail(RF_ERR_PARSE, "truncated field key");
        uint64_t field = key >> 3, wire = key & 7;
        if (wire == 0) {
            if (read_varint(&p, end, &v) < 0) return rf_fail(RF_ERR_PARSE, "truncated varint");
            if (field == 2) id->seq = v;
        } else if (wire == 2) {
            if (read_varint(&p, end, &v) < 0 || v > (uint64_t)(end - p))
                return rf_fail(RF_ERR_PARSE, "bad length");
            if (field == 1) {
                if (v >= sizeof id->run_id) return rf_fail(RF_ERR_RANGE, "run id too long");
                memcpy(id->run_id, p, v);
                id->run_id[v] = 0;
                have_run = 1;
            }
            p += v;
        } else if (wire == 1 || wire == 5) {
            size_t n = wire == 1 ? 8 : 4;
            if ((size_t)(end - p) < n) return rf_fail(RF_ERR_PARSE, "truncated fixed field");
            p += n;
        } else {
            return rf_fail(RF_ERR_PARSE, "unsupported wire type %d", (int)wire);
        }
    }
    if (!have_run || !id->run_id[0]) return rf_fail(RF_ERR_PARSE, "no run id");
    return RF_OK;
}
