#!/usr/bin/env bash
# The backend seam's CI guard (issue 36 item 1; docs/ARCHITECTURE.md decision 73): the layers
# above ops/ reach compute and tensor memory only through ops.h, so in each folder of DIRS
#   - no `#pragma omp` (a parallel loop is a backend operation of src/ops/),
#   - no include of a header of src/ops/cpu/ (one backend's internals; ops/ops.h is the seam),
#   - memcpy/memset/memmove/bzero calls (and their __builtin_ forms) only where
#     tests/memcpy_allowlist.txt lists them as non-tensor uses: one line per file,
#     `src/<folder>/<file>: <count>: <reason>`, and the file must hold exactly <count> calls
#     (a new call fails, and so does a removed one until its count is lowered). Tensor memory
#     is copied and filled by dt_copy / dt_fill.
# Every violation is named by file and line.
#   tests/check_backend_use.sh [ROOT]   (default: the repository this script is in)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
. "$(dirname "$0")/lib.sh"
allow=$root/tests/memcpy_allowlist.txt

# The folders of src/ checked. model/ still has its loops until the model layer's move is
# merged: the lead adds `model` here after merging it.
DIRS="model parallel optim"

calls='(^|[^A-Za-z0-9_])(__builtin_)?(memcpy|memset|memmove|bzero)[[:space:]]*\('

declare -A allowed=()
if [ ! -f "$allow" ]; then
  fail "$allow: missing (one line per file: 'src/<folder>/<file>: <count>: <reason>')"
else
  ln=0
  while IFS= read -r line || [ -n "$line" ]; do
    ln=$((ln + 1))
    [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
    if [[ ! "$line" =~ ^(src/[^:[:space:]]+):[[:space:]]*([0-9]+):[[:space:]]*([^[:space:]].*)$ ]]; then
      fail "tests/memcpy_allowlist.txt:$ln: not 'src/<folder>/<file>: <count>: <reason>': $line"
      continue
    fi
    f=${BASH_REMATCH[1]} n=${BASH_REMATCH[2]}
    d=$(cut -d/ -f2 <<<"$f")
    if [ "$n" -eq 0 ]; then
      fail "tests/memcpy_allowlist.txt:$ln: $f with count 0 (remove the line)"
    elif [ -n "${allowed[$f]:-}" ]; then
      fail "tests/memcpy_allowlist.txt:$ln: $f listed twice"
    elif [[ " $DIRS " != *" $d "* ]]; then
      fail "tests/memcpy_allowlist.txt:$ln: $f is not in a checked folder (DIRS=\"$DIRS\" in tests/check_backend_use.sh)"
    elif [ ! -f "$root/$f" ]; then
      fail "tests/memcpy_allowlist.txt:$ln: $f does not exist"
    else
      allowed[$f]=$n
    fi
  done <"$allow"
fi

checked=0
for d in $DIRS; do
  [ -d "$root/src/$d" ] || { fail "src/$d (in DIRS) is not a folder"; continue; }
  while IFS= read -r f; do
    rel=${f#"$root"/}
    checked=$((checked + 1))
    while IFS=: read -r l _; do
      fail "$rel:$l: #pragma omp (move the loop into a backend operation: ops.h, src/ops/cpu/)"
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*pragma[[:space:]]+omp' "$f")
    while IFS=: read -r l inc; do
      fail "$rel:$l: $(sed 's/^[[:space:]]*//' <<<"$inc") (a header of src/ops/cpu/: include ops/ops.h only)"
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]*/)?ops/cpu/' "$f")
    mapfile -t hits < <(grep -nE "$calls" "$f")
    have=0
    for h in "${hits[@]}"; do have=$((have + $(grep -oE "$calls" <<<"${h#*:}" | wc -l))); done
    want=${allowed[$rel]:-}
    if [ -z "$want" ] && [ "$have" -gt 0 ]; then
      for h in "${hits[@]}"; do
        fail "$rel:${h%%:*}: $(grep -oE "$calls" <<<"${h#*:}" | head -1 | sed 's/^[^A-Za-z_]*//; s/[[:space:]]*($//') on a file with no line in tests/memcpy_allowlist.txt (tensor memory: dt_copy / dt_fill)"
      done
    elif [ -n "$want" ] && [ "$have" -gt "$want" ]; then
      for h in "${hits[@]}"; do
        fail "$rel:${h%%:*}: one of $have memcpy/memset/memmove calls where tests/memcpy_allowlist.txt allows $want (tensor memory: dt_copy / dt_fill)"
      done
    elif [ -n "$want" ] && [ "$have" -lt "$want" ]; then
      fail "$rel: $have memcpy/memset/memmove calls, tests/memcpy_allowlist.txt allows $want: lower its count"
    fi
  done < <(find "$root/src/$d" -name '*.[ch]' | sort)
done

[ "$checked" -gt 0 ] || fail "no source file checked under src/{${DIRS// /,}}"
[ "$fails" -eq 0 ] && pass "$checked files of src/{${DIRS// /,}}: no #pragma omp, no ops/cpu/ header, memcpy/memset only as tests/memcpy_allowlist.txt lists"
echo "check_backend_use: $fails failure(s)"
[ "$fails" -eq 0 ]
