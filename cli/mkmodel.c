/* cli/mkmodel.c: `spillway mkmodel`: writes a synthetic GGUF model with chosen shapes, dtype and
 * seeded random weights (tools/mkmodel.h), for tests and benchmarks; with --from, converts an
 * existing model's matrices to another dtype (mkmodel_convert). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "tools/mkmodel.h"

int cli_mkmodel(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"output", required_argument, 0, 'o'},
        {"preset", required_argument, 0, 4001},
        {"arch", required_argument, 0, 4002},
        {"dim", required_argument, 0, 4003},
        {"layers", required_argument, 0, 4004},
        {"heads", required_argument, 0, 4005},
        {"kv-heads", required_argument, 0, 4006},
        {"ffn", required_argument, 0, 4007},
        {"vocab", required_argument, 0, 4008},
        {"vocab-from", required_argument, 0, 4090},
        {"ctx", required_argument, 0, 4009},
        {"dtype", required_argument, 0, 4010},
        {"tied", no_argument, 0, 4011},
        {"untied", no_argument, 0, 4012},
        {"seed", required_argument, 0, 4013},
        {"rope-theta", required_argument, 0, 4014},
        {"norm-eps", required_argument, 0, 4015},
        {"from", required_argument, 0, 4016},
        {"pad", required_argument, 0, 4017},
        {"quantiser", required_argument, 0, 4018},
        {"head-dim", required_argument, 0, 4019},
        {"sliding-window", required_argument, 0, 4020},
        {"swa-pattern", required_argument, 0, 4021},
        {"rope-theta-swa", required_argument, 0, 4022},
        {"attn-softcap", required_argument, 0, 4023},
        {"logit-softcap", required_argument, 0, 4024},
        {"rope-scaling", required_argument, 0, 4025},
        {"rope-factor", required_argument, 0, 4026},
        {"rope-orig-ctx", required_argument, 0, 4027},
        {"rope-attn-factor", required_argument, 0, 4028},
        {"experts", required_argument, 0, 4029},
        {"experts-used", required_argument, 0, 4030},
        {"expert-ffn", required_argument, 0, 4031},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    mkmodel_params_t p;
    mkmodel_preset("tiny", &p);
    const char *out = NULL, *from = NULL;
    int dtype_given = 0, shape_given = 0;
    mkmodel_convert_t conv = {.dtype = DT_F16, .pad = 0, .quant = MKMODEL_QUANT_IMPORTANCE};
    int quant_given = 0;
    int tied_given = 0;
    long v;
    double d;
    int opt;
    /* The preset is applied first wherever it appears, so other flags override it. */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--preset") && mkmodel_preset(argv[i + 1], &p) != 0) {
            fprintf(stderr, "spillway: unknown preset '%s'; presets: %s\n", argv[i + 1], MKMODEL_PRESETS);
            return 2;
        }
    optind = 1;
    while ((opt = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'o': out = optarg; break;
        case 4001: break;
        case 4002:
            if (!strcmp(optarg, "llama")) p.arch = ARCH_LLAMA;
            else if (!strcmp(optarg, "qwen2")) p.arch = ARCH_QWEN2;
            else if (!strcmp(optarg, "qwen3")) p.arch = ARCH_QWEN3;
            else if (!strcmp(optarg, "gemma2")) p.arch = ARCH_GEMMA2;
            else if (!strcmp(optarg, "gemma3")) p.arch = ARCH_GEMMA3;
            else if (!strcmp(optarg, "phi3")) p.arch = ARCH_PHI3;
            else if (!strcmp(optarg, "qwen2moe")) p.arch = ARCH_QWEN2MOE;
            else if (!strcmp(optarg, "qwen3moe")) p.arch = ARCH_QWEN3MOE;
            else {
                fprintf(stderr, "spillway: --arch: llama, qwen2, qwen3, gemma2, gemma3, phi3, "
                        "qwen2moe or qwen3moe\n");
                return 2;
            }
            break;
        case 4019: if (cli_parse_int("--head-dim", optarg, 2, 1024, &v)) return 2; p.head_dim = (int)v; break;
        case 4020: if (cli_parse_int("--sliding-window", optarg, 1, 1 << 30, &v)) return 2; p.swa_window = (int)v; break;
        case 4021: if (cli_parse_int("--swa-pattern", optarg, 1, 1 << 20, &v)) return 2; p.swa_pattern = (int)v; break;
        case 4022: if (cli_parse_double("--rope-theta-swa", optarg, &d)) return 2; p.rope_theta_swa = (float)d; break;
        case 4023: if (cli_parse_double("--attn-softcap", optarg, &d)) return 2; p.attn_softcap = (float)d; break;
        case 4024: if (cli_parse_double("--logit-softcap", optarg, &d)) return 2; p.logit_softcap = (float)d; break;
        case 4025: p.rope_scaling = optarg; break;
        case 4026: if (cli_parse_double("--rope-factor", optarg, &d)) return 2; p.rope_factor = (float)d; break;
        case 4027: if (cli_parse_int("--rope-orig-ctx", optarg, 1, 1 << 30, &v)) return 2; p.rope_orig_ctx = (int)v; break;
        case 4028: if (cli_parse_double("--rope-attn-factor", optarg, &d)) return 2; p.rope_attn_factor = (float)d; break;
        case 4003: if (cli_parse_int("--dim", optarg, 2, 1 << 16, &v)) return 2; p.dim = (int)v; break;
        case 4004: if (cli_parse_int("--layers", optarg, 1, 1024, &v)) return 2; p.n_layers = (int)v; break;
        case 4005: if (cli_parse_int("--heads", optarg, 1, 1024, &v)) return 2; p.n_heads = (int)v; break;
        case 4006: if (cli_parse_int("--kv-heads", optarg, 1, 1024, &v)) return 2; p.n_kv_heads = (int)v; break;
        case 4007: if (cli_parse_int("--ffn", optarg, 1, 1 << 20, &v)) return 2; p.ffn_dim = (int)v; break;
        case 4008: if (cli_parse_int("--vocab", optarg, MKMODEL_MIN_VOCAB, 1 << 24, &v)) return 2; p.n_vocab = (int)v; break;
        case 4090: {
            char verr[256];
            int nv = mkmodel_vocab_size(optarg, verr, sizeof verr);
            if (nv < 0) { fprintf(stderr, "spillway: --vocab-from: %s\n", verr); return 2; }
            p.vocab_from = optarg;
            p.n_vocab = nv;
            break;
        }
        case 4009: if (cli_parse_int("--ctx", optarg, 1, 1 << 30, &v)) return 2; p.ctx_len = (int)v; break;
        case 4010:
            if (!strcmp(optarg, "f32")) p.dtype = DT_F32;
            else if (!strcmp(optarg, "f16")) p.dtype = DT_F16;
            else if (!strcmp(optarg, "bf16")) p.dtype = DT_BF16;
            else if (!strcmp(optarg, "q8_0")) p.dtype = DT_Q8_0;
            else if (!strcmp(optarg, "q4_0")) p.dtype = DT_Q4_0;
            else if (!strcmp(optarg, "q4_k") || !strcmp(optarg, "q4_K")) p.dtype = DT_Q4_K;
            else if (!strcmp(optarg, "q5_k") || !strcmp(optarg, "q5_K")) p.dtype = DT_Q5_K;
            else if (!strcmp(optarg, "q6_k") || !strcmp(optarg, "q6_K")) p.dtype = DT_Q6_K;
            else if (!strcmp(optarg, "q4_1")) p.dtype = DT_Q4_1;
            else if (!strcmp(optarg, "q5_0")) p.dtype = DT_Q5_0;
            else if (!strcmp(optarg, "q5_1")) p.dtype = DT_Q5_1;
            else if (!strcmp(optarg, "iq4_nl")) p.dtype = DT_IQ4_NL;
            else if (!strcmp(optarg, "iq4_xs")) p.dtype = DT_IQ4_XS;
            else if (!strcmp(optarg, "q3_k") || !strcmp(optarg, "q3_K")) p.dtype = DT_Q3_K;
            else if (!strcmp(optarg, "q2_k") || !strcmp(optarg, "q2_K")) p.dtype = DT_Q2_K;
            else { fprintf(stderr, "spillway: --dtype: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q3_k or q2_k\n"); return 2; }
            dtype_given = 1;
            break;
        case 4016: from = optarg; break;
        case 4017: if (cli_parse_int("--pad", optarg, 1, 65536, &v)) return 2; conv.pad = (int)v; break;
        case 4018:
            if (!strcmp(optarg, "importance")) conv.quant = MKMODEL_QUANT_IMPORTANCE;
            else if (!strcmp(optarg, "ggml")) conv.quant = MKMODEL_QUANT_GGML;
            else { fprintf(stderr, "spillway: --quantiser: importance or ggml\n"); return 2; }
            quant_given = 1;
            break;
        case 4029: if (cli_parse_int("--experts", optarg, 0, MODEL_MAX_EXPERTS, &v)) return 2; p.n_expert = (int)v; break;
        case 4030: if (cli_parse_int("--experts-used", optarg, 1, MODEL_MAX_EXPERTS_USED, &v)) return 2; p.n_expert_used = (int)v; break;
        case 4031: if (cli_parse_int("--expert-ffn", optarg, 1, 1 << 20, &v)) return 2; p.expert_ffn_dim = (int)v; break;
        case 4011: p.tied = 1; tied_given = 1; break;
        case 4012: p.tied = 0; tied_given = 1; break;
        case 4013: if (cli_parse_int("--seed", optarg, 0, 1L << 62, &v)) return 2; p.seed = (uint64_t)v; break;
        case 4014: if (cli_parse_double("--rope-theta", optarg, &d)) return 2; p.rope_theta = (float)d; break;
        case 4015: if (cli_parse_double("--norm-eps", optarg, &d)) return 2; p.norm_eps = (float)d; break;
        case 'h':
            printf("usage: spillway mkmodel -o FILE [--preset NAME] [options]\n"
                   "  --preset NAME   %s (default tiny); later flags override it\n"
                   "  --arch A        llama | qwen2 | qwen3 | gemma2 | gemma3 | phi3 | qwen2moe |\n"
                   "                  qwen3moe\n"
                   "  --dim N --layers N --heads N --kv-heads N --ffn N --vocab N --ctx N\n"
                   "  --vocab-from GGUF  copy that file's tokenizer (e.g. a BPE vocabulary of\n"
                   "                  /work/shared/models/tokenizer-vectors); sets --vocab\n"
                   "  --dtype T       f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q5_k | q6_k | q4_1 |\n"
                   "                  q5_0 | q5_1 | iq4_nl | iq4_xs | q3_k | q2_k (matrices; norms\n"
                   "                  stay f32; K-quant matrices whose rows are not a multiple of\n"
                   "                  256 fall back: q4_k, q3_k and q2_k to q4_0, q5_k and q6_k to\n"
                   "                  q8_0, iq4_xs to iq4_nl)\n"
                   "  --tied | --untied   share the output matrix with the embedding or not\n"
                   "  --seed N --rope-theta F --norm-eps F\n"
                   "  optional keys (not written unless given; the architecture's defaults apply):\n"
                   "  --head-dim N    attention.key_length (n_heads x N may differ from dim)\n"
                   "  --sliding-window N --swa-pattern N --rope-theta-swa F\n"
                   "  --attn-softcap F --logit-softcap F   gemma2's soft-caps (llama.cpp: 50, 30)\n"
                   "  --rope-scaling linear|yarn|llama3|longrope (longrope writes seeded\n"
                   "                  rope_factors_long/short) --rope-factor F --rope-orig-ctx N\n"
                   "  --rope-attn-factor F\n"
                   "  --experts N --experts-used K [--expert-ffn N]   mixture of experts: N\n"
                   "                  experts, top-K routing (llama: Mixtral-style, experts of\n"
                   "                  --ffn; qwen2moe/qwen3moe: experts of --expert-ffn, default\n"
                   "                  --ffn; qwen2moe's shared expert has --ffn)\n"
                   "\n"
                   "usage: spillway mkmodel --from MODEL.gguf --dtype T -o FILE [--pad N]\n"
                   "                [--quantiser Q]\n"
                   "  converts an existing model: every 2-D matrix re-rounded to T; a matrix whose\n"
                   "  rows do not fit T's block falls back (q4_k, q3_k, q2_k -> q4_0, q5_k and\n"
                   "  q6_k -> q8_0, iq4_xs -> iq4_nl, then its own type), each\n"
                   "  one reported on stderr.\n"
                   "  --pad N         pad embedding and FFN sizes with zeros to multiples of N (an\n"
                   "                  equivalent model whose matrices fit the blocks, e.g. 256)\n"
                   "  --quantiser Q   importance (default): q4_0 / q4_k rounding weighted by each\n"
                   "                  input lane's expected square, estimated from the model's\n"
                   "                  own norms and matrices; ggml: ggml's reference quantisers\n"
                   "                  (llama-quantize's bytes without an importance matrix)\n",
                   MKMODEL_PRESETS);
            return 0;
        default: return 2;
        }
        if ((opt >= 4001 && opt <= 4015 && opt != 4010) || (opt >= 4019 && opt <= 4031))
            shape_given = 1;
    }
    /* Gemma 2 files tie the output projection to token_embd: llama.cpp's gemma2 loader reads no
     * output.weight and refuses a file holding one */
    if (p.arch == ARCH_GEMMA2 && !tied_given) p.tied = 1;
    if (from) {
        if (!out || optind != argc || !dtype_given || shape_given) {
            fprintf(stderr, "usage: spillway mkmodel --from MODEL.gguf --dtype T -o FILE [--pad N] "
                    "[--quantiser Q] (no shape options)\n");
            return 2;
        }
        conv.dtype = p.dtype;
        char err[512];
        if (mkmodel_convert(from, out, &conv, stderr, err, sizeof err) != 0) {
            fprintf(stderr, "spillway: %s\n", err);
            return 1;
        }
        return 0;
    }
    if (conv.pad || quant_given) {
        fprintf(stderr, "spillway: --pad and --quantiser apply to --from only (synthetic models are "
                "rounded with ggml's reference quantisers)\n");
        return 2;
    }
    if (!out || optind != argc) {
        fprintf(stderr, "usage: spillway mkmodel -o FILE [--preset NAME] [options] (see --help)\n");
        return 2;
    }
    char err[512];
    if (mkmodel_write(&p, out, err, sizeof err) != 0) {
        fprintf(stderr, "spillway: %s\n", err);
        return 1;
    }
    return 0;
}
