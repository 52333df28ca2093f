/* GPT-2 byte-level BPE: the GPT-2 pre-tokenization regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * matched by hand (classes from unicode_tables.h), then ranked merges over
 * byte ids, with a per-thread cache of recent words. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/utf8.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode_tables.h"

#define CACHE_MAX_KEY   64         /* longer pieces are not cached */
#define CACHE_SLOTS     (1u << 16) /* per thread */
#define CACHE_KEY_BYTES (1u << 23) /* cleared when either budget is spent */

enum { CL_OTHER = 0, CL_L = 1, CL_N = 2, CL_S = 3 };

static int class_of_flags(uint16_t f) {
    if (f & RF_CP_L) return CL_L;
    if (f & RF_CP_N) return CL_N;
    if (f & RF_CP_S) return CL_S;
    return CL_OTHER;
}

static __attribute__((noinline)) int class_slow(const unsigned char *s, size_t n, size_t i,
                                                size_t *clen) {
    uint32_t cp;
    int k = rf_utf8_decode(s + i, n - i, &cp);
    *clen = k > 0 ? (size_t)k : 1;
    return k > 0 ? class_of_flags(rf_tok_cp_class(cp)) : CL_OTHER;
}

/* Class and byte length of the character at s[i] (valid UTF-8). */
static inline int class_at(const uint8_t *ascii, const unsigned char *s, size_t n, size_t i,
                           size_t *clen) {
    if (s[i] < 0x80) {
        *clen = 1;
        return ascii[s[i]];
    }
    return class_slow(s, n, i, clen);
}

/* End of the run of characters of class cl starting at i. */
static size_t run_end(const uint8_t *ascii, const unsigned char *s, size_t n, size_t i, int cl) {
    while (i < n) {
        size_t k;
        if (class_at(ascii, s, n, i, &k) != cl) break;
        i += k;
    }
    return i;
}

/* Length of the regex match at s[i] (the whole input is covered by matches). */
static size_t next_piece(const uint8_t *ascii, const unsigned char *s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    size_t k;
    int cl = class_at(ascii, s, n, i, &k);
    size_t j = i;
    if (s[i] == ' ' && i + 1 < n) {
        size_t k2;
        int cl2 = class_at(ascii, s, n, i + 1, &k2);
        if (cl2 != CL_S) { /* " ?X+" with the optional space */
            cl = cl2;
            j = i + 1;
        }
    }
    if (cl != CL_S) return run_end(ascii, s, n, j, cl) - i;
    /* \s+(?!\S) then \s+: a whitespace run stops one character short of a
     * following non-space, which then may take that last space as its prefix */
    size_t end = i, last = i;
    while (end < n) {
        size_t k2;
        if (class_at(ascii, s, n, end, &k2) != CL_S) break;
        last = end;
        end += k2;
    }
    if (end == n || last == i) return end - i;
    return last - i;
}

static inline const rf_merge_slot *merge_find(const rf_tokenizer *t, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t j = rf_mix64(key) & t->merges_mask;; j = (j + 1) & t->merges_mask) {
        const rf_merge_slot *m = &t->merges[j];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

static inline uint32_t pair_rank(const rf_tokenizer *t, uint32_t a, uint32_t b) {
    const rf_merge_slot *m = merge_find(t, a, b);
    return m ? m->rank : UINT32_MAX;
}

/* BPE of one pre-token: start from byte ids and apply the lowest-ranked merge
 * (leftmost on ties) until none applies -- the order of HF's merge heap.
 * Short words scan their pairs (quadratic, but tiny and cache-friendly). */
static int bpe_word_short(rf_tok_state *st, const unsigned char *s, size_t n, rf_u32vec *out) {
    const rf_tokenizer *t = st->tok;
    rf_u32vec *sym = &st->sym, *rank = &st->rank;
    sym->n = rank->n = 0;
    if (rf_u32vec_reserve(sym, n) || rf_u32vec_reserve(rank, n)) return RF_ERR_NOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) /* a byte missing from the vocabulary is dropped, as HF does */
        if (t->byte_id[s[i]] != RF_BPE_NO_BYTE) sym->v[m++] = t->byte_id[s[i]];
    for (size_t i = 0; i + 1 < m; i++)
        rank->v[i] = pair_rank(t, sym->v[i], sym->v[i + 1]);
    while (m > 1) {
        size_t best = 0;
        uint32_t br = UINT32_MAX;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank->v[i] < br) br = rank->v[i], best = i;
        if (br == UINT32_MAX) break;
        sym->v[best] = merge_find(t, sym->v[best], sym->v[best + 1])->id;
        memmove(sym->v + best + 1, sym->v + best + 2, (m - best - 2) * sizeof *sym->v);
        memmove(rank->v + best + 1, rank->v + best + 2, (m - best - 2) * sizeof *rank->v);
        m--;
        if (best > 0) rank->v[best - 1] = pair_rank(t, sym->v[best - 1], sym->v[best]);
        if (best + 1 < m) rank->v[best] = pair_rank(t, sym->v[best], sym->v[best + 1]);
    }
    if (rf_u32vec_reserve(out, m)) return RF_ERR_NOMEM;
    memcpy(out->v + out->n, sym->v, m * sizeof *sym->v);
    out->n += m;
    return 0;
}

/* A candidate merge of the symbol at pos with its right neighbour. */
struct rf_bpe_cand {
    uint32_t rank, pos, left, right;
};

static bool cand_before(const struct rf_bpe_cand *a, const struct rf_bpe_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct rf_bpe_cand *h, size_t *n, struct rf_bpe_cand c) {
    size_t i = (*n)++;
    while (i > 0 && cand_before(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static struct rf_bpe_cand heap_pop(struct rf_bpe_cand *h, size_t *n) {
    struct rf_bpe_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const struct rf_bpe_cand *best = &last;
        if (l < *n && cand_before(&h[l], best)) m = l, best = &h[l];
        if (l + 1 < *n && cand_before(&h[l + 1], best)) m = l + 1;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = last;
    return top;
}

/* Long words (a URL, a base64 blob) merge through a heap of candidate pairs
 * over a linked list of symbols, O(n log n) like HF's: the minimum (rank,
 * position) is taken, stale candidates (a side already merged away) skipped. */
static int bpe_word_long(rf_tok_state *st, const unsigned char *s, size_t n, rf_u32vec *out) {
    const rf_tokenizer *t = st->tok;
    rf_u32vec *sym = &st->sym, *link = &st->link;
    sym->n = link->n = 0;
    if (rf_u32vec_reserve(sym, n) || rf_u32vec_reserve(link, 2 * n)) return RF_ERR_NOMEM;
    /* n - 1 initial candidates, and at most two more per merge (n - 1 merges) */
    if (st->heap_cap < 3 * n) {
        struct rf_bpe_cand *h = realloc(st->heap, 3 * n * sizeof *h);
        if (!h) return RF_ERR_NOMEM;
        st->heap = h;
        st->heap_cap = 3 * n;
    }
    uint32_t *next = link->v, *prev = link->v + n, *id = sym->v;
    const uint32_t none = UINT32_MAX;
    size_t hn = 0, k = 0;
    for (size_t i = 0; i < n; i++) /* missing bytes dropped, as in bpe_word_short */
        if (t->byte_id[s[i]] != RF_BPE_NO_BYTE) id[k++] = t->byte_id[s[i]];
    n = k;
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (uint32_t)(i + 1) : none;
        prev[i] = i ? (uint32_t)(i - 1) : none;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const rf_merge_slot *m = merge_find(t, id[i], id[i + 1]);
        if (m)
            heap_push(st->heap, &hn, (struct rf_bpe_cand){m->rank, (uint32_t)i, id[i], id[i + 1]});
    }
    while (hn) {
        struct rf_bpe_cand c = heap_pop(st->heap, &hn);
        uint32_t p = c.pos, q = next[p];
        if (id[p] == none || q == none || id[p] != c.left || id[q] != c.right) continue; /* stale */
        id[p] = merge_find(t, c.left, c.right)->id;
        id[q] = none; /* q is gone */
        next[p] = next[q];
        if (next[q] != none) prev[next[q]] = p;
        if (prev[p] != none) {
            const rf_merge_slot *m = merge_find(t, id[prev[p]], id[p]);
            if (m)
                heap_push(st->heap, &hn,
                          (struct rf_bpe_cand){m->rank, prev[p], id[prev[p]], id[p]});
        }
        if (next[p] != none) {
            const rf_merge_slot *m = merge_find(t, id[p], id[next[p]]);
            if (m) heap_push(st->heap, &hn, (struct rf_bpe_cand){m->rank, p, id[p], id[next[p]]});
        }
    }
    for (uint32_t p = 0; p != none; p = next[p])
        if (rf_u32vec_push(out, id[p])) return RF_ERR_NOMEM;
    return 0;
}

#define SHORT_WORD 48 /* bytes; the pair scan is faster below this */

static int bpe_word(rf_tok_state *st, const unsigned char *s, size_t n, rf_u32vec *out) {
    return n <= SHORT_WORD ? bpe_word_short(st, s, n, out) : bpe_word_long(st, s, n, out);
}

static void cache_clear(rf_tok_state *st) {
    memset(st->cache, 0, (st->cache_mask + 1) * sizeof *st->cache);
    st->cache_count = 0;
    st->cache_keys.len = 0;
    st->cache_ids.n = 0;
}

/* BPE through the cache; pieces are cached by their raw bytes. */
static int bpe_cached(rf_tok_state *st, const unsigned char *s, size_t n, rf_u32vec *out) {
    if (n > CACHE_MAX_KEY) return bpe_word(st, s, n, out);
    if (!st->cache) {
        st->cache = calloc(CACHE_SLOTS, sizeof *st->cache);
        if (!st->cache) return RF_ERR_NOMEM;
        st->cache_mask = CACHE_SLOTS - 1;
    }
    uint64_t h = rf_hash64(s, n, 0);
    uint32_t tag = (uint32_t)(h >> 32) | 1;
    size_t j = h & st->cache_mask;
    for (; st->cache[j].tag; j = (j + 1) & st->cache_mask) {
        const rf_bpe_cache_slot *c = &st->cache[j];
        if (c->tag == tag && c->key_len == n &&
            memcmp(st->cache_keys.data + c->key_off, s, n) == 0) {
            if (rf_u32vec_reserve(out, c->val_len)) return RF_ERR_NOMEM;
            memcpy(out->v + out->n, st->cache_ids.v + c->val_off, c->val_len * sizeof *out->v);
            out->n += c->val_len;
            return 0;
        }
    }
    size_t before = out->n;
    int rc = bpe_word(st, s, n, out);
    if (rc) return rc;
    size_t nv = out->n - before; /* <= n <= CACHE_MAX_KEY */
    if ((st->cache_count + 1) * 2 > st->cache_mask + 1 ||
        st->cache_keys.len + n > CACHE_KEY_BYTES) {
        cache_clear(st);
        j = h & st->cache_mask;
    }
    size_t koff = st->cache_keys.len, voff = st->cache_ids.n;
    if (rf_buf_append(&st->cache_keys, s, n) || rf_u32vec_reserve(&st->cache_ids, nv))
        return RF_ERR_NOMEM;
    memcpy(st->cache_ids.v + voff, out->v + before, nv * sizeof *out->v);
    st->cache_ids.n += nv;
    st->cache[j] =
        (rf_bpe_cache_slot){tag, (uint32_t)koff, (uint32_t)voff, (uint16_t)n, (uint16_t)nv};
    st->cache_count++;
    return 0;
}

void rf_bpe_init_classes(rf_tokenizer *t) {
    for (int b = 0; b < 128; b++)
        t->ascii_class[b] = (uint8_t)class_of_flags(rf_tok_cp_class((uint32_t)b));
}

int rf_bpe_encode(rf_tok_state *st, const char *text, size_t len, rf_u32vec *out) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = len;
    if (st->tok->add_prefix_space && n > 0 && s[0] != ' ') {
        /* ByteLevel(add_prefix_space): the segment is seen with a leading ' ' */
        rf_buf *w = &st->word;
        w->len = 0;
        if (rf_buf_putc(w, ' ') || rf_buf_append(w, text, len)) return RF_ERR_NOMEM;
        s = (const unsigned char *)w->data;
        n = w->len;
    }
    for (size_t i = 0; i < n;) {
        size_t k = next_piece(st->tok->ascii_class, s, n, i);
        int rc = bpe_cached(st, s + i, k, out);
        if (rc) return rc;
        i += k;
    }
    return 0;
}
