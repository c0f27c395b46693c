#!/usr/bin/env bash
# Installs the Debian packages dtrain needs to build, test and demo; idempotent and
# non-interactive: only packages that are missing are installed.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libdnnl-dev libyaml-dev libcjson-dev libxxhash-dev
      libcmocka-dev libopenmpi-dev openmpi-bin python3 python3-torch python3-numpy
      libopenblas0-pthread  # PyTorch peer benchmark: without it Debian torch uses reference BLAS
      fortunes              # the demo corpus
      iproute2              # multi-host tests: network namespaces (ip netns)
      chromium)             # dtrain report test: renders the page headless
# The BPE parity test runs the reference tokenizer (npm gpt-3-encoder) under node; any
# node >= 12 does, so Debian's is installed only when none is on the PATH.
command -v node >/dev/null || pkgs+=(nodejs)
command -v npm >/dev/null || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
