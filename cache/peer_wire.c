/* cache/peer_wire.c: the peer protocol's wire (cache.h, "KV across hosts"): sockets with a
 * deadline, the handshake, and the encrypted, authenticated frames. This file and peer.c are
 * the protocol's only reader and writer; what the frames carry is peer.c's.
 *
 * Threads: a peer_conn_t is used by one thread; the rest is reentrant. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache/cache_internal.h"

#define PEER_MAGIC "SWPEER01"
#define HELLO_BYTES (8 + 8 + 4 + 8 + 32)

void peer_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
void peer_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
uint32_t peer_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
uint64_t peer_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

const char *cache_peer_error_name(int error)
{
    static const char *const n[] = {"ok", "connect", "auth", "timeout", "closed", "data", "store"};
    return error >= 0 && error <= CACHE_PEER_ESTORE ? n[error] : "?";
}

/* ---- sockets with a deadline ---- */

static int wait_fd(int fd, short ev, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - sw_mono_ms();
        if (left <= 0) return -CACHE_PEER_ETIMEOUT;
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return -CACHE_PEER_ECLOSED;
    }
}

static int write_full(int fd, const uint8_t *p, size_t n, int64_t deadline_ms)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline_ms);
            if (rc) return rc;
            continue;
        }
        return -CACHE_PEER_ECLOSED;
    }
    return 0;
}

static int read_full(int fd, uint8_t *p, size_t n, int64_t deadline_ms)
{
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) return -CACHE_PEER_ECLOSED;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, deadline_ms);
            if (rc) return rc;
            continue;
        }
        return -CACHE_PEER_ECLOSED;
    }
    return 0;
}

/* Splits "host:port" ("[v6]:port" too) into host and port. 0 or -1. */
int peer_split_addr(const char *addr, char *host, size_t hlen, char *port, size_t plen)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || !colon[1] || strlen(colon + 1) >= plen) return -1;
    const char *h = addr;
    size_t n = (size_t)(colon - addr);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    if (n >= hlen) return -1;
    memcpy(host, h, n);
    host[n] = 0;
    snprintf(port, plen, "%s", colon + 1);
    for (const char *q = port; *q; q++)
        if (*q < '0' || *q > '9') return -1;
    return 0;
}

int peer_dial(const char *addr, int64_t deadline_ms)
{
    char host[CACHE_PEER_ADDR_MAX], port[8];
    if (!addr || peer_split_addr(addr, host, sizeof host, port, sizeof port) || !*host)
        return -CACHE_PEER_ECONNECT;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) || !res) return -CACHE_PEER_ECONNECT;
    int fd = -1, rc = -CACHE_PEER_ECONNECT;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline_ms);
            int err = 0;
            socklen_t el = sizeof err;
            if (!w && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && !err) break;
            if (w == -CACHE_PEER_ETIMEOUT) rc = w;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) return rc;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* ---- protocol ---- */

void peer_derive_key(const unsigned char *secret, unsigned char key[PEER_KEY_BYTES])
{
    crypto_kdf_derive_from_key(key, PEER_KEY_BYTES, 1, "swpeer01", secret);
}

/* HMAC-SHA256(key, label hello nonce_s) into out. */
static void hs_tag(unsigned char out[32], const unsigned char *key, char label,
                   const uint8_t *hello, const uint8_t *nonce_s)
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, PEER_KEY_BYTES);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)&label, 1);
    crypto_auth_hmacsha256_update(&st, hello, HELLO_BYTES);
    crypto_auth_hmacsha256_update(&st, nonce_s, 32);
    crypto_auth_hmacsha256_final(&st, out);
}

void peer_conn_close(peer_conn_t *pc)
{
    if (pc->fd >= 0) close(pc->fd);
    pc->fd = -1;
    free(pc->buf);
    pc->buf = NULL;
    pc->cap = 0;
    sodium_memzero(pc->key, sizeof pc->key);
}

int peer_handshake(peer_conn_t *pc, int fd, int is_server, const unsigned char *key,
                   const cache_geometry_t *geo)
{
    pc->fd = fd;
    pc->seq_in = pc->seq_out = 0;
    pc->dir_out = is_server ? 1 : 0;
    uint8_t hello[HELLO_BYTES], reply[8 + 32 + 32], nonce_s[32];
    unsigned char tag[32];
    int rc;
    if (!is_server) {
        memcpy(hello, PEER_MAGIC, 8);
        peer_put64(hello + 8, geo->seed);
        peer_put32(hello + 16, (uint32_t)geo->block_tokens);
        peer_put64(hello + 20, (uint64_t)geo->block_bytes);
        randombytes_buf(hello + 28, 32);
        if ((rc = write_full(fd, hello, sizeof hello, pc->deadline_ms))) return rc;
        if ((rc = read_full(fd, reply, sizeof reply, pc->deadline_ms)))
            return rc == -CACHE_PEER_ECLOSED ? -CACHE_PEER_EAUTH : rc;
        if (memcmp(reply, PEER_MAGIC, 8)) return -CACHE_PEER_EAUTH;
        memcpy(nonce_s, reply + 8, 32);
        hs_tag(tag, key, 'S', hello, nonce_s);
        if (sodium_memcmp(tag, reply + 40, 32)) return -CACHE_PEER_EAUTH;
        hs_tag(tag, key, 'C', hello, nonce_s);
        if ((rc = write_full(fd, tag, 32, pc->deadline_ms))) return rc;
    } else {
        if ((rc = read_full(fd, hello, sizeof hello, pc->deadline_ms))) return rc;
        if (memcmp(hello, PEER_MAGIC, 8) || peer_get64(hello + 8) != geo->seed ||
            peer_get32(hello + 16) != (uint32_t)geo->block_tokens ||
            peer_get64(hello + 20) != (uint64_t)geo->block_bytes)
            return -CACHE_PEER_EAUTH;
        memcpy(reply, PEER_MAGIC, 8);
        randombytes_buf(nonce_s, 32);
        memcpy(reply + 8, nonce_s, 32);
        hs_tag(reply + 40, key, 'S', hello, nonce_s);
        if ((rc = write_full(fd, reply, sizeof reply, pc->deadline_ms))) return rc;
        uint8_t got[32];
        if ((rc = read_full(fd, got, 32, pc->deadline_ms)))
            return rc == -CACHE_PEER_ECLOSED ? -CACHE_PEER_EAUTH : rc;
        hs_tag(tag, key, 'C', hello, nonce_s);
        if (sodium_memcmp(tag, got, 32)) return -CACHE_PEER_EAUTH;
    }
    hs_tag(pc->key, key, 'K', hello, nonce_s);
    sodium_memzero(tag, sizeof tag);
    return 0;
}

static int ensure_buf(peer_conn_t *pc, size_t n)
{
    if (n <= pc->cap) return 0;
    uint8_t *b = realloc(pc->buf, n);
    if (!b) return -1;
    pc->buf = b;
    pc->cap = n;
    return 0;
}

static void frame_nonce(unsigned char n[12], uint8_t dir, uint64_t seq)
{
    memset(n, 0, 12);
    n[0] = dir;
    peer_put64(n + 1, seq);
}

int peer_send(peer_conn_t *pc, int type, const void *payload, size_t len)
{
    if (len > UINT32_MAX || ensure_buf(pc, PEER_HDR_BYTES + len + PEER_TAG_BYTES))
        return -CACHE_PEER_ECLOSED;
    uint8_t *h = pc->buf;
    peer_put32(h, (uint32_t)len);
    h[4] = (uint8_t)type;
    h[5] = h[6] = h[7] = 0;
    unsigned char nonce[12];
    frame_nonce(nonce, pc->dir_out, pc->seq_out++);
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(h + PEER_HDR_BYTES, h + PEER_HDR_BYTES + len,
                                                       NULL, payload, len, h, PEER_HDR_BYTES,
                                                       NULL, nonce, pc->key);
    return write_full(pc->fd, h, PEER_HDR_BYTES + len + PEER_TAG_BYTES, pc->deadline_ms);
}

int peer_recv(peer_conn_t *pc, int *type, const uint8_t **payload, size_t *len, size_t max)
{
    uint8_t h[PEER_HDR_BYTES];
    int rc = read_full(pc->fd, h, sizeof h, pc->deadline_ms);
    if (rc) return rc;
    uint32_t n = peer_get32(h);
    if (n > max || h[4] < PEER_REQ || h[4] > PEER_END || h[5] || h[6] || h[7])
        return -CACHE_PEER_EAUTH;
    if (ensure_buf(pc, (size_t)n + PEER_TAG_BYTES)) return -CACHE_PEER_ECLOSED;
    if ((rc = read_full(pc->fd, pc->buf, (size_t)n + PEER_TAG_BYTES, pc->deadline_ms))) return rc;
    unsigned char nonce[12];
    frame_nonce(nonce, (uint8_t)!pc->dir_out, pc->seq_in++);
    if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(pc->buf, NULL, pc->buf, n,
                                                           pc->buf + n, h, sizeof h, nonce,
                                                           pc->key))
        return -CACHE_PEER_EAUTH;
    *type = h[4];
    *payload = pc->buf;
    *len = n;
    return 0;
}
