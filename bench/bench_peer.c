/* bench/bench_peer.c: KV across hosts: fetching a prefix's blocks from a peer host over
 * loopback TCP (cache_peer_fetch: handshake, encrypted frames, verification, store into the
 * local arena and index) against recomputing them (the engine's prefill with the prefix cache
 * off), for prefixes of K blocks; then what the cost model chooses for each K, with the rates it
 * learned from those very fetches and prefills, and whether that choice was the faster one.
 *   recompute(K) = time of a K x block_tokens + 1 token prompt (max_tokens 1) minus that of a
 *                  1-token prompt (the last prompt token is computed either way)
 *   fetch(K)     = cache_peer_fetch of K blocks that host A (a cache handle with a peer server on
 *                  127.0.0.1) holds, into host B's arena (another handle, another arena file),
 *                  both indexed in the Redis given
 * Each figure is the median of R repetitions (fresh chains every time, so B never holds them).
 * Across hosts (bench/peer_bed.sh runs it so on the multi-host test bed), A and B are two
 * processes, each in its own network namespace, that draw the same chains from the same seed:
 *   --serve LISTEN  only host A: stores every chain the fetch phase will ask for, serves them on
 *                   LISTEN, prints "ready ADDR" on stdout once they are all indexed, and runs until
 *                   its stdin ends;
 *   --peer ADDR     only host B: the recompute phase, then fetches the chains from ADDR.
 * Without either, both hosts are in this process and A listens on 127.0.0.1.
 * usage: bench_peer MODEL --redis HOST:PORT [--threads 1] [--reps 5] [--blocks 1,2,4,8,16,32]
 *                   [--kv-type f32] [--serve HOST:PORT | --peer HOST:PORT] */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/benchlib.h"
#include "cache/cache.h"
#include "engine/engine.h"

static const unsigned char SECRET[ENGINE_KV_SECRET_BYTES] = "bench_peer: one deployment key";

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int done_count;
static void on_done(void *arg, const engine_result_t *r)
{
    (void)arg;
    (void)r;
    done_count++;
}

/* Seconds to run one request of n prompt tokens (max_tokens 1), or -1. */
static double run_prompt(engine_t *e, const int32_t *toks, int n)
{
    engine_request_t q;
    engine_request_default(&q);
    q.prompt = toks;
    q.n_prompt = n;
    q.max_tokens = 1;
    uint64_t id;
    char err[256];
    done_count = 0;
    double t0 = bench_now();
    if (engine_submit(e, &q, on_done, NULL, &id, err, sizeof err)) {
        fprintf(stderr, "engine_submit: %s\n", err);
        return -1;
    }
    if (engine_run(e, err, sizeof err) || done_count != 1) {
        fprintf(stderr, "engine_run: %s\n", err);
        return -1;
    }
    return bench_now() - t0;
}

static cache_t *mk_host(const char *arena, const char *host_id, const char *listen,
                        const char *redis_host, int redis_port, const cache_geometry_t *geo)
{
    cache_config_t kc;
    cache_config_default(&kc);
    kc.arena_path = arena;
    kc.arena_mb = 256;
    kc.redis_host = redis_host;
    kc.redis_port = redis_port;
    kc.namespace_ = "bench_peer";
    kc.host_id = host_id;
    kc.cmd_timeout_ms = 2000;
    kc.write_queue = 256;
    kc.peer_listen = listen;
    kc.peer_secret = SECRET;
    kc.peer_timeout_ms = 10000;
    kc.log_level = 1;
    char err[512];
    cache_t *c = cache_new(&kc, geo, err, sizeof err);
    if (!c) fprintf(stderr, "cache_new(%s): %s\n", host_id, err);
    return c;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *redis = NULL, *blocks_arg = "1,2,4,8,16,32", *kv_type = NULL;
    const char *serve = NULL, *peer = NULL;
    int threads = 1, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--redis") && i + 1 < argc) redis = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks_arg = argv[++i];
        else if (!strcmp(argv[i], "--kv-type") && i + 1 < argc) kv_type = argv[++i];
        else if (!strcmp(argv[i], "--serve") && i + 1 < argc) serve = argv[++i];
        else if (!strcmp(argv[i], "--peer") && i + 1 < argc) peer = argv[++i];
        else if (argv[i][0] != '-' && !model) model = argv[i];
        else {
            fprintf(stderr, "usage: bench_peer MODEL --redis HOST:PORT [--threads N] [--reps R] "
                            "[--blocks 1,2,4] [--kv-type T] [--serve HOST:PORT | --peer HOST:PORT]\n");
            return 2;
        }
    }
    if (!model || !redis || reps < 1 || reps > 100 || (serve && peer)) {
        fprintf(stderr, "bench_peer: MODEL and --redis HOST:PORT are required, and at most one "
                        "of --serve and --peer\n");
        return 2;
    }
    char rhost[256];
    int rport = 6379;
    snprintf(rhost, sizeof rhost, "%s", redis);
    char *colon = strrchr(rhost, ':');
    if (colon) {
        *colon = 0;
        rport = atoi(colon + 1);
    }
    int ks[32], nk = 0;
    for (const char *p = blocks_arg; *p && nk < 32;) {
        ks[nk++] = atoi(p);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }

    engine_config_t ec;
    engine_config_default(&ec);
    ec.model_path = model;
    ec.threads = threads;
    if (kv_type) ec.kv_type = kv_type;
    ec.prefix_cache = 0; /* recompute every time */
    ec.kv_secret = SECRET;
    char err[512];
    engine_t *e = engine_new(&ec, err, sizeof err);
    if (!e) {
        fprintf(stderr, "engine_new: %s\n", err);
        return 1;
    }
    ec.prefix_cache = 1; /* a second engine names the blocks (engine_prefix_names) */
    engine_t *namer = engine_new(&ec, err, sizeof err);
    if (!namer) {
        fprintf(stderr, "engine_new: %s\n", err);
        return 1;
    }
    engine_info_t info;
    engine_info(e, &info);
    const int B = info.block_tokens;
    cache_geometry_t geo = {info.kv_seed, B, info.kv_block_bytes};
    char dir[128], arena_a[192], arena_b[192];
    snprintf(dir, sizeof dir, "/dev/shm/spillway-bench-peer.XXXXXX");
    if (!mkdtemp(dir)) snprintf(dir, sizeof dir, "/tmp");
    snprintf(arena_a, sizeof arena_a, "%s/a.arena", dir);
    snprintf(arena_b, sizeof arena_b, "%s/b.arena", dir);
    cache_t *a = peer ? NULL : mk_host(arena_a, "benchA", serve ? serve : "127.0.0.1:0", rhost,
                                       rport, &geo);
    cache_t *b = serve ? NULL : mk_host(arena_b, "benchB", "", rhost, rport, &geo);
    if ((!peer && !a) || (!serve && !b)) return 1;
    char addr[CACHE_PEER_ADDR_MAX] = "";
    if (peer) snprintf(addr, sizeof addr, "%s", peer);
    for (int t = 0; t < 500 && !addr[0]; t++) {
        cache_peer_listen_addr(a, addr, sizeof addr);
        usleep(10000);
    }
    if (!addr[0]) {
        fprintf(stderr, "host A's peer server did not start\n");
        return 1;
    }

    int max_k = 0;
    for (int i = 0; i < nk; i++) max_k = ks[i] > max_k ? ks[i] : max_k;
    int n_max = max_k * B + 1;
    int32_t *toks = malloc(sizeof *toks * (size_t)n_max);
    uint64_t *names = malloc(sizeof *names * (size_t)max_k);
    uint8_t *kv = malloc(info.kv_block_bytes);
    double *samples = malloc(sizeof *samples * (size_t)reps);
    double t_rec[32], t_fetch[32];
    if (!toks || !names || !kv || !samples) return 1;
    uint64_t st = 0x9e3779b97f4a7c15ull;

    /* the fetch phase's chains come from a seed of their own, the same in both processes */
    uint64_t st_fetch = 0x2545f4914f6cdd1dull;
    double base = 0;
    if (serve) goto fetch;
    /* recompute: the 1-token baseline, then each K */
    for (int r = 0; r < reps; r++) {
        toks[0] = bench_rnd_tok(&st, info.n_vocab);
        samples[r] = run_prompt(e, toks, 1);
    }
    base = median(samples, reps);
    for (int i = 0; i < nk; i++) {
        int n = ks[i] * B + 1;
        for (int r = 0; r < reps; r++) {
            for (int j = 0; j < n; j++) toks[j] = bench_rnd_tok(&st, info.n_vocab);
            samples[r] = run_prompt(e, toks, n) - base;
        }
        t_rec[i] = median(samples, reps);
        if (t_rec[i] < 1e-6) t_rec[i] = 1e-6;
        /* the cost model's prefill rate, from the real prefills */
        cache_peer_note_prefill(b, (double)ks[i] * B, t_rec[i]);
    }

fetch:
    /* fetch: fresh chains stored on A, fetched by B */
    for (int i = 0; i < nk; i++) {
        int k = ks[i];
        for (int r = 0; r < reps; r++) {
            for (int j = 0; j < k * B + 1; j++) toks[j] = bench_rnd_tok(&st_fetch, info.n_vocab);
            uint64_t seed;
            if (engine_prefix_names(namer, NULL, toks, k * B + 1, &seed, names, k) != k) return 1;
            for (int j = 0; a && j < k; j++) {
                void *buf = NULL;
                for (int t = 0; t < 500 && !buf; t++) { /* the writer may be connecting */
                    buf = cache_store_begin(a, names[j], j ? names[j - 1] : seed, toks + j * B);
                    if (!buf) usleep(10000);
                }
                if (!buf) {
                    cache_stats_t cs;
                    cache_stats(a, &cs);
                    fprintf(stderr, "host A refused a store: redis_up %d, dropped %" PRIu64
                            ", arena refused %d\n", cs.redis_up, cs.stores_dropped,
                            cs.arena_refused);
                    return 1;
                }
                for (size_t x = 0; x < info.kv_block_bytes; x++) kv[x] = (uint8_t)(x * 31 + j + r);
                memcpy(buf, kv, info.kv_block_bytes);
                cache_store_commit(a, buf);
            }
            for (int t = 0; a && t < 1000 && cache_lookup(a, names, k) < k; t++) usleep(2000);
            if (!b) continue;
            int error;
            double t0 = bench_now();
            int got = cache_peer_fetch(b, addr, seed, names, toks, k, &error);
            samples[r] = bench_now() - t0;
            if (got != k) {
                fprintf(stderr, "fetch of %d blocks got %d (%s)\n", k, got,
                        cache_peer_error_name(error));
                return 1;
            }
        }
        if (b) t_fetch[i] = median(samples, reps);
    }
    if (serve) {
        printf("ready %s\n", addr);
        fflush(stdout);
        char line[64];
        while (fgets(line, sizeof line, stdin)) {
        }
        goto done;
    }

    printf("KV across hosts: fetch from a peer %s vs recompute, %s, %d thread(s), "
           "block %d tokens / %zu bytes, median of %d\n\n",
           peer ? "in another network namespace" : "over loopback", model, threads, B,
           info.kv_block_bytes, reps);
    printf("| blocks | tokens | KV bytes | fetch ms | recompute ms | TTFT fetch ms | TTFT "
           "recompute ms | faster | model: fetch est. ms | model: recompute est. ms | model's "
           "choice | right |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|\n");
    int right = 0;
    for (int i = 0; i < nk; i++) {
        double tf, tc;
        int choose = cache_peer_should_fetch(b, addr, ks[i], &tf, &tc);
        int faster_fetch = t_fetch[i] < t_rec[i];
        right += choose == faster_fetch;
        printf("| %d | %d | %zu | %.3f | %.3f | %.3f | %.3f | %s | %.3f | %.3f | %s | %s |\n",
               ks[i], ks[i] * B, (size_t)ks[i] * info.kv_block_bytes, t_fetch[i] * 1e3,
               t_rec[i] * 1e3, (t_fetch[i] + base) * 1e3, (t_rec[i] + base) * 1e3,
               faster_fetch ? "fetch" : "recompute", tf * 1e3, tc * 1e3,
               choose ? "fetch" : "recompute", choose == faster_fetch ? "yes" : "NO");
    }
    cache_stats_t cs;
    cache_stats(b, &cs);
    printf("\ncost model right in %d of %d; learned prefill rate %.0f tokens/s; TTFT = the "
           "prefix's fetch or recompute + the last prompt token (%.3f ms)\n", right, nk,
           cs.peer_prefill_tps, base * 1e3);
done:
    if (a) cache_free(a);
    if (b) cache_free(b);
    engine_free(e);
    engine_free(namer);
    unlink(arena_a);
    unlink(arena_b);
    rmdir(dir);
    free(toks);
    free(names);
    free(kv);
    free(samples);
    return 0;
}
