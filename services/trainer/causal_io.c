/* The causal models' per-batch buffers (causal_io.h). */
#include "trainer/causal_io.h"

#include <stdbool.h>
#include <stdlib.h>

#include "common/error.h"

/* The input pieces, in the order rf_inputs keeps them. */
enum { IO_IDS, IO_LABELS, IO_POS, IO_SEG, IO_VALID, IO_PIECES };

int rf_causal_io_alloc(rf_causal_io *io, const rf_backend *be, size_t nt) {
    size_t ni = sizeof(int32_t) * nt;
    size_t pieces[IO_PIECES] = {ni, ni, ni, ni, nt};
    rf_causal_io n = {0};
    n.tgt = malloc(ni ? ni : 1);
    n.tgt_dev = rf_backend_alloc(be, ni);
    n.se = rf_backend_alloc(be, sizeof(double) * nt);
    /* a backend's failed alloc has left its own message in rf_errmsg */
    if (!n.tgt || !n.tgt_dev || !n.se || rf_inputs_alloc(&n.in, be, IO_PIECES, pieces)) {
        bool host = !n.tgt;
        rf_causal_io_free(&n, be);
        return host ? rf_fail(RF_ERR_NOMEM, "causal model: no memory for %zu targets", nt)
                    : RF_ERR_NOMEM;
    }
    n.ids = rf_inputs_host(&n.in, IO_IDS), n.labels = rf_inputs_host(&n.in, IO_LABELS);
    n.pos = rf_inputs_host(&n.in, IO_POS), n.seg = rf_inputs_host(&n.in, IO_SEG);
    n.valid = rf_inputs_host(&n.in, IO_VALID);
    n.ids_dev = rf_inputs_dev(&n.in, IO_IDS), n.labels_dev = rf_inputs_dev(&n.in, IO_LABELS);
    n.pos_dev = rf_inputs_dev(&n.in, IO_POS), n.seg_dev = rf_inputs_dev(&n.in, IO_SEG);
    n.valid_dev = rf_inputs_dev(&n.in, IO_VALID);
    rf_causal_io_free(io, be);
    *io = n;
    return RF_OK;
}

int rf_causal_io_send(const rf_causal_io *io, const rf_backend *be) {
    return rf_inputs_send(&io->in, be, IO_PIECES);
}

void rf_causal_io_free(rf_causal_io *io, const rf_backend *be) {
    rf_inputs_free(&io->in, be);
    free(io->tgt);
    rf_backend_free(be, io->tgt_dev);
    rf_backend_free(be, io->se);
    *io = (rf_causal_io){0};
}
