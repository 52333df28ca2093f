/* A llama.cpp GGUF file of architecture "llama" (SmolLM2, TinyLlama, ...) as
 * an rf_llama in Hugging Face's layout, with every weight dequantized to fp32
 * (gguf.h): what transformers builds from AutoModelForCausalLM.from_pretrained(
 * dir, gguf_file=...).
 *
 * Config: llama.{block_count, context_length, embedding_length,
 * feed_forward_length, attention.head_count, attention.head_count_kv,
 * attention.layer_norm_rms_epsilon, rope.freq_base, vocab_size} (vocab_size,
 * when absent, from token_embd's rows); head_dim = embedding_length /
 * head_count as transformers computes it (rope.dimension_count must equal it:
 * partial rotary is refused); the head is tied when the file has no
 * output.weight (transformers' rule). Rope scaling other than "none" and any
 * tensor outside the map below (biases, rope_freqs, ...) are
 * RF_ERR_UNSUPPORTED, named in the message.
 *
 *   token_embd            model.embed_tokens        output_norm  model.norm
 *   output                lm_head (untied only)
 *   blk.N.attn_norm       input_layernorm           blk.N.ffn_norm  post_attention_layernorm
 *   blk.N.attn_q/k/v      self_attn.q/k/v_proj      blk.N.attn_output  self_attn.o_proj
 *   blk.N.ffn_gate/up/down  mlp.gate/up/down_proj
 *
 * convert_hf_to_gguf.py permutes the rows of q_proj and k_proj within each
 * head for llama.cpp's interleaved RoPE (HF row a*hd/2 + i -> GGUF row 2i + a,
 * per query head for q and per key/value head for k); the loader undoes it,
 * as transformers does, so the HF rotate_half RoPE of ops_causal.h applies. */
#ifndef RF_TR_LLAMA_GGUF_H
#define RF_TR_LLAMA_GGUF_H

#include "common/gguf.h"
#include "trainer/llama.h"

/* The config from f's metadata (f must be a "llama" GGUF). */
int rf_llama_config_from_gguf(const rf_gguf_file *f, rf_llama_config *c);
/* The model with every tensor of f dequantized and un-permuted; f may be
 * freed afterwards. */
int rf_llama_from_gguf(const rf_gguf_file *f, rf_llama **out);
/* The row permutation above for one projection of `heads` heads of hd rows:
 * map[HF row] = GGUF row (map has heads * hd entries). The LoRA loader
 * (lora_gguf.c) uses it to reorder quantized blocks without dequantizing. */
void rf_llama_gguf_row_map(int32_t *map, int heads, int hd);
/* rf_gguf_open + rf_llama_from_gguf. */
int rf_llama_load_gguf(const char *path, rf_llama **out);

/* Whether a model path names a GGUF: a regular file ending in ".gguf", or a
 * folder without config.json holding exactly one such file (the evaluator's
 * rule, lm.h). *out: that file's path (malloc'd), or NULL when the path is
 * anything else (a Hugging Face folder, a missing path: the caller's loader
 * says what is wrong). A folder without config.json holding several .gguf
 * files is RF_ERR_INVALID. */
int rf_llama_gguf_path(const char *path, char **out);
/* The config, the eos id (tokenizer.ggml.eos_token_id, -1 when absent) and
 * the tensor type of blk.0.attn_q.weight (the projections' type) of the GGUF
 * file at path. */
int rf_llama_gguf_describe(const char *path, rf_llama_config *c, int *eos, rf_ggml_type *proj);

#endif
