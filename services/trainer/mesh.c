#include "trainer/mesh.h"

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
    if (p->zero == 3 && (p->tp > 1 || p->pp > 1))
        return rf_fail(RF_ERR_UNSUPPORTED,
                       "trainer.parallel: zero 3 with tp %d x pp %d is not supported: ZeRO-3 "
                       "shards whole parameters over the world; use zero 1 or 2 on a tp/pp mesh",
                       p->tp, p->pp);
    return RF_OK;
}

int rf_tr_parallel_parse(const rf_cfg *trainer, rf_tr_parallel *p) {
    static const char *const keys[] = {"dp", "tp", "pp", "zero", "microbatches", NULL};
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
    if (p->pp > c->num_layers)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.pp is %d but the model has %d layer(s): at most one "
                       "stage per layer",
                       p->pp, c->num_layers);
    if (batch_size > 0 && batch_size % p->microbatches)
        return rf_fail(RF_ERR_INVALID,
                       "trainer.parallel.microbatches is %d but the batch size %d is not a "
                       "multiple of it",
                       p->microbatches, batch_size);
    return RF_OK;
}

int rf_tr_mesh_coords(const rf_tr_parallel *p, int rank, int *dp_i, int *tp_i, int *pp_i) {
    int rc = rf_tr_parallel_check(p);
    if (rc) return rc;
    return rf_comm_mesh_coords(rank, p->dp, p->tp, p->pp, dp_i, tp_i, pp_i);
}

int rf_tr_mesh_init(rf_comm *world, const rf_tr_parallel *p, rf_comm_mesh *m) {
    int rc = rf_tr_parallel_check_world(p, rf_comm_world(world));
    if (rc) return rc;
    return rf_comm_mesh_init(world, p->dp, p->tp, p->pp, m);
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
