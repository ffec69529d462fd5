/* tests/support/http_client.c: a minimal HTTP/1.0 client (contract: http_client.h). */
#include "http_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

void th_resp_free(th_resp_t *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

int th_request(int port, const char *method, const char *path, int timeout_s, th_resp_t *r)
{
    memset(r, 0, sizeof *r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {timeout_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) goto fail;
    char req[512];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
    if (write(fd, req, (size_t)n) != n) goto fail;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 16384;
            char *p = realloc(buf, cap);
            if (!p) goto fail;
            buf = p;
        }
        ssize_t got = read(fd, buf + len, cap - len - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) goto fail;
        if (got == 0) break;
        len += (size_t)got;
    }
    close(fd);
    fd = -1;
    if (!buf) goto fail;
    buf[len] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) goto fail;
    char *end = strstr(buf, "\r\n\r\n");
    if (!end) goto fail;
    *end = '\0';
    for (char *line = strstr(buf, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n")) {
        if (!strncasecmp(line + 2, "Content-Type:", 13)) {
            const char *v = line + 2 + 13;
            while (*v == ' ') v++;
            size_t vl = strcspn(v, "\r");
            if (vl >= sizeof r->ctype) vl = sizeof r->ctype - 1;
            memcpy(r->ctype, v, vl);
            r->ctype[vl] = '\0';
        }
    }
    r->body_len = len - (size_t)(end + 4 - buf);
    r->body = malloc(r->body_len + 1);
    if (!r->body) goto fail;
    memcpy(r->body, end + 4, r->body_len);
    r->body[r->body_len] = '\0';
    free(buf);
    return 0;
fail:
    if (fd >= 0) close(fd);
    free(buf);
    th_resp_free(r);
    return -1;
}
