/* Consume -> process -> deliver -> record -> commit. */
#include "runtime/stage_loop.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sys.h"
#include "common/utf8.h"
#include "common/obs.h"
#include "common/sys.h"
#include "runtime/svc.h"

/* One message of a poll and what became of it. */
typedef enum item_state { ITEM_BAD, ITEM_REPLAY, ITEM_TODO, ITEM_DONE } item_state;

typedef struct item {
    rf_stage_batch_id id;
    rf_store_counts counts;
    item_state state;
} item;

static void count(rf_stage_loop *l, const char *what, int64_t n) {
    if (!l->stats || !n) return;
    char name[128];
    snprintf(name, sizeof name, "%s.%s", l->counters ? l->counters : l->stage, what);
    rf_stats_add(l->stats, name, n);
}

/* Identifies every message: not a batch (BAD), the same batch twice in one
 * poll (an upstream replay: REPLAY), or TODO. */
static void identify_all(rf_stage_loop *l, const rf_kafka_batch *b, item *it) {
    for (size_t i = 0; i < b->n; i++) {
        const rf_kafka_msg *m = &b->msgs[i];
        it[i].state = ITEM_TODO;
        if (l->identify(l->user, m, &it[i].id) < 0) {
            rf_warn(l->stage, "%s [%d] offset %" PRId64 ": not a batch (%s); skipped", m->topic,
                    (int)m->partition, m->offset, rf_errmsg());
            count(l, "bad_messages", 1);
            it[i].state = ITEM_BAD;
            continue;
        }
        for (size_t k = 0; k < i; k++)
            if (it[k].state == ITEM_TODO && it[k].id.seq == it[i].id.seq &&
                !strcmp(it[k].id.run_id, it[i].id.run_id)) {
                count(l, "replayed", 1);
                it[i].state = ITEM_REPLAY;
                break;
            }
    }
}

/* Appends the run ids of the items in state st as a PostgreSQL text array
 * literal: {"a","b"}, with '"' and '\' escaped. */
static int put_run_ids(rf_buf *out, const item *it, size_t n, item_state st) {
    int rc = rf_buf_putc(out, '{');
    const char *sep = "";
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        if (it[i].state != st) continue;
        rc = rf_buf_puts(out, sep);
        if (rc == RF_OK) rc = rf_buf_putc(out, '"');
        for (const char *c = it[i].id.run_id; rc == RF_OK && *c; c++) {
            if (*c == '"' || *c == '\\') rc = rf_buf_putc(out, '\\');
            if (rc == RF_OK) rc = rf_buf_putc(out, *c);
        }
        if (rc == RF_OK) rc = rf_buf_putc(out, '"');
        sep = ",";
    }
    return rc ? rc : rf_buf_putc(out, '}');
}

/* Appends a bigint array literal of one field of the items in state st:
 * 0 = seq, 1..4 = in, out, rejected, duplicate. */
static int put_numbers(rf_buf *out, const item *it, size_t n, item_state st, int field) {
    int rc = rf_buf_putc(out, '{');
    const char *sep = "";
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        if (it[i].state != st) continue;
        const rf_store_counts *c = &it[i].counts;
        int64_t v = field == 1   ? c->in
                    : field == 2 ? c->out
                    : field == 3 ? c->rejected
                                 : c->duplicate;
        if (field == 0 && it[i].id.seq > INT64_MAX)
            return rf_fail(RF_ERR_RANGE, "batch seq %" PRIu64 " out of range", it[i].id.seq);
        if (field != 0 && v < 0) return rf_fail(RF_ERR_RANGE, "negative count in a batch");
        rc = rf_buf_puts(out, sep);
        if (rc == RF_OK)
            rc = field == 0 ? rf_buf_put_u64(out, it[i].id.seq) : rf_buf_put_i64(out, v);
        sep = ",";
    }
    return rc ? rc : rf_buf_putc(out, '}');
}

/* Array parameters for the items in state st: run ids, then the given
 * number fields. */
static int array_params(const item *it, size_t n, item_state st, int nfields, rf_buf *bufs) {
    int rc = put_run_ids(&bufs[0], it, n, st);
    for (int f = 0; rc == RF_OK && f < nfields; f++)
        rc = put_numbers(&bufs[1 + f], it, n, st, f);
    return rc;
}

/* One round trip for the whole poll: TODO batches whose progress row exists
 * were finished before (only their offset commit was lost) become REPLAY;
 * batches of a run that does not exist (a foreign producer, a deleted run)
 * become BAD, so that they are skipped and committed instead of failing the
 * progress insert on every restart. */
static int skip_recorded(rf_stage_loop *l, item *it, size_t n) {
    rf_buf a[2] = {RF_BUF_INIT, RF_BUF_INIT};
    PGresult *res = NULL;
    int rc = array_params(it, n, ITEM_TODO, 1, a);
    if (rc == RF_OK) {
        const char *p[] = {l->stage, a[0].data, a[1].data};
        rc = rf_store_exec(l->store,
                           "SELECT b.run_id, b.seq, p.batch_seq IS NOT NULL, r.id IS NOT NULL"
                           " FROM unnest($2::text[], $3::bigint[]) AS b(run_id, seq)"
                           " LEFT JOIN runs r ON r.id = b.run_id"
                           " LEFT JOIN stage_progress p ON p.run_id = b.run_id"
                           " AND p.batch_seq = b.seq AND p.stage = $1",
                           3, p, &res);
    }
    for (int r = 0; rc == RF_OK && r < PQntuples(res); r++) {
        const char *run = PQgetvalue(res, r, 0);
        uint64_t seq = strtoull(PQgetvalue(res, r, 1), NULL, 10);
        bool done = !strcmp(PQgetvalue(res, r, 2), "t"),
             known = !strcmp(PQgetvalue(res, r, 3), "t");
        if (known && !done) continue;
        for (size_t i = 0; i < n; i++) {
            if (it[i].state != ITEM_TODO || it[i].id.seq != seq || strcmp(it[i].id.run_id, run))
                continue;
            if (!known) {
                rf_warn(l->stage, "run %s batch %" PRIu64 ": no such run; skipped", run, seq);
                count(l, "unknown_run", 1);
                it[i].state = ITEM_BAD;
            } else {
                rf_info(l->stage, "run %s batch %" PRIu64 " already done: skipped", run, seq);
                count(l, "replayed", 1);
                it[i].state = ITEM_REPLAY;
            }
        }
    }
    if (res) PQclear(res);
    rf_buf_free(&a[0]);
    rf_buf_free(&a[1]);
    return rc;
}

/* The progress rows of every DONE batch, in one statement (so all or none). */
static int record_done(rf_stage_loop *l, const item *it, size_t n) {
    size_t ndone = 0;
    for (size_t i = 0; i < n; i++)
        ndone += it[i].state == ITEM_DONE;
    if (ndone == 0) return RF_OK;
    rf_buf a[6] = {RF_BUF_INIT, RF_BUF_INIT, RF_BUF_INIT, RF_BUF_INIT, RF_BUF_INIT, RF_BUF_INIT};
    int rc = array_params(it, n, ITEM_DONE, 5, a);
    if (rc == RF_OK) {
        const char *p[] = {l->stage,  a[0].data, a[1].data, a[2].data,
                           a[3].data, a[4].data, a[5].data};
        rc = rf_store_exec(l->store,
                           "INSERT INTO stage_progress"
                           " (run_id, stage, batch_seq, docs_in, docs_out, rejected, duplicate)"
                           " SELECT r, $1, s, i, o, j, d FROM unnest($2::text[], $3::bigint[],"
                           " $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[])"
                           " AS t(r, s, i, o, j, d)"
                           " ON CONFLICT (run_id, stage, batch_seq) DO NOTHING",
                           7, p, NULL);
    }
    for (size_t k = 0; k < 6; k++)
        rf_buf_free(&a[k]);
    return rc;
}

static int process_all(rf_stage_loop *l, const rf_kafka_batch *b, rf_kafka_tracker *t, item *it) {
    if (l->prepare) {
        const rf_kafka_msg **todo = calloc(b->n, sizeof *todo);
        if (!todo) return RF_ERR_NOMEM;
        size_t n = 0;
        for (size_t i = 0; i < b->n; i++)
            if (it[i].state == ITEM_TODO) todo[n++] = &b->msgs[i];
        int rc = n ? l->prepare(l->user, todo, n) : RF_OK;
        free(todo);
        if (rc < 0) return rc;
    }
    for (size_t i = 0; i < b->n; i++) {
        if (it[i].state != ITEM_TODO) continue;
        int rc = l->process(l->user, &b->msgs[i], &it[i].id, t, &it[i].counts);
        if (rc == RF_ERR_PARSE) {
            /* Its documents cannot be counted: the batch is one rejected record. */
            rf_warn(l->stage, "run %s batch %" PRIu64 ": %s; recorded as rejected", it[i].id.run_id,
                    it[i].id.seq, rf_errmsg());
            count(l, "bad_batches", 1);
            it[i].counts = (rf_store_counts){.rejected = 1};
        } else if (rc < 0) {
            return rc;
        }
        it[i].state = ITEM_DONE;
    }
    return RF_OK;
}

/* Records the poll's gaps before its offsets can commit past them; without
 * a store nobody could be told, and the loop stops as before. */
static int record_gaps(rf_stage_loop *l, const rf_kafka_batch *b) {
    for (size_t i = 0; i < b->n_gaps; i++) {
        const rf_kafka_gap *g = &b->gaps[i];
        count(l, "input_gaps", 1);
        if (!l->store)
            return rf_fail(RF_ERR_IO,
                           "%s [%d]: offsets %lld..%lld deleted before %s consumed them "
                           "(probable retention): input lost",
                           g->topic, (int)g->partition, (long long)g->from, (long long)g->to - 1,
                           l->stage);
        int rc = rf_store_gap_add(l->store, l->stage, g->topic, g->partition, g->from, g->to);
        if (rc < 0) return rc;
    }
    if (b->n_gaps) l->next_check_ = 0; /* check the runs at once */
    return RF_OK;
}

/* Whether the consumer has read the run's partition of every input topic
 * to the log's end; *st gets the first topic's standing. */
static bool run_drained(rf_stage_loop *l, const char *run_id, rf_kafka_standing *first) {
    const char *const *topics;
    size_t nt = rf_kafka_consumer_topics(l->consumer, &topics);
    for (size_t k = 0; k < nt; k++) {
        rf_kafka_standing st;
        if (rf_kafka_consumer_standing(l->consumer, topics[k], run_id, strlen(run_id), 5, &st) <
            0) {
            rf_warn(l->stage, "run %s: cannot tell whether its input is drained: %s", run_id,
                    rf_errmsg());
            return false;
        }
        if (k == 0) *first = st;
        bool drained = st.position >= 0 ? st.position >= st.high : st.high == st.low;
        if (!st.assigned || !drained) return false;
    }
    return nt > 0;
}

static int fail_run(rf_stage_loop *l, const rf_store_missing *m, const rf_kafka_standing *st) {
    const char *const *topics;
    rf_kafka_consumer_topics(l->consumer, &topics);
    int64_t from, to;
    int rc = rf_store_gap_last(l->store, l->stage, topics[0], st->partition, &from, &to);
    if (rc < 0 && rc != RF_ERR_NOT_FOUND) return rc;
    /* Deleted records are the likely cause only when some were deleted. */
    bool gap = rc == RF_OK, retention = gap || st->low > 0;
    rf_buf reason = RF_BUF_INIT;
    rc = rf_buf_printf(&reason,
                       "input lost: %s never received %lld of the %lld batches of run %s from %s "
                       "(seq %" PRIu64 "..%" PRIu64 " missing, of %" PRIu64 "..%" PRIu64,
                       l->stage, (long long)m->missing, (long long)m->expected, m->run_id,
                       l->upstream, m->first, m->last, m->seq_lo, m->seq_hi);
    if (rc == RF_OK && m->sealed_batches >= 0)
        rc = rf_buf_printf(&reason, "; sealed with %lld", (long long)m->sealed_batches);
    if (rc == RF_OK) rc = rf_buf_printf(&reason, ") on %s [%d]: ", topics[0], (int)st->partition);
    if (rc == RF_OK && gap)
        rc = rf_buf_printf(&reason,
                           "offsets %lld..%lld were deleted before %s consumed them (log now "
                           "starts at %lld)",
                           (long long)from, (long long)to - 1, l->stage, (long long)st->low);
    else if (rc == RF_OK && retention)
        rc = rf_buf_printf(&reason, "the log now starts at offset %lld, records before it deleted",
                           (long long)st->low);
    else if (rc == RF_OK)
        rc = rf_buf_printf(&reason, "not in the log (offsets %lld..%lld, none deleted)",
                           (long long)st->low, (long long)st->high - 1);
    if (rc == RF_OK && retention) rc = rf_buf_puts(&reason, ": probable retention");
    bool failed = false;
    if (rc == RF_OK) rc = rf_store_run_fail(l->store, m->run_id, reason.data, &failed);
    if (rc == RF_OK && failed) {
        rf_error(l->stage, "run %s failed: %s", m->run_id, reason.data);
        count(l, "runs_input_lost", 1);
    }
    rf_buf_free(&reason);
    if (rc == RF_ERR_NOT_FOUND) return RF_OK; /* deleted meanwhile */
    return rc < 0 ? rc : failed ? 1 : 0;
}

int rf_stage_loop_check_runs(rf_stage_loop *l) {
    if (!l->store || !l->upstream) return 0;
    rf_store_missing m[16];
    size_t n = 0;
    int rc = rf_store_missing_batches(l->store, l->upstream, l->stage, 16, m, &n);
    int failed = 0;
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        rf_kafka_standing st;
        if (!run_drained(l, m[i].run_id, &st)) continue;
        rc = fail_run(l, &m[i], &st);
        if (rc > 0) failed += rc;
    }
    return rc < 0 ? rc : failed;
}

/* The run check when due (every check_interval_s, at once after a gap). */
static int check_due(rf_stage_loop *l) {
    if (!l->store || !l->upstream) return RF_OK;
    double now = rf_now();
    if (now < l->next_check_) return RF_OK;
    l->next_check_ = now + (l->check_interval_s > 0 ? l->check_interval_s : 5);
    int rc = rf_stage_loop_check_runs(l);
    return rc < 0 ? rc : RF_OK;
}

int rf_stage_loop_step(rf_stage_loop *l) {
    rf_kafka_batch b;
    size_t max = l->max_messages ? l->max_messages : 16;
    int rc =
        rf_kafka_poll_batch(l->consumer, max, l->poll_timeout_s > 0 ? l->poll_timeout_s : 0.5, &b);
    if (rc < 0) return rc;
    rc = record_gaps(l, &b);
    if (rc == RF_OK && b.n == 0) rc = check_due(l);
    if (rc < 0 || b.n == 0) {
        rf_kafka_batch_release(&b);
        return rc < 0 ? rc : 0;
    }
    double t0 = rf_now();
    item *it = calloc(b.n, sizeof *it);
    rf_kafka_tracker t = {0};
    rc = it ? RF_OK : RF_ERR_NOMEM;
    if (rc == RF_OK) identify_all(l, &b, it);
    if (rc == RF_OK && l->store) rc = skip_recorded(l, it, b.n);
    if (rc == RF_OK) rc = process_all(l, &b, &t, it);
    /* Wait for whatever was produced, even after a failure: t lives here. */
    double timeout = l->delivery_timeout_s > 0 ? l->delivery_timeout_s : 30;
    int delivered = rf_kafka_wait(l->producer, &t, timeout);
    if (rc == RF_OK) rc = delivered;
    if (rc == RF_OK && l->store) rc = record_done(l, it, b.n);
    for (size_t i = 0; rc == RF_OK && l->after_record && i < b.n; i++)
        if (it[i].state == ITEM_DONE || it[i].state == ITEM_REPLAY)
            rc = l->after_record(l->user, &b.msgs[i], &it[i].id);
    if (rc == RF_OK) rc = rf_kafka_commit_batch(l->consumer, &b);
    if (rc == RF_OK) {
        for (size_t i = 0; i < b.n; i++) {
            if (it[i].state != ITEM_DONE) continue;
            count(l, "batches", 1);
            count(l, "in", it[i].counts.in);
            count(l, "out", it[i].counts.out);
            count(l, "rejected", it[i].counts.rejected);
            count(l, "duplicate", it[i].counts.duplicate);
            rf_obs_stage_counts(l->stage, it[i].counts.in, it[i].counts.out,
                                it[i].counts.duplicate);
        }
        rf_obs_batch_seconds(l->stage, rf_now() - t0);
        rf_kafka_consumer_observe_lag(l->consumer, l->stage, &b);
        rc = (int)b.n;
    }
    free(it);
    rf_kafka_batch_release(&b);
    if (rc > 0) {
        int c = check_due(l);
        if (c < 0) return c;
    }
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
                /* It becomes SQL text and file names: a run id that is not
                 * UTF-8 or holds a NUL would fail every poll it is in. */
                if (!rf_utf8_valid((const char *)p, v) || memchr(p, 0, v))
                    return rf_fail(RF_ERR_PARSE, "run id is not UTF-8 text");
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
