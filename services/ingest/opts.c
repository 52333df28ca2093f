/* Ingest options: defaults and the `ingest:` spec section. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "ingest/ingest.h"
#include "ingest/preset.h"

const char *const rf_ingest_keys[] = {
    "inputs",      "preset",        "format",
    "text_fields", "text_join",     "text_join_skip_contained",
    "label_field", "id_field",      "label_map",
    "header",      "columns",       "quote",
    "paragraphs",  "skip_headings", "max_line",
    "max_record",  "threads",       "batch_docs",
    "clean",       "quality",       "quality_filter",
    "language",    "augment",       "cache",
    "retries",     "resources",     "chat",
    NULL,
};

static const char *const format_names[] = {"auto", "jsonl", "csv", "tsv", "text", NULL};

const char *rf_ingest_format_name(rf_ingest_format f) {
    return format_names[f];
}

void rf_ingest_opts_default(rf_ingest_opts *o) {
    memset(o, 0, sizeof(*o));
    o->format = RF_FORMAT_AUTO;
    o->text_fields[0] = "text";
    o->n_text_fields = 1;
    o->text_join = "\n";
    o->header = true;
    o->quote = '"';
    o->max_line = (size_t)8 << 20;
    o->max_record = (size_t)8 << 20;
    o->threads = 1;
    o->batch_docs = 1024;
    rf_clean_opts_default(&o->clean);
    rf_quality_opts_default(&o->quality);
    o->quality_enabled = true;
    rf_langid_opts_default(&o->language);
    rf_augment_opts_default(&o->augment);
}

void rf_ingest_opts_free(rf_ingest_opts *o) {
    for (size_t i = 0; i < 2; i++) {
        free(o->owned[i]);
        o->owned[i] = NULL;
    }
}

/* A list of names: a YAML sequence, or one string split on commas (the CLI's
 * form, "summary,reviewText"). Split copies are kept in *owned. */
static int name_list(const rf_cfg *sec, const char *key, const char **dst, size_t max,
                     size_t *count, char **owned) {
    const rf_cfg *node = rf_cfg_get(sec, key);
    if (!node) return 0;
    const char **list;
    size_t n, k = 0;
    int rc = rf_cfg_strlist(sec, key, &list, &n);
    if (rc) return rc;
    if (rf_cfg_kind_of(node) == RF_CFG_SCALAR) {
        free(*owned);
        *owned = strdup(list[0]);
        rc = *owned ? 0 : RF_ERR_NOMEM;
        char *save = NULL;
        for (char *t = rc ? NULL : strtok_r(*owned, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            if (k == max) {
                k = 0;
                break;
            }
            dst[k++] = t;
        }
    } else {
        for (; n <= max && k < n; k++)
            dst[k] = list[k];
    }
    free(list);
    if (rc) return rc;
    if (k == 0)
        return rf_fail(RF_ERR_INVALID, "%s: expected 1 to %zu names", rf_cfg_path(node), max);
    *count = k;
    return 0;
}

/* Prefixes the current error detail with the key's path (copying it first:
 * rf_fail writes the buffer rf_errmsg() reads). */
static int fail_at(const rf_cfg *sec, const char *key, int rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rf_errmsg());
    return rf_fail(rc, "%s: %s", rf_cfg_path(rf_cfg_get(sec, key)), msg);
}

static int opt_string(const rf_cfg *sec, const char *key, const char **v) {
    /* "" or "none" clears an optional field set by a preset. */
    int rc = rf_cfg_str(sec, key, *v, v);
    if (!rc && *v && (!**v || strcmp(*v, "none") == 0)) *v = NULL;
    return rc;
}

/* The `chat:` section: {system, user, answers, max_words} (ingest.h). */
static int chat_from_cfg(const rf_cfg *c, rf_ingest_opts *o) {
    static const char *const keys[] = {"system", "user", "answers", "max_words", NULL};
    if (!c) return 0;
    int rc = rf_cfg_check_keys(c, keys);
    if (!rc) rc = rf_cfg_str(c, "system", o->chat_system, &o->chat_system);
    if (!rc) rc = rf_cfg_str(c, "user", o->chat_user, &o->chat_user);
    if (!rc) rc = rf_cfg_int(c, "max_words", o->chat_max_words, 0, 1 << 30, &o->chat_max_words);
    if (rc) return rc;
    if (!o->chat_user || !strstr(o->chat_user, "{text}"))
        return rf_fail(RF_ERR_INVALID, "%s: a user template holding {text} is required",
                       rf_cfg_path(c));
    const char **list;
    size_t n;
    if (!rf_cfg_get(c, "answers"))
        return rf_fail(RF_ERR_INVALID, "%s: answers (one per label) are required", rf_cfg_path(c));
    if ((rc = rf_cfg_strlist(c, "answers", &list, &n))) return rc;
    if (n == 0 || n > RF_INGEST_MAX_ANSWERS) {
        free(list);
        return rf_fail(RF_ERR_INVALID, "%s.answers: expected 1 to %d answers", rf_cfg_path(c),
                       RF_INGEST_MAX_ANSWERS);
    }
    for (size_t i = 0; i < n; i++)
        o->chat_answers[i] = list[i];
    o->n_chat_answers = n;
    free(list);
    if (o->conversations)
        return rf_fail(RF_ERR_INVALID, "%s: the records are conversations already (preset sft)",
                       rf_cfg_path(c));
    return 0;
}

int rf_ingest_opts_from_cfg(const rf_cfg *sec, rf_ingest_opts *o) {
    int rc;
    if (!sec) return 0;
    if ((rc = rf_cfg_check_keys(sec, rf_ingest_keys))) return rc;
    const char *preset = NULL;
    if ((rc = rf_cfg_str(sec, "preset", NULL, &preset))) return rc;
    if (preset && (rc = rf_ingest_preset_apply(o, preset))) return fail_at(sec, "preset", rc);

    int fmt = (int)o->format;
    if ((rc = rf_cfg_enum(sec, "format", format_names, fmt, &fmt))) return rc;
    o->format = (rf_ingest_format)fmt;
    if ((rc = name_list(sec, "text_fields", o->text_fields, RF_INGEST_MAX_TEXT_FIELDS,
                        &o->n_text_fields, &o->owned[0])) ||
        (rc = name_list(sec, "columns", o->columns, RF_INGEST_MAX_COLUMNS, &o->n_columns,
                        &o->owned[1])))
        return rc;
    if ((rc = rf_cfg_str(sec, "text_join", o->text_join, &o->text_join)) ||
        (rc = rf_cfg_bool(sec, "text_join_skip_contained", o->text_join_skip_contained,
                          &o->text_join_skip_contained)) ||
        (rc = opt_string(sec, "label_field", &o->label_field)) ||
        (rc = opt_string(sec, "id_field", &o->id_field)))
        return rc;

    const char *map = NULL;
    if ((rc = rf_cfg_str(sec, "label_map", NULL, &map))) return rc;
    if (map && (!*map || strcmp(map, "none") == 0)) {
        o->label_map.n = 0;
    } else if (map && (rc = rf_label_map_parse(map, &o->label_map))) {
        return fail_at(sec, "label_map", rc);
    }

    const char *quote = NULL;
    if ((rc = rf_cfg_str(sec, "quote", NULL, &quote))) return rc;
    if (quote) {
        if (strcmp(quote, "none") == 0 || !*quote)
            o->quote = -1;
        else if (strlen(quote) == 1)
            o->quote = (unsigned char)quote[0];
        else
            return rf_fail(RF_ERR_INVALID, "%s: expected one character or 'none', got '%s'",
                           rf_cfg_path(rf_cfg_get(sec, "quote")), quote);
        o->quote_set = true;
    }

    int64_t max_line, max_record, threads, batch;
    if ((rc = rf_cfg_bool(sec, "header", o->header, &o->header)) ||
        (rc = rf_cfg_bool(sec, "paragraphs", o->paragraphs, &o->paragraphs)) ||
        (rc = rf_cfg_bool(sec, "skip_headings", o->skip_headings, &o->skip_headings)) ||
        (rc = rf_cfg_bool(sec, "quality_filter", o->quality_enabled, &o->quality_enabled)) ||
        (rc = rf_cfg_int(sec, "max_line", (int64_t)o->max_line, 64, (int64_t)1 << 40, &max_line)) ||
        (rc = rf_cfg_int(sec, "max_record", (int64_t)o->max_record, 64, (int64_t)1 << 40,
                         &max_record)) ||
        (rc = rf_cfg_int(sec, "threads", o->threads, 1, 256, &threads)) ||
        (rc = rf_cfg_int(sec, "batch_docs", (int64_t)o->batch_docs, 1, 1 << 20, &batch)))
        return rc;
    o->max_line = (size_t)max_line;
    o->max_record = (size_t)max_record;
    o->threads = (int)threads;
    o->batch_docs = (size_t)batch;

    if ((rc = rf_clean_opts_from_cfg(rf_cfg_get(sec, "clean"), &o->clean)) ||
        (rc = rf_quality_opts_from_cfg(rf_cfg_get(sec, "quality"), &o->quality)) ||
        (rc = rf_langid_opts_from_cfg(rf_cfg_get(sec, "language"), &o->language)) ||
        (rc = rf_augment_opts_from_cfg(rf_cfg_get(sec, "augment"), &o->augment)) ||
        (rc = chat_from_cfg(rf_cfg_get(sec, "chat"), o)))
        return rc;
    return 0;
}
