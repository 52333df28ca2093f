/* Conversations through a model's chat template: rendering, and the SFT
 * encoding with its loss mask.
 *
 * TEMPLATES. The ChatML template SmolLM2 and other instruct models carry is
 * recognised in the model's jinja text (rf_chat_render) and rendered as jinja
 * would: when the first message is not a system message, the template's
 * default system block; then "<|im_start|>" role "\n" content "<|im_end|>\n"
 * per message; then, with add_generation_prompt, "<|im_start|>assistant\n".
 * Other templates are RF_ERR_UNSUPPORTED (no jinja interpreter here).
 *
 * THE SFT ENCODING (rf_chat_encode). The conversation is rendered without a
 * generation prompt and tokenized without added special tokens (what
 * apply_chat_template(tokenize=True) gives: "<|im_start|>" and "<|im_end|>"
 * are the special tokens they are). The loss mask is TRL's prompt-completion
 * rule applied to every assistant turn: the tokens after an assistant's
 * "<|im_start|>assistant\n", up to and including its "<|im_end|>\n", are
 * targets (1); everything else (system and user turns, the role headers) is
 * not (0). The text is tokenized piece by piece at those boundaries so that
 * the mask is exact; a piece boundary lies between a "\n" or a special token
 * and the next text, which byte-level BPE pre-tokenization splits anyway, so
 * the ids equal the whole rendering's. rf_chat_encode checks this on every
 * conversation and reports a difference (*merged) rather than hiding it.
 *
 * Where a model's template lives (rf_chat_template_find): a GGUF file's
 * tokenizer.chat_template; beside a tokenizer.json (or in a model folder),
 * tokenizer_config.json's "chat_template" string, or chat_template.jinja
 * (transformers 5). */
#ifndef RF_TOK_CHAT_H
#define RF_TOK_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "tokenizer/tokenizer.h"

/* One chat message (NUL-terminated strings, borrowed). */
typedef struct rf_chat_msg {
    const char *role, *content;
} rf_chat_msg;

/* Renders msgs with the ChatML template `tmpl` (NULL: RF_ERR_NOT_FOUND),
 * appending to out; add_generation_prompt appends the assistant's header. */
int rf_chat_render(const char *tmpl, const rf_chat_msg *msgs, size_t n, bool add_generation_prompt,
                   rf_buf *out);

/* The chat template for the tokenizer or model at `path` (a .gguf file, a
 * tokenizer.json or any file in a model folder, or the folder): *out is a
 * malloc'd copy, or NULL when there is none (not an error). */
int rf_chat_template_find(const char *path, char **out);

/* Canonical messages JSON (common/doc.h) to messages: *msgs (malloc'd) holds
 * *n messages whose strings are in *store (malloc'd); free both. A
 * malformed array is RF_ERR_INVALID. */
int rf_chat_msgs_parse(const char *json, size_t len, rf_chat_msg **msgs, size_t *n, char **store);

/* The SFT encoding above into e (reused, see tokenizer.h) and *mask (malloc'd,
 * e->len bytes, caller frees). *merged: the piecewise ids differ from the
 * whole rendering's (the piecewise ones are kept). ts's tokenizer must not
 * truncate below the conversation's length (the caller checks e->len). */
int rf_chat_encode(rf_tok_state *ts, const char *tmpl, const rf_chat_msg *msgs, size_t n,
                   rf_tok_encoding *e, uint8_t **mask, bool *merged);

#endif
