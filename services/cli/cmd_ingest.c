/* `refinery ingest`: the ingest stage on files, outside a pipeline run.
 * Every flag sets a key of the `ingest:` section (services/ingest/README.md), so
 * the command line, a --config spec and REFINERY__INGEST__* variables mean the
 * same thing. Outputs are written to temporary files and renamed at the end:
 * a failed run leaves no half-written output behind. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/command.h"
#include "common/config.h"
#include "common/error.h"
#include "common/stats.h"
#include "common/sys.h"
#include "ingest/ingest.h"

static volatile int canceled;

static void on_signal(int sig) {
    (void)sig;
    canceled = 1;
}

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: refinery ingest [--preset amazon|sst2|wikitext|sft] [--format jsonl|csv|tsv|text]\n"
        "                       INPUT... --out OUT.jsonl --rejects REJECTS.jsonl\n"
        "                       [--stats STATS.json] [--threads N] [options]\n"
        "\n"
        "Reads JSON Lines, CSV/TSV or text (plain, .gz or .zst), cleans and filters each\n"
        "record and writes kept documents to OUT and refused ones, with the reason, to\n"
        "REJECTS. Every record ends in exactly one of the two.\n"
        "\n"
        "mapping:   --text-field A[,B]  --label-field F  --id-field F  --label-map 1-2:0,3-5:1\n"
        "           --header | --no-header  --columns A,B,C  --quote CHAR|none  --paragraphs\n"
        "           --[no-]join-skip-contained (drop a text field contained in another)\n"
        "cleaning:  --lowercase  --html  --utf8 repair|reject\n"
        "filters:   --min-words N  --max-words N  --no-quality  --lang en[,de]\n"
        "           --lang-min-percent N\n"
        "augment:   --augment N (copies per document)  --seed S\n"
        "other:     --max-line BYTES  --config SPEC.yaml (its ingest: section)\n"
        "           --set KEY=VALUE (any ingest key, e.g. quality.max_symbol_ratio=0.2)\n");
}

enum {
    OPT_OUT = 256,
    OPT_REJECTS,
    OPT_STATS,
    OPT_THREADS,
    OPT_PRESET,
    OPT_FORMAT,
    OPT_TEXT,
    OPT_SKIP_CONTAINED,
    OPT_NO_SKIP_CONTAINED,
    OPT_LABEL,
    OPT_ID,
    OPT_LABEL_MAP,
    OPT_HEADER,
    OPT_NO_HEADER,
    OPT_COLUMNS,
    OPT_QUOTE,
    OPT_PARAGRAPHS,
    OPT_LOWERCASE,
    OPT_HTML,
    OPT_UTF8,
    OPT_MIN_WORDS,
    OPT_MAX_WORDS,
    OPT_NO_QUALITY,
    OPT_LANG,
    OPT_LANG_PCT,
    OPT_AUGMENT,
    OPT_SEED,
    OPT_MAX_LINE,
    OPT_CONFIG,
    OPT_SET,
    OPT_HELP,
};

static const struct option long_opts[] = {
    {"out", required_argument, 0, OPT_OUT},
    {"rejects", required_argument, 0, OPT_REJECTS},
    {"stats", required_argument, 0, OPT_STATS},
    {"threads", required_argument, 0, OPT_THREADS},
    {"preset", required_argument, 0, OPT_PRESET},
    {"format", required_argument, 0, OPT_FORMAT},
    {"text-field", required_argument, 0, OPT_TEXT},
    {"join-skip-contained", no_argument, 0, OPT_SKIP_CONTAINED},
    {"no-join-skip-contained", no_argument, 0, OPT_NO_SKIP_CONTAINED},
    {"label-field", required_argument, 0, OPT_LABEL},
    {"id-field", required_argument, 0, OPT_ID},
    {"label-map", required_argument, 0, OPT_LABEL_MAP},
    {"header", no_argument, 0, OPT_HEADER},
    {"no-header", no_argument, 0, OPT_NO_HEADER},
    {"columns", required_argument, 0, OPT_COLUMNS},
    {"quote", required_argument, 0, OPT_QUOTE},
    {"paragraphs", no_argument, 0, OPT_PARAGRAPHS},
    {"lowercase", no_argument, 0, OPT_LOWERCASE},
    {"html", no_argument, 0, OPT_HTML},
    {"utf8", required_argument, 0, OPT_UTF8},
    {"min-words", required_argument, 0, OPT_MIN_WORDS},
    {"max-words", required_argument, 0, OPT_MAX_WORDS},
    {"no-quality", no_argument, 0, OPT_NO_QUALITY},
    {"lang", required_argument, 0, OPT_LANG},
    {"lang-min-percent", required_argument, 0, OPT_LANG_PCT},
    {"augment", required_argument, 0, OPT_AUGMENT},
    {"seed", required_argument, 0, OPT_SEED},
    {"max-line", required_argument, 0, OPT_MAX_LINE},
    {"config", required_argument, 0, OPT_CONFIG},
    {"set", required_argument, 0, OPT_SET},
    {"help", no_argument, 0, OPT_HELP},
    {0, 0, 0, 0},
};

/* The ingest key each simple flag sets (value = the flag's argument or fixed). */
static const struct {
    int opt;
    const char *key;
    const char *fixed;
} flag_keys[] = {
    {OPT_THREADS, "threads", NULL},
    {OPT_PRESET, "preset", NULL},
    {OPT_FORMAT, "format", NULL},
    {OPT_TEXT, "text_fields", NULL},
    {OPT_SKIP_CONTAINED, "text_join_skip_contained", "true"},
    {OPT_NO_SKIP_CONTAINED, "text_join_skip_contained", "false"},
    {OPT_LABEL, "label_field", NULL},
    {OPT_ID, "id_field", NULL},
    {OPT_LABEL_MAP, "label_map", NULL},
    {OPT_HEADER, "header", "true"},
    {OPT_NO_HEADER, "header", "false"},
    {OPT_COLUMNS, "columns", NULL},
    {OPT_QUOTE, "quote", NULL},
    {OPT_PARAGRAPHS, "paragraphs", "true"},
    {OPT_LOWERCASE, "clean.lowercase", "true"},
    {OPT_HTML, "clean.html_unescape", "true"},
    {OPT_HTML, "clean.strip_tags", "true"},
    {OPT_UTF8, "clean.utf8", NULL},
    {OPT_MIN_WORDS, "quality.min_words", NULL},
    {OPT_MAX_WORDS, "quality.max_words", NULL},
    {OPT_NO_QUALITY, "quality_filter", "false"},
    {OPT_LANG, "language.expected", NULL},
    {OPT_LANG_PCT, "language.min_percent", NULL},
    {OPT_AUGMENT, "augment.n_aug", NULL},
    {OPT_AUGMENT, "augment.enabled", "true"},
    {OPT_SEED, "augment.seed", NULL},
    {OPT_MAX_LINE, "max_line", NULL},
};

static int set_key(rf_cfg *root, const char *key, const char *value) {
    char dotted[256];
    snprintf(dotted, sizeof dotted, "ingest.%s", key);
    return rf_cfg_set(root, dotted, value);
}

/* Flags are applied after the spec is loaded, in a second pass. */
static int apply_flags(rf_cfg *root, int argc, char **argv) {
    optind = 0; /* full re-initialisation of GNU getopt, argv was permuted */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
        int rc = 0;
        if (c == OPT_SET) {
            char *eq = strchr(optarg, '=');
            if (!eq) return rf_fail(RF_ERR_INVALID, "--set expects KEY=VALUE, got '%s'", optarg);
            *eq = '\0';
            rc = set_key(root, optarg, eq + 1);
            *eq = '=';
        }
        for (size_t i = 0; i < sizeof(flag_keys) / sizeof(flag_keys[0]) && !rc; i++)
            if (flag_keys[i].opt == c)
                rc = set_key(root, flag_keys[i].key,
                             flag_keys[i].fixed ? flag_keys[i].fixed : optarg);
        if (rc) return rc;
    }
    return 0;
}

static FILE *open_tmp(const char *path, char **tmp) {
    if (asprintf(tmp, "%s.tmp.%d", path, (int)getpid()) < 0) {
        *tmp = NULL;
        return NULL;
    }
    FILE *f = fopen(*tmp, "wb");
    if (f)
        setvbuf(f, NULL, _IOFBF, 1 << 20);
    else
        fprintf(stderr, "refinery ingest: cannot create %s\n", *tmp);
    return f;
}

/* Closes f and renames tmp to path when ok, else removes tmp. */
static int finish_file(FILE *f, char *tmp, const char *path, bool ok) {
    int rc = 0;
    if (f && fclose(f) != 0) rc = rf_fail(RF_ERR_IO, "writing %s failed", path);
    if (tmp) {
        if (ok && !rc && rename(tmp, path) != 0)
            rc = rf_fail(RF_ERR_IO, "cannot rename %s to %s", tmp, path);
        if (!ok || rc) unlink(tmp);
        free(tmp);
    }
    return rc;
}

static void summary(const rf_stats *st, double seconds) {
    double mb = (double)rf_stats_get(st, "ingest.bytes_in") / 1e6;
    double docs = (double)rf_stats_get(st, "ingest.records_in");
    fprintf(stderr,
            "ingest: %lld records in, %lld kept, %lld rejected, %lld augmented copies; "
            "%.1f MB in %.2fs (%.1f MB/s, %.0f docs/s), peak RSS %lld MB\n",
            (long long)rf_stats_get(st, "ingest.records_in"),
            (long long)rf_stats_get(st, "ingest.kept"),
            (long long)rf_stats_get(st, "ingest.rejected_total"),
            (long long)rf_stats_get(st, "ingest.augmented"), mb, seconds,
            seconds > 0 ? mb / seconds : 0, seconds > 0 ? docs / seconds : 0,
            (long long)rf_peak_rss_kb() / 1024);
}

static int cmd_ingest(int argc, char **argv) {
    const char *out = NULL, *rejects = NULL, *stats_path = NULL, *config = NULL;
    int c;
    opterr = 1;
    while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
        switch (c) {
        case OPT_OUT:
            out = optarg;
            break;
        case OPT_REJECTS:
            rejects = optarg;
            break;
        case OPT_STATS:
            stats_path = optarg;
            break;
        case OPT_CONFIG:
            config = optarg;
            break;
        case OPT_HELP:
            usage(stdout);
            return 0;
        case '?':
            usage(stderr);
            return 2;
        default:
            break;
        }
    }
    const char **inputs = (const char **)argv + optind;
    size_t n_inputs = (size_t)(argc - optind);
    if (!out || !rejects) {
        fprintf(stderr, "refinery ingest: --out and --rejects are required\n\n");
        usage(stderr);
        return 2;
    }

    rf_cfg *root = NULL;
    int rc =
        config ? rf_cfg_load_file(config, &root) : rf_cfg_load_string("", 0, "command line", &root);
    if (!rc) rc = rf_cfg_apply_env(root);
    if (!rc) rc = apply_flags(root, argc, argv);
    rf_ingest_opts opts;
    rf_ingest_opts_default(&opts);
    const rf_cfg *section = root ? rf_cfg_get(root, "ingest") : NULL;
    if (!rc) rc = rf_ingest_opts_from_cfg(section, &opts);
    const char **spec_inputs = NULL;
    if (!rc && n_inputs == 0) {
        rc = rf_cfg_strlist(section, "inputs", &spec_inputs, &n_inputs);
        inputs = spec_inputs;
    }
    if (rc) {
        fprintf(stderr, "refinery ingest: %s\n", rf_errmsg());
        free(spec_inputs);
        rf_ingest_opts_free(&opts);
        rf_cfg_free(root);
        return 2;
    }
    if (n_inputs == 0) {
        fprintf(stderr, "refinery ingest: no INPUT files\n\n");
        usage(stderr);
        rf_ingest_opts_free(&opts);
        rf_cfg_free(root);
        return 2;
    }

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    char *docs_tmp = NULL, *rej_tmp = NULL;
    FILE *docs = open_tmp(out, &docs_tmp);
    FILE *rej = docs ? open_tmp(rejects, &rej_tmp) : NULL;
    rf_stats *st = rf_stats_new();
    rc = docs && rej && st ? 0 : RF_ERR_IO;
    double t0 = rf_now();
    if (!rc) {
        rf_ingest_sink sink = {.docs = docs, .rejects = rej};
        rc = rf_ingest_run(&opts, inputs, n_inputs, &sink, st, &canceled);
    }
    int frc = finish_file(docs, docs_tmp, out, rc == 0);
    if (!rc) rc = frc;
    frc = finish_file(rej, rej_tmp, rejects, rc == 0);
    if (!rc) rc = frc;

    if (!rc && stats_path) {
        rf_buf json = RF_BUF_INIT;
        rc = rf_stats_to_json(st, &json);
        if (!rc) rc = rf_buf_putc(&json, '\n');
        if (!rc) rc = rf_write_file_atomic(stats_path, json.data, json.len);
        rf_buf_free(&json);
    }
    if (rc)
        fprintf(stderr, "refinery ingest: %s\n", rf_errmsg());
    else
        summary(st, rf_now() - t0);
    rf_stats_free(st);
    free(spec_inputs);
    rf_ingest_opts_free(&opts);
    rf_cfg_free(root);
    return rc ? 1 : 0;
}

static const rf_command ingest_cmd = {"ingest", "clean and filter raw text into documents",
                                      cmd_ingest};
RF_COMMAND(ingest_cmd)
