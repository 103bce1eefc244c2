/*
 * app.h — the application doubles: the business rows an obx user's service writes, in its own
 * tables and its own SQL, next to obx's. Not obx: obx never reads or writes these tables.
 *   - the producing service (obx__app_producer): its database (SQLite in memory, or a
 *     PostgreSQL connection) with the business table sim_orders, one row per command, written
 *     in the same transaction as the command's event (obx's store on the same connection);
 *   - a consuming service (obx__app_consumer): its SQLite database with the effect table
 *     sim_effects, the handler's effect, written in the inbox's transaction.
 * The simulator (src/sim) runs them as its actors' applications and checks them as the
 * business would (every order has its event, every event applied once); it runs no SQL of its
 * own. Like a user's service, this module uses the public API only (include/obx.h) and the
 * database clients. (The CLI's sample consumer, src/cli/projection.c, is the same kind of code;
 * it stays with the CLI, which ships it: `obx consume` and `obx demo` run it.)
 * Threads: an object belongs to the thread that opened it (one simulator worker).
 */
#ifndef OBX_APP_H
#define OBX_APP_H

#include "obx.h"

#include <stddef.h>

typedef struct obx__app_producer obx__app_producer;
typedef struct obx__app_consumer obx__app_consumer;

/* Opens the producing service's database: PostgreSQL at pg_url (its search_path obx, public;
 * obx's schema must be there already: `obx migrate`), or SQLite in memory when pg_url is NULL
 * (obx's schema created), with the business table (temporary: nothing of it outlives the
 * connection) and an obx store wrapping the same connection. *out is the caller's, closed with
 * obx__app_producer_close (also after a failed open, which leaves what it opened in *out). */
obx_err obx__app_producer_open(const char *pg_url, obx__app_producer **out);
/* The obx store on the producer's connection (borrowed: valid until the close). */
obx_store *obx__app_producer_store(const obx__app_producer *p);
/* The business row of a command, in the caller's open transaction (idempotent: a retried
 * command writes nothing new). */
obx_err obx__app_order_put(obx__app_producer *p, const char *order_id, const char *event_id);
/* The event ID of every business row, at most cap of them into ids; *n gets how many. */
obx_err obx__app_orders(obx__app_producer *p, char (*ids)[OBX_EVENT_ID_LEN + 1], size_t cap,
                        size_t *n);
void obx__app_producer_close(obx__app_producer *p);

/* Opens a consuming service's database (SQLite in memory) with its effect table and an
 * initialized obx store on the same connection. Closed as the producer. */
obx_err obx__app_consumer_open(obx__app_consumer **out);
/* The obx store (borrowed) and the connection (sqlite3 *: what obx_inbox_process hands the
 * handler) of the consumer's database. */
obx_store *obx__app_consumer_store(const obx__app_consumer *c);
void *obx__app_consumer_conn(const obx__app_consumer *c);
/* The handler's effect for event_id, in the inbox's open transaction. */
obx_err obx__app_effect_put(obx__app_consumer *c, const char *event_id);
/* How many events the consumer applied, and how many of them more than once; -1 on failure. */
long obx__app_effects_distinct(obx__app_consumer *c);
long obx__app_effects_doubled(obx__app_consumer *c);
void obx__app_consumer_close(obx__app_consumer *c);

#endif
