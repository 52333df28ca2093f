/* Presets for the real data in ../shared/data (see README.md here):
 *
 *   amazon    Amazon reviews: the 2014 and 2018 JSON formats and the header-less
 *             CSV rendering (reviewerID, asin, reviewerName, helpful, reviewText,
 *             overall, summary, unixReviewTime, reviewTime). The format is chosen
 *             per file. Text = summary + "\n" + reviewText (either may be
 *             missing), label = overall mapped 1-2 -> 0, 3-5 -> 1.
 *   sst2      GLUE SST-2 TSV: header "sentence\tlabel", no quoting (quotes are
 *             literal text), label 0/1 as is.
 *   wikitext  WikiText raw: a document per non-blank line (each is a paragraph
 *             of an article); " = Heading = " lines are rejected as "heading",
 *             blank lines are separators.
 *   sft       SFT conversations, JSON Lines: {"messages": [{"role", "content"},
 *             ...]} or {"prompt", "response" | "completion", "system"?}
 *             (ingest.h's `conversations`); the quality filter is off.
 *
 * A preset only sets defaults: any explicit option applied after it wins. */
#ifndef RF_INGEST_PRESET_H
#define RF_INGEST_PRESET_H

#include "ingest/ingest.h"

/* Applies the named preset; RF_ERR_INVALID naming the choices if unknown. */
int rf_ingest_preset_apply(rf_ingest_opts *o, const char *name);

#endif
