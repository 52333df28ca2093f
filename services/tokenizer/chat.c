/* Conversations through a chat template: see chat.h. */
#include "tokenizer/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/gguf.h"
#include "common/json.h"
#include "common/sys.h"
#include "tokenizer/tok_internal.h"

/* tmpl without whitespace outside quotes and with the escape \n (two
 * characters) as a newline: enough to compare template expressions. */
static char *normalize(const char *t) {
    size_t n = strlen(t), j = 0;
    char *o = malloc(n + 1), q = 0;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (q) {
            if (c == '\\' && i + 1 < n) {
                char e = t[++i];
                o[j++] = e == 'n' ? '\n' : e;
                continue;
            }
            if (c == q) q = 0;
            o[j++] = c;
        } else if (c == '\'' || c == '"') {
            q = c;
            o[j++] = c;
        } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            o[j++] = c;
        }
    }
    o[j] = 0;
    return o;
}

/* The literal of the default system block: the jinja string printed when
 * the first message is not a system message (NULL when the template has
 * none; *err set when it has one that does not parse). */
static char *default_system(const char *norm, int *err) {
    static const char *const heads[] = {
        "{%ifloop.firstandmessages[0]['role']!='system'%}{{",
        "{%ifloop.firstandmessages[0]['role']!=\"system\"%}{{",
    };
    *err = 0;
    const char *p = NULL;
    for (size_t i = 0; i < 2 && !p; i++)
        if ((p = strstr(norm, heads[i]))) p += strlen(heads[i]);
    if (!p) return NULL;
    char q = *p;
    const char *e = (q == '\'' || q == '"') ? strchr(p + 1, q) : NULL;
    if (!e || strncmp(e + 1, "}}{%endif%}", 11) != 0) {
        *err = 1;
        return NULL;
    }
    return strndup(p + 1, (size_t)(e - p - 1));
}

/* The template's default system block (malloc'd, NULL when none) after
 * checking that tmpl is the ChatML template this file renders. */
static int chatml_check(const char *tmpl, char **sys_out) {
    static const char *const msg_expr[] = {
        "{{'<|im_start|>'+message['role']+'\n'+message['content']+'<|im_end|>'+'\n'}}",
        "{{'<|im_start|>'+message['role']+'\n'+message['content']+'<|im_end|>\n'}}",
    };
    *sys_out = NULL;
    if (!tmpl) return rf_fail(RF_ERR_NOT_FOUND, "chat: the model has no chat template");
    char *norm = normalize(tmpl);
    if (!norm) return RF_ERR_NOMEM;
    bool chatml = strstr(norm, "{%formessageinmessages%}") &&
                  (strstr(norm, msg_expr[0]) || strstr(norm, msg_expr[1])) &&
                  strstr(norm, "{%ifadd_generation_prompt%}{{'<|im_start|>assistant\n'}}{%endif%}");
    int err = 0;
    char *sys = chatml ? default_system(norm, &err) : NULL;
    free(norm);
    if (!chatml || err) {
        free(sys);
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "chat: the model's chat template is not the ChatML one this renderer "
                       "knows (<|im_start|>role\\n...<|im_end|>\\n)");
    }
    *sys_out = sys;
    return RF_OK;
}

/* The rendering as pieces: fn(text, len, target) in order. */
typedef int (*piece_fn)(void *ctx, const char *s, size_t n, bool target);

static int render_pieces(const char *tmpl, const rf_chat_msg *msgs, size_t n, bool gen_prompt,
                         piece_fn fn, void *ctx) {
    char *sys;
    int rc = chatml_check(tmpl, &sys);
    if (rc) return rc;
    rf_buf head = RF_BUF_INIT; /* the non-target text since the last target piece */
    if (sys && n > 0 && strcmp(msgs[0].role, "system") != 0) rc = rf_buf_puts(&head, sys);
    free(sys);
    for (size_t i = 0; i < n && !rc; i++) {
        bool target = strcmp(msgs[i].role, "assistant") == 0;
        rc = rf_buf_puts(&head, "<|im_start|>");
        if (!rc) rc = rf_buf_puts(&head, msgs[i].role);
        if (!rc) rc = rf_buf_putc(&head, '\n');
        if (!rc && !target) {
            rc = rf_buf_puts(&head, msgs[i].content);
            if (!rc) rc = rf_buf_puts(&head, "<|im_end|>\n");
            continue;
        }
        if (!rc && head.len) rc = fn(ctx, head.data, head.len, false);
        rf_buf_reset(&head);
        rf_buf t = RF_BUF_INIT;
        if (!rc) rc = rf_buf_puts(&t, msgs[i].content);
        if (!rc) rc = rf_buf_puts(&t, "<|im_end|>\n");
        if (!rc) rc = fn(ctx, t.data, t.len, true);
        rf_buf_free(&t);
    }
    if (!rc && gen_prompt) rc = rf_buf_puts(&head, "<|im_start|>assistant\n");
    if (!rc && head.len) rc = fn(ctx, head.data, head.len, false);
    rf_buf_free(&head);
    return rc;
}

static int append_piece(void *ctx, const char *s, size_t n, bool target) {
    (void)target;
    return rf_buf_append(ctx, s, n);
}

int rf_chat_render(const char *tmpl, const rf_chat_msg *msgs, size_t n, bool add_generation_prompt,
                   rf_buf *out) {
    return render_pieces(tmpl, msgs, n, add_generation_prompt, append_piece, out);
}

/* ---- where the template lives ---- */

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

static int from_gguf(const char *path, char **out) {
    rf_gguf_file *f;
    int rc = rf_gguf_open(path, &f);
    if (rc) return rc;
    const char *s;
    size_t n;
    if (rf_gguf_get_str(f, "tokenizer.chat_template", &s, &n) == RF_OK && !(*out = strndup(s, n)))
        rc = RF_ERR_NOMEM;
    rf_gguf_free(f);
    return rc;
}

int rf_chat_template_find(const char *path, char **out) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return rf_fail(RF_ERR_NOT_FOUND, "%s: no such file or folder", path);
    if (S_ISREG(st.st_mode) && has_suffix(path, ".gguf")) return from_gguf(path, out);
    char dir[4096], p[4200];
    snprintf(dir, sizeof dir, "%s", path);
    if (!S_ISDIR(st.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    char *text;
    size_t len;
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    if (rf_read_file(p, 16 << 20, &text, &len) == RF_OK) {
        rf_json_doc *doc = rf_json_doc_new();
        const rf_json *root, *t;
        int rc = doc ? RF_OK : RF_ERR_NOMEM;
        if (!rc && rf_json_parse(doc, text, len, &root) == RF_OK &&
            rf_json_is_str(t = rf_json_get(root, "chat_template")) &&
            !(*out = strndup(t->u.str, t->len)))
            rc = RF_ERR_NOMEM;
        rf_json_doc_free(doc);
        free(text);
        if (rc || *out) return rc;
    }
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    if (rf_read_file(p, 1 << 20, &text, &len) == RF_OK) *out = text;
    return RF_OK;
}

/* ---- canonical messages ---- */

int rf_chat_msgs_parse(const char *json, size_t len, rf_chat_msg **msgs, size_t *n, char **store) {
    *msgs = NULL, *n = 0, *store = NULL;
    rf_json_doc *doc = rf_json_doc_new();
    if (!doc) return RF_ERR_NOMEM;
    const rf_json *root;
    int rc = rf_json_parse(doc, json, len, &root);
    if (!rc && root->type != RF_JSON_ARRAY) rc = rf_fail(RF_ERR_INVALID, "messages: not an array");
    size_t bytes = 0;
    for (size_t i = 0; !rc && i < root->len; i++) {
        const rf_json *r = rf_json_get(&root->u.items[i], "role");
        const rf_json *c = rf_json_get(&root->u.items[i], "content");
        if (!rf_json_is_str(r) || !rf_json_is_str(c))
            rc = rf_fail(RF_ERR_INVALID, "messages[%zu]: role and content must be strings", i);
        else
            bytes += r->len + c->len + 2;
    }
    if (!rc && (!(*msgs = calloc(root->len ? root->len : 1, sizeof **msgs)) ||
                !(*store = malloc(bytes ? bytes : 1))))
        rc = RF_ERR_NOMEM;
    char *p = *store;
    for (size_t i = 0; !rc && i < root->len; i++) {
        const rf_json *f[2] = {rf_json_get(&root->u.items[i], "role"),
                               rf_json_get(&root->u.items[i], "content")};
        const char *s[2];
        for (int k = 0; k < 2; k++) {
            memcpy(p, f[k]->u.str, f[k]->len);
            p[f[k]->len] = 0;
            s[k] = p;
            p += f[k]->len + 1;
        }
        (*msgs)[i] = (rf_chat_msg){s[0], s[1]};
    }
    if (!rc) *n = root->len;
    rf_json_doc_free(doc);
    if (rc) {
        free(*msgs), free(*store);
        *msgs = NULL, *store = NULL;
    }
    return rc;
}

/* ---- the SFT encoding ---- */

typedef struct enc_ctx {
    rf_tok_state *ts;
    rf_tok_encoding piece;
    rf_buf ids, mask, text; /* uint32 ids, mask bytes, the whole rendering */
} enc_ctx;

static int encode_piece(void *ctx, const char *s, size_t n, bool target) {
    enc_ctx *c = ctx;
    int rc = rf_tok_encode(c->ts, s, n, false, &c->piece);
    if (!rc) rc = rf_buf_append(&c->ids, c->piece.ids, c->piece.len * sizeof(uint32_t));
    for (size_t i = 0; !rc && i < c->piece.len; i++)
        rc = rf_buf_putc(&c->mask, target ? 1 : 0);
    if (!rc) rc = rf_buf_append(&c->text, s, n);
    return rc;
}

int rf_chat_encode(rf_tok_state *ts, const char *tmpl, const rf_chat_msg *msgs, size_t n,
                   rf_tok_encoding *e, uint8_t **mask, bool *merged) {
    *mask = NULL, *merged = false;
    enc_ctx c = {.ts = ts, .ids = RF_BUF_INIT, .mask = RF_BUF_INIT, .text = RF_BUF_INIT};
    int rc = render_pieces(tmpl, msgs, n, false, encode_piece, &c);
    if (!rc) rc = rf_tok_encode(ts, c.text.data ? c.text.data : "", c.text.len, false, e);
    size_t len = c.ids.len / sizeof(uint32_t);
    if (!rc) {
        *merged = e->len != len || (len && memcmp(e->ids, c.ids.data, c.ids.len) != 0);
        if (*merged && !(rc = rf_tok_encoding_reserve(e, len))) {
            /* keep the piecewise ids: their mask is exact */
            memcpy(e->ids, c.ids.data, c.ids.len);
            for (size_t i = 0; i < len; i++)
                e->type_ids[i] = 0, e->attention_mask[i] = 1, e->special_mask[i] = 0;
            e->len = len;
        }
    }
    if (!rc && !(*mask = malloc(len ? len : 1))) rc = RF_ERR_NOMEM;
    if (!rc && len) memcpy(*mask, c.mask.data, len);
    rf_tok_encoding_free(&c.piece);
    rf_buf_free(&c.ids);
    rf_buf_free(&c.mask);
    rf_buf_free(&c.text);
    return rc;
}
