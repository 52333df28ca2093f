/* Tensor parallelism inside the BERT classifier (model.h: rf_bert_tp_split)
 * against the whole model, run by tests/trainer/tp_bert.test.sh under
 * scripts/mpirun.sh: build/trainer/tp_bert_check MODEL_DIR.
 *
 * Every rank loads the model twice: whole (the reference, computed locally)
 * and split over the tp group of each mesh that fits the world (tp = world;
 * at 4 ranks also dp 2 x tp 2, the dp replicas taking other batches). On a
 * padded batch, with dropout off and then on (the same seed: masks must not
 * depend on tp), it compares the logits and the loss (replicated: every rank
 * against the whole model), every gradient element of the rank's shard (via
 * rf_bert_tp_spans, relative to the largest |gradient| of its tensor; the key
 * biases, whose gradient is round-off noise, against their layer's query
 * bias), and, after 3 AdamW steps (forward, backward, update on the rank's
 * block), every weight. Bound 1e-5. Replicated parameters must hold the same
 * bits on every tp rank, and the tp ranks' spans must cover the whole model
 * exactly once. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/error.h"
#include "trainer/model.h"
#include "trainer/optim.h"

#define TOL 1e-5

static rf_comm *g_world;
static int g_fail;

static void die(const char *what, int rc) {
    fprintf(stderr, "rank %d: %s: %s (%d)\n", rf_comm_rank(g_world), what, rf_errmsg(), rc);
    exit(2);
}
#define OK(x)                                                                                      \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) die(#x, rc_);                                                                     \
    } while (0)

static void verdict(const char *mesh, const char *what, double err, const char *where) {
    double e = err;
    OK(rf_comm_allreduce(g_world, &e, &e, 1, RF_COMM_F64, RF_COMM_MAX));
    int bad = !(e <= TOL);
    if (rf_comm_rank(g_world) == 0)
        printf("%-5s %-14s %-34s rel err %.2e%s%s%s\n", bad ? "FAIL" : "ok", mesh, what, e,
               where ? "  (rank 0's worst: " : "", where ? where : "", where ? ")" : "");
    g_fail |= bad;
}

static void flag(const char *mesh, const char *what, int ok) {
    OK(rf_comm_allreduce(g_world, &ok, &ok, 1, RF_COMM_I32, RF_COMM_MIN));
    if (rf_comm_rank(g_world) == 0) printf("%-5s %-14s %s\n", ok ? "ok" : "FAIL", mesh, what);
    g_fail |= !ok;
}

typedef struct batch {
    int B, T;
    int32_t *ids, *types, *labels;
    uint8_t *valid;
} batch;

/* B sequences padded to T, lengths T, T-3, ..., ids from a seed (dp replica d
 * gets other data). */
static batch make_batch(int B, int T, int V, int K, int d) {
    batch b = {B,
               T,
               calloc((size_t)B * T, 4),
               calloc((size_t)B * T, 4),
               calloc((size_t)B, 4),
               calloc((size_t)B * T, 1)};
    uint64_t s = 17 + 1000003 * (uint64_t)d;
    for (int i = 0; i < B; i++) {
        int len = T - (3 * i) % T;
        len = len < 2 ? 2 : len;
        for (int t = 0; t < T; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int k = i * T + t;
            b.valid[k] = t < len;
            b.ids[k] = t < len ? (int)((s >> 33) % (uint64_t)V) : 0;
            b.types[k] = t >= len / 2 && t < len;
        }
        b.labels[i] = (i + d) % K;
    }
    return b;
}

static void free_batch(batch *b) {
    free(b->ids);
    free(b->types);
    free(b->labels);
    free(b->valid);
}

/* Index of the whole table's tensor holding global element g. */
static size_t tensor_of(const rf_tensor_info *t, size_t nt, size_t g) {
    size_t lo = 0, hi = nt;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (t[mid].offset <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The rank's block against the whole one (got: local, ref: global), per
 * tensor scale; returns the worst relative error and names its tensor. With
 * key_abs (weights after AdamW) the key biases are left out and their worst
 * absolute difference goes to *key_abs: their gradient is round-off noise,
 * which AdamW turns into steps of up to lr on either side. Without it
 * (gradients) a key bias is measured against its layer's query bias. */
static double cmp_block(const rf_bert *m, const float *got, const float *ref, double *key_abs,
                        char *where, size_t wcap) {
    size_t nt;
    const rf_tensor_info *t = rf_bert_tp_global_tensors(m, &nt);
    double *scale = calloc(nt, sizeof *scale);
    for (size_t i = 0; i < nt; i++)
        for (size_t k = 0; k < t[i].numel; k++)
            scale[i] = fmax(scale[i], fabs(ref[t[i].offset + k]));
    const rf_tp_span *sp;
    size_t ns = rf_bert_tp_spans(m, &sp);
    double worst = 0;
    snprintf(where, wcap, "-");
    for (size_t k = 0; k < ns; k++) {
        size_t i = tensor_of(t, nt, sp[k].global);
        double sc = scale[i];
        bool key = strstr(t[i].name, "attention.self.key.bias") != NULL;
        if (key && !key_abs) sc = fmax(sc, scale[i - 1]); /* the query bias, just before it */
        for (size_t j = 0; j < sp[k].n; j++) {
            double d = fabs((double)got[sp[k].local + j] - ref[sp[k].global + j]);
            if (key && key_abs) {
                *key_abs = fmax(*key_abs, d);
                continue;
            }
            double e = sc > 0 ? d / sc : d;
            if (!(e <= worst)) {
                worst = isnan(e) ? INFINITY : e;
                snprintf(where, wcap, "%s", t[i].name);
            }
        }
    }
    free(scale);
    return worst;
}

static double cmp_vec(const float *a, const float *b, size_t n) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(b[i]));
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
    }
    return scale > 0 ? worst / scale : worst;
}

/* Replicated parameters hold the same bits on every tp rank. */
static int replicas_equal(const rf_bert *m, rf_comm *tp, const float *block) {
    const rf_tp_span *sp;
    size_t ns = rf_bert_tp_spans(m, &sp), n = 0;
    for (size_t k = 0; k < ns; k++)
        n += sp[k].replicated ? sp[k].n : 0;
    float *x = malloc(n * sizeof *x + 4), *hi = malloc(n * sizeof *x + 4),
          *lo = malloc(n * sizeof *x + 4);
    size_t at = 0;
    for (size_t k = 0; k < ns; k++)
        if (sp[k].replicated) {
            memcpy(x + at, block + sp[k].local, sp[k].n * sizeof *x);
            at += sp[k].n;
        }
    memcpy(hi, x, n * sizeof *x);
    memcpy(lo, x, n * sizeof *x);
    OK(rf_comm_allreduce(tp, hi, hi, n, RF_COMM_F32, RF_COMM_MAX));
    OK(rf_comm_allreduce(tp, lo, lo, n, RF_COMM_F32, RF_COMM_MIN));
    int same = !memcmp(hi, x, n * sizeof *x) && !memcmp(lo, x, n * sizeof *x);
    free(x);
    free(hi);
    free(lo);
    return same;
}

static void step(rf_bert *m, const batch *b, bool train, uint64_t seed) {
    rf_batch rb = {b->B, b->T, b->ids, b->types, b->labels, b->valid};
    OK(rf_bert_zero_grad(m));
    OK(rf_bert_forward(m, &rb, train, seed));
    OK(rf_bert_backward(m, 1.0f));
}

static void run_mesh(const char *dir, int dp, int tpn) {
    rf_comm_mesh mesh;
    OK(rf_comm_mesh_init(g_world, dp, tpn, 1, &mesh));
    char name[32], where[128];
    snprintf(name, sizeof name, "dp%d x tp%d", dp, tpn);
    rf_bert *ref, *m;
    OK(rf_bert_load(dir, 2, 3, rf_backend_cpu(), &ref));
    OK(rf_bert_load(dir, 2, 3, rf_backend_cpu(), &m));
    OK(rf_bert_tp_split(m, mesh.tp_comm, NULL));
    OK(rf_bert_enable_training(ref));
    OK(rf_bert_enable_training(m));
    for (int k = 0; k < 2; k++) { /* dropout everywhere (the tiny fixture has none) */
        rf_bert_config *cf = k ? &m->cfg : &ref->cfg;
        cf->hidden_dropout = cf->attention_dropout = cf->classifier_dropout = 0.1f;
    }
    { /* coverage: the group's spans hold every element once */
        const rf_tp_span *sp;
        size_t ns = rf_bert_tp_spans(m, &sp);
        int64_t own = 0, rep = 0;
        for (size_t k = 0; k < ns; k++)
            *(sp[k].replicated ? &rep : &own) += (int64_t)sp[k].n;
        OK(rf_comm_allreduce(mesh.tp_comm, &own, &own, 1, RF_COMM_I64, RF_COMM_SUM));
        flag(name, "spans cover the whole model once",
             own + rep == (int64_t)rf_bert_tp_global_nparams(m));
    }
    const rf_bert_config *c = &ref->cfg;
    int T = c->max_position < 13 ? c->max_position : 13;
    batch b = make_batch(5, T, c->vocab_size, c->num_labels, mesh.dp_i);
    for (int drop = 0; drop < 2; drop++) {
        char what[64];
        const char *dn = drop ? "dropout on" : "dropout off";
        step(ref, &b, drop, 99);
        step(m, &b, drop, 99);
        snprintf(what, sizeof what, "logits, %s", dn);
        verdict(name, what, cmp_vec(m->logits, ref->logits, (size_t)b.B * c->num_labels), NULL);
        snprintf(what, sizeof what, "loss, %s", dn);
        verdict(name, what, fabs(m->loss - ref->loss) / fmax(fabs(ref->loss), 1e-30), NULL);
        snprintf(what, sizeof what, "gradients, %s", dn);
        verdict(name, what, cmp_block(m, m->grads, ref->grads, NULL, where, sizeof where), where);
        snprintf(what, sizeof what, "replicated gradients same bits, %s", dn);
        flag(name, what, replicas_equal(m, mesh.tp_comm, m->grads));
    }
    /* 3 AdamW steps on each side (the rank's block; no clipping: the norm
     * would need the group's sum), dropout on, lr 1e-4 after one warmup step
     * at lr 0 as the trainer's default schedule does (and dp.test.sh): the
     * first real update then sees a second moment of two gradients, so an
     * element whose gradient is rounding-sized does not move by a whole lr
     * on one side only */
    rf_adamw opt = rf_adamw_defaults();
    opt.lr = 1e-4f;
    opt.weight_decay = 0.01f;
    opt.warmup_steps = 1;
    opt.total_steps = 4;
    for (long k = 0; k < 3; k++) {
        step(ref, &b, true, 100 + (uint64_t)k);
        step(m, &b, true, 100 + (uint64_t)k);
        float lr = rf_adamw_lr(&opt, k);
        OK(rf_adamw_update(ref, &opt, k, lr, 0, ref->nparams, ref->m, ref->v));
        OK(rf_adamw_update(m, &opt, k, lr, 0, m->nparams, m->m, m->v));
    }
    double key_abs = 0;
    verdict(name, "weights after 3 AdamW steps",
            cmp_block(m, m->params, ref->params, &key_abs, where, sizeof where), where);
    /* the key biases: an absolute bound of 2 x lr x steps (as dp_minilm.test.sh) */
    OK(rf_comm_allreduce(g_world, &key_abs, &key_abs, 1, RF_COMM_F64, RF_COMM_MAX));
    int kbad = !(key_abs <= 2 * opt.lr * 3);
    if (rf_comm_rank(g_world) == 0)
        printf("%-5s %-14s %-34s abs diff %.2e (bound 2 x lr x steps = %.0e)\n",
               kbad ? "FAIL" : "ok", name, "key biases after 3 AdamW steps", key_abs,
               2 * opt.lr * 3);
    g_fail |= kbad;
    flag(name, "replicated weights same bits", replicas_equal(m, mesh.tp_comm, m->params));
    free_batch(&b);
    rf_bert_free(ref);
    rf_bert_free(m);
    OK(rf_comm_mesh_destroy(&mesh));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
        return 2;
    }
    OK(rf_comm_init_from_env(NULL, &g_world));
    int world = rf_comm_world(g_world);
    run_mesh(argv[1], 1, world);
    if (world == 4) run_mesh(argv[1], 2, 2);
    if (rf_comm_rank(g_world) == 0 && !g_fail) printf("all checks passed at %d rank(s)\n", world);
    rf_comm_destroy(g_world);
    return g_fail;
}
