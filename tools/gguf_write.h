/* tools/gguf_write.h: GGUF v3 writer (spillway mkmodel and its converter, tests). Not part of
 * the engine library, which only reads GGUF (engine/gguf.h): key and value types here are that
 * header's enum gguf_type, tensor types engine/dtype.h's enum dtype.
 *
 * Builds a GGUF v3 file in memory order: all kvs, then tensor infos, then aligned data.
 * Every add function copies its arguments (the caller keeps ownership). Returns 0 or -1 (out of
 * memory or bad argument; the writer's errstr says which). */
#ifndef SPILLWAY_TOOLS_GGUF_WRITE_H
#define SPILLWAY_TOOLS_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"

typedef struct gguf_writer gguf_writer_t;

gguf_writer_t *gguf_writer_new(void);
void gguf_writer_free(gguf_writer_t *w);
const char *gguf_writer_errstr(const gguf_writer_t *w);
int gguf_writer_set_alignment(gguf_writer_t *w, uint32_t alignment); /* power of two; default 32 */
int gguf_writer_add_u32(gguf_writer_t *w, const char *key, uint32_t v);
int gguf_writer_add_i32(gguf_writer_t *w, const char *key, int32_t v);
int gguf_writer_add_u64(gguf_writer_t *w, const char *key, uint64_t v);
int gguf_writer_add_f32(gguf_writer_t *w, const char *key, float v);
int gguf_writer_add_bool(gguf_writer_t *w, const char *key, int v);
int gguf_writer_add_str(gguf_writer_t *w, const char *key, const char *v);
/* Numeric array of n elements of elem_type, packed little-endian in data. */
int gguf_writer_add_arr(gguf_writer_t *w, const char *key, int elem_type, const void *data, uint64_t n);
/* String array; strs[j] has lens[j] bytes (lens may be NULL for NUL-terminated strings). */
int gguf_writer_add_arr_str(gguf_writer_t *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n);
/* Tensor: n_dims dims in ne (ne[0] innermost), type an enum dtype, data of dtype_row_bytes(type,
 * ne[0]) * ne[1] * ne[2] * ne[3] bytes, copied. */
int gguf_writer_add_tensor(gguf_writer_t *w, const char *name, int type, int n_dims,
                           const int64_t *ne, const void *data);
/* The key/value pair at index i of g (0 <= i < gguf_n_kv(g)) under the same key and type: what
 * a rewrite of a GGUF file copies unchanged. Values go through the reader's getters: integers
 * through int64 (a UINT64 above INT64_MAX cannot be read), FLOAT64 through float (rounded to F32
 * precision), strings up to an embedded NUL; arrays of arrays are refused. 0, or -1 when g cannot
 * read the value or w refuses it (w's errstr says which). */
int gguf_writer_copy_kv(gguf_writer_t *w, const gguf_t *g, int64_t i);
/* Any fixed-size scalar type (not STRING or ARRAY): value points to a host object of that
 * type's C type (uint8_t, int8_t, ..., float, double; BOOL: a uint8_t 0 or 1). */
int gguf_writer_add_scalar(gguf_writer_t *w, const char *key, int type, const void *value);
/* Streaming tensor (large models without holding the weights in memory): the data is not given
 * now; during gguf_writer_write the writer calls fill once per row, in order, for rows
 * 0 .. ne[1]*ne[2]*ne[3]-1, with dst a buffer of row_bytes = dtype_row_bytes(type, ne[0]) to
 * fill. fill returns 0, or -1 to abort the write (the writer's errstr then says so). user is
 * borrowed and must stay valid until the write. Types: any ggml type dtype_ggml_block_elems()
 * knows, here and in gguf_writer_add_tensor. */
typedef int (*gguf_row_fill_fn)(void *user, int64_t row, void *dst, size_t row_bytes);
int gguf_writer_add_tensor_stream(gguf_writer_t *w, const char *name, int type, int n_dims,
                                  const int64_t *ne, gguf_row_fill_fn fill, void *user);
/* Writes the file (atomically: a temp file renamed over path). 0 or -1. */
int gguf_writer_write(gguf_writer_t *w, const char *path);

#endif
