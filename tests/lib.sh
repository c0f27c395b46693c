# Shared by the shell tests: result lines and the failure count. Source it, then end with
#   echo "NAME: $fails failure(s)"; [ $fails -eq 0 ]
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
skip() { echo "skip: $*"; exit 77; } # CTest SKIP_RETURN_CODE 77
