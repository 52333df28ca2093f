#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "common/error.h"

extern char **environ;

struct rf_cfg {
    rf_cfg_kind kind;
    char *path;   /* dotted path for messages */
    char *source; /* file name, or "environment" */
    int line;
    char *scalar;  /* SCALAR */
    size_t n, cap; /* MAP / SEQ children */
    char **keys;   /* MAP keys */
    rf_cfg **vals;
};

static rf_cfg *node_new(rf_cfg_kind kind, const char *path, const char *source, int line) {
    rf_cfg *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->kind = kind;
    c->path = strdup(path);
    c->source = strdup(source);
    c->line = line;
    if (!c->path || !c->source) {
        free(c->path);
        free(c->source);
        free(c);
        return NULL;
    }
    return c;
}

void rf_cfg_free(rf_cfg *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) {
        if (c->keys) free(c->keys[i]);
        rf_cfg_free(c->vals[i]);
    }
    free(c->keys);
    free(c->vals);
    free(c->scalar);
    free(c->path);
    free(c->source);
    free(c);
}

static int add_child(rf_cfg *parent, const char *key, rf_cfg *child) {
    if (parent->n == parent->cap) {
        size_t cap = parent->cap ? parent->cap * 2 : 8;
        rf_cfg **vals = realloc(parent->vals, cap * sizeof *vals);
        if (!vals) return RF_ERR_NOMEM;
        parent->vals = vals;
        if (parent->kind == RF_CFG_MAP) {
            char **keys = realloc(parent->keys, cap * sizeof *keys);
            if (!keys) return RF_ERR_NOMEM;
            parent->keys = keys;
        }
        parent->cap = cap;
    }
    if (parent->kind == RF_CFG_MAP) {
        char *k = strdup(key);
        if (!k) return RF_ERR_NOMEM;
        parent->keys[parent->n] = k;
    }
    parent->vals[parent->n++] = child;
    return RF_OK;
}

static char *child_path(const rf_cfg *parent, const char *key, size_t index) {
    char *p = NULL;
    int rc;
    if (parent->kind == RF_CFG_MAP)
        rc = parent->path[0] ? asprintf(&p, "%s.%s", parent->path, key) : asprintf(&p, "%s", key);
    else
        rc = asprintf(&p, "%s[%zu]", parent->path, index);
    return rc < 0 ? NULL : p;
}

static int convert(yaml_document_t *doc, yaml_node_t *yn, const char *path, const char *source,
                   int depth, rf_cfg **out) {
    if (depth > 64) return rf_fail(RF_ERR_PARSE, "%s: nesting too deep at %s", source, path);
    int line = (int)yn->start_mark.line + 1;
    rf_cfg *c;
    switch (yn->type) {
    case YAML_SCALAR_NODE:
        c = node_new(RF_CFG_SCALAR, path, source, line);
        if (!c) return RF_ERR_NOMEM;
        c->scalar = strndup((const char *)yn->data.scalar.value, yn->data.scalar.length);
        if (!c->scalar) {
            rf_cfg_free(c);
            return RF_ERR_NOMEM;
        }
        break;
    case YAML_SEQUENCE_NODE: {
        c = node_new(RF_CFG_SEQ, path, source, line);
        if (!c) return RF_ERR_NOMEM;
        size_t i = 0;
        for (yaml_node_item_t *it = yn->data.sequence.items.start; it < yn->data.sequence.items.top;
             it++, i++) {
            char *cp = child_path(c, NULL, i);
            rf_cfg *child = NULL;
            int rc =
                cp ? convert(doc, yaml_document_get_node(doc, *it), cp, source, depth + 1, &child)
                   : RF_ERR_NOMEM;
            free(cp);
            if (!rc && (rc = add_child(c, NULL, child))) rf_cfg_free(child);
            if (rc) {
                rf_cfg_free(c);
                return rc;
            }
        }
        break;
    }
    case YAML_MAPPING_NODE: {
        c = node_new(RF_CFG_MAP, path, source, line);
        if (!c) return RF_ERR_NOMEM;
        for (yaml_node_pair_t *pr = yn->data.mapping.pairs.start; pr < yn->data.mapping.pairs.top;
             pr++) {
            yaml_node_t *kn = yaml_document_get_node(doc, pr->key);
            if (!kn || kn->type != YAML_SCALAR_NODE) {
                rf_cfg_free(c);
                return rf_fail(RF_ERR_PARSE, "%s:%d: %s: keys must be plain scalars", source, line,
                               path[0] ? path : "(top level)");
            }
            const char *key = (const char *)kn->data.scalar.value;
            for (size_t i = 0; i < c->n; i++) {
                if (strcmp(c->keys[i], key) == 0) {
                    rf_cfg_free(c);
                    return rf_fail(RF_ERR_PARSE, "%s:%d: %s%s%s: duplicate key", source,
                                   (int)kn->start_mark.line + 1, path, path[0] ? "." : "", key);
                }
            }
            char *cp = child_path(c, key, 0);
            rf_cfg *child = NULL;
            int rc = cp ? convert(doc, yaml_document_get_node(doc, pr->value), cp, source,
                                  depth + 1, &child)
                        : RF_ERR_NOMEM;
            free(cp);
            if (!rc && (rc = add_child(c, key, child))) rf_cfg_free(child);
            if (rc) {
                rf_cfg_free(c);
                return rc;
            }
        }
        break;
    }
    default:
        return rf_fail(RF_ERR_PARSE, "%s:%d: %s: empty node", source, line, path);
    }
    *out = c;
    return RF_OK;
}

int rf_cfg_load_string(const char *yaml, size_t len, const char *name, rf_cfg **root) {
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return RF_ERR_NOMEM;
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        int rc =
            rf_fail(RF_ERR_PARSE, "%s:%zu:%zu: YAML error: %s %s", name,
                    parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                    parser.problem ? parser.problem : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return rc;
    }
    yaml_node_t *top = yaml_document_get_root_node(&doc);
    int rc;
    if (!top) {
        *root = node_new(RF_CFG_MAP, "", name, 1); /* empty document = empty map */
        rc = *root ? RF_OK : RF_ERR_NOMEM;
    } else if (top->type != YAML_MAPPING_NODE) {
        rc = rf_fail(RF_ERR_PARSE, "%s: the top level must be a mapping of sections", name);
    } else {
        rc = convert(&doc, top, "", name, 0, root);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

int rf_cfg_load_file(const char *path, rf_cfg **root) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return rf_fail(errno == ENOENT ? RF_ERR_NOT_FOUND : RF_ERR_IO, "%s: %s", path,
                       strerror(errno));
    char *data = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[65536];
    int rc = RF_OK;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n > (16u << 20)) {
            rc = rf_fail(RF_ERR_RANGE, "%s: spec larger than 16 MiB", path);
            break;
        }
        if (len + n > cap) {
            cap = (len + n) * 2;
            char *d = realloc(data, cap);
            if (!d) {
                rc = RF_ERR_NOMEM;
                break;
            }
            data = d;
        }
        memcpy(data + len, chunk, n);
        len += n;
    }
    if (!rc && ferror(f)) rc = rf_fail(RF_ERR_IO, "%s: read failed", path);
    fclose(f);
    if (!rc) rc = rf_cfg_load_string(data ? data : "", len, path, root);
    free(data);
    return rc;
}

int rf_cfg_set(rf_cfg *root, const char *dotted, const char *value) {
    rf_cfg *node = root;
    const char *seg = dotted;
    for (;;) {
        const char *dot = strchr(seg, '.');
        size_t n = dot ? (size_t)(dot - seg) : strlen(seg);
        if (n == 0) return rf_fail(RF_ERR_INVALID, "empty key segment in '%s'", dotted);
        if (node->kind != RF_CFG_MAP)
            return rf_fail(RF_ERR_INVALID, "%s: cannot set '%s': %s is not a mapping", dotted,
                           dotted, node->path[0] ? node->path : "top level");
        char *key = strndup(seg, n);
        if (!key) return RF_ERR_NOMEM;
        size_t i;
        for (i = 0; i < node->n && strcmp(node->keys[i], key) != 0; i++) {
        }
        int rc = RF_OK;
        if (i == node->n) {
            char *cp = child_path(node, key, 0);
            rf_cfg *child =
                cp ? node_new(dot ? RF_CFG_MAP : RF_CFG_SCALAR, cp, "environment", 0) : NULL;
            free(cp);
            if (!child || (rc = add_child(node, key, child))) {
                rf_cfg_free(child);
                rc = RF_ERR_NOMEM;
            }
        }
        free(key);
        if (rc) return rc;
        rf_cfg *child = node->vals[i];
        if (!dot) {
            if (child->kind != RF_CFG_SCALAR)
                return rf_fail(RF_ERR_INVALID, "%s: cannot replace a %s with a scalar", child->path,
                               child->kind == RF_CFG_MAP ? "mapping" : "sequence");
            char *v = strdup(value), *src = strdup("environment");
            if (!v || !src) {
                free(v);
                free(src);
                return RF_ERR_NOMEM;
            }
            free(child->scalar);
            free(child->source);
            child->scalar = v;
            child->source = src;
            child->line = 0;
            return RF_OK;
        }
        node = child;
        seg = dot + 1;
    }
}

int rf_cfg_apply_env(rf_cfg *root) {
    static const char prefix[] = "REFINERY__";
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, prefix, sizeof prefix - 1) != 0) continue;
        const char *name = *e + sizeof prefix - 1;
        const char *eq = strchr(name, '=');
        if (!eq) continue;
        char dotted[256];
        size_t o = 0;
        for (const char *p = name; p < eq && o + 1 < sizeof dotted; p++) {
            if (p[0] == '_' && p + 1 < eq && p[1] == '_') {
                dotted[o++] = '.';
                p++;
            } else {
                dotted[o++] = (char)tolower((unsigned char)*p);
            }
        }
        dotted[o] = 0;
        int rc = rf_cfg_set(root, dotted, eq + 1);
        if (rc) return rc;
    }
    return RF_OK;
}

rf_cfg_kind rf_cfg_kind_of(const rf_cfg *n) {
    return n->kind;
}
const char *rf_cfg_path(const rf_cfg *n) {
    return n->path;
}
int rf_cfg_line(const rf_cfg *n) {
    return n->line;
}
const char *rf_cfg_source(const rf_cfg *n) {
    return n->source;
}
size_t rf_cfg_len(const rf_cfg *n) {
    return n && n->kind != RF_CFG_SCALAR ? n->n : 0;
}
const rf_cfg *rf_cfg_at(const rf_cfg *n, size_t i) {
    return n && i < rf_cfg_len(n) ? n->vals[i] : NULL;
}
const char *rf_cfg_key_at(const rf_cfg *n, size_t i) {
    return n && n->kind == RF_CFG_MAP && i < n->n ? n->keys[i] : NULL;
}
const char *rf_cfg_scalar(const rf_cfg *n) {
    return n && n->kind == RF_CFG_SCALAR ? n->scalar : NULL;
}

const rf_cfg *rf_cfg_get(const rf_cfg *n, const char *dotted) {
    const char *seg = dotted;
    while (n) {
        const char *dot = strchr(seg, '.');
        size_t len = dot ? (size_t)(dot - seg) : strlen(seg);
        if (n->kind != RF_CFG_MAP) return NULL;
        const rf_cfg *next = NULL;
        for (size_t i = 0; i < n->n; i++)
            if (strlen(n->keys[i]) == len && memcmp(n->keys[i], seg, len) == 0) next = n->vals[i];
        n = next;
        if (!dot) return n;
        seg = dot + 1;
    }
    return NULL;
}

/* "spec.yaml:12: ingest.threads" or "environment: ingest.threads". */
static int bad(const rf_cfg *v, const char *expected) {
    if (v->line)
        return rf_fail(RF_ERR_INVALID, "%s:%d: %s: expected %s, got '%s'", v->source, v->line,
                       v->path, expected, v->scalar ? v->scalar : "(a mapping or list)");
    return rf_fail(RF_ERR_INVALID, "%s: %s: expected %s, got '%s'", v->source, v->path, expected,
                   v->scalar ? v->scalar : "(a mapping or list)");
}

int rf_cfg_str(const rf_cfg *n, const char *key, const char *def, const char **out) {
    const rf_cfg *v = rf_cfg_get(n, key);
    if (!v) {
        *out = def;
        return RF_OK;
    }
    if (v->kind != RF_CFG_SCALAR) return bad(v, "a string");
    *out = v->scalar;
    return RF_OK;
}

int rf_cfg_int(const rf_cfg *n, const char *key, int64_t def, int64_t min, int64_t max,
               int64_t *out) {
    const rf_cfg *v = rf_cfg_get(n, key);
    if (!v) {
        *out = def;
        return RF_OK;
    }
    char expected[96];
    snprintf(expected, sizeof expected, "an integer in [%lld, %lld]", (long long)min,
             (long long)max);
    if (v->kind != RF_CFG_SCALAR || !v->scalar[0]) return bad(v, expected);
    char *end;
    errno = 0;
    long long x = strtoll(v->scalar, &end, 10);
    if (errno || *end || x < min || x > max) return bad(v, expected);
    *out = x;
    return RF_OK;
}

int rf_cfg_real(const rf_cfg *n, const char *key, double def, double min, double max, double *out) {
    const rf_cfg *v = rf_cfg_get(n, key);
    if (!v) {
        *out = def;
        return RF_OK;
    }
    char expected[96];
    snprintf(expected, sizeof expected, "a number in [%g, %g]", min, max);
    if (v->kind != RF_CFG_SCALAR || !v->scalar[0]) return bad(v, expected);
    char *end;
    errno = 0;
    double x = strtod(v->scalar, &end);
    if (errno || *end || !isfinite(x) || x < min || x > max) return bad(v, expected);
    *out = x;
    return RF_OK;
}

int rf_cfg_bool(const rf_cfg *n, const char *key, bool def, bool *out) {
    const rf_cfg *v = rf_cfg_get(n, key);
    if (!v) {
        *out = def;
        return RF_OK;
    }
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no",
                                                                                "off", "0"};
    if (v->kind == RF_CFG_SCALAR) {
        for (int i = 0; i < 4; i++) {
            if (strcasecmp(v->scalar, yes[i]) == 0) {
                *out = true;
                return RF_OK;
            }
            if (strcasecmp(v->scalar, no[i]) == 0) {
                *out = false;
                return RF_OK;
            }
        }
    }
    return bad(v, "true or false");
}

int rf_cfg_enum(const rf_cfg *n, const char *key, const char *const *choices, int def, int *out) {
    const rf_cfg *v = rf_cfg_get(n, key);
    if (!v) {
        *out = def;
        return RF_OK;
    }
    char expected[256] = "one of";
    for (int i = 0; choices[i]; i++) {
        if (v->kind == RF_CFG_SCALAR && strcmp(v->scalar, choices[i]) == 0) {
            *out = i;
            return RF_OK;
        }
        size_t o = strlen(expected);
        snprintf(expected + o, sizeof expected - o, "%s %s", i ? "," : "", choices[i]);
    }
    return bad(v, expected);
}

int rf_cfg_strlist(const rf_cfg *n, const char *key, const char ***out, size_t *count) {
    const rf_cfg *v = rf_cfg_get(n, key);
    *out = NULL;
    *count = 0;
    if (!v) return RF_OK;
    size_t k = v->kind == RF_CFG_SCALAR ? 1 : v->n;
    if (v->kind == RF_CFG_MAP) return bad(v, "a string or a list of strings");
    const char **list = calloc(k + 1, sizeof *list);
    if (!list) return RF_ERR_NOMEM;
    if (v->kind == RF_CFG_SCALAR) {
        list[0] = v->scalar;
    } else {
        for (size_t i = 0; i < k; i++) {
            if (v->vals[i]->kind != RF_CFG_SCALAR) {
                free(list);
                return bad(v->vals[i], "a string");
            }
            list[i] = v->vals[i]->scalar;
        }
    }
    *out = list;
    *count = k;
    return RF_OK;
}

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

int rf_cfg_check_keys(const rf_cfg *n, const char *const *allowed) {
    if (!n) return RF_OK;
    if (n->kind != RF_CFG_MAP) return bad(n, "a mapping");
    for (size_t i = 0; i < n->n; i++) {
        const char *k = n->keys[i];
        const char *best = NULL;
        size_t best_d = 3;
        int ok = 0;
        for (int j = 0; allowed[j]; j++) {
            if (strcmp(k, allowed[j]) == 0) {
                ok = 1;
                break;
            }
            size_t d = edit_distance(k, allowed[j]);
            if (d < best_d) {
                best_d = d;
                best = allowed[j];
            }
        }
        if (ok) continue;
        const rf_cfg *v = n->vals[i];
        char where[64] = "";
        if (v->line) snprintf(where, sizeof where, ":%d", v->line);
        if (best)
            return rf_fail(RF_ERR_INVALID, "%s%s: unknown key '%s' (did you mean '%s'?)", v->source,
                           where, v->path, best);
        char list[512] = "";
        for (int j = 0; allowed[j]; j++) {
            size_t o = strlen(list);
            snprintf(list + o, sizeof list - o, "%s%s", j ? ", " : "", allowed[j]);
        }
        return rf_fail(RF_ERR_INVALID, "%s%s: unknown key '%s' (expected one of: %s)", v->source,
                       where, v->path, list);
    }
    return RF_OK;
}
