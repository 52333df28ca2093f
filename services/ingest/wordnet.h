/* A read-only synonym table built from the WordNet 3.0 database files shipped
 * by Debian's wordnet-base (index.*, data.*, *.exc). Synonyms follow EDA's
 * get_synonyms(): every lemma of every synset of the word, in any part of
 * speech, lowercased with '_' and '-' turned into spaces, keeping only those
 * made of a-z and spaces, without the word itself. */
#ifndef RF_INGEST_WORDNET_H
#define RF_INGEST_WORDNET_H

#include <stddef.h>

typedef struct rf_wordnet rf_wordnet;

/* Parses the files under dir. RF_ERR_NOT_FOUND / RF_ERR_CORRUPT name the file. */
int rf_wordnet_load(const char *dir, rf_wordnet **out);
void rf_wordnet_free(rf_wordnet *wn);

/* Synonyms of a lowercase lemma (sorted, NULL-terminated, owned by wn), or
 * NULL. *count may be NULL. */
const char *const *rf_wordnet_synonyms(const rf_wordnet *wn, const char *word, size_t len,
                                       size_t *count);

/* Like rf_wordnet_synonyms, but an inflected word is first reduced to its base
 * form as WordNet's morphy does (exception lists, then suffix rules): the first
 * base form that has synonyms is used. */
const char *const *rf_wordnet_lookup(const rf_wordnet *wn, const char *word, size_t len,
                                     size_t *count);

/* Distinct lemmas with at least one synonym (for tests and logs). */
size_t rf_wordnet_lemmas(const rf_wordnet *wn);

#endif
