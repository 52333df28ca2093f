/* Test support: a JSON Lines corpus that mixes kept records with every
 * reader-level reject reason (broken JSON, a missing text, a bad label, a
 * blank line, empty text, invalid UTF-8), seven lines to a cycle. */
#ifndef RF_TEST_MIXED_JSONL_H
#define RF_TEST_MIXED_JSONL_H

/* Writes n lines to path: 0, or -1 when the file cannot be written. */
int test_write_mixed_jsonl(const char *path, int n);

#endif
