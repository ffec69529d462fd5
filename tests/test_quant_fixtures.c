/* tests/test_quant_fixtures.c: spillway's dequantisation of llama.cpp's own quantised files,
 * bit for bit.
 *
 * Data: SPILLWAY_MODELS/quant-fixtures/ (see its README.md): one synthetic model quantised by
 * llama-quantize to every common type and mix; for each file NAME.gguf, NAME.deq.json holds per
 * tensor the ggml type name and the SHA-256 of its values dequantised to little-endian F32 by
 * llama.cpp's reference code (in storage order: rows of ne[0] values, one after another).
 *
 * For every tensor whose type this build supports (dtype_supported), the test dequantises it
 * with the portable reference (dtype_dequant_row) and with every kernel table this CPU runs
 * (kern_get: avx512, avx2, scalar), and checks both against the recorded hash and the recorded
 * first 32 values. Every tensor's type must be supported (the fixtures hold every common type
 * and mix), and a tensor whose type name in the JSON disagrees with the file's type is a failure. Exits 77 when the
 * fixtures are absent. */
#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/kernels.h"
#include "engine/dtype.h"
#include "engine/gguf.h"
#include "tests/check.h"

#ifndef SPILLWAY_MODELS
#define SPILLWAY_MODELS "../shared/models"
#endif

/* Hex SHA-256 of the dequantised tensor t (n_rows rows of ne0 values) through deq. */
typedef void (*deq_fn)(int type, const void *row, float *out, int64_t n);

static int tensor_sha(const gguf_tensor_t *t, deq_fn deq, char hex[65], float first32[32])
{
    int64_t ne0 = t->ne[0], rows = 1;
    for (int d = 1; d < t->n_dims; d++) rows *= t->ne[d];
    size_t rb = dtype_row_bytes(t->type, ne0);
    if (rb == 0 || (uint64_t)rb * (uint64_t)rows != t->nbytes) return -1;
    float *buf = malloc((size_t)ne0 * sizeof(float));
    if (!buf) return -1;
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    for (int64_t r = 0; r < rows; r++) {
        deq(t->type, (const char *)t->data + (size_t)r * rb, buf, ne0);
        if (r == 0)
            for (int i = 0; i < 32 && i < ne0; i++) first32[i] = buf[i];
        /* little-endian host (x86-64): the floats' bytes are already F32LE */
        crypto_hash_sha256_update(&st, (const unsigned char *)buf, (size_t)ne0 * sizeof(float));
    }
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&st, h);
    sodium_bin2hex(hex, 65, h, sizeof h);
    free(buf);
    return 0;
}

/* The kernel tables' dequant_row, called through a fixed table pointer. */
static const kern_table_t *cur_table;
static void deq_kern(int type, const void *row, float *out, int64_t n)
{
    cur_table->dequant_row(type, row, out, n);
}

typedef struct {
    int tensors_checked;   /* tensors whose type is supported, checked */
    int quant_checked;     /* of those, not F32 */
    int unsupported;       /* tensors of a type this build does not support */
} tally_t;

static void check_file(const char *dir, const char *json_name, tally_t *tl)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/%s", dir, json_name);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    CHECKF(root != NULL, "%s: %s", path, jerr.text);
    if (!root) return;
    const char *file = json_string_value(json_object_get(root, "file"));
    json_t *tensors = json_object_get(root, "tensors");
    CHECKF(file && json_is_array(tensors), "%s: no file/tensors", path);
    if (!file || !json_is_array(tensors)) goto out;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    gguf_t *g = gguf_open(path, err, sizeof err);
    CHECKF(g != NULL, "%s: %s", path, err);
    if (!g) goto out;
    CHECKF((size_t)gguf_n_tensors(g) == json_array_size(tensors), "%s: %" PRId64 " tensors, json %zu",
           file, gguf_n_tensors(g), json_array_size(tensors));
    size_t i;
    json_t *jt;
    json_array_foreach(tensors, i, jt) {
        const char *name = json_string_value(json_object_get(jt, "name"));
        const char *tname = json_string_value(json_object_get(jt, "type"));
        const char *want = json_string_value(json_object_get(jt, "sha256_f32le"));
        json_t *jfirst = json_object_get(jt, "first32");
        const gguf_tensor_t *t = name ? gguf_find_tensor(g, name) : NULL;
        CHECKF(t != NULL && tname && want, "%s: tensor %s missing", file, name ? name : "?");
        if (!t || !tname || !want) continue;
        CHECKF(strcasecmp(dtype_name(t->type), tname) == 0, "%s %s: file type %s, json %s", file,
               name, dtype_name(t->type), tname);
        if (!dtype_supported(t->type)) {
            tl->unsupported++;
            continue;
        }
        char hex[65];
        float first[32];
        CHECKF(tensor_sha(t, dtype_dequant_row, hex, first) == 0, "%s %s: bad geometry", file, name);
        CHECKF(strcmp(hex, want) == 0, "%s %s (%s): reference dequant sha %s, llama.cpp %s", file,
               name, tname, hex, want);
        for (size_t k = 0; k < json_array_size(jfirst) && k < 32; k++) {
            float v = (float)json_number_value(json_array_get(jfirst, k));
            CHECKF(first[k] == v, "%s %s: value %zu is %.9g, llama.cpp %.9g", file, name, k,
                   (double)first[k], (double)v);
        }
        static const char *isas[] = {"avx512", "avx2", "scalar"};
        for (int a = 0; a < 3; a++) {
            cur_table = kern_get(isas[a]);
            if (!cur_table) continue;
            char khex[65];
            float kfirst[32];
            CHECKF(tensor_sha(t, deq_kern, khex, kfirst) == 0, "%s %s", file, name);
            CHECKF(strcmp(khex, want) == 0, "%s %s (%s): %s dequant_row sha %s, llama.cpp %s",
                   file, name, tname, isas[a], khex, want);
        }
        tl->tensors_checked++;
        if (t->type != DT_F32) tl->quant_checked++;
    }
    gguf_close(g);
out:
    json_decref(root);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
    if (sodium_init() < 0) {
        fprintf(stderr, "sodium_init failed\n");
        return 1;
    }
    const char *dir = SPILLWAY_MODELS "/quant-fixtures";
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "SKIP: %s not found\n", dir);
        return 77;
    }
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        size_t len = strlen(e->d_name);
        if (len > 9 && strcmp(e->d_name + len - 9, ".deq.json") == 0) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    CHECKF(n >= 20, "only %d .deq.json files in %s", n, dir);
    tally_t tl = {0};
    for (int i = 0; i < n; i++) {
        tally_t before = tl;
        check_file(dir, names[i], &tl);
        fprintf(stderr, "%-22s checked %d tensors, %d of unsupported types\n", names[i],
                tl.tensors_checked - before.tensors_checked, tl.unsupported - before.unsupported);
        free(names[i]);
    }
    fprintf(stderr, "total: %d tensors checked (%d quantised), %d of types this build does not "
            "support (supported: %s)\n", tl.tensors_checked, tl.quant_checked, tl.unsupported,
            DTYPE_SUPPORTED_LIST);
    CHECK(tl.quant_checked > 0);
    /* every type in the fixtures (all of llama.cpp's common types and mixes) is supported */
    CHECKF(tl.unsupported == 0, "%d tensors of types this build does not support", tl.unsupported);
    return check_exit();
}
