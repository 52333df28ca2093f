/* Safetensors reader and writer. The reader copies tensor names out of the JSON
 * arena, so the header document is freed as soon as parsing ends. */
#include "trainer/safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"

static const struct {
    const char *name;
    rf_st_dtype dtype;
    unsigned size;
} dtypes[] = {
    {"F32", RF_ST_F32, 4}, {"F16", RF_ST_F16, 2},   {"BF16", RF_ST_BF16, 2}, {"F64", RF_ST_F64, 8},
    {"I64", RF_ST_I64, 8}, {"I32", RF_ST_I32, 4},   {"I16", RF_ST_I16, 2},   {"I8", RF_ST_I8, 1},
    {"U8", RF_ST_U8, 1},   {"BOOL", RF_ST_BOOL, 1},
};

const char *rf_st_dtype_name(rf_st_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dtype == d) return dtypes[i].name;
    return "?";
}

void rf_st_free(rf_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->buf);
    free(f);
}

/* Validates one header entry and fills t; data_len is the size of the data area. */
static int parse_entry(const rf_json_member *m, const uint8_t *data, uint64_t data_len,
                       rf_st_tensor *t, uint64_t range[2]) {
    const rf_json *v = &m->value;
    if (strlen(m->key) != m->keylen || m->keylen == 0)
        return rf_fail(RF_ERR_CORRUPT, "safetensors: empty tensor name or name with NUL");
    if (v->type != RF_JSON_OBJECT)
        return rf_fail(RF_ERR_CORRUPT, "safetensors: tensor '%s': entry is not an object", m->key);
    const rf_json *dt = rf_json_get(v, "dtype"), *shape = rf_json_get(v, "shape"),
                  *offs = rf_json_get(v, "data_offsets");
    if (!rf_json_is_str(dt) || !shape || shape->type != RF_JSON_ARRAY || !offs ||
        offs->type != RF_JSON_ARRAY || offs->len != 2)
        return rf_fail(RF_ERR_CORRUPT,
                       "safetensors: tensor '%s': needs dtype, shape and data_offsets[2]", m->key);
    unsigned esize = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dt->u.str, dtypes[i].name) == 0) {
            t->dtype = dtypes[i].dtype;
            esize = dtypes[i].size;
        }
    if (!esize)
        return rf_fail(RF_ERR_UNSUPPORTED, "safetensors: tensor '%s': unsupported dtype '%s'",
                       m->key, dt->u.str);
    if (shape->len > RF_ST_MAX_DIMS)
        return rf_fail(RF_ERR_UNSUPPORTED, "safetensors: tensor '%s': %zu dimensions (max %d)",
                       m->key, shape->len, RF_ST_MAX_DIMS);
    t->ndim = (int)shape->len;
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        int64_t s;
        if (rf_json_int64(&shape->u.items[d], &s) != 0 || s < 0 || s > (int64_t)1 << 40)
            return rf_fail(RF_ERR_CORRUPT, "safetensors: tensor '%s': bad shape[%d]", m->key, d);
        t->shape[d] = s;
        if (s && numel > UINT64_MAX / (uint64_t)s)
            return rf_fail(RF_ERR_CORRUPT, "safetensors: tensor '%s': shape overflows", m->key);
        numel *= (uint64_t)s;
    }
    int64_t b, e;
    if (rf_json_int64(&offs->u.items[0], &b) != 0 || rf_json_int64(&offs->u.items[1], &e) != 0 ||
        b < 0 || e < b || (uint64_t)e > data_len)
        return rf_fail(RF_ERR_CORRUPT,
                       "safetensors: tensor '%s': data_offsets outside the %llu data bytes", m->key,
                       (unsigned long long)data_len);
    if (numel > UINT64_MAX / esize || numel * esize != (uint64_t)(e - b))
        return rf_fail(RF_ERR_CORRUPT,
                       "safetensors: tensor '%s': %lld bytes do not match shape x %s", m->key,
                       (long long)(e - b), dt->u.str);
    t->numel = numel;
    t->data = data + b;
    t->nbytes = (size_t)(e - b);
    range[0] = (uint64_t)b;
    range[1] = (uint64_t)e;
    t->name = strdup(m->key);
    return t->name ? RF_OK : RF_ERR_NOMEM;
}

static int cmp_range(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] > y[1]) - (x[1] < y[1]);
}

int rf_st_parse(uint8_t *buf, size_t len, rf_st_file **out) {
    *out = NULL;
    rf_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        free(buf);
        return RF_ERR_NOMEM;
    }
    f->buf = buf;
    f->len = len;
    rf_json_doc *doc = NULL;
    uint64_t *ranges = NULL;
    int rc;
    if (len < 8) {
        rc = rf_fail(RF_ERR_CORRUPT, "safetensors: file of %zu bytes is truncated", len);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > RF_ST_MAX_HEADER || hlen > len - 8) {
        rc = rf_fail(RF_ERR_CORRUPT, "safetensors: header of %llu bytes exceeds the file (%zu)",
                     (unsigned long long)hlen, len);
        goto fail;
    }
    const rf_json *root;
    if (!(doc = rf_json_doc_new())) {
        rc = RF_ERR_NOMEM;
        goto fail;
    }
    if ((rc = rf_json_parse(doc, (const char *)buf + 8, hlen, &root)) != 0) {
        rc = rf_fail_ctx(RF_ERR_CORRUPT, "safetensors: bad header JSON");
        goto fail;
    }
    if (root->type != RF_JSON_OBJECT) {
        rc = rf_fail(RF_ERR_CORRUPT, "safetensors: header is not a JSON object");
        goto fail;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    f->tensors = calloc(root->len ? root->len : 1, sizeof *f->tensors);
    ranges = calloc(root->len ? root->len : 1, 2 * sizeof *ranges);
    if (!f->tensors || !ranges) {
        rc = RF_ERR_NOMEM;
        goto fail;
    }
    for (size_t i = 0; i < root->len; i++) {
        const rf_json_member *m = &root->u.members[i];
        if (strcmp(m->key, "__metadata__") == 0) continue;
        if (rf_st_find(f, m->key)) {
            rc = rf_fail(RF_ERR_CORRUPT, "safetensors: tensor '%s' appears twice", m->key);
            goto fail;
        }
        if ((rc = parse_entry(m, data, data_len, &f->tensors[f->n], &ranges[2 * f->n])) != 0)
            goto fail;
        f->n++;
    }
    /* Byte ranges must not overlap (empty tensors may share an offset). */
    qsort(ranges, f->n, 2 * sizeof *ranges, cmp_range);
    for (size_t i = 1; i < f->n; i++)
        if (ranges[2 * i] < ranges[2 * i - 1] && ranges[2 * i] != ranges[2 * i + 1]) {
            rc = rf_fail(RF_ERR_CORRUPT, "safetensors: tensor byte ranges overlap at offset %llu",
                         (unsigned long long)ranges[2 * i]);
            goto fail;
        }
    free(ranges);
    rf_json_doc_free(doc);
    *out = f;
    return RF_OK;
fail:
    free(ranges);
    rf_json_doc_free(doc);
    rf_st_free(f);
    return rc;
}

int rf_st_open(const char *path, rf_st_file **out) {
    char *buf;
    size_t len;
    *out = NULL;
    int rc = rf_read_file(path, (size_t)16 << 30, &buf, &len);
    if (rc) return rf_fail_ctx(rc, "safetensors: cannot read %s", path);
    rc = rf_st_parse((uint8_t *)buf, len, out);
    if (rc) return rf_fail_ctx(rc, "%s", path);
    return RF_OK;
}

const rf_st_tensor *rf_st_find(const rf_st_file *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 1024)) {
                man <<= 1;
                exp--;
            }
            bits = sign | exp << 23 | (man & 1023) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int rf_st_to_f32(const rf_st_tensor *t, float *dst) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case RF_ST_F32:
        memcpy(dst, p, t->numel * 4);
        return RF_OK;
    case RF_ST_F16:
    case RF_ST_BF16:
        for (uint64_t i = 0; i < t->numel; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            if (t->dtype == RF_ST_F16) {
                dst[i] = half_to_float(h);
            } else {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&dst[i], &bits, 4);
            }
        }
        return RF_OK;
    case RF_ST_F64:
        for (uint64_t i = 0; i < t->numel; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        return RF_OK;
    default:
        return rf_fail(RF_ERR_UNSUPPORTED, "safetensors: tensor '%s' has dtype %s, not a float",
                       t->name, rf_st_dtype_name(t->dtype));
    }
}

int rf_st_write(const char *path, const rf_st_out *t, size_t n) {
    rf_buf hdr = RF_BUF_INIT;
    uint64_t off = 0;
    int rc = rf_buf_puts(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++)
            numel *= (uint64_t)t[i].shape[d];
        rc = rf_buf_putc(&hdr, ',');
        if (!rc) rc = rf_buf_append_json_str(&hdr, t[i].name, strlen(t[i].name));
        if (!rc) rc = rf_buf_puts(&hdr, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t[i].ndim && !rc; d++)
            rc = rf_buf_printf(&hdr, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        if (!rc)
            rc = rf_buf_printf(&hdr, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                               (unsigned long long)(off + 4 * numel));
        off += 4 * numel;
    }
    if (!rc) rc = rf_buf_putc(&hdr, '}');
    while (!rc && hdr.len % 8)
        rc = rf_buf_putc(&hdr, ' '); /* data stays 8-byte aligned */
    uint8_t *file = NULL;
    if (!rc && !(file = malloc(8 + hdr.len + off))) rc = RF_ERR_NOMEM;
    if (!rc) {
        for (int i = 0; i < 8; i++)
            file[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
        memcpy(file + 8, hdr.data, hdr.len);
        uint8_t *p = file + 8 + hdr.len;
        for (size_t i = 0; i < n; i++) {
            uint64_t numel = 1;
            for (int d = 0; d < t[i].ndim; d++)
                numel *= (uint64_t)t[i].shape[d];
            memcpy(p, t[i].data, 4 * numel);
            p += 4 * numel;
        }
        rc = rf_write_file_atomic(path, file, 8 + hdr.len + off);
        if (rc) rc = rf_fail_ctx(rc, "safetensors: cannot write %s", path);
    }
    free(file);
    rf_buf_free(&hdr);
    return rc;
}
