/*
 * cmd_catalog.c — `obx catalog check`: the topic catalog against the route policy (--db) and
 * the consumers' subscriptions (--consumers FILE, --subscription ID=TOPICS, --consumer-db
 * ID=URL for what a consumer actually consumed). Exit status 1 when there are findings, so it
 * can gate a release in CI.
 */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int cmd_catalog(int argc, char **argv) {
    const char *usage = "usage: obx catalog check --catalog FILE [--db URL] [--consumers FILE] "
                        "[--subscription CONSUMER=TOPIC[,TOPIC...]]... [--consumer-db ID=URL]... "
                        "[--json]";
    if (argc < 2 || strcmp(argv[1], "check")) return cli_usage("catalog", "%s", usage);
    argc--;
    argv++;
    obx_catalog_check_options o = {0};
    const char *db = NULL, *subs[64], *cdbs[64];
    size_t ns = 0, nc = 0;
    int js = 0;
    static const struct option opts[] = {{"catalog", required_argument, 0, 'c'},
                                         {"db", required_argument, 0, 'd'},
                                         {"consumers", required_argument, 0, 'C'},
                                         {"subscription", required_argument, 0, 's'},
                                         {"consumer-db", required_argument, 0, 'D'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'c': o.catalog_path = optarg; break;
        case 'd': db = optarg; break;
        case 'C': o.consumers_path = optarg; break;
        case 's':
            if (ns == 64) return cli_usage("catalog", "at most 64 --subscription");
            subs[ns++] = optarg;
            break;
        case 'D':
            if (nc == 64) return cli_usage("catalog", "at most 64 --consumer-db");
            cdbs[nc++] = optarg;
            break;
        case 'j': js = 1; break;
        default: return cli_usage("catalog", "%s", usage);
        }
    }
    if (optind < argc) return cli_usage("catalog", "unexpected argument '%s'", argv[optind]);
    if (!o.catalog_path) return cli_usage("catalog", "--catalog: required\n%s", usage);
    o.subscriptions = subs;
    o.n_subscriptions = ns;
    o.consumer_dbs = cdbs;
    o.n_consumer_dbs = nc;
    obx_store *s = NULL;
    if (db) {
        int rc = cli_open_store_ro("catalog check", db, &s);
        if (rc) return rc;
        o.routes = s;
    }
    char *out = NULL;
    size_t n = 0;
    obx_err e = obx_catalog_check(&o, &out, &n);
    obx_store_close(s);
    if (e) return cli_fail("catalog check", o.catalog_path, e);
    if (js)
        printf("%s\n", out);
    else {
        json_t *j = json_loads(out, 0, NULL);
        printf("catalog %s: %lld topics, %lld event types; ", o.catalog_path,
               (long long)json_integer_value(json_object_get(j, "topics")),
               (long long)json_integer_value(json_object_get(j, "event_types")));
        if (json_is_integer(json_object_get(j, "routes")))
            printf("%lld routes; ", (long long)json_integer_value(json_object_get(j, "routes")));
        else
            printf("routes not checked (no --db); ");
        printf("%lld consumers\n", (long long)json_integer_value(json_object_get(j, "consumers")));
        size_t i;
        json_t *f;
        json_array_foreach(json_object_get(j, "findings"), i, f) {
            const char *sug = json_string_value(json_object_get(f, "suggestion"));
            json_int_t line = json_integer_value(json_object_get(f, "line"));
            printf("  %-30s %s", json_string_value(json_object_get(f, "kind")),
                   json_string_value(json_object_get(f, "subject")));
            if (line) printf(" (line %lld)", (long long)line);
            printf(": %s", json_string_value(json_object_get(f, "detail")));
            if (sug) printf(" [did you mean '%s'?]", sug);
            printf("\n");
        }
        printf("%zu finding(s)\n", n);
        json_decref(j);
    }
    obx_free(out);
    return n ? 1 : 0;
}
