/* records/records_int.h: what the request parser's files share (records/request*.c). Private to
 * the records module. */
#ifndef SPILLWAY_RECORDS_INT_H
#define SPILLWAY_RECORDS_INT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "records/request.h"

#define MAX_PATCHES 16                     /* unknown-field tokens overwritten, at most */
#define MAX_ROLE_BYTES 64
#define MAX_TEMPLATE_NAME_BYTES 64
#define MAX_DEADLINE_TEXT 64
#define MAX_EPOCH_MS INT64_C(253402300799999) /* 9999-12-31T23:59:59.999Z */
#define MAX_EXACT_REAL 9007199254740992.0    /* 2^53: integral reals accepted up to this */
#define MAX_TOPIC_BYTES 249                  /* Kafka's limit on a topic name */
#define MAX_LABEL_BYTES 64                   /* tenant and class names (metric labels) */

/* ---- errors ---- */

typedef struct {
    const request_limits_t *lim;
    const char **code;          /* gets rec_err_reason(err) */
    char *errstr;
    size_t errlen;
    rec_err_t err;              /* the failure's code (parsing stops at the first) */
} pctx_t;

/* Sets the code (c->err, *c->code) and the printf-formatted message; returns -1. */
int rq_fail(pctx_t *c, rec_err_t e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int rq_oom(pctx_t *c); /* REC_NO_MEMORY */

/* ---- fields (request.c) ---- */

enum ftype { F_ID, F_TEXT, F_FORM, F_INT, F_FLOAT, F_SEED, F_STOP, F_DEADLINE, F_TTL, F_META, F_TMPL,
             F_STR, F_BOOL, F_GRAMMAR };

typedef struct {
    const char *name;
    int type;            /* enum ftype */
    double lo, hi;       /* F_INT / F_FLOAT range (hi < 0 with F_INT: from limits) */
    int lo_open;         /* F_FLOAT: lo itself is excluded */
    size_t off;          /* offset of the int / float in request_t */
} field_t;

extern const field_t RQ_FIELDS[];
extern const size_t RQ_N_FIELDS;
const field_t *rq_field_find(const char *name); /* NULL for an unknown name */
/* What field f accepts, for error messages, into buf[n]; returns buf. */
const char *rq_accepted(const field_t *f, const request_limits_t *l, char *buf, size_t n);
rec_err_t rq_type_code(const field_t *f); /* the code for a value of the wrong JSON type */
const char *rq_json_type_name(const json_t *v);
int rq_wrong_type(pctx_t *c, const field_t *f, const json_t *v);

/* ---- field readers (request_fields.c; v is never NULL and never JSON null) ---- */

int rq_out_of_range(pctx_t *c, const field_t *f, int huge, int64_t x);
char *rq_dup_n(const char *s, size_t n);
int rq_get_int64(const json_t *v, int64_t *out);
int rq_read_int(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_float(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_deadline(pctx_t *c, const field_t *f, const json_t *v, int64_t *out);
int rq_read_ttl(pctx_t *c, const field_t *f, const json_t *v, int64_t *out);
int rq_read_id(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_prompt(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_messages(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_input_ids(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_seed(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_stop(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_metadata(pctx_t *c, const char *doc, size_t len, request_t *r);
int rq_read_template(pctx_t *c, const field_t *f, const json_t *v, request_t *r);
int rq_read_str(pctx_t *c, const field_t *f, const json_t *v, request_t *r);

/* ---- raw text (request_text.c) ---- */

/* Offset of the first byte that does not start a valid UTF-8 character (common/utf8.h), or len
 * when all of s[0..len) is valid. */
size_t rq_utf8_invalid_at(const unsigned char *s, size_t len);
typedef struct {
    size_t pos;
    int started;
    size_t key0, key1; /* key token, quotes included */
    size_t val0, val1; /* value span */
} member_it_t;

int rq_next_member(const char *s, size_t len, member_it_t *it);
void rq_member_key(const char *s, const member_it_t *it, char *buf, size_t n);
size_t rq_token_start(const char *s, size_t from, size_t p);
size_t rq_compact_json(const char *s, size_t n, char *out);
const char *rq_member_at(const char *s, size_t len, size_t off, char *key, size_t n);
int rq_parse_timestamp(const char *s, size_t n, int64_t *ms, const char **why);

#endif
