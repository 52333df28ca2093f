/* Ingest presets: see preset.h. */
#include "ingest/preset.h"

#include <string.h>

#include "common/error.h"

static const char *const amazon_columns[] = {
    "reviewerID", "asin",    "reviewerName",   "helpful",    "reviewText",
    "overall",    "summary", "unixReviewTime", "reviewTime",
};

static void set_text(rf_ingest_opts *o, const char *const *fields, size_t n) {
    for (size_t i = 0; i < n; i++)
        o->text_fields[i] = fields[i];
    o->n_text_fields = n;
}

static int amazon(rf_ingest_opts *o) {
    static const char *const text[] = {"summary", "reviewText"};
    o->format = RF_FORMAT_AUTO;
    set_text(o, text, 2);
    o->text_join = "\n";
    o->text_join_skip_contained = true; /* summaries cut from the review text */
    o->label_field = "overall";
    o->id_field = NULL;
    o->header = false;
    o->n_columns = sizeof(amazon_columns) / sizeof(amazon_columns[0]);
    for (size_t i = 0; i < o->n_columns; i++)
        o->columns[i] = amazon_columns[i];
    o->quote = '"';
    o->quote_set = true;
    return rf_label_map_parse("1-2:0,3-5:1", &o->label_map);
}

static int sst2(rf_ingest_opts *o) {
    static const char *const text[] = {"sentence"};
    o->format = RF_FORMAT_TSV;
    set_text(o, text, 1);
    o->label_field = "label";
    o->id_field = NULL;
    o->label_map.n = 0;
    o->header = true;
    o->n_columns = 0;
    o->quote = -1;
    o->quote_set = true;
    return 0;
}

static int wikitext(rf_ingest_opts *o) {
    o->format = RF_FORMAT_TEXT;
    o->paragraphs = false;
    o->skip_headings = true;
    o->label_field = NULL;
    o->id_field = NULL;
    return 0;
}

/* SFT conversations in JSON Lines (ingest.h's `conversations`). The quality
 * filter is off: its rules are for prose, and a one-word answer is no defect. */
static int sft(rf_ingest_opts *o) {
    o->format = RF_FORMAT_JSONL;
    o->conversations = true;
    o->label_field = NULL;
    o->id_field = NULL;
    o->quality_enabled = false;
    return 0;
}

int rf_ingest_preset_apply(rf_ingest_opts *o, const char *name) {
    if (strcmp(name, "amazon") == 0) return amazon(o);
    if (strcmp(name, "sst2") == 0) return sst2(o);
    if (strcmp(name, "wikitext") == 0) return wikitext(o);
    if (strcmp(name, "sft") == 0) return sft(o);
    return rf_fail(RF_ERR_INVALID, "unknown preset '%s' (expected amazon, sst2, wikitext or sft)",
                   name);
}
