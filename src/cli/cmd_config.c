/* dtrain config show: the resolved configuration (file + flags + presets + derived values),
 * printed as YAML that dtrain reads back. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static int config_flag(dt_ctx *ctx, void *ud, int argc, char **argv, int *i) {
    (void)ctx, (void)argc;
    if (strcmp(argv[*i], "--help") == 0 || strcmp(argv[*i], "-h") == 0) return *(int *)ud = 1;
    return 0;
}

int dt_cmd_config(dt_ctx *ctx, int argc, char **argv) {
    if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        printf("usage: dtrain config show [CONFIG.yaml] [--set KEY=VALUE ...]\n"
               "       dtrain config keys\n\n"
               "show prints the resolved configuration (file, then flags, presets and derived values)\n"
               "as YAML that dtrain reads back; keys lists every key with its default.\n");
        return DT_EXIT_OK;
    }
    if (argc < 1 || (strcmp(argv[0], "show") != 0 && strcmp(argv[0], "keys") != 0)) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain config: expected 'show' or 'keys'%s%s%s (see dtrain config --help)",
                argc ? ", got '" : "", argc ? argv[0] : "", argc ? "'" : "");
        return DT_EXIT_USAGE;
    }
    if (strcmp(argv[0], "keys") == 0) {
        dt_cfg_print_keys(stdout);
        return DT_EXIT_OK;
    }
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    int help = 0;
    dt_status st = dt_cli_parse_run(ctx, "config show", argc - 1, argv + 1, &cfg, config_flag, &help);
    if (help) {
        printf("usage: dtrain config show [CONFIG.yaml] [--set KEY=VALUE ...]\n\n");
        dt_cli_print_config_help();
        return DT_EXIT_OK;
    }
    if (st != DT_OK) return dt_cli_exit_code(st);
    dt_cfg_print(stdout, &cfg);
    return DT_EXIT_OK;
}
