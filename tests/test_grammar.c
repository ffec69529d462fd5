/* tests/test_grammar.c: the EBNF grammar engine (engine/grammar.h): parse errors, accepted and
 * rejected strings, byte-by-byte versus whole-string advancing, partial UTF-8 characters, and
 * token masks equal to a brute-force check of every token of a vocabulary. */
#include "check.h"
#include "engine/grammar.h"

#include <stdint.h>
#include <string.h>

static grammar_t *parse(const char *text)
{
    char err[256] = "";
    grammar_t *g = grammar_parse(text, strlen(text), err, sizeof err);
    CHECKF(g != NULL, "%s: %s", text, err);
    return g;
}

/* 1 when s is a complete sentence of g (advanced in one call, then byte by byte). */
static int full_match(grammar_t *g, const char *s)
{
    grammar_state_t *a = grammar_state_new(g, NULL, 0);
    grammar_state_t *b = grammar_state_new(g, NULL, 0);
    int ra = grammar_state_advance(a, s, strlen(s)) == 0 && grammar_state_can_end(a);
    int rb = 1;
    for (size_t i = 0; s[i] && rb; i++) rb = grammar_state_advance(b, s + i, 1) == 0;
    rb = rb && grammar_state_can_end(b);
    CHECKF(ra == rb, "whole vs bytewise disagree on '%s'", s);
    grammar_state_free(a);
    grammar_state_free(b);
    return ra;
}

/* 1 when s is a prefix of some sentence. */
static int prefix_ok(grammar_t *g, const char *s, size_t n)
{
    grammar_state_t *a = grammar_state_new(g, NULL, 0);
    int r = grammar_state_advance(a, s, n) == 0;
    grammar_state_free(a);
    return r;
}

static void test_match(void)
{
    struct { const char *g; const char *yes[6]; const char *no[6]; } cases[] = {
        {"root ::= \"ab\" | \"cd\"", {"ab", "cd"}, {"", "a", "abc", "ac"}},
        {"root ::= [a-c]+ \"!\"", {"a!", "abcabc!"}, {"!", "ad!", "a"}},
        {"root ::= [^\"\\\\]* \"\\\"\"", {"\"", "abc\"", "\xc3\xa9\xe2\x82\xac\""}, {"a\\\"", "a"}},
        {"root ::= x{2,3}\nx ::= \"x\" | \"y\"", {"xx", "xyx", "yy"}, {"x", "xxxx", ""}},
        {"root ::= \"a\"{3}", {"aaa"}, {"aa", "aaaa"}},
        {"root ::= \"a\"{2,} \"b\"?", {"aa", "aaab", "aaaaaaa"}, {"a", "ab", "aabb"}},
        {"root ::= (\"(\" root \")\")*", {"", "()", "(())()"}, {"(", "())", ")("}},
        {"root ::= . \".\"", {"a.", "\xf0\x9f\x98\x80."}, {"..a", "a"}},
        {"# comment\nroot ::= a b # trailing\na ::= \"\\x41\" b ::= \"\\u00e9\"",
         {"A\xc3\xa9"}, {"A", "Ae"}},
        {"root ::= ws \"[\" ws ( v ( \",\" ws v )* )? \"]\"\nv ::= [0-9]+ ws\nws ::= [ ]*",
         {"[]", " [ 1, 2 ,3]", "[12 ]"}, {"[,]", "[1,]", "[1 2]"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        grammar_t *g = parse(cases[c].g);
        if (!g) continue;
        for (int i = 0; i < 6 && cases[c].yes[i]; i++)
            CHECKF(full_match(g, cases[c].yes[i]), "grammar %zu should accept '%s'", c,
                   cases[c].yes[i]);
        for (int i = 0; i < 6 && cases[c].no[i]; i++)
            CHECKF(!full_match(g, cases[c].no[i]), "grammar %zu should reject '%s'", c,
                   cases[c].no[i]);
        grammar_release(g);
    }
    /* partial characters: e-acute's first byte is alive only where some completion fits */
    grammar_t *g = parse("root ::= [\\u00e0-\\u00ff] \"x\"");
    CHECK(prefix_ok(g, "\xc3", 1));
    CHECK(!prefix_ok(g, "\xc4", 1));
    CHECK(!prefix_ok(g, "\xc3\x80\xc3", 3));
    CHECK(!prefix_ok(g, "\xff", 1));
    grammar_release(g);
    g = parse("root ::= [^a]");
    CHECK(prefix_ok(g, "\xe2\x82", 2));
    CHECK(!prefix_ok(g, "\xed\xa0\x80", 3)); /* a surrogate is not UTF-8 */
    CHECK(!prefix_ok(g, "\xc0\x80", 2));     /* overlong */
    grammar_release(g);
    /* done: nothing can follow */
    g = parse("root ::= \"{}\" | \"{}x\"");
    grammar_state_t *st = grammar_state_new(g, NULL, 0);
    CHECK(grammar_state_advance(st, "{}", 2) == 0 && grammar_state_can_end(st) &&
          !grammar_state_done(st));
    CHECK(grammar_state_advance(st, "y", 1) == -1);
    CHECK(grammar_state_advance(st, "x", 1) == 0 && grammar_state_done(st));
    grammar_state_free(st);
    grammar_release(g);
}

static void test_errors(void)
{
    const char *bad[] = {
        "",                               /* no root */
        "root ::= foo",                   /* undefined */
        "root ::= \"a",                   /* unclosed string */
        "root ::= [a-",                   /* unclosed class */
        "root ::= [z-a]",                 /* backwards */
        "root ::= (\"a\"",                /* unclosed group */
        "root ::= \"a\")",                /* stray ) */
        "root ::= root \"a\"",            /* left recursion */
        "root ::= x \"a\"\nx ::= \"\" | root", /* left recursion through a nullable rule */
        "root ::= (\"\")*",               /* repetition of the empty string */
        "root ::= \"a\"{3,2}",            /* max < min */
        "root ::= \"a\"{99999}",          /* too large */
        "root ::= \"\\q\"",               /* unknown escape */
        "root ::= \"a\"\nroot ::= \"b\"", /* defined twice */
        "root ::= @",                     /* junk */
        "root = \"a\"",                   /* not ::= */
        "root ::= \"\\uD800\"",           /* surrogate */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        grammar_t *g = grammar_parse(bad[i], strlen(bad[i]), err, sizeof err);
        CHECKF(g == NULL && err[0], "'%s' should be refused", bad[i]);
        grammar_release(g);
    }
    char err[256] = "";
    grammar_t *g = grammar_parse("root ::= a\n\n  a ::= b", strlen("root ::= a\n\n  a ::= b"), err, sizeof err);
    CHECK(g == NULL && strstr(err, "3:") && strstr(err, "b"));
}

/* A vocabulary of single bytes, ASCII pairs, JSON-ish pieces and UTF-8 fragments. */
typedef struct {
    char buf[2000][8];
    const char *p[2000];
    size_t len[2000];
    unsigned char eog[2000];
    int n;
} vocab_src_t;

static void add(vocab_src_t *s, const char *b, size_t n)
{
    memcpy(s->buf[s->n], b, n);
    s->p[s->n] = s->buf[s->n];
    s->len[s->n] = n;
    s->n++;
}

static void make_vocab(vocab_src_t *s)
{
    s->n = 0;
    memset(s->eog, 0, sizeof s->eog);
    add(s, "", 0); /* a control token */
    s->eog[0] = 1;
    add(s, "", 0); /* another, not EOG */
    for (int b = 1; b < 256; b++) {
        char c = (char)b;
        add(s, &c, 1);
    }
    const char *pieces[] = {"{\"", "\":", "\",", "\"}", " \"", "true", "false", "null", "\\n",
                            "\\\"", "ab", " a", "12", "3.", ".5", "e+", "}}", "]}", "[{",
                            "\xc3\xa9", "\xc3", "\xa9x", "\xe2\x82\xac", "\xe2\x82", "\x82\xac",
                            "  ", "\n", "\": \"", "a\"", "1,", "-0", "ab\"}"};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
        add(s, pieces[i], strlen(pieces[i]));
    uint64_t x = 88172645463325252ull; /* xorshift: a few hundred random ASCII-ish pieces */
    while (s->n < 900) {
        char b[8];
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int n = 2 + (int)(x % 5);
        for (int i = 0; i < n; i++) b[i] = "{}[]\":, abe01.-\\tn"[(x >> (8 + 5 * i)) % 19];
        add(s, b, (size_t)n);
    }
}

static const char *json_grammar =
    "root ::= obj\n"
    "value ::= obj | arr | str | num | \"true\" | \"false\" | \"null\"\n"
    "obj ::= \"{\" ws ( str ws \":\" ws value ws ( \",\" ws str ws \":\" ws value ws )* )? \"}\"\n"
    "arr ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "str ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt] )* \"\\\"\"\n"
    "num ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,15} )?\n"
    "ws ::= [ \\t\\n]{0,4}\n";

static void test_masks(void)
{
    static vocab_src_t src;
    make_vocab(&src);
    char err[256];
    grammar_vocab_t *v = grammar_vocab_new(src.n, src.p, src.len, src.eog, 1, err, sizeof err);
    CHECK(v != NULL);
    grammar_t *g = parse(json_grammar);
    if (!v || !g) return;
    grammar_state_t *st = grammar_state_new(g, NULL, 0);
    uint32_t mask[GRAMMAR_MASK_WORDS(2000)];
    /* walk a document token by token; at each step the mask must equal brute force */
    const char *doc = "{\"ab\": [1, 3.5, {\"\xc3\xa9\xe2\x82\xac\": null}], \"x\\n\": true}";
    size_t at = 0, L = strlen(doc);
    int steps = 0, at_start = 1;
    while (steps < 400) {
        CHECK(grammar_state_mask(st, v, at_start, mask) == 0);
        int bad = 0;
        for (int t = 0; t < src.n; t++) {
            int want;
            if (src.eog[t]) {
                want = grammar_state_can_end(st);
            } else {
                size_t n;
                const char *p = grammar_vocab_piece(v, t, at_start, &n);
                grammar_state_t *c = grammar_state_new(g, NULL, 0);
                grammar_state_advance(c, doc, at);
                want = n > 0 && grammar_state_advance(c, p, n) == 0;
                grammar_state_free(c);
            }
            int got = (mask[t >> 5] >> (t & 31)) & 1;
            if (got != want) bad++;
        }
        CHECKF(bad == 0, "mask differs from brute force at byte %zu (%d tokens)", at, bad);
        if (at == L) {
            CHECK((mask[0] & 1) && grammar_state_done(st)); /* EOG allowed at the end */
            break;
        }
        CHECK(!(mask[0] & 1) || grammar_state_can_end(st));
        /* advance by the longest allowed token that is a prefix of the rest of the doc */
        int best = -1;
        size_t best_n = 0;
        for (int t = 0; t < src.n; t++) {
            size_t n;
            const char *p = grammar_vocab_piece(v, t, at_start, &n);
            if (n > best_n && n <= L - at && memcmp(p, doc + at, n) == 0 &&
                ((mask[t >> 5] >> (t & 31)) & 1)) {
                best = t;
                best_n = n;
            }
        }
        CHECKF(best >= 0, "no token continues the document at %zu", at);
        if (best < 0) break;
        CHECK(grammar_state_advance(st, doc + at, best_n) == 0);
        at += best_n;
        at_start = 0;
        steps++;
    }
    /* the same state twice hits the cache */
    uint64_t h0, m0, h1, m1;
    grammar_cache_stats(g, &h0, &m0);
    grammar_state_t *s2 = grammar_state_new(g, NULL, 0);
    CHECK(grammar_state_mask(s2, v, 1, mask) == 0);
    grammar_cache_stats(g, &h1, &m1);
    CHECK(h1 == h0 + 1 && m1 == m0);
    grammar_state_free(s2);
    grammar_state_free(st);
    grammar_release(g);
    grammar_vocab_free(v);
}

int main(void)
{
    test_match();
    test_errors();
    test_masks();
    return check_exit();
}
