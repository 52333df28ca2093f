#include "common/doc.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

void rf_doc_clear(rf_doc *d) {
    free(d->id);
    free(d->text);
    free(d->source);
    free(d->aug_of);
    free(d->messages);
    memset(d, 0, sizeof *d);
    d->label = RF_LABEL_NONE;
}

int rf_doc_to_json(const rf_doc *d, rf_buf *out) {
    int rc = rf_buf_puts(out, "{\"id\":");
    rc |= rf_buf_append_json_str(out, d->id ? d->id : "", d->id ? strlen(d->id) : 0);
    rc |= rf_buf_puts(out, ",\"text\":");
    rc |= rf_buf_append_json_str(out, d->text ? d->text : "", d->text ? d->text_len : 0);
    if (d->label != RF_LABEL_NONE) {
        rc |= rf_buf_puts(out, ",\"label\":");
        rc |= rf_buf_put_i64(out, d->label);
    }
    if (d->source) {
        rc |= rf_buf_puts(out, ",\"source\":");
        rc |= rf_buf_append_json_str(out, d->source, strlen(d->source));
    }
    rc |= rf_buf_puts(out, ",\"line\":");
    rc |= rf_buf_put_u64(out, d->line);
    rc |= rf_buf_puts(out, ",\"offset\":");
    rc |= rf_buf_put_u64(out, d->offset);
    if (d->cluster) rc |= rf_buf_printf(out, ",\"cluster\":\"%016" PRIx64 "\"", d->cluster);
    if (d->aug_of) {
        rc |= rf_buf_puts(out, ",\"aug_of\":");
        rc |= rf_buf_append_json_str(out, d->aug_of, strlen(d->aug_of));
    }
    if (d->messages) { /* canonical JSON already */
        rc |= rf_buf_puts(out, ",\"messages\":");
        rc |= rf_buf_append(out, d->messages, d->messages_len);
    }
    rc |= rf_buf_putc(out, '}');
    return rc ? RF_ERR_NOMEM : RF_OK;
}

static int copy_str(const rf_json *v, char **out, size_t *len) {
    *out = malloc(v->len + 1);
    if (!*out) return RF_ERR_NOMEM;
    memcpy(*out, v->u.str, v->len);
    (*out)[v->len] = 0;
    if (len) *len = v->len;
    return RF_OK;
}

static int get_u64(const rf_json *obj, const char *key, uint64_t *out) {
    const rf_json *v = rf_json_get(obj, key);
    int64_t x;
    if (!v) return RF_OK;
    if (rf_json_int64(v, &x) || x < 0)
        return rf_fail(RF_ERR_INVALID, "document field '%s' must be a non-negative integer", key);
    *out = (uint64_t)x;
    return RF_OK;
}

int rf_doc_from_json(const rf_json *obj, rf_doc *d) {
    memset(d, 0, sizeof *d);
    d->label = RF_LABEL_NONE;
    if (!obj || obj->type != RF_JSON_OBJECT)
        return rf_fail(RF_ERR_INVALID, "document is not a JSON object");
    const rf_json *id = rf_json_get(obj, "id"), *text = rf_json_get(obj, "text");
    if (!rf_json_is_str(id)) return rf_fail(RF_ERR_INVALID, "document has no string 'id'");
    if (!rf_json_is_str(text)) return rf_fail(RF_ERR_INVALID, "document has no string 'text'");
    int rc = copy_str(id, &d->id, NULL);
    if (!rc) rc = copy_str(text, &d->text, &d->text_len);
    const rf_json *label = rf_json_get(obj, "label");
    if (!rc && label && label->type != RF_JSON_NULL) {
        int64_t x;
        if (rf_json_int64(label, &x) || x < 0 || x > INT32_MAX)
            rc = rf_fail(RF_ERR_INVALID, "document '%s': label must be a non-negative integer",
                         d->id);
        else
            d->label = (int32_t)x;
    }
    const rf_json *source = rf_json_get(obj, "source");
    if (!rc && rf_json_is_str(source)) rc = copy_str(source, &d->source, NULL);
    if (!rc) rc = get_u64(obj, "line", &d->line);
    if (!rc) rc = get_u64(obj, "offset", &d->offset);
    const rf_json *cluster = rf_json_get(obj, "cluster");
    if (!rc && cluster) {
        char *end = NULL;
        if (rf_json_is_str(cluster) && cluster->len == 16)
            d->cluster = strtoull(cluster->u.str, &end, 16);
        if (!end || *end)
            rc = rf_fail(RF_ERR_INVALID, "document '%s': cluster must be 16 hex digits", d->id);
    }
    const rf_json *aug = rf_json_get(obj, "aug_of");
    if (!rc && rf_json_is_str(aug)) rc = copy_str(aug, &d->aug_of, NULL);
    const rf_json *msgs = rf_json_get(obj, "messages");
    if (!rc && msgs && msgs->type != RF_JSON_NULL) {
        rf_buf m = RF_BUF_INIT;
        const char *why = rf_messages_canon(msgs, &m, NULL);
        if (why && strcmp(why, "out_of_memory") == 0)
            rc = RF_ERR_NOMEM;
        else if (why)
            rc = rf_fail(RF_ERR_INVALID, "document '%s': messages: %s", d->id, why);
        if (!rc) {
            d->messages = m.data, d->messages_len = m.len;
            m = (rf_buf)RF_BUF_INIT;
        }
        rf_buf_free(&m);
    }
    if (rc) rf_doc_clear(d);
    return rc;
}

const char *rf_messages_canon(const rf_json *arr, rf_buf *out, rf_buf *text) {
    if (!arr || arr->type != RF_JSON_ARRAY || arr->len == 0) return "messages_not_array";
    bool assistant = false;
    int rc = rf_buf_putc(out, '[');
    for (size_t i = 0; i < arr->len; i++) {
        const rf_json *m = &arr->u.items[i];
        const rf_json *role = rf_json_get(m, "role"), *content = rf_json_get(m, "content");
        if (!rf_json_is_str(role) || !rf_json_is_str(content)) return "bad_message";
        if (!((role->len == 6 && !memcmp(role->u.str, "system", 6)) ||
              (role->len == 4 && !memcmp(role->u.str, "user", 4)) ||
              (role->len == 9 && !memcmp(role->u.str, "assistant", 9))))
            return "bad_role";
        assistant |= role->len == 9;
        rc |= rf_buf_puts(out, i ? ",{\"role\":" : "{\"role\":");
        rc |= rf_buf_append_json_str(out, role->u.str, role->len);
        rc |= rf_buf_puts(out, ",\"content\":");
        rc |= rf_buf_append_json_str(out, content->u.str, content->len);
        rc |= rf_buf_putc(out, '}');
        if (text) {
            if (i) rc |= rf_buf_putc(text, '\n');
            rc |= rf_buf_append(text, content->u.str, content->len);
        }
    }
    rc |= rf_buf_putc(out, ']');
    if (rc) return "out_of_memory";
    return assistant ? NULL : "no_assistant";
}

rf_doc_batch *rf_doc_batch_new(size_t cap) {
    rf_doc_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    if (cap) {
        b->docs = calloc(cap, sizeof *b->docs);
        if (!b->docs) {
            free(b);
            return NULL;
        }
        b->cap = cap;
    }
    return b;
}

rf_doc *rf_doc_batch_push(rf_doc_batch *b) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        rf_doc *docs = realloc(b->docs, cap * sizeof *docs);
        if (!docs) return NULL;
        b->docs = docs;
        b->cap = cap;
    }
    rf_doc *d = &b->docs[b->n++];
    memset(d, 0, sizeof *d);
    d->label = RF_LABEL_NONE;
    return d;
}

void rf_doc_batch_free(rf_doc_batch *b) {
    if (!b) return;
    for (size_t i = 0; i < b->n; i++)
        rf_doc_clear(&b->docs[i]);
    free(b->docs);
    free(b);
}
