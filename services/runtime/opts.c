/* Option table parsing: flags > environment > defaults. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "runtime/svc.h"

static int set_value(const rf_opt *o, const char *v, const char *from) {
    char *end;
    switch (o->type) {
    case RF_OPT_STR:
        *(const char **)o->dest = v;
        return RF_OK;
    case RF_OPT_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end)
            return rf_fail(RF_ERR_INVALID, "%s: expected an integer, got '%s'", from, v);
        *(int64_t *)o->dest = x;
        return RF_OK;
    }
    case RF_OPT_REAL: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x))
            return rf_fail(RF_ERR_INVALID, "%s: expected a number, got '%s'", from, v);
        *(double *)o->dest = x;
        return RF_OK;
    }
    case RF_OPT_BOOL:
        if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes")) {
            *(bool *)o->dest = true;
        } else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no")) {
            *(bool *)o->dest = false;
        } else {
            return rf_fail(RF_ERR_INVALID, "%s: expected true or false, got '%s'", from, v);
        }
        return RF_OK;
    }
    return rf_fail(RF_ERR_INTERNAL, "%s: unknown option type", from);
}

static void usage(const char *prog, const char *summary, const rf_opt *opts, size_t n) {
    printf("usage: %s [options]\n%s\n\noptions (flag, environment variable, default):\n", prog,
           summary);
    for (size_t i = 0; i < n; i++)
        printf("  --%-22s %-28s %s\n      %s\n", opts[i].flag, opts[i].env ? opts[i].env : "",
               opts[i].def ? opts[i].def : "(unset)", opts[i].help);
}

int rf_svc_parse(const char *prog, const char *summary, const rf_opt *opts, size_t n, int argc,
                 char **argv) {
    const char **seen = calloc(n ? n : 1, sizeof *seen); /* value from the command line */
    if (!seen) return RF_ERR_NOMEM;
    int rc = RF_OK;
    for (int i = 1; i < argc && rc == RF_OK; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(prog, summary, opts, n);
            free(seen);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            rc = rf_fail(RF_ERR_INVALID, "unexpected argument '%s' (see --help)", a);
            break;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        size_t k = 0;
        while (k < n && !(strlen(opts[k].flag) == len && !strncmp(opts[k].flag, name, len)))
            k++;
        if (k == n) {
            rc = rf_fail(RF_ERR_INVALID, "unknown option --%.*s (see --help)", (int)len, name);
        } else if (eq) {
            seen[k] = eq + 1;
        } else if (opts[k].type == RF_OPT_BOOL) {
            seen[k] = "true";
        } else if (i + 1 < argc) {
            seen[k] = argv[++i];
        } else {
            rc = rf_fail(RF_ERR_INVALID, "--%s needs a value", opts[k].flag);
        }
    }
    for (size_t k = 0; k < n && rc == RF_OK; k++) {
        char from[128];
        const char *v = seen[k];
        snprintf(from, sizeof from, "--%s", opts[k].flag);
        if (!v && opts[k].env && (v = getenv(opts[k].env)))
            snprintf(from, sizeof from, "%s", opts[k].env);
        if (!v) {
            v = opts[k].def;
            snprintf(from, sizeof from, "default of --%s", opts[k].flag);
        }
        if (v)
            rc = set_value(&opts[k], v, from);
        else if (opts[k].type == RF_OPT_STR)
            *(const char **)opts[k].dest = NULL;
    }
    free(seen);
    return rc;
}

int rf_svc_split_props(const char *spec, char **storage, const char ***out) {
    *storage = strdup(spec ? spec : "");
    size_t n = 1;
    for (const char *p = spec ? spec : ""; *p; p++)
        n += *p == ';';
    *out = calloc(2 * n + 1, sizeof **out);
    if (!*storage || !*out) {
        free(*storage);
        free(*out);
        *storage = NULL;
        *out = NULL;
        return RF_ERR_NOMEM;
    }
    size_t k = 0;
    char *save = NULL;
    for (char *e = strtok_r(*storage, ";", &save); e; e = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(e, '=');
        if (!eq || eq == e) {
            int rc = rf_fail(RF_ERR_INVALID, "Kafka property '%s' is not name=value", e);
            free(*storage);
            free(*out);
            *storage = NULL;
            *out = NULL;
            return rc;
        }
        *eq = 0;
        (*out)[k++] = e;
        (*out)[k++] = eq + 1;
    }
    return RF_OK;
}
