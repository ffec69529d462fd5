/* engine/chat.h: built-in chat templates. Internal to the engine module (the public entry points
 * are engine_chat_* in engine.h).
 *
 * Rendering by name needs neither an engine nor a model, so it can be tested and fuzzed alone.
 * Two kinds (see chat_template_exact): the Jinja-exact ones render byte for byte what a model
 * family's own Jinja template gives; the others reproduce what llama.cpp's
 * llama_chat_apply_template (src/llama-chat.cpp) produces for the same messages. Detection first
 * recognises the Jinja-exact families' own sources, then follows llm_chat_detect_template's
 * substring rules in its order, so another Jinja source is given the template llama.cpp would
 * give it.
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

/* 1 when built-in template `name` is a Jinja-exact one (llama-3, llama-3.1, llama-3.2, qwen2.5,
 * qwen3, gemma-2, gemma-3, phi-3, phi-3.5, mistral-v0.3, mistral-nemo): it renders exactly what
 * its model's own Jinja template gives (BOS text included; where the template raises an error,
 * rendering fails with its message), and detection prefers it for that template's source.
 * The others reproduce llama.cpp's llama_chat_apply_template. */
int chat_template_exact(const char *name);

/* The BOS text Jinja-exact template `name` writes at the start of its text ("<|begin_of_text|>",
 * "<bos>", "<s>"; static), or NULL. chat_tokenize leaves that BOS to the tokenizer when the
 * tokenizer adds BOS and this text is its BOS token. */
const char *chat_template_bos(const char *name);

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

/* Options of the templates that have them (engine_chat_opts_t of engine.h); NULL stands for
 * CHAT_OPTS_DEFAULT. */
typedef engine_chat_opts_t chat_opts_t;
#define CHAT_OPTS_DEFAULT ENGINE_CHAT_OPTS_DEFAULT

/* chat_render with options (opts may be NULL). */
char *chat_render_opts(const char *name, const engine_chat_msg_t *msgs, int n,
                       int add_generation_prompt, const chat_opts_t *opts, size_t *len_out,
                       char *errstr, size_t errlen);

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
/* chat_render_segments with options (opts may be NULL). */
int chat_render_segments_opts(const char *name, const engine_chat_msg_t *msgs, int n,
                              int add_generation_prompt, const chat_opts_t *opts, char **text,
                              size_t *len_out, tok_segment_t **segs, int *n_segs, char *errstr,
                              size_t errlen);

/* Renders msgs with template `name` and tokenises the result with t (tokenizer_encode_segments,
 * BOS/EOS as the file's flags say): the template's markers become its special tokens, and no
 * role or content text ever becomes a special token. *ids gets n_ids ids (malloc'd, caller
 * frees), *text_len (if not NULL) the rendered text's bytes. 0 or CHAT_E* + errstr. */
int chat_tokenize(const tokenizer_t *t, const char *name, const engine_chat_msg_t *msgs, int n,
                  int add_generation_prompt, int32_t **ids, int *n_ids, size_t *text_len,
                  char *errstr, size_t errlen);
/* chat_tokenize with options (opts may be NULL). */
int chat_tokenize_opts(const tokenizer_t *t, const char *name, const engine_chat_msg_t *msgs,
                       int n, int add_generation_prompt, const chat_opts_t *opts, int32_t **ids,
                       int *n_ids, size_t *text_len, char *errstr, size_t errlen);

#endif
