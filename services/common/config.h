/* Pipeline specs: YAML (libyaml) loaded into a tree of maps, sequences and
 * scalars that remembers each node's dotted path and source line, so that every
 * error names the offending key ("spec.yaml:12: ingest.threads: expected an
 * integer in [1, 256], got 'many'").
 *
 * Environment overrides: REFINERY__INGEST__THREADS=4 sets ingest.threads
 * (double underscore separates levels; keys are lowercased). */
#ifndef RF_CONFIG_H
#define RF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rf_cfg rf_cfg;

typedef enum rf_cfg_kind { RF_CFG_SCALAR, RF_CFG_MAP, RF_CFG_SEQ } rf_cfg_kind;

int rf_cfg_load_file(const char *path, rf_cfg **root);
int rf_cfg_load_string(const char *yaml, size_t len, const char *name, rf_cfg **root);
void rf_cfg_free(rf_cfg *root);
/* Applies REFINERY__A__B=value overrides from environ. */
int rf_cfg_apply_env(rf_cfg *root);
/* Sets a dotted key to a scalar value, creating maps on the way. */
int rf_cfg_set(rf_cfg *root, const char *dotted, const char *value);

rf_cfg_kind rf_cfg_kind_of(const rf_cfg *n);
const char *rf_cfg_path(const rf_cfg *n); /* dotted path, "" for the root */
int rf_cfg_line(const rf_cfg *n);         /* 1-based source line, 0 if from env */
const char *rf_cfg_source(const rf_cfg *n);
size_t rf_cfg_len(const rf_cfg *n);                   /* children of a map/seq */
const rf_cfg *rf_cfg_at(const rf_cfg *n, size_t i);   /* i-th value */
const char *rf_cfg_key_at(const rf_cfg *n, size_t i); /* i-th key of a map */
const char *rf_cfg_scalar(const rf_cfg *n);           /* NULL unless scalar */
/* Child by dotted path ("ingest.clean.nfkc"), NULL if absent. */
const rf_cfg *rf_cfg_get(const rf_cfg *n, const char *dotted);

/* Typed getters: absent key -> def; present but wrong -> RF_ERR_INVALID with a
 * message naming the key and what was expected. */
int rf_cfg_str(const rf_cfg *n, const char *key, const char *def, const char **out);
int rf_cfg_int(const rf_cfg *n, const char *key, int64_t def, int64_t min, int64_t max,
               int64_t *out);
int rf_cfg_real(const rf_cfg *n, const char *key, double def, double min, double max, double *out);
int rf_cfg_bool(const rf_cfg *n, const char *key, bool def, bool *out);
/* One of choices[] (NULL-terminated); stores its index. */
int rf_cfg_enum(const rf_cfg *n, const char *key, const char *const *choices, int def, int *out);
/* A scalar or a sequence of scalars; *out is a NULL-terminated array owned by
 * the caller (free the array, not the strings, which live in the tree). */
int rf_cfg_strlist(const rf_cfg *n, const char *key, const char ***out, size_t *count);

/* Fails with RF_ERR_INVALID naming the first key of map n that is not in
 * allowed[] (NULL-terminated), with a did-you-mean suggestion. */
int rf_cfg_check_keys(const rf_cfg *n, const char *const *allowed);

#endif
