#!/usr/bin/env bash
# ctest, then every skip named: `make test`, `make test-asan` and scripts/test-aarch64.sh run
# the suite through this, in the build directory. CTest reports a test that exits 77
# (SKIP_RETURN_CODE) as "Skipped" yet exits 0, and a cmocka case skipped inside a test binary
# counts as passed, so both vanish in a green run. Afterwards this lists the tests CTest
# skipped whole and each skipped case (the "skip:" lines of tests/lib.sh's skip/skip_case and
# testutil's tu_skip; cmocka's "[  SKIPPED ]" for a case without one), by test. Under CI=true
# any skip fails the run: the tests fail on their own skips then, and this catches one that
# does not (an `exit 77` outside tests/lib.sh).
#   tests/ctest.sh [CTEST ARGS...]
set -uo pipefail
console=$(mktemp)
trap 'rm -f "$console"' EXIT
ctest "$@" 2>&1 | tee "$console"
rc=${PIPESTATUS[0]}

# Tests skipped whole: CTest's "did not run" list ("  12 - test_multihost (Skipped)").
mapfile -t whole < <(sed -nE 's/^[[:space:]]*[0-9]+ - (.+) \((Skipped|Disabled)\)$/\1 (\2)/p' "$console")
# Skipped cases: per test section of LastTest.log ("3/40 Testing: NAME" ... output).
log=Testing/Temporary/LastTest.log
mapfile -t cases < <([ -f "$log" ] && awk '
  /^[0-9]+\/[0-9]+ Testing: / { t = $3; next }
  /^skip: / { if (!seen[t, $0]++) { line[++n] = t "\t" $0; named[t] = 1 } next }
  /^\[  SKIPPED \] [A-Za-z_][A-Za-z0-9_]*$/ { if (!seen[t, $0]++) { cm[++m] = t "\t" $0 } }
  END {
    for (i = 1; i <= n; i++) print line[i]
    for (i = 1; i <= m; i++) { split(cm[i], p, "\t"); if (!named[p[1]]) print cm[i] }
  }' "$log")

if [ ${#whole[@]} -eq 0 ] && [ ${#cases[@]} -eq 0 ]; then
  echo "---- skips: none (every selected test and case ran)"
  exit "$rc"
fi
echo "---- skips: ${#whole[@]} test(s) skipped whole, ${#cases[@]} skip message(s) (not run here; under CI=true each is a failure)"
for w in "${whole[@]}"; do printf '  %-24s skipped whole\n' "$w"; done
for c in "${cases[@]}"; do printf '  %-24s %s\n' "${c%%$'\t'*}" "${c#*$'\t'}"; done
if [ "${CI:-}" = true ]; then
  echo "FAIL: CI=true and the run skipped something: a green CI run must have run everything"
  exit 1
fi
exit "$rc"
