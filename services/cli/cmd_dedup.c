/* refinery dedup IN.jsonl --out KEPT.jsonl --dups DUPS.jsonl [options]:
 * removes exact and near duplicates from an ingest-format JSON Lines file.
 * With --index DIR the run is restartable: after a crash, the same command
 * continues from the last committed batch and the outputs end up identical to
 * an uninterrupted run (outputs are cut back to the sizes the index recorded). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/command.h"
#include "common/error.h"
#include "common/json.h"
#include "common/log.h"
#include "common/reader.h"
#include "common/stats.h"
#include "common/sys.h"
#include "dedup/dedup.h"
#include "dedup/index_log.h"
#include "dedup/minhash.h"
#include "dedup/normalize.h"
#include "dedup/planted.h"
#include "dedup/shingle.h"
#include "dedup/table.h"

#define MAX_LINE (64u << 20)
#define MAX_WARN 10

static void dedup_usage(FILE *out) {
    fprintf(out,
            "usage: refinery dedup IN.jsonl --out KEPT.jsonl --dups DUPS.jsonl [options]\n"
            "  --ngram N          shingle length in words (default 5)\n"
            "  --char             shingles of N code points instead of N words\n"
            "  --bands B --rows R LSH bands x rows = MinHash permutations (default 20 x 5)\n"
            "  --threshold T      Jaccard for a verified near duplicate (default 0.7)\n"
            "  --no-verify        accept every LSH candidate without checking Jaccard\n"
            "  --set-cap N        shingles kept per document for verification (default 2048)\n"
            "  --norm SPEC        case,punct,space,digits | all | none (default all)\n"
            "  --index DIR        persistent index: reruns continue where a run stopped\n"
            "  --threads N        worker threads (default: CPUs); output does not depend on it\n"
            "  --batch N          documents per committed batch (default 1024)\n"
            "  --stats FILE       counters, cluster-size histogram and timing as JSON\n");
}

typedef struct dd_cli {
    const char *in, *out, *dups, *index, *stats;
    int batch;
    rf_dedup_opts o;
} dd_cli;

static int parse_int(const char *opt, const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "refinery dedup: %s '%s': expected an integer in [%d, %d]\n", opt, s, lo,
                hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_real(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (*end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "refinery dedup: %s '%s': expected a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Options shared by dedup and dedup-eval (the engine's), as getopt codes. */
#define ENGINE_LONGOPTS                                                                            \
    {"ngram", required_argument, NULL, 'n'}, {"char", no_argument, NULL, 'C'},                     \
        {"bands", required_argument, NULL, 'b'}, {"rows", required_argument, NULL, 'r'},           \
        {"threshold", required_argument, NULL, 'T'}, {"no-verify", no_argument, NULL, 'V'},        \
        {"set-cap", required_argument, NULL, 'S'}, {"norm", required_argument, NULL, 'N'}, {       \
        "threads", required_argument, NULL, 't'                                                    \
    }

/* 1 if opt was an engine option (0 not one, -1 bad value). */
static int engine_opt(int opt, const char *arg, rf_dedup_opts *o) {
    switch (opt) {
    case 'n':
        return parse_int("--ngram", arg, 1, 64, &o->ngram) ? -1 : 1;
    case 'C':
        o->char_mode = true;
        return 1;
    case 'b':
        return parse_int("--bands", arg, 1, RF_MINHASH_MAX_PERM, &o->bands) ? -1 : 1;
    case 'r':
        return parse_int("--rows", arg, 1, RF_MINHASH_MAX_PERM, &o->rows) ? -1 : 1;
    case 'T':
        return parse_real("--threshold", arg, 1e-9, 1, &o->threshold) ? -1 : 1;
    case 'V':
        o->verify = false;
        return 1;
    case 'S':
        return parse_int("--set-cap", arg, 16, 1 << 20, &o->set_cap) ? -1 : 1;
    case 't':
        return parse_int("--threads", arg, 1, 256, &o->threads) ? -1 : 1;
    case 'N':
        if (!rf_norm_parse(arg, &o->norm)) return 1;
        fprintf(stderr, "refinery dedup: --norm: %s\n", rf_errmsg());
        return -1;
    default:
        return 0;
    }
}

static int parse_args(int argc, char **argv, dd_cli *c) {
    static const struct option longopts[] = {ENGINE_LONGOPTS,
                                             {"out", required_argument, NULL, 'o'},
                                             {"dups", required_argument, NULL, 'd'},
                                             {"index", required_argument, NULL, 'i'},
                                             {"batch", required_argument, NULL, 'B'},
                                             {"stats", required_argument, NULL, 's'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    memset(c, 0, sizeof *c);
    rf_dedup_opts_default(&c->o);
    c->o.threads = rf_ncpu();
    c->batch = 1024;
    int opt, rc = 0;
    optind = 1;
    while (!rc && (opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int e = engine_opt(opt, optarg, &c->o);
        if (e) {
            rc = e < 0;
            continue;
        }
        switch (opt) {
        case 'o':
            c->out = optarg;
            break;
        case 'd':
            c->dups = optarg;
            break;
        case 'i':
            c->index = optarg;
            break;
        case 'B':
            rc = parse_int("--batch", optarg, 1, 1 << 20, &c->batch);
            break;
        case 's':
            c->stats = optarg;
            break;
        case 'h':
            dedup_usage(stdout);
            return 1;
        default:
            rc = -1;
        }
    }
    if (rc) return -1;
    if (optind != argc - 1 || !c->out || !c->dups) {
        fprintf(stderr, "refinery dedup: need IN.jsonl, --out and --dups\n");
        return -1;
    }
    c->in = argv[optind];
    if (rf_dedup_opts_check(&c->o)) {
        fprintf(stderr, "refinery dedup: %s\n", rf_errmsg());
        return -1;
    }
    return 0;
}

/* Opens an output for appending after cutting it back to `size`, the length
 * the index committed (0 for a new index). */
static int open_output(const char *path, uint64_t size, FILE **out) {
    FILE *f = fopen(path, size ? "r+b" : "wb");
    if (!f) return rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || (uint64_t)st.st_size < size) {
        fclose(f);
        return rf_fail(RF_ERR_INVALID,
                       "%s has %lld bytes but the index committed %llu: it was changed since, "
                       "so the run cannot continue (remove the index to start over)",
                       path, (long long)st.st_size, (unsigned long long)size);
    }
    if (ftruncate(fileno(f), (off_t)size) != 0 || fseeko(f, (off_t)size, SEEK_SET) != 0) {
        fclose(f);
        return rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
    }
    *out = f;
    return RF_OK;
}

static int sync_output(FILE *f, const char *path, uint64_t *size) {
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        return rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
    *size = (uint64_t)ftello(f);
    return RF_OK;
}

typedef struct dd_run {
    dd_cli *c;
    rf_dedup *d;
    FILE *kept, *dups;
    rf_stats *stats;
    rf_doc *docs;
    rf_dd_result *res;
    size_t n;
    uint64_t done;     /* documents decided by this process */
    uint64_t crash_at; /* test hook: REFINERY_DEDUP_CRASH_AFTER */
    rf_buf line;
} dd_run;

/* Decides the buffered batch, writes its lines, makes them durable, then
 * commits the index with the new output sizes. */
static int flush_batch(dd_run *r) {
    if (!r->n) return RF_OK;
    int rc = rf_dedup_process(r->d, r->docs, r->n, r->res);
    for (size_t i = 0; !rc && i < r->n; i++) {
        if (r->res[i].replayed) continue;
        rf_buf_reset(&r->line);
        FILE *f = r->res[i].kind == RF_DD_KEPT ? r->kept : r->dups;
        if (r->res[i].kind == RF_DD_KEPT) {
            r->docs[i].cluster = r->res[i].cluster;
            rc = rf_doc_to_json(&r->docs[i], &r->line);
        } else {
            rc = rf_dd_dup_json(&r->docs[i], &r->res[i], &r->line);
        }
        if (!rc) rc = rf_buf_putc(&r->line, '\n');
        if (!rc && fwrite(r->line.data, 1, r->line.len, f) != r->line.len)
            rc = rf_fail(RF_ERR_IO, "write: %s", strerror(errno));
        r->done++;
    }
    uint64_t kept_size = 0, dups_size = 0;
    if (!rc) rc = sync_output(r->kept, r->c->out, &kept_size);
    if (!rc) rc = sync_output(r->dups, r->c->dups, &dups_size);
    /* Crash injection for the restart test: outputs are ahead of the index here. */
    if (!rc && r->crash_at && r->done >= r->crash_at) raise(SIGKILL);
    if (!rc) rc = rf_dedup_commit(r->d, kept_size, dups_size);
    rf_dd_results_clear(r->res, r->n);
    for (size_t i = 0; i < r->n; i++)
        rf_doc_clear(&r->docs[i]);
    r->n = 0;
    return rc;
}

static void reject(dd_run *r, const char *why, const rf_line *ln, const char *detail) {
    char name[64];
    snprintf(name, sizeof name, "dedup.rejected.%s", why);
    rf_stats_add(r->stats, name, 1);
    if (rf_stats_sum_prefix(r->stats, "dedup.rejected.") <= MAX_WARN)
        rf_warn("dedup", "%s:%llu: skipped (%s): %s", r->c->in, (unsigned long long)ln->lineno, why,
                detail);
}

static int read_input(dd_run *r, uint64_t *bytes) {
    rf_reader *rd;
    int rc = rf_reader_open(r->c->in, MAX_LINE, &rd);
    if (rc) return rc;
    rf_json_doc *jd = rf_json_doc_new();
    if (!jd) {
        rf_reader_close(rd);
        return RF_ERR_NOMEM;
    }
    rf_line ln;
    int got;
    while (!rc && (got = rf_reader_next(rd, &ln)) == 1) {
        size_t len = ln.len;
        while (len && (ln.data[len - 1] == '\r' || ln.data[len - 1] == ' '))
            len--;
        if (!len) {
            rf_stats_add(r->stats, "dedup.skipped_blank_lines", 1);
            continue;
        }
        if (ln.too_long) {
            reject(r, "too_long", &ln, "line longer than 64 MiB");
            continue;
        }
        const rf_json *root;
        if (rf_json_parse(jd, ln.data, len, &root)) {
            reject(r, "invalid_json", &ln, rf_errmsg());
            continue;
        }
        rf_doc *doc = &r->docs[r->n];
        if (rf_doc_from_json(root, doc)) {
            reject(r, "invalid_doc", &ln, rf_errmsg());
            rf_doc_clear(doc);
            continue;
        }
        if (++r->n == (size_t)r->c->batch) rc = flush_batch(r);
    }
    if (!rc && got < 0) rc = got;
    if (!rc) rc = flush_batch(r);
    *bytes = rf_reader_bytes_out(rd);
    rf_json_doc_free(jd);
    rf_reader_close(rd);
    return rc;
}

static int write_stats(dd_run *r, double secs, uint64_t bytes) {
    int rc = rf_dedup_report(r->d, r->stats, "dedup.");
    rf_stats_set(r->stats, "dedup.threads", r->c->o.threads);
    rf_stats_set(r->stats, "dedup.this_run.docs", (int64_t)r->done);
    rf_stats_set_real(r->stats, "dedup.this_run.seconds", secs);
    rf_stats_set_real(r->stats, "dedup.this_run.docs_per_s", secs > 0 ? (double)r->done / secs : 0);
    rf_stats_set_real(r->stats, "dedup.this_run.input_mb_per_s",
                      secs > 0 ? (double)bytes / 1e6 / secs : 0);
    rf_stats_set(r->stats, "dedup.peak_rss_kb", rf_peak_rss_kb());
    rf_stats_set_real(r->stats, "dedup.config.threshold", r->c->o.threshold);
    rf_stats_set(r->stats, "dedup.config.bands", r->c->o.bands);
    rf_stats_set(r->stats, "dedup.config.rows", r->c->o.rows);
    rf_stats_set(r->stats, "dedup.config.ngram", r->c->o.ngram);
    rf_stats_set(r->stats, "dedup.config.verify", r->c->o.verify);
    if (rc || !r->c->stats) return rc;
    rf_buf b = RF_BUF_INIT;
    rc = rf_stats_to_json(r->stats, &b);
    if (!rc) rc = rf_buf_putc(&b, '\n');
    if (!rc) rc = rf_write_file_atomic(r->c->stats, b.data, b.len);
    rf_buf_free(&b);
    return rc;
}

static void remove_index(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, RF_DDLOG_FILE);
    unlink(path);
    rmdir(dir);
}

static int cmd_dedup(int argc, char **argv) {
    dd_cli c;
    int prc = parse_args(argc, argv, &c);
    if (prc > 0) return 0;
    if (prc < 0) {
        dedup_usage(stderr);
        return 2;
    }
    char tmp_index[] = "/tmp/refinery-dedup-XXXXXX";
    const char *index = c.index;
    if (!index && !(index = mkdtemp(tmp_index))) {
        fprintf(stderr, "refinery dedup: temporary index: %s\n", strerror(errno));
        return 1;
    }
    dd_run r = {.c = &c, .line = RF_BUF_INIT};
    const char *crash = getenv("REFINERY_DEDUP_CRASH_AFTER");
    r.crash_at = crash ? strtoull(crash, NULL, 10) : 0;
    double t0 = rf_now();
    uint64_t bytes = 0, kept_size, dups_size;
    int rc = rf_dedup_open(&c.o, index, &r.d);
    if (!rc) {
        rf_dedup_out_sizes(r.d, &kept_size, &dups_size);
        if (rf_dedup_committed(r.d))
            rf_info("dedup", "%s: continuing after %llu committed documents", index,
                    (unsigned long long)rf_dedup_committed(r.d));
        rc = open_output(c.out, kept_size, &r.kept);
        if (!rc) rc = open_output(c.dups, dups_size, &r.dups);
    }
    if (!rc) {
        r.stats = rf_stats_new();
        r.docs = calloc((size_t)c.batch, sizeof *r.docs);
        r.res = calloc((size_t)c.batch, sizeof *r.res);
        if (!r.stats || !r.docs || !r.res) rc = RF_ERR_NOMEM;
    }
    if (!rc) rc = read_input(&r, &bytes);
    if (!rc) rc = write_stats(&r, rf_now() - t0, bytes);
    if (!rc)
        fprintf(
            stderr,
            "dedup: %lld docs: %lld kept, %lld exact, %lld near duplicates (%lld rejected lines)\n",
            (long long)rf_stats_get(r.stats, "dedup.docs"),
            (long long)rf_stats_get(r.stats, "dedup.kept"),
            (long long)rf_stats_get(r.stats, "dedup.exact"),
            (long long)rf_stats_get(r.stats, "dedup.near"),
            (long long)rf_stats_sum_prefix(r.stats, "dedup.rejected."));
    else
        fprintf(stderr, "refinery dedup: %s\n", rf_errmsg()[0] ? rf_errmsg() : rf_err_name(rc));
    if (r.res) rf_dd_results_clear(r.res, (size_t)c.batch);
    if (r.docs)
        for (size_t i = 0; i < (size_t)c.batch; i++)
            rf_doc_clear(&r.docs[i]);
    free(r.docs);
    free(r.res);
    rf_buf_free(&r.line);
    rf_stats_free(r.stats);
    if (r.kept) fclose(r.kept);
    if (r.dups) fclose(r.dups);
    rf_dedup_close(r.d);
    if (!c.index) remove_index(index);
    return rc ? 1 : 0;
}

static const rf_command dedup_cmd = {
    "dedup", "remove exact and near-duplicate documents (MinHash LSH)", cmd_dedup};
RF_COMMAND(dedup_cmd)

/* ---- refinery dedup-eval: the planted near-duplicate benchmark ---- */

static void eval_usage(FILE *out) {
    fprintf(
        out,
        "usage: refinery dedup-eval CORPUS.jsonl... [--originals N] [--copies V]\n"
        "         [--max-rate R] [--min-words W] [--random-pairs N] [--seed S] [engine options]\n"
        "Plants edited copies (swaps, insertions, deletions, typos, truncation) of real\n"
        "documents, deduplicates originals and copies as one shuffled stream, and prints\n"
        "precision/recall/F1 against exact Jaccard >= threshold and the measured LSH\n"
        "S-curve against 1-(1-s^r)^b, as JSON. Engine options are those of `dedup`.\n");
}

/* Appends the text of every valid document of path to texts. */
static int load_texts(const char *path, char ***texts, size_t *n, size_t *cap) {
    rf_reader *rd;
    int rc = rf_reader_open(path, MAX_LINE, &rd);
    if (rc) return rc;
    rf_json_doc *jd = rf_json_doc_new();
    rf_line ln;
    int got;
    while (!rc && jd && (got = rf_reader_next(rd, &ln)) == 1) {
        const rf_json *root;
        rf_doc doc;
        if (ln.too_long || rf_json_parse(jd, ln.data, ln.len, &root)) continue;
        if (rf_doc_from_json(root, &doc)) {
            rf_doc_clear(&doc);
            continue;
        }
        if (*n == *cap) {
            size_t nc = *cap ? 2 * *cap : 1024;
            char **t = realloc(*texts, nc * sizeof *t);
            if (!t) {
                rf_doc_clear(&doc);
                rc = RF_ERR_NOMEM;
                break;
            }
            *texts = t;
            *cap = nc;
        }
        (*texts)[(*n)++] = doc.text;
        doc.text = NULL;
        rf_doc_clear(&doc);
    }
    if (!jd)
        rc = RF_ERR_NOMEM;
    else if (!rc && got < 0)
        rc = got;
    rf_json_doc_free(jd);
    rf_reader_close(rd);
    return rc;
}

static int cmd_dedup_eval(int argc, char **argv) {
    static const struct option longopts[] = {ENGINE_LONGOPTS,
                                             {"originals", required_argument, NULL, 'O'},
                                             {"copies", required_argument, NULL, 'v'},
                                             {"max-rate", required_argument, NULL, 'R'},
                                             {"min-words", required_argument, NULL, 'w'},
                                             {"random-pairs", required_argument, NULL, 'P'},
                                             {"seed", required_argument, NULL, 'e'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    rf_dedup_opts o;
    rf_dedup_opts_default(&o);
    o.threads = rf_ncpu();
    rf_planted_opts po;
    rf_planted_opts_default(&po);
    int opt, bad = 0, v;
    optind = 1;
    while (!bad && (opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int e = engine_opt(opt, optarg, &o);
        if (e) {
            bad = e < 0;
            continue;
        }
        switch (opt) {
        case 'O':
            bad = parse_int("--originals", optarg, 2, 1 << 24, &v);
            po.max_base = (size_t)v;
            break;
        case 'v':
            bad = parse_int("--copies", optarg, 1, 64, &po.variants);
            break;
        case 'R':
            bad = parse_real("--max-rate", optarg, 0, 1, &po.max_rate);
            break;
        case 'w':
            bad = parse_int("--min-words", optarg, 1, 100000, &po.min_words);
            break;
        case 'P':
            bad = parse_int("--random-pairs", optarg, 0, 1 << 26, &v);
            po.random_pairs = (size_t)v;
            break;
        case 'e':
            bad = parse_int("--seed", optarg, 0, 1 << 30, &v);
            po.seed = (uint64_t)v;
            break;
        case 'h':
            eval_usage(stdout);
            return 0;
        default:
            bad = 1;
        }
    }
    if (bad || optind >= argc || rf_dedup_opts_check(&o)) {
        if (!bad && optind < argc) fprintf(stderr, "refinery dedup-eval: %s\n", rf_errmsg());
        eval_usage(stderr);
        return 2;
    }
    char **texts = NULL;
    size_t n = 0, cap = 0;
    int rc = RF_OK;
    for (int i = optind; i < argc && !rc; i++)
        rc = load_texts(argv[i], &texts, &n, &cap);
    char tmp_index[] = "/tmp/refinery-dedup-eval-XXXXXX";
    rf_planted_report rep;
    rf_buf out = RF_BUF_INIT;
    if (!rc && !mkdtemp(tmp_index))
        rc = rf_fail(RF_ERR_IO, "temporary index: %s", strerror(errno));
    else if (!rc) {
        rc = rf_planted_run(&o, &po, texts, n, tmp_index, &rep);
        remove_index(tmp_index);
    }
    if (!rc) rc = rf_planted_json(&rep, &o, &out);
    if (!rc)
        printf("%s\n", out.data);
    else
        fprintf(stderr, "refinery dedup-eval: %s\n",
                rf_errmsg()[0] ? rf_errmsg() : rf_err_name(rc));
    for (size_t i = 0; i < n; i++)
        free(texts[i]);
    free(texts);
    rf_buf_free(&out);
    return rc ? 1 : 0;
}

static const rf_command dedup_eval_cmd = {
    "dedup-eval", "planted near-duplicate benchmark: F1 and the LSH S-curve", cmd_dedup_eval};
RF_COMMAND(dedup_eval_cmd)

/* ---- refinery dedup-speed: signature throughput on one core ---- */

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void speed_usage(FILE *out) {
    fprintf(out, "usage: refinery dedup-speed IN.jsonl... [engine options]\n"
                 "Times, on one thread, text -> signature (normalize, shingle, MinHash, band\n"
                 "keys) and MinHash alone on prepared shingles; prints JSON with CPU seconds.\n");
}

static int cmd_dedup_speed(int argc, char **argv) {
    static const struct option longopts[] = {
        ENGINE_LONGOPTS, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    rf_dedup_opts o;
    rf_dedup_opts_default(&o);
    int opt, bad = 0;
    optind = 1;
    while (!bad && (opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int e = engine_opt(opt, optarg, &o);
        if (opt == 'h') {
            speed_usage(stdout);
            return 0;
        }
        bad = e <= 0;
    }
    if (bad || optind >= argc) {
        speed_usage(stderr);
        return 2;
    }
    char **texts = NULL;
    size_t n = 0, cap = 0, bytes = 0, nsh = 0;
    int rc = RF_OK;
    for (int i = optind; i < argc && !rc; i++)
        rc = load_texts(argv[i], &texts, &n, &cap);
    rf_minhash mh;
    if (!rc) rc = rf_minhash_init(&mh, o.bands, o.rows, o.seed);
    if (rc) {
        fprintf(stderr, "refinery dedup-speed: %s\n", rf_errmsg());
        for (size_t i = 0; i < n; i++)
            free(texts[i]);
        free(texts);
        return 1;
    }
    rf_buf norm = RF_BUF_INIT;
    rf_u64vec sh = {0};
    rf_u64vec *all = calloc(n ? n : 1, sizeof *all);
    uint64_t *bkeys = malloc((n ? n : 1) * (size_t)o.bands * sizeof *bkeys);
    uint32_t sig[RF_MINHASH_MAX_PERM];
    uint64_t keys[RF_MINHASH_MAX_PERM], sink = 0;
    double w0 = rf_now(), c0 = cpu_now();
    for (size_t i = 0; i < n && !rc; i++) {
        size_t len = strlen(texts[i]);
        bytes += len;
        rc = rf_normalize(texts[i], len, o.norm, &norm);
        if (!rc) rc = rf_shingle(norm.data, norm.len, o.ngram, o.char_mode, &sh);
        if (rc) break;
        rf_minhash_sign(&mh, sh.v, sh.n, sig);
        rf_minhash_band_keys(&mh, sig, bkeys ? bkeys + i * (size_t)o.bands : keys);
        sink ^= sig[0];
    }
    double text_cpu = cpu_now() - c0, text_wall = rf_now() - w0;
    /* The band index alone: per document, query its band keys, then insert them. */
    rf_band_table bt = {0};
    c0 = cpu_now();
    for (size_t i = 0; i < n && !rc && bkeys; i++) {
        const uint64_t *k = bkeys + i * (size_t)o.bands;
        for (int j = 0; j < o.bands; j++)
            sink ^= rf_band_table_get(&bt, k[j]);
        for (int j = 0; j < o.bands && !rc; j++)
            rc = rf_band_table_put_new(&bt, k[j], (uint32_t)i);
    }
    double index_cpu = cpu_now() - c0;
    size_t index_bytes = rf_band_table_bytes(&bt);
    rf_band_table_free(&bt);
    for (size_t i = 0; i < n && !rc && all; i++) {
        rc = rf_normalize(texts[i], strlen(texts[i]), o.norm, &norm);
        if (!rc) rc = rf_shingle(norm.data, norm.len, o.ngram, o.char_mode, &all[i]);
        nsh += all[i].n;
    }
    /* MinHash alone is fast: repeat passes for at least half a CPU second. */
    int passes = 0;
    w0 = rf_now();
    c0 = cpu_now();
    while (!rc && all && (passes == 0 || cpu_now() - c0 < 0.5)) {
        for (size_t i = 0; i < n; i++) {
            rf_minhash_sign(&mh, all[i].v, all[i].n, sig);
            sink ^= sig[0];
        }
        passes++;
    }
    double sign_cpu = (cpu_now() - c0) / (passes ? passes : 1),
           sign_wall = (rf_now() - w0) / (passes ? passes : 1);
    if (!all || !bkeys) rc = RF_ERR_NOMEM;
    if (!rc)
        printf("{\"impl\":\"refinery\",\"docs\":%zu,\"bytes\":%zu,\"shingles\":%zu,\"perm\":%d,"
               "\"text_to_sig\":{\"cpu_seconds\":%.4f,\"wall_seconds\":%.4f,\"docs_per_s\":%.1f,"
               "\"mb_per_s\":%.2f},\"sign_only\":{\"cpu_seconds\":%.4f,\"wall_seconds\":%.4f,"
               "\"docs_per_s\":%.1f,\"passes\":%d},\"band_index\":{\"cpu_seconds\":%.4f,"
               "\"docs_per_s\":%.1f,\"keys_per_s\":%.1f,\"bytes_per_doc\":%.1f},"
               "\"checksum\":%llu}\n",
               n, bytes, nsh, mh.nperm, text_cpu, text_wall, (double)n / text_cpu,
               (double)bytes / 1e6 / text_cpu, sign_cpu, sign_wall, (double)n / sign_cpu, passes,
               index_cpu, (double)n / index_cpu, 2.0 * (double)n * o.bands / index_cpu,
               (double)index_bytes / (double)(n ? n : 1), (unsigned long long)(sink & 0xffff));
    else
        fprintf(stderr, "refinery dedup-speed: %s\n", rf_errmsg());
    for (size_t i = 0; i < n; i++) {
        free(texts[i]);
        if (all) rf_u64vec_free(&all[i]);
    }
    free(all);
    free(bkeys);
    free(texts);
    rf_buf_free(&norm);
    rf_u64vec_free(&sh);
    rf_minhash_free(&mh);
    return rc ? 1 : 0;
}

static const rf_command dedup_speed_cmd = {
    "dedup-speed", "MinHash signature throughput on one core (for make bench)", cmd_dedup_speed};
RF_COMMAND(dedup_speed_cmd)
