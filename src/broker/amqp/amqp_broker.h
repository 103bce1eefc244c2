/*
 * amqp_broker.h — what the RabbitMQ backend offers beyond the broker vtable: counters for
 * tests and the benchmark. Everything else goes through broker.h.
 */
#ifndef OBX_AMQP_BROKER_H
#define OBX_AMQP_BROKER_H

#include "broker/broker.h"

typedef struct obx__amqp_stats {
    uint64_t published; /* basic.publish calls that wrote the whole message */
    uint64_t acked, nacked, returned, unknown, not_sent;
    uint64_t connects, losses; /* successful connects (all purposes); publisher losses */
    size_t max_outstanding;    /* high-water mark of unconfirmed publishes (<= confirm_window) */
} obx__amqp_stats;

/* OBX_EINVAL when b is not an amqp handle. */
obx_err obx__amqp_broker_stats(obx__broker *b, obx__amqp_stats *out);

#endif
