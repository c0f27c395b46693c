/* dtrain plan: memory, step time, MFU, scaling and cost of a run on hardware from the catalog
 * (src/plan/plan.h, docs/planner.md); --validate compares it with published runs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench/prices.h"
#include "cli/cli.h"
#include "cli/plan_emit.h"
#include "plan/plan.h"
#include "plan/validate.h"

typedef struct plan_flags {
    int help, json, all, gpus, nodes, fit;
    dt_plan_fix fix;
    int dp;
    long global_batch;
    double train_tokens, gemm_eff, intra_eff, inter_eff, tp_overlap;
    const char *hardware, *catalog, *prices, *instance, *validate;
    int sweep[64], n_sweep;
    dt_plan_emit_opts emit;
    unsigned char *used; /* argv entries that were plan's own flags or their values (for --emit) */
} plan_flags;

static int need(dt_ctx *ctx, int argc, char **argv, int i) {
    if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) return 1;
    dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s needs a value", argv[i]);
    return 0;
}

static int number(dt_ctx *ctx, int argc, char **argv, int *i, double lo, double hi, double *out) {
    if (!need(ctx, argc, argv, *i)) return -1;
    char *end;
    double v = strtod(argv[*i + 1], &end);
    if (end == argv[*i + 1] || *end || !(v >= lo && v <= hi)) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s must be a number in [%g, %g] (got '%s')", argv[*i], lo, hi, argv[*i + 1]);
        return -1;
    }
    *out = v;
    ++*i;
    return 1;
}

static int whole(dt_ctx *ctx, int argc, char **argv, int *i, int lo, int *out) {
    double v;
    int r = number(ctx, argc, argv, i, lo, 1 << 20, &v);
    if (r > 0 && v != floor(v)) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s must be a whole number (got '%s')", argv[*i - 1], argv[*i]);
        return -1;
    }
    if (r > 0) *out = (int)v;
    return r;
}

static int text(dt_ctx *ctx, int argc, char **argv, int *i, const char **out) {
    if (!need(ctx, argc, argv, *i)) return -1;
    *out = argv[++*i];
    return 1;
}

static int plan_flag(dt_ctx *ctx, void *ud, int argc, char **argv, int *i) {
    plan_flags *f = ud;
    const char *a = argv[*i];
    double v;
    int r;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return f->help = 1;
    if (!strcmp(a, "--json")) return f->json = 1;
    if (!strcmp(a, "--all")) return f->all = 1;
    if (!strcmp(a, "--fit")) return f->fit = 1;
    if (!strcmp(a, "--gpus")) return whole(ctx, argc, argv, i, 1, &f->gpus);
    if (!strcmp(a, "--nodes")) return whole(ctx, argc, argv, i, 1, &f->nodes);
    if (!strcmp(a, "--tp")) return whole(ctx, argc, argv, i, 1, &f->fix.tp);
    if (!strcmp(a, "--pp")) return whole(ctx, argc, argv, i, 1, &f->fix.pp);
    if (!strcmp(a, "--cp")) return whole(ctx, argc, argv, i, 1, &f->fix.cp);
    if (!strcmp(a, "--ep")) return whole(ctx, argc, argv, i, 1, &f->fix.ep);
    if (!strcmp(a, "--dp")) return whole(ctx, argc, argv, i, 1, &f->dp);
    if (!strcmp(a, "--global-batch")) {
        if ((r = number(ctx, argc, argv, i, 1, 1e12, &v)) > 0) f->global_batch = (long)v;
        return r;
    }
    if (!strcmp(a, "--train-tokens")) return number(ctx, argc, argv, i, 1, 1e18, &f->train_tokens);
    if (!strcmp(a, "--gemm-eff")) return number(ctx, argc, argv, i, 0.01, 1, &f->gemm_eff);
    if (!strcmp(a, "--intra-eff")) return number(ctx, argc, argv, i, 0.01, 1, &f->intra_eff);
    if (!strcmp(a, "--inter-eff")) return number(ctx, argc, argv, i, 0.01, 1, &f->inter_eff);
    if (!strcmp(a, "--tp-overlap")) return number(ctx, argc, argv, i, 0, 1, &f->tp_overlap);
    if (!strcmp(a, "--hardware")) return text(ctx, argc, argv, i, &f->hardware);
    if (!strcmp(a, "--catalog")) return text(ctx, argc, argv, i, &f->catalog);
    if (!strcmp(a, "--prices")) return text(ctx, argc, argv, i, &f->prices);
    if (!strcmp(a, "--instance")) return text(ctx, argc, argv, i, &f->instance);
    if (!strcmp(a, "--validate")) return text(ctx, argc, argv, i, &f->validate);
    if (!strcmp(a, "--strategy")) {
        const char *s;
        if ((r = text(ctx, argc, argv, i, &s)) < 0) return r;
        dt_strategy z;
        int h = 0;
        if (!strcasecmp(s, "hybrid")) z = DT_STRAT_ZERO3, h = 1;
        else if (dt_strategy_parse(ctx, s, &z, &h) != DT_OK) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --strategy %s: unknown (ddp, zero1, zero2, zero3, hybrid)", s);
            return -1;
        }
        f->fix.zero = z, f->fix.hybrid = h;
        return 1;
    }
    if (!strcmp(a, "--sweep")) {
        const char *s;
        if ((r = text(ctx, argc, argv, i, &s)) < 0) return r;
        if (strncmp(s, "gpus=", 5)) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --sweep expects gpus=N1,N2,... (got '%s')", s);
            return -1;
        }
        for (const char *p = s + 5; *p;) {
            char *end;
            long g = strtol(p, &end, 10);
            if (end == p || g < 1 || g > (1 << 20) || (*end && *end != ',') || f->n_sweep == 64) {
                dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --sweep %s: expected up to 64 GPU counts >= 1, comma-separated", s);
                return -1;
            }
            f->sweep[f->n_sweep++] = (int)g;
            p = *end ? end + 1 : end;
        }
        return 1;
    }
    return dt_plan_emit_flag(ctx, &f->emit, argc, argv, i);
}

/* plan_flag, marking what it consumed: the rest goes to the job file's train command. */
static int plan_flag_mark(dt_ctx *ctx, void *ud, int argc, char **argv, int *i) {
    plan_flags *f = ud;
    int start = *i, r = plan_flag(ctx, ud, argc, argv, i);
    if (r > 0)
        for (int k = start; k <= *i; k++) f->used[k] = 1;
    return r;
}

/* Flags that are configuration keys under another name. */
static const char *const renamed[][2] = {
    {"--micro-batch", "--training.micro_batch"},
    {"--precision", "--training.precision"},
    {"--checkpointing", "--memory.activation_checkpointing"},
};

static void usage(void) {
    printf("usage: dtrain plan [CONFIG] [--set KEY=VALUE ...] --gpus N --hardware NAME [flags]\n"
           "       dtrain plan --validate FILE.csv [--fit] [--catalog FILE]\n"
           "       dtrain plan --calibrate FILE [--ranks R] [--nodes M [--hosts LIST]] [--comm-fit F] [bench flags]\n"
           "\n"
           "Predicts memory per device, step time (compute, recompute, exposed communication per\n"
           "collective and link level, pipeline bubble), tokens/s, MFU, scaling efficiency vs one\n"
           "node and cost of a training run, for every layout (strategies x tp x pp) or the one the\n"
           "flags fix, and recommends the fastest and the cheapest layout that fits. Formulas:\n"
           "docs/planner.md. The model and batch come from the config (as for dtrain train).\n"
           "\n"
           "  --gpus N              devices in the job\n"
           "  --hardware NAME       accelerator of the catalog (e.g. h100-sxm)\n"
           "  --catalog FILE        hardware catalog (default configs/hardware.yaml)\n"
           "  --nodes M             spread the devices over M nodes (default: full nodes)\n"
           "  --strategy S          ddp, zero1, zero2, zero3 or hybrid (zero3 sharded inside a node)\n"
           "  --tp T --pp P --cp C --ep E --dp D   fix the layout's degrees (default: enumerate tp, pp)\n"
           "  --micro-batch B --seq T --global-batch G   batch (G in sequences; default micro x accum x N)\n"
           "  --precision fp32|bf16|fp16  --checkpointing none|selective|full\n"
           "  --prices FILE --instance NAME   cost from a price table (configs/prices.yaml), per node\n"
           "  --train-tokens N      whole-run cost (default training.tokens or steps x tokens/step)\n"
           "  --gemm-eff X --intra-eff X --inter-eff X   override the catalog's efficiency factors\n"
           "  --tp-overlap F        fraction of tensor-parallel communication hidden behind GEMMs (0)\n"
           "  --sweep gpus=8,16,32  scaling table: the recommended layout at each size\n"
           "  --all                 print every layout (default: the best 12)\n"
           "  --json                JSON on stdout instead of tables\n"
           "  --emit slurm|mpirun|k8s  write a job file running the fastest fitting layout dtrain runs\n"
           "                        (docs/launch.md, \"Job files\"): an sbatch script, a hostfile launch\n"
           "                        script or a Kubeflow MPIJob; needs checkpoint.dir (--set checkpoint.dir=D)\n"
           "    --emit-out FILE     write it to FILE (default: stdout, and the plan is not printed)\n"
           "    --job-name NAME     job / MPIJob name (default dtrain)\n"
           "    --max-restarts K    the supervisor's restart budget (default 3; k8s: also backoffLimit)\n"
           "    --cpus-per-task C   cores (OpenMP threads) per rank (default 1)\n"
           "    --dtrain PATH       the dtrain binary the job runs (default this one; k8s: dtrain)\n"
           "    slurm: --partition P --account A --time T   #SBATCH values; --signal-time S (120):\n"
           "                        SIGUSR1 S s before the time limit: checkpoint and requeue\n"
           "    mpirun: --hosts a,b,... (one host per node) or --hostfile FILE\n"
           "    k8s: --image IMAGE (dtrain and sshd) --pvc CLAIM (mounted at checkpoint.dir)\n"
           "  --validate FILE       predict each published run of FILE (bench/planner/published_runs.csv)\n"
           "  --fit                 with --validate: fit one GEMM efficiency per GPU type on the rows of\n"
           "                        split fit; report in-sample, held-out and leave-one-source-out errors\n"
           "  --calibrate FILE      measure this machine (dtrain bench on the configuration given, and\n"
           "                        dtrain launch -n R -- bench comm --fit) and write a catalog entry\n"
           "                        cpu-calibrated to FILE; --ranks R (default 2; with 1\n"
           "                        the link is fitted on 2 ranks); the TP link tp-fit is the\n"
           "                        node's all-reduce fit read at the job's activation size, the\n"
           "                        PP link pp-fit its ping-pong's, the EP link ep-fit its all-to-all's\n"
           "    --nodes M           the comm fit runs the R ranks on M nodes (M divides R; simulated\n"
           "                        with --simulate-nodes, or the hosts of --hosts LIST, e.g.\n"
           "                        h1:2,h2:2): inter-node link net-fit from its cross group\n"
           "    --comm-fit F        use the fit F of dtrain bench comm --fit (R ranks on M nodes)\n"
           "    --comm-max-bytes B  the comm fit's largest message, where bandwidths are read (64M)\n"
           "\n"
           "Exit 2 with one line for an unknown accelerator, a layout whose product is not --gpus,\n"
           "tp not dividing the heads, or a model that fits in no layout.\n");
}

static dt_status setup_job(dt_ctx *ctx, const plan_flags *f, const dt_run_cfg *rc, const dt_hw_catalog *cat,
                           dt_plan_job *job) {
    memset(job, 0, sizeof *job);
    const char *fam = rc->train.model.family;
    if (fam[0] && strcmp(fam, "gpt2") && strcmp(fam, "llama"))
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: model.family %s is not planned (gpt2 and llama families)", fam);
    dt_plan_model_from_dtrain(&rc->train.model, rc->train.preset, &job->model);
    job->train = rc->train;
    if (!f->hardware) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --hardware NAME is required (see --help)");
    DT_CHECK(dt_hw_find(ctx, cat, f->hardware, &job->hw));
    job->intra = dt_hw_link_find(cat, job->hw->intra), job->inter = dt_hw_link_find(cat, job->hw->inter);
    job->gemm_eff = f->gemm_eff > 0 ? f->gemm_eff : job->hw->gemm_eff;
    job->intra_eff = f->intra_eff > 0 ? f->intra_eff : job->intra->eff;
    job->inter_eff = f->inter_eff > 0 ? f->inter_eff : job->inter->eff;
    job->tp = dt_hw_tp_link(cat, job->hw); /* --intra-eff covers it: a link inside the node */
    job->tp_eff = job->tp == job->intra ? job->intra_eff : f->intra_eff > 0 ? f->intra_eff : job->tp->eff;
    job->pp = dt_hw_pp_link(cat, job->hw); /* the pipeline's sends inside a node (decision 77) */
    job->pp_eff = job->pp == job->intra ? job->intra_eff : f->intra_eff > 0 ? f->intra_eff : job->pp->eff;
    job->ep = dt_hw_ep_link(cat, job->hw); /* the experts' all-to-alls inside a node (decision 92) */
    job->ep_eff = job->ep == job->intra ? job->intra_eff : f->intra_eff > 0 ? f->intra_eff : job->ep->eff;
    /* the same two across nodes (--inter-eff covers them) */
    job->pp_inter = dt_hw_pp_inter_link(cat, job->hw), job->ep_inter = dt_hw_ep_inter_link(cat, job->hw);
    job->pp_inter_eff = job->pp_inter == job->inter ? job->inter_eff : f->inter_eff > 0 ? f->inter_eff : job->pp_inter->eff;
    job->ep_inter_eff = job->ep_inter == job->inter ? job->inter_eff : f->inter_eff > 0 ? f->inter_eff : job->ep_inter->eff;
    job->tp_overlap = f->tp_overlap;
    if (dt_hw_peak(job->hw, job->train.model_opts.compute) <= 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s has no peak_tflops for training.precision %s in %s",
                       job->hw->key, rc->precision, cat->path);
    job->price_hour = job->spot_hour = -1;
    if (f->prices || f->instance) {
        if (!f->prices || !f->instance)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --prices FILE and --instance NAME go together");
        dt_price_table t;
        DT_CHECK(dt_prices_load(ctx, f->prices, &t));
        for (int i = 0; i < t.n; i++)
            if (!strcmp(t.p[i].name, f->instance)) job->price_hour = t.p[i].on_demand, job->spot_hour = t.p[i].spot;
        dt_prices_free(&t);
        if (job->price_hour < 0)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --instance %s: not in %s", f->instance, f->prices);
    }
    return DT_OK;
}

/* The job at n devices: nodes, devices per node, default global batch, run length. */
static dt_status size_job(dt_ctx *ctx, const plan_flags *f, const dt_run_cfg *rc, dt_plan_job *job, int n) {
    job->gpus = n;
    int per = job->hw->devices_per_node;
    if (f->nodes) {
        if (n % f->nodes || n / f->nodes > per)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --gpus %d on --nodes %d: %s nodes hold %d devices each", n,
                           f->nodes, job->hw->key, per);
        job->dpn = n / f->nodes;
    } else {
        if (n > per && n % per)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --gpus %d is not a whole number of %s nodes (%d devices "
                           "each; --nodes M spreads them)", n, job->hw->key, per);
        job->dpn = n < per ? n : per;
    }
    job->global_batch = f->global_batch ? f->global_batch
                        : rc->global_batch  ? rc->global_batch
                                            : (long)rc->train.micro_batch * rc->train.accum * n;
    double tokens_step = (double)job->global_batch * rc->train.seq_len;
    job->train_tokens = f->train_tokens > 0 ? f->train_tokens
                        : rc->tokens > 0    ? (double)rc->tokens
                        : rc->steps_set     ? (double)rc->train.steps * tokens_step
                                            : 0;
    return DT_OK;
}

static dt_status fits_somewhere(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_result *r, int n) {
    for (int i = 0; i < n; i++)
        if (r[i].fits) return DT_OK;
    int best = 0;
    for (int i = 1; i < n; i++)
        if (r[i].mem_total < r[best].mem_total) best = i;
    char name[64];
    dt_plan_layout_name(&r[best].lay, name, sizeof name);
    return dt_fail(ctx, DT_ERR_CONFIG,
                   "dtrain plan: %s fits in no layout of %d x %s: the smallest (%s) needs %.2f GiB per device, %s has %.2f GiB",
                   job->model.name, job->gpus, job->hw->key, name, r[best].mem_total / 1073741824.0, job->hw->key,
                   job->hw->memory_bytes / 1073741824.0);
}

/* The top of a --json answer: the schema dtrain report reads (docs/FORMATS.md). */
static cJSON *plan_json_root(void) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "schema", "dtrain-plan/1");
    cJSON_AddStringToObject(o, "kind", "plan");
    return o;
}

static dt_status run_plan(dt_ctx *ctx, const plan_flags *f, const dt_run_cfg *rc, dt_plan_job *job, int argc,
                          char **argv) {
    dt_plan_fix fix = f->fix;
    if (f->dp) { /* --dp with the others: the product check names every degree */
        dt_plan_layout l = {f->dp, fix.tp ? fix.tp : 1, fix.pp ? fix.pp : 1, fix.cp ? fix.cp : 1, fix.ep ? fix.ep : 1,
                            DT_STRAT_DDP, 0};
        DT_CHECK(dt_plan_check_layout(ctx, job, &l));
        fix.tp = l.tp, fix.pp = l.pp, fix.cp = l.cp;
    }
    if (fix.tp || fix.pp || fix.cp) { /* an explicit product must divide the devices */
        int mp = (fix.tp ? fix.tp : 1) * (fix.pp ? fix.pp : 1) * (fix.cp ? fix.cp : 1);
        if (job->gpus % mp)
            return dt_fail(ctx, DT_ERR_CONFIG, "--tp %d --pp %d --cp %d: tp x pp x cp = %d does not divide --gpus %d",
                           fix.tp ? fix.tp : 1, fix.pp ? fix.pp : 1, fix.cp ? fix.cp : 1, mp, job->gpus);
        dt_plan_layout l = {job->gpus / mp, fix.tp ? fix.tp : 1, fix.pp ? fix.pp : 1, fix.cp ? fix.cp : 1,
                            fix.ep ? fix.ep : 1, fix.zero >= 0 ? (dt_strategy)fix.zero : DT_STRAT_DDP, 0};
        DT_CHECK(dt_plan_check_layout(ctx, job, &l));
    }
    dt_plan_result *r = NULL;
    int n = 0, fast, cheap;
    DT_CHECK(dt_plan_search(ctx, job, &fix, &r, &n));
    dt_plan_recommend(r, n, &fast, &cheap);
    if (f->emit.kind != DT_EMIT_NONE && !f->emit.out) { /* stdout is the job file */
    } else if (f->json) {
        cJSON *o = plan_json_root(), *arr;
        cJSON_AddItemToObject(o, "job", dt_plan_job_json(job));
        cJSON_AddItemToObject(o, "layouts", arr = cJSON_CreateArray());
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, dt_plan_result_json(job, &r[i]));
        if (fast >= 0) cJSON_AddItemToObject(o, "fastest", dt_plan_result_json(job, &r[fast]));
        else cJSON_AddNullToObject(o, "fastest");
        if (cheap >= 0) cJSON_AddItemToObject(o, "cheapest", dt_plan_result_json(job, &r[cheap]));
        else cJSON_AddNullToObject(o, "cheapest");
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        dt_plan_print_header(stdout, job);
        dt_plan_print_table(stdout, job, r, n, f->all ? 0 : 12);
        if (fast >= 0) dt_plan_print_detail(stdout, job, &r[fast], "fastest layout that fits");
        if (cheap >= 0 && cheap != fast) dt_plan_print_detail(stdout, job, &r[cheap], "cheapest layout that fits");
        else if (cheap >= 0) printf("  (also the cheapest%s)\n", isfinite(r[cheap].usd_1b_tokens) ? "" : ": no --prices given");
        if (fast < 0) dt_plan_print_detail(stdout, job, &r[0], "smallest-step layout (does not fit)");
        if (fast >= 0) dt_plan_print_run(stdout, job, r, n, fast);
    }
    dt_status st = fits_somewhere(ctx, job, r, n);
    if (st == DT_OK && f->emit.kind != DT_EMIT_NONE) {
        fflush(stdout);
        st = dt_plan_emit(ctx, &f->emit, rc, job, r, n, argc, argv, f->used);
    }
    free(r);
    return st;
}

static dt_status run_sweep(dt_ctx *ctx, const plan_flags *f, const dt_run_cfg *rc, dt_plan_job *job) {
    cJSON *arr = f->json ? cJSON_CreateArray() : NULL;
    double base = NAN;
    dt_status st = DT_OK;
    for (int s = 0; s < f->n_sweep && st == DT_OK; s++) {
        if ((st = size_job(ctx, f, rc, job, f->sweep[s])) != DT_OK) break;
        if (s == 0 && !f->json) {
            dt_plan_print_header(stdout, job);
            printf("# scaling: the fastest layout that fits at each size; eff = per-device throughput / the first row's\n");
            printf("# %6s %5s %-30s %8s %9s %10s %8s %5s %6s %6s %10s %10s\n", "gpus", "nodes", "layout", "GiB/dev",
                   "step_s", "tokens/s", "TFLOP/s", "MFU", "eff", "eff1n", "$/1Btok", "$_run");
        }
        dt_plan_result *r = NULL;
        int n = 0, fast, cheap;
        if ((st = dt_plan_search(ctx, job, &f->fix, &r, &n)) != DT_OK) break;
        dt_plan_recommend(r, n, &fast, &cheap);
        if (fast < 0) {
            st = fits_somewhere(ctx, job, r, n);
            free(r);
            break;
        }
        const dt_plan_result *x = &r[fast];
        if (s == 0) base = x->tokens_s / job->gpus;
        double eff = x->tokens_s / job->gpus / base;
        char name[64];
        dt_plan_layout_name(&x->lay, name, sizeof name);
        if (arr) {
            cJSON *o = dt_plan_result_json(job, x);
            cJSON_AddNumberToObject(o, "gpus", job->gpus);
            cJSON_AddNumberToObject(o, "efficiency_vs_first", eff);
            cJSON_AddItemToArray(arr, o);
        } else {
            printf("  %6d %5d %-30s %8.2f %9.4g %10.4g %8.4g %5.3f %6.3f", job->gpus, (job->gpus + job->dpn - 1) / job->dpn,
                   name, x->mem_total / 1073741824.0, x->step_s, x->tokens_s, x->tflops_gpu, x->mfu, eff);
            if (isfinite(x->scaling_eff)) printf(" %6.3f", x->scaling_eff);
            else printf(" %6s", "-");
            if (isfinite(x->usd_1b_tokens)) printf(" %10.4g", x->usd_1b_tokens);
            else printf(" %10s", "-");
            if (isfinite(x->usd_run)) printf(" %10.4g\n", x->usd_run);
            else printf(" %10s\n", "-");
        }
        free(r);
    }
    if (arr) {
        if (st == DT_OK) {
            cJSON *o = plan_json_root();
            cJSON_AddItemToObject(o, "job", dt_plan_job_json(job));
            cJSON_AddItemToObject(o, "sweep", arr);
            char *s = cJSON_Print(o);
            printf("%s\n", s);
            free(s);
            cJSON_Delete(o);
        } else cJSON_Delete(arr);
    }
    return st;
}

int dt_cmd_plan(dt_ctx *ctx, int argc, char **argv) {
    plan_flags f;
    memset(&f, 0, sizeof f);
    f.fix.zero = -1, f.fix.hybrid = -1;
    dt_plan_emit_defaults(&f.emit);
    for (int i = 0; i < argc; i++) /* --calibrate: every other flag is dtrain bench's (it checks them) */
        if (!strcmp(argv[i], "--calibrate")) return dt_cli_exit_code(dt_plan_calibrate(ctx, argc, argv));
    char **av = malloc((size_t)(argc + 1) * sizeof *av);
    f.used = calloc((size_t)argc + 1, 1);
    if (!av || !f.used) {
        free(av);
        free(f.used);
        return DT_EXIT_FAIL;
    }
    for (int i = 0; i < argc; i++) {
        av[i] = argv[i];
        for (size_t k = 0; k < sizeof renamed / sizeof renamed[0]; k++)
            if (!strcmp(argv[i], renamed[k][0])) av[i] = (char *)renamed[k][1];
    }
    dt_run_cfg rc;
    dt_run_cfg_defaults(&rc);
    dt_status st = dt_cli_parse_run(ctx, "plan", argc, av, &rc, plan_flag_mark, &f);
    if (st == DT_OK && !f.help) st = dt_plan_emit_check(ctx, &f.emit);
    if (st == DT_OK && f.emit.kind != DT_EMIT_NONE && (f.validate || f.n_sweep))
        st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit goes with one plan (--gpus N), not %s",
                     f.validate ? "--validate" : "--sweep");
    if (f.help || st != DT_OK) {
        free(av);
        free(f.used);
        if (f.help) usage();
        return f.help ? DT_EXIT_OK : dt_cli_exit_code(st);
    }
    dt_hw_catalog cat;
    const char *catalog = f.catalog ? f.catalog : "configs/hardware.yaml";
    if ((st = dt_hw_load(ctx, catalog, &cat)) != DT_OK) {
        free(av);
        free(f.used);
        return dt_cli_exit_code(st);
    }
    if (f.validate) {
        st = dt_plan_validate(ctx, &cat, f.validate, f.fit, f.json, stdout);
    } else {
        dt_plan_job job;
        if (!f.gpus && !f.n_sweep) st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --gpus N (or --sweep gpus=...) is required");
        if (st == DT_OK) st = setup_job(ctx, &f, &rc, &cat, &job);
        if (st == DT_OK && f.n_sweep) st = run_sweep(ctx, &f, &rc, &job);
        else if (st == DT_OK && (st = size_job(ctx, &f, &rc, &job, f.gpus)) == DT_OK) st = run_plan(ctx, &f, &rc, &job, argc, av);
    }
    dt_hw_free(&cat);
    free(av);
    free(f.used);
    fflush(stdout);
    return dt_cli_exit_code(st);
}
