/* tests/test_sampler.c: engine/sampler.c against brute-force references.
 *
 * Sampling is checked statistically with fixed seeds (so every run is identical): drawn ids
 * must lie in the reference's kept set, and on small kept sets the empirical frequencies must
 * pass a generous chi-square bound against the renormalised reference probabilities.
 * Penalties are checked exactly by bracketing the penalised logit between adjacent floats and
 * watching which id greedy picks. Stop strings are checked against a brute-force matcher for
 * every split of the text into pushes. */
#include "engine/sampler.h"
#include "tests/check.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ---- test-side helpers ---- */

static uint64_t trng_next(uint64_t *x)   /* splitmix64: the test's own deterministic stream */
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double trng_unif(uint64_t *x)
{
    return (double)(trng_next(x) >> 11) * 0x1.0p-53;
}

static double trng_normal(uint64_t *x)
{
    double u1 = trng_unif(x), u2 = trng_unif(x);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* LLM-like logits: N(0, 2.5) plus a few large ones; some exact duplicates. */
static void fill_logits(float *l, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++)
        l[i] = (float)(2.5 * trng_normal(rng));
    for (int j = 0; j < 8 && j < n; j++)
        l[trng_next(rng) % (uint64_t)n] = (float)(8.0 + 4.0 * trng_unif(rng));
    for (int j = 0; j < n / 50; j++)
        l[trng_next(rng) % (uint64_t)n] = l[trng_next(rng) % (uint64_t)n];
}

static sampler_t *mk(const sampler_params_t *p, int n_vocab)
{
    char err[256] = "";
    sampler_t *s = sampler_new(p, n_vocab, err, sizeof err);
    CHECKF(s != NULL, "sampler_new: %s", err);
    return s;
}

/* ---- brute-force reference for the filters ---- */

typedef struct {
    int id;
    float l;
} ref_ent_t;

static int ref_cmp(const void *a, const void *b)
{
    const ref_ent_t *x = a, *y = b;
    if (x->l != y->l)
        return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

enum { REF_OUT = 0, REF_IN = 1, REF_MAYBE = 2 };

/* For temperature > 0 and no penalties: cls[i] says whether id i is surely kept, surely
 * dropped, or within rounding of a filter boundary; prob[i] is its renormalised probability
 * over the surely-kept set. Returns the number of MAYBE ids. */
static int ref_filter(const float *logits, int n, const sampler_params_t *p, unsigned char *cls,
                      double *prob)
{
    const double eps = 1e-6;
    ref_ent_t *e = malloc((size_t)n * sizeof *e);
    double *w = malloc((size_t)n * sizeof *w);
    for (int i = 0; i < n; i++) {
        e[i].id = i;
        e[i].l = logits[i];
        cls[i] = REF_OUT;
        prob[i] = 0.0;
    }
    qsort(e, (size_t)n, sizeof *e, ref_cmp);
    int k = (p->top_k > 0 && p->top_k < n) ? p->top_k : n;
    double Z = 0.0;
    for (int j = 0; j < k; j++) {
        w[j] = exp(((double)e[j].l - (double)e[0].l) / (double)p->temperature);
        Z += w[j];
    }
    double cum = 0.0, kept = 0.0;
    int n_maybe = 0;
    const double target = p->top_p < 1.0f ? (double)p->top_p * Z : INFINITY;
    for (int j = 0; j < k; j++) {
        int c = REF_IN;
        if (p->min_p > 0.0f) {
            double d = w[j] - (double)p->min_p;
            if (fabs(d) < eps)
                c = REF_MAYBE;
            else if (d < 0)
                c = REF_OUT;
        }
        if (c != REF_OUT && p->top_p < 1.0f) {
            double d = cum - target;
            if (fabs(d) < eps * Z)
                c = REF_MAYBE;
            else if (d >= 0)
                c = REF_OUT;
        }
        if (j == 0 && c == REF_MAYBE)
            c = REF_IN; /* the top token is always kept */
        cls[e[j].id] = (unsigned char)c;
        if (c == REF_IN)
            kept += w[j];
        if (c == REF_MAYBE)
            n_maybe++;
        cum += w[j];
    }
    /* Ties at the top-k border: any of the tied ids is a correct answer, but the sampler must
     * take the lowest ids; the qsort order above already does (id asc within equal logits). */
    for (int j = 0; j < k; j++)
        if (cls[e[j].id] == REF_IN)
            prob[e[j].id] = w[j] / kept;
    free(w);
    free(e);
    return n_maybe;
}

/* Draws n_draws tokens with p from master logits; every id must be IN or MAYBE; when the kept
 * set is small enough and has no MAYBE, chi-square against prob. Returns the chi-square
 * statistic (or -1 when it was not computed). */
static double check_distribution(const float *master, int n, const sampler_params_t *p,
                                 int n_draws, const char *what)
{
    unsigned char *cls = malloc((size_t)n);
    double *prob = malloc((size_t)n * sizeof *prob);
    int *hits = calloc((size_t)n, sizeof *hits);
    float *l = malloc((size_t)n * sizeof *l);
    int n_maybe = ref_filter(master, n, p, cls, prob);
    sampler_t *s = mk(p, n);
    int bad = 0;
    for (int d = 0; s && d < n_draws; d++) {
        memcpy(l, master, (size_t)n * sizeof *l);
        int32_t id = sampler_sample(s, l, NULL, NULL);
        if (id < 0 || id >= n || cls[id] == REF_OUT) {
            if (!bad)
                fprintf(stderr, "%s: drew id %d outside the kept set\n", what, (int)id);
            bad++;
        } else {
            hits[id]++;
        }
    }
    CHECKF(bad == 0, "%s: %d draws outside the kept set", what, bad);
    double chi2 = -1.0;
    int n_in = 0;
    double pmin = 1.0;
    for (int i = 0; i < n; i++)
        if (cls[i] == REF_IN) {
            n_in++;
            if (prob[i] < pmin)
                pmin = prob[i];
        }
    if (n_maybe == 0 && n_in > 1 && pmin * n_draws >= 5.0) {
        chi2 = 0.0;
        for (int i = 0; i < n; i++) {
            if (cls[i] != REF_IN)
                continue;
            double ex = prob[i] * n_draws, d = hits[i] - ex;
            chi2 += d * d / ex;
        }
        const double df = n_in - 1;
        const double bound = df + 7.0 * sqrt(2.0 * df) + 10.0; /* far beyond 1e-6 */
        CHECKF(chi2 < bound, "%s: chi2 %.2f >= %.2f (df %d)", what, chi2, bound, n_in - 1);
    }
    sampler_free(s);
    free(l);
    free(hits);
    free(prob);
    free(cls);
    return chi2;
}

/* ---- params ---- */

static void test_params(void)
{
    sampler_params_t p;
    char err[256];
    sampler_params_default(&p);
    CHECK(p.temperature == 1.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f);
    CHECK(p.repeat_penalty == 1.0f && p.repeat_last_n == 64 && p.presence_penalty == 0.0f);
    CHECK(p.frequency_penalty == 0.0f && p.seed == 0 && p.n_logprobs == 0);
    CHECK(sampler_params_validate(&p, err, sizeof err) == 0);

    /* Each bad value alone must be rejected with a message, by validate and by new. */
    for (int c = 0; c < 16; c++) {
        sampler_params_default(&p);
        const char *what = "";
        switch (c) {
        case 0: p.top_p = 0.0f; what = "top_p 0"; break;
        case 1: p.top_p = -0.5f; what = "top_p < 0"; break;
        case 2: p.top_p = 1.0001f; what = "top_p > 1"; break;
        case 3: p.top_p = NAN; what = "top_p NaN"; break;
        case 4: p.temperature = NAN; what = "temperature NaN"; break;
        case 5: p.temperature = INFINITY; what = "temperature inf"; break;
        case 6: p.n_logprobs = SAMPLER_MAX_LOGPROBS + 1; what = "n_logprobs > max"; break;
        case 7: p.n_logprobs = -1; what = "n_logprobs < 0"; break;
        case 8: p.min_p = NAN; what = "min_p NaN"; break;
        case 9: p.min_p = 1.5f; what = "min_p > 1"; break;
        case 10: p.repeat_penalty = 0.0f; what = "repeat_penalty 0"; break;
        case 11: p.repeat_penalty = NAN; what = "repeat_penalty NaN"; break;
        case 12: p.repeat_last_n = -2; what = "repeat_last_n -2"; break;
        case 13: p.presence_penalty = NAN; what = "presence NaN"; break;
        case 14: p.frequency_penalty = -INFINITY; what = "frequency inf"; break;
        case 15: p.repeat_last_n = SAMPLER_MAX_REPEAT_LAST_N + 1; what = "repeat_last_n big"; break;
        }
        err[0] = '\0';
        CHECKF(sampler_params_validate(&p, err, sizeof err) == -1, "%s accepted", what);
        CHECKF(err[0] != '\0', "%s: no message", what);
        err[0] = '\0';
        sampler_t *s = sampler_new(&p, 100, err, sizeof err);
        CHECKF(s == NULL, "%s: sampler_new accepted", what);
        CHECKF(err[0] != '\0', "%s: sampler_new gave no message", what);
        sampler_free(s);
    }
    /* Boundary values that are fine. */
    sampler_params_default(&p);
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.temperature = -1.0f;
    p.top_k = -5;
    p.n_logprobs = SAMPLER_MAX_LOGPROBS;
    p.repeat_last_n = -1;
    p.presence_penalty = -2.0f;
    CHECK(sampler_params_validate(&p, err, sizeof err) == 0);
    CHECK(sampler_params_validate(NULL, err, sizeof err) == -1);
    CHECK(sampler_params_validate(&p, NULL, 0) == 0);
    sampler_params_default(&p);
    err[0] = '\0';
    CHECK(sampler_new(&p, 0, err, sizeof err) == NULL && err[0] != '\0');
    sampler_free(NULL);
}

/* ---- greedy ---- */

static int32_t ref_argmax(const float *l, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

static void test_greedy(void)
{
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = 0.0f;
    sampler_t *s = mk(&p, 8);
    float l1[8] = {1, 3, 2, 3, -1, 3, 0, 2};
    CHECK(sampler_sample(s, l1, NULL, NULL) == 1); /* tie 1/3/5: lowest id */
    float l2[8] = {-5, -5, -5, -5, -5, -5, -5, -4};
    CHECK(sampler_sample(s, l2, NULL, NULL) == 7);
    float l3[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                   -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(sampler_sample(s, l3, NULL, NULL) == 0);
    float l4[8] = {NAN, 1, NAN, 2, NAN, NAN, NAN, NAN}; /* NaN counts as -inf */
    CHECK(sampler_sample(s, l4, NULL, NULL) == 3);
    float l5[8] = {-0.0f, 0.0f, -1, -1, -1, -1, -1, -1}; /* -0 == +0: lowest id */
    CHECK(sampler_sample(s, l5, NULL, NULL) == 0);
    float l6[8] = {1, 2, INFINITY, 3, INFINITY, 0, 0, 0};
    CHECK(sampler_sample(s, l6, NULL, NULL) == 2);
    sampler_free(s);

    /* Negative temperature is greedy too; random arrays against the reference. */
    p.temperature = -0.5f;
    const int n = 5000;
    s = mk(&p, n);
    float *l = malloc(n * sizeof *l), *cp = malloc(n * sizeof *cp);
    uint64_t rng = 7;
    for (int it = 0; it < 20 && s; it++) {
        fill_logits(l, n, &rng);
        if (it % 2)
            for (int i = 0; i < n; i++)
                l[i] = roundf(l[i]); /* many ties */
        memcpy(cp, l, n * sizeof *l);
        CHECK(sampler_sample(s, cp, NULL, NULL) == ref_argmax(l, n));
    }
    sampler_free(s);
    free(cp);
    free(l);
}

/* top_k = 1 is greedy at any temperature, including ties at the top. */
static void test_top_k_one(void)
{
    const int n = 151936;
    float *l = malloc(n * sizeof *l), *cp = malloc(n * sizeof *cp);
    uint64_t rng = 11;
    const float temps[] = {0.05f, 0.7f, 1.0f, 5.0f, 1000.0f};
    for (int t = 0; t < 5; t++) {
        sampler_params_t p;
        sampler_params_default(&p);
        p.top_k = 1;
        p.temperature = temps[t];
        p.top_p = 0.9f;
        p.seed = (uint64_t)t;
        sampler_t *s = mk(&p, n);
        for (int it = 0; it < 4 && s; it++) {
            fill_logits(l, n, &rng);
            if (it == 1) { /* a tie for the max: lowest id wins */
                l[100] = 50.0f;
                l[99999] = 50.0f;
            }
            if (it == 2)
                for (int i = 0; i < n; i++)
                    l[i] = roundf(l[i] * 0.5f);
            memcpy(cp, l, n * sizeof *l);
            int32_t got = sampler_sample(s, cp, NULL, NULL);
            CHECKF(got == ref_argmax(l, n), "T %g it %d: %d vs %d", (double)temps[t], it,
                   (int)got, (int)ref_argmax(l, n));
        }
        sampler_free(s);
    }
    free(cp);
    free(l);
}

/* ---- filters on crafted distributions ---- */

static void crafted_expect(const char *what, const sampler_params_t *p, const int *allowed,
                           int n_allowed)
{
    /* probabilities: id0 .05, id1 .40, id2 .10, id3 .30, id4 .15 */
    static const double pr[5] = {0.05, 0.40, 0.10, 0.30, 0.15};
    float l[5];
    for (int i = 0; i < 5; i++)
        l[i] = (float)log(pr[i]) + 3.0f;
    unsigned char cls[5];
    double prob[5];
    CHECKF(ref_filter(l, 5, p, cls, prob) == 0, "%s: reference is ambiguous", what);
    for (int i = 0; i < 5; i++) {
        int want = 0;
        for (int j = 0; j < n_allowed; j++)
            want |= allowed[j] == i;
        CHECKF((cls[i] == REF_IN) == want, "%s: reference disagrees on id %d", what, i);
    }
    double chi2 = check_distribution(l, 5, p, 20000, what);
    CHECKF(n_allowed == 1 || chi2 >= 0.0, "%s: no chi-square computed", what);
}

static void test_filters_crafted(void)
{
    sampler_t *s;
    sampler_params_t p;
    sampler_params_default(&p);
    p.seed = 1234;

    crafted_expect("plain", &p, (const int[]){0, 1, 2, 3, 4}, 5);
    p.top_k = 3;
    crafted_expect("top_k 3", &p, (const int[]){1, 3, 4}, 3);
    p.top_k = 5;
    crafted_expect("top_k 5 (= n_vocab)", &p, (const int[]){0, 1, 2, 3, 4}, 5);
    p.top_k = 0;
    p.top_p = 0.65f; /* .40 < .65 <= .70 */
    crafted_expect("top_p .65", &p, (const int[]){1, 3}, 2);
    p.top_p = 0.75f;
    crafted_expect("top_p .75", &p, (const int[]){1, 3, 4}, 3);
    p.top_p = 0.3f;
    crafted_expect("top_p .3", &p, (const int[]){1}, 1);
    p.top_p = 0.97f;
    crafted_expect("top_p .97", &p, (const int[]){0, 1, 2, 3, 4}, 5);
    p.top_p = 1.0f;
    p.min_p = 0.3f; /* threshold .12 */
    crafted_expect("min_p .3", &p, (const int[]){1, 3, 4}, 3);
    p.min_p = 0.2f; /* .08 */
    crafted_expect("min_p .2", &p, (const int[]){1, 2, 3, 4}, 4);
    p.min_p = 1.0f;
    crafted_expect("min_p 1", &p, (const int[]){1}, 1);
    p.min_p = 0.0f;
    p.top_k = 4;
    p.top_p = 0.8f; /* renormalised over .95: .421 .316 -> .737 < .8 <= .895 */
    crafted_expect("top_k 4 + top_p .8", &p, (const int[]){1, 3, 4}, 3);
    p.top_k = 0;
    p.top_p = 0.8f; /* T 1: .7 < .8 -> {1,3,4}; T .5: .561 + .316 = .877 >= .8 -> {1,3} */
    crafted_expect("top_p .8 T 1", &p, (const int[]){1, 3, 4}, 3);
    p.temperature = 0.5f;
    crafted_expect("top_p .8 T .5", &p, (const int[]){1, 3}, 2);
    p.top_p = 1.0f;
    crafted_expect("T .5", &p, (const int[]){0, 1, 2, 3, 4}, 5);
    p.temperature = 2.0f;
    crafted_expect("T 2", &p, (const int[]){0, 1, 2, 3, 4}, 5);
    p.temperature = 0.7f; /* top_p on the top-k probabilities, then min-p: intersection */
    p.top_k = 4;
    p.top_p = 0.95f;
    p.min_p = 0.15f;
    crafted_expect("top_k 4 + top_p .95 + min_p .15 T .7", &p, (const int[]){1, 3, 4}, 3);
    p.min_p = 0.05f;
    crafted_expect("top_k 4 + top_p .95 + min_p .05 T .7", &p, (const int[]){1, 2, 3, 4}, 4);

    /* The top-p cut inside one bucket: ids 1 and 3 tie at p .2 (id 0 has .5); top_p .6 keeps
     * the max and the lower id of the tie only. */
    sampler_params_default(&p);
    p.top_p = 0.6f;
    float tie[5] = {(float)log(0.5), (float)log(0.2), (float)log(0.05), (float)log(0.2),
                    (float)log(0.05)};
    check_distribution(tie, 5, &p, 6000, "top_p cut within a tie");
    s = mk(&p, 5);
    int tie_hits[5] = {0};
    for (int d = 0; s && d < 6000; d++) {
        float c[5];
        memcpy(c, tie, sizeof c);
        tie_hits[sampler_sample(s, c, NULL, NULL)]++;
    }
    CHECK(tie_hits[0] > 0 && tie_hits[1] > 0);
    CHECK(tie_hits[2] + tie_hits[3] + tie_hits[4] == 0);
    sampler_free(s);

    /* Ties at the top-k border: the lowest ids among equal logits are kept. */
    sampler_params_default(&p);
    p.top_k = 3;
    float l[8] = {0, 1, 2, 1, 1, 2, 1, 0}; /* top 3 by (logit, id): 2, 5, 1 */
    check_distribution(l, 8, &p, 3000, "top_k ties");
    s = mk(&p, 8);
    int seen[8] = {0};
    for (int d = 0; s && d < 3000; d++) {
        float c[8];
        memcpy(c, l, sizeof c);
        seen[sampler_sample(s, c, NULL, NULL)]++;
    }
    CHECK(seen[1] > 0 && seen[2] > 0 && seen[5] > 0);
    CHECK(seen[0] + seen[3] + seen[4] + seen[6] + seen[7] == 0);
    sampler_free(s);

    /* All equal logits with top_p: the nucleus is the lowest ids. 10 equal -> top_p .35 keeps
     * 4 (.3 < .35 <= .4). */
    sampler_params_default(&p);
    p.top_p = 0.35f;
    float eq[10] = {0};
    check_distribution(eq, 10, &p, 8000, "flat top_p");
    /* NaN and -inf never drawn when finite logits exist. */
    sampler_params_default(&p);
    s = mk(&p, 6);
    int bad = 0;
    for (int d = 0; s && d < 2000; d++) {
        float c[6] = {NAN, 0.0f, -INFINITY, 0.5f, NAN, -INFINITY};
        int32_t id = sampler_sample(s, c, NULL, NULL);
        bad += !(id == 1 || id == 3);
    }
    CHECK(bad == 0);
    float allinf[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(s && sampler_sample(s, allinf, NULL, NULL) == 0);
    sampler_free(s);
}

/* Larger vocabularies with random configurations against the reference. */
static void test_filters_random(void)
{
    const int n = 32000;
    float *l = malloc(n * sizeof *l);
    uint64_t rng = 99;
    int n_chi = 0;
    for (int c = 0; c < 14; c++) {
        sampler_params_t p;
        sampler_params_default(&p);
        p.seed = 1000 + (uint64_t)c;
        p.temperature = (float)(0.2 + 1.6 * trng_unif(&rng));
        switch (c % 7) {
        case 0: p.top_k = 40; break;
        case 1: p.top_p = 0.9f; break;
        case 2: p.min_p = 0.05f; break;
        case 3: p.top_k = 40; p.top_p = 0.95f; break;
        case 4: p.top_k = 2000; p.top_p = 0.5f; p.min_p = 0.01f; break;
        case 5: p.top_p = 0.99f; p.temperature = 3.0f; break; /* a large nucleus */
        case 6: p.top_k = 7; break;
        }
        fill_logits(l, n, &rng);
        if (c == 13)
            for (int i = 0; i < n; i++)
                l[i] = roundf(l[i]); /* heavy ties at every boundary */
        char what[96];
        snprintf(what, sizeof what, "random cfg %d (k %d p %.2f minp %.2f T %.2f)", c, p.top_k,
                 (double)p.top_p, (double)p.min_p, (double)p.temperature);
        n_chi += check_distribution(l, n, &p, 400, what) >= 0.0;
    }
    CHECK(n_chi >= 3); /* the chi-square ran on some of them */
    free(l);
}

/* ---- determinism ---- */

static void run_sequence(sampler_t *s, int32_t *out, int len, int n, uint64_t logit_seed)
{
    float *l = malloc(n * sizeof *l);
    uint64_t rng = logit_seed;
    for (int t = 0; t < len; t++) {
        fill_logits(l, n, &rng);
        for (int i = 0; i < n; i++)
            l[i] *= 0.3f; /* flat enough that seeds matter */
        out[t] = sampler_sample(s, l, NULL, NULL);
        sampler_accept(s, out[t]);
    }
    free(l);
}

static void test_determinism(void)
{
    const int n = 2000, len = 64;
    sampler_params_t p;
    sampler_params_default(&p);
    p.top_p = 0.95f;
    p.top_k = 500;
    p.repeat_penalty = 1.1f;
    p.seed = 42;
    int32_t a[64], b[64], c[64];
    sampler_t *s1 = mk(&p, n), *s2 = mk(&p, n);
    p.seed = 43;
    sampler_t *s3 = mk(&p, n);
    if (!s1 || !s2 || !s3)
        return;
    run_sequence(s1, a, len, n, 5);
    /* s2 interleaved with draws on another sampler: its stream must not be affected */
    float junk[2000];
    for (int i = 0; i < 10; i++) {
        memset(junk, 0, sizeof junk);
        sampler_sample(s3, junk, NULL, NULL);
    }
    run_sequence(s2, b, len, n, 5);
    CHECK(memcmp(a, b, sizeof a) == 0);
    sampler_free(s3);
    s3 = mk(&p, n);
    if (!s3)
        return;
    run_sequence(s3, c, len, n, 5);
    int same = 0;
    for (int i = 0; i < len; i++)
        same += a[i] == c[i];
    CHECKF(same < len / 2, "seeds 42 and 43 agree on %d of %d tokens", same, len);
    sampler_free(s1);
    sampler_free(s2);
    sampler_free(s3);
}

/* ---- penalties, exactly ---- */

/* With greedy, a competitor at id `comp` with logit just above / at / just below the expected
 * penalised value of `tok` tells the exact value apart. */
static void bracket(sampler_t *s, int n, const float *base, int tok, int comp, float expected,
                    const char *what)
{
    float *l = malloc(n * sizeof *l);
    memcpy(l, base, n * sizeof *l);
    l[comp] = nextafterf(expected, INFINITY);
    CHECKF(sampler_sample(s, l, NULL, NULL) == comp, "%s: penalised value above %.9g", what,
           (double)expected);
    memcpy(l, base, n * sizeof *l);
    l[comp] = nextafterf(expected, -INFINITY);
    CHECKF(sampler_sample(s, l, NULL, NULL) == tok, "%s: penalised value below %.9g", what,
           (double)expected);
    memcpy(l, base, n * sizeof *l);
    l[comp] = expected; /* exact tie: the lower id wins */
    CHECKF(sampler_sample(s, l, NULL, NULL) == (comp < tok ? comp : tok),
           "%s: penalised value not exactly %.9g", what, (double)expected);
    free(l);
}

static float pen_expected(float v, int c, float rp, float fp, float pp)
{
    v = v > 0.0f ? v / rp : v * rp;
    v -= (float)c * fp + (float)(c > 0) * pp;
    return v;
}

static void test_penalties(void)
{
    enum { N = 6 };
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = 0.0f;
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.7f;
    p.repeat_last_n = 64;
    sampler_t *s = mk(&p, N);
    if (!s)
        return;
    /* history: 2 x3, 4 x1, 1 x0; ids out of range are ignored */
    sampler_accept(s, 2);
    sampler_accept(s, 4);
    sampler_accept(s, 2);
    sampler_accept(s, -1);
    sampler_accept(s, N);
    sampler_accept(s, 2);
    float base[N];
    for (int i = 0; i < N; i++)
        base[i] = -100.0f;
    /* positive logit, count 3 */
    base[2] = 2.0f;
    bracket(s, N, base, 2, 0, pen_expected(2.0f, 3, 1.3f, 0.25f, 0.7f), "positive x3");
    bracket(s, N, base, 2, 5, pen_expected(2.0f, 3, 1.3f, 0.25f, 0.7f), "positive x3 hi comp");
    /* negative logit, count 1 */
    base[2] = -100.0f;
    base[4] = -1.5f;
    bracket(s, N, base, 4, 1, pen_expected(-1.5f, 1, 1.3f, 0.25f, 0.7f), "negative x1");
    /* zero logit */
    base[4] = 0.0f;
    bracket(s, N, base, 4, 1, pen_expected(0.0f, 1, 1.3f, 0.25f, 0.7f), "zero x1");
    /* an unseen token is untouched */
    base[4] = -100.0f;
    base[3] = 1.75f;
    bracket(s, N, base, 3, 0, 1.75f, "unseen");
    sampler_free(s);

    /* Window: repeat_last_n 3 with history 2 2 2 4 1 3 -> window {4,1,3}: 2 unpenalised,
     * 4/1/3 count 1 each. Accept more to push 4 out too. */
    p.repeat_last_n = 3;
    s = mk(&p, N);
    if (!s)
        return;
    const int32_t hist[] = {2, 2, 2, 4, 1, 3};
    for (int i = 0; i < 6; i++)
        sampler_accept(s, hist[i]);
    for (int i = 0; i < N; i++)
        base[i] = -100.0f;
    base[2] = 2.0f;
    bracket(s, N, base, 2, 0, 2.0f, "window: 2 evicted");
    base[2] = -100.0f;
    base[4] = 3.0f;
    bracket(s, N, base, 4, 0, pen_expected(3.0f, 1, 1.3f, 0.25f, 0.7f), "window: 4 in");
    sampler_accept(s, 3);
    sampler_accept(s, 3); /* window {3,3,3}: 1 and 4 out, 3 count 3 */
    bracket(s, N, base, 4, 0, 3.0f, "window: 4 evicted");
    base[4] = -100.0f;
    base[3] = 3.0f;
    bracket(s, N, base, 3, 0, pen_expected(3.0f, 3, 1.3f, 0.25f, 0.7f), "window: 3 x3");
    base[3] = -100.0f;
    base[1] = 3.0f;
    bracket(s, N, base, 1, 0, 3.0f, "window: 1 evicted");
    sampler_free(s);

    /* Random histories against a reference window: every token's penalised value, exactly,
     * after every accept (ids out of range are ignored, not recorded). */
    for (int win = 1; win <= 5; win += 2) {
        p.repeat_last_n = win;
        s = mk(&p, N);
        if (!s)
            return;
        int32_t hist_ref[256];
        int nh = 0;
        uint64_t rng = 500 + (uint64_t)win;
        int wrong = 0;
        for (int step = 0; step < 60; step++) {
            /* ids 0..3, sometimes out of range; 5 is never accepted: the competitor */
            int32_t id = (int32_t)(trng_next(&rng) % 4);
            if (step % 7 == 3)
                id = step % 2 ? -1 - id : N + id;
            sampler_accept(s, id);
            if (id >= 0 && id < N)
                hist_ref[nh++] = id;
            for (int t = 0; t < 4; t++) {
                int c = 0;
                for (int j = nh - win < 0 ? 0 : nh - win; j < nh; j++)
                    c += hist_ref[j] == t;
                float b2[N];
                for (int i = 0; i < N; i++)
                    b2[i] = -1000.0f;
                const float raw = t % 2 ? 2.5f : -0.75f;
                b2[t] = raw;
                const float want = c ? pen_expected(raw, c, 1.3f, 0.25f, 0.7f) : raw;
                const int comp = 5;
                const int before = check_failures_;
                bracket(s, N, b2, t, comp, want, "random window");
                wrong += check_failures_ != before;
            }
        }
        CHECKF(wrong == 0, "window %d: %d wrong penalised values", win, wrong);
        sampler_free(s);
    }

    /* Whole history (-1): counts never expire. */
    p.repeat_last_n = -1;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.125f;
    s = mk(&p, N);
    if (!s)
        return;
    for (int i = 0; i < 1000; i++)
        sampler_accept(s, i % 3 == 0 ? 5 : 1); /* 5 x334, 1 x666 */
    for (int i = 0; i < N; i++)
        base[i] = -1000.0f;
    base[5] = 10.0f;
    bracket(s, N, base, 5, 0, pen_expected(10.0f, 334, 1.0f, 0.125f, 0.0f), "history x334");
    base[5] = -1000.0f;
    base[1] = 10.0f;
    bracket(s, N, base, 1, 0, pen_expected(10.0f, 666, 1.0f, 0.125f, 0.0f), "history x666");
    sampler_free(s);

    /* Penalties that overflow stay finite and ordered: FLT_MAX / 0.5 is +inf -> FLT_MAX, and
     * a tiny positive temperature (1/T = inf) behaves as greedy. */
    p.repeat_last_n = 4;
    p.repeat_penalty = 0.5f;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    for (int pass = 0; pass < 2; pass++) {
        p.temperature = pass ? 1e-45f : 0.0f;
        s = mk(&p, N);
        if (!s)
            return;
        sampler_accept(s, 3);
        float big[N] = {1.0f, 2.0f, FLT_MAX, FLT_MAX, 0.5f, -INFINITY};
        CHECK(sampler_sample(s, big, NULL, NULL) == 2); /* 2 and 3 tie at FLT_MAX */
        float big2[N] = {1.0f, 2.0f, 3.0f, FLT_MAX, 0.5f, -INFINITY};
        CHECK(sampler_sample(s, big2, NULL, NULL) == 3);
        sampler_free(s);
    }
    p.temperature = 0.0f;
    p.frequency_penalty = -FLT_MAX; /* -inf logits stay -inf, never NaN */
    p.repeat_penalty = 1.0f;
    s = mk(&p, N);
    if (!s)
        return;
    for (int i = 0; i < 3; i++)
        sampler_accept(s, 0);
    float ninf[N] = {-INFINITY, -INFINITY, -1.0f, -2.0f, -3.0f, -4.0f};
    CHECK(sampler_sample(s, ninf, NULL, NULL) == 2);
    sampler_free(s);

    /* repeat_last_n 0: penalties off. */
    p.repeat_last_n = 0;
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.125f;
    s = mk(&p, N);
    if (!s)
        return;
    sampler_accept(s, 1);
    bracket(s, N, base, 1, 0, 10.0f, "repeat_last_n 0");
    sampler_free(s);

    /* Penalties feed the stochastic path too (top_k 1 is greedy there). */
    p.repeat_last_n = 8;
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.0f;
    p.temperature = 0.8f;
    p.top_k = 1;
    s = mk(&p, N);
    if (!s)
        return;
    sampler_accept(s, 1);
    bracket(s, N, base, 1, 0, pen_expected(10.0f, 1, 1.3f, 0.0f, 0.0f), "stochastic path");
    sampler_free(s);
}

/* ---- logprobs ---- */

static void test_logprobs(void)
{
    const int n = 3000;
    float *l = malloc(n * sizeof *l), *cp = malloc(n * sizeof *cp);
    uint64_t rng = 3;
    sampler_params_t p;
    sampler_params_default(&p);
    p.n_logprobs = 7;
    p.temperature = 0.9f;
    p.top_p = 0.9f;
    p.repeat_penalty = 1.5f;
    p.presence_penalty = 1.0f;
    p.seed = 77;
    sampler_t *s = mk(&p, n);
    for (int it = 0; s && it < 30; it++) {
        fill_logits(l, n, &rng);
        if (it == 0) { /* a tie inside the top list */
            l[10] = 20.0f;
            l[5] = 20.0f;
            l[2000] = 19.0f;
        }
        if (it % 3 == 1) /* coarse logits: ties across the 7th place, lowest ids first */
            for (int i = 0; i < n; i++)
                l[i] = roundf(l[i] * 0.5f);
        double mx = -INFINITY, sum = 0.0;
        for (int i = 0; i < n; i++)
            mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < n; i++)
            sum += exp((double)l[i] - mx);
        const double lse = mx + log(sum);
        /* the reference top list by full sort */
        ref_ent_t *e = malloc(n * sizeof *e);
        for (int i = 0; i < n; i++) {
            e[i].id = i;
            e[i].l = l[i];
        }
        qsort(e, n, sizeof *e, ref_cmp);
        memcpy(cp, l, n * sizeof *l);
        sampler_logprob_t top[7], ch;
        int32_t id = sampler_sample(s, cp, top, &ch);
        for (int j = 0; j < 7; j++) {
            CHECKF(top[j].id == e[j].id, "it %d slot %d: id %d vs %d", it, j, (int)top[j].id,
                   e[j].id);
            CHECKF(fabs(top[j].logprob - ((double)e[j].l - lse)) < 1e-5, "it %d slot %d", it,
                   j);
            if (j)
                CHECK(top[j].logprob <= top[j - 1].logprob);
        }
        CHECK(ch.id == id);
        CHECKF(fabs(ch.logprob - ((double)l[id] - lse)) < 1e-5, "chosen %d: %g vs %g", (int)id,
               (double)ch.logprob, (double)l[id] - lse);
        if (it == 0)
            CHECK(top[0].id == 5 && top[1].id == 10 && top[2].id == 2000);
        sampler_accept(s, id); /* penalties now change cp, never the reported values */
        free(e);
    }
    sampler_free(s);

    /* Fixed logits with top_k 3: the same tokens come back while penalised; their reported
     * logprobs stay the raw ones. */
    p.top_k = 3;
    p.top_p = 1.0f;
    s = mk(&p, n);
    fill_logits(l, n, &rng);
    l[17] = 30.0f;
    l[18] = 30.5f;
    l[19] = 29.5f;
    {
        double mx = -INFINITY, sum = 0.0;
        for (int i = 0; i < n; i++)
            mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < n; i++)
            sum += exp((double)l[i] - mx);
        const double lse = mx + log(sum);
        int repeats = 0;
        for (int it = 0; s && it < 20; it++) {
            memcpy(cp, l, n * sizeof *l);
            sampler_logprob_t top[7], ch;
            int32_t id = sampler_sample(s, cp, top, &ch);
            CHECK(id >= 17 && id <= 19);
            CHECKF(fabs(ch.logprob - ((double)l[id] - lse)) < 1e-5, "repeat %d: %g vs %g", it,
                   (double)ch.logprob, (double)l[id] - lse);
            CHECK(top[0].id == 18 && top[1].id == 17 && top[2].id == 19);
            repeats += it > 2;
            sampler_accept(s, id);
        }
        CHECK(repeats > 0);
    }
    sampler_free(s);

    /* More slots than tokens: padded with -1 / -inf. */
    p.n_logprobs = SAMPLER_MAX_LOGPROBS;
    p.temperature = 0.0f;
    s = mk(&p, 3);
    sampler_logprob_t top[SAMPLER_MAX_LOGPROBS], ch;
    float t3[3] = {0.0f, (float)log(3.0), NAN};
    if (s) {
        CHECK(sampler_sample(s, t3, top, &ch) == 1);
        CHECK(top[0].id == 1 && fabs(top[0].logprob - log(0.75)) < 1e-6);
        CHECK(top[1].id == 0 && fabs(top[1].logprob - log(0.25)) < 1e-6);
        CHECK(top[2].id == 2 && top[2].logprob == -INFINITY);
        for (int j = 3; j < SAMPLER_MAX_LOGPROBS; j++)
            CHECK(top[j].id == -1 && top[j].logprob == -INFINITY);
        CHECK(ch.id == 1 && fabs(ch.logprob - log(0.75)) < 1e-6);
    }
    sampler_free(s);
    free(cp);
    free(l);
}

/* ---- stop strings ---- */

/* Reference over the whole text t[0..len): -1 if no stop completes, else the output length.
 * *safe_out gets the safe length when no stop completed. */
static long ref_stop(const char *const *strs, int n, const char *t, size_t len, size_t *safe_out)
{
    for (size_t e = 1; e <= len; e++) {
        size_t best = 0;
        for (int j = 0; j < n; j++) {
            size_t L = strlen(strs[j]);
            if (L <= e && memcmp(t + e - L, strs[j], L) == 0 && L > best)
                best = L;
        }
        if (best)
            return (long)(e - best);
    }
    size_t pend = 0;
    for (int j = 0; j < n; j++) {
        size_t L = strlen(strs[j]);
        for (size_t k = 1; k < L && k <= len; k++)
            if (memcmp(t + len - k, strs[j], k) == 0 && k > pend)
                pend = k;
    }
    *safe_out = len - pend;
    return -1;
}

/* Pushes text in pieces at cuts[0..nc) (increasing) and compares with the reference after
 * each push. */
static int push_split(const char *const *strs, int n, const char *t, size_t len,
                      const size_t *cuts, int nc)
{
    stop_matcher_t *m = stop_matcher_new(strs, n, NULL, 0);
    if (!m)
        return 0;
    size_t from = 0, prev = 0;
    int ok = 1;
    for (int c = 0; c <= nc; c++) {
        size_t to = c < nc ? cuts[c] : len;
        int stopped = -1;
        size_t got = stop_matcher_push(m, t + from, to - from, &stopped);
        size_t safe = 0;
        long want = ref_stop(strs, n, t, to, &safe);
        if (want >= 0)
            ok &= stopped == 1 && got == (size_t)want;
        else
            ok &= stopped == 0 && got == safe;
        ok &= got >= prev; /* monotone */
        prev = got;
        from = to;
    }
    stop_matcher_free(m);
    return ok;
}

static void stop_all_splits(const char *const *strs, int n, const char *t, const char *what)
{
    const size_t len = strlen(t);
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    /* one byte at a time */
    for (size_t i = 0; i < len; i++)
        cuts[i] = i + 1;
    CHECKF(push_split(strs, n, t, len, cuts, (int)len), "%s: byte by byte", what);
    /* two pieces at every split point (including empty pieces) */
    for (size_t c = 0; c <= len; c++) {
        cuts[0] = c;
        CHECKF(push_split(strs, n, t, len, cuts, 1), "%s: split at %zu", what, c);
    }
    /* three pieces, every pair of split points (texts here are short) */
    for (size_t a = 0; a <= len && len <= 40; a++)
        for (size_t b = a; b <= len; b++) {
            cuts[0] = a;
            cuts[1] = b;
            CHECKF(push_split(strs, n, t, len, cuts, 2), "%s: split at %zu,%zu", what, a, b);
        }
    free(cuts);
}

static size_t push_str(stop_matcher_t *m, const char *t, int *stopped)
{
    return stop_matcher_push(m, t, strlen(t), stopped);
}

static void test_stop(void)
{
    int st;
    char err[128];

    /* Explicit expectations first, then every split against the reference. */
    const char *u[] = {"\n\nUser:"};
    stop_matcher_t *m = stop_matcher_new(u, 1, err, sizeof err);
    CHECK(m != NULL);
    if (m) {
        CHECK(push_str(m, "Hello", &st) == 5 && st == 0);
        CHECK(push_str(m, "\n", &st) == 5 && st == 0);      /* "\n" may start the stop */
        CHECK(push_str(m, "\nUs", &st) == 5 && st == 0);
        CHECK(push_str(m, "e", &st) == 5 && st == 0);
        CHECK(push_str(m, "x", &st) == 11 && st == 0);      /* "\n\nUsex" cannot */
        CHECK(push_str(m, "\n\nUser: more", &st) == 11 && st == 1);
        CHECK(push_str(m, "after", &st) == 11 && st == 1);  /* stays stopped */
        stop_matcher_free(m);
    }
    stop_all_splits(u, 1, "Hello there\n\nUser: next", "User");
    stop_all_splits(u, 1, "a\n\n\nUser:", "User after 3 newlines");
    stop_all_splits(u, 1, "\n\nUse\n\nUser", "User incomplete");

    const char *aab[] = {"aab"};
    m = stop_matcher_new(aab, 1, NULL, 0);
    if (m) {
        CHECK(push_str(m, "a", &st) == 0 && st == 0);
        CHECK(push_str(m, "a", &st) == 0 && st == 0);
        CHECK(push_str(m, "a", &st) == 1 && st == 0); /* "aa" still pending */
        CHECK(push_str(m, "b", &st) == 1 && st == 1); /* "aaab" -> "a" */
        stop_matcher_free(m);
    }
    stop_all_splits(aab, 1, "aaab", "aab/aaab");
    stop_all_splits(aab, 1, "aaaabaab", "aab/aaaabaab");
    stop_all_splits(aab, 1, "abaaba", "aab no match");
    const char *abab[] = {"abac", "bab"};
    stop_all_splits(abab, 2, "ababac", "overlap abac/bab"); /* bab completes first, at 3 */

    /* Several stop strings: the earliest completion wins; at the same end, the longest. */
    const char *multi[] = {"User:", "\n\n", "END"};
    m = stop_matcher_new(multi, 3, NULL, 0);
    if (m) {
        CHECK(push_str(m, "hi\n\nUser:", &st) == 2 && st == 1);
        stop_matcher_free(m);
    }
    stop_all_splits(multi, 3, "hi\n\nUser:", "multi");
    stop_all_splits(multi, 3, "xEN\nUser:END\n\n", "multi 2");
    const char *same_end[] = {"b", "ab", "xab"};
    m = stop_matcher_new(same_end, 3, NULL, 0);
    if (m) {
        CHECK(push_str(m, "zzxab", &st) == 2 && st == 1);
        stop_matcher_free(m);
    }
    stop_all_splits(same_end, 3, "zzxab", "same end");
    const char *nested[] = {"abcd", "bc"}; /* "bc" completes before "abcd" could */
    m = stop_matcher_new(nested, 2, NULL, 0);
    if (m) {
        CHECK(push_str(m, "abcd", &st) == 1 && st == 1);
        stop_matcher_free(m);
    }
    stop_all_splits(nested, 2, "xabcd", "nested");

    /* No stop strings: everything is final at once. */
    m = stop_matcher_new(NULL, 0, NULL, 0);
    CHECK(m != NULL);
    if (m) {
        CHECK(push_str(m, "abc", &st) == 3 && st == 0);
        CHECK(stop_matcher_push(m, "", 0, &st) == 3 && st == 0);
        CHECK(stop_matcher_push(m, "de", 2, NULL) == 5);
        stop_matcher_free(m);
    }
    /* Bad lists. */
    const char *empty[] = {"ok", ""};
    err[0] = '\0';
    CHECK(stop_matcher_new(empty, 2, err, sizeof err) == NULL && err[0] != '\0');
    const char *withnull[] = {"ok", NULL};
    CHECK(stop_matcher_new(withnull, 2, NULL, 0) == NULL);
    CHECK(stop_matcher_new(NULL, 1, NULL, 0) == NULL);
    CHECK(stop_matcher_new(u, -1, NULL, 0) == NULL);

    /* Random small-alphabet cases against the reference, random splits. */
    uint64_t rng = 2024;
    int fails = 0;
    for (int it = 0; it < 3000; it++) {
        char sbuf[4][8];
        const char *ss[4];
        int ns = 1 + (int)(trng_next(&rng) % 4);
        for (int j = 0; j < ns; j++) {
            int L = 1 + (int)(trng_next(&rng) % 6);
            for (int k = 0; k < L; k++)
                sbuf[j][k] = "ab\n"[trng_next(&rng) % 3];
            sbuf[j][L] = '\0';
            ss[j] = sbuf[j];
        }
        char t[49];
        size_t len = (size_t)(trng_next(&rng) % 49);
        for (size_t k = 0; k < len; k++)
            t[k] = "ab\n"[trng_next(&rng) % 3];
        t[len] = '\0';
        size_t cuts[8];
        int nc = (int)(trng_next(&rng) % 8);
        for (int c = 0; c < nc; c++)
            cuts[c] = len ? (size_t)(trng_next(&rng) % (len + 1)) : 0;
        for (int a = 1; a < nc; a++) /* sort the cuts */
            for (int b = a; b > 0 && cuts[b] < cuts[b - 1]; b--) {
                size_t x = cuts[b];
                cuts[b] = cuts[b - 1];
                cuts[b - 1] = x;
            }
        fails += !push_split(ss, ns, t, len, cuts, nc);
    }
    CHECKF(fails == 0, "%d random stop cases failed", fails);

    /* Two letters and longer stop strings: many self-overlapping patterns (KMP borders). */
    fails = 0;
    for (int it = 0; it < 4000; it++) {
        char sbuf[3][10];
        const char *ss[3];
        int ns = 1 + (int)(trng_next(&rng) % 3);
        for (int j = 0; j < ns; j++) {
            int L = 1 + (int)(trng_next(&rng) % 9);
            for (int k = 0; k < L; k++)
                sbuf[j][k] = "ab"[trng_next(&rng) % 4 == 0];
            sbuf[j][L] = '\0';
            ss[j] = sbuf[j];
        }
        char t[65];
        size_t len = (size_t)(trng_next(&rng) % 65);
        for (size_t k = 0; k < len; k++)
            t[k] = "ab"[trng_next(&rng) % 4 == 0];
        t[len] = '\0';
        size_t cuts[64];
        for (size_t c = 0; c < len; c++)
            cuts[c] = c + 1;
        fails += !push_split(ss, ns, t, len, cuts, (int)len);
    }
    CHECKF(fails == 0, "%d two-letter stop cases failed", fails);

    /* 16 stop strings of 256 bytes over 1 MB of text pushed in 3-byte pieces; the text keeps
     * running into long partial matches (255 bytes of some strings) that never complete. */
    char big[16][257];
    const char *bp[16];
    for (int j = 0; j < 16; j++) {
        for (int k = 0; k < 255; k++)
            big[j][k] = (char)('a' + (k * 7 + j) % 3);
        big[j][255] = 'y';
        big[j][256] = '\0';
        bp[j] = big[j];
    }
    m = stop_matcher_new(bp, 16, NULL, 0);
    if (m) {
        const size_t total = 1 << 20;
        char *txt = malloc(total);
        for (size_t k = 0; k < total; k++)
            txt[k] = (char)('a' + (k * 7) % 3); /* close to the stop strings, never equal */
        txt[total - 1] = 'z';
        clock_t c0 = clock();
        size_t got = 0;
        for (size_t k = 0; k < total; k += 3)
            got = stop_matcher_push(m, txt + k, total - k < 3 ? total - k : 3, &st);
        double sec = (double)(clock() - c0) / CLOCKS_PER_SEC;
        fprintf(stderr, "stop matcher: 16 x 256-byte strings, %.1f MB/s\n", 1.0 / sec);
        CHECK(st == 0 && got <= total && got + 255 >= total);
        free(txt);
        stop_matcher_free(m);
    }
}

/* ---- speed (printed, not asserted: ASan builds are slower); flat-ish logits, so top-p
 * keeps thousands of tokens here ---- */

static void test_speed(void)
{
    const int n = 151936, iters = 30;
    float *l = malloc(n * sizeof *l), *cp = malloc(n * sizeof *cp);
    uint64_t rng = 1;
    fill_logits(l, n, &rng);
    struct {
        const char *name;
        float T, top_p, min_p;
        int top_k, nlp;
    } cfg[] = {
        {"greedy", 0.0f, 1.0f, 0.0f, 0, 0},
        {"T 1 (no filter)", 1.0f, 1.0f, 0.0f, 0, 0},
        {"T .7 top_p .9", 0.7f, 0.9f, 0.0f, 0, 0},
        {"T .8 top_k 40 top_p .95", 0.8f, 0.95f, 0.0f, 40, 0},
        {"T 1 min_p .05", 1.0f, 1.0f, 0.05f, 0, 0},
        {"T 1.5 top_p .99", 1.5f, 0.99f, 0.0f, 0, 0},
        {"greedy + 5 logprobs", 0.0f, 1.0f, 0.0f, 0, 5},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        sampler_params_t p;
        sampler_params_default(&p);
        p.temperature = cfg[c].T;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.top_k = cfg[c].top_k;
        p.n_logprobs = cfg[c].nlp;
        sampler_t *s = mk(&p, n);
        sampler_logprob_t top[SAMPLER_MAX_LOGPROBS], ch;
        double best = INFINITY; /* the minimum: the machine may be shared */
        for (int it = 0; s && it < iters; it++) {
            memcpy(cp, l, n * sizeof *l);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            sampler_sample(s, cp, top, &ch);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double sec =
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            best = sec < best ? sec : best;
        }
        fprintf(stderr, "sample n_vocab %d %-26s %8.1f us (min of %d)\n", n, cfg[c].name,
                1e6 * best, iters);
        sampler_free(s);
    }
    free(cp);
    free(l);
}

/* The helpers of device sampling (sampler_draw, sampler_evict_next, sampler_penalty_counts): a
 * sampler that only draws advances its stream exactly as one that samples, and the counts and
 * the evicted id are those of a brute-force window over the accepted ids. */
static void test_device_helpers(void)
{
    enum { V = 50, STEPS = 300 };
    const int windows[3] = {8, -1, 0};
    const float temps[2] = {0.7f, 0.0f};
    for (int wi = 0; wi < 3; wi++)
        for (int ti = 0; ti < 2; ti++) {
            sampler_params_t p;
            sampler_params_default(&p);
            p.temperature = temps[ti];
            p.repeat_last_n = windows[wi];
            p.presence_penalty = 0.5f;
            p.seed = 99 + (uint64_t)wi;
            char err[128];
            sampler_t *a = sampler_new(&p, V, err, sizeof err), *b = sampler_new(&p, V, err, sizeof err);
            CHECK(a && b);
            if (!a || !b) {
                sampler_free(a);
                sampler_free(b);
                return;
            }
            int32_t hist[STEPS];
            float l[V];
            uint64_t x = 5 + (uint64_t)wi * 7 + (uint64_t)ti;
            for (int k = 0; k < STEPS; k++) {
                for (int i = 0; i < V; i++) l[i] = (float)trng_unif(&x) * 4.0f;
                const int32_t id = sampler_sample(a, l, NULL, NULL);
                (void)sampler_draw(b);
                const int win = windows[wi];
                const int32_t want_evict = win > 0 && k >= win ? hist[k - win] : -1;
                CHECKF(sampler_evict_next(b) == want_evict, "window %d step %d: evict %d, want %d",
                       win, k, sampler_evict_next(b), want_evict);
                sampler_accept(a, id);
                sampler_accept(b, id);
                hist[k] = id;
                const int32_t *cnt = sampler_penalty_counts(b);
                CHECK((cnt == NULL) == (win == 0));
                if (!cnt) continue;
                int bad = 0;
                for (int t = 0; t < V; t++) {
                    int c = 0;
                    for (int j = win > 0 && k + 1 > win ? k + 1 - win : 0; j <= k; j++)
                        c += hist[j] == t;
                    bad += cnt[t] != c;
                }
                CHECKF(bad == 0, "window %d step %d: %d counts differ", win, k, bad);
            }
            CHECKF(sampler_draw(a) == sampler_draw(b), "window %d T %g: streams diverged",
                   windows[wi], (double)temps[ti]);
            sampler_free(a);
            sampler_free(b);
        }
}

int main(void)
{
    test_params();
    test_greedy();
    test_top_k_one();
    test_filters_crafted();
    test_filters_random();
    test_determinism();
    test_penalties();
    test_logprobs();
    test_device_helpers();
    test_stop();
    test_speed();
    return check_exit();
}
