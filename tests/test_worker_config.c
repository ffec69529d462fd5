/* tests/test_worker_config.c: worker configuration: defaults, key=value file, SPILLWAY_*
 * environment, -X pass-through, precedence and errors; the claims key's parser and rules; the
 * key table (sections, ranges, choices) and the engine's and cache's own defaults against it. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "check.h"
#include "engine/engine.h"
#include "records/request.h"
#include "worker/claims.h"
#include "worker/worker.h"

static const char *source_of(const worker_config_t *c, const char *key)
{
    for (int i = 0; i < worker_config_n_keys(); i++)
        if (!strcmp(worker_config_key_name(i), key)) return c->source[i];
    return NULL;
}

/* claims_check of (topic, tenant, class) under c: the code ("" = allowed) and defaults. */
static const char *claim(const claims_t *c, const char *topic, const char *tenant,
                         const char *cls, const char **def_tenant, int *def_class)
{
    char err[256];
    const char *code = NULL, *dt = NULL;
    int dc = -1;
    if (!claims_check(c, topic, tenant, cls, &dt, &dc, &code, err, sizeof err)) code = "";
    else CHECKF(strstr(err, topic) && strstr(err, "may not be claimed"), "%s", err);
    if (def_tenant) *def_tenant = dt;
    if (def_class) *def_class = dc;
    return code;
}

static void test_claims(void)
{
    char err[512];
    worker_class_t *cl = NULL;
    int ncl = 0;
    CHECK(worker_classes_parse("interactive:priority=100,standard:priority=50,batch,bulk-low",
                               &cl, &ncl, err, sizeof err) == 0 && ncl == 4);
    enum { INTERACTIVE, STANDARD, BATCH, BULK_LOW };
    claims_t *c = (claims_t *)1;
    /* empty or blank: no mapping */
    CHECK(claims_parse("", cl, ncl, BATCH, &c, err, sizeof err) == 0 && c == NULL);
    CHECK(claims_parse(" ; ;", cl, ncl, BATCH, &c, err, sizeof err) == 0 && c == NULL);

    CHECKF(claims_parse("prompts tenants=acme,org:globex/eu classes=interactive,standard "
                        "tenant=acme class=standard ; "
                        "bulk-* tenants=bulk-* classes=b* ; bulk-vip classes=* ;"
                        " * tenant=anon", cl, ncl, BATCH, &c, err, sizeof err) == 0 && c,
           "%s", err);
    const char *dt;
    int dc;
    /* prompts: the listed claims, the defaults for a request without any */
    CHECK(!strcmp(claim(c, "prompts", "acme", "interactive", &dt, &dc), ""));
    CHECK(!strcmp(claim(c, "prompts", "org:globex/eu", "standard", NULL, NULL), ""));
    CHECK(!strcmp(claim(c, "prompts", NULL, NULL, &dt, &dc), "") && dt && !strcmp(dt, "acme") &&
          dc == STANDARD);
    CHECK(!strcmp(claim(c, "prompts", "initech", NULL, NULL, NULL), REQ_ERR_TENANT_NOT_ALLOWED));
    CHECK(!strcmp(claim(c, "prompts", "acme2", NULL, NULL, NULL), REQ_ERR_TENANT_NOT_ALLOWED));
    CHECK(!strcmp(claim(c, "prompts", NULL, "batch", NULL, NULL), REQ_ERR_CLASS_NOT_ALLOWED));
    CHECK(!strcmp(claim(c, "prompts", "acme", "bulk-low", NULL, NULL), REQ_ERR_CLASS_NOT_ALLOWED));
    /* prefix entries and patterns; the longest prefix wins over "*" */
    CHECK(!strcmp(claim(c, "bulk-7", "bulk-team9", "batch", &dt, &dc), "") && !dt && dc == BATCH);
    CHECK(!strcmp(claim(c, "bulk-7", NULL, "bulk-low", NULL, NULL), ""));
    CHECK(!strcmp(claim(c, "bulk-7", "acme", NULL, NULL, NULL), REQ_ERR_TENANT_NOT_ALLOWED));
    CHECK(!strcmp(claim(c, "bulk-7", NULL, "interactive", NULL, NULL), REQ_ERR_CLASS_NOT_ALLOWED));
    /* an exact entry beats a prefix one */
    CHECK(!strcmp(claim(c, "bulk-vip", NULL, "interactive", NULL, NULL), ""));
    CHECK(!strcmp(claim(c, "bulk-vip", "bulk-team9", NULL, NULL, NULL), REQ_ERR_TENANT_NOT_ALLOWED));
    /* "*": any other topic; naming its default tenant or class.default is allowed, not more */
    CHECK(!strcmp(claim(c, "other", NULL, NULL, &dt, &dc), "") && dt && !strcmp(dt, "anon") &&
          dc == BATCH);
    CHECK(!strcmp(claim(c, "other", "anon", "batch", NULL, NULL), ""));
    CHECK(!strcmp(claim(c, "other", "acme", NULL, NULL, NULL), REQ_ERR_TENANT_NOT_ALLOWED));
    CHECK(!strcmp(claim(c, "other", NULL, "interactive", NULL, NULL), REQ_ERR_CLASS_NOT_ALLOWED));
    CHECK(claims_covers(c, "prompts") && claims_covers(c, "bulk-1") && !claims_covers(c, "other"));
    claims_free(c);

    /* no "*" entry: another topic may claim nothing, and gets class.default and no tenant */
    CHECK(claims_parse("prompts tenants=* classes=*", cl, ncl, BATCH, &c, err, sizeof err) == 0);
    CHECK(!strcmp(claim(c, "prompts", "anyone", "interactive", NULL, NULL), ""));
    CHECK(!strcmp(claim(c, "other", NULL, NULL, &dt, &dc), "") && !dt && dc == BATCH);
    CHECK(!strcmp(claim(c, "other", NULL, "batch", NULL, NULL), ""));
    CHECK(!strcmp(claim(c, "other", "anyone", NULL, NULL, NULL), REQ_ERR_TENANT_NOT_ALLOWED));
    CHECK(!strcmp(claim(c, "other", NULL, "standard", NULL, NULL), REQ_ERR_CLASS_NOT_ALLOWED));
    CHECK(!claims_covers(c, "other"));
    claims_free(c);

    /* bad syntax: refused, naming the claims key and what is wrong */
    const char *bad[][2] = {
        {"prompts tenants=acme classes=gold", "gold is not one of the classes"},
        {"prompts class=gold", "class=gold is not one of the classes"},
        {"prompts classes=x*", "matches none of the classes"},
        {"prompts tenants=", "is not a tenant name"},
        {"prompts tenants=a,,b", "is not a tenant name"},
        {"prompts tenants=_internal", "is not a tenant name"},
        {"prompts tenants=a*b", "is not a tenant name"},
        {"prompts tenants=a, b", "without blanks"},
        {"prompts tenant=a*", "expected a tenant name"},
        {"prompts tenant=", "expected a tenant name"},
        {"prompts tenants=a tenants=b", "tenants= given twice"},
        {"prompts owner=a", "is not tenants="},
        {"prompts acme", "is not tenants="},
        {"prom*pts tenants=a", "is not a topic"},
        {"bad/topic tenants=a", "is not a topic"},
        {"prompts tenants=a; prompts classes=batch", "topic prompts given twice"},
        {"* tenants=a; * classes=batch", "topic * given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = NULL;
        err[0] = 0;
        CHECKF(claims_parse(bad[i][0], cl, ncl, BATCH, &c, err, sizeof err) == -1 && !c &&
                   !strncmp(err, "claims: ", 8) && strstr(err, bad[i][1]),
               "\"%s\": %s", bad[i][0], err);
    }
    free(cl);

    /* worker_config_check (spillway config --check) refuses a bad claims key */
    worker_config_t k;
    CHECK(worker_config_default(&k) == 0);
    CHECK(!strcmp(k.claims, ""));
    CHECK(worker_config_set(&k, "model", "/x.gguf", "cli", err, sizeof err) == 0);
    CHECK(worker_config_set(&k, "claims", "prompts tenants=acme classes=interactive", "cli", err,
                            sizeof err) == 0);
    CHECKF(worker_config_check(&k, err, sizeof err) == 0, "%s", err);
    CHECK(worker_config_set(&k, "claims", "prompts classes=gold", "cli", err, sizeof err) == 0);
    CHECK(worker_config_check(&k, err, sizeof err) == -1 && strstr(err, "claims: topic prompts"));
    setenv("SPILLWAY_CLAIMS", "* tenant=anon", 1);
    CHECK(worker_config_load_env(&k, err, sizeof err) == 0 && !strcmp(k.claims, "* tenant=anon"));
    unsetenv("SPILLWAY_CLAIMS");
    CHECK(worker_config_check(&k, err, sizeof err) == 0);
    worker_config_free(&k);
}

/* The key table: every key in a section (each section one run of keys), its default a valid
 * value, its bounds accepted and one beyond refused, its choices accepted and others refused;
 * and the modules' own defaults (engine_config_default, cache_config_default: what `spillway
 * generate` starts from) equal to the table's. */
static void test_key_table(void)
{
    char err[512], seen[64][96];
    int n_seen = 0;
    const char *prev = NULL;
    worker_config_key_t k;
    CHECK(worker_config_key(-1, &k) == -1 && worker_config_key(worker_config_n_keys(), &k) == -1);
    CHECK(worker_config_find_key("no.such.key") == -1);
    for (int i = 0; i < worker_config_n_keys(); i++) {
        CHECK(worker_config_key(i, &k) == 0 && worker_config_find_key(k.name) == i);
        CHECKF(k.section && *k.help && k.def, "%s", k.name);
        if (!k.section) continue;
        if (!prev || strcmp(prev, k.section)) { /* a new section: not one seen before */
            for (int j = 0; j < n_seen; j++) CHECKF(strcmp(seen[j], k.section), "%s", k.section);
            if (n_seen < 64) snprintf(seen[n_seen++], sizeof seen[0], "%s", k.section);
            prev = k.section;
        }
        long v = -7;
        CHECKF(worker_config_parse_value(i, k.def, &v, err, sizeof err) == 0, "%s", err);
        if (k.integer) {
            char t[32];
            CHECK(k.lo <= v && v <= k.hi);
            snprintf(t, sizeof t, "%ld", k.lo);
            CHECK(worker_config_parse_value(i, t, &v, err, sizeof err) == 0 && v == k.lo);
            snprintf(t, sizeof t, "%ld", k.hi);
            CHECK(worker_config_parse_value(i, t, &v, err, sizeof err) == 0 && v == k.hi);
            if (k.lo > LONG_MIN) {
                snprintf(t, sizeof t, "%ld", k.lo - 1);
                CHECK(worker_config_parse_value(i, t, NULL, err, sizeof err) == -1 &&
                      strstr(err, k.name));
            }
            if (k.hi < LONG_MAX) {
                snprintf(t, sizeof t, "%ld", k.hi + 1);
                CHECK(worker_config_parse_value(i, t, NULL, err, sizeof err) == -1);
            }
            CHECK(worker_config_parse_value(i, "12x", NULL, err, sizeof err) == -1);
        }
        if (k.choices) {
            char buf[128];
            snprintf(buf, sizeof buf, "%s", k.choices);
            for (char *save = NULL, *c = strtok_r(buf, "|", &save); c; c = strtok_r(NULL, "|", &save))
                CHECKF(worker_config_parse_value(i, c, NULL, err, sizeof err) == 0, "%s", err);
            CHECK(worker_config_parse_value(i, "bogus", NULL, err, sizeof err) == -1 &&
                  strstr(err, k.name) && strstr(err, "must be"));
        }
    }
    CHECK(n_seen >= 5);
    /* choices are checked when set, as ranges are */
    worker_config_t c;
    CHECK(worker_config_default(&c) == 0);
    CHECK(worker_config_set(&c, "kv.type", "q8", "cli", err, sizeof err) == -1 &&
          strstr(err, "kv.type must be f16 or f32"));
    CHECK(worker_config_set(&c, "log.format", "yaml", "cli", err, sizeof err) == -1 &&
          strstr(err, "log.format must be text or json"));
    CHECK(worker_config_set(&c, "cache.isolation", "none", "cli", err, sizeof err) == 0 &&
          !strcmp(c.cache_isolation, "none"));
    CHECK(worker_config_set(&c, "cache.isolation", "tenant", "cli", err, sizeof err) == 0);
    /* a real key: its range, and `spillway config` prints the shortest form that reads back */
    CHECK(worker_config_set(&c, "cuda.mem_fraction", "0", "cli", err, sizeof err) == -1 &&
          strstr(err, "[0.01, 1]"));
    CHECK(worker_config_set(&c, "cuda.mem_fraction", "1.5", "cli", err, sizeof err) == -1);
    CHECK(worker_config_set(&c, "cuda.mem_fraction", "nan", "cli", err, sizeof err) == -1);
    CHECK(worker_config_set(&c, "cuda.mem_fraction", "0.8x", "cli", err, sizeof err) == -1);
    static const char *const reals[][2] = {
        {"0.8", "0.8"}, {"0.80000000000000004", "0.8"}, {"8e-1", "0.8"}, {"1", "1"},
        {"0.30000000000000004", "0.30000000000000004"}, {"0.123456789", "0.123456789"},
    };
    for (size_t r = 0; r < sizeof reals / sizeof reals[0]; r++) {
        CHECK(worker_config_set(&c, "cuda.mem_fraction", reals[r][0], "cli", err, sizeof err) == 0);
        char *buf = NULL, want[96];
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        worker_config_print(&c, m);
        fclose(m);
        snprintf(want, sizeof want, "\n%-28s = %-24s #", "cuda.mem_fraction", reals[r][1]);
        CHECKF(buf && strstr(buf, want), "%s: want \"%s\"", reals[r][0], want);
        free(buf);
    }
    CHECK(worker_config_set(&c, "cuda.mem_fraction", "0.9", "cli", err, sizeof err) == 0);

    /* c holds the table's defaults; the engine's and the cache's own must be the same */
    engine_config_t e;
    engine_config_default(&e);
    CHECK(!strcmp(e.backend, c.backend));
    CHECK(e.threads == c.threads && e.max_seqs == c.max_seqs &&
          e.max_batch_tokens == c.max_batch_tokens);
    CHECK(e.kv_blocks == c.kv_blocks && e.kv_mem_mb == c.kv_mem_mb &&
          !strcmp(e.kv_type, c.kv_type) && e.block_tokens == c.block_tokens);
    CHECK(e.max_ctx == c.max_ctx && e.prefix_cache == c.prefix_cache && e.cpu_pack == c.cpu_pack);
    CHECK(e.sched_window == c.sched_window && e.sched_aging_ms == c.sched_aging_ms &&
          e.sched_urgent_ms == c.sched_urgent_ms);
    CHECK(!strcmp(e.cuda_dtype, c.cuda_dtype) && e.cuda_mem_fraction == (float)c.cuda_mem_fraction);
    CHECK(e.cuda_device == c.cuda_device);
    engine_request_t rq; /* generate -n: the default max_tokens */
    engine_request_default(&rq);
    CHECK(rq.max_tokens == c.default_max_tokens);
    cache_config_t kc;
    cache_config_default(&kc);
    CHECK(!strcmp(kc.arena_path, c.cache_arena_path) && kc.arena_mb == c.cache_arena_mb);
    CHECK(!strcmp(kc.secret_path, c.cache_secret_file));
    CHECK(!strcmp(kc.redis_host, c.cache_redis_host) && kc.redis_port == c.cache_redis_port);
    CHECK(!strcmp(kc.redis_user, c.cache_redis_user) &&
          !strcmp(kc.redis_password, c.cache_redis_password) && kc.redis_db == c.cache_redis_db);
    CHECK(!strcmp(kc.namespace_, c.cache_namespace) && !strcmp(kc.host_id, c.cache_host_id));
    CHECK(kc.connect_timeout_ms == c.cache_connect_timeout_ms &&
          kc.cmd_timeout_ms == c.cache_cmd_timeout_ms);
    CHECK(kc.backoff_min_ms == c.cache_backoff_min_ms &&
          kc.backoff_max_ms == c.cache_backoff_max_ms && kc.health_ms == c.cache_health_ms);
    CHECK(kc.write_queue == c.cache_write_queue);
    worker_config_free(&c);
}

int main(void)
{
    test_claims();
    test_key_table();

    char err[512];
    worker_config_t c;
    CHECK(worker_config_default(&c) == 0);
    CHECK(!strcmp(c.brokers, "localhost:9092"));
    CHECK(c.delivery == WORKER_ALO);
    CHECK(c.max_seqs == 64 && c.prefix_cache == 1 && c.log_level == 2);
    CHECK(!strcmp(source_of(&c, "brokers"), "default"));
    /* every key has a name and help, and no name repeats */
    for (int i = 0; i < worker_config_n_keys(); i++) {
        CHECK(worker_config_key_name(i) && worker_config_key_help(i));
        for (int j = 0; j < i; j++) CHECK(strcmp(worker_config_key_name(i), worker_config_key_name(j)));
    }

    char path[] = "/tmp/spillway-cfg-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "# comment\n\n  brokers = b1:9092,b2:9092  \nbatch.max_seqs=8\ndelivery=exactly-once\n"
               "kafka.linger.ms = 7\nprefix_cache=false\nlog.level=debug\n");
    fclose(f);
    CHECK(worker_config_load_file(&c, path, err, sizeof err) == 0);
    CHECK(!strcmp(c.brokers, "b1:9092,b2:9092"));
    CHECK(c.max_seqs == 8 && c.delivery == WORKER_EOS && c.prefix_cache == 0 && c.log_level == 3);
    CHECK(c.n_kafka == 1 && !strcmp(c.kafka[0].key, "linger.ms") && !strcmp(c.kafka[0].value, "7"));
    CHECKF(!strncmp(source_of(&c, "brokers"), "file:", 5) &&
               strstr(source_of(&c, "brokers"), ":3"), "%s", source_of(&c, "brokers"));

    /* environment beats the file */
    setenv("SPILLWAY_BATCH_MAX_SEQS", "12", 1);
    setenv("SPILLWAY_OUTPUT_TOPIC", "out2", 1);
    CHECK(worker_config_load_env(&c, err, sizeof err) == 0);
    CHECK(c.max_seqs == 12 && !strcmp(c.output_topic, "out2"));
    CHECK(!strcmp(source_of(&c, "batch.max_seqs"), "env:SPILLWAY_BATCH_MAX_SEQS"));
    setenv("SPILLWAY_BATCH_MAX_SEQS", "zero", 1);
    CHECK(worker_config_load_env(&c, err, sizeof err) == -1 && strstr(err, "batch.max_seqs"));
    unsetenv("SPILLWAY_BATCH_MAX_SEQS");
    unsetenv("SPILLWAY_OUTPUT_TOPIC");

    /* set / errors */
    CHECK(worker_config_set(&c, "max.inflight", "0", "cli", err, sizeof err) == -1);
    CHECK(worker_config_set(&c, "no.such.key", "1", "cli", err, sizeof err) == -1 &&
          strstr(err, "unknown key"));
    CHECK(worker_config_set(&c, "delivery", "twice", "cli", err, sizeof err) == -1);
    CHECK(worker_config_set(&c, "max.inflight", "3", "cli", err, sizeof err) == 0 && c.max_inflight == 3);
    CHECK(worker_config_add_kafka(&c, "producer.acks=all", "cli", err, sizeof err) == 0 && c.n_kafka == 2);
    CHECK(worker_config_add_kafka(&c, "noequals", "cli", err, sizeof err) == -1);

    /* check(): model missing, then consistent */
    CHECK(worker_config_check(&c, err, sizeof err) == -1 && strstr(err, "model"));
    CHECK(worker_config_set(&c, "model", "/x.gguf", "cli", err, sizeof err) == 0);
    CHECK(worker_config_check(&c, err, sizeof err) == 0);
    { /* a producer message.max.bytes below limits.max_message_bytes + the DLQ overhead */
        worker_config_t d;
        CHECK(worker_config_copy(&d, &c) == 0);
        CHECK(worker_config_add_kafka(&d, "producer.message.max.bytes=1000000", "cli", err,
                                      sizeof err) == 0);
        CHECK(worker_config_check(&d, err, sizeof err) == -1 &&
              strstr(err, "producer.message.max.bytes") && strstr(err, "limits.max_message_bytes"));
        CHECK(worker_config_set(&d, "limits.max_message_bytes", "900000", "cli", err,
                                sizeof err) == 0);
        CHECK(worker_config_set(&d, "limits.max_prompt_bytes", "9000", "cli", err,
                                sizeof err) == 0);
        CHECK(worker_config_check(&d, err, sizeof err) == 0);
        worker_config_free(&d);
    }
    CHECK(worker_config_set(&c, "limits.default_max_tokens", "5000", "cli", err, sizeof err) == 0);
    CHECK(worker_config_check(&c, err, sizeof err) == -1);

    /* a bad file line names FILE:LINE */
    f = fopen(path, "w");
    fprintf(f, "brokers=x\nthreads=lots\n");
    fclose(f);
    CHECK(worker_config_load_file(&c, path, err, sizeof err) == -1 && strstr(err, ":2:"));
    CHECK(worker_config_load_file(&c, "/nonexistent/spillway.conf", err, sizeof err) == -1);
    unlink(path);

    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    worker_config_print(&c, m);
    fclose(m);
    CHECK(strstr(buf, "kafka.producer.acks") && strstr(buf, "# cli") && strstr(buf, "max.inflight"));
    free(buf);

    /* service classes */
    worker_class_t *cl = NULL;
    int ncl = 0;
    CHECK(worker_classes_parse("rt:priority=100:ttft_ms=500:max_queue_ms=9000,bulk", &cl, &ncl,
                               err, sizeof err) == 0);
    CHECK(ncl == 2 && !strcmp(cl[0].name, "rt") && cl[0].priority == 100 && cl[0].ttft_ms == 500 &&
          cl[0].max_queue_ms == 9000 && !strcmp(cl[1].name, "bulk") && cl[1].priority == 0 &&
          cl[1].ttft_ms == 0);
    free(cl);
    const char *bad[] = {"", "a,a", "a:prio=1", "a:priority=2000", "a:ttft_ms=-1", "a b",
                         "a:priority", "a:priority=1x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(worker_classes_parse(bad[i], &cl, &ncl, err, sizeof err) == -1 && strstr(err, "classes"));
    CHECK(worker_config_set(&c, "limits.default_max_tokens", "256", "cli", err, sizeof err) == 0);
    CHECK(worker_config_check(&c, err, sizeof err) == 0);
    CHECK(worker_config_set(&c, "class.default", "gold", "cli", err, sizeof err) == 0);
    CHECK(worker_config_check(&c, err, sizeof err) == -1 && strstr(err, "class.default"));
    CHECK(worker_config_set(&c, "class.default", "interactive", "cli", err, sizeof err) == 0);
    CHECK(worker_config_set(&c, "overload.cap_at", "20", "cli", err, sizeof err) == 0);
    CHECK(worker_config_check(&c, err, sizeof err) == -1 && strstr(err, "overload"));
    CHECK(worker_config_set(&c, "overload.cap_at", "75", "cli", err, sizeof err) == 0);

    /* models: `models` entries in order, then `model` under its file stem; model.default */
    worker_model_spec_t *ms = NULL;
    int nms = 0, def = -1;
    CHECK(worker_models_parse(&c, &ms, &nms, &def, err, sizeof err) == 0);
    CHECK(nms == 1 && def == 0 && !strcmp(ms[0].name, "x") && !strcmp(ms[0].path, "/x.gguf"));
    free(ms);
    CHECK(worker_config_set(&c, "models", " small = /m/s.gguf , big=/m/b-v2.gguf,, ", "cli", err,
                            sizeof err) == 0);
    CHECK(worker_models_parse(&c, &ms, &nms, &def, err, sizeof err) == 0);
    CHECK(nms == 3 && def == 0 && !strcmp(ms[0].name, "small") && !strcmp(ms[0].path, "/m/s.gguf") &&
          !strcmp(ms[1].name, "big") && !strcmp(ms[1].path, "/m/b-v2.gguf") &&
          !strcmp(ms[2].name, "x") && !strcmp(ms[2].path, "/x.gguf"));
    free(ms);
    CHECK(worker_config_set(&c, "model.default", "big", "cli", err, sizeof err) == 0);
    CHECK(worker_models_parse(&c, &ms, &nms, &def, err, sizeof err) == 0 && def == 1);
    free(ms);
    CHECK(worker_config_check(&c, err, sizeof err) == 0);
    CHECK(worker_config_set(&c, "model.default", "huge", "cli", err, sizeof err) == 0);
    CHECK(worker_config_check(&c, err, sizeof err) == -1 && strstr(err, "model.default"));
    CHECK(worker_config_set(&c, "model.default", "", "cli", err, sizeof err) == 0);
    const char *bad_models[] = {"a=/p,a=/q", "=/p", "a=", "a b=/p", "a/p", "x=/other.gguf"};
    for (size_t i = 0; i < sizeof bad_models / sizeof bad_models[0]; i++) {
        CHECK(worker_config_set(&c, "models", bad_models[i], "cli", err, sizeof err) == 0);
        CHECK(worker_models_parse(&c, &ms, &nms, &def, err, sizeof err) == -1);
        CHECK(worker_config_check(&c, err, sizeof err) == -1);
    }
    /* `model` named by `models` with the same path: one model, not two */
    CHECK(worker_config_set(&c, "models", "x=/x.gguf", "cli", err, sizeof err) == 0);
    CHECK(worker_models_parse(&c, &ms, &nms, &def, err, sizeof err) == 0 && nms == 1);
    free(ms);
    /* no model at all */
    CHECK(worker_config_set(&c, "models", "", "cli", err, sizeof err) == 0);
    CHECK(worker_config_set(&c, "model", "", "cli", err, sizeof err) == 0);
    CHECK(worker_models_parse(&c, &ms, &nms, &def, err, sizeof err) == -1 && strstr(err, "model"));
    worker_config_free(&c);
    return check_exit();
}
