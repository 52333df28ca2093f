/* Easy Data Augmentation (EDA, Wei & Zou 2019): synonym replacement (WordNet),
 * random insertion of a synonym, random swap and random deletion of words.
 *
 * Each augmented copy applies one operation, cycling SR, RI, RS, RD over the
 * operations whose alpha is > 0; an operation changes max(1, alpha * words)
 * words (RD deletes each word with probability alpha, keeping at least one).
 * Words are whitespace-separated tokens; punctuation stays attached. Synonym
 * lookup lowercases the word and strips surrounding punctuation.
 *
 * Deterministic: the copies depend only on the text and the seed. Derive the
 * seed with rf_augment_seed(global_seed, doc_id) so results do not depend on
 * thread count or order. Off by default. */
#ifndef RF_INGEST_AUGMENT_H
#define RF_INGEST_AUGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/config.h"

typedef struct rf_augment_opts {
    bool enabled;    /* default false */
    size_t n_aug;    /* copies per document; default 4 */
    double alpha_sr; /* default 0.1 each (the EDA paper's recommendation) */
    double alpha_ri;
    double alpha_rs;
    double alpha_rd;
    uint64_t seed;           /* global seed, default 0 */
    const char *wordnet_dir; /* default "/usr/share/wordnet" (Debian wordnet-base) */
} rf_augment_opts;

void rf_augment_opts_default(rf_augment_opts *o);
/* Reads an `augment:` map: enabled, n_aug (0..64), alpha_sr, alpha_ri,
 * alpha_rs, alpha_rd (0..1), seed, wordnet_dir. Strings point into the tree,
 * which must outlive *o. Keys absent keep *o; section may be NULL. */
int rf_augment_opts_from_cfg(const rf_cfg *section, rf_augment_opts *o);

typedef struct rf_augmenter rf_augmenter;

/* Loads WordNet's index/data files (noun, verb, adj, adv) from o->wordnet_dir.
 * RF_ERR_NOT_FOUND / RF_ERR_CORRUPT with a message naming the file. */
int rf_augmenter_new(const rf_augment_opts *o, rf_augmenter **out);
void rf_augmenter_free(rf_augmenter *a);

/* Sorted synonyms of a lowercase word (multi-word lemmas use spaces), NULL-
 * terminated, owned by a; *count may be NULL. NULL if the word has none. */
const char *const *rf_augmenter_synonyms(const rf_augmenter *a, const char *word, size_t len,
                                         size_t *count);

/* Per-document seed: mixes the global seed with a hash of the document id. */
uint64_t rf_augment_seed(uint64_t global_seed, const char *doc_id, size_t id_len);

/* Writes n_aug augmented copies of text[0..n) into outs[0..n_aug) (each reset
 * first). Thread-safe: a is read-only after construction. Returns 0 or
 * RF_ERR_NOMEM. */
int rf_augment(const rf_augmenter *a, const char *text, size_t n, uint64_t seed, rf_buf *outs,
               size_t n_aug);

#endif
