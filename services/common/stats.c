#include "common/stats.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* A sorted array of counters under one mutex: updates come per batch, not per
 * record, so contention is low and sorted order makes the JSON deterministic. */
typedef struct counter {
    char *name;
    int is_real; /* 1: real; 2: boolean (value 0/1); 3: string (str) */
    int64_t value;
    double real;
    char *str;
} counter;

struct rf_stats {
    pthread_mutex_t lock;
    counter *items;
    size_t n, cap;
};

rf_stats *rf_stats_new(void) {
    rf_stats *s = calloc(1, sizeof *s);
    if (s) pthread_mutex_init(&s->lock, NULL);
    return s;
}

void rf_stats_free(rf_stats *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->items[i].name);
        free(s->items[i].str);
    }
    free(s->items);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Index of name, or where it would be inserted (with *found = 0). */
static size_t find(const rf_stats *s, const char *name, int *found) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(s->items[mid].name, name);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = 0;
    return lo;
}

static counter *get_or_add(rf_stats *s, const char *name) {
    int found;
    size_t i = find(s, name, &found);
    if (found) return &s->items[i];
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        counter *items = realloc(s->items, cap * sizeof *items);
        if (!items) return NULL;
        s->items = items;
        s->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return NULL;
    memmove(&s->items[i + 1], &s->items[i], (s->n - i) * sizeof *s->items);
    s->items[i] = (counter){copy, 0, 0, 0.0, NULL};
    s->n++;
    return &s->items[i];
}

int rf_stats_add(rf_stats *s, const char *name, int64_t delta) {
    pthread_mutex_lock(&s->lock);
    counter *c = get_or_add(s, name);
    if (c) c->value += delta;
    pthread_mutex_unlock(&s->lock);
    return c ? RF_OK : RF_ERR_NOMEM;
}

int rf_stats_set(rf_stats *s, const char *name, int64_t value) {
    pthread_mutex_lock(&s->lock);
    counter *c = get_or_add(s, name);
    if (c) {
        c->value = value;
        c->is_real = 0;
    }
    pthread_mutex_unlock(&s->lock);
    return c ? RF_OK : RF_ERR_NOMEM;
}

int rf_stats_set_real(rf_stats *s, const char *name, double value) {
    pthread_mutex_lock(&s->lock);
    counter *c = get_or_add(s, name);
    if (c) {
        c->real = value;
        c->is_real = 1;
    }
    pthread_mutex_unlock(&s->lock);
    return c ? RF_OK : RF_ERR_NOMEM;
}

int rf_stats_set_bool(rf_stats *s, const char *name, bool value) {
    pthread_mutex_lock(&s->lock);
    counter *c = get_or_add(s, name);
    if (c) {
        c->value = value;
        c->is_real = 2;
    }
    pthread_mutex_unlock(&s->lock);
    return c ? RF_OK : RF_ERR_NOMEM;
}

int rf_stats_set_str(rf_stats *s, const char *name, const char *value) {
    char *copy = strdup(value);
    if (!copy) return RF_ERR_NOMEM;
    pthread_mutex_lock(&s->lock);
    counter *c = get_or_add(s, name);
    if (c) {
        free(c->str);
        c->str = copy;
        c->is_real = 3;
    }
    pthread_mutex_unlock(&s->lock);
    if (!c) free(copy);
    return c ? RF_OK : RF_ERR_NOMEM;
}

int rf_stats_each(const rf_stats *s, const char *prefix, rf_stats_fn fn, void *user) {
    rf_stats *m = (rf_stats *)s;
    size_t n = strlen(prefix);
    int rc = RF_OK;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < s->n && !rc; i++) {
        const counter *c = &s->items[i];
        if (strncmp(c->name, prefix, n) == 0)
            rc = fn(user, c->name, c->is_real, c->value, c->real, c->str);
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int64_t rf_stats_get(const rf_stats *s, const char *name) {
    rf_stats *m = (rf_stats *)s;
    pthread_mutex_lock(&m->lock);
    int found;
    size_t i = find(s, name, &found);
    int64_t v = found ? s->items[i].value : 0;
    pthread_mutex_unlock(&m->lock);
    return v;
}

int64_t rf_stats_sum_prefix(const rf_stats *s, const char *prefix) {
    rf_stats *m = (rf_stats *)s;
    size_t n = strlen(prefix);
    int64_t sum = 0;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < s->n; i++)
        if (strncmp(s->items[i].name, prefix, n) == 0) sum += s->items[i].value;
    pthread_mutex_unlock(&m->lock);
    return sum;
}

int rf_stats_merge(rf_stats *dst, const rf_stats *src) {
    rf_stats *m = (rf_stats *)src;
    int rc = RF_OK;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < src->n && !rc; i++) {
        const counter *c = &src->items[i];
        if (c->is_real == 1)
            rc = rf_stats_set_real(dst, c->name, c->real);
        else if (c->is_real == 2)
            rc = rf_stats_set_bool(dst, c->name, c->value != 0);
        else if (c->is_real == 3)
            rc = rf_stats_set_str(dst, c->name, c->str);
        else
            rc = rf_stats_add(dst, c->name, c->value);
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* Length of the common dotted prefix (whole segments) of a and b. */
static size_t common_segments(const char *a, const char *b) {
    size_t last = 0, i = 0;
    while (a[i] && a[i] == b[i]) {
        if (a[i] == '.') last = i + 1;
        i++;
    }
    return last;
}

int rf_stats_to_json(const rf_stats *s, rf_buf *out) {
    rf_stats *m = (rf_stats *)s;
    int rc = RF_OK;
    pthread_mutex_lock(&m->lock);
    rc |= rf_buf_putc(out, '{');
    const char *prev = "";
    for (size_t i = 0; i < s->n; i++) {
        const counter *c = &s->items[i];
        size_t keep = i ? common_segments(prev, c->name) : 0;
        /* Close the objects of prev below the shared prefix. */
        for (const char *p = prev + keep; *p; p++)
            if (*p == '.') rc |= rf_buf_putc(out, '}');
        if (i) rc |= rf_buf_putc(out, ',');
        /* Open objects for the new segments. */
        const char *seg = c->name + keep;
        for (;;) {
            const char *dot = strchr(seg, '.');
            size_t n = dot ? (size_t)(dot - seg) : strlen(seg);
            rc |= rf_buf_append_json_str(out, seg, n);
            rc |= rf_buf_putc(out, ':');
            if (!dot) break;
            rc |= rf_buf_putc(out, '{');
            seg = dot + 1;
        }
        if (c->is_real == 1)
            rc |= rf_buf_printf(out, "%.6g", c->real);
        else if (c->is_real == 2)
            rc |= rf_buf_puts(out, c->value ? "true" : "false");
        else if (c->is_real == 3)
            rc |= rf_buf_append_json_str(out, c->str, strlen(c->str));
        else
            rc |= rf_buf_printf(out, "%lld", (long long)c->value);
        prev = c->name;
    }
    for (const char *p = prev; *p; p++)
        if (*p == '.') rc |= rf_buf_putc(out, '}');
    rc |= rf_buf_putc(out, '}');
    pthread_mutex_unlock(&m->lock);
    return rc ? RF_ERR_NOMEM : RF_OK;
}
