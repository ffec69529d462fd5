/* engine/engine.h: the engine module's public interface.
 *
 * An engine_t owns a loaded model, its tokenizer, a compute backend with its KV block pool and
 * a continuous-batching scheduler. Requests are submitted (prompt token ids plus sampling
 * parameters and limits); each engine_step() runs one forward step over a batch that mixes
 * prefill chunks and single-token decodes, under limits on batch tokens, sequences and free KV
 * blocks; finished requests are reported through their callback.
 *
 * Threads: an engine_t is used by one thread at a time (the step thread); callbacks run on it.
 * Exceptions: engine_tokenize, engine_token_to_piece, engine_info and engine_chat_* only read the
 * immutable tokenizer and model metadata, so they may be called from any thread, concurrently
 * with each other and with engine_step / engine_submit on the step thread.
 * Errors: functions return 0 / -1 (or NULL) and fill the caller's errstr; where a caller must
 * tell failures apart (engine_submit) the negative value is a code of common/err.h. */
#ifndef SPILLWAY_ENGINE_H
#define SPILLWAY_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/sampler.h" /* sampler_params_t: a request's sampling parameters */

typedef struct engine engine_t;
struct grammar; /* engine/grammar.h */

/* Every tunable number of the engine, with its default in engine_config_default(). */
typedef struct {
    const char *model_path;  /* GGUF file (borrowed during engine_new) */
    const char *backend;     /* "cpu", "cuda" (when built: engine_backends()) or "auto" (cuda
                                when built and a device is present, else cpu) ("cpu") */
    int threads;             /* compute threads; 0 = one per online CPU */
    int block_tokens;        /* tokens per KV block (16) */
    int kv_blocks;           /* KV pool blocks; 0 = from kv_mem_mb */
    int kv_mem_mb;           /* KV pool size in MiB when kv_blocks is 0 (1024) */
    const char *kv_type;     /* "f16" or "f32" ("f16") */
    int max_batch_tokens;    /* tokens per forward step, prefill chunks included (512) */
    int max_seqs;            /* sequences running at once (64) */
    int max_ctx;             /* context limit per sequence; 0 = the model's trained context */
    int prefix_cache;        /* 1: reuse cached full prompt blocks across requests (1) */
    int cpu_pack;            /* CPU backend: 1 = the kernels' packed copies of the matrices they
                                pack (backend_params_t.cpu_pack) (1) */
    const unsigned char *kv_secret; /* ENGINE_KV_SECRET_BYTES bytes keying the block names
                                (copied by engine_new); engines share cached blocks (tier 2)
                                only when they have the same secret. NULL: a random one drawn
                                by engine_new (this engine's names are its own) (NULL) */
    /* admission order (prefix-grouped): among the sched_window first waiting requests (by
     * priority, then arrival) and the oldest one, the next admitted is the one with the highest
     * effective priority, then the longest cached prefix, then the oldest. Effective priority =
     * priority + 1 per sched_aging_ms waited (0 = no aging) + 1 when its deadline is less than
     * sched_urgent_ms away. */
    int sched_window;        /* 32 */
    int sched_aging_ms;      /* 5000 */
    int sched_urgent_ms;     /* 2000 */
    /* CUDA backend: kv_blocks 0 there means the pool takes what cuda_mem_fraction leaves after
     * weights and activations (kv_mem_mb is not used) */
    const char *cuda_dtype;  /* device weight type "bf16", "f16" or "f32" ("bf16"; "f32" with
                                kv_type f32 computes like the CPU backend) */
    float cuda_mem_fraction; /* share of the free device memory for weights, activations and
                                the KV pool, (0, 1] (0.9) */
    int cuda_device;         /* device index, >= 0 (0) */
} engine_config_t;

void engine_config_default(engine_config_t *c);

#define ENGINE_KV_SECRET_BYTES 32

/* The backends this build has, comma-separated ("cpu" or "cpu, cuda"). Static. */
const char *engine_backends(void);

enum engine_finish {
    ENGINE_FINISH_STOP = 0,   /* EOS/EOG token, stop token id or stop string */
    ENGINE_FINISH_LENGTH = 1, /* max_tokens or the context limit */
    ENGINE_FINISH_ABORT = 2,  /* engine_cancel */
};
const char *engine_finish_name(int finish); /* "stop", "length", "abort" */

/* A running request's progress: its text that is final so far. text[0..text_len) never changes
 * afterwards and only grows from one call to the next: it is a prefix of the finished
 * request's text (engine_result_t.text), ends on a UTF-8 character boundary (the streaming
 * decoder holds back partial characters) and holds nothing that a stop string could still
 * remove (the stop matcher holds back a possible partial match). Valid only during the call. */
typedef struct {
    uint64_t id;
    void *user;
    const char *text;
    size_t text_len;
    int n_tokens;                   /* tokens generated so far */
} engine_progress_t;

/* Called on the step thread (inside engine_step) after each generated token that does not
 * finish the request; the last token is reported by the done callback only. Must not call
 * engine_submit, engine_step or engine_cancel. */
typedef void (*engine_progress_fn)(void *cb_arg, const engine_progress_t *p);

typedef struct {
    const int32_t *prompt;          /* [n_prompt] token ids, copied by engine_submit */
    int n_prompt;
    sampler_params_t sampling;      /* reaches the sequence's sampler as is (defaults:
                                       sampler_params_default) */
    int max_tokens;                 /* generated tokens at most (>= 1) */
    const char *const *stop;        /* [n_stop] stop strings, copied */
    int n_stop;
    const int32_t *stop_ids;        /* [n_stop_ids] extra stop token ids, copied */
    int n_stop_ids;
    int ignore_eos;                 /* 1: EOS/EOG tokens do not stop */
    int text_at_start;              /* 1: the completion starts the text (no prompt text before
                                       it), so a SentencePiece leading space is dropped */
    int priority;                   /* higher is admitted first (0) */
    int64_t deadline_ms;            /* Unix epoch ms after which the result is useless; 0 none.
                                       Only orders admission (sched_urgent_ms): the caller
                                       cancels what expires */
    const char *cache_scope;        /* prefix cache scope (e.g. the tenant), read by
                                       engine_submit: blocks are shared only between requests
                                       of the same scope. NULL or "" = the shared scope */
    void *user;                     /* passed back in the result */
    engine_progress_fn progress;    /* optional (NULL): see engine_progress_t; gets the cb_arg
                                       of engine_submit */
    struct grammar *grammar;        /* optional (NULL): structured output. Every generated token
                                       keeps the text a prefix of a sentence of the grammar (its
                                       mask is applied before sampling); EOG tokens are allowed
                                       only where the grammar may end, and the request finishes
                                       with "stop" as soon as nothing can follow. engine_submit
                                       takes its own reference (the caller keeps its own); the
                                       grammar is then used on the step thread only */
} engine_request_t;

void engine_request_default(engine_request_t *r);

typedef struct {
    int32_t id;
    float logprob;
} engine_logprob_t;

/* A finished request. Valid only during the callback (copy what you keep). */
typedef struct {
    uint64_t id;
    void *user;
    int finish;                     /* enum engine_finish */
    const char *text;               /* completion text, UTF-8, stop string excluded */
    size_t text_len;
    const int32_t *tokens;          /* generated ids (a matched stop string's tokens included) */
    int n_tokens;
    int n_prompt;
    int n_cached;                   /* prompt tokens whose KV came from the prefix cache */
    int n_preempted;                /* times the request was preempted and recomputed */
    /* monotonic ns */
    int64_t t_submit, t_first_scheduled, t_first_token, t_finish;
    int64_t compute_ns;             /* this request's share of forward-step time: each step's
                                       time split over the step's tokens (prefill and decode
                                       tokens alike), summed over its steps */
    /* when sampling.n_logprobs > 0: [n_tokens] chosen and [n_tokens][n_logprobs] top */
    const engine_logprob_t *logprobs;
    const engine_logprob_t *top_logprobs;
    int n_logprobs;
} engine_result_t;

typedef void (*engine_done_fn)(void *cb_arg, const engine_result_t *r);

engine_t *engine_new(const engine_config_t *cfg, char *errstr, size_t errlen);
void engine_free(engine_t *e);

/* Adds a request to the waiting queue; *id_out gets its id. done is called once when it
 * finishes (from engine_step / engine_cancel). On failure a negative code (common/err.h) +
 * errstr: -SW_ERANGE for a prompt that leaves no room in the context limit, -SW_ENOMEM when out
 * of memory, -SW_EINVAL (-1) for any other bad request (empty prompt, bad sampling parameters,
 * stop list or max_tokens, token ids out of range). */
int engine_submit(engine_t *e, const engine_request_t *req, engine_done_fn done, void *cb_arg,
                  uint64_t *id_out, char *errstr, size_t errlen);
/* Runs one scheduler step. Returns 1 when a forward step ran, 0 when there was nothing to do,
 * -1 on a backend error (errstr). */
int engine_step(engine_t *e, char *errstr, size_t errlen);
/* Runs steps until no request is left. 0 or -1. */
int engine_run(engine_t *e, char *errstr, size_t errlen);
/* Finishes a waiting or running request with ENGINE_FINISH_ABORT. 0, or -1 if unknown. */
int engine_cancel(engine_t *e, uint64_t id);

int engine_n_waiting(const engine_t *e);
int engine_n_running(const engine_t *e);

/* Tokenizer access (see engine/tokenizer.h for the semantics). Any thread (see the top). */
int engine_tokenize(const engine_t *e, const char *text, size_t len, int add_special,
                    int parse_special, int32_t *out, int cap);
int engine_token_to_piece(const engine_t *e, int32_t id, char *buf, size_t cap);

typedef struct {
    const char *arch;
    const char *backend;
    const char *kernels;     /* CPU kernel set in use */
    int n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, ctx_len;
    int threads, block_tokens, kv_blocks, max_batch_tokens, max_seqs;
    size_t kv_block_bytes;
    size_t weight_bytes;
    uint64_t host_packed_bytes; /* the CPU backend's packed weight copies (backend.h) */
    /* device memory of the CUDA backend (0 on the CPU backend): engine/devmem.h's figure, what
     * the device's free memory fell by while the backend was created, and the allocations */
    uint64_t dev_bytes_planned, dev_bytes_measured;
    int dev_allocations;
    uint64_t fingerprint;
    uint64_t kv_seed;        /* seed of the block-name chain of the shared scope (keyed hash
                                of fingerprint, block size, KV type) */
    int32_t bos, eos;
} engine_info_t;
void engine_info(const engine_t *e, engine_info_t *info);

typedef struct {
    uint64_t steps, prompt_tokens, cached_tokens, generated_tokens, preemptions;
    uint64_t prefix_lookups, prefix_hits, evictions;  /* tier 1, in blocks */
    uint64_t tier2_lookups, tier2_hits;               /* tier 2, in blocks */
    uint64_t tier2_stores;                            /* blocks offered to tier 2 */
    uint64_t tier2_waits;    /* times a sequence sat out a step because its tier-2 blocks were
                                still being copied to the device */
    uint64_t kv_mismatches;  /* blocks found by name (tier 1 or 2) but holding other tokens or
                                another parent: refused, computed instead */
    uint64_t deferred;       /* admissions put off because another request was computing the
                                same prefix block (it is shared once published) */
    int kv_blocks_used, kv_blocks_total;
    double forward_seconds;
    uint64_t argmax_steps;   /* steps whose sampled tokens were all plainly greedy and came back
                                from the backend as ids (forward_argmax), not as logits */
    uint64_t sample_steps;   /* steps whose tokens were sampled on the device (forward_sample):
                                only ids and logprobs came back */
    double grammar_seconds;  /* structured output: computing and applying token masks and
                                advancing grammar states (on the step thread) */
} engine_stats_t;
void engine_stats(const engine_t *e, engine_stats_t *st);

/* Tier 2 of the prefix cache (cache/: a host arena indexed in Redis), seen through callbacks so
 * the engine does not depend on it. All are called on the step thread. The names are the
 * engine's block names (engine_info.kv_seed starts the chain); a block is kv_block_bytes bytes in
 * the backend's layout.
 *   lookup       names[0..n) is a chain: how many leading blocks the tier holds (0..n)
 *   fetch        copies block i of the last lookup into dst, and the parent name and tokens
 *                ([block_tokens]) it was stored with into *parent and tokens; 0, or -1 on a
 *                miss. The engine uses the block only when they equal its own (names are
 *                an index, never trusted)
 *   store_begin  a buffer for a newly computed block named name, computed from tokens
 *                ([block_tokens], after parent): the tier keeps them with the block (copied);
 *                NULL when the tier does not want it
 *   store_commit hands the buffer back: ok 1 = filled (store it), 0 = not filled (drop it) */
typedef struct {
    void *arg;
    int (*lookup)(void *arg, const uint64_t *names, int n);
    int (*fetch)(void *arg, int i, void *dst, uint64_t *parent, int32_t *tokens);
    void *(*store_begin)(void *arg, uint64_t name, uint64_t parent, const int32_t *tokens);
    void (*store_commit)(void *arg, void *buf, int ok);
} engine_kv_tier_t;
/* Attaches tier 2 (copied; tier->arg must stay valid until detached with NULL or the engine is
 * freed). A prompt's blocks are then looked up in tier 1, then tier 2; computed blocks are
 * offered to it. 0, or -1 (errstr) when the backend cannot copy blocks or out of memory. */
int engine_set_kv_tier(engine_t *e, const engine_kv_tier_t *tier, char *errstr, size_t errlen);

/* Any thread (reads only the immutable name secret and block geometry): the names of the
 * leading full blocks of a prompt that the prefix cache could reuse, the chain the engine
 * looks up for a request with this prompt and cache_scope (engine_request_t's): at most
 * (n_tokens - 1) / block_tokens blocks (the last prompt token is always computed), at most max.
 * The chain seed (the parent of names[0]) into *seed. Returns the count (0 when the prefix
 * cache is off or no block is full). */
int engine_prefix_names(const engine_t *e, const char *cache_scope, const int32_t *tokens,
                        int n_tokens, uint64_t *seed, uint64_t *names, int max);

/* Prints a GGUF file's metadata, tensors and derived figures (KV bytes per token) to out.
 * Works on files the engine cannot run (it then names why). 0, or -1 when the file itself is
 * unreadable (errstr). */
int engine_inspect(const char *path, FILE *out, char *errstr, size_t errlen);

/* Low-level: one forward step over explicit sequences, for tests and `spillway logits`.
 * Sequence s has tokens[s][0..n[s]) at positions start[s].. and uses block table tables[s]
 * (blocks owned by the caller, allocated with engine_raw_alloc_blocks). logits gets, for every
 * token of every sequence in order, n_vocab floats. 0 or -1. */
int engine_raw_forward(engine_t *e, int n_seqs, const int32_t *const *tokens, const int *n,
                       const int *start, const int32_t *const *tables, float *logits,
                       char *errstr, size_t errlen);
/* Allocates n fresh KV blocks into out (refcount 1). 0, or -1 when the pool is exhausted. */
int engine_raw_alloc_blocks(engine_t *e, int n, int32_t *out);
void engine_raw_free_blocks(engine_t *e, int n, const int32_t *blocks);

/* ---- chat templates (engine/chat.c) ----
 * Built-in renderers (not a Jinja interpreter): the Jinja-exact ones (llama-3, llama-3.1,
 * llama-3.2, qwen2.5, qwen3, gemma-2, gemma-3, phi-3, phi-3.5, mistral-v0.3, mistral-nemo)
 * produce exactly what those models' own Jinja templates do, BOS text included, and refuse what
 * those templates refuse; the others produce what llama.cpp's llama_chat_apply_template does
 * for the same name. */
typedef struct { const char *role; const char *content; } engine_chat_msg_t;
/* Renders msgs[0..n) with the template named `name` ("chatml", "llama2", "llama3", "zephyr", ...:
 * engine_chat_template_names()), or, when name is NULL, with the one detected from the model's
 * tokenizer.chat_template metadata (e may be NULL when name is given).
 * add_generation_prompt: end with the assistant turn opener (templates that have none, such as
 * the llama2 and mistral families, end after the last message either way). NULL role/content
 * count as "". Returns malloc'd NUL-terminated text (caller frees), or NULL + errstr ("unknown
 * chat template ..." naming the supported ones, "model has no chat template", or out of
 * memory, or the conversation a Jinja-exact template refuses). Roles are not checked: this is
 * text to show; the model's prompt comes from engine_chat_tokenize. Thread-safe: reads only immutable model metadata. */
char *engine_chat_render(const engine_t *e, const char *name, const engine_chat_msg_t *msgs, int n,
                         int add_generation_prompt, char *errstr, size_t errlen);
/* Errors of engine_chat_tokenize. */
#define ENGINE_CHAT_ETEMPLATE (-1) /* unknown template, model without one, bad message list */
#define ENGINE_CHAT_EROLE (-2)     /* a role the template does not have (see below) */
#define ENGINE_CHAT_ENOMEM (-3)
/* Renders msgs[0..n) as engine_chat_render does and tokenises the prompt (BOS as the model's
 * flags say) so that only the template's own markers (<|im_start|>, <|eot_id|>, </s>, ...)
 * become special tokens: a role or content that contains such text stays plain text. Every role
 * must be one the template has: system, user, assistant, and also tool for chatml, qwen2.5 and
 * qwen3, tool and ipython for llama3 and llama-3.x, observation for glmedge; anything else, or a
 * conversation a Jinja-exact template refuses (e.g. roles not alternating), is
 * ENGINE_CHAT_EROLE. A BOS text the template writes first is the tokenizer's BOS, not a
 * second one. *ids gets *n_ids ids (malloc'd, caller frees), *text_len (if not NULL) the
 * rendered text's bytes.
 * 0, or ENGINE_CHAT_E* + errstr. Thread-safe like engine_chat_render. */
int engine_chat_tokenize(const engine_t *e, const char *name, const engine_chat_msg_t *msgs,
                         int n, int add_generation_prompt, int32_t **ids, int *n_ids,
                         size_t *text_len, char *errstr, size_t errlen);
/* Options of the templates that have them; NULL stands for ENGINE_CHAT_OPTS_DEFAULT. Other
 * templates ignore them, as a Jinja template ignores a variable it does not read. */
typedef struct {
    int enable_thinking; /* qwen3: 0 = the template's enable_thinking=false (the generation prompt
                          * ends with an empty <think> block); 1 (default) = thinking */
    long long now;       /* llama-3.2's "Today Date": this UTC day, in seconds since the Unix
                          * epoch; < 0 (default) = the current time */
} engine_chat_opts_t;
#define ENGINE_CHAT_OPTS_DEFAULT {1, -1}
/* engine_chat_tokenize with options (opts may be NULL). */
int engine_chat_tokenize_opts(const engine_t *e, const char *name, const engine_chat_msg_t *msgs,
                              int n, int add_generation_prompt, const engine_chat_opts_t *opts,
                              int32_t **ids, int *n_ids, size_t *text_len, char *errstr,
                              size_t errlen);
/* Name of the template detected from the model's metadata, or NULL. */
const char *engine_chat_template(const engine_t *e);
/* Built-in template names, comma-separated ("chatml, llama2, ..."). Static. */
const char *engine_chat_template_names(void);

#endif
