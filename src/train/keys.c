#include "train/keys.h"
#include "train/keys_layout.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/comm_fit.h"
#include "model/lora.h"
#include "model/rope.h"
#include "parallel/mesh.h"

/* K_FLOAT_AUTO: a float that may also be "auto", stored as -1. K_INTS: a list of integers
 * (dt_cfg_ints), "2,3" or "[2, 3]" in text, a sequence in YAML. */
typedef enum key_type { K_INT, K_LONG, K_U64, K_FLOAT, K_FLOAT_AUTO, K_BOOL, K_STR, K_ENUM, K_SCHED, K_ROPE, K_INTS } key_type;

typedef struct key_def {
    const char *key;
    key_type type;
    size_t off;        /* offset in dt_run_cfg */
    size_t size;       /* K_STR / K_ENUM: buffer size */
    const char *enums; /* K_ENUM: "a|b|c" */
    const char *help;
} key_def;

#define OFF(field) offsetof(dt_run_cfg, field)
#define SZ(field) sizeof(((dt_run_cfg *)0)->field)
#define STR(key, field, help) {key, K_STR, OFF(field), SZ(field), NULL, help}
#define ENUM(key, field, vals, help) {key, K_ENUM, OFF(field), SZ(field), vals, help}
#define NUM(key, type, field, help) {key, type, OFF(field), 0, NULL, help}
static const key_def keys[] = {
    STR("model.preset", train.preset, "preset the model.* keys start from, of any family ('' = custom; the list: dtrain train --help)"),
    STR("model.family", train.model.family, "model family of a custom model (gpt2, llama; a preset sets it)"),
    NUM("model.n_layer", K_INT, train.model.n_layer, "transformer blocks"),
    NUM("model.d_model", K_INT, train.model.d_model, "embedding width"),
    NUM("model.n_head", K_INT, train.model.n_head, "attention heads (must divide d_model)"),
    NUM("model.n_kv_head", K_INT, train.model.n_kv_head, "key/value heads dividing n_head (llama grouped-query attention, 1 = MQA; 0 = n_head)"),
    NUM("model.d_ff", K_INT, train.model.d_ff, "MLP width (llama SwiGLU intermediate size; gpt2: 4 d_model; 0 = family default)"),
    NUM("model.vocab_size", K_INT, train.model.vocab, "vocabulary size (padded to 128 internally)"),
    NUM("model.context", K_INT, train.model.context, "maximum sequence length (gpt2, vit: <= the preset's; llama: any)"),
    NUM("model.untied_embeddings", K_BOOL, train.model.untied, "the lm_head has its own weights (llama); false: tied to the token embedding"),
    NUM("model.rope_theta", K_FLOAT, train.model.rope_theta, "rotary embedding base (llama; 0 = 10000)"),
    NUM("model.norm_eps", K_FLOAT, train.model.norm_eps, "epsilon of the norms (0 = family default 1e-5)"),
    {"model.rope_scaling", K_ROPE, OFF(train.model.rope_scaling), 0, "none|linear|llama3|yarn",
     "llama: RoPE frequency rule of Hugging Face's rope_scaling (dynamic is refused: an inference-time rule)"},
    NUM("model.rope_factor", K_FLOAT, train.model.rope_factor, "llama: RoPE scaling factor, >= 1 (linear, llama3, yarn)"),
    NUM("model.rope_low_freq_factor", K_FLOAT, train.model.rope_low_freq_factor, "llama: llama3 scaling's low_freq_factor (Llama 3.1: 1)"),
    NUM("model.rope_high_freq_factor", K_FLOAT, train.model.rope_high_freq_factor, "llama: llama3 scaling's high_freq_factor, > low_freq_factor (Llama 3.1: 4)"),
    NUM("model.rope_original_context", K_INT, train.model.rope_original_context, "llama: the context before RoPE scaling, original_max_position_embeddings (llama3, yarn)"),
    NUM("model.rope_beta_fast", K_FLOAT, train.model.rope_beta_fast, "llama: yarn's beta_fast (0 = 32)"),
    NUM("model.rope_beta_slow", K_FLOAT, train.model.rope_beta_slow, "llama: yarn's beta_slow, < beta_fast (0 = 1)"),
    NUM("model.rope_attention_factor", K_FLOAT, train.model.rope_attention_factor, "llama: yarn's scale of cos and sin (0 = 0.1 ln(factor) + 1)"),
    NUM("model.image_size", K_INT, train.model.image_size, "vit: image side in pixels"),
    NUM("model.patch_size", K_INT, train.model.patch_size, "vit: patch side in pixels (divides image_size)"),
    NUM("model.channels", K_INT, train.model.channels, "vit: colour planes (0 = 1)"),
    NUM("model.n_classes", K_INT, train.model.n_classes, "vit: classes of the classification head"),
    NUM("model.n_experts", K_INT, train.model.n_experts, "llama: experts per layer, a mixture of experts (Mixtral's sparse MoE MLP, <= 16; 0 = a dense MLP)"),
    NUM("model.experts_topk", K_INT, train.model.experts_topk, "llama: experts each token is routed to, in [1, n_experts] (their weights renormalised over these)"),
    NUM("model.expert_d_ff", K_INT, train.model.expert_d_ff, "llama: each expert's SwiGLU width (0 = model.d_ff)"),
    STR("model.init_from", init_from, "start from these weights: a dtrain model file or checkpoint, a Hugging Face directory (config.json + safetensors), or an llm.c gpt2_*.bin ('' = random init)"),
    STR("data.train", data_train, "training tokens: shard file, glob or comma list ('' = synthetic)"),
    STR("data.ledger", ledger, "test aid: append each step's consumed sample ids to FILE.rank<r>, r the data-parallel rank (under tensor parallelism the first rank of each TP group writes it) ('' = off)"),
    STR("data.val", data_val, "validation tokens: shard file, glob or comma list ('' = none)"),
    ENUM("data.format", data_format, "auto|llmc|raw16|idx", "shard format (auto: llm.c header if present; idx: IDX images + labels)"),
    NUM("data.shuffle", K_BOOL, data_shuffle, "shuffle samples each epoch (seeded)"),
    ENUM("data.tokenizer", tokenizer, "byte|gpt2|hf", "tokenizer the data was prepared with (recorded in checkpoints)"),
    NUM("training.micro_batch", K_INT, train.micro_batch, "sequences per micro-step (per rank)"),
    NUM("training.seq_len", K_INT, train.seq_len, "tokens per sequence (<= model.context)"),
    NUM("training.grad_accum", K_INT, train.accum, "micro-steps per optimizer step"),
    NUM("training.batch", K_INT, global_batch, "global batch in sequences: sets grad_accum = batch / (micro_batch x ranks) (0 = use grad_accum)"),
    NUM("training.steps", K_LONG, train.steps, "optimizer steps"),
    NUM("training.tokens", K_LONG, tokens, "train this many tokens instead of training.steps (0 = use steps)"),
    NUM("training.seed", K_U64, train.seed, "seed of init, shuffling and synthetic data"),
    ENUM("training.nonfinite", nonfinite, "stop|skip", "a step whose loss or gradient norm is NaN/Inf on any rank: stop naming the step, or skip its update (counted, in metrics)"),
    NUM("training.spike_factor", K_FLOAT, spike_factor, "warn (log + metrics) when a step's loss exceeds this x the median of the previous 20 steps' (before 20 steps: this x ln(vocab), uniform guessing's loss); a run whose last 20 losses end above this x ln(vocab) fails as diverged (0 = off)"),
    NUM("training.spike_rollback", K_INT, spike_rollback, "on a loss spike, go back to the newest checkpoint and skip the batches since, up to this many times (0 = off; needs checkpoint.dir and data.train)"),
    NUM("training.eval_interval", K_INT, eval_interval, "steps between validation passes (0 = off)"),
    NUM("training.eval_batches", K_INT, eval_batches, "micro-batches per validation pass (0 = every complete batch)"),
    ENUM("training.precision", precision, "fp32|bf16|fp16", "matmul operands in 16 bits with fp32 results (master weights, optimizer, gradients, norms, softmax, loss stay fp32); fp16 adds dynamic loss scaling"),
    NUM("training.loss_scale", K_FLOAT_AUTO, loss_scale, "loss scale: auto (fp16: dynamic from 65536, halved on overflow, doubled after loss_scale_window finite steps; otherwise off) or a static number"),
    NUM("training.loss_scale_window", K_LONG, train.loss_scale_window, "finite steps in a row before a dynamic loss scale doubles"),
    NUM("training.moe_aux_loss_coef", K_FLOAT, train.moe_aux_coef, "mixture of experts: coefficient of the load-balancing loss added to the loss (training.moe_aux_loss_type says which; logged apart as moe_aux_loss)"),
    ENUM("training.moe_aux_loss_type", moe_aux_type, "global|layer", "mixture of experts: the load-balancing loss - global: Hugging Face Mixtral's load_balancing_loss_func, E sum_e f_e P_e over every layer's router rows pooled (balanced: k); layer: Megatron-Core's aux_loss, E / (k T^2) sum_e c_e P_e of each layer's T rows (c_e its choices of expert e, P_e the sum of its probabilities), summed over the layers (balanced: 1 a layer), which balances each layer's own experts"),
    NUM("training.moe_z_loss_coef", K_FLOAT, train.moe_z_coef, "mixture of experts: coefficient of the router z-loss added to the loss (mean over all layers' router rows of logsumexp(logits)^2; logged apart as moe_z_loss)"),
    ENUM("memory.activation_checkpointing", recompute, "none|selective|full", "drop activations after each layer's forward and recompute them in its backward: selective keeps the MLP's input projection output and one of the attention's two matmul outputs (gpt2, vit: q|k|v; llama: the attention block's output) and recomputes the norms, the attention, the other attention matmul and the MLP activation (under bf16/fp16 gpt2 and vit keep the attention's outputs instead of recomputing the attention, and gpt2 recomputes the MLP's input projection, vit q|k|v; llama keeps gate|up alone), full keeps only the layer input; gradients are bitwise those of none"),
    NUM("memory.activation_checkpointing_every", K_INT, train.model_opts.recompute_every, "recompute only layers l with l % k == 0 (1 = every layer)"),
    NUM("memory.fused_loss", K_BOOL, train.model_opts.fused_loss, "run the lm_head and the loss 256 token rows at a time, forming their gradients in the forward, so the micro-batch's logits are never stored (DDP and ZeRO-1; ZeRO-2/3 store them); the same bits either way"),
    NUM("memory.fused_loss_rows", K_INT, train.model_opts.head_rows, "token rows per block of the lm_head and loss (0 = 256): the fused loss's logits memory, and the blocks every strategy uses, so all compute the same bits"),
    NUM("lora.rank", K_INT, train.model_opts.lora.rank, "LoRA: rank of the adapters on a frozen base (0 = off: full training); only the adapters train, communicate and are checkpointed"),
    NUM("lora.alpha", K_FLOAT, train.model_opts.lora.alpha, "LoRA: the adapters' output is scaled by alpha / rank (0 = rank: scale 1)"),
    NUM("lora.dropout", K_FLOAT, train.model_opts.lora.dropout, "LoRA: dropout probability on the adapters' input, [0, 1)"),
    STR("lora.targets", lora_targets, "LoRA: projections to adapt, comma list of q,k,v,o,gate,up,down,w1,w2,w3 (llama: each its own projection; a mixture of experts: w1, w2, w3 = every expert's gate, down, up, each expert its own adapters, no gate/up/down, the router frozen; gpt2: q,k,v are the thirds of attn.c_attn, o attn.c_proj, up mlp.c_fc, down mlp.c_proj, no gate)"),
    ENUM("lora.base_dtype", lora_base, "fp32|nf4", "LoRA: the frozen base's layer matmul weights in fp32, or 4-bit NormalFloat with double-quantized scales (QLoRA; embeddings, norms and lm_head stay fp32)"),
    NUM("optimizer.lr", K_FLOAT, train.sched.lr, "peak learning rate"),
    NUM("optimizer.beta1", K_FLOAT, train.adamw.beta1, "AdamW beta1"),
    NUM("optimizer.beta2", K_FLOAT, train.adamw.beta2, "AdamW beta2"),
    NUM("optimizer.eps", K_FLOAT, train.adamw.eps, "AdamW epsilon"),
    NUM("optimizer.weight_decay", K_FLOAT, train.adamw.weight_decay, "decoupled weight decay (2-D weights only)"),
    NUM("optimizer.grad_clip", K_FLOAT, train.clip, "global grad-norm clip (0 = off)"),
    {"schedule.kind", K_SCHED, OFF(train.sched.kind), 0, "constant|cosine|linear", "learning-rate schedule"},
    NUM("schedule.warmup", K_LONG, train.sched.warmup, "linear warm-up steps"),
    NUM("schedule.decay_steps", K_LONG, train.sched.total, "step where decay reaches min_lr (default training.steps)"),
    NUM("schedule.min_lr", K_FLOAT, train.sched.min_lr, "final learning rate"),
    NUM("logging.every", K_INT, log_every, "log a line every N steps"),
    STR("logging.metrics", metrics, "JSONL metrics file, one object per logged step (auto = checkpoint.dir/metrics.jsonl, none without checkpoint.dir; '' = none)"),
    ENUM("logging.progress", progress, "auto|bar|lines", "live status line (bar), plain lines, or bar on a terminal"),
    STR("logging.prometheus", prometheus, "Prometheus node-exporter textfile (FILE.prom) rank 0 rewrites atomically with every rank's metrics ('' = off)"),
    NUM("logging.prometheus_every", K_INT, prometheus_every, "steps between rewrites of logging.prometheus (and at the end)"),
    NUM("logging.straggler_every", K_INT, straggler_every, "steps between comparisons of the ranks' compute time per step (0 = off)"),
    NUM("logging.straggler_factor", K_FLOAT, straggler_factor, "a rank computing slower than this x the median of the others is named (log, metrics)"),
    STR("logging.trace", trace, "Chrome-trace JSON of every rank's steps, layers, communication and checkpoints ('' = off)"),
    NUM("logging.peak_gflops", K_FLOAT, peak_gflops, "matmul peak that MFU is relative to (0 = measure at start)"),
    STR("checkpoint.dir", ckpt_dir, "directory of checkpoints ('' = no checkpoints)"),
    NUM("checkpoint.every", K_LONG, ckpt_every, "steps between checkpoints (0 = at the end only)"),
    NUM("checkpoint.every_minutes", K_FLOAT, ckpt_minutes, "also checkpoint once this many minutes passed since the last one (0 = off)"),
    NUM("checkpoint.keep_last", K_INT, ckpt_keep, "committed checkpoints to keep, newest first (0 = all)"),
    NUM("checkpoint.async", K_BOOL, ckpt_async, "write checkpoints on a background thread: a step pays only for a copy"),
    NUM("checkpoint.max_failures", K_INT, ckpt_max_failures, "consecutive failed saves (disk full, I/O error) before training stops"),
    STR("checkpoint.resume", resume, "resume from: latest (checkpoint.dir's newest intact step), auto (same, or start fresh if none), a directory, or '' (no)"),
    NUM("fault.collective_timeout", K_FLOAT_AUTO, coll_timeout, "seconds a collective may block before the watchdog names the ranks holding it up and aborts (0 = off; auto = 300 s for the first 10 steps, then 10 x the slowest collective, at least 25 s)"),
    NUM("fault.preempt_grace", K_FLOAT, preempt_grace, "seconds between SIGTERM/SIGUSR1 and the clean exit, checkpoint included (warned about if exceeded)"),
    NUM("parallel.moe_capacity_factor", K_FLOAT, train.moe_capacity, "mixture of experts: each expert takes at most ceil(f x micro-batch tokens x experts_topk / n_experts) choices per micro-batch, dropping those of the lowest routing weight first (ties: the higher token index); dropped choices are logged (0 = dropless)"),
    STR("parallel.strategy", strategy, "ddp|zero1|zero2|zero3, or FSDP's no_shard|shard_grad_op|full_shard|hybrid_shard"),
    NUM("parallel.hybrid", K_BOOL, hybrid, "ZeRO: shard inside each node, replicate across nodes"),
    NUM("parallel.bucket_mb", K_FLOAT_AUTO, bucket_mb, "gradient bucket size in MiB; auto: from parallel.comm_model, the smallest bucket whose all-reduce latency is <= 10% of its time, within [1, 64] MiB"),
    STR("parallel.comm_model", comm_model, "a cost model from `dtrain bench comm --fit FILE` (alpha-beta per collective, group and size range): predicts each collective, sizes parallel.bucket_mb: auto and chooses parallel.allreduce: auto"),
    NUM("parallel.overlap", K_BOOL, overlap, "all-reduce buckets during backward (else after it)"),
    NUM("parallel.shared_memory", K_BOOL, shm, "ranks of one node reduce and gather through a shared-memory segment instead of MPI (the same bits; env DTRAIN_SHM=0 keeps the segment from being made at all)"),
    ENUM("parallel.allreduce", allreduce, "auto|flat|hierarchical", "the world's gradient all-reduce with several nodes: hierarchical = shared memory inside each node, one copy of each part down a chain of the nodes and back (the same bits as flat); auto = hierarchical where the layout allows (equal nodes of 2+ consecutive ranks), or flat if parallel.comm_model was fitted on this ranks x nodes layout and predicts flat faster for a bucket"),
    ENUM("parallel.grad_dtype", grad_dtype, "fp32|bf16|fp16", "what gradient reductions send (the casting compression; with parallel.compression=topk, its values): bf16 or fp16 halve the bytes (each rank's contribution rounded to 16 bits, summed in fp32 in rank order by its owner, the sum rounded to 16 bits: every strategy gives the same bits; accumulation, optimizer and weights stay fp32; one rank sends and rounds nothing); fp16 keeps 3 more mantissa bits but overflows above 65504 (such a step is non-finite: skipped under loss scaling, else stopped)"),
    ENUM("parallel.compression", compression, "none|topk", "topk: each bucket sends only its largest parallel.compression_ratio of elements (per block of 65536) as (index, value) pairs, values in parallel.grad_dtype, all-gathered and summed in rank order; what was not sent is kept per rank (error feedback, saved in checkpoints) and added to the next step's gradients; ddp and zero1 only"),
    NUM("parallel.compression_ratio", K_FLOAT, compression_ratio, "the part of each block of gradients Top-K sends, in (0, 1]"),
    ENUM("parallel.compression_adam", compression_adam, "age|plain", "Top-K with parallel.compression_ratio < 1: how AdamW takes the sparse, delayed sums (age: an element whose sum arrives after a steps takes it as a steps of its mean gradient - moments advanced by a steps, a steps of movement at once - and otherwise waits, its age kept per element in the optimizer state and checkpoints; plain: the sums as ordinary gradients, the elements that received nothing decaying their moments, one step of movement per burst)"),
    ENUM("parallel.zero_reduce", zero_reduce, "auto|step|micro", "zero2/zero3: when gradients are reduce-scattered - step: each rank accumulates its full gradient over the step's micro-batches (DDP's scheme, a gradient buffer of the rank's parameters kept between steps) and reduce-scatters each unit once, in the last micro-step's backward (the bits of ddp and zero1); micro: every unit at every micro-step into the fp32 shard (no full gradient buffer); auto: step with parallel.pp > 1 or with parallel.ep > 1 and grad_accum > 1, micro otherwise"),
    ENUM("parallel.zero3_gather", zero3_gather, "auto|step|use", "zero3: when parameters are all-gathered - step: each unit once per step into a resident copy of the rank's parameters (and their 16-bit copy under bf16/fp16), read without communication until the update; use: at every use into one of two unit windows (each forward and backward of each micro-batch); the same bits; auto: step with parallel.pp > 1 when the trainer's memory plan with the resident copy fits this rank's share of the host's physical memory (total / ranks on the node), use otherwise"),
    NUM("parallel.compression_warmup", K_LONG, compression_warmup, "Top-K: the first N steps are reduced uncompressed (Deep Gradient Compression's warm-up: the early, fast-changing gradients are not delayed by the residual); the bits are those of parallel.compression=none for those steps"),
    NUM("parallel.tp", K_INT, tp, "tensor-parallel degree: ranks that split each layer's matmuls (Megatron's column- and row-parallel layers, the vocabulary-parallel embedding and loss; consecutive ranks, inside a node); gpt2, llama and vit, with ddp, zero1-3, hybrid sharding and Top-K compression over the data-parallel ranks"),
    STR("parallel.layout", layout, "auto: rank 0 plans the job on parallel.layout_hardware (dtrain plan's model, docs/planner.md) and every rank runs the fastest fitting layout dtrain can run (strategy, hybrid, tp, pp; parallel.cp as given), logging the plan's top 3; an explicit parallel.tp, parallel.pp or parallel.strategy keeps its value; '' = the keys as given"),
    STR("parallel.layout_hardware", layout_hardware, "parallel.layout auto: the catalog entry of this machine's devices (a calibrated one from dtrain plan --calibrate, or cpu-core)"),
    STR("parallel.layout_catalog", layout_catalog, "parallel.layout auto: the hardware catalog file"),
    NUM("parallel.sequence_parallel", K_BOOL, sp, "with parallel.tp > 1: the residual stream and the norms hold each TP rank's share of the token rows (Megatron's sequence parallelism: gathered before each column-parallel GEMM, reduce-scattered after each row-parallel one; the norms' weight gradients summed over the group); gpt2, llama and vit, in every precision, with activation checkpointing"),
    NUM("parallel.tp_blocks", K_BOOL, tp_blocks, "test mode: one process holds all parallel.tp shards and runs exactly the arithmetic of tp ranks (each shard's GEMMs alone, partial sums added in shard order), so its results are bitwise those of a tp-rank run"),
    NUM("parallel.cp", K_INT, cp, "context-parallel degree: ranks that split each sequence (next to tp in rank order): rank r holds chunks r and 2 cp - 1 - r of its 2 cp chunks (the causal work balanced), the attention runs around the CP ring (ring attention: keys and values travel, their gradients come back), the gradients are summed over data- and context-parallel ranks; llama and gpt2, with ddp and zero1-3, tensor and pipeline parallelism, bf16/fp16, activation checkpointing; training.seq_len a multiple of 2 cp"),
    ENUM("parallel.cp_comm", cp_comm, "p2p|all_gather", "context parallelism's exchange: p2p = the ring (each block sent on to the next rank while the current one is computed; two blocks of memory), all_gather = every rank's keys and values gathered once and the gradient shares sent home by one all-to-all (cp blocks of memory, nothing overlapped); the same bits"),
    ENUM("parallel.cp_split", cp_split, "balanced|contiguous", "context parallelism's chunks: balanced = rank r holds chunks r and 2 cp - 1 - r (every rank the same causal work), contiguous = the r-th cp-th of each sequence (the last rank does most of the attention: kept for comparison)"),
    NUM("parallel.pp", K_INT, pp, "pipeline-parallel degree: stages of consecutive layers (slowest in rank order), cut by their cost (the embedding on the first stage and the head and loss on the last counted; or parallel.pp_layers); gpt2, llama and vit (a head tied to the embedding: the last stage holds a copy), ddp or zero1-3 over each stage's data-parallel ranks, with tensor parallelism, bf16/fp16, activation checkpointing and LoRA/QLoRA; a step's micro-batches are training.grad_accum; checkpoints resume onto any pp"),
    ENUM("parallel.pp_schedule", pp_schedule, "1f1b|gpipe|interleaved|zb-h1", "with parallel.pp > 1: the order of a stage's forward and backward passes (1f1b: pp - stage - 1 forwards, then one forward one backward, then the backwards: at most pp micro-batches' activations on stage 0; gpipe: every forward, then every backward: training.grad_accum micro-batches' activations); interleaved: parallel.pp_virtual chunks per stage, virtual stage c pp + s on stage s (Megatron's interleaving; pp x pp_virtual divides model.n_layer); every schedule runs each stage's backwards in micro-batch order, so a pipeline accumulates gradients as one rank does (bitwise; the gradient norm and a tied head's sums as parallel.pp_blocks); zb-h1: 1f1b with each backward split into its input-gradient pass and its matmuls' weight-gradient pass, deferred to fill the cool-down, at 1f1b's activation memory (Qi et al.'s ZB-H1; with tensor and sequence parallelism each shard's weight GEMMs, with LoRA/QLoRA the adapters' gradients, with experts the experts' GEMMs, whose douts and gathered inputs take blocks of B T k rows beside; under activation checkpointing the recomputed layers' weight gradients stay in the input-gradient pass)"),
    NUM("parallel.pp_virtual", K_INT, pp_virtual, "with parallel.pp_schedule=interleaved: chunks (virtual stages) per stage, >= 2"),
    NUM("parallel.pp_blocks", K_BOOL, pp_blocks, "test mode: with parallel.pp > 1, one process (no pipeline ranks) runs exactly the arithmetic of the pp stages - the gradient norm summed stage by stage, a head tied to the embedding accumulating its two gradients apart and adding them once per step - so a pipeline's results are bitwise its own (ddp)"),
    NUM("parallel.pp_layers", K_INTS, pp_layers, "layers per pipeline stage, one count >= 1 per parallel.pp stage summing to model.n_layer ([2, 3] in YAML, 2,3 in --set); [] = the cost rule: the split whose most expensive stage is cheapest, counting each stage's layers, the embedding on the first and the final norm, head and loss on the last in training FLOPs (ties: the most even counts, then fewer layers on the last stage, then on the earlier ones)"),
    NUM("parallel.ep", K_INT, ep, "expert-parallel degree, dividing the data-parallel size and model.n_experts: ep consecutive data-parallel ranks split each layer's experts (n_experts / ep each), tokens sent to their experts' ranks by all-to-all; bitwise ep = 1's results: with ddp in any training.precision and parallel.grad_dtype, with parallel.pp (each stage's EP group) or parallel.tp (each TP rank's EP group, its shards of the experts); with zero1-3 (not hybrid; ZeRO shards the experts over the dp / ep ranks holding them) with fp32 gradients and neither tp nor pp; not with Top-K compression (decisions 85, 87, 88, 89, 91)"),
    NUM("parallel.check_replicas", K_INT, check_replicas, "every N steps and at the end compare a hash of every rank's parameters; stop naming the ranks that differ (0 = off)"),
    NUM("runtime.threads", K_INT, threads, "OpenMP threads (0 = OMP_NUM_THREADS or all cores)"),
};
#undef OFF
#undef SZ
#undef STR
#undef ENUM
#undef NUM
#define NKEYS (sizeof keys / sizeof keys[0])

int dt_restart_attempt(void) {
    const char *v = getenv("DTRAIN_RESTART");
    return v ? atoi(v) : -1;
}

dt_status dt_cfg_check_resume(dt_ctx *ctx, const dt_run_cfg *c) {
    /* A supervised restart (dtrain launch --max-restarts adds --resume auto) of a run without
     * checkpoints trains again from step 0 (dt_train_run says so); anywhere else this is a
     * mistake. */
    int supervised_restart = dt_restart_attempt() > 0 && !strcmp(c->resume, "auto");
    if (c->resume[0] && !c->ckpt_dir[0] && !supervised_restart &&
        (!strcmp(c->resume, "latest") || !strcmp(c->resume, "auto")))
        return dt_fail(ctx, DT_ERR_CONFIG, "checkpoint.resume (--resume) '%s' needs checkpoint.dir (or give the "
                       "directory: --resume DIR)", c->resume);
    return DT_OK;
}

void dt_run_cfg_defaults(dt_run_cfg *c) {
    memset(c, 0, sizeof *c);
    dt_train_cfg_defaults(&c->train);
    strcpy(c->data_format, "auto");
    c->data_shuffle = 1;
    strcpy(c->tokenizer, "byte");
    strcpy(c->nonfinite, "stop");
    strcpy(c->recompute, "none");
    strcpy(c->precision, "fp32");
    strcpy(c->cp_split, "balanced");
    strcpy(c->moe_aux_type, "global");
    strcpy(c->cp_comm, "p2p");
    strcpy(c->lora_targets, "q,v");
    strcpy(c->lora_base, "fp32");
    c->eval_batches = 20;
    c->log_every = 1;
    c->prometheus_every = 10;
    c->straggler_every = 50;
    c->straggler_factor = 1.5f;
    c->spike_factor = 3.0f;
    strcpy(c->metrics, "auto");
    strcpy(c->progress, "auto");
    strcpy(c->strategy, "ddp");
    c->bucket_mb = 4.0f;
    c->overlap = 1;
    strcpy(c->grad_dtype, "fp32");
    strcpy(c->allreduce, "auto");
    strcpy(c->compression, "none");
    strcpy(c->compression_adam, "age");
    strcpy(c->zero_reduce, "auto");
    strcpy(c->zero3_gather, "auto");
    strcpy(c->pp_schedule, "1f1b");
    c->pp_virtual = 1;
    c->compression_ratio = 0.01f;
    c->shm = 1;
    c->tp = c->cp = c->pp = c->ep = 1;
    snprintf(c->layout_hardware, sizeof c->layout_hardware, "cpu-core");
    snprintf(c->layout_catalog, sizeof c->layout_catalog, "configs/hardware.yaml");
    c->ckpt_keep = 3;
    c->ckpt_async = 1;
    c->ckpt_max_failures = 3;
    c->coll_timeout = -1.0f; /* auto */
    c->loss_scale = -1.0f;   /* auto */
    c->preempt_grace = 30.0f;
}

static const key_def *find_key(const char *key) {
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].key, key) == 0) return &keys[i];
    return NULL;
}

/* Levenshtein distance, for "did you mean". */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

static const char *closest_key(const char *key) {
    const char *best = keys[0].key;
    int bd = 1 << 30;
    for (size_t i = 0; i < NKEYS; i++) {
        int d = edit_distance(key, keys[i].key);
        const char *dot = strchr(keys[i].key, '.');
        if (dot && strcmp(dot + 1, key) == 0) d = 0; /* a bare name matches its section's key */
        if (d < bd) {
            bd = d;
            best = keys[i].key;
        }
    }
    return best;
}

/* Is `v` one of the '|'-separated values in `list`? */
static int in_enum(const char *list, const char *v) {
    size_t n = strlen(v);
    for (const char *p = list;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        if (!bar) return 0;
        p = bar + 1;
    }
}

int dt_cfg_key_is_list(const char *key) {
    const key_def *k = find_key(key);
    return k && k->type == K_INTS;
}

/* "2,3", "[2, 3]", "" or "[]" (none) -> l; one line naming the key otherwise. */
static dt_status parse_ints(dt_ctx *ctx, const char *key, const char *value, dt_cfg_ints *l) {
    dt_cfg_ints out = {0};
    const char *p = value;
    while (*p == ' ' || *p == '\t') p++;
    int bracket = *p == '[';
    if (bracket) p++;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p || (bracket && *p == ']')) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno == ERANGE || v < INT_MIN || v > INT_MAX) goto bad;
        if (out.n == DT_PP_MAX)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: more than %d numbers ('%s')", key, DT_PP_MAX, value);
        out.v[out.n++] = (int)v;
        p = end;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == ',') {
            p++;
            while (*p == ' ' || *p == '\t') p++;
            if (!*p || *p == ']') goto bad; /* a trailing comma */
        } else if (*p && !(bracket && *p == ']')) goto bad;
    }
    if (bracket) {
        if (*p != ']') goto bad;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        if (*p) goto bad;
    }
    *l = out;
    return DT_OK;
bad:
    return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected a comma list of integers (2,3 or [2, 3]), got '%s'", key, value);
}

dt_status dt_cfg_set(dt_ctx *ctx, dt_run_cfg *c, const char *key, const char *value) {
    const key_def *k = find_key(key);
    if (!k)
        return dt_fail(ctx, DT_ERR_CONFIG, "unknown key '%s' (did you mean '%s'?)", key, closest_key(key));
    char *end = NULL;
    void *dst = (char *)c + k->off;
    errno = 0;
    switch (k->type) {
    case K_INT:
    case K_LONG: {
        long v = strtol(value, &end, 10);
        if (end == value || *end || errno == ERANGE || (k->type == K_INT && (v < INT_MIN || v > INT_MAX)))
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected an integer, got '%s'", key, value);
        if (k->type == K_INT) *(int *)dst = (int)v;
        else *(long *)dst = v;
        break;
    }
    case K_U64: {
        unsigned long long v = strtoull(value, &end, 10);
        if (value[0] == '-' || end == value || *end || errno == ERANGE)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected a non-negative integer, got '%s'", key, value);
        *(uint64_t *)dst = (uint64_t)v;
        break;
    }
    case K_FLOAT_AUTO:
        if (!strcmp(value, "auto")) {
            *(float *)dst = -1.0f;
            break;
        }
        /* fall through */
    case K_FLOAT: {
        float v = strtof(value, &end);
        if (end == value || *end || errno == ERANGE || !isfinite(v))
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected a number, got '%s'", key, value);
        *(float *)dst = v;
        break;
    }
    case K_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes")) *(int *)dst = 1;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no")) *(int *)dst = 0;
        else return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected true or false, got '%s'", key, value);
        break;
    case K_SCHED:
        return dt_lr_schedule_parse(ctx, value, (dt_sched_kind *)dst);
    case K_ROPE:
        DT_CHECK(dt_rope_scaling_parse(ctx, key, value, (int *)dst));
        break;
    case K_INTS:
        DT_CHECK(parse_ints(ctx, key, value, (dt_cfg_ints *)dst));
        break;
    case K_ENUM:
        if (!in_enum(k->enums, value))
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: '%s' is not one of %s", key, value,
                           k->enums[0] == '|' ? k->enums + 1 : k->enums);
        __attribute__((fallthrough)); /* stored like a string */
    case K_STR:
        if (strlen(value) >= k->size)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: value longer than %zu characters", key, k->size - 1);
        strcpy((char *)dst, value);
        break;
    }
    for (int i = 0; i < dt_model_cfg_nfields; i++)
        if (strcmp(key, dt_model_cfg_fields[i].key) == 0) c->model_set[i] = 1;
    if (strcmp(key, "model.family") == 0) c->family_set = 1;
    if (strcmp(key, "parallel.tp") == 0) c->tp_set = 1;
    if (strcmp(key, "parallel.pp") == 0) c->pp_set = 1;
    if (strcmp(key, "parallel.strategy") == 0 || strcmp(key, "parallel.hybrid") == 0) c->strategy_set = 1;
    if (strcmp(key, "model.preset") == 0 && value[0]) {
        dt_model_config probe;
        DT_CHECK(dt_model_preset(ctx, value, &probe)); /* names model.preset and the list */
    }
    if (strcmp(key, "schedule.decay_steps") == 0) c->decay_steps_set = 1;
    if (strcmp(key, "training.steps") == 0) c->steps_set = 1;
    if (strcmp(key, "training.seq_len") == 0) c->seq_len_set = 1;
    if (strcmp(key, "training.tokens") == 0) c->tokens_set = 1;
    if (strcmp(key, "training.grad_accum") == 0) c->accum_set = 1;
    return DT_OK;
}

/* The world size a run will have, before the communicator starts: 1 outside MPI, the size
 * the launcher exports under it (Open MPI, MPICH/Hydra), 0 when it exports none (checks that
 * need it wait for dt_cfg_apply_world). So that training.batch is judged against the real
 * number of ranks, not against one. */
static int launch_world(void) {
    if (!dt_comm_launched_by_mpi()) return 1;
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    for (int i = 0; vars[i]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long n = v ? strtol(v, &end, 10) : 0;
        if (v && *v && !*end && n >= 1 && n <= 1 << 24) return (int)n;
    }
    return 0;
}

static dt_status apply_world(dt_ctx *ctx, dt_run_cfg *c, int world, int mesh);

dt_status dt_cfg_finish(dt_ctx *ctx, dt_run_cfg *c) {
    dt_train_cfg *t = &c->train;
    if (t->preset[0]) {
        dt_model_config p, user = t->model;
        DT_CHECK(dt_model_preset(ctx, t->preset, &p));
        if (c->family_set && dt_model_family_find(user.family) != dt_model_family_of(&p))
            return dt_fail(ctx, DT_ERR_CONFIG, "model.family '%s' differs from preset %s's family %s",
                           user.family, t->preset, p.family);
        int preset_context = p.context;
        /* Keys set by the user override the preset; derived fields are derived again. */
        dt_model_config base;
        memset(&base, 0, sizeof base);
        snprintf(base.family, sizeof base.family, "%s", p.family);
        dt_model_family_of(&p)->preset(t->preset, &base);
        /* A scaling rule given by the user replaces the preset's with its parameters: those it
         * does not set are unset (0), not the preset's rule's. */
        int rule_set = 0;
        for (int i = 0; i < dt_model_cfg_nfields; i++)
            if (!strcmp(dt_model_cfg_fields[i].key, "model.rope_scaling")) rule_set = c->model_set[i];
        dt_model_config none;
        memset(&none, 0, sizeof none);
        for (int i = 0; i < dt_model_cfg_nfields; i++) {
            const dt_cfg_field *f = &dt_model_cfg_fields[i];
            const dt_model_config *from = c->model_set[i] ? &user
                                          : rule_set && !strncmp(f->key, "model.rope_", 11) &&
                                                    strcmp(f->key, "model.rope_theta") ? &none : &base;
            dt_model_cfg_set(&p, f, dt_model_cfg_get(from, f));
        }
        /* Learned positions have a row per position up to the preset's context; rotary ones
         * extend to any length (model/rope.h's scaling rules keep them in range). */
        if (p.context > preset_context && !dt_model_family_of(&p)->rotary)
            return dt_fail(ctx, DT_ERR_CONFIG, "model.context (%d) exceeds the maximum %d of preset %s (%s has "
                           "learned positions)", p.context, preset_context, t->preset, p.family);
        t->model = p;
    } else if (dt_model_family_find(t->model.family) && dt_model_family_find(t->model.family)->images) {
        /* A custom image model derives its sample length and pixel range: the language
         * defaults (context 64, vocabulary 256) are not its own unless given. */
        for (int i = 0; i < dt_model_cfg_nfields; i++)
            if (!c->model_set[i] && (!strcmp(dt_model_cfg_fields[i].key, "model.context") ||
                                     !strcmp(dt_model_cfg_fields[i].key, "model.vocab_size")))
                dt_model_cfg_set(&t->model, &dt_model_cfg_fields[i], 0);
    }
    DT_CHECK(dt_model_config_validate(ctx, &t->model));
    if (t->micro_batch < 1 || t->micro_batch > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.micro_batch must be in [1, 65536] (got %d)", t->micro_batch);
    /* An image classifier's sample is one image: its length is the model's, not a choice. */
    if (t->model.n_classes > 0) {
        if (c->seq_len_set && t->seq_len != t->model.context)
            return dt_fail(ctx, DT_ERR_CONFIG,
                           "training.seq_len: a %s sample is one image of %d values (got %d; leave it unset)",
                           t->model.family, t->model.context, t->seq_len);
        t->seq_len = t->model.context;
    }
    if (t->seq_len < 1 || t->seq_len > t->model.context)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.seq_len must be in [1, model.context=%d] (got %d)",
                       t->model.context, t->seq_len);
    if (c->log_every < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "logging.every must be >= 1 (got %d)", c->log_every);
    if (c->eval_interval < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.eval_interval must be >= 0 (got %d)", c->eval_interval);
    if (c->eval_batches < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.eval_batches must be >= 0 (got %d; 0 = every complete batch)",
                       c->eval_batches);
    if (c->ckpt_every < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "checkpoint.every must be >= 0 (got %ld)", c->ckpt_every);
    if (!(c->ckpt_minutes >= 0))
        return dt_fail(ctx, DT_ERR_CONFIG, "checkpoint.every_minutes must be >= 0 (got %g)", (double)c->ckpt_minutes);
    if (c->ckpt_keep < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "checkpoint.keep_last must be >= 0 (got %d)", c->ckpt_keep);
    if (c->ckpt_max_failures < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "checkpoint.max_failures must be >= 1 (got %d)", c->ckpt_max_failures);
    DT_CHECK(dt_cfg_check_resume(ctx, c));
    if (!(c->coll_timeout >= 0 || c->coll_timeout == -1.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "fault.collective_timeout must be auto or >= 0 (got %g)", (double)c->coll_timeout);
    if (!(c->preempt_grace > 0))
        return dt_fail(ctx, DT_ERR_CONFIG, "fault.preempt_grace must be > 0 (got %g)", (double)c->preempt_grace);
    if (c->threads < 0 || c->threads > 4096)
        return dt_fail(ctx, DT_ERR_CONFIG, "runtime.threads must be in [0, 4096] (got %d)", c->threads);
    int hybrid_alias;
    DT_CHECK(dt_strategy_parse(ctx, c->strategy, &t->parallel.strategy, &hybrid_alias));
    t->parallel.hybrid = hybrid_alias || c->hybrid;
    if (t->parallel.hybrid && t->parallel.strategy == DT_STRAT_DDP)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.hybrid needs a ZeRO strategy (zero1, zero2, zero3)");
    if (strlen(c->comm_model) >= sizeof t->parallel.comm_model)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.comm_model: path longer than %zu bytes", sizeof t->parallel.comm_model - 1);
    snprintf(t->parallel.comm_model, sizeof t->parallel.comm_model, "%s", c->comm_model);
    if (c->bucket_mb == -1.0f) {
        if (!c->comm_model[0])
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.bucket_mb=auto needs parallel.comm_model (a file written by "
                                               "dtrain bench comm --fit FILE)");
        dt_comm_fit fit;
        DT_CHECK(dt_comm_fit_load(ctx, c->comm_model, &fit));
        t->parallel.bucket_bytes = dt_comm_fit_bucket_bytes(&fit);
    } else {
        if (!(c->bucket_mb >= 0.004f && c->bucket_mb <= 4096.0f))
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.bucket_mb must be auto or in [0.004, 4096] (got %g)",
                           (double)c->bucket_mb);
        t->parallel.bucket_bytes = (size_t)((double)c->bucket_mb * 1048576.0);
    }
    t->parallel.overlap = c->overlap;
    t->parallel.grad_dtype = !strcmp(c->grad_dtype, "bf16") ? DT_BF16 : !strcmp(c->grad_dtype, "fp16") ? DT_F16 : DT_F32;
    t->parallel.shm = c->shm;
    t->parallel.compression = !strcmp(c->compression, "topk") ? DT_COMPRESS_TOPK : DT_COMPRESS_NONE;
    t->parallel.topk_ratio = c->compression_ratio;
    t->parallel.topk_warmup = c->compression_warmup;
    t->parallel.topk_age = !strcmp(c->compression_adam, "age");
    t->parallel.zero_reduce = !strcmp(c->zero_reduce, "step") ? DT_ZR_STEP : !strcmp(c->zero_reduce, "micro") ? DT_ZR_MICRO : DT_ZR_AUTO;
    t->parallel.zero3_gather = !strcmp(c->zero3_gather, "step") ? DT_ZG_STEP : !strcmp(c->zero3_gather, "use") ? DT_ZG_USE : DT_ZG_AUTO;
    if (c->compression_warmup < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.compression_warmup must be >= 0 (got %ld)", c->compression_warmup);
    if (!(c->compression_ratio > 0 && c->compression_ratio <= 1))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.compression_ratio must be in (0, 1] (got %g)",
                       (double)c->compression_ratio);
    if (t->parallel.compression == DT_COMPRESS_TOPK && t->parallel.strategy >= DT_STRAT_ZERO2)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.compression=topk works with parallel.strategy ddp or zero1 only "
                       "(%s reduce-scatters each layer's gradient as it is formed: no full gradient to keep a "
                       "residual for)", c->strategy);
    t->parallel.allreduce = !strcmp(c->allreduce, "flat") ? DT_AR_FLAT : !strcmp(c->allreduce, "hierarchical") ? DT_AR_HIER : DT_AR_AUTO;
    t->nonfinite_skip = !strcmp(c->nonfinite, "skip");
    if (!(c->loss_scale == -1.0f || c->loss_scale > 0))
        return dt_fail(ctx, DT_ERR_CONFIG, "training.loss_scale must be auto or > 0 (got %g)", (double)c->loss_scale);
    t->loss_scale = c->loss_scale < 0 ? 0.0f : c->loss_scale;
    t->model_opts.compute = !strcmp(c->precision, "bf16") ? DT_BF16 : !strcmp(c->precision, "fp16") ? DT_F16 : DT_F32;
    t->model_opts.recompute = !strcmp(c->recompute, "full")        ? DT_RECOMPUTE_FULL
                              : !strcmp(c->recompute, "selective") ? DT_RECOMPUTE_SELECTIVE
                                                                   : DT_RECOMPUTE_NONE;
    DT_CHECK(dt_lora_parse_targets(ctx, c->lora_targets, &t->model_opts.lora.targets));
    t->model_opts.lora.nf4 = !strcmp(c->lora_base, "nf4");
    t->model_opts.lora.base_external = c->init_from[0] != 0; /* run.c loads it: not drawn first */
    if (c->prometheus_every < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "logging.prometheus_every must be >= 1 (got %d)", c->prometheus_every);
    if (c->spike_rollback < 0 || c->spike_rollback > 1000)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.spike_rollback must be in [0, 1000] (got %d)", c->spike_rollback);
    if (c->spike_rollback > 0 && (!c->ckpt_dir[0] || !c->data_train[0] || c->spike_factor == 0.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "training.spike_rollback needs checkpoint.dir (to roll back to), data.train "
                       "(batches to skip) and training.spike_factor > 0");
    if (!(c->spike_factor == 0.0f || c->spike_factor > 1.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "training.spike_factor must be 0 (off) or > 1 (got %g)", (double)c->spike_factor);
    if (c->straggler_every < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "logging.straggler_every must be >= 0 (got %d)", c->straggler_every);
    if (!(c->straggler_factor > 1.0f))
        return dt_fail(ctx, DT_ERR_CONFIG, "logging.straggler_factor must be > 1 (got %g)", (double)c->straggler_factor);
    if (c->check_replicas < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.check_replicas must be >= 0 (got %d)", c->check_replicas);
    if (!(c->peak_gflops >= 0))
        return dt_fail(ctx, DT_ERR_CONFIG, "logging.peak_gflops must be >= 0 (got %g)", (double)c->peak_gflops);
    if (c->tokens < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.tokens must be >= 0 (got %ld)", c->tokens);
    if (c->tokens > 0 && c->steps_set)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.tokens and training.steps are both set: keep one");
    if (c->global_batch < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.batch must be >= 0 (got %d)", c->global_batch);
    if (c->global_batch > 0 && c->accum_set)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.batch and training.grad_accum are both set: keep one");
    if (!strcmp(c->tokenizer, "gpt2") && t->model.vocab < 50257)
        return dt_fail(ctx, DT_ERR_CONFIG, "model.vocab_size (%d) is smaller than the gpt2 tokenizer's 50257",
                       t->model.vocab);
    if (c->layout[0] && strcmp(c->layout, "auto"))
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.layout must be auto or '' (the keys as given; got '%s')", c->layout);
    return apply_world(ctx, c, launch_world(), 0);
}

/* world = 0: not known yet (1 outside MPI, the launcher's announced size under it; 0 when
 * none is announced: training.batch waits). mesh = 0 (dt_cfg_finish): the degrees alone; the
 * mesh against the world only when the run applies its world, once the communicator is up. */
static dt_status apply_world(dt_ctx *ctx, dt_run_cfg *c, int world, int mesh) {
    dt_train_cfg *t = &c->train;
    /* tensor parallelism: the model holds 1 shard (a rank of a TP group) or all (tp_blocks) */
    const int tp = c->tp > 1 ? c->tp : 1, tp_ranks = c->tp_blocks ? 1 : tp;
    t->model_opts.tp = tp > 1 ? tp : 0;
    t->model_opts.tp_local = c->tp_blocks ? tp : 1;
    t->model_opts.tp_first = 0; /* the trainer sets its TP rank */
    t->model_opts.sp = c->sp;
    t->parallel.tp = tp_ranks;
    DT_CHECK(dt_cfg_check_ep(ctx, c)); /* before the others: a composition with ep names parallel.ep */
    t->ep = c->ep > 1 ? c->ep : 1;
    t->model_opts.ep = c->ep > 1 ? c->ep : 0;
    t->model_opts.ep_rank = 0; /* the trainer sets its EP rank */
    DT_CHECK(dt_cfg_check_tp(ctx, c));
    /* pipeline parallelism: the stages' layers are cut by the trainer (dt_pp_cfg_stages) */
    t->pp = c->pp > 1 ? c->pp : 1;
    dt_pp_kind kind;
    DT_CHECK(dt_pp_kind_parse(ctx, c->pp_schedule, &kind));
    t->pp_kind = (int)kind;
    t->pp_virtual = c->pp_virtual;
    if (c->pp_blocks && c->pp < 2)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_blocks needs parallel.pp >= 2 (got %d)", c->pp);
    t->pp_blocks = c->pp_blocks;
    const int pp_ranks = c->pp_blocks ? 1 : (c->pp > 0 ? c->pp : 1);
    /* the data-parallel ranks: batches, samples and tokens count them */
    long mp = (long)tp_ranks * (c->cp > 0 ? c->cp : 1) * pp_ranks;
    const int world_all = world;
    if (world > 0 && mp > 0 && world % mp == 0) world /= (int)mp;
    if (mesh && world > 0) {
        DT_CHECK(dt_cfg_check_mesh(ctx, c, world_all));
    } else {
        dt_mesh m; /* the degrees alone: a mesh of exactly their product */
        int deg[4] = {c->tp, c->cp, c->pp, c->ep};
        for (int i = 0; i < 4; i++)
            if (deg[i] < 1 || deg[i] > DT_MESH_MAX_WORLD) return dt_mesh_init(ctx, &m, 1, 0, c->tp, c->cp, c->pp, c->ep);
    }
    DT_CHECK(dt_cfg_check_pp(ctx, c));
    /* context parallelism: each rank the rows of its two chunks of every sequence */
    t->cp = c->cp > 1 ? c->cp : 1;
    t->model_opts.cp = c->cp > 1 ? c->cp : 0;
    t->model_opts.cp_rank = 0; /* the trainer sets its CP rank */
    t->cp_contiguous = !strcmp(c->cp_split, "contiguous");
    t->moe_aux_layer = !strcmp(c->moe_aux_type, "layer");
    t->model_opts.cp_all_gather = c->cp > 1 && !strcmp(c->cp_comm, "all_gather");
    DT_CHECK(dt_cfg_check_cp(ctx, c));
    /* explicit stage layers; else the trainer cuts them by the cost rule (pp_first all 0) */
    memset(t->pp_first, 0, sizeof t->pp_first);
    if (c->pp_layers.n && t->pp > 1)
        DT_CHECK(dt_pp_split_explicit(ctx, c->pp_layers.v, c->pp_layers.n, c->pp, t->model.n_layer, t->pp_first));
    if (c->global_batch > 0 && world > 0) {
        long per = (long)t->micro_batch * world;
        if (c->global_batch % per != 0)
            return dt_fail(ctx, DT_ERR_CONFIG,
                           "training.batch (%d) must be a multiple of training.micro_batch (%d) x the %s "
                           "(%d rank%s) = %ld", c->global_batch, t->micro_batch,
                           mp > 1 ? "data-parallel size" : "world size", world, world == 1 ? "" : "s", per);
        t->accum = (int)(c->global_batch / per);
    }
    /* ZeRO-2/3 under expert parallelism reduce the experts' gradients once a step (decision 88) */
    if (c->ep > 1 && t->parallel.strategy >= DT_STRAT_ZERO2 && t->accum > 1 && t->parallel.zero_reduce == DT_ZR_MICRO)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.zero_reduce=micro with parallel.ep=%d and grad_accum %d: expert "
                       "parallelism reduces the experts' gradients once a step (zero_reduce: step, or auto)", c->ep,
                       t->accum);
    if (c->tokens > 0) {
        long per_step = (long)t->micro_batch * t->seq_len * t->accum * (world > 0 ? world : 1);
        t->steps = (c->tokens + per_step - 1) / per_step;
    }
    if (!c->decay_steps_set) t->sched.total = t->steps;
    t->checked = 0;
    DT_CHECK(dt_train_cfg_validate(ctx, t));
    t->checked = 1; /* dt_trainer_init does not validate it again (decision 72) */
    return DT_OK;
}

dt_status dt_cfg_apply_world(dt_ctx *ctx, dt_run_cfg *c, int world) { return apply_world(ctx, c, world, 1); }

/* Writes the value of key k in c as YAML scalar text. */
static void format_value(char *buf, size_t n, const key_def *k, const dt_run_cfg *c) {
    const void *p = (const char *)c + k->off;
    switch (k->type) {
    case K_INT: snprintf(buf, n, "%d", *(const int *)p); break;
    case K_LONG: snprintf(buf, n, "%ld", *(const long *)p); break;
    case K_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case K_FLOAT_AUTO:
        if (*(const float *)p == -1.0f) {
            snprintf(buf, n, "auto");
            break;
        }
        /* fall through */
    case K_FLOAT: { /* the shortest text that reads back as the same float: 0.0006, not 0.000600000028 */
        float v = *(const float *)p;
        if (v == floorf(v) && fabsf(v) < 1e9f) { /* 30, not 3e+01 */
            snprintf(buf, n, "%.0f", (double)v);
            break;
        }
        for (int prec = 1; prec <= 9; prec++) {
            snprintf(buf, n, "%.*g", prec, (double)v);
            if (strtof(buf, NULL) == v) break;
        }
        break;
    }
    case K_BOOL: snprintf(buf, n, "%s", *(const int *)p ? "true" : "false"); break;
    case K_SCHED: snprintf(buf, n, "%s", dt_sched_kind_name(*(const dt_sched_kind *)p)); break;
    case K_ROPE: snprintf(buf, n, "%s", dt_rope_scaling_names[*(const int *)p]); break;
    case K_INTS: { /* a YAML flow sequence: [2, 3], [] */
        const dt_cfg_ints *l = p;
        size_t j = (size_t)snprintf(buf, n, "[");
        for (int i = 0; i < l->n && j < n; i++) j += (size_t)snprintf(buf + j, n - j, "%s%d", i ? ", " : "", l->v[i]);
        if (j < n) snprintf(buf + j, n - j, "]");
        break;
    }
    case K_ENUM:
    case K_STR: {
        /* Double-quoted YAML: escape backslash and quote. */
        const char *s = p;
        size_t j = 0;
        if (j < n) buf[j++] = '"';
        for (; *s && j + 3 < n; s++) {
            if (*s == '"' || *s == '\\') buf[j++] = '\\';
            buf[j++] = *s;
        }
        if (j + 1 < n) buf[j++] = '"';
        buf[j < n ? j : n - 1] = 0;
        break;
    }
    }
}

void dt_cfg_print_keys(FILE *f) {
    dt_run_cfg d;
    dt_run_cfg_defaults(&d);
    for (size_t i = 0; i < NKEYS; i++) {
        char def[DT_PATH_MAX + 8];
        format_value(def, sizeof def, &keys[i], &d);
        fprintf(f, "  %-28s %-22s %s%s%s\n", keys[i].key, def, keys[i].help,
                keys[i].enums ? "; one of " : "",
                keys[i].enums ? (keys[i].enums[0] == '|' ? keys[i].enums + 1 : keys[i].enums) : "");
    }
}

void dt_cfg_print(FILE *f, const dt_run_cfg *c) {
    const char *section = "";
    size_t slen = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        const char *dot = strchr(keys[i].key, '.');
        size_t len = (size_t)(dot - keys[i].key);
        if (len != slen || strncmp(section, keys[i].key, len) != 0) {
            section = keys[i].key;
            slen = len;
            fprintf(f, "%.*s:\n", (int)len, section);
        }
        char val[DT_PATH_MAX + 8];
        format_value(val, sizeof val, &keys[i], c);
        fprintf(f, "  %s: %s\n", dot + 1, val);
    }
}
