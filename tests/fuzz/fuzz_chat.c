/* tests/fuzz/fuzz_chat.c: libFuzzer target for the built-in chat templates (engine/chat.c),
 * without a model. The whole input is first given to template detection (as Jinja source);
 * then byte 0 picks a built-in template, byte 1 bit 0 the generation prompt, and the rest is
 * split at NUL bytes into alternating role / content strings (at most 64 messages) that are
 * rendered. Rendering must succeed with a length bounded by the input's plus a fixed overhead
 * per message (a Jinja-exact template may instead refuse the conversation as its Jinja source
 * does, and then chat_render_segments refuses it too); detection must return a built-in name
 * (and no "unsupported" name) or NULL. chat_render_segments must give the same text, cut into
 * segments that concatenate to it, alternate in kind and are never empty, or refuse a role
 * (CHAT_EROLE) and nothing else. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 64

static void require(int cond)
{
    if (!cond) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *other = NULL;
    const char *found = chat_template_detect((const char *)data, size, &other);
    require(!found || (chat_template_lookup(found) == found && other == NULL));

    /* the built-in names */
    const char *list = engine_chat_template_names();
    char names[64][32];
    int n_names = 0;
    for (const char *p = list; *p && n_names < 64;) {
        size_t n = strcspn(p, ",");
        require(n > 0 && n < sizeof names[0]);
        memcpy(names[n_names], p, n);
        names[n_names++][n] = 0;
        p += n;
        while (*p == ',' || *p == ' ') p++;
    }
    require(n_names > 0);
    if (size < 2) return 0;
    const char *name = names[data[0] % n_names];
    int gen = data[1] & 1;

    /* NUL-terminated copy of the rest; fields split at NUL bytes */
    size_t len = size - 2;
    char *buf = malloc(len + 1);
    require(buf != NULL);
    memcpy(buf, data + 2, len);
    buf[len] = 0;
    engine_chat_msg_t msgs[MAX_MSGS];
    int n = 0;
    size_t total = 0;
    for (size_t i = 0; i < len && n < MAX_MSGS;) {
        const char *role = buf + i;
        i += strlen(role) + 1;
        const char *content = i < len ? buf + i : "";
        if (i < len) i += strlen(content) + 1;
        msgs[n].role = role;
        msgs[n].content = content;
        total += strlen(content);
        n++;
    }
    char err[256];
    size_t out_len = 0;
    char *s = chat_render(name, msgs, n, gen, &out_len, err, sizeof err);
    char *text;
    size_t tlen;
    tok_segment_t *sg;
    int ns;
    if (!s) { /* only a Jinja-exact template refuses a conversation, and then both paths do */
        require(chat_template_exact(name));
        int rc = chat_render_segments(name, msgs, n, gen, &text, &tlen, &sg, &ns, err,
                                      sizeof err);
        require(rc == CHAT_EROLE || rc == CHAT_ETEMPLATE);
        free(buf);
        return 0;
    }
    require(strlen(s) == out_len);
    /* templates add text; only gemma and the trimming ones may drop (whitespace / system) bytes,
     * and nothing renders more than a bounded overhead per message (llama-3.x writes a tool
     * message as a JSON string: at most 6 bytes per content byte) */
    require(out_len <= 6 * total + (size_t)n * 128 + 2 * len + 256);
    int rc = chat_render_segments(name, msgs, n, gen, &text, &tlen, &sg, &ns, err, sizeof err);
    require(rc == 0 || rc == CHAT_EROLE);
    if (rc == 0) {
        require(tlen == out_len && memcmp(text, s, tlen) == 0);
        size_t at = 0;
        for (int i = 0; i < ns; i++) {
            require(sg[i].len > 0 && sg[i].text == text + at);
            require(i == 0 || sg[i].special != sg[i - 1].special);
            at += sg[i].len;
        }
        require(at == tlen);
        free(text);
        free(sg);
    }
    free(s);
    free(buf);
    return 0;
}
