/* tests/test_mkmodel_q56k.c: the Q6_K and Q5_K quantisers (tools/mkmodel_q56k.h) and
 * `mkmodel` models of those types.
 *
 * Round trip: rows of approximately normal values (with outliers) quantised and dequantised
 * (dtype_dequant_row): NMSE under a bound (Q6_K 1e-3, Q5_K 4e-3: a step of about max/32 per 16
 * values and range/31 per 32 values give ~3e-4 and ~1.3e-3 on normal data; llama.cpp's own
 * quantisers reach 2.9e-4 and 1.2e-3 on the quant-fixtures model), and every element within the
 * format's bound for this rounding (bound_of: a sub-block step plus the 8-bit / 6-bit scales'
 * own rounding). Special rows: zeros stay exactly zero; a constant row, a row of one sign, a
 * lone spike, large values come back within the same bounds.
 * Models: mkmodel_write with dtype Q6_K / Q5_K (dim 256; ffn 96, whose ffn_down rows fall back to
 * Q8_0) gives the right tensor types and file_type, loads with model_load, and its matrices are
 * within the NMSE bound of the F32 file of the same seed; mkmodel_convert of that F32 file to each
 * type gives the same bytes as mkmodel_write. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/dtype.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "tests/check.h"
#include "tools/mkmodel.h"

static const int TYPES[] = {DT_Q6_K, DT_Q5_K};
static char tmpdir[64];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double rng_u01(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}
static float rng_normal(void) /* Box-Muller */
{
    double u = rng_u01(), v = rng_u01();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

/* The largest error the quantiser may make at element k (from x alone). Q6_K: sub-block step
 * s = max|x| / 32 over its 16, d = (the super-block's largest s) / 127; the 8-bit scale is s
 * within d / 2, so an element is within half a (stored) step, or -- the value opposite the
 * extreme, clipped to 31 -- a step, plus 32 times the scale's rounding: s + 17 d. Q5_K: step
 * (hi - lo) / 31 with lo = min(0, min x), hi = max x, min -lo, d and dmin the largest step and
 * min over 63; 6-bit scale and min within d / 2 and dmin / 2: half a step, or at the ends the
 * min's rounding plus 31 times the scale's: step / 2 + 16 d + dmin / 2. Both with the fp16
 * rounding of d (relative 2^-11) as slack. */
static double bound_of(int t, const float *x, int64_t k)
{
    const int64_t s0 = k / 256 * 256;
    if (t == DT_Q6_K) {
        double am = 0, sm = 0;
        for (int64_t i = k / 16 * 16; i < k / 16 * 16 + 16; i++) am = fmax(am, fabs(x[i]));
        for (int64_t i = s0; i < s0 + 256; i++) sm = fmax(sm, fabs(x[i]));
        return (am / 32 + 17 * (sm / 32 / 127)) * (1 + 1.0 / 512);
    }
    double step = 0, dmax = 0, mmax = 0;
    for (int64_t j = s0; j < s0 + 256; j += 32) {
        double lo = 0, hi = x[j];
        for (int64_t i = j; i < j + 32; i++) lo = fmin(lo, x[i]), hi = fmax(hi, x[i]);
        dmax = fmax(dmax, (hi - lo) / 31);
        mmax = fmax(mmax, -lo);
        if (k / 32 * 32 == j) step = (hi - lo) / 31;
    }
    return (step / 2 + 16 * dmax / 63 + mmax / 63 / 2) * (1 + 1.0 / 512);
}

/* Quantise and dequantise x[0..n); returns the NMSE, counts elements beyond a step in *bad. */
static double round_trip(int t, const float *x, int64_t n, int *bad)
{
    void *q = malloc(dtype_row_bytes(t, n));
    float *back = malloc((size_t)n * sizeof(float));
    CHECK(mkmodel_quantize_row(t, x, q, n) == 0);
    dtype_dequant_row(t, q, back, n);
    double e2 = 0, r2 = 0;
    for (int64_t k = 0; k < n; k++) {
        double e = fabs((double)back[k] - x[k]);
        e2 += e * e;
        r2 += (double)x[k] * x[k];
        if (!(e <= bound_of(t, x, k) + 1e-30)) (*bad)++;
    }
    free(q);
    free(back);
    return r2 > 0 ? e2 / r2 : e2;
}

static void test_quantiser(void)
{
    const int64_t n = 8192;
    float *x = malloc(n * sizeof(float));
    for (int ti = 0; ti < 2; ti++) {
        const int t = TYPES[ti];
        for (int64_t k = 0; k < n; k++) x[k] = 0.02f * rng_normal();
        for (int64_t k = 0; k < n; k += 97) x[k] *= 8.0f; /* outliers */
        int bad = 0;
        double nmse = round_trip(t, x, n, &bad);
        fprintf(stderr, "%s round trip: NMSE %.3g\n", dtype_name(t), nmse);
        CHECKF(nmse < (t == DT_Q6_K ? 1e-3 : 4e-3), "%s NMSE %g", dtype_name(t), nmse);
        CHECKF(bad == 0, "%s: %d elements beyond the bound", dtype_name(t), bad);

        /* special rows of one super-block each */
        float s[256 * 5];
        for (int k = 0; k < 256; k++) {
            s[k] = 0.0f;                                  /* zeros */
            s[256 + k] = 0.375f;                          /* constant */
            s[512 + k] = -0.01f - 0.001f * (float)(k % 7); /* one sign */
            s[768 + k] = k == 77 ? 50.0f : 1e-3f * rng_normal(); /* a spike */
            s[1024 + k] = 1e4f * rng_normal();            /* large */
        }
        bad = 0;
        round_trip(t, s, 256 * 5, &bad);
        CHECKF(bad == 0, "%s special rows: %d elements beyond the bound", dtype_name(t), bad);
        void *q = malloc(dtype_row_bytes(t, 256));
        float back[256];
        CHECK(mkmodel_quantize_row(t, s, q, 256) == 0);
        dtype_dequant_row(t, q, back, 256);
        int nz = 0;
        for (int k = 0; k < 256; k++) nz += back[k] != 0.0f;
        CHECKF(nz == 0, "%s: zeros came back as %d non-zeros", dtype_name(t), nz);
        free(q);
        CHECK(mkmodel_quantize_row(t, x, x, 200) == -1); /* not a multiple of 256 */
    }
    CHECK(mkmodel_matrix_type(DT_Q6_K, 512, DT_F32) == DT_Q6_K);
    CHECK(mkmodel_matrix_type(DT_Q5_K, 96, DT_F32) == DT_Q8_0);
    CHECK(mkmodel_matrix_type(DT_Q6_K, 100, DT_F16) == DT_F16);
    free(x);
}

static int64_t n_elems(const gguf_tensor_t *t)
{
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

static void tensor_f32(const gguf_tensor_t *t, float *out)
{
    const int64_t rows = n_elems(t) / t->ne[0];
    const size_t rb = dtype_row_bytes(t->type, t->ne[0]);
    for (int64_t r = 0; r < rows; r++)
        dtype_dequant_row(t->type, (const char *)t->data + (size_t)r * rb, out + r * t->ne[0],
                          t->ne[0]);
}

static void test_models(void)
{
    char pf[128], pq[128], pc[128], err[256];
    snprintf(pf, sizeof pf, "%s/f32.gguf", tmpdir);
    snprintf(pq, sizeof pq, "%s/q.gguf", tmpdir);
    snprintf(pc, sizeof pc, "%s/conv.gguf", tmpdir);
    mkmodel_params_t p;
    CHECK(mkmodel_preset("tiny", &p) == 0);
    p.dim = 256;
    p.n_heads = 4;
    p.n_kv_heads = 2;
    p.ffn_dim = 96;
    p.n_vocab = 320;
    p.ctx_len = 128;
    p.tied = 0;
    p.seed = 7;
    p.dtype = DT_F32;
    CHECK(mkmodel_write(&p, pf, err, sizeof err) == 0);
    gguf_t *gf = gguf_open(pf, err, sizeof err);
    CHECK(gf != NULL);
    for (int ti = 0; ti < 2 && gf; ti++) {
        const int t = TYPES[ti];
        p.dtype = t;
        CHECKF(mkmodel_write(&p, pq, err, sizeof err) == 0, "%s", err);
        gguf_t *g = gguf_open(pq, err, sizeof err);
        CHECKF(g != NULL, "%s", err);
        if (!g) continue;
        uint32_t ft = 0;
        CHECK(gguf_get_u32(g, "general.file_type", &ft) == 0 && ft == (t == DT_Q6_K ? 18u : 16u));
        double e2 = 0, r2 = 0;
        int wrong_type = 0;
        for (int64_t i = 0; i < gguf_n_tensors(gf); i++) {
            const gguf_tensor_t *tf = gguf_tensor(gf, i), *tq = gguf_find_tensor(g, tf->name);
            CHECKF(tq && n_elems(tq) == n_elems(tf), "%s", tf->name);
            if (!tq || tf->n_dims == 1) continue;
            wrong_type += tq->type != (tf->ne[0] % 256 ? DT_Q8_0 : t);
            float *a = malloc((size_t)n_elems(tf) * 4), *b = malloc((size_t)n_elems(tf) * 4);
            tensor_f32(tf, a);
            tensor_f32(tq, b);
            for (int64_t k = 0; k < n_elems(tf); k++) {
                e2 += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
                r2 += (double)a[k] * a[k];
            }
            free(a);
            free(b);
        }
        CHECKF(wrong_type == 0, "%s: %d matrices of another type", dtype_name(t), wrong_type);
        fprintf(stderr, "%s model vs f32: NMSE %.3g\n", dtype_name(t), e2 / r2);
        CHECKF(e2 / r2 < (t == DT_Q6_K ? 1e-3 : 4e-3), "%s model NMSE %g", dtype_name(t), e2 / r2);
        model_t *m = model_load(pq, err, sizeof err);
        CHECKF(m != NULL, "%s: %s", dtype_name(t), err);
        model_free(m);
        /* conversion of the F32 file: the same bytes as the writer */
        mkmodel_convert_t c = {.dtype = t, .pad = 0, .quant = MKMODEL_QUANT_GGML};
        CHECKF(mkmodel_convert(pf, pc, &c, NULL, err, sizeof err) == 0, "%s", err);
        gguf_t *gc = gguf_open(pc, err, sizeof err);
        CHECK(gc != NULL);
        int differ = 0;
        for (int64_t i = 0; gc && i < gguf_n_tensors(g); i++) {
            const gguf_tensor_t *tq = gguf_tensor(g, i), *tc = gguf_find_tensor(gc, tq->name);
            if (!tc || tc->type != tq->type || tc->nbytes != tq->nbytes ||
                memcmp(tc->data, tq->data, tq->nbytes) != 0)
                differ++;
        }
        CHECKF(differ == 0, "%s: %d tensors differ between convert and write", dtype_name(t), differ);
        gguf_close(gc);
        gguf_close(g);
        unlink(pq);
        unlink(pc);
    }
    gguf_close(gf);
    unlink(pf);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "test_mkmodel_q56k.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_quantiser();
    test_models();
    if (rmdir(tmpdir) != 0) {
        fprintf(stderr, "temp dir %s not empty\n", tmpdir);
        check_failures_++;
    }
    return check_exit();
}
