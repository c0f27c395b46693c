/* dtrain report: benchmark result files (bench --json) -> one self-contained HTML page with
 * charts, tables and recommendations (src/report/report.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "report/report.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain report RESULT.json... [-o report.html] [--mem-budget SIZE]\n"
            "\n"
            "Reads benchmark results (one JSON object per file, schema dtrain-bench/1, written by\n"
            "dtrain bench --json and dtrain bench comm --json; schema dtrain-plan/1, written by\n"
            "dtrain plan --json) and writes one self-contained HTML\n"
            "page: throughput and scaling efficiency vs world size, step-time breakdown, memory per\n"
            "rank by kind, loss curves, busbw vs message size, a table per run, plans beside the\n"
            "measured runs they describe (step time and memory, planned vs measured), cost and\n"
            "environment, and recommendations (DDP vs ZeRO stage, bucket size, micro-batch vs\n"
            "accumulation, loss-hash cross-check) with the numbers behind each. Tensor-parallel runs\n"
            "get their layout (tp x dp, sequence parallelism, ZeRO stage) and TP collectives (bytes and\n"
            "exposed time per step, share of the step) in a table of their own; a mixture of experts gets\n"
            "its expert load as a heat map (layers x experts, tokens over the layer's mean).\n"
            "  -o, --output FILE   the page to write (default report.html)\n"
            "  --mem-budget SIZE   memory a rank may use (e.g. 16GiB, 512MiB, bytes): decides between\n"
            "                      DDP and ZeRO stages and caps the micro-batch (default: unknown)\n"
            "\n"
            "example: dtrain report results/*.json -o report.html\n"
            "exit codes: 0 written, 1 cannot write the page, 2 usage error or a bad input file\n"
            "(the error names the file and the key)\n");
}

/* "16GiB", "512MiB", "1.5G", "1000000" -> bytes; -1 if malformed. */
static double parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0)) return -1;
    static const struct {
        const char *suffix;
        double mul;
    } units[] = {{"", 1},          {"B", 1},          {"K", 1024},       {"KB", 1e3},  {"KiB", 1024},
                 {"M", 1048576},   {"MB", 1e6},       {"MiB", 1048576},  {"G", 1073741824.0},
                 {"GB", 1e9},      {"GiB", 1073741824.0}, {"T", 1099511627776.0}, {"TB", 1e12},
                 {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcasecmp(end, units[i].suffix) && (!strcmp(end, units[i].suffix) || strlen(end) <= 1))
            return v * units[i].mul;
    return -1;
}

int dt_cmd_report(dt_ctx *ctx, int argc, char **argv) {
    const char *out = "report.html";
    double budget = 0;
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    int nfiles = 0, rc = DT_EXIT_OK;
    dt_report *r = NULL;
    if (!files) {
        dt_fail(ctx, DT_ERR_NOMEM, "dtrain report: out of memory");
        return DT_EXIT_FAIL;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            goto done;
        }
        const char *val = NULL;
        int is_out = !strcmp(a, "-o") || !strcmp(a, "--output"), is_mem = !strcmp(a, "--mem-budget");
        if (!strncmp(a, "--output=", 9)) is_out = 1, val = a + 9;
        if (!strncmp(a, "--mem-budget=", 13)) is_mem = 1, val = a + 13;
        if (is_out || is_mem) {
            if (!val) {
                if (i + 1 >= argc) {
                    dt_fail(ctx, DT_ERR_CONFIG, "dtrain report: %s needs a value", a);
                    rc = DT_EXIT_USAGE;
                    goto done;
                }
                val = argv[++i];
            }
            if (is_out) out = val;
            if (is_mem && (budget = parse_size(val)) < 0) {
                dt_fail(ctx, DT_ERR_CONFIG, "dtrain report: --mem-budget expects a size such as 16GiB, got '%s'", val);
                rc = DT_EXIT_USAGE;
                goto done;
            }
            continue;
        }
        if (a[0] == '-' && a[1]) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain report: unknown flag '%s' (see dtrain report --help)", a);
            rc = DT_EXIT_USAGE;
            goto done;
        }
        files[nfiles++] = a;
    }
    if (nfiles == 0) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain report: no result files (usage: dtrain report RESULT.json... -o report.html)");
        rc = DT_EXIT_USAGE;
        goto done;
    }
    /* a file that cannot be read or parsed is bad input: exit 2, naming the file and key */
    if (dt_report_load(ctx, files, nfiles, &r) != DT_OK) {
        rc = DT_EXIT_USAGE;
        goto done;
    }
    dt_report_analyze(r, budget);
    if (dt_report_write_html(ctx, r, out) != DT_OK) {
        rc = DT_EXIT_FAIL;
        goto done;
    }
    printf("dtrain report: wrote %s (%d training run(s), %d collective benchmark(s), %d plan(s))\n", out, r->ntrain,
           r->ncomm, r->nplan);
    static const char *const lv[] = {"recommend", "info", "warning", "no data"};
    for (int i = 0; i < r->nrec; i++) printf("  [%s] %s\n", lv[r->rec[i].level], r->rec[i].text);
done:
    dt_report_free(r);
    free(files);
    return rc;
}
