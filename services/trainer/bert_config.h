/* The subset of a Hugging Face BertConfig (config.json) that the trainer uses. */
#ifndef RF_TR_BERT_CONFIG_H
#define RF_TR_BERT_CONFIG_H

#include "common/buf.h"

#define RF_BERT_MAX_LABELS 4096

typedef struct rf_bert_config {
    int vocab_size;
    int hidden_size;
    int num_layers;
    int num_heads;
    int intermediate_size;
    int max_position;
    int type_vocab_size;
    int num_labels;
    int pad_token_id;
    float layer_norm_eps;
    float initializer_range;
    float hidden_dropout;
    float attention_dropout;
    float classifier_dropout; /* hidden_dropout when config has null */
} rf_bert_config;

/* Parses config.json text. Unknown activations, non-BERT model types, relative
 * position embeddings, bad or missing sizes give RF_ERR_INVALID/UNSUPPORTED
 * naming the key. num_labels comes from "num_labels" or the size of "id2label"
 * (default 2); default_labels > 0 overrides it (a new classification head). */
int rf_bert_config_parse(const char *text, size_t len, int default_labels, rf_bert_config *cfg);
int rf_bert_config_load(const char *path, int default_labels, rf_bert_config *cfg);
/* Writes config.json for a BertForSequenceClassification export. */
int rf_bert_config_to_json(const rf_bert_config *cfg, rf_buf *out);

#endif
