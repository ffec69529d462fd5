/* engine/engine_internal.h: accessors into engine_t for other files of the engine module only
 * (engine_t's struct stays private to engine.c). */
#ifndef SPILLWAY_ENGINE_INTERNAL_H
#define SPILLWAY_ENGINE_INTERNAL_H

#include "engine.h"
#include "gguf.h"

/* The loaded model's GGUF file (metadata and tensors). Owned by the engine; valid until
 * engine_free. Read-only: safe from any thread. */
const gguf_t *engine_gguf(const engine_t *e);
/* Its tokenizer (immutable, owned by the engine): safe from any thread. */
const struct tokenizer *engine_tokenizer(const engine_t *e);

#endif
