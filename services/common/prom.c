/* Families in a list under the registry mutex; series in an array per family
 * under the family mutex; values as atomic bit patterns of doubles. */
#include "common/prom.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

const double rf_prom_latency_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                          0.5,   1,      2.5,   5,    10,    30,   60};
const size_t rf_prom_nlatency_buckets = sizeof rf_prom_latency_buckets / sizeof(double);

typedef struct series {
    char *values[RF_PROM_MAX_LABELS];
    _Atomic uint64_t value;                        /* double bits: counter/gauge, or sum */
    _Atomic uint64_t count;                        /* histogram observations */
    _Atomic uint64_t buckets[RF_PROM_MAX_BUCKETS]; /* histogram, not cumulative */
} series;

struct rf_prom_family {
    rf_prom *reg;
    rf_prom_type type;
    char *name, *help;
    int nlabels;
    char *labels[RF_PROM_MAX_LABELS];
    double bounds[RF_PROM_MAX_BUCKETS];
    size_t nbounds;
    pthread_mutex_t mu;
    series **series;
    size_t nseries, cap;
    struct rf_prom_family *next;
};

typedef struct collector {
    void (*fn)(rf_prom *r, void *user);
    void *user;
} collector;

struct rf_prom {
    pthread_mutex_t mu;
    rf_prom_family *families;
    collector collect[8];
    int ncollect;
    _Atomic uint64_t dropped;
};

static double bits_to_double(uint64_t b) {
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static uint64_t double_to_bits(double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static void atomic_add_double(_Atomic uint64_t *p, double v) {
    uint64_t old = atomic_load(p);
    while (!atomic_compare_exchange_weak(p, &old, double_to_bits(bits_to_double(old) + v))) {
    }
}

rf_prom *rf_prom_new(void) {
    rf_prom *r = calloc(1, sizeof *r);
    if (r) pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void family_free(rf_prom_family *f) {
    for (size_t i = 0; i < f->nseries; i++) {
        for (int k = 0; k < f->nlabels; k++)
            free(f->series[i]->values[k]);
        free(f->series[i]);
    }
    free(f->series);
    for (int k = 0; k < f->nlabels; k++)
        free(f->labels[k]);
    free(f->name);
    free(f->help);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

void rf_prom_free(rf_prom *r) {
    if (!r) return;
    for (rf_prom_family *f = r->families, *next; f; f = next) {
        next = f->next;
        family_free(f);
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static rf_prom *default_reg;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void default_init(void) {
    default_reg = rf_prom_new();
}

rf_prom *rf_prom_default(void) {
    pthread_once(&default_once, default_init);
    return default_reg;
}

static int valid_name(const char *s, int allow_colon) {
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++) {
        int alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
                    (allow_colon && *p == ':');
        if (!alpha && !(p > s && *p >= '0' && *p <= '9')) return 0;
    }
    return 1;
}

/* Splits "a,b" into f->labels. */
static int parse_labels(rf_prom_family *f, const char *labels) {
    if (!labels || !*labels) return RF_OK;
    const char *p = labels;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (f->nlabels == RF_PROM_MAX_LABELS)
            return rf_fail(RF_ERR_INVALID, "metric %s: more than %d labels", f->name,
                           RF_PROM_MAX_LABELS);
        char *l = strndup(p, n);
        if (!l) return RF_ERR_NOMEM;
        f->labels[f->nlabels++] = l;
        if (!valid_name(l, 0) || !strncmp(l, "__", 2) ||
            (f->type == RF_PROM_HISTOGRAM && !strcmp(l, "le")))
            return rf_fail(RF_ERR_INVALID, "metric %s: bad label name '%s'", f->name, l);
        if (!comma) break;
        p = comma + 1;
    }
    return RF_OK;
}

static int same_labels(const rf_prom_family *f, const char *labels) {
    char joined[256] = "";
    size_t at = 0;
    for (int k = 0; k < f->nlabels; k++)
        at += (size_t)snprintf(joined + at, sizeof joined - (at < sizeof joined ? at : 0),
                               k ? ",%s" : "%s", f->labels[k]);
    return !strcmp(joined, labels ? labels : "");
}

rf_prom_family *rf_prom_family_get(rf_prom *r, rf_prom_type type, const char *name,
                                   const char *help, const char *labels, const double *buckets,
                                   size_t nbuckets) {
    if (!r) return NULL;
    if (!valid_name(name, 1)) {
        rf_fail(RF_ERR_INVALID, "bad metric name '%s'", name ? name : "(null)");
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    rf_prom_family *f = r->families;
    while (f && strcmp(f->name, name))
        f = f->next;
    if (f) {
        pthread_mutex_unlock(&r->mu);
        if (f->type != type || !same_labels(f, labels)) {
            rf_fail(RF_ERR_INVALID, "metric %s registered twice with different types or labels",
                    name);
            return NULL;
        }
        return f;
    }
    int rc = RF_OK;
    f = calloc(1, sizeof *f);
    if (!f) rc = RF_ERR_NOMEM;
    if (rc == RF_OK) {
        pthread_mutex_init(&f->mu, NULL);
        f->reg = r;
        f->type = type;
        f->name = strdup(name);
        f->help = strdup(help ? help : "");
        if (!f->name || !f->help) rc = RF_ERR_NOMEM;
    }
    if (rc == RF_OK) rc = parse_labels(f, labels);
    if (rc == RF_OK && type == RF_PROM_HISTOGRAM) {
        if (nbuckets == 0 || nbuckets > RF_PROM_MAX_BUCKETS - 1)
            rc = rf_fail(RF_ERR_INVALID, "metric %s: %zu buckets", name, nbuckets);
        for (size_t i = 0; rc == RF_OK && i < nbuckets; i++) {
            if (!isfinite(buckets[i]) || (i && buckets[i] <= buckets[i - 1]))
                rc = rf_fail(RF_ERR_INVALID, "metric %s: buckets must increase", name);
            f->bounds[i] = buckets[i];
        }
        f->nbounds = nbuckets;
    }
    if (rc != RF_OK) {
        pthread_mutex_unlock(&r->mu);
        if (f) family_free(f);
        if (rc == RF_ERR_NOMEM) rf_fail(rc, "metric %s: out of memory", name);
        return NULL;
    }
    f->next = r->families;
    r->families = f;
    pthread_mutex_unlock(&r->mu);
    return f;
}

/* The series of the label values in ap, added when new; NULL when the family
 * is full or memory ran out. */
static series *find_series(rf_prom_family *f, va_list ap) {
    const char *v[RF_PROM_MAX_LABELS];
    for (int k = 0; k < f->nlabels; k++) {
        v[k] = va_arg(ap, const char *);
        if (!v[k]) v[k] = "";
    }
    pthread_mutex_lock(&f->mu);
    series *s = NULL;
    for (size_t i = 0; i < f->nseries && !s; i++) {
        int k = 0;
        while (k < f->nlabels && !strcmp(f->series[i]->values[k], v[k]))
            k++;
        if (k == f->nlabels) s = f->series[i];
    }
    if (!s && f->nseries < RF_PROM_MAX_SERIES) {
        if (f->nseries == f->cap) {
            size_t cap = f->cap ? 2 * f->cap : 8;
            series **grown = realloc(f->series, cap * sizeof *grown);
            if (grown) {
                f->series = grown;
                f->cap = cap;
            }
        }
        if (f->nseries < f->cap && (s = calloc(1, sizeof *s))) {
            int k = 0;
            while (k < f->nlabels && (s->values[k] = strdup(v[k])))
                k++;
            if (k < f->nlabels) {
                while (k--)
                    free(s->values[k]);
                free(s);
                s = NULL;
            } else {
                f->series[f->nseries++] = s;
            }
        }
    }
    pthread_mutex_unlock(&f->mu);
    if (!s) atomic_fetch_add(&f->reg->dropped, 1);
    return s;
}

void rf_prom_add(rf_prom_family *f, double v, ...) {
    if (!f || f->type == RF_PROM_HISTOGRAM || (f->type == RF_PROM_COUNTER && !(v >= 0))) return;
    va_list ap;
    va_start(ap, v);
    series *s = find_series(f, ap);
    va_end(ap);
    if (s) atomic_add_double(&s->value, v);
}

void rf_prom_set(rf_prom_family *f, double v, ...) {
    if (!f || f->type == RF_PROM_HISTOGRAM) return;
    va_list ap;
    va_start(ap, v);
    series *s = find_series(f, ap);
    va_end(ap);
    if (s) atomic_store(&s->value, double_to_bits(v));
}

void rf_prom_observe(rf_prom_family *f, double v, ...) {
    if (!f || f->type != RF_PROM_HISTOGRAM || isnan(v)) return;
    va_list ap;
    va_start(ap, v);
    series *s = find_series(f, ap);
    va_end(ap);
    if (!s) return;
    size_t b = 0;
    while (b < f->nbounds && v > f->bounds[b])
        b++;
    atomic_fetch_add(&s->buckets[b], 1);
    atomic_add_double(&s->value, v);
    atomic_fetch_add(&s->count, 1);
}

double rf_prom_value(rf_prom_family *f, ...) {
    if (!f) return 0;
    const char *v[RF_PROM_MAX_LABELS];
    va_list ap;
    va_start(ap, f);
    for (int k = 0; k < f->nlabels; k++) {
        v[k] = va_arg(ap, const char *);
        if (!v[k]) v[k] = "";
    }
    va_end(ap);
    double out = 0;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nseries; i++) {
        int k = 0;
        while (k < f->nlabels && !strcmp(f->series[i]->values[k], v[k]))
            k++;
        if (k < f->nlabels) continue;
        out = f->type == RF_PROM_HISTOGRAM ? (double)atomic_load(&f->series[i]->count)
                                           : bits_to_double(atomic_load(&f->series[i]->value));
        break;
    }
    pthread_mutex_unlock(&f->mu);
    return out;
}

int rf_prom_on_collect(rf_prom *r, void (*fn)(rf_prom *r, void *user), void *user) {
    pthread_mutex_lock(&r->mu);
    int ok = r->ncollect < 8;
    if (ok) r->collect[r->ncollect++] = (collector){fn, user};
    pthread_mutex_unlock(&r->mu);
    return ok ? RF_OK : rf_fail(RF_ERR_RANGE, "metrics: too many collectors");
}

/* A sample value: Go's strconv formatting is not required, only a float the
 * parser reads back exactly: the shortest of %.15g/%.17g that round-trips. */
static int put_number(rf_buf *out, double v) {
    if (isnan(v)) return rf_buf_puts(out, "NaN");
    if (isinf(v)) return rf_buf_puts(out, v > 0 ? "+Inf" : "-Inf");
    char s[40];
    snprintf(s, sizeof s, "%.15g", v);
    if (strtod(s, NULL) != v) snprintf(s, sizeof s, "%.17g", v);
    return rf_buf_puts(out, s);
}

static int put_escaped(rf_buf *out, const char *s, int quote) {
    int rc = RF_OK;
    for (; rc == RF_OK && *s; s++) {
        if (*s == '\\')
            rc = rf_buf_puts(out, "\\\\");
        else if (*s == '\n')
            rc = rf_buf_puts(out, "\\n");
        else if (quote && *s == '"')
            rc = rf_buf_puts(out, "\\\"");
        else
            rc = rf_buf_putc(out, *s);
    }
    return rc;
}

/* {a="x",b="y"} with an optional trailing le; nothing when there are no labels. */
static int put_labels(rf_buf *out, const rf_prom_family *f, const series *s, const char *le) {
    if (f->nlabels == 0 && !le) return RF_OK;
    int rc = rf_buf_putc(out, '{');
    for (int k = 0; rc == RF_OK && k < f->nlabels; k++) {
        rc = rf_buf_printf(out, "%s%s=\"", k ? "," : "", f->labels[k]);
        if (rc == RF_OK) rc = put_escaped(out, s->values[k], 1);
        if (rc == RF_OK) rc = rf_buf_putc(out, '"');
    }
    if (rc == RF_OK && le) rc = rf_buf_printf(out, "%sle=\"%s\"", f->nlabels ? "," : "", le);
    return rc ? rc : rf_buf_putc(out, '}');
}

static int expose_family(rf_buf *out, rf_prom_family *f) {
    static const char *const types[] = {"counter", "gauge", "histogram"};
    int rc = rf_buf_printf(out, "# HELP %s ", f->name);
    if (rc == RF_OK) rc = put_escaped(out, f->help, 0);
    if (rc == RF_OK) rc = rf_buf_printf(out, "\n# TYPE %s %s\n", f->name, types[f->type]);
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; rc == RF_OK && i < f->nseries; i++) {
        series *s = f->series[i];
        if (f->type != RF_PROM_HISTOGRAM) {
            rc = rf_buf_puts(out, f->name);
            if (rc == RF_OK) rc = put_labels(out, f, s, NULL);
            if (rc == RF_OK) rc = rf_buf_putc(out, ' ');
            if (rc == RF_OK) rc = put_number(out, bits_to_double(atomic_load(&s->value)));
            if (rc == RF_OK) rc = rf_buf_putc(out, '\n');
            continue;
        }
        uint64_t cum = 0;
        for (size_t b = 0; rc == RF_OK && b <= f->nbounds; b++) {
            char le[40];
            if (b == f->nbounds) {
                snprintf(le, sizeof le, "+Inf");
            } else {
                rf_buf t = RF_BUF_INIT;
                rc = put_number(&t, f->bounds[b]);
                snprintf(le, sizeof le, "%s", t.data ? t.data : "0");
                rf_buf_free(&t);
            }
            cum += atomic_load(&s->buckets[b]);
            if (rc == RF_OK) rc = rf_buf_printf(out, "%s_bucket", f->name);
            if (rc == RF_OK) rc = put_labels(out, f, s, le);
            if (rc == RF_OK) rc = rf_buf_printf(out, " %llu\n", (unsigned long long)cum);
        }
        if (rc == RF_OK) rc = rf_buf_printf(out, "%s_sum", f->name);
        if (rc == RF_OK) rc = put_labels(out, f, s, NULL);
        if (rc == RF_OK) rc = rf_buf_putc(out, ' ');
        if (rc == RF_OK) rc = put_number(out, bits_to_double(atomic_load(&s->value)));
        /* _count is the +Inf bucket, so that the two always agree. */
        if (rc == RF_OK) rc = rf_buf_printf(out, "\n%s_count", f->name);
        if (rc == RF_OK) rc = put_labels(out, f, s, NULL);
        if (rc == RF_OK) rc = rf_buf_printf(out, " %llu\n", (unsigned long long)cum);
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(rf_prom_family *const *)a)->name, (*(rf_prom_family *const *)b)->name);
}

int rf_prom_expose(rf_prom *r, rf_buf *out) {
    pthread_mutex_lock(&r->mu);
    collector c[8];
    int nc = r->ncollect;
    memcpy(c, r->collect, sizeof c);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < nc; i++)
        c[i].fn(r, c[i].user);
    rf_prom_family *dropped = rf_prom_family_get(
        r, RF_PROM_COUNTER, "refinery_metrics_dropped_series_total",
        "Metric updates dropped: a family's series limit or no memory.", NULL, NULL, 0);
    rf_prom_add(dropped, 0); /* so that the family always has its one series */
    /* Families are only ever added: a snapshot of the list is enough. */
    pthread_mutex_lock(&r->mu);
    size_t n = 0;
    for (rf_prom_family *f = r->families; f; f = f->next)
        n++;
    rf_prom_family **all = malloc((n ? n : 1) * sizeof *all);
    if (all) {
        n = 0;
        for (rf_prom_family *f = r->families; f; f = f->next)
            all[n++] = f;
    }
    pthread_mutex_unlock(&r->mu);
    if (!all) return RF_ERR_NOMEM;
    qsort(all, n, sizeof *all, by_name);
    int rc = RF_OK;
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        if (all[i] == dropped) {
            /* Reported separately: its value is the registry's own count. */
            pthread_mutex_lock(&dropped->mu);
            if (dropped->nseries)
                atomic_store(&dropped->series[0]->value,
                             double_to_bits((double)atomic_load(&r->dropped)));
            pthread_mutex_unlock(&dropped->mu);
        }
        rc = expose_family(out, all[i]);
    }
    free(all);
    return rc;
}
