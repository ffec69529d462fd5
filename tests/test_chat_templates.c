/* tests/test_chat_templates.c: the Jinja-exact chat templates (engine/chat.c) against the
 * outputs of the models' own Jinja templates, tests/chat_templates/ (made by its gen.py with
 * jinja2; tests/test_chat_templates.py proves they are jinja2's output).
 *
 * - every templates/<name>.jinja (the source as the model ships it) is detected as <name>;
 * - every cases/<name>/<conversation>.json renders, with chat_render_opts, to exactly the bytes
 *   of its .expected file, or fails where jinja2 raised (.error; a raise_exception message is in
 *   spillway's error); chat_render_segments_opts gives the same text (and refuses, with
 *   CHAT_EROLE, only conversations with a role outside the template's list);
 * - with llama.cpp's Llama 3 (llama-bpe), Qwen2, phi-3 and llama-spm (whose <s> BOS Mistral's
 *   SentencePiece vocabularies share) vocabularies, chat_tokenize of each case of llama-3,
 *   llama-3.1, qwen2.5, qwen3, phi-3, phi-3.5, mistral-v0.3 and mistral-nemo without options
 *   gives the ids of the expected text with special-token parsing (BOS once), except where a
 *   content holds control-token text, which stays text;
 * - llama-3.2 without a date option prints today's UTC date. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "engine/chat.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

#define DIR_T SPILLWAY_SOURCE_DIR "/tests/chat_templates"
#define VOCAB(x) SPILLWAY_MODELS "/tokenizer-vectors/ggml-vocab-" x ".gguf"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names in dir ending with suffix (without it); caller frees. */
static int list_dir(const char *dir, const char *suffix, char ***out)
{
    DIR *d = opendir(dir);
    int n = 0, cap = 0;
    char **v = NULL;
    struct dirent *e;
    size_t sl = strlen(suffix);
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || l <= sl || strcmp(e->d_name + l - sl, suffix) != 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            char **nv = realloc(v, sizeof *v * (size_t)cap);
            if (!nv) break;
            v = nv;
        }
        v[n] = malloc(l - sl + 1);
        if (!v[n]) break;
        memcpy(v[n], e->d_name, l - sl);
        v[n][l - sl] = 0;
        n++;
    }
    if (d) closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    return n;
}

static void free_list(char **v, int n)
{
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

typedef struct {
    tokenizer_t *llama3, *qwen2, *spm, *phi3;
} vocabs_t;

static tokenizer_t *load_tok(const char *path)
{
    char err[512];
    gguf_t *g = gguf_open(path, err, sizeof err);
    if (!g) {
        fprintf(stderr, "note: %s: %s (token checks skipped)\n", path, err);
        return NULL;
    }
    tokenizer_t *t = tokenizer_from_gguf(g, err, sizeof err);
    CHECKF(t != NULL, "%s: %s", path, err);
    gguf_close(g);
    return t;
}

/* chat_tokenize of msgs == the expected text's ids (special parsing; its BOS text, if any, is
 * the BOS that tokenizer adds) */
static void check_tokens(const tokenizer_t *t, const char *name, const engine_chat_msg_t *m,
                         int n, int agp, const char *expected, const char *what)
{
    char err[512];
    int32_t *ids = NULL;
    int nid = 0;
    int rc = chat_tokenize(t, name, m, n, agp, &ids, &nid, NULL, err, sizeof err);
    CHECKF(rc == 0, "%s: %s", what, err);
    const char *from = expected, *bos = chat_template_bos(name);
    if (bos && !strncmp(from, bos, strlen(bos)) && tokenizer_add_bos(t)) from += strlen(bos);
    int cap = (int)strlen(expected) + 8;
    int32_t *want = malloc(sizeof *want * (size_t)cap);
    int nw = tokenizer_encode(t, from, strlen(from), 1, 1, want, cap);
    CHECKF(rc == 0 && nw == nid && nw <= cap && !memcmp(ids, want, sizeof *ids * (size_t)nw),
           "%s: %d ids, the expected text gives %d", what, nid, nw);
    free(want);
    free(ids);
}

typedef struct {
    int cases, errors, tokens;
} tally_t;

static void run_case(const char *name, const char *conv, const vocabs_t *vv, tally_t *tally)
{
    char path[1024], what[256], err[512];
    snprintf(what, sizeof what, "%s/%s", name, conv);
    snprintf(path, sizeof path, "%s/cases/%s/%s.json", DIR_T, name, conv);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECKF(root != NULL, "%s: %s", path, je.text);
    if (!root) return;
    const char *tname = json_string_value(json_object_get(root, "template"));
    json_t *jm = json_object_get(root, "messages");
    int agp = json_is_true(json_object_get(root, "add_generation_prompt"));
    chat_opts_t opts = CHAT_OPTS_DEFAULT;
    int has_opts = 0;
    json_t *jt = json_object_get(root, "enable_thinking");
    if (jt) {
        opts.enable_thinking = json_is_true(jt);
        has_opts = 1;
    }
    const char *date = json_string_value(json_object_get(root, "date"));
    if (date) {
        struct tm tm = {0};
        CHECK(sscanf(date, "%d-%d-%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday) == 3);
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        opts.now = (long long)timegm(&tm) + 12 * 3600;
    }
    CHECKF(tname && strcmp(tname, name) == 0, "%s: template %s", what, tname ? tname : "?");
    int n = (int)json_array_size(jm), roles_ok = 1;
    engine_chat_msg_t *m = calloc((size_t)n + 1, sizeof *m);
    const char *roles = chat_template_roles(name);
    for (int i = 0; i < n; i++) {
        json_t *x = json_array_get(jm, (size_t)i);
        m[i].role = json_string_value(json_object_get(x, "role"));
        m[i].content = json_string_value(json_object_get(x, "content"));
        CHECKF(m[i].role && m[i].content, "%s: message %d is not two strings", what, i);
        if (!m[i].role) m[i].role = "";
        /* roles is "a, b, c": is m[i].role one of them? */
        int found = 0;
        for (const char *p = roles; p && *p;) {
            size_t k = strcspn(p, ",");
            found |= strlen(m[i].role) == k && !strncmp(p, m[i].role, k);
            p += k;
            while (*p == ',' || *p == ' ') p++;
        }
        roles_ok &= found;
    }
    size_t elen = 0;
    snprintf(path, sizeof path, "%s/cases/%s/%s.expected", DIR_T, name, conv);
    char *expected = slurp(path, &elen);
    snprintf(path, sizeof path, "%s/cases/%s/%s.error", DIR_T, name, conv);
    char *error = expected ? NULL : slurp(path, NULL);
    CHECKF(expected || error, "%s: neither .expected nor .error", what);

    size_t len = 0;
    err[0] = 0;
    char *got = chat_render_opts(name, m, n, agp, &opts, &len, err, sizeof err);
    if (expected) {
        int same = got && len == elen && memcmp(got, expected, elen) == 0;
        CHECKF(same, "%s: rendered text differs from the template's", what);
        if (!same)
            fprintf(stderr, "  got  [%s]\n  want [%s]\n  (%s)\n", got ? got : "(null)", expected,
                    err);
    } else if (error) {
        CHECKF(!got, "%s: rendered although the template raises %s", what, error);
        const char *msg = strncmp(error, "TemplateError: ", 15) == 0 ? error + 15 : NULL;
        CHECKF(!msg || strstr(err, msg), "%s: error \"%s\" lacks \"%s\"", what, err, msg);
        tally->errors++;
    }
    /* the tokenising path: same text, unless a role is outside the list (then CHAT_EROLE) */
    char *text = NULL;
    tok_segment_t *segs = NULL;
    int ns = 0;
    size_t tl = 0;
    int rc = chat_render_segments_opts(name, m, n, agp, &opts, &text, &tl, &segs, &ns, err,
                                       sizeof err);
    if (!roles_ok) {
        CHECKF(rc == CHAT_EROLE, "%s: a role outside %s, rc %d", what, roles, rc);
    } else if (expected) {
        size_t sum = 0;
        int joined = rc == 0;
        for (int i = 0; joined && i < ns; i++) {
            joined = segs[i].text == text + sum;
            sum += segs[i].len;
        }
        CHECKF(rc == 0 && tl == elen && !memcmp(text, expected, elen) && joined && sum == tl,
               "%s: segments path: rc %d %s", what, rc, err);
    } else {
        CHECKF(rc != 0, "%s: segments path rendered although the template raises", what);
    }
    /* ids, with the model family's vocabulary */
    const tokenizer_t *t = NULL;
    if (!strcmp(name, "llama-3") || !strcmp(name, "llama-3.1")) t = vv->llama3;
    if (!strcmp(name, "qwen2.5") || !strcmp(name, "qwen3")) t = vv->qwen2;
    if (!strcmp(name, "mistral-v0.3") || !strcmp(name, "mistral-nemo")) t = vv->spm; /* <s> */
    if (!strcmp(name, "phi-3") || !strcmp(name, "phi-3.5")) t = vv->phi3;
    if (t && expected && roles_ok && !has_opts && strcmp(conv, "control-text") != 0) {
        check_tokens(t, name, m, n, agp, expected, what);
        tally->tokens++;
    }
    tally->cases++;
    free(text);
    free(segs);
    free(got);
    free(expected);
    free(error);
    free(m);
    json_decref(root);
}

int main(void)
{
    char **names;
    int nn = list_dir(DIR_T "/templates", ".jinja", &names);
    if (nn == 0) {
        printf("SKIP: no templates under %s\n", DIR_T "/templates");
        return 77;
    }
    tally_t tally = {0};
    vocabs_t vv = {load_tok(VOCAB("llama-bpe")), load_tok(VOCAB("qwen2")),
                   load_tok(VOCAB("llama-spm")), load_tok(VOCAB("phi-3"))};
    for (int i = 0; i < nn; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/templates/%s.jinja", DIR_T, names[i]);
        size_t len;
        char *src = slurp(path, &len);
        const char *other = NULL;
        const char *got = src ? chat_template_detect(src, len, &other) : NULL;
        CHECKF(got && strcmp(got, names[i]) == 0, "%s.jinja detected as %s", names[i],
               got ? got : "NULL");
        CHECK(chat_template_exact(names[i]));
        free(src);
        char **convs;
        snprintf(path, sizeof path, "%s/cases/%s", DIR_T, names[i]);
        int nc = list_dir(path, ".json", &convs);
        CHECKF(nc >= 10, "%s: %d cases", names[i], nc);
        for (int c = 0; c < nc; c++) run_case(names[i], convs[c], &vv, &tally);
        free_list(convs, nc);
    }
    /* every Jinja-exact built-in template has its source here */
    int n_exact = 0;
    for (const char *p = engine_chat_template_names(); *p;) {
        size_t k = strcspn(p, ",");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)k, p);
        if (chat_template_exact(name)) {
            n_exact++;
            int found = 0;
            for (int i = 0; i < nn; i++) found |= strcmp(names[i], name) == 0;
            CHECKF(found, "no tests/chat_templates/templates/%s.jinja", name);
        }
        p += k;
        while (*p == ',' || *p == ' ') p++;
    }
    CHECK(n_exact == nn);

    /* llama-3.2's default date is today's (UTC), as "%d %b %Y" */
    {
        engine_chat_msg_t one = {"user", "hi"};
        char err[256], want[64];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(want, sizeof want, "Today Date: %d %b %Y\n", &tm);
        char *s = chat_render("llama-3.2", &one, 1, 1, NULL, err, sizeof err);
        CHECKF(s && strstr(s, want), "llama-3.2 today: %s", s ? s : err);
        free(s);
    }
    printf("%d templates, %d cases (%d where the template raises), %d token checks\n", nn,
           tally.cases, tally.errors, tally.tokens);
    free_list(names, nn);
    tokenizer_free(vv.llama3);
    tokenizer_free(vv.qwen2);
    tokenizer_free(vv.spm);
    tokenizer_free(vv.phi3);
    return check_exit();
}
