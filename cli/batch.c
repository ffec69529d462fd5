/* cli/batch.c: `spillway batch -b BROKERS [options] FILE`: runs an OpenAI Batch input file end to
 * end. Converts each line (consumer/openai_batch.h), produces the requests to the input topic
 * (routed by --route as `spillway produce` routes), follows the results and dead-letter topics and
 * writes the Batch output file (one line per completed request) and error file (one line per
 * refused, dead-lettered or expired request), as OpenAI's Batch API writes them.
 *
 * Resumable. The state file (OUTPUT.state, replaced atomically) holds the batch id, the input's
 * size and hash, the results/DLQ topics' end offsets taken before anything was produced, and how
 * many lines are known to be delivered to Kafka. What is done is what the two files hold: on start
 * they are read back (a last line without its newline, cut by a crash, is truncated away) and
 * their custom_ids are done. Then the lines not delivered before and not done are produced, and
 * the results/DLQ topics are read from the saved offsets, so results of requests sent by an
 * earlier run are used too; a result for a line already done (at-least-once repeats, or a line
 * sent twice because a crash came between delivery and the state update) is skipped. So a line
 * is never written twice, and a crash at any point loses at most work, never a line.
 *
 * Request ids on Kafka are BATCHID:LINE (LINE = the 1-based line number in the input), so
 * results of other batches sharing the topics are ignored. Exit 0 when every line has its output
 * or error line, 1 on --timeout or a fatal error, 2 on usage / a bad input file, 130 after
 * SIGINT/SIGTERM (state saved: run again to resume). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli.h"
#include "cli_route.h"
#include "common/clock.h"
#include "consumer/json_text.h"
#include "consumer/openai_batch.h"

#define MAX_PARTS 1024 /* partitions per topic followed */

static volatile sig_atomic_t batch_stop;
static void batch_on_signal(int sig)
{
    (void)sig;
    batch_stop = 1;
}

typedef struct {
    oai_line_t l;
    long lineno;       /* 1-based line number in the input */
    int rc;            /* oai_line_convert's */
    unsigned char done, delivered;
} bline_t;

typedef struct {
    int n;
    int64_t off[MAX_PARTS];
} offsets_t;

typedef struct {
    /* options */
    const char *brokers, *in_topic, *res_topic, *dlq_topic, *in_path;
    char out_path[4096], err_path[4096], state_path[4200];
    long timeout, ttl_ms, progress_s;
    cli_route_t route;
    /* input */
    bline_t *lines;
    long n_lines;
    uint64_t in_hash;
    long long in_bytes;
    long *by_cid; /* line indexes sorted by custom_id (lines with one) */
    long n_cid;
    /* state */
    char batch_id[32];
    offsets_t res_from, dlq_from;
    long produced; /* lines [0, produced) known delivered by an earlier state save */
    /* progress */
    long done, failed, done_before, tokens;
    FILE *out, *err;
    rd_kafka_t *prod, *cons;
} batch_t;

/* ---- input ---- */

static int cmp_cid(const void *a, const void *b, void *ctx)
{
    const batch_t *B = ctx;
    return strcmp(B->lines[*(const long *)a].l.custom_id, B->lines[*(const long *)b].l.custom_id);
}

static long find_cid(const batch_t *B, const char *cid)
{
    long lo = 0, hi = B->n_cid;
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (strcmp(B->lines[B->by_cid[mid]].l.custom_id, cid) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < B->n_cid && !strcmp(B->lines[B->by_cid[lo]].l.custom_id, cid) ? B->by_cid[lo] : -1;
}

/* Reads and converts the input. A line without a custom_id or a custom_id twice refuses the
 * whole file (as OpenAI does): 2. */
static int load_input(batch_t *B)
{
    FILE *f = fopen(B->in_path, "r");
    if (!f) {
        fprintf(stderr, "spillway batch: %s: %s\n", B->in_path, strerror(errno));
        return 2;
    }
    XXH64_state_t *hs = XXH64_createState();
    XXH64_reset(hs, 0);
    char *line = NULL;
    size_t cap = 0, lcap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        lineno++;
        XXH64_update(hs, line, (size_t)len);
        B->in_bytes += len;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        if ((size_t)B->n_lines == lcap) {
            lcap = lcap ? lcap * 2 : 1024;
            bline_t *nl = realloc(B->lines, lcap * sizeof *nl);
            if (!nl) goto oom;
            B->lines = nl;
        }
        bline_t *bl = &B->lines[B->n_lines];
        memset(bl, 0, sizeof *bl);
        bl->lineno = lineno;
        char id[64];
        snprintf(id, sizeof id, "%s:%ld", B->batch_id, lineno);
        bl->rc = oai_line_convert(line, (size_t)len, id, &bl->l);
        B->n_lines++;
        if (bl->rc == -2) goto oom;
        if (!bl->l.custom_id) {
            fprintf(stderr, "spillway batch: %s line %ld: %s; the file is refused\n", B->in_path,
                    lineno, bl->l.err_msg);
            rc = 2;
            goto done;
        }
        if (bl->rc == 0 && B->ttl_ms > 0 && !strstr(bl->l.request, "\"ttl_ms\":")) {
            /* the completion window: ttl_ms on every request that has none */
            size_t rl = strlen(bl->l.request);
            char *r = malloc(rl + 40);
            if (!r) goto oom;
            memcpy(r, bl->l.request, rl - 1);
            snprintf(r + rl - 1, 40, ",\"ttl_ms\":%ld}", B->ttl_ms);
            free(bl->l.request);
            bl->l.request = r;
        }
    }
    B->in_hash = XXH64_digest(hs);
    B->by_cid = malloc(sizeof *B->by_cid * (size_t)(B->n_lines ? B->n_lines : 1));
    if (!B->by_cid) goto oom;
    for (long i = 0; i < B->n_lines; i++) B->by_cid[B->n_cid++] = i;
    qsort_r(B->by_cid, (size_t)B->n_cid, sizeof *B->by_cid, cmp_cid, B);
    for (long i = 1; i < B->n_cid; i++) {
        const bline_t *a = &B->lines[B->by_cid[i - 1]], *b = &B->lines[B->by_cid[i]];
        if (!strcmp(a->l.custom_id, b->l.custom_id)) {
            fprintf(stderr, "spillway batch: %s: custom_id \"%s\" on lines %ld and %ld; custom_ids "
                    "must be unique, the file is refused\n", B->in_path, a->l.custom_id, a->lineno,
                    b->lineno);
            rc = 2;
            goto done;
        }
    }
    goto done;
oom:
    fprintf(stderr, "spillway batch: out of memory reading %s\n", B->in_path);
    rc = 1;
done:
    XXH64_freeState(hs);
    free(line);
    fclose(f);
    return rc;
}

/* ---- state file ---- */

static json_t *offsets_json(const offsets_t *o)
{
    json_t *a = json_array();
    for (int i = 0; i < o->n; i++) json_array_append_new(a, json_integer(o->off[i]));
    return a;
}

static void offsets_from(offsets_t *o, const json_t *a)
{
    o->n = 0;
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) {
        if (o->n < MAX_PARTS) o->off[o->n++] = json_integer_value(v);
    }
}

/* Writes the state (tmp file, fsync, rename). 0 or -1 (printed). */
static int save_state(const batch_t *B)
{
    char hash[24], tmp[4300];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)B->in_hash);
    json_t *s = json_pack("{s:i, s:s, s:{s:s, s:I, s:s}, s:s, s:s, s:s, s:o, s:o, s:I}", "version", 1,
                          "batch_id", B->batch_id, "input", "path", B->in_path, "bytes",
                          (json_int_t)B->in_bytes, "xxh64", hash, "input_topic", B->in_topic,
                          "results_topic", B->res_topic, "dlq_topic", B->dlq_topic, "results_from",
                          offsets_json(&B->res_from), "dlq_from", offsets_json(&B->dlq_from),
                          "produced", (json_int_t)B->produced);
    snprintf(tmp, sizeof tmp, "%s.tmp", B->state_path);
    int rc = -1;
    char *text = s ? json_dumps(s, JSON_INDENT(1)) : NULL;
    FILE *f = text ? fopen(tmp, "w") : NULL;
    if (f) {
        int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 && fsync(fileno(f)) == 0;
        ok = fclose(f) == 0 && ok;
        if (ok && rename(tmp, B->state_path) == 0) rc = 0;
    }
    if (rc) fprintf(stderr, "spillway batch: cannot write %s: %s\n", B->state_path, strerror(errno));
    free(text);
    json_decref(s);
    return rc;
}

/* 1: loaded; 0: no state file; -1: unusable (printed). */
static int load_state(batch_t *B)
{
    json_error_t je;
    json_t *s = json_load_file(B->state_path, 0, &je);
    if (!s) {
        if (access(B->state_path, F_OK) != 0) return 0;
        fprintf(stderr, "spillway batch: %s: %s\n", B->state_path, je.text);
        return -1;
    }
    const char *id = json_string_value(json_object_get(s, "batch_id"));
    const char *h = json_string_value(json_object_get(json_object_get(s, "input"), "xxh64"));
    int rc = -1;
    if (!id || strlen(id) >= sizeof B->batch_id || !h) {
        fprintf(stderr, "spillway batch: %s: not a batch state file\n", B->state_path);
    } else {
        snprintf(B->batch_id, sizeof B->batch_id, "%s", id);
        B->in_hash = strtoull(h, NULL, 16); /* checked against the input once it is read */
        offsets_from(&B->res_from, json_object_get(s, "results_from"));
        offsets_from(&B->dlq_from, json_object_get(s, "dlq_from"));
        B->produced = (long)json_integer_value(json_object_get(s, "produced"));
        rc = 1;
    }
    json_decref(s);
    return rc;
}

/* ---- output files ---- */

/* Opens path for appending after reading back its complete lines (marking their custom_ids
 * done); a trailing partial line is cut off. NULL on error (printed). */
static FILE *open_done(batch_t *B, const char *path, int is_err)
{
    FILE *f = fopen(path, "a+");
    if (!f) {
        fprintf(stderr, "spillway batch: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    rewind(f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long long good = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (line[len - 1] != '\n') break;
        json_t *o = json_loadb(line, (size_t)len - 1, 0, NULL);
        const char *cid = json_string_value(json_object_get(o, "custom_id"));
        long i = cid ? find_cid(B, cid) : -1;
        if (i >= 0 && !B->lines[i].done) {
            B->lines[i].done = 1;
            B->done++;
            B->done_before++;
            if (is_err) B->failed++;
        }
        json_decref(o);
        good += len;
    }
    free(line);
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && sb.st_size > good) {
        fprintf(stderr, "spillway batch: %s: cutting a partial last line (%lld bytes)\n", path,
                (long long)(sb.st_size - good));
        if (ftruncate(fileno(f), (off_t)good) != 0) {
            fprintf(stderr, "spillway batch: %s: %s\n", path, strerror(errno));
            fclose(f);
            return NULL;
        }
    }
    fseek(f, 0, SEEK_END);
    return f;
}

/* Appends line o (consumed) for line index i and marks it done. 0 or -1 (printed). */
static int emit(batch_t *B, long i, json_t *o, int is_err)
{
    char *s = o ? json_text_dump(o) : NULL; /* logprobs as the worker wrote them: -0.75, not -0.7500000000001 */
    json_decref(o);
    FILE *f = is_err ? B->err : B->out;
    if (!s || fputs(s, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0) {
        fprintf(stderr, "spillway batch: cannot write %s: %s\n", is_err ? B->err_path : B->out_path,
                s ? strerror(errno) : "out of memory");
        free(s);
        return -1;
    }
    free(s);
    B->lines[i].done = 1;
    B->done++;
    if (is_err) B->failed++;
    return 0;
}

static void line_id(const batch_t *B, long i, char *buf, size_t cap)
{
    snprintf(buf, cap, "batch_req_%s_%ld", B->batch_id, B->lines[i].lineno);
}

/* The line index of request id "BATCHID:LINE", or -1 when it is not one of this batch's. */
static long index_of_id(const batch_t *B, const char *id, size_t n)
{
    size_t bl = strlen(B->batch_id);
    if (n <= bl + 1 || memcmp(id, B->batch_id, bl) || id[bl] != ':') return -1;
    long v = 0;
    for (size_t k = bl + 1; k < n; k++) {
        if (id[k] < '0' || id[k] > '9' || v > 1000000000L) return -1;
        v = v * 10 + (id[k] - '0');
    }
    long lo = 0, hi = B->n_lines; /* lines are in lineno order */
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (B->lines[mid].lineno < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < B->n_lines && B->lines[lo].lineno == v ? lo : -1;
}

static int on_result(batch_t *B, const rd_kafka_message_t *m)
{
    json_t *o = json_loadb(m->payload, m->len, 0, NULL);
    const json_t *idv = json_object_get(o, "id");
    long i = json_is_string(idv) ? index_of_id(B, json_string_value(idv), json_string_length(idv)) : -1;
    int rc = 0;
    if (i >= 0 && !B->lines[i].done) {
        char lid[96];
        line_id(B, i, lid, sizeof lid);
        const char *fin = json_string_value(json_object_get(o, "finish_reason"));
        if (fin && !strcmp(fin, "expired")) {
            rc = emit(B, i, oai_error_line(lid, B->lines[i].l.custom_id, 0, NULL, "batch_expired",
                                           NULL, "This request could not be executed before its "
                                           "deadline (deadline / ttl_ms / --ttl-ms) passed."), 1);
        } else if (fin && !strcmp(fin, "overloaded")) {
            rc = emit(B, i, oai_error_line(lid, B->lines[i].l.custom_id, 503, "server_error",
                                           "overloaded", NULL, "The worker was overloaded and "
                                           "refused this request; send it again."), 1);
        } else {
            B->tokens += (long)json_integer_value(json_object_get(json_object_get(o, "usage"),
                                                                  "completion_tokens"));
            rc = emit(B, i, oai_output_line(&B->lines[i].l, lid, o, (long long)time(NULL)), 0);
        }
    }
    json_decref(o);
    return rc;
}

/* The request id of a dead letter: from its JSON, else from the text of a truncated one (our
 * requests start with {"id":"...). */
static int dlq_id(const rd_kafka_message_t *m, char *buf, size_t cap)
{
    json_t *o = json_loadb(m->payload, m->len, 0, NULL);
    const char *id = json_string_value(json_object_get(o, "id"));
    int ok = 0;
    if (id) {
        snprintf(buf, cap, "%s", id);
        ok = 1;
    } else if (m->len > 8 && !memcmp(m->payload, "{\"id\":\"", 7)) {
        const char *p = (const char *)m->payload + 7, *e = memchr(p, '"', m->len - 7);
        if (e && (size_t)(e - p) < cap) {
            memcpy(buf, p, (size_t)(e - p));
            buf[e - p] = 0;
            ok = 1;
        }
    }
    json_decref(o);
    return ok;
}

static int on_dead_letter(batch_t *B, const rd_kafka_message_t *m)
{
    char id[300], code[64] = "invalid_request", msg[1100] = "dead-lettered by the worker";
    if (!dlq_id(m, id, sizeof id)) return 0;
    long i = index_of_id(B, id, strlen(id));
    if (i < 0 || B->lines[i].done) return 0;
    rd_kafka_headers_t *hs = NULL;
    if (rd_kafka_message_headers(m, &hs) == 0) {
        const void *v;
        size_t n;
        if (rd_kafka_header_get_last(hs, "__spillway.errors.code", &v, &n) == 0)
            snprintf(code, sizeof code, "%.*s", (int)n, (const char *)v);
        if (rd_kafka_header_get_last(hs, "__spillway.errors.message", &v, &n) == 0)
            snprintf(msg, sizeof msg, "%.*s", (int)n, (const char *)v);
    }
    /* the param: the field the message starts with ("max_tokens: 0 is out of range ...") */
    char param[64] = "";
    size_t k = strcspn(msg, ": [");
    if (k > 0 && k < sizeof param && msg[k] == ':') snprintf(param, sizeof param, "%.*s", (int)k, msg);
    else if (k > 0 && k < sizeof param && msg[k] == '[') snprintf(param, sizeof param, "%.*s", (int)k, msg);
    char lid[96];
    line_id(B, i, lid, sizeof lid);
    int status = !strcmp(code, "delivery_failed") || !strcmp(code, "result_too_large") ? 500 : 400;
    return emit(B, i, oai_error_line(lid, B->lines[i].l.custom_id, status,
                                     status == 400 ? "invalid_request_error" : "server_error", code,
                                     param, msg), 1);
}

/* ---- Kafka ---- */

static int topic_parts(rd_kafka_t *rk, const char *topic)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
    int n = -1;
    if (t && rd_kafka_metadata(rk, 0, t, &md, 10000) == 0) {
        if (md->topic_cnt == 1 && !md->topics[0].err) n = md->topics[0].partition_cnt;
        rd_kafka_metadata_destroy(md);
    }
    if (t) rd_kafka_topic_destroy(t);
    return n > MAX_PARTS ? MAX_PARTS : n;
}

/* The end offsets of topic's partitions now (where this batch's results will start). */
static int end_offsets(rd_kafka_t *rk, const char *topic, offsets_t *o)
{
    int n = topic_parts(rk, topic);
    if (n < 0) {
        fprintf(stderr, "spillway batch: topic %s: no metadata (does it exist?)\n", topic);
        return -1;
    }
    o->n = n;
    for (int p = 0; p < n; p++) {
        int64_t lo, hi;
        rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 10000);
        if (e) {
            fprintf(stderr, "spillway batch: %s[%d]: %s\n", topic, p, rd_kafka_err2str(e));
            return -1;
        }
        o->off[p] = hi;
    }
    return 0;
}

static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    batch_t *B = opaque;
    long i = (long)(intptr_t)m->_private;
    if (i >= 0 && i < B->n_lines && !m->err) B->lines[i].delivered = 1;
    else if (m->err)
        fprintf(stderr, "spillway batch: line %ld not delivered: %s\n",
                i >= 0 && i < B->n_lines ? B->lines[i].lineno : -1L, rd_kafka_err2str(m->err));
}

/* Advances B->produced over the delivered prefix; saves the state when it moved. */
static int checkpoint(batch_t *B)
{
    long p = B->produced;
    while (p < B->n_lines && (B->lines[p].delivered || B->lines[p].rc != 0)) p++;
    if (p == B->produced) return 0;
    B->produced = p;
    return save_state(B);
}

static int poll_once(batch_t *B, int timeout_ms)
{
    rd_kafka_message_t *m = rd_kafka_consumer_poll(B->cons, timeout_ms);
    if (!m) return 0;
    int rc = 0;
    if (!m->err) {
        const char *t = rd_kafka_topic_name(m->rkt);
        rc = !strcmp(t, B->res_topic) ? on_result(B, m) : on_dead_letter(B, m);
    } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        fprintf(stderr, "spillway batch: consumer: %s\n", rd_kafka_message_errstr(m));
    }
    rd_kafka_message_destroy(m);
    return rc;
}

static void progress(batch_t *B, int tty, double t0, int final)
{
    double el = sw_mono_s() - t0;
    long new_done = B->done - B->done_before, left = B->n_lines - B->done;
    double rate = el > 0 ? (double)new_done / el : 0;
    char eta[32] = "--";
    if (left == 0) snprintf(eta, sizeof eta, "0s");
    else if (rate > 0) snprintf(eta, sizeof eta, "%.0fs", (double)left / rate);
    fprintf(stderr, "%s%ld/%ld done  %ld failed  %.1f tok/s  ETA %s%s", tty ? "\r" : "", B->done,
            B->n_lines, B->failed, el > 0 ? (double)B->tokens / el : 0.0, eta,
            tty && !final ? "   " : "\n");
}

static const char USAGE[] =
    "usage: spillway batch -b BROKERS [-t INPUT_TOPIC] [-r RESULTS_TOPIC] [-d DLQ_TOPIC]\n"
    "                      [-o OUTPUT] [-e ERRORS] [--route MODE] [--key-prefix BYTES]\n"
    "                      [--ttl-ms MS] [--timeout S] [--progress S] [-X PROP=VALUE] FILE\n";

int cli_batch(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"brokers", required_argument, 0, 'b'},   {"topic", required_argument, 0, 't'},
        {"results", required_argument, 0, 'r'},   {"dlq", required_argument, 0, 'd'},
        {"output", required_argument, 0, 'o'},    {"errors", required_argument, 0, 'e'},
        CLI_ROUTE_LONGOPTS,                       {"ttl-ms", required_argument, 0, 'L'},
        {"timeout", required_argument, 0, 'T'},   {"progress", required_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    batch_t *B = calloc(1, sizeof *B);
    rd_kafka_conf_t *pconf = rd_kafka_conf_new(), *cconf = rd_kafka_conf_new();
    char err[512];
    int rc = 2, opt;
    const char *out_opt = NULL, *err_opt = NULL;
    if (!B) return 1;
    if (cli_route_init(&B->route)) {
        rd_kafka_conf_destroy(pconf);
        rd_kafka_conf_destroy(cconf);
        free(B);
        return 2;
    }
    B->in_topic = "prompts";
    B->res_topic = "results";
    B->dlq_topic = "prompts.dlq";
    B->progress_s = 10;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "b:t:r:d:o:e:k:X:h", longopts, NULL)) != -1) {
        int ro = cli_route_opt(&B->route, opt, optarg);
        if (ro < 0) goto usage;
        if (ro) continue;
        switch (opt) {
        case 'b': B->brokers = optarg; break;
        case 't': B->in_topic = optarg; break;
        case 'r': B->res_topic = optarg; break;
        case 'd': B->dlq_topic = optarg; break;
        case 'o': out_opt = optarg; break;
        case 'e': err_opt = optarg; break;
        case 'L':
            if (cli_parse_int("--ttl-ms", optarg, 1, 1L << 40, &B->ttl_ms)) goto usage;
            break;
        case 'T':
            if (cli_parse_int("--timeout", optarg, 1, 1L << 30, &B->timeout)) goto usage;
            break;
        case 'P':
            if (cli_parse_int("--progress", optarg, 1, 86400, &B->progress_s)) goto usage;
            break;
        case 'X': {
            char *eq = strchr(optarg, '=');
            if (!eq) goto usage;
            *eq = 0;
            if (rd_kafka_conf_set(pconf, optarg, eq + 1, err, sizeof err) ||
                rd_kafka_conf_set(cconf, optarg, eq + 1, err, sizeof err)) {
                fprintf(stderr, "spillway batch: %s\n", err);
                goto usage;
            }
            break;
        }
        case 'h':
            printf("%s", USAGE);
            cli_route_help(stdout);
            rc = 0;
            goto out;
        default: goto usage;
        }
    }
    if (!B->brokers || argc - optind != 1) goto usage;
    B->in_path = argv[optind];
    {
        /* OUTPUT defaults to FILE without .jsonl + ".output.jsonl"; ERRORS likewise */
        char stem[4000];
        snprintf(stem, sizeof stem, "%s", B->in_path);
        size_t sl = strlen(stem);
        if (sl > 6 && !strcmp(stem + sl - 6, ".jsonl")) stem[sl - 6] = 0;
        if (out_opt) snprintf(B->out_path, sizeof B->out_path, "%s", out_opt);
        else snprintf(B->out_path, sizeof B->out_path, "%s.output.jsonl", stem);
        if (err_opt) snprintf(B->err_path, sizeof B->err_path, "%s", err_opt);
        else snprintf(B->err_path, sizeof B->err_path, "%s.errors.jsonl", stem);
        snprintf(B->state_path, sizeof B->state_path, "%s.state", B->out_path);
    }
    rc = 1;
    int st = load_state(B);
    if (st < 0) goto out;
    uint64_t saved_hash = B->in_hash;
    if (st == 0) {
        if (access(B->out_path, F_OK) == 0 || access(B->err_path, F_OK) == 0) {
            fprintf(stderr, "spillway batch: %s or %s exists but %s does not: not resuming a batch "
                    "whose state is lost; move the files away to start over\n", B->out_path,
                    B->err_path, B->state_path);
            goto out;
        }
        uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed ^= (uint64_t)ts.tv_nsec;
        snprintf(B->batch_id, sizeof B->batch_id, "b%012llx",
                 (unsigned long long)(XXH64(B->in_path, strlen(B->in_path), seed) & 0xffffffffffffULL));
    }
    if ((rc = load_input(B))) goto out;
    rc = 1;
    if (st == 1 && saved_hash != B->in_hash) {
        fprintf(stderr, "spillway batch: %s changed since %s was written; not resuming (move the "
                "output, error and state files away to start over)\n", B->in_path, B->state_path);
        goto out;
    }
    if (!(B->out = open_done(B, B->out_path, 0)) || !(B->err = open_done(B, B->err_path, 1))) goto out;

    rd_kafka_conf_set(pconf, "bootstrap.servers", B->brokers, err, sizeof err);
    rd_kafka_conf_set(pconf, "enable.idempotence", "true", err, sizeof err);
    rd_kafka_conf_set(pconf, "linger.ms", "10", err, sizeof err);
    rd_kafka_conf_set_dr_msg_cb(pconf, on_dr);
    rd_kafka_conf_set_opaque(pconf, B);
    B->prod = rd_kafka_new(RD_KAFKA_PRODUCER, pconf, err, sizeof err);
    pconf = NULL;
    if (!B->prod) {
        fprintf(stderr, "spillway batch: %s\n", err);
        goto out;
    }
    if (cli_route_start(&B->route, B->prod, B->in_topic, 10000)) goto out;
    if (st == 0) {
        if (end_offsets(B->prod, B->res_topic, &B->res_from) ||
            end_offsets(B->prod, B->dlq_topic, &B->dlq_from) || save_state(B))
            goto out;
    }
    char group[96];
    snprintf(group, sizeof group, "spillway-batch-%s-%d", B->batch_id, (int)getpid());
    const char *props[][2] = {{"bootstrap.servers", B->brokers}, {"group.id", group},
                              {"isolation.level", "read_committed"},
                              {"enable.auto.commit", "false"}, {"enable.partition.eof", "false"}};
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++)
        rd_kafka_conf_set(cconf, props[i][0], props[i][1], err, sizeof err);
    B->cons = rd_kafka_new(RD_KAFKA_CONSUMER, cconf, err, sizeof err);
    cconf = NULL;
    if (!B->cons) {
        fprintf(stderr, "spillway batch: %s\n", err);
        goto out;
    }
    rd_kafka_poll_set_consumer(B->cons);
    {
        int nr = topic_parts(B->cons, B->res_topic), nd = topic_parts(B->cons, B->dlq_topic);
        if (nr < 0 || nd < 0) {
            fprintf(stderr, "spillway batch: no metadata for %s / %s\n", B->res_topic, B->dlq_topic);
            goto out;
        }
        rd_kafka_topic_partition_list_t *as = rd_kafka_topic_partition_list_new(nr + nd);
        for (int p = 0; p < nr; p++)
            rd_kafka_topic_partition_list_add(as, B->res_topic, p)->offset =
                p < B->res_from.n ? B->res_from.off[p] : RD_KAFKA_OFFSET_BEGINNING;
        for (int p = 0; p < nd; p++)
            rd_kafka_topic_partition_list_add(as, B->dlq_topic, p)->offset =
                p < B->dlq_from.n ? B->dlq_from.off[p] : RD_KAFKA_OFFSET_BEGINNING;
        rd_kafka_resp_err_t e = rd_kafka_assign(B->cons, as);
        rd_kafka_topic_partition_list_destroy(as);
        if (e) {
            fprintf(stderr, "spillway batch: assign: %s\n", rd_kafka_err2str(e));
            goto out;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = batch_on_signal; /* no SA_RESTART: polls wake up */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int tty = isatty(2);
    double t0 = sw_mono_s(), last_prog = t0, last_ck = t0;
    long to_send = 0, refused_now = 0;
    fprintf(stderr, "spillway batch %s: %ld line(s), %ld already done%s\n", B->batch_id, B->n_lines,
            B->done, st == 1 ? " (resuming)" : "");
    /* refused lines: error lines now */
    for (long i = 0; i < B->n_lines; i++) {
        bline_t *bl = &B->lines[i];
        if (bl->rc == 0 || bl->done) continue;
        char lid[96];
        line_id(B, i, lid, sizeof lid);
        if (emit(B, i, oai_error_line(lid, bl->l.custom_id, 400, "invalid_request_error",
                                      bl->l.err_code, bl->l.err_param, bl->l.err_msg), 1))
            goto out;
        refused_now++;
    }
    /* produce what has no output and was not delivered by an earlier run */
    for (long i = B->produced; i < B->n_lines && !batch_stop; i++) {
        bline_t *bl = &B->lines[i];
        if (bl->rc != 0 || bl->done) {
            bl->delivered = 1;
            continue;
        }
        json_t *r = json_loads(bl->l.request, 0, NULL);
        char key[32], rerr[128];
        const char *k = NULL;
        size_t klen = 0;
        int32_t part;
        if (cli_route_message(&B->route, r, key, sizeof key, &k, &klen, &part, rerr, sizeof rerr)) {
            /* a prefix_key the request schema refuses: an error line, nothing sent */
            char lid[96];
            json_decref(r);
            line_id(B, i, lid, sizeof lid);
            bl->delivered = 1;
            if (emit(B, i, oai_error_line(lid, bl->l.custom_id, 400, "invalid_request_error",
                                          "invalid_prefix_key", "prefix_key", rerr), 1))
                goto out;
            refused_now++;
            continue;
        }
        for (;;) {
            rd_kafka_resp_err_t e = rd_kafka_producev(
                B->prod, RD_KAFKA_V_TOPIC(B->in_topic), RD_KAFKA_V_PARTITION(part),
                RD_KAFKA_V_KEY(k, klen),
                RD_KAFKA_V_VALUE(bl->l.request, strlen(bl->l.request)),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE((void *)(intptr_t)i),
                RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                rd_kafka_poll(B->prod, 50);
                continue;
            }
            if (e) fprintf(stderr, "spillway batch: line %ld: %s\n", bl->lineno, rd_kafka_err2str(e));
            else to_send++;
            break;
        }
        json_decref(r);
        rd_kafka_poll(B->prod, 0);
        if (poll_once(B, 0)) goto out;
        double t = sw_mono_s();
        if (t - last_ck > 1.0) {
            last_ck = t;
            if (checkpoint(B)) goto out;
        }
    }
    fprintf(stderr, "spillway batch: %ld request(s) sent to %s, %ld line(s) refused\n", to_send,
            B->in_topic, refused_now);
    double end = B->timeout ? t0 + (double)B->timeout : 0;
    int flushed = 0;
    while (B->done < B->n_lines && !batch_stop && (!end || sw_mono_s() < end)) {
        if (poll_once(B, 100)) goto out;
        rd_kafka_poll(B->prod, 0);
        double t = sw_mono_s();
        if (!flushed && rd_kafka_outq_len(B->prod) == 0) {
            flushed = 1;
            if (checkpoint(B)) goto out;
        } else if (t - last_ck > 1.0) {
            last_ck = t;
            if (checkpoint(B)) goto out;
        }
        if (tty ? t - last_prog > 0.25 : t - last_prog >= (double)B->progress_s) {
            last_prog = t;
            progress(B, tty, t0, 0);
        }
    }
    rd_kafka_flush(B->prod, batch_stop ? 2000 : 30000);
    checkpoint(B);
    progress(B, tty, t0, 1);
    if (B->done == B->n_lines) {
        fprintf(stderr, "spillway batch %s: complete: %ld line(s) in %s, %ld in %s\n", B->batch_id,
                B->done - B->failed, B->out_path, B->failed, B->err_path);
        rc = 0;
    } else {
        fprintf(stderr, "spillway batch %s: %s with %ld line(s) left; run the same command again "
                "to resume\n", B->batch_id, batch_stop ? "stopped" : "timed out", B->n_lines - B->done);
        rc = batch_stop ? 130 : 1;
    }
out:
    if (B->out && (fflush(B->out) || fsync(fileno(B->out)) || fclose(B->out))) rc = rc ? rc : 1;
    if (B->err && (fflush(B->err) || fsync(fileno(B->err)) || fclose(B->err))) rc = rc ? rc : 1;
    if (B->cons) {
        rd_kafka_consumer_close(B->cons);
        rd_kafka_destroy(B->cons);
    }
    if (B->prod) rd_kafka_destroy(B->prod);
    if (pconf) rd_kafka_conf_destroy(pconf);
    if (cconf) rd_kafka_conf_destroy(cconf);
    for (long i = 0; i < B->n_lines; i++) oai_line_free(&B->lines[i].l);
    free(B->lines);
    free(B->by_cid);
    cli_route_free(&B->route);
    free(B);
    return rc;
usage:
    fprintf(stderr, "%s", USAGE);
    goto out;
}
