/* records/admit.c: the admission step of a parsed request (records.h). */
#include "records/records.h"

#include <stdio.h>
#include <string.h>

rec_err_t records_admit(request_t *r, const rec_rules_t *rules, rec_header_fn header,
                        void *header_arg, int *class_ix, void **model, char *err, size_t errlen)
{
    *class_ix = -1;
    *model = NULL;
    if (header) {
        static const char *const names[REQUEST_N_HEADER_FIELDS] = REQUEST_HEADER_FIELDS;
        for (int i = 0; i < REQUEST_N_HEADER_FIELDS; i++) {
            const void *v;
            size_t n;
            if (!header(header_arg, names[i], &v, &n)) continue;
            int rc = request_apply_header(r, names[i], v, n, rules->limits, NULL, err, errlen);
            if (rc) return (rec_err_t)-rc;
        }
    }
    if (r->reply_to) {
        int ok = 0;
        for (int i = 0; i < rules->n_reply_topics && !ok; i++)
            ok = !strcmp(rules->reply_topics[i], r->reply_to);
        if (!ok) {
            snprintf(err, errlen, "reply_to: topic \"%.100s\" is not in reply.topics (%s)",
                     r->reply_to, rules->n_reply_topics ? "see the worker's configuration"
                                                         : "empty: no reply topic is allowed");
            return REC_REPLY_NOT_ALLOWED;
        }
    }
    if (r->class_name) {
        for (int i = 0; i < rules->n_classes && *class_ix < 0; i++)
            if (!strcmp(rules->classes[i], r->class_name)) *class_ix = i;
        if (*class_ix < 0) {
            snprintf(err, errlen, "class: \"%s\" is not a class of this worker", r->class_name);
            return REC_UNKNOWN_CLASS;
        }
    }
    const char *name = r->model ? r->model : rules->default_model;
    if (!(*model = rules->model(rules->model_arg, name))) {
        snprintf(err, errlen, "model: \"%s\" is not a model this worker serves", name);
        return REC_UNKNOWN_MODEL;
    }
    return REC_OK;
}

rec_err_t records_admit_prompt(size_t rendered_bytes, size_t max_prompt_bytes, int n_tokens,
                               int max_prompt_tokens, char *err, size_t errlen)
{
    if (rendered_bytes > max_prompt_bytes) {
        snprintf(err, errlen, "rendered chat prompt has %zu bytes, over "
                 "limits.max_prompt_bytes=%zu", rendered_bytes, max_prompt_bytes);
        return REC_PROMPT_BYTES;
    }
    if (max_prompt_tokens > 0 && n_tokens > max_prompt_tokens) {
        snprintf(err, errlen, "prompt has %d tokens, over limits.max_prompt_tokens=%d", n_tokens,
                 max_prompt_tokens);
        return REC_PROMPT_TOKENS;
    }
    return REC_OK;
}
