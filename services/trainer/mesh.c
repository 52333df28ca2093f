#include "trainer/mesh.h"

#include <stdlib.h>

#include "common/error.h"

rf_tr_parallel rf_tr_parallel_default(void) {
    return (rf_tr_parallel){.dp = 1, .tp = 1, .pp = 1, .zero = 0, .microbatches = 1};
}

int rf_tr_parallel_check(const rf_tr_parallel *p) {
    if (p->dp < 1 || p->tp < 1 || p->pp < 1 || p->microbatches < 1)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel: dp %d, tp %d, pp %d, microbatches %d: each must be >= 1",
                       p->dp, p->tp, p->pp, p->microbatches);
    if (p->zero < 0 || p->zero > 3)
        return rf_fail(RF_ERR_INVALID, "trainer.parallel.zero is %d: expected 0, 1, 2 or 3",
                       p->zero);
    if (p->nstages && p->nstages != p->pp)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.stages lists %d stage(s) but pp is %d: one layer count "
                       "per pipeline stage",
                       p->nstages, p->pp);
    for (int i = 0; i < p->nstages; i++)
        if (p->stages[i] < 1)
            return rf_fail(RF_ERR_INVALID,
                           "trainer.parallel.stages[%d] is %d: every stage needs at least one "
                           "layer",
                           i, p->stages[i]);
    if (p->zero == 3 && (p->tp > 1 || p->pp > 1))
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "trainer.parallel: zero 3 with tp %d x pp %d is not supported: ZeRO-3 "
                       "shards whole parameters over the world; use zero 1 or 2 on a tp/pp mesh",
                       p->tp, p->pp);
    return RF_OK;
}

int rf_tr_parallel_parse(const rf_cfg *trainer, rf_tr_parallel *p) {
    static const char *const keys[] = {"dp", "tp", "pp", "zero", "microbatches", "stages", NULL};
    *p = rf_tr_parallel_default();
    const rf_cfg *par = trainer ? rf_cfg_get(trainer, "parallel") : NULL;
    if (!par) return RF_OK;
    if (rf_cfg_kind_of(par) != RF_CFG_MAP)
        return rf_fail(RF_ERR_INVALID, "trainer.parallel: expected a mapping {dp: N, tp: N, pp: "
                                       "N, zero: 0|1|2|3, microbatches: N}");
    int rc;
    if ((rc = rf_cfg_check_keys(par, keys))) return rc;
    struct {
        const char *key;
        int64_t def, lo, hi;
        int *dst;
    } f[] = {
        {"dp", 1, 1, RF_TR_PARALLEL_MAX, &p->dp},          {"tp", 1, 1, RF_TR_PARALLEL_MAX, &p->tp},
        {"pp", 1, 1, RF_TR_PARALLEL_MAX, &p->pp},          {"zero", 0, 0, 3, &p->zero},
        {"microbatches", 1, 1, 1 << 20, &p->microbatches},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        int64_t v;
        if ((rc = rf_cfg_int(par, f[i].key, f[i].def, f[i].lo, f[i].hi, &v))) return rc;
        *f[i].dst = (int)v;
    }
    const rf_cfg *st = rf_cfg_get(par, "stages");
    if (st) {
        size_t n = rf_cfg_len(st);
        if (rf_cfg_kind_of(st) != RF_CFG_SEQ || n == 0 || n > RF_TR_MAX_STAGES)
            return rf_fail(RF_ERR_INVALID,
                           "trainer.parallel.stages: expected a list of 1 to %d layer counts, "
                           "one per pipeline stage (e.g. [3, 3])",
                           RF_TR_MAX_STAGES);
        for (size_t i = 0; i < n; i++) {
            const char *x = rf_cfg_scalar(rf_cfg_at(st, i));
            char *end = NULL;
            long v = x ? strtol(x, &end, 10) : 0;
            if (!x || !*x || *end || v < 1 || v > RF_TR_PARALLEL_MAX)
                return rf_fail(RF_ERR_INVALID,
                               "trainer.parallel.stages[%zu]: expected a layer count >= 1, got "
                               "'%s'",
                               i, x ? x : "(not a scalar)");
            p->stages[i] = (int)v;
        }
        p->nstages = (int)n;
    }
    return rf_tr_parallel_check(p);
}

int rf_tr_parallel_check_world(const rf_tr_parallel *p, int world) {
    int rc = rf_tr_parallel_check(p);
    if (rc) return rc;
    long long n = (long long)p->dp * p->tp * p->pp;
    if (n != world)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel: dp %d x tp %d x pp %d = %lld rank(s) but the group has "
                       "%d",
                       p->dp, p->tp, p->pp, n, world);
    return RF_OK;
}

int rf_tr_parallel_check_model(const rf_tr_parallel *p, const rf_bert_config *c, int batch_size) {
    int rc = rf_tr_parallel_check(p);
    if (rc) return rc;
    if (c->num_heads % p->tp)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.tp is %d but the model has %d attention heads: tp must "
                       "divide the heads",
                       p->tp, c->num_heads);
    if (c->hidden_size % p->tp) /* implied by the heads for a valid config; checked anyway */
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.tp is %d but the model's hidden size is %d: tp must "
                       "divide it",
                       p->tp, c->hidden_size);
    if (c->intermediate_size % p->tp)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.tp is %d but the model's intermediate size is %d: tp "
                       "must divide it",
                       p->tp, c->intermediate_size);
    return rf_tr_parallel_check_layers(p, c->num_layers, batch_size);
}

int rf_tr_parallel_check_layers(const rf_tr_parallel *p, int layers, int batch_size) {
    int rc = rf_tr_parallel_check(p);
    if (rc) return rc;
    if (p->pp > layers)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.pp is %d but the model has %d layer(s): at most one "
                       "stage per layer",
                       p->pp, layers);
    long sum = 0;
    for (int i = 0; i < p->nstages; i++)
        sum += p->stages[i];
    if (p->nstages && sum != layers)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.stages sum to %ld layer(s) but the model has %d", sum,
                       layers);
    if (batch_size > 0 && batch_size % p->microbatches)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.microbatches is %d but the batch size %d is not a "
                       "multiple of it",
                       p->microbatches, batch_size);
    return RF_OK;
}

int rf_tp_vocab_split(int V, int tp, int tp_i, rf_tp_vocab *out) {
    if (V < 1 || tp < 1 || tp_i < 0 || tp_i >= tp)
        return rf_fail(RF_ERR_INVALID, "vocabulary split: V %d over tp %d at rank %d", V, tp, tp_i);
    int block = (int)(((long long)V + tp - 1) / tp);
    long long lo = (long long)tp_i * block, hi = lo + block;
    out->V = V;
    out->block = block;
    out->padded = block * tp;
    out->lo = (int)(lo < V ? lo : V);
    out->hi = (int)(hi < V ? hi : V);
    return RF_OK;
}
