/* consumer/consumer.h: the consumer module's public header.
 *
 * The consumer turns Kafka prompt messages into engine requests:
 *   - request.h: parsing and validating one message value (request_parse), its limits and the
 *     stable dead-letter reason codes (REQ_ERR_*). Wire formats: schemas/request.schema.json,
 *     schemas/result.schema.json, schemas/dlq.schema.json.
 *   - the Kafka intake API (to come) is declared below this block. */
#ifndef SPILLWAY_CONSUMER_H
#define SPILLWAY_CONSUMER_H

#include "consumer/request.h"

#endif
