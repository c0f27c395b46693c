/* backend_ops.h - the op-case machinery of tests/test_backend_ops.c: a case, one run of it on
 * a backend (its buffers in the backend's memory and its named outputs), the input builders
 * and the runners (backend_ops_run.c; the model/ operations' in backend_ops_run_model.c), one
 * per family of operations. */
#ifndef DT_TEST_BACKEND_OPS_H
#define DT_TEST_BACKEND_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "ops/backend.h"
#include "testutil.h"

typedef struct op_case op_case;
typedef struct run run;
typedef void (*run_fn)(run *r);

struct op_case {
    const char *op;    /* the dt_backend member */
    run_fn fn;         /* builds the inputs, calls the operation, names the outputs */
    const char *dims;  /* the names of d[] for messages, comma separated */
    int d[6];
    dt_dtype dt;       /* the operand type where the op takes one */
    int flag;          /* the variant: F_* below, meaning per runner */
    double rtol, atol; /* 0 0: bit for bit */
};

enum { F_BIAS = 1, F_ACC = 2, F_CAUSAL = 4, F_INPLACE = 8, F_NODINP = 16, F_NODW = 32, F_MASK = 64, F_SCALE = 128, F_NOY = 256,
       F_NAN = 512, F_EPS6 = 1024, F_DROP = 2048 };

/* One run of a case on one backend: its buffers (the backend's memory) and outputs. */
enum { MAX_BUF = 24, MAX_OUT = 6 };
typedef struct { const char *name; const void *dev; size_t bytes; int elem; double rtol, atol; } out_spec;
struct run {
    const op_case *c;
    const dt_backend *be;
    void *buf[MAX_BUF];
    size_t bytes[MAX_BUF];
    int nbuf;
    out_spec out[MAX_OUT];
    int nout;
    char err[256]; /* a property a query operation broke */
};


/* Input builders and outputs (backend_ops_run.c). */
uint64_t splitmix(uint64_t *s);
void *put(run *r, const void *host, size_t bytes);
float *uni(run *r, size_t n, float scale, float shift, uint64_t seed);
float *val(run *r, size_t n, float v);
uint16_t *uni_lp(run *r, dt_dtype dt, size_t n, float scale, uint64_t seed);
float *bits32(run *r, size_t n, uint64_t seed);
int32_t *ints(run *r, const int32_t *h, size_t n);
void out_t(run *r, const char *name, const void *dev, size_t n, int elem, double rtol, double atol);
void out(run *r, const char *name, const void *dev, size_t n);
void out_exact(run *r, const char *name, const void *dev, size_t n, int elem);
void out_scalar(run *r, const char *name, double v, int exact);

/* The runners: each builds the inputs from the case alone, calls the operation, names the outputs. */
void run_encoder(run *r);
void run_pos(run *r);
void run_layernorm(run *r);
void run_rmsnorm(run *r);
void run_matmul(run *r);
void run_nf4_matmul(run *r);
void run_nf4(run *r);
void run_attention(run *r);
void run_attention_block(run *r);
void run_rope(run *r);
void run_swiglu(run *r);
void run_gelu(run *r);
void run_residual(run *r);
void run_crossentropy(run *r);
void run_exp_sum(run *r);
void run_convert(run *r);
void run_serial(run *r);
void run_query(run *r);
void run_adamw(run *r);
void run_sumsq(run *r);
void run_add_scale(run *r);
/* model/ operations (backend_ops_run_model.c) */
void run_patchify(run *r);
void run_cls_pos(run *r);
void run_ce_blocks(run *r);
void run_lowp_rows(run *r);
void run_lowrank_down(run *r);
void run_lowrank_up(run *r);
void run_fill(run *r);
void run_lowrank_merge(run *r);

#define D(i) (r->c->d[i])
#define FL(f) (r->c->flag & (f))
#define BE (r->be)


#endif
