/* cli/eval.c: `spillway eval`: perplexity of a model on a text file.
 *
 * The text is tokenised as a prompt would be (BOS first when the model's tokenizer adds one) and
 * cut into windows of ctx tokens (default min(model context, 512)). Window i starts at token
 * i * stride (stride defaults to ctx: windows side by side); the last window ends at the last
 * token. Each window is run alone from position 0 with a fresh KV cache, its first token replaced
 * by BOS when the text started with BOS (as llama-perplexity does), and scores the tokens that no
 * earlier window scored: side by side, every token after the first of its window; with
 * stride S < ctx, the first window scores all its tokens after the first and every later one
 * only its last S tokens, each then predicted from at least ctx - S tokens of context (the
 * strided evaluation of llama-perplexity --ppl-stride and of Hugging Face's guide;
 * --stride ctx/2 scores the second half of each window).
 *
 * A scored token t contributes -log softmax(logits at t - 1)[t], in double from the F32 logits.
 * Printed: tokens scored, mean NLL (nats), perplexity = exp(mean NLL). The logits come from
 * engine_raw_forward in chunks of --batch-tokens (default 512) positions; the CPU kernels are
 * batch invariant, so the numbers do not depend on the chunking or on --threads.
 *
 * --kld-dtype T runs a second engine, the same but for cuda.dtype T, over the same windows and
 * chunks, and prints its perplexity, the mean of KL(base || this) over the scored tokens
 * (softmaxes in double) and the share of them whose argmaxes agree: e.g. --backend cuda
 * --cuda-dtype fp8 --kld-dtype bf16, FP8 weights against BF16. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "engine/gguf.h"

#define EVAL_DEFAULT_CTX 512

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (!buf || ferror(f)) {
        fprintf(stderr, "spillway: %s: %s\n", path, buf ? "read error" : "out of memory");
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* log sum_i exp(l[i]) over n logits, in double (shifted by the largest), and in *amax the index
 * of the first largest. */
static double log_norm(const float *l, int n, int *amax)
{
    double mx = l[0];
    int am = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > mx) mx = l[i], am = i;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)l[i] - mx);
    *amax = am;
    return log(s) + mx;
}

/* -log softmax(l)[target] over n logits, in double. */
static double token_nll(const float *l, int n, int target)
{
    int am;
    return log_norm(l, n, &am) - (double)l[target];
}

/* KL(P || Q) of the softmaxes of logits p (base) and q over n, in double, and whether their
 * argmaxes (first on ties) agree. */
static double token_kld(const float *p, const float *q, int n, int *agree)
{
    int ap, aq;
    const double lp = log_norm(p, n, &ap), lq = log_norm(q, n, &aq);
    double kl = 0;
    for (int i = 0; i < n; i++) {
        const double a = (double)p[i] - lp, b = (double)q[i] - lq;
        kl += exp(a) * (a - b);
    }
    *agree = ap == aq;
    return kl > 0 ? kl : 0; /* rounding can leave -1e-17 */
}

/* The model's trained context length: <arch>.context_length, 2048 when absent (as model_load
 * reads it). Opens only the header (gguf_open touches no tensor data). */
static int model_context(const char *path, int64_t *ctx, char *err, size_t errlen)
{
    gguf_t *g = gguf_open(path, err, errlen);
    if (!g) return -1;
    gguf_str_t a;
    char key[96];
    *ctx = 2048;
    if (gguf_get_str(g, "general.architecture", &a) == 0 && a.len < 64) {
        snprintf(key, sizeof key, "%.*s.context_length", (int)a.len, a.ptr);
        int64_t v;
        if (gguf_find_key(g, key) >= 0 && gguf_get_i64(g, key, &v) == 0 && v > 0) *ctx = v;
    }
    gguf_close(g);
    return 0;
}

int cli_eval(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"file", required_argument, 0, 'f'},
        {"stride", required_argument, 0, 5001},
        {"kld-dtype", required_argument, 0, 5002},
        {"help", no_argument, 0, 'h'},
        CLI_ENGINE_LONGOPTS,
        {0, 0, 0, 0},
    };
    engine_config_t cfg;
    engine_config_default(&cfg);
    const char *text_path = NULL, *kld_dtype = NULL;
    long stride = 0;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:f:h", longopts, NULL)) != -1) {
        int r = cli_engine_opt(&cfg, opt, optarg); /* --ctx lands in cfg.max_ctx */
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (opt) {
        case 'm': cfg.model_path = optarg; break;
        case 'f': text_path = optarg; break;
        case 5001: if (cli_parse_int("--stride", optarg, 1, 1 << 30, &stride)) return 2; break;
        case 5002: kld_dtype = optarg; break;
        case 'h':
            printf("usage: spillway eval -m MODEL -f TEXT [--ctx N] [--stride S] [--kld-dtype T]\n"
                   "       [--threads N]\n"
                   "  Perplexity of MODEL on the text file TEXT: windows of N tokens (default\n"
                   "  min(model context, %d)), each run alone and starting with BOS (when the\n"
                   "  tokenizer adds one). Without --stride the windows lie side by side and every\n"
                   "  token after the first of a window is scored; with --stride S (< N) a window\n"
                   "  starts every S tokens and scores its last S tokens (the first window all of\n"
                   "  its own), so each is predicted from at least N - S tokens.\n"
                   "  Prints tokens scored, mean NLL (nats) and perplexity = exp(mean NLL).\n"
                   "  --kld-dtype T: also runs the model with cuda.dtype T (the base, e.g. bf16 for\n"
                   "  --cuda-dtype fp8) over the same windows and prints the base's perplexity,\n"
                   "  the mean KL divergence KL(base || this) per scored token (nats) and how\n"
                   "  often the two argmaxes agree. (The CPU backend has one arithmetic whatever\n"
                   "  the dtype: there it prints 0 and 100%%, a check of the comparison.)\n"
                   "Engine options (the workers' keys of the same name; --ctx: the window):\n",
                   EVAL_DEFAULT_CTX);
            cli_engine_help(stdout);
            return 0;
        default: return 2;
        }
    }
    if (!cfg.model_path || !text_path || optind != argc) {
        fprintf(stderr, "usage: spillway eval -m MODEL -f TEXT [--ctx N] [--stride S] (see --help)\n");
        return 2;
    }
    size_t text_len = 0;
    char *text = read_file(text_path, &text_len);
    if (!text) return 1;

    int rc = 1;
    int want_ctx = cfg.max_ctx;
    engine_t *e = NULL, *eb = NULL; /* eb: the --kld-dtype base */
    int32_t *tok = NULL, *blocks = NULL, *win = NULL, *bblocks = NULL;
    float *logits = NULL, *blogits = NULL;
    int n_blocks = 0, n_bblocks = 0;
    char err[512];
    /* The engine is sized for one window: the KV pool holds exactly its blocks. */
    cfg.prefix_cache = 0;
    cfg.max_seqs = 1;
    {
        /* the model's trained context bounds the window: read it from the file's header */
        int64_t model_ctx = 0;
        if (model_context(cfg.model_path, &model_ctx, err, sizeof err)) {
            fprintf(stderr, "spillway: %s\n", err);
            goto out;
        }
        int64_t ctx = want_ctx ? want_ctx : model_ctx < EVAL_DEFAULT_CTX ? model_ctx : EVAL_DEFAULT_CTX;
        if (ctx < 2 || ctx > model_ctx || ctx > (1 << 24)) {
            fprintf(stderr, "spillway: --ctx %lld not in 2..%lld (the model's context)\n",
                    (long long)ctx, (long long)model_ctx);
            rc = 2;
            goto out;
        }
        cfg.max_ctx = (int)ctx;
        if (cfg.kv_blocks == 0) cfg.kv_blocks = (cfg.max_ctx + cfg.block_tokens - 1) / cfg.block_tokens;
    }
    const int ctx = cfg.max_ctx;
    if (stride == 0) stride = ctx;
    if (stride > ctx) {
        fprintf(stderr, "spillway: --stride %ld must be at most --ctx %d\n", stride, ctx);
        rc = 2;
        goto out;
    }
    if (cfg.max_batch_tokens > ctx) cfg.max_batch_tokens = ctx;
    e = engine_new(&cfg, err, sizeof err);
    if (!e) {
        fprintf(stderr, "spillway: %s\n", err);
        goto out;
    }
    if (kld_dtype) {
        engine_config_t bc = cfg;
        bc.cuda_dtype = kld_dtype;
        if (!(eb = engine_new(&bc, err, sizeof err))) {
            fprintf(stderr, "spillway: --kld-dtype %s: %s\n", kld_dtype, err);
            goto out;
        }
    }
    engine_info_t info;
    engine_info(e, &info);
    const int nv = info.n_vocab, chunk = info.max_batch_tokens;

    int n_tok = engine_tokenize(e, text, text_len, 1, 0, NULL, 0);
    if (n_tok < 0 || !(tok = malloc(sizeof *tok * (size_t)(n_tok > 0 ? n_tok : 1))) ||
        engine_tokenize(e, text, text_len, 1, 0, tok, n_tok) != n_tok) {
        fprintf(stderr, "spillway: tokenizer: out of memory\n");
        goto out;
    }
    if (n_tok < 2) {
        fprintf(stderr, "spillway: %s gives %d token(s); at least 2 are needed\n", text_path, n_tok);
        goto out;
    }
    const int bos_first = info.bos >= 0 && tok[0] == info.bos;

    n_blocks = (ctx + info.block_tokens - 1) / info.block_tokens;
    blocks = malloc(sizeof *blocks * (size_t)n_blocks);
    win = malloc(sizeof *win * (size_t)ctx);
    logits = malloc(sizeof *logits * (size_t)nv * (size_t)chunk);
    if (!blocks || !win || !logits) {
        fprintf(stderr, "spillway: out of memory\n");
        goto out;
    }
    if (engine_raw_alloc_blocks(e, n_blocks, blocks) != 0) {
        n_blocks = 0;
        fprintf(stderr, "spillway: out of KV blocks\n");
        goto out;
    }
    if (eb) {
        bblocks = malloc(sizeof *bblocks * (size_t)n_blocks);
        blogits = malloc(sizeof *blogits * (size_t)nv * (size_t)chunk);
        if (!bblocks || !blogits) {
            fprintf(stderr, "spillway: out of memory\n");
            goto out;
        }
        if (engine_raw_alloc_blocks(eb, n_blocks, bblocks) != 0) {
            fprintf(stderr, "spillway: out of KV blocks (--kld-dtype engine)\n");
            goto out;
        }
        n_bblocks = n_blocks;
    }

    double nll = 0, bnll = 0, kld = 0;
    long scored = 0, windows = 0, agree = 0;
    int next = 1; /* first token not scored yet (token 0 has no context) */
    for (long s = 0;; s += stride) {
        int n = n_tok - s < ctx ? (int)(n_tok - s) : ctx;
        memcpy(win, tok + s, sizeof *win * (size_t)n);
        if (bos_first) win[0] = info.bos;
        int first = next > s + 1 ? (int)(next - s) : 1; /* window position of the first scored */
        for (int p0 = 0; p0 < n; p0 += chunk) {
            int m = n - p0 < chunk ? n - p0 : chunk;
            const int32_t *tp = win + p0;
            const int32_t *bp = blocks;
            if (engine_raw_forward(e, 1, &tp, &m, &p0, &bp, logits, err, sizeof err)) {
                fprintf(stderr, "spillway: %s\n", err);
                goto out;
            }
            const int32_t *bbp = bblocks;
            if (eb && engine_raw_forward(eb, 1, &tp, &m, &p0, &bbp, blogits, err, sizeof err)) {
                fprintf(stderr, "spillway: --kld-dtype %s: %s\n", kld_dtype, err);
                goto out;
            }
            /* logits at position p predict window token p + 1 */
            for (int p = p0; p < p0 + m && p + 1 < n; p++) {
                if (p + 1 < first) continue;
                const float *l = logits + (size_t)(p - p0) * (size_t)nv;
                nll += token_nll(l, nv, win[p + 1]);
                if (eb) {
                    const float *bl = blogits + (size_t)(p - p0) * (size_t)nv;
                    int same;
                    bnll += token_nll(bl, nv, win[p + 1]);
                    kld += token_kld(bl, l, nv, &same);
                    agree += same;
                }
                scored++;
            }
        }
        windows++;
        next = (int)(s + n);
        if (s + n >= n_tok) break;
    }
    if (scored == 0) {
        fprintf(stderr, "spillway: no token scored\n");
        goto out;
    }
    double mean = nll / (double)scored;
    printf("model: %s\n", cfg.model_path);
    printf("text: %s: %d tokens%s, windows of %d tokens, stride %ld, %ld windows\n", text_path,
           n_tok, bos_first ? " (BOS first)" : "", ctx, stride, windows);
    printf("tokens scored: %ld\n", scored);
    printf("mean NLL: %.6f\n", mean);
    printf("perplexity: %.6f\n", exp(mean));
    if (eb) {
        printf("base (cuda.dtype %s) perplexity: %.6f\n", kld_dtype, exp(bnll / (double)scored));
        printf("mean KL divergence from the base: %.6g\n", kld / (double)scored);
        printf("top-1 agreement with the base: %.4f%% (%ld of %ld)\n",
               100.0 * (double)agree / (double)scored, agree, scored);
    }
    rc = 0;
out:
    if (eb && n_bblocks) engine_raw_free_blocks(eb, n_bblocks, bblocks);
    engine_free(eb);
    free(bblocks);
    free(blogits);
    if (e && n_blocks) engine_raw_free_blocks(e, n_blocks, blocks);
    engine_free(e);
    free(text);
    free(tok);
    free(blocks);
    free(win);
    free(logits);
    return rc;
}
