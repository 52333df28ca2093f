/* JSON Lines field extraction: see jsonl.h. */
#include "ingest/jsonl.h"

#include <string.h>

#include "common/doc.h"
#include "ingest/join.h"

/* Member by name; a dotted name walks nested objects when no key matches whole. */
static const rf_json *lookup(const rf_json *obj, const char *name) {
    const rf_json *v = rf_json_get(obj, name);
    if (v || !strchr(name, '.')) return v;
    const char *p = name;
    while (obj && obj->type == RF_JSON_OBJECT) {
        const char *dot = strchr(p, '.');
        size_t klen = dot ? (size_t)(dot - p) : strlen(p);
        const rf_json *next = NULL;
        for (size_t i = 0; i < obj->len; i++) {
            const rf_json_member *m = &obj->u.members[i];
            if (m->keylen == klen && memcmp(m->key, p, klen) == 0) {
                next = &m->value;
                break;
            }
        }
        if (!dot) return next;
        obj = next;
        p = dot + 1;
    }
    return NULL;
}

const char *rf_jsonl_extract(rf_json_doc *doc, const char *line, size_t len,
                             const rf_field_map *map, rf_record_fields *out) {
    const rf_json *root;
    out->label = RF_LABEL_NONE;
    out->id = NULL;
    out->id_len = 0;
    out->text_data = NULL;
    out->text_len = 0;
    rf_buf_reset(out->text);
    if (rf_json_parse(doc, line, len, &root)) return "invalid_json";
    if (root->type != RF_JSON_OBJECT) return "not_an_object";

    /* One present field is used in place; a second one starts a joined copy. */
    const rf_json *first = NULL;
    size_t present = 0;
    rf_text_part parts[RF_TEXT_JOIN_MAX];
    for (size_t i = 0; i < map->n_text_fields; i++) {
        const rf_json *v = lookup(root, map->text_fields[i]);
        if (!v || v->type == RF_JSON_NULL) continue;
        if (v->type != RF_JSON_STRING) return "text_not_string";
        if (map->skip_contained) { /* joined below */
            if (i < RF_TEXT_JOIN_MAX) parts[present++] = (rf_text_part){v->u.str, v->len};
            continue;
        }
        if (present++ == 0) {
            first = v;
            continue;
        }
        if (present == 2 && rf_buf_append(out->text, first->u.str, first->len))
            return "out_of_memory";
        if (rf_buf_puts(out->text, map->text_join) || rf_buf_append(out->text, v->u.str, v->len))
            return "out_of_memory";
    }
    if (!present) return "missing_text";
    if (map->skip_contained) {
        if (rf_text_join(parts, present, map->text_join, true, out->text, out->norm,
                         &out->text_data, &out->text_len))
            return "out_of_memory";
    } else if (present == 1) {
        out->text_data = first->len ? first->u.str : "";
        out->text_len = first->len;
    } else {
        out->text_data = out->text->data ? out->text->data : "";
        out->text_len = out->text->len;
    }

    if (map->label_field) {
        const rf_json *v = lookup(root, map->label_field);
        if (!v || v->type == RF_JSON_NULL) return "missing_label";
        if (v->type == RF_JSON_NUMBER) {
            const char *r = rf_label_apply(map->label_map, v->num, &out->label);
            if (r) return r;
        } else if (v->type == RF_JSON_STRING) {
            const char *r = rf_label_from_text(map->label_map, v->u.str, v->len, &out->label);
            if (r) return r;
        } else if (v->type == RF_JSON_TRUE || v->type == RF_JSON_FALSE) {
            const char *r = rf_label_apply(map->label_map, v->type == RF_JSON_TRUE, &out->label);
            if (r) return r;
        } else {
            return "bad_label";
        }
    }
    if (map->id_field) {
        const rf_json *v = lookup(root, map->id_field);
        if (!v || (v->type != RF_JSON_STRING && v->type != RF_JSON_NUMBER) || v->len == 0)
            return "missing_id";
        out->id = v->u.str;
        out->id_len = v->len;
    }
    return NULL;
}
