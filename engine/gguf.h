/* engine/gguf.h: GGUF v2/v3 reader (mmap). Internal to the engine module (the writer is
 * tools/gguf_write.h).
 *
 * Reader contract: gguf_open() maps the file read-only and validates the whole header, every
 * metadata value, every tensor info and every tensor's data range before returning; afterwards
 * no accessor can read out of bounds. A truncated, corrupt or hostile file gives NULL and an
 * errstr naming the problem and its byte offset. A gguf_t is immutable after open: it may be
 * read from any number of threads at once.
 *
 * Strings in GGUF are length-prefixed and not NUL-terminated: they come back as gguf_str_t that
 * point into the mapping (valid until gguf_close). Keys are additionally available NUL-terminated.
 */
#ifndef SPILLWAY_ENGINE_GGUF_H
#define SPILLWAY_ENGINE_GGUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf gguf_t;

/* Metadata value types, numbered as in the GGUF spec. */
enum gguf_type {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3,
    GGUF_UINT32 = 4, GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7,
    GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
};

/* Bytes of a value of fixed-size type t (enum gguf_type); 0 for STRING, ARRAY and unknown
 * types. */
size_t gguf_type_size(int t);

typedef struct {
    const char *ptr; /* not NUL-terminated; points into the mapping */
    uint64_t len;
} gguf_str_t;

#define GGUF_MAX_DIMS 4

typedef struct {
    const char *name;        /* NUL-terminated copy, owned by the gguf_t */
    int n_dims;              /* 1..4 */
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (innermost) dimension; unused dims = 1 */
    int type;                /* enum dtype (engine/dtype.h) */
    uint64_t offset;         /* from the start of the data section */
    uint64_t nbytes;
    const void *data;        /* into the mapping, aligned to the file's alignment */
} gguf_tensor_t;

/* Open and validate. errstr gets a message on failure. Returns NULL on error.
 * Tensor types outside dtype_supported() are accepted here (inspect can list them); the model
 * loader refuses them. */
gguf_t *gguf_open(const char *path, char *errstr, size_t errlen);

/* Same on a caller buffer (fuzzing, tests). The buffer is borrowed: it must outlive the gguf_t. */
gguf_t *gguf_open_mem(const void *data, size_t len, char *errstr, size_t errlen);

void gguf_close(gguf_t *g);

uint32_t gguf_version(const gguf_t *g);
uint32_t gguf_alignment(const gguf_t *g);
size_t gguf_file_size(const gguf_t *g);

/* Metadata key/values. Index i in [0, gguf_n_kv). */
int64_t gguf_n_kv(const gguf_t *g);
const char *gguf_kv_key(const gguf_t *g, int64_t i);        /* NUL-terminated */
int gguf_kv_type(const gguf_t *g, int64_t i);               /* enum gguf_type */
int64_t gguf_find_key(const gguf_t *g, const char *key);    /* index or -1 */

/* Scalar getters by key. Return 0 and store the value; -1 when the key is missing or its type
 * does not convert. Integers convert between all integer types when the value fits; floats
 * accept FLOAT32/FLOAT64; bool accepts BOOL and integer types. */
int gguf_get_i64(const gguf_t *g, const char *key, int64_t *out);
int gguf_get_u32(const gguf_t *g, const char *key, uint32_t *out);
int gguf_get_f32(const gguf_t *g, const char *key, float *out);
int gguf_get_bool(const gguf_t *g, const char *key, int *out);
int gguf_get_str(const gguf_t *g, const char *key, gguf_str_t *out);

/* "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64";
 * "unknown" otherwise. */
const char *gguf_type_name(int type);

/* Scalar value by index, for printing: writes a short human-readable rendering of the value
 * (arrays as "[type; n]" plus the first few elements) into buf. */
void gguf_kv_format(const gguf_t *g, int64_t i, char *buf, size_t buflen);

/* Arrays by key. gguf_get_arr returns 0 and fills elem type and count; -1 when missing or
 * not an array. Numeric arrays: gguf_get_arr_data gives a pointer to the packed little-endian
 * elements (may be unaligned: read with memcpy). String arrays: gguf_get_arr_str gives element j. */
int gguf_get_arr(const gguf_t *g, const char *key, int *elem_type, uint64_t *n);
const void *gguf_get_arr_data(const gguf_t *g, const char *key);
int gguf_get_arr_str(const gguf_t *g, const char *key, uint64_t j, gguf_str_t *out);

/* Tensors. */
int64_t gguf_n_tensors(const gguf_t *g);
const gguf_tensor_t *gguf_tensor(const gguf_t *g, int64_t i);
const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name); /* NULL if absent */

#endif
