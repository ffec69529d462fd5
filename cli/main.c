/* cli/main.c: the `spillway` command: generate, inspect, mkmodel, logits, plan, ...
 * Built with SPILLWAY_ENGINE_ONLY (CMake option of that name), it has the engine's subcommands
 * only, and the files of the others are not linked. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "engine/engine.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: spillway COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  generate  -m MODEL (-p PROMPT | -f PROMPTS.jsonl) [options]  generate completions\n"
            "  inspect   MODEL                                  metadata, tensors, KV bytes per token\n"
            "  mkmodel   -o FILE [--preset NAME] [shape options] write a synthetic GGUF model\n"
            "  logits    -m MODEL -i SEQS.txt -o OUT.f32 [--mode M] dump logits (tests)\n"
            "  eval      -m MODEL -f TEXT [--ctx N] [--stride S] perplexity of a model on a text\n"
#ifndef SPILLWAY_ENGINE_ONLY
            "  worker    [-c FILE] [-X PROP=V] [-s KEY=V] ...  run a worker: Kafka prompts in, results out\n"
            "  config    [-c FILE] [-X PROP=V] [-s KEY=V]     print the worker's effective settings\n"
            "  demo      [-m MODEL] [-n N]                    worker on an in-process mock Kafka cluster\n"
            "  produce   -b BROKERS -t TOPIC [FILE|-]         send spillway / OpenAI Batch JSONL prompts\n"
            "  collect   -b BROKERS -t TOPIC (--ids F|--count N) [-o F] [--openai]  read results\n"
            "  batch     -b BROKERS FILE  run an OpenAI Batch file: output + error files, resumable\n"
            "  top       [URL] [--interval S] [--once]        live view of a worker's /metrics\n"
#endif
            "  plan      -m MODEL [--gpu-mem S] [--kv-mem S] [--host-arena S] [--json]  memory plan\n"
            "\n"
            "Run 'spillway COMMAND --help' for the options of a command.\n");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "generate")) return cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cli_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "mkmodel")) return cli_mkmodel(argc - 1, argv + 1);
    if (!strcmp(cmd, "logits")) return cli_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cli_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return cli_plan(argc - 1, argv + 1);
#ifndef SPILLWAY_ENGINE_ONLY
    if (!strcmp(cmd, "config")) return cli_config(argc - 1, argv + 1);
    if (!strcmp(cmd, "worker")) return cli_worker(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return cli_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "produce")) return cli_produce(argc - 1, argv + 1);
    if (!strcmp(cmd, "collect")) return cli_collect(argc - 1, argv + 1);
    if (!strcmp(cmd, "batch")) return cli_batch(argc - 1, argv + 1);
    if (!strcmp(cmd, "top")) return cli_top(argc - 1, argv + 1);
#endif
    fprintf(stderr, "spillway: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
