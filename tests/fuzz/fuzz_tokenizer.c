/* tests/fuzz/fuzz_tokenizer.c: libFuzzer target for the tokenizer (engine/tokenizer.c) on real
 * vocabularies, loaded once: stories260K.gguf (SentencePiece, 512 tokens) and, when present, the
 * llama.cpp vocab-only files under tokenizer-vectors/ (SentencePiece llama-spm and phi-3;
 * byte-level BPE gpt-2, deepseek-coder, deepseek-llm, falcon, mpt, starcoder, refact,
 * llama-bpe (Llama 3), qwen2: every pre-tokenizer regex set). The models folder is $SPILLWAY_MODELS, else the SPILLWAY_MODELS the
 * build defines, else ../shared/models beside the checkout; with no vocabulary there every input
 * is a no-op (the replay test then passes vacuously; a note says so once).
 *
 * Input: byte 0 picks the vocabulary, byte 1 the mode; the rest is the payload.
 *   mode bit 3 clear: encode the payload as text (bit 0 add_special, bit 1 parse_special).
 *     The count is bounded by the input (at most 3 tokens per byte: byte-level BPE turns an
 *     invalid byte into U+FFFD; plus BOS/EOS and the dummy prefix), asking again with a smaller cap gives the same count and a prefix of the
 *     same ids, every id is in the vocabulary, the streaming decoder emits only complete UTF-8
 *     in every chunk, and without parse_special a valid UTF-8 text without U+2581 decodes back
 *     to itself (after BOS, SentencePiece may keep its dummy-prefix space) when every byte
 *     has a token of its own in that vocabulary (see rt_byte).
 *   mode bit 3 set: decode arbitrary ids (3 payload bytes each, spread over [-16, n_vocab + 16)).
 *     token_to_piece returns -1 exactly for ids out of range and otherwise the same length
 *     into any cap (exact-size heap buffers, so ASan sees any overrun); the streaming decoder
 *     (bit 2: at text start) fails exactly on bad ids, never writes past a cap of 64 + the
 *     longest piece nor past a tiny cap, emits complete UTF-8 only, and when the pieces
 *     concatenate to valid UTF-8 (not at text start) emits exactly that concatenation.
 * Anything else aborts, so the fuzzer reports it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "../support/utf8_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TOK 16
#define MAX_TEXT 4096

static tokenizer_t *toks[MAX_TOK];
static size_t longest[MAX_TOK]; /* longest piece, render_special on or off */
/* rt_byte[t][b]: byte b has a token of its own (SentencePiece <0xNN>, or its byte-level BPE
 * symbol). Some BPE vocabularies lack a few (C0 controls): the tokenizer then drops that byte,
 * as llama.cpp does, and text holding one cannot round-trip. */
static unsigned char rt_byte[MAX_TOK][256];
static int n_toks = -1;

static void require(int cond)
{
    if (!cond) abort();
}

/* The UTF-8 of byte b's symbol in byte-level BPE (GPT-2's bytes_to_unicode): printable
 * Latin-1 bytes stand for themselves, the others for U+0100 + their rank among them. */
static size_t bpe_symbol(int b, char *out)
{
    int cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static void load(const char *path)
{
    char err[256];
    if (n_toks >= MAX_TOK) return;
    gguf_t *g = gguf_open(path, err, sizeof err);
    if (!g) return;
    tokenizer_t *t = tokenizer_from_gguf(g, err, sizeof err);
    gguf_close(g);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
        return;
    }
    size_t lo = 0;
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++)
        for (int rs = 0; rs < 2; rs++) {
            int k = tokenizer_token_to_piece(t, id, rs, NULL, 0);
            require(k >= 0);
            if ((size_t)k > lo) lo = (size_t)k;
        }
    longest[n_toks] = lo;
    for (int b = 0; b < 256; b++) {
        char sym[8];
        size_t n = bpe_symbol(b, sym);
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        rt_byte[n_toks][b] = tokenizer_find(t, sym, n) >= 0 || tokenizer_find(t, hex, 6) >= 0;
    }
    toks[n_toks++] = t;
}

static void init(void)
{
    static const char *const vocabs[] = {"llama-spm", "phi-3", "gpt-2", "deepseek-coder",
                                         "deepseek-llm", "falcon", "mpt", "starcoder", "refact",
                                         "llama-bpe", "qwen2"};
    char dir[1024], path[1200];
    const char *env = getenv("SPILLWAY_MODELS");
    n_toks = 0;
#ifdef SPILLWAY_MODELS
    if (!env) env = SPILLWAY_MODELS;
#endif
    if (env) {
        snprintf(dir, sizeof dir, "%s", env);
    } else { /* this file is tests/fuzz/ of the checkout; the models are ../shared/models */
        snprintf(dir, sizeof dir, "%s", __FILE__);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        strncat(dir, "/../../../shared/models", sizeof dir - strlen(dir) - 1);
    }
    snprintf(path, sizeof path, "%s/stories260K.gguf", dir);
    load(path);
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        snprintf(path, sizeof path, "%s/tokenizer-vectors/ggml-vocab-%s.gguf", dir, vocabs[i]);
        load(path);
    }
    if (!n_toks)
        fprintf(stderr, "fuzz_tokenizer: no vocabulary under %s (set SPILLWAY_MODELS): nothing "
                        "is fuzzed\n", dir);
}

typedef struct {
    char *p;
    size_t n, cap;
} buf_t;

static void append(buf_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        require(b->p != NULL);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* Streams ids[0..n) (all valid) through the decoder; every chunk complete UTF-8. */
static void stream_all(int ti, const int32_t *ids, int n, int at_start, buf_t *out)
{
    const tokenizer_t *t = toks[ti];
    size_t cap = 64 + longest[ti];
    char *chunk = malloc(cap);
    require(chunk != NULL);
    tok_stream_t st;
    tokenizer_stream_init(&st, at_start);
    for (int i = 0; i <= n; i++) {
        int k = i < n ? tokenizer_stream_push(t, &st, ids[i], chunk, cap)
                      : tokenizer_stream_flush(t, &st, chunk, cap);
        require(k >= 0 && (size_t)k <= cap);
        require(utf8_complete((const unsigned char *)chunk, (size_t)k));
        append(out, chunk, (size_t)k);
    }
    free(chunk);
}

static void fuzz_encode(int ti, int mode, const char *text, size_t len)
{
    const tokenizer_t *t = toks[ti];
    int add_special = mode & 1, parse_special = (mode >> 1) & 1;
    int n = tokenizer_encode(t, text, len, add_special, parse_special, NULL, 0);
    /* a byte-level BPE replaces an invalid byte by U+FFFD: up to 3 tokens per input byte */
    require(n >= 0 && (size_t)n <= 3 * len + 3);
    int32_t *ids = malloc(sizeof *ids * (n > 0 ? (size_t)n : 1));
    require(ids != NULL);
    require(tokenizer_encode(t, text, len, add_special, parse_special, ids, n) == n);
    for (int i = 0; i < n; i++) require(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(t));
    if (n > 1) { /* a smaller cap: the same count, a prefix of the same ids */
        int half = n / 2;
        int32_t *part = malloc(sizeof *part * (size_t)half);
        require(part != NULL);
        require(tokenizer_encode(t, text, len, add_special, parse_special, part, half) == n);
        require(memcmp(part, ids, sizeof *ids * (size_t)half) == 0);
        free(part);
    }
    buf_t out = {0};
    stream_all(ti, ids, n, 1, &out);
    int representable = 1;
    for (size_t i = 0; i < len; i++) representable &= rt_byte[ti][(unsigned char)text[i]];
    if (!parse_special && representable && utf8_complete((const unsigned char *)text, len) &&
        !memmem(text, len, "\xe2\x96\x81", 3)) {
        int same = out.n == len && (len == 0 || memcmp(out.p, text, len) == 0);
        /* after BOS the decoder is no longer at the text's start: SPM's dummy space stays */
        int spaced = add_special && out.n == len + 1 && out.p[0] == ' ' &&
                     memcmp(out.p + 1, text, len) == 0;
        if (!same && !spaced) {
            fprintf(stderr, "round trip: %zu bytes in, %zu out, vocab %d, mode %d\n", len, out.n,
                    ti, mode);
            abort();
        }
    }
    free(out.p);
    free(ids);
}

static void fuzz_decode(int ti, int mode, const uint8_t *p, size_t len)
{
    const tokenizer_t *t = toks[ti];
    int nv = tokenizer_n_vocab(t);
    int at_start = (mode >> 2) & 1;
    size_t cap = 64 + longest[ti];
    char *chunk = malloc(cap), tiny[4];
    require(chunk != NULL);
    buf_t pieces = {0}, streamed = {0};
    tok_stream_t st;
    tokenizer_stream_init(&st, at_start);
    int all_valid = 1;
    for (size_t i = 0; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16;
        int32_t id = (int32_t)(v % (uint32_t)(nv + 32)) - 16;
        int bad = id < 0 || id >= nv;
        for (int rs = 0; rs < 2; rs++) {
            int k = tokenizer_token_to_piece(t, id, rs, NULL, 0);
            require(bad ? k == -1 : k >= 0 && (size_t)k <= longest[ti]);
            if (bad) continue;
            char *exact = malloc((size_t)k + 1);
            require(exact != NULL);
            require(tokenizer_token_to_piece(t, id, rs, exact, (size_t)k) == k);
            if (k > 1) { /* truncated: the full length, a prefix written */
                char *half = malloc((size_t)k / 2);
                require(half != NULL);
                require(tokenizer_token_to_piece(t, id, rs, half, (size_t)k / 2) == k);
                require(memcmp(half, exact, (size_t)k / 2) == 0);
                free(half);
            }
            if (!rs) append(&pieces, exact, (size_t)k);
            free(exact);
        }
        /* a tiny cap on a copy of the state: fails or fits, never overruns */
        tok_stream_t copy = st;
        int kt = tokenizer_stream_push(t, &copy, id, tiny, sizeof tiny);
        require(kt == -1 || (kt >= 0 && (size_t)kt <= sizeof tiny));
        int k = tokenizer_stream_push(t, &st, id, chunk, cap);
        if (bad) {
            require(k == -1);
            all_valid = 0;
            continue;
        }
        require(k >= 0 && (size_t)k <= cap);
        require(utf8_complete((const unsigned char *)chunk, (size_t)k));
        append(&streamed, chunk, (size_t)k);
    }
    int k = tokenizer_stream_flush(t, &st, chunk, cap);
    require(k >= 0 && (size_t)k <= cap && utf8_complete((const unsigned char *)chunk, (size_t)k));
    append(&streamed, chunk, (size_t)k);
    if (all_valid && !at_start && utf8_complete((const unsigned char *)pieces.p, pieces.n)) {
        if (streamed.n != pieces.n || (pieces.n && memcmp(streamed.p, pieces.p, pieces.n))) {
            fprintf(stderr, "stream decode: %zu bytes, pieces %zu, vocab %d\n", streamed.n,
                    pieces.n, ti);
            abort();
        }
    }
    free(pieces.p);
    free(streamed.p);
    free(chunk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (n_toks < 0) init();
    if (!n_toks || size < 2) return 0;
    int ti = data[0] % n_toks, mode = data[1];
    const uint8_t *p = data + 2;
    size_t len = size - 2 > MAX_TEXT ? MAX_TEXT : size - 2;
    if (mode & 8) {
        fuzz_decode(ti, mode, p, len);
    } else {
        /* an exact-size copy: the tokenizer must not read past len (no NUL terminator) */
        char *text = malloc(len ? len : 1);
        require(text != NULL);
        if (len) memcpy(text, p, len);
        fuzz_encode(ti, mode, text, len);
        free(text);
    }
    return 0;
}
