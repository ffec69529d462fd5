/* cli/worker.c: `spillway worker`: runs one worker of the consumer group until SIGTERM/SIGINT,
 * then drains (see worker/worker.h); SIGUSR1 logs the stats line (counters and where the time
 * went) without stopping; SIGHUP reloads the models (the command line, -c file and environment
 * are read again for `models`, `model` and `model.default`; worker_set_reload). Exit status 0 after a clean drain, 1 on a fatal error (a
 * supervisor restarts the process), 2 on a usage or configuration error. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "worker/worker.h"

/* Set by the signal handlers; the flags the worker loop polls (owned by this command). */
static volatile sig_atomic_t stop_flag, stats_flag, reload_flag;

static void on_signal(int sig)
{
    if (sig == SIGUSR1) stats_flag = 1;
    else if (sig == SIGHUP) reload_flag = 1;
    else stop_flag = 1;
}

typedef struct {
    int argc;
    char **argv;
} cli_args_t;

/* worker_reload_fn: the configuration as at start, read again. */
static int reload_config(void *arg, worker_config_t *out, char *errstr, size_t errlen)
{
    const cli_args_t *a = arg;
    if (cli_worker_config(a->argc, a->argv, out, NULL)) {
        snprintf(errstr, errlen, "the configuration does not parse (see the line above)");
        return -1;
    }
    return 0;
}

int cli_worker(int argc, char **argv)
{
    worker_config_t cfg;
    char err[512];
    int rc = cli_worker_config(argc, argv, &cfg, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (worker_config_check(&cfg, err, sizeof err)) {
        fprintf(stderr, "spillway worker: %s\n", err);
        worker_config_free(&cfg);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    worker_t *w = worker_new(&cfg, err, sizeof err);
    worker_config_free(&cfg);
    if (!w) {
        fprintf(stderr, "spillway worker: %s\n", err);
        return 1;
    }
    worker_set_stats_flag(w, &stats_flag);
    cli_args_t args = {argc, argv};
    worker_set_reload(w, &reload_flag, reload_config, &args);
    rc = worker_run(w, &stop_flag, err, sizeof err) ? 1 : 0;
    if (rc) fprintf(stderr, "spillway worker: fatal: %s\n", err);
    worker_free(w);
    return rc;
}
