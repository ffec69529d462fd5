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
 *                other: Tc</s> (T = " ", tekken ""). No opener. */
#include "chat.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "gguf.h"

enum tmpl {
    T_CHATML, T_LLAMA2, T_LLAMA2_SYS, T_LLAMA2_SYS_BOS, T_LLAMA2_SYS_STRIP, T_LLAMA3,
    T_MISTRAL_V1, T_MISTRAL_V3, T_MISTRAL_V3_TEKKEN, T_MISTRAL_V7, T_MISTRAL_V7_TEKKEN, T_PHI3,
    T_PHI4, T_FALCON3, T_ZEPHYR, T_GLMEDGE, T_GEMMA, T_COUNT
};

/* llama.cpp's names, indexed by enum tmpl */
static const char *const NAMES[T_COUNT] = {
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3",
    "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3",
    "phi4", "falcon3", "zephyr", "glmedge", "gemma",
};

static const char NAME_LIST[] =
    "chatml, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, llama3, mistral-v1, "
    "mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, phi3, phi4, falcon3, zephyr, "
    "glmedge, gemma";

static void seterr(char *errstr, size_t errlen, const char *fmt, ...)
{
    if (!errstr || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errlen, fmt, ap);
    va_end(ap);
}

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

const char *chat_template_detect(const char *tmpl, size_t len, const char **unsupported)
{
    const char *other = NULL, *found = NULL;
    text_t t = {tmpl ? tmpl : "", tmpl ? len : 0};
    int byname = tmpl_index(t.s, t.n);
    if (byname >= 0) {
        found = NAMES[byname];
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

/* Roles each template renders as what they are (every other role is refused by
 * chat_render_segments): the ones of its model family's own template. */
static int role_allowed(int t, const char *role)
{
    static const char *const base[] = {"system", "user", "assistant"};
    for (int i = 0; i < 3; i++)
        if (strcmp(role, base[i]) == 0) return 1;
    switch (t) {
    case T_CHATML: return strcmp(role, "tool") == 0;
    case T_LLAMA3: return strcmp(role, "tool") == 0 || strcmp(role, "ipython") == 0;
    case T_GLMEDGE: return strcmp(role, "observation") == 0;
    default: return 0;
    }
}

const char *chat_template_roles(const char *name)
{
    int t = name ? tmpl_index(name, strlen(name)) : -1;
    switch (t) {
    case -1: return NULL;
    case T_CHATML: return "system, user, assistant, tool";
    case T_LLAMA3: return "system, user, assistant, tool, ipython";
    case T_GLMEDGE: return "system, user, assistant, observation";
    default: return "system, user, assistant";
    }
}

/* Renders into *b (zeroed by the caller, freed by it). check_roles: refuse a role outside the
 * template's list. 0, or CHAT_E* + errstr. */
static int render(const char *name, const engine_chat_msg_t *msgs, int n,
                  int add_generation_prompt, int check_roles, sb_t *b, char *errstr,
                  size_t errlen)
{
    int t = name ? tmpl_index(name, strlen(name)) : -1;
    if (t < 0) {
        seterr(errstr, errlen, "unknown chat template \"%s\" (supported: %s)",
               name ? name : "(null)", NAME_LIST);
        return CHAT_ETEMPLATE;
    }
    if (n < 0 || (n > 0 && !msgs)) {
        seterr(errstr, errlen, "chat template %s: bad message list (%d messages)", name, n);
        return CHAT_ETEMPLATE;
    }
    for (int i = 0; check_roles && i < n; i++) {
        const char *role = msgs[i].role ? msgs[i].role : "";
        if (!role_allowed(t, role)) {
            seterr(errstr, errlen, "messages[%d].role \"%.64s\" is not a role of chat template "
                   "%s (allowed: %s)", i, role, name, chat_template_roles(name));
            return CHAT_EROLE;
        }
    }
    put(b, "", 0); /* an empty conversation still gives "" */
    const char *opener = NULL;
    switch (t) {
    case T_CHATML:
        render_simple(b, msgs, n, "<|im_start|>", "\n", "<|im_end|>\n", 0);
        opener = "<|im_start|>assistant\n";
        break;
    case T_PHI4:
        render_simple(b, msgs, n, "<|im_start|>", "<|im_sep|>", "<|im_end|>", 0);
        opener = "<|im_start|>assistant<|im_sep|>";
        break;
    case T_PHI3:
        render_simple(b, msgs, n, "<|", "|>\n", "<|end|>\n", 0);
        opener = "<|assistant|>\n";
        break;
    case T_FALCON3:
        render_simple(b, msgs, n, "<|", "|>\n", "\n", 0);
        opener = "<|assistant|>\n";
        break;
    case T_ZEPHYR:
        render_simple(b, msgs, n, "<|", "|>\n", "<|endoftext|>\n", 0);
        opener = "<|assistant|>\n";
        break;
    case T_GLMEDGE:
        render_simple(b, msgs, n, "<|", "|>\n", "", 0);
        opener = "<|assistant|>";
        break;
    case T_LLAMA3:
        render_simple(b, msgs, n, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
                      1);
        opener = "<|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
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
    }
    if (add_generation_prompt && opener) puts_(b, opener);
    if (b->oom) {
        seterr(errstr, errlen, "chat template %s: out of memory", name);
        return CHAT_ENOMEM;
    }
    return 0;
}

char *chat_render(const char *name, const engine_chat_msg_t *msgs, int n,
                  int add_generation_prompt, size_t *len_out, char *errstr, size_t errlen)
{
    sb_t b = {0};
    if (render(name, msgs, n, add_generation_prompt, 0, &b, errstr, errlen) != 0) {
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
    sb_t b = {0};
    *text = NULL;
    *segs = NULL;
    *n_segs = 0;
    int rc = render(name, msgs, n, add_generation_prompt, 1, &b, errstr, errlen);
    tok_segment_t *sg = rc == 0 ? malloc(sizeof *sg * (size_t)(b.n_cut > 0 ? b.n_cut : 1)) : NULL;
    if (rc == 0 && !sg) {
        seterr(errstr, errlen, "chat template %s: out of memory", name);
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
        seterr(errstr, errlen, "model has no chat template (no %s in its metadata); name one "
               "of: %s", CHAT_TEMPLATE_KEY, NAME_LIST);
        return NULL;
    }
    const char *other = NULL;
    name = chat_template_detect(s.ptr, (size_t)s.len, &other);
    if (!name) {
        if (other)
            seterr(errstr, errlen, "unknown chat template: the model's %s is llama.cpp's "
                   "\"%s\" format, which is not built in (supported: %s)", CHAT_TEMPLATE_KEY,
                   other, NAME_LIST);
        else
            seterr(errstr, errlen, "unknown chat template: the model's %s matches none of "
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
    char *text;
    tok_segment_t *segs;
    int ns;
    size_t len;
    *ids = NULL;
    *n_ids = 0;
    int rc = chat_render_segments(name, msgs, n, add_generation_prompt, &text, &len, &segs, &ns,
                                  errstr, errlen);
    if (rc != 0) return rc;
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
        seterr(errstr, errlen, "chat template %s: out of memory while tokenising", name);
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
    *ids = NULL;
    *n_ids = 0;
    if (!e) {
        seterr(errstr, errlen, "no model to tokenise with");
        return CHAT_ETEMPLATE;
    }
    name = resolve(e, name, errstr, errlen);
    if (!name) return CHAT_ETEMPLATE;
    return chat_tokenize(engine_tokenizer(e), name, msgs, n, add_generation_prompt, ids, n_ids,
                         text_len, errstr, errlen);
}
