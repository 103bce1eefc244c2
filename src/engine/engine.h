/*
 * engine.h — the protocol as step functions over a store and a broker (DESIGN.md §2-§8).
 * No threads, no sleeps, no clock reads: every function takes `now` (ms) from its driver, so
 * the simulator runs exactly this code under a virtual clock.
 */
#ifndef OBX_ENGINE_H
#define OBX_ENGINE_H

#include "store/store.h"

#include <jansson.h>
#include <pthread.h>

/* "<prefix><ULID>" with time now; gen NULL = the process-wide generator. */
obx_err obx__new_id(obx__ulid_gen *gen, const char *prefix, int64_t now, char *out, size_t cap);

/* ---- producer (enqueue.c) ---- */
obx_err obx__route_validate(const obx_route *r, obx__route_row *row, int64_t now);
obx_err obx__route_set_at(obx__store *s, const obx_route *r, int64_t now, int64_t *gen);
obx_err obx__enqueue_at(obx__store *s, const obx_event *ev, int64_t now, obx__ulid_gen *gen,
                        obx_enqueue_result *out);
void obx__dest_from_route(const obx__route_row *route, const obx__envelope *env, obx__dest *d,
                          const char *routing_key);
json_t *obx__route_json(const obx__route_row *r);

/* ---- JSON helpers (inspect.c) ---- */
/* Serializes and releases j; *out is the caller's (obx_free). */
obx_err obx__json_out(json_t *j, char **out);
json_t *obx__event_json(const obx__event_row *r);
json_t *obx__attempt_json(const obx__attempt_row *a);
json_t *obx__receipt_json(const obx__receipt_row *r);
json_t *obx__audit_json(const obx__audit_row *a);
obx_err obx__inspect_json(obx__store *s, const char *event_id, json_t **out);

#endif /* OBX_ENGINE_H */
