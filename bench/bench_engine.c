/* bench/bench_engine.c: engine throughput on one model, printed as a markdown table.
 *   prefill   tokens/s of one P-token prompt (default 512), prefix cache off
 *   decode@1  tokens/s of one sequence generating G tokens (default 128) after a short prompt
 *   decode@N  generated tokens/s of N sequences decoding together (N = 4, 16, 64 by default)
 * Each figure is measured R times (default 3) and reported as min / median / max.
 *   read bw   next to decode@1: the memory read bandwidth (bench/membw.h, the threads of the
 *             run, a 512 MiB buffer) measured before each of its repetitions and after the last,
 *             so that its GB/s of weights can be set against the bandwidth the machine gave at
 *             that time (a shared machine's bandwidth changes from minute to minute).
 * usage: bench_engine MODEL [--threads N] [--reps R] [--prompt P] [--gen G] [--batches 4,16,64]
 *                          [--kv-type f16|f32] [--json FILE]
 *        bench_engine MODEL --serve N,IN,OUT [--backend cpu|cuda] [--cuda-dtype T] [--max-seqs S]
 *                          [--batch-tokens B] [--threads N] [--kv-type f16|f32]
 * --serve: instead of the above, N requests of IN random prompt tokens generating OUT tokens
 * each (greedy, EOS ignored) are submitted at once and engine_run serves them with its own
 * scheduler (continuous batching: at most S sequences, B tokens a step; defaults 256 and 4096),
 * on the backend given (default cpu): wall seconds, generated tokens/s, all tokens/s, steps. The
 * CUDA backend's pool takes what cuda.mem_fraction leaves (kv_blocks 0); the CPU's 2 GiB.
 * --json appends one JSON object per figure to FILE (read by bench/run.py), after one object with
 * "workload": "info" (the model's shapes, weight_bytes, kernel set, threads, KV type); the read
 * bandwidth is "workload": "read_bw" (GB/s, 1e9 bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/benchlib.h"
#include "bench/membw.h"
#include "engine/cpu/threadpool.h"
#include "engine/engine.h"

typedef struct {
    int done;
} cnt_t;

static void on_done(void *arg, const engine_result_t *r)
{
    (void)r;
    ((cnt_t *)arg)->done++;
}

static unsigned long long rng_state = 88172645463325252ull;
static int32_t rnd_tok(int n_vocab)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (int32_t)(3 + rng_state % (unsigned long long)(n_vocab - 3));
}

/* Submits n greedy requests of prompt_len random tokens generating gen tokens each (EOS
 * ignored), counting results in *cnt. 0, or -1 after printing why. */
static int submit_random(engine_t *e, int n, int prompt_len, int gen, cnt_t *cnt)
{
    engine_info_t info;
    engine_info(e, &info);
    char err[512];
    int32_t *p = malloc(sizeof *p * (size_t)prompt_len);
    if (!p) return -1;
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < prompt_len; i++) p[i] = rnd_tok(info.n_vocab);
        engine_request_t rq;
        engine_request_default(&rq);
        rq.prompt = p;
        rq.n_prompt = prompt_len;
        rq.sampling.temperature = 0;
        rq.max_tokens = gen;
        rq.ignore_eos = 1;
        if (engine_submit(e, &rq, on_done, cnt, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "submit: %s\n", err);
            free(p);
            return -1;
        }
    }
    free(p);
    return 0;
}

/* Runs n_seq requests of prompt_len random tokens generating gen tokens each. Returns the
 * seconds of the first step (prefill of all prompts, which the config lets fit in one step)
 * in *t_prefill and of all later steps (pure decode) in *t_decode. */
static int measure(engine_t *e, int n_seq, int prompt_len, int gen, double *t_prefill, double *t_decode)
{
    cnt_t cnt = {0};
    char err[512];
    if (submit_random(e, n_seq, prompt_len, gen, &cnt)) return -1;
    double t0 = bench_now();
    if (engine_step(e, err, sizeof err) != 1) {
        fprintf(stderr, "step: %s\n", err);
        return -1;
    }
    double t1 = bench_now();
    if (engine_n_waiting(e) != 0) {
        fprintf(stderr, "bench: prompts did not fit one step\n");
        return -1;
    }
    if (engine_run(e, err, sizeof err) != 0) {
        fprintf(stderr, "run: %s\n", err);
        return -1;
    }
    double t2 = bench_now();
    *t_prefill = t1 - t0;
    *t_decode = t2 - t1;
    return cnt.done == n_seq ? 0 : -1;
}

/* --serve: n requests of in random tokens, out generated each, all submitted, then engine_run. */
static int serve(engine_t *e, int n, int in, int out)
{
    cnt_t cnt = {0};
    char err[512];
    if (submit_random(e, n, in, out, &cnt)) return -1;
    engine_stats_t st0, st1;
    engine_stats(e, &st0);
    const double t0 = bench_now();
    if (engine_run(e, err, sizeof err) != 0) {
        fprintf(stderr, "run: %s\n", err);
        return -1;
    }
    const double dt = bench_now() - t0;
    engine_stats(e, &st1);
    if (cnt.done != n) {
        fprintf(stderr, "serve: %d of %d requests finished\n", cnt.done, n);
        return -1;
    }
    printf("| figure | value |\n|---|---:|\n");
    printf("| requests x prompt / generated tokens | %d x %d / %d |\n", n, in, out);
    printf("| wall seconds (submit to last result) | %.2f |\n", dt);
    printf("| generated tokens/s | %.0f |\n", (double)n * out / dt);
    printf("| prompt + generated tokens/s | %.0f |\n", (double)n * (in + out) / dt);
    printf("| engine steps | %llu |\n", (unsigned long long)(st1.steps - st0.steps));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_engine MODEL [--threads N] [--reps R] [--prompt P] [--gen G] "
                        "[--batches 4,16,64] [--kv-type f16|f32]\n");
        return 2;
    }
    const char *model = argv[1];
    int threads = 2, reps = 3, P = 512, G = 128;
    const char *kv = "f16";
    FILE *jf = NULL;
    int batches[16] = {4, 16, 64}, nb = 3;
    int sv_n = 0, sv_in = 0, sv_out = 0, max_seqs = 256, batch_tokens = 4096;
    const char *backend = "cpu", *cuda_dtype = "bf16";
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--serve")) {
            if (sscanf(argv[i + 1], "%d,%d,%d", &sv_n, &sv_in, &sv_out) != 3 || sv_n < 1 ||
                sv_in < 1 || sv_out < 1) {
                fprintf(stderr, "--serve N,IN,OUT: three counts >= 1\n");
                return 2;
            }
            continue;
        }
        if (!strcmp(argv[i], "--backend")) { backend = argv[i + 1]; continue; }
        if (!strcmp(argv[i], "--cuda-dtype")) { cuda_dtype = argv[i + 1]; continue; }
        if (!strcmp(argv[i], "--max-seqs")) { max_seqs = atoi(argv[i + 1]); continue; }
        if (!strcmp(argv[i], "--batch-tokens")) { batch_tokens = atoi(argv[i + 1]); continue; }
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt")) P = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) G = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-type")) kv = argv[i + 1];
        else if (!strcmp(argv[i], "--json")) {
            jf = fopen(argv[i + 1], "a");
            if (!jf) {
                perror(argv[i + 1]);
                return 1;
            }
        }
        else if (!strcmp(argv[i], "--batches")) {
            nb = 0;
            for (char *s = argv[i + 1]; *s && nb < 16;) {
                batches[nb++] = (int)strtol(s, &s, 10);
                if (*s == ',') s++;
            }
        } else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 100) reps = 3;
    engine_config_t cfg;
    engine_config_default(&cfg);
    cfg.model_path = model;
    cfg.threads = threads;
    cfg.kv_type = kv;
    cfg.prefix_cache = 0;
    cfg.kv_mem_mb = 2048;
    if (sv_n) {
        cfg.backend = backend;
        cfg.cuda_dtype = cuda_dtype;
        cfg.max_seqs = max_seqs;
        cfg.max_batch_tokens = batch_tokens;
        cfg.max_ctx = sv_in + sv_out;
    } else {
        int maxb = 1;
        for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
        cfg.max_seqs = maxb;
        cfg.max_batch_tokens = P > maxb * 16 ? P : maxb * 16;
        cfg.sched_window = maxb; /* admit every batched prompt in the first step (it compares at
                                    most sched_window + 1 candidates per step) */
    }
    char err[512];
    engine_t *e = engine_new(&cfg, err, sizeof err);
    if (!e) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    engine_info_t info;
    engine_info(e, &info);
    if (sv_n) {
        printf("model %s: %s dim %d layers %d, backend %s%s%s, %d KV blocks, max_seqs %d, "
               "batch tokens %d\n\n", model, info.arch, info.dim, info.n_layers, info.backend,
               strcmp(backend, "cuda") ? "" : " ", strcmp(backend, "cuda") ? "" : cuda_dtype,
               info.kv_blocks, max_seqs, batch_tokens);
        const int rc = serve(e, sv_n, sv_in, sv_out);
        engine_free(e);
        return rc ? 1 : 0;
    }
    printf("model %s: %s dim %d layers %d heads %d/%d ffn %d vocab %d, %.1f MiB weights; "
           "%d threads, kernels %s, KV %s\n\n",
           model, info.arch, info.dim, info.n_layers, info.n_heads, info.n_kv_heads, info.ffn_dim,
           info.n_vocab, (double)info.weight_bytes / 1048576.0, threads, info.kernels, kv);
    if (jf)
        fprintf(jf, "{\"model\": \"%s\", \"workload\": \"info\", \"arch\": \"%s\", \"dim\": %d, "
                    "\"layers\": %d, \"heads\": %d, \"kv_heads\": %d, \"ffn\": %d, \"vocab\": %d, "
                    "\"weight_bytes\": %zu, \"kernels\": \"%s\", \"threads\": %d, \"kv_type\": \"%s\"}\n",
                model, info.arch, info.dim, info.n_layers, info.n_heads, info.n_kv_heads, info.ffn_dim,
                info.n_vocab, info.weight_bytes, info.kernels, threads, kv);
    printf("| workload | tokens/s min | median | max |\n|---|---:|---:|---:|\n");
    double v[100], tp, td;
    /* prefill */
    for (int r = 0; r < reps; r++) {
        if (measure(e, 1, P, 1, &tp, &td)) return 1;
        v[r] = P / tp;
    }
    qsort(v, (size_t)reps, sizeof *v, bench_cmp_double);
    printf("| prefill %d tokens | %.1f | %.1f | %.1f |\n", P, v[0], v[reps / 2], v[reps - 1]);
    if (jf)
        fprintf(jf, "{\"model\": \"%s\", \"workload\": \"prefill\", \"n\": %d, \"min\": %.3f, "
                    "\"median\": %.3f, \"max\": %.3f}\n", model, P, v[0], v[reps / 2], v[reps - 1]);
    fflush(stdout);
    int sizes[17] = {1};
    for (int i = 0; i < nb; i++) sizes[i + 1] = batches[i];
    /* the read bandwidth next to decode@1 */
    const size_t bw_bytes = (size_t)512 << 20;
    char *bw_buf = malloc(bw_bytes), tperr[128];
    tpool_t *bw_pool = bw_buf ? tpool_new(threads, tperr, sizeof tperr) : NULL;
    if (!bw_pool) {
        fprintf(stderr, "bench: read bandwidth: %s\n", bw_buf ? tperr : "out of memory");
        return 1;
    }
    memset(bw_buf, 1, bw_bytes);
    double bw[101], dec1[100];
    for (int b = 0; b < nb + 1; b++) {
        int n = sizes[b];
        for (int r = 0; r < reps; r++) {
            if (n == 1) bw[r] = membw_read(bw_pool, bw_buf, bw_bytes, 3);
            if (measure(e, n, 16, G, &tp, &td)) return 1;
            v[r] = (double)n * (G - 1) / td;
            if (n == 1) dec1[r] = v[r];
        }
        qsort(v, (size_t)reps, sizeof *v, bench_cmp_double);
        printf("| decode, %d sequence%s x %d tokens | %.1f | %.1f | %.1f |\n", n, n > 1 ? "s" : "",
               G, v[0], v[reps / 2], v[reps - 1]);
        if (jf)
            fprintf(jf, "{\"model\": \"%s\", \"workload\": \"decode\", \"n\": %d, \"gen\": %d, "
                        "\"min\": %.3f, \"median\": %.3f, \"max\": %.3f}\n",
                    model, n, G, v[0], v[reps / 2], v[reps - 1]);
        if (n == 1) {
            bw[reps] = membw_read(bw_pool, bw_buf, bw_bytes, 3);
            /* each repetition with the probes just before and after it (the machine's bandwidth
             * moves between minutes: bench/run.py pairs them) */
            printf("| decode-1 repetitions: read GB/s before, tokens/s, read GB/s after |");
            for (int r = 0; r < reps; r++)
                printf(" %.1f, %.1f, %.1f%s", bw[r], dec1[r], bw[r + 1], r + 1 < reps ? ";" : " |\n");
            if (jf) {
                fprintf(jf, "{\"model\": \"%s\", \"workload\": \"decode1_pairs\", \"n\": 1, "
                            "\"pairs\": [", model);
                for (int r = 0; r < reps; r++)
                    fprintf(jf, "%s[%.3f, %.3f, %.3f]", r ? ", " : "", bw[r], dec1[r], bw[r + 1]);
                fprintf(jf, "]}\n");
            }
            qsort(bw, (size_t)reps + 1, sizeof *bw, bench_cmp_double);
            printf("| read bandwidth before each decode-1 repetition and after, GB/s | %.1f | %.1f | "
                   "%.1f |\n", bw[0], bw[(reps + 1) / 2], bw[reps]);
            if (jf)
                fprintf(jf, "{\"model\": \"%s\", \"workload\": \"read_bw\", \"n\": 1, "
                            "\"min\": %.3f, \"median\": %.3f, \"max\": %.3f}\n",
                        model, bw[0], bw[(reps + 1) / 2], bw[reps]);
        }
        fflush(stdout);
    }
    tpool_free(bw_pool);
    free(bw_buf);
    engine_free(e);
    if (jf) fclose(jf);
    return 0;
}
