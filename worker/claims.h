/* worker/claims.h: which tenants and service classes the requests of each input topic may
 * claim (the `claims` key, README "Tenants and usage"). Part of the worker module.
 *
 * A request names its own `tenant` and `class` (JSON field or Kafka header); a producer that may
 * write a topic may claim only what the topic's entry allows. The spec, entries separated by
 * ';', settings by blanks, lists by ',':
 *
 *   TOPIC [tenants=T1,T2,...] [classes=C1,C2,...] [tenant=T] [class=C] ; TOPIC ...
 *
 *   TOPIC     an input topic, "PREFIX*" (topics starting with PREFIX) or "*" (any topic).
 *             A topic uses its own entry, else the longest matching prefix, else "*"; a topic
 *             no entry matches may claim nothing (its requests get the defaults only).
 *   tenants=  tenants a request may name; "NAME", "PREFIX*" or "*" (any). Absent: none.
 *   classes=  classes (of `classes`) a request may name; "NAME", "PREFIX*" or "*". Absent:
 *             none.
 *   tenant=   tenant of a request that names none (absent: none, counted as _none).
 *   class=    class of a request that names none (absent: class.default).
 *
 * Naming the tenant or class a request would get anyway (its topic's default) is always
 * allowed. Immutable after claims_parse: any thread may call claims_check. */
#ifndef SPILLWAY_WORKER_CLAIMS_H
#define SPILLWAY_WORKER_CLAIMS_H

#include <stddef.h>

#include "worker/worker.h"

typedef struct claims claims_t;

/* Parses spec against the configured classes[0..n_classes) (names checked: a class setting
 * must name one, a pattern match one); default_class is the index of class.default. An empty
 * or blank spec: *out = NULL (no mapping: claims are not checked) and 0. Otherwise 0 with *out
 * set (caller frees with claims_free), or -1 with errstr naming the entry and what it accepts. */
int claims_parse(const char *spec, const worker_class_t *classes, int n_classes,
                 int default_class, claims_t **out, char *errstr, size_t errlen);
void claims_free(claims_t *c);

/* 1 when an entry other than "*" matches topic (exact or prefix), else 0. */
int claims_covers(const claims_t *c, const char *topic);

/* Checks the claims of a request consumed from topic: tenant and class_name are what it named
 * (NULL = none). On 0 the claims are allowed and *def_tenant is the tenant to give a request
 * that named none (static to c, NULL = none) and *def_class the index of its class when it
 * named none. On -1, *code is REQ_ERR_TENANT_NOT_ALLOWED or REQ_ERR_CLASS_NOT_ALLOWED and err
 * says which claim the topic does not allow. */
int claims_check(const claims_t *c, const char *topic, const char *tenant,
                 const char *class_name, const char **def_tenant, int *def_class,
                 const char **code, char *err, size_t errlen);

#endif
