/* libFuzzer target: PEFT adapter files (lora.h) on arbitrary bytes: a 2-byte
 * little-endian length L, then L bytes of adapter_config.json, then the bytes
 * of adapter_model.safetensors, loaded into a LoRA set (rank 4, alpha 12,
 * every projection) of a Llama shaped like tests/fixtures/causal/tiny-llama-rand
 * (the seed is that fixture's peft adapter). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "trainer/llama.h"
#include "trainer/lora.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static rf_llama *m;
    static rf_lora *lo;
    if (!lo) {
        rf_llama_config c = {.vocab_size = 64,
                             .hidden_size = 32,
                             .intermediate_size = 48,
                             .num_hidden_layers = 2,
                             .num_attention_heads = 4,
                             .num_key_value_heads = 2,
                             .head_dim = 8,
                             .max_position_embeddings = 32,
                             .rms_norm_eps = 1e-6f,
                             .rope_theta = 10000};
        rf_lora_config lc = {.rank = 4, .alpha = 12, .targets = 127, .base = RF_QT_F32};
        if (rf_llama_new(&c, &m) || rf_lora_new_llama(m, &lc, 1, &lo)) abort();
    }
    if (size < 2) return 0;
    size_t len = (size_t)data[0] | (size_t)data[1] << 8;
    if (len > size - 2) len = size - 2;
    rf_lora_load_peft_mem(lo, (const char *)data + 2, len, data + 2 + len, size - 2 - len);
    return 0;
}
