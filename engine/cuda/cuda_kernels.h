/* engine/cuda/cuda_kernels.h: the CUDA backend's device kernels, behind a C interface
 * (implemented in cuda_kernels.cu, compiled by nvcc). Internal to engine/cuda, and used by
 * tests/test_cuda.c, which checks every one against a CPU reference.
 *
 * Conventions: pointers named d_* are device memory, owned by the caller. Every call only
 * enqueues work on `stream` and returns at once; the cuk_* launchers return the cudaError_t of
 * cudaGetLastError() after their launch (0 = cudaSuccess; errors of the kernel itself surface at
 * the next synchronisation). The GEMMs are cuBLAS's, loaded at run time (cuda_blas.h). Device
 * element types are the engine's enum dtype values: DT_F32, DT_F16 and DT_BF16 ("wtype"); the
 * residual stream, GEMM outputs and all reductions are F32. Threads: stateless; callable from
 * any host thread. */
#ifndef SPILLWAY_ENGINE_CUDA_KERNELS_H
#define SPILLWAY_ENGINE_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one element of a device type (4 or 2), 0 for another type. */
size_t cuk_elem_bytes(int type);

/* d_dst[i] = d_src[i] converted (F32/F16/BF16 -> F32/F16/BF16, round to nearest even), i < n. */
int cuk_convert(int src_type, const void *d_src, int dst_type, void *d_dst, size_t n,
                cudaStream_t stream);

/* d_dst[i] = lo + (hi - lo) * u(seed, i), u uniform in [0, 1): synthetic weights. */
int cuk_fill_random(int dst_type, void *d_dst, size_t n, uint64_t seed, float lo, float hi,
                    cudaStream_t stream);

/* d_x[t][:] = widen(d_table[d_tokens[t]][:]) for t < T. d_table: [n_vocab][dim] wtype; d_x:
 * [T][dim] F32. Token ids must be in range (the backend validates them). */
int cuk_embed(int wtype, const void *d_table, const int32_t *d_tokens, int T, int dim,
              float *d_x, cudaStream_t stream);

/* RoPE angles: d_cs[t][i] = (cos, sin)(pos[t] * freq_scale * inv_freq[i]) computed in double
 * and rounded to F32 (as the CPU backend does), i < half. d_cs: [T][half][2] F32. */
int cuk_rope_table(const int32_t *d_pos, int T, const float *d_inv_freq, int half,
                   float freq_scale, float *d_cs, cudaStream_t stream);

/* RMSNorm of T rows: out[t] = x[r] * w / sqrt(mean(x[r]^2) + eps), r = d_rows ? d_rows[t] : t.
 * d_x: rows of dim F32; d_w: [dim] F32; d_out: [T][dim] of out_type (F32, F16 or BF16). */
int cuk_rmsnorm(const float *d_x, const int32_t *d_rows, int T, int dim, const float *d_w,
                float eps, int out_type, void *d_out, cudaStream_t stream);

/* d_out[t][i] = silu(gu[t][i]) * gu[t][ffn + i]: d_gu [T][2 * ffn] F32 (gate then up, the
 * order of the fused gate/up weight), d_out [T][ffn] of out_type. */
int cuk_swiglu(const float *d_gu, int T, int ffn, int out_type, void *d_out,
               cudaStream_t stream);

/* The batch's sequences as the kernels see them (all device arrays):
 *   pos[T]      absolute position of each token
 *   tok_seq[T]  sequence index of each token
 *   bt_off[S]   offset of sequence s's block table in bt
 *   bt[...]     block ids, concatenated tables
 * KV pool: [n_blocks][block_elems] of kv_type (F32 or F16), one block laid out as
 * [n_layers][2 (K, V)][block_tokens][n_kv_heads][head_dim] (engine/backend.h). */
typedef struct {
    const int32_t *pos, *tok_seq, *bt_off, *bt;
    void *kv;
    int kv_type;
    size_t block_elems;
    int block_tokens;
    int layer;
} cuk_paged_t;

/* Per token t: adds the bias to its q, k, v (when d_bias), applies RoPE to q and k (rope_kind
 * enum rope_kind, the first rope_dim of each head's head_dim elements rotated, angles from
 * d_cs of cuk_rope_table) and stores k and v in the KV pool at the token's position through its
 * sequence's block table. d_qkv: [T][ld] F32 with q [n_heads][head_dim] at column 0, k
 * [n_kv_heads][head_dim] after it, then v; q is rotated in place (k, v in qkv are left as they
 * were). d_bias: [(n_heads + 2 n_kv_heads) head_dim] F32 or NULL. */
typedef struct {
    int T, n_heads, n_kv_heads, head_dim, rope_dim, rope_kind;
    float *qkv;
    int ld;
    const float *bias;
    const float *cs;
    cuk_paged_t kv;
} cuk_qkv_args_t;
int cuk_qkv_rope_store(const cuk_qkv_args_t *a, cudaStream_t stream);

/* Causal paged attention for every token of a varlen batch (prefill chunks and decodes alike):
 * token t's query heads attend to positions [0, pos[t]] of its sequence, read from the KV pool
 * (its own and earlier tokens of this batch included: run cuk_qkv_rope_store first).
 * GQA: one block serves all n_heads / n_kv_heads query heads of a kv head, so each K/V row is
 * read from the pool once per (token, kv head, split), not once per query head.
 * Split-K (flash-decoding) at fixed positions: token t's context of n_ctx = pos[t] + 1 keys is
 * cut into nch = ceil(n_ctx / chunk) chunks [c * chunk, (c + 1) * chunk), each a fresh online
 * softmax (partial output, max, sum), combined by a left fold in chunk order with every rounding
 * explicit. When nch <= n_splits (the scratch's partials a token), block z along the split axis
 * computes chunks z, z + grid, ... into d_part and a second kernel folds them; otherwise one
 * block folds the token's chunks itself. The two compute the same bits, and neither n_splits
 * nor grid_splits changes a token's output: only chunk does, so with a fixed chunk a token's
 * output does not depend on its batch.
 * grid_splits: blocks launched along the split axis, 0 = n_splits (at most 65535); a caller
 * that knows the longest context L of the batch may pass fewer (down to 1), e.g. min(n_splits,
 * ceil(L / chunk), what fills the device).
 * d_part: scratch of T * n_heads * n_splits * (head_dim + 2) F32. d_out: [T][n_heads *
 * head_dim] of out_type. head_dim <= 256, n_heads / n_kv_heads <= 32. A block uses
 * cuk_attention_smem() bytes of dynamic shared memory (opted in above 48 KiB: at most ~98 KiB,
 * which sm_80 and later allow). */
typedef struct {
    int T, n_heads, n_kv_heads, head_dim;
    const float *qkv; /* q of token t, head h at qkv[t * ld + h * head_dim] */
    int ld;
    cuk_paged_t kv;
    float scale;
    int n_splits, chunk;
    int grid_splits;
    float *part;
    int out_type;
    void *out;
    const int32_t *tiles; /* cuk_attention_tc only (NULL for cuk_attention) */
} cuk_attn_args_t;
int cuk_attention(const cuk_attn_args_t *a, cudaStream_t stream);
#define CUK_MAX_HEAD_DIM 256
#define CUK_MAX_GROUP 32
/* Dynamic shared memory bytes of one cuk_attention block for this shape. */
size_t cuk_attention_smem(int n_heads, int n_kv_heads, int head_dim);

/* Tensor-core attention (mma.sync m16n8k16, F16 inputs, F32 accumulators; sm_80 and later)
 * over an F16 KV pool, for head dims that are multiples of 16 up to CUK_TC_MAX_HEAD_DIM
 * (cuk_attention_tc_supported): the same contract as cuk_attention but for how the work is cut
 * and what it rounds:
 *  - Tiles: a block serves the query heads of one kv head for up to
 *    cuk_attention_tc_tile_tokens() tokens of ONE sequence (a prefill chunk's tokens share each
 *    K/V tile). d_tiles (device): [0] = NT tiles, [1] = mode (below), [2 + i] = the first token
 *    of tile i, [2 + NT] = T; a tile's tokens are consecutive in the batch and of one sequence.
 *    The grid is (T, n_kv_heads, grid_splits or n_splits): blocks past NT return at once.
 *  - Chunks at fixed positions: token t's keys are cut into chunks [c * chunk, (c + 1) * chunk)
 *    (chunk a multiple of 32); each chunk is a fresh online softmax, and the chunks are combined
 *    by a left fold in chunk order (every rounding explicit). Mode 1 (fold): each block folds
 *    its tile's chunks itself and writes the output (one block per tile and kv head). Mode 0
 *    (scatter): block z computes chunks z, z + gridDim.z, ... as partials in d_part, which then
 *    needs n_splits >= ceil((pos[t] + 1) / chunk) for every token; a merge kernel folds them.
 *    Both modes compute the same bits, and a row's result depends only on its own query, its
 *    position and its sequence's keys: not on the tile's other tokens, the mode, grid_splits or
 *    the batch. So the caller may choose the mode and tiles per step freely.
 *  - Rounding: q rounded to F16, scores and the softmax in F32 (scores scaled after the dot
 *    product, as cuk_attention), probabilities rounded to F16 for the P V product; the row sum
 *    of the softmax is of the unrounded probabilities. Not bit-compatible with cuk_attention.
 * Dynamic shared memory: cuk_attention_tc_smem(head_dim) bytes (under 48 KiB). */
#define CUK_TC_MAX_HEAD_DIM 128
int cuk_attention_tc(const cuk_attn_args_t *a, cudaStream_t stream);
int cuk_attention_tc_supported(int n_heads, int n_kv_heads, int head_dim, int kv_type);
/* Most tokens a tile holds: 64 query rows / (n_heads / n_kv_heads). */
int cuk_attention_tc_tile_tokens(int n_heads, int n_kv_heads);
/* Host: the tiles array (above) of a batch whose token t belongs to sequence tok_seq[t] (a
 * sequence's tokens consecutive): runs of at most tile_tokens tokens of one sequence, and the
 * mode. tiles: room for T + 3 words. Returns the tile count, -1 for T < 1 or tile_tokens < 1. */
int cuk_attention_tc_tiles(const int32_t *tok_seq, int T, int tile_tokens, int fold,
                           int32_t *tiles);
size_t cuk_attention_tc_smem(int head_dim);

/* d_ids[t] = the index of the largest of d_logits[t][0..n_vocab) (the lowest on ties; NaN never
 * wins), t < T. d_logits: [T][n_vocab] F32; d_ids: [T] int32. */
int cuk_argmax(const float *d_logits, int T, int n_vocab, int32_t *d_ids, cudaStream_t stream);

/* ---- FP8 (E4M3) weights and activations ----
 * E4M3 as NVIDIA's __nv_fp8_e4m3 (OCP "FN"): sign, 4 exponent bits (bias 7), 3 mantissa bits,
 * subnormals, no infinities, 0x7f / 0xff NaN, largest finite 448. Encoding rounds to nearest
 * even and saturates finite values beyond 448 to +-448 (__NV_SATFINITE); NaN stays NaN. */
#define CUK_FP8_MAX 448.0f

/* Per-row scaled quantisation: for each row r < rows of d_src ([rows][cols] of src_type, F32,
 * F16 or BF16): amax = max |x| over the row's non-NaN elements, scale[r] = amax / 448 (1 when
 * amax is 0), q[r][i] = e4m3(x[r][i] / scale[r]) (IEEE division; a NaN stays NaN, an infinite
 * amax makes the row's finite values 0 and its infinities NaN). d_q: [rows][cols] bytes; d_scale: [rows] F32.
 * Weights at load (one scale per output channel) and GEMM inputs (one per token). */
int cuk_quant_fp8_rows(int src_type, const void *d_src, int rows, int cols, uint8_t *d_q,
                       float *d_scale, cudaStream_t stream);

/* The FP8 GEMM's epilogue: v = (acc[t][o] * sx[t]) * sw[o] (F32, each product rounded), then
 * d_y[t * ldy + o] = beta ? d_y[t * ldy + o] + v : v, for t < T, o < N. d_acc: [T][lda] F32
 * (may be d_y itself when beta is 0 and lda == ldy). */
int cuk_fp8_epilogue(const float *d_acc, int lda, const float *d_sx, const float *d_sw, int T,
                     int N, float beta, float *d_y, int ldy, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
