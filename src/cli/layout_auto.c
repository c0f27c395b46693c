/* parallel.layout: auto (issue 35 item 1; docs/ARCHITECTURE.md decision 67): rank 0 plans the
 * job with dtrain plan's model on the catalog entry parallel.layout_hardware and every rank
 * takes the fastest fitting layout dtrain can run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"
#include "plan/plan.h"

/* Rank 0's plan: out = {found, tp, strategy, hybrid, global batch, pp}. */
static dt_status plan_here(dt_ctx *ctx, const dt_run_cfg *cfg, int world, int per_node, long out[6]) {
    dt_hw_catalog cat;
    DT_CHECK(dt_hw_load(ctx, cfg->layout_catalog, &cat));
    dt_plan_job job;
    memset(&job, 0, sizeof job);
    dt_status st = dt_hw_find(ctx, &cat, cfg->layout_hardware, &job.hw);
    if (st != DT_OK) { /* the key, not plan's flag */
        const char *why = strstr(ctx->err, ": ");
        char msg[sizeof ctx->err];
        snprintf(msg, sizeof msg, "%s", why ? why + 2 : ctx->err);
        st = dt_fail(ctx, DT_ERR_CONFIG, "parallel.layout_hardware %s: %s", cfg->layout_hardware, msg);
    }
    dt_plan_result *r = NULL;
    int n = 0;
    if (st == DT_OK) {
        dt_model_config mc = cfg->train.model;
        st = dt_model_config_validate(ctx, &mc);
        dt_plan_model_from_dtrain(&mc, cfg->train.preset, &job.model);
        job.train = cfg->train;
        job.intra = dt_hw_link_find(&cat, job.hw->intra), job.inter = dt_hw_link_find(&cat, job.hw->inter);
        job.gemm_eff = job.hw->gemm_eff, job.intra_eff = job.intra->eff, job.inter_eff = job.inter->eff;
        job.tp = dt_hw_tp_link(&cat, job.hw), job.tp_eff = job.tp->eff; /* the TP link (decision 71) */
        job.pp = dt_hw_pp_link(&cat, job.hw), job.pp_eff = job.pp->eff; /* the pipeline's (decision 77) */
        job.ep = dt_hw_ep_link(&cat, job.hw), job.ep_eff = job.ep->eff; /* the experts' all-to-alls (decision 92) */
        job.pp_inter = dt_hw_pp_inter_link(&cat, job.hw), job.pp_inter_eff = job.pp_inter->eff;
        job.ep_inter = dt_hw_ep_inter_link(&cat, job.hw), job.ep_inter_eff = job.ep_inter->eff;
        job.price_hour = job.spot_hour = -1;
        job.gpus = world;
        job.dpn = per_node > 0 && per_node <= world ? per_node : world;
        job.global_batch = cfg->global_batch > 0 ? cfg->global_batch : (long)cfg->train.micro_batch * cfg->train.accum * world;
    }
    /* an explicit parallel.tp, parallel.pp or parallel.strategy stays; context and expert
     * parallelism are the configuration's (1 unless parallel.cp / parallel.ep is given) */
    dt_plan_fix fix = {cfg->tp_set ? cfg->tp : 0, cfg->pp_set ? cfg->pp : 0, cfg->cp > 1 ? cfg->cp : 1, cfg->ep > 1 ? cfg->ep : 1,
                       cfg->strategy_set ? (int)cfg->train.parallel.strategy : -1, cfg->strategy_set ? cfg->train.parallel.hybrid : -1};
    if (st == DT_OK) st = dt_plan_search(ctx, &job, &fix, &r, &n);
    int pick = -1, shown = 0;
    char name[64], line[1024];
    size_t len = 0;
    line[0] = 0;
    for (int i = 0; st == DT_OK && i < n; i++) {
        if (!r[i].fits || !dt_plan_dtrain_runs(&job, &r[i].lay)) continue;
        if (pick < 0) pick = i;
        if (shown++ >= 3) continue;
        dt_plan_layout_name(&r[i].lay, name, sizeof name);
        len += (size_t)snprintf(line + len, len < sizeof line ? sizeof line - len : 0, "%s%d. %s: step %.4g s, %.1f MiB "
                                "per rank", shown > 1 ? "; " : "", shown, name, r[i].step_s, r[i].mem_total / 1048576.0);
    }
    if (st == DT_OK && pick < 0)
        st = dt_fail(ctx, DT_ERR_CONFIG, "parallel.layout auto: no layout dtrain can run fits %d x %s (%s)%s", world,
                     job.hw->key, cfg->layout_catalog, n > 0 ? "; dtrain plan --gpus N lists what would" : "");
    if (st == DT_OK) {
        dt_plan_layout_name(&r[pick].lay, name, sizeof name);
        dt_log_info(ctx, "parallel.layout auto on %d x %s: %s, the fastest fitting layout dtrain can run (plan's top %d: "
                    "%s)", world, job.hw->key, name, shown < 3 ? shown : 3, line);
        out[0] = 1, out[1] = r[pick].lay.tp, out[2] = r[pick].lay.zero, out[3] = r[pick].lay.hybrid;
        out[4] = job.global_batch, out[5] = r[pick].lay.pp;
    }
    free(r);
    dt_hw_free(&cat);
    return st;
}

dt_status dt_cli_layout_auto(dt_ctx *ctx, dt_run_cfg *cfg, dt_comm *comm) {
    if (strcmp(cfg->layout, "auto")) return DT_OK;
    int world = dt_comm_size(comm, DT_GROUP_WORLD), rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    long out[6] = {0};
    dt_status st = rank == 0 ? plan_here(ctx, cfg, world, dt_comm_size(comm, DT_GROUP_NODE), out) : DT_OK;
    /* rank 0's choice (or its failure) for every rank */
    dt_status bst = dt_comm_broadcast(ctx, comm, DT_GROUP_WORLD, out, sizeof out, 0);
    if (st != DT_OK) return st;
    DT_CHECK(bst);
    if (!out[0]) return dt_fail(ctx, DT_ERR_CONFIG, "parallel.layout auto: rank 0 found no layout (see its message)");
    cfg->tp = (int)out[1];
    cfg->pp = (int)out[5];
    cfg->train.parallel.strategy = (dt_strategy)out[2];
    cfg->train.parallel.hybrid = (int)out[3];
    cfg->hybrid = (int)out[3];
    snprintf(cfg->strategy, sizeof cfg->strategy, "%s", dt_strategy_name((dt_strategy)out[2]));
    cfg->global_batch = (int)out[4]; /* the global batch stays; accumulation follows the data-parallel size */
    return DT_OK;
}
