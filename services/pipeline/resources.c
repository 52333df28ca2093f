/* Per-stage resources (resources.h). */
#include "pipeline/resources.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"

int rf_quantity_cpu(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end != s && *end == 'm' && !end[1]) {
        v /= 1000;
        end++;
    }
    if (end == s || *end || errno || !(v > 0) || v > 4096)
        return rf_fail(RF_ERR_INVALID, "expected a CPU count such as 2 or 500m, got '%s'", s);
    *out = v;
    return RF_OK;
}

int rf_quantity_bytes(const char *s, int64_t *out) {
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"Ki", 1024.0},       {"Mi", 1048576.0},
                 {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
                 {"k", 1e3},           {"K", 1e3},
                 {"M", 1e6},           {"G", 1e9},
                 {"T", 1e12},          {"", 1}};
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end != s && !errno && v > 0)
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (!strcmp(end, units[i].suffix) && v * units[i].mult < 9e18) {
                *out = (int64_t)ceil(v * units[i].mult);
                return RF_OK;
            }
    return rf_fail(RF_ERR_INVALID, "expected a memory size such as 512Mi or 2Gi, got '%s'", s);
}

void rf_bytes_text(int64_t b, char *out, size_t n) {
    if (b >= (int64_t)1 << 30 && b % ((int64_t)1 << 30) == 0)
        snprintf(out, n, "%lld GiB", (long long)(b >> 30));
    else if (b >= 1 << 20)
        snprintf(out, n, "%.0f MiB", (double)b / 1048576.0);
    else
        snprintf(out, n, "%.0f KiB", (double)b / 1024.0);
}

int rf_resources_parse(const rf_cfg *section, rf_resources *r) {
    memset(r, 0, sizeof *r);
    const rf_cfg *res = section ? rf_cfg_get(section, "resources") : NULL;
    if (!res) return RF_OK;
    if (rf_cfg_kind_of(res) != RF_CFG_MAP)
        return rf_fail(RF_ERR_INVALID, "%s:%d: %s: expected a mapping of cpu, memory, gpu",
                       rf_cfg_source(res), rf_cfg_line(res), rf_cfg_path(res));
    static const char *const keys[] = {"cpu", "memory", "gpu", NULL};
    int rc = rf_cfg_check_keys(res, keys);
    const char *cpu = NULL, *mem = NULL;
    if (!rc) rc = rf_cfg_str(res, "cpu", NULL, &cpu);
    if (!rc) rc = rf_cfg_str(res, "memory", NULL, &mem);
    if (!rc) rc = rf_cfg_int(res, "gpu", 0, 0, 64, &r->gpu);
    if (!rc && cpu && (rc = rf_quantity_cpu(cpu, &r->cpu)))
        rc = rf_fail_ctx(rc, "%s.cpu", rf_cfg_path(res));
    if (!rc && mem && (rc = rf_quantity_bytes(mem, &r->memory)))
        rc = rf_fail_ctx(rc, "%s.memory", rf_cfg_path(res));
    r->cpu_text = cpu;
    r->memory_text = mem;
    return rc;
}

int64_t rf_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long long size = 0, resident = 0;
    int n = fscanf(f, "%lld %lld", &size, &resident);
    fclose(f);
    return n == 2 ? (int64_t)resident * sysconf(_SC_PAGESIZE) : 0;
}

struct rf_memwatch {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    int64_t budget, base, peak;
    bool exceeded;
    volatile int *cancel;
};

static void sample(rf_memwatch *w) {
    int64_t grew = rf_rss_bytes() - w->base;
    if (grew > w->peak) w->peak = grew;
    if (w->peak > w->budget && !w->exceeded) {
        w->exceeded = true;
        if (w->cancel) *w->cancel = 1;
    }
}

static void *watch_loop(void *arg) {
    rf_memwatch *w = arg;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
        sample(w);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

int rf_memwatch_start(int64_t budget, volatile int *cancel, rf_memwatch **out) {
    rf_memwatch *w = calloc(1, sizeof *w);
    if (!w) return RF_ERR_NOMEM;
    w->budget = budget;
    w->cancel = cancel;
    w->base = rf_rss_bytes();
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    if (pthread_create(&w->thread, NULL, watch_loop, w)) {
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        free(w);
        return rf_fail(RF_ERR_INTERNAL, "cannot start the memory watch");
    }
    *out = w;
    return RF_OK;
}

int64_t rf_memwatch_stop(rf_memwatch *w, bool *exceeded) {
    pthread_mutex_lock(&w->lock);
    sample(w);
    w->stop = 1;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    int64_t peak = w->peak;
    *exceeded = w->exceeded;
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w);
    return peak;
}

int rf_resources_values(const rf_cfg *spec, const char *const *stages, size_t n, FILE *out) {
    fprintf(out,
            "# Helm values from %s: each stage's resources as its service's requests\n"
            "# and limits (helm install -f this.yaml ... charts/refinery).\n",
            rf_cfg_source(spec));
    size_t shown = 0;
    for (size_t i = 0; i < n; i++) {
        rf_resources r;
        const rf_cfg *sec = rf_cfg_get(spec, stages[i]);
        int rc = rf_resources_parse(sec, &r);
        if (rc) return rc;
        if (!sec || !rf_cfg_get(sec, "resources")) continue;
        char cpu[64] = "", mem[64] = "", gpu[64] = "";
        if (r.cpu_text) snprintf(cpu, sizeof cpu, "cpu: \"%s\"", r.cpu_text);
        if (r.memory_text)
            snprintf(mem, sizeof mem, "%smemory: %s", r.cpu_text ? ", " : "", r.memory_text);
        if (r.gpu)
            snprintf(gpu, sizeof gpu, "%snvidia.com/gpu: %lld", cpu[0] || mem[0] ? ", " : "",
                     (long long)r.gpu);
        fprintf(out, "%s:\n  resources:\n", stages[i]);
        if (cpu[0] || mem[0]) fprintf(out, "    requests: {%s%s}\n", cpu, mem);
        fprintf(out, "    limits: {%s%s%s}\n", cpu, mem, gpu);
        shown++;
    }
    if (!shown) fprintf(out, "{}  # no stage of the spec sets resources\n");
    return RF_OK;
}
