/* consumer/openai_batch.h: OpenAI Batch API lines ({"custom_id", "method", "url", "body"}) to
 * spillway requests (schemas/request.schema.json), and spillway results back to Batch output
 * lines. Used by `spillway produce` (conversion only) and `spillway batch` (both ways). Pure
 * functions of their arguments; thread-safe.
 *
 * The body mapping (url /v1/chat/completions or /v1/completions, method POST):
 *   messages (chat; content a string or an array of {"type":"text","text"} parts, joined; role
 *   "developer" becomes "system") / prompt (completions; a string, an array of one string, or an
 *   array of token ids -> input_ids); max_completion_tokens (wins) or max_tokens -> max_tokens;
 *   temperature, top_p, seed, stop, presence_penalty, frequency_penalty, metadata, n and
 *   response_format passed through unchanged (the worker checks their values), and so are
 *   spillway's own fields as extensions (ttl_ms, deadline, priority, top_k, min_p,
 *   repeat_penalty, chat_template, enable_thinking, tenant, class; prefix_key, the routing key,
 *   must be a string of 1..256 bytes, else the line is refused); chat logprobs
 *   true + top_logprobs K -> logprobs max(K, 1) (the output keeps K alternatives); completions
 *   logprobs K -> logprobs K; user, model, store, service_tier, stream_options and unknown
 *   fields are ignored as OpenAI ignores what it does not know.
 *   Refused (an error line, never dropped): another url or method, a field that changes what
 *   OpenAI would return and spillway cannot do (tools, tool_choice, functions, function_call,
 *   non-empty logit_bias, audio, modalities other than text, prediction, web_search_options,
 *   reasoning_effort, stream true, echo true, suffix, best_of > 1, n > 1 with the completions
 *   url's best_of), content parts that are not text, several prompts in one request. */
#ifndef SPILLWAY_CONSUMER_OPENAI_BATCH_H
#define SPILLWAY_CONSUMER_OPENAI_BATCH_H

#include <jansson.h>
#include <stddef.h>

enum { OAI_CHAT = 1, OAI_COMPLETION = 2 };

typedef struct {
    char *custom_id;   /* owned; NULL when the line has no string custom_id */
    int kind;          /* OAI_CHAT / OAI_COMPLETION; 0 when the url is not one of them */
    int chat_top;      /* chat logprobs asked: top_logprobs K (0..20); -1 = no logprobs */
    int completion_lp; /* completions logprobs K; -1 = none */
    char *request;     /* the spillway request text (compact JSON, "id" first; owned), or NULL
                          when the line is refused */
    const char *err_code;  /* refused: a short code (static), e.g. "unsupported_parameter" */
    char err_param[64];    /* refused: the offending field ("" when none) */
    char err_msg[512];     /* refused: what is wrong and what is accepted */
} oai_line_t;

/* Converts one Batch line (text[0..len)) to a spillway request with id `id` (NULL: the
 * custom_id). 0: out->request set. -1: refused (out->err_* set; out->custom_id set when the
 * line has one, so the caller can write an error line for it). -2: out of memory. The caller
 * frees out with oai_line_free either way. */
int oai_line_convert(const char *text, size_t len, const char *id, oai_line_t *out);
void oai_line_free(oai_line_t *l);

/* The Batch output line (new reference) for spillway result `res` of a line converted as `l`:
 * {"id": line_id, "custom_id", "response": {"status_code": 200, "request_id", "body":
 * chat.completion or text_completion with usage}, "error": null}. created: Unix seconds. NULL
 * on out of memory. A result whose finish_reason is "expired" or "overloaded" is not a
 * completion: use oai_error_line for it. */
json_t *oai_output_line(const oai_line_t *l, const char *line_id, const json_t *res,
                        long long created);

/* An error-file line (new reference). status 0: {"response": null, "error": {"code",
 * "message"}} (e.g. batch_expired); else {"response": {"status_code": status, "request_id",
 * "body": {"error": {"message", "type", "param", "code"}}}, "error": null} as OpenAI writes
 * requests it refused. param may be NULL or "". */
json_t *oai_error_line(const char *line_id, const char *custom_id, int status, const char *type,
                       const char *code, const char *param, const char *message);

#endif
