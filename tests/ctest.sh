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
# The tests' output comes from a JUnit file of this run's own (not Testing/Temporary/LastTest.log,
# which another ctest in the same build directory overwrites, and which calls a skip "Passed"),
# whole: CTest keeps only 1 KB of a passed test's output by default.
junit=$(mktemp --suffix=.xml)
trap 'rm -f "$junit"' EXIT
ctest --output-junit "$junit" --test-output-size-passed 268435456 --test-output-size-failed 268435456 "$@"
rc=$?

# Per <testcase name="NAME" ... status="notrun"> with <skipped .../>: skipped whole (CTest:
# SKIP_RETURN_CODE or DISABLED); in its <system-out>: the skip lines.
mapfile -t whole < <(awk '
  /<testcase / { match($0, /name="[^"]*"/); t = substr($0, RSTART + 6, RLENGTH - 7) }
  /<skipped / { print t }' "$junit")
mapfile -t cases < <(awk '
  function unxml(s) { gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s); gsub(/&quot;/, "\"", s); gsub(/&apos;/, "\047", s)
                      gsub(/&amp;/, "\\&", s); return s }
  /<testcase / { match($0, /name="[^"]*"/); t = substr($0, RSTART + 6, RLENGTH - 7); next }
  { sub(/^[ \t]*<system-out>/, ""); l = unxml($0) }
  l ~ /^skip: / { if (!seen[t, l]++) { line[++n] = t "\t" l; named[t] = 1 } next }
  l ~ /^\[  SKIPPED \] [A-Za-z_][A-Za-z0-9_]*$/ { if (!seen[t, l]++) cm[++m] = t "\t" l }
  END {
    for (i = 1; i <= n; i++) print line[i]
    for (i = 1; i <= m; i++) { split(cm[i], p, "\t"); if (!named[p[1]]) print cm[i] }
  }' "$junit")

if [ ${#whole[@]} -eq 0 ] && [ ${#cases[@]} -eq 0 ]; then
  echo "---- skips: none (every selected test and case ran)"
  exit "$rc"
fi
echo "---- skips: ${#whole[@]} test(s) skipped whole, ${#cases[@]} skip message(s) (not run here; under CI=true each is a failure)"
for w in "${whole[@]}"; do printf '  %-24s skipped whole (CTest: Skipped)\n' "$w"; done
for c in "${cases[@]}"; do printf '  %-24s %s\n' "${c%%$'\t'*}" "${c#*$'\t'}"; done
if [ "${CI:-}" = true ]; then
  echo "FAIL: CI=true and the run skipped something: a green CI run must have run everything"
  exit 1
fi
exit "$rc"
