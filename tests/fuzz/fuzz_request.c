/* tests/fuzz/fuzz_request.c: libFuzzer target for request_parse (records/request.c) with the
 * default limits. Every outcome must be well-formed: a failure has a code and a message and
 * leaves the request empty; a success satisfies the limits and the header's promises (exactly
 * one prompt form, NUL-terminated strings of the stated lengths, metadata_json that jansson
 * parses back). Anything else aborts, so the fuzzer reports it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "records/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int cond)
{
    if (!cond) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    request_limits_t lim;
    request_limits_default(&lim);
    request_t r;
    const char *code = NULL;
    char err[256];
    int rc = request_parse((const char *)data, size, INT64_C(1790000000000), &lim, &r, &code, err,
                           sizeof err);
    if (rc != 0) {
        static const request_t zero;
        require(rc < 0 && code && code[0] && err[0]);
        require(!strcmp(rec_err_reason((rec_err_t)-rc), code)); /* the same reason, as a code */
        require(memcmp(&r, &zero, sizeof r) == 0);
        return 0;
    }
    require(code == NULL);
    require(r.id && r.id[0] && strlen(r.id) <= lim.max_id_bytes);
    require(!!r.prompt + !!r.messages + !!r.input_ids == 1);
    if (r.prompt)
        require(r.prompt_len > 0 && r.prompt_len <= lim.max_prompt_bytes &&
                strlen(r.prompt) == r.prompt_len);
    if (r.messages) {
        require(r.n_messages > 0 && r.n_messages <= lim.max_messages);
        for (int i = 0; i < r.n_messages; i++)
            require(r.messages[i].role && r.messages[i].role[0] && r.messages[i].content);
    }
    if (r.input_ids) {
        require(r.n_input_ids > 0 && r.n_input_ids <= lim.max_input_ids);
        for (int i = 0; i < r.n_input_ids; i++) require(r.input_ids[i] >= 0);
    }
    require(r.max_tokens >= 1 && r.max_tokens <= lim.max_tokens_limit);
    require(r.sampling.temperature >= 0 && r.sampling.temperature <= 100);
    require(r.sampling.top_p > 0 && r.sampling.top_p <= 1 && r.sampling.min_p >= 0 && r.sampling.min_p <= 1);
    require(r.sampling.top_k >= 0 && r.sampling.top_k <= 1000000);
    require(r.sampling.repeat_penalty > 0 && r.sampling.repeat_penalty <= 100);
    require(r.sampling.n_logprobs >= 0 && r.sampling.n_logprobs <= 20);
    require(r.priority >= -1000 && r.priority <= 1000);
    require(r.deadline_ms >= 0);
    require(r.n_stop >= 0 && r.n_stop <= lim.max_stop);
    for (int i = 0; i < r.n_stop; i++) {
        size_t n = strlen(r.stop[i]);
        require(n >= 1 && n <= lim.max_stop_bytes);
    }
    if (r.metadata_json) {
        require(strlen(r.metadata_json) <= lim.max_metadata_bytes);
        json_t *m = json_loads(r.metadata_json, JSON_DECODE_ANY, NULL);
        require(m != NULL);
        json_decref(m);
    }
    if (r.template_name) require(r.template_name[0] != 0);
    request_free(&r);
    return 0;
}
