/* tests/test_tokenizer.c: the tokenizer against llama.cpp's tokenizer test vectors (every
 * X.gguf / X.gguf.inp / X.gguf.out triple in models/tokenizer-vectors), the stories260K prompt,
 * decoding round trips, the streaming decoder's UTF-8 contract, special-token parsing, and the
 * errors for unsupported vocabularies (GGUF files built in memory). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "support/utf8_check.h"

#define VEC_DIR SPILLWAY_MODELS "/tokenizer-vectors"

static const char *const k_vocabs[] = {
    "llama-spm", "phi-3", "gpt-2", "deepseek-coder", "deepseek-llm",
    "falcon", "mpt", "starcoder", "refact", "llama-bpe", "qwen2",
};
#define N_VOCABS (sizeof k_vocabs / sizeof k_vocabs[0])

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    *len = n;
    return buf;
}

typedef struct {
    gguf_t *g;
    tokenizer_t *t;
} vocab_t;

static int load_vocab(const char *path, vocab_t *v)
{
    char err[512] = "";
    v->t = NULL;
    v->g = gguf_open(path, err, sizeof err);
    if (!v->g) {
        fprintf(stderr, "gguf_open(%s): %s\n", path, err);
        return -1;
    }
    v->t = tokenizer_from_gguf(v->g, err, sizeof err);
    if (!v->t) {
        fprintf(stderr, "tokenizer_from_gguf(%s): %s\n", path, err);
        gguf_close(v->g);
        v->g = NULL;
        return -1;
    }
    return 0;
}

static void free_vocab(vocab_t *v)
{
    tokenizer_free(v->t);
    gguf_close(v->g);
}

/* Encodes into a malloc'd array (two passes: count, then fill). */
static int32_t *encode(const tokenizer_t *t, const char *s, size_t len, int add_special,
                       int parse_special, int *n_out)
{
    int n = tokenizer_encode(t, s, len, add_special, parse_special, NULL, 0);
    *n_out = n;
    if (n < 0) return NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)(n + 1));
    int n2 = tokenizer_encode(t, s, len, add_special, parse_special, ids, n);
    if (n2 != n) {
        free(ids);
        *n_out = -1;
        return NULL;
    }
    return ids;
}

/* Concatenated pieces (render_special 0); malloc'd, length in *len. */
static char *pieces(const tokenizer_t *t, const int32_t *ids, int n, size_t *len)
{
    size_t cap = 64, w = 0;
    char *out = malloc(cap);
    for (int i = 0; i < n; i++) {
        int k = tokenizer_token_to_piece(t, ids[i], 0, NULL, 0);
        if (k < 0) {
            free(out);
            return NULL;
        }
        while (w + (size_t)k + 1 > cap) out = realloc(out, cap *= 2);
        tokenizer_token_to_piece(t, ids[i], 0, out + w, (size_t)k);
        w += (size_t)k;
    }
    out[w] = 0;
    *len = w;
    return out;
}

/* Streams ids through the decoder; every chunk must be complete UTF-8. Malloc'd result. */
static char *stream_decode(const tokenizer_t *t, const int32_t *ids, int n, int at_start,
                           size_t *len, int *partial_chunks)
{
    tok_stream_t st;
    tokenizer_stream_init(&st, at_start);
    size_t cap = 256, w = 0;
    char *out = malloc(cap);
    char chunk[4096 + 64];
    *partial_chunks = 0;
    for (int i = 0; i <= n; i++) {
        int k = i < n ? tokenizer_stream_push(t, &st, ids[i], chunk, sizeof chunk)
                      : tokenizer_stream_flush(t, &st, chunk, sizeof chunk);
        if (k < 0) {
            free(out);
            return NULL;
        }
        if (!utf8_complete((const unsigned char *)chunk, (size_t)k)) (*partial_chunks)++;
        while (w + (size_t)k + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + w, chunk, (size_t)k);
        w += (size_t)k;
    }
    out[w] = 0;
    *len = w;
    return out;
}

/* ---- test vectors ---- */

typedef struct {
    char **inp;
    size_t *inp_len;
    int n;
    int32_t **exp;
    int *exp_n;
} vectors_t;

static void free_vectors(vectors_t *v)
{
    for (int i = 0; i < v->n; i++) {
        free(v->inp[i]);
        free(v->exp[i]);
    }
    free(v->inp);
    free(v->inp_len);
    free(v->exp);
    free(v->exp_n);
}

/* Parses X.inp / X.out exactly as llama.cpp's tests/test-tokenizer-0 does: inputs separated by
 * "\n__ggml_vocab_test__\n" (a trailing separator does not open another input), outputs one
 * std::getline line each, stripped, ids separated by single spaces. */
static int read_vectors(const char *base, vectors_t *v)
{
    char path[1024];
    size_t ilen, olen;
    snprintf(path, sizeof path, "%s.inp", base);
    char *inp = read_file(path, &ilen);
    snprintf(path, sizeof path, "%s.out", base);
    char *out = read_file(path, &olen);
    memset(v, 0, sizeof *v);
    if (!inp || !out) {
        free(inp);
        free(out);
        return -1;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof sep - 1;
    int cap = 16;
    v->inp = malloc(sizeof *v->inp * (size_t)cap);
    v->inp_len = malloc(sizeof *v->inp_len * (size_t)cap);
    size_t pos = 0;
    while (pos < ilen) {
        size_t next = pos;
        while (next + sl <= ilen && memcmp(inp + next, sep, sl) != 0) next++;
        int last = next + sl > ilen;
        size_t end = last ? ilen : next;
        if (v->n == cap) {
            cap *= 2;
            v->inp = realloc(v->inp, sizeof *v->inp * (size_t)cap);
            v->inp_len = realloc(v->inp_len, sizeof *v->inp_len * (size_t)cap);
        }
        v->inp[v->n] = malloc(end - pos + 1);
        memcpy(v->inp[v->n], inp + pos, end - pos);
        v->inp[v->n][end - pos] = 0;
        v->inp_len[v->n] = end - pos;
        v->n++;
        if (last) break;
        pos = next + sl;
    }
    /* output lines */
    int n_lines = 0;
    v->exp = calloc((size_t)v->n + 1, sizeof *v->exp);
    v->exp_n = calloc((size_t)v->n + 1, sizeof *v->exp_n);
    pos = 0;
    while (pos < olen) {
        size_t e = pos;
        while (e < olen && out[e] != '\n') e++;
        if (n_lines < v->n) {
            int32_t *ids = malloc(sizeof *ids * (e - pos + 1));
            int k = 0;
            size_t p = pos;
            while (p < e) {
                while (p < e && (out[p] == ' ' || out[p] == '\t' || out[p] == '\r')) p++;
                if (p >= e) break;
                ids[k++] = (int32_t)strtol(out + p, NULL, 10);
                while (p < e && out[p] != ' ') p++;
            }
            v->exp[n_lines] = ids;
            v->exp_n[n_lines] = k;
        }
        n_lines++;
        pos = e + 1;
    }
    free(inp);
    free(out);
    if (n_lines != v->n) {
        fprintf(stderr, "%s: %d inputs but %d output lines\n", base, v->n, n_lines);
        return -1;
    }
    return 0;
}

static void print_ids(const char *what, const int32_t *ids, int n)
{
    fprintf(stderr, "    %s (%d):", what, n);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

typedef struct {
    int n, enc_ok, rt_ok;
} vec_result_t;

static vec_result_t run_vectors(const char *name)
{
    vec_result_t r = {0, 0, 0};
    char base[1024];
    snprintf(base, sizeof base, "%s/ggml-vocab-%s.gguf", VEC_DIR, name);
    vocab_t v;
    vectors_t vec;
    CHECKF(load_vocab(base, &v) == 0, "%s", name);
    if (!v.t) return r;
    CHECKF(read_vectors(base, &vec) == 0, "%s", name);
    r.n = vec.n;
    for (int i = 0; i < vec.n; i++) {
        int n;
        int32_t *ids = encode(v.t, vec.inp[i], vec.inp_len[i], 0, 0, &n);
        int ok = ids && n == vec.exp_n[i] &&
                 (n == 0 || memcmp(ids, vec.exp[i], sizeof *ids * (size_t)n) == 0);
        if (ok) r.enc_ok++;
        else {
            fprintf(stderr, "  %s: input %d '%s' encodes differently\n", name, i, vec.inp[i]);
            print_ids("expected", vec.exp[i], vec.exp_n[i]);
            if (ids) print_ids("got", ids, n);
        }
        /* decode: streaming (at text start) and piece by piece give the input back */
        if (ids) {
            size_t dl, pl;
            int partial;
            char *d = stream_decode(v.t, ids, n, 1, &dl, &partial);
            char *p = pieces(v.t, ids, n, &pl);
            int rt = d && dl == vec.inp_len[i] && memcmp(d, vec.inp[i], dl) == 0 && partial == 0;
            /* pieces keep SPM's dummy prefix: one extra leading space */
            int ptok = p && ((pl == vec.inp_len[i] && memcmp(p, vec.inp[i], pl) == 0) ||
                             (pl == vec.inp_len[i] + 1 && p[0] == ' ' &&
                              memcmp(p + 1, vec.inp[i], pl - 1) == 0));
            if (rt && ptok) r.rt_ok++;
            else
                fprintf(stderr, "  %s: input %d '%s' decodes to '%s' / pieces '%s'\n", name, i,
                        vec.inp[i], d ? d : "(null)", p ? p : "(null)");
            free(d);
            free(p);
        }
        free(ids);
    }
    free_vectors(&vec);
    free_vocab(&v);
    return r;
}

/* ---- concurrency: encode from several threads at once, compare with the serial result ---- */

typedef struct {
    const tokenizer_t *t;
    const vectors_t *vec;
    int mismatches;
} thr_arg_t;

static void *thr_encode(void *p)
{
    thr_arg_t *a = p;
    for (int rep = 0; rep < 3; rep++)
        for (int i = 0; i < a->vec->n; i++) {
            int n;
            int32_t *ids = encode(a->t, a->vec->inp[i], a->vec->inp_len[i], 0, 0, &n);
            if (!ids || n != a->vec->exp_n[i] ||
                (n && memcmp(ids, a->vec->exp[i], sizeof *ids * (size_t)n) != 0))
                a->mismatches++;
            free(ids);
        }
    return NULL;
}

static void test_threads(void)
{
    char base[1024];
    snprintf(base, sizeof base, "%s/ggml-vocab-deepseek-llm.gguf", VEC_DIR);
    vocab_t v;
    vectors_t vec;
    if (load_vocab(base, &v) != 0) {
        CHECK(0);
        return;
    }
    CHECK(read_vectors(base, &vec) == 0);
    enum { NT = 4 };
    pthread_t th[NT];
    thr_arg_t args[NT];
    for (int k = 0; k < NT; k++) {
        args[k] = (thr_arg_t){v.t, &vec, 0};
        CHECK(pthread_create(&th[k], NULL, thr_encode, &args[k]) == 0);
    }
    int bad = 0;
    for (int k = 0; k < NT; k++) {
        pthread_join(th[k], NULL);
        bad += args[k].mismatches;
    }
    CHECKF(bad == 0, "%d mismatches across threads", bad);
    free_vectors(&vec);
    free_vocab(&v);
}

/* ---- stories260K ---- */

static void test_stories(void)
{
    vocab_t v;
    if (load_vocab(SPILLWAY_MODELS "/stories260K.gguf", &v) != 0) {
        CHECK(0);
        return;
    }
    const tokenizer_t *t = v.t;
    CHECK(tokenizer_n_vocab(t) == 512);
    CHECK(tokenizer_bos(t) == 1);
    CHECK(tokenizer_eos(t) == 2);
    CHECK(tokenizer_add_bos(t) == 1);
    CHECK(tokenizer_add_eos(t) == 0);
    CHECK(tokenizer_is_eog(t, 2));
    CHECK(!tokenizer_is_eog(t, 1));
    CHECK(tokenizer_is_control(t, 1) && tokenizer_is_control(t, 2));
    CHECK(!tokenizer_is_control(t, 403));
    CHECK(tokenizer_find(t, "\xe2\x96\x81Once", 7) == 403);
    CHECK(tokenizer_find(t, "no such token", 13) == -1);

    const char *s = "Once upon a time";
    int n;
    int32_t *ids = encode(t, s, strlen(s), 1, 0, &n);
    static const int32_t exp[] = {1, 403, 407, 261, 378};
    CHECKF(ids && n == 5 && memcmp(ids, exp, sizeof exp) == 0, "n=%d", n);
    if (ids) print_ids("stories 'Once upon a time'", ids, n);

    /* truncated output: the count is still the full one */
    int32_t two[2];
    CHECK(tokenizer_encode(t, s, strlen(s), 1, 0, two, 2) == 5);
    CHECK(two[0] == 1 && two[1] == 403);

    size_t dl;
    int partial;
    char *d = stream_decode(t, ids, n, 1, &dl, &partial);
    CHECKF(d && strcmp(d, s) == 0, "'%s'", d ? d : "");
    free(d);
    /* not at text start: the dummy-prefix space stays */
    d = stream_decode(t, ids, n, 0, &dl, &partial);
    CHECKF(d && strcmp(d, " Once upon a time") == 0, "'%s'", d ? d : "");
    free(d);
    free(ids);

    /* the golden continuation decodes to the reference text */
    static const int32_t story[] = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421,
                                    395, 317, 426, 338, 401, 396, 267, 337};
    d = stream_decode(t, story, (int)(sizeof story / sizeof story[0]), 1, &dl, &partial);
    CHECKF(d && strcmp(d, "Once upon a time, there was a little girl named Lily. She loved to "
                          "play") == 0,
           "'%s'", d ? d : "");
    free(d);

    /* special text: only with parse_special */
    ids = encode(t, "<s>Hi", 5, 0, 1, &n);
    CHECKF(ids && n >= 2 && ids[0] == 1, "n=%d", n);
    free(ids);
    ids = encode(t, "<s>Hi", 5, 0, 0, &n);
    CHECKF(ids && n >= 2 && ids[0] != 1, "n=%d", n);
    free(ids);

    /* piece API */
    char buf[16];
    CHECK(tokenizer_token_to_piece(t, 403, 0, buf, sizeof buf) == 5 && memcmp(buf, " Once", 5) == 0);
    CHECK(tokenizer_token_to_piece(t, 403, 0, buf, 2) == 5 && memcmp(buf, " O", 2) == 0);
    CHECK(tokenizer_token_to_piece(t, 1, 0, buf, sizeof buf) == 0);
    CHECK(tokenizer_token_to_piece(t, 1, 1, buf, sizeof buf) == 3 && memcmp(buf, "<s>", 3) == 0);
    CHECK(tokenizer_token_to_piece(t, 3 + 0x41, 0, buf, sizeof buf) == 1 && buf[0] == 'A');
    CHECK(tokenizer_token_to_piece(t, 512, 0, buf, sizeof buf) == -1);
    CHECK(tokenizer_token_to_piece(t, -1, 0, buf, sizeof buf) == -1);
    free_vocab(&v);
}

/* ---- streaming decoder: never a partial character ---- */

static void test_stream(void)
{
    char base[1024];
    snprintf(base, sizeof base, "%s/ggml-vocab-llama-spm.gguf", VEC_DIR);
    vocab_t v;
    if (load_vocab(base, &v) != 0) {
        CHECK(0);
        return;
    }
    const tokenizer_t *t = v.t;
    const char *s = "h\xc3\xa9llo w\xc3\xb6rld \xf0\x9f\xa6\x99 \xe6\x97\xa5\xe6\x9c\xac "
                    "\xe2\x9c\x93 \xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe";
    size_t sl = strlen(s);
    int32_t *ids = malloc(sizeof *ids * sl);
    for (size_t i = 0; i < sl; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", (unsigned char)s[i]);
        ids[i] = tokenizer_find(t, name, 6);
        CHECK(ids[i] >= 0);
    }
    size_t dl;
    int partial;
    char *d = stream_decode(t, ids, (int)sl, 1, &dl, &partial);
    CHECKF(d && dl == sl && memcmp(d, s, sl) == 0 && partial == 0, "partial=%d", partial);
    free(d);

    /* chunk by chunk: a multi-byte character appears only with its last byte */
    tok_stream_t st;
    tokenizer_stream_init(&st, 0);
    char out[64];
    int32_t lama[4];
    for (int k = 0; k < 4; k++) lama[k] = ids[14 + k]; /* the 4 bytes of U+1F999 */
    CHECK((unsigned char)s[14] == 0xF0);
    CHECK(tokenizer_stream_push(t, &st, lama[0], out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, lama[1], out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, lama[2], out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, lama[3], out, sizeof out) == 4 &&
          memcmp(out, s + 14, 4) == 0);
    /* too small a buffer: -1 and nothing consumed */
    CHECK(tokenizer_stream_push(t, &st, lama[0], out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, lama[1], out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, lama[2], out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, lama[3], out, 3) == -1);
    CHECK(tokenizer_stream_push(t, &st, lama[3], out, 4) == 4 && memcmp(out, s + 14, 4) == 0);
    free(ids);

    /* invalid sequences become U+FFFD; an incomplete tail is flushed as U+FFFD */
    int32_t ff = tokenizer_find(t, "<0xFF>", 6), e6 = tokenizer_find(t, "<0xE6>", 6);
    int32_t x97 = tokenizer_find(t, "<0x97>", 6), a = tokenizer_find(t, "<0x61>", 6);
    tokenizer_stream_init(&st, 0);
    CHECK(tokenizer_stream_push(t, &st, ff, out, sizeof out) == 3 &&
          memcmp(out, "\xef\xbf\xbd", 3) == 0);
    CHECK(tokenizer_stream_push(t, &st, e6, out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, a, out, sizeof out) == 4 &&
          memcmp(out, "\xef\xbf\xbd" "a", 4) == 0);
    CHECK(tokenizer_stream_push(t, &st, e6, out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, x97, out, sizeof out) == 0);
    CHECK(tokenizer_stream_flush(t, &st, out, sizeof out) == 3 &&
          memcmp(out, "\xef\xbf\xbd", 3) == 0);
    CHECK(tokenizer_stream_flush(t, &st, out, sizeof out) == 0);
    CHECK(tokenizer_stream_push(t, &st, tokenizer_n_vocab(t), out, sizeof out) == -1);

    /* at text start: control tokens render nothing and keep the start state */
    tokenizer_stream_init(&st, 1);
    CHECK(tokenizer_stream_push(t, &st, 1, out, sizeof out) == 0);
    int32_t hello = tokenizer_find(t, "\xe2\x96\x81Hello", 8);
    CHECK(hello >= 0);
    CHECK(tokenizer_stream_push(t, &st, hello, out, sizeof out) == 5 &&
          memcmp(out, "Hello", 5) == 0);
    CHECK(tokenizer_stream_push(t, &st, hello, out, sizeof out) == 6 &&
          memcmp(out, " Hello", 6) == 0);
    free_vocab(&v);

    /* byte-level BPE: characters split across tokens are held back until complete */
    snprintf(base, sizeof base, "%s/ggml-vocab-gpt-2.gguf", VEC_DIR);
    if (load_vocab(base, &v) != 0) {
        CHECK(0);
        return;
    }
    int n;
    ids = encode(v.t, s, sl, 0, 0, &n);
    CHECK(ids && n > 0);
    d = stream_decode(v.t, ids, n, 1, &dl, &partial);
    CHECKF(d && dl == sl && memcmp(d, s, sl) == 0 && partial == 0, "partial=%d", partial);
    free(d);
    int held = 0; /* some token must end inside a character for this test to mean anything */
    tokenizer_stream_init(&st, 1);
    for (int i = 0; i < n; i++) {
        char piece[64];
        int pk = tokenizer_token_to_piece(v.t, ids[i], 0, piece, sizeof piece);
        int k = tokenizer_stream_push(v.t, &st, ids[i], out, sizeof out);
        if (pk > 0 && k != pk) held++;
    }
    CHECKF(held > 0, "no token ended inside a character");
    free(ids);
    free_vocab(&v);
}

/* ---- invalid UTF-8 survives encode -> decode ---- */

/* GPT-2 byte -> symbol (UTF-8 of the code point), for checking which bytes a BPE vocabulary
 * can represent. */
static size_t gpt2_symbol(unsigned char b, char *u)
{
    int n = 0, cp = -1;
    for (int c = 0; c < 256 && cp < 0; c++) {
        int printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        if (c == b) cp = printable ? c : 256 + n;
        if (!printable) n++;
    }
    if (cp < 0x80) {
        u[0] = (char)cp;
        return 1;
    }
    u[0] = (char)(0xC0 | (cp >> 6));
    u[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static void test_invalid_utf8(void)
{
    static const char *const inputs[] = {
        "\xff\xfe abc \xc3(",          "\xe2\x82",
        "a\x80" "b",                   "\xf0\x9f\xa6",
        "overlong \xc0\xaf and \xe0\x80\xaf", "surrogate \xed\xa0\x80!",
        "\xf4\x90\x80\x80 above U+10FFFF", "  tail \xe6\x97",
    };
    static const char *const vocabs[] = {"llama-spm", "phi-3", "gpt-2", "deepseek-llm",
                                         "falcon", "starcoder", "llama-bpe", "qwen2"};
    for (size_t k = 0; k < sizeof vocabs / sizeof vocabs[0]; k++) {
        char base[1024];
        snprintf(base, sizeof base, "%s/ggml-vocab-%s.gguf", VEC_DIR, vocabs[k]);
        vocab_t v;
        if (load_vocab(base, &v) != 0) {
            CHECK(0);
            continue;
        }
        int spm = k < 2, n_missing = 0;
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
            /* expected text: the input, where a BPE vocabulary lacks a byte's symbol U+FFFD */
            size_t il = strlen(inputs[i]), el = 0, pl;
            char exp[256];
            for (size_t j = 0; j < il; j++) {
                char u[2], pc[8];
                size_t ul = gpt2_symbol((unsigned char)inputs[i][j], u);
                int32_t bt = spm ? 0 : tokenizer_find(v.t, u, ul);
                if (!spm && (bt < 0 || tokenizer_token_to_piece(v.t, bt, 0, pc, sizeof pc) != 1 ||
                             pc[0] != inputs[i][j])) {
                    memcpy(exp + el, "\xef\xbf\xbd", 3);
                    el += 3;
                    n_missing++;
                } else
                    exp[el++] = inputs[i][j];
            }
            int n;
            int32_t *ids = encode(v.t, inputs[i], il, 0, 0, &n);
            char *p = ids ? pieces(v.t, ids, n, &pl) : NULL;
            /* SPM pieces keep the dummy-prefix space */
            int ok = p && (spm ? (pl == el + 1 && p[0] == ' ' && memcmp(p + 1, exp, el) == 0)
                               : (pl == el && memcmp(p, exp, el) == 0));
            CHECKF(ok, "%s input %zu -> '%s'", vocabs[k], i, p ? p : "");
            /* the stream decoder still emits only complete, valid UTF-8 */
            size_t dl;
            int partial;
            char *d = ids ? stream_decode(v.t, ids, n, 1, &dl, &partial) : NULL;
            CHECKF(d && partial == 0 && utf8_complete((const unsigned char *)d, dl),
                   "%s input %zu", vocabs[k], i);
            free(d);
            free(p);
            free(ids);
        }
        if (strcmp(vocabs[k], "gpt-2") == 0) CHECK(n_missing == 0); /* all 256 bytes */
        printf("  invalid UTF-8 through %-13s: %s (%d unrepresentable bytes -> U+FFFD)\n",
               vocabs[k], check_failures_ ? "see failures" : "ok", n_missing);
        free_vocab(&v);
    }
}

/* ---- special tokens, eog ---- */

static int contains(const int32_t *ids, int n, int32_t id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

static void test_special(void)
{
    char base[1024];
    vocab_t v;
    int n;
    int32_t *ids;

    snprintf(base, sizeof base, "%s/ggml-vocab-phi-3.gguf", VEC_DIR);
    if (load_vocab(base, &v) == 0) {
        CHECK(tokenizer_eos(v.t) == 32000);
        CHECK(tokenizer_is_eog(v.t, 32000)); /* <|endoftext|> */
        CHECK(tokenizer_is_eog(v.t, 32007)); /* <|end|> */
        CHECK(!tokenizer_is_eog(v.t, 32010)); /* <|user|> */
        const char *s = "<|user|>\nHi<|end|>\n<|assistant|>";
        ids = encode(v.t, s, strlen(s), 1, 1, &n);
        CHECKF(ids && n >= 5 && ids[0] == 1 && ids[1] == 32010 && ids[n - 1] == 32001 &&
                   contains(ids, n, 32007),
               "n=%d", n);
        if (ids) print_ids("phi-3 chat", ids, n);
        free(ids);
        ids = encode(v.t, s, strlen(s), 0, 0, &n);
        CHECK(ids && !contains(ids, n, 32010) && !contains(ids, n, 32007));
        free(ids);
        free_vocab(&v);
    } else
        CHECK(0);

    /* mpt: runs of spaces are user-defined tokens, split out even without parse_special,
     * longest first */
    snprintf(base, sizeof base, "%s/ggml-vocab-mpt.gguf", VEC_DIR);
    if (load_vocab(base, &v) == 0) {
        ids = encode(v.t, "a     b", 7, 0, 0, &n);
        int32_t five = tokenizer_find(v.t, "     ", 5);
        CHECKF(ids && five >= 0 && contains(ids, n, five), "n=%d", n);
        free(ids);
        ids = encode(v.t, "<|endoftext|>x", 14, 0, 1, &n);
        CHECK(ids && n >= 2 && ids[0] == 0);
        free(ids);
        ids = encode(v.t, "<|endoftext|>x", 14, 0, 0, &n);
        CHECK(ids && n >= 2 && ids[0] != 0);
        free(ids);
        CHECK(tokenizer_is_eog(v.t, 0));
        CHECK(tokenizer_add_bos(v.t) == 0);
        free_vocab(&v);
    } else
        CHECK(0);

    snprintf(base, sizeof base, "%s/ggml-vocab-gpt-2.gguf", VEC_DIR);
    if (load_vocab(base, &v) == 0) {
        CHECK(tokenizer_is_eog(v.t, 50256));
        CHECK(tokenizer_is_control(v.t, 50256));
        char buf[32];
        CHECK(tokenizer_token_to_piece(v.t, 50256, 0, buf, sizeof buf) == 0);
        CHECK(tokenizer_token_to_piece(v.t, 50256, 1, buf, sizeof buf) == 13);
        free_vocab(&v);
    } else
        CHECK(0);
}

/* ---- GGUF built in memory: unsupported vocabularies, and a tiny BPE ---- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    uint64_t n_kv;
} gbuf_t;

static void gb_put(gbuf_t *b, const void *d, size_t k)
{
    while (b->n + k > b->cap) b->p = realloc(b->p, b->cap = b->cap ? b->cap * 2 : 256);
    memcpy(b->p + b->n, d, k);
    b->n += k;
}
static void gb_u32(gbuf_t *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gbuf_t *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(gbuf_t *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static void gb_kv_str(gbuf_t *b, const char *k, const char *v)
{
    gb_str(b, k);
    gb_u32(b, GGUF_STRING);
    gb_str(b, v);
    b->n_kv++;
}
static void gb_kv_strs(gbuf_t *b, const char *k, const char *const *v, int n)
{
    gb_str(b, k);
    gb_u32(b, GGUF_ARRAY);
    gb_u32(b, GGUF_STRING);
    gb_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) gb_str(b, v[i]);
    b->n_kv++;
}

/* GGUF v3, no tensors: "GGUF", version, n_tensors, n_kv, then the kvs. */
static tokenizer_t *tok_from_kvs(gbuf_t *kvs, char *err, size_t errlen, gguf_t **g)
{
    gbuf_t f = {0};
    gb_put(&f, "GGUF", 4);
    gb_u32(&f, 3);
    gb_u64(&f, 0);
    gb_u64(&f, kvs->n_kv);
    gb_put(&f, kvs->p, kvs->n);
    free(kvs->p);
    *g = gguf_open_mem(f.p, f.n, err, errlen);
    tokenizer_t *t = NULL;
    if (*g) t = tokenizer_from_gguf(*g, err, errlen);
    else fprintf(stderr, "gguf_open_mem: %s\n", err);
    /* the tokenizer copied what it needs: the file may go */
    if (*g) {
        gguf_close(*g);
        *g = NULL;
    }
    free(f.p);
    return t;
}

static void test_unsupported(void)
{
    static const char *const toks[] = {"a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "ab", "<|endoftext|>"};
    static const char *const merges[] = {"a b", "\xc4\xa0 ab"};
    char err[1024];
    gguf_t *g;

    gbuf_t kv = {0};
    gb_kv_str(&kv, "tokenizer.ggml.model", "bert");
    gb_kv_strs(&kv, "tokenizer.ggml.tokens", toks, 6);
    err[0] = 0;
    tokenizer_t *t = tok_from_kvs(&kv, err, sizeof err, &g);
    CHECK(t == NULL);
    CHECKF(strstr(err, "'bert'") && strstr(err, "llama") && strstr(err, "gpt2") &&
               strstr(err, "WPM"),
           "%s", err);
    printf("unsupported model error: %s\n", err);
    tokenizer_free(t);

    kv = (gbuf_t){0};
    gb_kv_str(&kv, "tokenizer.ggml.model", "t5");
    gb_kv_strs(&kv, "tokenizer.ggml.tokens", toks, 6);
    t = tok_from_kvs(&kv, err, sizeof err, &g);
    CHECKF(t == NULL && strstr(err, "'t5'"), "%s", err);
    tokenizer_free(t);

    kv = (gbuf_t){0};
    gb_kv_str(&kv, "tokenizer.ggml.model", "gpt2");
    gb_kv_str(&kv, "tokenizer.ggml.pre", "nonesuch-pre");
    gb_kv_strs(&kv, "tokenizer.ggml.tokens", toks, 6);
    gb_kv_strs(&kv, "tokenizer.ggml.merges", merges, 2);
    t = tok_from_kvs(&kv, err, sizeof err, &g);
    CHECK(t == NULL);
    CHECKF(strstr(err, "'nonesuch-pre'") && strstr(err, "llama-bpe") && strstr(err, "qwen2") &&
               strstr(err, "deepseek-coder"),
           "%s", err);
    printf("unsupported pre error: %s\n", err);
    tokenizer_free(t);

    /* missing merges */
    kv = (gbuf_t){0};
    gb_kv_str(&kv, "tokenizer.ggml.model", "gpt2");
    gb_kv_strs(&kv, "tokenizer.ggml.tokens", toks, 6);
    t = tok_from_kvs(&kv, err, sizeof err, &g);
    CHECKF(t == NULL && strstr(err, "merges"), "%s", err);
    tokenizer_free(t);

    /* a tiny working BPE: " ab" -> "Ġab"; "ba" -> b a; "<|endoftext|>" is not special here
     * (no token types: all normal) */
    kv = (gbuf_t){0};
    gb_kv_str(&kv, "tokenizer.ggml.model", "gpt2");
    gb_kv_str(&kv, "tokenizer.ggml.pre", "gpt-2");
    gb_kv_strs(&kv, "tokenizer.ggml.tokens", toks, 6);
    gb_kv_strs(&kv, "tokenizer.ggml.merges", merges, 2);
    t = tok_from_kvs(&kv, err, sizeof err, &g);
    CHECKF(t != NULL, "%s", err);
    if (t) {
        int32_t out[8];
        CHECK(tokenizer_encode(t, " ab", 3, 0, 0, out, 8) == 1 && out[0] == 4);
        CHECK(tokenizer_encode(t, "ba", 2, 0, 0, out, 8) == 2 && out[0] == 1 && out[1] == 0);
        CHECK(tokenizer_encode(t, "ab ab", 5, 0, 0, out, 8) == 2 && out[0] == 2 && out[1] == 4);
        CHECK(tokenizer_add_bos(t) == 0);
        CHECK(tokenizer_bos(t) == -1); /* default 11 is out of range */
        CHECK(tokenizer_is_eog(t, 5)); /* by its text, as llama.cpp does */
        char buf[8];
        CHECK(tokenizer_token_to_piece(t, 4, 0, buf, sizeof buf) == 3 && memcmp(buf, " ab", 3) == 0);
        tokenizer_free(t);
    }
}

/* Every pre-tokenizer compiles and cuts "x 1234 ab" its own way. A tiny byte-level vocabulary
 * (all 256 byte symbols plus "Ġ1", "12", "123", "1234", "ab", "Ġab") with merges "Ġ 1",
 * "1 2", "12 3", "123 4", "a b", "Ġ ab" makes the cuts visible: " 1234" in one pre-token gives
 * " 1|2|3|4"; a space cut off before the digits gives " |1234" or finer digit groups. */
static void test_pre_variants(void)
{
    static const struct {
        const char *pre, *pieces; /* expected pieces, '|'-separated */
    } cases[] = {
        {"default", "x| |123|4| ab"},      {"gpt-2", "x| 1|2|3|4| ab"},
        {"mpt", "x| 1|2|3|4| ab"},         {"olmo", "x| 1|2|3|4| ab"},
        {"llama-bpe", "x| |123|4| ab"},    {"dbrx", "x| |123|4| ab"},
        {"qwen2", "x| |1|2|3|4| ab"},      {"deepseek-llm", "x| |1234| ab"},
        {"deepseek-coder", "x| |1|2|3|4| ab"}, {"falcon", "x| |123|4| ab"},
        {"starcoder", "x| |1|2|3|4| ab"},  {"refact", "x| |1|2|3|4| ab"},
        {"smollm", "x| |1|2|3|4| ab"},     {"gpt-4o", "x| |123|4| ab"},
        {"tekken", "x| |1|2|3|4| ab"},
    };
    char sym[256][3];
    const char *toks[256 + 6];
    for (int b = 0; b < 256; b++) {
        size_t k = gpt2_symbol((unsigned char)b, sym[b]);
        sym[b][k] = 0;
        toks[b] = sym[b];
    }
    toks[256] = "12";
    toks[257] = "123";
    toks[258] = "1234";
    toks[259] = "ab";
    toks[260] = "\xc4\xa0" "1";
    toks[261] = "\xc4\xa0" "ab";
    static const char *const merges[] = {"\xc4\xa0 1", "1 2", "12 3", "123 4", "a b",
                                         "\xc4\xa0 ab"};
    const char *text = "x 1234 ab";
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gbuf_t kv = {0};
        char err[512] = "";
        gguf_t *g;
        gb_kv_str(&kv, "tokenizer.ggml.model", "gpt2");
        gb_kv_str(&kv, "tokenizer.ggml.pre", cases[c].pre);
        gb_kv_strs(&kv, "tokenizer.ggml.tokens", toks, 262);
        gb_kv_strs(&kv, "tokenizer.ggml.merges", merges, 6);
        tokenizer_t *t = tok_from_kvs(&kv, err, sizeof err, &g);
        CHECKF(t != NULL, "pre %s: %s", cases[c].pre, err);
        if (!t) continue;
        int32_t ids[32];
        int n = tokenizer_encode(t, text, strlen(text), 0, 0, ids, 32);
        char got[128] = "";
        size_t w = 0;
        for (int i = 0; i < n && i < 32; i++) {
            if (i) got[w++] = '|';
            int k = tokenizer_token_to_piece(t, ids[i], 0, got + w, sizeof got - w - 1);
            w += (size_t)(k > 0 ? k : 0);
            got[w] = 0;
        }
        CHECKF(strcmp(got, cases[c].pieces) == 0, "pre %s: '%s', expected '%s'", cases[c].pre,
               got, cases[c].pieces);
        /* any valid UTF-8 round-trips through a full byte vocabulary */
        const char *u = "Z\xc3\xbcrich 3.14 \xf0\x9f\xa6\x99\t\n  \xe6\x97\xa5\xe6\x9c\xac it's";
        int32_t many[128];
        n = tokenizer_encode(t, u, strlen(u), 0, 0, many, 128);
        size_t pl;
        char *p = n > 0 && n <= 128 ? pieces(t, many, n, &pl) : NULL;
        CHECKF(p && pl == strlen(u) && memcmp(p, u, pl) == 0, "pre %s", cases[c].pre);
        free(p);
        tokenizer_free(t);
    }
    /* llama-bpe ignores merges for a pre-token that is itself a token */
    {
        const char *toks2[] = {"a", "b", "c", "abc"};
        const char *const merges2[] = {"a b"};
        for (int k = 0; k < 2; k++) {
            gbuf_t kv = {0};
            char err[512] = "";
            gguf_t *g;
            gb_kv_str(&kv, "tokenizer.ggml.model", "gpt2");
            gb_kv_str(&kv, "tokenizer.ggml.pre", k ? "llama-bpe" : "gpt-2");
            gb_kv_strs(&kv, "tokenizer.ggml.tokens", toks2, 4);
            gb_kv_strs(&kv, "tokenizer.ggml.merges", merges2, 1);
            tokenizer_t *t = tok_from_kvs(&kv, err, sizeof err, &g);
            CHECKF(t != NULL, "%s", err);
            if (!t) continue;
            int32_t ids[8];
            int n = tokenizer_encode(t, "abc", 3, 0, 0, ids, 8);
            if (k) CHECKF(n == 1 && ids[0] == 3, "n=%d", n);
            else CHECKF(n == 3 && ids[0] == 0 && ids[1] == 1 && ids[2] == 2, "n=%d", n);
            CHECK(tokenizer_add_bos(t) == k); /* llama-bpe defaults to adding BOS */
            tokenizer_free(t);
        }
    }
}

/* ---- throughput (printed, not asserted: the machine is shared) ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(const char *name)
{
    char base[1024];
    snprintf(base, sizeof base, "%s/ggml-vocab-%s.gguf", VEC_DIR, name);
    vocab_t v;
    size_t il;
    char path[1100];
    snprintf(path, sizeof path, "%s.inp", base);
    char *inp = read_file(path, &il);
    if (!inp || load_vocab(base, &v) != 0) {
        free(inp);
        CHECK(0);
        return;
    }
    /* one long text (the vector file repeated, ~64 KB) and many short prompts */
    size_t reps = 65536 / il + 1, tl = il * reps;
    char *text = malloc(tl);
    for (size_t r = 0; r < reps; r++) memcpy(text + r * il, inp, il);
    int n = 0, n2 = 0;
    double full = 1e9, half = 1e9;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        n = tokenizer_encode(v.t, text, tl, 1, 0, NULL, 0);
        double t1 = now_s();
        n2 = tokenizer_encode(v.t, text, tl / 2, 1, 0, NULL, 0);
        double t2 = now_s();
        if (t1 - t0 < full) full = t1 - t0;
        if (t2 - t1 < half) half = t2 - t1;
    }
    CHECK(n > 0 && n2 > 0);
    int prompts = 0;
    double t3 = now_s();
    while (now_s() - t3 < 0.2) {
        tokenizer_encode(v.t, inp, il > 256 ? 256 : il, 1, 0, NULL, 0);
        prompts++;
    }
    double t4 = now_s();
    printf("  %-15s %zu bytes -> %d tokens in %.1f ms (%.1f MB/s; half: %.1f ms); "
           "256-byte prompts: %.0f/s\n",
           name, tl, n, full * 1e3, tl / full / 1e6, half * 1e3,
           prompts / (t4 - t3));
    free(text);
    free(inp);
    free_vocab(&v);
}

int main(void)
{
    FILE *probe = fopen(VEC_DIR "/ggml-vocab-gpt-2.gguf", "rb");
    if (!probe) {
        printf("SKIP: no tokenizer vectors under %s\n", VEC_DIR);
        return 77;
    }
    fclose(probe);
    vec_result_t res[N_VOCABS];
    int all = 1;
    for (size_t k = 0; k < N_VOCABS; k++) {
        res[k] = run_vectors(k_vocabs[k]);
        int pass = res[k].n > 0 && res[k].enc_ok == res[k].n;
        CHECKF(pass, "vocab %s: %d/%d encoded as expected", k_vocabs[k], res[k].enc_ok, res[k].n);
        CHECKF(res[k].rt_ok == res[k].n, "vocab %s: %d/%d round trips", k_vocabs[k], res[k].rt_ok,
               res[k].n);
        all &= pass;
    }
    printf("tokenizer vectors (llama.cpp test-tokenizer-0, add_special=0 parse_special=0):\n");
    for (size_t k = 0; k < N_VOCABS; k++)
        printf("  %-15s %s  encode %2d/%2d  decode round trip %2d/%2d\n", k_vocabs[k],
               res[k].n > 0 && res[k].enc_ok == res[k].n ? "PASS" : "FAIL", res[k].enc_ok,
               res[k].n, res[k].rt_ok, res[k].n);
    printf("  all vocabularies: %s\n", all ? "PASS" : "FAIL");

    test_stories();
    test_stream();
    test_invalid_utf8();
    test_special();
    test_unsupported();
    test_pre_variants();
    test_threads();
    printf("throughput:\n");
    bench("llama-spm");
    bench("gpt-2");
    bench("deepseek-llm");
    return check_exit();
}
