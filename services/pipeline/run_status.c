/* refinery status RUN_DIR: an embedded run's state, stage by stage, from the
 * files its run directory keeps (run_status.h). */
#include "pipeline/run_status.h"

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"
#include "pipeline/stages.h"

#define MAX_STATS (64u << 20)
#define MAX_LOG   (256u << 20)

/* The message of the last error line of run.log (JSON lines, or the text
 * format `TS error comp: msg` of a terminal run) into err; "" when none. */
static void last_error(const char *dir, rf_buf *err) {
    char *path = NULL, *text = NULL;
    size_t len = 0;
    if (asprintf(&path, "%s/run.log", dir) < 0) return;
    int rc = rf_read_file(path, MAX_LOG, &text, &len);
    free(path);
    if (rc) return;
    rf_json_doc *doc = rf_json_doc_new();
    const char *end = text + len;
    for (const char *p = text; doc && p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        size_t n = (size_t)(e - p);
        const rf_json *root, *level, *msg;
        if (n && *p == '{' && rf_json_parse(doc, p, n, &root) == RF_OK &&
            (level = rf_json_get(root, "level")) && rf_json_is_str(level) &&
            !strcmp(level->u.str, "error") && (msg = rf_json_get(root, "msg")) &&
            rf_json_is_str(msg)) {
            err->len = 0;
            rf_buf_append(err, msg->u.str, msg->len);
        } else if (n && *p != '{') {
            const char *lv = memmem(p, n, " error ", 7);
            const char *colon = lv ? memmem(lv + 7, (size_t)(e - lv - 7), ": ", 2) : NULL;
            if (colon) {
                err->len = 0;
                rf_buf_append(err, colon + 2, (size_t)(e - colon - 2));
            }
        }
        p = e + 1;
    }
    rf_json_doc_free(doc);
    free(text);
}

static bool has_file(const char *dir, const char *name) {
    char *path = NULL;
    if (asprintf(&path, "%s/%s", dir, name) < 0) return false;
    FILE *f = fopen(path, "rb");
    free(path);
    if (f) fclose(f);
    return f != NULL;
}

static int emit(FILE *out, const char *dir, const char *state, const rf_buf *err,
                const rf_json *stats, bool lines) {
    const rf_stage_table *t = rf_pipeline_schema();
    const rf_json *run = stats ? rf_json_get(stats, "run") : NULL;
    const rf_json *secs = run ? rf_json_get(run, "seconds") : NULL;
    rf_buf b = RF_BUF_INIT;
    int rc = RF_OK;
    if (lines) {
        rc |= rf_buf_printf(&b, "%s %s", dir, state);
    } else {
        rc |= rf_buf_puts(&b, "{\"run_dir\":");
        rc |= rf_buf_append_json_str(&b, dir, strlen(dir));
        rc |= rf_buf_printf(&b, ",\"state\":\"%s\",\"error\":", state);
        if (err->len)
            rc |= rf_buf_append_json_str(&b, err->data, err->len);
        else
            rc |= rf_buf_puts(&b, "null");
        if (secs && secs->type == RF_JSON_NUMBER)
            rc |= rf_buf_printf(&b, ",\"seconds\":%.3f", secs->num);
        else
            rc |= rf_buf_puts(&b, ",\"seconds\":null");
        rc |= rf_buf_puts(&b, ",\"stages\":[");
    }
    int listed = 0;
    for (size_t i = 0; stats && i < t->n; i++) {
        const char *name = t->stages[i]->name;
        const rf_json *s = rf_json_get(stats, name);
        const rf_json *cached = s ? rf_json_get(s, "cached") : NULL;
        if (!cached) continue; /* not in this run's spec */
        const rf_json *att = rf_json_get(s, "attempts"), *sec = rf_json_get(s, "seconds");
        const rf_json *key = rf_json_get(s, "key");
        int64_t attempts = 0;
        if (att) rf_json_int64(att, &attempts);
        double seconds = sec && sec->type == RF_JSON_NUMBER ? sec->num : 0;
        bool hit = cached->type == RF_JSON_TRUE;
        if (lines) {
            if (hit)
                rc |= rf_buf_printf(&b, " | %s cached", name);
            else
                rc |= rf_buf_printf(&b, " | %s %lld attempt%s %.1fs", name, (long long)attempts,
                                    attempts == 1 ? "" : "s", seconds);
        } else {
            rc |= rf_buf_printf(&b, "%s{\"stage\":\"%s\",\"cached\":%s,\"attempts\":%lld,"
                                    "\"seconds\":%.3f,\"key\":",
                                listed ? "," : "", name, hit ? "true" : "false",
                                (long long)attempts, seconds);
            if (key && rf_json_is_str(key))
                rc |= rf_buf_append_json_str(&b, key->u.str, key->len);
            else
                rc |= rf_buf_puts(&b, "null");
            rc |= rf_buf_putc(&b, '}');
        }
        listed++;
    }
    if (lines) {
        if (err->len) {
            rc |= rf_buf_puts(&b, " | error: ");
            rc |= rf_buf_append(&b, err->data, err->len);
        }
        rc |= rf_buf_putc(&b, '\n');
    } else {
        rc |= rf_buf_puts(&b, "]}\n");
    }
    if (rc) {
        rf_buf_free(&b);
        return rf_fail(RF_ERR_NOMEM, "status: out of memory");
    }
    fwrite(b.data, 1, b.len, out);
    rf_buf_free(&b);
    return RF_OK;
}

int rf_run_dir_status(const char *dir, bool lines, FILE *out) {
    char *path = NULL, *text = NULL;
    size_t len = 0;
    if (asprintf(&path, "%s/stats.json", dir) < 0) return rf_fail(RF_ERR_NOMEM, "out of memory");
    int rc = rf_read_file(path, MAX_STATS, &text, &len);
    rf_buf err = RF_BUF_INIT;
    if (rc) {
        free(path);
        if (!has_file(dir, "run.log"))
            return rf_fail(RF_ERR_NOT_FOUND, "%s is not a run directory (no stats.json, no run.log)",
                           dir);
        /* no stats.json yet: running, or killed before it ended */
        last_error(dir, &err);
        rc = emit(out, dir, "unfinished", &err, NULL, lines);
        rf_buf_free(&err);
        return rc;
    }
    rf_json_doc *doc = rf_json_doc_new();
    const rf_json *root = NULL;
    if (!doc)
        rc = rf_fail(RF_ERR_NOMEM, "out of memory");
    else if ((rc = rf_json_parse(doc, text, len, &root)) == RF_OK && root->type != RF_JSON_OBJECT)
        rc = RF_ERR_PARSE;
    if (rc == RF_ERR_PARSE) rc = rf_fail(RF_ERR_PARSE, "%s is not a JSON object", path);
    if (!rc) {
        const rf_json *run = rf_json_get(root, "run");
        const rf_json *ok = run ? rf_json_get(run, "ok") : NULL;
        bool good = ok && (ok->type == RF_JSON_TRUE || (ok->type == RF_JSON_NUMBER && ok->num));
        if (!good) last_error(dir, &err);
        rc = emit(out, dir, good ? "succeeded" : "failed", &err, root, lines);
    }
    rf_json_doc_free(doc);
    rf_buf_free(&err);
    free(text);
    free(path);
    return rc;
}
