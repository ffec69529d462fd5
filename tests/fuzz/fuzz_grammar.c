/* tests/fuzz/fuzz_grammar.c: libFuzzer target for structured output (engine/grammar.c,
 * consumer/json_schema.c). The input up to its first NUL byte is tried as EBNF text and, when it
 * is JSON, as a JSON Schema (whose compiled grammar must then parse: the compiler's output is
 * always valid EBNF); the rest is text fed to the grammar byte by byte. For the first 16 bytes
 * the mask over a small vocabulary (every single byte, some multi-byte pieces) must agree with
 * advancing a fresh state by the text so far and then the token. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "consumer/json_schema.h"
#include "engine/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int cond)
{
    if (!cond) abort();
}

static const char *const extra[] = {"\"", "{\"", "\":", "ab", "\xc3\xa9", "\xc3", "\xa9",
                                    "\xe2\x82\xac", "12", " \"", "\\n", "true"};
#define N_EXTRA (sizeof extra / sizeof *extra)
#define N_VOCAB ((int)(256 + N_EXTRA))

static void exercise(grammar_t *g, const grammar_vocab_t *v, const char *text, size_t n)
{
    grammar_state_t *st = grammar_state_new(g, NULL, 0);
    if (!st) return;
    uint32_t mask[GRAMMAR_MASK_WORDS(N_VOCAB)];
    for (size_t i = 0; i < n; i++) {
        if (i < 16 && grammar_state_mask(st, v, 0, mask) == 0) {
            for (int t = 0; t < N_VOCAB; t++) {
                size_t len;
                const char *p = grammar_vocab_piece(v, t, 0, &len);
                grammar_state_t *c = grammar_state_new(g, NULL, 0);
                if (!c) break;
                require(grammar_state_advance(c, text, i) == 0);
                int ok = grammar_state_advance(c, p, len) == 0;
                require(ok == (int)((mask[t >> 5] >> (t & 31)) & 1));
                grammar_state_free(c);
            }
        }
        if (grammar_state_advance(st, text + i, 1) != 0) break;
        (void)grammar_state_can_end(st);
        (void)grammar_state_done(st);
    }
    grammar_state_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    const char *nul = memchr(s, 0, size);
    size_t glen = nul ? (size_t)(nul - s) : size;
    const char *text = nul ? nul + 1 : "";
    size_t tlen = nul ? size - glen - 1 : 0;
    const char *pieces[N_VOCAB];
    size_t lens[N_VOCAB];
    char bytes[256];
    for (int b = 0; b < 256; b++) {
        bytes[b] = (char)b;
        pieces[b] = bytes + b;
        lens[b] = 1;
    }
    for (size_t k = 0; k < N_EXTRA; k++) {
        pieces[256 + k] = extra[k];
        lens[256 + k] = strlen(extra[k]);
    }
    grammar_vocab_t *v = grammar_vocab_new(N_VOCAB, pieces, lens, NULL, 0, NULL, 0);
    require(v != NULL);
    char err[256];
    grammar_t *g = grammar_parse(s, glen, err, sizeof err);
    if (g) {
        exercise(g, v, text, tlen);
        grammar_release(g);
    }
    json_t *schema = json_loadb(s, glen, JSON_DECODE_ANY, NULL);
    if (schema) {
        char *gt = json_schema_to_grammar(schema, err, sizeof err);
        json_decref(schema);
        if (gt) {
            g = grammar_parse(gt, strlen(gt), err, sizeof err);
            require(g != NULL || strstr(err, "too large") || strstr(err, "memory"));
            if (g) exercise(g, v, text, tlen);
            grammar_release(g);
            free(gt);
        }
    }
    grammar_vocab_free(v);
    return 0;
}
