/* cli/logits.c: `spillway logits`: runs sequences of token ids through the forward pass in a
 * chosen batching mode and writes every position's logits (raw little-endian float32, for each
 * sequence in file order, for each position, n_vocab values). Used by the reference tests. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum { MODE_ALONE, MODE_BATCH, MODE_DECODE, MODE_CHUNK };

typedef struct {
    int32_t *tok;
    int n;
    int32_t *blocks;
    int n_blocks;
    float *logits; /* [n][n_vocab] */
} lseq_t;

static int read_seqs(const char *path, lseq_t **out, int *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return -1;
    }
    lseq_t *seqs = NULL;
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        int32_t *tok = NULL;
        int nt = 0, ct = 0;
        char *p = line, *end;
        for (;;) {
            long v = strtol(p, &end, 10);
            if (end == p) break;
            if (nt == ct) {
                ct = ct ? ct * 2 : 16;
                tok = realloc(tok, sizeof *tok * (size_t)ct);
            }
            tok[nt++] = (int32_t)v;
            p = end;
        }
        if (nt == 0) {
            free(tok);
            continue;
        }
        seqs = realloc(seqs, sizeof *seqs * (size_t)(n + 1));
        memset(&seqs[n], 0, sizeof seqs[n]);
        seqs[n].tok = tok;
        seqs[n].n = nt;
        n++;
    }
    free(line);
    fclose(f);
    *out = seqs;
    *n_out = n;
    return 0;
}

int cli_logits(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"input", required_argument, 0, 'i'},
        {"output", required_argument, 0, 'o'},
        {"mode", required_argument, 0, 3001},
        {"chunk", required_argument, 0, 3002},
        {"help", no_argument, 0, 'h'},
        CLI_ENGINE_LONGOPTS,
        {0, 0, 0, 0},
    };
    engine_config_t cfg;
    engine_config_default(&cfg);
    cfg.kv_mem_mb = 64;
    const char *in = NULL, *outp = NULL;
    int mode = MODE_BATCH;
    long chunk = 4;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:i:o:h", longopts, NULL)) != -1) {
        int r = cli_engine_opt(&cfg, opt, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (opt) {
        case 'm': cfg.model_path = optarg; break;
        case 'i': in = optarg; break;
        case 'o': outp = optarg; break;
        case 3001:
            if (!strcmp(optarg, "alone")) mode = MODE_ALONE;
            else if (!strcmp(optarg, "batch")) mode = MODE_BATCH;
            else if (!strcmp(optarg, "decode")) mode = MODE_DECODE;
            else if (!strcmp(optarg, "chunk")) mode = MODE_CHUNK;
            else { fprintf(stderr, "spillway: --mode: alone|batch|decode|chunk\n"); return 2; }
            break;
        case 3002: if (cli_parse_int("--chunk", optarg, 1, 1 << 20, &chunk)) return 2; break;
        case 'h':
            printf("usage: spillway logits -m MODEL -i SEQS.txt -o OUT.f32 [--mode alone|batch|decode|chunk] [--chunk N]\n"
                   "  SEQS.txt: one sequence of space-separated token ids per line.\n"
                   "  OUT.f32: float32 logits, for each sequence, for each position, n_vocab values.\n"
                   "  alone: each sequence prefilled alone; batch: all prefilled in one step;\n"
                   "  decode: one token per sequence per step; chunk: N tokens per sequence per step.\n"
                   "Engine options (the workers' keys of the same name; here --kv-mem-mb is 64\n"
                   "unless given):\n");
            cli_engine_help(stdout);
            return 0;
        default: return 2;
        }
    }
    if (!cfg.model_path || !in || !outp) {
        fprintf(stderr, "usage: spillway logits -m MODEL -i SEQS.txt -o OUT.f32 (see --help)\n");
        return 2;
    }
    lseq_t *seqs = NULL;
    int ns = 0, rc = 1;
    if (read_seqs(in, &seqs, &ns) != 0) return 1;
    int total = 0;
    for (int s = 0; s < ns; s++) total += seqs[s].n;
    if (cfg.max_batch_tokens < total) cfg.max_batch_tokens = total;
    if (cfg.max_seqs < ns) cfg.max_seqs = ns;
    cfg.prefix_cache = 0;
    char err[512];
    engine_t *e = engine_new(&cfg, err, sizeof err);
    if (!e) {
        fprintf(stderr, "spillway: %s\n", err);
        goto out;
    }
    engine_info_t info;
    engine_info(e, &info);
    const size_t nv = (size_t)info.n_vocab;
    for (int s = 0; s < ns; s++) {
        seqs[s].n_blocks = (seqs[s].n + info.block_tokens - 1) / info.block_tokens;
        seqs[s].blocks = malloc(sizeof(int32_t) * (size_t)seqs[s].n_blocks);
        seqs[s].logits = malloc(sizeof(float) * nv * (size_t)seqs[s].n);
        if (!seqs[s].blocks || !seqs[s].logits ||
            engine_raw_alloc_blocks(e, seqs[s].n_blocks, seqs[s].blocks) != 0) {
            seqs[s].n_blocks = 0; /* nothing held */
            fprintf(stderr, "spillway: out of KV blocks or memory\n");
            goto out;
        }
    }
    float *buf = malloc(sizeof(float) * nv * (size_t)total);
    const int32_t **tk = malloc(sizeof *tk * (size_t)ns);
    const int32_t **tb = malloc(sizeof *tb * (size_t)ns);
    int *nn = malloc(sizeof *nn * (size_t)ns), *st = malloc(sizeof *st * (size_t)ns);
    int *idx = malloc(sizeof *idx * (size_t)ns);
    if (!buf || !tk || !tb || !nn || !st || !idx) goto out2;
    if (mode == MODE_ALONE) {
        for (int s = 0; s < ns; s++) {
            const int32_t *t0 = seqs[s].tok;
            const int32_t *b0 = seqs[s].blocks;
            int z = 0;
            if (engine_raw_forward(e, 1, &t0, &seqs[s].n, &z, &b0, seqs[s].logits, err, sizeof err)) {
                fprintf(stderr, "spillway: %s\n", err);
                goto out2;
            }
        }
    } else {
        int step_len = mode == MODE_BATCH ? 1 << 30 : mode == MODE_DECODE ? 1 : (int)chunk;
        int done_pos = 0;
        for (;;) {
            int k = 0;
            for (int s = 0; s < ns; s++) {
                if (done_pos >= seqs[s].n) continue;
                int len = seqs[s].n - done_pos < step_len ? seqs[s].n - done_pos : step_len;
                tk[k] = seqs[s].tok + done_pos;
                tb[k] = seqs[s].blocks;
                nn[k] = len;
                st[k] = done_pos;
                idx[k] = s;
                k++;
            }
            if (k == 0) break;
            if (engine_raw_forward(e, k, tk, nn, st, tb, buf, err, sizeof err)) {
                fprintf(stderr, "spillway: %s\n", err);
                goto out2;
            }
            size_t off = 0;
            for (int i = 0; i < k; i++) {
                memcpy(seqs[idx[i]].logits + (size_t)st[i] * nv, buf + off, sizeof(float) * nv * (size_t)nn[i]);
                off += nv * (size_t)nn[i];
            }
            done_pos += step_len > (1 << 29) ? (1 << 30) : step_len;
        }
    }
    FILE *f = fopen(outp, "wb");
    if (!f) {
        perror(outp);
        goto out2;
    }
    for (int s = 0; s < ns; s++) fwrite(seqs[s].logits, sizeof(float), nv * (size_t)seqs[s].n, f);
    if (fclose(f) != 0) {
        perror(outp);
        goto out2;
    }
    rc = 0;
out2:
    free(buf);
    free(tk);
    free(tb);
    free(nn);
    free(st);
    free(idx);
out:
    for (int s = 0; s < ns; s++) {
        if (e && seqs[s].blocks && seqs[s].n_blocks) engine_raw_free_blocks(e, seqs[s].n_blocks, seqs[s].blocks);
        free(seqs[s].tok);
        free(seqs[s].blocks);
        free(seqs[s].logits);
    }
    free(seqs);
    engine_free(e);
    return rc;
}
