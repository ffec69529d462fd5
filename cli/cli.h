/* cli/cli.h: the spillway command's subcommands. Each takes (argc, argv) with argv[0] the
 * subcommand name and returns the process exit code (0 ok, 1 failure, 2 usage error). */
#ifndef SPILLWAY_CLI_H
#define SPILLWAY_CLI_H

#include "engine/engine.h"

int cli_generate(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_mkmodel(int argc, char **argv);
int cli_logits(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_config(int argc, char **argv);
int cli_worker(int argc, char **argv);
int cli_demo(int argc, char **argv);
int cli_produce(int argc, char **argv);
int cli_collect(int argc, char **argv);
int cli_batch(int argc, char **argv);
int cli_top(int argc, char **argv);
int cli_plan(int argc, char **argv);

/* The worker's configuration from the command line (cli/config.c): defaults, then -c FILE, then
 * SPILLWAY_* environment, then options. 0: cfg filled (caller frees with worker_config_free);
 * 1: --help printed (exit 0); 2: usage or value error (printed). *list_keys (may be NULL) is set
 * when --keys was given. */
#include "worker/worker.h"
int cli_worker_config(int argc, char **argv, worker_config_t *cfg, int *list_keys);

/* Shared engine options (--threads, --kv-type, ...): returns 1 if opt was one and stored it in
 * cfg, 0 if not, -1 for a bad value (message printed). */
int cli_engine_opt(engine_config_t *cfg, int opt, const char *arg);
/* getopt_long entries for cli_engine_opt, to append to a command's table. */
#define CLI_ENGINE_LONGOPTS                                 \
    {"threads", required_argument, 0, 1001},                \
    {"kv-type", required_argument, 0, 1002},                \
    {"block-tokens", required_argument, 0, 1003},           \
    {"batch-tokens", required_argument, 0, 1004},           \
    {"max-seqs", required_argument, 0, 1005},               \
    {"kv-mem-mb", required_argument, 0, 1006},              \
    {"kv-blocks", required_argument, 0, 1007},              \
    {"ctx", required_argument, 0, 1008},                    \
    {"no-prefix-cache", no_argument, 0, 1009}
#define CLI_ENGINE_HELP                                                                   \
    "  --threads N        compute threads (default: one per CPU)\n"                       \
    "  --kv-type T        KV cache type f16|f32 (default f16)\n"                         \
    "  --block-tokens B   tokens per KV block (default 16)\n"                            \
    "  --batch-tokens N   tokens per forward step (default 512)\n"                       \
    "  --max-seqs N       sequences running at once (default 64)\n"                      \
    "  --kv-mem-mb N      KV pool size in MiB (default 1024)\n"                          \
    "  --kv-blocks N      KV pool size in blocks (overrides --kv-mem-mb)\n"              \
    "  --ctx N            context limit per sequence (default: the model's)\n"           \
    "  --no-prefix-cache  do not reuse cached prompt blocks\n"

/* Parses a non-negative int / double; 0 ok, -1 bad (message printed naming opt). */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_double(const char *opt, const char *s, double *out);

/* The Kafka key of request r for prefix affinity: XXH64 of the first `prefix` bytes of its prompt
 * (prompt text, or "role\x1fcontent\x1e" per message), as 16 hex digits into key (cap >= 17).
 * 0, or -1 when r has neither prompt nor messages. */
#include <jansson.h>
int cli_prompt_key(const json_t *r, long prefix, char *key, size_t cap);

#endif
