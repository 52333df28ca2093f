/* The parameter units of the causal LMs (GPT-2, Llama) and the order of their
 * unit events (model_iface.h), shared by gpt2.c and llama.c.
 *
 * Units: 0 = the token (and position) embeddings, 1..L = the layers, L+1 =
 * the final norm (and an untied LM head). A tied head reads unit 0's word
 * embedding after unit L+1 in forward, and backward starts with the head's
 * part of unit 0's gradient. For a range [u0, u1) of n = L + 2 units:
 *   forward:  FWD u for u = u0 .. u1-1, then FWD 0 (tied, u1 = n: the head);
 *   backward: (tied, u1 = n) BWD 0, BWD_PART 0; then BWD u, BWD_DONE u for
 *             u = u1-1 down to u0.
 * `next` (the prefetch hint) is the unit of the following event of the same
 * pass, -1 at the end. */
#ifndef RF_TR_CAUSAL_UNITS_H
#define RF_TR_CAUSAL_UNITS_H

#include <stdbool.h>

/* The head reads unit 0 again in this range. */
static inline bool rf_cu_head_reads_emb(int u1, int n, bool tied) {
    return tied && u1 == n;
}

/* next of FWD u (head: the tied head's FWD 0). */
static inline int rf_cu_fwd_next(int u, bool head, int u1, int n, bool tied) {
    if (head) return -1;
    if (u + 1 < u1) return u + 1;
    return rf_cu_head_reads_emb(u1, n, tied) ? 0 : -1;
}

/* next of BWD u (head: the tied head's BWD 0). */
static inline int rf_cu_bwd_next(int u, bool head, int u0, int u1) {
    if (head) return u1 - 1;
    return u - 1 >= u0 ? u - 1 : -1;
}

#endif
