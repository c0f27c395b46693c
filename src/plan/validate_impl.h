/* validate_impl.h - what validate.c (the CSV, the rows, the report) and validate_fit.c (the
 * fit and its scores: in sample, held out, leave one source out) share. Not a public API. */
#ifndef DT_PLAN_VALIDATE_IMPL_H
#define DT_PLAN_VALIDATE_IMPL_H

#include <stddef.h>

#include "plan/plan.h"

#define DT_VAL_MAX_ROWS 512
#define DT_VAL_MAX_SOURCES 128
#define DT_VAL_MAX_FW 32 /* frameworks named in a file */

/* One published run: the job and layout the planner predicts, what the row published. */
typedef struct dt_val_row {
    int line, ok;
    char id[64], model[64], gpu[48], why[DT_ERRMSG_MAX];
    int src;     /* the row's source: index into the sources (the id's prefix before the first '-') */
    int heldout; /* split = heldout: never fitted on */
    int vpp;     /* virtual pipeline stages per pipeline rank (column vpp; 1: none, the 1F1B schedule) */
    int fw;      /* the software that ran it (column framework: an index into the file's names; -1: not stated) */
    int fp8;     /* precision fp8: the linear layers at the fp8 peak */
    dt_plan_job job;
    dt_plan_layout lay;
    double rep_tflops, rep_step, rep_mem;
    const char *rep_from; /* which column gave rep_tflops */
    int hw_flops;         /* the publisher counts the recomputed forward */
    char assumed[200];    /* what the planner assumed where the row says nothing */
    int acc;              /* the catalog accelerator (index) */
    dt_hw_accel hw;       /* its copy (fp8 rows: the fp8 peak stands in for the 16-bit one) */
    dt_plan_result r;
    double pred_tflops;
} dt_val_row;

/* The GEMM efficiencies a fit gives (decision 98): one per accelerator (the catalog's, or fitted
 * on its 16-bit fitting rows), one per accelerator and framework (fitted on that framework's
 * 16-bit fitting rows on it; NaN: none - the accelerator's serves), and the fraction of that
 * 16-bit efficiency fp8 rows reach of the fp8 peak (fitted on the fp8 fitting rows; 1: none). */
typedef struct dt_val_eff {
    int n_acc, n_fw;
    double *acc; /* [n_acc] */
    double *cls; /* [n_acc x n_fw] */
    double fp8;
    int fp8_rows; /* fp8 fitting rows the factor was fitted on */
} dt_val_eff;

/* Allocates (catalog values, no framework fitted, fp8 factor 1); 0 or -1 when out of memory. */
int dt_val_eff_init(dt_val_eff *e, const dt_hw_catalog *cat, int n_fw);
void dt_val_eff_free(dt_val_eff *e);
/* The efficiency row w is predicted with: its framework's on its accelerator if fitted, else
 * the accelerator's; x the fp8 factor on an fp8 row. */
double dt_val_eff_of(const dt_val_eff *e, const dt_val_row *w);

/* The frameworks a file names (column framework), in order of first use. */
typedef struct dt_val_fws {
    int n;
    char name[DT_VAL_MAX_FW][32];
} dt_val_fws;

/* |errors| of TFLOP/s per GPU over a set of rows: count, median, worst (NaN when n = 0). */
typedef struct dt_val_err {
    int n;
    double median, worst;
} dt_val_err;

/* Predicts the row with GEMM efficiency eff (pred_tflops; + the recompute when the publisher counts it). */
void dt_val_predict(dt_val_row *w, double eff);
/* (pred - rep) / rep, NaN without a positive published value. */
double dt_val_rel(double pred, double rep);
/* The flags text of a row; returns 1 when its claim is impossible (beyond the peak), 2 when it
 * cannot fit (or 3). */
int dt_val_flags(const dt_val_row *w, char *buf, size_t n);
/* The row has a published rate and a possible claim: it is scored (and may be fitted). */
int dt_val_scored(const dt_val_row *w);
/* The fit (decision 98), each value on a 0.0025 grid minimising the median |error| of its rows
 * (split fit, leaving out the rows of source skip_src; -1: none): (1) per accelerator, over
 * its 16-bit rows (0.1 to 1; none: the catalog's value, or its same_compute_as twin's fit);
 * (2) per accelerator and framework, over that framework's 16-bit rows on it (none: NaN, or
 * the twin's for an accelerator without fitting rows); (3) the fp8 factor, over every fp8 row
 * predicted at its 16-bit efficiency x the factor (0.1 to 1.5; none: 1). Held-out rows are
 * never read. */
void dt_val_fit(const dt_hw_catalog *cat, dt_val_row *rows, int n, int skip_src, dt_val_eff *e);
/* 1 when type a has no fitting row and takes its same_compute_as twin's fitted efficiency */
int dt_val_twin_fitted(const dt_hw_catalog *cat, const dt_val_row *rows, int n, int a);
/* The errors of the scored rows with heldout == which, predicted with e. */
dt_val_err dt_val_score(dt_val_row *rows, int n, const dt_val_eff *e, int which);
/* Leave one source out: each fitting source's scored rows predicted by a fit on the other
 * fitting sources. *n_src: the sources that had scored rows. */
dt_val_err dt_val_loso(const dt_hw_catalog *cat, dt_val_row *rows, int n, int n_sources, int n_fw, int *n_src);

#endif
