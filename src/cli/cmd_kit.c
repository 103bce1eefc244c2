/*
 * cmd_kit.c — `obx consumer-test`: runs the consumer test kit (obx_consumer_test_run) on the
 * built-in sample consumer or on a consumer's handler loaded from a shared library, and prints
 * which deliveries it mishandles. Exit status 1 when any scenario fails.
 *
 *   obx consumer-test --builtin order-projection [--types T,..] [--tenants A,..] [--json]
 *     (the sample consumer `obx consume` runs, with the contracts and tenants it declares)
 *   obx consumer-test --handler ./libmyconsumer.so[:SYMBOL] [--types ..] [--tenants ..]
 *
 * A handler library exports `const obx_consumer_test *SYMBOL(void)` (default symbol
 * obx_consumer_test_spec) describing its handler, hooks and samples. --types and --tenants
 * replace what the spec declares, as the consumer's configuration would.
 */
#include "cli.h"

#include <dlfcn.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef const obx_consumer_test *(*spec_fn)(void);

static int split_list(char *s, const char **out, int max) {
    int n = 0;
    for (char *save = NULL, *t = s ? strtok_r(s, ",", &save) : NULL; t && n < max;
         t = strtok_r(NULL, ",", &save))
        out[n++] = t;
    return n;
}

/* Load: the handler library's spec (LIB.so[:SYMBOL]) into *spec, the library's handle in *dl
 * (to dlclose after the run) and its name in what; on failure nothing stays loaded (0, or an
 * exit code). */
static int kit_load_handler(const char *lib, obx_consumer_test *spec, void **dl, char *what,
                            size_t whatcap) {
    char path[512];
    snprintf(path, sizeof path, "%s", lib);
    const char *sym = "obx_consumer_test_spec";
    char *colon = strrchr(path, ':');
    if (colon) {
        *colon = '\0';
        sym = colon + 1;
    }
    /* a path, never a bare name: the loader must not search its library path */
    if (!strchr(path, '/'))
        return cli_usage("consumer-test", "--handler: '%s' is not a path (use ./%s)", path, path);
    *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*dl) /* the argument names no library that loads */
        return cli_error("consumer-test", CLI_EXIT_USAGE, "usage", "--handler: %s", dlerror());
    spec_fn f;
    *(void **)&f = dlsym(*dl, sym);
    const obx_consumer_test *t = f ? f() : NULL;
    if (!t) {
        dlclose(*dl);
        *dl = NULL;
        return cli_error("consumer-test", CLI_EXIT_USAGE, "usage",
                         "--handler: %s: no consumer test spec '%s'", path, sym);
    }
    *spec = *t;
    snprintf(what, whatcap, "%s:%s", path, sym);
    return 0;
}

/* Report (default): the kit's JSON result as one line per scenario, with the fix for each
 * mishandled one. */
static void kit_print(const char *out, const char *what, int bad) {
    json_t *j = json_loads(out, 0, NULL);
    printf("consumer test of %s (consumer %s)\n", what,
           json_string_value(json_object_get(j, "consumer_id")));
    json_t *d = json_object_get(j, "declared");
    printf("  declares contracts: %s; tenants: %s\n\n",
           json_array_size(json_object_get(d, "event_types")) ? "yes" : "NONE (any)",
           json_array_size(json_object_get(d, "tenants")) ? "yes" : "NONE (any)");
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(j, "scenarios"), i, s) {
        printf("  %-15s %-11s %s\n", json_string_value(json_object_get(s, "scenario")),
               json_is_true(json_object_get(s, "ok")) ? "ok" : "MISHANDLED",
               json_string_value(json_object_get(s, "detail")));
        const char *fix = json_string_value(json_object_get(s, "fix"));
        if (fix) printf("  %-15s %-11s fix: %s\n", "", "", fix);
    }
    printf("\n%d scenario(s) mishandled\n", bad);
    json_decref(j);
}

int cmd_consumer_test(int argc, char **argv) {
    const char *builtin = NULL, *lib = NULL;
    char *types_s = NULL, *tenants_s = NULL;
    long max_failures = 0;
    int js = 0;
    static const struct option opts[] = {{"builtin", required_argument, 0, 'b'},
                                         {"handler", required_argument, 0, 'h'},
                                         {"types", required_argument, 0, 'T'},
                                         {"tenants", required_argument, 0, 'n'},
                                         {"max-failures", required_argument, 0, 'm'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    const char *usage = "usage: obx consumer-test --builtin order-projection | --handler "
                        "LIB.so[:SYMBOL] [--types T1,T2|*] [--tenants A,B|*] [--max-failures N] "
                        "[--json]";
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        char *end;
        switch (c) {
        case 'b': builtin = optarg; break;
        case 'h': lib = optarg; break;
        case 'T': types_s = optarg; break;
        case 'n': tenants_s = optarg; break;
        case 'm':
            max_failures = strtol(optarg, &end, 10);
            if (*end || max_failures < 2 || max_failures > 1000)
                return cli_usage("consumer-test", "--max-failures: '%s' is not 2..1000", optarg);
            break;
        case 'j': js = 1; break;
        default: return cli_usage("consumer-test", "%s", usage);
        }
    }
    if (optind < argc || !builtin == !lib) return cli_usage("consumer-test", "%s", usage);
    obx_consumer_test spec;
    projection proj = {0, 1};
    void *dl = NULL;
    char what[600];
    if (builtin) {
        if (strcmp(builtin, "order-projection"))
            return cli_usage("consumer-test", "--builtin: '%s' is not order-projection", builtin);
        /* the sample as `obx consume` runs it: with the contracts and tenants it declares */
        spec = (obx_consumer_test){.consumer_id = "order-projection",
                                   .handler = projection_handler,
                                   .user = &proj,
                                   .event_types = projection_types,
                                   .n_event_types = projection_n_types,
                                   .tenants = projection_tenants,
                                   .n_tenants = projection_n_tenants,
                                   .setup = projection_setup,
                                   .snapshot = projection_snapshot};
        snprintf(what, sizeof what, "builtin order-projection");
    } else {
        int rc = kit_load_handler(lib, &spec, &dl, what, sizeof what);
        if (rc) return rc;
    }
    const char *types[64], *tenants[64];
    /* "*" declares nothing: every contract or tenant gets through the inbox */
    if (types_s) {
        spec.n_event_types = strcmp(types_s, "*") ? (size_t)split_list(types_s, types, 64) : 0;
        spec.event_types = spec.n_event_types ? types : NULL;
    }
    if (tenants_s) {
        spec.n_tenants = strcmp(tenants_s, "*") ? (size_t)split_list(tenants_s, tenants, 64) : 0;
        spec.tenants = spec.n_tenants ? tenants : NULL;
    }
    if (max_failures) spec.max_failures = (int)max_failures;
    char *out = NULL;
    int bad = 0;
    obx_err e = obx_consumer_test_run(&spec, &out, &bad);
    if (e) {
        int rc = cli_fail("consumer-test", what, e);
        if (dl) dlclose(dl);
        return rc;
    }
    if (js)
        printf("%s\n", out);
    else
        kit_print(out, what, bad);
    obx_free(out);
    if (dl) dlclose(dl);
    return bad ? 1 : 0;
}
