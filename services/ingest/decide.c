/* The ingest verdict on one document: see decide.h. */
#include "ingest/decide.h"

#include <stdlib.h>

#include "common/buf.h"
#include "common/error.h"

struct rf_decider {
    rf_doc_rules rules;
    rf_buf clean;                /* cleaned text of the last call */
    rf_quality_scratch *quality; /* reused n-gram tables */
};

void rf_doc_rules_from_opts(const rf_ingest_opts *o, rf_doc_rules *r) {
    *r = (rf_doc_rules){o->clean, o->quality_enabled, o->quality, o->language};
}

rf_decider *rf_decider_new(const rf_doc_rules *rules) {
    rf_decider *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->rules = *rules;
    d->clean = (rf_buf)RF_BUF_INIT;
    if (!(d->quality = rf_quality_scratch_new())) {
        free(d);
        return NULL;
    }
    return d;
}

void rf_decider_free(rf_decider *d) {
    if (!d) return;
    rf_buf_free(&d->clean);
    rf_quality_scratch_free(d->quality);
    free(d);
}

int rf_decide(rf_decider *d, const char *text, size_t n, rf_verdict *v) {
    const rf_doc_rules *r = &d->rules;
    if (!text) text = "";
    int rc = rf_clean_text(&r->clean, text, n, &d->clean, &v->clean);
    if (rc) return rc;
    if (v->clean.reject) {
        *v = (rf_verdict){v->clean.reject, text, n, v->clean};
        return 0;
    }
    const char *ctext = d->clean.data ? d->clean.data : "";
    size_t clen = d->clean.len;
    const char *why = NULL;
    if (r->quality_enabled &&
        (rc = rf_quality_check_with(&r->quality, d->quality, ctext, clen, &why)))
        return rc;
    if (!why && r->language.n_expected &&
        (rc = rf_langid_check(&r->language, ctext, clen, &why, NULL)))
        return rc;
    v->reject = why;
    v->text = ctext;
    v->len = clen;
    return 0;
}

static void add_nonzero(rf_stats *s, const char *name, size_t n) {
    if (n) rf_stats_add(s, name, (int64_t)n);
}

void rf_verdict_count_clean(const rf_verdict *v, rf_stats *s) {
    add_nonzero(s, "ingest.clean.utf8_repairs", v->clean.utf8_repairs);
    add_nonzero(s, "ingest.clean.controls_removed", v->clean.controls_removed);
    add_nonzero(s, "ingest.clean.nul_bytes", v->clean.nul_bytes);
    add_nonzero(s, "ingest.clean.entities_decoded", v->clean.entities_decoded);
    add_nonzero(s, "ingest.clean.tags_removed", v->clean.tags_removed);
}
