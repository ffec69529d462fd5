/* engine/chat.c: built-in chat templates (see chat.h) and engine_chat_* (engine.h).
 *
 * The formats, with r = role and c = content of each message in order ("trim" strips ASCII
 * whitespace at both ends, like C isspace):
 *   chatml       <|im_start|>r\nc<|im_end|>\n ...               opener <|im_start|>assistant\n
 *   phi4         <|im_start|>r<|im_sep|>c<|im_end|> ...         opener <|im_start|>assistant<|im_sep|>
 *   phi3         <|r|>\nc<|end|>\n ...                          opener <|assistant|>\n
 *   falcon3      <|r|>\nc\n ...                                 opener <|assistant|>\n
 *   zephyr       <|r|>\nc<|endoftext|>\n ...                    opener <|assistant|>\n
 *   glmedge      <|r|>\nc ...                                   opener <|assistant|>
 *   llama3       <|start_header_id|>r<|end_header_id|>\n\n trim(c) <|eot_id|> ...
 *                                            opener <|start_header_id|>assistant<|end_header_id|>\n\n
 *   gemma        <start_of_turn>r'\n trim(c)<end_of_turn>\n, r' = "model" for "assistant"; system
 *                messages are not turns: their trimmed texts are joined and put, followed by
 *                "\n\n", at the start of the next turn that is not the model's. opener
 *                <start_of_turn>model\n
 *   llama2*      "[INST] " first; system: <<SYS>>\nc\n<</SYS>>\n\n (plain llama2: c\n);
 *                user: c" [/INST]"; any other role: c</s>, and the next message opens a new turn
 *                with "[INST] " (-bos: "<s>[INST] "). -strip trims every c. No opener.
 *   mistral-v1/v3/v3-tekken  a turn opens with L"[INST]"T (v1: L = " ", T = " "; v3: L = "",
 *                T = " "; v3-tekken: L = T = ""); system: c\n\n; user: c L"[/INST]"; other roles:
 *                T c</s> (v3 trims c) and close the turn. No opener.
 *   mistral-v7(-tekken)  system: [SYSTEM_PROMPT]Tc[/SYSTEM_PROMPT]; user: [INST]Tc[/INST];
 *                other: Tc</s> (T = " ", tekken ""). No opener.
 * Those are llama.cpp's formats. The Jinja-exact ones (llama-3 ... mistral-nemo) are described
 * in the section "Jinja-exact templates" below. */
#include "chat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/utf8.h"
#include "engine_internal.h"
#include "gguf.h"

enum tmpl {
    T_CHATML, T_LLAMA2, T_LLAMA2_SYS, T_LLAMA2_SYS_BOS, T_LLAMA2_SYS_STRIP, T_LLAMA3,
    T_MISTRAL_V1, T_MISTRAL_V3, T_MISTRAL_V3_TEKKEN, T_MISTRAL_V7, T_MISTRAL_V7_TEKKEN, T_PHI3,
    T_PHI4, T_FALCON3, T_ZEPHYR, T_GLMEDGE, T_GEMMA,
    /* the Jinja-exact ones (see "Jinja-exact templates" below) */
    T_J_LLAMA3, T_J_LLAMA31, T_J_LLAMA32, T_J_QWEN25, T_J_QWEN3, T_J_GEMMA2, T_J_GEMMA3,
    T_J_PHI3, T_J_PHI35, T_J_MISTRAL03, T_J_NEMO, T_COUNT
};

/* names, indexed by enum tmpl (llama.cpp's for the llama.cpp formats) */
static const char *const NAMES[T_COUNT] = {
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3",
    "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3",
    "phi4", "falcon3", "zephyr", "glmedge", "gemma",
    "llama-3", "llama-3.1", "llama-3.2", "qwen2.5", "qwen3", "gemma-2", "gemma-3", "phi-3",
    "phi-3.5", "mistral-v0.3", "mistral-nemo",
};

static const char NAME_LIST[] =
    "chatml, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, llama3, mistral-v1, "
    "mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, phi3, phi4, falcon3, zephyr, "
    "glmedge, gemma, llama-3, llama-3.1, llama-3.2, qwen2.5, qwen3, gemma-2, gemma-3, phi-3, "
    "phi-3.5, mistral-v0.3, mistral-nemo";

const char *engine_chat_template_names(void)
{
    return NAME_LIST;
}

static int tmpl_index(const char *name, size_t len)
{
    for (int i = 0; i < T_COUNT; i++)
        if (strlen(NAMES[i]) == len && memcmp(NAMES[i], name, len) == 0) return i;
    return -1;
}

int chat_template_exact(const char *name)
{
    return (name ? tmpl_index(name, strlen(name)) : -1) >= T_J_LLAMA3;
}

const char *chat_template_lookup(const char *name)
{
    int i = name ? tmpl_index(name, strlen(name)) : -1;
    return i >= 0 ? NAMES[i] : NULL;
}

/* ---- detection ---- */

typedef struct {
    const char *s;
    size_t n;
} text_t;

static int has(text_t t, const char *needle)
{
    return memmem(t.s, t.n, needle, strlen(needle)) != NULL;
}

/* The Jinja-exact template whose official source t is (each test is a set of phrases only that
 * model family's own template has), or -1. */
static int detect_exact(text_t t)
{
    /* (phrases without a "\n": sources may hold it as an escape or as a newline) */
    if (has(t, "<start_of_turn>") && has(t, "first_user_prefix") &&
        has(t, "Conversation roles must alternate"))
        return T_J_GEMMA3;
    if (has(t, "<start_of_turn>") && has(t, "{{ bos_token }}") &&
        has(t, "raise_exception('System role not supported')") &&
        has(t, "Conversation roles must alternate") && has(t, "message['content'] | trim"))
        return T_J_GEMMA2;
    if (has(t, "<|start_header_id|>") && has(t, "Cutting Knowledge Date: December 2023") &&
        has(t, "{%- set system_message = messages[0]['content']|trim %}")) {
        if (has(t, "strftime_now(\"%d %b %Y\")")) return T_J_LLAMA32;
        if (has(t, "{%- set date_string = \"26 Jul 2024\" %}")) return T_J_LLAMA31;
        return -1;
    }
    if (has(t, "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>") &&
        has(t, "'+ message['content'] | trim + '<|eot_id|>' %}") &&
        has(t, "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}") &&
        !has(t, "Cutting Knowledge"))
        return T_J_LLAMA3;
    if (has(t, "<|im_start|>") && has(t, "ns.last_query_index") && has(t, "enable_thinking") &&
        has(t, "message.content.split('</think>')[-1].lstrip("))
        return T_J_QWEN3;
    if (has(t, "<|im_start|>") &&
        has(t, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.") &&
        has(t, "<tool_response>") && !has(t, "<think>"))
        return T_J_QWEN25;
    if (has(t, "{% elif message['role'] == 'user' %}{{'<|user|>") &&
        has(t, "{% elif message['role'] == 'assistant' %}{{'<|assistant|>") &&
        has(t, "<|end|>") && has(t, "{% else %}{{ eos_token }}{% endif %}")) {
        if (has(t, "{% if message['role'] == 'system' and message['content'] %}{{'<|system|>"))
            return T_J_PHI35;
        if (has(t, "{% if message['role'] == 'system' %}{{'<|system|>")) return T_J_PHI3;
        return -1;
    }
    if (has(t, "{%- if loop.last and system_message is defined %}") &&
        has(t, "After the optional system message, conversation roles must alternate")) {
        if (has(t, "{{- \"[INST] \" + system_message + ") &&
            has(t, "{{- \" \" + message[\"content\"]|trim + eos_token}}"))
            return T_J_MISTRAL03;
        if (has(t, "{{- \"[INST]\" + system_message + ") &&
            has(t, "{{- message[\"content\"] + eos_token}}"))
            return T_J_NEMO;
    }
    return -1;
}

const char *chat_template_detect(const char *tmpl, size_t len, const char **unsupported)
{
    const char *other = NULL, *found = NULL;
    text_t t = {tmpl ? tmpl : "", tmpl ? len : 0};
    int byname = tmpl_index(t.s, t.n), exact = byname >= 0 ? -1 : detect_exact(t);
    if (byname >= 0) {
        found = NAMES[byname];
    } else if (exact >= 0) {
        found = NAMES[exact];
    } else if (has(t, "<|im_start|>")) {
        if (has(t, "<|im_sep|>")) found = "phi4";
        else if (has(t, "<end_of_utterance>")) other = "smolvlm";
        else found = "chatml";
    } else if ((t.n >= 7 && memcmp(t.s, "mistral", 7) == 0) || has(t, "[INST]")) {
        if (has(t, "[SYSTEM_PROMPT]")) {
            found = "mistral-v7";
        } else if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
            /* mistral's own v1 / v3 / v3-tekken templates */
            if (has(t, " [INST]")) found = "mistral-v1";
            else if (has(t, "\"[INST]\"")) found = "mistral-v3-tekken";
            else found = "mistral-v3";
        } else if (has(t, "content.strip()")) {
            found = "llama2-sys-strip";
        } else if (has(t, "bos_token + '[INST]")) {
            found = "llama2-sys-bos";
        } else if (has(t, "<<SYS>>")) {
            found = "llama2-sys";
        } else {
            found = "llama2";
        }
    } else if (has(t, "<|assistant|>") && has(t, "<|end|>")) {
        found = "phi3";
    } else if (has(t, "[gMASK]<sop>")) {
        other = "chatglm4";
    } else if (has(t, "<|assistant|>") && has(t, "<|user|>")) {
        if (has(t, "<|tool_declare|>")) other = "exaone-moe";
        else if (has(t, "</s>")) found = "falcon3";
        else found = "glmedge";
    } else if (has(t, "<|{{ item['role'] }}|>") && has(t, "<|begin_of_image|>")) {
        found = "glmedge";
    } else if (has(t, "<|user|>") && has(t, "<|endoftext|>")) {
        found = "zephyr";
    } else if (has(t, "bos_token + message['role']")) {
        other = "monarch";
    } else if (has(t, "<start_of_turn>")) {
        found = "gemma";
    } else if (has(t, "'\\n\\nAssistant: ' + eos_token")) {
        other = "orion";
    } else if (has(t, "GPT4 Correct ")) {
        other = "openchat";
    } else if (has(t, "USER: ") && has(t, "ASSISTANT: ")) {
        other = has(t, "SYSTEM: ") ? "vicuna-orca" : "vicuna";
    } else if (has(t, "### Instruction:") && has(t, "<|EOT|>")) {
        other = "deepseek";
    } else if (has(t, "<|START_OF_TURN_TOKEN|>") && has(t, "<|USER_TOKEN|>")) {
        other = "command-r";
    } else if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) {
        found = "llama3";
    }
    /* llama.cpp knows further formats after llama3 in its order; none is built in here */
    if (unsupported) *unsupported = found ? NULL : other;
    return found;
}

/* ---- rendering ---- */

/* Text under construction and, when segs is wanted, its cut into template text (special 1) and
 * message contents (special 0): [off, off + len) ranges of p, adjacent ones of a kind merged. */
typedef struct {
    size_t off, len;
    int special;
} cut_t;

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
    const char *raise; /* the template refuses the conversation: why (static), else NULL */
    cut_t *cut;
    int n_cut, cut_cap;
} sb_t;

static void put_as(sb_t *b, const char *s, size_t n, int special)
{
    if (b->oom) return;
    if (n > SIZE_MAX - b->n - 1) {
        b->oom = 1;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap = cap > SIZE_MAX / 2 ? b->n + n + 1 : cap * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n > 0) {
        if (b->n_cut > 0 && b->cut[b->n_cut - 1].special == special) {
            b->cut[b->n_cut - 1].len += n;
        } else {
            if (b->n_cut == b->cut_cap) {
                int cap = b->cut_cap ? b->cut_cap * 2 : 16;
                cut_t *c = cap > b->cut_cap ? realloc(b->cut, sizeof *c * (size_t)cap) : NULL;
                if (!c) {
                    b->oom = 1;
                    return;
                }
                b->cut = c;
                b->cut_cap = cap;
            }
            b->cut[b->n_cut++] = (cut_t){b->n, n, special};
        }
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* the template's own text */
static void put(sb_t *b, const char *s, size_t n)
{
    put_as(b, s, n, 1);
}

static void puts_(sb_t *b, const char *s)
{
    put(b, s, strlen(s));
}

static int is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

/* s without leading and trailing whitespace: [*start, *start + return) */
static size_t trimmed(const char *s, const char **start)
{
    size_t n = strlen(s);
    while (n > 0 && is_space(*s)) s++, n--;
    while (n > 0 && is_space(s[n - 1])) n--;
    *start = s;
    return n;
}

/* a message's content (plain text), trimmed when trim */
static void content(sb_t *b, const char *s, int trim)
{
    const char *p = s;
    size_t n = trim ? trimmed(s, &p) : strlen(s);
    put_as(b, p, n, 0);
}

static void render_llama2(sb_t *b, int t, const engine_chat_msg_t *m, int n)
{
    int with_sys = t != T_LLAMA2;
    int bos_inside = t == T_LLAMA2_SYS_BOS;
    int strip = t == T_LLAMA2_SYS_STRIP;
    int in_turn = 1; /* the first turn is opened here, without BOS */
    puts_(b, "[INST] ");
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role ? m[i].role : "";
        const char *c = m[i].content ? m[i].content : "";
        if (!in_turn) {
            puts_(b, bos_inside ? "<s>[INST] " : "[INST] ");
            in_turn = 1;
        }
        if (strcmp(role, "system") == 0) {
            if (with_sys) puts_(b, "<<SYS>>\n");
            content(b, c, strip);
            puts_(b, with_sys ? "\n<</SYS>>\n\n" : "\n");
        } else if (strcmp(role, "user") == 0) {
            content(b, c, strip);
            puts_(b, " [/INST]");
        } else {
            content(b, c, strip);
            puts_(b, "</s>");
            in_turn = 0;
        }
    }
}

static void render_mistral_v1_v3(sb_t *b, int t, const engine_chat_msg_t *m, int n)
{
    const char *lead = t == T_MISTRAL_V1 ? " " : "";
    const char *trail = t == T_MISTRAL_V3_TEKKEN ? "" : " ";
    int in_turn = 0;
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role ? m[i].role : "";
        const char *c = m[i].content ? m[i].content : "";
        if (!in_turn) {
            puts_(b, lead);
            puts_(b, "[INST]");
            puts_(b, trail);
            in_turn = 1;
        }
        if (strcmp(role, "system") == 0) {
            content(b, c, 0);
            puts_(b, "\n\n");
        } else if (strcmp(role, "user") == 0) {
            content(b, c, 0);
            puts_(b, lead);
            puts_(b, "[/INST]");
        } else {
            puts_(b, trail);
            content(b, c, t == T_MISTRAL_V3);
            puts_(b, "</s>");
            in_turn = 0;
        }
    }
}

static void render_mistral_v7(sb_t *b, int t, const engine_chat_msg_t *m, int n)
{
    const char *sp = t == T_MISTRAL_V7 ? " " : "";
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role ? m[i].role : "";
        const char *c = m[i].content ? m[i].content : "";
        if (strcmp(role, "system") == 0) {
            puts_(b, "[SYSTEM_PROMPT]");
            puts_(b, sp);
            content(b, c, 0);
            puts_(b, "[/SYSTEM_PROMPT]");
        } else if (strcmp(role, "user") == 0) {
            puts_(b, "[INST]");
            puts_(b, sp);
            content(b, c, 0);
            puts_(b, "[/INST]");
        } else {
            puts_(b, sp);
            content(b, c, 0);
            puts_(b, "</s>");
        }
    }
}

static void render_gemma(sb_t *b, const engine_chat_msg_t *m, int n)
{
    sb_t sys = {0};
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role ? m[i].role : "";
        const char *c = m[i].content ? m[i].content : "";
        if (strcmp(role, "system") == 0) {
            content(&sys, c, 1);
            continue;
        }
        if (strcmp(role, "assistant") == 0) role = "model";
        puts_(b, "<start_of_turn>");
        puts_(b, role);
        puts_(b, "\n");
        if (sys.n > 0 && strcmp(role, "model") != 0) {
            put_as(b, sys.p, sys.n, 0);
            puts_(b, "\n\n");
            sys.n = 0;
        }
        content(b, c, 1);
        puts_(b, "<end_of_turn>\n");
    }
    if (sys.oom) b->oom = 1;
    free(sys.p);
    free(sys.cut);
}

/* Templates of the form: prefix role mid content suffix, for every message. */
static void render_simple(sb_t *b, const engine_chat_msg_t *m, int n, const char *pre,
                          const char *mid, const char *suf, int trim)
{
    for (int i = 0; i < n; i++) {
        puts_(b, pre);
        puts_(b, m[i].role ? m[i].role : ""); /* template text: roles are checked first */
        puts_(b, mid);
        content(b, m[i].content ? m[i].content : "", trim);
        puts_(b, suf);
    }
}

/* ---- Jinja-exact templates ----
 *
 * Each renders, byte for byte, what the model's own Jinja template (its tokenizer_config.json
 * chat_template) gives under Hugging Face transformers' apply_chat_template for messages with
 * string contents and no tools, including the template's BOS text; where the template raises an
 * exception (or fails on an empty conversation), rendering fails with its message. Jinja's
 * `trim` and Python's str methods are reproduced exactly (Unicode whitespace; strip('\n') ...).
 * The test data under tests/chat_templates/ holds the template sources and their outputs. */

/* Sets the template's error (the first one wins); rendering then fails with it. */
static void raise_(sb_t *b, const char *msg)
{
    if (!b->raise) b->raise = msg;
}

/* Length of the UTF-8 character at s[0..n) (1 for a bad byte) and its code point in *cp
 * (0xFFFFFFFF for a bad byte: a truncated, overlong or surrogate sequence, or one above
 * U+10FFFF; such text never reaches a Jinja template, which works on Unicode strings). */
static size_t utf8_at(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t k = sw_utf8_decode(s, n, cp);
    if (k) return k;
    *cp = 0xFFFFFFFFu;
    return 1;
}

/* Python's str.isspace() for one code point. */
static int py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Jinja's trim (Python str.strip()) of s[0..n): [*start, *start + return). */
static size_t py_trim(const char *s, size_t n, const char **start)
{
    const unsigned char *u = (const unsigned char *)s;
    uint32_t cp;
    size_t a = 0, e = n;
    while (a < e) {
        size_t k = utf8_at(u + a, e - a, &cp);
        if (!py_space(cp)) break;
        a += k;
    }
    while (e > a) {
        size_t b = e - 1; /* back to the start of the last character */
        while (b > a && e - b < 4 && (u[b] & 0xC0) == 0x80) b--;
        size_t k = utf8_at(u + b, e - b, &cp);
        if (b + k != e) { /* not one whole character: a stray byte */
            b = e - 1;
            cp = 0xFFFFFFFFu;
        }
        if (!py_space(cp)) break;
        e = b;
    }
    *start = s + a;
    return e - a;
}

/* str.lstrip('\n') / str.rstrip('\n') on [*s, *s + *n) */
static void lstrip_nl(const char **s, size_t *n)
{
    while (*n > 0 && **s == '\n') (*s)++, (*n)--;
}

static void rstrip_nl(const char *s, size_t *n)
{
    (void)s;
    while (*n > 0 && s[*n - 1] == '\n') (*n)--;
}

/* memmem from the end: the last occurrence of needle in s[0..n), or NULL */
static const char *last_of(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

static const char *role_of(const engine_chat_msg_t *m)
{
    return m->role ? m->role : "";
}

static const char *content_of(const engine_chat_msg_t *m)
{
    return m->content ? m->content : "";
}

static int is_role(const engine_chat_msg_t *m, const char *role)
{
    return strcmp(role_of(m), role) == 0;
}

/* content trimmed as Jinja's trim filter does */
static void content_trim(sb_t *b, const char *c)
{
    const char *p;
    size_t n = py_trim(c, strlen(c), &p);
    put_as(b, p, n, 0);
}

/* HF's tojson of a string (json.dumps, ensure_ascii=False): content, quotes included. */
static void content_json(sb_t *b, const char *c)
{
    put_as(b, "\"", 1, 0);
    for (const char *p = c; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        char esc[8];
        const char *e = NULL;
        switch (ch) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
                e = esc;
            }
        }
        if (e) put_as(b, e, strlen(e), 0);
        else put_as(b, p, 1, 0);
    }
    put_as(b, "\"", 1, 0);
}

static const char NO_MESSAGE[] =
    "the conversation has no messages (the template reads messages[0])";
#define L3_HEADER(r) "<|start_header_id|>" r "<|end_header_id|>\n\n"

/* A Llama 3 header turn of message m, its content trimmed (the caller ends it). */
static void l3_turn(sb_t *b, const engine_chat_msg_t *m)
{
    puts_(b, "<|start_header_id|>");
    puts_(b, role_of(m));
    puts_(b, "<|end_header_id|>\n\n");
    content_trim(b, content_of(m));
}

/* Llama 3 Instruct: BOS before the first message; every message a header turn, trimmed. */
static void render_j_llama3(sb_t *b, const engine_chat_msg_t *m, int n, int agp)
{
    for (int i = 0; i < n; i++) {
        if (i == 0) puts_(b, "<|begin_of_text|>");
        l3_turn(b, &m[i]);
        puts_(b, "<|eot_id|>");
    }
    if (agp) puts_(b, L3_HEADER("assistant"));
}

/* Llama 3.1 / 3.3 (date "26 Jul 2024") and 3.2 (today's date): a system turn always opens, with
 * the knowledge-date preamble and the first message's trimmed content when it is a system one;
 * tool and ipython messages are ipython turns holding the content as a JSON string. */
static void render_j_llama31(sb_t *b, const engine_chat_msg_t *m, int n, int agp,
                             const char *date)
{
    puts_(b, "<|begin_of_text|>");
    if (n == 0) {
        raise_(b, NO_MESSAGE);
        return;
    }
    int i = 0;
    puts_(b, L3_HEADER("system") "Cutting Knowledge Date: December 2023\nToday Date: ");
    puts_(b, date);
    puts_(b, "\n\n");
    if (is_role(&m[0], "system")) content_trim(b, content_of(&m[i++]));
    puts_(b, "<|eot_id|>");
    for (; i < n; i++) {
        if (is_role(&m[i], "tool") || is_role(&m[i], "ipython")) {
            puts_(b, L3_HEADER("ipython"));
            content_json(b, content_of(&m[i]));
        } else {
            l3_turn(b, &m[i]);
        }
        puts_(b, "<|eot_id|>");
    }
    if (agp) puts_(b, L3_HEADER("assistant"));
}

/* Qwen tool results: consecutive tool messages share one user turn. */
static void qwen_tool(sb_t *b, const engine_chat_msg_t *m, int n, int i)
{
    if (i == 0 || !is_role(&m[i - 1], "tool")) puts_(b, "<|im_start|>user");
    puts_(b, "\n<tool_response>\n");
    content(b, content_of(&m[i]), 0);
    puts_(b, "\n</tool_response>");
    if (i == n - 1 || !is_role(&m[i + 1], "tool")) puts_(b, "<|im_end|>\n");
}

static void chatml_turn(sb_t *b, const engine_chat_msg_t *m)
{
    puts_(b, "<|im_start|>");
    puts_(b, role_of(m));
    puts_(b, "\n");
    content(b, content_of(m), 0);
    puts_(b, "<|im_end|>\n");
}

/* Qwen2.5 Instruct: ChatML with Qwen's default system message when the first is not one; other
 * roles than system, user, assistant and tool are left out. */
static void render_j_qwen25(sb_t *b, const engine_chat_msg_t *m, int n, int agp)
{
    if (n == 0) {
        raise_(b, NO_MESSAGE);
        return;
    }
    if (is_role(&m[0], "system")) chatml_turn(b, &m[0]);
    else puts_(b, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
               "assistant.<|im_end|>\n");
    for (int i = 0; i < n; i++) {
        if (is_role(&m[i], "user") || is_role(&m[i], "assistant") ||
            (is_role(&m[i], "system") && i > 0))
            chatml_turn(b, &m[i]);
        else if (is_role(&m[i], "tool"))
            qwen_tool(b, m, n, i);
    }
    if (agp) puts_(b, "<|im_start|>assistant\n");
}

/* Qwen3: ChatML; an assistant content is cut at </think> into reasoning and answer. Assistant
 * turns after the last real user query (one not wrapped in <tool_response>) keep their
 * reasoning in a <think> block (the final message always gets one); earlier ones lose it.
 * enable_thinking 0 opens the answer with an empty think block. */
static void render_j_qwen3(sb_t *b, const engine_chat_msg_t *m, int n, int agp, int think)
{
    static const char OPEN[] = "<tool_response>", CLOSE[] = "</tool_response>";
    if (n == 0) {
        raise_(b, NO_MESSAGE);
        return;
    }
    if (is_role(&m[0], "system")) chatml_turn(b, &m[0]);
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        const char *c = content_of(&m[i]);
        size_t cl = strlen(c);
        int wrapped = cl >= strlen(OPEN) && memcmp(c, OPEN, strlen(OPEN)) == 0 &&
                      cl >= strlen(CLOSE) && memcmp(c + cl - strlen(CLOSE), CLOSE,
                                                    strlen(CLOSE)) == 0;
        if (is_role(&m[i], "user") && !wrapped) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i > 0)) {
            chatml_turn(b, &m[i]);
        } else if (is_role(&m[i], "assistant")) {
            const char *c = content_of(&m[i]), *ans = c, *rs = "";
            size_t cl = strlen(c), al = cl, rl = 0;
            const char *end = memmem(c, cl, "</think>", 8);
            if (end) {
                const char *last = last_of(c, cl, "</think>");
                ans = last + 8;
                al = (size_t)(c + cl - ans);
                lstrip_nl(&ans, &al);
                rl = (size_t)(end - c);
                rstrip_nl(c, &rl);
                const char *open = last_of(c, rl, "<think>");
                rs = open ? open + 7 : c;
                rl -= (size_t)(rs - c);
                lstrip_nl(&rs, &rl);
            }
            puts_(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || rl > 0)) {
                lstrip_nl(&rs, &rl); /* reasoning_content.strip('\n') */
                rstrip_nl(rs, &rl);
                lstrip_nl(&ans, &al);
                puts_(b, "<think>\n");
                put_as(b, rs, rl, 0);
                puts_(b, "\n</think>\n\n");
            }
            put_as(b, ans, al, 0);
            puts_(b, "<|im_end|>\n");
        } else if (is_role(&m[i], "tool")) {
            qwen_tool(b, m, n, i);
        }
    }
    if (agp) {
        puts_(b, "<|im_start|>assistant\n");
        if (!think) puts_(b, "<think>\n\n</think>\n\n");
    }
}

#define ALTERNATE "Conversation roles must alternate user/assistant/user/assistant/..."

/* Gemma 2 (a system message first is refused) and Gemma 3 (a system message first is put,
 * untrimmed and followed by a blank line, at the start of the first turn). Turns must alternate
 * user / model starting with user; "assistant" is called "model"; contents are trimmed. */
static void render_j_gemma(sb_t *b, int t, const engine_chat_msg_t *m, int n, int agp)
{
    puts_(b, "<bos>");
    if (n == 0) {
        raise_(b, NO_MESSAGE);
        return;
    }
    int first = 0;
    if (is_role(&m[0], "system")) {
        if (t == T_J_GEMMA2) {
            raise_(b, "System role not supported");
            return;
        }
        first = 1;
    }
    for (int i = first; i < n; i++) {
        if (is_role(&m[i], "user") != ((i - first) % 2 == 0)) {
            raise_(b, ALTERNATE);
            return;
        }
        puts_(b, "<start_of_turn>");
        puts_(b, is_role(&m[i], "assistant") ? "model" : role_of(&m[i]));
        puts_(b, "\n");
        if (i == first && first) {
            content(b, content_of(&m[0]), 0);
            puts_(b, "\n\n");
        }
        content_trim(b, content_of(&m[i]));
        puts_(b, "<end_of_turn>\n");
    }
    if (agp) puts_(b, "<start_of_turn>model\n");
}

/* Phi-3 mini (July 2024) and Phi-3.5 mini: <|role|>\ncontent<|end|>\n for system, user and
 * assistant (3.5: a system message only when not empty), other roles left out; the generation
 * prompt, or else EOS. */
static void render_j_phi3(sb_t *b, int t, const engine_chat_msg_t *m, int n, int agp)
{
    for (int i = 0; i < n; i++) {
        const char *c = content_of(&m[i]);
        if (is_role(&m[i], "system") && (t == T_J_PHI3 || *c)) puts_(b, "<|system|>\n");
        else if (is_role(&m[i], "user")) puts_(b, "<|user|>\n");
        else if (is_role(&m[i], "assistant")) puts_(b, "<|assistant|>\n");
        else continue;
        content(b, c, 0);
        puts_(b, "<|end|>\n");
    }
    puts_(b, agp ? "<|assistant|>\n" : "<|endoftext|>");
}

/* Mistral 7B Instruct v0.3 / Large 2407 ("v3") and Nemo ("v3-tekken"): a system message first
 * goes, with a blank line, into the last message when that is a user one (else nowhere);
 * user/assistant must alternate after it; [INST] c[/INST] (Nemo: no space), assistant
 * " "trim(c)</s> (Nemo: c</s>). No generation prompt. */
static void render_j_mistral(sb_t *b, int t, const engine_chat_msg_t *m, int n)
{
    int nemo = t == T_J_NEMO;
    if (n == 0) {
        raise_(b, NO_MESSAGE);
        return;
    }
    int first = is_role(&m[0], "system") ? 1 : 0, k = 0;
    for (int i = first; i < n; i++) {
        if (is_role(&m[i], "tool") || is_role(&m[i], "tool_results")) continue;
        if (is_role(&m[i], "user") != (k % 2 == 0)) {
            raise_(b, "After the optional system message, conversation roles must alternate "
                   "user/assistant/user/assistant/...");
            return;
        }
        k++;
    }
    puts_(b, "<s>");
    for (int i = first; i < n; i++) {
        if (is_role(&m[i], "user")) {
            puts_(b, nemo ? "[INST]" : "[INST] ");
            if (i == n - 1 && first) {
                content(b, content_of(&m[0]), 0);
                puts_(b, "\n\n");
            }
            content(b, content_of(&m[i]), 0);
            puts_(b, "[/INST]");
        } else if (is_role(&m[i], "assistant")) {
            if (nemo) {
                content(b, content_of(&m[i]), 0);
            } else {
                puts_(b, " ");
                content_trim(b, content_of(&m[i]));
            }
            puts_(b, "</s>");
        } else if (is_role(&m[i], "tool") || is_role(&m[i], "tool_results")) {
            raise_(b, "Tool call IDs should be alphanumeric strings with length 9!");
            return;
        } else {
            raise_(b, "Only user and assistant roles are supported, with the exception of an "
                   "initial optional system message!");
            return;
        }
    }
}

/* "%d %b %Y" of the UTC day of `now` (seconds since the epoch; < 0: the current time) */
static void date_string(long long now, char *out, size_t cap)
{
    static const char *const MON[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t tt = now < 0 ? time(NULL) : (time_t)now;
    struct tm tm;
    if (!gmtime_r(&tt, &tm)) memset(&tm, 0, sizeof tm);
    snprintf(out, cap, "%02d %s %d", tm.tm_mday, MON[tm.tm_mon % 12], tm.tm_year + 1900);
}

/* Roles each template renders as what they are (every other role is refused by
 * chat_render_segments): the ones of its model family's own template. */
static int role_allowed(int t, const char *role)
{
    static const char *const base[] = {"system", "user", "assistant"};
    for (int i = 0; i < 3; i++)
        if (strcmp(role, base[i]) == 0) return 1;
    switch (t) {
    case T_CHATML: case T_J_QWEN25: case T_J_QWEN3: return strcmp(role, "tool") == 0;
    case T_LLAMA3: case T_J_LLAMA3: case T_J_LLAMA31: case T_J_LLAMA32:
        return strcmp(role, "tool") == 0 || strcmp(role, "ipython") == 0;
    case T_GLMEDGE: return strcmp(role, "observation") == 0;
    default: return 0;
    }
}

const char *chat_template_roles(const char *name)
{
    int t = name ? tmpl_index(name, strlen(name)) : -1;
    switch (t) {
    case -1: return NULL;
    case T_CHATML: case T_J_QWEN25: case T_J_QWEN3: return "system, user, assistant, tool";
    case T_LLAMA3: case T_J_LLAMA3: case T_J_LLAMA31: case T_J_LLAMA32:
        return "system, user, assistant, tool, ipython";
    case T_GLMEDGE: return "system, user, assistant, observation";
    default: return "system, user, assistant";
    }
}

/* The templates of render_simple's form (every message: pre role mid content suf, the content
 * trimmed when trim) and the opener of the assistant's turn that a generation prompt adds. */
static const struct {
    int t; /* enum tmpl */
    const char *pre, *mid, *suf;
    int trim;
    const char *opener;
} SIMPLE[] = {
    {T_CHATML, "<|im_start|>", "\n", "<|im_end|>\n", 0, "<|im_start|>assistant\n"},
    {T_PHI4, "<|im_start|>", "<|im_sep|>", "<|im_end|>", 0, "<|im_start|>assistant<|im_sep|>"},
    {T_PHI3, "<|", "|>\n", "<|end|>\n", 0, "<|assistant|>\n"},
    {T_FALCON3, "<|", "|>\n", "\n", 0, "<|assistant|>\n"},
    {T_ZEPHYR, "<|", "|>\n", "<|endoftext|>\n", 0, "<|assistant|>\n"},
    {T_GLMEDGE, "<|", "|>\n", "", 0, "<|assistant|>"},
    {T_LLAMA3, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", 1,
     "<|start_header_id|>assistant<|end_header_id|>\n\n"},
};

/* Renders into *b (zeroed by the caller, freed by it). check_roles: refuse a role outside the
 * template's list. 0, or CHAT_E* + errstr. */
static int render(const char *name, const engine_chat_msg_t *msgs, int n,
                  int add_generation_prompt, const chat_opts_t *opts, int check_roles, sb_t *b,
                  char *errstr, size_t errlen)
{
    static const chat_opts_t defaults = CHAT_OPTS_DEFAULT;
    char date[32];
    if (!opts) opts = &defaults;
    int t = name ? tmpl_index(name, strlen(name)) : -1;
    if (t < 0) {
        sw_seterr(errstr, errlen, "unknown chat template \"%s\" (supported: %s)",
                  name ? name : "(null)", NAME_LIST);
        return CHAT_ETEMPLATE;
    }
    if (n < 0 || (n > 0 && !msgs)) {
        sw_seterr(errstr, errlen, "chat template %s: bad message list (%d messages)", name, n);
        return CHAT_ETEMPLATE;
    }
    for (int i = 0; check_roles && i < n; i++) {
        const char *role = msgs[i].role ? msgs[i].role : "";
        if (!role_allowed(t, role)) {
            sw_seterr(errstr, errlen, "messages[%d].role \"%.64s\" is not a role of chat template "
                      "%s (allowed: %s)", i, role, name, chat_template_roles(name));
            return CHAT_EROLE;
        }
    }
    put(b, "", 0); /* an empty conversation still gives "" */
    const char *opener = NULL;
    for (size_t i = 0; i < sizeof SIMPLE / sizeof SIMPLE[0]; i++)
        if (SIMPLE[i].t == t) {
            render_simple(b, msgs, n, SIMPLE[i].pre, SIMPLE[i].mid, SIMPLE[i].suf, SIMPLE[i].trim);
            opener = SIMPLE[i].opener;
        }
    switch (t) {
    case T_GEMMA:
        render_gemma(b, msgs, n);
        opener = "<start_of_turn>model\n";
        break;
    case T_LLAMA2: case T_LLAMA2_SYS: case T_LLAMA2_SYS_BOS: case T_LLAMA2_SYS_STRIP:
        render_llama2(b, t, msgs, n);
        break;
    case T_MISTRAL_V1: case T_MISTRAL_V3: case T_MISTRAL_V3_TEKKEN:
        render_mistral_v1_v3(b, t, msgs, n);
        break;
    case T_MISTRAL_V7: case T_MISTRAL_V7_TEKKEN:
        render_mistral_v7(b, t, msgs, n);
        break;
    case T_J_LLAMA3:
        render_j_llama3(b, msgs, n, add_generation_prompt);
        break;
    case T_J_LLAMA31: case T_J_LLAMA32:
        if (t == T_J_LLAMA31) snprintf(date, sizeof date, "26 Jul 2024");
        else date_string(opts->now, date, sizeof date);
        render_j_llama31(b, msgs, n, add_generation_prompt, date);
        break;
    case T_J_QWEN25:
        render_j_qwen25(b, msgs, n, add_generation_prompt);
        break;
    case T_J_QWEN3:
        render_j_qwen3(b, msgs, n, add_generation_prompt, opts->enable_thinking);
        break;
    case T_J_GEMMA2: case T_J_GEMMA3:
        render_j_gemma(b, t, msgs, n, add_generation_prompt);
        break;
    case T_J_PHI3: case T_J_PHI35:
        render_j_phi3(b, t, msgs, n, add_generation_prompt);
        break;
    case T_J_MISTRAL03: case T_J_NEMO:
        render_j_mistral(b, t, msgs, n);
        break;
    }
    if (b->raise) {
        sw_seterr(errstr, errlen, "chat template %s refuses the conversation: %s", name, b->raise);
        return b->raise == NO_MESSAGE ? CHAT_ETEMPLATE : CHAT_EROLE;
    }
    if (add_generation_prompt && opener) puts_(b, opener);
    if (b->oom) {
        sw_seterr(errstr, errlen, "chat template %s: out of memory", name);
        return CHAT_ENOMEM;
    }
    return 0;
}

char *chat_render(const char *name, const engine_chat_msg_t *msgs, int n,
                  int add_generation_prompt, size_t *len_out, char *errstr, size_t errlen)
{
    return chat_render_opts(name, msgs, n, add_generation_prompt, NULL, len_out, errstr, errlen);
}

char *chat_render_opts(const char *name, const engine_chat_msg_t *msgs, int n,
                       int add_generation_prompt, const chat_opts_t *opts, size_t *len_out,
                       char *errstr, size_t errlen)
{
    sb_t b = {0};
    if (render(name, msgs, n, add_generation_prompt, opts, 0, &b, errstr, errlen) != 0) {
        free(b.p);
        free(b.cut);
        return NULL;
    }
    free(b.cut);
    if (len_out) *len_out = b.n;
    return b.p;
}

int chat_render_segments(const char *name, const engine_chat_msg_t *msgs, int n,
                         int add_generation_prompt, char **text, size_t *len_out,
                         tok_segment_t **segs, int *n_segs, char *errstr, size_t errlen)
{
    return chat_render_segments_opts(name, msgs, n, add_generation_prompt, NULL, text, len_out,
                                     segs, n_segs, errstr, errlen);
}

int chat_render_segments_opts(const char *name, const engine_chat_msg_t *msgs, int n,
                              int add_generation_prompt, const chat_opts_t *opts, char **text,
                              size_t *len_out, tok_segment_t **segs, int *n_segs, char *errstr,
                              size_t errlen)
{
    sb_t b = {0};
    *text = NULL;
    *segs = NULL;
    *n_segs = 0;
    int rc = render(name, msgs, n, add_generation_prompt, opts, 1, &b, errstr, errlen);
    tok_segment_t *sg = rc == 0 ? malloc(sizeof *sg * (size_t)(b.n_cut > 0 ? b.n_cut : 1)) : NULL;
    if (rc == 0 && !sg) {
        sw_seterr(errstr, errlen, "chat template %s: out of memory", name);
        rc = CHAT_ENOMEM;
    }
    if (rc != 0) {
        free(b.p);
        free(b.cut);
        return rc;
    }
    for (int i = 0; i < b.n_cut; i++)
        sg[i] = (tok_segment_t){b.p + b.cut[i].off, b.cut[i].len, b.cut[i].special};
    free(b.cut);
    *text = b.p;
    if (len_out) *len_out = b.n;
    *segs = sg;
    *n_segs = b.n_cut;
    return 0;
}

const char *chat_template_bos(const char *name)
{
    switch (name ? tmpl_index(name, strlen(name)) : -1) {
    case T_J_LLAMA3: case T_J_LLAMA31: case T_J_LLAMA32: return "<|begin_of_text|>";
    case T_J_GEMMA2: case T_J_GEMMA3: return "<bos>";
    case T_J_MISTRAL03: case T_J_NEMO: return "<s>";
    default: return NULL;
    }
}

/* ---- with an engine ---- */

#define CHAT_TEMPLATE_KEY "tokenizer.chat_template"

const char *engine_chat_template(const engine_t *e)
{
    gguf_str_t s;
    if (!e || gguf_get_str(engine_gguf(e), CHAT_TEMPLATE_KEY, &s) != 0) return NULL;
    return chat_template_detect(s.ptr, (size_t)s.len, NULL);
}

/* The template to use: name, else the one detected from e's metadata. NULL + errstr. */
static const char *resolve(const engine_t *e, const char *name, char *errstr, size_t errlen)
{
    if (name) return name;
    gguf_str_t s;
    if (!e || gguf_get_str(engine_gguf(e), CHAT_TEMPLATE_KEY, &s) != 0) {
        sw_seterr(errstr, errlen, "model has no chat template (no %s in its metadata); name one "
                  "of: %s", CHAT_TEMPLATE_KEY, NAME_LIST);
        return NULL;
    }
    const char *other = NULL;
    name = chat_template_detect(s.ptr, (size_t)s.len, &other);
    if (!name) {
        if (other)
            sw_seterr(errstr, errlen, "unknown chat template: the model's %s is llama.cpp's "
                      "\"%s\" format, which is not built in (supported: %s)", CHAT_TEMPLATE_KEY,
                      other, NAME_LIST);
        else
            sw_seterr(errstr, errlen, "unknown chat template: the model's %s matches none of "
                      "the supported ones (%s)", CHAT_TEMPLATE_KEY, NAME_LIST);
    }
    return name;
}

char *engine_chat_render(const engine_t *e, const char *name, const engine_chat_msg_t *msgs, int n,
                         int add_generation_prompt, char *errstr, size_t errlen)
{
    name = resolve(e, name, errstr, errlen);
    if (!name) return NULL;
    return chat_render(name, msgs, n, add_generation_prompt, NULL, errstr, errlen);
}

int chat_tokenize(const tokenizer_t *t, const char *name, const engine_chat_msg_t *msgs, int n,
                  int add_generation_prompt, int32_t **ids, int *n_ids, size_t *text_len,
                  char *errstr, size_t errlen)
{
    return chat_tokenize_opts(t, name, msgs, n, add_generation_prompt, NULL, ids, n_ids,
                              text_len, errstr, errlen);
}

int chat_tokenize_opts(const tokenizer_t *t, const char *name, const engine_chat_msg_t *msgs,
                       int n, int add_generation_prompt, const chat_opts_t *opts, int32_t **ids,
                       int *n_ids, size_t *text_len, char *errstr, size_t errlen)
{
    char *text;
    tok_segment_t *segs;
    int ns;
    size_t len;
    *ids = NULL;
    *n_ids = 0;
    int rc = chat_render_segments_opts(name, msgs, n, add_generation_prompt, opts, &text, &len,
                                       &segs, &ns, errstr, errlen);
    if (rc != 0) return rc;
    /* A template that writes the model's BOS text first (the Jinja-exact ones) and a tokenizer
     * that adds BOS itself: that BOS is left to the tokenizer, so there is one either way. */
    const char *bos = chat_template_bos(name);
    if (bos && ns > 0 && segs[0].special && segs[0].len >= strlen(bos) &&
        memcmp(segs[0].text, bos, strlen(bos)) == 0 && tokenizer_add_bos(t) &&
        tokenizer_bos(t) >= 0 && tokenizer_find(t, bos, strlen(bos)) == tokenizer_bos(t)) {
        segs[0].text += strlen(bos);
        segs[0].len -= strlen(bos);
    }
    /* no tokenizer makes more than a token per byte, plus BOS/EOS: one pass */
    int cap = len < (size_t)(1 << 30) ? (int)len + 4 : 1 << 30;
    int32_t *out = malloc(sizeof *out * (size_t)cap);
    int k = out ? tokenizer_encode_segments(t, segs, ns, 1, out, cap) : -1;
    if (k > cap) { /* more ids than the bound (not seen): a second pass */
        int32_t *o2 = realloc(out, sizeof *out * (size_t)k);
        k = o2 ? tokenizer_encode_segments(t, segs, ns, 1, o2, k) : -1;
        out = o2 ? o2 : out;
    }
    free(segs);
    free(text);
    if (k < 0) {
        free(out);
        sw_seterr(errstr, errlen, "chat template %s: out of memory while tokenising", name);
        return CHAT_ENOMEM;
    }
    *ids = out;
    *n_ids = k;
    if (text_len) *text_len = len;
    return 0;
}

int engine_chat_tokenize(const engine_t *e, const char *name, const engine_chat_msg_t *msgs,
                         int n, int add_generation_prompt, int32_t **ids, int *n_ids,
                         size_t *text_len, char *errstr, size_t errlen)
{
    return engine_chat_tokenize_opts(e, name, msgs, n, add_generation_prompt, NULL, ids, n_ids,
                                     text_len, errstr, errlen);
}

int engine_chat_tokenize_opts(const engine_t *e, const char *name, const engine_chat_msg_t *msgs,
                              int n, int add_generation_prompt, const engine_chat_opts_t *opts,
                              int32_t **ids, int *n_ids, size_t *text_len, char *errstr,
                              size_t errlen)
{
    *ids = NULL;
    *n_ids = 0;
    if (!e) {
        sw_seterr(errstr, errlen, "no model to tokenise with");
        return CHAT_ETEMPLATE;
    }
    name = resolve(e, name, errstr, errlen);
    if (!name) return CHAT_ETEMPLATE;
    return chat_tokenize_opts(engine_tokenizer(e), name, msgs, n, add_generation_prompt, opts,
                              ids, n_ids, text_len, errstr, errlen);
}
