/* engine/chat.h: built-in chat templates. Internal to the engine module (the public entry points
 * are engine_chat_* in engine.h).
 *
 * Rendering by name needs neither an engine nor a model, so it can be tested and fuzzed alone.
 * Each template reproduces, byte for byte, what llama.cpp's llama_chat_apply_template (src/
 * llama-chat.cpp) produces for the same messages; detection follows llm_chat_detect_template's
 * substring rules in its order, so a Jinja source is given the template llama.cpp would give it.
 * All functions are pure and thread-safe. */
#ifndef SPILLWAY_ENGINE_CHAT_H
#define SPILLWAY_ENGINE_CHAT_H

#include <stddef.h>

#include "engine.h"
#include "tokenizer.h"

/* Errors of the functions below (the ENGINE_CHAT_E* values of engine.h). */
#define CHAT_ETEMPLATE ENGINE_CHAT_ETEMPLATE
#define CHAT_EROLE ENGINE_CHAT_EROLE
#define CHAT_ENOMEM ENGINE_CHAT_ENOMEM

/* The canonical (static) name when `name` is a built-in template, else NULL. */
const char *chat_template_lookup(const char *name);

/* Detects the template of Jinja source tmpl[0..len) (not NUL-terminated), or of a bare template
 * name. Returns a built-in name, or NULL. When NULL and the source looks like a template that
 * llama.cpp knows but spillway does not render, *unsupported (if not NULL) gets llama.cpp's name
 * for it; otherwise NULL. */
const char *chat_template_detect(const char *tmpl, size_t len, const char **unsupported);

/* Renders msgs[0..n) with built-in template `name` (see engine_chat_render for the contract).
 * *len_out (if not NULL) gets the text's length. NULL + errstr for an unknown name, n < 0, or
 * out of memory. */
char *chat_render(const char *name, const engine_chat_msg_t *msgs, int n,
                  int add_generation_prompt, size_t *len_out, char *errstr, size_t errlen);

/* The roles template `name` accepts ("system, user, assistant[, ...]"; static), NULL for an
 * unknown name. chat_render does not check them; chat_render_segments refuses any other. */
const char *chat_template_roles(const char *name);

/* chat_render, for tokenising: *text gets the text (malloc'd, NUL-terminated) and *segs
 * (malloc'd, pointing into *text; caller frees both) its cut into the template's own text
 * (special 1: its markers, the roles, the opener) and message contents (special 0), in order.
 * Every role must be one of chat_template_roles(name). 0, or CHAT_ETEMPLATE (unknown name, bad
 * list), CHAT_EROLE (the message names the role and the allowed ones) or CHAT_ENOMEM, + errstr;
 * then nothing is allocated. */
int chat_render_segments(const char *name, const engine_chat_msg_t *msgs, int n,
                         int add_generation_prompt, char **text, size_t *len_out,
                         tok_segment_t **segs, int *n_segs, char *errstr, size_t errlen);

/* Renders msgs with template `name` and tokenises the result with t (tokenizer_encode_segments,
 * BOS/EOS as the file's flags say): the template's markers become its special tokens, and no
 * role or content text ever becomes a special token. *ids gets n_ids ids (malloc'd, caller
 * frees), *text_len (if not NULL) the rendered text's bytes. 0 or CHAT_E* + errstr. */
int chat_tokenize(const tokenizer_t *t, const char *name, const engine_chat_msg_t *msgs, int n,
                  int add_generation_prompt, int32_t **ids, int *n_ids, size_t *text_len,
                  char *errstr, size_t errlen);

#endif
