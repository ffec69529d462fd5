/* tests/fuzz/fuzz_peer.c: libFuzzer target for the peer protocol's receiving side
 * (cache/peer_wire.c): what arrives from the network before anything is trusted.
 *   byte 0 even: the rest is raw bytes from a peer: first a server handshake reads them as a
 *                client's hello and tag (it must refuse: no input knows the fresh nonce), then a
 *                session with a fixed key reads them as frames (peer_recv): each must be
 *                refused, or accepted with a type in range and a payload within the bound;
 *   byte 0 odd:  the rest is a list of (type, length u16 LE, payload) frames, sealed by the
 *                sending side with the session key and fed to the receiving side: each must come
 *                back with its type and bytes (types outside the protocol's are refused).
 * Bytes travel over a socketpair whose writer is the harness (at most 60 KB: the socket buffer);
 * every read has a deadline, so a short input ends the receive with a timeout or a close.
 * Anything else aborts, so the fuzzer reports it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache/cache_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_IN 60000
#define BOUND 4096 /* the receiver's payload bound */

static void require(int cond)
{
    if (!cond) abort();
}

static const unsigned char KEY[PEER_KEY_BYTES] = "fuzz_peer: a fixed session key..";

static void raw(const uint8_t *data, size_t size)
{
    int sv[2];
    require(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    require(write(sv[1], data, size) == (ssize_t)size);
    shutdown(sv[1], SHUT_WR);
    cache_geometry_t geo = {.seed = 1, .block_tokens = 16, .block_bytes = 64};
    peer_conn_t pc = {.fd = -1};
    pc.deadline_ms = sw_mono_ms() + 50;
    int dup0 = dup(sv[0]);
    require(dup0 >= 0);
    int rc = peer_handshake(&pc, dup0, 1, KEY, &geo); /* pc owns dup0 now */
    require(rc < 0 && rc >= -CACHE_PEER_ESTORE);
    peer_conn_close(&pc);
    /* the same bytes as frames of an established session */
    peer_conn_t s = {.fd = sv[0], .dir_out = 1};
    memcpy(s.key, KEY, sizeof s.key);
    s.deadline_ms = sw_mono_ms() + 50;
    for (int i = 0; i < 64; i++) {
        int type;
        const uint8_t *p;
        size_t len;
        rc = peer_recv(&s, &type, &p, &len, BOUND);
        if (rc) {
            require(rc < 0 && rc >= -CACHE_PEER_ESTORE);
            break;
        }
        require(type >= PEER_REQ && type <= PEER_END && len <= BOUND);
    }
    peer_conn_close(&s);
    close(sv[1]);
}

static void sealed(const uint8_t *data, size_t size)
{
    int sv[2];
    require(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    peer_conn_t tx = {.fd = sv[1], .dir_out = 0}, rx = {.fd = sv[0], .dir_out = 1};
    memcpy(tx.key, KEY, sizeof tx.key);
    memcpy(rx.key, KEY, sizeof rx.key);
    tx.deadline_ms = rx.deadline_ms = sw_mono_ms() + 50;
    struct {
        int type;
        size_t off, len;
    } sent[64];
    int n = 0;
    size_t at = 0, total = 0;
    while (n < 64 && at + 3 <= size) {
        int type = data[at] % 8;
        size_t len = (size_t)(data[at + 1] | data[at + 2] << 8);
        at += 3;
        if (len > size - at) len = size - at;
        total += PEER_HDR_BYTES + len + PEER_TAG_BYTES;
        if (total > MAX_IN) break;
        require(peer_send(&tx, type, data + at, len) == 0);
        sent[n].type = type;
        sent[n].off = at;
        sent[n].len = len;
        n++;
        at += len;
    }
    shutdown(sv[1], SHUT_WR);
    for (int i = 0; i < n; i++) {
        int type;
        const uint8_t *p;
        size_t len;
        int rc = peer_recv(&rx, &type, &p, &len, BOUND);
        int valid = sent[i].type >= PEER_REQ && sent[i].type <= PEER_END && sent[i].len <= BOUND;
        if (!valid) { /* refused, and the session is over */
            require(rc == -CACHE_PEER_EAUTH);
            break;
        }
        require(rc == 0 && type == sent[i].type && len == sent[i].len);
        require(memcmp(p, data + sent[i].off, len) == 0);
    }
    peer_conn_close(&tx);
    peer_conn_close(&rx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > MAX_IN) return 0;
    if (data[0] % 2 == 0) raw(data + 1, size - 1);
    else sealed(data + 1, size - 1);
    return 0;
}
