/* worker/usage.h: per-tenant accounting (internal to the worker module).
 *
 * A usage_t counts, per (tenant, class), the results a worker produced and their prompt, cached
 * and completion tokens and compute time. Label cardinality is bounded: the first max_tenants
 * distinct tenants keep their names, later ones are counted as USAGE_OTHER; likewise classes
 * (max_classes). A request without a tenant counts as USAGE_NONE, without a class as
 * USAGE_DEFAULT_CLASS; neither takes a slot of the bounds. Request tenant and class names never
 * start with '_' (records/request.c), so these labels cannot be confused with a real one.
 *
 * Totals since start feed /metrics; the activity since the last usage_take_records call becomes
 * the periodic usage records (schemas/usage.schema.json).
 * Threads: every function may be called from any thread (one mutex inside). */
#ifndef SPILLWAY_WORKER_USAGE_H
#define SPILLWAY_WORKER_USAGE_H

#include <stdint.h>

#include "worker/metrics.h"

#define USAGE_OTHER "_other"
#define USAGE_NONE "_none"
#define USAGE_DEFAULT_CLASS "default"

typedef struct usage usage_t;

/* NULL on out of memory. */
usage_t *usage_new(int max_tenants, int max_classes);
void usage_free(usage_t *u);

/* One result of tenant / class (NULL: none). */
void usage_add(usage_t *u, const char *tenant, const char *cls, uint64_t prompt_tokens,
               uint64_t cached_tokens, uint64_t completion_tokens, uint64_t compute_ns);

/* Writes the spillway:tenant_* families (schema in README's metrics table). */
void usage_render(usage_t *u, metrics_buf_t *b);

/* One usage record (records_usage: compact, malloc'd) per (tenant, class) with results since the last
 * call, covering [start_ms, end_ms) of wall-clock time; those counts are then cleared. Returns
 * the number of records in *out (a malloc'd array; caller frees each and the array; NULL when
 * 0), or -1 on out of memory (the counts are kept for the next call). */
int usage_take_records(usage_t *u, const char *worker, int64_t start_ms, int64_t end_ms,
                       char ***out);

#endif
