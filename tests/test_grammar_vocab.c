/* tests/test_grammar_vocab.c: grammar masks over a real vocabulary (stories260K's SentencePiece
 * tokens, with its dummy-prefix space at the text start) equal a brute-force check of every token
 * along random walks, and the engine's constrained generation ends in a sentence of the grammar
 * with finish "stop" (greedy and sampled, with and without the text-start rule, many sequences
 * sharing one grammar). Exit 77 without /work/shared's stories260K. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "consumer/json_schema.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/grammar.h"
#include "engine/tokenizer.h"

#define MODEL SPILLWAY_MODELS "/stories260K.gguf"

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"n\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300},\"ok\":{\"type\":\"boolean\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b c\"]},\"maxItems\":3}},"
    "\"required\":[\"name\",\"n\"],\"additionalProperties\":false}";

static grammar_t *schema_grammar(void)
{
    json_t *s = json_loads(SCHEMA, 0, NULL);
    char err[256];
    char *text = json_schema_to_grammar(s, err, sizeof err);
    json_decref(s);
    CHECKF(text != NULL, "%s", err);
    grammar_t *g = text ? grammar_parse(text, strlen(text), err, sizeof err) : NULL;
    CHECKF(g != NULL, "%s", err);
    free(text);
    return g;
}

typedef struct {
    int done, stopped, valid;
    grammar_t *g;
} res_t;

static void on_done(void *arg, const engine_result_t *r)
{
    res_t *x = arg;
    x->done++;
    x->stopped += r->finish == ENGINE_FINISH_STOP;
    grammar_state_t *st = grammar_state_new(x->g, NULL, 0);
    int ok = grammar_state_advance(st, r->text, r->text_len) == 0 && grammar_state_can_end(st);
    if (!ok) fprintf(stderr, "not a sentence: %.*s\n", (int)r->text_len, r->text);
    x->valid += ok;
    grammar_state_free(st);
}

int main(void)
{
    if (access(MODEL, R_OK) != 0) {
        fprintf(stderr, "skip: no %s\n", MODEL);
        return 77;
    }
    engine_config_t cfg;
    engine_config_default(&cfg);
    cfg.model_path = MODEL;
    cfg.threads = 1;
    char err[256];
    engine_t *e = engine_new(&cfg, err, sizeof err);
    CHECKF(e != NULL, "%s", err);
    if (!e) return check_exit();
    const tokenizer_t *tok = engine_tokenizer(e);
    int n = tokenizer_n_vocab(tok);
    char **pieces = calloc((size_t)n, sizeof *pieces);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    unsigned char *eog = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        char buf[256];
        int len = tokenizer_token_to_piece(tok, i, 0, buf, sizeof buf);
        pieces[i] = malloc((size_t)(len > 0 ? len : 1));
        if (len > 0) memcpy(pieces[i], buf, (size_t)len);
        lens[i] = len > 0 ? (size_t)len : 0;
        eog[i] = (unsigned char)tokenizer_is_eog(tok, i);
    }
    CHECK(tokenizer_strips_start_space(tok) == 1);
    grammar_vocab_t *v = grammar_vocab_new(n, (const char *const *)pieces, lens, eog,
                                           tokenizer_strips_start_space(tok), err, sizeof err);
    CHECKF(v != NULL, "%s", err);
    grammar_t *g = schema_grammar();
    uint32_t *mask = malloc(GRAMMAR_MASK_WORDS(n) * sizeof *mask);
    unsigned long long rng = 12345;
    int walks = 0;
    for (int w = 0; v && g && w < 6; w++) {
        grammar_state_t *st = grammar_state_new(g, NULL, 0);
        char text[4096];
        size_t tl = 0;
        int at_start = w % 2 == 0; /* walks alternate the text-start rule */
        for (int step = 0; step < 80; step++) {
            CHECK(grammar_state_mask(st, v, at_start, mask) == 0);
            int bad = 0, n_ok = 0;
            for (int t = 0; t < n; t++) {
                int want;
                if (eog[t]) {
                    want = grammar_state_can_end(st);
                } else {
                    size_t pl;
                    const char *p = grammar_vocab_piece(v, t, at_start, &pl);
                    grammar_state_t *c = grammar_state_new(g, NULL, 0);
                    want = grammar_state_advance(c, text, tl) == 0 && pl > 0 &&
                           grammar_state_advance(c, p, pl) == 0;
                    grammar_state_free(c);
                }
                int got = (mask[t >> 5] >> (t & 31)) & 1;
                bad += got != want;
                n_ok += got;
            }
            CHECKF(bad == 0, "walk %d step %d: %d tokens differ from brute force", w, step, bad);
            if (n_ok == 0 || grammar_state_done(st)) break;
            /* a random allowed token, EOG excluded */
            int pick = -1;
            for (int tries = 0; tries < 10000 && pick < 0; tries++) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                int t = (int)(rng % (unsigned long long)n);
                if (!eog[t] && ((mask[t >> 5] >> (t & 31)) & 1)) pick = t;
            }
            if (pick < 0) break;
            size_t pl;
            const char *p = grammar_vocab_piece(v, pick, at_start, &pl);
            if (tl + pl >= sizeof text) break;
            CHECK(grammar_state_advance(st, p, pl) == 0);
            memcpy(text + tl, p, pl);
            tl += pl;
            at_start = 0;
        }
        grammar_state_free(st);
        walks++;
    }
    CHECK(walks == 6);
    /* the engine: 24 sequences sharing the grammar, greedy and sampled, BOS-only prompts (text
     * start) and a text prompt */
    res_t res = {0, 0, 0, g};
    for (int i = 0; g && i < 24; i++) {
        int32_t prompt[8];
        int np = engine_tokenize(e, i % 3 ? "" : "Once upon a time", i % 3 ? 0 : 16, 1, 0,
                                 prompt, 8);
        engine_request_t rq;
        engine_request_default(&rq);
        rq.prompt = prompt;
        rq.n_prompt = np;
        rq.max_tokens = 300;
        rq.sampling.temperature = i % 2 ? 1.0f : 0.0f;
        rq.sampling.seed = (uint64_t)i;
        rq.text_at_start = i % 3 != 0;
        rq.grammar = g;
        CHECKF(engine_submit(e, &rq, on_done, &res, NULL, err, sizeof err) == 0, "%s", err);
    }
    CHECK(engine_run(e, err, sizeof err) == 0);
    CHECKF(res.done == 24 && res.stopped == 24 && res.valid == 24,
           "%d done, %d stopped, %d sentences", res.done, res.stopped, res.valid);
    engine_stats_t st;
    engine_stats(e, &st);
    CHECK(st.grammar_seconds > 0);
    grammar_release(g);
    grammar_vocab_free(v);
    for (int i = 0; i < n; i++) free(pieces[i]);
    free(pieces);
    free(lens);
    free(eog);
    free(mask);
    engine_free(e);
    return check_exit();
}
