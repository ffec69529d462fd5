/* engine/grammar.h: grammar-constrained decoding (structured output).
 *
 * A grammar is EBNF text in a dialect close to llama.cpp's GBNF (the README's "Structured output"
 * section is the reference):
 *     root   ::= "{" ws pair ("," ws pair)* "}"     # rules: name ::= alternatives
 *     pair   ::= [a-z]+ ":" ws ( "true" | "false" )
 *     ws     ::= [ \t\n]{0,4}
 * Alternation |, grouping ( ), postfix * + ? {m} {m,} {m,n}, string literals "..." with escapes
 * \n \r \t \\ \" \' \xHH \uHHHH \UHHHHHHHH, character classes [a-z0-9_] and negated [^"\\], and .
 * (any code point). # starts a comment to the end of the line. Newlines are plain whitespace: a
 * rule ends where the next `name ::=` begins. Rule names are [A-Za-z0-9_-]+; "root" is the
 * start. Left recursion (also through rules that can match empty, e.g. ("")*) is refused.
 *
 * Matching is over Unicode code points of UTF-8 text; a token may end inside a character (the
 * state then holds the partial character and keeps only alternatives some completion of it can
 * match). The matcher is a set of pushdown stacks over the rules' positions, deduplicated.
 *
 * Threads: a grammar_t is immutable except for its mask cache, which grammar_state_mask fills:
 * the grammar's states and masks are used by one thread at a time (the engine's step thread).
 * Reference counting (grammar_retain / grammar_release) is atomic, so a grammar compiled on one
 * thread may be handed to another. Errors: NULL / -1 with errstr. */
#ifndef SPILLWAY_ENGINE_GRAMMAR_H
#define SPILLWAY_ENGINE_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

typedef struct grammar grammar_t;

/* Limits of the dialect: a {m,n} bound, rules (named and generated), elements in all. */
#define GRAMMAR_MAX_REPEAT 10000
#define GRAMMAR_MAX_RULES 100000
#define GRAMMAR_MAX_ELEMS 2000000
/* Bytes of mask cache per grammar before the cache is cleared and refilled. */
#define GRAMMAR_MASK_CACHE_BYTES (16u << 20)

/* Parses text[0..len) (need not be NUL-terminated). Returns a grammar with one reference, or NULL
 * with errstr giving the reason and the line:column. */
grammar_t *grammar_parse(const char *text, size_t len, char *errstr, size_t errlen);
grammar_t *grammar_retain(grammar_t *g);
void grammar_release(grammar_t *g);   /* NULL is fine; frees on the last reference */
/* 64-bit hash of the source text: grammars with the same text match the same language. */
uint64_t grammar_text_hash(const grammar_t *g);
int grammar_same_text(const grammar_t *a, const grammar_t *b);

/* A vocabulary's token texts, for masks. Built once per model (immutable afterwards, any
 * thread). pieces[i][0..lens[i]) are token i's bytes as they appear in text; a token with no
 * bytes (control) is never allowed, except that the ids flagged in eog[] (may be NULL) are
 * allowed exactly where the grammar may end. strip_start_space: the text's first token loses
 * one leading ' ' (SentencePiece's dummy prefix), so masks at the text start use that. */
typedef struct grammar_vocab grammar_vocab_t;
grammar_vocab_t *grammar_vocab_new(int n_vocab, const char *const *pieces, const size_t *lens,
                                   const unsigned char *eog, int strip_start_space,
                                   char *errstr, size_t errlen);
void grammar_vocab_free(grammar_vocab_t *v);
int grammar_vocab_n(const grammar_vocab_t *v);
/* Token i's bytes (at_start: as the text's first token). */
const char *grammar_vocab_piece(const grammar_vocab_t *v, int32_t id, int at_start, size_t *len);
int grammar_vocab_is_eog(const grammar_vocab_t *v, int32_t id);

/* A sequence's position in the grammar. Holds a reference to g. */
typedef struct grammar_state grammar_state_t;
grammar_state_t *grammar_state_new(grammar_t *g, char *errstr, size_t errlen);
void grammar_state_free(grammar_state_t *st);
/* The grammar st follows (borrowed). */
grammar_t *grammar_state_grammar(const grammar_state_t *st);
/* Consumes bytes[0..n). 0 when the grammar accepts them as a continuation (state advanced),
 * -1 when it does not (state unchanged), -2 out of memory (state unchanged). */
int grammar_state_advance(grammar_state_t *st, const char *bytes, size_t n);
/* 1 when the text so far is a complete sentence of the grammar (it may end here). */
int grammar_state_can_end(const grammar_state_t *st);
/* 1 when nothing can follow (the grammar has ended: it can end and no byte continues it). */
int grammar_state_done(const grammar_state_t *st);

/* Mask words for a vocabulary of n tokens: bit (id & 31) of word id >> 5. */
#define GRAMMAR_MASK_WORDS(n) (((size_t)(n) + 31) / 32)
/* Fills mask[GRAMMAR_MASK_WORDS(n_vocab)]: bit set = the token's bytes keep the grammar alive
 * (every prefix of them, partial characters included, can be continued to a sentence), or the
 * token is an EOG and the grammar may end here. at_start: masks for the text's first token
 * (v's strip_start_space applies). Walks v's byte trie with the state; masks are cached in the
 * grammar by state (the cache is per vocabulary: a different v clears it). 0, or -1 out of
 * memory. */
int grammar_state_mask(grammar_state_t *st, const grammar_vocab_t *v, int at_start,
                       uint32_t *mask);

/* Mask cache counters of g (hits, misses), for benches and tests. */
void grammar_cache_stats(const grammar_t *g, uint64_t *hits, uint64_t *misses);

#endif
