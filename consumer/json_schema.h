/* consumer/json_schema.h: JSON Schema to EBNF grammar (engine/grammar.h's dialect).
 *
 * The grammar matches JSON text (between tokens at most one space, or a newline and up to 4
 * spaces; nothing before the value or after it) whose value validates against the schema. The supported subset and how each keyword is enforced are in the README
 * ("Structured output"); any other keyword (annotations aside) is an error naming it and its
 * location, never ignored. Thread-safe (no shared state). */
#ifndef SPILLWAY_CONSUMER_JSON_SCHEMA_H
#define SPILLWAY_CONSUMER_JSON_SCHEMA_H

#include <stddef.h>

#include <jansson.h>

/* Largest decimal digits of an unbounded number's integer part (and of its fraction). */
#define JSON_SCHEMA_MAX_DIGITS 15

/* Returns the grammar text (malloc'd, NUL-terminated, caller frees), or NULL with errstr
 * ("unsupported JSON Schema keyword 'not' at #/properties/a", "out of memory", ...). */
char *json_schema_to_grammar(const json_t *schema, char *errstr, size_t errlen);

/* Grammar of any JSON object (response_format json_object). Same ownership. */
char *json_schema_any_object_grammar(char *errstr, size_t errlen);

/* Kinds of structured output of a request. */
enum { JSON_SCHEMA_NONE = 0, JSON_SCHEMA_EBNF = 1, JSON_SCHEMA_OBJECT = 2, JSON_SCHEMA_SCHEMA = 3 };

struct grammar;
/* Compiles a request's structured-output fields: grammar (EBNF text, a JSON string) and
 * response_format (OpenAI's shape: {"type":"text"}, {"type":"json_object"} or
 * {"type":"json_schema","json_schema":{"name":...,"schema":{...},"strict":true}}); either may
 * be NULL. *out gets the compiled grammar (one reference, caller releases) or NULL (none, or
 * type text); *kind a JSON_SCHEMA_* value. Returns 0; -1 a bad grammar or schema, or both fields
 * asking for a constraint (errstr says why); -2 a field of the wrong JSON type (errstr names
 * it); -3 out of memory. */
int json_schema_request_grammar(const json_t *grammar, const json_t *response_format,
                                struct grammar **out, int *kind, char *errstr, size_t errlen);

#endif
