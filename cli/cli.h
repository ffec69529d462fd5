/* cli/cli.h: the spillway command's subcommands. Each takes (argc, argv) with argv[0] the
 * subcommand name and returns the process exit code (0 ok, 1 failure, 2 usage error). */
#ifndef SPILLWAY_CLI_H
#define SPILLWAY_CLI_H

#include <stdio.h>

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
 * 1: --help printed (exit 0); 2: usage or value error (printed). *list_keys (may be NULL) gets
 * 1 for --keys, 2 for --check, 4 for --markdown (`spillway config` only). */
#include "worker/worker.h"
int cli_worker_config(int argc, char **argv, worker_config_t *cfg, int *list_keys);

/* Shared engine options (--threads, --kv-type, ...), each the flag of one worker key (the key
 * table, worker/config.c: same range, choices and help): returns 1 if opt was one and stored it
 * in cfg (kv_type points into arg), 0 if not, -1 for a bad value (message printed). */
int cli_engine_opt(engine_config_t *cfg, int opt, const char *arg);
/* Prints the help lines of the engine options, from the key table. */
void cli_engine_help(FILE *f);
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

/* A flag that sets worker key `key`: parses arg as worker_config_set would (range, choices),
 * printing an error naming flag and the key; 0 and *num (may be NULL), or -1. */
int cli_parse_key(const char *flag, const char *key, const char *arg, long *num);
/* Prints lead, then text from column indent on, wrapped at 100 columns (continuation lines
 * indented by indent; text on the next line when lead reaches indent). */
void cli_wrap(FILE *f, const char *lead, int indent, const char *text);
/* Prints the help line of such a flag ("--flag ARG"): the key's help (or meaning, when not NULL),
 * then "[key; default D; values]". */
void cli_key_help(FILE *f, const char *flag, const char *key, const char *meaning);

/* Parses a non-negative int / double; 0 ok, -1 bad (message printed naming opt). */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_double(const char *opt, const char *s, double *out);

#endif
