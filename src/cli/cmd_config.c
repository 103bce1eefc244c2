/*
 * cmd_config.c — `obx config`: the effective relay configuration (defaults, then the file,
 * then the flags, as `obx relay` would use it) printed as JSON, secrets redacted. The output
 * is itself a valid configuration file: `obx config ... > relay.yaml` then
 * `obx relay --config relay.yaml`. Takes the flags of `obx relay`.
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

int cmd_config(int argc, char **argv) {
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},      {"db", required_argument, 0, 'd'},
        {"broker", required_argument, 0, 'b'},      {"http", required_argument, 0, 'h'},
        {"id", required_argument, 0, 'i'},          {"set", required_argument, 0, 's'},
        {"broker-prop", required_argument, 0, 'p'}, {0, 0, 0, 0}};
    const char *file = NULL;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c == 'c') file = optarg;
        if (c == '?')
            return cli_usage("config", "usage: obx config [--config FILE] [--db URL] [--broker "
                                       "URL] [--http ADDR:PORT] [--id ID] [--set KEY=VALUE]... "
                                       "[--broker-prop K=V]...");
    }
    if (optind < argc) return cli_usage("config", "unexpected argument '%s'", argv[optind]);
    obx_config *cfg;
    obx_err e = file ? obx_config_load(file, &cfg) : obx_config_new(&cfg);
    if (e) return cli_fail("config", file ? file : "configuration", e);
    /* flags override the file, in order, exactly as `obx relay` applies them */
    optind = 1;
    while (!e && (c = cli_getopt(argc, argv, "", opts)) != -1) {
        char key[128];
        const char *eq;
        switch (c) {
        case 'd': e = obx_config_set(cfg, "db", optarg); break;
        case 'b': e = obx_config_set(cfg, "broker", optarg); break;
        case 'h': e = obx_config_set(cfg, "http.listen", optarg); break;
        case 'i': e = obx_config_set(cfg, "relay.id", optarg); break;
        case 'p': e = obx_config_set(cfg, "broker_properties", optarg); break;
        case 's':
            eq = strchr(optarg, '=');
            if (!eq || (size_t)(eq - optarg) >= sizeof key) {
                obx_config_free(cfg);
                return cli_usage("config", "--set: expects KEY=VALUE");
            }
            memcpy(key, optarg, (size_t)(eq - optarg));
            key[eq - optarg] = '\0';
            e = obx_config_set(cfg, key, eq + 1);
            break;
        default: break;
        }
    }
    char *js = NULL;
    if (!e) e = obx_config_dump(cfg, &js);
    obx_config_free(cfg);
    if (e) return cli_fail("config", "configuration", e);
    printf("%s\n", js);
    obx_free(js);
    return 0;
}
