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

#endif
