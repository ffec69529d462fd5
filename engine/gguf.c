/* engine/gguf.c: GGUF v2/v3 reader (see gguf.h for the contract).
 *
 * File layout (all little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv × { string key, u32 type, value },
 *   n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset },
 *   padding to the alignment, data section (tensor offsets are relative to its start).
 * A string is u64 length + bytes; an array is u32 element type + u64 count + elements.
 *
 * Validation strategy: one forward pass over the bytes with a cursor that never reads past the
 * end; every count is first checked against the bytes left (each element needs at least a known
 * number of bytes), and tables grow only as entries actually parse, so a hostile count cannot
 * cause a large allocation. Keys and tensor names are then sorted (duplicate check, lookup) and
 * tensors sorted by offset (overlap check). */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_KEY_LEN 65535u      /* GGUF spec: keys are at most 2^16 - 1 bytes */
#define GGUF_MAX_NAME_LEN 1024u      /* tensor names (ggml itself allows 63) */
#define GGUF_MAX_ARRAY_DEPTH 8       /* arrays of arrays nested deeper are refused */
#define GGUF_MIN_KV_BYTES 14u        /* key len 8 + key 1 + type 4 + value 1 */
#define GGUF_MIN_TINFO_BYTES 33u     /* name len 8 + name 1 + n_dims 4 + ne 8 + type 4 + offset 8 */

struct gguf_kv {
    char *key;                /* NUL-terminated copy, owned */
    int type;                 /* enum gguf_type */
    const uint8_t *val;       /* scalar: its bytes; string: its u64 length; array: first element */
    int elem_type;            /* arrays only */
    uint64_t n;               /* arrays only: element count */
    const uint8_t **strs;     /* string arrays: [n] pointers to each element's u64 length, owned */
};

struct gguf {
    const uint8_t *base;      /* whole file; mapping owned when mapped */
    size_t size;
    int mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;        /* start of the data section */
    struct gguf_kv *kv;       /* [n_kv] in file order, owned */
    int64_t n_kv;
    gguf_tensor_t *t;         /* [n_t] in file order, owned (names too) */
    int64_t n_t;
    const struct gguf_kv **kv_by_key;   /* [n_kv] sorted by key, owned */
    const gguf_tensor_t **t_by_name;    /* [n_t] sorted by name, owned */
};

/* ---------------------------------------------------------------- byte cursor and errors */

typedef struct {
    const uint8_t *p;
    size_t size;
    size_t pos;
    char *err;
    size_t errlen;
    char item[256]; /* what is being read, for messages: "kv 3 'general.name'" */
} rd_t;

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* Printable rendering of untrusted bytes (at most ~48 shown) into dst. */
static void esc_bytes(char *dst, size_t dstlen, const uint8_t *s, uint64_t len)
{
    size_t o = 0;
    if (dstlen == 0) return;
    for (uint64_t i = 0; i < len && o + 5 < dstlen; i++) {
        if (i == 48) {
            if (o + 4 < dstlen) { memcpy(dst + o, "...", 3); o += 3; }
            break;
        }
        uint8_t c = s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
            dst[o++] = (char)c;
        } else {
            static const char hex[] = "0123456789abcdef";
            dst[o++] = '\\';
            dst[o++] = 'x';
            dst[o++] = hex[c >> 4];
            dst[o++] = hex[c & 15];
        }
    }
    dst[o] = '\0';
}

static int rd_fail(rd_t *r, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "gguf: <item>: <message> at offset <off>". Always returns -1. */
static int rd_fail(rd_t *r, uint64_t off, const char *fmt, ...)
{
    if (r->errlen == 0) return -1;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->errlen, "gguf: %s: %s at offset %" PRIu64, r->item, msg, off);
    return -1;
}

/* Fails with a truncation message unless n bytes are left. idx >= 0 names an array element. */
static int rd_need(rd_t *r, uint64_t n, const char *field, int64_t idx)
{
    if (r->size - r->pos >= n) return 0;
    if (r->errlen) {
        char el[40] = "";
        if (idx >= 0) snprintf(el, sizeof el, " element %" PRId64, idx);
        snprintf(r->err, r->errlen,
                 "gguf: truncated at offset %zu while reading %s %s%s (needs %" PRIu64
                 " bytes, %zu left)",
                 r->pos, r->item, field, el, n, r->size - r->pos);
    }
    return -1;
}

static int rd_u32(rd_t *r, uint32_t *v, const char *field)
{
    if (rd_need(r, 4, field, -1)) return -1;
    *v = le32(r->p + r->pos);
    r->pos += 4;
    return 0;
}

static int rd_u64(rd_t *r, uint64_t *v, const char *field)
{
    if (rd_need(r, 8, field, -1)) return -1;
    *v = le64(r->p + r->pos);
    r->pos += 8;
    return 0;
}

/* Reads a string; *s points at its bytes (in the buffer), *len its length. */
static int rd_str(rd_t *r, const uint8_t **s, uint64_t *len, const char *field, int64_t idx)
{
    size_t at = r->pos;
    if (rd_need(r, 8, field, idx)) return -1;
    uint64_t n = le64(r->p + r->pos);
    r->pos += 8;
    if (n > r->size - r->pos) {
        char el[40] = "";
        if (idx >= 0) snprintf(el, sizeof el, " (element %" PRId64 ")", idx);
        return rd_fail(r, at, "%s%s: string length %" PRIu64 " exceeds the %zu bytes left",
                       field, el, n, r->size - r->pos);
    }
    if (s) *s = r->p + r->pos;
    if (len) *len = n;
    r->pos += n;
    return 0;
}

size_t gguf_type_size(int t)
{
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static const char *const type_names[] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_type_name(int type)
{
    if (type < 0 || type > GGUF_FLOAT64) return "unknown";
    return type_names[type];
}

static int rd_array(rd_t *r, int depth, uint32_t *elem_type, uint64_t *count);

/* Validates and skips one value of type t (already known to be a valid type). */
static int rd_value(rd_t *r, uint32_t t, int depth)
{
    size_t sz = gguf_type_size((int)t);
    if (sz) {
        if (rd_need(r, sz, "value", -1)) return -1;
        if (t == GGUF_BOOL && r->p[r->pos] > 1)
            return rd_fail(r, r->pos, "bool value %u is not 0 or 1", r->p[r->pos]);
        r->pos += sz;
        return 0;
    }
    if (t == GGUF_STRING) return rd_str(r, NULL, NULL, "string value", -1);
    return rd_array(r, depth, NULL, NULL);
}

/* Validates and skips an array (element type, count, elements); arrays of arrays are walked
 * recursively up to GGUF_MAX_ARRAY_DEPTH. */
static int rd_array(rd_t *r, int depth, uint32_t *elem_type, uint64_t *count)
{
    size_t at = r->pos;
    uint32_t et;
    uint64_t n;
    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return rd_fail(r, at, "arrays nested more than %d deep", GGUF_MAX_ARRAY_DEPTH);
    if (rd_u32(r, &et, "array element type")) return -1;
    if (et > GGUF_FLOAT64) return rd_fail(r, at, "unknown array element type %" PRIu32, et);
    if (rd_u64(r, &n, "array length")) return -1;
    size_t esz = gguf_type_size((int)et);
    size_t min = esz ? esz : et == GGUF_STRING ? 8 : 12;
    size_t left = r->size - r->pos;
    if (n > left / min)
        return rd_fail(r, at + 4,
                       "array of %" PRIu64 " %s elements cannot fit in the %zu bytes left", n,
                       type_names[et], left);
    if (esz) {
        if (et == GGUF_BOOL) {
            for (uint64_t i = 0; i < n; i++)
                if (r->p[r->pos + i] > 1)
                    return rd_fail(r, r->pos + i, "bool array element %" PRIu64 " is %u, not 0 or 1",
                                   i, r->p[r->pos + i]);
        }
        r->pos += (size_t)n * esz;
    } else if (et == GGUF_STRING) {
        for (uint64_t i = 0; i < n; i++)
            if (rd_str(r, NULL, NULL, "array string", (int64_t)i)) return -1;
    } else {
        for (uint64_t i = 0; i < n; i++)
            if (rd_array(r, depth + 1, NULL, NULL)) return -1;
    }
    if (elem_type) *elem_type = et;
    if (count) *count = n;
    return 0;
}

/* ---------------------------------------------------------------- parse */

static int cmp_kv_key(const void *a, const void *b)
{
    const struct gguf_kv *x = *(const struct gguf_kv *const *)a;
    const struct gguf_kv *y = *(const struct gguf_kv *const *)b;
    return strcmp(x->key, y->key);
}

static int cmp_t_name(const void *a, const void *b)
{
    const gguf_tensor_t *x = *(const gguf_tensor_t *const *)a;
    const gguf_tensor_t *y = *(const gguf_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_t_offset(const void *a, const void *b)
{
    const gguf_tensor_t *x = *(const gguf_tensor_t *const *)a;
    const gguf_tensor_t *y = *(const gguf_tensor_t *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Grows *arr (of elem bytes each, *cap slots) to hold at least need slots. */
static int grow(void **arr, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap) return 0;
    int64_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    if ((uint64_t)nc > SIZE_MAX / elem) return -1;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

static int parse_header(rd_t *r, gguf_t *g, uint64_t *n_tensors, uint64_t *n_kv)
{
    snprintf(r->item, sizeof r->item, "header");
    if (rd_need(r, 4, "magic", -1)) return -1;
    if (memcmp(r->p, "GGUF", 4) != 0) {
        char got[24];
        esc_bytes(got, sizeof got, r->p, 4);
        return rd_fail(r, 0, "bad magic '%s' (expected 'GGUF')", got);
    }
    r->pos = 4;
    uint32_t v;
    if (rd_u32(r, &v, "version")) return -1;
    if (v == 1)
        return rd_fail(r, 4, "GGUF version 1 is not supported (only versions 2 and 3)");
    if (v != 2 && v != 3) {
        if ((v & 0xffff) == 0 && (v >> 16) != 0)
            return rd_fail(r, 4, "version 0x%08" PRIx32 " looks byte-swapped: big-endian GGUF "
                           "files are not supported", v);
        return rd_fail(r, 4, "unsupported GGUF version %" PRIu32 " (only 2 and 3)", v);
    }
    g->version = v;
    if (rd_u64(r, n_tensors, "tensor count")) return -1;
    if (rd_u64(r, n_kv, "kv count")) return -1;
    size_t left = r->size - r->pos;
    if (*n_kv > left / GGUF_MIN_KV_BYTES)
        return rd_fail(r, 16, "kv count %" PRIu64 " cannot fit in the %zu bytes left (at least %u "
                       "bytes each)", *n_kv, left, GGUF_MIN_KV_BYTES);
    if (*n_tensors > left / GGUF_MIN_TINFO_BYTES)
        return rd_fail(r, 8, "tensor count %" PRIu64 " cannot fit in the %zu bytes left (at least "
                       "%u bytes each)", *n_tensors, left, GGUF_MIN_TINFO_BYTES);
    if (*n_kv * GGUF_MIN_KV_BYTES + *n_tensors * GGUF_MIN_TINFO_BYTES > left)
        return rd_fail(r, 8, "%" PRIu64 " kvs and %" PRIu64 " tensor infos cannot fit in the %zu "
                       "bytes left", *n_kv, *n_tensors, left);
    return 0;
}

static int parse_kvs(rd_t *r, gguf_t *g, uint64_t n_kv)
{
    int64_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        snprintf(r->item, sizeof r->item, "kv %" PRIu64, i);
        size_t at = r->pos;
        const uint8_t *ks;
        uint64_t klen;
        if (rd_str(r, &ks, &klen, "key", -1)) return -1;
        if (klen == 0) return rd_fail(r, at, "empty key");
        if (klen > GGUF_MAX_KEY_LEN)
            return rd_fail(r, at, "key length %" PRIu64 " exceeds %u", klen, GGUF_MAX_KEY_LEN);
        if (memchr(ks, 0, (size_t)klen)) return rd_fail(r, at + 8, "key contains a NUL byte");
        if (grow((void **)&g->kv, &cap, g->n_kv + 1, sizeof *g->kv))
            return rd_fail(r, at, "out of memory");
        struct gguf_kv *kv = &g->kv[g->n_kv];
        memset(kv, 0, sizeof *kv);
        kv->key = malloc((size_t)klen + 1);
        if (!kv->key) return rd_fail(r, at, "out of memory");
        memcpy(kv->key, ks, (size_t)klen);
        kv->key[klen] = '\0';
        g->n_kv++;
        char kesc[160];
        esc_bytes(kesc, sizeof kesc, ks, klen);
        snprintf(r->item, sizeof r->item, "kv %" PRIu64 " '%s'", i, kesc);

        size_t tat = r->pos;
        uint32_t type;
        if (rd_u32(r, &type, "value type")) return -1;
        if (type > GGUF_FLOAT64) return rd_fail(r, tat, "unknown value type %" PRIu32, type);
        kv->type = (int)type;
        size_t vat = r->pos;
        if (type == GGUF_ARRAY) {
            uint32_t et;
            uint64_t n;
            if (rd_array(r, 0, &et, &n)) return -1;
            kv->elem_type = (int)et;
            kv->n = n;
            kv->val = r->p + vat + 12;
            if (et == GGUF_STRING && n > 0) {
                /* Validated above: n strings follow, so n <= bytes / 8 and the walk is safe. */
                kv->strs = malloc((size_t)n * sizeof *kv->strs);
                if (!kv->strs) return rd_fail(r, vat, "out of memory");
                const uint8_t *q = kv->val;
                for (uint64_t j = 0; j < n; j++) {
                    kv->strs[j] = q;
                    q += 8 + le64(q);
                }
            }
        } else {
            kv->val = r->p + vat;
            if (rd_value(r, type, 0)) return -1;
        }

        if (strcmp(kv->key, "general.alignment") == 0) {
            if (type != GGUF_UINT32)
                return rd_fail(r, tat, "general.alignment has type %s, expected u32",
                               type_names[type]);
            uint32_t a = le32(kv->val);
            if (a == 0 || (a & (a - 1)) != 0)
                return rd_fail(r, vat, "general.alignment %" PRIu32 " is not a power of two", a);
            g->alignment = a;
        }
    }
    snprintf(r->item, sizeof r->item, "kvs");
    if (g->n_kv > 0) {
        g->kv_by_key = malloc((size_t)g->n_kv * sizeof *g->kv_by_key);
        if (!g->kv_by_key) return rd_fail(r, r->pos, "out of memory");
        for (int64_t i = 0; i < g->n_kv; i++) g->kv_by_key[i] = &g->kv[i];
        qsort(g->kv_by_key, (size_t)g->n_kv, sizeof *g->kv_by_key, cmp_kv_key);
        for (int64_t i = 1; i < g->n_kv; i++) {
            if (strcmp(g->kv_by_key[i - 1]->key, g->kv_by_key[i]->key) == 0) {
                const struct gguf_kv *a = g->kv_by_key[i - 1], *b = g->kv_by_key[i];
                if (a > b) { const struct gguf_kv *tmp = a; a = b; b = tmp; }
                char kesc[160];
                esc_bytes(kesc, sizeof kesc, (const uint8_t *)b->key, strlen(b->key));
                return rd_fail(r, (uint64_t)(b->val - r->p), "duplicate key '%s' (kv %td and kv %td)",
                               kesc, a - g->kv, b - g->kv);
            }
        }
    }
    return 0;
}

static int parse_tensor_infos(rd_t *r, gguf_t *g, uint64_t n_tensors, uint64_t **info_off)
{
    int64_t cap = 0, ocap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        snprintf(r->item, sizeof r->item, "tensor info %" PRIu64, i);
        size_t at = r->pos;
        const uint8_t *ns;
        uint64_t nlen;
        if (rd_str(r, &ns, &nlen, "name", -1)) return -1;
        if (nlen == 0) return rd_fail(r, at, "empty tensor name");
        if (nlen > GGUF_MAX_NAME_LEN)
            return rd_fail(r, at, "tensor name length %" PRIu64 " exceeds %u", nlen,
                           GGUF_MAX_NAME_LEN);
        if (memchr(ns, 0, (size_t)nlen)) return rd_fail(r, at + 8, "tensor name contains a NUL byte");
        if (grow((void **)&g->t, &cap, g->n_t + 1, sizeof *g->t) ||
            grow((void **)info_off, &ocap, g->n_t + 1, sizeof **info_off))
            return rd_fail(r, at, "out of memory");
        gguf_tensor_t *t = &g->t[g->n_t];
        memset(t, 0, sizeof *t);
        char *name = malloc((size_t)nlen + 1);
        if (!name) return rd_fail(r, at, "out of memory");
        memcpy(name, ns, (size_t)nlen);
        name[nlen] = '\0';
        t->name = name;
        g->n_t++;
        char nesc[160];
        esc_bytes(nesc, sizeof nesc, ns, nlen);
        snprintf(r->item, sizeof r->item, "tensor info %" PRIu64 " '%s'", i, nesc);

        size_t dat = r->pos;
        uint32_t n_dims;
        if (rd_u32(r, &n_dims, "n_dims")) return -1;
        if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
            return rd_fail(r, dat, "n_dims %" PRIu32 " not in 1..%d", n_dims, GGUF_MAX_DIMS);
        t->n_dims = (int)n_dims;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        int64_t nel = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            size_t eat = r->pos;
            uint64_t ne;
            if (rd_u64(r, &ne, "ne")) return -1;
            if (ne > (uint64_t)INT64_MAX)
                return rd_fail(r, eat, "ne[%" PRIu32 "] = %" PRIu64 " is negative as int64", d, ne);
            t->ne[d] = (int64_t)ne;
            if (ne != 0 && nel > INT64_MAX / (int64_t)ne)
                return rd_fail(r, eat, "element count overflows int64 at ne[%" PRIu32 "] = %" PRIu64,
                               d, ne);
            nel *= (int64_t)ne;
        }
        size_t tat = r->pos;
        uint32_t type;
        if (rd_u32(r, &type, "type")) return -1;
        int be = dtype_ggml_block_elems((int)type);
        if (be == 0 || type > INT32_MAX) return rd_fail(r, tat, "unknown tensor type %" PRIu32, type);
        t->type = (int)type;
        if (t->ne[0] % be != 0)
            return rd_fail(r, tat, "ne[0] = %" PRId64 " is not a multiple of the %s block size %d",
                           t->ne[0], dtype_name(t->type), be);
        uint64_t row = (uint64_t)(t->ne[0] / be), bb = dtype_ggml_block_bytes(t->type);
        if (row > UINT64_MAX / bb) return rd_fail(r, tat, "byte size overflows");
        row *= bb;
        uint64_t rows = t->ne[0] ? (uint64_t)(nel / t->ne[0]) : 0;
        if (rows && row > UINT64_MAX / rows) return rd_fail(r, tat, "byte size overflows");
        t->nbytes = row * rows;
        size_t oat = r->pos;
        if (rd_u64(r, &t->offset, "offset")) return -1;
        if (t->offset % g->alignment != 0)
            return rd_fail(r, oat, "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                           t->offset, g->alignment);
        (*info_off)[i] = oat;
    }
    return 0;
}

/* Checks names unique, data ranges inside the file and disjoint; sets data pointers. */
static int check_tensors(rd_t *r, gguf_t *g, const uint64_t *info_off)
{
    snprintf(r->item, sizeof r->item, "tensors");
    if (g->n_t == 0) return 0;
    g->t_by_name = malloc((size_t)g->n_t * sizeof *g->t_by_name);
    if (!g->t_by_name) return rd_fail(r, r->pos, "out of memory");
    for (int64_t i = 0; i < g->n_t; i++) g->t_by_name[i] = &g->t[i];
    qsort(g->t_by_name, (size_t)g->n_t, sizeof *g->t_by_name, cmp_t_name);
    for (int64_t i = 1; i < g->n_t; i++) {
        if (strcmp(g->t_by_name[i - 1]->name, g->t_by_name[i]->name) == 0) {
            const gguf_tensor_t *a = g->t_by_name[i - 1], *b = g->t_by_name[i];
            if (a > b) { const gguf_tensor_t *tmp = a; a = b; b = tmp; }
            char nesc[160];
            esc_bytes(nesc, sizeof nesc, (const uint8_t *)b->name, strlen(b->name));
            return rd_fail(r, info_off[b - g->t], "duplicate tensor name '%s' (tensor %td and %td)",
                           nesc, a - g->t, b - g->t);
        }
    }
    uint64_t size = r->size;
    for (int64_t i = 0; i < g->n_t; i++) {
        gguf_tensor_t *t = &g->t[i];
        if (g->data_off > size || t->offset > size - g->data_off ||
            t->nbytes > size - g->data_off - t->offset) {
            char nesc[160];
            esc_bytes(nesc, sizeof nesc, (const uint8_t *)t->name, strlen(t->name));
            return rd_fail(r, info_off[i], "tensor %" PRId64 " '%s' data [%" PRIu64 ", +%" PRIu64
                           ") runs past the end of the file (%" PRIu64 " bytes, data section at %"
                           PRIu64 ")", i, nesc, t->offset, t->nbytes, size, g->data_off);
        }
        t->data = r->p + g->data_off + t->offset;
    }
    /* Reuse the name index as scratch for the offset sort, then restore it. */
    qsort(g->t_by_name, (size_t)g->n_t, sizeof *g->t_by_name, cmp_t_offset);
    const gguf_tensor_t *prev = NULL;
    uint64_t end = 0;
    int bad = 0;
    for (int64_t i = 0; i < g->n_t && !bad; i++) {
        const gguf_tensor_t *t = g->t_by_name[i];
        if (t->nbytes == 0) continue;
        if (prev && t->offset < end) {
            char a[160], b[160];
            esc_bytes(a, sizeof a, (const uint8_t *)prev->name, strlen(prev->name));
            esc_bytes(b, sizeof b, (const uint8_t *)t->name, strlen(t->name));
            rd_fail(r, info_off[t - g->t], "data of tensors '%s' and '%s' overlap", a, b);
            bad = 1;
        }
        if (t->offset + t->nbytes > end) {
            end = t->offset + t->nbytes;
            prev = t;
        }
    }
    qsort(g->t_by_name, (size_t)g->n_t, sizeof *g->t_by_name, cmp_t_name);
    return bad ? -1 : 0;
}

void gguf_close(gguf_t *g)
{
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].strs);
    }
    free(g->kv);
    for (int64_t i = 0; i < g->n_t; i++) free((void *)g->t[i].name);
    free(g->t);
    free(g->kv_by_key);
    free(g->t_by_name);
    if (g->mapped && g->size) munmap((void *)g->base, g->size);
    free(g);
}

/* Parses buf; on success returns a gguf_t that borrows buf (mapped says whether to unmap it at
 * close). On failure nothing of buf is touched. */
static gguf_t *parse(const void *buf, size_t len, int mapped, char *errstr, size_t errlen)
{
    rd_t r = {.p = buf, .size = len, .err = errstr, .errlen = errlen};
    uint64_t *info_off = NULL, n_tensors, n_kv;
    gguf_t *g = calloc(1, sizeof *g);
    if (!g) {
        if (errlen) snprintf(errstr, errlen, "gguf: out of memory");
        return NULL;
    }
    g->base = buf;
    g->size = len;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (parse_header(&r, g, &n_tensors, &n_kv)) goto fail;
    if (parse_kvs(&r, g, n_kv)) goto fail;
    if (parse_tensor_infos(&r, g, n_tensors, &info_off)) goto fail;
    g->data_off = ((uint64_t)r.pos + g->alignment - 1) & ~(uint64_t)(g->alignment - 1);
    if (check_tensors(&r, g, info_off)) goto fail;
    free(info_off);
    g->mapped = mapped;
    if (errlen) errstr[0] = '\0';
    return g;
fail:
    free(info_off);
    gguf_close(g); /* g->mapped is still 0: the buffer stays with the caller */
    return NULL;
}

gguf_t *gguf_open_mem(const void *data, size_t len, char *errstr, size_t errlen)
{
    static const uint8_t empty[1];
    if (!data) {
        if (len) {
            if (errlen) snprintf(errstr, errlen, "gguf: NULL buffer");
            return NULL;
        }
        data = empty;
    }
    return parse(data, len, 0, errstr, errlen);
}

gguf_t *gguf_open(const char *path, char *errstr, size_t errlen)
{
    char eb[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errlen)
            snprintf(errstr, errlen, "gguf: cannot open '%s': %s", path,
                     strerror_r(errno, eb, sizeof eb));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        if (errlen)
            snprintf(errstr, errlen, "gguf: cannot stat '%s': %s", path,
                     strerror_r(errno, eb, sizeof eb));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        if (errlen) snprintf(errstr, errlen, "gguf: '%s' is not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        if (errlen) snprintf(errstr, errlen, "gguf: '%s' is too large to map", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    if (len == 0) {
        close(fd);
        return gguf_open_mem(NULL, 0, errstr, errlen);
    }
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int merr = errno;
    close(fd);
    if (m == MAP_FAILED) {
        if (errlen)
            snprintf(errstr, errlen, "gguf: cannot map '%s': %s", path,
                     strerror_r(merr, eb, sizeof eb));
        return NULL;
    }
    gguf_t *g = parse(m, len, 1, errstr, errlen);
    if (!g) munmap(m, len);
    return g;
}

/* ---------------------------------------------------------------- accessors */

uint32_t gguf_version(const gguf_t *g) { return g ? g->version : 0; }
uint32_t gguf_alignment(const gguf_t *g) { return g ? g->alignment : 0; }
size_t gguf_file_size(const gguf_t *g) { return g ? g->size : 0; }
int64_t gguf_n_kv(const gguf_t *g) { return g ? g->n_kv : 0; }
int64_t gguf_n_tensors(const gguf_t *g) { return g ? g->n_t : 0; }

static const struct gguf_kv *kv_at(const gguf_t *g, int64_t i)
{
    return g && i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const char *gguf_kv_key(const gguf_t *g, int64_t i)
{
    const struct gguf_kv *kv = kv_at(g, i);
    return kv ? kv->key : NULL;
}

int gguf_kv_type(const gguf_t *g, int64_t i)
{
    const struct gguf_kv *kv = kv_at(g, i);
    return kv ? kv->type : -1;
}

static const struct gguf_kv *kv_find(const gguf_t *g, const char *key)
{
    if (!g || !key || g->n_kv == 0) return NULL;
    size_t lo = 0, hi = (size_t)g->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(key, g->kv_by_key[mid]->key);
        if (c == 0) return g->kv_by_key[mid];
        if (c < 0) hi = mid; else lo = mid + 1;
    }
    return NULL;
}

int64_t gguf_find_key(const gguf_t *g, const char *key)
{
    const struct gguf_kv *kv = kv_find(g, key);
    return kv ? kv - g->kv : -1;
}

/* Integer value of kv: *is_neg and magnitude in *u (two's complement handled here). Returns -1
 * for non-integer types. */
static int kv_int(const struct gguf_kv *kv, int *is_neg, uint64_t *u)
{
    const uint8_t *p = kv->val;
    int64_t s;
    *is_neg = 0;
    switch (kv->type) {
    case GGUF_UINT8: *u = p[0]; return 0;
    case GGUF_UINT16: *u = (uint64_t)p[0] | (uint64_t)p[1] << 8; return 0;
    case GGUF_UINT32: *u = le32(p); return 0;
    case GGUF_UINT64: *u = le64(p); return 0;
    case GGUF_INT8: s = (int8_t)p[0]; break;
    case GGUF_INT16: s = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
    case GGUF_INT32: s = (int32_t)le32(p); break;
    case GGUF_INT64: s = (int64_t)le64(p); break;
    default: return -1;
    }
    if (s < 0) {
        *is_neg = 1;
        *u = (uint64_t)0 - (uint64_t)s; /* magnitude, 2^63 for INT64_MIN */
    } else {
        *u = (uint64_t)s;
    }
    return 0;
}

int gguf_get_i64(const gguf_t *g, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = kv_find(g, key);
    int neg;
    uint64_t u;
    if (!kv || kv_int(kv, &neg, &u)) return -1;
    if (neg) {
        if (u > (uint64_t)INT64_MAX + 1) return -1;
        *out = u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)u;
    } else {
        if (u > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)u;
    }
    return 0;
}

int gguf_get_u32(const gguf_t *g, const char *key, uint32_t *out)
{
    const struct gguf_kv *kv = kv_find(g, key);
    int neg;
    uint64_t u;
    if (!kv || kv_int(kv, &neg, &u)) return -1;
    if ((neg && u != 0) || u > UINT32_MAX) return -1;
    *out = (uint32_t)u;
    return 0;
}

int gguf_get_f32(const gguf_t *g, const char *key, float *out)
{
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv) return -1;
    if (kv->type == GGUF_FLOAT32) {
        uint32_t b = le32(kv->val);
        memcpy(out, &b, 4);
        return 0;
    }
    if (kv->type == GGUF_FLOAT64) {
        uint64_t b = le64(kv->val);
        double d;
        memcpy(&d, &b, 8);
        if (d > FLT_MAX) *out = HUGE_VALF;
        else if (d < -FLT_MAX) *out = -HUGE_VALF;
        else *out = (float)d;
        return 0;
    }
    return -1;
}

int gguf_get_bool(const gguf_t *g, const char *key, int *out)
{
    const struct gguf_kv *kv = kv_find(g, key);
    int neg;
    uint64_t u;
    if (!kv) return -1;
    if (kv->type == GGUF_BOOL) {
        *out = kv->val[0] != 0;
        return 0;
    }
    if (kv_int(kv, &neg, &u)) return -1;
    *out = u != 0;
    return 0;
}

static gguf_str_t str_at(const uint8_t *lenp)
{
    gguf_str_t s = {(const char *)lenp + 8, le64(lenp)};
    return s;
}

int gguf_get_str(const gguf_t *g, const char *key, gguf_str_t *out)
{
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv || kv->type != GGUF_STRING) return -1;
    *out = str_at(kv->val);
    return 0;
}

int gguf_get_arr(const gguf_t *g, const char *key, int *elem_type, uint64_t *n)
{
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv || kv->type != GGUF_ARRAY) return -1;
    if (elem_type) *elem_type = kv->elem_type;
    if (n) *n = kv->n;
    return 0;
}

const void *gguf_get_arr_data(const gguf_t *g, const char *key)
{
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv || kv->type != GGUF_ARRAY || gguf_type_size(kv->elem_type) == 0) return NULL;
    return kv->val;
}

int gguf_get_arr_str(const gguf_t *g, const char *key, uint64_t j, gguf_str_t *out)
{
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->elem_type != GGUF_STRING || j >= kv->n) return -1;
    *out = str_at(kv->strs[j]);
    return 0;
}

const gguf_tensor_t *gguf_tensor(const gguf_t *g, int64_t i)
{
    return g && i >= 0 && i < g->n_t ? &g->t[i] : NULL;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name)
{
    if (!g || !name || g->n_t == 0) return NULL;
    size_t lo = 0, hi = (size_t)g->n_t;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, g->t_by_name[mid]->name);
        if (c == 0) return g->t_by_name[mid];
        if (c < 0) hi = mid; else lo = mid + 1;
    }
    return NULL;
}

/* ---------------------------------------------------------------- formatting */

typedef struct {
    char *buf;
    size_t cap, len; /* len may exceed cap - 1: output is truncated */
} fmt_t;

static void fmt_add(fmt_t *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fmt_add(fmt_t *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = f->len < f->cap ? f->cap - f->len : 0;
    int n = vsnprintf(room ? f->buf + f->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) f->len += (size_t)n;
}

static void fmt_str(fmt_t *f, gguf_str_t s, size_t max)
{
    fmt_add(f, "\"");
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        uint8_t c = (uint8_t)s.ptr[i];
        if (c == '"' || c == '\\') fmt_add(f, "\\%c", c);
        else if (c == '\n') fmt_add(f, "\\n");
        else if (c < 0x20 || c == 0x7f) fmt_add(f, "\\x%02x", c);
        else fmt_add(f, "%c", c); /* UTF-8 bytes pass through */
    }
    fmt_add(f, s.len > max ? "\"..." : "\"");
}

/* Renders the fixed-size scalar at p of type t. */
static void fmt_scalar(fmt_t *f, int t, const uint8_t *p)
{
    struct gguf_kv tmp = {.type = t, .val = p};
    int neg;
    uint64_t u;
    if (t == GGUF_BOOL) {
        fmt_add(f, "%s", p[0] ? "true" : "false");
    } else if (t == GGUF_FLOAT32) {
        uint32_t b = le32(p);
        float v;
        memcpy(&v, &b, 4);
        fmt_add(f, "%g", (double)v);
    } else if (t == GGUF_FLOAT64) {
        uint64_t b = le64(p);
        double v;
        memcpy(&v, &b, 8);
        fmt_add(f, "%g", v);
    } else if (kv_int(&tmp, &neg, &u) == 0) {
        fmt_add(f, "%s%" PRIu64, neg ? "-" : "", u);
    }
}

void gguf_kv_format(const gguf_t *g, int64_t i, char *buf, size_t buflen)
{
    const struct gguf_kv *kv = kv_at(g, i);
    fmt_t f = {buf, buflen, 0};
    if (!buf || buflen == 0) return;
    buf[0] = '\0';
    if (!kv) return;
    if (kv->type == GGUF_STRING) {
        fmt_str(&f, str_at(kv->val), 200);
    } else if (kv->type == GGUF_ARRAY) {
        enum { SHOW = 8 };
        fmt_add(&f, "[%s; %" PRIu64 "]", type_names[kv->elem_type], kv->n);
        if (kv->elem_type == GGUF_ARRAY || kv->n == 0) goto done;
        fmt_add(&f, " [");
        size_t esz = gguf_type_size(kv->elem_type);
        for (uint64_t j = 0; j < kv->n && j < SHOW; j++) {
            if (j) fmt_add(&f, ", ");
            if (kv->elem_type == GGUF_STRING) fmt_str(&f, str_at(kv->strs[j]), 40);
            else fmt_scalar(&f, kv->elem_type, kv->val + j * esz);
        }
        fmt_add(&f, kv->n > SHOW ? ", ...]" : "]");
    } else {
        fmt_scalar(&f, kv->type, kv->val);
    }
done:
    if (f.len >= buflen && buflen >= 4) memcpy(buf + buflen - 4, "...", 4);
}
