/* engine/sampler.c: per-sequence token sampling and stop-string matching (contract: sampler.h).
 *
 * sampler_sample, in this order:
 *  1. Sanitise logits[] in place: NaN -> -INFINITY, +INFINITY -> FLT_MAX, -0 -> +0 (so that
 *     equal floats are equal radix keys and "lowest id wins ties" holds everywhere).
 *  2. If n_logprobs > 0: log-sum-exp of these raw logits (shifted by their max, summed in
 *     double) and the n_logprobs best ids by (logit desc, id asc) through a small min-heap.
 *     If penalties will change logits[], the raw logits are copied first so the chosen token's
 *     logprob is still the raw one.
 *  3. Penalties, once per distinct token t with count c > 0 in the window (llama.cpp's repeat
 *     penalty, OpenAI's presence/frequency penalties):
 *         l = l > 0 ? l / repeat_penalty : l * repeat_penalty;
 *         l -= (float)c * frequency_penalty + (float)(c > 0) * presence_penalty;
 *     On return logits[] holds the sanitised, penalised logits (temperature is not applied
 *     in place).
 *  4. temperature <= 0: argmax, lowest id on ties; no random number is consumed.
 *  Otherwise exactly one 64-bit random number is drawn per call, whatever the filters keep:
 *  5. top-k (0 < top_k < n_vocab): the top_k largest by (logit desc, id asc), found by a
 *     three-pass radix select on order-preserving 32-bit keys: O(n_vocab), no sort.
 *  6. Temperature and softmax: w_i = exp_neg((l_i - l_max) * (1 / T)) over the candidates
 *     (top-k's, or the whole vocabulary), so the max weighs exactly 1, p_i = w_i / Z, Z = sum
 *     w_i (double). exp_neg is our own polynomial (~1e-7 relative), not libm's expf.
 *  7. min-p (min_p > 0): keep w_i >= min_p, i.e. p_i >= min_p * p_max.
 *  8. top-p (top_p < 1): in the order (w desc, id asc), the shortest prefix whose sum reaches
 *     top_p * Z (Z from step 6: probabilities after top-k), at least one token. min-p also
 *     keeps a prefix of that order, so the result of top-p then min-p is the shorter prefix:
 *     everything at or before a "cut" token that also passes min-p.
 *  9. Renormalise and draw: u in [0,1) (53 bits); the first kept token, in id order, whose
 *     running sum of w exceeds u * (sum of kept w).
 * Random numbers: xoshiro256** whose state is four splitmix64 outputs of params.seed, so a
 * sequence's tokens depend only on its seed and its logits (and, through exp_neg and fixed
 * summation orders, not on libm or on which SIMD path runs).
 *
 * Cost, n = n_vocab: every step is O(n); nothing sorts the vocabulary.
 *  - No top-k, no min-p/top-p: two streaming passes (Z; then the draw, skipping blocks of 16
 *    by their sums); nothing is stored.
 *  - No top-k, min-p or top-p: one streaming pass computes Z and keeps only tokens above a
 *    floor that provably contains every survivor (see sample_stochastic); typically a few
 *    hundred. top-p then works on those: a histogram of w over buckets of 1/16 octave finds
 *    the bucket where the running sum crosses top_p * Z; only that bucket is ordered, by a
 *    heap popped as far as needed. Near-flat distributions (thousands of survivors, one
 *    crowded bucket) are the slow case, still O(n + m log m) for m tokens in that bucket.
 *  - top-k: radix select (one histogram pass over n, the rest over one bin), then the above
 *    on k candidates.
 *
 * Memory: everything is allocated by sampler_new (candidates [n_vocab or top_k, doubled with
 * top-p], radix keys [n_vocab] only with top-k, penalty counts [n_vocab] and a ring
 * [repeat_last_n] or a distinct-token list [n_vocab] only with penalties, a raw copy
 * [n_vocab] only with penalties plus logprobs); sampler_sample and sampler_accept never
 * allocate.
 *
 * Stop strings: one KMP automaton per stop string (state = length of the longest prefix of
 * that string which is a suffix of the text so far). The text itself is not kept: the states
 * are exactly the information a tail of max_len - 1 bytes would give. Per byte: O(n strings)
 * amortised. */
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* ---- errors ---- */

/* ---- random numbers: splitmix64 seeding xoshiro256** ---- */

static uint64_t splitmix64_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t st[4])
{
    const uint64_t out = rotl64(st[1] * 5, 7) * 9;
    const uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl64(st[3], 45);
    return out;
}

/* ---- sampler state ---- */

typedef struct {
    float w;      /* a logit (during top-k gathering) or a softmax weight in (0, 1] */
    int32_t id;
} cand_t;

#define RADIX_BINS 2048
#define RADIX_WAYS 4
/* Top-p buckets: 16 per octave of w in (0, 1] (see wbucket). 0x3F800000 >> 19 = 2032. */
#define WB_SHIFT 19
#define WB_COUNT (0x3F800000u >> WB_SHIFT)

struct sampler {
    sampler_params_t p;
    int n_vocab;
    uint64_t rng[4];

    cand_t *cand;          /* [nc, 2 nc with top-p; nc = top_k or n_vocab] candidates */
    uint32_t *keys;        /* [n_vocab] radix-select scratch; NULL unless 0 < top_k < n_vocab */
    float *raw;            /* [n_vocab] raw-logit copy; NULL unless penalties and n_logprobs */

    /* Penalty history; pen_on == 0 means penalties are off and all of this is NULL/0. */
    int pen_on;
    int32_t *count;        /* [n_vocab] occurrences of each id inside the window */
    int32_t *ring;         /* [repeat_last_n] last ids, when repeat_last_n > 0 */
    int ring_len, ring_head;   /* filled slots; next slot to write (the oldest once full) */
    int32_t *seen;         /* [n_vocab] distinct ids seen, when repeat_last_n == -1 */
    int n_seen;

    uint32_t hist[RADIX_WAYS * RADIX_BINS];  /* radix-select histograms */
    uint32_t bcount[WB_COUNT];     /* top-p bucket sizes */
    double bsum[WB_COUNT];         /* top-p bucket weight sums */
    sampler_logprob_t heap[SAMPLER_MAX_LOGPROBS];  /* logprob min-heap; .logprob holds a logit */
};

void sampler_params_default(sampler_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
    p->n_logprobs = 0;
}

int sampler_params_validate(const sampler_params_t *p, char *errstr, size_t errlen)
{
    if (!p) {
        sw_seterr(errstr, errlen, "sampler: no parameters");
        return -1;
    }
    if (!isfinite(p->temperature)) {
        sw_seterr(errstr, errlen, "sampler: temperature must be a finite number");
        return -1;
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        sw_seterr(errstr, errlen, "sampler: top_p must be in (0, 1], got %g", (double)p->top_p);
        return -1;
    }
    if (!(p->min_p <= 1.0f)) { /* also rejects NaN */
        sw_seterr(errstr, errlen, "sampler: min_p must be at most 1, got %g", (double)p->min_p);
        return -1;
    }
    if (isinf(p->min_p)) {
        sw_seterr(errstr, errlen, "sampler: min_p must be finite");
        return -1;
    }
    if (!(isfinite(p->repeat_penalty) && p->repeat_penalty > 0.0f)) {
        sw_seterr(errstr, errlen, "sampler: repeat_penalty must be finite and > 0, got %g",
                  (double)p->repeat_penalty);
        return -1;
    }
    if (p->repeat_last_n < -1 || p->repeat_last_n > SAMPLER_MAX_REPEAT_LAST_N) {
        sw_seterr(errstr, errlen, "sampler: repeat_last_n must be -1..%d, got %d",
                  SAMPLER_MAX_REPEAT_LAST_N, p->repeat_last_n);
        return -1;
    }
    if (!isfinite(p->presence_penalty)) {
        sw_seterr(errstr, errlen, "sampler: presence_penalty must be finite");
        return -1;
    }
    if (!isfinite(p->frequency_penalty)) {
        sw_seterr(errstr, errlen, "sampler: frequency_penalty must be finite");
        return -1;
    }
    if (p->n_logprobs < 0 || p->n_logprobs > SAMPLER_MAX_LOGPROBS) {
        sw_seterr(errstr, errlen, "sampler: n_logprobs must be 0..%d, got %d",
                  SAMPLER_MAX_LOGPROBS, p->n_logprobs);
        return -1;
    }
    return 0;
}

sampler_t *sampler_new(const sampler_params_t *p, int n_vocab, char *errstr, size_t errlen)
{
    sampler_t *s = NULL;
    if (sampler_params_validate(p, errstr, errlen) != 0)
        return NULL;
    if (n_vocab <= 0) {
        sw_seterr(errstr, errlen, "sampler: n_vocab must be > 0, got %d", n_vocab);
        return NULL;
    }
    const size_t nv = (size_t)n_vocab;

    /* The scratch arrays from hist on (56 KiB) are cleared where they are used: zeroing only
     * the fields before them keeps creating a sampler cheap (one per request). */
    s = malloc(sizeof *s);
    if (!s)
        goto oom;
    memset(s, 0, offsetof(struct sampler, hist));
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64_next(&x);

    const int use_top_k = p->top_k > 0 && p->top_k < n_vocab;
    /* nc candidates (nc <= top_k or n_vocab) plus room to gather their crossing top-p bucket */
    const size_t ncand = use_top_k ? (size_t)p->top_k : nv;
    s->cand = malloc((p->top_p < 1.0f ? 2 * ncand : ncand) * sizeof *s->cand);
    if (!s->cand)
        goto oom;
    if (use_top_k) {
        s->keys = malloc(nv * sizeof *s->keys);
        if (!s->keys)
            goto oom;
    }
    s->pen_on = p->repeat_last_n != 0 &&
                (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
                 p->frequency_penalty != 0.0f);
    if (s->pen_on) {
        s->count = calloc(nv, sizeof *s->count);
        if (!s->count)
            goto oom;
        if (p->repeat_last_n > 0) {
            s->ring = malloc((size_t)p->repeat_last_n * sizeof *s->ring);
            if (!s->ring)
                goto oom;
        } else {
            s->seen = malloc(nv * sizeof *s->seen);
            if (!s->seen)
                goto oom;
        }
        if (p->n_logprobs > 0) {
            s->raw = malloc(nv * sizeof *s->raw);
            if (!s->raw)
                goto oom;
        }
    }
    return s;

oom:
    sw_seterr(errstr, errlen, "sampler: out of memory (n_vocab %d)", n_vocab);
    sampler_free(s);
    return NULL;
}

void sampler_free(sampler_t *s)
{
    if (!s)
        return;
    free(s->raw);
    free(s->seen);
    free(s->ring);
    free(s->count);
    free(s->keys);
    free(s->cand);
    free(s);
}

int sampler_mask_logits(float *logits, int n_vocab, const uint32_t *mask)
{
    int allowed = 0;
    for (int w = 0; w * 32 < n_vocab; w++) {
        uint32_t m = mask[w];
        int n = n_vocab - w * 32 < 32 ? n_vocab - w * 32 : 32;
        if (n == 32 && m == 0xffffffffu) {
            allowed += 32;
            continue;
        }
        for (int b = 0; b < n; b++) {
            if ((m >> b) & 1u) allowed++;
            else logits[w * 32 + b] = -INFINITY;
        }
    }
    return allowed;
}

void sampler_accept(sampler_t *s, int32_t id)
{
    if (!s->pen_on || id < 0 || id >= s->n_vocab)
        return;
    const int win = s->p.repeat_last_n;
    if (win > 0) {
        if (s->ring_len == win)
            s->count[s->ring[s->ring_head]]--;   /* evict the oldest */
        else
            s->ring_len++;
        s->ring[s->ring_head] = id;
        s->ring_head = s->ring_head + 1 == win ? 0 : s->ring_head + 1;
        s->count[id]++;
    } else {
        if (s->count[id] == 0)
            s->seen[s->n_seen++] = id;
        if (s->count[id] < INT32_MAX)
            s->count[id]++;
    }
}

uint64_t sampler_draw(sampler_t *s)
{
    return s->p.temperature > 0.0f ? xoshiro_next(s->rng) : 0;
}

int32_t sampler_evict_next(const sampler_t *s)
{
    const int win = s->p.repeat_last_n;
    return s->pen_on && win > 0 && s->ring_len == win ? s->ring[s->ring_head] : -1;
}

const int32_t *sampler_penalty_counts(const sampler_t *s)
{
    return s->pen_on ? s->count : NULL;
}

/* ---- vector-friendly kernels ----
 * GCC at -O2 vectorises only loops whose trip count is known, so the long loops below walk
 * blocks of BLK elements with fixed inner loops (per-lane accumulators, fixed summation
 * order) and treat the tail as a block padded with -INFINITY. On x86-64 the streaming passes
 * are also built for AVX2 and picked at load time; FP contraction is off (ISO C mode) and AVX2
 * alone has no FMA, so both versions compute bit-identical results. */

#define BLK 16

/* Not under ThreadSanitizer: the clones' resolvers run during relocation, before its runtime
 * is up (gcc defines __SANITIZE_THREAD__ for -fsanitize=thread). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define VEC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VEC_CLONES
#endif

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* e^x for x <= 0 (or -inf), within ~1e-7 relative; exactly 1 at 0 and exactly 0 below -86
 * (weights under e^-86 ~ 4e-38 of the top token's are dropped). Our own polynomial rather than
 * libm, so the same logits give the same tokens whichever libm is installed. */
static inline float exp_neg(float x)
{
    const float t = x * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: rounds x*log2(e) */
    const float nf = t - 12582912.0f;
    const float r = (x - nf * 0.693145751953125f) - nf * 1.428606765330187045e-06f;
    float q = 1.0f / 5040.0f;
    q = q * r + 1.0f / 720.0f;
    q = q * r + 1.0f / 120.0f;
    q = q * r + 1.0f / 24.0f;
    q = q * r + 1.0f / 6.0f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    q = q * r + 1.0f;
    const uint32_t scale = (f2u(t) - 0x4B400000u + 127u) << 23; /* 2^n, n in [-124, 0] */
    const uint32_t keep = 0u - (uint32_t)(x >= -86.0f);
    return u2f(f2u(q * u2f(scale)) & keep);
}

/* Softmax weight of logit l: exp_neg((l - mx) * inv_t), in [0, 1]. */
static inline float weight(float l, float mx, float inv_t)
{
    return exp_neg((l - mx) * inv_t);
}

/* Block i of l[0..n) as BLK values: l + i when whole, else the tail copied into pad and padded
 * with -INFINITY. *m gets how many are real. */
static inline const float *block_at(const float *l, int n, int i, float *pad, int *m)
{
    if (n - i >= BLK) {
        *m = BLK;
        return l + i;
    }
    *m = n - i;
    for (int j = 0; j < BLK; j++)
        pad[j] = j < *m ? l[i + j] : -INFINITY;
    return pad;
}

/* Max of l[0..n) ignoring NaN (-INFINITY if none); *odd set when a NaN, +inf or -0 occurs. */
VEC_CLONES static float scan_max(const float *l, int n, int *odd)
{
    float m[BLK], pad[BLK];
    uint32_t bad[BLK];
    for (int j = 0; j < BLK; j++) {
        m[j] = -INFINITY;
        bad[j] = 0;
    }
    for (int i = 0; i < n; i += BLK) {
        int nr;
        const float *v = block_at(l, n, i, pad, &nr);
        for (int j = 0; j < BLK; j++) {
            const uint32_t b = f2u(v[j]);
            m[j] = v[j] > m[j] ? v[j] : m[j];
            bad[j] |= (uint32_t)((b & 0x7FFFFFFFu) > 0x7F800000u) |
                      (uint32_t)(b == 0x7F800000u) | (uint32_t)(b == 0x80000000u);
        }
    }
    float mx = -INFINITY;
    uint32_t any = 0;
    for (int j = 0; j < BLK; j++) {
        mx = m[j] > mx ? m[j] : mx;
        any |= bad[j];
    }
    *odd = any != 0;
    return mx;
}

/* ---- sampling steps ---- */

/* Step 1; returns the max. */
static float sanitize(float *l, int n)
{
    int odd;
    float mx = scan_max(l, n, &odd);
    if (!odd)
        return mx;
    for (int i = 0; i < n; i++) {
        const float v = l[i];
        if (isnan(v))
            l[i] = -INFINITY;
        else if (v > FLT_MAX)
            l[i] = FLT_MAX;
        else if (v == 0.0f)
            l[i] = 0.0f;
    }
    return scan_max(l, n, &odd);
}

/* a ranks before b: larger value, then lower id. */
static inline int ranks_before(float av, int32_t aid, float bv, int32_t bid)
{
    return av > bv || (av == bv && aid < bid);
}

static void lp_sift_down(sampler_logprob_t *h, int n, int i)
{
    for (;;) {
        int worst = i, a = 2 * i + 1, b = a + 1;
        if (a < n && ranks_before(h[worst].logprob, h[worst].id, h[a].logprob, h[a].id))
            worst = a;
        if (b < n && ranks_before(h[worst].logprob, h[worst].id, h[b].logprob, h[b].id))
            worst = b;
        if (worst == i)
            return;
        sampler_logprob_t t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* Offers id i with logit v to the logprob min-heap (root = the worst kept) of k entries. */
static void lp_offer(sampler_logprob_t *h, int *hn, int k, int32_t i, float v)
{
    if (*hn < k) {
        int j = (*hn)++;
        h[j].id = i;
        h[j].logprob = v;
        while (j > 0) {
            int par = (j - 1) / 2;
            if (!ranks_before(h[par].logprob, h[par].id, h[j].logprob, h[j].id))
                break;
            sampler_logprob_t t = h[par];
            h[par] = h[j];
            h[j] = t;
            j = par;
        }
    } else if (v > h[0].logprob) { /* ids arrive in order: a later id never wins a tie */
        h[0].id = i;
        h[0].logprob = v;
        lp_sift_down(h, *hn, 0);
    }
}

/* Step 2 streaming part: sum of e^(l - mx) over l[0..n); with h, also the k best (logit desc,
 * id asc) into the min-heap h[0..*hn). */
VEC_CLONES static double lse_pass(const float *l, int n, float mx, sampler_logprob_t *h,
                                  int *hn, int k)
{
    double lane[BLK];
    float pad[BLK], w[BLK];
    for (int j = 0; j < BLK; j++)
        lane[j] = 0.0;
    for (int i = 0; i < n; i += BLK) {
        int m;
        const float *v = block_at(l, n, i, pad, &m);
        for (int j = 0; j < BLK; j++) {
            w[j] = weight(v[j], mx, 1.0f);
            lane[j] += (double)w[j];
        }
        if (!h)
            continue;
        /* Only blocks holding something better than the heap's worst are walked. */
        const float thr = *hn < k ? -INFINITY : h[0].logprob;
        int any = *hn < k;
        for (int j = 0; j < BLK; j++)
            any |= v[j] > thr;
        if (any)
            for (int j = 0; j < m; j++)
                lp_offer(h, hn, k, i + j, v[j]);
    }
    double sum = 0.0;
    for (int j = 0; j < BLK; j++)
        sum += lane[j];
    return sum;
}

/* Step 2: returns log-sum-exp of l[0..n) (sanitised, max mx); fills top[0..k) when top. */
static double logprob_pass(sampler_t *s, const float *l, int n, float mx,
                           sampler_logprob_t *top, int k)
{
    sampler_logprob_t *h = s->heap;
    int hn = 0;
    if (mx == -INFINITY) { /* every logit is -inf: all logprobs are -inf, ids in order */
        for (int i = 0; top && i < k; i++) {
            top[i].id = i < n ? i : -1;
            top[i].logprob = -INFINITY;
        }
        return 0.0;
    }
    const double lse = (double)mx + log(lse_pass(l, n, mx, top ? h : NULL, &hn, k));
    if (!top)
        return lse;
    /* Insertion sort, best first (hn <= SAMPLER_MAX_LOGPROBS). */
    for (int i = 1; i < hn; i++) {
        sampler_logprob_t t = h[i];
        int j = i;
        while (j > 0 && ranks_before(t.logprob, t.id, h[j - 1].logprob, h[j - 1].id)) {
            h[j] = h[j - 1];
            j--;
        }
        h[j] = t;
    }
    for (int i = 0; i < k; i++) {
        if (i < hn) {
            top[i].id = h[i].id;
            top[i].logprob = (float)((double)h[i].logprob - lse);
        } else {
            top[i].id = -1;
            top[i].logprob = -INFINITY;
        }
    }
    return lse;
}

static inline void penalize(const sampler_params_t *p, float *l, int32_t c)
{
    float v = *l;
    v = v > 0.0f ? v / p->repeat_penalty : v * p->repeat_penalty;
    v -= (float)c * p->frequency_penalty + (float)(c > 0) * p->presence_penalty;
    /* keep step 1's invariants: overflow to +inf -> FLT_MAX, -inf - -inf -> -inf, -0 -> +0 */
    if (isnan(v))
        v = -INFINITY;
    else if (v > FLT_MAX)
        v = FLT_MAX;
    else if (v == 0.0f)
        v = 0.0f;
    *l = v;
}

/* Step 3: true when some token is in the window. */
static int penalties_pending(const sampler_t *s)
{
    return s->pen_on && (s->ring_len > 0 || s->n_seen > 0);
}

static void apply_penalties(sampler_t *s, float *l)
{
    if (s->p.repeat_last_n > 0) {
        /* A token may sit in several slots: mark it done by negating its count, then undo. */
        for (int j = 0; j < s->ring_len; j++) {
            int32_t t = s->ring[j];
            int32_t c = s->count[t];
            if (c > 0) {
                penalize(&s->p, &l[t], c);
                s->count[t] = -c;
            }
        }
        for (int j = 0; j < s->ring_len; j++) {
            int32_t t = s->ring[j];
            if (s->count[t] < 0)
                s->count[t] = -s->count[t];
        }
    } else {
        for (int j = 0; j < s->n_seen; j++)
            penalize(&s->p, &l[s->seen[j]], s->count[s->seen[j]]);
    }
}

/* First id holding the max mx (l sanitised; 0 when everything is -inf). */
static int32_t first_of(const float *l, int n, float mx)
{
    if (mx == -INFINITY)
        return 0;
    for (int i = 0; i < n; i++)
        if (l[i] == mx)
            return i;
    return 0;
}

/* Order-preserving map of non-NaN floats to uint32 (-0 and +0 differ; step 1 removed -0). */
static inline uint32_t float_key(float f)
{
    const uint32_t b = f2u(f);
    return b ^ ((0u - (b >> 31)) | 0x80000000u);
}

/* Radix pass 0 over l[0..n): histogram of key >> 21 into h (RADIX_WAYS interleaved copies). */
VEC_CLONES static void hist_top_bits(const float *l, int n, uint32_t *h)
{
    float pad[BLK];
    uint32_t key[BLK];
    for (int i = 0; i < n; i += BLK) {
        int m;
        const float *v = block_at(l, n, i, pad, &m);
        for (int j = 0; j < BLK; j++)
            key[j] = float_key(v[j]) >> 21;
        for (int j = 0; j < m; j++)
            h[(j % RADIX_WAYS) * RADIX_BINS + key[j]]++;
    }
}

/* The keys of l[0..n) with key >> 21 == bin into keys; returns their count. */
VEC_CLONES static int gather_bin(const float *l, int n, uint32_t bin, uint32_t *keys)
{
    float pad[BLK];
    uint32_t key[BLK];
    int cnt = 0;
    for (int i = 0; i < n; i += BLK) {
        int m;
        const float *v = block_at(l, n, i, pad, &m);
        int any = 0;
        for (int j = 0; j < BLK; j++) {
            key[j] = float_key(v[j]);
            any |= (key[j] >> 21) == bin;
        }
        if (any)
            for (int j = 0; j < m; j++) {
                keys[cnt] = key[j];
                cnt += (key[j] >> 21) == bin;
            }
    }
    return cnt;
}

/* Tokens of l[0..n) whose key is > kth, then (lowest ids first) ties == kth until k are taken,
 * into cand in id order with .w = logit. Blocks without a key >= kth are skipped. */
VEC_CLONES static void gather_top(const float *l, int n, uint32_t kth, int ties, cand_t *out)
{
    float pad[BLK];
    int nc = 0;
    for (int i = 0; i < n; i += BLK) {
        int m;
        const float *v = block_at(l, n, i, pad, &m);
        int any = 0;
        for (int j = 0; j < BLK; j++)
            any |= float_key(v[j]) >= kth;
        if (!any)
            continue;
        for (int j = 0; j < m; j++) {
            const uint32_t key = float_key(v[j]);
            if (key > kth || (key == kth && ties-- > 0)) {
                out[nc].w = v[j];
                out[nc].id = i + j;
                nc++;
            }
        }
    }
}

/* Step 5: the k largest of l[0..n) (1 <= k < n) by (value desc, id asc) into cand[0..k), in
 * id order, .w = logit. Radix select over 11 + 11 + 10 key bits finds the k-th largest key
 * kth and how many keys lie strictly above it. Logits crowd into few top-bit bins, so the
 * histogram is kept as RADIX_WAYS interleaved copies to keep increments independent. */
static void select_top_k(sampler_t *s, const float *l, int n, int k)
{
    static const int shift[3] = {21, 10, 0};
    static const uint32_t mask[3] = {0x7FF, 0x7FF, 0x3FF};
    uint32_t *keys = s->keys, *h = s->hist;
    uint32_t kth = 0;
    int above = 0, rank = k, m = n;

    for (int pass = 0; pass < 3; pass++) {
        const int sh = shift[pass];
        const uint32_t mk = mask[pass];
        memset(h, 0, sizeof s->hist);
        if (pass == 0) {
            hist_top_bits(l, n, h);
        } else {
            int i = 0;
            for (; i + RADIX_WAYS <= m; i += RADIX_WAYS)
                for (int w = 0; w < RADIX_WAYS; w++)
                    h[w * RADIX_BINS + ((keys[i + w] >> sh) & mk)]++;
            for (; i < m; i++)
                h[(keys[i] >> sh) & mk]++;
        }
        for (uint32_t b = 0; b <= mk; b++)
            for (int w = 1; w < RADIX_WAYS; w++)
                h[b] += h[w * RADIX_BINS + b];
        uint32_t b = mk, acc = 0;
        while (acc + h[b] < (uint32_t)rank) /* the bins sum to m >= rank: terminates */
            acc += h[b--];
        rank -= (int)acc;
        above += (int)acc;
        kth |= b << sh;
        if (pass == 0) {
            m = gather_bin(l, n, b, keys);
        } else if (pass == 1) { /* in place: write index <= read index */
            int w = 0;
            for (int i = 0; i < m; i++) {
                keys[w] = keys[i];
                w += ((keys[i] >> sh) & mk) == b;
            }
            m = w;
        }
    }
    gather_top(l, n, kth, k - above, s->cand);
}

/* Bucket of a weight w in (0, 1]: 0 holds [~0.96, 1], larger buckets hold smaller w. */
static inline uint32_t wbucket(float w)
{
    const uint32_t b = f2u(w);
    return b >= 0x3F800000u ? 0 : (0x3F800000u - b) >> WB_SHIFT;
}

static inline void hist_add(sampler_t *s, float w)
{
    const uint32_t b = wbucket(w);
    s->bcount[b]++;
    s->bsum[b] += (double)w;
}

/* The kept set after min-p and top-p: w >= wmin and (w, id) at or before the cut in the
 * order (w desc, id asc). No top-p cut: cw = 0 (every kept w > 0). */
typedef struct {
    float wmin;
    float cw;
    int32_t cid;
} keep_t;

static inline int kept(const keep_t *k, float w, int32_t id)
{
    return (w >= k->wmin) & ((w > k->cw) | ((w == k->cw) & (id <= k->cid)));
}

static inline void cand_swap(cand_t *a, cand_t *b)
{
    cand_t t = *a;
    *a = *b;
    *b = t;
}

/* Max-heap by (w desc, id asc) over c[0..n). */
static void cand_sift_down(cand_t *c, int n, int i)
{
    for (;;) {
        int best = i, a = 2 * i + 1, b = a + 1;
        if (a < n && ranks_before(c[a].w, c[a].id, c[best].w, c[best].id))
            best = a;
        if (b < n && ranks_before(c[b].w, c[b].id, c[best].w, c[best].id))
            best = b;
        if (best == i)
            return;
        cand_swap(&c[i], &c[best]);
        i = best;
    }
}

/* Step 8, first half: the bucket where the running sum of kept weights (bucket by bucket, from
 * the largest) reaches target, and in *cum the sum of the buckets before it. WB_COUNT when the
 * kept weights never reach it (min-p removed mass): no cut. */
static uint32_t crossing_bucket(const sampler_t *s, double target, double *cum)
{
    double c = 0.0;
    for (uint32_t B = 0; B < WB_COUNT; B++) {
        if (s->bcount[B] && c + s->bsum[B] >= target) {
            *cum = c;
            return B;
        }
        c += s->bsum[B];
    }
    *cum = c;
    return WB_COUNT;
}

/* Step 8, second half: seg[0..nb) holds the crossing bucket's kept tokens. Pops them largest
 * first until cum reaches target; the last popped is the cut. Returns the kept mass. */
static double cut_in_bucket(cand_t *seg, int nb, double cum, double target, keep_t *k)
{
    for (int i = nb / 2 - 1; i >= 0; i--)
        cand_sift_down(seg, nb, i);
    int heap_n = nb;
    while (heap_n > 0) { /* cum < target on entry, so at least one pop */
        cand_swap(&seg[0], &seg[heap_n - 1]);
        heap_n--;
        cand_sift_down(seg, heap_n, 0);
        cum += (double)seg[heap_n].w;
        k->cw = seg[heap_n].w;
        k->cid = seg[heap_n].id;
        if (cum >= target)
            break;
    }
    return cum;
}

/* Full vocabulary, no filter: the sum of all weights of l[0..n). */
VEC_CLONES static double weigh_pass(const float *l, int n, float mx, float inv_t)
{
    double za[BLK];
    float pad[BLK];
    for (int j = 0; j < BLK; j++)
        za[j] = 0.0;
    for (int i = 0; i < n; i += BLK) {
        int m;
        const float *v = block_at(l, n, i, pad, &m);
        for (int j = 0; j < BLK; j++)
            za[j] += (double)weight(v[j], mx, inv_t);
    }
    double z = 0.0;
    for (int j = 0; j < BLK; j++)
        z += za[j];
    return z;
}

/* Full vocabulary, filtered: returns the sum of all weights of l[0..n) and appends the tokens
 * with weight >= floor to out (in id order); *nc gets their count. */
VEC_CLONES static double collect_pass(const float *l, int n, float mx, float inv_t, float floor,
                                      cand_t *out, int *nc)
{
    double za[BLK];
    float pad[BLK], w[BLK];
    int cnt = 0;
    for (int j = 0; j < BLK; j++)
        za[j] = 0.0;
    for (int i = 0; i < n; i += BLK) {
        int m;
        const float *v = block_at(l, n, i, pad, &m);
        int any = 0;
        for (int j = 0; j < BLK; j++) {
            w[j] = weight(v[j], mx, inv_t);
            za[j] += (double)w[j];
            any |= w[j] >= floor;
        }
        if (any)
            for (int j = 0; j < m; j++) { /* branch-free: the slot is overwritten if not kept */
                out[cnt].w = w[j];
                out[cnt].id = i + j;
                cnt += w[j] >= floor;
            }
    }
    double z = 0.0;
    for (int j = 0; j < BLK; j++)
        z += za[j];
    *nc = cnt;
    return z;
}

/* Full vocabulary, no filter: the first id whose running weight exceeds r; blocks are skipped
 * by their sums. -1 if rounding left r beyond the end. */
VEC_CLONES static int32_t draw_pass(const float *l, int n, float mx, float inv_t, double r)
{
    float pad[BLK], w[BLK];
    double d[BLK / 2];
    double acc = 0.0;
    for (int i = 0; i < n; i += BLK) {
        int m;
        const float *v = block_at(l, n, i, pad, &m);
        for (int j = 0; j < BLK; j++)
            w[j] = weight(v[j], mx, inv_t);
        for (int j = 0; j < BLK / 2; j++)
            d[j] = (double)w[j] + (double)w[j + BLK / 2];
        for (int h = BLK / 4; h >= 1; h /= 2)
            for (int j = 0; j < h; j++)
                d[j] += d[j + h];
        if (r < acc + d[0]) {
            double a = acc;
            for (int j = 0; j < m; j++) {
                a += (double)w[j];
                if (w[j] > 0.0f && r < a)
                    return i + j;
            }
        }
        acc += d[0];
    }
    return -1;
}

/* Steps 7-9 on the candidates cand[0..nc) (id order, .w = weight, containing every token
 * that can survive min-p and top-p; Z = the weight sum of all candidates of step 6). */
static int32_t finish(sampler_t *s, int nc, double Z, keep_t *k, double u)
{
    const sampler_params_t *p = &s->p;
    cand_t *c = s->cand;
    const int use_top_p = p->top_p < 1.0f;
    double tot = 0.0;
    if (use_top_p) {
        memset(s->bcount, 0, sizeof s->bcount);
        memset(s->bsum, 0, sizeof s->bsum);
    }
    for (int i = 0; i < nc; i++)
        if (c[i].w >= k->wmin) {
            tot += (double)c[i].w;
            if (use_top_p)
                hist_add(s, c[i].w);
        }
    if (use_top_p) {
        const double target = (double)p->top_p * Z;
        double cum;
        const uint32_t B = crossing_bucket(s, target, &cum);
        if (B < WB_COUNT) {
            cand_t *seg = c + nc; /* cand has room for 2 * nc */
            int nb = 0;
            for (int i = 0; i < nc; i++)
                if (c[i].w >= k->wmin && wbucket(c[i].w) == B)
                    seg[nb++] = c[i];
            tot = cut_in_bucket(seg, nb, cum, target, k);
        }
    }
    const double r = u * tot;
    double acc = 0.0;
    int32_t last = -1;
    for (int i = 0; i < nc; i++) {
        if (!kept(k, c[i].w, c[i].id))
            continue;
        acc += (double)c[i].w;
        last = c[i].id;
        if (r < acc)
            return c[i].id;
    }
    return last; /* r past the end by rounding; the max is always kept, so last >= 0 */
}

/* Steps 5-9 (temperature > 0); mx = max of l (sanitised, penalised). */
static int32_t sample_stochastic(sampler_t *s, const float *l, float mx)
{
    const sampler_params_t *p = &s->p;
    const int n = s->n_vocab;
    const uint64_t r64 = xoshiro_next(s->rng); /* exactly one draw per call */
    const double u = (double)(r64 >> 11) * 0x1.0p-53;
    const float inv_t = 1.0f / p->temperature;
    /* min-p as a weight floor (w >= min_p <=> p >= min_p * p_max); off: w > 0, and as
     * exp_neg never returns a denormal, w >= FLT_MIN is the same. */
    keep_t k = {p->min_p > FLT_MIN ? p->min_p : FLT_MIN, 0.0f, -1};
    cand_t *c = s->cand;

    if (!(inv_t <= FLT_MAX)) /* T so small that 1/T overflows: the limit is greedy */
        return first_of(l, n, mx);
    if (p->top_k > 0 && p->top_k < n) {
        const int nk = p->top_k;
        select_top_k(s, l, n, nk);
        mx = -INFINITY;
        for (int i = 0; i < nk; i++)
            mx = c[i].w > mx ? c[i].w : mx;
        if (mx == -INFINITY)
            return c[0].id; /* every candidate is -inf: the lowest id */
        double Z = 0.0;
        for (int i = 0; i < nk; i++) {
            c[i].w = weight(c[i].w, mx, inv_t);
            Z += (double)c[i].w;
        }
        return finish(s, nk, Z, &k, u);
    }

    if (mx == -INFINITY)
        return 0;
    if (p->top_p >= 1.0f && p->min_p <= 0.0f) { /* no filter: stream, keep nothing */
        const double Z = weigh_pass(l, n, mx, inv_t);
        int32_t id = draw_pass(l, n, mx, inv_t, u * Z);
        if (id < 0) /* r past the end by rounding: the last token with a weight */
            for (id = n - 1; id > 0 && !(weight(l[id], mx, inv_t) > 0.0f); id--)
                ;
        return id;
    }
    /* Only tokens that can survive the filters become candidates. min-p: w >= min_p. top-p:
     * let c be the cut token; everything after it weighs <= w_c and sums to more than
     * (1 - top_p) Z - w_c, so w_c > (1 - top_p) Z / n; and Z >= 1 (the max weighs 1). Hence
     * a token with w < (1 - top_p) / n is never in the nucleus; half of that leaves margin
     * for rounding. Typically a few hundred tokens pass. */
    float floor = k.wmin;
    if (p->top_p < 1.0f) {
        const float f = (float)(0.5 * (1.0 - (double)p->top_p) / ((double)n + 1.0));
        floor = f > floor ? f : floor;
    }
    int nc;
    const double Z = collect_pass(l, n, mx, inv_t, floor, c, &nc);
    return finish(s, nc, Z, &k, u);
}

int32_t sampler_sample(sampler_t *s, float *logits, sampler_logprob_t *top,
                       sampler_logprob_t *chosen)
{
    const sampler_params_t *p = &s->p;
    const int n = s->n_vocab;
    const float raw_max = sanitize(logits, n);

    const int want_lp = p->n_logprobs > 0 && (top || chosen);
    double lse = 0.0;
    if (want_lp)
        lse = logprob_pass(s, logits, n, raw_max, top, p->n_logprobs);

    const int pen = penalties_pending(s);
    const int keep_raw = pen && want_lp && chosen;
    float mx = raw_max;
    if (keep_raw)
        memcpy(s->raw, logits, (size_t)n * sizeof *logits);
    if (pen) {
        int odd;
        apply_penalties(s, logits);
        mx = scan_max(logits, n, &odd);
    }

    const int32_t id =
        p->temperature > 0.0f ? sample_stochastic(s, logits, mx) : first_of(logits, n, mx);

    if (want_lp && chosen) {
        const float raw = keep_raw ? s->raw[id] : logits[id];
        chosen->id = id;
        chosen->logprob = raw_max > -INFINITY ? (float)((double)raw - lse) : -INFINITY;
    }
    return id;
}

/* ---- stop strings ---- */

struct stop_matcher {
    int n;
    size_t *len;           /* [n] byte length of each stop string (> 0) */
    size_t *off;           /* [n] offset of each string in bytes[] and fail[] */
    size_t *state;         /* [n] longest prefix of string j that is a suffix of the text */
    unsigned char *bytes;  /* [sum len] the strings, concatenated */
    size_t *fail;          /* [sum len] KMP: fail[off+i] = longest proper border of s[0..i] */
    size_t total;          /* bytes consumed (up to the stop) */
    size_t final_len;      /* once stopped: the length of the output */
    int stopped;
};

stop_matcher_t *stop_matcher_new(const char *const *strs, int n, char *errstr, size_t errlen)
{
    stop_matcher_t *m = NULL;
    if (n < 0 || (n > 0 && !strs)) {
        sw_seterr(errstr, errlen, "stop: bad stop-string list");
        return NULL;
    }
    size_t sum = 0;
    for (int j = 0; j < n; j++) {
        if (!strs[j] || strs[j][0] == '\0') {
            sw_seterr(errstr, errlen, "stop: stop string %d is empty", j);
            return NULL;
        }
        sum += strlen(strs[j]);
    }
    m = calloc(1, sizeof *m);
    if (!m)
        goto oom;
    m->n = n;
    const size_t nn = n > 0 ? (size_t)n : 1, ns = sum > 0 ? sum : 1;
    m->len = calloc(nn, sizeof *m->len);
    m->off = calloc(nn, sizeof *m->off);
    m->state = calloc(nn, sizeof *m->state);
    m->bytes = malloc(ns);
    m->fail = malloc(ns * sizeof *m->fail);
    if (!m->len || !m->off || !m->state || !m->bytes || !m->fail)
        goto oom;

    size_t o = 0;
    for (int j = 0; j < n; j++) {
        const size_t L = strlen(strs[j]);
        const unsigned char *sj = m->bytes + o;
        size_t *f = m->fail + o;
        memcpy(m->bytes + o, strs[j], L);
        m->len[j] = L;
        m->off[j] = o;
        f[0] = 0;
        size_t k = 0;
        for (size_t i = 1; i < L; i++) {
            while (k > 0 && sj[i] != sj[k])
                k = f[k - 1];
            if (sj[i] == sj[k])
                k++;
            f[i] = k;
        }
        o += L;
    }
    return m;

oom:
    sw_seterr(errstr, errlen, "stop: out of memory");
    stop_matcher_free(m);
    return NULL;
}

void stop_matcher_free(stop_matcher_t *m)
{
    if (!m)
        return;
    free(m->fail);
    free(m->bytes);
    free(m->state);
    free(m->off);
    free(m->len);
    free(m);
}

size_t stop_matcher_push(stop_matcher_t *m, const char *text, size_t len, int *stopped)
{
    if (!m->stopped) {
        const unsigned char *t = (const unsigned char *)text;
        for (size_t i = 0; i < len; i++) {
            const unsigned char ch = t[i];
            size_t done = 0; /* length of the longest stop string completed by this byte */
            m->total++;
            for (int j = 0; j < m->n; j++) {
                const unsigned char *sj = m->bytes + m->off[j];
                const size_t *f = m->fail + m->off[j];
                size_t st = m->state[j];     /* < len[j]: a full match stops the stream */
                while (st > 0 && sj[st] != ch)
                    st = f[st - 1];
                if (sj[st] == ch)
                    st++;
                m->state[j] = st;
                if (st == m->len[j] && st > done)
                    done = st;
            }
            if (done) {
                m->stopped = 1;
                m->final_len = m->total - done;
                break;
            }
        }
    }
    if (stopped)
        *stopped = m->stopped;
    if (m->stopped)
        return m->final_len;
    size_t pending = 0;
    for (int j = 0; j < m->n; j++)
        if (m->state[j] > pending)
            pending = m->state[j];
    return m->total - pending;
}
