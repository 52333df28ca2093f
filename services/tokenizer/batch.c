/* Batching for training (see batch.h). */
#include "tokenizer/batch.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"

/* ---- partitioning ---- */

typedef struct heap_item {
    uint64_t load;
    uint32_t part;
} heap_item;

static bool lighter(heap_item a, heap_item b) {
    return a.load < b.load || (a.load == b.load && a.part < b.part);
}

static void sift_down(heap_item *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && lighter(h[l], h[m])) m = l;
        if (r < n && lighter(h[r], h[m])) m = r;
        if (m == i) return;
        heap_item t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static const uint32_t *sort_lens; /* qsort has no context argument */

static int by_len_desc(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    if (sort_lens[x] != sort_lens[y]) return sort_lens[x] > sort_lens[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int by_len_asc(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    if (sort_lens[x] != sort_lens[y]) return sort_lens[x] < sort_lens[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Sorts idx by length with a counting sort when lengths are small (they are:
 * at most max_length), else qsort; stable on the index either way. */
static int sort_by_len(const uint32_t *lens, size_t *idx, size_t n, bool desc) {
    uint32_t maxlen = 0;
    for (size_t i = 0; i < n; i++)
        if (lens[idx[i]] > maxlen) maxlen = lens[idx[i]];
    if (maxlen > (1u << 20)) {
        sort_lens = lens;
        qsort(idx, n, sizeof *idx, desc ? by_len_desc : by_len_asc);
        return 0;
    }
    size_t *count = calloc((size_t)maxlen + 2, sizeof *count), *out = malloc(n * sizeof *out);
    if (!count || !out) {
        free(count);
        free(out);
        return RF_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        count[(desc ? maxlen - lens[idx[i]] : lens[idx[i]]) + 1]++;
    for (size_t k = 1; k <= (size_t)maxlen + 1; k++)
        count[k] += count[k - 1];
    for (size_t i = 0; i < n; i++)
        out[count[desc ? maxlen - lens[idx[i]] : lens[idx[i]]]++] = idx[i];
    memcpy(idx, out, n * sizeof *idx);
    free(count);
    free(out);
    return 0;
}

int rf_partition_balanced(const uint32_t *lens, size_t n, int parts, uint32_t *assign,
                          rf_partition_report *rep) {
    if (parts < 1) return rf_fail(RF_ERR_INVALID, "partitions must be >= 1");
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    heap_item *h = malloc((size_t)parts * sizeof *h);
    int rc = idx && h ? 0 : RF_ERR_NOMEM;
    for (size_t i = 0; !rc && i < n; i++)
        idx[i] = i;
    if (!rc) rc = sort_by_len(lens, idx, n, true);
    if (rc) {
        free(idx);
        free(h);
        return rc;
    }
    for (int p = 0; p < parts; p++)
        h[p] = (heap_item){0, (uint32_t)p};
    for (size_t k = 0; k < n; k++) {
        assign[idx[k]] = h[0].part;
        h[0].load += lens[idx[k]];
        sift_down(h, (size_t)parts, 0);
    }
    uint64_t max = 0, min = UINT64_MAX, total = 0;
    for (int p = 0; p < parts; p++) {
        total += h[p].load;
        if (h[p].load > max) max = h[p].load;
        if (h[p].load < min) min = h[p].load;
    }
    rep->max_tokens = max;
    rep->min_tokens = min;
    rep->mean_tokens = (double)total / parts;
    rep->imbalance = total ? (double)max / rep->mean_tokens : 1.0;
    free(idx);
    free(h);
    return 0;
}

/* ---- bucketed batching ---- */

void rf_batch_plan_free(rf_batch_plan *p) {
    free(p->order);
    free(p->batch_start);
    memset(p, 0, sizeof *p);
}

int rf_batch_by_length(const uint32_t *lens, const size_t *idx, size_t n, size_t batch_size,
                       uint64_t seed, rf_batch_plan *plan) {
    memset(plan, 0, sizeof *plan);
    if (batch_size == 0) return rf_fail(RF_ERR_INVALID, "batch_size must be >= 1");
    size_t nb = (n + batch_size - 1) / batch_size;
    size_t *sorted = malloc((n ? n : 1) * sizeof *sorted);
    size_t *perm = malloc((nb ? nb : 1) * sizeof *perm);
    plan->order = malloc((n ? n : 1) * sizeof *plan->order);
    plan->batch_start = malloc((nb + 1) * sizeof *plan->batch_start);
    int rc = sorted && perm && plan->order && plan->batch_start ? 0 : RF_ERR_NOMEM;
    for (size_t i = 0; !rc && i < n; i++)
        sorted[i] = idx ? idx[i] : i;
    if (!rc) rc = sort_by_len(lens, sorted, n, false);
    if (rc) {
        free(sorted);
        free(perm);
        rf_batch_plan_free(plan);
        return rc;
    }
    /* Fisher-Yates over the batches with a splitmix64 stream */
    for (size_t b = 0; b < nb; b++)
        perm[b] = b;
    uint64_t s = seed;
    for (size_t b = nb; b > 1; b--) {
        s += 0x9e3779b97f4a7c15ull;
        size_t j = (size_t)(rf_mix64(s) % b);
        size_t t = perm[b - 1];
        perm[b - 1] = perm[j];
        perm[j] = t;
    }
    size_t at = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = perm[b] * batch_size, hi = lo + batch_size < n ? lo + batch_size : n;
        plan->batch_start[b] = at;
        uint32_t longest = 0;
        for (size_t k = lo; k < hi; k++) {
            plan->order[at++] = sorted[k];
            plan->real_tokens += lens[sorted[k]];
            if (lens[sorted[k]] > longest) longest = lens[sorted[k]];
        }
        plan->padded_tokens += (uint64_t)longest * (hi - lo);
    }
    plan->batch_start[nb] = at;
    plan->n = n;
    plan->n_batches = nb;
    free(sorted);
    free(perm);
    return 0;
}

uint64_t rf_padded_fixed(const uint32_t *lens, size_t n, uint32_t fixed_len) {
    if (fixed_len == 0)
        for (size_t i = 0; i < n; i++)
            if (lens[i] > fixed_len) fixed_len = lens[i];
    return (uint64_t)fixed_len * n;
}

uint64_t rf_padded_stream_batches(const uint32_t *lens, size_t n, size_t batch_size) {
    uint64_t padded = 0;
    for (size_t lo = 0; lo < n && batch_size; lo += batch_size) {
        size_t hi = lo + batch_size < n ? lo + batch_size : n;
        uint32_t longest = 0;
        for (size_t i = lo; i < hi; i++)
            if (lens[i] > longest) longest = lens[i];
        padded += (uint64_t)longest * (hi - lo);
    }
    return padded;
}

double rf_padding_fraction(uint64_t real, uint64_t padded) {
    return padded ? (double)(padded - real) / (double)padded : 0.0;
}

/* ---- packing ---- */

int rf_packer_init(rf_packer *p, uint32_t block_len, uint32_t eos_id) {
    memset(p, 0, sizeof *p);
    if (block_len < 2) return rf_fail(RF_ERR_INVALID, "block_len must be >= 2");
    p->buf = malloc(block_len * sizeof *p->buf);
    if (!p->buf) return RF_ERR_NOMEM;
    p->block_len = block_len;
    p->eos_id = eos_id;
    return 0;
}

void rf_packer_free(rf_packer *p) {
    free(p->buf);
    memset(p, 0, sizeof *p);
}

static int put(rf_packer *p, uint32_t id, rf_block_fn fn, void *ctx) {
    p->buf[p->fill++] = id;
    p->tokens++;
    if (p->fill < p->block_len) return 0;
    p->fill = 0;
    p->blocks++;
    return fn(ctx, p->buf, p->block_len);
}

int rf_packer_add(rf_packer *p, const uint32_t *ids, size_t n, rf_block_fn fn, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        int rc = put(p, ids[i], fn, ctx);
        if (rc) return rc;
    }
    return put(p, p->eos_id, fn, ctx);
}

int rf_packer_finish(rf_packer *p, bool pad, uint32_t pad_id, rf_block_fn fn, void *ctx,
                     uint32_t *left) {
    *left = p->fill ? (pad ? p->block_len - p->fill : p->fill) : 0;
    if (!p->fill) return 0;
    if (!pad) {
        p->tokens -= p->fill;
        p->fill = 0;
        return 0;
    }
    while (p->fill < p->block_len)
        p->buf[p->fill++] = pad_id;
    p->fill = 0;
    p->blocks++;
    return fn(ctx, p->buf, p->block_len);
}

void rf_pack_segments(const uint32_t *block, uint32_t len, uint32_t eos_id, uint32_t *seg) {
    uint32_t s = 0;
    for (uint32_t i = 0; i < len; i++) {
        seg[i] = s;
        if (block[i] == eos_id) s++;
    }
}

/* ---- split ---- */

bool rf_split_is_eval(uint64_t cluster, const char *doc_id, size_t id_len, double eval_fraction,
                      uint64_t seed) {
    if (eval_fraction <= 0) return false;
    if (eval_fraction >= 1) return true;
    uint64_t key = cluster ? cluster : rf_hash64(doc_id ? doc_id : "", doc_id ? id_len : 0, 0);
    uint64_t h = rf_mix64(key ^ rf_mix64(seed));
    return (double)(h >> 11) * 0x1.0p-53 < eval_fraction;
}
