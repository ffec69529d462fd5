/* engine/tokenizer.c: SentencePiece-style ("llama") and byte-level BPE ("gpt2") tokenizers built
 * from a GGUF file's tokenizer.ggml.* metadata.
 *
 * Reference behaviour is llama.cpp's vocabulary code (the tokenizer test vectors in
 * shared/models/tokenizer-vectors come from it); this is an independent implementation:
 *
 *   encode(text) = [BOS] + partition(text into special tokens and text fragments)
 *                  + per fragment: SPM (escape spaces, score-driven bigram merges, byte fallback)
 *                                  or BPE (regex pre-tokenisation, GPT-2 byte mapping, ranked
 *                                  merges) + [EOS]
 *
 * Known, deliberate differences from llama.cpp (all on inputs the reference mangles):
 *  - Bytes that are not valid UTF-8 survive: SPM symbols are whole well-formed characters or
 *    single stray bytes (llama.cpp sizes them by the lead byte alone and can swallow part of a
 *    following escaped space); BPE keeps them as bytes (their own pre-token, byte-mapped like
 *    any other byte) instead of replacing each by U+FFFD; only a byte the vocabulary cannot
 *    represent becomes U+FFFD.
 *  - Pre-tokeniser regexes run in PCRE2 (UTF + UCP, Unicode tables of the installed PCRE2);
 *    llama.cpp uses hand-written splitters or std::regex over its own tables. Both follow the
 *    same regexes; code points whose Unicode category or White_Space status differs between
 *    table versions (e.g. U+180E) may split differently.
 *  - A token whose byte fallback has no <0xNN> token becomes the unknown token (or is dropped
 *    when there is none) where llama.cpp aborts.
 *
 * Immutable after tokenizer_from_gguf: every other function only reads the struct, so encode
 * and decode may run concurrently from any number of threads (PCRE2 compiled code and JIT code
 * are shared read-only; each encode call allocates its own match data and scratch). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/err.h"

/* ---- token attributes (bit set; GGUF token_type values map onto one bit each) ---- */
enum {
    TA_UNKNOWN = 1u << 0,      /* type 2 */
    TA_UNUSED = 1u << 1,       /* type 5 */
    TA_NORMAL = 1u << 2,       /* type 1 */
    TA_CONTROL = 1u << 3,      /* type 3 */
    TA_USER_DEFINED = 1u << 4, /* type 4 */
    TA_BYTE = 1u << 5,         /* type 6 */
    TA_LSTRIP = 1u << 6,       /* matched special token swallows whitespace on its left */
    TA_RSTRIP = 1u << 7,       /* ... and on its right */
};
#define TA_SPECIAL (TA_CONTROL | TA_USER_DEFINED | TA_UNKNOWN) /* split out of input text */
#define TA_HIDDEN (TA_CONTROL | TA_UNKNOWN) /* rendered only with render_special */

enum tok_kind { TOK_SPM = 1, TOK_BPE = 2 };

#define MAX_PRE_REGEX 6

typedef struct {
    uint32_t off, len;             /* token text in text_pool */
    uint32_t piece_off, piece_len; /* rendered bytes (as with render_special) in piece_pool */
    float score;
    uint32_t attr;
} tok_entry_t;

/* Ranked BPE merge "left right": left at merge_pool+off (llen bytes), right after one space. */
typedef struct {
    uint32_t off, llen, rlen;
    int32_t rank;
} merge_t;

/* A special token and its text length, for sorting by match priority. */
typedef struct {
    uint32_t len;
    int32_t id;
} len_id_t;

struct tokenizer {
    int kind;
    int n_vocab;
    tok_entry_t *tok;           /* [n_vocab] */
    char *text_pool;            /* token texts, concatenated */
    char *piece_pool;           /* rendered pieces, concatenated */
    size_t max_piece;

    int32_t *vmap;              /* open addressing text -> id, -1 empty; [vmap_mask + 1] */
    uint64_t vmap_mask;

    merge_t *merges;            /* BPE only */
    int n_merges;
    char *merge_pool;
    int32_t *mmap_;             /* open addressing (left,right) -> merge index; [mmap_mask + 1] */
    uint64_t mmap_mask;

    /* special tokens (attr & TA_SPECIAL): trie over their texts; rank = match priority
     * (longer first, then lower id) */
    int n_special;
    int n_special_user;         /* of which matchable without parse_special */
    int32_t *special_rank;      /* [n_vocab], -1 when not special */
    int32_t *trie_term;         /* [n_nodes] token id ending at node or -1 */
    int n_nodes;
    uint64_t *trie_key;         /* edge hash: key = (node << 8 | byte) + 1, 0 empty */
    int32_t *trie_child;
    uint64_t trie_mask;

    int32_t bos, eos, eot, eom, unk, pad;
    int add_bos, add_eos, add_space_prefix, ignore_merges;
    uint8_t *eog;               /* [n_vocab] 0/1 */

    int32_t spm_byte_tok[256];  /* SPM byte fallback token per byte, -1 when none */
    uint16_t byte_cp[256];      /* GPT-2 byte -> code point */
    int16_t cp_byte[0x144];     /* GPT-2 code point -> byte, -1 when not a byte symbol */
    uint8_t bpe_byte_ok[256];   /* 1 when the byte's GPT-2 symbol is a token rendering as it */

    pcre2_code *re[MAX_PRE_REGEX];
    int n_re;
};

/* ---------------------------------------------------------------------------------------------
 * Pre-tokeniser definitions (regex stages applied in sequence; each stage splits every current
 * piece into its matches and the gaps between them).
 * ------------------------------------------------------------------------------------------- */

#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_GPT2 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                        \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                         \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"      \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Letters that are not ASCII lower case / not ASCII upper case (the std::regex-compatible form
 * of [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] / [\p{Ll}\p{Lm}\p{Lo}\p{M}] that llama.cpp runs). */
#define RE_NOT_LOWER "(?:(?=\\p{L})[^a-z])"
#define RE_NOT_UPPER "(?:(?=\\p{L})[^A-Z])"
#define RE_GPT4O                                                                          \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_NOT_LOWER "*" RE_NOT_UPPER "+" RE_CONTRACTIONS "?"           \
    "|[^\\r\\n\\p{L}\\p{N}]?" RE_NOT_LOWER "+" RE_NOT_UPPER "*" RE_CONTRACTIONS "?"          \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_TEKKEN                                                                         \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_NOT_LOWER "*" RE_NOT_UPPER "+"                               \
    "|[^\\r\\n\\p{L}\\p{N}]?" RE_NOT_LOWER "+" RE_NOT_UPPER "*"                              \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* CJK ideographs, U+0800..U+4E00 and Hangul, minus the White_Space code points in that span:
 * llama.cpp maps non-ASCII white space to \v before matching, so they never match this class. */
#define RE_DEEPSEEK_CJK                                                                   \
    "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}"          \
    "\\x{202A}-\\x{202E}\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{4E00}"            \
    "\\x{AC00}-\\x{D7FF}]+"
/* Cased letters (Lu, Ll, Lt) as listed by DeepSeek LLM's tokenizer.json. */
#define RE_DEEPSEEK_LETTERS                                                               \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-"    \
    "\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}"      \
    "\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"    \
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-"      \
    "\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"   \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-"  \
    "\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-"    \
    "\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-"   \
    "\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}"   \
    "\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}"     \
    "\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-"   \
    "\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-"    \
    "\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"    \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-"  \
    "\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-"         \
    "\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-"    \
    "\\x{118DF}\\x{1E900}-\\x{1E943}"

typedef struct {
    const char *re[MAX_PRE_REGEX]; /* NULL-terminated when shorter */
    int ignore_merges;             /* a pre-token that is itself a token is emitted whole */
    int add_bos;                   /* default for tokenizer.ggml.add_bos_token */
} pre_def_t;

enum {
    PRE_DEFAULT, PRE_GPT2, PRE_LLAMA3, PRE_LLAMA3_MERGE, PRE_QWEN2, PRE_DEEPSEEK_LLM,
    PRE_DEEPSEEK_CODER, PRE_FALCON, PRE_STARCODER, PRE_GPT4O, PRE_TEKKEN,
};

static const pre_def_t k_pre_defs[] = {
    [PRE_DEFAULT] = {{"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, 0, 0},
    [PRE_GPT2] = {{RE_GPT2}, 0, 0},
    [PRE_LLAMA3] = {{RE_LLAMA3}, 1, 1},
    [PRE_LLAMA3_MERGE] = {{RE_LLAMA3}, 0, 0},
    [PRE_QWEN2] = {{RE_QWEN2}, 0, 0},
    [PRE_DEEPSEEK_LLM] = {{"[\\r\\n]", "\\s?[" RE_DEEPSEEK_LETTERS "]+",
                           "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
                           "\\x{3001}-\\x{3002}]+",
                           /* "\s+$": the leftmost match always starts a white-space run */
                           "(?<!\\s)\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"},
                          0, 0},
    [PRE_DEEPSEEK_CODER] = {{"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK,
                             "\\p{N}"},
                            0, 0},
    [PRE_FALCON] = {{"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, 0, 0},
    [PRE_STARCODER] = {{"\\p{N}", RE_GPT2}, 0, 0},
    [PRE_GPT4O] = {{RE_GPT4O}, 0, 0},
    [PRE_TEKKEN] = {{RE_TEKKEN}, 1, 1},
};

static const struct {
    const char *name;
    int pre;
} k_pre_names[] = {
    {"default", PRE_DEFAULT},
    {"gpt-2", PRE_GPT2}, {"phi-2", PRE_GPT2}, {"gigachat", PRE_GPT2}, {"a.x-4.0", PRE_GPT2},
    {"mellum", PRE_GPT2}, {"exaone4", PRE_GPT2}, {"mpt", PRE_GPT2}, {"olmo", PRE_GPT2},
    {"jais", PRE_GPT2}, {"trillion", PRE_GPT2}, {"granite-docling", PRE_GPT2},
    {"llama-bpe", PRE_LLAMA3}, {"llama3", PRE_LLAMA3}, {"llama-v3", PRE_LLAMA3},
    {"falcon3", PRE_LLAMA3}, {"falcon-h1", PRE_LLAMA3}, {"pixtral", PRE_LLAMA3},
    {"midm-2.0", PRE_LLAMA3}, {"lfm2", PRE_LLAMA3},
    {"dbrx", PRE_LLAMA3_MERGE}, {"smaug-bpe", PRE_LLAMA3_MERGE},
    {"qwen2", PRE_QWEN2}, {"deepseek-r1-qwen", PRE_QWEN2}, {"kormo", PRE_QWEN2},
    {"f2llmv2", PRE_QWEN2}, {"megrez", PRE_QWEN2}, {"stablelm2", PRE_QWEN2},
    {"hunyuan", PRE_QWEN2}, {"solar-open", PRE_QWEN2}, {"grok-2", PRE_QWEN2},
    {"deepseek-llm", PRE_DEEPSEEK_LLM},
    {"deepseek-coder", PRE_DEEPSEEK_CODER},
    {"falcon", PRE_FALCON},
    {"starcoder", PRE_STARCODER}, {"refact", PRE_STARCODER}, {"command-r", PRE_STARCODER},
    {"smollm", PRE_STARCODER}, {"codeshell", PRE_STARCODER}, {"exaone", PRE_STARCODER},
    {"minerva-7b", PRE_STARCODER}, {"mellum2", PRE_STARCODER},
    {"gpt-4o", PRE_GPT4O}, {"llama4", PRE_GPT4O}, {"kanana2", PRE_GPT4O},
    {"talkie", PRE_GPT4O}, {"minimax-m2", PRE_GPT4O},
    {"tekken", PRE_TEKKEN},
};

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

static uint64_t pow2_at_least(uint64_t n)
{
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Length of the well-formed UTF-8 character at s[0..n) (1..4), or 0 when the bytes there do
 * not start one (Unicode's definition: no overlongs, surrogates or code points > U+10FFFF). */
static size_t utf8_char_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < need) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < need; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return need;
}

static const char k_replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

static size_t utf8_put(char *dst, uint32_t cp)
{
    unsigned char *d = (unsigned char *)dst;
    if (cp < 0x80) {
        d[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (unsigned char)(0xC0 | (cp >> 6));
        d[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (unsigned char)(0xE0 | (cp >> 12));
        d[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (unsigned char)(0xF0 | (cp >> 18));
    d[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Returns p grown to hold at least need elements of size elem (updating *cap), p itself when
 * it already does, or NULL when out of memory (p is then still valid and unchanged). */
static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem) return NULL;
        c *= 2;
    }
    void *q = realloc(p, c * elem);
    if (!q) return NULL;
    *cap = c;
    return q;
}

static int is_c_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* ---------------------------------------------------------------------------------------------
 * Vocabulary and merge lookups
 * ------------------------------------------------------------------------------------------- */

static int32_t vocab_lookup(const tokenizer_t *t, const char *s, size_t len)
{
    uint64_t i = XXH3_64bits(s, len) & t->vmap_mask;
    for (;; i = (i + 1) & t->vmap_mask) {
        int32_t id = t->vmap[i];
        if (id < 0) return -1;
        const tok_entry_t *e = &t->tok[id];
        if (e->len == len && memcmp(t->text_pool + e->off, s, len) == 0) return id;
    }
}

/* Later duplicates replace earlier ones (the last id with a given text wins). */
static void vocab_insert(tokenizer_t *t, int32_t id)
{
    const tok_entry_t *e = &t->tok[id];
    const char *s = t->text_pool + e->off;
    uint64_t i = XXH3_64bits(s, e->len) & t->vmap_mask;
    for (;; i = (i + 1) & t->vmap_mask) {
        int32_t o = t->vmap[i];
        if (o < 0) break;
        const tok_entry_t *oe = &t->tok[o];
        if (oe->len == e->len && memcmp(t->text_pool + oe->off, s, e->len) == 0) break;
    }
    t->vmap[i] = id;
}

static uint64_t pair_hash(const char *l, size_t ll, const char *r, size_t rl)
{
    return XXH3_64bits_withSeed(r, rl, XXH3_64bits(l, ll));
}

/* Rank of merge (l, r), or -1. */
static int32_t merge_rank(const tokenizer_t *t, const char *l, size_t ll, const char *r,
                          size_t rl)
{
    if (!t->n_merges) return -1;
    uint64_t i = pair_hash(l, ll, r, rl) & t->mmap_mask;
    for (;; i = (i + 1) & t->mmap_mask) {
        int32_t m = t->mmap_[i];
        if (m < 0) return -1;
        const merge_t *e = &t->merges[m];
        const char *ml = t->merge_pool + e->off;
        if (e->llen == ll && e->rlen == rl && memcmp(ml, l, ll) == 0 &&
            memcmp(ml + ll + 1, r, rl) == 0)
            return e->rank;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Special-token trie
 * ------------------------------------------------------------------------------------------- */

static int32_t trie_child(const tokenizer_t *t, int32_t node, unsigned char b)
{
    uint64_t key = (((uint64_t)node << 8) | b) + 1;
    uint64_t i = XXH3_64bits(&key, sizeof key) & t->trie_mask;
    for (;; i = (i + 1) & t->trie_mask) {
        if (t->trie_key[i] == key) return t->trie_child[i];
        if (t->trie_key[i] == 0) return -1;
    }
}

static int trie_build(tokenizer_t *t, const len_id_t *ids, int n)
{
    size_t total = 1;
    for (int k = 0; k < n; k++) total += ids[k].len;
    if (total > INT32_MAX / 2) return -1;
    t->trie_term = malloc(total * sizeof *t->trie_term);
    t->trie_mask = pow2_at_least(total * 2) - 1;
    t->trie_key = calloc(t->trie_mask + 1, sizeof *t->trie_key);
    t->trie_child = malloc((t->trie_mask + 1) * sizeof *t->trie_child);
    if (!t->trie_term || !t->trie_key || !t->trie_child) return -1;
    t->n_nodes = 1;
    t->trie_term[0] = -1;
    for (int k = 0; k < n; k++) {
        const tok_entry_t *e = &t->tok[ids[k].id];
        const unsigned char *s = (const unsigned char *)t->text_pool + e->off;
        int32_t node = 0;
        for (uint32_t j = 0; j < e->len; j++) {
            int32_t c = trie_child(t, node, s[j]);
            if (c < 0) {
                uint64_t key = (((uint64_t)node << 8) | s[j]) + 1;
                uint64_t i = XXH3_64bits(&key, sizeof key) & t->trie_mask;
                while (t->trie_key[i]) i = (i + 1) & t->trie_mask;
                c = t->n_nodes++;
                t->trie_term[c] = -1;
                t->trie_key[i] = key;
                t->trie_child[i] = c;
            }
            node = c;
        }
        /* ids arrive in priority order; equal texts cannot occur (the map keeps one id) */
        if (t->trie_term[node] < 0) t->trie_term[node] = ids[k].id;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Construction from GGUF
 * ------------------------------------------------------------------------------------------- */

static int str_eq(gguf_str_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* Reads element j of a numeric array as int64 (integer types) — elem types checked by caller. */
static int64_t arr_int(const void *data, int type, uint64_t j)
{
    const unsigned char *p = data;
    switch (type) {
    case GGUF_UINT8: return p[j];
    case GGUF_INT8: return (int8_t)p[j];
    case GGUF_UINT16: { uint16_t v; memcpy(&v, p + 2 * j, 2); return v; }
    case GGUF_INT16: { int16_t v; memcpy(&v, p + 2 * j, 2); return v; }
    case GGUF_UINT32: { uint32_t v; memcpy(&v, p + 4 * j, 4); return v; }
    case GGUF_INT32: { int32_t v; memcpy(&v, p + 4 * j, 4); return v; }
    case GGUF_UINT64: { uint64_t v; memcpy(&v, p + 8 * j, 8); return (int64_t)v; }
    case GGUF_INT64: { int64_t v; memcpy(&v, p + 8 * j, 8); return v; }
    default: return 0;
    }
}

static int is_int_type(int type)
{
    return type == GGUF_UINT8 || type == GGUF_INT8 || type == GGUF_UINT16 ||
           type == GGUF_INT16 || type == GGUF_UINT32 || type == GGUF_INT32 ||
           type == GGUF_UINT64 || type == GGUF_INT64;
}

/* Token id key: kept at def when absent or out of range (as llama.cpp does). */
static int32_t read_id(const gguf_t *g, const char *key, int32_t def, int n_vocab)
{
    int64_t v;
    if (gguf_get_i64(g, key, &v) != 0) return def;
    if (v < 0 || v >= n_vocab) return def;
    return (int32_t)v;
}

static void read_flag(const gguf_t *g, const char *key, int *flag)
{
    int v;
    if (gguf_get_bool(g, key, &v) == 0) *flag = v != 0;
}

/* Texts that mark end-of-generation tokens (llama.cpp's list). */
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
};
/* Fill-in-the-middle tokens: pre/suf/mid are made control tokens; pad/rep/sep also end
 * generation. Keys first, then these texts when the key is absent. */
static const char *const k_fim_pre[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
    "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const k_fim_suf[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
    "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const k_fim_mid[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
    "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const k_fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
                                        NULL};
static const char *const k_fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                        "<reponame>", NULL};
static const char *const k_fim_sep[] = {"<|file_sep|>", NULL};

static int32_t find_lit(const tokenizer_t *t, const char *s)
{
    return vocab_lookup(t, s, strlen(s));
}

/* FIM token: the key's id, else the first listed text present. Returns the id or -1 and marks
 * the token a control token. */
static int32_t fim_token(tokenizer_t *t, const gguf_t *g, const char *key,
                         const char *const *texts)
{
    int32_t id = read_id(g, key, -1, t->n_vocab);
    if (id < 0) {
        for (int k = 0; texts[k] && id < 0; k++) id = find_lit(t, texts[k]);
        if (id >= 0) t->tok[id].attr |= TA_CONTROL;
    }
    return id;
}

static void set_eog_and_attrs(tokenizer_t *t, const gguf_t *g)
{
    t->eot = read_id(g, "tokenizer.ggml.eot_token_id", -1, t->n_vocab);
    t->eom = read_id(g, "tokenizer.ggml.eom_token_id", -1, t->n_vocab);

    (void)fim_token(t, g, "tokenizer.ggml.fim_pre_token_id", k_fim_pre);
    (void)fim_token(t, g, "tokenizer.ggml.fim_suf_token_id", k_fim_suf);
    (void)fim_token(t, g, "tokenizer.ggml.fim_mid_token_id", k_fim_mid);
    int32_t pad = fim_token(t, g, "tokenizer.ggml.fim_pad_token_id", k_fim_pad);
    int32_t rep = fim_token(t, g, "tokenizer.ggml.fim_rep_token_id", k_fim_rep);
    int32_t sep = fim_token(t, g, "tokenizer.ggml.fim_sep_token_id", k_fim_sep);
    if (pad >= 0) t->eog[pad] = 1;
    if (rep >= 0) t->eog[rep] = 1;
    if (sep >= 0) t->eog[sep] = 1;

    for (size_t k = 0; k < sizeof k_eog_texts / sizeof k_eog_texts[0]; k++) {
        int32_t id = find_lit(t, k_eog_texts[k]);
        if (id < 0) continue;
        t->eog[id] = 1;
        t->tok[id].attr |= TA_CONTROL;
    }
    /* gpt-oss renders these channel markers as text */
    static const char *const k_user[] = {"<|channel|>", "<|message|>", "<|start|>",
                                         "<|constrain|>"};
    for (size_t k = 0; k < sizeof k_user / sizeof k_user[0]; k++) {
        int32_t id = find_lit(t, k_user[k]);
        if (id >= 0) t->tok[id].attr = TA_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;

    /* o200k_harmony / solar-open: "<|end|>" ends a message, not the generation */
    int32_t end = find_lit(t, "<|end|>");
    int32_t ret = find_lit(t, "<|return|>"), call = find_lit(t, "<|call|>");
    int32_t calls = find_lit(t, "<|calls|>"), flush = find_lit(t, "<|flush|>");
    if (end >= 0 && t->eog[end] &&
        ((ret >= 0 && t->eog[ret] && ((call >= 0 && t->eog[call]) ||
                                      (calls >= 0 && t->eog[calls]))) ||
         (flush >= 0 && t->eog[flush] && ((call >= 0 && t->eog[call]) ||
                                          (calls >= 0 && t->eog[calls]))))) {
        t->eog[end] = 0;
        t->tok[end].attr = TA_USER_DEFINED;
    }
    /* gemma4 / paddleocr: "</s>" is not an end token when "<|tool_response>" is */
    int32_t tr = find_lit(t, "<|tool_response>"), s = find_lit(t, "</s>");
    if (tr >= 0 && s >= 0 && t->eog[tr] && t->eog[s]) {
        t->eog[s] = 0;
        t->tok[s].attr = TA_NORMAL;
    }
}

/* Phi-3 files: special tokens swallow white space to their right (except <unk>, <s>,
 * <|endoftext|>). Keyed on general.name, as llama.cpp does. */
static void phi3_strip_attrs(tokenizer_t *t, const gguf_t *g)
{
    gguf_str_t name;
    if (gguf_get_str(g, "general.name", &name) != 0) return;
    char low[256];
    size_t n = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
    for (size_t i = 0; i < n; i++) {
        char c = name.ptr[i];
        low[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    low[n] = 0;
    if (!strstr(low, "phi-3") && !strstr(low, "phi3")) return;
    for (int i = 0; i < t->n_vocab; i++)
        if (t->tok[i].attr & TA_SPECIAL) t->tok[i].attr |= TA_RSTRIP;
    int32_t id = find_lit(t, "</s>");
    if (id >= 0) t->tok[id].attr |= TA_RSTRIP;
    static const char *const k_keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t k = 0; k < 3; k++) {
        id = find_lit(t, k_keep[k]);
        if (id >= 0) t->tok[id].attr &= ~(uint32_t)TA_RSTRIP;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xNN>" -> NN, or -1. */
static int parse_byte_token(const char *s, size_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
}

/* Renders token id's bytes (as with render_special) into dst (capacity >= text len). */
static size_t render_piece(const tokenizer_t *t, int32_t id, char *dst)
{
    const tok_entry_t *e = &t->tok[id];
    const char *s = t->text_pool + e->off;
    size_t n = e->len;
    if (e->attr & TA_SPECIAL) {
        memcpy(dst, s, n);
        return n;
    }
    if (e->attr & TA_NORMAL) {
        size_t w = 0;
        if (t->kind == TOK_SPM) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    dst[w++] = ' ';
                    i += 3;
                } else
                    dst[w++] = s[i++];
            }
            return w;
        }
        /* byte-level BPE: every code point of the text stands for one byte */
        for (size_t i = 0; i < n;) {
            size_t k = utf8_char_len((const unsigned char *)s + i, n - i);
            if (k == 0) {
                dst[w++] = s[i++];
                continue;
            }
            uint32_t cp = 0;
            const unsigned char *u = (const unsigned char *)s + i;
            if (k == 1) cp = u[0];
            else if (k == 2) cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
            else cp = 0x110000; /* 3- and 4-byte characters are never byte symbols */
            if (cp < 0x144 && t->cp_byte[cp] >= 0) {
                dst[w++] = (char)t->cp_byte[cp];
            } else {
                memcpy(dst + w, s + i, k);
                w += k;
            }
            i += k;
        }
        return w;
    }
    if (e->attr & TA_BYTE) {
        int b = parse_byte_token(s, n);
        if (b < 0) return 0;
        dst[0] = (char)b;
        return 1;
    }
    return 0; /* unused / undefined types render as nothing */
}

/* Match priority of special tokens: longer texts first, then lower ids. */
static int cmp_special(const void *a, const void *b)
{
    const len_id_t *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int compile_pre(tokenizer_t *t, int pre, char *errstr, size_t errlen)
{
    const pre_def_t *d = &k_pre_defs[pre];
    uint32_t jit = 0;
    pcre2_config(PCRE2_CONFIG_JIT, &jit);
    for (int k = 0; k < MAX_PRE_REGEX && d->re[k]; k++) {
        int err;
        PCRE2_SIZE eoff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)d->re[k], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY,
                                       &err, &eoff, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            sw_seterr(errstr, errlen, "tokenizer: pre-tokenizer regex %d does not compile at %zu: %s",
                      k, (size_t)eoff, (const char *)msg);
            return -1;
        }
        if (jit) (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to interpreter */
        t->re[t->n_re++] = re;
    }
    t->ignore_merges = d->ignore_merges;
    return 0;
}

static int load_merges(tokenizer_t *t, const gguf_t *g, char *errstr, size_t errlen)
{
    int et;
    uint64_t n;
    if (gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n) != 0 || et != GGUF_STRING) {
        sw_seterr(errstr, errlen, "tokenizer: gpt2 model without a tokenizer.ggml.merges string array");
        return -1;
    }
    if (n > INT32_MAX / 4) {
        sw_seterr(errstr, errlen, "tokenizer: too many merges (%llu)", (unsigned long long)n);
        return -1;
    }
    size_t pool = 0;
    for (uint64_t j = 0; j < n; j++) {
        gguf_str_t s;
        if (gguf_get_arr_str(g, "tokenizer.ggml.merges", j, &s) != 0) goto bad;
        pool += s.len;
        if (pool > UINT32_MAX) goto big;
    }
    t->merges = malloc((n ? n : 1) * sizeof *t->merges);
    t->merge_pool = malloc(pool ? pool : 1);
    t->mmap_mask = pow2_at_least(n * 2 + 1) - 1;
    t->mmap_ = malloc((t->mmap_mask + 1) * sizeof *t->mmap_);
    if (!t->merges || !t->merge_pool || !t->mmap_) goto oom;
    memset(t->mmap_, 0xff, (t->mmap_mask + 1) * sizeof *t->mmap_);
    size_t off = 0;
    for (uint64_t j = 0; j < n; j++) {
        gguf_str_t s;
        if (gguf_get_arr_str(g, "tokenizer.ggml.merges", j, &s) != 0) goto bad;
        /* split at the first space after the first byte; no space: unusable, skipped */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) continue;
        merge_t *m = &t->merges[t->n_merges];
        m->off = (uint32_t)off;
        m->llen = (uint32_t)(sp - s.ptr);
        m->rlen = (uint32_t)(s.len - m->llen - 1);
        m->rank = (int32_t)j;
        memcpy(t->merge_pool + off, s.ptr, s.len);
        off += s.len;
        const char *l = t->merge_pool + m->off, *r = l + m->llen + 1;
        uint64_t i = pair_hash(l, m->llen, r, m->rlen) & t->mmap_mask;
        int dup = 0;
        for (;; i = (i + 1) & t->mmap_mask) {
            int32_t o = t->mmap_[i];
            if (o < 0) break;
            const merge_t *oe = &t->merges[o];
            if (oe->llen == m->llen && oe->rlen == m->rlen &&
                memcmp(t->merge_pool + oe->off, l, s.len) == 0) {
                dup = 1; /* the first (lowest) rank of a repeated pair wins */
                break;
            }
        }
        if (dup) continue;
        t->mmap_[i] = t->n_merges++;
    }
    return 0;
bad:
    sw_seterr(errstr, errlen, "tokenizer: unreadable tokenizer.ggml.merges element");
    return -1;
big:
    sw_seterr(errstr, errlen, "tokenizer: tokenizer.ggml.merges too large");
    return -1;
oom:
    sw_seterr(errstr, errlen, "tokenizer: out of memory");
    return -1;
}

static void init_byte_map(tokenizer_t *t)
{
    /* GPT-2: printable Latin-1 bytes map to themselves, the rest to U+0100.. in byte order */
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
                        (b >= 0xAE && b <= 0xFF);
        t->byte_cp[b] = (uint16_t)(printable ? b : 256 + n++);
    }
    for (int c = 0; c < 0x144; c++) t->cp_byte[c] = -1;
    for (int b = 0; b < 256; b++) t->cp_byte[t->byte_cp[b]] = (int16_t)b;
}

tokenizer_t *tokenizer_from_gguf(const gguf_t *g, char *errstr, size_t errlen)
{
    tokenizer_t *t = NULL;
    len_id_t *special = NULL;
    if (!g) {
        sw_seterr(errstr, errlen, "tokenizer: no GGUF");
        return NULL;
    }
    gguf_str_t model;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model) != 0) {
        sw_seterr(errstr, errlen, "tokenizer: tokenizer.ggml.model missing (supported: %s)",
                  TOKENIZER_MODELS_SUPPORTED);
        return NULL;
    }
    int kind;
    if (str_eq(model, "llama")) kind = TOK_SPM;
    else if (str_eq(model, "gpt2")) kind = TOK_BPE;
    else {
        sw_seterr(errstr, errlen,
                  "tokenizer: unsupported tokenizer.ggml.model '%.*s' (supported: %s; "
                  "bert/WPM is a non-causal encoder vocabulary and is not supported)",
                  (int)(model.len > 64 ? 64 : model.len), model.ptr, TOKENIZER_MODELS_SUPPORTED);
        return NULL;
    }
    int pre = PRE_DEFAULT;
    if (kind == TOK_BPE) {
        gguf_str_t ps;
        if (gguf_get_str(g, "tokenizer.ggml.pre", &ps) == 0 && ps.len) {
            pre = -1;
            for (size_t k = 0; k < sizeof k_pre_names / sizeof k_pre_names[0]; k++)
                if (str_eq(ps, k_pre_names[k].name)) pre = k_pre_names[k].pre;
            if (pre < 0) {
                char list[1024];
                size_t w = 0;
                for (size_t k = 0; k < sizeof k_pre_names / sizeof k_pre_names[0]; k++) {
                    int r = snprintf(list + w, sizeof list - w, "%s%s", k ? ", " : "",
                                     k_pre_names[k].name);
                    if (r < 0 || (size_t)r >= sizeof list - w) break;
                    w += (size_t)r;
                }
                sw_seterr(errstr, errlen,
                          "tokenizer: unsupported pre-tokenizer tokenizer.ggml.pre '%.*s' "
                          "(supported: %s)",
                          (int)(ps.len > 64 ? 64 : ps.len), ps.ptr, list);
                return NULL;
            }
        }
    }

    int et;
    uint64_t n;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) != 0 || et != GGUF_STRING || n == 0) {
        sw_seterr(errstr, errlen, "tokenizer: tokenizer.ggml.tokens missing or not a string array");
        return NULL;
    }
    if (n > INT32_MAX / 4) {
        sw_seterr(errstr, errlen, "tokenizer: vocabulary too large (%llu)", (unsigned long long)n);
        return NULL;
    }

    t = calloc(1, sizeof *t);
    if (!t) goto oom;
    t->kind = kind;
    t->n_vocab = (int)n;
    t->tok = calloc(n, sizeof *t->tok);
    t->eog = calloc(n, 1);
    t->special_rank = malloc(n * sizeof *t->special_rank);
    if (!t->tok || !t->eog || !t->special_rank) goto oom;

    /* texts; empty ones become "[EMPTY_<id>]" */
    size_t pool = 0;
    for (uint64_t j = 0; j < n; j++) {
        gguf_str_t s;
        if (gguf_get_arr_str(g, "tokenizer.ggml.tokens", j, &s) != 0) {
            sw_seterr(errstr, errlen, "tokenizer: unreadable token %llu", (unsigned long long)j);
            goto fail;
        }
        pool += s.len ? s.len : 24;
        if (pool > UINT32_MAX) {
            sw_seterr(errstr, errlen, "tokenizer: token texts too large");
            goto fail;
        }
    }
    t->text_pool = malloc(pool ? pool : 1);
    t->piece_pool = malloc(pool ? pool : 1);
    if (!t->text_pool || !t->piece_pool) goto oom;
    size_t off = 0;
    for (uint64_t j = 0; j < n; j++) {
        gguf_str_t s;
        (void)gguf_get_arr_str(g, "tokenizer.ggml.tokens", j, &s);
        t->tok[j].off = (uint32_t)off;
        if (s.len) {
            memcpy(t->text_pool + off, s.ptr, s.len);
            t->tok[j].len = (uint32_t)s.len;
        } else {
            int r = snprintf(t->text_pool + off, 24, "[EMPTY_%llu]", (unsigned long long)j);
            t->tok[j].len = (uint32_t)r;
        }
        off += t->tok[j].len;
        t->tok[j].attr = TA_NORMAL;
    }

    /* scores and types */
    uint64_t m;
    if (gguf_get_arr(g, "tokenizer.ggml.scores", &et, &m) == 0) {
        const void *d = gguf_get_arr_data(g, "tokenizer.ggml.scores");
        if (m < n || (et != GGUF_FLOAT32 && et != GGUF_FLOAT64) || !d) {
            sw_seterr(errstr, errlen, "tokenizer: tokenizer.ggml.scores has %llu %s values for %llu "
                      "tokens", (unsigned long long)m, et == GGUF_FLOAT32 ? "f32" : "non-float",
                      (unsigned long long)n);
            goto fail;
        }
        for (uint64_t j = 0; j < n; j++) {
            if (et == GGUF_FLOAT32) memcpy(&t->tok[j].score, (const char *)d + 4 * j, 4);
            else {
                double v;
                memcpy(&v, (const char *)d + 8 * j, 8);
                t->tok[j].score = (float)v;
            }
        }
    }
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &m) == 0) {
        const void *d = gguf_get_arr_data(g, "tokenizer.ggml.token_type");
        if (m < n || !is_int_type(et) || !d) {
            sw_seterr(errstr, errlen, "tokenizer: tokenizer.ggml.token_type has %llu values for "
                      "%llu tokens (or is not an integer array)", (unsigned long long)m,
                      (unsigned long long)n);
            goto fail;
        }
        for (uint64_t j = 0; j < n; j++) {
            switch (arr_int(d, et, j)) {
            case 1: t->tok[j].attr = TA_NORMAL; break;
            case 2: t->tok[j].attr = TA_UNKNOWN; break;
            case 3: t->tok[j].attr = TA_CONTROL; break;
            case 4: t->tok[j].attr = TA_USER_DEFINED; break;
            case 5: t->tok[j].attr = TA_UNUSED; break;
            case 6: t->tok[j].attr = TA_BYTE; break;
            default: t->tok[j].attr = 0; break; /* undefined */
            }
        }
    }

    t->vmap_mask = pow2_at_least(n * 2) - 1;
    t->vmap = malloc((t->vmap_mask + 1) * sizeof *t->vmap);
    if (!t->vmap) goto oom;
    memset(t->vmap, 0xff, (t->vmap_mask + 1) * sizeof *t->vmap);
    for (uint64_t j = 0; j < n; j++) vocab_insert(t, (int32_t)j);

    if (kind == TOK_BPE) {
        if (load_merges(t, g, errstr, errlen) != 0) goto fail;
        if (compile_pre(t, pre, errstr, errlen) != 0) goto fail;
        init_byte_map(t);
    }

    /* special ids and flags (defaults as llama.cpp: SPM 1/2/0, BPE 11/11/none) */
    int32_t def_bos = kind == TOK_SPM ? 1 : 11, def_eos = kind == TOK_SPM ? 2 : 11;
    int32_t def_unk = kind == TOK_SPM ? 0 : -1;
    if (def_bos >= t->n_vocab) def_bos = -1;
    if (def_eos >= t->n_vocab) def_eos = -1;
    if (def_unk >= t->n_vocab) def_unk = -1;
    t->bos = read_id(g, "tokenizer.ggml.bos_token_id", def_bos, t->n_vocab);
    t->eos = read_id(g, "tokenizer.ggml.eos_token_id", def_eos, t->n_vocab);
    t->unk = read_id(g, "tokenizer.ggml.unknown_token_id", def_unk, t->n_vocab);
    t->pad = read_id(g, "tokenizer.ggml.padding_token_id", -1, t->n_vocab);
    t->add_bos = kind == TOK_SPM ? 1 : k_pre_defs[pre].add_bos;
    t->add_eos = 0;
    t->add_space_prefix = kind == TOK_SPM;
    read_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    read_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos);
    read_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);

    set_eog_and_attrs(t, g);
    phi3_strip_attrs(t, g);

    /* SPM byte fallback */
    for (int b = 0; b < 256; b++) {
        char buf[8];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        int32_t id = vocab_lookup(t, buf, 6);
        if (id < 0) {
            char c = (char)b;
            id = vocab_lookup(t, &c, 1);
        }
        t->spm_byte_tok[b] = id;
    }

    /* rendered pieces */
    off = 0;
    for (int i = 0; i < t->n_vocab; i++) {
        size_t k = render_piece(t, i, t->piece_pool + off);
        t->tok[i].piece_off = (uint32_t)off;
        t->tok[i].piece_len = (uint32_t)k;
        if (k > t->max_piece) t->max_piece = k;
        off += k;
    }

    /* BPE bytes that round-trip: symbol is a token whose piece is that byte (DeepSeek, e.g.,
     * has user-defined tokens "\xc3\xbf" etc. in place of the bytes UTF-8 never uses) */
    if (kind == TOK_BPE) {
        for (int b = 0; b < 256; b++) {
            char u[4];
            int32_t id = vocab_lookup(t, u, utf8_put(u, t->byte_cp[b]));
            t->bpe_byte_ok[b] = id >= 0 && !(t->tok[id].attr & TA_HIDDEN) &&
                                t->tok[id].piece_len == 1 &&
                                (unsigned char)t->piece_pool[t->tok[id].piece_off] == b;
        }
    }

    /* special tokens in match priority order */
    special = malloc(n * sizeof *special);
    if (!special) goto oom;
    for (int i = 0; i < t->n_vocab; i++) {
        t->special_rank[i] = -1;
        uint32_t a = t->tok[i].attr;
        if (!(a & TA_SPECIAL) || vocab_lookup(t, t->text_pool + t->tok[i].off, t->tok[i].len) != i)
            continue;
        special[t->n_special].len = t->tok[i].len;
        special[t->n_special].id = i;
        t->n_special++;
        if (!(a & TA_HIDDEN)) t->n_special_user++;
    }
    qsort(special, (size_t)t->n_special, sizeof *special, cmp_special);
    for (int k = 0; k < t->n_special; k++) t->special_rank[special[k].id] = k;
    if (trie_build(t, special, t->n_special) != 0) goto oom;
    free(special);
    return t;

oom:
    sw_seterr(errstr, errlen, "tokenizer: out of memory");
fail:
    free(special);
    tokenizer_free(t);
    return NULL;
}

void tokenizer_free(tokenizer_t *t)
{
    if (!t) return;
    for (int k = 0; k < t->n_re; k++) pcre2_code_free(t->re[k]);
    free(t->trie_child);
    free(t->trie_key);
    free(t->trie_term);
    free(t->special_rank);
    free(t->eog);
    free(t->mmap_);
    free(t->merge_pool);
    free(t->merges);
    free(t->vmap);
    free(t->piece_pool);
    free(t->text_pool);
    free(t->tok);
    free(t);
}

/* ---------------------------------------------------------------------------------------------
 * Accessors
 * ------------------------------------------------------------------------------------------- */

int tokenizer_n_vocab(const tokenizer_t *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer_t *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer_t *t) { return t->eos; }
int tokenizer_add_bos(const tokenizer_t *t) { return t->add_bos; }
int tokenizer_add_eos(const tokenizer_t *t) { return t->add_eos; }

int tokenizer_is_eog(const tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

int tokenizer_strips_start_space(const tokenizer_t *t) { return t->add_space_prefix ? 1 : 0; }

/* Control and unknown tokens: the ones token_to_piece renders as "" without render_special. */
int tokenizer_is_control(const tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->tok[id].attr & TA_HIDDEN) != 0;
}

int tokenizer_is_special(const tokenizer_t *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab &&
           (t->tok[id].attr & (TA_CONTROL | TA_USER_DEFINED)) != 0;
}

int32_t tokenizer_find(const tokenizer_t *t, const char *s, size_t len)
{
    if (!s && len) return -1;
    return vocab_lookup(t, s ? s : "", len);
}

/* ---------------------------------------------------------------------------------------------
 * Encoding
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    int32_t prev, next;
    uint32_t start, n; /* bytes of the symbol in the working buffer; n == 0: merged away */
} sym_t;

typedef struct {
    float score;  /* SPM: higher first */
    int32_t rank; /* BPE: lower first */
    int32_t left, right;
    uint32_t size; /* combined length when queued: stale when the symbols changed */
} bigram_t;

typedef struct {
    uint32_t rank, pos;
    int32_t id;
} cand_t;

typedef struct {
    size_t start, end; /* text segment when id < 0, else the bytes the token (and strip) cover */
    int32_t id;
} seg_t;

/* Per-call working memory. */
typedef struct {
    char *buf;
    size_t buf_cap;
    char *sub; /* BPE: an invalid-UTF-8 run with unrepresentable bytes replaced */
    size_t sub_cap;
    sym_t *sym;
    size_t sym_cap;
    bigram_t *heap;
    size_t heap_n, heap_cap;
    pcre2_match_data *md;
    int plain; /* tokenizer_encode_segments: merges never give a special token */
} scratch_t;

typedef struct {
    int32_t *out;
    size_t cap;
    size_t n;
} sink_t;

/* vocab_lookup for a merged piece: in plain mode never a special token. */
static int32_t piece_lookup(const tokenizer_t *t, const scratch_t *sc, const char *s, size_t len)
{
    int32_t id = vocab_lookup(t, s, len);
    return id >= 0 && sc->plain && (t->tok[id].attr & TA_SPECIAL) ? -1 : id;
}

static void emit(sink_t *s, int32_t id)
{
    if (s->n < s->cap) s->out[s->n] = id;
    s->n++;
}

/* mode 0: SPM order (score desc, left asc); mode 1: BPE order (rank asc, left asc). */
static int bg_before(const bigram_t *a, const bigram_t *b, int mode)
{
    if (mode == 0) {
        if (a->score != b->score) return a->score > b->score;
    } else {
        if (a->rank != b->rank) return a->rank < b->rank;
    }
    return a->left < b->left;
}

static int heap_push(scratch_t *sc, const bigram_t *b, int mode)
{
    bigram_t *h = grow(sc->heap, &sc->heap_cap, sc->heap_n + 1, sizeof *h);
    if (!h) return -1;
    sc->heap = h;
    size_t i = sc->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_before(b, &sc->heap[p], mode)) break;
        sc->heap[i] = sc->heap[p];
        i = p;
    }
    sc->heap[i] = *b;
    return 0;
}

static bigram_t heap_pop(scratch_t *sc, int mode)
{
    bigram_t top = sc->heap[0];
    bigram_t last = sc->heap[--sc->heap_n];
    size_t n = sc->heap_n, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bg_before(&sc->heap[c + 1], &sc->heap[c], mode)) c++;
        if (!bg_before(&sc->heap[c], &last, mode)) break;
        sc->heap[i] = sc->heap[c];
        i = c;
    }
    if (n) sc->heap[i] = last;
    return top;
}

/* Splits buf[0..len) into symbols, one per well-formed UTF-8 character and one per byte that
 * is not part of one. (llama.cpp sizes a symbol by its lead byte alone, which on invalid input
 * can swallow the first bytes of a following escaped space and break the round trip; on valid
 * UTF-8 both splits agree.) Returns the count or -1. */
static long split_symbols(scratch_t *sc, size_t len)
{
    sym_t *sy = grow(sc->sym, &sc->sym_cap, len, sizeof *sy);
    if (!sy) return -1;
    sc->sym = sy;
    long n = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_char_len((const unsigned char *)sc->buf + i, len - i);
        if (k == 0) k = 1;
        sym_t *s = &sc->sym[n];
        s->start = (uint32_t)i;
        s->n = (uint32_t)k;
        s->prev = (int32_t)n - 1;
        i += k;
        s->next = i == len ? -1 : (int32_t)n + 1;
        n++;
    }
    return n;
}

static int spm_try_bigram(const tokenizer_t *t, scratch_t *sc, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return 0;
    const sym_t *a = &sc->sym[l], *b = &sc->sym[r];
    size_t len = (size_t)a->n + b->n;
    int32_t id = piece_lookup(t, sc, sc->buf + a->start, len);
    if (id < 0) return 0;
    bigram_t bg = {t->tok[id].score, 0, l, r, (uint32_t)len};
    return heap_push(sc, &bg, 0);
}

static int bpe_try_bigram(const tokenizer_t *t, scratch_t *sc, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return 0;
    const sym_t *a = &sc->sym[l], *b = &sc->sym[r];
    int32_t rank = merge_rank(t, sc->buf + a->start, a->n, sc->buf + b->start, b->n);
    if (rank < 0) return 0;
    bigram_t bg = {0.0f, rank, l, r, a->n + b->n};
    return heap_push(sc, &bg, 1);
}

/* Merges the n symbols of sc->buf, the best adjacent pair first, until no pair merges, then
 * emits each symbol's token. Mode 0 (SentencePiece): a pair merges when it is a token, the
 * highest score first; a symbol that is no token gives its bytes' byte tokens (<0xNN>, else
 * unk). Mode 1 (BPE): a pair merges when it is a merge rule, the lowest rank first; a symbol
 * that is no token gives those of its single bytes that are tokens. 0, or -1 out of memory. */
static int merge_emit(const tokenizer_t *t, scratch_t *sc, long n, int mode, sink_t *out)
{
    int (*try_bigram)(const tokenizer_t *, scratch_t *, int32_t, int32_t) =
        mode ? bpe_try_bigram : spm_try_bigram;
    sc->heap_n = 0;
    for (long i = 1; i < n; i++)
        if (try_bigram(t, sc, (int32_t)i - 1, (int32_t)i) != 0) return -1;
    while (sc->heap_n) {
        bigram_t bg = heap_pop(sc, mode);
        sym_t *a = &sc->sym[bg.left], *b = &sc->sym[bg.right];
        if (a->n == 0 || b->n == 0 || a->n + b->n != bg.size) continue;
        a->n += b->n;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0) sc->sym[b->next].prev = bg.left;
        if (try_bigram(t, sc, a->prev, bg.left) != 0) return -1;
        if (try_bigram(t, sc, bg.left, a->next) != 0) return -1;
    }
    for (int32_t i = 0; i != -1; i = sc->sym[i].next) {
        const sym_t *y = &sc->sym[i];
        int32_t id = piece_lookup(t, sc, sc->buf + y->start, y->n);
        if (id >= 0) {
            emit(out, id);
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            const char *byte = sc->buf + y->start + j;
            int32_t b;
            if (mode == 0) {
                b = t->spm_byte_tok[(unsigned char)*byte];
                if (b < 0) b = t->unk;
            } else {
                b = piece_lookup(t, sc, byte, 1);
            }
            if (b >= 0) emit(out, b);
        }
    }
    return 0;
}

/* One text fragment through SentencePiece-style merging. */
static int spm_fragment(const tokenizer_t *t, scratch_t *sc, const char *s, size_t len,
                        int prefix, sink_t *out)
{
    if (len > (SIZE_MAX - 3) / 3 || (len + 1) * 3 > UINT32_MAX) return -1;
    char *nb = grow(sc->buf, &sc->buf_cap, (len + 1) * 3, 1);
    if (!nb) return -1;
    sc->buf = nb;
    size_t w = 0;
    if (prefix) {
        memcpy(sc->buf, "\xe2\x96\x81", 3);
        w = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(sc->buf + w, "\xe2\x96\x81", 3);
            w += 3;
        } else
            sc->buf[w++] = s[i];
    }
    long n = split_symbols(sc, w);
    if (n < 0) return -1;
    if (n == 0) return 0;
    return merge_emit(t, sc, n, 0, out);
}

/* One pre-token (raw bytes) through byte mapping and ranked merges. */
static int bpe_word(const tokenizer_t *t, scratch_t *sc, const char *s, size_t len, sink_t *out)
{
    if (len > UINT32_MAX / 2) return -1;
    char *nb = grow(sc->buf, &sc->buf_cap, len * 2, 1);
    if (!nb) return -1;
    sc->buf = nb;
    size_t w = 0;
    for (size_t i = 0; i < len; i++) w += utf8_put(sc->buf + w, t->byte_cp[(unsigned char)s[i]]);
    if (t->ignore_merges) {
        int32_t id = piece_lookup(t, sc, sc->buf, w);
        if (id >= 0) {
            emit(out, id);
            return 0;
        }
    }
    long n = split_symbols(sc, w);
    if (n <= 0) return (int)n;
    return merge_emit(t, sc, n, 1, out);
}

/* Pre-tokenises valid UTF-8 s[0..len) with regex stages stage.. and encodes each piece, depth
 * first: each match and each gap between matches of one stage goes through the next stage, the
 * pieces of the last one through bpe_word, in text order. Depth <= MAX_PRE_REGEX; no memory
 * beyond the shared match data. */
static int bpe_split(const tokenizer_t *t, scratch_t *sc, const char *s, size_t len, int stage,
                     sink_t *out)
{
    if (stage == t->n_re) return bpe_word(t, sc, s, len, out);
    PCRE2_SPTR subj = (PCRE2_SPTR)s;
    size_t prev = 0, at = 0;
    while (at < len) {
        int rc = pcre2_match(t->re[stage], subj, len, at, PCRE2_NO_UTF_CHECK, sc->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(t->re[stage], subj, len, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             sc->md, NULL);
        if (rc < 0) break; /* no match (or a resource limit): the rest is one gap */
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        size_t ms = ov[0], me = ov[1]; /* read before recursing reuses the match data */
        if (me <= ms) { /* empty match: not a piece; step one character */
            at = ms + 1;
            while (at < len && (subj[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (ms > prev && bpe_split(t, sc, s + prev, ms - prev, stage + 1, out) != 0) return -1;
        if (bpe_split(t, sc, s + ms, me - ms, stage + 1, out) != 0) return -1;
        prev = at = me;
    }
    if (prev < len && bpe_split(t, sc, s + prev, len - prev, stage + 1, out) != 0) return -1;
    return 0;
}

/* One text fragment through byte-level BPE. Bytes outside well-formed UTF-8 form their own
 * pre-token (one per maximal run) and so survive a round trip; a byte whose GPT-2 symbol is not
 * in the vocabulary (many vocabularies lack C0, C1, F5..FF, which valid UTF-8 never uses)
 * becomes U+FFFD, as llama.cpp turns every invalid byte into. */
static int bpe_fragment(const tokenizer_t *t, scratch_t *sc, const char *s, size_t len,
                        sink_t *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t j = i, k;
        while (j < len && (k = utf8_char_len(u + j, len - j)) > 0) j += k;
        if (j > i && bpe_split(t, sc, s + i, j - i, 0, out) != 0) return -1;
        size_t b = j;
        while (j < len && utf8_char_len(u + j, len - j) == 0) j++;
        if (j > b) {
            char *nb = grow(sc->sub, &sc->sub_cap, (j - b) * 3, 1);
            if (!nb) return -1;
            sc->sub = nb;
            size_t w = 0;
            for (size_t x = b; x < j; x++) {
                if (t->bpe_byte_ok[u[x]]) nb[w++] = (char)u[x];
                else {
                    memcpy(nb + w, k_replacement, 3);
                    w += 3;
                }
            }
            if (bpe_word(t, sc, nb, w, out) != 0) return -1;
        }
        i = j;
    }
    return 0;
}

static int cmp_cand(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int cmp_seg(const void *a, const void *b)
{
    const seg_t *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* Splits text into special tokens and text segments: each special token (longest first, then
 * lowest id) claims its leftmost non-overlapping occurrences inside still unclaimed text, the
 * way llama.cpp's tokenizer_st_partition does. mask (NULL: all text) is [len]: a token is
 * matched only where every byte it covers has mask 1. *segs gets the token segments sorted by
 * position (text lies between them); returns their count or -1. */
static long partition(const tokenizer_t *t, const char *text, size_t len, int parse_special,
                      const uint8_t *mask, seg_t **segs)
{
    *segs = NULL;
    if ((parse_special ? t->n_special : t->n_special_user) == 0 || len == 0) return 0;
    if (len > UINT32_MAX) return -1;
    cand_t *c = NULL;
    size_t nc = 0, ccap = 0;
    unsigned char *state = NULL;
    seg_t *sg = NULL;
    long ns = 0;
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++) {
        int32_t node = 0;
        for (size_t j = i; j < len && (!mask || mask[j]); j++) {
            node = trie_child(t, node, u[j]);
            if (node < 0) break;
            int32_t id = t->trie_term[node];
            if (id < 0) continue;
            if (!parse_special && (t->tok[id].attr & TA_HIDDEN)) continue;
            cand_t *nc2 = grow(c, &ccap, nc + 1, sizeof *nc2);
            if (!nc2) goto oom;
            c = nc2;
            c[nc].rank = (uint32_t)t->special_rank[id];
            c[nc].pos = (uint32_t)i;
            c[nc].id = id;
            nc++;
        }
    }
    if (nc == 0) {
        free(c);
        return 0;
    }
    qsort(c, nc, sizeof *c, cmp_cand);
    state = calloc(len, 1);
    sg = malloc(nc * sizeof *sg);
    if (!state || !sg) goto oom;
    for (size_t k = 0; k < nc; k++) {
        const tok_entry_t *e = &t->tok[c[k].id];
        size_t p = c[k].pos, q = p + e->len, x;
        for (x = p; x < q && !state[x]; x++) {}
        if (x < q) continue;
        memset(state + p, 1, q - p);
        if (e->attr & TA_LSTRIP)
            while (p > 0 && !state[p - 1] && is_c_space(u[p - 1])) state[--p] = 1;
        if (e->attr & TA_RSTRIP)
            while (q < len && !state[q] && is_c_space(u[q])) state[q++] = 1;
        sg[ns].start = p;
        sg[ns].end = q;
        sg[ns].id = c[k].id;
        ns++;
    }
    qsort(sg, (size_t)ns, sizeof *sg, cmp_seg);
    free(c);
    free(state);
    *segs = sg;
    return ns;
oom:
    free(c);
    free(state);
    free(sg);
    return -1;
}

/* tokenizer_encode, and with mask (see partition) tokenizer_encode_segments: then no merge
 * gives a special token either (sc.plain). */
static int encode(const tokenizer_t *t, const char *text, size_t len, const uint8_t *mask,
                  int add_special, int parse_special, int32_t *out, int cap)
{
    if (!t || (!text && len) || len > (size_t)INT_MAX / 4) return -1;
    sink_t sink = {out, cap > 0 && out ? (size_t)cap : 0, 0};
    scratch_t sc = {0};
    sc.plain = mask != NULL;
    seg_t *segs = NULL;
    int rc = -1;

    if (add_special && t->add_bos && t->bos >= 0) emit(&sink, t->bos);
    if (len > 0) {
        long ns = partition(t, text, len, parse_special, mask, &segs);
        if (ns < 0) goto done;
        if (t->kind == TOK_BPE) {
            sc.md = pcre2_match_data_create(1, NULL);
            if (!sc.md) goto done;
        }
        int prev_special = 1; /* SPM: a fragment at the start or after a token gets the prefix */
        size_t at = 0;
        for (long k = 0; k <= ns; k++) {
            size_t end = k < ns ? segs[k].start : len;
            if (end > at) {
                int r = t->kind == TOK_SPM
                            ? spm_fragment(t, &sc, text + at, end - at,
                                           t->add_space_prefix && prev_special, &sink)
                            : bpe_fragment(t, &sc, text + at, end - at, &sink);
                if (r != 0) goto done;
                prev_special = 0;
            }
            if (k < ns) {
                emit(&sink, segs[k].id);
                prev_special = 1;
                at = segs[k].end;
            }
        }
    }
    if (add_special && t->add_eos && t->eos >= 0) emit(&sink, t->eos);
    rc = sink.n > (size_t)INT_MAX ? -1 : (int)sink.n;
done:
    free(segs);
    pcre2_match_data_free(sc.md);
    free(sc.buf);
    free(sc.sub);
    free(sc.sym);
    free(sc.heap);
    return rc;
}

/* Also -1 for inputs over INT_MAX / 4 bytes (the count could not be returned). */
int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                     int parse_special, int32_t *out, int cap)
{
    return encode(t, text, len, NULL, add_special, parse_special, out, cap);
}

int tokenizer_encode_segments(const tokenizer_t *t, const tok_segment_t *segs, int n,
                              int add_special, int32_t *out, int cap)
{
    if (!t || n < 0 || (n > 0 && !segs)) return -1;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (!segs[i].text && segs[i].len) return -1;
        if (segs[i].len > (size_t)INT_MAX / 4 - len) return -1;
        len += segs[i].len;
    }
    char *text = malloc(len + 1);
    uint8_t *mask = malloc(len + 1);
    int rc = -1;
    if (!text || !mask) goto done;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (segs[i].len) memcpy(text + at, segs[i].text, segs[i].len);
        memset(mask + at, segs[i].special ? 1 : 0, segs[i].len);
        at += segs[i].len;
    }
    rc = encode(t, text, len, mask, add_special, 1, out, cap);
done:
    free(text);
    free(mask);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Decoding
 * ------------------------------------------------------------------------------------------- */

int tokenizer_token_to_piece(const tokenizer_t *t, int32_t id, int render_special, char *buf,
                             size_t cap)
{
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    const tok_entry_t *e = &t->tok[id];
    if (!render_special && (e->attr & TA_HIDDEN)) return 0;
    size_t n = e->piece_len;
    if (buf && cap) memcpy(buf, t->piece_pool + e->piece_off, n < cap ? n : cap);
    return (int)n;
}

void tokenizer_stream_init(tok_stream_t *s, int at_text_start)
{
    memset(s, 0, sizeof *s);
    s->at_start = at_text_start ? 1 : 0;
}

/* Bytes a UTF-8 lead byte needs (2..4), 0 when it cannot start a character. */
static int utf8_need(unsigned char c)
{
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Whether b may be byte idx (1..3) of a character that starts with lead. */
static int utf8_cont_ok(unsigned char lead, int idx, unsigned char b)
{
    if ((b & 0xC0) != 0x80) return 0;
    if (idx == 1) {
        if (lead == 0xE0) return b >= 0xA0;
        if (lead == 0xED) return b <= 0x9F;
        if (lead == 0xF0) return b >= 0x90;
        if (lead == 0xF4) return b <= 0x8F;
    }
    return 1;
}

static int put_bytes(char *out, size_t cap, size_t *w, const void *src, size_t k)
{
    if (k > cap - *w) return -1;
    memcpy(out + *w, src, k);
    *w += k;
    return 0;
}

/* Feeds one byte to the stream state st; completed text goes to out. 0 or -1 (cap). */
static int stream_byte(tok_stream_t *st, unsigned char b, char *out, size_t cap, size_t *w)
{
    for (;;) {
        if (st->n_pend == 0) {
            if (b < 0x80) return put_bytes(out, cap, w, &b, 1);
            if (utf8_need(b)) {
                st->pend[0] = b;
                st->n_pend = 1;
                return 0;
            }
            return put_bytes(out, cap, w, k_replacement, 3);
        }
        if (utf8_cont_ok(st->pend[0], st->n_pend, b)) {
            st->pend[st->n_pend++] = b;
            if (st->n_pend == utf8_need(st->pend[0])) {
                int r = put_bytes(out, cap, w, st->pend, (size_t)st->n_pend);
                st->n_pend = 0;
                return r;
            }
            return 0;
        }
        /* the pending prefix cannot complete: one U+FFFD for it, then b starts afresh */
        st->n_pend = 0;
        if (put_bytes(out, cap, w, k_replacement, 3) != 0) return -1;
    }
}

/* Output is at most 3 * (piece length + 1) bytes (every byte of a piece could be invalid and
 * become a 3-byte U+FFFD); for real vocabularies that stays within the header's "64 + longest
 * token" bound, which holds for any piece with at most 30 invalid bytes. State is committed
 * only on success, so a call that returns -1 can be retried with a larger buffer. */
int tokenizer_stream_push(const tokenizer_t *t, tok_stream_t *s, int32_t id, char *out,
                          size_t cap)
{
    if (!t || !s || id < 0 || id >= t->n_vocab || (!out && cap)) return -1;
    const tok_entry_t *e = &t->tok[id];
    const unsigned char *p = (const unsigned char *)t->piece_pool + e->piece_off;
    size_t n = (e->attr & TA_HIDDEN) ? 0 : e->piece_len;
    tok_stream_t st = *s; /* committed only on success */
    if (st.n_pend < 0 || st.n_pend > 3) st.n_pend = 0;
    if (st.at_start) {
        if (n == 0) return 0;
        if (t->add_space_prefix && p[0] == ' ') {
            p++;
            n--;
        }
        st.at_start = 0;
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (stream_byte(&st, p[i], out, cap, &w) != 0) return -1;
    *s = st;
    return (int)w;
}

int tokenizer_stream_flush(const tokenizer_t *t, tok_stream_t *s, char *out, size_t cap)
{
    (void)t;
    if (!s) return -1;
    if (s->n_pend <= 0) {
        s->n_pend = 0;
        return 0;
    }
    if (!out || cap < 3) return -1;
    memcpy(out, k_replacement, 3);
    s->n_pend = 0;
    return 3;
}
