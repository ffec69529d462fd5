/* tests/test_json_schema.c: JSON Schema to grammar (consumer/json_schema.h): every schema of
 * tests/structured/ compiles (or is refused with its expect text), integer ranges accept exactly
 * their integers, and a few documents are accepted or rejected as the schema says. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "consumer/json_schema.h"
#include "engine/grammar.h"

#define CASES SPILLWAY_SOURCE_DIR "/tests/structured"

static grammar_t *compile(const char *schema_text, char *err, size_t errlen)
{
    json_error_t je;
    json_t *s = json_loads(schema_text, JSON_DECODE_ANY, &je);
    if (!s) {
        snprintf(err, errlen, "bad test JSON: %s", je.text);
        return NULL;
    }
    char *text = json_schema_to_grammar(s, err, errlen);
    json_decref(s);
    if (!text) return NULL;
    grammar_t *g = grammar_parse(text, strlen(text), err, errlen);
    free(text);
    return g;
}

static int accepts(grammar_t *g, const char *doc)
{
    grammar_state_t *st = grammar_state_new(g, NULL, 0);
    int ok = st && grammar_state_advance(st, doc, strlen(doc)) == 0 && grammar_state_can_end(st);
    grammar_state_free(st);
    return ok;
}

static void test_cases(void)
{
    DIR *d = opendir(CASES);
    if (!d) {
        fprintf(stderr, "no %s\n", CASES);
        check_failures_++;
        return;
    }
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1024], err[512] = "";
        snprintf(path, sizeof path, "%s/%s/schema.json", CASES, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        char buf[8192];
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        grammar_t *g = compile(buf, err, sizeof err);
        if (strncmp(de->d_name, "bad_", 4) == 0) {
            char want[512] = "";
            snprintf(path, sizeof path, "%s/%s/expect", CASES, de->d_name);
            f = fopen(path, "rb");
            if (f) {
                size_t k = fread(want, 1, sizeof want - 1, f);
                fclose(f);
                want[k] = 0;
                want[strcspn(want, "\n")] = 0;
            }
            /* bad_false is a schema the CLI loads with JSON_DECODE_ANY as we do here */
            CHECKF(!g && strstr(err, want), "%s: refused with '%s', want '%s'", de->d_name, err,
                   want);
        } else {
            CHECKF(g != NULL, "%s: %s", de->d_name, err);
        }
        grammar_release(g);
        n++;
    }
    closedir(d);
    CHECK(n >= 40);
}

/* Every integer in [lo - 120, hi + 120] is accepted iff in [lo, hi]. */
static void check_range(const char *schema, long lo, long hi)
{
    char err[512];
    grammar_t *g = compile(schema, err, sizeof err);
    CHECKF(g != NULL, "%s: %s", schema, err);
    if (!g) return;
    int bad = 0;
    for (long x = lo - 120; x <= hi + 120; x++) {
        char s[32];
        snprintf(s, sizeof s, "%ld", x);
        if (accepts(g, s) != (x >= lo && x <= hi)) {
            if (bad++ < 5) fprintf(stderr, "%s: %s wrongly %s\n", schema, s,
                                   accepts(g, s) ? "accepted" : "rejected");
        }
    }
    CHECKF(bad == 0, "%s: %d integers misjudged", schema, bad);
    CHECK(!accepts(g, "-0") && !accepts(g, "007") && !accepts(g, ""));
    grammar_release(g);
}

static void test_ranges(void)
{
    check_range("{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}", 0, 0);
    check_range("{\"type\":\"integer\",\"minimum\":-50,\"maximum\":-3}", -50, -3);
    check_range("{\"type\":\"integer\",\"minimum\":-999,\"maximum\":12345}", -999, 12345);
    check_range("{\"type\":\"integer\",\"minimum\":17,\"maximum\":1203}", 17, 1203);
    check_range("{\"type\":\"integer\",\"exclusiveMinimum\":99,\"exclusiveMaximum\":1000}", 100, 999);
    check_range("{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":9.5}", 3, 9);
    check_range("{\"type\":\"integer\",\"minimum\":-1,\"maximum\":1}", -1, 1);
}

static void test_documents(void)
{
    struct { const char *schema; const char *yes[5]; const char *no[5]; } c[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"boolean\"}},\"required\":[\"b\"],\"additionalProperties\":false}",
         {"{\"a\":1,\"b\":true}", "{\"b\":false}", "{ \"a\": -3, \"b\": true}"},
         {"{\"a\":1}", "{\"b\":true,\"a\":1}", "{\"b\":true,\"c\":1}", "{\"b\":true} "}},
        {"{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"null\"}},\"required\":[\"ab\"],"
         "\"additionalProperties\":{\"type\":\"integer\"}}",
         {"{\"ab\":null}", "{\"ab\":null,\"a\":1}", "{\"ab\":null,\"abc\":2,\"x\":3}"},
         {"{\"ab\":null,\"ab\":1}", "{\"ab\":null,\"a\":true}"}},
        {"{\"type\":\"string\",\"pattern\":\"^a[0-9]{2}(x|yz)?$\"}",
         {"\"a12\"", "\"a00x\"", "\"a99yz\""}, {"\"a1\"", "\"a12y\"", "\"ba12\""}},
        {"{\"type\":\"string\",\"pattern\":\"b+\"}", {"\"b\"", "\"xbbx\"", "\"zzb\""},
         {"\"\"", "\"xyz\""}},
        {"{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-01-31\"", "\"1999-12-30\""},
         {"\"2024-02-30\"", "\"2024-04-31\"", "\"2024-13-01\"", "\"24-01-01\""}},
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"x\",1]},\"minItems\":1,\"maxItems\":2}",
         {"[\"x\"]", "[1, \"x\"]"}, {"[]", "[1,1,1]", "[2]"}},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\","
         "\"items\":{\"$ref\":\"#/$defs/n\"}}},\"required\":[\"k\"],\"additionalProperties\":"
         "false}},\"$ref\":\"#/$defs/n\"}",
         {"{\"k\":[]}", "{\"k\":[{\"k\":[]},{\"k\":[{\"k\":[]}]}]}"}, {"{\"k\":[{}]}"}},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", {"0", "0.25", "1", "1.000"},
         {"1.5", "-0.1", "2"}},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        char err[512];
        grammar_t *g = compile(c[i].schema, err, sizeof err);
        CHECKF(g != NULL, "%s: %s", c[i].schema, err);
        if (!g) continue;
        for (int k = 0; k < 5 && c[i].yes[k]; k++)
            CHECKF(accepts(g, c[i].yes[k]), "%s should accept %s", c[i].schema, c[i].yes[k]);
        for (int k = 0; k < 5 && c[i].no[k]; k++)
            CHECKF(!accepts(g, c[i].no[k]), "%s should reject %s", c[i].schema, c[i].no[k]);
        grammar_release(g);
    }
}

int main(void)
{
    test_cases();
    test_ranges();
    test_documents();
    return check_exit();
}
