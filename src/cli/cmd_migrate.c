/*
 * cmd_migrate.c — `obx migrate` (destination migration and delivery-set targets), `obx shadow`
 * (compare what obx would send with what another dispatcher published) and `obx takeover`
 * (hand event types to a dispatcher alias, or back). Public API only; docs/migration.md.
 *
 * Exit status: 0 done (no refusal, no difference), 1 a refusal, a difference or a failure,
 * 2 a usage error. Nothing is stored on bad input.
 */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* A repeatable option's values (argv strings, not copied). */
typedef struct strv {
    const char *v[256];
    size_t n;
} strv;

/* Adds a comma-separated option value (split in place: argv strings are writable). */
static int push(strv *s, const char *cmd, const char *opt, char *val) {
    for (char *save = NULL, *t = strtok_r(val, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (s->n == sizeof s->v / sizeof s->v[0])
            return cli_usage(cmd, "%s: more than %zu values", opt, sizeof s->v / sizeof s->v[0]);
        s->v[s->n++] = t;
    }
    return 0;
}

static int parse_i64(const char *cmd, const char *opt, const char *v, long long lo, long long hi,
                     long long *out) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi)
        return cli_usage(cmd, "%s: '%s' is not an integer in %lld..%lld", opt, v, lo, hi);
    *out = x;
    return 0;
}

static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* ---- obx migrate ------------------------------------------------------------------------------
 */

/* The new route generation asked for: the type's current route with another cluster/topic (and
 * any route option given). obx_migrate writes it with the events' changes, or not at all. *keep
 * holds the strings rt points into (the caller's, json_decref). */
static int route_first(obx_store *s, const char *type, const obx_route *over, obx_route *rt,
                       json_t **keep) {
    char *js = NULL;
    obx_err e = obx_route_list(s, 0, &js);
    if (e) return cli_fail("migrate", "route list", e);
    json_t *arr = json_loads(js, 0, NULL), *cur = NULL, *r;
    obx_free(js);
    size_t i;
    json_array_foreach(arr, i, r) {
        if (!strcmp(str(r, "event_type"), type)) cur = r;
    }
    if (!cur) {
        json_decref(arr);
        return cli_error("migrate", CLI_EXIT_FINDING, "OBX_ENOROUTE",
                         "--type %s: no route yet (obx route set)", type);
    }
    if (json_integer_value(json_object_get(cur, "targets"))) {
        json_decref(arr);
        return cli_error("migrate", CLI_EXIT_USAGE, "usage",
                         "--cluster/--topic: %s has a delivery set; set its new route with `obx "
                         "route set` (with --also), then migrate with --route-gen",
                         type);
    }
    *rt = (obx_route){
        .event_type = type,
        .cluster = over->cluster,
        .topic = over->topic,
        .routing_key = over->routing_key ? over->routing_key : str(cur, "routing_key"),
        .algorithm = over->algorithm ? over->algorithm : str(cur, "algorithm"),
        .serializer = over->serializer ? over->serializer : str(cur, "serializer"),
        .durability = over->durability ? over->durability : str(cur, "durability"),
        .required_acks = over->required_acks ? over->required_acks : str(cur, "required_acks"),
        .max_attempts = (int)json_integer_value(json_object_get(cur, "max_attempts")),
        .on_unknown = str(cur, "on_unknown"),
        .unordered = json_is_true(json_object_get(cur, "unordered")),
        .alias = str(cur, "alias"),
        .encrypt = str(cur, "encrypt")}; /* a moved route keeps sealing its payloads */
    *keep = arr;
    return 0;
}

/* What became of the new route: written (with its generation), or not. */
static void print_route(json_t *rt, bool dry_run, bool add_target) {
    if (!rt) return;
    const char *type = str(rt, "event_type");
    if (json_is_true(json_object_get(rt, "written")))
        printf("route %s -> %s/%s: generation %lld written; events of %s enqueued from now on "
               "go to %s/%s only%s\n",
               type, str(rt, "cluster"), str(rt, "topic"),
               (long long)json_integer_value(json_object_get(rt, "gen")), type, str(rt, "cluster"),
               str(rt, "topic"),
               add_target ? " (their own destination, not a further target)" : "");
    else
        printf("route %s -> %s/%s: not written (%s)\n", type, str(rt, "cluster"), str(rt, "topic"),
               dry_run ? "dry run" : "no event changed");
}

static void print_migration(json_t *res, bool add_target) {
    size_t i;
    json_t *it;
    json_array_foreach(json_object_get(res, "events"), i, it) {
        const char *out = str(it, "outcome");
        json_t *from = json_object_get(it, "from"), *to = json_object_get(it, "to");
        if (!strcmp(out, "refused")) {
            printf("%s REFUSED: %s\n", str(it, "event_id"), str(it, "reason"));
        } else if (!strcmp(out, "target_added") || !strcmp(out, "would_add_target")) {
            printf("%s %s: target %lld %s/%s (slot %s); proof: %s\n", str(it, "event_id"),
                   !strcmp(out, "target_added") ? "target added" : "would add a target",
                   (long long)json_integer_value(json_object_get(it, "target")), str(to, "cluster"),
                   str(to, "topic"), *str(it, "slot_id") ? str(it, "slot_id") : "-",
                   str(json_object_get(it, "proof"), "kind"));
        } else {
            printf("%s %s: %s/%s (gen %lld) -> %s/%s (gen %lld); proof: %s\n", str(it, "event_id"),
                   !strcmp(out, "migrated") ? "migrated" : "would migrate", str(from, "cluster"),
                   str(from, "topic"),
                   (long long)json_integer_value(json_object_get(from, "envelope_gen")),
                   str(to, "cluster"), str(to, "topic"),
                   (long long)json_integer_value(json_object_get(to, "envelope_gen")),
                   str(json_object_get(it, "proof"), "kind"));
        }
    }
    bool dry = json_is_true(json_object_get(res, "dry_run"));
    json_t *rt = json_object_get(res, "route");
    print_route(rt, dry, add_target);
    long long sel = json_integer_value(json_object_get(res, "selected")),
              ref = json_integer_value(json_object_get(res, "refused"));
    printf("%lld selected, %lld refused%s\n", sel, ref,
           dry          ? " (dry run: nothing changed)"
           : sel == ref ? " (nothing changed)"
                        : "");
}

static const char migrate_usage[] =
    "usage: obx migrate [EVENT_ID...] [--type T] [--from-cluster C] [--from-topic T] "
    "[--state S] [--limit N] [--route-gen G | --cluster C --topic T [--routing-key TPL] "
    "[--algorithm A] [--serializer S] [--durability D] [--acks A]] [--add-target "
    "[--target N] [--completion all|any]] [--who W] [--reason R] [--dry-run] [--json] "
    "[--db URL] [--broker URL] [--broker-prop K=V]...";

/* `obx migrate`'s flags, from parsing to the run (cmd_migrate and its helpers below). */
typedef struct migrate_args {
    const char *db, *broker;
    strv props;              /* --broker-prop, in order */
    obx_migrate_request req; /* the selection and the migration asked for */
    obx_route over;          /* --cluster, --topic, ...: a new route generation for --type */
    int js;
} migrate_args;

/* Options: parses argv into a (0, or the exit code of a usage error). */
static int migrate_options(migrate_args *a, int argc, char **argv) {
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"broker", required_argument, 0, 'b'},
                                         {"broker-prop", required_argument, 0, 'p'},
                                         {"type", required_argument, 0, 'T'},
                                         {"from-cluster", required_argument, 0, 'C'},
                                         {"from-topic", required_argument, 0, 'O'},
                                         {"state", required_argument, 0, 'S'},
                                         {"limit", required_argument, 0, 'L'},
                                         {"route-gen", required_argument, 0, 'g'},
                                         {"cluster", required_argument, 0, 'c'},
                                         {"topic", required_argument, 0, 't'},
                                         {"routing-key", required_argument, 0, 'k'},
                                         {"algorithm", required_argument, 0, 'a'},
                                         {"serializer", required_argument, 0, 's'},
                                         {"durability", required_argument, 0, 'D'},
                                         {"acks", required_argument, 0, 'A'},
                                         {"add-target", no_argument, 0, '+'},
                                         {"target", required_argument, 0, 'n'},
                                         {"completion", required_argument, 0, 'm'},
                                         {"who", required_argument, 0, 'w'},
                                         {"reason", required_argument, 0, 'r'},
                                         {"dry-run", no_argument, 0, 'x'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    obx_migrate_request *req = &a->req;
    obx_route *over = &a->over;
    long long v = 0;
    int c, rc;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'd': a->db = optarg; break;
        case 'b': a->broker = optarg; break;
        case 'p':
            if (a->props.n == sizeof a->props.v / sizeof a->props.v[0])
                return cli_usage("migrate", "--broker-prop: more than %zu",
                                 sizeof a->props.v / sizeof a->props.v[0]);
            a->props.v[a->props.n++] = optarg; /* a property value may hold commas */
            break;
        case 'T': req->event_type = optarg; break;
        case 'C': req->cluster = optarg; break;
        case 'O': req->topic = optarg; break;
        case 'S': req->state = optarg; break;
        case 'L':
            if ((rc = parse_i64("migrate", "--limit", optarg, 1, 100000, &v))) return rc;
            req->limit = (size_t)v;
            break;
        case 'g':
            if ((rc = parse_i64("migrate", "--route-gen", optarg, 1, INT64_MAX, &v))) return rc;
            req->route_gen = v;
            break;
        case 'c': over->cluster = optarg; break;
        case 't': over->topic = optarg; break;
        case 'k': over->routing_key = optarg; break;
        case 'a': over->algorithm = optarg; break;
        case 's': over->serializer = optarg; break;
        case 'D': over->durability = optarg; break;
        case 'A': over->required_acks = optarg; break;
        case '+': req->add_target = 1; break;
        case 'n':
            if ((rc = parse_i64("migrate", "--target", optarg, 1, OBX_SET_MAX, &v))) return rc;
            req->target = (int)v;
            break;
        case 'm': req->completion = optarg; break;
        case 'w': req->who = optarg; break;
        case 'r': req->reason = optarg; break;
        case 'x': req->dry_run = 1; break;
        case 'j': a->js = 1; break;
        default: return cli_usage("migrate", "%s", migrate_usage);
        }
    }
    req->event_ids = (const char *const *)argv + optind;
    req->n_event_ids = (size_t)(argc - optind);
    return 0;
}

/* Validate: a new route needs both --cluster and --topic, --type and no --route-gen; something
 * must select events (0, or the exit code of a usage error). */
static int migrate_validate(const migrate_args *a, bool new_route) {
    const obx_migrate_request *req = &a->req;
    if (new_route && (!a->over.cluster || !a->over.topic))
        return cli_usage("migrate", "--cluster and --topic: both or neither (a new route "
                                    "generation for --type)");
    if (new_route && req->route_gen)
        return cli_usage("migrate", "--route-gen: not together with --cluster/--topic");
    if (new_route && !req->event_type)
        return cli_usage("migrate", "--cluster/--topic: needs --type (the route to set first)");
    if (!req->n_event_ids && !req->event_type && !req->cluster && !req->topic && !req->state)
        return cli_usage("migrate",
                         "no EVENT_ID and no selector (--type, --from-cluster, "
                         "--from-topic, --state)\n%s",
                         migrate_usage);
    return 0;
}

int cmd_migrate(int argc, char **argv) {
    migrate_args a;
    memset(&a, 0, sizeof a);
    a.db = CLI_DEFAULT_DB;
    obx_migrate_request *req = &a.req;
    int rc = migrate_options(&a, argc, argv);
    if (rc) return rc;
    obx_route *over = &a.over;
    bool new_route = over->cluster || over->topic || over->routing_key || over->algorithm ||
                     over->serializer || over->durability || over->required_acks;
    if ((rc = migrate_validate(&a, new_route))) return rc;
    obx_store *s;
    /* a dry run opens the outbox read-only: it cannot write, even by a bug */
    if ((rc = cli_open_store_with("migrate", a.db, req->dry_run ? OBX_STORE_READ_ONLY : 0, "outbox",
                                  &s)))
        return rc;
    obx_route rt;
    json_t *keep = NULL;
    if (new_route) {
        if ((rc = route_first(s, req->event_type, over, &rt, &keep))) {
            obx_store_close(s);
            return rc;
        }
        req->route = &rt;
    }
    /* with IDs, the type only named the route to set: the IDs select */
    if (new_route && req->n_event_ids) req->event_type = NULL;
    char *out = NULL;
    obx_err e = obx_migrate(s, a.broker, a.props.v, a.props.n, req, &out);
    obx_store_close(s);
    json_decref(keep);
    if (!out) return cli_fail("migrate", "rejected, nothing changed", e);
    if (a.js) {
        printf("%s\n", out);
    } else {
        json_t *res = json_loads(out, 0, NULL);
        print_migration(res, req->add_target);
        json_decref(res);
    }
    obx_free(out);
    if (e) return cli_fail("migrate", "refused", e);
    return 0;
}

/* ---- obx shadow --------------------------------------------------------------------------------
 */

int cmd_shadow(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB, *broker = NULL;
    strv props = {0}, aliases = {0}, types = {0}, topics = {0};
    obx_shadow_request req;
    memset(&req, 0, sizeof req);
    int js = 0, rc;
    long long v = 0;
    static const char usage[] =
        "usage: obx shadow [--alias A]... [--type T]... [--topic T]... [--feed FILE] "
        "[--since-ms MS] [--grace-ms MS] [--limit N] [--json] [--db URL] [--broker URL] "
        "[--broker-prop K=V]...";
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"broker", required_argument, 0, 'b'},
                                         {"broker-prop", required_argument, 0, 'p'},
                                         {"alias", required_argument, 0, 'a'},
                                         {"type", required_argument, 0, 'T'},
                                         {"topic", required_argument, 0, 't'},
                                         {"feed", required_argument, 0, 'f'},
                                         {"since-ms", required_argument, 0, 's'},
                                         {"grace-ms", required_argument, 0, 'g'},
                                         {"limit", required_argument, 0, 'L'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'd': db = optarg; break;
        case 'b': broker = optarg; break;
        case 'p':
            if (props.n == sizeof props.v / sizeof props.v[0])
                return cli_usage("shadow", "--broker-prop: more than %zu",
                                 sizeof props.v / sizeof props.v[0]);
            props.v[props.n++] = optarg; /* a property value may hold commas */
            break;
        case 'a':
            if ((rc = push(&aliases, "shadow", "--alias", optarg))) return rc;
            break;
        case 'T':
            if ((rc = push(&types, "shadow", "--type", optarg))) return rc;
            break;
        case 't':
            if ((rc = push(&topics, "shadow", "--topic", optarg))) return rc;
            break;
        case 'f': req.feed_path = optarg; break;
        case 's':
            if ((rc = parse_i64("shadow", "--since-ms", optarg, 0, INT64_MAX, &v))) return rc;
            req.since_ms = v;
            break;
        case 'g':
            if ((rc = parse_i64("shadow", "--grace-ms", optarg, -1, INT64_MAX, &v))) return rc;
            req.grace_ms = v;
            break;
        case 'L':
            if ((rc = parse_i64("shadow", "--limit", optarg, 1, 10000000, &v))) return rc;
            req.limit = (size_t)v;
            break;
        case 'j': js = 1; break;
        default: return cli_usage("shadow", "%s", usage);
        }
    }
    if (optind < argc) return cli_usage("shadow", "unexpected argument '%s'", argv[optind]);
    if (!broker && !req.feed_path) broker = CLI_DEFAULT_BROKER;
    req.aliases = aliases.v;
    req.n_aliases = aliases.n;
    req.event_types = types.v;
    req.n_event_types = types.n;
    req.topics = topics.v;
    req.n_topics = topics.n;
    obx_store *s;
    if ((rc = cli_open_store_ro("shadow", db, &s))) return rc;
    char *out = NULL;
    obx_err e = obx_shadow(s, broker, props.v, props.n, &req, &out);
    obx_store_close(s);
    if (!out) return cli_fail("shadow", "comparison", e);
    if (js) {
        printf("%s\n", out);
    } else {
        json_t *r = json_loads(out, 0, NULL), *d = json_object_get(r, "differences"), *f;
        printf("shadow (claims nothing, sends nothing): %lld slots compared with %lld "
               "publications from %s\n",
               (long long)json_integer_value(json_object_get(r, "compared")),
               (long long)json_integer_value(json_object_get(r, "observed")), str(r, "source"));
        printf("  matched %lld, not due yet %lld, duplicates %lld, outside the scope %lld\n",
               (long long)json_integer_value(json_object_get(r, "matched")),
               (long long)json_integer_value(json_object_get(r, "pending")),
               (long long)json_integer_value(json_object_get(r, "duplicates")),
               (long long)json_integer_value(json_object_get(r, "outside_scope")));
        printf("  differences: missing %lld, destination %lld, partition %lld, payload %lld, "
               "unknown on the broker %lld\n",
               (long long)json_integer_value(json_object_get(d, "missing")),
               (long long)json_integer_value(json_object_get(d, "destination")),
               (long long)json_integer_value(json_object_get(d, "partition")),
               (long long)json_integer_value(json_object_get(d, "payload")),
               (long long)json_integer_value(json_object_get(d, "unknown_on_broker")));
        size_t i;
        json_array_foreach(json_object_get(r, "findings"), i, f) {
            json_t *w = json_object_get(f, "would_send");
            printf("  %-17s %s: %s", str(f, "kind"), str(f, "event_id"), str(f, "why"));
            if (w)
                printf(" [obx: %s/%s partition %lld key '%s']", str(w, "cluster"), str(w, "topic"),
                       (long long)json_integer_value(json_object_get(w, "partition")),
                       str(w, "key"));
            printf("\n");
        }
        json_decref(r);
    }
    obx_free(out);
    if (e == OBX_EFINDINGS) return CLI_EXIT_FINDING;
    return e ? cli_fail("shadow", "comparison", e) : 0;
}

/* ---- obx takeover ------------------------------------------------------------------------------
 */

int cmd_takeover(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB;
    strv types = {0};
    obx_takeover_request req;
    memset(&req, 0, sizeof req);
    int js = 0, rc;
    long long v = 0;
    static const char usage[] =
        "usage: obx takeover --to ALIAS (--type T[,T...]... | --from ALIAS [--percent P]) "
        "[--backlog] [--who W] [--dry-run] [--json] [--db URL]";
    static const struct option opts[] = {
        {"db", required_argument, 0, 'd'},      {"to", required_argument, 0, 't'},
        {"type", required_argument, 0, 'T'},    {"from", required_argument, 0, 'f'},
        {"percent", required_argument, 0, 'P'}, {"backlog", no_argument, 0, 'B'},
        {"who", required_argument, 0, 'w'},     {"dry-run", no_argument, 0, 'x'},
        {"json", no_argument, 0, 'j'},          {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'd': db = optarg; break;
        case 't': req.to_alias = optarg; break;
        case 'T':
            if ((rc = push(&types, "takeover", "--type", optarg))) return rc;
            break;
        case 'f': req.from_alias = optarg; break;
        case 'P':
            if ((rc = parse_i64("takeover", "--percent", optarg, 1, 100, &v))) return rc;
            req.percent = (int)v;
            break;
        case 'B': req.backlog = 1; break;
        case 'w': req.who = optarg; break;
        case 'x': req.dry_run = 1; break;
        case 'j': js = 1; break;
        default: return cli_usage("takeover", "%s", usage);
        }
    }
    if (optind < argc) return cli_usage("takeover", "unexpected argument '%s'", argv[optind]);
    if (!req.to_alias) return cli_usage("takeover", "--to: required\n%s", usage);
    if (!types.n && !req.from_alias)
        return cli_usage("takeover", "--type or --from: one is required\n%s", usage);
    req.event_types = types.v;
    req.n_event_types = types.n;
    obx_store *s;
    /* a dry run opens the outbox read-only: it cannot write, even by a bug */
    if ((rc = cli_open_store_with("takeover", db, req.dry_run ? OBX_STORE_READ_ONLY : 0, "outbox",
                                  &s)))
        return rc;
    char *out = NULL;
    obx_err e = obx_takeover(s, &req, &out);
    obx_store_close(s);
    if (e) return cli_fail("takeover", "nothing changed", e);
    if (js) {
        printf("%s\n", out);
    } else {
        json_t *r = json_loads(out, 0, NULL), *t;
        size_t i;
        json_array_foreach(json_object_get(r, "types"), i, t) {
            printf("%-32s %s -> %s%s (route generation %lld); backlog handed over: %lld\n",
                   str(t, "event_type"), str(t, "from_alias"), str(t, "to_alias"),
                   json_is_true(json_object_get(t, "switched")) ? "" : " (already)",
                   (long long)json_integer_value(json_object_get(t, "route_gen")),
                   (long long)json_integer_value(json_object_get(t, "backlog_moved")));
        }
        printf("%lld types switched to %s%s; events already claimed or sent stay with their "
               "attempts and keep being reconciled\n",
               (long long)json_integer_value(json_object_get(r, "types_switched")),
               str(r, "to_alias"),
               json_is_true(json_object_get(r, "dry_run")) ? " (dry run: nothing changed)" : "");
        json_decref(r);
    }
    obx_free(out);
    return 0;
}
