/* The per-batch buffers GPT-2 and Llama keep beside their activation arenas:
 * the batch's inputs (ids, labels, positions, segments, the valid mask) as
 * the pieces of one rf_inputs, so a forward uploads them with one to_device;
 * and the vocabulary-parallel loss's shifted targets (host, and the
 * backend's copy) and sums of exponentials (backend). Sized by the models'
 * reserve for batch x length tokens; owned by the model. */
#ifndef RF_TR_CAUSAL_IO_H
#define RF_TR_CAUSAL_IO_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/backend.h" /* rf_backend, rf_inputs */

typedef struct rf_causal_io {
    rf_inputs in;                      /* the pieces below: host and backend, one upload */
    int32_t *ids, *labels, *pos, *seg; /* host pieces of in (checks, tp) */
    uint8_t *valid;
    int32_t *ids_dev, *labels_dev, *pos_dev, *seg_dev; /* backend pieces (the slots) */
    uint8_t *valid_dev;
    int32_t *tgt, *tgt_dev; /* shifted targets: malloc'd, and backend memory */
    double *se;             /* backend memory: a row's sum of exponentials */
} rf_causal_io;

/* Replaces *io (freeing its buffers) with buffers for nt tokens on be; on
 * failure (RF_ERR_NOMEM) *io is unchanged. */
int rf_causal_io_alloc(rf_causal_io *io, const rf_backend *be, size_t nt);
/* The input pieces to the backend, in one to_device. */
int rf_causal_io_send(const rf_causal_io *io, const rf_backend *be);
/* Frees every buffer; *io is then empty (a second call is a no-op). */
void rf_causal_io_free(rf_causal_io *io, const rf_backend *be);

#endif
