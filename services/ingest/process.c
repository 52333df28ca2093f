/* The worker side of ingest: see process.h. */
#include "ingest/process.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "ingest/decide.h"
#include "ingest/jsonl.h"

#define EXCERPT_BYTES 80
#define ID_MAX        512

struct rf_worker {
    const rf_ingest_opts *o;
    const rf_augmenter *aug;
    const rf_source *src;
    bool want_docs;
    bool keep_rejects;
    rf_field_map map;
    rf_json_doc *json;
    rf_decider *decider; /* clean -> quality -> language (decide.h) */
    rf_buf text;         /* joined text of a JSON record */
    rf_buf norm;         /* scratch of text_join_skip_contained */
    rf_buf *augs;        /* o->augment.n_aug augmented copies */
    rf_buf msgs;         /* a conversation's canonical messages JSON */
    rf_buf scratch;      /* chat: the user message */
};

int rf_worker_new(const rf_ingest_opts *o, const rf_augmenter *aug, const rf_source *src,
                  bool want_docs, rf_worker **out) {
    rf_worker *w = calloc(1, sizeof(*w));
    if (!w) return RF_ERR_NOMEM;
    *w = (rf_worker){.o = o, .aug = aug, .src = src, .want_docs = want_docs};
    w->map = (rf_field_map){
        o->text_fields, o->n_text_fields,           o->text_join, o->label_field, o->id_field,
        &o->label_map,  o->text_join_skip_contained};
    w->json = rf_json_doc_new();
    rf_doc_rules rules;
    rf_doc_rules_from_opts(o, &rules);
    w->decider = rf_decider_new(&rules);
    size_t n_aug = aug ? o->augment.n_aug : 0;
    w->augs = n_aug ? calloc(n_aug, sizeof(rf_buf)) : NULL;
    if (!w->json || !w->decider || (n_aug && !w->augs)) {
        rf_worker_free(w);
        return RF_ERR_NOMEM;
    }
    *out = w;
    return 0;
}

void rf_worker_free(rf_worker *w) {
    if (!w) return;
    rf_json_doc_free(w->json);
    rf_decider_free(w->decider);
    rf_buf_free(&w->text);
    rf_buf_free(&w->norm);
    rf_buf_free(&w->msgs);
    rf_buf_free(&w->scratch);
    if (w->augs)
        for (size_t i = 0; i < w->o->augment.n_aug; i++)
            rf_buf_free(&w->augs[i]);
    free(w->augs);
    free(w);
}

void rf_worker_keep_rejects(rf_worker *w) {
    w->keep_rejects = true;
}

static int reject(rf_worker *w, rf_ibatch *b, const rf_rec *r, const char *reason,
                  const char *bytes, size_t n, const char *detail, size_t detail_len) {
    rf_buf *out = &b->rejects_out;
    const char *path = rf_source_path(w->src, r->src);
    int rc = rf_buf_puts(out, "{\"source\":");
    rc |= rf_buf_append_json_str(out, path, strlen(path));
    rc |= rf_buf_printf(out, ",\"line\":%" PRIu64 ",\"offset\":%" PRIu64 ",\"reason\":", r->line,
                        r->offset);
    rc |= rf_buf_append_json_str(out, reason, strlen(reason));
    if (detail && detail_len) {
        rc |= rf_buf_puts(out, ",\"detail\":");
        rc |= rf_buf_append_json_str(out, detail, detail_len);
    }
    rc |= rf_buf_puts(out, ",\"excerpt\":");
    rc |= rf_buf_append_json_str(out, bytes, n < EXCERPT_BYTES ? n : EXCERPT_BYTES);
    rc |= rf_buf_puts(out, "}\n");
    rf_ibatch_count(b, reason);
    if (!rc && w->keep_rejects)
        rc = rf_ibatch_keep_reject(b, r->src, r->line, r->offset, reason, bytes,
                                   n < EXCERPT_BYTES ? n : EXCERPT_BYTES);
    return rc ? RF_ERR_NOMEM : 0;
}

/* Appends one document line, and a copy to b->docs when a stage wants them. */
static int put_doc(rf_worker *w, rf_ibatch *b, const rf_doc *d) {
    int rc = rf_doc_to_json(d, &b->docs_out);
    if (!rc) rc = rf_buf_putc(&b->docs_out, '\n');
    if (rc || !w->want_docs) return rc;
    if (!b->docs && !(b->docs = rf_doc_batch_new(b->n))) return RF_ERR_NOMEM;
    rf_doc *c = rf_doc_batch_push(b->docs);
    if (!c) return RF_ERR_NOMEM;
    c->id = strdup(d->id);
    c->text = malloc(d->text_len + 1);
    c->source = strdup(d->source);
    c->aug_of = d->aug_of ? strdup(d->aug_of) : NULL;
    if (d->messages && (c->messages = malloc(d->messages_len + 1))) {
        memcpy(c->messages, d->messages, d->messages_len);
        c->messages[d->messages_len] = '\0';
        c->messages_len = d->messages_len;
    }
    if (!c->id || !c->text || !c->source || (d->aug_of && !c->aug_of) ||
        (d->messages && !c->messages))
        return RF_ERR_NOMEM;
    memcpy(c->text, d->text, d->text_len);
    c->text[d->text_len] = '\0';
    c->text_len = d->text_len;
    c->label = d->label;
    c->line = d->line;
    c->offset = d->offset;
    return 0;
}

/* "<base>:<line>" into out[ID_MAX], without printf (a hot path for short docs). */
static void format_id(char *out, const char *base, uint64_t line) {
    size_t n = strnlen(base, ID_MAX - 22);
    memcpy(out, base, n);
    out[n++] = ':';
    char digits[20];
    size_t k = 0;
    do {
        digits[k++] = (char)('0' + line % 10);
        line /= 10;
    } while (line);
    while (k)
        out[n++] = digits[--k];
    out[n] = '\0';
}

/* One message of a canonical messages array (doc.h). */
static int put_msg(rf_buf *m, const char *role, const char *content, size_t len) {
    int rc = rf_buf_puts(m, m->len ? ",{\"role\":\"" : "[{\"role\":\"");
    rc |= rf_buf_puts(m, role);
    rc |= rf_buf_puts(m, "\",\"content\":");
    rc |= rf_buf_append_json_str(m, content, len);
    rc |= rf_buf_putc(m, '}');
    return rc ? RF_ERR_NOMEM : 0;
}

/* The `chat:` conversation of a kept document (ingest.h) into w->msgs; *why
 * set (and nothing built) when its label has no answer. */
static int make_chat(rf_worker *w, const char *text, size_t n, int32_t label, const char **why) {
    const rf_ingest_opts *o = w->o;
    *why = NULL;
    if (label < 0 || (size_t)label >= o->n_chat_answers) {
        *why = "no_answer";
        return 0;
    }
    if (o->chat_max_words > 0) { /* cut after the max_words-th word */
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < n; i++) {
            bool sp = text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r';
            if (!sp && !in && ++words > o->chat_max_words) {
                n = i;
                while (n && (text[n - 1] == ' ' || text[n - 1] == '\n' || text[n - 1] == '\t' ||
                             text[n - 1] == '\r'))
                    n--;
                break;
            }
            in = !sp;
        }
    }
    rf_buf *u = &w->scratch;
    rf_buf_reset(u);
    int rc = 0;
    for (const char *p = o->chat_user; !rc && *p;) {
        const char *t = strstr(p, "{text}");
        size_t k = t ? (size_t)(t - p) : strlen(p);
        rc = rf_buf_append(u, p, k);
        if (!rc && t) rc = rf_buf_append(u, text, n);
        p += k + (t ? 6 : 0);
    }
    rf_buf_reset(&w->msgs);
    if (!rc && o->chat_system)
        rc = put_msg(&w->msgs, "system", o->chat_system, strlen(o->chat_system));
    if (!rc) rc = put_msg(&w->msgs, "user", u->data ? u->data : "", u->len);
    const char *a = o->chat_answers[label];
    if (!rc) rc = put_msg(&w->msgs, "assistant", a, strlen(a));
    if (!rc) rc = rf_buf_putc(&w->msgs, ']');
    return rc ? RF_ERR_NOMEM : 0;
}

/* Decide (clean, filter), write, augment: the part shared by every input
 * format. msgs: a conversation's canonical messages (preset sft), else NULL. */
static int finish_record(rf_worker *w, rf_ibatch *b, const rf_rec *r, const char *text, size_t n,
                         int32_t label, const char *id, size_t id_len, const rf_buf *msgs) {
    const rf_ingest_opts *o = w->o;
    rf_verdict v;
    int rc = rf_decide(w->decider, text, n, &v);
    if (rc) return rc;
    b->utf8_repairs += (int64_t)v.clean.utf8_repairs;
    b->controls_removed += (int64_t)v.clean.controls_removed;
    b->nul_bytes += (int64_t)v.clean.nul_bytes;
    b->entities += (int64_t)v.clean.entities_decoded;
    b->tags += (int64_t)v.clean.tags_removed;
    if (v.reject) return reject(w, b, r, v.reject, v.text, v.len, NULL, 0);
    const char *ctext = v.text;
    size_t clen = v.len;
    if (o->chat_user) {
        const char *why;
        if ((rc = make_chat(w, ctext, clen, label, &why))) return rc;
        if (why) return reject(w, b, r, why, ctext, clen, NULL, 0);
        msgs = &w->msgs;
    }

    char idbuf[ID_MAX];
    if (id) {
        /* Ids become C strings: cut at an embedded NUL and at ID_MAX. */
        size_t k = strnlen(id, id_len < ID_MAX - 1 ? id_len : ID_MAX - 1);
        memcpy(idbuf, id, k);
        idbuf[k] = '\0';
    } else {
        format_id(idbuf, rf_source_base(w->src, r->src), r->line);
    }
    rf_doc d = {.id = idbuf,
                .text = (char *)ctext,
                .text_len = clen,
                .label = label,
                .source = (char *)rf_source_path(w->src, r->src),
                .line = r->line,
                .offset = r->offset,
                .messages = msgs ? msgs->data : NULL,
                .messages_len = msgs ? msgs->len : 0};
    if ((rc = put_doc(w, b, &d))) return rc;
    b->kept++;
    if (!w->aug || msgs) return 0; /* augmenting the text would not touch the conversation */

    size_t n_aug = o->augment.n_aug;
    uint64_t seed = rf_augment_seed(o->augment.seed, idbuf, strlen(idbuf));
    if ((rc = rf_augment(w->aug, ctext, clen, seed, w->augs, n_aug))) return rc;
    char augid[ID_MAX + 32];
    for (size_t k = 0; k < n_aug; k++) {
        snprintf(augid, sizeof augid, "%s#aug%zu", idbuf, k + 1);
        rf_doc a = d;
        a.id = augid;
        a.text = w->augs[k].data ? w->augs[k].data : "";
        a.text_len = w->augs[k].len;
        a.aug_of = idbuf;
        if ((rc = put_doc(w, b, &a))) return rc;
        b->augmented++;
    }
    return 0;
}

/* A conversation record (preset sft) into w->msgs and w->text; NULL or the
 * reject reason. */
static const char *conversation(rf_worker *w, const char *line, size_t len) {
    const rf_json *root;
    rf_buf_reset(&w->msgs);
    rf_buf_reset(&w->text);
    if (rf_json_parse(w->json, line, len, &root)) return "invalid_json";
    if (root->type != RF_JSON_OBJECT) return "not_an_object";
    const rf_json *m = rf_json_get(root, "messages");
    if (m) return rf_messages_canon(m, &w->msgs, &w->text);
    const rf_json *sys = rf_json_get(root, "system"), *p = rf_json_get(root, "prompt");
    const rf_json *a = rf_json_get(root, "response");
    if (!a) a = rf_json_get(root, "completion");
    if (!rf_json_is_str(p)) return "missing_prompt";
    if (!rf_json_is_str(a)) return "missing_response";
    if (sys && sys->type != RF_JSON_NULL && !rf_json_is_str(sys)) return "bad_message";
    int rc = 0;
    if (rf_json_is_str(sys)) {
        rc |= put_msg(&w->msgs, "system", sys->u.str, sys->len);
        rc |= rf_buf_append(&w->text, sys->u.str, sys->len) | rf_buf_putc(&w->text, '\n');
    }
    rc |= put_msg(&w->msgs, "user", p->u.str, p->len);
    rc |= put_msg(&w->msgs, "assistant", a->u.str, a->len);
    rc |= rf_buf_putc(&w->msgs, ']');
    rc |= rf_buf_append(&w->text, p->u.str, p->len) | rf_buf_putc(&w->text, '\n');
    rc |= rf_buf_append(&w->text, a->u.str, a->len);
    return rc ? "out_of_memory" : NULL;
}

static int json_record(rf_worker *w, rf_ibatch *b, const rf_rec *r) {
    const char *line = b->arena.data + r->a.off;
    if (w->o->conversations) {
        const char *why = conversation(w, line, r->a.len);
        if (why && strcmp(why, "out_of_memory") == 0) return RF_ERR_NOMEM;
        if (why) {
            const char *detail = strcmp(why, "invalid_json") == 0 ? rf_errmsg() : NULL;
            return reject(w, b, r, why, line, r->a.len, detail, detail ? strlen(detail) : 0);
        }
        return finish_record(w, b, r, w->text.data ? w->text.data : "", w->text.len, RF_LABEL_NONE,
                             NULL, 0, &w->msgs);
    }
    rf_record_fields f = {.text = &w->text, .norm = &w->norm};
    const char *why = rf_jsonl_extract(w->json, line, r->a.len, &w->map, &f);
    if (why) {
        if (strcmp(why, "out_of_memory") == 0) return RF_ERR_NOMEM;
        const char *detail = strcmp(why, "invalid_json") == 0 ? rf_errmsg() : NULL;
        return reject(w, b, r, why, line, r->a.len, detail, detail ? strlen(detail) : 0);
    }
    return finish_record(w, b, r, f.text_data, f.text_len, f.label, f.id, f.id_len, NULL);
}

static int fields_record(rf_worker *w, rf_ibatch *b, const rf_rec *r) {
    const char *text = b->arena.data + r->a.off;
    int32_t label = RF_LABEL_NONE;
    if (w->o->label_field) {
        const char *why;
        if (r->b.off == RF_NO_SPAN || r->b.len == 0)
            why = "missing_label";
        else
            why = rf_label_from_text(&w->o->label_map, b->arena.data + r->b.off, r->b.len, &label);
        if (why) return reject(w, b, r, why, text, r->a.len, NULL, 0);
    }
    const char *id = NULL;
    size_t id_len = 0;
    if (w->o->id_field) {
        if (r->c.off == RF_NO_SPAN || r->c.len == 0)
            return reject(w, b, r, "missing_id", text, r->a.len, NULL, 0);
        id = b->arena.data + r->c.off;
        id_len = r->c.len;
    }
    return finish_record(w, b, r, text, r->a.len, label, id, id_len, NULL);
}

int rf_worker_process(rf_worker *w, rf_ibatch *b) {
    int rc = 0;
    for (size_t i = 0; i < b->n && !rc && !b->err; i++) {
        const rf_rec *r = &b->recs[i];
        switch (r->kind) {
        case RF_REC_JSON:
            rc = json_record(w, b, r);
            break;
        case RF_REC_FIELDS:
            rc = fields_record(w, b, r);
            break;
        case RF_REC_REJECT:
            rc = reject(w, b, r, r->reason, b->arena.data + r->a.off, r->a.len,
                        r->b.off == RF_NO_SPAN ? NULL : b->arena.data + r->b.off,
                        r->b.off == RF_NO_SPAN ? 0 : r->b.len);
            break;
        }
    }
    if (rc && !b->err) b->err = rc;
    return b->err;
}
