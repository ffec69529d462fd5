/* consumer/json_text.h: JSON text for the records spillway writes from values it parsed (e.g. a
 * request converted from OpenAI's Batch format by `spillway produce`), with numbers as the user
 * would write them. Thread-safe, pure. */
#ifndef SPILLWAY_CONSUMER_JSON_TEXT_H
#define SPILLWAY_CONSUMER_JSON_TEXT_H

#include <jansson.h>

/* v as compact JSON text (JSON_COMPACT), every real in its shortest form that reads back as the
 * same double (0.8 stays "0.8", not jansson's 17-digit "0.80000000000000004"; 0.1 + 0.2 is still
 * "0.30000000000000004"; a real keeps a '.' or an exponent, so it reads back as a real).
 * Integers are written as jansson writes them. Returns malloc'd text (caller frees) or NULL on
 * out of memory or a value jansson cannot encode. */
char *json_text_dump(const json_t *v);

/* Rewrites in place, in the NUL-terminated JSON text s, every number token with a fraction or
 * exponent to that shortest form; never lengthens a token written with 17 significant digits,
 * as jansson's are. Strings (and their escapes) are left untouched. Returns s. Exposed for tests. */
char *json_text_shorten_reals(char *s);

#endif
