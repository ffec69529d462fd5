/* engine/engine.c: requests, continuous-batching scheduler and the step loop.
 *
 * A sequence holds tokens = prompt + generated; positions [0, n_computed) have KV in its blocks.
 * Every step gives each running sequence min(n_tokens - n_computed, budget left) tokens (one
 * for a decoding sequence, a chunk for one still in prefill); a sequence whose chunk reaches
 * n_tokens gets logits and samples its next token (when every such sequence of a step is plainly
 * greedy and the backend has forward_argmax, the backend returns the argmax ids instead of the
 * logits: for finite logits the same tokens, as the sampler's greedy pick is the argmax with the
 * lowest id winning ties, without moving [n][n_vocab] floats off the device; otherwise, when
 * the backend has forward_sample and no sequence of the step follows a grammar, the backend
 * samples every row on the device with the sequences' host samplers' random numbers and
 * penalty windows, and returns ids and logprobs only). Waiting sequences
 * are admitted in order of (priority desc, arrival asc) while sequences, batch tokens and KV
 * blocks allow, after reusing the longest run of their full prompt blocks that the pool has cached
 * by name. When a running sequence cannot get a block, the lowest-priority, newest running
 * sequence is preempted: its full blocks are published (so its recompute can hit them), its blocks
 * released, and it goes back to the waiting queue keeping its tokens, sampler and text. */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sodium.h>

#include "common/clock.h"
#include "common/err.h"
#include "backend.h"
#include "cpu/kernels.h"
#include "dtype.h"
#include "kvpool.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"
#include "engine_internal.h"
#include "grammar.h"

typedef struct seq {
    uint64_t id;
    uint64_t arrival;
    void *user;
    engine_done_fn done;
    engine_progress_fn progress; /* NULL: none */
    void *cb_arg;
    int priority;
    int64_t deadline_ms;      /* Unix epoch ms, 0 none */

    int32_t *tokens;          /* [cap_tokens]: prompt then generated */
    int n_tokens, cap_tokens;
    int n_prompt;
    int n_computed;           /* positions with KV in the blocks */
    int32_t *blocks;          /* block table [cap_blocks]; -1 for a block released behind the
                                 sliding window (the first n_dropped) */
    int n_blocks, cap_blocks;
    int n_dropped;            /* leading blocks released (seq_drop_old_blocks) */
    int kv_wait_from, kv_wait_to; /* blocks [from, to) came from tier 2 and their copies to the
                                 device may still be in flight (backend kv_write_pending): the
                                 sequence joins a step only once they are in */
    int n_named;              /* leading blocks whose names are known */
    uint64_t last_name;       /* name of block n_named - 1, or chain_seed */
    uint64_t chain_seed;      /* h_{-1} of its names: the engine's kv_seed and its cache scope */
    uint64_t *pnames;         /* [n_pnames] names of the full prompt blocks (prefix cache on) */
    int n_pnames;

    sampler_params_t sp;      /* validated at submit */
    int plain_greedy;         /* temperature <= 0, no penalties, no logprobs: the next token is
                                 the argmax of the raw logits (the backend may pick it) */
    sampler_t *sampler;       /* created at first admission (its scratch is per-vocabulary:
                                 waiting requests hold none), kept across preemption */
    int pen_slot;             /* the backend's penalty-count slot mirroring the sampler's window
                                 (forward_sample), -1 none; freed when a step samples on the host */
    stop_matcher_t *stop;
    int32_t *stop_ids;
    int n_stop_ids;
    int max_tokens;
    int ignore_eos;
    int n_logprobs;
    grammar_state_t *gstate;  /* structured output (NULL: none); its grammar is referenced */

    int n_generated;
    int n_cached;
    int n_preempted;
    char *text;               /* generated text so far (may end in a partial stop string) */
    size_t text_len, text_cap;
    size_t text_final;        /* bytes of text that are final */
    int stopped_by_string;
    tok_stream_t stream;
    engine_logprob_t *lp;     /* [max_tokens] chosen */
    engine_logprob_t *top;    /* [max_tokens][n_logprobs] */

    int64_t t_submit, t_first_scheduled, t_first_token;
    int step_tokens;          /* tokens given in the current step */
    int64_t compute_ns;       /* share of forward time: each step's split over its tokens */
} seq_t;

struct engine {
    engine_config_t cfg;
    model_t *model;
    tokenizer_t *tok;
    backend_t *be;
    kvpool_t *pool;
    int max_ctx;
    int kv_type;
    int kv_window;            /* model_kv_window: > 0 when blocks behind the window are released */

    seq_t **waiting;          /* sorted: priority desc, arrival asc */
    int n_waiting, cap_waiting;
    seq_t **running;          /* sorted the same way */
    int n_running;
    uint64_t next_id;
    uint64_t next_arrival;

    /* step scratch */
    int32_t *b_tokens, *b_pos, *b_seq_start, *b_logits_idx;
    const int32_t **b_tables;
    seq_t **b_seqs;
    float *logits;            /* [max_seqs][n_vocab] */
    int32_t *b_ids;           /* [max_batch_tokens] ids of forward_argmax / forward_sample */
    /* with forward_sample only (else NULL): */
    backend_sample_t *b_rows; /* [max_seqs] forward_sample's rows */
    sampler_logprob_t *b_chosen; /* [max_seqs] forward_sample's chosen logprobs */
    sampler_logprob_t *b_top; /* [max_seqs][SAMPLER_MAX_LOGPROBS] its top logprobs */
    char piece[4096];
    seq_t **cand;             /* [sched_window + 1] admission candidates of a step */
    int64_t *cand_prio, *cand_cached; /* [sched_window + 1] their sort keys */

    grammar_vocab_t *gvocab;  /* token texts for grammar masks, built at the first grammar */
    uint32_t *gmask;          /* [GRAMMAR_MASK_WORDS(n_vocab)] mask scratch of the step */

    engine_kv_tier_t tier;    /* tier 2; tier.lookup NULL = none */
    struct tier_store {       /* a tier-2 store whose block is still being copied off the
                                 device (backend kv_block_read_async); the block holds a
                                 reference of its own until the copy is answered */
        uint64_t ticket;
        void *buf;            /* the tier's buffer, committed once the copy is answered */
        int32_t block;
    } *stores;                /* [n_stores], capacity cap_stores */
    int n_stores, cap_stores;
    void *kv_stage;           /* [kv_block_bytes] tier 2 fetch staging */
    int32_t *tok_stage;       /* [block_tokens] tokens of a tier 2 fetch */
    uint64_t kv_seed;         /* chain seed of the shared scope */

    engine_stats_t st;
};

void engine_config_default(engine_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->backend = "cpu";
    c->threads = 0;
    c->block_tokens = 16;
    c->kv_blocks = 0;
    c->kv_mem_mb = 1024;
    c->kv_type = "f16";
    c->max_batch_tokens = 512;
    c->max_seqs = 64;
    c->max_ctx = 0;
    c->prefix_cache = 1;
    c->cpu_pack = 1;
    c->sched_window = 32;
    c->sched_aging_ms = 5000;
    c->sched_urgent_ms = 2000;
    c->cuda_dtype = "bf16";
    c->cuda_mem_fraction = 0.9f;
    c->cuda_device = 0;
}

const char *engine_backends(void)
{
#ifdef SPILLWAY_HAVE_CUDA
    return "cpu, cuda";
#else
    return "cpu";
#endif
}

void engine_request_default(engine_request_t *r)
{
    memset(r, 0, sizeof *r);
    sampler_params_default(&r->sampling);
    r->max_tokens = 256;
}

const char *engine_finish_name(int finish)
{
    switch (finish) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_ABORT: return "abort";
    default: return "unknown";
    }
}

/* ---- sequences ---- */

static void seq_free(seq_t *s)
{
    if (!s) return;
    free(s->tokens);
    free(s->blocks);
    free(s->pnames);
    sampler_free(s->sampler);
    stop_matcher_free(s->stop);
    free(s->stop_ids);
    free(s->text);
    free(s->lp);
    free(s->top);
    grammar_state_free(s->gstate);
    free(s);
}

/* Frees s's penalty slot on the backend, if it holds one. */
static void seq_free_pen_slot(engine_t *e, seq_t *s)
{
    if (s->pen_slot >= 0) e->be->ops->sample_slot_free(e->be, s->pen_slot);
    s->pen_slot = -1;
}

static void seq_release_blocks(engine_t *e, seq_t *s)
{
    for (int i = s->n_dropped; i < s->n_blocks; i++) kvpool_unref(e->pool, s->blocks[i]);
    s->n_dropped = 0;
    s->n_blocks = 0;
    s->kv_wait_from = s->kv_wait_to = 0;
    s->n_named = 0;
    s->last_name = s->chain_seed;
    s->n_computed = 0;
}

/* Commits to tier 2 the stores whose copies have been answered (all of them with wait 1, which
 * blocks until each is), dropping each block's extra reference. Step thread. */
static void tier_stores_reap(engine_t *e, int wait)
{
    int kept = 0;
    for (int i = 0; i < e->n_stores; i++) {
        struct tier_store *ts = &e->stores[i];
        const int d = e->be->ops->kv_read_done(e->be, ts->ticket, wait);
        if (d == 0) {
            e->stores[kept++] = *ts;
            continue;
        }
        e->tier.store_commit(e->tier.arg, ts->buf, d == 1);
        e->st.tier2_stores += (uint64_t)(d == 1);
        kvpool_unref(e->pool, ts->block);
    }
    e->n_stores = kept;
}

/* Offers block b, named name, to tier 2: the copy off the device is queued and committed later
 * (tier_stores_reap) where the backend can, else made now. */
static void tier_store(engine_t *e, int32_t b, uint64_t name, uint64_t parent,
                       const int32_t *toks)
{
    void *buf = e->tier.store_begin(e->tier.arg, name, parent, toks);
    if (!buf) return;
    if (e->be->ops->kv_block_read_async && e->be->ops->kv_read_done) {
        if (e->n_stores == e->cap_stores) {
            const int cap = e->cap_stores ? 2 * e->cap_stores : 16;
            struct tier_store *grown = realloc(e->stores, sizeof *grown * (size_t)cap);
            if (grown) {
                e->stores = grown;
                e->cap_stores = cap;
            }
        }
        uint64_t ticket;
        if (e->n_stores < e->cap_stores &&
            e->be->ops->kv_block_read_async(e->be, b, buf, &ticket) == 0) {
            kvpool_ref(e->pool, b);
            e->stores[e->n_stores++] = (struct tier_store){ticket, buf, b};
            return;
        }
    }
    const int ok = e->be->ops->kv_block_read(e->be, b, buf) == 0;
    e->st.tier2_stores += (uint64_t)ok;
    e->tier.store_commit(e->tier.arg, buf, ok);
}

/* Names and publishes the full, computed blocks not yet named. */
static void seq_publish(engine_t *e, seq_t *s)
{
    if (!e->cfg.prefix_cache) return;
    const int B = e->cfg.block_tokens;
    int full = s->n_computed / B;
    while (s->n_named < full && s->n_named < s->n_blocks) {
        int32_t b = s->blocks[s->n_named];
        const int32_t *toks = s->tokens + (size_t)s->n_named * B;
        uint64_t name = s->n_named < s->n_pnames ? s->pnames[s->n_named]
                                                 : kvpool_block_name(e->pool, s->last_name, toks);
        kvpool_publish(e->pool, b, name, s->last_name, toks);
        if (e->tier.store_begin) tier_store(e, b, name, s->last_name, toks);
        s->last_name = name;
        s->n_named++;
    }
}

/* Sliding-window models (every layer windowed, e->kv_window > 0): releases the blocks wholly
 * before the first key the sequence's next query reads (its next position is n_computed, its
 * first key n_computed - kv_window + 1) and marks them -1 in the table (backend.h). With the
 * prefix cache only named blocks are released (seq_publish reads the others first); a published
 * block stays cached by name. */
static void seq_drop_old_blocks(engine_t *e, seq_t *s)
{
    if (e->kv_window <= 0) return;
    int first_key = s->n_computed - e->kv_window + 1;
    int drop = first_key > 0 ? first_key / e->cfg.block_tokens : 0;
    if (drop > s->n_blocks) drop = s->n_blocks;
    if (e->cfg.prefix_cache && drop > s->n_named) drop = s->n_named;
    for (; s->n_dropped < drop; s->n_dropped++) {
        kvpool_unref(e->pool, s->blocks[s->n_dropped]);
        s->blocks[s->n_dropped] = -1;
    }
}

static int text_append(seq_t *s, const char *p, size_t n)
{
    if (s->text_len + n + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap * 2 : 256;
        while (cap < s->text_len + n + 1) cap *= 2;
        char *t = realloc(s->text, cap);
        if (!t) return -1;
        s->text = t;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return 0;
}

static void queue_insert(seq_t **q, int *n, seq_t *s)
{
    int i = *n;
    while (i > 0 && (q[i - 1]->priority < s->priority ||
                     (q[i - 1]->priority == s->priority && q[i - 1]->arrival > s->arrival))) {
        q[i] = q[i - 1];
        i--;
    }
    q[i] = s;
    (*n)++;
}

static void queue_remove_at(seq_t **q, int *n, int i)
{
    memmove(q + i, q + i + 1, (size_t)(*n - i - 1) * sizeof *q);
    (*n)--;
}

static void seq_finish(engine_t *e, seq_t *s, int finish)
{
    seq_publish(e, s);
    seq_release_blocks(e, s);
    if (!s->stopped_by_string) {
        /* Whatever the stream still holds back is final now. */
        char tail[64];
        int n = tokenizer_stream_flush(e->tok, &s->stream, tail, sizeof tail);
        if (n > 0 && text_append(s, tail, (size_t)n) == 0) {
        }
        s->text_final = s->text_len;
    }
    engine_result_t r = {
        .id = s->id,
        .user = s->user,
        .finish = finish,
        .text = s->text ? s->text : "",
        .text_len = s->text_final,
        .tokens = s->tokens + s->n_prompt,
        .n_tokens = s->n_generated,
        .n_prompt = s->n_prompt,
        .n_cached = s->n_cached,
        .n_preempted = s->n_preempted,
        .t_submit = s->t_submit,
        .t_first_scheduled = s->t_first_scheduled,
        .t_first_token = s->t_first_token,
        .t_finish = sw_mono_ns(),
        .compute_ns = s->compute_ns,
        .logprobs = s->n_logprobs ? s->lp : NULL,
        .top_logprobs = s->n_logprobs ? s->top : NULL,
        .n_logprobs = s->n_logprobs,
    };
    if (s->text) s->text[s->text_final] = 0;
    if (s->done) s->done(s->cb_arg, &r);
    seq_free_pen_slot(e, s);
    seq_free(s);
}

/* ---- construction ---- */

void engine_free(engine_t *e)
{
    if (!e) return;
    tier_stores_reap(e, 1);
    free(e->stores);
    for (int i = 0; i < e->n_waiting; i++) {
        seq_release_blocks(e, e->waiting[i]);
        seq_free_pen_slot(e, e->waiting[i]);
        seq_free(e->waiting[i]);
    }
    for (int i = 0; i < e->n_running; i++) {
        seq_release_blocks(e, e->running[i]);
        seq_free_pen_slot(e, e->running[i]);
        seq_free(e->running[i]);
    }
    free(e->waiting);
    free(e->running);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_seq_start);
    free(e->b_logits_idx);
    free(e->b_ids);
    free(e->b_rows);
    free(e->b_chosen);
    free(e->b_top);
    free(e->b_tables);
    free(e->b_seqs);
    free(e->logits);
    free(e->cand);
    free(e->cand_prio);
    free(e->cand_cached);
    free(e->kv_stage);
    free(e->tok_stage);
    grammar_vocab_free(e->gvocab);
    free(e->gmask);
    kvpool_free(e->pool);
    backend_free(e->be);
    tokenizer_free(e->tok);
    model_free(e->model);
    free(e);
}

engine_t *engine_new(const engine_config_t *cfg, char *errstr, size_t errlen)
{
    engine_t *e = calloc(1, sizeof *e);
    if (!e) {
        sw_seterr(errstr, errlen, "engine: out of memory");
        return NULL;
    }
    e->cfg = *cfg;
    engine_config_t *c = &e->cfg;
    if (!c->model_path) {
        sw_seterr(errstr, errlen, "engine: no model path");
        goto fail;
    }
    int use_cuda = 0, cuda_wtype = DT_BF16;
    if (c->backend && strcmp(c->backend, "auto") == 0) {
#ifdef SPILLWAY_HAVE_CUDA
        use_cuda = backend_cuda_device_count() > 0;
#endif
    } else if (c->backend && strcmp(c->backend, "cuda") == 0) {
#ifdef SPILLWAY_HAVE_CUDA
        use_cuda = 1;
#else
        sw_seterr(errstr, errlen, "engine: backend 'cuda' is not built in (configure with "
                  "-DSPILLWAY_CUDA=ON); available: %s", engine_backends());
        goto fail;
#endif
    } else if (c->backend && strcmp(c->backend, "cpu") != 0) {
        sw_seterr(errstr, errlen, "engine: backend '%s' is not available; available: %s", c->backend,
                  engine_backends());
        goto fail;
    }
    if (use_cuda) {
        if (c->cuda_dtype && strcmp(c->cuda_dtype, "bf16") == 0) cuda_wtype = DT_BF16;
        else if (c->cuda_dtype && strcmp(c->cuda_dtype, "f16") == 0) cuda_wtype = DT_F16;
        else if (c->cuda_dtype && strcmp(c->cuda_dtype, "f32") == 0) cuda_wtype = DT_F32;
        else if (c->cuda_dtype && strcmp(c->cuda_dtype, "fp8") == 0) cuda_wtype = BACKEND_WTYPE_FP8;
        else {
            sw_seterr(errstr, errlen, "engine: cuda_dtype must be bf16, f16, f32 or fp8");
            goto fail;
        }
        if (!(c->cuda_mem_fraction > 0.0f && c->cuda_mem_fraction <= 1.0f)) {
            sw_seterr(errstr, errlen, "engine: cuda_mem_fraction must be in (0, 1]");
            goto fail;
        }
        if (c->cuda_device < 0) {
            sw_seterr(errstr, errlen, "engine: cuda_device must be >= 0");
            goto fail;
        }
    }
    if (c->kv_type && strcmp(c->kv_type, "f16") == 0) e->kv_type = DT_F16;
    else if (c->kv_type && strcmp(c->kv_type, "f32") == 0) e->kv_type = DT_F32;
    else {
        sw_seterr(errstr, errlen, "engine: kv_type must be f16 or f32");
        goto fail;
    }
    if (c->threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c->threads = n > 0 ? (int)n : 1;
    }
    if (c->block_tokens < 1 || c->block_tokens > 4096 || c->max_batch_tokens < 1 ||
        c->max_seqs < 1 || c->max_seqs > c->max_batch_tokens || c->kv_blocks < 0 ||
        c->kv_mem_mb < 0 || c->max_ctx < 0 || c->threads > 1024 || c->sched_window < 1 ||
        c->sched_window > 65536 || c->sched_aging_ms < 0 || c->sched_urgent_ms < 0) {
        sw_seterr(errstr, errlen, "engine: bad limits (block_tokens 1..4096, max_batch_tokens >= "
                  "max_seqs >= 1, threads <= 1024, sched_window 1..65536, sched_*_ms >= 0)");
        goto fail;
    }
    e->model = model_load(c->model_path, errstr, errlen);
    if (!e->model) goto fail;
    e->tok = tokenizer_from_gguf(e->model->gguf, errstr, errlen);
    if (!e->tok) goto fail;
    const hparams_t *hp = &e->model->hp;
    e->max_ctx = c->max_ctx > 0 && c->max_ctx < hp->ctx_len ? c->max_ctx : hp->ctx_len;
    e->kv_window = model_kv_window(e->model);
    model_select_context(e->model, e->max_ctx);

    size_t block_bytes = (size_t)c->block_tokens *
                         model_kv_bytes_per_token(e->model, e->kv_type == DT_F32 ? 4 : 2);
    int n_blocks = c->kv_blocks;
    if (n_blocks == 0 && !use_cuda) {
        size_t nb = ((size_t)c->kv_mem_mb << 20) / block_bytes;
        n_blocks = nb > (1u << 30) ? (1 << 30) : (int)nb;
    }
    if (n_blocks < 1 && !use_cuda) {
        sw_seterr(errstr, errlen, "engine: the KV pool holds no block of %zu bytes", block_bytes);
        goto fail;
    }
    backend_params_t bp = {
        .threads = c->threads,
        .block_tokens = c->block_tokens,
        .n_kv_blocks = n_blocks, /* cuda: 0 = sized by the backend from its memory budget */
        .kv_type = e->kv_type,
        .max_batch_tokens = c->max_batch_tokens,
        .cpu_pack = c->cpu_pack,
        .weight_type = cuda_wtype,
        .mem_fraction = c->cuda_mem_fraction,
        .device = c->cuda_device,
        .max_seqs = c->max_seqs,
        .max_ctx = e->max_ctx,
    };
#ifdef SPILLWAY_HAVE_CUDA
    if (use_cuda) e->be = backend_cuda_new(e->model, &bp, errstr, errlen);
    else
#endif
        e->be = backend_cpu_new(e->model, &bp, errstr, errlen);
    if (!e->be) goto fail;
    n_blocks = e->be->params.n_kv_blocks;
    int per_seq = (e->max_ctx + c->block_tokens - 1) / c->block_tokens;
    if (per_seq > n_blocks) e->max_ctx = n_blocks * c->block_tokens; /* one sequence must fit */
    unsigned char secret[ENGINE_KV_SECRET_BYTES];
    if (sodium_init() < 0) {
        sw_seterr(errstr, errlen, "engine: libsodium failed to initialise");
        goto fail;
    }
    if (c->kv_secret) memcpy(secret, c->kv_secret, sizeof secret);
    else randombytes_buf(secret, sizeof secret);
    c->kv_secret = NULL; /* borrowed only during engine_new */
    e->pool = kvpool_new(n_blocks, c->block_tokens, secret, errstr, errlen);
    sodium_memzero(secret, sizeof secret);
    if (!e->pool) goto fail;
    uint64_t seed_in[4] = {e->model->fingerprint, (uint64_t)c->block_tokens, (uint64_t)e->kv_type,
                           0x73706c6c77617932ull /* "spllway2" */};
    e->kv_seed = kvpool_derive_seed(e->pool, 0, seed_in, sizeof seed_in);

    size_t T = (size_t)c->max_batch_tokens;
    e->cap_waiting = 64;
    e->waiting = malloc(sizeof *e->waiting * (size_t)e->cap_waiting);
    e->running = malloc(sizeof *e->running * (size_t)c->max_seqs);
    e->b_tokens = malloc(T * sizeof *e->b_tokens);
    e->b_pos = malloc(T * sizeof *e->b_pos);
    e->b_seq_start = malloc((T + 1) * sizeof *e->b_seq_start);
    e->b_logits_idx = malloc(T * sizeof *e->b_logits_idx);
    e->b_ids = malloc(T * sizeof *e->b_ids);
    if (e->be->ops->forward_sample) { /* one row per sequence of a step at most */
        const size_t S = (size_t)c->max_seqs;
        e->b_rows = malloc(S * sizeof *e->b_rows);
        e->b_chosen = malloc(S * sizeof *e->b_chosen);
        e->b_top = malloc(S * SAMPLER_MAX_LOGPROBS * sizeof *e->b_top);
        if (!e->b_rows || !e->b_chosen || !e->b_top) {
            sw_seterr(errstr, errlen, "engine: out of memory");
            goto fail;
        }
    }
    e->b_tables = malloc(T * sizeof *e->b_tables);
    e->b_seqs = malloc(T * sizeof *e->b_seqs);
    e->logits = malloc((size_t)c->max_seqs * hp->n_vocab * sizeof *e->logits);
    e->cand = malloc(sizeof *e->cand * ((size_t)c->sched_window + 1));
    e->cand_prio = malloc(sizeof *e->cand_prio * ((size_t)c->sched_window + 1));
    e->cand_cached = malloc(sizeof *e->cand_cached * ((size_t)c->sched_window + 1));
    if (!e->cand || !e->cand_prio || !e->cand_cached || !e->waiting || !e->running || !e->b_tokens || !e->b_pos || !e->b_seq_start ||
        !e->b_logits_idx || !e->b_ids || !e->b_tables || !e->b_seqs || !e->logits) {
        sw_seterr(errstr, errlen, "engine: out of memory");
        goto fail;
    }
    e->next_id = 1;
    e->st.kv_blocks_total = n_blocks;
    return e;
fail:
    engine_free(e);
    return NULL;
}

/* ---- requests ---- */

/* Builds the vocabulary's token texts for grammar masks (once). */
static int engine_grammar_init(engine_t *e, char *errstr, size_t errlen)
{
    if (e->gvocab) return 0;
    const int n = e->model->hp.n_vocab;
    char **pieces = calloc((size_t)n, sizeof *pieces);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    unsigned char *eog = calloc((size_t)n, 1);
    int rc = -1;
    if (!pieces || !lens || !eog) goto oom;
    for (int i = 0; i < n; i++) {
        int len = tokenizer_token_to_piece(e->tok, i, 0, e->piece, sizeof e->piece);
        if (len < 0) len = 0;
        if ((size_t)len > sizeof e->piece) len = (int)sizeof e->piece;
        pieces[i] = malloc((size_t)len + 1);
        if (!pieces[i]) goto oom;
        memcpy(pieces[i], e->piece, (size_t)len);
        lens[i] = (size_t)len;
        eog[i] = (unsigned char)tokenizer_is_eog(e->tok, i);
    }
    e->gmask = malloc(GRAMMAR_MASK_WORDS(n) * sizeof *e->gmask);
    if (!e->gmask) goto oom;
    e->gvocab = grammar_vocab_new(n, (const char *const *)pieces, lens, eog,
                                  tokenizer_strips_start_space(e->tok), errstr, errlen);
    rc = e->gvocab ? 0 : -1;
    goto out;
oom:
    sw_seterr(errstr, errlen, "out of memory");
out:
    if (pieces)
        for (int i = 0; i < n; i++) free(pieces[i]);
    free(pieces);
    free(lens);
    free(eog);
    return rc;
}

/* The grammar a new sequence uses: one already in use with the same text (so the sequences
 * share its mask cache), else g. Borrowed. */
static grammar_t *engine_grammar_intern(engine_t *e, grammar_t *g)
{
    for (int q = 0; q < 2; q++) {
        seq_t **v = q ? e->running : e->waiting;
        int n = q ? e->n_running : e->n_waiting;
        for (int i = 0; i < n; i++) {
            if (!v[i]->gstate) continue;
            grammar_t *h = grammar_state_grammar(v[i]->gstate);
            if (grammar_same_text(h, g)) return h;
        }
    }
    return g;
}

int engine_submit(engine_t *e, const engine_request_t *req, engine_done_fn done, void *cb_arg,
                  uint64_t *id_out, char *errstr, size_t errlen)
{
    const int n_vocab = e->model->hp.n_vocab;
    int rc = -SW_EINVAL;
    if (req->n_prompt < 1) {
        sw_seterr(errstr, errlen, "empty prompt (at least one token is needed)");
        return -1;
    }
    if (req->n_prompt >= e->max_ctx) {
        sw_seterr(errstr, errlen, "prompt of %d tokens leaves no room in the context of %d tokens",
                  req->n_prompt, e->max_ctx);
        return -SW_ERANGE;
    }
    if (req->max_tokens < 1) {
        sw_seterr(errstr, errlen, "max_tokens must be at least 1");
        return -1;
    }
    for (int i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= n_vocab) {
            sw_seterr(errstr, errlen, "prompt token %d (id %d) is outside the vocabulary [0, %d)", i,
                      req->prompt[i], n_vocab);
            return -1;
        }
    if (req->n_stop < 0 || req->n_stop_ids < 0 || req->sampling.n_logprobs < 0 ||
        req->sampling.n_logprobs > SAMPLER_MAX_LOGPROBS) {
        sw_seterr(errstr, errlen, "bad stop list or n_logprobs (0..%d)", SAMPLER_MAX_LOGPROBS);
        return -1;
    }
    seq_t *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->pen_slot = -1;
    int room = e->max_ctx;
    int max_tokens = req->max_tokens;
    if (max_tokens > room - req->n_prompt) max_tokens = room - req->n_prompt + 0;
    s->cap_tokens = req->n_prompt + max_tokens + 1;
    s->tokens = malloc((size_t)s->cap_tokens * sizeof *s->tokens);
    s->cap_blocks = (s->cap_tokens + e->cfg.block_tokens - 1) / e->cfg.block_tokens;
    s->blocks = malloc((size_t)s->cap_blocks * sizeof *s->blocks);
    if (!s->tokens || !s->blocks) goto oom;
    memcpy(s->tokens, req->prompt, (size_t)req->n_prompt * sizeof *s->tokens);
    s->n_tokens = s->n_prompt = req->n_prompt;
    s->max_tokens = req->max_tokens;
    s->ignore_eos = req->ignore_eos;
    s->priority = req->priority;
    s->deadline_ms = req->deadline_ms;
    s->user = req->user;
    s->done = done;
    s->progress = req->progress;
    s->cb_arg = cb_arg;
    s->chain_seed = req->cache_scope && *req->cache_scope
                        ? kvpool_derive_seed(e->pool, e->kv_seed, req->cache_scope,
                                             strlen(req->cache_scope))
                        : e->kv_seed;
    s->last_name = s->chain_seed;
    s->n_logprobs = req->sampling.n_logprobs;
    if (s->n_logprobs) {
        s->lp = calloc((size_t)max_tokens + 1, sizeof *s->lp);
        s->top = calloc(((size_t)max_tokens + 1) * (size_t)s->n_logprobs, sizeof *s->top);
        if (!s->lp || !s->top) goto oom;
    }
    s->sp = req->sampling;
    if (sampler_params_validate(&s->sp, errstr, errlen) != 0) goto fail;
    /* penalties count when the sampler turns them on (sampler.c: pen_on) */
    /* a grammar masks the logits on the host first: never by the backend's argmax */
    s->plain_greedy = !req->grammar && s->sp.temperature <= 0.0f && s->sp.n_logprobs == 0 &&
                      !(s->sp.repeat_last_n != 0 &&
                        (s->sp.repeat_penalty != 1.0f || s->sp.presence_penalty != 0.0f ||
                         s->sp.frequency_penalty != 0.0f));
    if (req->n_stop > 0) {
        s->stop = stop_matcher_new(req->stop, req->n_stop, errstr, errlen);
        if (!s->stop) goto fail;
    }
    if (req->n_stop_ids > 0) {
        s->stop_ids = malloc((size_t)req->n_stop_ids * sizeof *s->stop_ids);
        if (!s->stop_ids) goto oom;
        memcpy(s->stop_ids, req->stop_ids, (size_t)req->n_stop_ids * sizeof *s->stop_ids);
        s->n_stop_ids = req->n_stop_ids;
    }
    tokenizer_stream_init(&s->stream, req->text_at_start);
    if (req->grammar) {
        if (engine_grammar_init(e, errstr, errlen) != 0) goto fail;
        s->gstate = grammar_state_new(engine_grammar_intern(e, req->grammar), errstr, errlen);
        if (!s->gstate) goto fail;
    }
    if (e->n_waiting == e->cap_waiting) {
        int cap = e->cap_waiting * 2;
        seq_t **w = realloc(e->waiting, sizeof *w * (size_t)cap);
        if (!w) goto oom;
        e->waiting = w;
        e->cap_waiting = cap;
    }
    s->id = e->next_id++;
    s->arrival = e->next_arrival++;
    s->t_submit = sw_mono_ns();
    queue_insert(e->waiting, &e->n_waiting, s);
    if (id_out) *id_out = s->id;
    return 0;
oom:
    sw_seterr(errstr, errlen, "out of memory");
    rc = -SW_ENOMEM;
fail:
    seq_free(s);
    return rc;
}

int engine_cancel(engine_t *e, uint64_t id)
{
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i]->id == id) {
            seq_t *s = e->waiting[i];
            queue_remove_at(e->waiting, &e->n_waiting, i);
            seq_finish(e, s, ENGINE_FINISH_ABORT);
            return 0;
        }
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) {
            seq_t *s = e->running[i];
            queue_remove_at(e->running, &e->n_running, i);
            seq_finish(e, s, ENGINE_FINISH_ABORT);
            return 0;
        }
    return -1;
}

int engine_n_waiting(const engine_t *e) { return e->n_waiting; }
int engine_n_running(const engine_t *e) { return e->n_running; }

/* ---- scheduling ---- */

/* Makes s hold blocks for positions [0, upto). 0, or -1 when the pool has no block left. */
static int seq_grow(engine_t *e, seq_t *s, int upto)
{
    int need = (upto + e->cfg.block_tokens - 1) / e->cfg.block_tokens;
    while (s->n_blocks < need) {
        int32_t b = kvpool_alloc(e->pool);
        if (b < 0) return -1;
        s->blocks[s->n_blocks++] = b;
    }
    return 0;
}

static void preempt(engine_t *e, int idx)
{
    seq_t *s = e->running[idx];
    queue_remove_at(e->running, &e->n_running, idx);
    seq_publish(e, s);
    seq_release_blocks(e, s);
    s->n_preempted++;
    e->st.preemptions++;
    queue_insert(e->waiting, &e->n_waiting, s); /* arrival order puts it ahead of newer ones */
}

/* Names of the full blocks of s's tokens [0, upto) into s->pnames (grown as needed). 0 or -1. */
static int seq_name_blocks(engine_t *e, seq_t *s, int upto)
{
    const int B = e->cfg.block_tokens;
    int n = upto / B;
    if (n <= s->n_pnames) return 0;
    uint64_t *p = realloc(s->pnames, sizeof *p * (size_t)n);
    if (!p) return -1;
    s->pnames = p;
    for (int i = s->n_pnames; i < n; i++)
        p[i] = kvpool_block_name(e->pool, i ? p[i - 1] : s->chain_seed,
                                 s->tokens + (size_t)i * B);
    s->n_pnames = n;
    return 0;
}

int engine_prefix_names(const engine_t *e, const char *cache_scope, const int32_t *tokens,
                        int n_tokens, uint64_t *seed, uint64_t *names, int max)
{
    const int B = e->cfg.block_tokens;
    *seed = cache_scope && *cache_scope
                ? kvpool_derive_seed(e->pool, e->kv_seed, cache_scope, strlen(cache_scope))
                : e->kv_seed;
    if (!e->cfg.prefix_cache || n_tokens < 1 || !tokens) return 0;
    int n = (n_tokens - 1) / B;
    if (n > max) n = max;
    for (int i = 0; i < n; i++)
        names[i] = kvpool_block_name(e->pool, i ? names[i - 1] : *seed, tokens + (size_t)i * B);
    return n;
}

/* The parent name of s's full block i (s->pnames holds blocks [0, i)). */
static uint64_t seq_parent(const seq_t *s, int i) { return i ? s->pnames[i - 1] : s->chain_seed; }

/* Blocks of s's leading full blocks held by tier 1 (no reference taken), at most max. */
static int seq_cached_blocks(const engine_t *e, const seq_t *s, int max)
{
    const int B = e->cfg.block_tokens;
    int n = 0;
    while (n < max && n < s->n_pnames &&
           kvpool_contains(e->pool, s->pnames[n], seq_parent(s, n), s->tokens + (size_t)n * B))
        n++;
    return n;
}

/* Reuses the longest run of cached full blocks of s's tokens (tier 1, then tier 2), leaving at
 * least one token to compute (its logits are needed). */
static void seq_reuse_prefix(engine_t *e, seq_t *s)
{
    if (!e->cfg.prefix_cache || s->n_computed != 0) return;
    const int B = e->cfg.block_tokens;
    int max_blocks = (s->n_tokens - 1) / B;
    if (seq_name_blocks(e, s, s->n_tokens) != 0) return; /* out of memory: compute it all */
    while (s->n_blocks < max_blocks) {
        int i = s->n_blocks;
        int32_t b = kvpool_lookup(e->pool, s->pnames[i], seq_parent(s, i),
                                  s->tokens + (size_t)i * B);
        if (b < 0) break;
        s->blocks[s->n_blocks++] = b;
    }
    if (e->tier.lookup && s->n_blocks < max_blocks) {
        int first = s->n_blocks, want = max_blocks - first;
        e->st.tier2_lookups += (uint64_t)want;
        int found = e->tier.lookup(e->tier.arg, s->pnames + first, want);
        for (int i = 0; i < found; i++) {
            int j = first + i;
            const int32_t *toks = s->tokens + (size_t)j * B;
            uint64_t parent = 0;
            /* straight into the backend's page-locked staging when it has one */
            void *stage = e->be->ops->kv_stage_buffer ? e->be->ops->kv_stage_buffer(e->be) : NULL;
            if (!stage) stage = e->kv_stage;
            if (e->tier.fetch(e->tier.arg, i, stage, &parent, e->tok_stage) != 0) break;
            /* the tier's name is only an index: the block is ours only if it was computed
             * from these tokens after this parent */
            if (parent != seq_parent(s, j) ||
                memcmp(e->tok_stage, toks, (size_t)B * sizeof *toks) != 0) {
                e->st.kv_mismatches++;
                break;
            }
            int32_t b = kvpool_alloc(e->pool);
            if (b < 0) break;
            if (e->be->ops->kv_block_write(e->be, b, stage) != 0) {
                kvpool_unref(e->pool, b);
                break;
            }
            kvpool_publish(e->pool, b, s->pnames[j], seq_parent(s, j), toks);
            s->blocks[s->n_blocks++] = b;
            e->st.tier2_hits++;
        }
        if (e->be->ops->kv_write_pending && s->n_blocks > first) {
            s->kv_wait_from = first;
            s->kv_wait_to = s->n_blocks;
        }
    }
    s->n_named = s->n_blocks;
    s->last_name = seq_parent(s, s->n_blocks);
    s->n_computed = s->n_blocks * B;
}

/* Whether s waits for its tier-2 blocks' copies to the device (seq_t.kv_wait_*); forgets the
 * wait once they are in. Never blocks. A device error counts as in: the step reports it. */
static int seq_kv_pending(engine_t *e, seq_t *s)
{
    if (s->kv_wait_to <= s->kv_wait_from) return 0;
    if (e->be->ops->kv_write_pending(e->be, s->blocks + s->kv_wait_from,
                                     s->kv_wait_to - s->kv_wait_from) == 1)
        return 1;
    s->kv_wait_from = s->kv_wait_to = 0;
    return 0;
}

/* Whether s's first block that is not cached is being computed by a running sequence right now:
 * admitting s would compute it a second time, while waiting a step or two gets it from tier 1
 * once that sequence publishes it. */
static int prefix_in_flight(const engine_t *e, const seq_t *s, int cached)
{
    if (cached >= s->n_pnames || cached >= (s->n_tokens - 1) / e->cfg.block_tokens) return 0;
    uint64_t name = s->pnames[cached];
    for (int i = 0; i < e->n_running; i++) {
        const seq_t *r = e->running[i];
        if (r->n_named <= cached && cached < r->n_pnames && r->pnames[cached] == name) return 1;
    }
    return 0;
}

/* Admission candidates of this step, best first (see engine_config_t.sched_*): fills e->cand and
 * returns their number. */
static int pick_candidates(engine_t *e)
{
    int w = e->cfg.sched_window < e->n_waiting ? e->cfg.sched_window : e->n_waiting;
    int n = 0;
    for (int i = 0; i < w; i++) e->cand[n++] = e->waiting[i];
    /* the oldest waiting request, wherever priority put it */
    seq_t *oldest = NULL;
    for (int i = w; i < e->n_waiting; i++)
        if (!oldest || e->waiting[i]->arrival < oldest->arrival) oldest = e->waiting[i];
    if (oldest) e->cand[n++] = oldest;
    if (n <= 1) return n;
    int64_t now = sw_mono_ns(), wall = e->cfg.sched_urgent_ms > 0 ? sw_wall_ms() : 0;
    int64_t *key_prio = e->cand_prio, *key_cached = e->cand_cached;
    for (int i = 0; i < n; i++) {
        seq_t *s = e->cand[i];
        int64_t p = s->priority;
        if (e->cfg.sched_aging_ms > 0)
            p += (now - s->t_submit) / ((int64_t)e->cfg.sched_aging_ms * 1000000);
        if (s->deadline_ms > 0 && e->cfg.sched_urgent_ms > 0 &&
            s->deadline_ms - wall < e->cfg.sched_urgent_ms)
            p += 1;
        key_prio[i] = p;
        key_cached[i] = 0;
        if (e->cfg.prefix_cache && s->n_computed == 0 && seq_name_blocks(e, s, s->n_tokens) == 0)
            key_cached[i] = seq_cached_blocks(e, s, (s->n_tokens - 1) / e->cfg.block_tokens);
    }
    /* insertion sort: n is small */
    for (int i = 1; i < n; i++) {
        seq_t *s = e->cand[i];
        int64_t kp = key_prio[i], kc = key_cached[i];
        int j = i;
        while (j > 0 && (key_prio[j - 1] < kp ||
                         (key_prio[j - 1] == kp && (key_cached[j - 1] < kc ||
                                                    (key_cached[j - 1] == kc &&
                                                     e->cand[j - 1]->arrival > s->arrival))))) {
            e->cand[j] = e->cand[j - 1];
            key_prio[j] = key_prio[j - 1];
            key_cached[j] = key_cached[j - 1];
            j--;
        }
        e->cand[j] = s;
        key_prio[j] = kp;
        key_cached[j] = kc;
    }
    return n;
}

static int waiting_index(const engine_t *e, const seq_t *s)
{
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i] == s) return i;
    return -1;
}

/* Plans one step: fills e->b_seqs[0..n) with step_tokens set. Returns n. */
static int plan_step(engine_t *e)
{
    int budget = e->cfg.max_batch_tokens;
    int n = 0;
    /* Running sequences, highest priority / oldest first. */
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        seq_t *s = e->running[i];
        if (seq_kv_pending(e, s)) { /* its prefix is still being copied in: not this step */
            e->st.tier2_waits++;
            continue;
        }
        int want = s->n_tokens - s->n_computed;
        if (want > budget) want = budget;
        while (seq_grow(e, s, s->n_computed + want) != 0) {
            /* Out of blocks: preempt the lowest-priority, newest sequence (maybe s itself). */
            int victim = e->n_running - 1;
            int self = e->running[victim] == s;
            preempt(e, victim);
            if (self) {
                want = 0;
                break;
            }
        }
        if (want == 0) break; /* s was the last one and got preempted */
        s->step_tokens = want;
        budget -= want;
        e->b_seqs[n++] = s;
    }
    /* Admissions, best candidate first; one that does not fit ends them (no smaller request
     * overtakes it, so it cannot starve). */
    int n_cand = e->n_running < e->cfg.max_seqs && budget > 0 ? pick_candidates(e) : 0;
    for (int c = 0; c < n_cand && e->n_running < e->cfg.max_seqs && budget > 0; c++) {
        seq_t *s = e->cand[c];
        if (e->cfg.prefix_cache && s->n_computed == 0 &&
            prefix_in_flight(e, s, seq_cached_blocks(e, s, (s->n_tokens - 1) / e->cfg.block_tokens))) {
            e->st.deferred++;
            continue;
        }
        if (!s->sampler) {
            char err[128];
            s->sampler = sampler_new(&s->sp, e->model->hp.n_vocab, err, sizeof err);
            if (!s->sampler) { /* out of memory: leave it waiting, try again next step */
                break;
            }
            for (int i = 0; i < s->n_tokens; i++) sampler_accept(s->sampler, s->tokens[i]);
        }
        seq_reuse_prefix(e, s);
        int want = s->n_tokens - s->n_computed;
        if (want > budget) want = budget;
        int need_blocks = (s->n_computed + want + e->cfg.block_tokens - 1) / e->cfg.block_tokens -
                          s->n_blocks;
        /* Keep one block of headroom per running sequence so decodes rarely preempt. */
        if (need_blocks + e->n_running > kvpool_n_available(e->pool) &&
            !(e->n_running == 0 && need_blocks <= kvpool_n_available(e->pool))) {
            /* Give back the reused prefix: it stays cached by name. */
            seq_release_blocks(e, s);
            break;
        }
        if (seq_grow(e, s, s->n_computed + want) != 0) {
            seq_release_blocks(e, s);
            break;
        }
        queue_remove_at(e->waiting, &e->n_waiting, waiting_index(e, s));
        queue_insert(e->running, &e->n_running, s);
        if (s->n_preempted == 0) {
            s->n_cached = s->n_computed;
            e->st.cached_tokens += (uint64_t)s->n_computed;
            e->st.prompt_tokens += (uint64_t)s->n_prompt;
        }
        if (!s->t_first_scheduled) s->t_first_scheduled = sw_mono_ns();
        if (seq_kv_pending(e, s)) { /* admitted; joins a step once its tier-2 blocks are in */
            e->st.tier2_waits++;
            continue;
        }
        s->step_tokens = want;
        budget -= want;
        e->b_seqs[n++] = s;
    }
    return n;
}

static int is_stop_id(const seq_t *s, int32_t id)
{
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id) return 1;
    return 0;
}

/* Appends the next token of s: sampled from logits, or `picked` when logits is NULL (a
 * plain-greedy sequence's argmax from the backend, or the backend's sample with its logprobs
 * in d_chosen and d_top[SAMPLER_MAX_LOGPROBS] when s asked for them). Returns 1 when s
 * finished. */
static int seq_advance(engine_t *e, seq_t *s, float *logits, int32_t picked,
                       const sampler_logprob_t *d_chosen, const sampler_logprob_t *d_top,
                       int *finish_out)
{
    sampler_logprob_t top[SAMPLER_MAX_LOGPROBS], chosen;
    if (!logits && d_chosen && s->n_logprobs) {
        chosen = *d_chosen;
        memcpy(top, d_top, (size_t)s->n_logprobs * sizeof *top);
    }
    const int at_start = s->stream.at_start;
    int64_t tg0 = s->gstate ? sw_mono_ns() : 0;
    if (s->gstate && logits) {
        const int n_vocab = e->model->hp.n_vocab;
        int ok = grammar_state_mask(s->gstate, e->gvocab, at_start, e->gmask) == 0;
        if (ok && s->ignore_eos)
            for (int i = 0; i < n_vocab; i++)
                if (tokenizer_is_eog(e->tok, i)) e->gmask[i >> 5] &= ~(1u << (i & 31));
        if (!ok || sampler_mask_logits(logits, n_vocab, e->gmask) == 0) {
            /* out of memory, or no token of this vocabulary continues the grammar */
            *finish_out = grammar_state_can_end(s->gstate) ? ENGINE_FINISH_STOP
                                                           : ENGINE_FINISH_ABORT;
            return 1;
        }
        e->st.grammar_seconds += (double)(sw_mono_ns() - tg0) * 1e-9;
    }
    int32_t tok = logits ? sampler_sample(s->sampler, logits, s->n_logprobs ? top : NULL,
                                          s->n_logprobs ? &chosen : NULL)
                         : picked;
    /* the device counts saw only device picks: after a host pick they are stale */
    if (!d_chosen) seq_free_pen_slot(e, s);
    sampler_accept(s->sampler, tok);
    if (s->n_logprobs) {
        s->lp[s->n_generated].id = chosen.id;
        s->lp[s->n_generated].logprob = chosen.logprob;
        for (int i = 0; i < s->n_logprobs; i++) {
            s->top[(size_t)s->n_generated * s->n_logprobs + i].id = top[i].id;
            s->top[(size_t)s->n_generated * s->n_logprobs + i].logprob = top[i].logprob;
        }
    }
    if (s->n_generated == 0) s->t_first_token = sw_mono_ns();
    s->tokens[s->n_tokens++] = tok;
    s->n_generated++;
    e->st.generated_tokens++;

    int finish = -1;
    if (s->gstate && !(!s->ignore_eos && tokenizer_is_eog(e->tok, tok))) {
        size_t n;
        const char *p = grammar_vocab_piece(e->gvocab, tok, at_start, &n);
        int64_t tg1 = sw_mono_ns();
        if (grammar_state_advance(s->gstate, p, n) != 0) finish = ENGINE_FINISH_ABORT;
        e->st.grammar_seconds += (double)(sw_mono_ns() - tg1) * 1e-9;
    }
    if (finish >= 0) {
    } else if ((!s->ignore_eos && tokenizer_is_eog(e->tok, tok)) || is_stop_id(s, tok)) {
        finish = ENGINE_FINISH_STOP;
    } else {
        int n = tokenizer_stream_push(e->tok, &s->stream, tok, e->piece, sizeof e->piece);
        if (n > 0 && text_append(s, e->piece, (size_t)n) != 0) n = -1;
        if (s->stop && n > 0) {
            int stopped = 0;
            s->text_final = stop_matcher_push(s->stop, e->piece, (size_t)n, &stopped);
            if (stopped) {
                s->stopped_by_string = 1;
                finish = ENGINE_FINISH_STOP;
            }
        } else if (!s->stop) {
            s->text_final = s->text_len;
        }
    }
    if (finish < 0 && s->gstate && grammar_state_done(s->gstate)) finish = ENGINE_FINISH_STOP;
    if (finish < 0 && (s->n_generated >= s->max_tokens || s->n_tokens >= e->max_ctx))
        finish = ENGINE_FINISH_LENGTH;
    *finish_out = finish;
    return finish >= 0;
}

/* Whether the rows of this step (the b_seqs[0..n) whose chunk reaches their end) can be
 * sampled by the backend, and if so fills b_rows in logits order: draws each row's random
 * number and loads the penalty counts of a sequence that has no slot yet. 0 (sample on the
 * host) when the backend has no forward_sample, a row follows a grammar (its mask is the
 * host's), or a slot cannot be loaded; nothing is drawn then. */
static int plan_device_sampling(engine_t *e, int n)
{
    if (!e->be->ops->forward_sample) return 0;
    for (int i = 0; i < n; i++) {
        const seq_t *s = e->b_seqs[i];
        if (s->n_computed + s->step_tokens == s->n_tokens && s->gstate) return 0;
    }
    for (int i = 0; i < n; i++) {
        seq_t *s = e->b_seqs[i];
        if (s->n_computed + s->step_tokens != s->n_tokens || s->pen_slot >= 0) continue;
        const int32_t *counts = sampler_penalty_counts(s->sampler);
        if (!counts) continue;
        char err[256]; /* out of device memory: this step samples on the host, correctly */
        s->pen_slot = e->be->ops->sample_slot_load(e->be, counts, err, sizeof err);
        if (s->pen_slot < 0) return 0;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        seq_t *s = e->b_seqs[i];
        if (s->n_computed + s->step_tokens != s->n_tokens) continue;
        backend_sample_t *r = &e->b_rows[k++];
        r->p = &s->sp;
        r->rand = sampler_draw(s->sampler);
        r->pen_slot = s->pen_slot;
        r->pen_evict = s->pen_slot >= 0 ? sampler_evict_next(s->sampler) : -1;
    }
    return 1;
}

int engine_step(engine_t *e, char *errstr, size_t errlen)
{
    if (e->n_stores) tier_stores_reap(e, 0);
    int n = plan_step(e);
    if (n == 0) {
        for (int i = 0; i < e->n_running; i++) {
            if (e->running[i]->kv_wait_to <= e->running[i]->kv_wait_from) continue;
            /* every sequence that could run waits for tier-2 copies: nothing to do but wait */
            if (e->be->ops->synchronize(e->be) != 0) {
                sw_seterr(errstr, errlen, "engine: %s: waiting for KV block copies failed",
                          e->be->ops->name);
                return -1;
            }
            return 1;
        }
        if (e->n_waiting > 0 && e->n_running == 0) {
            /* Nothing can run: the head request cannot fit even alone. Fail it as length. */
            seq_t *s = e->waiting[0];
            queue_remove_at(e->waiting, &e->n_waiting, 0);
            seq_finish(e, s, ENGINE_FINISH_LENGTH);
            return 1;
        }
        if (e->n_stores) tier_stores_reap(e, 1); /* idle: finish the stores in flight */
        return 0;
    }
    int T = 0, n_logits = 0;
    for (int i = 0; i < n; i++) {
        seq_t *s = e->b_seqs[i];
        e->b_seq_start[i] = T;
        e->b_tables[i] = s->blocks;
        for (int j = 0; j < s->step_tokens; j++) {
            e->b_tokens[T] = s->tokens[s->n_computed + j];
            e->b_pos[T] = s->n_computed + j;
            T++;
        }
        if (s->n_computed + s->step_tokens == s->n_tokens) e->b_logits_idx[n_logits++] = T - 1;
    }
    e->b_seq_start[n] = T;
    backend_batch_t batch = {
        .n_tokens = T,
        .tokens = e->b_tokens,
        .pos = e->b_pos,
        .n_seqs = n,
        .seq_start = e->b_seq_start,
        .block_tables = e->b_tables,
        .n_logits = n_logits,
        .logits_idx = e->b_logits_idx,
    };
    /* ids instead of logits when every sequence that samples this step is plainly greedy */
    int by_id = n_logits > 0 && e->be->ops->forward_argmax != NULL;
    for (int i = 0; i < n && by_id; i++) {
        const seq_t *s = e->b_seqs[i];
        if (s->n_computed + s->step_tokens == s->n_tokens && !s->plain_greedy) by_id = 0;
    }
    const int by_sample = !by_id && n_logits > 0 && plan_device_sampling(e, n);
    int64_t t0 = sw_mono_ns();
    int frc;
    if (by_id)
        frc = e->be->ops->forward_argmax(e->be, &batch, e->b_ids, errstr, errlen);
    else if (by_sample)
        frc = e->be->ops->forward_sample(e->be, &batch, e->b_rows, e->b_ids, e->b_chosen,
                                         e->b_top, errstr, errlen);
    else
        frc = e->be->ops->forward(e->be, &batch, e->logits, errstr, errlen);
    if (frc) return -1;
    int64_t dt = sw_mono_ns() - t0;
    e->st.forward_seconds += (double)dt * 1e-9;
    e->st.steps++;
    if (by_id) e->st.argmax_steps++;
    if (by_sample) e->st.sample_steps++;
    for (int i = 0; i < n; i++)
        e->b_seqs[i]->compute_ns += dt * e->b_seqs[i]->step_tokens / T;

    const int n_vocab = e->model->hp.n_vocab;
    int li = 0;
    for (int i = 0; i < n; i++) {
        seq_t *s = e->b_seqs[i];
        s->n_computed += s->step_tokens;
        seq_publish(e, s);
        seq_drop_old_blocks(e, s);
        if (s->n_computed != s->n_tokens) continue;
        int finish;
        const int k = li++;
        const int host = !by_id && !by_sample;
        if (!seq_advance(e, s, host ? e->logits + (size_t)k * n_vocab : NULL,
                         host ? -1 : e->b_ids[k], by_sample ? &e->b_chosen[k] : NULL,
                         by_sample ? &e->b_top[(size_t)k * SAMPLER_MAX_LOGPROBS] : NULL,
                         &finish)) {
            if (s->progress) {
                engine_progress_t p = {.id = s->id, .user = s->user,
                                       .text = s->text ? s->text : "",
                                       .text_len = s->text_final, .n_tokens = s->n_generated};
                s->progress(s->cb_arg, &p);
            }
        } else {
            for (int r = 0; r < e->n_running; r++)
                if (e->running[r] == s) {
                    queue_remove_at(e->running, &e->n_running, r);
                    break;
                }
            seq_finish(e, s, finish);
        }
    }
    return 1;
}

int engine_run(engine_t *e, char *errstr, size_t errlen)
{
    for (;;) {
        int r = engine_step(e, errstr, errlen);
        if (r < 0) return -1;
        if (r == 0) return 0;
    }
}

/* ---- info ---- */

int engine_tokenize(const engine_t *e, const char *text, size_t len, int add_special,
                    int parse_special, int32_t *out, int cap)
{
    return tokenizer_encode(e->tok, text, len, add_special, parse_special, out, cap);
}

const struct tokenizer *engine_tokenizer(const engine_t *e)
{
    return e->tok;
}

int engine_token_to_piece(const engine_t *e, int32_t id, char *buf, size_t cap)
{
    return tokenizer_token_to_piece(e->tok, id, 0, buf, cap);
}

int engine_set_kv_tier(engine_t *e, const engine_kv_tier_t *tier, char *errstr, size_t errlen)
{
    tier_stores_reap(e, 1); /* the stores in flight belong to the tier attached now */
    if (!tier) {
        memset(&e->tier, 0, sizeof e->tier);
        return 0;
    }
    if (!tier->lookup || !tier->fetch || !tier->store_begin || !tier->store_commit) {
        sw_seterr(errstr, errlen, "engine: tier 2 needs all four callbacks");
        return -1;
    }
    if (!e->be->ops->kv_block_read || !e->be->ops->kv_block_write) {
        sw_seterr(errstr, errlen, "engine: backend %s cannot copy KV blocks", e->be->ops->name);
        return -1;
    }
    if (!e->tok_stage &&
        !(e->tok_stage = malloc((size_t)e->cfg.block_tokens * sizeof *e->tok_stage))) {
        sw_seterr(errstr, errlen, "engine: out of memory");
        return -1;
    }
    if (!e->kv_stage && !(e->kv_stage = malloc(e->be->kv_block_bytes))) {
        sw_seterr(errstr, errlen, "engine: out of memory");
        return -1;
    }
    e->tier = *tier;
    return 0;
}

void engine_info(const engine_t *e, engine_info_t *info)
{
    const hparams_t *hp = &e->model->hp;
    memset(info, 0, sizeof *info);
    info->arch = hp->arch_name;
    info->backend = e->be->ops->name;
    info->kernels = kern_get(NULL)->name;
    info->n_vocab = hp->n_vocab;
    info->dim = hp->dim;
    info->n_layers = hp->n_layers;
    info->n_heads = hp->n_heads;
    info->n_kv_heads = hp->n_kv_heads;
    info->head_dim = hp->head_dim;
    info->ffn_dim = hp->ffn_dim;
    info->ctx_len = e->max_ctx;
    info->threads = e->cfg.threads;
    info->block_tokens = e->cfg.block_tokens;
    info->kv_blocks = e->be->params.n_kv_blocks;
    info->max_batch_tokens = e->cfg.max_batch_tokens;
    info->max_seqs = e->cfg.max_seqs;
    info->kv_block_bytes = e->be->kv_block_bytes;
    info->weight_bytes = e->model->weight_bytes;
    info->host_packed_bytes = e->be->host_packed_bytes;
    info->dev_bytes_planned = e->be->dev_bytes_planned;
    info->dev_bytes_measured = e->be->dev_bytes_measured;
    info->dev_allocations = e->be->dev_allocations;
    info->fingerprint = e->model->fingerprint;
    info->kv_seed = e->kv_seed;
    info->bos = tokenizer_bos(e->tok);
    info->eos = tokenizer_eos(e->tok);
}

void engine_stats(const engine_t *e, engine_stats_t *st)
{
    *st = e->st;
    const kvpool_stats_t *ps = kvpool_stats(e->pool);
    st->prefix_lookups = ps->lookups;
    st->prefix_hits = ps->hits;
    st->evictions = ps->evictions;
    st->kv_mismatches += ps->mismatches;
    st->kv_blocks_used = kvpool_n_used(e->pool);
    st->kv_blocks_total = kvpool_n_blocks(e->pool);
}

/* ---- raw access ---- */

int engine_raw_alloc_blocks(engine_t *e, int n, int32_t *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = kvpool_alloc(e->pool);
        if (out[i] < 0) {
            engine_raw_free_blocks(e, i, out);
            return -1;
        }
    }
    return 0;
}

void engine_raw_free_blocks(engine_t *e, int n, const int32_t *blocks)
{
    for (int i = 0; i < n; i++) kvpool_unref(e->pool, blocks[i]);
}

int engine_raw_forward(engine_t *e, int n_seqs, const int32_t *const *tokens, const int *n,
                       const int *start, const int32_t *const *tables, float *logits,
                       char *errstr, size_t errlen)
{
    int T = 0;
    for (int s = 0; s < n_seqs; s++) T += n[s];
    if (n_seqs < 1 || T > e->cfg.max_batch_tokens) {
        sw_seterr(errstr, errlen, "raw forward: %d tokens in %d sequences (limit %d tokens)", T,
                  n_seqs, e->cfg.max_batch_tokens);
        return -1;
    }
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        e->b_seq_start[s] = t;
        e->b_tables[s] = tables[s];
        for (int j = 0; j < n[s]; j++) {
            e->b_tokens[t] = tokens[s][j];
            e->b_pos[t] = start[s] + j;
            e->b_logits_idx[t] = t;
            t++;
        }
    }
    e->b_seq_start[n_seqs] = t;
    backend_batch_t batch = {
        .n_tokens = T, .tokens = e->b_tokens, .pos = e->b_pos, .n_seqs = n_seqs,
        .seq_start = e->b_seq_start, .block_tables = e->b_tables, .n_logits = T,
        .logits_idx = e->b_logits_idx,
    };
    return e->be->ops->forward(e->be, &batch, logits, errstr, errlen);
}

/* ---- internal accessors (engine_internal.h) ---- */

const gguf_t *engine_gguf(const engine_t *e)
{
    return e->model->gguf;
}
