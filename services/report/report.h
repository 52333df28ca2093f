/* The run report: one self-contained HTML file (report.html in the run
 * directory) built from what the stages wrote there. No scripts, no network
 * requests: styles are inline and charts are inline SVG. Every string that
 * comes from data (texts, ids, reasons, the spec) is HTML-escaped.
 *
 * Sections and where their data comes from (a missing file leaves its section
 * with a note saying which file is missing):
 *   spec and cache   spec.yaml (rf_report_save_spec), stats.json <stage>.cached,
 *                    .key, .attempts when the runner records them
 *   funnel           stats.json: ingest records_in/kept, dedup, tokenizer,
 *                    trainer, evaluator counts
 *   rejects          stats.json <stage>.rejected.<reason>; examples from
 *                    ingest/rejects.jsonl, tokenizer/rejects.jsonl,
 *                    dedup/dups.jsonl (first 3 of each reason)
 *   duplicates       stats.json dedup.cluster_size
 *   token lengths    tokenizer/{train,eval}.idx (sequence lengths),
 *                    tokenizer/report.json (padding)
 *   training         trainer/metrics.jsonl (loss, lr, grad norm, tokens/s per step)
 *   throughput       stats.json <stage>.docs_per_s, .seconds
 *   evaluation       evaluator/report.json (confusion matrix, per-class P/R/F1),
 *                    evaluator/predictions.jsonl (the worst-classified examples:
 *                    lowest probability of the true label); a causal LM: eval
 *                    loss, perplexity and the sample generations (prompt, greedy
 *                    completion, the text's continuation; evaluator/lm_loss.h) */
#ifndef RF_REPORT_H
#define RF_REPORT_H

#include "common/buf.h"

/* Writes <run_dir>/report.html (atomically). 0 or a negative rf_err. */
int rf_report_write(const char *run_dir);
/* The report as HTML into out (for tests). */
int rf_report_build(const char *run_dir, rf_buf *out);
/* Copies the spec file to <run_dir>/spec.yaml, so that `refinery report`
 * can show it later. */
int rf_report_save_spec(const char *run_dir, const char *spec_path);

/* Appends s[0..n) HTML-escaped (& < > " ') to out. */
int rf_html_escape(rf_buf *out, const char *s, size_t n);

#endif
