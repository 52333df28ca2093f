/* Safetensors files (the Hugging Face weight format): an 8-byte little-endian
 * header length, a JSON header mapping tensor names to dtype, shape and byte
 * range, then the raw data. Every field is validated before use: a corrupt or
 * truncated file gives RF_ERR_CORRUPT / RF_ERR_UNSUPPORTED with a message that
 * names the tensor, never an out-of-bounds read. */
#ifndef RF_TR_SAFETENSORS_H
#define RF_TR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define RF_ST_MAX_DIMS 8
/* Headers larger than this are refused (the format itself caps them at 100 MB). */
#define RF_ST_MAX_HEADER (100u << 20)

typedef enum rf_st_dtype {
    RF_ST_F32,
    RF_ST_F16,
    RF_ST_BF16,
    RF_ST_F64,
    RF_ST_I64,
    RF_ST_I32,
    RF_ST_I16,
    RF_ST_I8,
    RF_ST_U8,
    RF_ST_BOOL,
} rf_st_dtype;

typedef struct rf_st_tensor {
    char *name;
    rf_st_dtype dtype;
    int ndim;
    int64_t shape[RF_ST_MAX_DIMS];
    uint64_t numel;
    const uint8_t *data; /* points into the file's buffer */
    size_t nbytes;
} rf_st_tensor;

typedef struct rf_st_file {
    uint8_t *buf; /* the whole file, owned */
    size_t len;
    rf_st_tensor *tensors; /* in header order */
    size_t n;
} rf_st_file;

/* Parses a file already in memory; takes ownership of buf (freed by
 * rf_st_free, also on failure). */
int rf_st_parse(uint8_t *buf, size_t len, rf_st_file **out);
/* Reads and parses path. */
int rf_st_open(const char *path, rf_st_file **out);
void rf_st_free(rf_st_file *f);

const rf_st_tensor *rf_st_find(const rf_st_file *f, const char *name);
const char *rf_st_dtype_name(rf_st_dtype d);
/* Copies a floating tensor into dst[0..numel) as float, converting F16, BF16 and
 * F64; any other dtype is RF_ERR_UNSUPPORTED. */
int rf_st_to_f32(const rf_st_tensor *t, float *dst);

/* One tensor to write: F32 data, row-major. */
typedef struct rf_st_out {
    const char *name;
    int ndim;
    int64_t shape[RF_ST_MAX_DIMS];
    const float *data;
} rf_st_out;

/* Writes tensors as an F32 safetensors file, atomically. */
int rf_st_write(const char *path, const rf_st_out *t, size_t n);

#endif
