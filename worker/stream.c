/* worker/stream.c: streaming ("stream": true with stream.topic set): chunks of the final text so
 * far, sent best effort on the side producer by whichever thread holds the request. */
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

/* Opaques of the side producer's records, told apart in its delivery reports (by address). */
const char AUX_CHUNK[] = "chunk";
const char AUX_USAGE[] = "usage";

/* Publishes one chunk of r's stream (schemas/chunk.schema.json): delta[0..len) follows the
 * text of the previous chunks; finish is NULL, or the finish reason for the last chunk. Best
 * effort and never blocking: when the side producer cannot take it, nothing is sent and the
 * next chunk carries this delta too (the deltas of the chunks sent always concatenate to a
 * prefix of the final text). Thread of whoever holds r. */
void wstream_chunk(worker_t *w, wreq_t *r, const char *delta, size_t len, int n_tokens,
                       const char *finish)
{
    char err[256];
    const char *corr = r->req.correlation_id;
    rec_chunk_t in = {r->req.id, corr, r->stream_seq, delta, len, n_tokens, finish,
                      {rd_kafka_topic_name(r->msg->rkt), r->msg->partition, r->msg->offset}};
    char *js = records_chunk(&in);
    if (!js) {
        atomic_fetch_add(&w->st.chunks_failed, 1);
        return;
    }
    rd_kafka_headers_t *h = NULL;
    if (corr) {
        h = rd_kafka_headers_new(1);
        if (h && rd_kafka_header_add(h, WORKER_H_CORRELATION_ID, -1, corr, -1)) {
            rd_kafka_headers_destroy(h);
            h = NULL;
        }
    }
    const char *key = corr ? corr : r->req.id; /* one partition: chunks stay in seq order */
    int rc = producer_send_nowait(w->aux, w->cfg.stream_topic, key, strlen(key), js, strlen(js),
                                  h, (void *)AUX_CHUNK, err, sizeof err); /* h consumed */
    free(js);
    if (rc) {
        atomic_fetch_add(&w->st.chunks_failed, 1);
        wlog(w, SW_LOG_DEBUG, "stream chunk %d of %s not sent: %s", r->stream_seq, r->req.id, err);
        return;
    }
    r->stream_sent += len;
    r->stream_seq++;
    r->stream_tokens = n_tokens;
    r->stream_ns = mono_ns();
}

/* The last chunk of a streamed request: the rest of its final text, final: true. */
void wstream_finish(worker_t *w, wreq_t *r, const char *text, size_t len, int n_tokens,
                          const char *finish)
{
    if (!w->aux || !r->parsed || !r->req.stream || len < r->stream_sent) return;
    wstream_chunk(w, r, text + r->stream_sent, len - r->stream_sent, n_tokens, finish);
}
