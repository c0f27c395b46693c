#include "bench/bench_json.h"
#include "core/jsonfile.h"
#include "model/lora.h"

#include <errno.h>
#include <math.h>
#ifdef DT_HAVE_MPI
#include <mpi.h> /* only the version macros of the MPI dtrain was built with */
#endif
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops/cpu/isa.h"

void dt_bench_iso_date(char *buf, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        colon += 1 + (colon[1] == ' ');
        colon[strcspn(colon, "\n")] = 0;
        snprintf(buf, n, "%s", colon);
        break;
    }
    fclose(f);
}

cJSON *dt_bench_json_env(int ranks, int nodes, int threads) {
    cJSON *e = cJSON_CreateObject();
    char buf[256];
    if (gethostname(buf, sizeof buf) != 0) snprintf(buf, sizeof buf, "unknown");
    buf[sizeof buf - 1] = 0;
    cJSON_AddStringToObject(e, "host", buf);
    cpu_model(buf, sizeof buf);
    cJSON_AddStringToObject(e, "cpu_model", buf);
    cJSON_AddStringToObject(e, "cpu_flags", dt_isa_cpu_flags());
    cJSON_AddStringToObject(e, "kernel_isa", dt_isa_name(dt_isa_active()));
    cJSON_AddNumberToObject(e, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(e, "threads", threads);
    cJSON_AddNumberToObject(e, "ranks", ranks);
    cJSON_AddNumberToObject(e, "nodes", nodes);
#if defined(OMPI_MAJOR_VERSION)
    snprintf(buf, sizeof buf, "Open MPI %d.%d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#elif defined(DT_HAVE_MPI)
    snprintf(buf, sizeof buf, "MPI %d.%d", MPI_VERSION, MPI_SUBVERSION);
#else
    snprintf(buf, sizeof buf, "none");
#endif
    cJSON_AddStringToObject(e, "mpi", buf);
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, sizeof buf, "%d.%d.%d", v->major, v->minor, v->patch);
    cJSON_AddStringToObject(e, "onednn", buf);
#if defined(__clang__)
    snprintf(buf, sizeof buf, "clang %d.%d.%d", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
    snprintf(buf, sizeof buf, "gcc %d.%d.%d", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
    snprintf(buf, sizeof buf, "unknown");
#endif
    cJSON_AddStringToObject(e, "compiler", buf);
    return e;
}

/* A value as dt_cfg_print writes it: "quoted" string, true/false, number, or a bare word. */
static cJSON *config_value(const char *v) {
    size_t len = strlen(v);
    if (len >= 2 && v[0] == '"' && v[len - 1] == '"') {
        char *s = malloc(len);
        size_t j = 0;
        if (!s) return cJSON_CreateNull();
        for (size_t i = 1; i + 1 < len; i++) {
            if (v[i] == '\\' && i + 2 < len) i++;
            s[j++] = v[i];
        }
        s[j] = 0;
        cJSON *r = cJSON_CreateString(s);
        free(s);
        return r;
    }
    if (!strcmp(v, "true") || !strcmp(v, "false")) return cJSON_CreateBool(v[0] == 't');
    char *end;
    double d = strtod(v, &end);
    if (end != v && !*end) return cJSON_CreateNumber(d);
    return cJSON_CreateString(v);
}

cJSON *dt_bench_json_config(const dt_run_cfg *cfg) {
    cJSON *o = cJSON_CreateObject();
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return o;
    dt_cfg_print(f, cfg); /* the YAML of `dtrain config show`: "section:" then "  key: value" */
    fclose(f);
    char section[64] = "";
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] != ' ') {
            snprintf(section, sizeof section, "%.*s", (int)strcspn(line, ":"), line);
            continue;
        }
        char *k = line + strspn(line, " "), *colon = strstr(k, ": ");
        if (!colon) continue;
        *colon = 0;
        char key[160];
        snprintf(key, sizeof key, "%s.%s", section, k);
        cJSON_AddItemToObject(o, key, config_value(colon + 2));
    }
    free(text);
    return o;
}

static cJSON *stats_json(const dt_stats *s, double scale) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "mean", s->mean * scale);
    cJSON_AddNumberToObject(o, "std", s->std * scale);
    cJSON_AddNumberToObject(o, "min", s->min * scale);
    cJSON_AddNumberToObject(o, "median", s->median * scale);
    cJSON_AddNumberToObject(o, "max", s->max * scale);
    return o;
}

static void add_hash(cJSON *o, const char *key, unsigned long long h) {
    char buf[20];
    snprintf(buf, sizeof buf, "%016llx", h);
    cJSON_AddStringToObject(o, key, buf);
}

cJSON *dt_bench_json_train(const dt_bench_suite *s, const dt_run_cfg *rc, int argc, char **argv,
                           const char *peak_source, int threads) {
    const dt_train_cfg *c = &rc->train;
    const dt_bench_opts *op = &s->opts;
    cJSON *o = cJSON_CreateObject();
    char buf[64];
    cJSON_AddStringToObject(o, "schema", DT_BENCH_SCHEMA);
    cJSON_AddStringToObject(o, "kind", "train");
    cJSON *av = cJSON_AddArrayToObject(o, "argv");
    for (int i = 0; i < argc; i++) cJSON_AddItemToArray(av, cJSON_CreateString(argv[i]));
    dt_bench_iso_date(buf, sizeof buf);
    cJSON_AddStringToObject(o, "date", buf);
    cJSON_AddStringToObject(o, "dtrain_version", DT_VERSION);
    cJSON *env = dt_bench_json_env(s->world, s->nodes, threads);
    cJSON_AddNumberToObject(env, "machine_ranks", s->machine_ranks); /* who share the cores (decision 95) */
    cJSON_AddItemToObject(o, "environment", env);
    cJSON_AddItemToObject(o, "config", dt_bench_json_config(rc));

    cJSON *m = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(m, "preset", c->preset[0] ? c->preset : "custom");
    cJSON_AddNumberToObject(m, "n_layer", c->model.n_layer);
    cJSON_AddNumberToObject(m, "d_model", c->model.d_model);
    cJSON_AddNumberToObject(m, "n_head", c->model.n_head);
    cJSON_AddNumberToObject(m, "vocab", c->model.vocab);
    cJSON_AddNumberToObject(m, "seq_len", c->seq_len);
    cJSON_AddNumberToObject(m, "params", (double)s->n_params);
    /* what the optimizer updates and the gradients carry: the adapters under LoRA */
    cJSON_AddNumberToObject(m, "trainable_params", (double)s->n_trainable);
    if (c->model_opts.lora.rank > 0) {
        char tg[64];
        dt_lora_targets_str(c->model_opts.lora.targets, tg, sizeof tg);
        cJSON *l = cJSON_AddObjectToObject(m, "lora");
        cJSON_AddNumberToObject(l, "rank", c->model_opts.lora.rank);
        cJSON_AddNumberToObject(l, "alpha", c->model_opts.lora.alpha > 0.0f ? c->model_opts.lora.alpha
                                                                            : (float)c->model_opts.lora.rank);
        cJSON_AddStringToObject(l, "targets", tg);
        cJSON_AddStringToObject(l, "base_dtype", c->model_opts.lora.nf4 ? "nf4" : "fp32");
    }

    cJSON *p = cJSON_AddObjectToObject(o, "parallel");
    cJSON_AddNumberToObject(p, "world", s->world);
    cJSON_AddNumberToObject(p, "tp", s->tp);
    cJSON_AddNumberToObject(p, "dp", s->dp);
    if (s->pp.n > 1) cJSON_AddNumberToObject(p, "pp", s->pp.n);
    cJSON_AddStringToObject(p, "strategy", dt_strategy_name(c->parallel.strategy));
    cJSON_AddBoolToObject(p, "hybrid", c->parallel.hybrid);
    cJSON_AddNumberToObject(p, "bucket_bytes", (double)c->parallel.bucket_bytes);
    cJSON_AddBoolToObject(p, "overlap", c->parallel.overlap);
    cJSON_AddNumberToObject(p, "micro_batch", c->micro_batch);
    cJSON_AddNumberToObject(p, "accum", c->accum);
    cJSON_AddNumberToObject(p, "global_batch", (double)s->samples_step);
    cJSON_AddBoolToObject(p, "fixed_global_batch", rc->global_batch > 0);

    if (op->peak_gflops > 0) cJSON_AddNumberToObject(o, "peak_gflops", op->peak_gflops);
    else cJSON_AddNullToObject(o, "peak_gflops");
    cJSON_AddStringToObject(o, "peak_source", peak_source);
    cJSON_AddNumberToObject(o, "flops_per_token", s->flops_per_token);
    cJSON_AddStringToObject(o, "mfu_formula",
                            "mfu = flops_per_token * tokens_per_s_rank / (peak_gflops * 1e9); flops_per_token = "
                            "6*N + 12*L*T*d, N = non-embedding params + lm_head (V*d) (PaLM, no causal halving)");
    cJSON_AddNumberToObject(o, "warmup", op->warmup);
    cJSON_AddNumberToObject(o, "steps", op->steps);
    cJSON_AddNumberToObject(o, "repeats", op->repeats);

    cJSON *runs = cJSON_AddArrayToObject(o, "runs");
    double *lv = malloc((size_t)op->steps * sizeof *lv);
    for (int i = 0; i < op->repeats; i++) {
        const dt_bench_result *r = &s->runs[i];
        cJSON *ro = cJSON_CreateObject();
        cJSON_AddItemToObject(ro, "step_s", cJSON_CreateDoubleArray(r->step_s, op->steps));
        for (int j = 0; lv && j < op->steps; j++) lv[j] = (double)r->loss[j];
        cJSON_AddItemToObject(ro, "loss", lv ? cJSON_CreateDoubleArray(lv, op->steps) : cJSON_CreateArray());
        add_hash(ro, "loss_hash", r->loss_hash);
        cJSON_AddNumberToObject(ro, "mean_step_s", r->mean_s);
        cJSON_AddItemToArray(runs, ro);
    }
    free(lv);

    cJSON *su = cJSON_AddObjectToObject(o, "summary");
    cJSON_AddItemToObject(su, "step_s", stats_json(&s->step_s, 1));
    cJSON_AddItemToObject(su, "run_mean_step_s", stats_json(&s->run_mean_s, 1));
    cJSON_AddItemToObject(su, "samples_per_s", stats_json(&s->samples_per_s, 1));
    cJSON_AddItemToObject(su, "samples_per_s_rank", stats_json(&s->samples_per_s, 1.0 / s->world));
    cJSON_AddItemToObject(su, "tokens_per_s", stats_json(&s->tokens_per_s, 1));
    cJSON_AddItemToObject(su, "tokens_per_s_rank", stats_json(&s->tokens_per_s_rank, 1));
    cJSON_AddItemToObject(su, "tflops_rank", stats_json(&s->tflops_rank, 1));
    if (op->peak_gflops > 0 && !(s->mfu_over_gflops > 0)) cJSON_AddItemToObject(su, "mfu", stats_json(&s->mfu, 1));
    else cJSON_AddNullToObject(su, "mfu");
    if (s->mfu_over_gflops > 0) {
        char why[200];
        snprintf(why, sizeof why, "a step ran at %.6g GFLOP/s per rank, above the peak %.6g", s->mfu_over_gflops,
                 op->peak_gflops);
        cJSON_AddStringToObject(su, "mfu_unknown", why);
    }
    cJSON_AddNumberToObject(su, "comm_total_s", s->comm_total_s);
    cJSON_AddNumberToObject(su, "comm_exposed_s", s->comm_exposed_s);
    cJSON_AddNumberToObject(su, "comm_overhead", s->step_s.mean > 0 ? s->comm_exposed_s / s->step_s.mean : 0);
    cJSON_AddNumberToObject(su, "comm_exposed_min_s", s->comm_exposed_min_s);
    cJSON_AddNumberToObject(su, "comm_bytes_step", s->comm_bytes_step);
    cJSON_AddNumberToObject(su, "tp_comm_s", s->tp_s);
    cJSON_AddNumberToObject(su, "tp_bytes_step", s->tp_bytes_step);
    cJSON_AddNumberToObject(su, "cp_comm_s", s->cp_s);
    cJSON_AddNumberToObject(su, "cp_bytes_step", s->cp_bytes_step);
    cJSON_AddNumberToObject(su, "ep_comm_s", s->ep_s);
    cJSON_AddNumberToObject(su, "ep_bytes_step", s->ep_bytes_step);
    if (s->comm_predicted_s >= 0) cJSON_AddNumberToObject(su, "comm_predicted_s", s->comm_predicted_s);
    cJSON *bd = cJSON_AddObjectToObject(su, "breakdown_s");
    cJSON_AddNumberToObject(bd, "forward", s->bd_forward);
    cJSON_AddNumberToObject(bd, "backward", s->bd_backward);
    cJSON_AddNumberToObject(bd, "optimizer", s->bd_optimizer);
    cJSON_AddNumberToObject(bd, "communication", s->bd_comm);
    cJSON_AddNumberToObject(bd, "data", s->bd_data);
    cJSON_AddNumberToObject(bd, "idle", s->bd_idle);
    cJSON_AddNumberToObject(su, "loss_avg", s->loss_avg);
    cJSON_AddNumberToObject(su, "loss_final", s->loss_final);
    add_hash(su, "loss_hash", s->loss_hash);
    cJSON_AddBoolToObject(su, "loss_hash_match", s->hash_mismatch == 0);

    cJSON *mem = cJSON_AddArrayToObject(o, "memory");
    for (int r = 0; r < s->world; r++) {
        cJSON *mo = cJSON_CreateObject();
        cJSON_AddNumberToObject(mo, "rank", r);
        for (int k = 0; k < DT_BENCH_MEM_N; k++)
            cJSON_AddNumberToObject(mo, dt_bench_mem_names[k], (double)s->mem[(size_t)r * DT_BENCH_MEM_N + k]);
        cJSON_AddItemToArray(mem, mo);
    }
    cJSON *rk = cJSON_AddArrayToObject(o, "ranks");
    for (int r = 0; s->compute_ms && r < s->world; r++) {
        cJSON *ro = cJSON_CreateObject();
        cJSON_AddNumberToObject(ro, "rank", r);
        cJSON_AddNumberToObject(ro, "compute_ms", s->compute_ms[r]);
        if (s->exposed_ms) cJSON_AddNumberToObject(ro, "exposed_ms", s->exposed_ms[r]);
        if (s->attn_ms) cJSON_AddNumberToObject(ro, "attention_ms", s->attn_ms[r]);
        if (s->cp_wait_ms) cJSON_AddNumberToObject(ro, "cp_wait_ms", s->cp_wait_ms[r]);
        cJSON_AddItemToArray(rk, ro);
    }
    if (s->pp.n > 1 && s->pp.rank) cJSON_AddItemToObject(o, "pipeline", dt_bench_pp_json(s));
    if (s->moe_load) { /* a mixture of experts (decision 86) */
        cJSON *me = cJSON_AddObjectToObject(o, "moe");
        cJSON *ld = cJSON_AddArrayToObject(me, "load");
        for (int l = 0; l < s->moe_layers; l++)
            cJSON_AddItemToArray(ld, cJSON_CreateDoubleArray(s->moe_load + (size_t)l * s->moe_experts, s->moe_experts));
        cJSON_AddNumberToObject(me, "load_max_mean", s->moe_max_mean);
        cJSON_AddNumberToObject(me, "dropped", s->moe_dropped);
        cJSON_AddNumberToObject(me, "aux_loss", s->moe_aux);
        cJSON_AddNumberToObject(me, "z_loss", s->moe_z);
    }
    cJSON_AddArrayToObject(o, "cost");
    return o;
}

dt_status dt_bench_json_write(dt_ctx *ctx, const char *path, const cJSON *obj) { return dt_json_write(ctx, path, obj); }

dt_status dt_bench_json_read(dt_ctx *ctx, const char *path, cJSON **out) { return dt_json_read(ctx, path, out); }

/* ---- CSV */

static const char *const csv_cols[] = {
    "id", "kind", "preset", "world", "nodes", "strategy", "micro_batch", "accum", "global_batch", "bucket_bytes",
    "steps", "repeats", "step_ms_mean", "step_ms_std", "step_ms_min", "step_ms_median", "step_ms_max",
    "samples_per_s", "tokens_per_s", "tokens_per_s_rank", "tflops_rank", "mfu", "comm_total_ms",
    "comm_exposed_ms", "comm_overhead", "weak_efficiency", "strong_efficiency", "mem_total_max_bytes",
    "rss_max_bytes", "loss_final", "loss_hash", "loss_hash_match"};

void dt_bench_csv_header(FILE *f) {
    for (size_t i = 0; i < sizeof csv_cols / sizeof csv_cols[0]; i++) fprintf(f, "%s%s", i ? "," : "", csv_cols[i]);
    fputc('\n', f);
}

static const cJSON *at(const cJSON *o, const char *a, const char *b, const char *c) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (x && b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    if (x && c) x = cJSON_GetObjectItemCaseSensitive(x, c);
    return x;
}

static void csv_num(FILE *f, const cJSON *x, double scale) {
    if (cJSON_IsNumber(x)) fprintf(f, ",%.9g", x->valuedouble * scale);
    else if (cJSON_IsBool(x)) fprintf(f, ",%s", cJSON_IsTrue(x) ? "true" : "false");
    else fputc(',', f);
}

static void csv_str(FILE *f, const cJSON *x) {
    fputc(',', f);
    if (!cJSON_IsString(x)) return;
    fputc('"', f);
    for (const char *s = x->valuestring; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

void dt_bench_csv_row(FILE *f, const cJSON *o) {
    const cJSON *id = at(o, "sweep", "id", NULL), *pt = at(o, "sweep", "point_id", NULL);
    fprintf(f, "\"%s%s%s\"", cJSON_IsString(id) ? id->valuestring : "run", cJSON_IsString(pt) ? "/" : "",
            cJSON_IsString(pt) ? pt->valuestring : "");
    csv_str(f, at(o, "kind", NULL, NULL));
    csv_str(f, at(o, "model", "preset", NULL));
    csv_num(f, at(o, "parallel", "world", NULL), 1);
    csv_num(f, at(o, "environment", "nodes", NULL), 1);
    csv_str(f, at(o, "parallel", "strategy", NULL));
    csv_num(f, at(o, "parallel", "micro_batch", NULL), 1);
    csv_num(f, at(o, "parallel", "accum", NULL), 1);
    csv_num(f, at(o, "parallel", "global_batch", NULL), 1);
    csv_num(f, at(o, "parallel", "bucket_bytes", NULL), 1);
    csv_num(f, at(o, "steps", NULL, NULL), 1);
    csv_num(f, at(o, "repeats", NULL, NULL), 1);
    static const char *const st[] = {"mean", "std", "min", "median", "max"};
    for (int i = 0; i < 5; i++) csv_num(f, at(o, "summary", "step_s", st[i]), 1e3);
    csv_num(f, at(o, "summary", "samples_per_s", "mean"), 1);
    csv_num(f, at(o, "summary", "tokens_per_s", "mean"), 1);
    csv_num(f, at(o, "summary", "tokens_per_s_rank", "mean"), 1);
    csv_num(f, at(o, "summary", "tflops_rank", "mean"), 1);
    csv_num(f, at(o, "summary", "mfu", "mean"), 1);
    csv_num(f, at(o, "summary", "comm_total_s", NULL), 1e3);
    csv_num(f, at(o, "summary", "comm_exposed_s", NULL), 1e3);
    csv_num(f, at(o, "summary", "comm_overhead", NULL), 1);
    csv_num(f, at(o, "sweep", "weak_efficiency", NULL), 1);
    csv_num(f, at(o, "sweep", "strong_efficiency", NULL), 1);
    double mt = -1, rss = -1;
    const cJSON *r;
    cJSON_ArrayForEach(r, at(o, "memory", NULL, NULL)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "total"), *s = cJSON_GetObjectItemCaseSensitive(r, "rss");
        if (cJSON_IsNumber(t) && t->valuedouble > mt) mt = t->valuedouble;
        if (cJSON_IsNumber(s) && s->valuedouble > rss) rss = s->valuedouble;
    }
    if (mt >= 0) fprintf(f, ",%.0f", mt);
    else fputc(',', f);
    if (rss >= 0) fprintf(f, ",%.0f", rss);
    else fputc(',', f);
    csv_num(f, at(o, "summary", "loss_final", NULL), 1);
    csv_str(f, at(o, "summary", "loss_hash", NULL));
    csv_num(f, at(o, "summary", "loss_hash_match", NULL), 1);
    fputc('\n', f);
}
