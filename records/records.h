/* records/records.h: the records module: the owner of spillway's five wire formats.
 *
 *   request     schemas/request.schema.json  request_parse, request_apply_header (request.h)
 *               and records_admit: the one admission step of a parsed request
 *   result      schemas/result.schema.json   records_result (records_logprobs, records_choice)
 *   dead letter schemas/dlq.schema.json      records_dlq_headers (the record's value is the
 *                                            original message value; the record is its headers)
 *   stream      schemas/chunk.schema.json    records_chunk
 *   usage       schemas/usage.schema.json    records_usage
 *
 * Every encoder takes plain values (what the worker knows about a request and its outcome) and
 * returns the record's text, compact JSON with every real in its shortest round-trip form
 * (consumer/json_text.h); the request's "metadata" is spliced in as the text the request held
 * (request_t.metadata_json: numbers and escapes exactly as sent). Nothing else builds these
 * records. tests/records/<case>/ holds one folder per encoder case, tests/requests/<case>/ one
 * per request case, both checked against schemas/.
 *
 * Threads: every function is pure (no shared state) and may be called from any thread.
 * Ownership: returned text is malloc'd (caller frees); json_t values follow jansson's rules and
 * each function says which it steals. */
#ifndef SPILLWAY_RECORDS_H
#define SPILLWAY_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "engine/engine.h"
#include "records/request.h"

/* ---- admission ---- */

/* A model the worker serves now, looked up by name: an opaque handle the caller owns from here
 * (e.g. a reference taken), or NULL when it serves none of that name. */
typedef void *(*rec_model_fn)(void *arg, const char *name);
/* The value of the Kafka record header `name` (borrowed), or 0 when the record has none. */
typedef int (*rec_header_fn)(void *arg, const char *name, const void **value, size_t *len);

/* What the worker admits: its limits, reply allow-list, classes and models. Borrowed. */
typedef struct {
    const request_limits_t *limits;  /* for header values (request_apply_header) */
    const char *const *reply_topics; /* [n_reply_topics] reply.topics: reply_to must be one */
    int n_reply_topics;
    const char *const *classes;      /* [n_classes] class names: "class" must be one */
    int n_classes;
    const char *default_model;       /* the model of a request without "model" */
    rec_model_fn model;              /* finds a served model by name */
    void *model_arg;
} rec_rules_t;

/* The admission step of a parsed request r (request_parse): the request fields that came as
 * Kafka headers (header may be NULL: none), then reply_to against the allow-list, "class"
 * against the classes (*class_ix: its index, -1 when r names none) and "model" against the
 * served models (*model: the handle rules->model returned, owned by the caller; NULL unless
 * REC_OK). Returns REC_OK, REC_NO_MEMORY (not the message's fault), or the dead-letter code
 * with a message in err naming the field. r gets the header values (it stays the caller's). */
rec_err_t records_admit(request_t *r, const rec_rules_t *rules, rec_header_fn header,
                        void *header_arg, int *class_ix, void **model, char *err, size_t errlen);

/* The limits on a prompt once it is rendered and tokenised: rendered_bytes (0: not a chat
 * prompt) against max_prompt_bytes, n_tokens against max_prompt_tokens (<= 0: no limit).
 * REC_OK, REC_PROMPT_BYTES or REC_PROMPT_TOKENS with err. */
rec_err_t records_admit_prompt(size_t rendered_bytes, size_t max_prompt_bytes, int n_tokens,
                               int max_prompt_tokens, char *err, size_t errlen);

/* ---- result ---- */

/* The text of token id (its piece), into buf[cap]; returns its length (may exceed cap: cut),
 * or < 0 for none. engine_token_to_piece has this shape. */
typedef int (*rec_piece_fn)(void *arg, int32_t id, char *buf, size_t cap);

/* The result's "logprobs" array: per token i of n_tokens, {"id", "text", "logprob",
 * "top_logprobs": the first max_top (< 0: all) of top[i * n_top .. + n_top) with an id >= 0}.
 * Texts are the pieces with invalid UTF-8 replaced by U+FFFD; a logprob of -inf is -9999 (as
 * OpenAI's API writes it). A new reference, or NULL on out of memory. */
json_t *records_logprobs(const engine_logprob_t *chosen, const engine_logprob_t *top,
                         int n_tokens, int n_top, int max_top, rec_piece_fn piece,
                         void *piece_arg);

/* One entry of the result's "choices": {"index", "text", "finish_reason"[, "logprobs"]}.
 * Steals logprobs (may be NULL). A new reference, or NULL on out of memory. */
json_t *records_choice(int index, const char *text, size_t len, const char *finish,
                       json_t *logprobs);

/* Where a record's request came from (the "input" member; the DLQ's source headers). */
typedef struct {
    const char *topic;
    int32_t partition;
    int64_t offset;
} rec_source_t;

typedef struct {
    const char *id;              /* the request's id */
    const char *correlation_id;  /* NULL: absent */
    const char *tenant;          /* NULL: absent */
    /* choices (n > 1, borrowed): an array of records_choice entries; text and finish_reason at
     * the top are then choice 0's. NULL: text / finish below, logprobs (borrowed, NULL: absent) */
    const json_t *choices;
    const char *text;
    size_t text_len;
    const char *finish;
    const json_t *logprobs;
    int64_t prompt_tokens, cached_tokens, completion_tokens;
    double compute_ms;
    double queue_ms, ttft_ms, decode_ms, total_ms, wait_ms;
    const char *class_name;      /* NULL: absent */
    int capped_from;             /* > 0: "degraded" {cap, max_tokens, requested_max_tokens} */
    int max_tokens;              /* the cap, with capped_from */
    const char *model;
    const char *model_fingerprint; /* NULL: absent */
    const char *worker;
    rec_source_t input;
    const char *metadata;        /* the request's metadata text (spliced as is); NULL: absent */
} rec_result_t;

/* The result record (schemas/result.schema.json). NULL on out of memory. */
char *records_result(const rec_result_t *in);

/* ---- stream chunk ---- */

typedef struct {
    const char *id;
    const char *correlation_id;  /* NULL: absent */
    int seq;                     /* 0, 1, ... per request */
    const char *text;            /* the delta: text[0..text_len) follows the previous chunks */
    size_t text_len;
    int n_tokens;                /* tokens generated so far */
    const char *finish;          /* NULL, or the finish reason of the last chunk (final) */
    rec_source_t input;
} rec_chunk_t;

/* One stream chunk (schemas/chunk.schema.json). NULL on out of memory. */
char *records_chunk(const rec_chunk_t *in);

/* ---- usage record ---- */

typedef struct {
    const char *worker, *tenant, *class_name;
    int64_t start_ms, end_ms;    /* wall clock, Unix epoch ms: [start_ms, end_ms) */
    uint64_t requests, prompt_tokens, cached_tokens, completion_tokens;
    double compute_ms;
} rec_usage_t;

/* One usage record (schemas/usage.schema.json). NULL on out of memory. */
char *records_usage(const rec_usage_t *in);

/* ---- dead letter ---- */

/* Its headers (Kafka Connect style); values are UTF-8 text. */
#define REC_H_CODE       "__spillway.errors.code"      /* a REQ_ERR_* code */
#define REC_H_MESSAGE    "__spillway.errors.message"   /* human-readable reason */
#define REC_H_TOPIC      "__spillway.errors.topic"     /* source topic */
#define REC_H_PARTITION  "__spillway.errors.partition" /* source partition, decimal */
#define REC_H_OFFSET     "__spillway.errors.offset"    /* source offset, decimal */
#define REC_H_WORKER     "__spillway.errors.worker"    /* worker.id */
#define REC_H_TIMESTAMP  "__spillway.errors.timestamp" /* when rejected, Unix epoch ms */
/* only on a dead letter whose value was cut because the record was refused for its size: */
#define REC_H_TRUNCATED  "__spillway.errors.truncated"      /* "true" */
#define REC_H_ORIG_BYTES "__spillway.errors.original_bytes" /* original length, decimal */

typedef struct {
    const char *code;            /* a REQ_ERR_* string (rec_err_reason) */
    const char *message;
    rec_source_t input;
    const char *worker;
    int64_t timestamp_ms;        /* when the worker dead-lettered it, Unix epoch ms */
    int truncated;               /* 1: the value is cut; original_bytes: its whole length */
    size_t original_bytes;
} rec_dlq_t;

/* The dead letter's headers (schemas/dlq.schema.json), in that order. NULL on out of memory.
 * Caller owns (producer_send takes them). */
rd_kafka_headers_t *records_dlq_headers(const rec_dlq_t *in);

#endif
