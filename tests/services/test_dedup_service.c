/* The dedup service's batch journal (round trip, truncation to the size an
 * index recorded, corruption), and, with arguments, the tools
 * dedup_service.test.sh drives the refinery-dedup binary with:
 *   --produce BOOTSTRAP RUN DOCS.tsv BATCH   DocumentBatches of id<TAB>text lines to docs.clean
 *   --collect BOOTSTRAP RUN NBATCH NDOCS OUT docs.unique + docs.duplicates, deduplicated by
 *                                            (topic, run, seq): kept ids to OUT, counts on stdout
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "dedup/dedup.h"
#include "runtime/kafka/kafka.h"
#include "refinery.pb-c.h"
#include "dedup/server/dedup_journal.h"

typedef struct seen {
    int calls;
    char last_run[32];
    uint64_t last_seq;
    char ids[8][16];
    size_t n;
} seen;

static int record(void *user, const char *run_id, uint64_t seq, const rf_doc *docs, size_t n) {
    seen *s = user;
    s->calls++;
    snprintf(s->last_run, sizeof s->last_run, "%s", run_id);
    s->last_seq = seq;
    s->n = n;
    for (size_t i = 0; i < n && i < 8; i++)
        snprintf(s->ids[i], sizeof s->ids[i], "%s", docs[i].id);
    return RF_OK;
}

static void test_journal(void **state) {
    char dir[] = "/tmp/rf-dj-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/batches.log", dir);
    rf_doc docs[3] = {{.id = "a"}, {.id = "bb"}, {.id = ""}};
    rf_dedup_journal *j;
    uint64_t s1, s2;
    assert_int_equal(rf_dedup_journal_open(path, 0, &j), RF_OK);
    assert_int_equal(rf_dedup_journal_append(j, "run-1", 7, docs, 3, &s1), RF_OK);
    assert_int_equal(rf_dedup_journal_append(j, "run-2", 9, docs, 1, &s2), RF_OK);
    assert_true(s2 > s1);
    rf_dedup_journal_close(j);

    /* Reopened at the first record's size: the second is gone. */
    seen s = {0};
    assert_int_equal(rf_dedup_journal_open(path, s1, &j), RF_OK);
    assert_int_equal(rf_dedup_journal_replay(j, record, &s), RF_OK);
    assert_int_equal(s.calls, 1);
    assert_string_equal(s.last_run, "run-1");
    assert_int_equal(s.last_seq, 7);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.ids[1], "bb");
    assert_string_equal(s.ids[2], "");
    /* Appending after the truncation continues from there. */
    assert_int_equal(rf_dedup_journal_append(j, "run-3", 1, docs + 1, 2, &s2), RF_OK);
    rf_dedup_journal_close(j);
    memset(&s, 0, sizeof s);
    assert_int_equal(rf_dedup_journal_open(path, s2, &j), RF_OK);
    assert_int_equal(rf_dedup_journal_replay(j, record, &s), RF_OK);
    assert_int_equal(s.calls, 2);
    assert_string_equal(s.last_run, "run-3");
    assert_string_equal(s.ids[0], "bb");
    rf_dedup_journal_close(j);

    /* A journal shorter than the index says is not this index's. */
    assert_int_equal(rf_dedup_journal_open(path, s2 + 1, &j), RF_ERR_INVALID);
    /* A record cut short is reported, not read past. */
    assert_int_equal(truncate(path, (off_t)s2 - 1), 0);
    assert_int_equal(rf_dedup_journal_open(path, s2 - 1, &j), RF_OK);
    assert_int_equal(rf_dedup_journal_replay(j, record, &s), RF_ERR_CORRUPT);
    rf_dedup_journal_close(j);
    unlink(path);
    rmdir(dir);
}

/* The service's premise: an engine reopened on its index and fed the
 * committed documents' ids only (no text, as the journal replays them) gives
 * back every decision, cluster included. */
static void test_replay_by_ids(void **state) {
    enum { N = 400, B = 10 };
    static char texts[N][160], ids[N][16];
    rf_doc docs[N];
    rf_dd_result first[N], again[N];
    uint64_t x = 7;
    for (int i = 0; i < N; i++) {
        int src = i >= 40 && i % 3 == 0 ? i / 3 : i; /* copies of earlier documents */
        size_t len = 0;
        for (int w = 0; w < 20; w++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t word = src == i ? (x >> 33) % 5000 : 0;
            len += (size_t)snprintf(texts[i] + len, sizeof texts[i] - len, "%s%c%c%c", w ? " " : "",
                                    'a' + (int)(word % 26), 'a' + (int)(word / 26 % 26),
                                    'a' + (int)(word / 676 % 26));
        }
        if (src != i) {
            memcpy(texts[i], texts[src], sizeof texts[i]);
            if (i % 2) texts[i][0] = 'z'; /* a near copy */
        }
        snprintf(ids[i], sizeof ids[i], "d%d", i);
        docs[i] = (rf_doc){.id = ids[i], .text = texts[i], .text_len = strlen(texts[i])};
    }
    char dir[] = "/tmp/rf-ddr-XXXXXX";
    assert_non_null(mkdtemp(dir));
    rf_dedup_opts o;
    rf_dedup_opts_default(&o);
    rf_dedup *d;
    assert_int_equal(rf_dedup_open(&o, dir, &d), RF_OK);
    for (int i = 0; i < N; i += B) {
        assert_int_equal(rf_dedup_process(d, docs + i, B, first + i), RF_OK);
        assert_int_equal(rf_dedup_commit(d, 0, 0), RF_OK);
    }
    rf_dedup_close(d);
    assert_int_equal(rf_dedup_open(&o, dir, &d), RF_OK);
    int dups = 0;
    for (int i = 0; i < N; i += B) {
        rf_doc only_ids[B];
        for (int k = 0; k < B; k++)
            only_ids[k] = (rf_doc){.id = ids[i + k], .text = ""};
        assert_int_equal(rf_dedup_process(d, only_ids, B, again + i), RF_OK);
    }
    for (int i = 0; i < N; i++) {
        assert_true(again[i].replayed);
        assert_int_equal(again[i].kind, first[i].kind);
        assert_true(again[i].cluster == first[i].cluster);
        assert_true(first[i].cluster != 0);
        dups += first[i].kind != RF_DD_KEPT;
    }
    assert_true(dups > 50);
    rf_dd_results_clear(first, N);
    rf_dd_results_clear(again, N);
    rf_dedup_close(d);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static int tool_fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, rf_errmsg());
    return 1;
}

static int send_batch(rf_kafka_producer *p, const char *run, uint64_t seq,
                      Refinery__V1__Document **ptrs, size_t n) {
    Refinery__V1__DocumentBatch b = REFINERY__V1__DOCUMENT_BATCH__INIT;
    b.run_id = (char *)run;
    b.seq = seq;
    b.docs = ptrs;
    b.n_docs = n;
    size_t len = refinery__v1__document_batch__get_packed_size(&b);
    uint8_t *buf = malloc(len + 1);
    if (!buf) return RF_ERR_NOMEM;
    refinery__v1__document_batch__pack(&b, buf);
    int rc = rf_kafka_produce(p, "docs.clean", run, strlen(run), buf, len);
    free(buf);
    for (size_t i = 0; i < n; i++) {
        free(ptrs[i]->id);
        free(ptrs[i]->text);
        free(ptrs[i]);
    }
    return rc;
}

static int tool_produce(const char *bs, const char *run, const char *path, size_t batch) {
    FILE *f = fopen(path, "r");
    rf_kafka_opts po = {.bootstrap = bs};
    rf_kafka_producer *p;
    if (!f || rf_kafka_producer_new(&po, &p) < 0) return tool_fail("produce");
    Refinery__V1__Document **ptrs = calloc(batch, sizeof *ptrs);
    char *line = NULL;
    size_t cap = 0, n = 0;
    uint64_t seq = 0;
    ssize_t len;
    int rc = ptrs ? RF_OK : RF_ERR_NOMEM;
    while (!rc && (len = getline(&line, &cap, f)) > 0) {
        if (line[len - 1] == '\n') line[len - 1] = '\0';
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab = '\0';
        Refinery__V1__Document *d = malloc(sizeof *d);
        refinery__v1__document__init(d);
        d->id = strdup(line);
        d->text = strdup(tab + 1);
        d->label = -1;
        ptrs[n++] = d;
        if (n == batch) {
            rc = send_batch(p, run, seq++, ptrs, n);
            n = 0;
        }
    }
    if (!rc && n) rc = send_batch(p, run, seq++, ptrs, n);
    if (!rc) rc = rf_kafka_flush(p, 30);
    rf_kafka_producer_free(p);
    free(line);
    free(ptrs);
    fclose(f);
    if (rc) return tool_fail("produce");
    printf("batches=%llu\n", (unsigned long long)seq);
    return 0;
}

static int tool_collect(const char *bs, const char *run, int nbatch, long ndocs, const char *out) {
    const char *topics[] = {"docs.unique", "docs.duplicates"};
    char *got[2] = {calloc((size_t)nbatch, 1), calloc((size_t)nbatch, 1)};
    long docs[2] = {0, 0}, repeats = 0, bad = 0;
    int unique_batches = 0;
    rf_kafka_opts co = {.bootstrap = bs};
    rf_kafka_consumer *c;
    FILE *f = fopen(out, "w");
    if (!f || !got[0] || !got[1] || rf_kafka_consumer_new(&co, "collect", topics, 2, &c) < 0)
        return tool_fail("collect");
    double end = rf_now() + 60;
    while ((unique_batches < nbatch || docs[0] + docs[1] < ndocs) && rf_now() < end && !bad) {
        rf_kafka_batch b;
        if (rf_kafka_poll_batch(c, 100, 0.5, &b) < 0) return tool_fail("poll");
        for (size_t i = 0; i < b.n; i++) {
            int t = strcmp(b.msgs[i].topic, "docs.unique") != 0;
            Refinery__V1__DocumentBatch *db =
                refinery__v1__document_batch__unpack(NULL, b.msgs[i].len, b.msgs[i].value);
            if (db && strcmp(db->run_id, run)) {
                /* another run's */
            } else if (!db || db->seq >= (uint64_t)nbatch) {
                fprintf(stderr, "%s: not a batch of %s below %d\n", b.msgs[i].topic, run, nbatch);
                bad++;
            } else if (got[t][db->seq]++) {
                repeats++;
            } else {
                docs[t] += (long)db->n_docs;
                unique_batches += !t;
                for (size_t k = 0; k < db->n_docs; k++) {
                    if (db->docs[k]->cluster == 0) {
                        fprintf(stderr, "%s: %s/%llu: %s has no cluster\n", b.msgs[i].topic, run,
                                (unsigned long long)db->seq, db->docs[k]->id);
                        bad++;
                    }
                    if (!t) fprintf(f, "%s\n", db->docs[k]->id);
                }
            }
            if (db) refinery__v1__document_batch__free_unpacked(db, NULL);
        }
        rf_kafka_batch_release(&b);
    }
    rf_kafka_consumer_free(c);
    fclose(f);
    free(got[0]);
    free(got[1]);
    printf("unique_batches=%d kept=%ld duplicates=%ld repeats=%ld bad=%ld\n", unique_batches,
           docs[0], docs[1], repeats, bad);
    return !bad && unique_batches == nbatch && docs[0] + docs[1] == ndocs ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--produce"))
        return tool_produce(argv[2], argv[3], argv[4], (size_t)atoi(argv[5]));
    if (argc == 7 && !strcmp(argv[1], "--collect"))
        return tool_collect(argv[2], argv[3], atoi(argv[4]), atol(argv[5]), argv[6]);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_journal),
                                       cmocka_unit_test(test_replay_by_ids)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
