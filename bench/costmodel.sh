#!/usr/bin/env bash
# How well the fitted cost model predicts collectives it was not fitted on, across 2 simulated
# hosts x 2 ranks (scripts/mnhosts.sh) with every host's link shaped by tc's token bucket to
# each RATE in turn. Per rate: `dtrain bench comm --fit` on sizes MIN, 2 MIN, ... MAX (the fit:
# per collective, link level - world, node, cross - and size range), then a second run on the
# sizes halfway between (1.5 MIN, 3 MIN, ...), whose every row is predicted from the first
# run's file and compared; prints per row predicted vs measured and the relative error, then
# the median and the largest error per collective and group; then a third run at the fit's
# sizes again, and how far each row moved between the two runs of the same size (the floor
# below which no prediction can be checked on this host).
#   bash bench/costmodel.sh build/dtrain [RATE...]     (default: 1gbit 10gbit; root)
# Env: MIN (default 256K), MAX (default 16M), ITERS (default 5), OUT (keep the files there).
set -euo pipefail
bin=$(readlink -f "${1:-build/dtrain}")
shift || true
rates=("$@")
[ ${#rates[@]} -eq 0 ] && rates=(1gbit 10gbit)
src=$(cd "$(dirname "$0")/.." && pwd)
mn=$src/scripts/mnhosts.sh
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
export MN_PREFIX=dtmnb- MN_STATE=${TMPDIR:-/tmp}/dtrain-mn-bench
trap '"$mn" down >/dev/null 2>&1 || true' EXIT
"$mn" up 2 >/dev/null
min=$(numfmt --from=iec "${MIN:-256K}")
max=$(numfmt --from=iec "${MAX:-16M}")
echo "# host: $(grep -o -w 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores; 2 hosts x 2 ranks, links shaped with tc tbf; files in $out"
for rate in "${rates[@]}"; do
  for h in h1 h2; do
    "$mn" exec "$h" tc qdisc replace dev mn0 root tbf rate "$rate" burst 1mbit latency 100ms
  done
  run() { # SUFFIX MIN MAX [--fit FILE]
    "$mn" mpirun --host h1:2,h2:2 -n 4 -x OMP_NUM_THREADS=1 "$bin" bench comm --min-bytes "$2" --max-bytes "$3" \
      --iters "${ITERS:-5}" --json "$out/comm-$rate-$1.json" "${@:4}" >"$out/comm-$rate-$1.log" 2>&1 ||
      { echo "FAILED at $rate ($1): $(tail -3 "$out/comm-$rate-$1.log")"; exit 1; }
  }
  run fit "$min" "$max" --fit "$out/fit-$rate.json"
  run check $((min * 3 / 2)) $((max * 3 / 2))
  run repeat "$min" "$max"
  echo "## link $rate: predicted from fit-$rate.json (sizes MIN..MAX) vs measured at the sizes between"
  python3 - "$out/fit-$rate.json" "$out/comm-$rate-check.json" "$out/comm-$rate-fit.json" "$out/comm-$rate-repeat.json" <<'PY'
import json, statistics, sys
fit, rows = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["rows"]
def predict(group, op, b):  # comm_fit.c dt_comm_fit_find_in: the range holding b, else the nearest
    best, dist = None, None
    for l in fit["lines"]:
        if l["op"] != op or l.get("group", "world") != group: continue
        d = l["min_bytes"] - b if b < l["min_bytes"] else b - l["max_bytes"] if b > l["max_bytes"] else 0
        if best is None or d < dist: best, dist = l, d
    return None if best is None else best["alpha_us"] + best["beta_us_per_byte"] * b
errs = {}
print(f"# {'group':6} {'collective':26} {'bytes':>10} {'measured_us':>12} {'predicted_us':>12} {'error':>8}")
for r in rows:
    g = r.get("group", "world")
    p = predict(g, r["op"], r["bytes"])
    if p is None: continue
    e = (p - r["time_us"]) / r["time_us"]
    errs.setdefault((g, r["op"]), []).append(abs(e))
    print(f"  {g:6} {r['op']:26} {r['bytes']:10.0f} {r['time_us']:12.1f} {p:12.1f} {e:+8.1%}")
print(f"# {'group':6} {'collective':26} {'median |err|':>12} {'max |err|':>10}")
for (g, op), e in sorted(errs.items()):
    print(f"  {g:6} {op:26} {statistics.median(e):12.1%} {max(e):10.1%}")
allerr = [x for e in errs.values() for x in e]
print(f"# all rows: median |error| {statistics.median(allerr):.1%}, within 20%: {sum(x <= 0.2 for x in allerr)} of {len(allerr)}")
# The measurement's own repeatability: the fit run's sizes measured again, after the check run;
# no model can predict a row closer than the row repeats.
first = {(r.get("group", "world"), r["op"], r["bytes"]): r["time_us"] for r in json.load(open(sys.argv[3]))["rows"]}
rep = {}
for r in json.load(open(sys.argv[4]))["rows"]:
    k = (r.get("group", "world"), r["op"], r["bytes"])
    if k in first: rep.setdefault(k[:2], []).append(abs(first[k] - r["time_us"]) / r["time_us"])
print(f"# the same sizes measured twice (fit run vs repeat run): {'group':6} {'collective':26} {'median |diff|':>13} {'max':>8}")
for (g, op), e in sorted(rep.items()):
    print(f"  {g:6} {op:26} {statistics.median(e):13.1%} {max(e):8.1%}")
alld = [x for e in rep.values() for x in e]
print(f"# repeat: median |diff| {statistics.median(alld):.1%}, within 20%: {sum(x <= 0.2 for x in alld)} of {len(alld)}")
PY
done
