/* The stage cache of `refinery run`: each stage's outputs stored under a key
 * that hashes (XXH3-128) everything they depend on:
 *   - the stage's name and code version (rf_stage_cache.version);
 *   - its spec section after defaults, serialized canonically (keys sorted,
 *     numbers and booleans normalized, the generic keys cache/retries/resources
 *     and the stage's ignore list left out);
 *   - the content of every file or directory a value of the section names
 *     (input files, the tokenizer file, the pretrained model);
 *   - the key of the stage before it (which covers that stage's inputs).
 *
 * An entry is the directory <cache_dir>/<stage>/<key>/:
 *   out/<name>   the stage's outputs, moved there from the run directory, which
 *                then holds a symbolic link to them (reuse is by reference)
 *   stream.jsonl the documents a streaming stage passed on, to feed a later
 *                stage that is not cached (optional)
 *   stats.tsv    the stage's counters, restored into stats.json on a hit
 *   MANIFEST     every file with its size and XXH3-128 of its content
 *   COMPLETE     the key and the hash of MANIFEST, written last
 * It is built in a temporary directory beside it and renamed into place, so a
 * crash leaves no entry. A lookup checks COMPLETE, MANIFEST and every file's
 * size and content: an entry that fails is removed (and the stage rebuilt),
 * never used. Content hashes of input files are remembered under
 * <cache_dir>/files/ by path, device, inode, size and modification times. */
#ifndef RF_PIPELINE_CACHE_H
#define RF_PIPELINE_CACHE_H

#include <stdbool.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/stats.h"
#include "pipeline/stages.h"

#define RF_CACHE_KEY_LEN 33 /* 32 hex digits and NUL */

typedef struct rf_cache rf_cache;

/* The default directory: $XDG_CACHE_HOME/refinery, else ~/.cache/refinery
 * (malloc'd; NULL without either variable). */
char *rf_cache_default_dir(void);

/* Opens (creating) the cache at dir. */
int rf_cache_open(const char *dir, rf_cache **out);
void rf_cache_close(rf_cache *c);
const char *rf_cache_path(const rf_cache *c); /* absolute */

/* The canonical form of a section (info may be NULL) that the key hashes. */
int rf_cache_canon(const rf_cfg *section, const rf_stage_cache *info, rf_buf *out);

/* The key of a stage (upstream: the previous stage's key, or NULL). */
int rf_cache_key(rf_cache *c, const char *stage, const rf_stage_cache *info, const rf_cfg *section,
                 const char *upstream, char key[RF_CACHE_KEY_LEN]);

/* 1 and *entry (malloc'd) for a complete, intact entry; 0 when there is none
 * (*why says why: "absent", or what was wrong with an entry now removed). */
int rf_cache_lookup(rf_cache *c, const char *stage, const char *key, char **entry,
                    const char **why);

/* Starts an entry: *tmp (malloc'd) is an empty directory to fill. */
int rf_cache_begin(rf_cache *c, const char *stage, const char *key, char **tmp);
/* Moves run_dir/<outputs> into tmp/out/, writes stats (the counters under
 * "<stage>." except skip_suffixes), MANIFEST and COMPLETE, renames tmp into
 * place and links run_dir/<outputs> to it. *entry (malloc'd) is the entry. */
int rf_cache_commit(rf_cache *c, const char *stage, const char *key, char *tmp, const char *run_dir,
                    const char *const *outputs, const rf_stats *stats, char **entry);
/* Removes a begun entry. */
void rf_cache_abort(char *tmp);

/* Links run_dir/<outputs> to entry/out/<outputs> (replacing what is there)
 * and adds the entry's counters to stats. */
int rf_cache_reuse(const char *entry, const char *run_dir, const char *const *outputs,
                   rf_stats *stats);

/* Removes run_dir/<outputs> that are links (into the cache), so that a stage
 * that reruns writes fresh directories instead of into an entry. */
int rf_cache_unlink_outputs(const char *run_dir, const char *const *outputs);

/* Removes path and everything under it (not following links). */
int rf_rm_tree(const char *path);

/* The counter names a stage entry does not keep: the runner's own records. */
bool rf_cache_is_record(const char *name);

#endif
