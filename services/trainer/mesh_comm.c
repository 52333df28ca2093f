/* The parts of mesh.h that call the comm layer, apart from mesh.c so that
 * programs which only parse specs (spec.c calls rf_tr_parallel_parse) do not
 * link it. */
#include "trainer/mesh.h"

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
