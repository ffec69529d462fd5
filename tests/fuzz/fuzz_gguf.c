/* tests/fuzz/fuzz_gguf.c: libFuzzer target for the GGUF reader. Parses the input with
 * gguf_open_mem and, when it is accepted, calls every accessor on every kv and tensor and
 * touches every tensor byte range end, so an over-read or a wrong size shows under ASan. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    gguf_t *g = gguf_open_mem(data, size, err, sizeof err);
    if (!g) {
        if (strncmp(err, "gguf: ", 6) != 0) abort(); /* every failure must say why */
        return 0;
    }
    volatile uint64_t sink = gguf_version(g) + gguf_alignment(g) + gguf_file_size(g);
    char buf[300];
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (!key || gguf_find_key(g, key) != i) abort(); /* keys are unique and found */
        int type = gguf_kv_type(g, i);
        sink += (uint64_t)type + strlen(gguf_type_name(type));
        gguf_kv_format(g, i, buf, sizeof buf);
        gguf_kv_format(g, i, buf, 1);
        gguf_kv_format(g, i, buf, 7);
        int64_t iv;
        uint32_t uv;
        float fv;
        int bv, et;
        uint64_t n;
        gguf_str_t s;
        if (!gguf_get_i64(g, key, &iv)) sink += (uint64_t)iv;
        if (!gguf_get_u32(g, key, &uv)) sink += uv;
        if (!gguf_get_f32(g, key, &fv)) sink += fv != fv;
        if (!gguf_get_bool(g, key, &bv)) sink += (uint64_t)bv;
        if (!gguf_get_str(g, key, &s) && s.len) sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        if (!gguf_get_arr(g, key, &et, &n)) {
            const uint8_t *d = gguf_get_arr_data(g, key);
            size_t es = gguf_type_size(et);
            if ((d != NULL) != (es != 0)) abort();
            if (d && n) sink += d[0] + d[n * es - 1];
            for (uint64_t j = 0; j < n; j++)
                if (!gguf_get_arr_str(g, key, j, &s) && s.len) sink += (uint8_t)s.ptr[s.len - 1];
            if (gguf_get_arr_str(g, key, n, &s) == 0) abort();
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        if (!t || gguf_find_tensor(g, t->name) != t) abort();
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) abort();
        const uint8_t *d = t->data;
        if (d < data || (size_t)(d - data) > size || t->nbytes > size - (size_t)(d - data)) abort();
        if (t->nbytes) sink += d[0] + d[t->nbytes - 1];
    }
    (void)sink;
    gguf_close(g);
    return 0;
}
