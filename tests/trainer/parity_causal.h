/* Helpers of the causal-LM parity tests (header-only, each test is its own
 * binary): fixture paths, comparison with whole or sampled reference tensors,
 * and the AdamW steps of scripts/parity/causal_fixtures.py on a flat block. */
#ifndef RF_TEST_PARITY_CAUSAL_H
#define RF_TEST_PARITY_CAUSAL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parity_util.h"
#include "trainer/backend.h"
#include "trainer/model.h"
#include "trainer/ops.h"
#include "trainer/optim.h"

#define LOGIT_TOL  1e-5
#define GRAD_TOL   1e-4
#define WEIGHT_TOL 1e-5

static inline char *root_path(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", root ? root : ".", rel);
    return p;
}

/* Relative error of x[n] against the fixture's `name`: whole, or (fixtures
 * of large tensors) the worst of its sum (against the norm: a sum may cancel),
 * its sum of squares and 1000 elements at flat indices i * n / 1000. */
static inline double compare(const rf_st_file *ref, const char *name, const float *x, size_t n) {
    if (rf_st_find(ref, name)) {
        size_t k;
        float *r = fx_get(ref, name, &k);
        assert_int_equal(k, n);
        double e = rel_err(x, r, n);
        free(r);
        return e;
    }
    char key[256];
    snprintf(key, sizeof key, "samp.%s", name);
    size_t ns;
    float *samp = fx_get(ref, key, &ns), *mine = malloc(ns * sizeof(float));
    for (size_t i = 0; i < ns; i++)
        mine[i] = x[i * n / ns];
    double e = rel_err(mine, samp, ns);
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i], ss += (double)x[i] * x[i];
    snprintf(key, sizeof key, "sum.%s", name);
    float *rs = fx_get(ref, key, NULL);
    snprintf(key, sizeof key, "sumsq.%s", name);
    float *rss = fx_get(ref, key, NULL);
    double es = fabs(s - rs[0]) / fmax(sqrt(rss[0]), 1e-6), ess = fabs(ss - rss[0]) / rss[0];
    e = fmax(e, fmax(es, ess));
    free(samp), free(mine), free(rs), free(rss);
    return e;
}

/* Relative error of the weights w[n] after the AdamW steps against the
 * fixture's `name` ("after.3.<tensor>"), leaving out the elements whose
 * step-0 gradient `gname` is non-zero but below 1e-7 in magnitude: there
 * m / (sqrt(v) + eps) sits near Adam's eps and the gradient's own round-off
 * (relative to the tensor's largest entries) decides the step's size, as in
 * the BERT parity test. *left_out counts them. Tensors the fixture holds
 * sampled are compared whole (compare()). */
static inline double weight_err(const rf_st_file *ref, const char *name, const char *gname,
                                const float *w, size_t n, size_t *left_out) {
    if (!rf_st_find(ref, name) || !rf_st_find(ref, gname)) return compare(ref, name, w, n);
    size_t k;
    float *r = fx_get(ref, name, &k), *g = fx_get(ref, gname, NULL);
    assert_int_equal(k, n);
    double d = 0, rr = 0;
    for (size_t i = 0; i < n; i++) {
        if (g[i] != 0 && fabsf(g[i]) < 1e-7f) {
            ++*left_out;
            continue;
        }
        d += ((double)w[i] - r[i]) * ((double)w[i] - r[i]);
        rr += (double)r[i] * r[i];
    }
    free(r), free(g);
    return sqrt(d) / fmax(sqrt(rr), 1e-6);
}

/* The fixture's optimizer: lr 1e-3, warmup 1 step, linear decay to step 4,
 * global clipping at 1.0 (torch's formula), weight decay 0.01 on the tensors
 * flagged `decay`, betas (0.9, 0.999), eps 1e-8. */
static inline rf_adamw causal_fixture_adamw(void) {
    rf_adamw o = rf_adamw_defaults();
    o.lr = 1e-3f;
    o.weight_decay = 0.01f;
    o.warmup_steps = 1;
    o.total_steps = 4;
    o.clip_norm = 1.0f;
    return o;
}

/* One optimizer step on the flat blocks with the CPU kernels. */
static inline void adamw_step_flat(float *params, float *grads, float *m1, float *m2, size_t n,
                                   const rf_tensor_info *t, size_t nt, const rf_adamw *o,
                                   long step) {
    float norm = (float)sqrt(rf_op_sumsq(grads, n));
    float coef = o->clip_norm / (norm + 1e-6f);
    if (coef < 1.0f) rf_op_scale(grads, n, coef);
    rf_param_span *spans = malloc(nt * sizeof *spans);
    for (size_t i = 0; i < nt; i++)
        spans[i] = (rf_param_span){t[i].offset, t[i].numel, t[i].decay};
    rf_adamw_hp hp = {rf_adamw_lr(o, step), o->beta1, o->beta2, o->eps, o->weight_decay, step};
    rf_op_adamw(params, grads, m1, m2, 0, n, spans, nt, &hp);
    free(spans);
}

#endif
