/* cli/config.c: the worker's command-line configuration (shared by `spillway worker`, `spillway
 * config` and `spillway demo`) and the `spillway config` command, which prints the effective
 * value of every key and where it came from.
 *
 * Precedence, lowest first: defaults, -c FILE, SPILLWAY_* environment, command-line options. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "worker/worker.h"

typedef struct {
    int kind; /* 0: key=value, 1: -X property, 2: shortcut key */
    const char *key;
    const char *arg;
} pending_t;

/* The options that set one key each: their help is the key's, from the key table. */
static const struct {
    const char *opt, *key;
} SHORTCUTS[] = {
    {"-b, --brokers BROKERS", "brokers"},    {"-t, --topics TOPICS", "input.topics"},
    {"-o, --output TOPIC", "output.topic"},  {"-d, --dlq TOPIC", "dlq.topic"},
    {"-g, --group GROUP", "group.id"},       {"-m, --model MODEL", "model"},
    {"-i, --id NAME", "worker.id"},          {"--exactly-once", "delivery"},
};

static void config_usage(FILE *f, const char *cmd)
{
    int is_config = !strcmp(cmd, "config");
    fprintf(f,
            "usage: spillway %s [options]\n"
            "  -c FILE                  key=value config file (kafka.* keys pass to librdkafka)\n"
            "  -X PROP=VALUE            librdkafka property (consumer.PROP / producer.PROP for\n"
            "                           one client)\n"
            "  -s KEY=VALUE             set a worker key (see 'spillway config --keys')\n",
            cmd);
    for (size_t i = 0; i < sizeof SHORTCUTS / sizeof SHORTCUTS[0]; i++) {
        worker_config_key_t k;
        if (worker_config_key(worker_config_find_key(SHORTCUTS[i].key), &k)) continue;
        char lead[64], text[1024];
        snprintf(lead, sizeof lead, "  %s", SHORTCUTS[i].opt);
        if (!strcmp(k.name, "delivery")) snprintf(text, sizeof text, "delivery=exactly-once");
        else snprintf(text, sizeof text, "%s: %s", k.name, k.help);
        cli_wrap(f, lead, 27, text);
    }
    if (is_config)
        fprintf(f, "  --keys                   list the keys: key = default  # meaning [values]\n"
                   "  --markdown               the keys as the README's configuration reference\n"
                   "  --check                  also validate the values as the worker would; exit 1\n"
                   "                           if not\n");
    fprintf(f, "Environment: SPILLWAY_<KEY> (upper case, '.' -> '_'), e.g. SPILLWAY_BATCH_MAX_SEQS.\n");
}

int cli_worker_config(int argc, char **argv, worker_config_t *cfg, int *list_keys)
{
    static const struct option longopts[] = {
        {"config", required_argument, 0, 'c'}, {"set", required_argument, 0, 's'},
        {"brokers", required_argument, 0, 'b'}, {"topics", required_argument, 0, 't'},
        {"output", required_argument, 0, 'o'}, {"dlq", required_argument, 0, 'd'},
        {"group", required_argument, 0, 'g'}, {"model", required_argument, 0, 'm'},
        {"exactly-once", no_argument, 0, 'E'}, {"id", required_argument, 0, 'i'},
        {"keys", no_argument, 0, 'K'},
        {"check", no_argument, 0, 'C'}, {"markdown", no_argument, 0, 'M'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    char err[512];
    const char *file = NULL;
    pending_t *ops = calloc((size_t)argc + 1, sizeof *ops);
    int n_ops = 0, rc = 2, opt;
    if (!ops || worker_config_default(cfg)) {
        free(ops);
        fprintf(stderr, "spillway: out of memory\n");
        return 2;
    }
    if (list_keys) *list_keys = 0;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "c:X:s:b:t:o:d:g:m:i:h", longopts, NULL)) != -1) {
        pending_t *p = &ops[n_ops];
        switch (opt) {
        case 'c': file = optarg; break;
        case 'X': *p = (pending_t){1, NULL, optarg}; n_ops++; break;
        case 's': *p = (pending_t){0, NULL, optarg}; n_ops++; break;
        case 'b': *p = (pending_t){2, "brokers", optarg}; n_ops++; break;
        case 't': *p = (pending_t){2, "input.topics", optarg}; n_ops++; break;
        case 'o': *p = (pending_t){2, "output.topic", optarg}; n_ops++; break;
        case 'd': *p = (pending_t){2, "dlq.topic", optarg}; n_ops++; break;
        case 'g': *p = (pending_t){2, "group.id", optarg}; n_ops++; break;
        case 'm': *p = (pending_t){2, "model", optarg}; n_ops++; break;
        case 'i': *p = (pending_t){2, "worker.id", optarg}; n_ops++; break;
        case 'E': *p = (pending_t){2, "delivery", "exactly-once"}; n_ops++; break;
        case 'K':
        case 'C':
        case 'M':
            if (!list_keys) { /* `spillway config` only */
                config_usage(stderr, argv[0]);
                goto fail;
            }
            *list_keys |= opt == 'K' ? 1 : opt == 'C' ? 2 : 4;
            break;
        case 'h': config_usage(stdout, argv[0]); rc = 1; goto fail;
        default: config_usage(stderr, argv[0]); goto fail;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "spillway %s: unexpected argument '%s'\n", argv[0], argv[optind]);
        goto fail;
    }
    if (file && worker_config_load_file(cfg, file, err, sizeof err)) goto bad;
    if (worker_config_load_env(cfg, err, sizeof err)) goto bad;
    for (int i = 0; i < n_ops; i++) {
        pending_t *p = &ops[i];
        if (p->kind == 1) {
            if (worker_config_add_kafka(cfg, p->arg, "cli", err, sizeof err)) goto bad;
        } else if (p->kind == 2) {
            if (worker_config_set(cfg, p->key, p->arg, "cli", err, sizeof err)) goto bad;
        } else {
            const char *eq = strchr(p->arg, '=');
            if (!eq) {
                snprintf(err, sizeof err, "-s %s: expected key=value", p->arg);
                goto bad;
            }
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)(eq - p->arg), p->arg);
            if (worker_config_set(cfg, key, eq + 1, "cli", err, sizeof err)) goto bad;
        }
    }
    free(ops);
    return 0;
bad:
    fprintf(stderr, "spillway %s: %s\n", argv[0], err);
fail:
    free(ops);
    worker_config_free(cfg);
    return rc;
}

/* The values column of key k: its range, or its choices. */
static void key_values(const worker_config_key_t *k, const char *bar, char *buf, size_t cap)
{
    buf[0] = 0;
    if (k->integer) {
        if (k->hi == LONG_MAX) snprintf(buf, cap, ">= %ld", k->lo);
        else snprintf(buf, cap, "%ld..%ld", k->lo, k->hi);
    } else if (k->real) {
        snprintf(buf, cap, "%g..%g", k->real_lo, k->real_hi);
    } else if (k->choices) {
        size_t j = 0;
        for (const char *p = k->choices; *p && j + 8 < cap; p++)
            j += (size_t)snprintf(buf + j, cap - j, "%s", *p == '|' ? bar : (char[2]){*p, 0});
    }
}

/* text with '|' escaped for a Markdown table cell */
static void md_cell(FILE *out, const char *text)
{
    for (const char *p = text; *p; p++) {
        if (*p == '|') fputc('\\', out);
        fputc(*p, out);
    }
}

/* One table per module section, in table order: key, default, values, meaning. */
static void print_markdown(FILE *out)
{
    const char *section = NULL;
    char values[256];
    for (int i = 0; i < worker_config_n_keys(); i++) {
        worker_config_key_t k;
        worker_config_key(i, &k);
        if (!section || strcmp(section, k.section)) {
            section = k.section;
            fprintf(out, "%s#### %s\n\n| key | default | values | meaning |\n|---|---|---|---|\n",
                    i ? "\n" : "", section);
        }
        key_values(&k, " | ", values, sizeof values);
        fprintf(out, "| `%s` | ", k.name);
        if (*k.def) {
            fputc('`', out);
            md_cell(out, k.def);
            fputc('`', out);
        } else {
            fputs("(empty)", out);
        }
        fputs(" | ", out);
        md_cell(out, values);
        fputs(" | ", out);
        md_cell(out, k.help);
        fputs(" |\n", out);
    }
}

/* key = default  # meaning [values] */
static void print_keys(FILE *out)
{
    char values[256];
    for (int i = 0; i < worker_config_n_keys(); i++) {
        worker_config_key_t k;
        worker_config_key(i, &k);
        key_values(&k, "|", values, sizeof values);
        fprintf(out, "%-31s = %-16s # %s%s%s%s\n", k.name, *k.def ? k.def : "\"\"", k.help,
                *values ? " [" : "", values, *values ? "]" : "");
    }
}

int cli_config(int argc, char **argv)
{
    worker_config_t cfg;
    int keys = 0;
    int rc = cli_worker_config(argc, argv, &cfg, &keys);
    if (rc) return rc == 1 ? 0 : rc;
    if (keys & 4) {
        print_markdown(stdout);
    } else if (keys & 1) {
        print_keys(stdout);
    } else {
        worker_config_print(&cfg, stdout);
    }
    rc = 0;
    char err[512];
    if ((keys & 2) && worker_config_check(&cfg, err, sizeof err)) {
        fprintf(stderr, "spillway config: %s\n", err);
        rc = 1;
    }
    worker_config_free(&cfg);
    return rc;
}
