/* tests/support/http_client.h: a minimal HTTP/1.0 client for the tests of the worker's HTTP
 * endpoints (/metrics, /healthz, /readyz). Linked into every tests/test_*.c
 * (spillway_test_support). Threads: any; no state between calls. */
#ifndef SPILLWAY_TESTS_SUPPORT_HTTP_CLIENT_H
#define SPILLWAY_TESTS_SUPPORT_HTTP_CLIENT_H

#include <stddef.h>

typedef struct {
    int status;      /* 0 when the request failed */
    char ctype[128]; /* Content-Type header, "" if none */
    char *body;      /* owned, NUL-terminated */
    size_t body_len;
} th_resp_t;

/* Sends "METHOD path HTTP/1.0" to 127.0.0.1:port and reads the whole response into *r, each read
 * and write given timeout_s seconds. 0, or -1 (the request failed or the response was not HTTP;
 * *r zeroed). The caller frees *r with th_resp_free. */
int th_request(int port, const char *method, const char *path, int timeout_s, th_resp_t *r);
void th_resp_free(th_resp_t *r);

#endif
