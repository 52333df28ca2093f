/* GGUF files (llama.cpp's model format, versions 2 and 3): a header, metadata
 * key/values, tensor infos, then the aligned tensor data.
 *
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv
 *   n_kv x (string key, u32 value type, value)      string = u64 length + bytes
 *   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
 *   padding to general.alignment (default 32), then the data area; each
 *   tensor's offset is relative to the data area and a multiple of the alignment.
 *
 * Everything is little-endian. Nothing read from the file is trusted: every
 * length and count is checked against the bytes that remain before use, every
 * size computation is overflow-checked, and any violation is RF_ERR_CORRUPT
 * (RF_ERR_UNSUPPORTED for a valid file that uses a version, value type or
 * tensor type this reader does not handle) with a message naming the key or
 * tensor -- never an out-of-bounds read.
 *
 * The parsed file points into the caller's bytes (rf_gguf_parse) or into a
 * read-only mapping of the file (rf_gguf_open); strings handed out are not
 * NUL-terminated unless stated (keys and tensor names are, as copies).
 *
 * Tensor shapes keep GGUF's order: ne[0] is the fastest-varying dimension
 * (the row length), so a PyTorch [out, in] weight has ne = {in, out}. */
#ifndef RF_GGUF_H
#define RF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RF_GGUF_MAX_DIMS          4
#define RF_GGUF_DEFAULT_ALIGNMENT 32
/* Longer keys or tensor names are refused (llama.cpp's names are < 64 bytes). */
#define RF_GGUF_MAX_NAME 4096

/* Metadata value types (GGUF's numbering). */
typedef enum rf_gguf_vtype {
    RF_GGUF_U8 = 0,
    RF_GGUF_I8 = 1,
    RF_GGUF_U16 = 2,
    RF_GGUF_I16 = 3,
    RF_GGUF_U32 = 4,
    RF_GGUF_I32 = 5,
    RF_GGUF_F32 = 6,
    RF_GGUF_BOOL = 7,
    RF_GGUF_STRING = 8,
    RF_GGUF_ARRAY = 9,
    RF_GGUF_U64 = 10,
    RF_GGUF_I64 = 11,
    RF_GGUF_F64 = 12,
} rf_gguf_vtype;

/* Tensor types (ggml's numbering). The reader knows the block layout of all
 * listed here; rf_gguf_dequant handles F32, F16, BF16, Q8_0, Q4_0 and Q4_1. */
typedef enum rf_ggml_type {
    RF_GGML_F32 = 0,
    RF_GGML_F16 = 1,
    RF_GGML_Q4_0 = 2,  /* 32 weights: fp16 d, 16 bytes; x = (q - 8) * d */
    RF_GGML_Q4_1 = 3,  /* 32 weights: fp16 d, fp16 m, 16 bytes; x = q * d + m */
    RF_GGML_Q5_0 = 6,  /* layout only */
    RF_GGML_Q5_1 = 7,  /* layout only */
    RF_GGML_Q8_0 = 8,  /* 32 weights: fp16 d, 32 int8; x = q * d */
    RF_GGML_Q8_1 = 9,  /* layout only */
    RF_GGML_Q2_K = 10, /* K-quants: layout only */
    RF_GGML_Q3_K = 11,
    RF_GGML_Q4_K = 12,
    RF_GGML_Q5_K = 13,
    RF_GGML_Q6_K = 14,
    RF_GGML_Q8_K = 15,
    RF_GGML_I8 = 24,
    RF_GGML_I16 = 25,
    RF_GGML_I32 = 26,
    RF_GGML_I64 = 27,
    RF_GGML_F64 = 28,
    RF_GGML_BF16 = 30,
} rf_ggml_type;

/* A metadata entry. For arrays, arr_type/n describe the elements; data points
 * at the first element in the file (strings: at the first length prefix).
 * Nested arrays are refused (RF_ERR_UNSUPPORTED) as llama.cpp never writes them. */
typedef struct rf_gguf_kv {
    char *key; /* NUL-terminated copy */
    rf_gguf_vtype type;
    rf_gguf_vtype arr_type; /* arrays only */
    uint64_t n;             /* arrays: element count; strings: byte length; else 1 */
    const uint8_t *data;    /* the value's bytes in the file (past the array header) */
    uint64_t nbytes;        /* size of the value's bytes */
    uint64_t *str_off;      /* string arrays: offset of each element's length prefix
                               from data (owned); NULL otherwise */
} rf_gguf_kv;

typedef struct rf_gguf_tensor {
    char *name; /* NUL-terminated copy */
    rf_ggml_type type;
    int n_dims;
    int64_t ne[RF_GGUF_MAX_DIMS]; /* unused dims are 1 */
    uint64_t numel;
    uint64_t offset; /* in the data area */
    const uint8_t *data;
    uint64_t nbytes;
} rf_gguf_tensor;

typedef struct rf_gguf_file {
    uint32_t version;
    uint32_t alignment;
    rf_gguf_kv *kv;
    uint64_t n_kv;
    rf_gguf_tensor *tensors; /* in file order */
    uint64_t n_tensors;
    uint64_t data_offset; /* start of the data area in the file */
    const uint8_t *base;
    size_t len;
    void *map; /* rf_gguf_open's mapping (NULL for rf_gguf_parse) */
} rf_gguf_file;

/* Parses len bytes at buf, which must outlive the returned file (not copied). */
int rf_gguf_parse(const uint8_t *buf, size_t len, rf_gguf_file **out);
/* Maps path read-only and parses it. */
int rf_gguf_open(const char *path, rf_gguf_file **out);
void rf_gguf_free(rf_gguf_file *f);

const rf_gguf_kv *rf_gguf_find_kv(const rf_gguf_file *f, const char *key);
const rf_gguf_tensor *rf_gguf_find_tensor(const rf_gguf_file *f, const char *name);

/* Typed getters: RF_ERR_NOT_FOUND if absent, RF_ERR_INVALID if the value has
 * another type. get_u64 accepts any unsigned or non-negative signed integer;
 * get_f32 an F32 or F64 value. A string is returned as (pointer, length). */
int rf_gguf_get_u64(const rf_gguf_file *f, const char *key, uint64_t *out);
int rf_gguf_get_f32(const rf_gguf_file *f, const char *key, float *out);
int rf_gguf_get_bool(const rf_gguf_file *f, const char *key, bool *out);
int rf_gguf_get_str(const rf_gguf_file *f, const char *key, const char **s, size_t *len);
/* Element i of a string array (i < kv->n checked: RF_ERR_RANGE). */
int rf_gguf_arr_str(const rf_gguf_kv *kv, uint64_t i, const char **s, size_t *len);
/* Element i of an integer array as int64 (unsigned 64-bit values above
 * INT64_MAX are RF_ERR_RANGE). */
int rf_gguf_arr_int(const rf_gguf_kv *kv, uint64_t i, int64_t *out);

const char *rf_ggml_type_name(rf_ggml_type t);
const char *rf_gguf_vtype_name(rf_gguf_vtype t);
/* Weights per block and bytes per block of a tensor type; 0 if unknown. */
uint32_t rf_ggml_block_size(rf_ggml_type t);
uint32_t rf_ggml_type_size(rf_ggml_type t);

/* IEEE half -> float, exact (subnormals, infinities and NaNs included). */
float rf_gguf_f16_to_f32(uint16_t h);

/* Dequantizes n weights of type t (n a multiple of the block size) from src
 * to dst, as ggml's dequantize_row_* does. Types other than F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1 are RF_ERR_UNSUPPORTED. */
int rf_gguf_dequant_row(rf_ggml_type t, const void *src, float *dst, uint64_t n);
/* The whole tensor into dst[0..numel). */
int rf_gguf_dequant(const rf_gguf_tensor *t, float *dst);

#endif
