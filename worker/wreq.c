/* worker/wreq.c: the request record (wreq_t, worker_int.h): its release. Who holds a record at
 * each stage, and who frees it, is stated in worker_int.h ("Ownership of one message"). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker/worker_int.h"

void wreq_free(worker_t *w, wreq_t *r)
{
    if (!r) return;
    wmodel_release(w, r);
    if (r->parsed) request_free(&r->req);
    if (r->msg) rd_kafka_message_destroy(r->msg);
    free(r->toks);
    free(r->out);
    free(r->choice_ids);
    json_decref(r->choices);
    free(r);
}

const int32_t *wreq_prompt(const wreq_t *r, int *n)
{
    *n = r->toks ? r->n_toks : r->req.n_input_ids;
    return r->toks ? r->toks : r->req.input_ids;
}

const char *wreq_cache_scope(const worker_t *w, const wreq_t *r)
{
    return strcmp(w->cfg.cache_isolation, "tenant") == 0 ? r->req.tenant : NULL;
}

/* 1 when r has a deadline and it has passed (wall clock). Any thread holding r. */
int wreq_deadline_passed(const wreq_t *r)
{
    return r->req.deadline_ms > 0 && wall_ms() >= r->req.deadline_ms;
}
