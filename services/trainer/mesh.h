/* The trainer's parallel mesh: `trainer.parallel: {dp, tp, pp, zero,
 * microbatches}` (issue 17), its checks against the world size and against a
 * model, and the sub-groups.
 *
 * The rank layout is the comm layer's (comm.h, rf_comm_mesh): tp fastest,
 * then pp, then dp,
 *
 *     rank = (dp_i * pp + pp_i) * tp + tp_i
 *
 * so a tensor-parallel group is adjacent ranks. Everything here runs before
 * any work: a mesh the world or the model cannot take fails with
 * RF_ERR_INVALID (or RF_ERR_UNSUPPORTED) and a message naming the numbers.
 *
 * spec.c parses `trainer.parallel` with rf_tr_parallel_parse; the trainer
 * (train.c, and parallel.c for tp/pp meshes) makes the groups. */
#ifndef RF_TR_MESH_H
#define RF_TR_MESH_H

#include "comm/comm.h"
#include "common/config.h"
#include "trainer/bert_config.h"

#define RF_TR_PARALLEL_MAX 65536 /* any one axis */
#define RF_TR_MAX_STAGES   128   /* an explicit `stages` list */

typedef struct rf_tr_parallel {
    int dp, tp, pp;   /* axis sizes, each >= 1 */
    int zero;         /* ZeRO stage on the dp axis: 0..3 */
    int microbatches; /* micro-batches per batch (the 1F1B schedule), >= 1 */
    /* `stages: [n0, n1, ...]`: transformer layers of each pipeline stage (the
     * embeddings go with stage 0, the head with the last); nstages 0: the
     * trainer balances the stages by measured cost (parallel.c). */
    int nstages;
    int stages[RF_TR_MAX_STAGES];
} rf_tr_parallel;

/* dp = tp = pp = 1, zero 0, microbatches 1 (one process). */
rf_tr_parallel rf_tr_parallel_default(void);

/* Reads `trainer.parallel` from the trainer section `trainer` (absent: the
 * defaults). Unknown keys, non-integers and out-of-range values fail with
 * RF_ERR_INVALID naming the key; so do combinations that no world or model
 * could take (rf_tr_parallel_check). */
int rf_tr_parallel_parse(const rf_cfg *trainer, rf_tr_parallel *p);

/* Combinations invalid whatever the world and model: sizes < 1, zero outside
 * 0..3, ZeRO-3 with tp or pp > 1 (RF_ERR_UNSUPPORTED: ZeRO-1/2 only on the dp
 * axis of a tp/pp mesh). */
int rf_tr_parallel_check(const rf_tr_parallel *p);

/* dp*tp*pp must equal world: "trainer.parallel: dp 2 x tp 2 x pp 1 = 4 ranks
 * but the group has 2". */
int rf_tr_parallel_check_world(const rf_tr_parallel *p, int world);

/* Whether model `cfg` can be split on this mesh: heads and intermediate size
 * divisible by tp, pp <= layers (and an explicit `stages` list summing to
 * the layers), and (when batch_size > 0) the batch divisible into
 * microbatches. The vocabulary never blocks a split: it is padded
 * (rf_tp_vocab_split). */
int rf_tr_parallel_check_model(const rf_tr_parallel *p, const rf_bert_config *cfg, int batch_size);
/* The pipeline part of that check for any model of `layers` layers. */
int rf_tr_parallel_check_layers(const rf_tr_parallel *p, int layers, int batch_size);

/* This rank's coordinates on the mesh (RF_ERR_INVALID for a rank outside it). */
int rf_tr_mesh_coords(const rf_tr_parallel *p, int rank, int *dp_i, int *tp_i, int *pp_i);

/* Checks the world size, then makes the dp/tp/pp sub-groups of world with the
 * comm layer's split (collective over world). Destroy with
 * rf_comm_mesh_destroy() before the world. */
int rf_tr_mesh_init(rf_comm *world, const rf_tr_parallel *p, rf_comm_mesh *m);

/* One tp rank's part of a vocabulary of V ids split over tp ranks: every rank
 * stores `block` = ceil(V / tp) rows (the padded vocabulary is tp * block);
 * rank tp_i owns ids [lo, hi), hi - lo <= block (the last ranks' slices may
 * be short, or empty when V < tp * block - block); rows past hi - lo are
 * padding that no id selects and no loss counts. */
typedef struct rf_tp_vocab {
    int V, padded, block, lo, hi;
} rf_tp_vocab;
int rf_tp_vocab_split(int V, int tp, int tp_i, rf_tp_vocab *out);

#endif
