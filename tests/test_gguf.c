/* tests/test_gguf.c: GGUF reader and writer.
 *
 * 1. Round trip: the writer emits every value type, arrays, tensors of several types (copied
 *    and streamed) at alignments 32 and 64; the reader must give back the same.
 * 2. The real stories260K.gguf: known metadata and tensor shapes; llama.cpp's 9 vocab-only
 *    files open (each skipped if absent).
 * 3. A table of hand-built bad files, each refused with a specific message.
 * 4. Every prefix of a small valid file fails cleanly (or succeeds once all data is present);
 *    random byte mutations of it never crash (run under ASan to see over-reads).
 * 5. Writer argument errors and atomic write (no temp file left behind). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/dtype.h"
#include "engine/gguf.h"
#include "tests/check.h"
#include "tools/gguf_write.h"

/* ---------------------------------------------------------------- byte builder */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} bb_t;

static void bb_raw(bb_t *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n) nc *= 2;
        b->p = realloc(b->p, nc);
        if (!b->p) abort();
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}
static void bb_le(bb_t *b, uint64_t v, int n)
{
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    bb_raw(b, t, (size_t)n);
}
static void bb_u8(bb_t *b, uint8_t v) { bb_le(b, v, 1); }
static void bb_u32(bb_t *b, uint32_t v) { bb_le(b, v, 4); }
static void bb_u64(bb_t *b, uint64_t v) { bb_le(b, v, 8); }
static void bb_strn(bb_t *b, const char *s, size_t n) { bb_u64(b, n); bb_raw(b, s, n); }
static void bb_str(bb_t *b, const char *s) { bb_strn(b, s, strlen(s)); }
static void bb_pad(bb_t *b, size_t a)
{
    while (b->len % a) bb_u8(b, 0);
}
static void bb_zeros(bb_t *b, size_t n)
{
    while (n--) bb_u8(b, 0);
}
static void hdr(bb_t *b, uint32_t version, uint64_t n_t, uint64_t n_kv)
{
    bb_raw(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_t);
    bb_u64(b, n_kv);
}
static void kv_u32(bb_t *b, const char *key, uint32_t v)
{
    bb_str(b, key);
    bb_u32(b, GGUF_UINT32);
    bb_u32(b, v);
}
/* Tensor info with n_dims dims from ne. */
static void tinfo(bb_t *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                  uint64_t offset)
{
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int str_eq(gguf_str_t s, const char *c)
{
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* Touches everything a valid gguf_t exposes; returns a checksum so nothing is optimised out. */
static uint64_t exercise(const gguf_t *g)
{
    uint64_t h = gguf_version(g) + gguf_alignment(g) + gguf_file_size(g);
    char buf[512];
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        gguf_kv_format(g, i, buf, sizeof buf);
        h += strlen(buf) + (uint64_t)gguf_kv_type(g, i) + (uint64_t)gguf_find_key(g, key);
        gguf_kv_format(g, i, buf, 5);
        int64_t iv;
        uint32_t uv;
        float fv;
        int bv, et;
        uint64_t n;
        gguf_str_t s;
        if (!gguf_get_i64(g, key, &iv)) h += (uint64_t)iv;
        if (!gguf_get_u32(g, key, &uv)) h += uv;
        if (!gguf_get_f32(g, key, &fv)) h += (uint64_t)(fv == fv);
        if (!gguf_get_bool(g, key, &bv)) h += (uint64_t)bv;
        if (!gguf_get_str(g, key, &s)) for (uint64_t j = 0; j < s.len; j++) h += (uint8_t)s.ptr[j];
        if (!gguf_get_arr(g, key, &et, &n)) {
            const uint8_t *d = gguf_get_arr_data(g, key);
            if (d) {
                size_t es = et == GGUF_UINT8 || et == GGUF_INT8 || et == GGUF_BOOL ? 1
                          : et == GGUF_UINT16 || et == GGUF_INT16 ? 2
                          : et == GGUF_UINT32 || et == GGUF_INT32 || et == GGUF_FLOAT32 ? 4 : 8;
                for (uint64_t j = 0; j < n * es; j++) h += d[j];
            }
            for (uint64_t j = 0; j < n && j < 64; j++)
                if (!gguf_get_arr_str(g, key, j, &s) && s.len) h += (uint8_t)s.ptr[s.len - 1];
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        h += (uint64_t)(gguf_find_tensor(g, t->name) == t);
        const uint8_t *d = t->data;
        if (t->nbytes) h += d[0] + d[t->nbytes - 1];
    }
    return h;
}

static char tmpdir[64];

static void path_in_tmp(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmpdir, name);
}

/* ---------------------------------------------------------------- 1. round trip */

typedef struct {
    int64_t rows, cols;
} fill_ctx_t;

static int fill_rows(void *user, int64_t row, void *dst, size_t row_bytes)
{
    const fill_ctx_t *c = user;
    if (row >= c->rows || row_bytes != (size_t)c->cols * 4) return -1;
    float *f = dst;
    for (int64_t j = 0; j < c->cols; j++) f[j] = (float)(row * 1000 + j);
    return 0;
}

static int fill_fail(void *user, int64_t row, void *dst, size_t row_bytes)
{
    memset(dst, 0, row_bytes);
    return row == 2 ? -1 : 0;
}

/* Builds the round-trip writer. */
static gguf_writer_t *make_rt_writer(uint32_t alignment, fill_ctx_t *fc)
{
    gguf_writer_t *w = gguf_writer_new();
    int rc = 0;
    if (alignment != 32) rc |= gguf_writer_set_alignment(w, alignment);
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    int64_t i64 = INT64_MIN + 5; double f64 = -2.5e300; uint8_t bo = 1;
    rc |= gguf_writer_add_scalar(w, "t.u8", GGUF_UINT8, &u8);
    rc |= gguf_writer_add_scalar(w, "t.i8", GGUF_INT8, &i8);
    rc |= gguf_writer_add_scalar(w, "t.u16", GGUF_UINT16, &u16);
    rc |= gguf_writer_add_scalar(w, "t.i16", GGUF_INT16, &i16);
    rc |= gguf_writer_add_u32(w, "t.u32", 4000000000u);
    rc |= gguf_writer_add_i32(w, "t.i32", -7);
    rc |= gguf_writer_add_f32(w, "t.f32", 1.5f);
    rc |= gguf_writer_add_bool(w, "t.bool", 1);
    rc |= gguf_writer_add_scalar(w, "t.bool0", GGUF_BOOL, &(uint8_t){0});
    rc |= gguf_writer_add_str(w, "t.str", "héllo \"world\"");
    rc |= gguf_writer_add_str(w, "t.empty", "");
    rc |= gguf_writer_add_u64(w, "t.u64", UINT64_MAX);
    rc |= gguf_writer_add_scalar(w, "t.i64", GGUF_INT64, &i64);
    rc |= gguf_writer_add_scalar(w, "t.f64", GGUF_FLOAT64, &f64);
    rc |= gguf_writer_add_scalar(w, "t.bool2", GGUF_BOOL, &bo);
    uint8_t a_u8[3] = {1, 2, 255};
    int16_t a_i16[2] = {-1, 300};
    int32_t a_i32[4] = {-5, 0, 5, INT32_MAX};
    float a_f32[3] = {0.25f, -1.0f, 3.0e38f};
    uint64_t a_u64[2] = {0, UINT64_MAX};
    double a_f64[2] = {1e-300, -0.0};
    uint8_t a_bool[3] = {1, 0, 1};
    rc |= gguf_writer_add_arr(w, "a.u8", GGUF_UINT8, a_u8, 3);
    rc |= gguf_writer_add_arr(w, "a.i16", GGUF_INT16, a_i16, 2);
    rc |= gguf_writer_add_arr(w, "a.i32", GGUF_INT32, a_i32, 4);
    rc |= gguf_writer_add_arr(w, "a.f32", GGUF_FLOAT32, a_f32, 3);
    rc |= gguf_writer_add_arr(w, "a.u64", GGUF_UINT64, a_u64, 2);
    rc |= gguf_writer_add_arr(w, "a.f64", GGUF_FLOAT64, a_f64, 2);
    rc |= gguf_writer_add_arr(w, "a.bool", GGUF_BOOL, a_bool, 3);
    rc |= gguf_writer_add_arr(w, "a.empty", GGUF_INT32, NULL, 0);
    const char *strs[] = {"<unk>", "", "a\0b", "\xe2\x96\x81the"};
    uint64_t lens[] = {5, 0, 3, 6};
    rc |= gguf_writer_add_arr_str(w, "a.str", strs, lens, 4);
    const char *strs2[] = {"x", "yy"};
    rc |= gguf_writer_add_arr_str(w, "a.str2", strs2, NULL, 2);
    rc |= gguf_writer_add_arr_str(w, "a.strempty", NULL, NULL, 0);

    /* Tensors: F32 2-D, F16 1-D, BF16 3-D, Q8_0, Q4_0 (listed only), 4-D, empty, streamed. */
    float f32d[3 * 5];
    for (int i = 0; i < 15; i++) f32d[i] = (float)i - 7.0f;
    rc |= gguf_writer_add_tensor(w, "w.f32", DT_F32, 2, (int64_t[]){5, 3}, f32d);
    uint16_t f16d[7];
    for (int i = 0; i < 7; i++) f16d[i] = f32_to_fp16((float)i * 0.5f);
    rc |= gguf_writer_add_tensor(w, "w.f16", DT_F16, 1, (int64_t[]){7}, f16d);
    uint16_t bf[2 * 3 * 4];
    for (int i = 0; i < 24; i++) bf[i] = f32_to_bf16((float)i);
    rc |= gguf_writer_add_tensor(w, "w.bf16", DT_BF16, 3, (int64_t[]){2, 3, 4}, bf);
    block_q8_0 q8[2 * 2];
    for (int b = 0; b < 4; b++) {
        q8[b].d = f32_to_fp16(0.01f * (float)(b + 1));
        for (int j = 0; j < QK8_0; j++) q8[b].qs[j] = (int8_t)(j - 16 + b);
    }
    rc |= gguf_writer_add_tensor(w, "w.q8_0", DT_Q8_0, 2, (int64_t[]){64, 2}, q8);
    uint8_t q4[18 * 2];
    for (int i = 0; i < 36; i++) q4[i] = (uint8_t)(i * 7);
    rc |= gguf_writer_add_tensor(w, "w.q4_0", DT_Q4_0, 2, (int64_t[]){32, 2}, q4);
    float f4[1 * 2 * 1 * 3] = {1, 2, 3, 4, 5, 6};
    rc |= gguf_writer_add_tensor(w, "w.4d", DT_F32, 4, (int64_t[]){1, 2, 1, 3}, f4);
    rc |= gguf_writer_add_tensor(w, "w.empty", DT_F32, 2, (int64_t[]){4, 0}, NULL);
    rc |= gguf_writer_add_tensor_stream(w, "w.stream", DT_F32, 2, (int64_t[]){fc->cols, fc->rows},
                                        fill_rows, fc);
    CHECKF(rc == 0, "%s", gguf_writer_errstr(w));
    return w;
}

static void check_rt(const gguf_t *g, uint32_t alignment, const fill_ctx_t *fc)
{
    CHECK(gguf_version(g) == 3);
    CHECK(gguf_alignment(g) == alignment);
    int64_t iv;
    uint32_t uv;
    float fv;
    int bv, et;
    uint64_t n;
    gguf_str_t s;
    /* Scalars and conversions. */
    CHECK(gguf_get_i64(g, "t.u8", &iv) == 0 && iv == 200);
    CHECK(gguf_get_u32(g, "t.u8", &uv) == 0 && uv == 200);
    CHECK(gguf_get_i64(g, "t.i8", &iv) == 0 && iv == -100);
    CHECK(gguf_get_u32(g, "t.i8", &uv) == -1);
    CHECK(gguf_get_i64(g, "t.u16", &iv) == 0 && iv == 60000);
    CHECK(gguf_get_i64(g, "t.i16", &iv) == 0 && iv == -30000);
    CHECK(gguf_get_u32(g, "t.u32", &uv) == 0 && uv == 4000000000u);
    CHECK(gguf_get_i64(g, "t.i32", &iv) == 0 && iv == -7);
    CHECK(gguf_get_f32(g, "t.f32", &fv) == 0 && fv == 1.5f);
    CHECK(gguf_get_f32(g, "t.i32", &fv) == -1);
    CHECK(gguf_get_bool(g, "t.bool", &bv) == 0 && bv == 1);
    CHECK(gguf_get_bool(g, "t.bool0", &bv) == 0 && bv == 0);
    CHECK(gguf_get_bool(g, "t.i32", &bv) == 0 && bv == 1);
    CHECK(gguf_get_bool(g, "t.str", &bv) == -1);
    CHECK(gguf_get_str(g, "t.str", &s) == 0 && str_eq(s, "héllo \"world\""));
    CHECK(gguf_get_str(g, "t.empty", &s) == 0 && s.len == 0);
    CHECK(gguf_get_str(g, "t.u32", &s) == -1);
    CHECK(gguf_get_i64(g, "t.u64", &iv) == -1); /* does not fit */
    CHECK(gguf_get_u32(g, "t.u64", &uv) == -1);
    CHECK(gguf_get_i64(g, "t.i64", &iv) == 0 && iv == INT64_MIN + 5);
    CHECK(gguf_get_f32(g, "t.f64", &fv) == 0 && isinf(fv) && fv < 0); /* clamps */
    CHECK(gguf_get_i64(g, "missing", &iv) == -1);
    CHECK(gguf_find_key(g, "missing") == -1);
    int64_t ki = gguf_find_key(g, "t.i16");
    CHECK(ki >= 0 && gguf_kv_type(g, ki) == GGUF_INT16 && strcmp(gguf_kv_key(g, ki), "t.i16") == 0);
    CHECK(gguf_kv_key(g, -1) == NULL && gguf_kv_key(g, gguf_n_kv(g)) == NULL);
    CHECK(gguf_kv_type(g, gguf_n_kv(g)) == -1);
    /* Arrays. */
    CHECK(gguf_get_arr(g, "a.i32", &et, &n) == 0 && et == GGUF_INT32 && n == 4);
    const uint8_t *d = gguf_get_arr_data(g, "a.i32");
    int32_t i32s[4];
    CHECK(d != NULL);
    if (d) {
        memcpy(i32s, d, sizeof i32s);
        CHECK(i32s[0] == -5 && i32s[3] == INT32_MAX);
    }
    CHECK(gguf_get_arr(g, "a.f64", &et, &n) == 0 && et == GGUF_FLOAT64 && n == 2);
    CHECK(gguf_get_arr(g, "a.bool", &et, &n) == 0 && et == GGUF_BOOL && n == 3);
    CHECK(gguf_get_arr(g, "a.empty", &et, &n) == 0 && n == 0);
    CHECK(gguf_get_arr(g, "t.u8", &et, &n) == -1);
    CHECK(gguf_get_arr(g, "a.str", &et, &n) == 0 && et == GGUF_STRING && n == 4);
    CHECK(gguf_get_arr_data(g, "a.str") == NULL);
    CHECK(gguf_get_arr_str(g, "a.str", 0, &s) == 0 && str_eq(s, "<unk>"));
    CHECK(gguf_get_arr_str(g, "a.str", 1, &s) == 0 && s.len == 0);
    CHECK(gguf_get_arr_str(g, "a.str", 2, &s) == 0 && s.len == 3 && memcmp(s.ptr, "a\0b", 3) == 0);
    CHECK(gguf_get_arr_str(g, "a.str", 3, &s) == 0 && str_eq(s, "\xe2\x96\x81the"));
    CHECK(gguf_get_arr_str(g, "a.str", 4, &s) == -1);
    CHECK(gguf_get_arr_str(g, "a.str2", 1, &s) == 0 && str_eq(s, "yy"));
    CHECK(gguf_get_arr_str(g, "a.i32", 0, &s) == -1);
    CHECK(gguf_get_arr(g, "a.strempty", &et, &n) == 0 && et == GGUF_STRING && n == 0);
    /* Formatting. */
    char buf[256];
    gguf_kv_format(g, gguf_find_key(g, "a.i32"), buf, sizeof buf);
    CHECKF(strcmp(buf, "[i32; 4] [-5, 0, 5, 2147483647]") == 0, "%s", buf);
    gguf_kv_format(g, gguf_find_key(g, "a.str"), buf, sizeof buf);
    CHECKF(strcmp(buf, "[string; 4] [\"<unk>\", \"\", \"a\\x00b\", \"\xe2\x96\x81the\"]") == 0, "%s", buf);
    gguf_kv_format(g, gguf_find_key(g, "t.str"), buf, sizeof buf);
    CHECKF(strcmp(buf, "\"héllo \\\"world\\\"\"") == 0, "%s", buf);
    gguf_kv_format(g, gguf_find_key(g, "t.i64"), buf, sizeof buf);
    CHECKF(strcmp(buf, "-9223372036854775803") == 0, "%s", buf);
    gguf_kv_format(g, gguf_find_key(g, "t.bool"), buf, sizeof buf);
    CHECKF(strcmp(buf, "true") == 0, "%s", buf);
    gguf_kv_format(g, gguf_find_key(g, "a.str"), buf, 10);
    CHECKF(strlen(buf) == 9 && strcmp(buf + 6, "...") == 0, "%s", buf);
    CHECK(strcmp(gguf_type_name(GGUF_FLOAT64), "f64") == 0 && strcmp(gguf_type_name(13), "unknown") == 0);

    /* Tensors. */
    CHECK(gguf_n_tensors(g) == 8);
    const gguf_tensor_t *t = gguf_find_tensor(g, "w.f32");
    CHECK(t && t->type == DT_F32 && t->n_dims == 2 && t->ne[0] == 5 && t->ne[1] == 3 &&
          t->ne[2] == 1 && t->ne[3] == 1 && t->nbytes == 60);
    if (t) {
        float v;
        memcpy(&v, (const uint8_t *)t->data + 4 * 14, 4);
        CHECK(v == 7.0f);
    }
    t = gguf_find_tensor(g, "w.bf16");
    CHECK(t && t->type == DT_BF16 && t->n_dims == 3 && t->ne[2] == 4 && t->nbytes == 48);
    if (t) CHECK(bf16_to_f32(((const uint16_t *)t->data)[23]) == 23.0f);
    t = gguf_find_tensor(g, "w.q8_0");
    CHECK(t && t->type == DT_Q8_0 && t->nbytes == 4 * 34);
    if (t) {
        const block_q8_0 *b = t->data;
        CHECK(b[3].qs[0] == -13 && fabsf(fp16_to_f32(b[3].d) - 0.04f) < 1e-4f);
    }
    t = gguf_find_tensor(g, "w.q4_0");
    CHECK(t && t->type == DT_Q4_0 && t->nbytes == 36 && ((const uint8_t *)t->data)[35] == (uint8_t)(35 * 7));
    t = gguf_find_tensor(g, "w.4d");
    CHECK(t && t->n_dims == 4 && t->ne[3] == 3 && ((const float *)t->data)[5] == 6.0f);
    t = gguf_find_tensor(g, "w.empty");
    CHECK(t && t->nbytes == 0 && t->ne[1] == 0);
    t = gguf_find_tensor(g, "w.stream");
    CHECK(t && t->nbytes == (uint64_t)(fc->rows * fc->cols * 4));
    if (t) {
        const float *f = t->data;
        int ok = 1;
        for (int64_t r = 0; r < fc->rows; r++)
            for (int64_t j = 0; j < fc->cols; j++) ok &= f[r * fc->cols + j] == (float)(r * 1000 + j);
        CHECK(ok);
    }
    CHECK(gguf_find_tensor(g, "nope") == NULL && gguf_tensor(g, 8) == NULL && gguf_tensor(g, -1) == NULL);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        t = gguf_tensor(g, i);
        CHECKF(t->offset % alignment == 0 && (uintptr_t)t->data % alignment == 0, "%s", t->name);
    }
    /* File order is preserved. */
    CHECK(strcmp(gguf_tensor(g, 0)->name, "w.f32") == 0 && strcmp(gguf_kv_key(g, 0), "t.u8") == 0);
}

static void test_round_trip(void)
{
    uint32_t aligns[] = {32, 64};
    for (int a = 0; a < 2; a++) {
        fill_ctx_t fc = {37, 9};
        gguf_writer_t *w = make_rt_writer(aligns[a], &fc);
        char path[128], err[256];
        path_in_tmp(path, sizeof path, "rt.gguf");
        CHECKF(gguf_writer_write(w, path) == 0, "%s", gguf_writer_errstr(w));
        gguf_writer_free(w);
        gguf_t *g = gguf_open(path, err, sizeof err);
        CHECKF(g != NULL, "%s", err);
        if (!g) continue;
        check_rt(g, aligns[a], &fc);
        CHECK((gguf_find_key(g, "general.alignment") >= 0) == (aligns[a] != 32));
        exercise(g);
        gguf_close(g);
        /* The same bytes through gguf_open_mem. */
        size_t len;
        uint8_t *bytes = read_file(path, &len);
        CHECK(bytes != NULL);
        g = gguf_open_mem(bytes, len, err, sizeof err);
        CHECKF(g != NULL, "%s", err);
        if (g) gguf_close(g);
        free(bytes);
        unlink(path);
    }
}

/* ---------------------------------------------------------------- 2. real model */

static void test_stories(void)
{
    char err[256];
    gguf_t *g = gguf_open(SPILLWAY_MODELS "/stories260K.gguf", err, sizeof err);
    if (!g && access(SPILLWAY_MODELS "/stories260K.gguf", R_OK) != 0) {
        fprintf(stderr, "stories260K.gguf not found: real-file checks skipped\n");
        return;
    }
    CHECKF(g != NULL, "%s", err);
    if (!g) return;
    gguf_str_t s;
    uint32_t u;
    float f;
    CHECK(gguf_version(g) == 3 && gguf_alignment(g) == 32 && gguf_file_size(g) == 1185376);
    CHECK(gguf_get_str(g, "general.architecture", &s) == 0 && str_eq(s, "llama"));
    CHECK(gguf_get_u32(g, "llama.context_length", &u) == 0 && u == 512);
    CHECK(gguf_get_u32(g, "llama.embedding_length", &u) == 0 && u == 64);
    CHECK(gguf_get_u32(g, "llama.block_count", &u) == 0 && u == 5);
    CHECK(gguf_get_u32(g, "llama.feed_forward_length", &u) == 0 && u == 172);
    CHECK(gguf_get_u32(g, "llama.attention.head_count", &u) == 0 && u == 8);
    CHECK(gguf_get_u32(g, "llama.attention.head_count_kv", &u) == 0 && u == 4);
    CHECK(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f) == 0 && f == 1e-5f);
    CHECK(gguf_get_str(g, "tokenizer.ggml.model", &s) == 0 && str_eq(s, "llama"));
    int et;
    uint64_t n;
    CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) == 0 && et == GGUF_STRING && n == 512);
    CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 1, &s) == 0 && str_eq(s, "<s>"));
    CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", 3, &s) == 0 && str_eq(s, "<0x00>"));
    CHECK(gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n) == 0 && et == GGUF_FLOAT32 && n == 512);
    CHECK(gguf_n_tensors(g) == 3 + 5 * 9);
    const gguf_tensor_t *t = gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == DT_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 &&
          t->nbytes == 64 * 512 * 4);
    t = gguf_find_tensor(g, "blk.4.ffn_down.weight");
    CHECK(t && t->type == DT_F32 && t->ne[0] == 172 && t->ne[1] == 64);
    t = gguf_find_tensor(g, "blk.4.attn_k.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 32);
    CHECK(gguf_find_tensor(g, "blk.5.attn_k.weight") == NULL);
    exercise(g);
    gguf_close(g);
}

/* llama.cpp's vocab-only files: all open, with a token list as long as the other arrays. */
static void test_vocab_files(void)
{
    static const char *const names[] = {"deepseek-coder", "deepseek-llm", "falcon", "gpt-2",
                                        "llama-spm", "mpt", "phi-3", "refact", "starcoder"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[512], err[256];
        snprintf(path, sizeof path, "%s/tokenizer-vectors/ggml-vocab-%s.gguf", SPILLWAY_MODELS,
                 names[i]);
        if (access(path, R_OK) != 0) {
            fprintf(stderr, "%s not found: skipped\n", path);
            continue;
        }
        gguf_t *g = gguf_open(path, err, sizeof err);
        CHECKF(g != NULL, "%s: %s", names[i], err);
        if (!g) continue;
        int et, et2;
        uint64_t n = 0, n2 = 0;
        gguf_str_t s;
        CHECKF(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) == 0 && et == GGUF_STRING &&
               n > 30000, "%s", names[i]);
        CHECK(gguf_get_arr(g, "tokenizer.ggml.token_type", &et2, &n2) == 0 && et2 == GGUF_INT32 &&
              n2 == n);
        CHECK(gguf_get_arr_str(g, "tokenizer.ggml.tokens", n - 1, &s) == 0 && s.len > 0);
        CHECK(gguf_get_str(g, "tokenizer.ggml.model", &s) == 0 &&
              (str_eq(s, "llama") || str_eq(s, "gpt2")));
        CHECK(gguf_n_tensors(g) == 0);
        exercise(g);
        gguf_close(g);
    }
}

/* ---------------------------------------------------------------- 3. bad files */

static const uint64_t ne_8_2[2] = {8, 2};

/* One valid F32 tensor 'w' {8,2} at offset 0 with its 64 data bytes. */
static void valid_one_tensor(bb_t *b)
{
    hdr(b, 3, 1, 1);
    kv_u32(b, "a.b", 1);
    tinfo(b, "w", 2, ne_8_2, DT_F32, 0);
    bb_pad(b, 32);
    bb_zeros(b, 64);
}

static void bad_magic(bb_t *b) { valid_one_tensor(b); memcpy(b->p, "GGUX", 4); }
static void bad_v1(bb_t *b) { valid_one_tensor(b); b->p[4] = 1; }
static void bad_v4(bb_t *b) { valid_one_tensor(b); b->p[4] = 4; }
static void bad_vswap(bb_t *b) { valid_one_tensor(b); b->p[4] = 0; b->p[7] = 3; }
static void bad_empty(bb_t *b) { (void)b; }
static void bad_short_hdr(bb_t *b) { valid_one_tensor(b); b->len = 13; }
static void bad_huge_kv(bb_t *b) { hdr(b, 3, 0, UINT64_MAX); kv_u32(b, "a.b", 1); }
static void bad_huge_nt(bb_t *b) { hdr(b, 3, 1ull << 40, 0); bb_zeros(b, 100); }
static void bad_counts_sum(bb_t *b) { hdr(b, 3, 3, 5); bb_zeros(b, 120); }
static void bad_huge_key(bb_t *b) { hdr(b, 3, 0, 1); bb_u64(b, 1ull << 62); bb_raw(b, "abc", 3); bb_zeros(b, 20); }
static void bad_huge_strval(bb_t *b)
{
    hdr(b, 3, 0, 1);
    bb_str(b, "k");
    bb_u32(b, GGUF_STRING);
    bb_u64(b, UINT64_MAX);
    bb_zeros(b, 16);
}
static void bad_huge_arr(bb_t *b)
{
    hdr(b, 3, 0, 1);
    bb_str(b, "k");
    bb_u32(b, GGUF_ARRAY);
    bb_u32(b, GGUF_UINT64);
    bb_u64(b, 1ull << 61);
    bb_zeros(b, 64);
}
static void bad_huge_strarr(bb_t *b)
{
    hdr(b, 3, 0, 1);
    bb_str(b, "k");
    bb_u32(b, GGUF_ARRAY);
    bb_u32(b, GGUF_STRING);
    bb_u64(b, 1000000);
    bb_zeros(b, 64);
}
static void bad_arr_str_elem(bb_t *b)
{
    hdr(b, 3, 0, 1);
    bb_str(b, "k");
    bb_u32(b, GGUF_ARRAY);
    bb_u32(b, GGUF_STRING);
    bb_u64(b, 3);
    bb_str(b, "ok");
    bb_u64(b, 1000); /* element 1 too long */
    bb_zeros(b, 16);
}
static void bad_vtype(bb_t *b) { hdr(b, 3, 0, 1); bb_str(b, "k"); bb_u32(b, 13); bb_zeros(b, 8); }
static void bad_etype(bb_t *b)
{
    hdr(b, 3, 0, 1);
    bb_str(b, "k");
    bb_u32(b, GGUF_ARRAY);
    bb_u32(b, 77);
    bb_u64(b, 0);
}
static void bad_bool(bb_t *b) { hdr(b, 3, 0, 1); bb_str(b, "k"); bb_u32(b, GGUF_BOOL); bb_u8(b, 2); bb_zeros(b, 4); }
static void bad_bool_arr(bb_t *b)
{
    hdr(b, 3, 0, 1);
    bb_str(b, "k");
    bb_u32(b, GGUF_ARRAY);
    bb_u32(b, GGUF_BOOL);
    bb_u64(b, 3);
    bb_u8(b, 1); bb_u8(b, 0); bb_u8(b, 7);
}
static void nest(bb_t *b, int depth)
{
    bb_u32(b, depth > 1 ? GGUF_ARRAY : GGUF_INT32);
    bb_u64(b, 1);
    if (depth > 1) nest(b, depth - 1);
    else bb_u32(b, 42);
}
static void bad_deep(bb_t *b) { hdr(b, 3, 0, 1); bb_str(b, "k"); bb_u32(b, GGUF_ARRAY); nest(b, 20); }
static void bad_empty_key(bb_t *b) { hdr(b, 3, 0, 1); kv_u32(b, "", 1); }
static void bad_nul_key(bb_t *b) { hdr(b, 3, 0, 1); bb_strn(b, "a\0b", 3); bb_u32(b, GGUF_UINT32); bb_u32(b, 1); }
static void bad_dup_key(bb_t *b)
{
    hdr(b, 3, 0, 3);
    kv_u32(b, "x.y", 1);
    kv_u32(b, "a.b", 1);
    kv_u32(b, "x.y", 2);
}
static void bad_align3(bb_t *b) { hdr(b, 3, 0, 1); kv_u32(b, "general.alignment", 3); }
static void bad_align0(bb_t *b) { hdr(b, 3, 0, 1); kv_u32(b, "general.alignment", 0); }
static void bad_align_type(bb_t *b)
{
    hdr(b, 3, 0, 1);
    bb_str(b, "general.alignment");
    bb_u32(b, GGUF_UINT64);
    bb_u64(b, 64);
}
static void one_tinfo(bb_t *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t off, size_t data)
{
    hdr(b, 3, 1, 0);
    tinfo(b, name, n_dims, ne, type, off);
    bb_pad(b, 32);
    bb_zeros(b, data);
}
static void bad_ndims0(bb_t *b) { one_tinfo(b, "w", 0, ne_8_2, DT_F32, 0, 64); }
static void bad_ndims5(bb_t *b) { one_tinfo(b, "w", 5, (const uint64_t[]){1, 1, 1, 1, 1}, DT_F32, 0, 64); }
static void bad_neg_ne(bb_t *b) { one_tinfo(b, "w", 2, (const uint64_t[]){8, (uint64_t)-1}, DT_F32, 0, 64); }
static void bad_ovf_ne(bb_t *b) { one_tinfo(b, "w", 3, (const uint64_t[]){1ull << 32, 1ull << 30, 4}, DT_F32, 0, 64); }
static void bad_ovf_bytes(bb_t *b) { one_tinfo(b, "w", 2, (const uint64_t[]){1ull << 40, 1ull << 22}, DT_F32, 0, 64); }
static void bad_type4(bb_t *b) { one_tinfo(b, "w", 2, ne_8_2, 4, 0, 64); }
static void bad_type99(bb_t *b) { one_tinfo(b, "w", 2, ne_8_2, 99, 0, 64); }
static void bad_block(bb_t *b) { one_tinfo(b, "w", 2, (const uint64_t[]){31, 2}, DT_Q8_0, 0, 128); }
static void bad_misaligned(bb_t *b) { one_tinfo(b, "w", 2, ne_8_2, DT_F32, 4, 128); }
static void bad_past_eof(bb_t *b) { one_tinfo(b, "w", 2, ne_8_2, DT_F32, 0, 63); }
static void bad_past_eof_off(bb_t *b) { one_tinfo(b, "w", 2, ne_8_2, DT_F32, 1ull << 62, 64); }
static void bad_empty_name(bb_t *b) { one_tinfo(b, "", 2, ne_8_2, DT_F32, 0, 64); }
static void two_tensors(bb_t *b, const char *n2, uint64_t off2, size_t data)
{
    hdr(b, 3, 2, 0);
    tinfo(b, "w", 2, ne_8_2, DT_F32, 0);
    tinfo(b, n2, 2, ne_8_2, DT_F32, off2);
    bb_pad(b, 32);
    bb_zeros(b, data);
}
static void bad_overlap(bb_t *b) { two_tensors(b, "v", 32, 128); }
static void bad_dup_name(bb_t *b) { two_tensors(b, "w", 64, 128); }
static void bad_trunc_tinfo(bb_t *b)
{
    one_tinfo(b, "blk.0.attn_q.weight", 2, ne_8_2, DT_F32, 0, 64);
    b->len = 24 + 8 + 19 + 4 + 8 + 3; /* 3 bytes of ne[1] */
}

typedef struct {
    const char *what;
    void (*build)(bb_t *);
    const char *expect; /* substring of the error */
} bad_case_t;

static const bad_case_t bad_cases[] = {
    {"bad magic", bad_magic, "gguf: header: bad magic 'GGUX' (expected 'GGUF') at offset 0"},
    {"v1", bad_v1, "GGUF version 1 is not supported (only versions 2 and 3) at offset 4"},
    {"v4", bad_v4, "unsupported GGUF version 4"},
    {"byte-swapped", bad_vswap, "byte-swapped"},
    {"empty file", bad_empty, "gguf: truncated at offset 0 while reading header magic"},
    {"short header", bad_short_hdr, "truncated at offset 8 while reading header tensor count"},
    {"huge kv count", bad_huge_kv, "kv count 18446744073709551615 cannot fit"},
    {"huge tensor count", bad_huge_nt, "tensor count 1099511627776 cannot fit"},
    {"counts sum", bad_counts_sum, "3 tensor infos cannot fit"},
    {"huge key length", bad_huge_key, "kv 0: key: string length 4611686018427387904 exceeds the"},
    {"huge string value", bad_huge_strval, "kv 0 'k': string value: string length 18446744073709551615"},
    {"huge array", bad_huge_arr, "array of 2305843009213693952 u64 elements cannot fit"},
    {"huge string array", bad_huge_strarr, "array of 1000000 string elements cannot fit"},
    {"string array element", bad_arr_str_elem, "array string (element 1): string length 1000 exceeds"},
    {"unknown value type", bad_vtype, "kv 0 'k': unknown value type 13 at offset 33"},
    {"unknown element type", bad_etype, "unknown array element type 77"},
    {"bool value", bad_bool, "bool value 2 is not 0 or 1"},
    {"bool array", bad_bool_arr, "bool array element 2 is 7"},
    {"nested too deep", bad_deep, "arrays nested more than 8 deep"},
    {"empty key", bad_empty_key, "kv 0: empty key at offset 24"},
    {"NUL in key", bad_nul_key, "key contains a NUL byte"},
    {"duplicate key", bad_dup_key, "duplicate key 'x.y' (kv 0 and kv 2)"},
    {"alignment 3", bad_align3, "general.alignment 3 is not a power of two"},
    {"alignment 0", bad_align0, "general.alignment 0 is not a power of two"},
    {"alignment type", bad_align_type, "general.alignment has type u64, expected u32"},
    {"n_dims 0", bad_ndims0, "tensor info 0 'w': n_dims 0 not in 1..4 at offset 33"},
    {"n_dims 5", bad_ndims5, "n_dims 5 not in 1..4"},
    {"negative ne", bad_neg_ne, "ne[1] = 18446744073709551615 is negative as int64"},
    {"overflowing ne", bad_ovf_ne, "element count overflows int64 at ne[2] = 4"},
    {"overflowing bytes", bad_ovf_bytes, "byte size overflows"},
    {"removed type 4", bad_type4, "unknown tensor type 4"},
    {"unknown type 99", bad_type99, "unknown tensor type 99"},
    {"partial block", bad_block, "ne[0] = 31 is not a multiple of the q8_0 block size 32"},
    {"misaligned offset", bad_misaligned, "data offset 4 is not a multiple of the alignment 32"},
    {"data past EOF", bad_past_eof, "tensor 0 'w' data [0, +64) runs past the end of the file (159 bytes, data section at 96) at offset 57"},
    {"offset past EOF", bad_past_eof_off, "runs past the end of the file"},
    {"empty tensor name", bad_empty_name, "empty tensor name"},
    {"overlap", bad_overlap, "data of tensors 'w' and 'v' overlap"},
    {"duplicate tensor", bad_dup_name, "duplicate tensor name 'w' (tensor 0 and 1)"},
    {"truncated tensor info", bad_trunc_tinfo,
     "gguf: truncated at offset 63 while reading tensor info 0 'blk.0.attn_q.weight' ne (needs 8 "
     "bytes, 3 left)"},
};

static void test_bad_files(void)
{
    /* The base of most cases must itself be valid. */
    bb_t v = {0};
    char err[512];
    valid_one_tensor(&v);
    gguf_t *g = gguf_open_mem(v.p, v.len, err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    gguf_close(g);
    free(v.p);
    /* Arrays nested within the limit are accepted. */
    bb_t b = {0};
    hdr(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, GGUF_ARRAY);
    nest(&b, 3);
    g = gguf_open_mem(b.p, b.len, err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    int et;
    uint64_t n;
    char buf[64];
    CHECK(g && gguf_get_arr(g, "k", &et, &n) == 0 && et == GGUF_ARRAY && n == 1);
    CHECK(g && gguf_get_arr_data(g, "k") == NULL);
    gguf_kv_format(g, 0, buf, sizeof buf);
    CHECKF(strcmp(buf, "[array; 1]") == 0, "%s", buf);
    gguf_close(g);
    free(b.p);
    /* A file of just a header (no kvs, no tensors) is valid; v2 too. */
    b = (bb_t){0};
    hdr(&b, 2, 0, 0);
    g = gguf_open_mem(b.p, b.len, err, sizeof err);
    CHECKF(g && gguf_version(g) == 2 && gguf_n_kv(g) == 0 && gguf_n_tensors(g) == 0, "%s", err);
    gguf_close(g);
    free(b.p);

    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case_t *c = &bad_cases[i];
        b = (bb_t){0};
        c->build(&b);
        /* An exact-size heap copy, so ASan sees any over-read. */
        uint8_t *copy = malloc(b.len ? b.len : 1);
        if (b.len) memcpy(copy, b.p, b.len);
        err[0] = '\0';
        g = gguf_open_mem(copy, b.len, err, sizeof err);
        CHECKF(g == NULL, "%s: accepted", c->what);
        CHECKF(strstr(err, c->expect) != NULL, "%s: got \"%s\", want \"%s\"", c->what, err, c->expect);
        gguf_close(g);
        /* A tiny error buffer is safe and still NUL-terminated. */
        char small[8] = "xxxxxxx";
        g = gguf_open_mem(copy, b.len, small, sizeof small);
        CHECK(g == NULL && strlen(small) == 7 && memcmp(small, "gguf: ", 6) == 0);
        g = gguf_open_mem(copy, b.len, NULL, 0);
        CHECK(g == NULL);
        free(copy);
        free(b.p);
    }
    /* Missing and non-regular files. */
    g = gguf_open("/nonexistent/x.gguf", err, sizeof err);
    CHECKF(g == NULL && strstr(err, "cannot open '/nonexistent/x.gguf'"), "%s", err);
    g = gguf_open(tmpdir, err, sizeof err);
    CHECKF(g == NULL && strstr(err, "is not a regular file"), "%s", err);
    /* NULL handle accessors. */
    CHECK(gguf_n_kv(NULL) == 0 && gguf_n_tensors(NULL) == 0 && gguf_find_key(NULL, "a") == -1);
    CHECK(gguf_find_tensor(NULL, "a") == NULL && gguf_version(NULL) == 0);
    gguf_close(NULL);
}

/* ---------------------------------------------------------------- 4. prefixes and mutations */

static void test_prefixes_and_mutations(void)
{
    fill_ctx_t fc = {3, 4};
    gguf_writer_t *w = make_rt_writer(32, &fc);
    char path[128], err[512];
    path_in_tmp(path, sizeof path, "small.gguf");
    CHECKF(gguf_writer_write(w, path) == 0, "%s", gguf_writer_errstr(w));
    gguf_writer_free(w);
    size_t len = 0;
    uint8_t *file = read_file(path, &len);
    unlink(path);
    CHECK(file != NULL && len > 500 && len < 8192);
    if (!file) return;
    gguf_t *g = gguf_open_mem(file, len, err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (!g) {
        free(file);
        return;
    }
    uint64_t data_end = 0; /* end of the last tensor's bytes */
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        uint64_t e = (uint64_t)((const uint8_t *)t->data - file) + t->nbytes;
        if (e > data_end) data_end = e;
    }
    gguf_close(g);

    int bad_prefix = 0;
    for (size_t l = 0; l < len; l++) {
        uint8_t *p = malloc(l ? l : 1);
        memcpy(p, file, l);
        err[0] = '\0';
        g = gguf_open_mem(p, l, err, sizeof err);
        if (g) {
            if (l < data_end) bad_prefix++;
            exercise(g);
            gguf_close(g);
        } else if (strncmp(err, "gguf: ", 6) != 0) {
            bad_prefix++;
        }
        free(p);
    }
    CHECKF(bad_prefix == 0, "%d prefixes misbehaved", bad_prefix);

    uint64_t seed = 12345, accepted = 0, sum = 0;
    uint8_t *m = malloc(len);
    const int iters = 30000;
    for (int it = 0; it < iters; it++) {
        memcpy(m, file, len);
        int nmut = 1 + (int)(rng_next(&seed) % 4);
        for (int k = 0; k < nmut; k++) {
            uint64_t r = rng_next(&seed);
            size_t pos = (size_t)(r % len);
            switch ((r >> 32) % 4) {
            case 0: m[pos] ^= (uint8_t)(1u << ((r >> 40) % 8)); break;
            case 1: m[pos] = (uint8_t)(r >> 48); break;
            case 2: m[pos] = 0xff; break;
            default: m[pos] = 0; break;
            }
        }
        size_t l = (rng_next(&seed) % 8 == 0) ? (size_t)(rng_next(&seed) % len) : len;
        uint8_t *p = malloc(l ? l : 1);
        memcpy(p, m, l);
        g = gguf_open_mem(p, l, err, sizeof err);
        if (g) {
            accepted++;
            sum += exercise(g);
            gguf_close(g);
        } else {
            CHECKF(strncmp(err, "gguf: ", 6) == 0, "%s", err);
        }
        free(p);
    }
    fprintf(stderr, "mutations: %d tried, %" PRIu64 " accepted (checksum %" PRIu64 ")\n", iters,
            accepted, sum);
    CHECK(accepted > 0 && accepted < (uint64_t)iters);
    free(m);
    free(file);
}

/* ---------------------------------------------------------------- 5. writer errors */

static void test_writer_errors(void)
{
    gguf_writer_t *w = gguf_writer_new();
    CHECK(gguf_writer_add_u32(w, "k", 1) == 0);
    CHECK(gguf_writer_add_u32(w, "k", 2) == -1 && strstr(gguf_writer_errstr(w), "duplicate key 'k'"));
    CHECK(gguf_writer_add_str(w, "", "x") == -1 && strstr(gguf_writer_errstr(w), "empty key"));
    CHECK(gguf_writer_set_alignment(w, 48) == -1 && strstr(gguf_writer_errstr(w), "power of two"));
    CHECK(gguf_writer_add_str(w, "general.alignment", "x") == -1);
    CHECK(gguf_writer_add_scalar(w, "s", GGUF_STRING, "x") == -1);
    CHECK(gguf_writer_add_scalar(w, "b", GGUF_BOOL, &(uint8_t){2}) == -1);
    CHECK(gguf_writer_add_arr(w, "a", GGUF_ARRAY, "x", 1) == -1);
    CHECK(gguf_writer_add_arr(w, "a", GGUF_BOOL, (uint8_t[]){0, 3}, 2) == -1);
    float d[64] = {0};
    CHECK(gguf_writer_add_tensor(w, "t", DT_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, d) == -1 &&
          strstr(gguf_writer_errstr(w), "n_dims 5"));
    CHECK(gguf_writer_add_tensor(w, "t", 4, 1, (int64_t[]){8}, d) == -1 &&
          strstr(gguf_writer_errstr(w), "unknown type 4"));
    CHECK(gguf_writer_add_tensor(w, "t", DT_Q8_0, 1, (int64_t[]){16}, d) == -1 &&
          strstr(gguf_writer_errstr(w), "not a multiple"));
    CHECK(gguf_writer_add_tensor(w, "t", DT_F32, 1, (int64_t[]){-1}, d) == -1);
    CHECK(gguf_writer_add_tensor(w, "t", DT_F32, 1, (int64_t[]){8}, NULL) == -1);
    CHECK(gguf_writer_add_tensor(w, "t", DT_F32, 2, (int64_t[]){8, 2}, d) == 0);
    CHECK(gguf_writer_add_tensor(w, "t", DT_F32, 1, (int64_t[]){8}, d) == -1 &&
          strstr(gguf_writer_errstr(w), "duplicate tensor name 't'"));
    CHECK(gguf_writer_add_tensor_stream(w, "s", DT_F32, 2, (int64_t[]){4, 5}, fill_fail, NULL) == 0);
    /* The earlier failures left nothing behind; the fill failure aborts the write cleanly. */
    char path[128];
    path_in_tmp(path, sizeof path, "fail.gguf");
    CHECK(gguf_writer_write(w, path) == -1 && strstr(gguf_writer_errstr(w), "fill callback failed at row 2"));
    CHECK(access(path, F_OK) != 0);
    CHECK(gguf_writer_write(w, "/nonexistent-dir/x.gguf") == -1 &&
          strstr(gguf_writer_errstr(w), "cannot create a temp file"));
    gguf_writer_free(w);

    /* Explicit general.alignment kv sets the alignment; an existing file is replaced whole. */
    w = gguf_writer_new();
    CHECK(gguf_writer_add_u32(w, "general.alignment", 128) == 0);
    CHECK(gguf_writer_add_tensor(w, "a", DT_F32, 1, (int64_t[]){3}, d) == 0);
    CHECK(gguf_writer_add_tensor(w, "b", DT_F32, 1, (int64_t[]){3}, d) == 0);
    path_in_tmp(path, sizeof path, "al.gguf");
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs("old contents", f);
        fclose(f);
    }
    CHECKF(gguf_writer_write(w, path) == 0, "%s", gguf_writer_errstr(w));
    gguf_writer_free(w);
    char err[256];
    gguf_t *g = gguf_open(path, err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    CHECK(g && gguf_alignment(g) == 128 && gguf_find_tensor(g, "b")->offset == 128);
    gguf_close(g);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size % 128 == 0);
    unlink(path);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "test_gguf.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_stories();
    test_vocab_files();
    test_bad_files();
    test_prefixes_and_mutations();
    test_writer_errors();
    if (rmdir(tmpdir) != 0) {
        fprintf(stderr, "temp dir %s not empty (leftover temp files?)\n", tmpdir);
        check_failures_++;
    }
    return check_exit();
}
