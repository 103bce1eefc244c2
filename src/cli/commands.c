/*
 * commands.c — the one source of the CLI's documentation. main.c dispatches through this table,
 * and help.c prints everything users read from it: `obx help`, `obx COMMAND --help` (and -h,
 * `obx help COMMAND`), the man page (docs/obx.1 is `obx help --man`) and the shell completions
 * (`obx completion bash|zsh|fish`). Text here is plain: help.c wraps it and escapes it for roff.
 *
 * To add a command (for example `obx resolve`):
 *   1. write `int cmd_resolve(int argc, char **argv)` and declare it in cli.h;
 *   2. add ONE entry to cli_commands[] below: name, function, one-line summary, synopsis
 *      lines (without "obx ", a subcommand as the first word), description, every long option
 *      its getopt table accepts (argument name or NULL for a flag, its default, what it does),
 *      one or two examples;
 *   3. regenerate the man page: `cmake --build build --target man` (writes docs/obx.1).
 * test_cli_help fails until every option the command's getopt accepts (read from the running
 * binary, tests/cli/getopt_dump.c) is listed here with the same argument kind, every listed
 * option is accepted, and docs/obx.1 matches; test_cli_completion completes from the same table.
 */
#include "cli.h"

#include <string.h>

/* Defaults shared by many commands, as the user types them. */
#define D_DB CLI_DEFAULT_DB
#define D_BROKER CLI_DEFAULT_BROKER
#define D_WHO "operator:$USER"
#define D_NONE "none"

/* Options several commands share, with the same words everywhere. */
#define O_DB                                                                                       \
    { "db", "URL", D_DB, "The outbox: sqlite:PATH or postgres://... (libpq URL)." }
#define O_JSON                                                                                     \
    {                                                                                              \
        "json", NULL, NULL,                                                                        \
            "Print the result as one JSON document instead of a table; an error is then a JSON "   \
            "object on stderr (code, message, exit_status)."                                       \
    }
#define O_CONFIG(what)                                                                             \
    { "config", "FILE", D_NONE, "A relay configuration file (YAML) to read " what " from." }
#define O_CONSUMER                                                                                 \
    {                                                                                              \
        "consumer", "ID=URL", "audit.critical_consumers",                                          \
            "A critical consumer and its inbox database. Repeatable; replaces the "                \
            "configuration's "                                                                     \
            "list."                                                                                \
    }
#define O_SET                                                                                      \
    {                                                                                              \
        "set", "KEY=VALUE", D_NONE,                                                                \
            "Set one configuration key (e.g. relay.batch=512) over the file. Repeatable."          \
    }
#define O_BROKER_PROP                                                                              \
    {                                                                                              \
        "broker-prop", "K=V", D_NONE,                                                              \
            "A property for the broker backend (librdkafka, rabbitmq-c). Repeatable."              \
    }
#define O_RELAY_OPTS                                                                               \
    O_CONFIG("the configuration"), O_DB,                                                           \
        {"broker", "URL", D_BROKER,                                                                \
         "The broker: log:PATH, kafka://HOST:PORT[,...] or amqp(s)://."},                          \
        {"http", "ADDR:PORT", "off (no HTTP server)",                                              \
         "Serve /healthz, /readyz, /metrics, the dashboard and its API (http.listen); port 0 "     \
         "picks a free one."},                                                                     \
        {"id", "ID", "HOST:PID", "The relay's name in claims and audit rows (relay.id)."}, O_SET,  \
        O_BROKER_PROP

const cli_command cli_commands[] = {
    {.name = "init",
     .fn = cmd_init,
     .summary = "create or upgrade the outbox schema",
     .synopsis = "init [--db URL] [--roles PREFIX] [--json]",
     .text =
         "Create the outbox schema, or migrate it to the version this obx needs. Idempotent; "
         "refuses a schema newer than this obx. The relay and every other command refuse an "
         "outbox whose schema is not current. On PostgreSQL a migration waits for no relay "
         "and runs under none: while relays are connected it refuses (OBX_EBUSY, exit status 3) "
         "and names their server processes; stop them first.",
     .opts = {{"db", "URL", D_DB, "The outbox: sqlite:PATH or postgres://... (libpq URL).", 'd'},
              {"roles", "PREFIX", D_NONE,
               "PostgreSQL: also create the NOLOGIN group roles PREFIX_producer, PREFIX_relay, "
               "PREFIX_auditor and PREFIX_consumer (docs/security.md)."},
              O_JSON},
     .examples = "obx init --db sqlite:/var/lib/obx/outbox.db\n"
                 "obx init --db postgres://owner@db.example/app --roles app"},
    {.name = "route",
     .fn = cmd_route,
     .summary = "set or list route policies (event type -> destination)",
     .synopsis = "route set EVENT_TYPE --cluster C --topic T [options]\n"
                 "route list [--all] [--json] [--db URL]",
     .subcommands = "set list",
     .text = "route set adds a route policy generation for an event type. Events enqueued earlier "
             "keep their frozen destination. --also declares a delivery set: a further "
             "destination (up to 7), each frozen per event with its own digest, attempts and "
             "publish slot, all under the same event ID; --completion says when the event counts "
             "as delivered. route list prints the current routes (every generation with --all).",
     .opts = {O_DB,
              {"cluster", "C", "required", "route set: the broker cluster's name (e.g. local)."},
              {"topic", "T", "required", "route set: the topic (Kafka) or exchange (AMQP)."},
              {"routing-key", "TPL", "{tenant}.{aggregate_type}.{aggregate_id}",
               "route set: the message key template; placeholders {tenant} {aggregate_type} "
               "{aggregate_id} {event_type}."},
              {"algorithm", "A", "murmur2", "route set: partitioner: murmur2, fnv1a or none."},
              {"serializer", "S", "raw", "route set: the payload serializer."},
              {"durability", "D", "persistent", "route set: persistent or transient."},
              {"acks", "A", "all", "route set: required acknowledgements: all, 1 or confirm."},
              {"max-attempts", "N", "8",
               "route set: definite rejections before the event is PARKED (1..1000)."},
              {"on-unknown", "retry|hold", "retry",
               "route set: what ends an UNKNOWN outcome the broker cannot look up, past the "
               "attempt's quiet time and without consumer evidence: a new attempt to the same "
               "frozen target (consumers dedupe), or hold it for an operator (obx resolve)."},
              {"blind-retry", NULL, NULL, "route set: the same as --on-unknown retry."},
              {"unordered", NULL, NULL,
               "route set: do not hold events back behind an unpublished one with the same key."},
              {"alias", "A", "obx", "route set: the dispatcher alias that owns the type."},
              {"encrypt", "KEY_ID", D_NONE,
               "route set: the relay seals every payload of this generation with key KEY_ID "
               "(AES-256-GCM) before the send (docs/security.md)."},
              {"also", "CLUSTER/TOPIC[/ROUTING_KEY]", D_NONE,
               "route set: a further delivery-set destination. Repeatable (at most 7)."},
              {"completion", "all|any", "all",
               "route set: a delivery set counts as delivered when every target has it, or any."},
              {"all", NULL, NULL, "route list: every generation, not only the current one."},
              O_JSON},
     .examples = "obx route set order.created.v1 --cluster local --topic orders\n"
                 "obx route list --json"},
    {.name = "enqueue",
     .fn = cmd_enqueue,
     .summary = "commit one event",
     .finding = "the outbox refused the event: no route for its type (OBX_ENOROUTE).",
     .synopsis = "enqueue --type T --aggregate TYPE/ID@VERSION --tenant X [options]",
     .text = "Commit one event with its frozen envelope and destination (the type's current "
             "route). Bad input is an error naming the field and the limit; nothing is stored. "
             "With --delay or --not-before the relay does not claim the event before its time, "
             "and a later event of the same aggregate (order key) waits behind it unless the "
             "route is --unordered.",
     .opts = {O_DB,
              {"type", "T", "required", "The versioned event type, e.g. order.created.v1."},
              {"aggregate", "TYPE/ID@VERSION", "required",
               "The aggregate the event belongs to and its version, e.g. order/o-42@17."},
              {"tenant", "X", "required", "The tenant."},
              {"payload-file", "F", "-", "The payload's file; - reads standard input."},
              {"idempotency-key", "K", D_NONE,
               "Unique per tenant: a second enqueue with it returns the first event."},
              {"correlation-id", "C", D_NONE, "Correlation ID (obx trace --correlation)."},
              {"causation-id", "C", D_NONE, "The ID of the event or command that caused it."},
              {"traceparent", "TP", D_NONE, "W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>."},
              {"schema", "sha256:HEX", "sha256 of \"schema:\" + the type",
               "The payload schema's digest."},
              {"payload-limit", "BYTES", "1048576", "The largest payload accepted."},
              {"otel-endpoint", "URL", D_NONE,
               "OpenTelemetry: send the event's producer span (create) to this OTLP/HTTP "
               "collector (http://HOST:4318)."},
              {"delay", "DURATION", D_NONE,
               "A delayed event: not published before now + DURATION (e.g. 90s, 30m, 2h, 1d; at "
               "most 366d). Frozen with the envelope; `obx cancel` drops it before its time."},
              {"not-before", "TIME", D_NONE,
               "A delayed event: not published before TIME, ISO-8601 UTC "
               "(2030-01-02T03:04:05Z; at most 366 days ahead). One of --delay and --not-before."},
              O_JSON},
     /* values the sample consumer (obx consume without --exec) serves: its contract
      * order.created.v1 and tenants tenant-7, tenant-9 (projection.c) */
     .examples = "echo '{\"order\":\"o-42\"}' | obx enqueue --type order.created.v1 "
                 "--aggregate order/o-42@1 --tenant tenant-7\n"
                 "echo '{\"order\":\"o-43\"}' | obx enqueue --type order.created.v1 "
                 "--aggregate order/o-43@1 --tenant tenant-7 --delay 15m"},
    {.name = "inspect",
     .fn = cmd_inspect,
     .summary = "one event's envelope, state, attempts, receipts and audit rows",
     .finding = "no such event in this outbox.",
     .synopsis = "inspect EVENT_ID [--json] [--db URL]",
     .text = "Envelope, destination, digests, state, attempts, receipts and audit rows of one "
             "event, its delivery set and the evidence of its migrations.",
     .opts = {O_DB, O_JSON},
     .examples = "obx inspect evt-01J8Z3Q4R5S6T7V8W9X0Y1Z2A3"},
    {.name = "report",
     .fn = cmd_report,
     .summary = "the whole outbox: counts, receipts, UNKNOWN times, invariants",
     .finding = "an invariant is violated, or a receipt is quarantined (an open alarm).",
     .synopsis = "report [--json] [--db URL]",
     .text = "Counts by state, receipts by kind, UNKNOWN resolution times and the invariants of "
             "the whole outbox, and the open alarms (quarantined receipts).",
     .opts = {O_DB, O_JSON},
     .examples = "obx report --db sqlite:/var/lib/obx/outbox.db"},
    {.name = "status",
     .fn = cmd_status,
     .summary = "the outbox at a glance (cheap): states, ages, UNKNOWN and PARKED lists",
     .finding = "an open alarm: a quarantined receipt, or an UNKNOWN held for an operator past its "
                "alert time.",
     .synopsis = "status [--db URL] [--config FILE] [--consumer ID=URL]... [--limit N] [--json] "
                 "[--watch SECONDS]",
     .text = "The outbox at a glance, cheap on a big outbox: events by state, the oldest PENDING "
             "and UNKNOWN ages, receipts by kind, the UNKNOWN events with their attempts, the "
             "PARKED events with the broker's last words, the quarantined receipts, and per "
             "critical consumer its lag, last commit and poison backlog.",
     .opts = {O_DB,
              O_CONFIG("db and audit.critical_consumers"),
              O_CONSUMER,
              O_JSON,
              {"watch", "SECONDS", D_NONE, "Redraw every SECONDS (1..3600) until SIGINT."},
              {"limit", "N", "50", "Rows per list (1..10000)."}},
     .examples = "obx status --config /etc/obx/relay.yaml\n"
                 "obx status --watch 2"},
    {.name = "trace",
     .fn = cmd_trace,
     .summary = "one event's flow, producer to consumers",
     .finding = "nothing matches.",
     .synopsis = "trace EVENT_ID | --correlation ID [--db URL] [--config FILE] "
                 "[--consumer ID=URL]... [--json]",
     .text = "The whole flow of one event, or of every event with a correlation ID, as a "
             "timeline: the producer's commit, every state change with who did it, the attempts "
             "and receipts, and each critical consumer's consume audit and receipt (or poison "
             "state).",
     .opts = {O_DB,
              O_CONFIG("db and audit.critical_consumers"),
              O_CONSUMER,
              {"correlation", "ID", D_NONE, "Every event with this correlation ID."},
              O_JSON},
     .examples = "obx trace evt-01J8Z3Q4R5S6T7V8W9X0Y1Z2A3\n"
                 "obx trace --correlation checkout-991 --consumer billing=sqlite:billing.db"},
    {.name = "consumer-test",
     .fn = cmd_consumer_test,
     .summary = "replay a consumer against duplicates, reordering, old contracts, poison",
     .finding = "the consumer mishandles a scenario.",
     .synopsis = "consumer-test --builtin order-projection | --handler LIB.so[:SYMBOL] [options]",
     .text = "Replay a consumer's handler through the inbox against duplicates, a crash between "
             "its effect and its commit, reordering, an older contract version, a foreign tenant "
             "and a poison message, each in a fresh in-memory database, and report which it "
             "mishandles. A handler library exports "
             "const obx_consumer_test *SYMBOL(void) (default obx_consumer_test_spec).",
     .opts = {{"builtin", "NAME", D_NONE, "A built-in handler: order-projection."},
              {"handler", "LIB.so[:SYMBOL]", D_NONE, "A handler library and its spec function."},
              {"types", "T1,T2", "the handler's own", "Accepted event types."},
              {"tenants", "A,B", "the handler's own", "Accepted tenants."},
              {"max-failures", "N", "5", "Handler failures before parking (2..1000)."},
              O_JSON},
     .examples = "obx consumer-test --builtin order-projection\n"
                 "obx consumer-test --handler ./libbilling.so:billing_spec --json"},
    {.name = "catalog",
     .fn = cmd_catalog,
     .summary = "check the topic catalog against routes and subscriptions",
     .finding = "a finding.",
     .synopsis = "catalog check --catalog FILE [--db URL] [--consumers FILE] "
                 "[--subscription CONSUMER=TOPIC[,TOPIC...]]... [--consumer-db ID=URL]... [--json]",
     .subcommands = "check",
     .text = "Compare the topic catalog (versioned topics with owner, event types, subscribers) "
             "with the route policy and the consumers' subscriptions (declared in a file or on "
             "the command line, or observed in a consumer database's watermarks). Reports topics "
             "nobody consumes, subscriptions to undeclared topics, routes of undeclared types or "
             "to another topic, subscriber lists that differ from the runtime, unversioned or "
             "ownerless topics, and spelling or version drift with the likely intended name.",
     .opts = {{"catalog", "FILE", "required", "The catalog (YAML)."},
              {"db", "URL", "none (routes not checked)", "The outbox whose routes to compare."},
              {"consumers", "FILE", D_NONE, "The consumers' declared subscriptions (YAML)."},
              {"subscription", "CONSUMER=TOPIC[,TOPIC...]", D_NONE,
               "A consumer's subscription. Repeatable."},
              {"consumer-db", "ID=URL", D_NONE,
               "A consumer's inbox database: its observed subscriptions. Repeatable."},
              O_JSON},
     .examples = "obx catalog check --catalog topics.yaml --db sqlite:obx.db"},
    {.name = "relay",
     .fn = cmd_relay,
     .summary = "run the relay daemon",
     .synopsis = "relay [--config FILE] [--db URL] [--broker URL] [--http ADDR:PORT] [--id ID] "
                 "[--set KEY=VALUE]... [--broker-prop K=V]...",
     .text = "Run the relay daemon: claim committed events, publish them to their frozen "
             "destination, accept receipts, reconcile UNKNOWN outcomes with the broker, audit and "
             "purge as configured. A database or broker that is not there yet, or goes away, is "
             "waited for (connect.retry_initial_ms, connect.retry_max_ms; one log line when it "
             "goes, one when it is back) and /readyz says why it is not ready; a configuration "
             "error exits 2 at once. Runs until SIGINT or SIGTERM; then it stops claiming, says "
             "how many outcomes it drains, drains in-flight acknowledgements (relay.drain_ms) "
             "and exits 0; a second signal stops it at once (what is outstanding is left to "
             "the reconciler, as after a kill). Under systemd (Type=notify) it sends READY=1 "
             "once it serves, STATUS= lines, WATCHDOG=1 and STOPPING=1. Flags override the "
             "configuration file (README.md, \"Configuration\"). The packaged service "
             "obx-relay.service runs obx relay --config /etc/obx/relay.yaml.",
     .opts = {O_RELAY_OPTS},
     .examples = "obx relay --config /etc/obx/relay.yaml\n"
                 "obx relay --db sqlite:obx.db --broker kafka://localhost:9092 --http "
                 "127.0.0.1:8080"},
    {.name = "config",
     .fn = cmd_config,
     .summary = "the relay's effective configuration as JSON, secrets redacted",
     .synopsis = "config [--config FILE] [--db URL] [--broker URL] [--http ADDR:PORT] [--id ID] "
                 "[--set KEY=VALUE]... [--broker-prop K=V]...",
     .text = "Print the configuration the relay would run with (defaults, file, flags in that "
             "order), as JSON with secrets replaced by ***. The output is itself a valid "
             "configuration file.",
     .opts = {O_RELAY_OPTS},
     .examples = "obx config --config /etc/obx/relay.yaml"},
    {.name = "consume",
     .fn = cmd_consume,
     .summary = "run a consumer through the inbox (sample projection, or a command per message)",
     .synopsis = "consume --consumer-db sqlite:PATH --topic T [options]\n"
                 "consume --consumer-db URL --topic T --exec CMD [--poison-exit N] "
                 "[--exec-timeout MS] [options]",
     .text = "Run a consumer through the inbox; each event's effect is applied once, and the "
             "broker is acknowledged only after the inbox's commit. Without --exec it applies "
             "the sample order projection in the consumer's own SQLite database (declaring its "
             "contract order.created.v1 and tenants tenant-7, tenant-9). With --exec CMD it runs "
             "/bin/sh -c CMD per message, the payload on its stdin and the obx headers in its "
             "environment (OBX_EVENT_ID, OBX_EFFECT_KEY, ...; docs/inbox-sql.md), the inbox in "
             "any store URL: exit 0 applies (the first line of its stdout is the result), exit "
             "--poison-exit parks the message at once, any other exit, a signal or the timeout "
             "is a failure retried up to --max-failures.\n\n"
             "A consumer database or broker that is not there yet, or goes away, is waited for "
             "(one line when it goes, one when it is back), never a reason to exit; a "
             "configuration error exits 2 at once. On SIGINT or SIGTERM the message in hand is "
             "finished (its command runs to its end) and the consumer exits 0 within a second "
             "after it; the rest of its batch is not acknowledged and comes again. Under "
             "systemd it sends READY=1 once consuming, STATUS= lines and WATCHDOG=1.",
     .opts = {{"consumer-db", "URL", "required",
               "The consumer's database (inbox): sqlite:PATH for the sample projection, any store "
               "URL with --exec."},
              {"broker", "URL", D_BROKER, "The broker to read from."},
              {"topic", "T[,T...]", "required", "Topics to consume."},
              {"consumer", "ID", "order-projection", "The consumer's ID in the inbox."},
              {"group", "G", "the consumer ID", "The consumer group (Kafka)."},
              {"types", "T1,T2|*", "the sample's own; any with --exec",
               "Accepted event types ('*': any)."},
              {"tenants", "A,B|*", "the sample's own; any with --exec",
               "Accepted tenants ('*': any)."},
              {"max-failures", "N", "5", "Handler failures before a message is parked as poison."},
              {"retry-backoff", "BASE[,MAX]", "1s,5m",
               "Wait before retrying a failed message: BASE, doubling per failure up to MAX, "
               "+-20 % jitter (durations: 250ms, 1s, 5m); kept in the inbox, so a restart keeps "
               "it; its partition waits behind it (per-key order) unless --unordered. 0: retry at "
               "once."},
              {"unordered", NULL, "ordered",
               "A failed message does not hold its partition or queue: a copy of it is kept in "
               "the inbox, the broker acknowledged past it, and its retry runs from the copy when "
               "due; later messages, of its key too, are applied meanwhile (per-key order is "
               "lost; a copy's bytes are stored until its retry)."},
              {"until-idle", "MS", "0 (run until SIGINT)",
               "Stop after MS without a message (exit 0), but not while a retry this consumer "
               "scheduled is due within the back-off's MAX (it waits for it, then idles); also "
               "after MS of waiting for a consumer database or broker that is not there "
               "(exit 1)."},
              {"fail-permille", "N", "0",
               "Test: fail this many sample handler calls in 1000 (0..1000; not with --exec)."},
              {"exec", "CMD", D_NONE,
               "Run CMD (/bin/sh -c) per message as the handler, with the inbox around it."},
              {"poison-exit", "N", "65",
               "With --exec: the exit status that parks at once (1..255)."},
              {"exec-timeout", "MS", "60000",
               "With --exec: kill the command's process group after MS (1..86400000); a retried "
               "failure."},
              {"set", "KEY=VALUE", D_NONE,
               "connect.retry_initial_ms or connect.retry_max_ms (defaults 500 and 15000): the "
               "wait between tries for a consumer database or broker that is not there; otel.* "
               "(otel.endpoint: a span per delivery, docs/operations.md). Repeatable."},
              O_BROKER_PROP,
              O_JSON},
     .examples = "obx consume --consumer-db sqlite:projection.db --topic orders --until-idle 2000\n"
                 "obx consume --consumer-db postgres://app@db/orders --topic orders --exec "
                 "'python3 handle.py' --poison-exit 65"},
    {.name = "requeue",
     .fn = cmd_requeue,
     .summary = "put a PARKED event back to PENDING",
     .finding = "refused: the event is not PARKED, or not in this outbox.",
     .synopsis = "requeue EVENT_ID [--who NAME] [--db URL] [--json]",
     .text = "Put a PARKED event back to PENDING (its rejection count reset), with an audit row "
             "naming who did it.",
     .opts = {O_DB, {"who", "NAME", D_WHO, "The operator recorded in the audit row."}, O_JSON},
     .examples = "obx requeue evt-01J8Z3Q4R5S6T7V8W9X0Y1Z2A3 --who alice"},
    {.name = "cancel",
     .fn = cmd_cancel,
     .summary = "cancel a delayed event before a relay claims it",
     .finding = "refused: the event is not PENDING (claimed, sent or cancelled already), has no "
                "delay, or is not in this outbox.",
     .synopsis = "cancel EVENT_ID --who NAME --reason TEXT [--db URL] [--json]",
     .text = "Cancel a delayed event (enqueued with --delay or --not-before) that no relay has "
             "claimed yet: PENDING -> CANCELLED, a final state, in one transaction with an audit "
             "row naming --who and --reason. It is never sent; a later event of the same order "
             "key stops waiting for it. Once claimed the event may be on its way to the broker, "
             "and cancel refuses.",
     .opts = {O_DB,
              {"who", "NAME", "required", "The operator, recorded in the audit row."},
              {"reason", "TEXT", "required", "Why (the business decision), recorded in the audit."},
              O_JSON},
     .examples = "obx cancel evt-01J8Z3Q4R5S6T7V8W9X0Y1Z2A3 --who alice --reason 'order paid'"},
    {.name = "resolve",
     .fn = cmd_resolve,
     .summary = "end UNKNOWN outcomes: same-target retry, or accept with evidence",
     .finding = "some selected events were refused (each with its reason).",
     .synopsis = "resolve [EVENT_ID...] [--type T] [--held] [--older-than DURATION] --retry "
                 "--who NAME --reason TEXT [--dry-run] [--json] [--db URL]\n"
                 "resolve EVENT_ID --accept --offset N --payload-digest D [--topic T] "
                 "[--partition P] [--attempt A] --who NAME --reason TEXT [--db URL] "
                 "[--config FILE] [--broker URL] [--broker-prop K=V]...\n"
                 "resolve [EVENT_ID...] --accept --from-consumer ID=URL --config FILE --who NAME "
                 "--reason TEXT [--db URL]",
     .text = "End DISPATCH_UNKNOWN and held events, chosen by ID or by filter. --retry issues a "
             "new attempt to the event's frozen destination (its digest checked); --accept "
             "records evidence that the broker has the message (its offset and payload digest, "
             "or a critical consumer's inbox row) through the acceptance point, and the event "
             "becomes PUBLISHED without a resend. Where the event's cluster can be asked (Kafka, "
             "the local log), obx reads the named offset from --broker and hashes the message: "
             "what is not the event's own message is refused; where it cannot (RabbitMQ), the "
             "acceptance is an operator assertion, shown by obx status and reported by obx "
             "audit until a critical consumer's receipt confirms it. --from-consumer takes only "
             "a critical consumer declared in --config. Nothing changes a destination. Every "
             "resolution is one transaction with an audit row naming --who and --reason.",
     .opts = {O_DB,
              O_CONFIG("db, broker, broker_properties, audit.critical_consumers and "
                       "otel.endpoint"),
              {"broker", "URL", "the configuration's; none",
               "--accept: the broker of the event's cluster, where the offset is read."},
              O_BROKER_PROP,
              {"type", "T", "any", "Only events of this type."},
              {"held", NULL, NULL, "Only events held by their route's UNKNOWN policy."},
              {"older-than", "DURATION", "any age",
               "Only events UNKNOWN for longer than this (e.g. 90s, 15m, 2h, 1d)."},
              {"retry", NULL, NULL, "A new attempt to the same frozen target."},
              {"accept", NULL, NULL,
               "Accept with evidence: --offset and --payload-digest, or "
               "--from-consumer."},
              {"topic", "T", "the frozen topic", "--accept: where the broker stored it."},
              {"partition", "P", "0", "--accept: the partition."},
              {"offset", "N", "required with --accept", "--accept: the broker's offset."},
              {"payload-digest", "D", "required with --offset",
               "--accept: the stored payload's digest (must match the frozen one)."},
              {"attempt", "A", "the open attempt", "--accept: the attempt the evidence is for."},
              {"from-consumer", "ID=URL", D_NONE,
               "--accept: a declared critical consumer (--config) whose inbox row proves "
               "delivery."},
              {"who", "NAME", "required", "The operator, recorded in the audit row."},
              {"reason", "TEXT", "required", "Why (an incident number), recorded in the audit."},
              {"dry-run", NULL, NULL, "List what would be resolved; opens the outbox read-only."},
              {"otel-endpoint", "URL", "the configuration's otel.endpoint; none",
               "OpenTelemetry: a reconcile span per resolution (obx.outcome operator_accept or "
               "operator_retry, linked to the attempt it resolved) to this OTLP/HTTP "
               "collector."},
              O_JSON},
     .examples = "obx resolve --held --older-than 15m --retry --who alice --reason INC-42\n"
                 "obx resolve evt-01J8Z3Q4R5S6T7V8W9X0Y1Z2A3 --accept --from-consumer "
                 "billing=postgres://billing --config /etc/obx/relay.yaml --who alice --reason "
                 "INC-43"},
    {.name = "poison",
     .fn = cmd_poison,
     .summary = "a consumer's poison messages: list or re-drive",
     .finding = "redrive: the message is not parked.",
     .synopsis = "poison list --consumer-db URL [--consumer ID] [--json]\n"
                 "poison redrive EVENT_ID --consumer-db URL --consumer ID [--json]",
     .subcommands = "list redrive",
     .text = "List a consumer's parked poison messages (as JSON), or mark one for re-drive: the "
             "next delivery of that event runs the handler again.",
     .opts = {{"consumer-db", "URL", "required", "The consumer's database (inbox)."},
              {"consumer", "ID", "every consumer (list); required (redrive)", "The consumer ID."},
              O_JSON},
     .examples = "obx poison list --consumer-db sqlite:projection.db\n"
                 "obx poison redrive evt-01J8Z3Q4R5S6T7V8W9X0Y1Z2A3 --consumer-db "
                 "sqlite:projection.db --consumer order-projection"},
    {.name = "sim",
     .fn = cmd_sim,
     .summary = "the deterministic simulator and release gate",
     .finding = "the gate fails.",
     .synopsis = "sim [--traces N] [--seed S] [--jobs J] [--json] [--fault NAME]... "
                 "[--replay TRACE_ID] [--db postgres://...] [--fail-fast]",
     .text = "The production engine against a simulated broker under a virtual clock, every "
             "fault class injected, the invariants checked after each trace. The same seed and N "
             "give the same trace hash with any --jobs, on "
             "SQLite (in memory) and on PostgreSQL (--db: every trace runs in one transaction "
             "that is rolled back). --replay narrates one trace step by step.",
     .opts = {{"traces", "N", "100000", "Traces to run."},
              {"seed", "S", "1", "The seed; trace i is a pure function of (seed, i)."},
              {"jobs", "J", "1", "Worker threads (1..64)."},
              O_JSON,
              {"fault", "NAME", "every class", "Inject only this fault class. Repeatable."},
              {"replay", "TRACE_ID", D_NONE, "Narrate one trace step by step."},
              {"mutation", "NAME", D_NONE,
               "Test builds (OBX_MUTATIONS) only: run with an engine mutation the checkers must "
               "catch."},
              {"fail-fast", NULL, NULL, "Stop at the first failing trace."},
              {"db", "URL", "sqlite in memory", "Run the outbox on this PostgreSQL database."}},
     .examples = "obx sim --traces 10000 --seed 42 --jobs 2\n"
                 "obx sim --replay 137 --seed 42"},
    {.name = "audit",
     .fn = cmd_audit,
     .summary = "three-set audit: outbox vs receipts vs critical consumers",
     .finding = "findings.",
     .synopsis = "audit [--db URL] [--broker URL | --no-broker] [--consumer ID=URL]... "
                 "[--config FILE] [--set KEY=VALUE]... [--json]",
     .text = "The three-set audit: committed outbox events, accepted publish receipts and each "
             "critical consumer's inbox. Findings, each with its event IDs (at most "
             "audit.max_ids), count and oldest age: pending_overdue, unconsumed, bypass "
             "(messages on the broker this outbox never committed), unknown_overdue, "
             "quarantined_receipt, consumer_quarantine, parked and pending_unserved (PENDING "
             "past audit.pending_max_age_ms in a cluster no live relay serves). Without --broker "
             "or --config the broker is not compared.",
     .opts = {O_CONFIG("db, broker and audit.*"),
              O_DB,
              {"broker", "URL", "the configuration's; none without --config",
               "The broker to look for bypass messages on."},
              {"no-broker", NULL, NULL, "Do not compare with the broker."},
              O_CONSUMER,
              O_SET,
              O_JSON},
     .examples = "obx audit --config /etc/obx/relay.yaml\n"
                 "obx audit --db sqlite:obx.db --consumer billing=sqlite:billing.db --json"},
    {.name = "purge",
     .fn = cmd_purge,
     .summary = "retention: retain and purge what the evidence allows",
     .finding = "with EVENT_ID: the event cannot go now (every unmet condition named).",
     .synopsis = "purge [EVENT_ID] [--dry-run] [--db URL] [--consumer ID=URL]... [--config FILE] "
                 "[--set KEY=VALUE]... [--who NAME] [--max-listed N] [--json]",
     .text = "Retention: PUBLISHED events consumed by every critical consumer become RETAINED; "
             "RETAINED events whose replay window (retention.replay_window_ms after publication) "
             "is over and that are behind the forced consumer watermark become PURGED: the "
             "payload is dropped, the envelope, digests, attempts, receipts and audit rows stay. "
             "In transactions of at most retention.batch events, at most retention.max_rate "
             "events per second when set. With an EVENT_ID only that event, all or nothing: exit "
             "status 1 and every unmet condition when it cannot go. Refuses everything when no "
             "critical consumer is declared.",
     .opts = {O_CONFIG("db, retention.* and audit.critical_consumers"),
              O_DB,
              O_CONSUMER,
              O_SET,
              O_JSON,
              {"dry-run", NULL, NULL, "List what would go; change nothing."},
              {"who", "NAME", D_WHO, "The operator recorded in the audit rows."},
              {"max-listed", "N", "1000", "Events listed (1..1000000); counts stay exact."}},
     .examples = "obx purge --dry-run --config /etc/obx/relay.yaml\n"
                 "obx purge evt-01J8Z3Q4R5S6T7V8W9X0Y1Z2A3 --consumer billing=sqlite:billing.db"},
    {.name = "watermark",
     .fn = cmd_watermark,
     .summary = "critical consumers' watermarks: list, or force one forward",
     .finding = "force: refused (it would not move forward).",
     .synopsis = "watermark [list] [--json] [--db URL] [--consumer ID=URL]... [--config FILE]\n"
                 "watermark force CONSUMER --until TIME --reason TEXT [--who NAME] "
                 "[--consumer ID=URL]... [--config FILE]",
     .subcommands = "list force",
     .text = "list: the critical consumers' forced watermarks and the forced consumer watermark "
             "(the oldest published event some critical consumer lacks). force: move a critical "
             "consumer's forced watermark forward, for a consumer that was decommissioned or "
             "rebuilt: every event published up to TIME (ms since the epoch, now, or "
             "2030-01-02T03:04:05Z; never in the future) counts as consumed by it. Recorded in "
             "the consumer's database with who and why; it never moves backwards.",
     .opts = {O_CONFIG("db and audit.critical_consumers"),
              O_DB,
              O_CONSUMER,
              O_SET,
              O_JSON,
              {"who", "NAME", D_WHO, "force: the operator recorded with the watermark."},
              {"until", "TIME", "required (force)", "force: the new watermark."},
              {"reason", "TEXT", "required (force)", "force: why, recorded with it."}},
     .examples = "obx watermark list --config /etc/obx/relay.yaml\n"
                 "obx watermark force billing --until now --reason 'rebuilt from snapshot' "
                 "--consumer billing=sqlite:billing.db"},
    {.name = "demo",
     .fn = cmd_demo,
     .summary = "the whole pipeline with injected faults",
     .finding = "an invariant does not hold at the end.",
     .synopsis = "demo [--events N] [--dir DIR [--force]] [--db URL] [--broker URL|kafka] "
                 "[--lease-ms MS] [--json]",
     .text = "Run the whole pipeline with injected faults (lost, late and timed-out ACKs, "
             "duplicate appends, a paused and a killed relay, flaky consumer handlers) and print "
             "what happened. --broker kafka starts a "
             "Kafka-protocol mock cluster inside the demo; an amqp:// URL uses that RabbitMQ. A "
             "--dir that holds an earlier demo, or a --db that already holds events, is refused "
             "at once (exit status 2); --force starts afresh in that --dir.",
     .opts = {{"events", "N", "10000", "Orders to commit (1..10000000)."},
              {"dir", "DIR", "a new /tmp/obx-demo-XXXXXX", "The demo's folder (kept)."},
              {"force", NULL, NULL,
               "In a --dir that holds an earlier demo: remove its databases and logs first."},
              {"broker", "URL|kafka", "log:DIR/broker.db", "The broker."},
              {"db", "URL", "sqlite:DIR/outbox.db", "The outbox."},
              {"lease-ms", "MS", "1500", "The relays' claim lease (at least 200)."},
              O_JSON},
     .examples = "obx demo --events 2000\n"
                 "obx demo --broker kafka --json"},
    {.name = "migrate",
     .fn = cmd_migrate,
     .summary = "move undelivered events to a new destination (with proof), or add a target",
     .finding =
         "some selected events were refused (no proof, or in flight), or --type has no route.",
     .synopsis = "migrate [EVENT_ID...] [selectors] (--route-gen G | --cluster C --topic T "
                 "[route options]) [--add-target [--target N] [--completion all|any]] [options]",
     .text = "Move undelivered events (by ID, or selected by type, current cluster and topic, "
             "state) to another destination: route generation G, the type's current one, or, "
             "with --cluster/--topic, a new generation set first. Each event moves only with "
             "proof that the old target did not accept it (never sent, a definite rejection, or "
             "an authoritative NOT_FOUND looked up through --broker): a new envelope generation "
             "and a MIGRATION receipt. An event that cannot be proven absent, in a dispatcher's "
             "or the reconciler's hands, or delivered, is refused with the reason. --add-target "
             "adds the destination as a further delivery-set target instead. "
             "See docs/migration.md.",
     .opts = {O_DB,
              {"broker", "URL", D_NONE, "The old target's broker, for attempts still UNKNOWN."},
              O_BROKER_PROP,
              {"type", "T", "any", "Select events of this type (and the route to set)."},
              {"from-cluster", "C", "any", "Select events frozen to this cluster."},
              {"from-topic", "T", "any", "Select events frozen to this topic."},
              {"state", "S", "every undelivered state", "Select events in this state."},
              {"limit", "N", "1000", "Select at most N events (1..100000)."},
              {"route-gen", "G", "the type's current", "The destination's route generation."},
              {"cluster", "C", D_NONE, "A new route generation's cluster (with --topic)."},
              {"topic", "T", D_NONE, "A new route generation's topic (with --cluster)."},
              {"routing-key", "TPL", "{tenant}.{aggregate_type}.{aggregate_id}",
               "The new route's key template."},
              {"algorithm", "A", "murmur2", "The new route's partitioner."},
              {"serializer", "S", "raw", "The new route's serializer."},
              {"durability", "D", "persistent", "The new route's durability."},
              {"acks", "A", "all", "The new route's required acknowledgements."},
              {"add-target", NULL, NULL, "Add the destination as a delivery-set target."},
              {"target", "N", "the first the event lacks", "--add-target: the target number."},
              {"completion", "all|any", "all", "--add-target to an event without a set."},
              {"who", "W", "operator", "The operator in receipts and audit rows."},
              {"reason", "R", D_NONE, "Why, recorded with the receipt."},
              {"dry-run", NULL, NULL, "Decide and report; opens the outbox read-only."},
              O_JSON},
     .examples = "obx migrate --type order.created.v1 --cluster local --topic orders-v2 --dry-run\n"
                 "obx migrate evt-01J8Z3Q4R5S6T7V8W9X0Y1Z2A3 --route-gen 3 --reason 'topic moved'"},
    {.name = "shadow",
     .fn = cmd_shadow,
     .summary = "compare what obx would send with what another dispatcher published",
     .finding = "a difference.",
     .synopsis = "shadow [--alias A]... [--type T]... [--topic T]... [--feed FILE] "
                 "[--since-ms MS] [--grace-ms MS] [--limit N] [--json] [--db URL] "
                 "[--broker URL] [--broker-prop K=V]...",
     .text = "Claim nothing, send nothing: compute what obx would send (destination, partition, "
             "key, digests) for the events the given dispatcher aliases or types own, and "
             "compare it with what was published, read from the broker through a consumer group "
             "that never commits, or from a receipts feed (JSON lines). Reports events missing "
             "on the broker, published elsewhere or with another payload, and event IDs the "
             "outbox never committed.",
     .opts = {O_DB,
              {"broker", "URL", D_BROKER " (without --feed)", "The broker to read."},
              O_BROKER_PROP,
              {"alias", "A", "every alias", "Events this alias owns. Repeatable."},
              {"type", "T", "every type", "Events of this type. Repeatable."},
              {"topic", "T", "every topic", "Events frozen to this topic. Repeatable."},
              {"feed", "FILE", D_NONE, "Compare with a receipts feed instead of the broker."},
              {"since-ms", "MS", "0 (the last hour)", "Events committed at or after MS."},
              {"grace-ms", "MS", "60000", "Younger events are not missing yet (-1: none)."},
              {"limit", "N", "100000", "Events compared at most."},
              O_JSON},
     .examples = "obx shadow --alias legacy --broker kafka://localhost:9092"},
    {.name = "takeover",
     .fn = cmd_takeover,
     .summary = "hand event types to a dispatcher alias (or back)",
     .finding = "refused (a type without a route).",
     .synopsis = "takeover --to ALIAS (--type T[,T...]... | --from ALIAS [--percent P]) "
                 "[--backlog] [--who W] [--dry-run] [--json] [--db URL]",
     .text = "Hand event types to a dispatcher alias: a new route generation per type, same "
             "destination. With --percent a stable share of the types --from owns; with "
             "--backlog their unclaimed PENDING and PARKED events too. Rollback is the same "
             "command back to the old alias: events already claimed or sent keep their attempts "
             "and keep being reconciled.",
     .opts = {O_DB,
              {"to", "ALIAS", "required", "The new owner."},
              {"type", "T[,T...]", D_NONE, "These types. Repeatable."},
              {"from", "ALIAS", D_NONE, "The types this alias owns now."},
              {"percent", "P", "100", "A stable share of --from's types (1..100)."},
              {"backlog", NULL, NULL, "Move their unclaimed PENDING and PARKED events too."},
              {"who", "W", "operator", "The operator in the audit rows."},
              {"dry-run", NULL, NULL, "Report; opens the outbox read-only."},
              O_JSON},
     .examples = "obx takeover --to obx --from legacy --percent 10 --dry-run"},
    {.name = "completion",
     .fn = cmd_completion,
     .summary = "print the shell completion script",
     .synopsis = "completion bash|zsh|fish",
     .subcommands = "bash zsh fish",
     .text = "Print the completion of commands, subcommands and options for bash, zsh or fish, "
             "generated from the same command table (the package installs them as "
             "/usr/share/bash-completion/completions/obx, "
             "/usr/share/zsh/vendor-completions/_obx and "
             "/usr/share/fish/vendor_completions.d/obx.fish).",
     .examples = "source <(obx completion bash)\n"
                 "source <(obx completion zsh)\n"
                 "obx completion fish | source"},
    {.name = "help",
     .fn = cmd_help,
     .summary = "this list, or one command's help",
     .synopsis = "help [COMMAND]\n"
                 "COMMAND --help",
     .text = "Without a command, list the commands. With one, its synopsis, options with their "
             "defaults and examples (the same as obx COMMAND --help or -h). obx help --man "
             "prints the man page in roff.",
     .opts = {{"man", NULL, NULL, "Print the man page (roff), the source of docs/obx.1."}},
     .examples = "obx help relay\n"
                 "obx relay --help"},
    {.name = "version",
     .fn = cmd_version,
     .summary = "print the version",
     .synopsis = "version\n"
                 "--version",
     .text = "Print obx's version (that of the library it runs).",
     .examples = "obx version\n"
                 "obx --version"},
};

const size_t cli_n_commands = sizeof cli_commands / sizeof cli_commands[0];

/* The man page's sections around COMMANDS; paragraphs separated by a blank line. */
const char cli_man_description[] =
    "obx moves events committed in a database (the outbox) to a broker and proves, per event, "
    "whether the broker has it. Services commit their business rows and a frozen event envelope "
    "in one transaction; the relay publishes each envelope to its frozen destination, tracks "
    "unknown outcomes by attempt and reconciles them with the broker instead of guessing; "
    "consumers apply each event's effect once through the inbox.\n\n"
    "Every command names its outbox with --db URL (sqlite:PATH or postgres://..., default " D_DB
    ") and its broker with --broker URL (log:PATH, kafka://HOST:PORT, "
    "amqp://USER:PASS@HOST:PORT/VHOST; default " D_BROKER "). A URL may hold ${NAME} "
    "(environment) and ${file:PATH} (a secret file) references instead of secrets.\n\n"
    "Commands that only read (report, status, inspect, route list, audit, trace, watermark list, "
    "purge --dry-run, shadow, catalog check, poison list) open every database read-only: they "
    "never create a file (a missing one is \"no such outbox: PATH\", exit status 3) and read "
    "one the user cannot write.";

const char cli_man_files[] =
    "/etc/obx/relay.yaml: the packaged relay's configuration (a conffile): SQLite outbox "
    "/var/lib/obx/outbox.db, local log broker /var/lib/obx/broker.db, HTTP on 127.0.0.1:8480.\n\n"
    "/etc/obx/relay.env: environment of obx-relay.service (root only): the secrets that "
    "${NAME} references in relay.yaml name.\n\n"
    "/etc/obx/http-token: the bearer token for the relay's mutating HTTP requests "
    "(http.token_file; owned by the obx user, mode 0600).\n\n"
    "/var/lib/obx: the service's state directory (StateDirectory=obx).\n\n"
    "obx-relay.service: the systemd unit: runs obx relay --config /etc/obx/relay.yaml as user "
    "obx, restarts it on failure.";

const char cli_man_http[] =
    "With --http ADDR:PORT (or http.listen) the relay serves, bound to 127.0.0.1 by default: "
    "/healthz (alive), /readyz (database reachable with the current schema, broker reachable, "
    "relay not stopping), /metrics (Prometheus text), / (the dashboard) and its JSON API under "
    "/api/. Mutating requests need Authorization: Bearer with the token in http.token_file. See "
    "docs/operations.md.";

const char cli_man_exit[] =
    "Every command exits with one of four statuses, so that a script or a monitoring check can "
    "tell a finding from a failure to look:\n\n"
    "0: done; for a check, all good.\n\n"
    "1: a finding: an invariant violated, an open alarm (a quarantined receipt), audit findings, "
    "some selected events refused. Each command's section says what a finding is for it; a "
    "command without one never exits 1.\n\n"
    "2: a usage error: an unknown option, a malformed URL (--db foo.db, sqlit:) or value, a "
    "missing required option (--tenant), a malformed configuration file.\n\n"
    "3: could not check: the database or broker unreachable, no such outbox, a schema that is "
    "not this obx's, permission denied, a busy database, out of memory.";

const char cli_man_see_also[] =
    "The documentation installed with obx, in /usr/share/doc/obx (the Debian package; "
    "share/doc/obx under another install prefix): README.md (the tour, the commands), "
    "CHANGELOG.md, design.md (the state machine and its rules), architecture.md (the source), "
    "operations.md (upgrades, metrics, logs, the dashboard, the configuration reference), "
    "testing.md (the test suites), postgres.md, kafka.md, "
    "amqp.md (the backends), security.md (TLS, secrets, roles), retention.md (audit and purge), "
    "migration.md (destinations, shadow mode, takeover), inbox-sql.md (consumers in any "
    "language), reliability.md (the chaos soak), performance.md.";

const cli_command *cli_find_command(const char *name) {
    for (size_t i = 0; i < cli_n_commands; i++)
        if (!strcmp(cli_commands[i].name, name)) return &cli_commands[i];
    return NULL;
}
