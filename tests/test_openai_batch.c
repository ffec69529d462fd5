/* tests/test_openai_batch.c: consumer/openai_batch: Batch lines -> spillway requests (exact
 * request text; every converted request also passes request_parse), the refused kinds (code and
 * param), and results -> output / error lines in OpenAI's shapes. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumer/openai_batch.h"
#include "records/request.h"
#include "tests/check.h"

#define CHAT "\"method\":\"POST\",\"url\":\"/v1/chat/completions\""
#define COMPL "\"method\":\"POST\",\"url\":\"/v1/completions\""

/* line converts to exactly `want` (id "x:1"), which request_parse accepts */
static void converts(const char *line, const char *want)
{
    oai_line_t l;
    int rc = oai_line_convert(line, strlen(line), "x:1", &l);
    CHECKF(rc == 0, "%s: refused: %s", line, l.err_msg);
    CHECKF(rc != 0 || !strcmp(l.request, want), "%s\n  -> %s\n  want %s", line, l.request, want);
    if (rc == 0) {
        request_t r;
        const char *code;
        char err[256];
        CHECKF(request_parse(l.request, strlen(l.request), 0, NULL, &r, &code, err, sizeof err) == 0,
               "%s: request_parse: %s", l.request, err);
        request_free(&r);
    }
    oai_line_free(&l);
}

/* line is refused with code and param; custom_id kept when has_cid */
static void refused(const char *line, const char *code, const char *param, int has_cid)
{
    oai_line_t l;
    int rc = oai_line_convert(line, strlen(line), NULL, &l);
    CHECKF(rc == -1, "%s: not refused (%s)", line, l.request ? l.request : "");
    CHECKF(rc != -1 || !strcmp(l.err_code, code), "%s: code %s, want %s", line, l.err_code, code);
    CHECKF(rc != -1 || !strcmp(l.err_param, param), "%s: param %s, want %s", line, l.err_param, param);
    CHECKF(!l.request, "%s: a request for a refused line", line);
    CHECKF(!!l.custom_id == has_cid, "%s: custom_id %s", line, l.custom_id ? l.custom_id : "(none)");
    CHECK(rc != -1 || strlen(l.err_msg) > 0);
    oai_line_free(&l);
}

static void test_convert(void)
{
    converts("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}],\"max_completion_tokens\":7,\"max_tokens\":99,\"temperature\":0.8,"
             "\"user\":\"u\",\"store\":false,\"future_field\":[1,2],\"tools\":[],\"logit_bias\":{},"
             "\"modalities\":[\"text\"],\"stream\":false}}",
             "{\"id\":\"x:1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":7,"
             "\"temperature\":0.8}");
    /* content parts joined; developer -> system; logprobs true + top_logprobs */
    converts("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"developer\","
             "\"content\":\"be\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Once \"},"
             "{\"type\":\"text\",\"text\":\"upon\"}]}],\"logprobs\":true,\"top_logprobs\":3,"
             "\"seed\":5,\"stop\":[\"\\n\"],\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
             "\"metadata\":{\"k\":\"v\"},\"n\":1}}",
             "{\"id\":\"x:1\",\"messages\":[{\"role\":\"system\",\"content\":\"be\"},{\"role\":\"user\","
             "\"content\":\"Once upon\"}],\"seed\":5,\"stop\":[\"\\n\"],\"presence_penalty\":0.5,"
             "\"frequency_penalty\":-0.5,\"n\":1,\"logprobs\":3,\"metadata\":{\"k\":\"v\"}}");
    /* chat logprobs true alone: one alternative computed (top_logprobs 0 kept by the output) */
    converts("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
             "\"logprobs\":true}}",
             "{\"id\":\"x:1\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":1}");
    converts("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
             "\"logprobs\":false}}",
             "{\"id\":\"x:1\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}");
    converts("{\"custom_id\":\"b\"," COMPL ",\"body\":{\"prompt\":\"Once\",\"max_tokens\":3,"
             "\"top_p\":0.9,\"logprobs\":2,\"best_of\":1,\"echo\":false,\"suffix\":null}}",
             "{\"id\":\"x:1\",\"prompt\":\"Once\",\"max_tokens\":3,\"top_p\":0.9,\"logprobs\":2}");
    converts("{\"custom_id\":\"b\"," COMPL ",\"body\":{\"prompt\":[\"Once\"]}}",
             "{\"id\":\"x:1\",\"prompt\":\"Once\"}");
    converts("{\"custom_id\":\"b\"," COMPL ",\"body\":{\"prompt\":[1,2,3]}}",
             "{\"id\":\"x:1\",\"input_ids\":[1,2,3]}");
    /* spillway's own fields pass as extensions; response_format passes unchanged */
    converts("{\"custom_id\":\"b\"," COMPL ",\"body\":{\"prompt\":\"a\",\"ttl_ms\":500,\"top_k\":4,"
             "\"response_format\":{\"type\":\"json_object\"}}}",
             "{\"id\":\"x:1\",\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"},"
             "\"ttl_ms\":500,\"top_k\":4}");
    /* the routing key passes on */
    converts("{\"custom_id\":\"b\"," COMPL ",\"body\":{\"prompt\":\"a\",\"prefix_key\":\"doc-7\"}}",
             "{\"id\":\"x:1\",\"prompt\":\"a\",\"prefix_key\":\"doc-7\"}");
    converts("{\"custom_id\":\"b\"," COMPL ",\"body\":{\"prompt\":\"a\",\"prefix_key\":null}}",
             "{\"id\":\"x:1\",\"prompt\":\"a\"}");
}

static void test_refused(void)
{
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"prompt\":\"a\",\"prefix_key\":\"\"}}",
            "invalid_value", "prefix_key", 1);
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"prompt\":\"a\",\"prefix_key\":5}}",
            "invalid_value", "prefix_key", 1);
    refused("not json", "invalid_json", "", 0);
    refused("[1]", "invalid_json", "", 0);
    refused("{" CHAT ",\"body\":{}}", "missing_required_parameter", "custom_id", 0);
    refused("{\"custom_id\":\"\"," CHAT ",\"body\":{}}", "missing_required_parameter", "custom_id", 0);
    refused("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{}}",
            "invalid_url", "url", 1);
    refused("{\"custom_id\":\"a\",\"method\":\"POST\",\"body\":{}}", "invalid_url", "url", 1);
    refused("{\"custom_id\":\"a\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{}}",
            "invalid_value", "method", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":7}", "invalid_type", "body", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"tools\":[{\"type\":\"function\"}]}}", "unsupported_parameter", "tools", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"tool_choice\":\"auto\"}}", "unsupported_parameter", "tool_choice", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"logit_bias\":{\"5\":3}}}", "unsupported_parameter", "logit_bias", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"modalities\":[\"text\",\"audio\"]}}", "unsupported_parameter", "modalities", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"stream\":true}}", "unsupported_parameter", "stream", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":"
            "[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}}", "unsupported_content",
            "messages[0].content", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":7}]}}",
            "invalid_type", "messages[0].content", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":\"hi\"}}", "invalid_type", "messages", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{}}", "missing_required_parameter", "messages", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"prompt\":\"a\"}}", "invalid_value", "prompt", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"logprobs\":3}}", "invalid_type", "logprobs", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"top_logprobs\":2}}", "invalid_value", "top_logprobs", 1);
    refused("{\"custom_id\":\"a\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"logprobs\":true,\"top_logprobs\":21}}", "invalid_value", "top_logprobs", 1);
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"prompt\":[\"a\",\"b\"]}}", "unsupported_parameter",
            "prompt", 1);
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"max_tokens\":3}}", "missing_required_parameter",
            "prompt", 1);
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"prompt\":\"a\",\"echo\":true}}",
            "unsupported_parameter", "echo", 1);
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"prompt\":\"a\",\"suffix\":\"z\"}}",
            "unsupported_parameter", "suffix", 1);
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"prompt\":\"a\",\"best_of\":3}}",
            "unsupported_parameter", "best_of", 1);
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"prompt\":\"a\",\"logprobs\":true}}",
            "invalid_value", "logprobs", 1);
    refused("{\"custom_id\":\"a\"," COMPL ",\"body\":{\"prompt\":\"a\",\"logprobs\":6}}",
            "invalid_value", "logprobs", 1);
}

static void test_output(void)
{
    const char *line = "{\"custom_id\":\"c1\"," CHAT ",\"body\":{\"messages\":[{\"role\":\"user\","
                       "\"content\":\"a\"}],\"logprobs\":true,\"top_logprobs\":1}}";
    oai_line_t l;
    CHECK(oai_line_convert(line, strlen(line), "x:1", &l) == 0);
    json_t *res = json_loads("{\"id\":\"x:1\",\"text\":\" hi\",\"finish_reason\":\"stop\",\"usage\":"
                             "{\"prompt_tokens\":4,\"cached_tokens\":2,\"completion_tokens\":1},"
                             "\"model\":\"m\",\"model_fingerprint\":\"0123456789abcdef\",\"logprobs\":"
                             "[{\"id\":5,\"text\":\" hi\",\"logprob\":-0.5,\"top_logprobs\":[{\"id\":5,"
                             "\"text\":\" hi\",\"logprob\":-0.5},{\"id\":6,\"text\":\"x\",\"logprob\":-2}]}]}",
                             0, NULL);
    json_t *o = oai_output_line(&l, "batch_req_1", res, 1700000000);
    char *s = json_dumps(o, JSON_COMPACT);
    const char *want =
        "{\"id\":\"batch_req_1\",\"custom_id\":\"c1\",\"response\":{\"status_code\":200,\"request_id\":"
        "\"batch_req_1\",\"body\":{\"id\":\"chatcmpl-batch_req_1\",\"object\":\"chat.completion\","
        "\"created\":1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
        "\"assistant\",\"content\":\" hi\",\"refusal\":null},\"logprobs\":{\"content\":[{\"token\":"
        "\" hi\",\"logprob\":-0.5,\"bytes\":[32,104,105],\"top_logprobs\":[{\"token\":\" hi\","
        "\"logprob\":-0.5,\"bytes\":[32,104,105]}]}],\"refusal\":null},\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1,\"total_tokens\":5,"
        "\"prompt_tokens_details\":{\"cached_tokens\":2}},\"system_fingerprint\":\"0123456789abcdef\"}},"
        "\"error\":null}";
    CHECKF(s && !strcmp(s, want), "\n  got  %s\n  want %s", s, want);
    free(s);
    json_decref(o);
    oai_line_free(&l);
    json_decref(res);

    o = oai_error_line("batch_req_2", "c2", 0, NULL, "batch_expired", NULL, "late");
    s = json_dumps(o, JSON_COMPACT);
    CHECKF(!strcmp(s, "{\"id\":\"batch_req_2\",\"custom_id\":\"c2\",\"response\":null,\"error\":"
                      "{\"code\":\"batch_expired\",\"message\":\"late\"}}"), "%s", s);
    free(s);
    json_decref(o);
    o = oai_error_line("batch_req_3", "c3", 400, "invalid_request_error", "bad_parameter",
                       "top_p", "top_p: 2 is out of range");
    s = json_dumps(o, JSON_COMPACT);
    CHECKF(!strcmp(s, "{\"id\":\"batch_req_3\",\"custom_id\":\"c3\",\"response\":{\"status_code\":400,"
                      "\"request_id\":\"batch_req_3\",\"body\":{\"error\":{\"message\":\"top_p: 2 is out "
                      "of range\",\"type\":\"invalid_request_error\",\"param\":\"top_p\",\"code\":"
                      "\"bad_parameter\"}}},\"error\":null}"), "%s", s);
    free(s);
    json_decref(o);
}

int main(void)
{
    test_convert();
    test_refused();
    test_output();
    return check_exit();
}
