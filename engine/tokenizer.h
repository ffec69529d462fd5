/* engine/tokenizer.h: tokenizer built from a GGUF file's tokenizer.* metadata. Internal.
 *
 * Models: "llama" (SentencePiece-style: score-driven merges of pieces, byte fallback through
 * <0xNN> tokens, optional dummy-prefix space, U+2581 for spaces) and "gpt2" (byte-level BPE:
 * ranked merges from tokenizer.ggml.merges, pre-tokenised with the regexes that
 * tokenizer.ggml.pre names, compiled with PCRE2 in UTF mode). Special (control/user-defined)
 * tokens are matched in the input text when parse_special is set.
 *
 * Immutable after creation: encode/decode may run from many threads at once. */
#ifndef SPILLWAY_ENGINE_TOKENIZER_H
#define SPILLWAY_ENGINE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tokenizer tokenizer_t;

/* Supported values, for error messages. */
#define TOKENIZER_MODELS_SUPPORTED "llama (SentencePiece), gpt2 (byte-level BPE)"
#define TOKENIZER_PRE_SUPPORTED \
    "default, gpt-2, llama-bpe/llama3, qwen2, deepseek-llm, deepseek-coder, falcon, mpt, " \
    "starcoder, refact"

/* Reads the vocabulary from g (borrowed; strings are copied, so g may be closed afterwards).
 * NULL + errstr when the model or pre-tokenizer is unsupported (the message names what is) or
 * the metadata is inconsistent. */
tokenizer_t *tokenizer_from_gguf(const gguf_t *g, char *errstr, size_t errlen);
void tokenizer_free(tokenizer_t *t);

int tokenizer_n_vocab(const tokenizer_t *t);
int32_t tokenizer_bos(const tokenizer_t *t);   /* -1 when none */
int32_t tokenizer_eos(const tokenizer_t *t);   /* -1 when none */
int tokenizer_add_bos(const tokenizer_t *t);   /* file's tokenizer.ggml.add_bos_token (or model default) */
int tokenizer_add_eos(const tokenizer_t *t);
/* 1 for end-of-generation tokens (EOS, EOT, and the file's eog ids such as <|im_end|>). */
int tokenizer_is_eog(const tokenizer_t *t, int32_t id);
/* 1 when the streaming decoder drops one leading ' ' of the text's first piece (SentencePiece's
 * dummy prefix: tokenizer_stream_init's at_text_start). */
int tokenizer_strips_start_space(const tokenizer_t *t);
/* 1 for control tokens (BOS, EOS, ...) that render as nothing in output text. */
int tokenizer_is_control(const tokenizer_t *t, int32_t id);
/* Id of a token whose text is exactly s, or -1. */
int32_t tokenizer_find(const tokenizer_t *t, const char *s, size_t len);

/* Encodes len bytes of text (need not be valid UTF-8: invalid bytes go through byte fallback).
 * add_special: add BOS/EOS as the file's flags say. parse_special: text matching a special token
 * becomes that token. Writes at most cap ids to out and returns the total count n (n > cap means
 * the output was truncated: call again with cap >= n), or -1 on out of memory. */
int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                     int parse_special, int32_t *out, int cap);

/* A piece of the text for tokenizer_encode_segments. special = 1: special tokens are matched in
 * it (text the caller wrote, such as a chat template's markers); 0: untrusted text, never a
 * special token. text[0..len) is borrowed. */
typedef struct {
    const char *text;
    size_t len;
    int special;
} tok_segment_t;

/* Encodes the concatenation of segs[0..n) like tokenizer_encode with parse_special, except that
 * a special (control or user-defined) token is matched only where all of its text lies inside
 * special segments, and merging plain text never yields a special token. Text between two
 * special tokens is one fragment whatever segments it spans, so the ids equal tokenizer_encode's
 * whenever the plain segments hold no special token's text. Same return as tokenizer_encode. */
int tokenizer_encode_segments(const tokenizer_t *t, const tok_segment_t *segs, int n,
                              int add_special, int32_t *out, int cap);

/* 1 for control and user-defined tokens (those special-token parsing matches; not <unk>). */
int tokenizer_is_special(const tokenizer_t *t, int32_t id);

/* Bytes of one token as they appear in text: SPM U+2581 becomes ' ', <0xNN> becomes the byte,
 * byte-level BPE symbols become their bytes; control tokens give "" unless render_special.
 * Writes at most cap bytes, returns the full length (may exceed cap), or -1 for a bad id. */
int tokenizer_token_to_piece(const tokenizer_t *t, int32_t id, int render_special, char *buf,
                             size_t cap);

/* Streaming decoder: turns a token stream into text that never ends in the middle of a UTF-8
 * character (incomplete bytes are held back until completed; invalid sequences are emitted as
 * U+FFFD). at_text_start: the next token begins the text (SPM then drops the dummy-prefix
 * space of the first piece, as SentencePiece's decoder does). Plain struct, no allocation. */
typedef struct {
    unsigned char pend[8];
    int n_pend;
    int at_start;
} tok_stream_t;

void tokenizer_stream_init(tok_stream_t *s, int at_text_start);
/* Appends the text completed by token id to out (at most cap bytes) and returns the number of
 * bytes written, or -1 when cap is too small (at least 64 + the longest token is always enough)
 * or the id is bad. */
int tokenizer_stream_push(const tokenizer_t *t, tok_stream_t *s, int32_t id, char *out,
                          size_t cap);
/* Emits what is still held back (as U+FFFD for an incomplete character); returns bytes written. */
int tokenizer_stream_flush(const tokenizer_t *t, tok_stream_t *s, char *out, size_t cap);

#endif
