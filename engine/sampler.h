/* engine/sampler.h: per-sequence token sampling and stop-string matching. Internal, except
 * sampler_params_t and its two functions: a request's sampling parameters, embedded as they are
 * by engine_request_t (engine.h) and by the parsed request (records/request.h), so the struct
 * a request was parsed into is the one its sampler gets.
 *
 * A sampler belongs to one sequence and is used by one thread at a time. Its random stream is
 * seeded from the request's seed alone, so the same seed and the same logits give the same
 * tokens whatever else is in the batch. */
#ifndef SPILLWAY_ENGINE_SAMPLER_H
#define SPILLWAY_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float temperature;        /* <= 0: greedy (argmax, lowest id wins ties) */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off; keep tokens with p >= min_p * p_max */
    float repeat_penalty;     /* 1: off; logits of tokens seen in the last repeat_last_n are
                                 divided (if > 0) or multiplied (if < 0) by it */
    int repeat_last_n;        /* window for all penalties; -1: whole history */
    float presence_penalty;   /* subtracted once from tokens that appeared (OpenAI semantics) */
    float frequency_penalty;  /* subtracted count times */
    uint64_t seed;
    int n_logprobs;           /* 0..SAMPLER_MAX_LOGPROBS: top alternatives to report */
} sampler_params_t;

#define SAMPLER_MAX_LOGPROBS 20

/* Defaults: temperature 1, top_k 0, top_p 1, min_p 0, penalties off, repeat_last_n 64, seed 0. */
void sampler_params_default(sampler_params_t *p);

/* Checks p without allocating: 0 if usable, -1 with errstr naming the first bad field.
 * Rejected: non-finite temperature/min_p/penalties, top_p not in (0, 1], min_p > 1,
 * repeat_penalty <= 0, repeat_last_n < -1 or > SAMPLER_MAX_REPEAT_LAST_N,
 * n_logprobs outside 0..SAMPLER_MAX_LOGPROBS. sampler_new calls it. */
int sampler_params_validate(const sampler_params_t *p, char *errstr, size_t errlen);

#define SAMPLER_MAX_REPEAT_LAST_N (1 << 20)

typedef struct {
    int32_t id;
    float logprob;   /* log-softmax of the raw logits (before penalties/temperature) */
} sampler_logprob_t;

typedef struct sampler sampler_t;

/* NULL on out of memory or bad params (errstr says which). */
sampler_t *sampler_new(const sampler_params_t *p, int n_vocab, char *errstr, size_t errlen);
void sampler_free(sampler_t *s);

/* Picks the next token from logits[n_vocab] (the array is used as scratch and modified).
 * Penalties use the tokens previously passed to sampler_accept (the prompt's and generated).
 * When p->n_logprobs > 0, top[0..n_logprobs) gets the most likely alternatives and *chosen the
 * chosen token's logprob (both may be NULL otherwise); slots beyond n_vocab get id -1 and
 * logprob -INFINITY. NaN logits count as -INFINITY. Returns the token id. */
int32_t sampler_sample(sampler_t *s, float *logits, sampler_logprob_t *top,
                       sampler_logprob_t *chosen);

/* Grammar constraint (engine/grammar.h masks): sets logits[i] = -INFINITY for every token whose
 * bit (i & 31) of mask[i >> 5] is clear. Called before sampler_sample, so penalties, temperature,
 * top-k, top-p, min-p and greedy all choose among the allowed tokens only (and logprobs are
 * those of the constrained logits). Returns the number of allowed tokens. */
int sampler_mask_logits(float *logits, int n_vocab, const uint32_t *mask);

/* Records a token into the penalty history (prompt tokens and each sampled token). Ids outside
 * [0, n_vocab) are ignored. No allocation. */
void sampler_accept(sampler_t *s, int32_t id);

/* For a backend that samples on the device (engine/backend.h, forward_sample) while this
 * sampler keeps the sequence's random stream and penalty history:
 * sampler_draw returns the 64-bit random number sampler_sample would draw now and advances the
 * stream exactly as sampler_sample does (one number when temperature > 0, else none and 0);
 * sampler_evict_next returns the id whose window count the next sampler_accept drops (-1 none);
 * sampler_penalty_counts returns the [n_vocab] counts of the ids in the penalty window (NULL
 * when penalties are off), valid until the next sampler_accept. */
uint64_t sampler_draw(sampler_t *s);
int32_t sampler_evict_next(const sampler_t *s);
const int32_t *sampler_penalty_counts(const sampler_t *s);

/* Stop strings, matched across token boundaries on the generated text.
 * stop_matcher_push appends text and returns how many bytes of the text pushed so far are safe
 * to emit (they cannot be the start of a stop string). When a stop string completes,
 * *stopped is set and the safe length excludes the stop string and everything after it.
 * Precisely: the stream stops at the first byte where any stop string completes; if several
 * complete at that byte, the longest (earliest-starting) is cut. The result does not depend on
 * how the text is split into pushes. */
typedef struct stop_matcher stop_matcher_t;

/* strs: n stop strings (copied). NULL on out of memory or an empty string. */
stop_matcher_t *stop_matcher_new(const char *const *strs, int n, char *errstr, size_t errlen);
void stop_matcher_free(stop_matcher_t *m);
/* text: the bytes newly generated. Returns the total number of bytes (over all pushes) that
 * are final; sets *stopped to 1 once a stop string matched. */
size_t stop_matcher_push(stop_matcher_t *m, const char *text, size_t len, int *stopped);

#endif
