#!/usr/bin/env bash
# Installs the Debian packages dtrain needs to build, test and demo; idempotent and
# non-interactive: only packages that are missing are installed.
# --aarch64: the cross build's packages instead (scripts/test-aarch64.sh).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libdnnl-dev libyaml-dev libcjson-dev libxxhash-dev
      zlib1g-dev            # gzip'd IDX image datasets
      dataset-fashion-mnist # the ViT demo and tests: Fashion-MNIST's IDX files
      libcmocka-dev libopenmpi-dev openmpi-bin python3 python3-torch python3-numpy
      libopenblas0-pthread  # PyTorch peer benchmark: without it Debian torch uses reference BLAS
      fortunes              # the demo corpus
      iproute2              # multi-host tests: network namespaces (ip netns)
      slurm-wlm slurmctld slurmd slurm-client munge   # test_slurm, test_jobs: a Slurm cluster in namespaces
      python3-yaml python3-jsonschema                 # test_jobs: the MPIJob checked against the operator's CRD
      chromium)             # dtrain report test: renders the page headless
# The BPE parity test runs the reference tokenizer (npm gpt-3-encoder) under node; any
# node >= 12 does, so Debian's is installed only when none is on the PATH.
command -v node >/dev/null || pkgs+=(nodejs)
command -v npm >/dev/null || pkgs+=(npm)
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ "${1:-}" = --aarch64 ]; then
  # arm64 libraries through Debian multiarch. Only runtime packages where the -dev package
  # cannot be co-installed with the amd64 one (oneDNN: a header differs; Open MPI: the
  # build is -DDTRAIN_MPI=OFF, its arm64 packages would replace mpirun).
  # libc6-dev-arm64-cross: the cross gcc only recommends it (crt files, libc headers), and
  # --no-install-recommends below would leave a compiler that cannot link.
  pkgs=(cmake gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user file libdnnl2:arm64 libyaml-dev:arm64
        libcjson-dev:arm64 libxxhash-dev:arm64 zlib1g-dev:arm64 libcmocka-dev:arm64 libgomp1:arm64)
  dpkg --print-foreign-architectures | grep -qx arm64 || {
    echo "install-deps: adding the arm64 architecture (dpkg --add-architecture arm64)"
    $SUDO dpkg --add-architecture arm64
  }
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
# Never let an install remove packages (a foreign-architecture package can displace the
# native one): refuse, naming them.
sim=$(DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -s --no-install-recommends "${missing[@]}" 2>&1) \
  || { echo "install-deps: apt-get cannot install ${missing[*]}: $(tail -1 <<<"$sim")" >&2; exit 1; }
removed=$(awk '/^Remv /{print $2}' <<<"$sim" | paste -sd' ')
if [ -n "$removed" ]; then
  echo "install-deps: installing ${missing[*]} would remove: $removed; not installing" >&2
  exit 1
fi
# The Slurm and munge daemons must not start as system services on install (the tests run their
# own, in network namespaces): policy-rc.d (exit 101) forbids it while we install, if none is set.
made_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null && $SUDO chmod 755 /usr/sbin/policy-rc.d \
    && made_policy=1
fi
rc=0
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" || rc=$?
[ $made_policy = 1 ] && $SUDO rm -f /usr/sbin/policy-rc.d
exit $rc
