/* GGUF reader: the gguf-py-written fixture read back exactly (every metadata
 * type; F32/F16/BF16/Q8_0/Q4_0/Q4_1 dequantized bit-equal to gguf-py's
 * reference), malformed files rejected with clear error codes, and, when
 * scripts/fetch-smollm2.sh has run, every SmolLM2-135M tensor checked against
 * the shapes its metadata implies and dequantized bit-equal to gguf-py (the
 * dequantizer transformers loads GGUF files with). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "../support/skip.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/sys.h"
#include "common/gguf.h"

static uint8_t *fixture;
static size_t fixture_len;

static char *path_in_root(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", root ? root : ".", rel);
    return p;
}

static void read_fixture(const char *rel, uint8_t **data, size_t *len) {
    char *p = path_in_root(rel), *d;
    if (rf_read_file(p, 1 << 20, &d, len)) fail_msg("%s: %s", p, rf_errmsg());
    *data = (uint8_t *)d;
    free(p);
}

static int setup(void **state) {
    read_fixture("tests/fixtures/gguf/types.gguf", &fixture, &fixture_len);
    return 0;
}
static int teardown(void **state) {
    free(fixture);
    return 0;
}

/* Parses a private, exactly sized copy (so ASan sees any overread). */
static int parse_copy(const uint8_t *b, size_t len) {
    uint8_t *c = malloc(len ? len : 1);
    memcpy(c, b, len);
    rf_gguf_file *f;
    int rc = rf_gguf_parse(c, len, &f);
    if (!rc) {
        /* a file that parses must also dequantize its known types */
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            float *x = malloc(f->tensors[i].numel * sizeof(float) + 1);
            int drc = rf_gguf_dequant(&f->tensors[i], x);
            assert_true(drc == 0 || drc == RF_ERR_UNSUPPORTED);
            free(x);
        }
        rf_gguf_free(f);
    }
    free(c);
    return rc;
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void test_fixture_values(void **state) {
    rf_gguf_file *f;
    assert_int_equal(rf_gguf_parse(fixture, fixture_len, &f), 0);
    assert_int_equal(f->version, 3);
    assert_int_equal(f->alignment, 64);
    assert_int_equal(f->n_kv, 16);
    assert_int_equal(f->n_tensors, 6);
    assert_int_equal(f->data_offset % 64, 0);

    uint64_t u;
    assert_int_equal(rf_gguf_get_u64(f, "t.u8", &u), 0), assert_int_equal(u, 200);
    assert_int_equal(rf_gguf_get_u64(f, "t.u16", &u), 0), assert_int_equal(u, 60000);
    assert_int_equal(rf_gguf_get_u64(f, "t.u32", &u), 0), assert_int_equal(u, 4000000000u);
    assert_int_equal(rf_gguf_get_u64(f, "t.u64", &u), 0);
    assert_true(u == 18000000000000000000ull);
    assert_int_equal(rf_gguf_get_u64(f, "t.i8", &u), RF_ERR_INVALID); /* negative */
    assert_int_equal(rf_gguf_get_u64(f, "t.str", &u), RF_ERR_INVALID);
    assert_int_equal(rf_gguf_get_u64(f, "no.such", &u), RF_ERR_NOT_FOUND);
    const rf_gguf_kv *kv = rf_gguf_find_kv(f, "t.i16");
    assert_non_null(kv);
    assert_int_equal(kv->type, RF_GGUF_I16);
    assert_int_equal((int16_t)(kv->data[0] | kv->data[1] << 8), -30000);
    kv = rf_gguf_find_kv(f, "t.i64");
    assert_int_equal(kv->type, RF_GGUF_I64);
    int64_t i64;
    memcpy(&i64, kv->data, 8);
    assert_true(i64 == -9000000000000000000ll);
    float x;
    assert_int_equal(rf_gguf_get_f32(f, "t.f32", &x), 0), assert_true(x == 0.15625f);
    assert_int_equal(rf_gguf_get_f32(f, "t.f64", &x), 0), assert_true(x == -2.5f);
    bool b = false;
    assert_int_equal(rf_gguf_get_bool(f, "t.bool", &b), 0), assert_true(b);
    const char *s;
    size_t n;
    assert_int_equal(rf_gguf_get_str(f, "t.str", &s, &n), 0);
    assert_int_equal(n, strlen("héllo, GGUF"));
    assert_memory_equal(s, "héllo, GGUF", n);
    assert_int_equal(rf_gguf_get_str(f, "general.architecture", &s, &n), 0);
    assert_int_equal(n, 4), assert_memory_equal(s, "test", 4);

    kv = rf_gguf_find_kv(f, "t.strs");
    assert_int_equal(kv->type, RF_GGUF_ARRAY);
    assert_int_equal(kv->arr_type, RF_GGUF_STRING);
    assert_int_equal(kv->n, 5);
    const char *want[] = {"", "a", "Ġthe", "<|im_start|>", "日本"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(rf_gguf_arr_str(kv, (uint64_t)i, &s, &n), 0);
        assert_int_equal(n, strlen(want[i]));
        assert_memory_equal(s, want[i], n);
    }
    assert_int_equal(rf_gguf_arr_str(kv, 5, &s, &n), RF_ERR_RANGE);
    assert_int_equal(rf_gguf_arr_int(kv, 0, &i64), RF_ERR_INVALID);
    kv = rf_gguf_find_kv(f, "t.ints");
    int64_t want_i[] = {3, -1, 7};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rf_gguf_arr_int(kv, (uint64_t)i, &i64), 0);
        assert_true(i64 == want_i[i]);
    }
    assert_int_equal(rf_gguf_arr_int(kv, 3, &i64), RF_ERR_RANGE);

    /* tensors: names, types, shapes {64, 3}, dequantized bit-equal to gguf-py */
    uint8_t *ref;
    size_t ref_len;
    read_fixture("tests/fixtures/gguf/types.f32", &ref, &ref_len);
    assert_int_equal(ref_len, 6 * 192 * sizeof(float));
    const char *names[] = {"t_f32", "t_f16", "t_bf16", "t_q8_0", "t_q4_0", "t_q4_1"};
    rf_ggml_type types[] = {RF_GGML_F32,  RF_GGML_F16,  RF_GGML_BF16,
                            RF_GGML_Q8_0, RF_GGML_Q4_0, RF_GGML_Q4_1};
    float out[192];
    for (int i = 0; i < 6; i++) {
        const rf_gguf_tensor *t = rf_gguf_find_tensor(f, names[i]);
        assert_non_null(t);
        assert_ptr_equal(t, &f->tensors[i]);
        assert_int_equal(t->type, types[i]);
        assert_int_equal(t->n_dims, 2);
        assert_int_equal(t->ne[0], 64), assert_int_equal(t->ne[1], 3);
        assert_int_equal(t->ne[2], 1), assert_int_equal(t->numel, 192);
        assert_int_equal(t->nbytes, 192 / rf_ggml_block_size(t->type) * rf_ggml_type_size(t->type));
        assert_int_equal(rf_gguf_dequant(t, out), 0);
        const uint8_t *r = ref + (size_t)i * 192 * sizeof(float);
        for (int j = 0; j < 192; j++) {
            uint32_t a, e;
            memcpy(&a, &out[j], 4);
            memcpy(&e, r + 4 * j, 4);
            if (a != e)
                fail_msg("%s[%d]: got %a (0x%08x), gguf-py says %a (0x%08x)", names[i], j,
                         (double)out[j], a, (double)(*(const float *)(r + 4 * j)), e);
        }
    }
    /* the fixture's edge cases made it through */
    const rf_gguf_tensor *t16 = rf_gguf_find_tensor(f, "t_f16");
    assert_int_equal(rf_gguf_dequant(t16, out), 0);
    assert_true(isinf(out[0]) && out[0] > 0 && isinf(out[1]) && out[1] < 0 && isnan(out[2]));
    assert_null(rf_gguf_find_tensor(f, "t_q4_k"));
    free(ref);
    rf_gguf_free(f);
}

/* Nibble order and formulas on hand-made blocks, independent of gguf-py:
 * low nibbles are weights 0..15, high nibbles 16..31. */
static void test_block_layouts(void **state) {
    uint8_t q41[20], q40[18], q80[34];
    put32(q41, 0x3c00u | 0x4000u << 16); /* d = 1.0, m = 2.0 */
    put32(q40, 0x3800u);                 /* d = 0.5 (then 16 bytes of nibbles) */
    for (int j = 0; j < 16; j++) {
        q41[4 + j] = (uint8_t)(j | (15 - j) << 4);
        q40[2 + j] = (uint8_t)(j | (15 - j) << 4);
    }
    q80[0] = 0x00, q80[1] = 0xc0; /* d = -2.0 */
    for (int j = 0; j < 32; j++)
        q80[2 + j] = (uint8_t)(int8_t)(j - 16);
    float y[32];
    assert_int_equal(rf_gguf_dequant_row(RF_GGML_Q4_1, q41, y, 32), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (float)j + 2.0f);
        assert_true(y[j + 16] == (float)(15 - j) + 2.0f);
    }
    assert_int_equal(rf_gguf_dequant_row(RF_GGML_Q4_0, q40, y, 32), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (float)(j - 8) * 0.5f);
        assert_true(y[j + 16] == (float)(7 - j) * 0.5f);
    }
    assert_int_equal(rf_gguf_dequant_row(RF_GGML_Q8_0, q80, y, 32), 0);
    for (int j = 0; j < 32; j++)
        assert_true(y[j] == (float)(j - 16) * -2.0f);
    assert_int_equal(rf_gguf_dequant_row(RF_GGML_Q4_1, q41, y, 31), RF_ERR_INVALID);
    assert_int_equal(rf_gguf_dequant_row(RF_GGML_Q6_K, q41, y, 256), RF_ERR_UNSUPPORTED);
    assert_int_equal(rf_gguf_dequant_row((rf_ggml_type)99, q41, y, 32), RF_ERR_UNSUPPORTED);
    /* half: normal, subnormal, signed zero */
    assert_true(rf_gguf_f16_to_f32(0x3555) == 0x1.554p-2f);
    assert_true(rf_gguf_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(rf_gguf_f16_to_f32(0x83ff) == -0x1.ff8p-15f);
    assert_true(signbit(rf_gguf_f16_to_f32(0x8000)) && rf_gguf_f16_to_f32(0x8000) == 0.0f);
    assert_true(rf_gguf_f16_to_f32(0x7bff) == 65504.0f);
}

/* The end of the last tensor's data: every shorter prefix must be refused. */
static size_t needed_len(void) {
    rf_gguf_file *f;
    assert_int_equal(rf_gguf_parse(fixture, fixture_len, &f), 0);
    size_t end = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        size_t e = (size_t)(f->data_offset + f->tensors[i].offset + f->tensors[i].nbytes);
        if (e > end) end = e;
    }
    rf_gguf_free(f);
    return end;
}

static void test_truncated(void **state) {
    size_t need = needed_len();
    assert_true(need <= fixture_len);
    for (size_t n = 0; n < need; n++) {
        int rc = parse_copy(fixture, n);
        if (rc != RF_ERR_CORRUPT) fail_msg("prefix of %zu bytes: rc %d (%s)", n, rc, rf_errmsg());
    }
    assert_int_equal(parse_copy(fixture, need), 0);
}

/* Offsets of fields inside the fixture, found through the parsed file. */
static size_t kv_data_off(const char *key) {
    rf_gguf_file *f;
    assert_int_equal(rf_gguf_parse(fixture, fixture_len, &f), 0);
    size_t off = (size_t)(rf_gguf_find_kv(f, key)->data - fixture);
    rf_gguf_free(f);
    return off;
}
/* Offset of a tensor info's n_dims field (just past its name). */
static size_t tensor_info_off(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 8; i + n + 4 < fixture_len; i++)
        if (fixture[i - 8] == n && memcmp(fixture + i, name, n) == 0) return i + n;
    fail_msg("tensor info %s not found", name);
    return 0;
}

typedef struct patch {
    const char *what;
    size_t off;
    int width; /* 4 or 8 */
    uint64_t value;
    int want;
} patch;

static void expect_patch(const patch *p) {
    uint8_t *b = malloc(fixture_len);
    memcpy(b, fixture, fixture_len);
    if (p->width == 8)
        put64(b + p->off, p->value);
    else
        put32(b + p->off, (uint32_t)p->value);
    int rc = parse_copy(b, fixture_len);
    if (rc != p->want) fail_msg("%s: rc %d, want %d (%s)", p->what, rc, p->want, rf_errmsg());
    printf("  %-40s -> %s%s%s\n", p->what, rc ? rf_err_name(rc) : "parses", rc ? ": " : "",
           rc ? rf_errmsg() : "");
    free(b);
}

static void test_malformed(void **state) {
    size_t strs = kv_data_off("t.strs"), ints = kv_data_off("t.ints"), str = kv_data_off("t.str");
    size_t align = kv_data_off("general.alignment"), u8 = kv_data_off("t.u8");
    size_t q41 = tensor_info_off("t_q4_1"), f32 = tensor_info_off("t_f32");
    /* t_q4_1 info: n_dims u32, ne[2] u64, type u32, offset u64 */
    const patch patches[] = {
        {"bad magic", 0, 4, 0x46554746, RF_ERR_CORRUPT},
        {"version 1", 4, 4, 1, RF_ERR_UNSUPPORTED},
        {"big-endian version", 4, 4, 0x03000000, RF_ERR_UNSUPPORTED},
        {"huge tensor count", 8, 8, UINT64_MAX, RF_ERR_CORRUPT},
        {"huge key count", 16, 8, 1ull << 60, RF_ERR_CORRUPT},
        {"tensor count one too many", 8, 8, 7, RF_ERR_CORRUPT},
        {"huge string length", str - 8, 8, UINT64_MAX, RF_ERR_CORRUPT},
        {"string length one too long", str - 8, 8, strlen("héllo, GGUF") + 1, RF_ERR_CORRUPT},
        {"huge string-array count", strs - 8, 8, 1ull << 61, RF_ERR_CORRUPT},
        {"huge int-array count", ints - 8, 8, (1ull << 62) + 1, RF_ERR_CORRUPT},
        {"array element length huge", strs, 8, UINT64_MAX - 4, RF_ERR_CORRUPT},
        {"nested array", strs - 12, 4, RF_GGUF_ARRAY, RF_ERR_UNSUPPORTED},
        {"unknown array type", ints - 12, 4, 13, RF_ERR_CORRUPT},
        {"unknown value type", u8 - 4, 4, 13, RF_ERR_CORRUPT},
        {"alignment 48", align, 4, 48, RF_ERR_CORRUPT},
        {"alignment 0", align, 4, 0, RF_ERR_CORRUPT},
        {"alignment of wrong type", align - 4, 4, RF_GGUF_I32, RF_ERR_CORRUPT},
        {"5 dimensions", q41, 4, 5, RF_ERR_CORRUPT},
        {"0 dimensions", q41, 4, 0, RF_ERR_CORRUPT},
        {"row not a multiple of 32", q41 + 4, 8, 48, RF_ERR_CORRUPT},
        {"dimension overflows", q41 + 12, 8, 1ull << 62, RF_ERR_CORRUPT},
        {"negative dimension", q41 + 12, 8, UINT64_MAX, RF_ERR_CORRUPT},
        {"rows past the data", q41 + 12, 8, 4, RF_ERR_CORRUPT},
        {"unknown tensor type", q41 + 20, 4, 99, RF_ERR_UNSUPPORTED},
        {"offset not aligned", q41 + 24, 8, 64 * 6 + 32, RF_ERR_CORRUPT},
        {"offset past the end", q41 + 24, 8, 1ull << 40, RF_ERR_CORRUPT},
        {"offset wraps around", q41 + 24, 8, UINT64_MAX - 63, RF_ERR_CORRUPT},
        {"duplicate tensor name", f32 - 4, 4, 0x3631665f /* "_f16" */, RF_ERR_CORRUPT},
    };
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++)
        expect_patch(&patches[i]);
    /* F32 tensor read as F16 still fits: a type change is caught only when it
     * breaks the layout, which the reader cannot know otherwise. */
    patch as_f16 = {"F32 tensor relabelled F16", f32 + 12, 4, RF_GGML_F16, 0};
    expect_patch(&as_f16);
}

static const char *smollm_path(void) {
    static char buf[4096];
    const char *d = getenv("REFINERY_SMOLLM2_DIR");
    const char *root = getenv("REFINERY_ROOT");
    if (d && *d)
        snprintf(buf, sizeof buf, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else
        snprintf(buf, sizeof buf, "%s/build/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
                 root ? root : ".");
    return buf;
}

static uint64_t meta(const rf_gguf_file *f, const char *key) {
    uint64_t v;
    if (rf_gguf_get_u64(f, key, &v)) fail_msg("%s", rf_errmsg());
    return v;
}

static void expect_shape(const rf_gguf_tensor *t, int64_t ne0, int64_t ne1) {
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || (ne1 == 1 && t->n_dims != 1) ||
        (ne1 != 1 && t->n_dims != 2))
        fail_msg("%s: shape {%lld, %lld} (%d dims), metadata implies {%lld, %lld}", t->name,
                 (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)ne0,
                 (long long)ne1);
}

static void test_smollm2(void **state) {
    const char *path = smollm_path();
    struct stat st;
    if (stat(path, &st) != 0)
        RF_SKIP("SmolLM2 not found at %s (run scripts/fetch-smollm2.sh)", path);
    rf_gguf_file *f;
    double t0 = rf_now();
    if (rf_gguf_open(path, &f)) fail_msg("%s", rf_errmsg());
    double t_parse = rf_now() - t0;
    const char *s;
    size_t n;
    assert_int_equal(rf_gguf_get_str(f, "general.architecture", &s, &n), 0);
    assert_int_equal(n, 5), assert_memory_equal(s, "llama", 5);
    uint64_t L = meta(f, "llama.block_count"), H = meta(f, "llama.embedding_length"),
             I = meta(f, "llama.feed_forward_length"), nh = meta(f, "llama.attention.head_count"),
             nkv = meta(f, "llama.attention.head_count_kv");
    const rf_gguf_kv *toks = rf_gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_non_null(toks);
    uint64_t V = toks->n, kvdim = H / nh * nkv;
    /* the model's own numbers (HF config of SmolLM2-135M) */
    assert_int_equal(L, 30), assert_int_equal(H, 576), assert_int_equal(V, 49152);
    /* token_embd, output_norm (tied head), 9 tensors a layer */
    assert_int_equal(f->n_tensors, 2 + 9 * L);
    /* gguf-py's dequantization of every tensor (scripts/parity/gguf_fixtures.py) */
    uint8_t *ref;
    size_t ref_len;
    read_fixture("tests/fixtures/gguf/smollm2_tensors.txt", &ref, &ref_len);
    char *line = strtok((char *)ref, "\n"); /* header */
    uint64_t params = 0, q41 = 0;
    double t1 = rf_now();
    float *buf = NULL;
    size_t cap = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const rf_gguf_tensor *t = &f->tensors[i];
        unsigned b;
        char part[64];
        if (strcmp(t->name, "token_embd.weight") == 0)
            expect_shape(t, (int64_t)H, (int64_t)V);
        else if (strcmp(t->name, "output_norm.weight") == 0)
            expect_shape(t, (int64_t)H, 1);
        else if (sscanf(t->name, "blk.%u.%63s", &b, part) == 2 && b < L) {
            if (!strcmp(part, "attn_norm.weight") || !strcmp(part, "ffn_norm.weight"))
                expect_shape(t, (int64_t)H, 1);
            else if (!strcmp(part, "attn_q.weight") || !strcmp(part, "attn_output.weight"))
                expect_shape(t, (int64_t)H, (int64_t)H);
            else if (!strcmp(part, "attn_k.weight") || !strcmp(part, "attn_v.weight"))
                expect_shape(t, (int64_t)H, (int64_t)kvdim);
            else if (!strcmp(part, "ffn_gate.weight") || !strcmp(part, "ffn_up.weight"))
                expect_shape(t, (int64_t)H, (int64_t)I);
            else if (!strcmp(part, "ffn_down.weight"))
                expect_shape(t, (int64_t)I, (int64_t)H);
            else
                fail_msg("unexpected tensor %s", t->name);
        } else {
            fail_msg("unexpected tensor %s", t->name);
        }
        params += t->numel;
        q41 += t->type == RF_GGML_Q4_1;
        if (t->numel > cap) {
            free(buf);
            buf = malloc((cap = t->numel) * sizeof(float));
        }
        if (rf_gguf_dequant(t, buf)) fail_msg("%s", rf_errmsg());
        char rname[128], rtype[16];
        unsigned long long rn, rh;
        if (!(line = strtok(NULL, "\n")) ||
            sscanf(line, "%127s %15s %llu %llx", rname, rtype, &rn, &rh) != 4)
            fail_msg("smollm2_tensors.txt: no line for %s", t->name);
        assert_string_equal(rname, t->name);
        assert_string_equal(rtype, rf_ggml_type_name(t->type));
        assert_int_equal(rn, t->numel);
        if (rf_hash64(buf, t->numel * sizeof(float), 0) != rh)
            fail_msg("%s: dequantized values differ from gguf-py's", t->name);
        for (uint64_t j = 0; j < t->numel; j++)
            if (!isfinite(buf[j]))
                fail_msg("%s[%llu] is not finite", t->name, (unsigned long long)j);
    }
    double t_deq = rf_now() - t1;
    /* V*H + L*(2H + 2H^2 + 2*H*kvdim + 3*H*I) + H: 134,515,008 for SmolLM2-135M */
    assert_true(params == V * H + L * (2 * H + 2 * H * H + 2 * H * kvdim + 3 * H * I) + H);
    assert_int_equal(params, 134515008);
    assert_int_equal(q41, 7 * L); /* every linear weight of the layers is Q4_1 */
    printf("  smollm2: %llu tensors, %llu parameters (%llu Q4_1 tensors), parse %.3f s, "
           "dequantize all %.2f s (bit-equal to gguf-py)\n",
           (unsigned long long)f->n_tensors, (unsigned long long)params, (unsigned long long)q41,
           t_parse, t_deq);
    assert_null(strtok(NULL, "\n"));
    free(ref);
    free(buf);
    rf_gguf_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_values), cmocka_unit_test(test_block_layouts),
        cmocka_unit_test(test_truncated),      cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_smollm2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
