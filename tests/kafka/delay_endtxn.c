/* tests/kafka/delay_endtxn.c: a librdkafka plugin (plugin.library.paths) for
 * tests/test_worker_eos_endtxn.sh. It holds back the handling of one EndTxn response: the
 * broker has applied the commit, the client learns it only after the pause, so a
 * commit_transaction with a shorter timeout times out with the outcome unknown to it.
 *
 * Trigger: the file named by SPILLWAY_TEST_ENDTXN_DELAY_FILE, holding the pause in ms. The first
 * EndTxn response after it exists removes it (unlink succeeds for one caller only, across
 * instances) and sleeps on that broker thread for the pause; every other response passes. No
 * state lives in the library: the file is the state. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

enum { API_END_TXN = 26 };

/* on_response_received: broker thread of the connection the response came on. */
static rd_kafka_resp_err_t on_response(rd_kafka_t *rk, int sockfd, const char *brokername,
                                       int32_t brokerid, int16_t ApiKey, int16_t ApiVersion,
                                       int32_t CorrId, size_t size, int64_t rtt,
                                       rd_kafka_resp_err_t err, void *ic_opaque)
{
    (void)rk, (void)sockfd, (void)brokername, (void)brokerid, (void)ApiVersion, (void)CorrId;
    (void)size, (void)rtt, (void)ic_opaque;
    const char *path = getenv("SPILLWAY_TEST_ENDTXN_DELAY_FILE");
    if (ApiKey != API_END_TXN || err || !path) return RD_KAFKA_RESP_ERR_NO_ERROR;
    FILE *f = fopen(path, "r");
    if (!f) return RD_KAFKA_RESP_ERR_NO_ERROR;
    long ms = 0;
    if (fscanf(f, "%ld", &ms) != 1) ms = 0;
    fclose(f);
    if (unlink(path) || ms <= 0) return RD_KAFKA_RESP_ERR_NO_ERROR; /* another one took it */
    fprintf(stderr, "delay_endtxn: holding an EndTxn response for %ld ms\n", ms);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
    return RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* on_new: each new client instance gets the response interceptor. */
static rd_kafka_resp_err_t on_new(rd_kafka_t *rk, const rd_kafka_conf_t *conf, void *ic_opaque,
                                  char *errstr, size_t errstr_size)
{
    (void)conf, (void)ic_opaque, (void)errstr, (void)errstr_size;
    return rd_kafka_interceptor_add_on_response_received(rk, "delay_endtxn", on_response, NULL);
}

/* The plugin entry point librdkafka looks up. */
rd_kafka_resp_err_t conf_init(rd_kafka_conf_t *conf, void **plug_opaquep, char *errstr,
                              size_t errstr_size);
rd_kafka_resp_err_t conf_init(rd_kafka_conf_t *conf, void **plug_opaquep, char *errstr,
                              size_t errstr_size)
{
    (void)plug_opaquep, (void)errstr, (void)errstr_size;
    /* a duplicated configuration sets plugin.library.paths again, which calls this again */
    return rd_kafka_conf_interceptor_add_on_new(conf, "delay_endtxn", on_new, NULL);
}
