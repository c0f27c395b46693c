#!/usr/bin/env bash
# The include layering of src/ (docs/ARCHITECTURE.md decision 72): every folder of src/ has a
# place in the layer order that ARCHITECTURE.md states on its "Layer order:" line, and a file
# may include headers of its own folder or of a folder earlier in that order, never a later
# one. A violation is named by file, line and include; a folder of src/ missing from the order
# (or an order naming a folder that does not exist) fails too, so a new folder must be placed,
# and so does a README.md layout section that does not list the folders in that order.
#   tests/check_layers.sh [SRC_ROOT]   (default: the repository this script is in)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
. "$(dirname "$0")/lib.sh"
doc=$root/docs/ARCHITECTURE.md

# "Layer order: `core < ops < ... < cli`" -> core ops ... cli
line=$(grep -m1 '^[[:space:]]*Layer order: `' "$doc" | sed 's/^[[:space:]]*Layer order: `\([^`]*\)`.*/\1/')
if [ -z "$line" ]; then
  fail "$doc: no 'Layer order: \`a < b < ...\`' line"
  echo "check_layers: $fails failure(s)"
  exit 1
fi
declare -A rank=()
i=0
for d in $(tr '<' ' ' <<<"$line"); do
  [ -n "${rank[$d]:-}" ] && fail "layer order names $d twice"
  rank[$d]=$i
  i=$((i + 1))
  [ -d "$root/src/$d" ] || fail "layer order names $d, which is not a folder of src/"
done
for p in "$root"/src/*/; do
  d=$(basename "$p")
  [ -n "${rank[$d]:-}" ] || fail "src/$d is not in the layer order of docs/ARCHITECTURE.md (place it there)"
done

# The README's layout section lists every folder of src/, in the layer order.
listed=$(sed -n '/^## Layout/,/^## /p' "$root/README.md" | sed -n 's|^src/\([a-z_]*\) .*|\1|p' | tr '\n' ' ')
if [ "$listed" = "$(tr -d '<' <<<"$line" | tr -s ' ') " ]; then
  pass "README.md's layout lists every folder of src/ in the layer order"
else
  fail "README.md's layout lists '$listed', not the layer order '$line'"
fi

checked=0
while IFS= read -r f; do
  rel=${f#"$root"/}
  own=$(cut -d/ -f2 <<<"$rel")
  [ -n "${rank[$own]:-}" ] || continue # named above
  checked=$((checked + 1))
  # '#include "dir/...' where dir is a folder of src/
  while IFS=: read -r ln inc; do
    dir=$(sed 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^/"]*\)\/.*/\1/' <<<"$inc")
    [ -n "${rank[$dir]:-}" ] || continue
    if [ "${rank[$dir]}" -gt "${rank[$own]}" ]; then
      fail "$rel:$ln: $(sed 's/^[[:space:]]*//' <<<"$inc") ($own/ is below $dir/ in the layer order: $line)"
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^/"]*/' "$f")
done < <(find "$root/src" -name '*.[ch]' | sort)

[ "$checked" -gt 0 ] || fail "no source file checked under $root/src"
[ "$fails" -eq 0 ] && pass "$checked files of src/ include only their own or lower layers ($line)"
echo "check_layers: $fails failure(s)"
[ "$fails" -eq 0 ]
