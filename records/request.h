/* records/request.h: a prompt request message, parsed and validated. Part of the records module
 * (its public header records/records.h includes this file).
 *
 * request_parse() turns the bytes of one Kafka message value into a request_t, or into a
 * dead-letter reason: a short stable code (REQ_ERR_*, used as the DLQ header value and metric
 * label) plus a human-readable message. It never aborts on bad input and never reads past len.
 * Unknown fields are ignored. Thread-safe (no shared state). */
#ifndef SPILLWAY_RECORDS_REQUEST_H
#define SPILLWAY_RECORDS_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"

/* Dead-letter reason codes (stable strings). */
#define REQ_ERR_NOT_JSON        "not_json"         /* not parseable JSON (a raw NUL byte
                                                      included), or not an object */
#define REQ_ERR_INVALID_UTF8    "invalid_utf8"     /* bytes are not valid UTF-8, or a known
                                                      field has a \u escape of a lone surrogate */
#define REQ_ERR_WRONG_TYPE      "wrong_type"       /* a known field has the wrong JSON type */
#define REQ_ERR_MISSING_PROMPT  "missing_prompt"   /* none of prompt / messages / input_ids */
#define REQ_ERR_AMBIGUOUS       "ambiguous_prompt" /* more than one of them */
#define REQ_ERR_EMPTY_PROMPT    "empty_prompt"
#define REQ_ERR_PROMPT_BYTES    "prompt_too_large" /* over limits.max_prompt_bytes (or
                                                      limits.max_messages) */
#define REQ_ERR_PROMPT_TOKENS   "prompt_too_many_tokens" /* input_ids over limits.max_input_ids;
                                                      also set by the worker after tokenising */
#define REQ_ERR_BAD_PARAM       "bad_parameter"    /* out-of-range sampling parameter / max_tokens
                                                      / seed / deadline / ttl_ms / stop length /
                                                      input id; unrepresentable number or \u0000
                                                      in a known field */
#define REQ_ERR_TOO_MANY_STOP   "too_many_stop"
#define REQ_ERR_METADATA        "metadata_too_large"
#define REQ_ERR_BAD_ID          "bad_id"           /* id missing/empty/too long/not a string */
#define REQ_ERR_TEMPLATE        "unknown_template" /* chat_template empty or over 64 bytes; set by
                                                      the worker when chat rendering fails */
#define REQ_ERR_BAD_ROLE        "unknown_role"     /* a message role the chat template does not
                                                      have; set by the worker */
#define REQ_ERR_RESULT_TOO_LARGE "result_too_large" /* set by the producer */
#define REQ_ERR_DELIVERY_FAILED "delivery_failed"  /* the output was refused with a permanent
                                                      error (output.max_retries); set by the
                                                      worker */
#define REQ_ERR_MESSAGE_BYTES   "message_too_large" /* value over limits.max_message_bytes */
#define REQ_ERR_UNKNOWN_CLASS   "unknown_class"    /* "class" names no configured class; set by
                                                      the worker */
#define REQ_ERR_UNKNOWN_MODEL   "unknown_model"    /* "model" names no model the worker serves;
                                                      set by the worker */
#define REQ_ERR_REPLY_NOT_ALLOWED "reply_not_allowed" /* reply_to names a topic outside the
                                                      worker's reply.topics; set by the worker */
#define REQ_ERR_TENANT_NOT_ALLOWED "tenant_not_allowed" /* "tenant" is not one the input topic
                                                      may claim (worker key claims) */
#define REQ_ERR_CLASS_NOT_ALLOWED "class_not_allowed" /* "class" is not one the input topic may
                                                      claim (worker key claims) */
#define REQ_ERR_BAD_GRAMMAR     "bad_grammar"      /* grammar is not a valid EBNF grammar, or
                                                      response_format's JSON Schema uses an
                                                      unsupported keyword or is malformed, or
                                                      both grammar and response_format json are
                                                      set (the message says why) */
/* Not a dead-letter reason: an allocation failed while parsing. The message itself may be fine;
 * the caller should retry or stop, not dead-letter it. */
#define REQ_ERR_NO_MEMORY       "out_of_memory"

/* The same reasons as codes: request_parse and request_apply_header return one negated, the
 * admission step (records.h) returns one; rec_err_reason maps a code to its string (a switch). */
typedef enum {
    REC_OK = 0,
    REC_NOT_JSON,
    REC_INVALID_UTF8,
    REC_WRONG_TYPE,
    REC_MISSING_PROMPT,
    REC_AMBIGUOUS,
    REC_EMPTY_PROMPT,
    REC_PROMPT_BYTES,
    REC_PROMPT_TOKENS,
    REC_BAD_PARAM,
    REC_TOO_MANY_STOP,
    REC_METADATA,
    REC_BAD_ID,
    REC_TEMPLATE,
    REC_BAD_ROLE,
    REC_RESULT_TOO_LARGE,
    REC_DELIVERY_FAILED,
    REC_MESSAGE_BYTES,
    REC_UNKNOWN_CLASS,
    REC_UNKNOWN_MODEL,
    REC_REPLY_NOT_ALLOWED,
    REC_TENANT_NOT_ALLOWED,
    REC_CLASS_NOT_ALLOWED,
    REC_BAD_GRAMMAR,
    REC_NO_MEMORY, /* not a dead letter: the caller retries or stops */
} rec_err_t;

/* The REQ_ERR_* string of code (static); "unknown" for a value outside the enum. */
const char *rec_err_reason(rec_err_t code);

/* Every input limit is a config key (worker config); defaults in request_limits_default(). */
typedef struct {
    size_t max_message_bytes;   /* whole message value (1 MiB) */
    size_t max_prompt_bytes;    /* prompt text / rendered messages (256 KiB) */
    int max_input_ids;          /* input_ids entries (32768) */
    int max_messages;           /* chat messages (256) */
    int max_tokens_limit;       /* largest max_tokens accepted (4096) */
    int default_max_tokens;     /* when the request has none (256) */
    int max_stop;               /* stop strings (16) */
    int max_n;                  /* choices per request, "n" (16) */
    size_t max_stop_bytes;      /* bytes per stop string (256) */
    size_t max_metadata_bytes;  /* serialized metadata (16 KiB) */
    size_t max_id_bytes;        /* id length (256) */
} request_limits_t;

void request_limits_default(request_limits_t *l);
/* 1 when s[0..n) is a legal Kafka topic name (1..249 of [a-zA-Z0-9._-], not "." or ".."). */
int request_is_topic_name(const char *s, size_t n);
/* 1 when s[0..n) may name a tenant or class: 1..64 of [a-zA-Z0-9._:@/-], not starting with '_'
 * (the worker's own labels, _none and _other, start with it). */
int request_is_label_name(const char *s, size_t n);

typedef struct {
    char *role;                 /* "system", "user", "assistant", ... (owned) */
    char *content;              /* owned, NUL-terminated, valid UTF-8 */
} request_message_t;

typedef struct {
    char *id;                   /* owned */
    /* Exactly one prompt form is set: */
    char *prompt;               /* text (owned, NUL-terminated, valid UTF-8) or NULL */
    size_t prompt_len;
    request_message_t *messages;/* chat messages (owned) or NULL */
    int n_messages;
    int32_t *input_ids;         /* token ids (owned) or NULL; range checked by the engine */
    int n_input_ids;
    /* Sampling: the engine's own struct, handed to engine_submit (and so to the sampler) as
     * it is; defaults from sampler_params_default. sampling.n_logprobs: the alternatives
     * computed per token; > 0: logprobs in the result ("logprobs": true sets
     * max(top_logprobs, 1)). repeat_last_n is not a request field (its default stays). */
    sampler_params_t sampling;
    int has_seed;               /* 1 when the request set "seed" */
    int max_tokens;             /* default from limits */
    int top_logprobs;           /* "logprobs": true: the alternatives reported per token (0..20;
                                   the result's top_logprobs are cut to it); -1 otherwise */
    int n;                      /* choices: n sequences sharing the prompt, choice i sampled
                                   with seed + i; default 1 */
    char **stop;                /* [n_stop] owned strings */
    int n_stop;
    int priority;               /* higher first; default 0 */
    int64_t deadline_ms;        /* absolute, Unix epoch ms; 0 = none. "ttl_ms" becomes
                                   msg_timestamp_ms + ttl_ms */
    char *metadata_json;        /* compact JSON text of "metadata", echoed; NULL when absent */
    char *template_name;        /* optional "chat_template" override by name; NULL = model's */
    int enable_thinking;        /* "enable_thinking": 0 = a qwen3 template's thinking off;
                                   default 1 (other templates ignore it) */
    /* Request-reply: from the JSON field, else from the Kafka header of the same name
     * (request_apply_header). NULL when absent. */
    char *reply_to;             /* topic for the result instead of the output topic (a legal
                                   topic name; the worker checks it against reply.topics) */
    char *correlation_id;       /* 1..max_id_bytes bytes, echoed in the result and its
                                   headers; the key of a reply */
    int stream;                 /* "stream": 1 = publish partial results (best effort) */
    /* Accounting (JSON field, else header of the same name): 1..64 of [a-zA-Z0-9._:@/-], not
     * starting with '_'. NULL when absent (the worker counts it as tenant _none, class
     * default). */
    char *tenant;
    char *class_name;           /* "class" */
    char *model;                /* "model": a model name of the worker (same charset as class;
                                   JSON field, else header); NULL = the worker's model.default */
    /* Structured output: "grammar" (EBNF text) or "response_format" (json_object /
     * json_schema), compiled at parse time; NULL = unconstrained. One reference, owned
     * (request_free releases it); grammar_kind is a JSON_SCHEMA_* value of
     * consumer/json_schema.h. */
    struct grammar *grammar;
    int grammar_kind;
} request_t;

/* Parses value[0..len) of a message whose Kafka timestamp is msg_timestamp_ms (used for
 * ttl_ms; pass 0 if unknown: ttl_ms then counts from the current wall-clock time). On success
 * returns 0 and fills *out (caller frees with request_free). On failure returns -1, sets *code
 * to a REQ_ERR_* string (static) and writes a message into errstr that names the offending
 * field and what it accepts; *out is left empty (zeroed). The failure's return value is
 * -(its rec_err_t code) (so -1 is REC_NOT_JSON). limits may be NULL (defaults).
 * The field-by-field rules are documented in schemas/request.schema.json. */
int request_parse(const char *value, size_t len, int64_t msg_timestamp_ms,
                  const request_limits_t *limits, request_t *out, const char **code,
                  char *errstr, size_t errlen);

void request_free(request_t *r);

/* Fields a Kafka record header may carry instead of the JSON (header name = field name). */
#define REQUEST_HEADER_FIELDS {"reply_to", "correlation_id", "tenant", "class", "model"}
#define REQUEST_N_HEADER_FIELDS 5

/* Sets field `name` of a parsed request from the value of the Kafka header of that name, with
 * the same checks as the JSON field, unless the JSON already set it (the JSON field wins). A
 * name that is not one of REQUEST_HEADER_FIELDS is ignored. 0, or -(rec_err_t code) with *code
 * and errstr as request_parse (r then stays valid and owned by the caller). */
int request_apply_header(request_t *r, const char *name, const void *value, size_t len,
                         const request_limits_t *limits, const char **code, char *errstr,
                         size_t errlen);

#endif
