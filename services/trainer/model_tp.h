/* Inside the trainer (model.c and model_tp.c only): a model's tensor-parallel
 * context, made by rf_bert_tp_split (model_tp.c, see model.h). model.c
 * reaches the tp ops (tp.h) through the pointers here, set by the split, so a
 * program that never splits a model (the evaluator) links neither them nor
 * the comm layer they call. */
#ifndef RF_TR_MODEL_TP_H
#define RF_TR_MODEL_TP_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "trainer/mesh.h"
#include "trainer/model.h"

struct rf_bert_tp {
    rf_comm *c;
    int n, r;             /* group size and this rank */
    int Cl, Il, NHl;      /* local channels (C/n), intermediate size (I/n), heads (NH/n) */
    int h0;               /* this rank's first global head */
    rf_tp_vocab vocab;    /* this rank's word-embedding rows */
    rf_tensor_info *full; /* the whole model's table */
    size_t nfull, nparams_full;
    rf_tp_span *spans;
    size_t nspans;
    /* tp.h's ops */
    int (*embed_fwd)(rf_comm *tp, float *out, const int32_t *ids, const int32_t *types,
                     const float *wte_local, const rf_tp_vocab *v, const float *wpe,
                     const float *wtt, int B, int T, int C);
    void (*embed_bwd)(float *dwte_local, float *dwpe, float *dwtt, const float *dout,
                      const int32_t *ids, const int32_t *types, const rf_tp_vocab *v, int B, int T,
                      int C);
    int (*qkv_fwd)(float *out, const float *inp, const float *w, const float *b, int wstride, int N,
                   int C, int Cl);
    int (*qkv_bwd)(rf_comm *tp, float *dinp, float *dw, float *db, int wstride, const float *dout,
                   const float *inp, const float *w, int N, int C, int Cl);
    int (*colpar_fwd)(float *out, int ldo, const float *inp, const float *w, int ldw,
                      const float *b, int N, int IC, int OCl);
    int (*colpar_bwd)(rf_comm *tp, float *dinp, float *dw, float *db, int ldw, const float *dout,
                      int ldd, const float *inp, const float *w, int N, int IC, int OCl);
    int (*rowpar_fwd)(rf_comm *tp, float *out, const float *inp, int ldi, const float *w, int ldw,
                      const float *b, int N, int ICl, int OC);
    int (*rowpar_bwd)(float *dinp, int ldi, float *dw, int ldw, float *db, const float *dout,
                      const float *inp, const float *w, int N, int ICl, int OC);
};

#endif
