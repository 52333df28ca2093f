/* GGUF reader and ggml block dequantization. Parsing walks a cursor over the
 * bytes; every read goes through take(), which checks the bytes that remain,
 * so no length from the file is used before it has been bounded. */
#include "common/gguf.h"

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

static const struct {
    rf_ggml_type type;
    const char *name;
    uint32_t block, size;
} ggml_types[] = {
    {RF_GGML_F32, "F32", 1, 4},       {RF_GGML_F16, "F16", 1, 2},
    {RF_GGML_Q4_0, "Q4_0", 32, 18},   {RF_GGML_Q4_1, "Q4_1", 32, 20},
    {RF_GGML_Q5_0, "Q5_0", 32, 22},   {RF_GGML_Q5_1, "Q5_1", 32, 24},
    {RF_GGML_Q8_0, "Q8_0", 32, 34},   {RF_GGML_Q8_1, "Q8_1", 32, 36},
    {RF_GGML_Q2_K, "Q2_K", 256, 84},  {RF_GGML_Q3_K, "Q3_K", 256, 110},
    {RF_GGML_Q4_K, "Q4_K", 256, 144}, {RF_GGML_Q5_K, "Q5_K", 256, 176},
    {RF_GGML_Q6_K, "Q6_K", 256, 210}, {RF_GGML_Q8_K, "Q8_K", 256, 292},
    {RF_GGML_I8, "I8", 1, 1},         {RF_GGML_I16, "I16", 1, 2},
    {RF_GGML_I32, "I32", 1, 4},       {RF_GGML_I64, "I64", 1, 8},
    {RF_GGML_F64, "F64", 1, 8},       {RF_GGML_BF16, "BF16", 1, 2},
};

static int type_index(uint32_t t) {
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if ((uint32_t)ggml_types[i].type == t) return (int)i;
    return -1;
}

const char *rf_ggml_type_name(rf_ggml_type t) {
    int i = type_index((uint32_t)t);
    return i < 0 ? "?" : ggml_types[i].name;
}
uint32_t rf_ggml_block_size(rf_ggml_type t) {
    int i = type_index((uint32_t)t);
    return i < 0 ? 0 : ggml_types[i].block;
}
uint32_t rf_ggml_type_size(rf_ggml_type t) {
    int i = type_index((uint32_t)t);
    return i < 0 ? 0 : ggml_types[i].size;
}

static const char *const vtype_names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                          "bool", "string", "array", "u64", "i64", "f64"};
const char *rf_gguf_vtype_name(rf_gguf_vtype t) {
    return (unsigned)t < sizeof vtype_names / sizeof vtype_names[0] ? vtype_names[t] : "?";
}

/* Byte size of a scalar value type; 0 for string, array and unknown types. */
static uint32_t scalar_size(uint32_t t) {
    switch (t) {
    case RF_GGUF_U8:
    case RF_GGUF_I8:
    case RF_GGUF_BOOL:
        return 1;
    case RF_GGUF_U16:
    case RF_GGUF_I16:
        return 2;
    case RF_GGUF_U32:
    case RF_GGUF_I32:
    case RF_GGUF_F32:
        return 4;
    case RF_GGUF_U64:
    case RF_GGUF_I64:
    case RF_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

static uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) {
    return rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

typedef struct cursor {
    const uint8_t *p;
    size_t pos, len;
} cursor;

/* Consumes n bytes; NULL if fewer remain. */
static const uint8_t *take(cursor *c, uint64_t n) {
    if (n > c->len - c->pos) return NULL;
    const uint8_t *q = c->p + c->pos;
    c->pos += (size_t)n;
    return q;
}

static int get_u32(cursor *c, uint32_t *v, const char *what) {
    const uint8_t *q = take(c, 4);
    if (!q) return rf_fail(RF_ERR_CORRUPT, "gguf: truncated at byte %zu reading %s", c->pos, what);
    *v = rd32(q);
    return 0;
}
static int get_u64(cursor *c, uint64_t *v, const char *what) {
    const uint8_t *q = take(c, 8);
    if (!q) return rf_fail(RF_ERR_CORRUPT, "gguf: truncated at byte %zu reading %s", c->pos, what);
    *v = rd64(q);
    return 0;
}

/* A string: u64 length + bytes. */
static int get_str(cursor *c, const uint8_t **s, uint64_t *n, const char *what) {
    int rc = get_u64(c, n, what);
    if (rc) return rc;
    if (!(*s = take(c, *n)))
        return rf_fail(RF_ERR_CORRUPT, "gguf: %s at byte %zu: length %llu runs past the end", what,
                       c->pos, (unsigned long long)*n);
    return 0;
}

/* A key or tensor name: non-empty, bounded, no NUL; returns a malloc'd copy. */
static int get_name(cursor *c, char **out, const char *what) {
    const uint8_t *s;
    uint64_t n;
    int rc = get_str(c, &s, &n, what);
    if (rc) return rc;
    if (n == 0 || n > RF_GGUF_MAX_NAME || memchr(s, 0, (size_t)n))
        return rf_fail(RF_ERR_CORRUPT, "gguf: %s at byte %zu: empty, longer than %d or has a NUL",
                       what, c->pos, RF_GGUF_MAX_NAME);
    if (!(*out = malloc((size_t)n + 1))) return RF_ERR_NOMEM;
    memcpy(*out, s, (size_t)n);
    (*out)[n] = 0;
    return 0;
}

void rf_gguf_free(rf_gguf_file *f) {
    if (!f) return;
    for (uint64_t i = 0; f->kv && i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].str_off);
    }
    for (uint64_t i = 0; f->tensors && i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    if (f->map) munmap(f->map, f->len);
    free(f);
}

/* The value of kv (type already read). */
static int parse_value(cursor *c, rf_gguf_kv *kv) {
    int rc;
    uint32_t es = scalar_size(kv->type);
    if (es) {
        kv->n = 1;
        kv->nbytes = es;
        if (!(kv->data = take(c, es)))
            return rf_fail(RF_ERR_CORRUPT, "gguf: key '%s': truncated value", kv->key);
        return 0;
    }
    if (kv->type == RF_GGUF_STRING) {
        if ((rc = get_str(c, &kv->data, &kv->n, kv->key))) return rc;
        kv->nbytes = kv->n;
        return 0;
    }
    if (kv->type != RF_GGUF_ARRAY)
        return rf_fail(RF_ERR_CORRUPT, "gguf: key '%s': unknown value type %u", kv->key,
                       (unsigned)kv->type);
    uint32_t at;
    if ((rc = get_u32(c, &at, kv->key)) || (rc = get_u64(c, &kv->n, kv->key))) return rc;
    kv->arr_type = (rf_gguf_vtype)at;
    if (at == RF_GGUF_ARRAY)
        return rf_fail(RF_ERR_UNSUPPORTED, "gguf: key '%s': nested arrays are not supported",
                       kv->key);
    size_t start = c->pos;
    kv->data = c->p + start;
    if ((es = scalar_size(at))) {
        if (kv->n > (c->len - c->pos) / es)
            return rf_fail(RF_ERR_CORRUPT, "gguf: key '%s': array of %llu %s runs past the end",
                           kv->key, (unsigned long long)kv->n, rf_gguf_vtype_name(kv->arr_type));
        kv->nbytes = kv->n * es;
        c->pos += (size_t)kv->nbytes;
        return 0;
    }
    if (at != RF_GGUF_STRING)
        return rf_fail(RF_ERR_CORRUPT, "gguf: key '%s': unknown array element type %u", kv->key,
                       (unsigned)at);
    /* Each string needs at least its 8-byte length, which bounds the count
     * before anything is allocated. */
    if (kv->n > (c->len - c->pos) / 8)
        return rf_fail(RF_ERR_CORRUPT, "gguf: key '%s': array of %llu strings runs past the end",
                       kv->key, (unsigned long long)kv->n);
    if (!(kv->str_off = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->str_off)))
        return RF_ERR_NOMEM;
    for (uint64_t i = 0; i < kv->n; i++) {
        const uint8_t *s;
        uint64_t n;
        kv->str_off[i] = c->pos - start;
        if ((rc = get_str(c, &s, &n, kv->key))) return rc;
    }
    kv->nbytes = c->pos - start;
    return 0;
}

static int parse_tensor_info(cursor *c, rf_gguf_tensor *t) {
    int rc;
    uint32_t nd, ty;
    if ((rc = get_name(c, &t->name, "tensor name"))) return rc;
    if ((rc = get_u32(c, &nd, t->name))) return rc;
    if (nd == 0 || nd > RF_GGUF_MAX_DIMS)
        return rf_fail(RF_ERR_CORRUPT, "gguf: tensor '%s': %u dimensions (1..%d allowed)", t->name,
                       nd, RF_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t numel = 1;
    for (int d = 0; d < RF_GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        if ((uint32_t)d < nd && (rc = get_u64(c, &v, t->name))) return rc;
        if (v > INT64_MAX || (v && numel > INT64_MAX / v))
            return rf_fail(RF_ERR_CORRUPT, "gguf: tensor '%s': dimension %d (%llu) overflows",
                           t->name, d, (unsigned long long)v);
        t->ne[d] = (int64_t)v;
        numel *= v;
    }
    t->numel = numel;
    if ((rc = get_u32(c, &ty, t->name)) || (rc = get_u64(c, &t->offset, t->name))) return rc;
    int ti = type_index(ty);
    if (ti < 0)
        return rf_fail(RF_ERR_UNSUPPORTED, "gguf: tensor '%s': unknown ggml type %u", t->name, ty);
    t->type = (rf_ggml_type)ty;
    uint32_t bs = ggml_types[ti].block, ts = ggml_types[ti].size;
    if (t->ne[0] % bs)
        return rf_fail(RF_ERR_CORRUPT,
                       "gguf: tensor '%s': row length %lld is not a multiple of the %s block (%u)",
                       t->name, (long long)t->ne[0], ggml_types[ti].name, bs);
    if (numel / bs > UINT64_MAX / ts)
        return rf_fail(RF_ERR_CORRUPT, "gguf: tensor '%s': byte size overflows", t->name);
    t->nbytes = numel / bs * ts;
    return 0;
}

int rf_gguf_parse(const uint8_t *buf, size_t len, rf_gguf_file **out) {
    *out = NULL;
    rf_gguf_file *f = calloc(1, sizeof *f);
    if (!f) return RF_ERR_NOMEM;
    f->base = buf;
    f->len = len;
    cursor c = {buf, 0, len};
    int rc = 0;
    const uint8_t *magic = take(&c, 4);
    if (!magic || memcmp(magic, "GGUF", 4) != 0) {
        rc = rf_fail(RF_ERR_CORRUPT, "gguf: bad magic (not a GGUF file)");
        goto fail;
    }
    if ((rc = get_u32(&c, &f->version, "version"))) goto fail;
    if (f->version != 2 && f->version != 3) {
        rc = rf_fail(RF_ERR_UNSUPPORTED, "gguf: version %u (2 and 3 are supported%s)", f->version,
                     (f->version & 0xffff) == 0 ? "; a big-endian file?" : "");
        goto fail;
    }
    if ((rc = get_u64(&c, &f->n_tensors, "tensor count")) ||
        (rc = get_u64(&c, &f->n_kv, "metadata count")))
        goto fail;
    /* A key/value takes at least 8 (key length) + 1 (key) + 4 (type) + 1 bytes
     * and a tensor info 8 + 1 + 4 + 8 + 4 + 8: the counts cannot exceed what
     * remains, so the allocations below are bounded by the file size. */
    size_t rem = len - c.pos;
    if (f->n_kv > rem / 14 || f->n_tensors > rem / 33) {
        rc = rf_fail(RF_ERR_CORRUPT, "gguf: %llu keys and %llu tensors cannot fit in %zu bytes",
                     (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors, len);
        goto fail;
    }
    uint64_t n_kv = f->n_kv, n_t = f->n_tensors;
    f->n_kv = f->n_tensors = 0; /* count what is filled, for rf_gguf_free */
    if (!(f->kv = calloc(n_kv ? n_kv : 1, sizeof *f->kv)) ||
        !(f->tensors = calloc(n_t ? n_t : 1, sizeof *f->tensors))) {
        rc = RF_ERR_NOMEM;
        goto fail;
    }
    f->alignment = RF_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        rf_gguf_kv *kv = &f->kv[f->n_kv++];
        uint32_t ty;
        if ((rc = get_name(&c, &kv->key, "key")) || (rc = get_u32(&c, &ty, kv->key))) goto fail;
        kv->type = (rf_gguf_vtype)ty;
        if ((rc = parse_value(&c, kv))) goto fail;
        for (uint64_t j = 0; j + 1 < f->n_kv; j++)
            if (strcmp(f->kv[j].key, kv->key) == 0) {
                rc = rf_fail(RF_ERR_CORRUPT, "gguf: duplicate key '%s'", kv->key);
                goto fail;
            }
        if (strcmp(kv->key, "general.alignment") == 0) {
            uint32_t a = kv->type == RF_GGUF_U32 ? rd32(kv->data) : 0;
            if (a == 0 || (a & (a - 1))) {
                rc = rf_fail(RF_ERR_CORRUPT,
                             "gguf: general.alignment must be a u32 power of two (got %s %u)",
                             rf_gguf_vtype_name(kv->type), a);
                goto fail;
            }
            f->alignment = a;
        }
    }
    for (uint64_t i = 0; i < n_t; i++) {
        rf_gguf_tensor *t = &f->tensors[f->n_tensors++];
        if ((rc = parse_tensor_info(&c, t))) goto fail;
        for (uint64_t j = 0; j + 1 < f->n_tensors; j++)
            if (strcmp(f->tensors[j].name, t->name) == 0) {
                rc = rf_fail(RF_ERR_CORRUPT, "gguf: duplicate tensor '%s'", t->name);
                goto fail;
            }
    }
    uint64_t pad = (f->alignment - c.pos % f->alignment) % f->alignment;
    f->data_offset = c.pos + pad;
    uint64_t data_len = f->data_offset <= len ? len - f->data_offset : 0;
    if (f->data_offset > len && n_t) {
        rc = rf_fail(RF_ERR_CORRUPT, "gguf: file ends before its data area (byte %llu)",
                     (unsigned long long)f->data_offset);
        goto fail;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        rf_gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment) {
            rc = rf_fail(RF_ERR_CORRUPT, "gguf: tensor '%s': offset %llu is not %u-aligned",
                         t->name, (unsigned long long)t->offset, f->alignment);
            goto fail;
        }
        if (t->offset > data_len || t->nbytes > data_len - t->offset) {
            rc = rf_fail(RF_ERR_CORRUPT,
                         "gguf: tensor '%s': bytes [%llu, +%llu) run past the data area (%llu)",
                         t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                         (unsigned long long)data_len);
            goto fail;
        }
        t->data = buf + f->data_offset + t->offset;
    }
    *out = f;
    return 0;
fail:
    rf_gguf_free(f);
    return rc;
}

int rf_gguf_open(const char *path, rf_gguf_file **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return rf_fail(RF_ERR_IO, "gguf: cannot open %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return rf_fail(RF_ERR_IO, "gguf: %s is not a non-empty regular file", path);
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return rf_fail(RF_ERR_IO, "gguf: cannot map %s", path);
    rf_gguf_file *f;
    int rc = rf_gguf_parse(map, len, &f);
    if (rc) {
        munmap(map, len);
        return rf_fail_ctx(rc, "%s", path);
    }
    f->map = map;
    *out = f;
    return 0;
}

const rf_gguf_kv *rf_gguf_find_kv(const rf_gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

const rf_gguf_tensor *rf_gguf_find_tensor(const rf_gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

/* An integer scalar at p of type t; false if t is not an integer type. */
static bool int_value(uint32_t t, const uint8_t *p, int64_t *v, bool *neg_or_big) {
    *neg_or_big = false;
    switch (t) {
    case RF_GGUF_U8:
        *v = p[0];
        return true;
    case RF_GGUF_I8:
        *v = (int8_t)p[0];
        break;
    case RF_GGUF_U16:
        *v = rd16(p);
        return true;
    case RF_GGUF_I16:
        *v = (int16_t)rd16(p);
        break;
    case RF_GGUF_U32:
        *v = rd32(p);
        return true;
    case RF_GGUF_I32:
        *v = (int32_t)rd32(p);
        break;
    case RF_GGUF_U64: {
        uint64_t u = rd64(p);
        *neg_or_big = u > INT64_MAX;
        *v = (int64_t)(u & INT64_MAX);
        return true;
    }
    case RF_GGUF_I64:
        *v = (int64_t)rd64(p);
        break;
    default:
        return false;
    }
    *neg_or_big = *v < 0;
    return true;
}

static int lookup(const rf_gguf_file *f, const char *key, const rf_gguf_kv **kv) {
    if (!(*kv = rf_gguf_find_kv(f, key)))
        return rf_fail(RF_ERR_NOT_FOUND, "gguf: no key '%s'", key);
    return 0;
}

int rf_gguf_get_u64(const rf_gguf_file *f, const char *key, uint64_t *out) {
    const rf_gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    if (rc) return rc;
    int64_t v;
    bool bad;
    if (!int_value(kv->type, kv->data, &v, &bad))
        return rf_fail(RF_ERR_INVALID, "gguf: key '%s' is a %s, not an integer", key,
                       rf_gguf_vtype_name(kv->type));
    if (bad && kv->type != RF_GGUF_U64)
        return rf_fail(RF_ERR_INVALID, "gguf: key '%s' is negative", key);
    *out = kv->type == RF_GGUF_U64 ? rd64(kv->data) : (uint64_t)v;
    return 0;
}

int rf_gguf_get_f32(const rf_gguf_file *f, const char *key, float *out) {
    const rf_gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    if (rc) return rc;
    if (kv->type == RF_GGUF_F32) {
        uint32_t u = rd32(kv->data);
        memcpy(out, &u, 4);
    } else if (kv->type == RF_GGUF_F64) {
        uint64_t u = rd64(kv->data);
        double d;
        memcpy(&d, &u, 8);
        *out = (float)d;
    } else {
        return rf_fail(RF_ERR_INVALID, "gguf: key '%s' is a %s, not a float", key,
                       rf_gguf_vtype_name(kv->type));
    }
    return 0;
}

int rf_gguf_get_bool(const rf_gguf_file *f, const char *key, bool *out) {
    const rf_gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    if (rc) return rc;
    if (kv->type != RF_GGUF_BOOL)
        return rf_fail(RF_ERR_INVALID, "gguf: key '%s' is a %s, not a bool", key,
                       rf_gguf_vtype_name(kv->type));
    *out = kv->data[0] != 0;
    return 0;
}

int rf_gguf_get_str(const rf_gguf_file *f, const char *key, const char **s, size_t *len) {
    const rf_gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    if (rc) return rc;
    if (kv->type != RF_GGUF_STRING)
        return rf_fail(RF_ERR_INVALID, "gguf: key '%s' is a %s, not a string", key,
                       rf_gguf_vtype_name(kv->type));
    *s = (const char *)kv->data;
    *len = (size_t)kv->n;
    return 0;
}

int rf_gguf_arr_str(const rf_gguf_kv *kv, uint64_t i, const char **s, size_t *len) {
    if (kv->type != RF_GGUF_ARRAY || kv->arr_type != RF_GGUF_STRING)
        return rf_fail(RF_ERR_INVALID, "gguf: key '%s' is not a string array", kv->key);
    if (i >= kv->n)
        return rf_fail(RF_ERR_RANGE, "gguf: key '%s': index %llu of %llu", kv->key,
                       (unsigned long long)i, (unsigned long long)kv->n);
    const uint8_t *p = kv->data + kv->str_off[i]; /* validated when parsed */
    *len = (size_t)rd64(p);
    *s = (const char *)p + 8;
    return 0;
}

int rf_gguf_arr_int(const rf_gguf_kv *kv, uint64_t i, int64_t *out) {
    uint32_t es = scalar_size(kv->arr_type);
    int64_t v;
    bool bad;
    if (kv->type != RF_GGUF_ARRAY || !es || kv->arr_type == RF_GGUF_F32 ||
        kv->arr_type == RF_GGUF_F64 || kv->arr_type == RF_GGUF_BOOL)
        return rf_fail(RF_ERR_INVALID, "gguf: key '%s' is not an integer array", kv->key);
    if (i >= kv->n)
        return rf_fail(RF_ERR_RANGE, "gguf: key '%s': index %llu of %llu", kv->key,
                       (unsigned long long)i, (unsigned long long)kv->n);
    int_value(kv->arr_type, kv->data + i * es, &v, &bad);
    if (bad && kv->arr_type == RF_GGUF_U64)
        return rf_fail(RF_ERR_RANGE, "gguf: key '%s': element %llu exceeds INT64_MAX", kv->key,
                       (unsigned long long)i);
    *out = v;
    return 0;
}

float rf_gguf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | man << 13; /* inf / NaN, payload kept */
    } else if (exp) {
        u = sign | (exp + 112) << 23 | man << 13;
    } else if (!man) {
        u = sign;
    } else { /* subnormal: man * 2^-24, exact in float */
        float v = ldexpf((float)man, -24);
        memcpy(&u, &v, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ggml's dequantize_row_q4_0/q4_1/q8_0: low nibbles are weights 0..15 of a
 * block, high nibbles 16..31. The products are computed in float as ggml does
 * (q * d, then + m for Q4_1), so results match its reference bit for bit. */
int rf_gguf_dequant_row(rf_ggml_type t, const void *src, float *dst, uint64_t n) {
    const uint8_t *p = src;
    uint32_t bs = rf_ggml_block_size(t);
    if (!bs) return rf_fail(RF_ERR_UNSUPPORTED, "gguf: unknown tensor type %u", (unsigned)t);
    if (n % bs)
        return rf_fail(RF_ERR_INVALID, "gguf: %llu weights is not a multiple of the %s block",
                       (unsigned long long)n, rf_ggml_type_name(t));
    switch (t) {
    case RF_GGML_F32:
        for (uint64_t i = 0; i < n; i++) {
            uint32_t u = rd32(p + 4 * i);
            memcpy(&dst[i], &u, 4);
        }
        return 0;
    case RF_GGML_F16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = rf_gguf_f16_to_f32(rd16(p + 2 * i));
        return 0;
    case RF_GGML_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)rd16(p + 2 * i) << 16;
            memcpy(&dst[i], &u, 4);
        }
        return 0;
    case RF_GGML_Q8_0:
        for (uint64_t b = 0; b < n / 32; b++, p += 34, dst += 32) {
            float d = rf_gguf_f16_to_f32(rd16(p));
            for (int j = 0; j < 32; j++)
                dst[j] = (float)(int8_t)p[2 + j] * d;
        }
        return 0;
    case RF_GGML_Q4_0:
        for (uint64_t b = 0; b < n / 32; b++, p += 18, dst += 32) {
            float d = rf_gguf_f16_to_f32(rd16(p));
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)((p[2 + j] & 0x0f) - 8) * d;
                dst[j + 16] = (float)((p[2 + j] >> 4) - 8) * d;
            }
        }
        return 0;
    case RF_GGML_Q4_1:
        for (uint64_t b = 0; b < n / 32; b++, p += 20, dst += 32) {
            float d = rf_gguf_f16_to_f32(rd16(p)), m = rf_gguf_f16_to_f32(rd16(p + 2));
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)(p[4 + j] & 0x0f) * d + m;
                dst[j + 16] = (float)(p[4 + j] >> 4) * d + m;
            }
        }
        return 0;
    default:
        return rf_fail(RF_ERR_UNSUPPORTED, "gguf: dequantizing %s is not supported",
                       rf_ggml_type_name(t));
    }
}

int rf_gguf_dequant(const rf_gguf_tensor *t, float *dst) {
    int rc = rf_gguf_dequant_row(t->type, t->data, dst, t->numel);
    return rc ? rf_fail_ctx(rc, "tensor '%s'", t->name) : 0;
}
