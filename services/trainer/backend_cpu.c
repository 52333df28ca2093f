/* The CPU backend: host memory (64-byte aligned) and the kernels of ops.c. */
#include <stdlib.h>
#include <string.h>

#include "trainer/backend.h"
#include "trainer/ops.h"

static void *cpu_alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p) memset(p, 0, n ? n : 64);
    return p;
}

static void cpu_copy(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}

static void cpu_zero(void *p, size_t bytes) {
    memset(p, 0, bytes);
}

static const rf_backend cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = free,
    .zero = cpu_zero,
    .to_host = cpu_copy,
    .to_device = cpu_copy,
    .copy = cpu_copy,
    .embed_fwd = rf_op_embed_fwd,
    .embed_bwd = rf_op_embed_bwd,
    .layernorm_fwd = rf_op_layernorm_fwd,
    .layernorm_bwd = rf_op_layernorm_bwd,
    .linear_fwd = rf_op_linear_fwd,
    .linear_bwd = rf_op_linear_bwd,
    .attention_fwd = rf_op_attention_fwd,
    .attention_bwd = rf_op_attention_bwd,
    .gelu_fwd = rf_op_gelu_fwd,
    .gelu_bwd = rf_op_gelu_bwd,
    .tanh_fwd = rf_op_tanh_fwd,
    .tanh_bwd = rf_op_tanh_bwd,
    .dropout_fwd = rf_op_dropout_fwd,
    .dropout_bwd = rf_op_dropout_bwd,
    .residual_fwd = rf_op_residual_fwd,
    .residual_bwd = rf_op_residual_bwd,
    .xent_fwd = rf_op_xent_fwd,
    .xent_bwd = rf_op_xent_bwd,
};

const rf_backend *rf_backend_cpu(void) {
    return &cpu;
}
