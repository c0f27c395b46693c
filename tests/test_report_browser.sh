#!/usr/bin/env bash
# dtrain report in a real browser: the page built from tests/data/report is rendered by headless
# Chromium; a checker script injected into a copy counts, per chart, the SVG marks that have a
# non-empty box inside the chart, compares them with what dtrain declared (data-marks), and
# writes the verdict into the DOM (read back with --dump-dom); the console must stay silent
# (no error, no exception). Controls prove the check can fail: a chart stripped of its marks
# and a page that throws must both be caught. Also: a screenshot that is not blank, partial
# data drawn as notes, and the CLI's one-line errors (exit 2).
# Chromium is installed if missing (root + apt); skipped (77) only if that fails or it cannot start,
# and under CI=true not even then (tests/lib.sh: skip).
set -uo pipefail
bin=$1
dir=$2
src=$(cd "$(dirname "$0")/.." && pwd)
fx=$src/tests/data/report
rm -rf "$dir" && mkdir -p "$dir"
. "$src/tests/lib.sh"

chrome=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chrome" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing chromium (scripts/install-deps.sh installs it too)"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends chromium >"$dir/apt.log" 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends chromium >"$dir/apt.log" 2>&1; }
  chrome=$(command -v chromium || true)
fi
[ -n "$chrome" ] || skip "chromium is not installed and could not be installed"
browse() { # browse OUT_PREFIX URL_FILE [extra flags]: --dump-dom to OUT.dom, log to OUT.log
  local out=$1 page=$2; shift 2
  timeout 60 "$chrome" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
    --user-data-dir="$dir/profile" --enable-logging=stderr --v=0 "$@" "file://$page" >"$out.dom" 2>"$out.log"
}
printf '<html><body><p id="x">ok</p></body></html>' >"$dir/probe.html"
browse "$dir/probe" "$dir/probe.html" --dump-dom
grep -q 'id="x">ok' "$dir/probe.dom" || skip "chromium does not start headless: $(tail -2 "$dir/probe.log")"

# --- the CLI: pages from the fixtures, errors --------------------------------------------
"$bin" report "$fx"/full/*.json -o "$dir/full.html" >"$dir/full.out" 2>&1 &&
  pass "report of $(ls "$fx"/full/*.json | wc -l) fixture files" || fail "report of the full fixtures: $(cat "$dir/full.out")"
"$bin" report "$fx"/partial/*.json --output "$dir/partial.html" >"$dir/partial.out" 2>&1 &&
  pass "report of partial data" || fail "report of partial data: $(cat "$dir/partial.out")"
expect_usage() { # NAME TEXT ARGS...: exit 2, one line on stderr containing TEXT
  local name=$1 text=$2; shift 2
  "$bin" report "$@" >"$dir/out" 2>"$dir/err"; local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$text" "$dir/err" && [ "$(wc -l <"$dir/err")" -eq 1 ]; then
    pass "$name: $(cat "$dir/err")"
  else
    fail "$name (rc=$rc, stderr: $(cat "$dir/err"))"
  fi
}
expect_usage "no input files" "no result files" -o "$dir/x.html"
expect_usage "missing file" "nope.json: cannot open" "$fx/full/ddp-w1.json" "$dir/nope.json"
expect_usage "missing key" "missing-key.json: key 'summary.tokens_per_s.mean' is missing" "$fx/bad/missing-key.json"
expect_usage "invalid JSON" "not-json.json: not valid JSON" "$fx/bad/not-json.json"
expect_usage "wrong schema" "wrong-schema.json: key 'schema'" "$fx/bad/wrong-schema.json"
expect_usage "bad flag" "unknown flag '--frob'" --frob "$fx/full/ddp-w1.json"
expect_usage "bad budget" "--mem-budget" --mem-budget lots "$fx/full/ddp-w1.json"
[ ! -e "$dir/x.html" ] && pass "no page written on a usage error" || fail "page written on a usage error"
if grep -qiE 'https?:|<link|<img|@import|<script' "$dir/full.html"; then
  fail "the page references something external or has a script"
else
  pass "self-contained: no script, link, image or URL"
fi

# --- the checker, injected into copies ----------------------------------------------------
cat >"$dir/head.js" <<'EOF'
<script>window.__dtErrors=[];window.addEventListener('error',function(e){window.__dtErrors.push(String(e.message))});</script>
EOF
cat >"$dir/check.js" <<'EOF'
<script>(function(){
var out=[];
document.querySelectorAll('figure.chart').forEach(function(fig){
  var id=fig.id.replace('chart-',''), svg=fig.querySelector('svg');
  if(!svg){out.push('chart '+id+' '+(fig.querySelector('p.note')?'empty-with-note':'BROKEN-no-svg-no-note'));return;}
  var vb=svg.viewBox.baseVal, declared=+svg.getAttribute('data-marks'), marks=svg.querySelectorAll('.mark'), vis=0;
  marks.forEach(function(m){var b=m.getBBox();
    if((b.width>0||b.height>0)&&b.x>=-1&&b.y>=-1&&b.x+b.width<=vb.width+1&&b.y+b.height<=vb.height+1)vis++;});
  var ok=declared>0&&vis===declared&&marks.length===declared&&svg.outerHTML.indexOf('NaN')<0&&svg.getBoundingClientRect().height>50;
  out.push('chart '+id+' declared='+declared+' marks='+marks.length+' visible='+vis+' '+(ok?'drawn':'BROKEN'));
});
out.push('errors='+window.__dtErrors.length+(window.__dtErrors.length?' '+window.__dtErrors.join(' | '):''));
var pre=document.createElement('pre');pre.id='dt-check';pre.textContent=out.join('\n');document.body.appendChild(pre);
})();</script>
EOF
instrument() { # SRC DST: the checker around the page
  python3 - "$1" "$2" "$dir/head.js" "$dir/check.js" <<'EOF'
import sys
html, head, check = (open(p).read() for p in (sys.argv[1], sys.argv[3], sys.argv[4]))
assert html.count('<head>') == 1 and html.count('</body>') == 1
open(sys.argv[2], 'w').write(html.replace('<head>', '<head>' + head).replace('</body>', check + '</body>'))
EOF
}
# check NAME PAGE: renders the instrumented page; prints the verdict lines to NAME.check
check() {
  instrument "$2" "$dir/$1.inst.html"
  browse "$dir/$1" "$dir/$1.inst.html" --dump-dom
  sed -n '/<pre id="dt-check">/,/<\/pre>/p' "$dir/$1.dom" | sed -e 's/<[^>]*>//g' >"$dir/$1.check"
  grep -a 'CONSOLE' "$dir/$1.log" >"$dir/$1.console" || true
}

check full "$dir/full.html"
cat "$dir/full.check"
n_drawn=$(grep -c ' drawn$' "$dir/full.check")
[ "$n_drawn" -eq 6 ] && ! grep -q BROKEN "$dir/full.check" && pass "all 6 charts drew (marks visible = declared)" ||
  fail "charts of the full report: $(tr '\n' ';' <"$dir/full.check")"
grep -q '^errors=0$' "$dir/full.check" && [ ! -s "$dir/full.console" ] && pass "no page errors, console silent" ||
  fail "page errors: $(grep errors= "$dir/full.check") $(cat "$dir/full.console")"

check partial "$dir/partial.html"
grep -q 'chart throughput .* drawn$' "$dir/partial.check" && [ "$(grep -c 'empty-with-note' "$dir/partial.check")" -eq 5 ] &&
  ! grep -q BROKEN "$dir/partial.check" && grep -q '^errors=0$' "$dir/partial.check" && [ ! -s "$dir/partial.console" ] &&
  pass "partial data: 1 chart drawn, 5 replaced by a note, no errors" || fail "partial: $(tr '\n' ';' <"$dir/partial.check")"

# controls: the check must catch an empty chart and a page that throws
python3 - "$dir/full.html" "$dir/stripped.html" <<'EOF'
import re, sys
html = open(sys.argv[1]).read()
a = html.index('id="chart-busbw"'); b = html.index('</figure>', a)
open(sys.argv[2], 'w').write(html[:a] + re.sub(r'<circle class="mark"[^>]*>.*?</circle>', '', html[a:b]) + html[b:])
EOF
check stripped "$dir/stripped.html"
grep -q 'chart busbw .*BROKEN' "$dir/stripped.check" && pass "control: a chart without marks is caught" ||
  fail "control: stripped chart not caught: $(tr '\n' ';' <"$dir/stripped.check")"
sed 's#</main>#<script>document.body.undefinedThing.go()</script></main>#' "$dir/full.html" >"$dir/throws.html"
check throws "$dir/throws.html"
grep -q '^errors=1 ' "$dir/throws.check" && grep -q 'Uncaught TypeError' "$dir/throws.console" &&
  pass "control: a page that throws is caught (DOM and console)" || fail "control: exception not caught: $(cat "$dir/throws.check")"

# --- screenshot of the real page: written and not blank --------------------------------
browse "$dir/shot" "$dir/full.html" --screenshot="$dir/report.png" --window-size=1440,2600 --hide-scrollbars
# A blank page of the same size compresses to a few KB; the report's charts and tables do not.
printf '<html><body></body></html>' >"$dir/blank.html"
browse "$dir/blankshot" "$dir/blank.html" --screenshot="$dir/blank.png" --window-size=1440,2600 --hide-scrollbars
size=$(stat -c %s "$dir/report.png" 2>/dev/null || echo 0)
blank=$(stat -c %s "$dir/blank.png" 2>/dev/null || echo 1)
magic=$(head -c 8 "$dir/report.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
if [ "$magic" = 89504e470d0a1a0a ] && [ "$size" -gt $((10 * blank)) ] && [ "$size" -gt 50000 ]; then
  pass "screenshot $dir/report.png: $size bytes (a blank page: $blank)"
else
  fail "screenshot missing or blank ($size bytes, blank page $blank, magic $magic)"
fi

echo "test_report_browser: $fails failure(s)"
[ $fails -eq 0 ]
