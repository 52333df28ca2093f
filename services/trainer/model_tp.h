/* Inside the trainer: a model's tensor-parallel context, made by
 * rf_bert_tp_split, rf_gpt2_tp_split or rf_llama_tp_split (model_tp.c; see
 * model.h for what the split means). The three models share it: model.c,
 * gpt2.c and llama.c reach the tp ops (tp.h) through the pointers here, set
 * by the split, so a program that never splits a model (the evaluator) calls
 * neither them nor the comm layer they call. The mesh (parallel.c) uses the
 * rf_model_tp_* calls at the end, which dispatch on the model. */
#ifndef RF_TR_MODEL_TP_H
#define RF_TR_MODEL_TP_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "trainer/mesh.h"
#include "trainer/model.h"
#include "trainer/tp.h"

struct rf_bert_tp {
    rf_comm *c;           /* the tp group (host memory: MPI or self) */
    rf_tp_group g;        /* where the ops run: the model's backend, and c or, for a
                           * GPU's memory, dev (g.sync owned) */
    rf_comm *dev;         /* c's NCCL twin (borrowed: rf_bert_tp_split), or NULL */
    int n, r;             /* group size and this rank */
    int Cl, Il, NHl;      /* local channels (C/n), intermediate size (I/n), heads (NH/n) */
    int NKVl;             /* Llama: local key/value heads (NKV/n); else NHl */
    int h0;               /* this rank's first global head */
    unsigned char *kinds; /* how each tensor of the whole table is split (model_tp.c) */
    rf_tp_vocab vocab;    /* this rank's word-embedding rows */
    rf_tensor_info *full; /* the whole model's table */
    size_t nfull, nparams_full;
    rf_tp_span *spans;
    size_t nspans;
    /* tp.h's ops */
    int (*embed_fwd)(const rf_tp_group *g, float *out, const int32_t *ids, const int32_t *pos,
                     const int32_t *types, const float *wte_local, const rf_tp_vocab *v,
                     const float *wpe, const float *wtt, int B, int T, int C);
    int (*embed_bwd)(const rf_tp_group *g, float *dwte_local, float *dwpe, float *dwtt,
                     const float *dout, const int32_t *ids, const int32_t *types,
                     const rf_tp_vocab *v, int B, int T, int C);
    int (*qkv_fwd)(const rf_tp_group *g, float *out, const float *inp, const float *w,
                   const float *b, int wstride, int N, int C, int Cl);
    int (*qkv_bwd)(const rf_tp_group *g, float *dinp, float *dw, float *db, int wstride,
                   const float *dout, const float *inp, const float *w, int N, int C, int Cl);
    int (*colpar_fwd)(const rf_tp_group *g, float *out, int ldo, const float *inp, const float *w,
                      int ldw, const float *b, int N, int IC, int OCl);
    int (*colpar_bwd)(const rf_tp_group *g, float *dinp, float *dw, float *db, int ldw,
                      const float *dout, int ldd, const float *inp, const float *w, int N, int IC,
                      int OCl);
    int (*rowpar_fwd)(const rf_tp_group *g, float *out, const float *inp, int ldi, const float *w,
                      int ldw, const float *b, int N, int ICl, int OC);
    int (*rowpar_bwd)(const rf_tp_group *g, float *dinp, int ldi, float *dw, int ldw, float *db,
                      const float *dout, const float *inp, const float *w, int N, int ICl, int OC);
    int (*sum)(const rf_tp_group *g, float *x, size_t n);
    int (*xent_fwd)(const rf_tp_group *g, float *loss, float *losses, float *mx, double *se,
                    const float *logits, int ldz, const int32_t *labels, const rf_tp_vocab *v,
                    int N);
    int (*xent_bwd)(const rf_tp_group *g, float *dlogits, int ldd, const float *logits, int ldz,
                    const float *mx, const double *se, const int32_t *labels, const rf_tp_vocab *v,
                    int N, float scale);
};

/* Frees a context and what it owns (the whole table, spans, kinds). */
void rf_tp_ctx_free(struct rf_bert_tp *tp);

/* ---- any model (rf_model of model_iface.h), for the mesh ---- */

struct rf_model;
/* RF_OK when model m can be split over a tp group of n ranks; else
 * RF_ERR_INVALID naming what n must divide (heads, key/value heads, the
 * intermediate size), or RF_ERR_UNSUPPORTED (LoRA).
 * Communicates nothing: every rank can check before any work. */
int rf_model_tp_check(const struct rf_model *m, int n);
/* rf_bert_tp_split, rf_gpt2_tp_split or rf_llama_tp_split by m's kind; dev
 * as rf_bert_tp_split's. */
int rf_model_tp_split(struct rf_model *m, rf_comm *tp, rf_comm *dev);
/* m's context (NULL: not split). */
const struct rf_bert_tp *rf_model_tp_ctx(const struct rf_model *m);
/* The spans of tp rank r of m's group (*spans the caller's to free), as
 * rf_bert_tp_spans_of. */
int rf_model_tp_spans_of(const struct rf_model *m, int r, rf_tp_span **spans, size_t *n);
/* Undoes the split with the whole parameters full[nparams_full], as
 * rf_bert_tp_merge. */
int rf_model_tp_merge(struct rf_model *m, const float *full);

#endif
