/* tools/gguf_write.c: GGUF v3 writer (see gguf_write.h for the contract).
 *
 * Each kv's value is serialised into a byte blob when it is added; tensors keep either a copy of
 * their data or a row callback. gguf_writer_write lays out kvs, tensor infos, padding, then each
 * tensor's data at an offset aligned to the alignment (zero padding between and after), into a
 * temp file in the target's folder that is fsync'ed and renamed over the target. A writer is
 * used by one thread at a time. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/dtype.h"
#include "engine/gguf.h"
#include "tools/gguf_write.h"

#define W_DEFAULT_ALIGNMENT 32u
#define W_MAX_KEY_LEN 65535u  /* as the reader */
#define W_MAX_NAME_LEN 1024u  /* as the reader */
#define W_ALIGN_KEY "general.alignment"

typedef struct {
    char *key;          /* owned */
    int type;           /* enum gguf_type */
    uint8_t *blob;      /* serialised value (after the type field), owned */
    size_t len;
} wkv_t;

typedef struct {
    char *name;         /* owned */
    int type;           /* enum dtype */
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t row_bytes, rows, nbytes;
    uint64_t offset;    /* assigned at write */
    uint8_t *data;      /* [nbytes] owned copy, or NULL when streamed */
    gguf_row_fill_fn fill;
    void *user;         /* borrowed */
} wtensor_t;

struct gguf_writer {
    uint32_t alignment;
    wkv_t *kv;
    size_t n_kv, cap_kv;
    wtensor_t *t;
    size_t n_t, cap_t;
    char errstr[256];
};

static int w_fail(gguf_writer_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int w_fail(gguf_writer_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->errstr, sizeof w->errstr, fmt, ap);
    va_end(ap);
    return -1;
}

gguf_writer_t *gguf_writer_new(void)
{
    gguf_writer_t *w = calloc(1, sizeof *w);
    if (w) w->alignment = W_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_free(gguf_writer_t *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].blob);
    }
    free(w->kv);
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w);
}

const char *gguf_writer_errstr(const gguf_writer_t *w)
{
    return w ? w->errstr : "gguf writer: NULL writer";
}

static void put_le(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Little-endian bytes of the host object v of scalar type t into p. */
static void put_scalar(uint8_t *p, int t, const void *v)
{
    size_t n = gguf_type_size(t);
    uint64_t x = 0;
    switch (n) {
    case 1: { uint8_t u; memcpy(&u, v, 1); x = u; break; }
    case 2: { uint16_t u; memcpy(&u, v, 2); x = u; break; }
    case 4: { uint32_t u; memcpy(&u, v, 4); x = u; break; }
    default: memcpy(&x, v, 8); break;
    }
    put_le(p, x, n);
}

static int find_kv(const gguf_writer_t *w, const char *key)
{
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return (int)i;
    return -1;
}

/* Checks key, then appends a kv taking ownership of blob (freed on failure too). */
static int add_kv(gguf_writer_t *w, const char *key, int type, uint8_t *blob, size_t len)
{
    if (!key || !key[0]) { free(blob); return w_fail(w, "gguf writer: empty key"); }
    if (strlen(key) > W_MAX_KEY_LEN) {
        free(blob);
        return w_fail(w, "gguf writer: key longer than %u bytes", W_MAX_KEY_LEN);
    }
    if (find_kv(w, key) >= 0) {
        free(blob);
        return w_fail(w, "gguf writer: duplicate key '%s'", key);
    }
    if (w->n_kv == w->cap_kv) {
        size_t nc = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv_t *p = realloc(w->kv, nc * sizeof *p);
        if (!p) { free(blob); return w_fail(w, "gguf writer: out of memory"); }
        w->kv = p;
        w->cap_kv = nc;
    }
    char *k = strdup(key);
    if (!k) { free(blob); return w_fail(w, "gguf writer: out of memory"); }
    w->kv[w->n_kv++] = (wkv_t){k, type, blob, len};
    return 0;
}

int gguf_writer_set_alignment(gguf_writer_t *w, uint32_t alignment)
{
    if (alignment == 0 || (alignment & (alignment - 1)))
        return w_fail(w, "gguf writer: alignment %" PRIu32 " is not a power of two", alignment);
    w->alignment = alignment;
    return 0;
}

int gguf_writer_add_scalar(gguf_writer_t *w, const char *key, int type, const void *value)
{
    size_t n = gguf_type_size(type);
    if (n == 0) return w_fail(w, "gguf writer: '%s': type %d is not a fixed-size scalar", key ? key : "", type);
    if (!value) return w_fail(w, "gguf writer: '%s': NULL value", key ? key : "");
    if (type == GGUF_BOOL && *(const uint8_t *)value > 1)
        return w_fail(w, "gguf writer: '%s': bool value must be 0 or 1", key ? key : "");
    if (key && strcmp(key, W_ALIGN_KEY) == 0) {
        /* Stored as a kv and also sets the data alignment (the reader requires u32). */
        if (type != GGUF_UINT32) return w_fail(w, "gguf writer: " W_ALIGN_KEY " must be u32");
        uint32_t a;
        memcpy(&a, value, 4);
        if (find_kv(w, key) < 0 && gguf_writer_set_alignment(w, a)) return -1;
    }
    uint8_t *blob = malloc(n);
    if (!blob) return w_fail(w, "gguf writer: out of memory");
    put_scalar(blob, type, value);
    return add_kv(w, key, type, blob, n);
}

int gguf_writer_copy_kv(gguf_writer_t *w, const gguf_t *g, int64_t i)
{
    const char *k = gguf_kv_key(g, i);
    const int t = gguf_kv_type(g, i);
    int64_t iv;
    float fv;
    int bv;
    gguf_str_t sv;
    if (t == GGUF_STRING) {
        if (gguf_get_str(g, k, &sv)) goto unreadable;
        char *tmp = malloc(sv.len + 1);
        if (!tmp) return w_fail(w, "gguf writer: out of memory");
        memcpy(tmp, sv.ptr, sv.len);
        tmp[sv.len] = 0;
        int rc = gguf_writer_add_str(w, k, tmp);
        free(tmp);
        return rc;
    }
    if (t == GGUF_ARRAY) {
        int et;
        uint64_t n;
        if (gguf_get_arr(g, k, &et, &n)) goto unreadable;
        if (et == GGUF_ARRAY) return w_fail(w, "gguf writer: '%s': arrays of arrays are not copied", k);
        if (et != GGUF_STRING) return gguf_writer_add_arr(w, k, et, gguf_get_arr_data(g, k), n);
        const char **strs = calloc(n + 1, sizeof *strs);
        uint64_t *lens = calloc(n + 1, sizeof *lens);
        int rc = strs && lens ? 0 : w_fail(w, "gguf writer: out of memory");
        for (uint64_t j = 0; j < n && rc == 0; j++) {
            if (gguf_get_arr_str(g, k, j, &sv)) rc = w_fail(w, "gguf writer: '%s'[%" PRIu64 "]: "
                                                            "cannot be read", k, j);
            strs[j] = sv.ptr;
            lens[j] = sv.len;
        }
        if (rc == 0) rc = gguf_writer_add_arr_str(w, k, strs, lens, n);
        free(strs);
        free(lens);
        return rc;
    }
    if (t == GGUF_FLOAT32 || t == GGUF_FLOAT64) {
        if (gguf_get_f32(g, k, &fv)) goto unreadable;
        double dv = fv;
        return gguf_writer_add_scalar(w, k, t, t == GGUF_FLOAT32 ? (void *)&fv : (void *)&dv);
    }
    if (t == GGUF_BOOL) {
        if (gguf_get_bool(g, k, &bv)) goto unreadable;
        uint8_t b8 = (uint8_t)bv;
        return gguf_writer_add_scalar(w, k, t, &b8);
    }
    if (gguf_get_i64(g, k, &iv)) goto unreadable;
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } u;
    switch (t) {
    case GGUF_UINT8: u.u8 = (uint8_t)iv; break;
    case GGUF_INT8: u.i8 = (int8_t)iv; break;
    case GGUF_UINT16: u.u16 = (uint16_t)iv; break;
    case GGUF_INT16: u.i16 = (int16_t)iv; break;
    case GGUF_UINT32: u.u32 = (uint32_t)iv; break;
    case GGUF_INT32: u.i32 = (int32_t)iv; break;
    case GGUF_UINT64: u.u64 = (uint64_t)iv; break;
    default: u.i64 = iv; break;
    }
    return gguf_writer_add_scalar(w, k, t, &u);
unreadable:
    return w_fail(w, "gguf writer: '%s' (type %d) cannot be read", k ? k : "", t);
}

int gguf_writer_add_u32(gguf_writer_t *w, const char *key, uint32_t v)
{
    return gguf_writer_add_scalar(w, key, GGUF_UINT32, &v);
}

int gguf_writer_add_i32(gguf_writer_t *w, const char *key, int32_t v)
{
    return gguf_writer_add_scalar(w, key, GGUF_INT32, &v);
}

int gguf_writer_add_u64(gguf_writer_t *w, const char *key, uint64_t v)
{
    return gguf_writer_add_scalar(w, key, GGUF_UINT64, &v);
}

int gguf_writer_add_f32(gguf_writer_t *w, const char *key, float v)
{
    return gguf_writer_add_scalar(w, key, GGUF_FLOAT32, &v);
}

int gguf_writer_add_bool(gguf_writer_t *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return gguf_writer_add_scalar(w, key, GGUF_BOOL, &b);
}

int gguf_writer_add_str(gguf_writer_t *w, const char *key, const char *v)
{
    if (!v) return w_fail(w, "gguf writer: '%s': NULL string", key ? key : "");
    if (key && strcmp(key, W_ALIGN_KEY) == 0) return w_fail(w, "gguf writer: " W_ALIGN_KEY " must be u32");
    size_t n = strlen(v);
    uint8_t *blob = malloc(8 + n);
    if (!blob) return w_fail(w, "gguf writer: out of memory");
    put_le(blob, n, 8);
    memcpy(blob + 8, v, n);
    return add_kv(w, key, GGUF_STRING, blob, 8 + n);
}

int gguf_writer_add_arr(gguf_writer_t *w, const char *key, int elem_type, const void *data, uint64_t n)
{
    size_t es = gguf_type_size(elem_type);
    if (es == 0)
        return w_fail(w, "gguf writer: '%s': array element type %d is not a fixed-size scalar",
                      key ? key : "", elem_type);
    if (key && strcmp(key, W_ALIGN_KEY) == 0) return w_fail(w, "gguf writer: " W_ALIGN_KEY " must be u32");
    if (n && !data) return w_fail(w, "gguf writer: '%s': NULL array data", key ? key : "");
    if (n > (SIZE_MAX - 12) / es) return w_fail(w, "gguf writer: '%s': array too large", key ? key : "");
    size_t len = 12 + (size_t)n * es;
    uint8_t *blob = malloc(len);
    if (!blob) return w_fail(w, "gguf writer: out of memory");
    put_le(blob, (uint32_t)elem_type, 4);
    put_le(blob + 4, n, 8);
    const uint8_t *src = data;
    for (uint64_t i = 0; i < n; i++) {
        if (elem_type == GGUF_BOOL && src[i] > 1) {
            free(blob);
            return w_fail(w, "gguf writer: '%s': bool array element %" PRIu64 " is not 0 or 1",
                          key ? key : "", i);
        }
        put_scalar(blob + 12 + i * es, elem_type, src + i * es);
    }
    return add_kv(w, key, GGUF_ARRAY, blob, len);
}

int gguf_writer_add_arr_str(gguf_writer_t *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n)
{
    if (key && strcmp(key, W_ALIGN_KEY) == 0) return w_fail(w, "gguf writer: " W_ALIGN_KEY " must be u32");
    if (n && !strs) return w_fail(w, "gguf writer: '%s': NULL string array", key ? key : "");
    size_t len = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) return w_fail(w, "gguf writer: '%s': NULL string %" PRIu64, key ? key : "", i);
        uint64_t l = lens ? lens[i] : strlen(strs[i]);
        if (l > SIZE_MAX - 8 - len) return w_fail(w, "gguf writer: '%s': array too large", key ? key : "");
        len += 8 + (size_t)l;
    }
    uint8_t *blob = malloc(len);
    if (!blob) return w_fail(w, "gguf writer: out of memory");
    put_le(blob, GGUF_STRING, 4);
    put_le(blob + 4, n, 8);
    size_t o = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t l = lens ? (size_t)lens[i] : strlen(strs[i]);
        put_le(blob + o, l, 8);
        memcpy(blob + o + 8, strs[i], l);
        o += 8 + l;
    }
    return add_kv(w, key, GGUF_ARRAY, blob, len);
}

/* Validates a tensor's name and shape, appends it (data NULL, no callback) and returns it. */
static wtensor_t *add_tensor_common(gguf_writer_t *w, const char *name, int type, int n_dims,
                                    const int64_t *ne)
{
    if (!name || !name[0]) { w_fail(w, "gguf writer: empty tensor name"); return NULL; }
    if (strlen(name) > W_MAX_NAME_LEN) {
        w_fail(w, "gguf writer: tensor name longer than %u bytes", W_MAX_NAME_LEN);
        return NULL;
    }
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) {
            w_fail(w, "gguf writer: duplicate tensor name '%s'", name);
            return NULL;
        }
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne) {
        w_fail(w, "gguf writer: tensor '%s': n_dims %d not in 1..%d", name, n_dims, GGUF_MAX_DIMS);
        return NULL;
    }
    int be = dtype_ggml_block_elems(type);
    if (be == 0) { w_fail(w, "gguf writer: tensor '%s': unknown type %d", name, type); return NULL; }
    wtensor_t t = {.type = type, .n_dims = n_dims};
    int64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0 || (t.ne[d] && nel > INT64_MAX / t.ne[d])) {
            w_fail(w, "gguf writer: tensor '%s': bad shape", name);
            return NULL;
        }
        nel *= t.ne[d];
    }
    if (t.ne[0] % be) {
        w_fail(w, "gguf writer: tensor '%s': ne[0] %" PRId64 " not a multiple of the %s block %d",
               name, t.ne[0], dtype_name(type), be);
        return NULL;
    }
    t.row_bytes = (uint64_t)(t.ne[0] / be) * dtype_ggml_block_bytes(type);
    t.rows = 1;
    for (int d = 1; d < GGUF_MAX_DIMS; d++) {
        if (t.ne[d] && t.rows > (uint64_t)INT64_MAX / (uint64_t)t.ne[d]) {
            w_fail(w, "gguf writer: tensor '%s': bad shape", name);
            return NULL;
        }
        t.rows *= (uint64_t)t.ne[d];
    }
    if (t.rows && t.row_bytes > (uint64_t)INT64_MAX / t.rows) {
        w_fail(w, "gguf writer: tensor '%s': too large", name);
        return NULL;
    }
    t.nbytes = t.row_bytes * t.rows;
    if (w->n_t == w->cap_t) {
        size_t nc = w->cap_t ? w->cap_t * 2 : 64;
        wtensor_t *p = realloc(w->t, nc * sizeof *p);
        if (!p) { w_fail(w, "gguf writer: out of memory"); return NULL; }
        w->t = p;
        w->cap_t = nc;
    }
    t.name = strdup(name);
    if (!t.name) { w_fail(w, "gguf writer: out of memory"); return NULL; }
    w->t[w->n_t] = t;
    return &w->t[w->n_t++];
}

int gguf_writer_add_tensor(gguf_writer_t *w, const char *name, int type, int n_dims,
                           const int64_t *ne, const void *data)
{
    wtensor_t *t = add_tensor_common(w, name, type, n_dims, ne);
    if (!t) return -1;
    if (t->nbytes) {
        if (!data || t->nbytes > SIZE_MAX || !(t->data = malloc((size_t)t->nbytes))) {
            free(t->name);
            w->n_t--;
            return w_fail(w, data ? "gguf writer: tensor '%s': out of memory"
                                  : "gguf writer: tensor '%s': NULL data", name);
        }
        memcpy(t->data, data, (size_t)t->nbytes);
    }
    return 0;
}

int gguf_writer_add_tensor_stream(gguf_writer_t *w, const char *name, int type, int n_dims,
                                  const int64_t *ne, gguf_row_fill_fn fill, void *user)
{
    if (!fill) return w_fail(w, "gguf writer: tensor '%s': NULL fill callback", name ? name : "");
    wtensor_t *t = add_tensor_common(w, name, type, n_dims, ne);
    if (!t) return -1;
    t->fill = fill;
    t->user = user;
    return 0;
}

/* ---------------------------------------------------------------- output */

typedef struct {
    FILE *f;
    uint64_t pos;
    int err;
} out_t;

static void out_bytes(out_t *o, const void *p, size_t n)
{
    if (o->err || n == 0) return;
    if (fwrite(p, 1, n, o->f) != n) o->err = errno ? errno : EIO;
    o->pos += n;
}

static void out_le(out_t *o, uint64_t v, size_t n)
{
    uint8_t b[8];
    put_le(b, v, n);
    out_bytes(o, b, n);
}

static void out_pad(out_t *o, uint32_t alignment)
{
    static const uint8_t zeros[256];
    uint64_t pad = (alignment - o->pos % alignment) % alignment;
    while (pad > 0 && !o->err) {
        size_t n = pad > sizeof zeros ? sizeof zeros : (size_t)pad;
        out_bytes(o, zeros, n);
        pad -= n;
    }
}

static int write_body(gguf_writer_t *w, out_t *o)
{
    /* general.alignment is recorded whenever it is not the default (or was added explicitly). */
    int ai = find_kv(w, W_ALIGN_KEY);
    if (ai >= 0) put_le(w->kv[ai].blob, w->alignment, 4);
    else if (w->alignment != W_DEFAULT_ALIGNMENT && gguf_writer_add_u32(w, W_ALIGN_KEY, w->alignment))
        return -1;

    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        off += w->t[i].nbytes;
        off = (off + w->alignment - 1) / w->alignment * w->alignment;
    }
    out_bytes(o, "GGUF", 4);
    out_le(o, 3, 4);
    out_le(o, w->n_t, 8);
    out_le(o, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        size_t kl = strlen(w->kv[i].key);
        out_le(o, kl, 8);
        out_bytes(o, w->kv[i].key, kl);
        out_le(o, (uint32_t)w->kv[i].type, 4);
        out_bytes(o, w->kv[i].blob, w->kv[i].len);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor_t *t = &w->t[i];
        size_t nl = strlen(t->name);
        out_le(o, nl, 8);
        out_bytes(o, t->name, nl);
        out_le(o, (uint32_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims; d++) out_le(o, (uint64_t)t->ne[d], 8);
        out_le(o, (uint32_t)t->type, 4);
        out_le(o, t->offset, 8);
    }
    out_pad(o, w->alignment);
    uint64_t data_start = o->pos;
    for (size_t i = 0; i < w->n_t && !o->err; i++) {
        const wtensor_t *t = &w->t[i];
        if (t->fill && t->nbytes) {
            uint8_t *row = malloc((size_t)t->row_bytes);
            if (!row) return w_fail(w, "gguf writer: out of memory");
            for (uint64_t r = 0; r < t->rows && !o->err; r++) {
                if (t->fill(t->user, (int64_t)r, row, (size_t)t->row_bytes) != 0) {
                    free(row);
                    return w_fail(w, "gguf writer: tensor '%s': fill callback failed at row %" PRIu64,
                                  t->name, r);
                }
                out_bytes(o, row, (size_t)t->row_bytes);
            }
            free(row);
        } else {
            out_bytes(o, t->data, (size_t)t->nbytes);
        }
        out_pad(o, w->alignment);
        if (!o->err && o->pos - data_start != (i + 1 < w->n_t ? w->t[i + 1].offset : off))
            return w_fail(w, "gguf writer: internal error: data offset mismatch");
    }
    return 0;
}

int gguf_writer_write(gguf_writer_t *w, const char *path)
{
    if (!w) return -1;
    if (!path || !path[0]) return w_fail(w, "gguf writer: empty path");
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 16);
    if (!tmp) return w_fail(w, "gguf writer: out of memory");
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp.XXXXXX", 12);
    char eb[128];
    int fd = mkstemp(tmp);
    if (fd < 0) {
        w_fail(w, "gguf writer: cannot create a temp file beside '%s': %s", path,
               strerror_r(errno, eb, sizeof eb));
        free(tmp);
        return -1;
    }
    out_t o = {0};
    int rc = -1;
    if (fchmod(fd, 0644) != 0) {
        w_fail(w, "gguf writer: chmod '%s': %s", tmp, strerror_r(errno, eb, sizeof eb));
        close(fd);
        goto fail;
    }
    o.f = fdopen(fd, "wb");
    if (!o.f) {
        w_fail(w, "gguf writer: fdopen '%s': %s", tmp, strerror_r(errno, eb, sizeof eb));
        close(fd);
        goto fail;
    }
    setvbuf(o.f, NULL, _IOFBF, 1 << 20);
    errno = 0;
    if (write_body(w, &o) != 0) goto fail_close;
    if (!o.err && fflush(o.f) != 0) o.err = errno ? errno : EIO;
    if (!o.err && fsync(fileno(o.f)) != 0) o.err = errno ? errno : EIO;
    if (o.err) {
        w_fail(w, "gguf writer: writing '%s': %s", tmp, strerror_r(o.err, eb, sizeof eb));
        goto fail_close;
    }
    if (fclose(o.f) != 0) {
        o.f = NULL;
        w_fail(w, "gguf writer: closing '%s': %s", tmp, strerror_r(errno, eb, sizeof eb));
        goto fail;
    }
    o.f = NULL;
    if (rename(tmp, path) != 0) {
        w_fail(w, "gguf writer: renaming '%s' to '%s': %s", tmp, path,
               strerror_r(errno, eb, sizeof eb));
        goto fail;
    }
    rc = 0;
    free(tmp);
    return rc;
fail_close:
    fclose(o.f);
fail:
    unlink(tmp);
    free(tmp);
    return rc;
}
