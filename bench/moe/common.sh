# Shared by bench/moe/*.sh: the 4-layer d 256 llama of issue 34's benchmarks (byte vocabulary,
# T 256), its mixture of experts (8 experts of expert_d_ff 512, top-2: the active MLP width of the
# dense d_ff 1024), micro-batch 4 on 2 ranks (global batch 8), one thread per rank.
E=(--set model.preset= --set model.family=llama --set model.n_layer=4 --set model.d_model=256 --set model.n_head=4
   --set model.n_kv_head=4 --set model.vocab_size=256 --set model.context=256)
MOE=(--set model.n_experts=8 --set model.experts_topk=2 --set model.expert_d_ff=512)
B=(--seq 256 --set training.micro_batch=4 --set training.batch=8)
mpirun2() { [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; OMP_NUM_THREADS=1 mpiexec --oversubscribe --bind-to none -n 2 -x OMP_NUM_THREADS "$@"; }
fortunes() { # DIR: the Debian fortunes corpus as byte tokens in DIR (fortunes_train_*.bin)
  [ -f "$1/fortunes_train_000000.bin" ] && return
  local files=() f
  for f in /usr/share/games/fortunes/*; do case $f in *.dat|*.u8) ;; *) [ -f "$f" ] && files+=("$f") ;; esac; done
  [ ${#files[@]} -gt 0 ] || { echo "no fortune files in /usr/share/games/fortunes (install package fortunes)" >&2; exit 1; }
  "$bin" prepare --tokenizer byte --doc-sep % --val-fraction 0.05 --out "$1/fortunes" "${files[@]}" >/dev/null
}
